"""The command line: the main job and perf (on a broker they start, or a service URL), produce/consume
(on a running broker), the broker's own flags."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

from .conftest import unique


def pulsarwire(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "pulsarwire", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_main_job_reports_throughput(tmp_path):
    out = tmp_path / "report.json"
    result = pulsarwire("-n", "3000", "-s", "200", "--quiet", "-z", "LZ4", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "embedded broker at pulsar://127.0.0.1:" in result.stdout
    assert "OK: 3,000 produced, 3,000 consumed" in result.stdout
    assert "msg/s" in result.stdout and "p99 ms" in result.stdout
    report = json.loads(out.read_text())
    assert [r["role"] for r in report["results"]] == ["produce", "e2e"]
    assert report["results"][0]["messages"] == 3000


def test_perf_and_produce_consume_against_a_service_url(embedded):
    topic = unique("cli")
    result = pulsarwire("perf", "produce", "--service-url", embedded.url, "--topic", topic, "-n", "500",
                        "--quiet", "--no-batching")
    assert result.returncode == 0, result.stderr
    assert "produce" in result.stdout and "500" in result.stdout
    sent = pulsarwire("produce", "--service-url", embedded.url, topic, "-m", "hello", "-k", "key")
    assert sent.returncode == 0 and sent.stdout.startswith("sent ")
    got = pulsarwire("consume", "--service-url", embedded.url, topic, "--earliest", "-n", "501")
    assert got.returncode == 0, got.stderr
    assert "key=key b'hello'" in got.stdout


def test_errors_are_reported_not_dumped():
    result = pulsarwire("perf", "produce", "--service-url", "pulsar://127.0.0.1:1", "--operation-timeout", "1",
                        "-n", "1", "--quiet", timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("pulsarwire: error: ConnectTimeoutError")
    assert "Traceback" not in result.stderr
    assert pulsarwire("--version").stdout.startswith("pulsarwire ")


def _stop(broker: subprocess.Popen, signum: int) -> str:
    """Signal a broker process and wait for it to end; its stderr, which a stop that hangs shows
    in the failure."""
    broker.send_signal(signum)
    try:
        _, stderr = broker.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        broker.kill()
        _, stderr = broker.communicate()
        raise AssertionError(f"the broker did not stop within 90 s of signal {signum}; its stderr:\n{stderr}")
    return stderr


def test_a_partitioned_topic_flag_the_broker_cannot_honour_stops_it(tmp_path):
    data = str(tmp_path / "data")
    base = ["broker", "--http-port", "-1", "--data-dir", data, "--port", "0", "--v1-port", "-1"]
    for spec in ("orders=x", "orders=0", "orders=-2"):
        refused = pulsarwire(*base, "--partitioned-topic", spec, timeout=30)
        assert refused.returncode == 2 and "takes TOPIC=N" in refused.stderr, (spec, refused.stderr)
    broker = subprocess.Popen([sys.executable, "-m", "pulsarwire", *base, "--partitioned-topic", "orders=3"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert broker.stdout.readline().startswith("broker: pulsar://127.0.0.1:")
    finally:
        # SIGTERM: a test run in the background of a non-interactive shell has SIGINT ignored,
        # and the broker inherits that
        _stop(broker, signal.SIGTERM)
    # fewer partitions would hide what the others hold; a bad name is reported, not skipped
    for spec, says in (("orders=2", "never removed"), ("a//b=2", "invalid topic name")):
        refused = pulsarwire(*base, "--partitioned-topic", spec, timeout=30)
        assert refused.returncode == 2 and says in refused.stderr, (spec, refused.stderr)


def test_produce_and_consume_talk_to_a_running_broker_never_a_throwaway_one(embedded):
    from pulsarwire.cli import DEFAULT_SERVICE_URL, parse_args
    # without a URL: where `pulsarwire broker` listens by default, not a temporary broker that
    # would take the messages and drop them
    assert parse_args(["produce", "t", "-m", "x"]).service_url == DEFAULT_SERVICE_URL == "pulsar://127.0.0.1:6650"
    assert parse_args(["consume", "t"]).service_url == DEFAULT_SERVICE_URL
    assert parse_args(["perf", "produce"]).service_url is None  # a load test may start its own
    # client options given before the subcommand are kept, not reset by the subcommand's defaults
    args = parse_args(["--service-url", "pulsar://h:1", "--token", "t0", "--operation-timeout", "3", "consume", "t"])
    assert (args.service_url, args.token, args.operation_timeout) == ("pulsar://h:1", "t0", 3)
    assert parse_args(["consume", "t"]).operation_timeout == 30
    topic = unique("cli-global")
    sent = pulsarwire("--service-url", embedded.url, "produce", topic, "-m", "kept")
    assert sent.returncode == 0, sent.stderr
    got = pulsarwire("--service-url", embedded.url, "consume", topic, "--earliest", "--timeout", "10")
    assert got.returncode == 0 and "b'kept'" in got.stdout, got.stderr


def test_sigterm_stops_the_broker_as_ctrl_c_does(tmp_path):
    from pulsarwire import InitialPosition
    from pulsarwire.blocking import Client
    from .peers import free_port
    port = free_port()
    command = [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", str(tmp_path), "--port", str(port),
               "--v1-port", "-1"]
    broker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert broker.stdout.readline().startswith("broker: ")
        with Client(f"pulsar://127.0.0.1:{port}") as client:
            producer = client.create_producer("t", batching_enabled=False)  # an ack of one entry each
            consumer = client.subscribe("t", "s", initial_position=InitialPosition.Earliest, ack_group_time_ms=0)
            producer.send_many([b"1", b"2"])
            consumer.acknowledge(consumer.receive(5000))
            producer.send(b"3")  # on the same connection after the ack: the broker has the ack
        err = _stop(broker, signal.SIGTERM)  # before the 0.2 s cursor round: the stop writes the cursor
        assert broker.returncode == 0 and "Traceback" not in err, err
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait()
    broker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert broker.stdout.readline().startswith("broker: ")
        with Client(f"pulsar://127.0.0.1:{port}") as client:
            assert client.subscribe("t", "s").receive(5000).data() == b"2"
    finally:
        _stop(broker, signal.SIGTERM)
    assert broker.returncode == 0


def test_the_broker_process_freezes_what_it_started_with_and_collects_young_objects_less_often():
    code = ("import gc; from pulsarwire import cli; before = gc.get_threshold(); cli._tune_collector(); "
            "after = gc.get_threshold(); print(gc.get_freeze_count() > 0, after[0], after[1:] == before[1:])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "10000", "True"], out.stderr


def test_broker_flags_are_the_settings_fields_with_the_keywords_defaults():
    import dataclasses

    from pulsarwire.broker.settings import BrokerSettings, flag_name, flags, from_flags
    from pulsarwire.cli import parse_args
    # `pulsarwire broker` with no flags: the settings of Broker(data_dir), but for the ports it serves
    given = BrokerSettings(**from_flags(vars(parse_args(["broker"]))))
    assert given == dataclasses.replace(BrokerSettings(), port=6650, v1_port=6680, http_port=8080)
    assert {flag_name(field) for field in flags()} >= {"--max-connections", "--tenant", "--grant", "--port"}
    # -1 turns a port off; repeatable flags make the keywords' collections
    args = parse_args(["broker", "--port", "-1", "--tenant", "a", "--grant", "t/n=r", "--grant", "t/n=s",
                       "--auth-basic", "u:p:q", "--advertised-listener", "x=pulsar://h:1"])
    given = BrokerSettings(**from_flags(vars(args)))
    assert (given.port, given.tenants, given.grants) == (None, ("a",), {"t/n": {"r", "s"}})
    assert (given.auth_basic, given.advertised_listeners) == ({"u": "p:q"}, {"x": "pulsar://h:1"})


def test_a_paced_perf_run_wakes_its_loop_at_each_send_time():
    """perf's --rate sends: asyncio's own loop waits whole milliseconds, so they are paced by a
    thread's wake-ups there (timers.call_at: never early, later than asyncio.sleep at the median
    never), and by the loop's own timers on pulsarwire's loop, whose timers are precise."""
    import asyncio
    import time

    from pulsarwire import blocking, perf

    async def lateness(wait):
        late = []
        for _ in range(30):
            due = time.monotonic() + 0.0003
            await wait(due)
            late.append(time.monotonic() - due)
        return sorted(late)[len(late) // 2], min(late)

    async def compare():
        loop = asyncio.get_running_loop()
        paced = await lateness(lambda due: perf.pace_until(loop, due))
        slept = await lateness(lambda due: asyncio.sleep(due - time.monotonic()))
        return paced, slept

    (paced_median, paced_min), (slept_median, _) = asyncio.run(compare())
    assert paced_min >= 0 and paced_median < slept_median  # asyncio.sleep(0.0003) takes a whole ms here
    stock = asyncio.new_event_loop()
    loop = blocking.new_event_loop()
    try:
        assert blocking.has_precise_timers(loop) and not blocking.has_precise_timers(stock)
    finally:
        loop.close()
        stock.close()
