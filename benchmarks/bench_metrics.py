"""What a Prometheus scrape costs the broker: the main job's load (produce + consume, 1 KiB
messages, batching on) against the embedded broker in its own process, with `/metrics` scraped
every `--interval` seconds by another process, and without. Runs alternate (off, on, on, off, ...)
so drift hits both; the broker also holds `--topics` idle topics with a subscription each, so
every scrape renders their series too.

    flock -x /tmp/pulsarwire-cpu.lock python benchmarks/bench_metrics.py

Prints each run's produce rate, the scrapes made and their mean time, and the cost: 1 - (mean
rate with scrapes / mean rate without). On a shared 2-core machine one run differs from the next by
several percent, more than a scrape costs, so it also measures what a scrape costs the broker
directly: its process CPU time over `--cpu-scrapes` scrapes of the idle broker (less what it spends
idle meanwhile), against the CPU time the main job (broker and client) spends per second under the
load: their ratio, at one scrape per interval, is the share of the job's work a scrape takes.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import BrokerUnderTest, free_port  # noqa: E402
from pulsarwire import perf  # noqa: E402
from pulsarwire.client import Client  # noqa: E402

SCRAPER = """
import sys, time, urllib.request
url, interval = sys.argv[1], float(sys.argv[2])
times = []
size = 0
try:
    while True:
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as response:
            size = len(response.read())
        times.append(time.perf_counter() - start)
        time.sleep(max(0.0, interval - times[-1]))
except KeyboardInterrupt:
    pass
finally:
    print(len(times), sum(times) / max(1, len(times)), size, flush=True)
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape_cpu(pid: int, url: str, scrapes: int) -> tuple[float, float]:
    """(broker CPU seconds per scrape, broker CPU seconds per second idle)."""
    start, began = cpu_seconds(pid), time.monotonic()
    time.sleep(2.0)
    idle_rate = (cpu_seconds(pid) - start) / (time.monotonic() - began)
    start, began = cpu_seconds(pid), time.monotonic()
    for _ in range(scrapes):
        urllib.request.urlopen(url, timeout=30).read()
    spent = cpu_seconds(pid) - start - idle_rate * (time.monotonic() - began)
    return spent / scrapes, idle_rate


async def load(url: str, topic: str, duration: float, size: int) -> float:
    async with Client(url) as client:
        produced, _ = await perf.end_to_end(client, topic, duration=duration, size=size, progress=False)
    return produced.rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per run")
    parser.add_argument("--runs", type=int, default=3, help="pairs of runs (one without, one with scrapes)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes (Prometheus: 15-60)")
    parser.add_argument("--topics", type=int, default=200, help="idle topics the metrics also cover")
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--cpu-scrapes", type=int, default=100, help="scrapes timed for the broker's CPU per scrape")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    http_port = free_port()
    rates: dict[str, list[float]] = {"off": [], "on": []}
    busy: list[float] = []  # CPU seconds per second of broker and client under the load, without scrapes
    scrapes = []
    with BrokerUnderTest("embedded", tempfile.mkdtemp(prefix="bench-metrics-"),
                         ["--http-port", str(http_port)]) as broker:
        admin = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + 20  # the HTTP port opens just after the Pulsar port
        while True:
            try:
                urllib.request.urlopen(f"{admin}/admin/v2/clusters", timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        for i in range(args.topics):
            request = urllib.request.Request(f"{admin}/admin/v2/persistent/public/default/idle-{i}/subscription/s",
                                             method="PUT")
            urllib.request.urlopen(request, timeout=30).close()
        asyncio.run(load(broker.url, "warm-up", args.duration, args.size))  # a full run, not counted
        order = [mode for pair in range(args.runs) for mode in (("off", "on") if pair % 2 == 0 else ("on", "off"))]
        for run, mode in enumerate(order):
            scraper = None
            if mode == "on":
                scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, f"{admin}/metrics", str(args.interval)],
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                time.sleep(1.0)  # its interpreter started and its first scrape made before the load
            cpu_before = cpu_seconds(broker.process.pid) + time.process_time()
            rate = asyncio.run(load(broker.url, f"load-{run}", args.duration, args.size))
            if mode == "off":  # the main job's CPU: the broker's and the client's (this process)
                busy.append((cpu_seconds(broker.process.pid) + time.process_time() - cpu_before) / args.duration)
            rates[mode].append(rate)
            line = f"run {run + 1}: scrapes {mode:>3}: {rate:>10,.0f} msg/s produced"
            if scraper is not None:
                scraper.send_signal(2)  # SIGINT: it prints its figures and ends
                count, mean, size = scraper.communicate(timeout=30)[0].split()
                scrapes.append((int(count), float(mean), int(size)))
                line += f"; {count} scrapes, {float(mean) * 1000:.1f} ms each, {int(size):,} bytes"
            print(line, flush=True)
        per_scrape, idle = scrape_cpu(broker.process.pid, f"{admin}/metrics", args.cpu_scrapes)
    share = per_scrape / args.interval / statistics.mean(busy)
    print(f"broker CPU: {per_scrape * 1000:.2f} ms per scrape (idle {idle * 1000:.1f} ms/s); the main job "
          f"(broker + client) {statistics.mean(busy):.2f} CPU s/s under the load: a scrape every "
          f"{args.interval:g} s takes {share * 100:.2f} % of the job's CPU")
    off, on = statistics.mean(rates["off"]), statistics.mean(rates["on"])
    cost = 1 - on / off
    print(f"\nwithout scrapes {off:,.0f} msg/s, with a scrape every {args.interval:g} s {on:,.0f} msg/s: "
          f"cost {cost * 100:.2f} % ({args.topics} idle topics besides the loaded one)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "metrics", "rates": rates, "scrapes": scrapes, "cost": cost,
                       "cpu_per_scrape": per_scrape, "broker_cpu_per_second": busy, "cpu_share": share,
                       "interval": args.interval, "topics": args.topics}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
