"""Peers the suite starts itself on 127.0.0.1 with free ports, and stops after."""
from __future__ import annotations

import asyncio
import inspect
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from pulsarwire.broker.server import Broker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 20.0, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"peer exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


class BrokerThread:
    """The embedded broker on its own event loop in a thread (usable from sync and async tests)."""

    def __init__(self, data_dir, **options) -> None:
        self.data_dir = str(data_dir)
        self.options = options
        self.loop: asyncio.AbstractEventLoop | None = None
        self.broker: Broker | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "BrokerThread":
        ready = threading.Event()
        self.loop = asyncio.new_event_loop()

        def run():
            asyncio.set_event_loop(self.loop)
            self.broker = Broker(self.data_dir, **self.options)
            self.loop.run_until_complete(self.broker.start())
            self.options["port"] = self.broker.port  # a restart comes back on the same port
            if self.broker.v1 is not None:
                self.options["v1_port"] = self.broker.v1_port
            ready.set()
            self.loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name="embedded-broker")
        self._thread.start()
        if not ready.wait(20):
            raise RuntimeError("embedded broker did not start")
        return self

    def call(self, fn, *args):
        """Run fn(*args) on the broker's loop (admin operations) and return its result."""
        async def invoke():
            result = fn(*args)
            return await result if inspect.isawaitable(result) else result
        return asyncio.run_coroutine_threadsafe(invoke(), self.loop).result(10)

    def set_policy(self, key: str, value, *, namespace: str | None = None, topic: str | None = None) -> None:
        """Set a namespace's or a topic's policy (e.g. deduplicationEnabled), as the admin API does."""
        policies = self.broker.core.policies

        async def apply():
            if topic is not None:
                full = topic if "://" in topic else f"persistent://public/default/{topic}"
                policies.set_topic_policy(full, key, value)
            else:
                policies.set_namespace_policy(namespace or "public/default", key, value)
            await policies.save()
        asyncio.run_coroutine_threadsafe(apply(), self.loop).result(10)

    @property
    def url(self) -> str:
        return self.broker.service_url

    @property
    def v1_port(self) -> int:
        return self.broker.v1_port

    def stop(self) -> None:
        if self.loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.broker.stop(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
        self.loop = None

    def restart(self) -> "BrokerThread":
        self.stop()
        return self.start()


class BrokerProcess:
    """The embedded broker as a separate process, for kill -9 tests."""

    def __init__(self, data_dir, port: int | None = None, extra: list[str] | None = None) -> None:
        self.data_dir = str(data_dir)
        self.port = port or free_port()
        self.extra = extra or []
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def start(self) -> "BrokerProcess":
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pulsarwire", "broker", "--http-port", "-1", "--data-dir", self.data_dir, "--port",
             str(self.port), "--v1-port", "-1", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ))
        wait_for_port(self.port, process=self.process)
        return self

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        terminate(self.process)


def terminate(process: subprocess.Popen | None) -> None:
    """Stop a peer politely, then firmly."""
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def pulsar_lite_binary() -> str | None:
    try:
        import pulsar_lite
    except ImportError:
        return None
    path = pathlib.Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite"
    return str(path) if path.exists() else shutil.which("pulsar-lite")


class PulsarLite:
    def __init__(self, data_dir) -> None:
        self.binary = pulsar_lite_binary()
        if self.binary is None:
            pytest.skip("pulsar-lite is not installed")
        self.data_dir = str(data_dir)
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def start(self) -> "PulsarLite":
        self.process = subprocess.Popen(
            [self.binary, "--addr", f"127.0.0.1:{self.port}", "--db-path", self.data_dir, "--log-level", "warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, process=self.process)
        return self

    def stop(self) -> None:
        terminate(self.process)
