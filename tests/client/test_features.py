"""Features the official and Go clients have, built into the asyncio client and tested against
the embedded broker: schemas, dead letter and retry letter topics, negative-ack backoff, a
custom message router, lazy partitioned producers, Basic/TLS/OAuth2 authentication, table views."""
from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest

from pulsarwire import MessageId, errors
from pulsarwire.client import (
    AuthenticationBasic, AuthenticationOauth2, AuthenticationTLS, AuthenticationToken, Client, ConsumerType,
    DeadLetterPolicy, InitialPosition, NegativeAckRedeliveryBackoff,
)
from pulsarwire.schema import (
    AvroSchema, BytesSchema, JsonSchema, KeyValue, KeyValueEncoding, KeyValueSchema, ProtobufNativeSchema,
    SchemaType, StringSchema,
)

from ..conftest import unique
from ..peers import BrokerProcess, BrokerThread

EARLIEST = InitialPosition.Earliest


def run(coro, timeout=60):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def client_for(url, **options):
    options.setdefault("operation_timeout_seconds", 10)
    options.setdefault("initial_backoff_seconds", 0.05)
    options.setdefault("max_backoff_seconds", 0.5)
    return Client(url, **options)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(tmp_path_factory.mktemp("features"), v1_port=None).start()
    yield thread
    thread.stop()


# --- schemas -------------------------------------------------------------------------------

class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Point:
    x: int
    y: float
    color: Color = Color.RED
    tags: list[str] = dataclasses.field(default_factory=list)
    label: str | None = None


@dataclasses.dataclass
class Shape:
    name: str
    corners: list[Point]
    raw: bytes = b""


SCHEMA_CASES = [
    ("string", StringSchema(), ["plain", "ünïcode ✓", ""]),
    ("bytes", BytesSchema(), [b"\x00\x01", b"raw"]),
    ("json", JsonSchema(Point), [Point(1, 2.5, Color.BLUE, ["a"], "p"), Point(-3, 0.0)]),
    ("json-nested", JsonSchema(Shape), [Shape("tri", [Point(0, 0.0), Point(1, 1.0, Color.BLUE)], b"\xff\x00")]),
    ("avro", AvroSchema(Point), [Point(7, 1.5, Color.BLUE, ["x", "y"]), Point(0, -1.0, label="z")]),
    ("avro-nested", AvroSchema(Shape), [Shape("sq", [Point(2, 2.0)], b"\x01")]),
    ("kv-inline", KeyValueSchema(StringSchema(), JsonSchema(Point)),
     [KeyValue("k1", Point(1, 1.0)), KeyValue("k2", None)]),
    ("kv-separated", KeyValueSchema(StringSchema(), AvroSchema(Point), KeyValueEncoding.SEPARATED),
     [KeyValue("key-a", Point(4, 4.0)), KeyValue("", Point(5, 5.0))]),
]


@pytest.mark.parametrize("batching", [True, False], ids=["batched", "single"])
@pytest.mark.parametrize("name,schema,values", SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_schema_round_trip(broker, name, schema, values, batching):
    topic = unique(f"schema-{name}")

    async def main():
        async with client_for(broker.url) as client:
            consumer = await client.subscribe(topic, "s", schema=schema, initial_position=EARLIEST)
            producer = await client.create_producer(topic, schema=schema, batching_enabled=batching)
            for value in values:
                await producer.send_async(value)
            await producer.flush()
            received = [await consumer.receive(5000) for _ in values]
            assert [m.value() for m in received] == values
            if schema.schema_type != SchemaType.BYTES:
                assert received[0].schema_version() == (0).to_bytes(8, "big")
            reader = await client.create_reader(topic, __import__("pulsarwire").MessageId.earliest, schema=schema)
            assert (await reader.read_next(5000)).value() == values[0]
            info = await client.get_schema_info(topic)
            if schema.schema_type == SchemaType.BYTES:
                assert info is None  # bytes declare no schema
            else:
                assert info.schema_type() == schema.schema_type
                assert info == schema.schema_info()
    run(main())


def test_protobuf_native_schema_round_trip(broker):
    from pulsarwire._proto import PulsarApi_pb2 as pb
    schema = ProtobufNativeSchema(pb.MessageIdData)
    topic = unique("schema-proto")

    async def main():
        async with client_for(broker.url) as client:
            consumer = await client.subscribe(topic, "s", schema=schema, initial_position=EARLIEST)
            producer = await client.create_producer(topic, schema=schema)
            await producer.send(pb.MessageIdData(ledgerId=3, entryId=9, partition=2))
            value = (await consumer.receive(5000)).value()
            assert isinstance(value, pb.MessageIdData) and (value.ledgerId, value.entryId, value.partition) == (3, 9, 2)
            definition = json.loads((await client.get_schema_info(topic)).schema())
            assert definition["rootMessageTypeName"] == "pulsar.proto.MessageIdData"
            with pytest.raises(TypeError):
                await producer.send(pb.MessageIdData)
    run(main())


def test_incompatible_schema_is_refused_and_none_is_accepted(broker):
    topic = unique("schema-incompatible")

    async def main():
        async with client_for(broker.url) as client:
            await client.create_producer(topic, schema=JsonSchema(Point))
            await client.create_producer(topic, schema=JsonSchema(Point))  # the same one: fine
            await client.create_producer(topic)  # no schema: fine
            with pytest.raises(errors.IncompatibleSchemaError):
                await client.create_producer(topic, schema=StringSchema())
            with pytest.raises(errors.IncompatibleSchemaError):
                await client.create_producer(topic, schema=JsonSchema(Shape))  # other definition
            with pytest.raises(errors.IncompatibleSchemaError):
                await client.subscribe(topic, "s", schema=AvroSchema(Point))
            consumer = await client.subscribe(topic, "s2", schema=JsonSchema(Point))
            await consumer.close()
            assert await client.get_schema_info(unique("no-such-topic")) is None
    run(main())


def test_schema_survives_broker_restart(tmp_path):
    topic = unique("schema-restart")
    thread = BrokerThread(tmp_path, v1_port=None).start()
    try:
        async def declare():
            async with client_for(thread.url) as client:
                await client.create_producer(topic, schema=StringSchema())
        run(declare())
        thread.restart()

        async def check():
            async with client_for(thread.url) as client:
                assert (await client.get_schema_info(topic)).schema_type() == SchemaType.STRING
                with pytest.raises(errors.IncompatibleSchemaError):
                    await client.create_producer(topic, schema=JsonSchema(Point))
        run(check())
    finally:
        thread.stop()


def test_schema_encode_rejects_wrong_types():
    with pytest.raises(TypeError):
        StringSchema().encode(b"bytes")
    with pytest.raises(TypeError):
        JsonSchema(Point).encode(Shape("x", []))
    with pytest.raises(TypeError):
        KeyValueSchema(StringSchema(), StringSchema()).encode("not a pair")
    with pytest.raises(ValueError):
        KeyValueSchema(StringSchema(), StringSchema()).decode(b"\x00\x00\x00\x09ab")


@pytest.mark.interop
def test_schemas_interoperate_with_the_official_client(broker):
    pulsar = pytest.importorskip("pulsar")
    from pulsar import schema as official

    class User(official.Record):
        name = official.String()
        age = official.Integer()

    cases = [(official.StringSchema(), StringSchema(), "hello", lambda v: v),
             (official.JsonSchema(User), JsonSchema(User), User(name="ann", age=31), lambda v: (v.name, v.age)),
             (official.AvroSchema(User), AvroSchema(User), User(name="bob", age=7), lambda v: (v.name, v.age))]
    theirs = pulsar.Client(broker.url)
    try:
        for official_schema, our_schema, value, view in cases:
            topic = unique("schema-interop")
            their_consumer = theirs.subscribe(topic, "theirs", schema=official_schema,
                                              initial_position=pulsar.InitialPosition.Earliest)
            theirs.create_producer(topic, schema=official_schema).send(value)

            async def ours():
                async with client_for(broker.url) as client:
                    consumer = await client.subscribe(topic, "ours", schema=our_schema, initial_position=EARLIEST)
                    producer = await client.create_producer(topic, schema=our_schema)
                    await producer.send(value)
                    return [view((await consumer.receive(5000)).value()) for _ in range(2)]
            assert run(ours()) == [view(value)] * 2
            assert [view(their_consumer.receive(5000).value()) for _ in range(2)] == [view(value)] * 2
    finally:
        theirs.close()


# --- dead letters, retry letters, negative-ack backoff -------------------------------------

def test_dead_letter_topic_after_max_redeliveries(broker):
    topic = unique("dlq")

    async def main():
        async with client_for(broker.url) as client:
            dlq = await client.subscribe(f"{topic}-sub-DLQ", "inspect", initial_position=EARLIEST)
            consumer = await client.subscribe(
                topic, "sub", consumer_type=ConsumerType.Shared, negative_ack_redelivery_delay_ms=20,
                dead_letter_policy=DeadLetterPolicy(max_redeliver_count=2))
            producer = await client.create_producer(topic, batching_enabled=False)
            await producer.send(b"poison", partition_key="k", properties={"a": "1"})
            await producer.send(b"good")
            counts = []
            while True:
                message = await consumer.receive(5000)
                if message.data() == b"good":
                    consumer.acknowledge(message)
                    continue
                counts.append(message.redelivery_count())
                consumer.negative_acknowledge(message)
                if len(counts) == 3:
                    break
            assert counts == [0, 1, 2]  # delivered 1 + max_redeliver_count times
            dead = await dlq.receive(5000)
            assert dead.data() == b"poison" and dead.partition_key() == "k"
            assert dead.properties()["a"] == "1"
            assert dead.properties()["REAL_TOPIC"] == f"persistent://public/default/{topic}"
            assert "ORIGIN_MESSAGE_ID" in dead.properties()
            with pytest.raises(errors.TimeoutError):  # acknowledged on the source: not redelivered
                await consumer.receive(300)
            await consumer.close()
            again = await client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared)
            with pytest.raises(errors.TimeoutError):
                await again.receive(300)
    run(main())


def test_dead_letters_as_the_official_client_sends_them(broker):
    """As the official client: an Exclusive (or Failover) subscription never dead-letters (it
    goes on redelivering), a partitioned topic's default dead letter topic is the partition's
    (`<topic>-partition-N-<subscription>-DLQ`, REAL_TOPIC the partition), and the dead letter
    copy carries no event time."""
    async def main():
        async with client_for(broker.url) as client:
            topic = unique("dlq-excl")
            dlq = await client.subscribe(f"{topic}-sub-DLQ", "inspect", initial_position=EARLIEST)
            consumer = await client.subscribe(
                topic, "sub", consumer_type=ConsumerType.Exclusive, negative_ack_redelivery_delay_ms=20,
                dead_letter_policy=DeadLetterPolicy(max_redeliver_count=1))
            producer = await client.create_producer(topic, batching_enabled=False)
            await producer.send(b"poison")
            counts = []
            for _ in range(4):
                message = await consumer.receive(5000)
                counts.append(message.redelivery_count())
                consumer.negative_acknowledge(message)
            assert counts == [0, 1, 2, 3]
            with pytest.raises(errors.TimeoutError):
                await dlq.receive(300)
            await consumer.close()

            parts = _partitioned(broker, 2)
            partition = f"{parts}-partition-1"
            dlq = await client.subscribe(f"{partition}-sub-DLQ", "inspect", initial_position=EARLIEST)
            consumer = await client.subscribe(
                parts, "sub", consumer_type=ConsumerType.Shared, negative_ack_redelivery_delay_ms=20,
                dead_letter_policy=DeadLetterPolicy(max_redeliver_count=1))
            producer = await client.create_producer(partition, batching_enabled=False)
            await producer.send(b"poison", event_timestamp=1234)
            for _ in range(2):
                message = await consumer.receive(5000)
                assert message.event_timestamp() == 1234
                consumer.negative_acknowledge(message)
            dead = await dlq.receive(5000)
            assert dead.data() == b"poison" and dead.event_timestamp() == 0
            assert dead.properties()["REAL_TOPIC"] == partition
    run(main())


def test_dead_letter_sends_only_the_unacknowledged_messages_of_a_batch(broker):
    topic = unique("dlq-batch")

    async def main():
        async with client_for(broker.url) as client:
            dlq = await client.subscribe(f"{topic}-sub-DLQ", "inspect", initial_position=EARLIEST)
            consumer = await client.subscribe(
                topic, "sub", consumer_type=ConsumerType.Shared, negative_ack_redelivery_delay_ms=20,
                batch_index_ack_enabled=True, dead_letter_policy=DeadLetterPolicy(max_redeliver_count=1))
            producer = await client.create_producer(topic, batching_max_publish_delay_ms=50)
            futures = [await producer.send_async(f"b{i}".encode()) for i in range(3)]
            await producer.flush()
            assert len({(m.ledger_id, m.entry_id) for m in await asyncio.gather(*futures)}) == 1  # one batch
            for round_ in range(2):
                batch = [await consumer.receive(5000) for _ in range(3 if round_ == 0 else 2)]
                if round_ == 0:
                    consumer.acknowledge(batch[1])  # b1 is done; b0 and b2 keep failing
                    batch = [batch[0], batch[2]]
                for message in batch:
                    consumer.negative_acknowledge(message)
            dead = sorted([(await dlq.receive(5000)).data() for _ in range(2)])
            assert dead == [b"b0", b"b2"]
            with pytest.raises(errors.TimeoutError):
                await dlq.receive(300)
            with pytest.raises(errors.TimeoutError):
                await consumer.receive(300)
    run(main())


def test_dead_letter_after_ack_timeout_with_named_topic_and_initial_subscription(broker):
    topic, dead_topic = unique("dlq-timeout"), unique("dead")

    async def main():
        async with client_for(broker.url) as client:
            consumer = await client.subscribe(
                topic, "sub", consumer_type=ConsumerType.Shared, unacked_messages_timeout_ms=150,
                dead_letter_policy=DeadLetterPolicy(1, dead_letter_topic=dead_topic,
                                                    initial_subscription_name="keep"))
            producer = await client.create_producer(topic)
            await producer.send(b"ignored")
            assert (await consumer.receive(5000)).redelivery_count() == 0  # never acknowledged
            assert (await consumer.receive(5000)).redelivery_count() == 1
            # the second timeout sends it to the dead letter topic (a reader, not a subscription, waits for it)
            watcher = await client.create_reader(dead_topic, MessageId.earliest)
            assert (await watcher.read_next(30_000)).data() == b"ignored"
            await watcher.close()
            await consumer.close()
            # the initial subscription existed before the dead letter was written
            kept = await client.subscribe(dead_topic, "keep")
            assert (await kept.receive(5000)).data() == b"ignored"
    run(main())


def test_reconsume_later_goes_through_the_retry_topic_then_the_dead_letter_topic(broker):
    topic = unique("retry")

    async def main():
        async with client_for(broker.url) as client:
            dlq = await client.subscribe(f"{topic}-sub-DLQ", "inspect", initial_position=EARLIEST)
            consumer = await client.subscribe(
                topic, "sub", consumer_type=ConsumerType.Shared, retry_enable=True,
                dead_letter_policy=DeadLetterPolicy(max_redeliver_count=2))
            producer = await client.create_producer(topic)
            await producer.send(b"later", properties={"origin": "x"})
            seen = []
            started = time.monotonic()
            for _ in range(3):
                message = await consumer.receive(5000)
                seen.append((message.topic_name().rsplit("/", 1)[1],
                             message.properties().get("RECONSUMETIMES")))
                await consumer.reconsume_later(message, 200)
            assert time.monotonic() - started >= 0.4  # two delayed retries
            assert seen == [(topic, None), (f"{topic}-sub-RETRY", "1"), (f"{topic}-sub-RETRY", "2")]
            dead = await dlq.receive(5000)
            assert dead.data() == b"later" and dead.properties()["origin"] == "x"
            with pytest.raises(errors.TimeoutError):
                await consumer.receive(300)
    run(main())


def test_reconsume_later_needs_a_policy(broker):
    async def main():
        async with client_for(broker.url) as client:
            consumer = await client.subscribe(unique("no-retry"), "sub", initial_position=EARLIEST)
            producer = await client.create_producer(consumer.topic())
            await producer.send(b"x")
            with pytest.raises(errors.PulsarWireError):
                await consumer.reconsume_later(await consumer.receive(5000), 10)
            with pytest.raises(ValueError):
                DeadLetterPolicy(0)
    run(main())


def test_negative_ack_backoff_grows_with_the_redelivery_count(broker):
    topic = unique("nack-backoff")
    backoff = NegativeAckRedeliveryBackoff(min_delay_ms=100, max_delay_ms=400, multiplier=2)
    assert [backoff.next(n) for n in range(5)] == [100, 200, 400, 400, 400]

    async def main():
        async with client_for(broker.url) as client:
            consumer = await client.subscribe(topic, "sub", consumer_type=ConsumerType.Shared,
                                              negative_ack_redelivery_backoff=backoff)
            producer = await client.create_producer(topic)
            await producer.send(b"retry me")
            gaps, last = [], None
            for _ in range(4):
                message = await consumer.receive(5000)
                now = time.monotonic()
                if last is not None:
                    gaps.append(now - last)
                last = now
                consumer.negative_acknowledge(message)
            assert [round(g, 1) >= d for g, d in zip(gaps, (0.1, 0.2, 0.4))] == [True] * 3
            assert gaps[2] > gaps[0] + 0.15
    run(main())


# --- custom message router, lazy partitioned producers -------------------------------------

def _partitioned(broker, partitions):
    topic = f"persistent://public/default/{unique('parts')}"
    broker.call(broker.broker.create_partitioned_topic, topic, partitions)
    return topic


def _attached_producers(broker, topic, partitions):
    return [len(broker.broker.topics[f"{topic}-partition-{i}"].producers)
            if f"{topic}-partition-{i}" in broker.broker.topics else 0 for i in range(partitions)]


def test_custom_message_router_chooses_the_partition(broker):
    topic = _partitioned(broker, 4)
    seen = []

    def by_property(message, num_partitions):
        seen.append((message.data(), message.partition_key(), num_partitions))
        return int(message.properties()["to"]) % num_partitions

    async def main():
        async with client_for(broker.url) as client:
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            producer = await client.create_producer(topic, message_router=by_property)
            for i in range(8):
                message_id = await producer.send(f"m{i}".encode(), properties={"to": str(i)}, partition_key="k")
                assert message_id.partition == i % 4
            received = [await consumer.receive(5000) for _ in range(8)]
            assert sorted((m.data(), m.message_id().partition) for m in received) == \
                [(f"m{i}".encode(), i % 4) for i in range(8)]
            assert seen[0] == (b"m0", "k", 4)
            bad = await client.create_producer(topic, message_router=lambda message, n: n)
            with pytest.raises(ValueError):
                await bad.send(b"out of range")
            with pytest.raises(TypeError):
                await client.create_producer(topic, message_router="not callable")
    run(main())


def test_lazy_partitioned_producers_attach_on_first_send(broker):
    topic = _partitioned(broker, 3)

    async def main():
        async with client_for(broker.url) as client:
            producer = await client.create_producer(topic, lazy_start_partitioned_producers=True,
                                                    message_router=lambda message, n: 2)
            assert broker.call(_attached_producers, broker, topic, 3) == [0, 0, 0]
            sends = [await producer.send_async(f"x{i}".encode()) for i in range(5)]  # concurrent first sends
            ids = await asyncio.gather(*sends)
            assert {m.partition for m in ids} == {2}
            assert broker.call(_attached_producers, broker, topic, 3) == [0, 0, 1]
            consumer = await client.subscribe(topic, "s", initial_position=EARLIEST)
            assert [(await consumer.receive(5000)).data() for _ in range(5)] == [f"x{i}".encode() for i in range(5)]
            await producer.close()
            eager = await client.create_producer(topic)
            assert broker.call(_attached_producers, broker, topic, 3) == [1, 1, 1]
            await eager.close()
    run(main())


# --- authentication: Basic, TLS client certificates, OAuth2 client credentials -------------

def test_basic_authentication(tmp_path):
    thread = BrokerThread(tmp_path, v1_port=None, auth_basic={"ann": "s3cret:with colon"}).start()
    try:
        async def main():
            async with client_for(thread.url, authentication=AuthenticationBasic("ann", "s3cret:with colon")) as client:
                consumer = await client.subscribe("basic", "s", initial_position=EARLIEST)
                await (await client.create_producer("basic")).send(b"in")
                assert (await consumer.receive(5000)).data() == b"in"
            for wrong in (AuthenticationBasic("ann", "nope"), AuthenticationBasic("bob", "s3cret:with colon"),
                          AuthenticationToken("s3cret:with colon"), None):
                async with client_for(thread.url, authentication=wrong) as client:
                    with pytest.raises(errors.AuthenticationError):
                        await client.create_producer("basic")
            official_style = AuthenticationBasic(auth_params_string='{"username": "ann", "password": "s3cret:with colon"}')
            async with client_for(thread.url, authentication=official_style) as client:
                await client.create_producer("basic")
        run(main())
    finally:
        thread.stop()


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    """A CA, a broker certificate for 127.0.0.1 and client certificates: one from the CA, one self-signed."""
    if subprocess.run(["which", "openssl"], capture_output=True).returncode:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=folder)
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, extra in (("broker", ["-extfile", "san.ext"]), ("alice", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=folder)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-out", f"{name}.pem", *extra, cwd=folder)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=mallory",
             "-keyout", "mallory.key", "-out", "mallory.pem", cwd=folder)
    return folder


def test_tls_client_certificate_authentication(tmp_path, certificates):
    from pulsarwire.broker.server import tls_context
    c = certificates
    context = tls_context(str(c / "broker.pem"), str(c / "broker.key"), str(c / "ca.pem"))
    thread = BrokerThread(tmp_path, v1_port=None, tls_port=0, ssl_context=context, auth_tls=True).start()
    try:
        url = thread.broker.service_url_tls

        async def main():
            alice = AuthenticationTLS(str(c / "alice.pem"), str(c / "alice.key"))
            async with client_for(url, authentication=alice, tls_trust_certs_file_path=str(c / "ca.pem"),
                                  tls_validate_hostname=True) as client:
                consumer = await client.subscribe("tls-auth", "s", initial_position=EARLIEST)
                await (await client.create_producer("tls-auth")).send(b"over tls")
                assert (await consumer.receive(5000)).data() == b"over tls"
            async with client_for(url, tls_trust_certs_file_path=str(c / "ca.pem")) as client:
                with pytest.raises(errors.AuthenticationError):  # TLS, but no certificate: no credential
                    await client.create_producer("tls-auth")
            mallory = AuthenticationTLS(str(c / "mallory.pem"), str(c / "mallory.key"))
            async with client_for(url, authentication=mallory, tls_trust_certs_file_path=str(c / "ca.pem"),
                                  operation_timeout_seconds=3) as client:
                with pytest.raises((errors.ConnectionClosedError, errors.AuthenticationError)):
                    await client.create_producer("tls-auth")  # the broker refuses an unknown CA
            async with client_for(thread.url, authentication=alice) as client:
                with pytest.raises(errors.AuthenticationError):  # method tls without TLS
                    await client.create_producer("tls-auth")
        run(main())
    finally:
        thread.stop()


def test_broker_command_line_auth_options(tmp_path, certificates):
    from ..peers import free_port
    c = certificates
    tls_port = free_port()
    process = BrokerProcess(tmp_path, extra=[
        "--auth-basic", "ann:pw", "--tls-port", str(tls_port), "--tls-cert-file", str(c / "broker.pem"),
        "--tls-key-file", str(c / "broker.key"), "--tls-trust-certs-file", str(c / "ca.pem")]).start()
    try:
        async def main():
            async with client_for(process.url, authentication=AuthenticationBasic("ann", "pw")) as client:
                await client.create_producer("cli-auth")
            alice = AuthenticationTLS(str(c / "alice.pem"), str(c / "alice.key"))
            async with client_for(f"pulsar+ssl://127.0.0.1:{tls_port}", authentication=alice,
                                  tls_trust_certs_file_path=str(c / "ca.pem")) as client:
                await client.create_producer("cli-auth")
            async with client_for(process.url, authentication=AuthenticationBasic("ann", "no")) as client:
                with pytest.raises(errors.AuthenticationError):
                    await client.create_producer("cli-auth")
        run(main())
    finally:
        process.stop()


class _TokenIssuer:
    """A tiny OAuth2 issuer on 127.0.0.1: discovery document and client-credentials token endpoint."""

    def __init__(self, client_id, client_secret, audience, token, lifetime=3600) -> None:
        issuer = self
        self.requests: list[dict] = []
        self.lifetime = lifetime

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/.well-known/openid-configuration":
                    self._answer(200, {"issuer": issuer.url, "token_endpoint": issuer.url + "/oauth/token"})
                else:
                    self._answer(404, {"error": "not found"})

            def do_POST(self):
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode()).items()}
                issuer.requests.append(form)
                if self.path == "/oauth/token" and form == {"grant_type": "client_credentials", "client_id": client_id,
                                                            "client_secret": client_secret, "audience": audience}:
                    self._answer(200, {"access_token": token, "token_type": "Bearer", "expires_in": issuer.lifetime})
                else:
                    self._answer(401, {"error": "invalid_client"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_oauth2_client_credentials(tmp_path):
    token = "issued-" + unique("tok")
    issuer = _TokenIssuer("my-app", "app-secret", "urn:pulsar:test", token)
    broker_process = BrokerProcess(tmp_path, extra=["--auth-token", token]).start()
    try:
        async def main():
            oauth = AuthenticationOauth2(issuer.url, "my-app", "app-secret", audience="urn:pulsar:test")
            async with client_for(broker_process.url, authentication=oauth) as client:
                consumer = await client.subscribe("oauth", "s", initial_position=EARLIEST)
                await (await client.create_producer("oauth")).send(b"authorised")
                assert (await consumer.receive(5000)).data() == b"authorised"
            assert len(issuer.requests) == 1  # one token, reused while fresh
            async with client_for(broker_process.url, authentication=oauth) as client:
                await client.create_producer("oauth")
            assert len(issuer.requests) == 1
            issuer.lifetime = 0.2  # the next token is short-lived: fetched again for each connection
            oauth._refresh_at = 0
            for _ in range(2):
                async with client_for(broker_process.url, authentication=oauth) as client:
                    await client.create_producer("oauth")
                await asyncio.sleep(0.2)
            assert len(issuer.requests) == 3
            import base64
            credentials = base64.b64encode(b'{"client_id": "my-app", "client_secret": "app-secret"}').decode()
            official_style = AuthenticationOauth2(json.dumps({
                "issuer_url": issuer.url, "audience": "urn:pulsar:test",
                "private_key": f"data:application/json;base64,{credentials}"}))
            async with client_for(broker_process.url, authentication=official_style) as client:
                await client.create_producer("oauth")
            refused = AuthenticationOauth2(issuer.url, "my-app", "wrong-secret", audience="urn:pulsar:test")
            async with client_for(broker_process.url, authentication=refused) as client:
                with pytest.raises(errors.AuthenticationError):
                    await client.create_producer("oauth")
        run(main())
    finally:
        broker_process.stop()
        issuer.stop()


# --- table view ----------------------------------------------------------------------------

def test_table_view_keeps_the_latest_value_per_key(broker):
    topic = _partitioned(broker, 2)

    async def main():
        async with client_for(broker.url) as client:
            producer = await client.create_producer(topic, schema=StringSchema())
            for key, value in [("a", "1"), ("b", "1"), ("a", "2"), ("c", "1")]:
                await producer.send(value, partition_key=key)
            await producer.send("ignored")  # no key: not part of the table
            raw = await client.create_producer(topic)
            await raw.send(b"", partition_key="c")  # an empty value removes the key
            view = await client.create_table_view(topic, schema=StringSchema())
            assert dict(view.items()) == {"a": "2", "b": "1"}  # everything before create is read
            assert view.get("a") == "2" and view.get("c") is None and len(view) == 2 and "b" in view
            seen = []
            view.for_each(lambda k, v: seen.append((k, v)))
            assert sorted(seen) == [("a", "2"), ("b", "1")]
            updates = []
            view.for_each_and_listen(lambda k, v: updates.append((k, v)))
            await producer.send("3", partition_key="a")
            await producer.send("9", partition_key="d")
            await raw.send(b"", partition_key="b")
            deadline = time.monotonic() + 5
            while len(updates) < 5 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert sorted(updates[:2]) == [("a", "2"), ("b", "1")]
            assert sorted(updates[2:]) == [("a", "3"), ("b", None), ("d", "9")]
            assert dict(view.items()) == {"a": "3", "d": "9"}
            await view.close()
            empty = await client.create_table_view(unique("empty-table"))
            assert len(empty) == 0
            await empty.close()
    run(main())


@pytest.mark.interop
def test_official_schema_objects_work_in_the_asyncio_client(broker):
    pytest.importorskip("pulsar")
    from pulsar import schema as official

    class Item(official.Record):
        sku = official.String()
        count = official.Integer()

    topic = unique("schema-foreign")

    async def main():
        async with client_for(broker.url) as client:
            consumer = await client.subscribe(topic, "s", schema=official.JsonSchema(Item), initial_position=EARLIEST)
            producer = await client.create_producer(topic, schema=official.JsonSchema(Item))
            await producer.send(Item(sku="a-1", count=2))
            value = (await consumer.receive(5000)).value()
            assert (value.sku, value.count) == ("a-1", 2)
            await client.create_producer(topic, schema=JsonSchema(Item))  # the same definition
            with pytest.raises(TypeError):
                await client.create_producer(topic, schema="json")
    run(main())
