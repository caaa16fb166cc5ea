"""The compatibility corpus (`tests/compat/`): programs written for the official client as its
documentation writes them, each run twice against the embedded broker - as written (`import
pulsar`) and with the import swapped to `pulsarwire.sync as pulsar` (`pulsarwire.asyncio` for
`pulsar.asyncio`) - and the two outputs compared line by line.

Each program takes the service URL and a topic prefix (fresh per run) and prints only what the
official client makes deterministic. A header line `# corpus: xfail=<reason>` marks a program
that needs a feature not built yet; `# corpus: broker=auth` runs it against a broker that
requires the token `corpus-token`; `# corpus: broker=authorization` against one set up as the
official client's CI sets up Pulsar (token of subject `token-principal`, basic `admin:123456` a
super user, the anonymous role, authorization on `public/default` and `private/auth`);
`# corpus: partitioned=<suffix>:<n>` creates the
partitioned topic `<prefix>-<suffix>` with n partitions first.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import uuid

import pytest

from ..peers import BrokerThread

pytest.importorskip("pulsar", reason="the official client (pulsar-client) is the reference")

CORPUS = pathlib.Path(__file__).resolve().parent  # the programs beside this file
PROGRAMS = sorted(p for p in CORPUS.glob("*.py") if not p.name.startswith(("_", "test_")))  # programs, not the tests here
RUN_TIMEOUT = 30  # a hang fails the test instead of stalling the suite
# a JWT of subject token-principal (the broker takes it verbatim: its signature is never checked)
AUTHORIZATION_TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0b2tlbi1wcmluY2lwYWwifQ.Y29ycHVzLXNpZ25hdHVyZQ"

# import lines of the official client -> pulsarwire's drop-in modules
SWAPS = [
    (re.compile(r"^(\s*)import pulsar\.asyncio\s*$", re.M), r"\1import pulsarwire.sync as pulsar"),
    (re.compile(r"^(\s*)import pulsar\s*$", re.M), r"\1import pulsarwire.sync as pulsar"),
    (re.compile(r"^(\s*)from pulsar\.asyncio import ", re.M), r"\1from pulsarwire.asyncio import "),
    (re.compile(r"^(\s*)from pulsar\.schema import ", re.M), r"\1from pulsarwire.schema import "),
    (re.compile(r"^(\s*)from pulsar import ", re.M), r"\1from pulsarwire.sync import "),
]
OFFICIAL_IMPORT = re.compile(r"^\s*(import pulsar\b|from pulsar[ .])", re.M)
# printed after the last statement of an official run: the program ran to its end, whatever happens
# to the process after (the official client's C++ destructors now and then crash at exit)
FINISHED = "# corpus: the program ran to its end"
# the official client's C++ logger writes to stdout: its lines are not the program's output
CLIENT_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ (DEBUG|INFO|WARN|ERROR) ")


def swap_imports(source: str) -> str:
    swapped = source
    for pattern, replacement in SWAPS:
        swapped = pattern.sub(replacement, swapped)
    assert swapped != source, "the program imports nothing from the official client"
    assert not OFFICIAL_IMPORT.search(swapped), "an official import is left after swapping"
    return swapped


def headers(path: pathlib.Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"#\s*corpus:\s*(\w+)=(.*)$", line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    return found


def corpus_params():
    params = []
    for path in PROGRAMS:
        marks = []
        reason = headers(path).get("xfail")
        if reason:
            marks.append(pytest.mark.xfail(strict=False, reason=reason))
        params.append(pytest.param(path, id=path.stem, marks=marks))
    return params


@pytest.fixture(scope="module")
def brokers(tmp_path_factory):
    started: dict[str, BrokerThread] = {}

    def get(kind: str) -> BrokerThread:
        if kind not in started:
            options: dict = {"auth_tokens": {"corpus-token"}} if kind == "auth" else {}
            if kind == "authorization":
                options = dict(auth_tokens={AUTHORIZATION_TOKEN}, auth_basic={"admin": "123456"},
                               anonymous_role="anonymous", super_user_roles=("admin",), tenants=("private",),
                               grants={"public/default": {"anonymous"}, "private/auth": {"token-principal"}})
            started[kind] = BrokerThread(tmp_path_factory.mktemp(f"corpus-{kind}"), v1_port=None,
                                         sync_policy="never", **options).start()
        return started[kind]
    yield get
    for broker in started.values():
        broker.stop()


def run_program(path: pathlib.Path, source: str, broker: BrokerThread, options: dict, tmp_path,
                official: bool) -> str:
    prefix = f"corpus-{path.stem}-{uuid.uuid4().hex[:8]}"
    if "partitioned" in options:
        suffix, count = options["partitioned"].split(":")
        for attempt in range(2):
            broker.call(broker.broker.create_partitioned_topic,
                        f"persistent://public/default/{prefix}-{attempt}-{suffix}", int(count))
    script = tmp_path / f"{prefix}.py"
    script.write_text(f"{source}\nprint({FINISHED!r}, flush=True)\n" if official else source)
    # Python's own buffering keeps each printed line whole: unbuffered, the official client's
    # C++ logger (writing to the same stdout from its threads) can land inside a line
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    for attempt in range(2):
        done = subprocess.run([sys.executable, str(script), broker.url, prefix + "-" + str(attempt)],
                              capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
        lines = done.stdout.splitlines()
        # the official client now and then dies of a signal while shutting down (its C++
        # destructors; more often on a loaded machine): what it printed is the reference when the
        # program got to its end first, else one more try, so that the reference is not the flaky part
        if not (official and done.returncode < 0) or FINISHED in lines:
            break
    assert done.returncode == 0 or (official and FINISHED in lines), \
        f"{path.name} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}"
    return "\n".join(line for line in lines if not CLIENT_LOG_LINE.match(line) and line != FINISHED)


@pytest.mark.parametrize("program", corpus_params())
def test_program_means_the_same_with_pulsarwire(program, brokers, tmp_path):
    options = headers(program)
    broker = brokers(options.get("broker", "plain"))
    source = program.read_text()
    official = run_program(program, source, broker, options, tmp_path, official=True)
    ours = run_program(program, swap_imports(source), broker, options, tmp_path, official=False)
    assert official.strip(), f"{program.name} printed nothing with the official client"
    if ours.splitlines() != official.splitlines():
        # the reference itself now and then loses or garbles a line (its C++ logger shares stdout,
        # its shutdown can crash): a second official run decides; pulsarwire's run is not repeated
        official = run_program(program, source, broker, options, tmp_path, official=True)
    assert ours.splitlines() == official.splitlines(), f"pulsarwire:\n{ours}\nofficial:\n{official}"


def test_swap_covers_every_official_import_form():
    source = ("import pulsar\nimport pulsar.asyncio\nfrom pulsar import MessageId\nfrom pulsar.asyncio import Client\n"
              "from pulsar.schema import StringSchema\n")
    assert swap_imports(source) == ("import pulsarwire.sync as pulsar\nimport pulsarwire.sync as pulsar\n"
                                    "from pulsarwire.sync import MessageId\nfrom pulsarwire.asyncio import Client\n"
                                    "from pulsarwire.schema import StringSchema\n")
