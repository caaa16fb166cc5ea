"""Every recorded scenario decodes exactly to its manifest, both directions."""
from __future__ import annotations

import hashlib

import pytest

from pulsarwire._proto import PulsarApi_pb2 as pb

from ..conftest import load_scenario, scenarios

DIRECTIONS = [("client_to_broker", pb.BaseCommand.SEND), ("broker_to_client", pb.BaseCommand.MESSAGE)]


def _messages(twin, data, payload_type, chunk):
    reader = twin.FrameReader()
    frames = []
    for start in range(0, len(data), chunk):
        reader.feed(data[start:start + chunk])
        frames.extend(reader)
    reader.close()
    messages = []
    for frame in frames:
        if frame.type == payload_type:
            messages.extend(frame.messages())
    return frames, messages


@pytest.mark.parametrize("scenario", scenarios())
@pytest.mark.parametrize("direction,payload_type", DIRECTIONS, ids=[d for d, _ in DIRECTIONS])
@pytest.mark.parametrize("chunk", [1 << 20, 4096, 7, 1])
def test_scenario_decodes_to_manifest(twin, scenario, direction, payload_type, chunk):
    manifest, streams = load_scenario(scenario)
    data = next(raw for name, raw in streams.items() if direction in name)
    frames, messages = _messages(twin, data, payload_type, chunk)
    assert sum(frame.size for frame in frames) == len(data)

    payload_frames = [f for f in frames if f.type == payload_type]
    if direction == "client_to_broker":
        assert all(f.checksum_verified for f in payload_frames)
    else:  # pulsar-lite sends no magic/CRC on MESSAGE frames
        assert not any(f.checksum_verified for f in payload_frames)
    for frame in payload_frames:
        expected_batch = manifest["batching"]
        assert frame.metadata.HasField("num_messages_in_batch") == expected_batch

    expected = manifest["messages"]
    assert len(messages) == len(expected)
    for got, want in zip(messages, expected):
        payload = got.data()
        assert len(payload) == want["payload_len"]
        assert hashlib.sha256(payload).hexdigest() == want["payload_sha256"]
        assert payload[:32].hex() == want["payload_head_hex"]
        assert got.partition_key == want["key"]
        assert got.properties == want["properties"]
        assert got.event_time == want["event_timestamp"]


@pytest.mark.parametrize("scenario", scenarios())
def test_stream_sha_matches_manifest(scenario):
    manifest, streams = load_scenario(scenario)
    for stream in manifest["streams"]:
        assert hashlib.sha256(streams[stream["file"]]).hexdigest() == stream["sha256"]


@pytest.mark.parametrize("scenario", scenarios())
def test_reencoding_send_frames_is_byte_exact(twin, scenario):
    """Re-framing each recorded Send around its stored span reproduces the bytes."""
    _, streams = load_scenario(scenario)
    data = next(raw for name, raw in streams.items() if "client_to_broker" in name)
    reader = twin.FrameReader()
    reader.feed(data)
    offset = 0
    for frame in reader:
        original = data[offset:offset + frame.size]
        offset += frame.size
        if frame.metadata is None:
            assert twin.encode_command(frame.command) == original
        else:
            assert twin.encode_payload_frame(frame.command, bytes(frame.metadata_and_payload)) == original
