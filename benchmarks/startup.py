"""A one-shot program, as a cron job or a command-line tool runs one: import the client, create a
client and a producer, send one message, close. The official client and `pulsarwire.sync`, each
in a fresh process, interleaved; the median of each step in ms, and the process's wall time.

    python benchmarks/startup.py [--broker embedded|pulsar-lite] [--rounds 5]

Bytecode is used as a pip install leaves it (cached): the variable PYTHONDONTWRITEBYTECODE is
dropped for the children, and a first round, not counted, writes what is missing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import ROOT, BrokerUnderTest  # noqa: E402

PROGRAM = r"""
import json, sys, time
start = time.perf_counter()
if sys.argv[1] == "pulsar":
    import pulsar
else:
    import pulsarwire.sync as pulsar
imported = time.perf_counter()
client = pulsar.Client(sys.argv[2], logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)) \
    if sys.argv[1] == "pulsar" else pulsar.Client(sys.argv[2])
producer = client.create_producer(sys.argv[3])
created = time.perf_counter()
producer.send(b"hello")
sent = time.perf_counter()
client.close()
closed = time.perf_counter()
print(json.dumps({"import": imported - start, "client and producer": created - imported,
                  "send": sent - created, "close": closed - sent}))
"""
STEPS = ("import", "client and producer", "send", "close", "process")


def one(module: str, url: str, topic: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROGRAM, module, url, topic], capture_output=True, text=True,
                          env=env, timeout=120)
    wall = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{module}: {done.stderr[-2000:]}")
    steps = json.loads(done.stdout.strip().splitlines()[-1])
    steps["process"] = wall
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("embedded", "pulsar-lite"), default="embedded")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    modules = {"official": "pulsar", "pulsarwire.sync": "pulsarwire.sync"}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in modules}
    with tempfile.TemporaryDirectory() as scratch, BrokerUnderTest(args.broker, os.path.join(scratch, "data")) as broker:
        for round_index in range(args.rounds + 1):
            order = list(modules) if round_index % 2 == 0 else list(reversed(modules))
            for name in order:
                result = one(modules[name], broker.url, "startup")
                if round_index:  # the first writes the bytecode that is missing
                    samples[name].append(result)
    print(f"{args.broker}, one-shot program, medians of {args.rounds} (ms)")
    print(f"{'client':<16}" + "".join(f"{step:>22}" for step in STEPS))
    for name, results in samples.items():
        print(f"{name:<16}" + "".join(f"{statistics.median(r[step] for r in results) * 1000:>22.2f}" for step in STEPS))


if __name__ == "__main__":
    main()
