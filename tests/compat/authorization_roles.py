"""The official CI's broker setup: token, basic and anonymous roles, authorization per namespace.
A client without credentials (or with a method the broker does not serve) acts as the anonymous
role, which may use public/default but not private/auth; the token's subject and the basic super
user may; a topic of an unknown tenant is not found whatever the role; built-in methods named as
strings (`Authentication("token", ...)`) work."""
# corpus: broker=authorization
import sys

import pulsar

service_url, prefix = sys.argv[1], sys.argv[2]
TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0b2tlbi1wcmluY2lwYWwifQ.Y29ycHVzLXNpZ25hdHVyZQ"
PRIVATE = "persistent://private/auth/" + prefix


def round_trip(name, authentication, topic):
    client = pulsar.Client(service_url, authentication=authentication) if authentication else \
        pulsar.Client(service_url)
    try:
        consumer = client.subscribe(topic, name.replace(" ", "-"))
        client.create_producer(topic).send(name.encode())
        print(name, "->", topic.split("/")[2], consumer.receive(5000).data())
    except pulsar.PulsarException as error:
        print(name, "->", topic.split("/")[2], type(error).__name__)
    client.close()


round_trip("anonymous", None, "persistent://public/default/" + prefix)
round_trip("anonymous", None, PRIVATE)
round_trip("anonymous", None, "persistent://no-such-tenant/ns/" + prefix)  # not found, whatever the role
round_trip("token", pulsar.AuthenticationToken(TOKEN), PRIVATE)
round_trip("token supplier", pulsar.AuthenticationToken(lambda: TOKEN), PRIVATE)
round_trip("named token", pulsar.Authentication("token", "token:" + TOKEN), PRIVATE)
round_trip("basic super user", pulsar.AuthenticationBasic("admin", "123456"), PRIVATE)
round_trip("named basic", pulsar.Authentication(
    "org.apache.pulsar.client.impl.auth.AuthenticationBasic", '{"username": "admin", "password": "123456"}'), PRIVATE)
round_trip("unknown method", pulsar.AuthenticationBasic("admin", "123456", "unknown"), PRIVATE)
try:
    pulsar.AuthenticationBasic(auth_params_string="not json")
except RuntimeError:
    print("unparsable basic parameters: RuntimeError")
