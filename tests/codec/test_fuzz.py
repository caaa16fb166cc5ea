"""Mutated real frames give typed errors only — never a crash, a hang or an
untyped exception — and both twins reach the same verdict."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsarwire import errors

from ..conftest import TWINS, load_scenario, scenarios


def _real_frames():
    frames = []
    for name in scenarios():
        _, streams = load_scenario(name)
        for data in streams.values():
            reader = TWINS[-1].FrameReader()
            reader.feed(data)
            offset = 0
            for frame in reader:
                frames.append(data[offset:offset + frame.size])
                offset += frame.size
    return frames


FRAMES = _real_frames()
PAYLOAD_FRAMES = [f for f in FRAMES if len(f) > 200]


def _verdict(twin, data):
    """What decoding `data` as a stream gives: messages decoded, or the error type."""
    reader = twin.FrameReader()
    try:
        reader.feed(data)
        out = []
        for frame in reader:
            for message in frame.messages():
                out.append((message.data(), message.properties, message.partition_key, message.event_time))
        reader.close()
        return ("ok", len(out), hash(tuple(map(repr, out))))
    except errors.CodecError as exc:
        return ("error", type(exc).__name__)


def _mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        pos = rng.randrange(len(data))
        if op < 0.5:
            data[pos] ^= 1 << rng.randrange(8)
        elif op < 0.7:
            data[pos] = rng.randrange(256)
        elif op < 0.85:
            del data[pos:pos + rng.randint(1, 16)]
        else:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        if not data:
            break
    return bytes(data)


@pytest.mark.parametrize("seed", range(8))
def test_mutated_frames_give_typed_errors(seed):
    rng = random.Random(seed)
    for _ in range(400):
        original = rng.choice(PAYLOAD_FRAMES if rng.random() < 0.8 else FRAMES)
        mutated = _mutate(rng, original)
        verdicts = {twin.IMPLEMENTATION: _verdict(twin, mutated) for twin in TWINS}
        assert len(set(verdicts.values())) == 1, verdicts


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400))
def test_random_bytes_give_typed_errors(data):
    verdicts = {twin.IMPLEMENTATION: _verdict(twin, data) for twin in TWINS}
    assert len(set(verdicts.values())) == 1, verdicts


@settings(max_examples=200, deadline=None)
@given(index=st.integers(0, len(PAYLOAD_FRAMES) - 1), cut=st.integers(1, 400))
def test_truncated_frames_wait_then_report(index, cut):
    data = PAYLOAD_FRAMES[index]
    cut = min(cut, len(data) - 1)
    for twin in TWINS:
        reader = twin.FrameReader()
        reader.feed(data[:cut])
        assert reader.next_frame() is None
        with pytest.raises(errors.TruncatedFrameError):
            reader.close()
