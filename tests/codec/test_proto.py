"""The checked-in PulsarApi_pb2 module is exactly what proto/PulsarApi.proto generates."""
from __future__ import annotations

import sys

import pytest

from pulsarwire._proto import PulsarApi_pb2 as pb

from ..conftest import ROOT


def test_checked_in_module_matches_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gen_proto
    finally:
        sys.path.pop(0)
    generated = gen_proto.generate(tmp_path)
    for name in (generated.name, generated.name + "i"):
        checked_in = ROOT / "pulsarwire" / "_proto" / name
        assert (tmp_path / name).read_text() == checked_in.read_text(), "run: python tools/gen_proto.py"


def test_wire_facts():
    assert pb.BaseCommand.Type.Value("SEND") == 6
    assert pb.BaseCommand.Type.Value("MESSAGE") == 9
    assert pb.BaseCommand.Type.Value("ACK_RESPONSE") == 38
    assert pb.MessageMetadata.DESCRIPTOR.fields_by_name["num_messages_in_batch"].number == 11
    assert pb.MessageMetadata.DESCRIPTOR.fields_by_name["uncompressed_size"].number == 9
    assert pb.SingleMessageMetadata.DESCRIPTOR.fields_by_name["payload_size"].number == 3
    assert pb.MessageIdData.DESCRIPTOR.fields_by_name["batch_index"].default_value == -1
    assert pb.ProtocolVersion.Value("v21") == 21
    # every BaseCommand sub-command field number equals its Type value
    for field in pb.BaseCommand.DESCRIPTOR.fields:
        if field.name != "type":
            assert field.message_type is not None
            assert field.number in pb.BaseCommand.Type.values()
