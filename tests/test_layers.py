"""Module structure. The broker's layers import one way: storage -> metafile -> topics -> core ->
front ends -> server; each client module imports alone; the client package keeps its public names.

Each module is imported alone in a fresh interpreter; the broker modules it pulls
in must all lie at or below its own layer."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

LAYERS = ["staging", "storage", "listener", "metafile", "topics", "policies",
          "compatibility", "core", "fsck", "pulsar", "v1", "stats", "metrics", "admin_http", "server"]
# broker/staging.py and the twin it loads (_staging.pyx or _staging_py.py, as the codec was
# chosen): runs of Send frames planned, staged as records and answered; below storage, which
# hands in its record layout
STAGING = {"staging", "_staging", "_staging_py"}
BELOW = {
    "staging": {"_staging", "_staging_py"},
    "storage": STAGING,
    "listener": set(),  # accepting sockets within the descriptor budget
    "metafile": {"storage"} | STAGING,  # the broker's small metadata files, beside the log
    "topics": {"storage", "metafile"} | STAGING,
    "policies": {"storage", "metafile"} | STAGING,  # namespace and topic policies, beside the domain
    "compatibility": set(),  # schema versions, on protocol types alone
    "core": {"storage", "metafile", "topics", "policies"} | STAGING,
    "fsck": {"storage", "metafile", "topics", "policies", "core"} | STAGING,  # checks a stopped broker's files
    "pulsar": {"storage", "listener", "metafile", "topics", "policies", "core", "compatibility"} | STAGING,
    "v1": {"storage", "metafile", "topics", "policies", "core"} | STAGING,
    "stats": {"storage", "metafile", "topics", "policies"} | STAGING,
    "metrics": {"storage", "metafile", "topics", "policies", "stats"} | STAGING,
    # the HTTP front end: admin API, HTTP lookup, /metrics; server imports it only when it serves HTTP
    "admin_http": {"storage", "metafile", "topics", "policies", "core", "compatibility", "stats", "metrics"} | STAGING,
    "server": {"storage", "listener", "metafile", "topics", "policies", "core", "compatibility", "pulsar", "v1"} | STAGING,
}


def _loaded_after_import(module: str) -> set[str]:
    code = (f"import sys, json; import pulsarwire.broker.{module}; "
            "print(json.dumps(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
            "if m.startswith('pulsarwire.broker.'))))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(json.loads(out))


@pytest.mark.parametrize("module", LAYERS)
def test_broker_layer_imports_only_layers_below(module):
    loaded = _loaded_after_import(module) - {module}
    assert loaded <= BELOW[module], f"{module} pulls in {sorted(loaded - BELOW[module])}"


def test_domain_layer_knows_no_front_end():
    import pulsarwire.broker.topics as topics
    source = open(topics.__file__).read()
    for word in ("BrokerConnection", "V1Server", "encode_payload_frame", "asyncio.Protocol"):
        assert word not in source


# Each client module and the client modules it may pull in at import time (type-only imports
# sit under TYPE_CHECKING): producers and consumers know nothing of each other or of `Client`.
CLIENT_DEPENDS = {
    "options": set(),
    "auth": set(),
    "reconnect": {"options"},
    "http_lookup": set(),
    "connection": {"options", "http_lookup"},
    "producer": {"options", "reconnect"},
    "dead_letter": set(),
    "consumer": {"options", "reconnect", "dead_letter"},
    "reader": {"options", "reconnect", "consumer", "dead_letter"},
    "table_view": {"options", "reconnect", "consumer", "dead_letter", "reader"},
    "entries": {"options", "reconnect"},
    "client": {"options", "reconnect", "connection", "http_lookup", "producer", "consumer", "dead_letter", "reader",
               "table_view", "entries"},
}
# Every name `pulsarwire.client` offered when it was one module and that user code may import
# from it: its own public names, the message and routing types in its signatures, the errors
# it raises. (Its stdlib modules, session events and private helpers are not kept.)
CLIENT_NAMES = [
    "Address", "AuthenticationToken", "Client", "CompressionType", "Consumer", "ConsumerType",
    "DEFAULT_PORT", "DEFAULT_TLS_PORT", "InitialPosition", "Producer", "Reader", "partition_name",
    "topic_name",
    "HashingScheme", "Message", "MessageId", "RoutingMode",
    "AuthenticationError", "AuthorizationError", "CodecError", "ConnectionClosedError", "NotAllowedError",
    "ProducerFencedError", "ProducerQueueFullError", "PulsarWireError", "ServerError", "TimeoutError",
    "TopicNotFoundError", "TopicTerminatedError",
]


@pytest.mark.parametrize("module", sorted(CLIENT_DEPENDS))
def test_each_client_module_imports_alone(module):
    subprocess.run([sys.executable, "-c", f"import pulsarwire.client.{module}"], check=True)


@pytest.mark.parametrize("module", sorted(CLIENT_DEPENDS))
def test_client_module_imports_without_the_package_init(module):
    # `import pulsarwire.client.x` runs the package __init__ first, which imports every module
    # in one order; empty stand-ins for `pulsarwire` and `pulsarwire.client` make `x` the first
    # client module loaded, so a cycle through it fails here whatever order __init__ uses.
    code = ("import importlib, importlib.util, json, sys, types\n"
            "root = importlib.util.find_spec('pulsarwire').submodule_search_locations[0]\n"
            "for name, path in (('pulsarwire', root), ('pulsarwire.client', root + '/client')):\n"
            "    package = types.ModuleType(name)\n"
            "    package.__path__ = [path]\n"
            "    sys.modules[name] = package\n"
            "sys.modules['pulsarwire'].__version__ = '0'\n"  # session.py reads it
            f"importlib.import_module('pulsarwire.client.{module}')\n"
            "print(json.dumps(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
            "if m.startswith('pulsarwire.client.'))))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = set(json.loads(out)) - {module}
    assert loaded == CLIENT_DEPENDS[module], f"{module} pulls in {sorted(loaded)}"


def test_client_package_keeps_its_public_names():
    import pulsarwire.client as client
    missing = [name for name in CLIENT_NAMES if not hasattr(client, name)]
    assert not missing
    assert set(CLIENT_NAMES) <= set(client.__all__)
    from pulsarwire import Client, Consumer, Producer, Reader
    assert (client.Client, client.Producer, client.Consumer, client.Reader) == (Client, Producer, Consumer, Reader)
