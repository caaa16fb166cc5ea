"""Codec throughput: decode + validate (CRC32C) + decompress + split.

Compares the Cython twin, the pure-Python twin and a naive baseline that
parses every SingleMessageMetadata with the protobuf-generated class, on the
same frames, one core. Prints a table; --json writes the rows.

A second table times split_columns on one uncompressed batch payload, beside
a plain copy of the same number of payload bytes (bytes(memoryview(...)),
timed the same way, in alternate samples): "of memcpy" is the copy's best time
over split_columns' best time; "(median)" the median of the per-sample ratios.
"of batch copy" is the same ratio for a copy of the whole batch payload (its
SingleMessageMetadata and size fields too: what the split reads), for context.

    python benchmarks/bench_codec.py [--seconds 0.5] [--json out.json] [--columns-only]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import time

from crc32c import crc32c

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pulsarwire import _codec_py, compression  # noqa: E402
from pulsarwire._proto import PulsarApi_pb2 as pb  # noqa: E402

try:
    from pulsarwire import _codec
except ImportError:
    _codec = None

BATCH_BYTES = 128 * 1024  # the official clients' default batch size limit
MAX_BATCH_MESSAGES = 1000


def _payloads(size, count, rng):
    # Compressible but not trivial: JSON-ish records.
    return [(b'{"id":%d,"v":"' % i + bytes(rng.choice(b"abcdefgh") for _ in range(size)))[:size]
            for i in range(count)]


def make_batch_frames(message_size, kind, frames=20, seed=1):
    rng = random.Random(seed)
    per_batch = min(MAX_BATCH_MESSAGES, BATCH_BYTES // (message_size + 16))
    out = []
    for f in range(frames):
        builder = _codec_py.BatchBuilder()
        for i, payload in enumerate(_payloads(message_size, per_batch, rng)):
            builder.add(payload, properties={"k": str(i)}, partition_key=f"key-{i % 8}", event_time=1 + i)
        raw = builder.build()
        md = pb.MessageMetadata(producer_name="bench", sequence_id=f, publish_time=1,
                                num_messages_in_batch=per_batch, compression=kind,
                                uncompressed_size=len(raw))
        cmd = pb.BaseCommand(type=pb.BaseCommand.MESSAGE, message=pb.CommandMessage(
            consumer_id=1, message_id=pb.MessageIdData(ledgerId=1, entryId=f)))
        out.append(_codec_py.encode_payload_command(cmd, md, compression.compress(kind, raw)))
    return b"".join(out), per_batch * frames, frames


def make_large_frames(size=1 << 20, frames=16):
    payload = os.urandom(size)
    md = pb.MessageMetadata(producer_name="bench", sequence_id=0, publish_time=1)
    cmd = pb.BaseCommand(type=pb.BaseCommand.MESSAGE, message=pb.CommandMessage(
        consumer_id=1, message_id=pb.MessageIdData(ledgerId=1, entryId=0)))
    frame = _codec_py.encode_payload_command(cmd, md, payload)
    return frame * frames, frames, frames


def run_twin(twin, stream):
    reader = twin.FrameReader()
    reader.feed(stream)
    count = 0
    for frame in reader:
        count += len(frame.messages())
    return count


def run_naive(stream):
    """Protobuf-generated classes for everything, one SingleMessageMetadata object per message."""
    view = memoryview(stream)
    pos = 0
    count = 0
    while pos < len(view):
        total, cmd_size = struct.unpack_from(">II", view, pos)
        end = pos + 4 + total
        pb.BaseCommand.FromString(view[pos + 8:pos + 8 + cmd_size])
        p = pos + 8 + cmd_size
        magic, checksum = struct.unpack_from(">HI", view, p)
        assert magic == 0x0E01 and crc32c(view[p + 6:end]) == checksum
        p += 6
        md_size = struct.unpack_from(">I", view, p)[0]
        md = pb.MessageMetadata.FromString(view[p + 4:p + 4 + md_size])
        payload = view[p + 4 + md_size:end]
        if md.compression:
            payload = memoryview(compression.decompress(md.compression, payload, md.uncompressed_size))
        if md.HasField("num_messages_in_batch"):
            q = 0
            for _ in range(md.num_messages_in_batch):
                smm_size = struct.unpack_from(">I", payload, q)[0]
                smm = pb.SingleMessageMetadata.FromString(payload[q + 4:q + 4 + smm_size])
                q += 4 + smm_size
                _ = (smm, payload[q:q + smm.payload_size])
                q += smm.payload_size
                count += 1
        else:
            count += 1
        pos = end
    return count


def measure(fn, stream, seconds):
    best = float("inf")
    deadline = time.perf_counter() + seconds
    runs = 0
    while runs < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        count = fn(stream)
        best = min(best, time.perf_counter() - start)
        runs += 1
        if runs >= 200:
            break
    return count, best


def make_columns_batch(message_size, shape, seed=2):
    """One uncompressed 128 KiB batch payload (at most 1 000 messages) and its metadata.

    shape: "payload" (SingleMessageMetadata holds payload_size only), "sequence" (and a
    sequence_id, as the official clients write), "keyed" (and a property, a partition
    key and an event time, as make_batch_frames).
    """
    rng = random.Random(seed)
    per_batch = min(MAX_BATCH_MESSAGES, BATCH_BYTES // (message_size + 16))
    builder = _codec_py.BatchBuilder()
    for i, payload in enumerate(_payloads(message_size, per_batch, rng)):
        if shape == "keyed":
            builder.add(payload, properties={"k": str(i)}, partition_key=f"key-{i % 8}", event_time=1 + i)
        elif shape == "sequence":
            builder.add(payload, sequence_id=1000 + i)
        else:
            builder.add(payload)
    md = pb.MessageMetadata(producer_name="bench", sequence_id=0, publish_time=1, num_messages_in_batch=per_batch)
    return md, builder.build(), per_batch, per_batch * message_size


def paired_times(split, copy, seconds, split_calls, batch_copy=None):
    """Alternate samples of `split` (split_calls calls), `copy` and `batch_copy` (20 calls each)
    for about `seconds`.

    Returns the best time of one call of each (None for a batch_copy not given) and the median
    of the per-sample ratios copy/split: samples taken together see the same machine, which
    matters where other work comes and goes.
    """
    split_times, copy_times, batch_copy_times = [], [], []
    calls_made = [(split, split_times, split_calls), (copy, copy_times, 20)]
    if batch_copy is not None:
        calls_made.append((batch_copy, batch_copy_times, 20))
    deadline = time.perf_counter() + seconds
    while len(split_times) < 5 or time.perf_counter() < deadline:
        for call, times, calls in calls_made:
            start = time.perf_counter()
            for _ in range(calls):
                call()
            times.append((time.perf_counter() - start) / calls)
    ratios = sorted(c / s for s, c in zip(split_times, copy_times))
    return (min(split_times), min(copy_times), ratios[len(ratios) // 2],
            min(batch_copy_times) if batch_copy_times else None)


def columns_main(args):
    impls = []
    if _codec is not None:
        impls.append(("cython", _codec.split_columns))
    if not args.skip_python:
        impls.append(("python", _codec_py.split_columns))
    if _codec is not None:
        impls.append(("cython split_messages", _codec.split_messages))  # reference: an object per message
    rows = []
    header = (f"{'columnar split, one batch':<28} {'impl':<22} {'messages/s':>12} {'payload GB/s':>13} "
              f"{'memcpy GB/s':>12} {'of memcpy':>10} {'(median)':>9} {'of batch copy':>14}")
    print(header)
    print("-" * len(header))
    for size, shape in ((100, "payload"), (100, "sequence"), (100, "keyed"), (1024, "payload"), (1024, "keyed")):
        md, raw, messages, payload_bytes = make_columns_batch(size, shape)
        name = f"columns {messages}x{size}B {shape}"
        plain = bytes(payload_bytes)
        for impl_name, split in impls:
            if impl_name == "cython":
                check = split(md, raw)
                assert len(check) == messages and len(check.payloads) == payload_bytes, name
            split_time, copy_time, median_ratio, batch_copy_time = paired_times(
                lambda: split(md, raw), lambda: bytes(memoryview(plain)), args.seconds,
                1 if impl_name == "python" else 20, lambda: bytes(memoryview(raw)))
            row = {"case": name, "impl": impl_name, "messages_per_s": messages / split_time,
                   "payload_gb_per_s": payload_bytes / split_time / 1e9,
                   "memcpy_gb_per_s": payload_bytes / copy_time / 1e9, "fraction_of_memcpy": copy_time / split_time,
                   "fraction_of_memcpy_median": median_ratio, "batch_bytes": len(raw),
                   "fraction_of_batch_copy": batch_copy_time / split_time}
            rows.append(row)
            print(f"{name:<28} {impl_name:<22} {row['messages_per_s']:>12,.0f} {row['payload_gb_per_s']:>13.2f} "
                  f"{row['memcpy_gb_per_s']:>12.2f} {row['fraction_of_memcpy']:>10.3f} {median_ratio:>9.3f} "
                  f"{row['fraction_of_batch_copy']:>14.3f}")
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="time per case and implementation")
    parser.add_argument("--json", help="write the rows as JSON to this file")
    parser.add_argument("--skip-python", action="store_true", help="skip the slow pure-Python twin")
    parser.add_argument("--columns-only", action="store_true", help="only the columnar split table")
    args = parser.parse_args(argv)
    if args.columns_only:
        rows = columns_main(args)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"benchmark": "codec", "rows": rows}, fh, indent=1)
        return rows

    impls = []
    if _codec is not None:
        impls.append(("cython", lambda s: run_twin(_codec, s)))
    if not args.skip_python:
        impls.append(("python", lambda s: run_twin(_codec_py, s)))
    impls.append(("naive-protobuf", run_naive))

    cases = []
    for size in (100, 1024):
        for kind in sorted(compression.NAMES):
            cases.append((f"batch {size}B {compression.NAMES[kind]}", *make_batch_frames(size, kind)))
    cases.append(("1MB frames (CRC32C)", *make_large_frames()))

    rows = []
    header = f"{'case':<24} {'impl':<15} {'frames/s':>12} {'messages/s':>14} {'GB/s':>8}"
    print(header)
    print("-" * len(header))
    for name, stream, messages, frames in cases:
        for impl_name, fn in impls:
            count, elapsed = measure(fn, stream, args.seconds)
            assert count == messages, (name, impl_name, count, messages)
            row = {"case": name, "impl": impl_name, "frames_per_s": frames / elapsed,
                   "messages_per_s": messages / elapsed, "gb_per_s": len(stream) / elapsed / 1e9}
            rows.append(row)
            print(f"{name:<24} {impl_name:<15} {row['frames_per_s']:>12,.0f} "
                  f"{row['messages_per_s']:>14,.0f} {row['gb_per_s']:>8.2f}")
    print()
    rows += columns_main(args)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"benchmark": "codec", "rows": rows}, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
