"""The codec, chosen once at import: the Cython twin when it is built, else the
pure-Python twin (with a warning). Set PULSARWIRE_PURE_PYTHON=1 to force the
pure-Python twin; both have the same API and behaviour.
"""
from __future__ import annotations

import importlib
import os
import warnings
from types import ModuleType

if os.environ.get("PULSARWIRE_PURE_PYTHON", "") not in ("", "0"):
    from . import _codec_py as _impl
else:
    try:
        from . import _codec as _impl  # type: ignore[attr-defined,no-redef,unused-ignore]
    except ImportError:  # no compiler at install time, or an unsupported platform
        warnings.warn("pulsarwire: Cython codec not built; using the pure-Python codec (slower)",
                      RuntimeWarning, stacklevel=2)
        from . import _codec_py as _impl

IMPLEMENTATION: str = _impl.IMPLEMENTATION
MAGIC_CRC32C: int = _impl.MAGIC_CRC32C
MAGIC_BROKER_ENTRY_METADATA: int = _impl.MAGIC_BROKER_ENTRY_METADATA
DEFAULT_MAX_MESSAGE_SIZE: int = _impl.DEFAULT_MAX_MESSAGE_SIZE
DEFAULT_MAX_FRAME_SIZE: int = _impl.DEFAULT_MAX_FRAME_SIZE
FRAME_PADDING: int = _impl.FRAME_PADDING

Frame = _impl.Frame
SendFrame = _impl.SendFrame
ReceiptFrame = _impl.ReceiptFrame
FrameReader = _impl.FrameReader
SingleMessage = _impl.SingleMessage
Columns = _impl.Columns
BatchBuilder = _impl.BatchBuilder
decode_frame = _impl.decode_frame
decompress_payload = _impl.decompress_payload
split_messages = _impl.split_messages
count_batch = _impl.count_batch
count_entry_batch = _impl.count_entry_batch
split_columns = _impl.split_columns
encode_command = _impl.encode_command
encode_metadata_and_payload = _impl.encode_metadata_and_payload
encode_payload_frame = _impl.encode_payload_frame
encode_payload_frame_head = _impl.encode_payload_frame_head
encode_payload_command = _impl.encode_payload_command
encode_single_message_metadata = _impl.encode_single_message_metadata
encode_send_receipt = _impl.encode_send_receipt
encode_send = _impl.encode_send
metadata_and_payload_size = _impl.metadata_and_payload_size



def follow_codec(cython_twin: str, pure_twin: str, what: str) -> ModuleType:
    """The twin of a module whose Cython twin works with the Cython codec alone (the broker's
    staging, the consumer's receiving helpers): the Cython one when the codec is Cython and it
    is built, else the pure-Python one (with a warning when only it is missing)."""
    if IMPLEMENTATION != "cython":
        return importlib.import_module(pure_twin)
    try:
        return importlib.import_module(cython_twin)
    except ImportError:  # the codec was built but not this: the pure twin reads its objects too
        warnings.warn(f"pulsarwire: Cython {what} not built; using the pure-Python twin (slower)",
                      RuntimeWarning, stacklevel=3)
        return importlib.import_module(pure_twin)


__all__ = [
    "IMPLEMENTATION", "MAGIC_CRC32C", "MAGIC_BROKER_ENTRY_METADATA", "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_FRAME_SIZE", "FRAME_PADDING", "Frame", "SendFrame", "ReceiptFrame", "FrameReader", "SingleMessage",
    "Columns",
    "BatchBuilder", "decode_frame", "decompress_payload", "split_messages", "count_batch", "count_entry_batch",
    "split_columns", "encode_command",
    "encode_metadata_and_payload", "encode_payload_frame", "encode_payload_frame_head", "encode_payload_command",
    "encode_single_message_metadata", "encode_send_receipt", "encode_send", "metadata_and_payload_size",
]
