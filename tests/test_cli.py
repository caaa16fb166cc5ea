"""The command line: the main job, perf, produce/consume against a broker it starts."""
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


def test_a_partitioned_topic_flag_the_broker_cannot_honour_stops_it(tmp_path):
    data = str(tmp_path / "data")
    base = ["broker", "--data-dir", data, "--port", "0", "--v1-port", "-1"]
    for spec in ("orders=x", "orders=0", "orders=-2"):
        refused = pulsarwire(*base, "--partitioned-topic", spec, timeout=30)
        assert refused.returncode == 2 and "takes TOPIC=N" in refused.stderr, (spec, refused.stderr)
    broker = subprocess.Popen([sys.executable, "-m", "pulsarwire", *base, "--partitioned-topic", "orders=3"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert broker.stdout.readline().startswith("broker: pulsar://127.0.0.1:")
    finally:
        broker.send_signal(signal.SIGINT)
        broker.wait(30)
    # fewer partitions would hide what the others hold; a bad name is reported, not skipped
    for spec, says in (("orders=2", "never removed"), ("a//b=2", "invalid topic name")):
        refused = pulsarwire(*base, "--partitioned-topic", spec, timeout=30)
        assert refused.returncode == 2 and says in refused.stderr, (spec, refused.stderr)
