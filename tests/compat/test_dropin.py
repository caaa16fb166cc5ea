"""The official client's surface (`pulsarwire.sync`, `pulsarwire.asyncio`) beyond what the
compatibility corpus compares: names, error classes that are both official and pulsarwire's,
and the threads callbacks and listeners run on."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

import pulsarwire.asyncio as pulsar_asyncio
import pulsarwire.sync as pulsar
from pulsarwire import errors

from ..conftest import unique

# official names pulsarwire does not offer: type-hint imports, Pulsar Functions, C++ plugin and
# failover machinery, encryption contexts, the raw batch parser (README lists them)
NOT_OFFERED = {"List", "Optional", "Tuple", "Union", "Callable", "Context", "Function", "SerDe", "IdentitySerDe",
               "PickleSerDe", "functions", "AutoClusterFailover", "ServiceInfo", "ServiceInfoProvider",
               "DeadLetterPolicyBuilder", "EncryptionContext", "EncryptionKey", "MessageBatch", "exceptions",
               "tableview", "logging", "re", "schema"}


def test_every_official_name_is_offered():
    official = pytest.importorskip("pulsar")
    import pulsar.asyncio as official_asyncio
    missing = sorted(n for n in dir(official) if not n.startswith("_") and n not in NOT_OFFERED
                     and not hasattr(pulsar, n))
    assert not missing
    missing = sorted(n for n in dir(official_asyncio) if not n.startswith("_")
                     and n not in {"List", "Union", "Any", "Callable", "functools", "pulsar"}
                     and not hasattr(pulsar_asyncio, n))
    assert not missing
    assert {r.name: r.value for r in pulsar.Result} == {n: int(v) for n, v in official.Result.__members__.items()}
    for enum_name in ("CompressionType", "ConsumerType", "InitialPosition", "PartitionsRoutingMode",
                      "ProducerAccessMode", "KeySharedMode", "BatchingType", "RegexSubscriptionMode"):
        ours, theirs = getattr(pulsar, enum_name), getattr(official, enum_name)
        assert {m.name: m.value for m in ours} == {n: int(v) for n, v in theirs.__members__.items()}, enum_name
    assert pulsar.asyncio is pulsar_asyncio  # `import pulsar.asyncio` works after swapping the import


def test_message_id_has_the_official_constructor_and_accessors():
    mid = pulsar.MessageId(partition=2, ledger_id=7, entry_id=9, batch_index=3)
    assert (mid.partition(), mid.ledger_id(), mid.entry_id(), mid.batch_index()) == (2, 7, 9, 3)
    assert str(mid) == "(7,9,2,3)" and str(pulsar.MessageId.earliest) == "(-1,-1,-1,-1)"
    assert pulsar.MessageId.deserialize(mid.serialize()) == mid
    assert pulsar.MessageId.earliest < mid < pulsar.MessageId.latest
    assert str(pulsar.Result.ProducerQueueIsFull) == "Result.ProducerQueueIsFull"


def test_official_errors_are_pulsarwire_errors_too(embedded):
    client = pulsar.Client(embedded.url, operation_timeout_seconds=10)
    try:
        consumer = client.subscribe(unique(), "s")
        with pytest.raises(pulsar.Timeout) as caught:
            consumer.receive(50)
        assert isinstance(caught.value, errors.TimeoutError) and isinstance(caught.value, pulsar.PulsarException)
        assert caught.value.error() == pulsar.Result.Timeout
        consumer.close()
        with pytest.raises(errors.ConnectionClosedError):  # AlreadyClosed is pulsarwire's closed error too
            consumer.receive(50)
    finally:
        client.close()


def test_async_errors_carry_the_result(embedded):
    async def main():
        client = pulsar_asyncio.Client(embedded.url)
        producer = await client.create_producer(unique())
        await producer.close()
        with pytest.raises(pulsar_asyncio.PulsarException) as caught:
            await producer.send(b"late")
        assert caught.value.error() == pulsar.Result.AlreadyClosed
        assert str(caught.value) == "15 AlreadyClosed" and isinstance(caught.value, errors.ConnectionClosedError)
        await client.close()
    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_blocking_call_in_a_send_callback_fails_instead_of_hanging(embedded):
    client = pulsar.Client(embedded.url)
    try:
        producer = client.create_producer(unique())
        outcome = []
        done = threading.Event()

        def callback(result, message_id):
            try:
                producer.send(b"from the callback")  # would wait for the thread it runs on
            except RuntimeError as error:
                outcome.append(str(error))
            producer.send_async(b"queued from the callback", lambda result, _: (outcome.append(result), done.set()))
        producer.send_async(b"first", callback)
        assert done.wait(10) and "callback" in outcome[0] and outcome[1] == pulsar.Result.Ok
    finally:
        client.close()


def test_listener_runs_on_its_own_thread_and_may_block(embedded):
    topic = unique()
    client = pulsar.Client(embedded.url)
    try:
        replies = client.create_producer(topic + "-replies")
        got = []

        def listener(consumer, message):
            replies.send(b"re: " + message.data())  # a blocking call is fine on the listener thread
            consumer.acknowledge(message)
            got.append(threading.current_thread().name)
        consumer = client.subscribe(topic, "s", message_listener=listener)
        with pytest.raises(pulsar.InvalidConfiguration):
            consumer.receive(10)
        reply_consumer = client.subscribe(topic + "-replies", "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        for i in range(3):
            producer.send(b"%d" % i)
        assert [reply_consumer.receive(5000).data() for _ in range(3)] == [b"re: 0", b"re: 1", b"re: 2"]
        assert set(got) == {"pulsarwire-listener-0"}
    finally:
        client.close()


def test_shutdown_releases_a_blocked_receive(embedded):
    client = pulsar.Client(embedded.url)
    consumer = client.subscribe(unique(), "s")
    outcome = []

    def wait():
        try:
            consumer.receive()
        except Exception as error:  # noqa: BLE001
            outcome.append(error)
    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)
    client.shutdown()
    waiter.join(10)
    assert not waiter.is_alive() and isinstance(outcome[0], pulsar.AlreadyClosed)
    with pytest.raises(pulsar.AlreadyClosed):
        client.create_producer(unique())


def test_unsupported_options_fail_clearly(embedded):
    client = pulsar.Client(embedded.url, io_threads=8, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        with pytest.raises(pulsar.OperationNotSupported):
            client.create_producer(unique(), encryption_key="key")
        with pytest.raises(ValueError):
            client.subscribe(unique(), "s", consumer_type=1)  # the official client checks enum types too
        with pytest.raises(NotImplementedError):
            pulsar.Authentication("libauth.so", "")
    finally:
        client.close()


def test_keys_hash_as_the_official_client_routes_them():
    from pulsarwire.routing import HashingScheme, Router, boost_hash
    # partitions the official Python client chose for key-0..key-11 on a 3-partition topic
    assert [boost_hash("key-%d" % i) % 3 for i in range(12)] == [0, 0, 1, 2, 1, 1, 0, 2, 2, 0, 2, 2]
    # every length class of the hash (0, 1-3, 4-7, 8+ bytes; UTF-8), matched with the official
    # client on a 97-partition topic
    expected = {"": 2133126054, "a": 2135870748, "abcd": 246651746, "abcdefgh": 1534298190,
                "héllo wörld": 816086940, "x" * 33: 93586335}
    assert {key: boost_hash(key) for key in expected} == expected
    assert {key: value % 97 for key, value in expected.items()} == \
        {key: Router(HashingScheme.BoostHash).partition(key, 97) for key in expected}


# (surface, method): the methods made from the option tables of pulsarwire.official_options
OFFICIAL_SIGNATURES = [("sync", "__init__"), ("sync", "create_producer"), ("sync", "subscribe"),
                       ("sync", "create_reader"), ("asyncio", "create_producer"), ("asyncio", "subscribe"),
                       ("asyncio", "create_reader")]


@pytest.mark.parametrize("surface, method", OFFICIAL_SIGNATURES, ids=[".".join(m) for m in OFFICIAL_SIGNATURES])
def test_signatures_are_the_official_ones(surface, method):
    """Names, order (positional calls bind alike) and defaults as the official client's; the
    official default schema is a BytesSchema where pulsarwire's is None, which means the same."""
    import inspect
    official = pytest.importorskip("pulsar")
    import pulsar.asyncio as official_asyncio
    theirs = inspect.signature(getattr((official if surface == "sync" else official_asyncio).Client, method))
    ours = inspect.signature(getattr((pulsar if surface == "sync" else pulsar_asyncio).Client, method))
    assert list(ours.parameters) == list(theirs.parameters)
    for name, parameter in ours.parameters.items():
        official_default = theirs.parameters[name].default
        assert parameter.kind == theirs.parameters[name].kind, name
        if name == "schema":
            assert parameter.default is None and type(official_default).__name__ in ("BytesSchema", "NoneType")
        elif hasattr(official_default, "value"):  # an official enum (pybind11)
            assert int(parameter.default) == int(official_default.value), name
        else:
            assert parameter.default == official_default, name
    assert inspect.iscoroutinefunction(getattr(pulsar_asyncio.Client, "subscribe"))


def test_async_client_takes_the_official_client_keywords_only():
    client = pulsar_asyncio.Client("pulsar://localhost:6650", io_threads=2, operation_timeout_seconds=5,
                                   logger=pulsar.ConsoleLogger())
    assert client._options["operation_timeout_seconds"] == 5
    with pytest.raises(TypeError, match="unexpected keyword argument 'operation_timeout'"):
        pulsar_asyncio.Client("pulsar://localhost:6650", operation_timeout=5)


@pytest.mark.parametrize("module", ["official", "sync", "asyncio", "blocking"])
def test_each_surface_imports_alone_without_starting_threads(module):
    import subprocess
    import sys
    code = (f"import threading, pulsarwire.{module} as m; "
            "assert threading.active_count() == 1, threading.enumerate(); "
            "import asyncio; assert asyncio.__file__ != getattr(m, '__file__', None)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_closing_a_consumer_ends_a_receive_blocked_in_another_thread(embedded):
    client = pulsar.Client(embedded.url)
    try:
        consumer = client.subscribe(unique(), "s")
        outcome = []
        waiter = threading.Thread(target=lambda: outcome.append(_error_of(consumer.receive)))
        waiter.start()
        time.sleep(0.2)
        consumer.close()
        waiter.join(10)
        assert not waiter.is_alive() and isinstance(outcome[0], pulsar.AlreadyClosed)
    finally:
        client.close()


def _error_of(call):
    try:
        call()
    except Exception as error:  # noqa: BLE001
        return error
    return None


def test_async_client_made_outside_a_loop_starts_on_the_first_call(embedded):
    client = pulsar_asyncio.Client(embedded.url, io_threads=4)  # no running loop yet

    async def main():
        topic = unique()
        consumer = await client.subscribe(topic, "s")
        producer = await client.create_producer(topic, batching_enabled=False)
        sent = await producer.send(b"hello", deliver_after=None)
        message = await consumer.receive()
        assert message.data() == b"hello" and message.message_id() == sent
        await client.close()
        with pytest.raises(pulsar_asyncio.PulsarException):
            await client.create_producer(topic)
    asyncio.run(asyncio.wait_for(main(), 30))


def test_records_declared_either_way_share_a_topic(embedded):
    official = pytest.importorskip("pulsar")
    import pulsar.schema as theirs

    from pulsarwire import records, schema as ours

    def declare(module):
        class Address(module.Record):
            street = module.String()

        class Order(module.Record):
            _avro_namespace = "shop"
            id = module.String(required=True)
            quantity = module.Integer(default=1, required_default=True)
            address = Address()
            lines = module.Array(module.Double())
        return Order

    their_order, our_order = declare(theirs), declare(records)
    assert our_order.schema() == their_order.schema()
    topic = unique("records")
    reader_client = pulsar.Client(embedded.url)
    writer_client = official.Client(embedded.url, logger=official.ConsoleLogger(official.LoggerLevel.Error))
    try:
        consumer = reader_client.subscribe(topic, "s", schema=ours.JsonSchema(our_order))
        producer = writer_client.create_producer(topic, schema=theirs.JsonSchema(their_order))
        producer.send(their_order(id="o-1", quantity=3, address=their_order._fields["address"].__class__(
            street="main"), lines=[1.5, 2.0]))
        got = consumer.receive(5000).value()
        assert (type(got), got.id, got.quantity, got.address.street, got.lines) == \
            (our_order, "o-1", 3, "main", [1.5, 2.0])
    finally:
        writer_client.close()
        reader_client.close()


def test_an_interrupted_blocking_call_leaves_nothing_running_on_the_loop(embedded):
    from pulsarwire.blocking import LoopThread
    loop = LoopThread()
    try:
        with pytest.raises(Exception):
            loop.run(asyncio.sleep(30), timeout=0.05)  # as a Ctrl-C would interrupt a receive

        async def pending():
            await asyncio.sleep(0.05)
            return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert loop.run(pending()) == []
    finally:
        loop.stop()


def test_closing_from_a_send_callback(embedded):
    client = pulsar.Client(embedded.url)
    producer = client.create_producer(unique())
    outcome = []
    done = threading.Event()

    def callback(result, message_id):
        outcome.append(_error_of(client.close))  # would wait for this very thread
        client.shutdown()  # closes at once
        done.set()
    producer.send_async(b"x", callback)
    assert done.wait(10) and isinstance(outcome[0], RuntimeError)
    with pytest.raises(pulsar.AlreadyClosed):
        producer.send(b"late")


def test_send_async_is_queued_in_the_callers_thread_and_a_full_queue_is_refused_at_the_call(embedded):
    client = pulsar.Client(embedded.url)
    try:
        producer = client.create_producer(unique(), max_pending_messages=1)
        hold = threading.Event()
        client._loop.loop.call_soon_threadsafe(hold.wait, 10)  # the loop can answer nothing meanwhile
        outcomes = []
        for index in range(3):
            producer.send_async(b"%d" % index, lambda result, _: outcomes.append(result))
        # returned without the loop: one accepted, two refused at once, as the official client does
        assert outcomes == [pulsar.Result.ProducerQueueIsFull] * 2
        hold.set()
        producer.flush()
        assert outcomes == [pulsar.Result.ProducerQueueIsFull] * 2 + [pulsar.Result.Ok]
    finally:
        client.close()


def test_sends_from_several_calls_keep_their_order_through_a_blocking_full_queue(embedded):
    client = pulsar.Client(embedded.url)
    try:
        topic = unique()
        consumer = client.subscribe(topic, "order")
        producer = client.create_producer(topic, max_pending_messages=3, block_if_queue_full=True)
        answered = []
        for index in range(200):
            if index % 50 == 49:
                producer.send(b"%d" % index)
                answered.append(pulsar.Result.Ok)
            else:
                producer.send_async(b"%d" % index, lambda result, _: answered.append(result))
        producer.flush()
        assert answered == [pulsar.Result.Ok] * 200
        assert [consumer.receive(5000).data() for _ in range(200)] == [b"%d" % i for i in range(200)]
        producer.close()
        late = []
        producer.send_async(b"late", lambda result, _: late.append(result))
        assert late == [pulsar.Result.AlreadyClosed]
    finally:
        client.close()


def test_a_send_waiting_for_room_answers_already_closed_when_the_client_closes(embedded):
    client = pulsar.Client(embedded.url)
    producer = client.create_producer(unique(), max_pending_messages=1, block_if_queue_full=True)
    hold = threading.Event()
    client._loop.loop.call_soon_threadsafe(hold.wait, 10)
    producer.send_async(b"first", None)  # accepted: the queue is now full
    outcome = []
    waiter = threading.Thread(target=lambda: outcome.append(_error_of(lambda: producer.send(b"second"))))
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive() and not outcome  # waiting for room
    producer._stop_listening()  # what client.close() does first to each handle
    waiter.join(5)
    hold.set()
    client.close()
    assert isinstance(outcome[0], pulsar.AlreadyClosed)


def test_client_close_sends_what_send_async_had_queued(embedded):
    client = pulsar.Client(embedded.url)
    topic = unique()
    producer = client.create_producer(topic, batching_enabled=True, batching_max_messages=10)
    hold = threading.Event()
    client._loop.loop.call_soon_threadsafe(hold.wait, 10)  # sends stay queued in the facade meanwhile
    outcomes = []
    for index in range(200):
        producer.send_async(b"%d" % index, lambda result, _: outcomes.append(result))
    threading.Timer(0.2, hold.set).start()
    client.close()  # sends what is pending, as producer.close() does
    assert outcomes == [pulsar.Result.Ok] * 200
    check = pulsar.Client(embedded.url)
    try:
        reader = check.create_reader(topic, pulsar.MessageId.earliest)
        assert [reader.read_next(5000).data() for _ in range(200)] == [b"%d" % i for i in range(200)]
    finally:
        check.close()


def test_a_send_timeout_ends_a_blocking_send(tmp_path):
    # The send's TimeoutError is also the builtin TimeoutError, which concurrent.futures raises for
    # "not answered yet": send() once took it for the latter and waited forever.
    from ..peers import BrokerThread
    broker = BrokerThread(tmp_path, v1_port=None).start()
    client = pulsar.Client(broker.url, operation_timeout_seconds=2)
    try:
        producer = client.create_producer(unique(), send_timeout_millis=500)
        producer.send(b"before")
        broker.stop()  # nothing will be acknowledged now
        started = time.monotonic()
        outcome = []
        sender = threading.Thread(target=lambda: outcome.append(_error_of(lambda: producer.send(b"lost"))),
                                  daemon=True)
        sender.start()
        sender.join(15)
        assert outcome and isinstance(outcome[0], pulsar.Timeout), outcome
        assert time.monotonic() - started < 10
    finally:
        client.shutdown()
        broker.stop()


def test_send_async_refuses_a_callback_that_cannot_be_called(embedded):
    client = pulsar.Client(embedded.url)
    try:
        producer = client.create_producer(unique())
        with pytest.raises(TypeError, match="callable"):
            producer.send_async(b"x", "not a function")  # once only logged when the receipt came
        producer.send_async(b"y", None)  # None: no callback, as the official client allows
        producer.flush()
    finally:
        client.close()


def test_listener_name_gets_the_advertised_listener_and_an_unknown_one_is_refused(tmp_path):
    from ..peers import BrokerThread
    broker = BrokerThread(tmp_path, v1_port=None, sync_policy="never").start()
    try:
        # the listener's URL is this broker itself: a lookup naming it connects there
        broker.call(lambda: broker.broker.pulsar.advertised_listeners.update(internal=broker.url))
        client = pulsar.Client(broker.url, listener_name="internal", operation_timeout_seconds=5)
        try:
            producer = client.create_producer(unique())
            assert producer.send(b"x").entry_id() == 0
        finally:
            client.close()
        # a listener the broker lacks: the refused lookup is retried until the operation
        # timeout, as the official client does
        client = pulsar.Client(broker.url, listener_name="elsewhere", operation_timeout_seconds=2)
        try:
            with pytest.raises(pulsar.Timeout):
                client.create_producer(unique())
        finally:
            client.close()
    finally:
        broker.stop()


def test_a_topic_of_an_unknown_tenant_is_not_found_and_stored_tenants_stay(tmp_path):
    from ..peers import BrokerThread
    broker = BrokerThread(tmp_path, v1_port=None, sync_policy="never", tenants=("configured",)).start()
    try:
        client = pulsar.Client(broker.url, operation_timeout_seconds=5)
        try:
            with pytest.raises(pulsar.TopicNotFound):
                client.create_producer("persistent://nobody/ns/t")
            with pytest.raises(pulsar.TopicNotFound):
                client.subscribe("nobody/ns/t", "sub")
            client.create_producer("persistent://configured/ns/t").send(b"kept")
            client.create_producer("persistent://pulsar/system/t").close()
        finally:
            client.close()
        broker.options["tenants"] = ()
        broker.restart()  # not configured any more: its stored topic keeps the tenant reachable
        client = pulsar.Client(broker.url, operation_timeout_seconds=5)
        try:
            reader = client.create_reader("persistent://configured/ns/t", pulsar.MessageId.earliest)
            assert reader.read_next(5000).data() == b"kept"
        finally:
            client.close()
    finally:
        broker.stop()


def test_official_objects_are_taken_where_they_mean_the_same(embedded):
    official = pytest.importorskip("pulsar")
    client = pulsar.Client(embedded.url)
    try:
        topic = unique()
        consumer = client.subscribe(topic, "s", consumer_type=official.ConsumerType.Shared,
                                    initial_position=official.InitialPosition.Earliest)
        producer = client.create_producer(topic, compression_type=official.CompressionType.ZLib)
        sent = producer.send(b"one")
        assert consumer.receive(5000).data() == b"one"
        consumer.acknowledge(official.MessageId.deserialize(sent.serialize()))
        reader = client.create_reader(topic, official.MessageId.earliest)
        assert reader.read_next(5000).data() == b"one"
        with pytest.raises(ValueError, match="pulsarwire.sync.AuthenticationToken"):
            pulsar.Client(embedded.url, authentication=official.AuthenticationToken("token"))
    finally:
        client.close()
    assert pulsar.MessageId(1, 2, 3, 4).serialize() == official.MessageId(1, 2, 3, 4).serialize()
    assert pulsar.MessageId(ledger_id=5, entry_id=6).serialize() == \
        official.MessageId(ledger_id=5, entry_id=6).serialize()


def test_error_messages_read_as_the_official_clients(embedded):
    client = pulsar.Client(embedded.url)
    try:
        consumer = client.subscribe(unique(), "s")
        with pytest.raises(pulsar.Timeout) as caught:
            consumer.receive(10)
        assert str(caught.value) == "Pulsar error: TimeOut"
        assert isinstance(caught.value.__cause__, errors.TimeoutError)  # pulsarwire's detail stays there
    finally:
        client.close()


def test_a_blocked_call_on_the_main_thread_is_interrupted_by_a_signal_sent_elsewhere(embedded):
    import signal
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, handler)
    client = pulsar.Client(embedded.url)
    try:
        consumer = client.subscribe(unique(), "s")
        threading.Timer(0.3, signal.raise_signal, (signal.SIGUSR1,)).start()  # delivered to the timer's thread
        with pytest.raises(pulsar.Interrupted):  # not Timeout: the wait saw the signal
            consumer.receive(20_000)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        client.close()


def test_a_records_json_bytes_are_written_as_the_official_client_writes_them():
    from pulsarwire.schema import Bytes, JsonSchema, Record, String

    class Sample(Record):
        name = String()
        blob = Bytes()

    ours = JsonSchema(Sample)
    encoded = ours.encode(Sample(name="n", blob=b"raw"))
    assert ours.decode(encoded).blob == b"raw"  # it comes back as it went
    official_schema = pytest.importorskip("pulsar.schema")

    class OfficialSample(official_schema.Record):
        name = official_schema.String()
        blob = official_schema.Bytes()

    theirs = official_schema.JsonSchema(OfficialSample)
    assert theirs.decode(encoded).blob == b"raw"
    assert ours.decode(theirs.encode(OfficialSample(name="n", blob=b"raw"))).blob == b"raw"
