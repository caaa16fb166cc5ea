"""Shared fixtures. The codec under test is the one pulsarwire.codec chose at
import (set PULSARWIRE_PURE_PYTHON=1 for the pure-Python twin); `twin` runs a
test against both twins in one process as well.
"""
from __future__ import annotations

import json
import pathlib

import pytest

from pulsarwire import _codec_py, codec

ROOT = pathlib.Path(__file__).resolve().parent.parent
VECTORS = ROOT / "tests" / "vectors"

TWINS = [_codec_py]
try:
    from pulsarwire import _codec
    TWINS.insert(0, _codec)
except ImportError:  # extension not built: only the pure twin can be tested
    pass


@pytest.fixture(params=TWINS, ids=lambda impl: impl.IMPLEMENTATION)
def twin(request):
    return request.param


def scenarios():
    return sorted(p.name for p in VECTORS.iterdir() if (p / "manifest.json").exists())


def load_scenario(name):
    folder = VECTORS / name
    manifest = json.loads((folder / "manifest.json").read_text())
    streams = {s["file"]: (folder / s["file"]).read_bytes() for s in manifest["streams"]}
    return manifest, streams


def pytest_report_header(config):
    return f"pulsarwire codec: {codec.IMPLEMENTATION} (twins under test: {[t.IMPLEMENTATION for t in TWINS]})"


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """An embedded broker shared by a test module (V1 on too)."""
    from .peers import BrokerThread
    broker = BrokerThread(tmp_path_factory.mktemp("broker"), v1_port=0, replication_factor=3,
                          min_insync_replicas=2, replication_timeout=1.0, keep_alive_interval=5).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def pulsar_lite(tmp_path_factory):
    from .peers import PulsarLite
    peer = PulsarLite(tmp_path_factory.mktemp("pulsar-lite")).start()
    yield peer
    peer.stop()


def unique(prefix="t"):
    import uuid
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
