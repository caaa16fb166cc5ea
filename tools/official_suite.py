"""Run the official Python client's own test suite (apache/pulsar-client-python `tests/`, kept
outside this project) against the embedded broker, as written (`import pulsar`) or with the import
swapped to pulsarwire, and print each file's pytest summary. docs/official-suite.md has the counts.

    python tools/official_suite.py /path/to/pulsar-client-python/tests --swapped [files...]

The files are copied to a temporary directory and pointed at a fresh broker on free loopback
ports (`localhost:6650`, `localhost:6651` and the admin API's `localhost:8080` rewritten to the
broker's binary, TLS and HTTP ports). The broker is set up as the official CI sets up Pulsar
(`build-support/start-test-service-inside-container.sh`, `test-conf/standalone-ssl.conf`): TLS
with the suite's certificates, token, basic (`admin:123456`) and TLS authentication, the role
`anonymous` for clients without credentials, authorization (`anonymous` on `public/default` and
`public/default-2`, `token-principal` on `private/auth`, super users `admin`, `superUser`,
`localhost`), and those namespaces created; the token (a JWT of subject `token-principal`) is
written to the suite's `.test-token.txt`. `requests` (used by one test for one PUT) is stood in
for by a module built on urllib, so that running the suite needs nothing beyond the official
client; every test gets 60 s. With --swapped,
the three names pulsarwire refuses (`ServiceInfoProvider`, `ServiceInfo`, `AutoClusterFailover`)
and the private `_set_future` helper are taken from the official module so that the files load.
"""
from __future__ import annotations

import argparse
import base64
import json
import pathlib
import re
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ADMIN = ("admin", "123456")  # the CI's basic-auth super user (test-conf/.htpasswd)
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
REQUESTS_STAND_IN = '''
"""The part of `requests` the official suite uses, on urllib."""
import json as _json
import urllib.error
import urllib.request


class Response:
    def __init__(self, status_code, content):
        self.status_code, self.content = status_code, content
        self.text = content.decode("utf-8", "replace")

    def json(self):
        return _json.loads(self.content)


def request(method, url, data=None, json=None, headers=None, **_ignored):
    headers = dict(headers or {})
    if json is not None:
        data = _json.dumps(json)
        headers.setdefault("Content-Type", "application/json")
    if isinstance(data, str):
        data = data.encode()
    call = urllib.request.Request(url, data=data, headers=headers, method=method.upper())
    try:
        with urllib.request.urlopen(call, timeout=30) as answer:
            return Response(answer.status, answer.read())
    except urllib.error.HTTPError as error:
        return Response(error.code, error.read())


def get(url, **kwargs):
    return request("GET", url, **kwargs)


def put(url, data=None, **kwargs):
    return request("PUT", url, data=data, **kwargs)


def post(url, data=None, **kwargs):
    return request("POST", url, data=data, **kwargs)


def delete(url, **kwargs):
    return request("DELETE", url, **kwargs)
'''


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ci_token() -> str:
    """A JWT of subject `token-principal`, as the CI's `pulsar tokens create` makes (the broker
    takes it verbatim, so its signature is never checked)."""
    def part(value) -> str:
        raw = value if isinstance(value, bytes) else json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return ".".join((part({"alg": "HS256"}), part({"sub": "token-principal"}), part(secrets.token_bytes(32))))


def broker_command(data: pathlib.Path, suite: pathlib.Path, ports: dict, token: str) -> list[str]:
    conf = suite / "test-conf"
    grants = ["public/default=anonymous", "public/default-2=anonymous", "private/auth=token-principal"]
    return [sys.executable, "-m", "pulsarwire", "broker", "--data-dir", str(data), "--v1-port", "-1",
            "--sync-policy", "never", "--port", str(ports["binary"]), "--http-port", str(ports["http"]),
            "--tls-port", str(ports["tls"]), "--tls-cert-file", str(conf / "broker-cert.pem"),
            "--tls-key-file", str(conf / "broker-key.pem"), "--tls-trust-certs-file", str(conf / "cacert.pem"),
            "--auth-token", token, "--auth-basic", f"{ADMIN[0]}:{ADMIN[1]}", "--anonymous-role", "anonymous",
            *(arg for grant in grants for arg in ("--grant", grant)),
            *(arg for role in ("admin", "superUser", "localhost") for arg in ("--super-user-role", role))]


def create_namespaces(http_port: int) -> None:
    """The tenant and namespaces the CI creates, through the admin API, as a super user."""
    credentials = base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()
    for path, body in (("tenants/private", {"adminRoles": [], "allowedClusters": ["standalone"]}),
                       ("namespaces/public/default-2", {}), ("namespaces/private/auth", {})):
        request = urllib.request.Request(f"http://127.0.0.1:{http_port}/admin/v2/{path}", method="PUT",
                                         data=json.dumps(body).encode(),
                                         headers={"Authorization": f"Basic {credentials}",
                                                  "Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=10).close()


def wait_for(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def prepare(source: pathlib.Path, target: pathlib.Path, ports: dict, swapped: bool) -> None:
    for path in source.glob("*.py"):
        text = path.read_text().replace("localhost:6650", f"localhost:{ports['binary']}")
        text = text.replace("localhost:6651", f"localhost:{ports['tls']}")
        text = text.replace("localhost:8080", f"localhost:{ports['http']}")
        if swapped:
            for pattern, replacement in SWAPS:
                text = re.sub(pattern, replacement, text, flags=re.M)
            text = text.replace(*REFUSED_NAMES).replace(*PRIVATE_HELPER)
        (target / path.name).write_text(text)
    if (source / "test-conf").is_dir():
        (target / "test-conf").symlink_to((source / "test-conf").resolve())
    (target / "conftest.py").write_text(PER_TEST_LIMIT)
    (target / "stubs").mkdir()
    (target / "stubs" / "requests.py").write_text(REQUESTS_STAND_IN)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", type=pathlib.Path, help="the tests/ folder of apache/pulsar-client-python")
    parser.add_argument("--swapped", action="store_true", help="import pulsarwire in place of pulsar")
    parser.add_argument("-k", dest="select", help="run only the tests pytest's -k expression selects")
    parser.add_argument("--full", action="store_true", help="print pytest's whole output (tracebacks included)")
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES)
    args = parser.parse_intermixed_args()
    selection = ["-k", args.select] if args.select else []
    project = pathlib.Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="official-suite-") as workdir:
        work = pathlib.Path(workdir)
        suite, data = work / "suite", work / "data"
        suite.mkdir()
        ports = {"binary": free_port(), "tls": free_port(), "http": free_port()}
        prepare(args.tests, suite, ports, args.swapped)
        token = ci_token()
        (suite / ".test-token.txt").write_text(token + "\n")
        env = {"PYTHONPATH": f"{project}:{suite / 'stubs'}", "PATH": "/usr/bin:/bin"}
        broker = subprocess.Popen(broker_command(data, suite, ports, token), env=env,
                                  stdout=subprocess.DEVNULL, stderr=open(work / "broker.log", "w"))
        try:
            wait_for(ports["http"])
            create_namespaces(ports["http"])
            for name in args.files:
                done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rf",
                                       *selection, name],
                                      cwd=suite, env=env, capture_output=True, text=True, timeout=1800)
                summary = [line for line in done.stdout.splitlines()
                           if args.full or line.startswith("FAILED ")
                           or re.search(r"\d+ (passed|failed|error).* in ", line)]
                print(f"{name}:", *summary, sep="\n  ")
        finally:
            broker.terminate()
            broker.wait(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
