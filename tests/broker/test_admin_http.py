"""The HTTP port: Pulsar's admin v2 REST API, HTTP lookup, /metrics and `pulsarwire admin`,
against the embedded broker (paths, verbs, JSON shapes and status codes as Pulsar's)."""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from pulsarwire.client import Client, InitialPosition

from ..conftest import unique
from ..peers import BrokerThread

pulsar = pytest.importorskip("pulsar")

NS = "/admin/v2/persistent/public/default"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    thread = BrokerThread(tmp_path_factory.mktemp("admin"), v1_port=None, http_port=0).start()
    yield thread
    thread.stop()


def call(broker, method, path, body=None, *, raw=False, token=None, data=None):
    """(status, parsed JSON or bytes, headers)."""
    if data is None and body is not None:
        data = json.dumps(body).encode()
    request = urllib.request.Request(broker.broker.http_url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, payload, headers = response.status, response.read(), response.headers
    except urllib.error.HTTPError as exc:
        status, payload, headers = exc.code, exc.read(), exc.headers
    if raw:
        return status, payload, headers
    return status, (json.loads(payload) if payload.strip() else None), headers


def error(broker, method, path, body=None, **kw):
    status, payload, headers = call(broker, method, path, body, raw=True, **kw)
    assert headers.get("Content-Type", "").startswith("application/json"), payload
    reason = json.loads(payload)["reason"]
    assert "Traceback" not in reason
    return status, reason


def produce(broker, topic, payloads, key=None):
    async def run():
        async with Client(broker.url) as client:
            producer = await client.create_producer(topic, batching_enabled=False)
            for payload in payloads:
                await producer.send(payload, partition_key=key(payload) if key else None)
            await producer.close()
    asyncio.run(run())


def test_tenants_and_namespaces(broker):
    assert call(broker, "GET", "/admin/v2/tenants")[1] == ["public"]
    assert call(broker, "GET", "/admin/v2/clusters")[1] == ["standalone"]
    assert call(broker, "PUT", "/admin/v2/tenants/acme", {"adminRoles": [], "allowedClusters": ["standalone"]})[0] == 204
    assert error(broker, "PUT", "/admin/v2/tenants/acme", {})[0] == 409
    assert error(broker, "PUT", "/admin/v2/tenants/bad%20name", {})[0] == 412
    assert call(broker, "GET", "/admin/v2/tenants/acme")[1] == {"adminRoles": [], "allowedClusters": ["standalone"]}
    assert call(broker, "POST", "/admin/v2/tenants/acme", {"adminRoles": ["ops"]})[0] == 204
    assert call(broker, "PUT", "/admin/v2/namespaces/acme/apps")[0] == 204
    assert error(broker, "PUT", "/admin/v2/namespaces/acme/apps")[0] == 409
    assert error(broker, "PUT", "/admin/v2/namespaces/nobody/apps")[0] == 404
    assert call(broker, "GET", "/admin/v2/namespaces/acme")[1] == ["acme/apps"]
    assert error(broker, "DELETE", "/admin/v2/tenants/acme")[0] == 409  # it has a namespace
    assert call(broker, "PUT", "/admin/v2/persistent/acme/apps/t")[0] == 204
    assert error(broker, "DELETE", "/admin/v2/namespaces/acme/apps")[0] == 409  # not empty
    assert call(broker, "DELETE", "/admin/v2/persistent/acme/apps/t")[0] == 204
    assert call(broker, "GET", "/admin/v2/namespaces/acme/apps")[0] == 200
    assert call(broker, "DELETE", "/admin/v2/namespaces/acme/apps")[0] == 204
    assert call(broker, "DELETE", "/admin/v2/tenants/acme")[0] == 204
    assert error(broker, "GET", "/admin/v2/tenants/acme")[0] == 404


def test_namespace_deduplication_and_schema_strategy_policies(broker):
    assert call(broker, "PUT", "/admin/v2/namespaces/public/dedup")[0] == 204
    base = "/admin/v2/namespaces/public/dedup"
    assert call(broker, "GET", f"{base}/deduplication")[1] is None
    assert call(broker, "POST", f"{base}/deduplication", True)[0] == 204
    assert call(broker, "GET", f"{base}/deduplication")[1] is True
    assert error(broker, "POST", f"{base}/deduplication", "yes")[0] == 400
    assert call(broker, "PUT", f"{base}/schemaCompatibilityStrategy", "FORWARD")[0] == 204
    assert call(broker, "GET", f"{base}/schemaCompatibilityStrategy")[1] == "FORWARD"
    assert error(broker, "PUT", f"{base}/schemaCompatibilityStrategy", "SOMETIMES")[0] == 400
    topic = f"persistent://public/dedup/{unique('d')}"

    client = pulsar.Client(broker.url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"a", sequence_id=9)
        assert producer.send(b"b", sequence_id=9).entry_id() == -1  # the namespace deduplicates
        path = "/admin/v2/" + topic.replace("://", "/")
        assert call(broker, "POST", f"{path}/deduplicationEnabled", False)[0] == 204  # the topic does not
        assert call(broker, "GET", f"{path}/deduplicationEnabled")[1] is False
        assert producer.send(b"c", sequence_id=9).entry_id() >= 0
        assert call(broker, "GET", f"{path}/stats")[1]["deduplicationStatus"] == "Disabled"
        assert call(broker, "DELETE", f"{path}/deduplicationEnabled")[0] == 204
        assert call(broker, "GET", f"{path}/stats")[1]["deduplicationStatus"] == "Enabled"
    finally:
        client.close()
    assert call(broker, "DELETE", f"{base}/deduplication")[0] == 204
    strategy = "/admin/v2/" + topic.replace("://", "/") + "/schemaCompatibilityStrategy"
    assert call(broker, "GET", strategy)[1] == "UNDEFINED"
    assert call(broker, "PUT", strategy, "ALWAYS_COMPATIBLE")[0] == 204
    assert call(broker, "GET", strategy)[1] == "ALWAYS_COMPATIBLE"
    assert broker.broker.core.policies.schema_strategy(topic) == "ALWAYS_COMPATIBLE"  # over the namespace's
    assert call(broker, "DELETE", strategy)[0] == 204
    assert broker.broker.core.policies.schema_strategy(topic) == "FORWARD"
    assert call(broker, "GET", "/admin/v2/brokers/health", raw=True)[1] == b"ok"


def test_topics_partitions_stats_and_delete(broker):
    name = unique("pt")
    assert call(broker, "PUT", f"{NS}/{name}/partitions", 3)[0] == 204
    assert error(broker, "PUT", f"{NS}/{name}/partitions", 3)[0] == 409
    assert error(broker, "PUT", f"{NS}/{unique('x')}/partitions", 0)[0] == 412
    assert call(broker, "GET", f"{NS}/{name}/partitions")[1]["partitions"] == 3
    assert call(broker, "POST", f"{NS}/{name}/partitions", 5)[0] == 204
    assert error(broker, "POST", f"{NS}/{name}/partitions", 2)[0] == 412  # never fewer
    assert error(broker, "POST", f"{NS}/{unique('none')}/partitions", 2)[0] == 404
    assert call(broker, "GET", f"{NS}/{name}/partitions")[1]["partitions"] == 5
    assert f"persistent://public/default/{name}" in call(broker, "GET", f"{NS}/partitioned")[1]
    listed = call(broker, "GET", NS)[1]
    assert all(f"persistent://public/default/{name}-partition-{i}" in listed for i in range(5))
    assert f"persistent://public/default/{name}-partition-0" in call(
        broker, "GET", "/admin/v2/namespaces/public/default/topics")[1]
    produce(broker, name, [b"x%d" % i for i in range(10)])
    stats = call(broker, "GET", f"{NS}/{name}/partitioned-stats")[1]
    assert stats["msgInCounter"] == 10 and stats["metadata"] == {"partitions": 5}
    assert len(stats["partitions"]) == 5
    assert call(broker, "GET", f"{NS}/{name}/internalStats")[1]["metadata"] == {"partitions": 5}
    assert call(broker, "DELETE", f"{NS}/{name}/partitions")[0] == 204
    assert call(broker, "GET", f"{NS}/{name}/partitions")[1]["partitions"] == 0
    assert not any(t.startswith(f"persistent://public/default/{name}-") for t in call(broker, "GET", NS)[1])

    plain = unique("t")
    assert call(broker, "PUT", f"{NS}/{plain}")[0] == 204
    volatile = unique("np")
    assert call(broker, "PUT", f"/admin/v2/non-persistent/public/default/{volatile}")[0] == 204
    assert f"non-persistent://public/default/{volatile}" in call(
        broker, "GET", "/admin/v2/non-persistent/public/default")[1]
    assert f"non-persistent://public/default/{volatile}" not in call(broker, "GET", NS)[1]
    assert error(broker, "PUT", f"{NS}/{plain}")[0] == 409
    assert error(broker, "GET", f"{NS}/{unique('missing')}/stats")[0] == 404
    assert error(broker, "GET", f"{NS}/{'x' * 300}/stats")[0] == 412  # a name the broker cannot store


def test_stats_internal_stats_subscriptions_skip_reset_and_peek(broker):
    name = unique("subs")
    path = f"{NS}/{name}"
    assert call(broker, "PUT", f"{path}/subscription/early", {"ledgerId": -1, "entryId": -1})[0] == 204
    assert error(broker, "PUT", f"{path}/subscription/early")[0] == 409
    produce(broker, name, [b"m%d" % i for i in range(6)], key=lambda p: "k" + p[-1:].decode())
    stats = call(broker, "GET", f"{path}/stats")[1]
    assert stats["msgInCounter"] == 6 and stats["storageSize"] > 0
    assert stats["subscriptions"]["early"]["msgBacklog"] == 6
    assert stats["subscriptions"]["early"]["type"] == "Exclusive"
    internal = call(broker, "GET", f"{path}/internalStats")[1]
    assert internal["numberOfEntries"] == 6 and internal["cursors"]["early"]["markDeletePosition"].endswith(":-1")
    assert call(broker, "GET", f"{path}/subscriptions")[1] == ["early"]

    status, body, headers = call(broker, "GET", f"{path}/subscription/early/position/2", raw=True)
    assert status == 200 and body == b"m1" and headers["X-Pulsar-partition-key"] == "k1"
    assert error(broker, "GET", f"{path}/subscription/early/position/99")[0] == 404
    assert error(broker, "GET", f"{path}/subscription/nope/position/1")[0] == 404

    assert call(broker, "POST", f"{path}/subscription/early/skip/2")[0] == 204
    assert call(broker, "GET", f"{path}/stats")[1]["subscriptions"]["early"]["msgBacklog"] == 4
    assert call(broker, "POST", f"{path}/subscription/early/skip_all")[0] == 204
    assert call(broker, "GET", f"{path}/stats")[1]["subscriptions"]["early"]["msgBacklog"] == 0
    assert call(broker, "POST", f"{path}/subscription/early/resetcursor/0")[0] == 204  # to the start
    assert call(broker, "GET", f"{path}/stats")[1]["subscriptions"]["early"]["msgBacklog"] == 6
    ledger = int(internal["lastConfirmedEntry"].split(":")[0])
    assert call(broker, "POST", f"{path}/subscription/early/resetcursor", {"ledgerId": ledger, "entryId": 4})[0] == 204
    assert call(broker, "GET", f"{path}/stats")[1]["subscriptions"]["early"]["msgBacklog"] == 2
    assert error(broker, "POST", f"{path}/subscription/early/resetcursor/yesterday")[0] == 412
    assert error(broker, "POST", f"{path}/subscription/early/resetcursor", {"ledgerId": "x"})[0] == 400

    async def consume_from_reset():  # a consumer attached after the reset starts from it
        async with Client(broker.url) as client:
            consumer = await client.subscribe(name, "early")
            got = [(await consumer.receive(5000)).data() for _ in range(2)]
            await consumer.close()
            return got
    assert asyncio.run(consume_from_reset()) == [b"m4", b"m5"]
    assert call(broker, "DELETE", f"{path}/subscription/early")[0] == 204
    assert error(broker, "DELETE", f"{path}/subscription/early")[0] == 404
    assert call(broker, "PUT", f"{path}/unload")[0] == 204
    terminated = call(broker, "POST", f"{path}/terminate")[1]
    assert terminated["entryId"] == 5 and terminated["ledgerId"] == ledger


def test_delete_refuses_a_topic_in_use_unless_forced(broker):
    name = unique("busy")
    client = pulsar.Client(broker.url)
    try:
        producer = client.create_producer(name)
        producer.send(b"x")
        assert error(broker, "DELETE", f"{NS}/{name}")[0] == 412
        assert call(broker, "DELETE", f"{NS}/{name}?force=true")[0] == 204
        assert error(broker, "GET", f"{NS}/{name}/stats")[0] == 404
    finally:
        client.close()


def test_compaction_then_a_compacted_read_gives_the_latest_value_per_key(broker):
    name = unique("compact")
    produce(broker, name, [b"a1", b"b1", b"a2", b"c1", b"b2", b"a3"], key=lambda p: p[:1].decode())
    assert call(broker, "GET", f"{NS}/{name}/compaction")[1]["status"] == "NOT_RUN"
    assert call(broker, "PUT", f"{NS}/{name}/compaction")[0] == 204
    deadline = time.monotonic() + 10
    while call(broker, "GET", f"{NS}/{name}/compaction")[1]["status"] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert call(broker, "GET", f"{NS}/{name}/compaction")[1] == {"status": "SUCCESS", "lastError": ""}
    client = pulsar.Client(broker.url)
    try:
        reader = client.create_reader(name, pulsar.MessageId.earliest, is_read_compacted=True)
        got = []
        while reader.has_message_available():
            got.append(reader.read_next(5000).data())
        assert got == [b"c1", b"b2", b"a3"]
        full = client.create_reader(name, pulsar.MessageId.earliest)  # not compacted: everything
        assert sum(1 for _ in iter(lambda: full.has_message_available() and full.read_next(5000), False)) == 6
    finally:
        client.close()


def test_schemas_get_post_versions_compatibility_and_delete(broker):
    name = unique("schema")
    base = f"/admin/v2/schemas/public/default/{name}"
    v1 = json.dumps({"type": "record", "name": "U", "fields": [{"name": "a", "type": "string"}]})
    v2 = json.dumps({"type": "record", "name": "U", "fields": [{"name": "a", "type": "string"},
                                                               {"name": "b", "type": "int", "default": 0}]})
    bad = json.dumps({"type": "record", "name": "U", "fields": [{"name": "c", "type": "int"}]})
    assert error(broker, "GET", f"{base}/schema")[0] == 404
    assert call(broker, "POST", f"{base}/schema", {"type": "AVRO", "schema": v1, "properties": {}})[1] == \
        {"version": {"version": 0}}
    assert call(broker, "POST", f"{base}/compatibility", {"type": "AVRO", "schema": v2})[1] == \
        {"isCompatibility": True, "schemaCompatibilityStrategy": "BACKWARD"}
    assert call(broker, "POST", f"{base}/schema", {"type": "AVRO", "schema": v2})[1]["version"] == {"version": 1}
    assert error(broker, "POST", f"{base}/schema", {"type": "AVRO", "schema": bad})[0] == 409
    assert error(broker, "POST", f"{base}/schema", {"type": "NOPE", "schema": ""})[0] == 400
    latest = call(broker, "GET", f"{base}/schema")[1]
    assert latest["version"] == 1 and latest["type"] == "AVRO" and json.loads(latest["data"])["fields"][1]["name"] == "b"
    assert call(broker, "GET", f"{base}/schema/0")[1]["data"] == v1
    assert [s["version"] for s in call(broker, "GET", f"{base}/schemas")[1]["getSchemaResponses"]] == [0, 1]
    assert call(broker, "DELETE", f"{base}/schema")[0] == 200
    assert error(broker, "GET", f"{base}/schema")[0] == 404


def test_bad_requests_get_json_reasons_never_tracebacks(broker):
    assert error(broker, "GET", "/admin/v2/no/such/path/at/all/here")[0] == 404
    assert error(broker, "PATCH", "/admin/v2/tenants")[0] == 405
    assert error(broker, "PUT", f"{NS}/{unique('j')}/partitions", data=b"{not json")[0] == 400
    assert error(broker, "PUT", f"{NS}/{unique('big')}/partitions", data=b"1" * (2 * 1024 * 1024))[0] == 413
    assert error(broker, "GET", f"{NS}/{unique('t')}/subscription/s/position/0")[0] == 412


def test_metrics_have_pulsar_names_and_labels(broker):
    name = unique("metrics")
    produce(broker, name, [b"x" * 100] * 5)
    client = pulsar.Client(broker.url)
    try:
        consumer = client.subscribe(name, "watch", initial_position=pulsar.InitialPosition.Earliest)
        consumer.receive(5000)
        status, body, headers = call(broker, "GET", "/metrics", raw=True)
    finally:
        client.close()
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = body.decode()
    labels = f'cluster="standalone",namespace="public/default",topic="persistent://public/default/{name}"'
    for metric in ("pulsar_rate_in", "pulsar_rate_out", "pulsar_storage_size", "pulsar_msg_backlog",
                   "pulsar_producers_count", "pulsar_consumers_count", "pulsar_subscriptions_count"):
        assert f"{metric}{{{labels}}}" in text, metric
    assert f"pulsar_in_messages_total{{{labels}}} 5.0" in text
    sub_labels = labels.replace(",topic=", ',subscription="watch",topic=')  # labels in name order
    assert f"pulsar_subscription_back_log{{{sub_labels}}} 5.0" in text
    assert "pulsar_active_connections{" in text and "pulsarwire_broker_connections{" in text
    assert "pulsarwire_storage_cache_bytes{" in text
    # the whole page is valid text format: prometheus_client's own parser reads every sample back
    from prometheus_client.parser import text_string_to_metric_families
    samples = {(s.name, s.labels.get("topic"), s.labels.get("subscription")): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    topic = f"persistent://public/default/{name}"
    assert samples[("pulsar_in_messages_total", topic, None)] == 5
    assert samples[("pulsar_subscription_back_log", topic, "watch")] == 5
    assert samples[("pulsar_consumers_count", topic, None)] == 1


def test_official_client_with_an_http_service_url(broker):
    """Lookup and partition metadata over HTTP, then produce and consume over the binary port."""
    name = unique("http")
    assert call(broker, "PUT", f"{NS}/{name}/partitions", 2)[0] == 204
    client = pulsar.Client(broker.broker.http_url, operation_timeout_seconds=10)
    try:
        consumer = client.subscribe(name, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(name)
        for i in range(4):
            producer.send(b"%d" % i)
        got = sorted(consumer.receive(5000).data() for _ in range(4))
        assert got == [b"0", b"1", b"2", b"3"]
        assert client.get_topic_partitions(name) == [f"persistent://public/default/{name}-partition-{i}"
                                                     for i in range(2)]
    finally:
        client.close()
    status, data, _ = call(broker, "GET", f"/lookup/v2/topic/persistent/public/default/{name}")
    assert status == 200 and data["brokerUrl"] == broker.url and data["httpUrl"] == broker.broker.http_url


def test_pulsarwire_client_with_an_http_service_url(broker):
    name = unique("http-ours")
    assert call(broker, "PUT", f"{NS}/{name}/partitions", 2)[0] == 204

    async def run():
        async with Client(broker.broker.http_url) as client:
            assert len(await client.get_topic_partitions(name)) == 2
            consumer = await client.subscribe(name, "s", initial_position=InitialPosition.Earliest)
            producer = await client.create_producer(name)
            for i in range(4):
                await producer.send(b"%d" % i)
            got = sorted([(await consumer.receive(5000)).data() for _ in range(4)])
            assert f"persistent://public/default/{name}-partition-0" in \
                await client.get_topics_of_namespace("public/default")
            return got
    assert asyncio.run(run()) == [b"0", b"1", b"2", b"3"]


def test_token_auth_as_on_the_binary_port(tmp_path):
    thread = BrokerThread(tmp_path, v1_port=None, http_port=0, auth_tokens={"secret"}).start()
    try:
        status, reason = error(thread, "GET", "/admin/v2/tenants")
        assert status == 401
        assert error(thread, "GET", "/admin/v2/tenants", token="wrong")[0] == 401
        assert error(thread, "GET", "/metrics")[0] == 401
        assert call(thread, "GET", "/admin/v2/tenants", token="secret")[1] == ["public"]
        client = pulsar.Client(thread.broker.http_url, authentication=pulsar.AuthenticationToken("secret"))
        try:
            client.create_producer(unique("auth")).send(b"x")
        finally:
            client.close()
    finally:
        thread.stop()


def test_connections_past_the_bound_get_503(tmp_path):
    thread = BrokerThread(tmp_path, v1_port=None, http_port=0, max_http_connections=2).start()
    held = []
    try:
        port = thread.broker.http_port
        for _ in range(2):
            held.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", port))
        extra.settimeout(5)
        assert extra.recv(100).startswith(b"HTTP/1.1 503")
        extra.close()
        for s in held:
            s.close()
        held.clear()
        time.sleep(0.2)
        assert call(thread, "GET", "/admin/v2/tenants")[0] == 200
        assert thread.broker.admin.refused_connections == 1
    finally:
        for s in held:
            s.close()
        thread.stop()


def admin_cli(broker, *args):
    return subprocess.run([sys.executable, "-m", "pulsarwire", "admin", "--admin-url", broker.broker.http_url, *args],
                          capture_output=True, text=True, timeout=60)


def test_admin_cli_output(broker):
    name = unique("cli")
    topic = f"persistent://public/default/{name}"
    assert admin_cli(broker, "topics", "create-partitioned-topic", topic, "-p", "2").returncode == 0
    listed = admin_cli(broker, "topics", "list", "public/default")
    assert f"{topic}-partition-1" in json.loads(listed.stdout)
    one = f"{name}-single"
    produce(broker, one, [b"hello", b"world"])
    assert admin_cli(broker, "topics", "create-subscription", one, "-s", "sub", "-m", "earliest").returncode == 0
    assert json.loads(admin_cli(broker, "topics", "subscriptions", one).stdout) == ["sub"]
    stats = json.loads(admin_cli(broker, "topics", "stats", one).stdout)
    assert stats["subscriptions"]["sub"]["msgBacklog"] == 2
    peek = admin_cli(broker, "topics", "peek-messages", one, "-s", "sub", "-n", "2")
    assert peek.returncode == 0 and peek.stdout.count("Message ID:") == 2 and "|hello" in peek.stdout
    assert admin_cli(broker, "topics", "reset-cursor", one, "-s", "sub", "-t", "1h").returncode == 0
    assert admin_cli(broker, "namespaces", "create", "public/cli-ns").returncode == 0
    assert "public/cli-ns" in json.loads(admin_cli(broker, "namespaces", "list", "public").stdout)
    assert admin_cli(broker, "namespaces", "set-deduplication", "public/cli-ns", "--enable").returncode == 0
    assert admin_cli(broker, "namespaces", "get-deduplication", "public/cli-ns").stdout.strip() == "true"
    refused = admin_cli(broker, "topics", "create-partitioned-topic", topic, "-p", "2")
    assert refused.returncode == 1 and "HTTP 409" in refused.stderr and "Traceback" not in refused.stderr
    assert admin_cli(broker, "topics", "delete", one, "--force").returncode == 0
    assert "--partitions" in admin_cli(broker, "topics", "create-partitioned-topic", "--help").stdout
    unreachable = subprocess.run([sys.executable, "-m", "pulsarwire", "admin", "--admin-url", "http://127.0.0.1:1",
                                  "tenants", "list"], capture_output=True, text=True, timeout=60)
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr
