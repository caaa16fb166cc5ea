"""Run every benchmark side by side, write JSON and a PNG plot.

    ./dev.sh bench                          # defaults below
    python benchmarks/run_all.py --messages 100000 --size 100 --out benchmarks/results

Writes <out>/results.json (all rows, with the command line, machine and
versions) and <out>/results.png (throughput bars per benchmark).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import bench_broker, bench_client, bench_codec  # noqa: E402


def versions() -> dict:
    out = {"python": platform.python_version(), "machine": platform.machine(),
           "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    for name in ("pulsarwire", "pulsar", "protobuf", "crc32c"):
        try:
            module = __import__(name if name != "protobuf" else "google.protobuf", fromlist=["__version__"])
            out[name] = getattr(module, "__version__", "?")
        except ImportError:
            out[name] = None
    from pulsarwire import codec
    out["codec"] = codec.IMPLEMENTATION
    return out


def _produce_consume_bars(ax, labels, rows, title) -> None:
    ax.bar([x - 0.2 for x in range(len(labels))], [r["produce_msg_per_s"] / 1e3 for r in rows], 0.4,
           label="produce")
    ax.bar([x + 0.2 for x in range(len(labels))], [r["consume_msg_per_s"] / 1e3 for r in rows], 0.4,
           label="consume")
    ax.set_xticks(range(len(labels)), labels)
    ax.set_title(title)
    ax.set_ylabel("thousand messages/s")
    ax.legend()


def plot(results: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    codec_rows = [r for r in results["codec"] if r["case"].startswith("batch 100B")]
    cases = sorted({r["case"].replace("batch 100B ", "") for r in codec_rows})
    impls = ["cython", "python", "naive-protobuf"]
    width = 0.27
    for i, impl in enumerate(impls):
        values = [next((r["messages_per_s"] / 1e6 for r in codec_rows
                        if r["impl"] == impl and r["case"].endswith(" " + c)), 0) for c in cases]
        axes[0].bar([x + i * width for x in range(len(cases))], values, width, label=impl)
    axes[0].set_xticks([x + width for x in range(len(cases))], cases)
    axes[0].set_title("codec: decode+validate+split, 100 B messages")
    axes[0].set_ylabel("million messages/s (one core)")
    axes[0].legend()

    client_rows = [r for r in results["client"] if "kind" in r]  # the asyncio rows (the others: bench_client's table)
    labels = [f"{r['kind']} {r['size']}B\n{r['broker']}\n{'best' if r['row'].startswith('each') else 'same'}"
              for r in client_rows]
    axes[1].bar(range(len(client_rows)), [r["ratio_of_medians"] for r in client_rows])
    axes[1].axhline(1.0, color="grey", linewidth=0.8)
    axes[1].set_xticks(range(len(client_rows)), labels, fontsize=6)
    axes[1].set_yscale("log")
    axes[1].set_title("client: pulsarwire / official (each at its best; same settings)")
    _produce_consume_bars(axes[2], [f"{r['broker']}\n{r['client']}" for r in results["broker"]],
                          results["broker"], "broker: embedded (fsync each second; no fsync) vs pulsar-lite")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--codec-seconds", type=float, default=0.5)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--quick", action="store_true", help="the client benchmark's smaller grid")
    parser.add_argument("--raw-messages", type=int, default=500_000, help="messages in each raw broker run")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    print("== codec ==")
    codec_rows = bench_codec.main(["--seconds", str(args.codec_seconds)])
    print("\n== client ==")
    client_rows = bench_client.main(["--messages", str(args.messages)] + (["--quick"] if args.quick else []))
    print("\n== broker ==")
    broker_rows = bench_broker.main(["--messages", str(args.messages), "--size", str(args.size),
                                     "--raw-messages", str(args.raw_messages), "--stall", "3",
                                     "--brokers", "embedded,embedded-nosync,pulsar-lite"])
    results = {"command": " ".join([os.path.basename(sys.executable), "benchmarks/run_all.py", *(argv or sys.argv[1:])]),
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
               "seconds": round(time.time() - started, 1), "versions": versions(),
               "codec": codec_rows, "client": client_rows, "broker": broker_rows}
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    if not args.no_plot:
        plot(results, os.path.join(args.out, "results.png"))
    print(f"\nwrote {args.out}/results.json" + ("" if args.no_plot else f" and {args.out}/results.png"))
    return results


if __name__ == "__main__":
    main()
