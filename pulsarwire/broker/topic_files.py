"""A topic's metadata files beside its log: their names, what each must hold to be trusted, and
reading them all when a topic opens."""
from __future__ import annotations

import os
from typing import Any, NamedTuple

from . import metafile
from .storage import FileOps

LEDGERS_FILE = "ledgers.json"
EPOCH_FILE = "producer-epoch.json"
STATE_FILE = "state.json"
CURSORS_FILE = "cursors.json"
SCHEMA_FILE = "schema.json"
COMPACTION_FILE = "compaction.json"


class Compaction(NamedTuple):
    """A topic's last compaction: the last entry it covered, and the entries it kept (each the
    latest of its key)."""

    horizon: int
    kept: set[int]


def _compaction(data: Any) -> Compaction:
    data = metafile.expect(dict)(data)
    return Compaction(int(data["horizon"]), {int(entry) for entry in data["kept"]})


def read_ledger_ranges(path: str) -> metafile.Loaded:
    return metafile.load(path, _ledger_ranges)


def _ledger_ranges(data: Any) -> list[list[int]]:
    ranges = metafile.expect(list)(data)
    starts = []
    for item in ranges:
        first, ledger = item
        if not isinstance(first, int) or not isinstance(ledger, int) or first < 0 or ledger < 0:
            raise ValueError(f"ledger range {item!r}")
        starts.append(first)
    if not ranges or starts != sorted(starts):
        raise ValueError("no ledger ranges, or out of order")
    return ranges


def _epoch(data: Any) -> int:
    epoch = metafile.expect(dict)(data).get("epoch", 0)
    if not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"epoch {epoch!r}")
    return epoch


def _topic_state(data: Any) -> dict[str, Any]:
    state = metafile.expect(dict)(data)
    if not isinstance(state.get("terminated", False), bool) or not isinstance(state.get("dedup_upto", -1), int) \
            or not isinstance(state.get("dedup_lost", 0), int):
        raise ValueError("terminated, dedup_upto or dedup_lost of the wrong type")
    dedup = metafile.expect(dict)(state.get("dedup", {}))
    if not all(isinstance(v, int) for v in dedup.values()):
        raise ValueError("a sequence id that is not a number")
    return state


def _cursors(data: Any) -> dict[str, Any]:
    for name, cursor in metafile.expect(dict)(data).items():
        metafile.expect(dict)(cursor)
        acked, partial = cursor.get("acked", []), cursor.get("partial", {})
        if not (_is_int(cursor["mark_delete"]) and _is_int(cursor.get("type", 0))
                and isinstance(acked, list) and all(_is_int(e) for e in acked)
                and isinstance(partial, dict) and all(k.lstrip("-").isdigit() and _is_int(v)
                                                      for k, v in partial.items())):
            raise ValueError(f"subscription {name}: {str(cursor)[:80]}")
    return data


def _schemas(data: Any) -> list[dict[str, Any]]:
    for record in metafile.expect(list)(data):
        if not (isinstance(record, dict) and _is_int(record.get("type")) and isinstance(record.get("name"), str)
                and isinstance(record.get("data"), str) and isinstance(record.get("properties"), dict)):
            raise ValueError(f"schema version {str(record)[:80]}")
    return data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# every metadata file a topic reads when it opens, with its validator
_METADATA_FILES = ((LEDGERS_FILE, _ledger_ranges), (EPOCH_FILE, _epoch), (STATE_FILE, _topic_state),
                   (CURSORS_FILE, _cursors), (SCHEMA_FILE, _schemas), (COMPACTION_FILE, _compaction))


def read_topic_files(directory: str, create: bool, ops: FileOps) -> dict[str, metafile.Loaded]:
    """The file-system part of opening a topic, for a thread off the event loop: its folder and
    first segment made (with `create`, for a new topic) and its metadata files read, for
    `Topic(preloaded=...)`. Best effort: whatever fails here is tried again, and reported, by
    the Topic opened on the loop."""
    try:
        if create and not os.path.isdir(directory):
            os.makedirs(directory, exist_ok=True)
            for suffix in (".log", ".idx"):  # the first segment, so the loop opens files that exist
                ops.close(ops.open(os.path.join(directory, f"{0:020d}{suffix}")))
    except OSError:
        pass
    if not os.path.isdir(directory):
        return {}
    return {name: metafile.load(os.path.join(directory, name), validate) for name, validate in _METADATA_FILES}
