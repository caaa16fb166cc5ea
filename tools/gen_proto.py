"""Regenerate pulsarwire/_proto/PulsarApi_pb2.py (and its .pyi stub) from proto/PulsarApi.proto.

Needs grpcio-tools (a pinned protoc). The generated module is checked in so
that installing pulsarwire never needs protoc; tests/codec/test_proto.py fails when
the checked-in module no longer matches the .proto.
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def generate(out_dir: pathlib.Path) -> pathlib.Path:
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    rc = protoc.main([
        "protoc",
        f"--proto_path={ROOT / 'proto'}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(ROOT / "proto" / "PulsarApi.proto"),
    ])
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    return out_dir / "PulsarApi_pb2.py"


if __name__ == "__main__":
    target = generate(ROOT / "pulsarwire" / "_proto")
    print(f"wrote {target}", file=sys.stderr)
