"""Run the official Python client's own test suite (apache/pulsar-client-python `tests/`, kept
outside this project) against the embedded broker, as written (`import pulsar`) or with the import
swapped to pulsarwire, and print each file's pytest summary. docs/official-suite.md has the counts.

    python tools/official_suite.py /path/to/pulsar-client-python/tests --swapped [files...]

The files are copied to a temporary directory and pointed at a fresh broker on a free loopback
port (`localhost:6650` rewritten). A stand-in `requests` module refuses every call (the embedded
broker has no admin HTTP API, which some tests use), and every test gets 60 s. With --swapped,
the three names pulsarwire refuses (`ServiceInfoProvider`, `ServiceInfo`, `AutoClusterFailover`)
and the private `_set_future` helper are taken from the official module so that the files load.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import time

DEFAULT_FILES = ["pulsar_test.py", "asyncio_test.py", "table_view_test.py", "reader_test.py",
                 "interrupted_test.py", "schema_test.py"]
SWAPS = [
    (r"^(\s*)import pulsar(\s)", r"\1import pulsarwire.sync as pulsar\2"),
    (r"^(\s*)from pulsar\.schema\.schema import ", r"\1from pulsarwire.schema import "),
    (r"^(\s*)from pulsar\.schema import ", r"\1from pulsarwire.schema import "),
    (r"^(\s*)from pulsar\.asyncio import ", r"\1from pulsarwire.asyncio import "),
    (r"^(\s*)from pulsar import ", r"\1from pulsarwire.sync import "),
]
REFUSED_NAMES = ("    ServiceInfoProvider,\n    ServiceInfo,\n    AutoClusterFailover,\n)",
                 ")\nfrom pulsar import ServiceInfoProvider, ServiceInfo, AutoClusterFailover")
PRIVATE_HELPER = ("    _set_future,\n)", ")\nfrom pulsar.asyncio import _set_future")
PER_TEST_LIMIT = '''
import signal
import pytest


@pytest.fixture(autouse=True)
def _per_test_limit():
    def fire(signum, frame):
        raise TimeoutError("the test ran past 60 s")
    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)
'''
NO_ADMIN_API = '''
def _refuse(*args, **kwargs):
    raise ConnectionError("the embedded broker has no admin HTTP API")


get = put = post = delete = _refuse
'''


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def prepare(source: pathlib.Path, target: pathlib.Path, port: int, swapped: bool) -> None:
    for path in source.glob("*.py"):
        text = path.read_text().replace("localhost:6650", f"localhost:{port}")
        if swapped:
            for pattern, replacement in SWAPS:
                text = re.sub(pattern, replacement, text, flags=re.M)
            text = text.replace(*REFUSED_NAMES).replace(*PRIVATE_HELPER)
        (target / path.name).write_text(text)
    if (source / "test-conf").is_dir():
        (target / "test-conf").symlink_to((source / "test-conf").resolve())
    (target / "conftest.py").write_text(PER_TEST_LIMIT)
    (target / "stubs").mkdir()
    (target / "stubs" / "requests.py").write_text(NO_ADMIN_API)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", type=pathlib.Path, help="the tests/ folder of apache/pulsar-client-python")
    parser.add_argument("--swapped", action="store_true", help="import pulsarwire in place of pulsar")
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES)
    args = parser.parse_intermixed_args()
    project = pathlib.Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="official-suite-") as workdir:
        work = pathlib.Path(workdir)
        suite, data = work / "suite", work / "data"
        suite.mkdir()
        port = free_port()
        prepare(args.tests, suite, port, args.swapped)
        env = {"PYTHONPATH": f"{project}:{suite / 'stubs'}", "PATH": "/usr/bin:/bin"}
        broker = subprocess.Popen([sys.executable, "-m", "pulsarwire", "broker", "--data-dir", str(data),
                                   "--port", str(port), "--v1-port", "-1", "--sync-policy", "never"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(2)
            for name in args.files:
                done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rf", name],
                                      cwd=suite, env=env, capture_output=True, text=True, timeout=1800)
                summary = [line for line in done.stdout.splitlines()
                           if line.startswith("FAILED ") or re.search(r"\d+ (passed|failed|error).* in ", line)]
                print(f"{name}:", *summary, sep="\n  ")
        finally:
            broker.terminate()
            broker.wait(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
