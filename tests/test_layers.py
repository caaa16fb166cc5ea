"""Module structure. The broker's layers import one way: storage -> topics -> core -> front
ends -> server; each client module imports alone; the client package keeps its public names.

Each module is imported alone in a fresh interpreter; the broker modules it pulls
in must all lie at or below its own layer."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

LAYERS = ["storage", "topics", "core", "pulsar", "v1", "server"]
BELOW = {
    "storage": set(),
    "topics": {"storage"},
    "core": {"storage", "topics"},
    "pulsar": {"storage", "topics", "core"},
    "v1": {"storage", "topics", "core"},
    "server": {"storage", "topics", "core", "pulsar", "v1"},
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


CLIENT_MODULES = ["options", "reconnect", "connection", "producer", "consumer", "reader", "client"]
# Every name `pulsarwire.client` offered when it was one module, so user code keeps working.
CLIENT_NAMES = ["Address", "AuthenticationToken", "Client", "CompressionType", "Consumer", "ConsumerType",
                "DEFAULT_PORT", "DEFAULT_TLS_PORT", "InitialPosition", "Producer", "Reader",
                "partition_name", "topic_name"]


@pytest.mark.parametrize("module", CLIENT_MODULES)
def test_each_client_module_imports_alone(module):
    subprocess.run([sys.executable, "-c", f"import pulsarwire.client.{module}"], check=True)


def test_client_package_keeps_its_public_names():
    import pulsarwire.client as client
    missing = [name for name in CLIENT_NAMES if not hasattr(client, name)]
    assert not missing
