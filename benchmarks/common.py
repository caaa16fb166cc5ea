"""What the benchmarks share: a broker in its own process, and percentiles."""
from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values, q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class BrokerUnderTest:
    """The embedded broker or pulsar-lite, in a separate process on 127.0.0.1; its data directory
    (and pulsar-lite's files beside it) are removed when it stops."""

    def __init__(self, kind: str, data_dir: str, extra: list[str] | None = None,
                 prefix: list[str] | None = None) -> None:
        self.kind = kind
        self.data_dir = data_dir
        self.extra = list(extra or [])  # more command-line arguments (the embedded broker's)
        self.prefix = list(prefix or [])  # what the command runs under (taskset -c 0, say)
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def __enter__(self) -> "BrokerUnderTest":
        if self.kind == "embedded":
            command = [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", self.data_dir,
                       "--port", str(self.port), "--v1-port", "-1", *self.extra]
        elif self.kind == "pulsar-lite":
            import pulsar_lite
            binary = pathlib.Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite"
            command = [str(binary), "--addr", f"127.0.0.1:{self.port}", "--db-path", self.data_dir,
                       "--log-level", "warn"]
        else:
            raise ValueError(self.kind)
        self.process = subprocess.Popen([*self.prefix, *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        cwd=str(ROOT), env=dict(os.environ))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError(f"{self.kind} did not start")

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        # the data, and what pulsar-lite writes beside its --db-path: a benchmark writes GBs a run
        shutil.rmtree(self.data_dir, ignore_errors=True)
        for sidecar in (self.data_dir + ".rocksdb", self.data_dir + ".metadata.json"):
            if os.path.isdir(sidecar):
                shutil.rmtree(sidecar, ignore_errors=True)
            elif os.path.exists(sidecar):
                os.remove(sidecar)
