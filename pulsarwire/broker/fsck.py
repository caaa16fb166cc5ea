"""`pulsarwire fsck DATA_DIR` (also `pulsarwire broker --check`): every damaged or inconsistent
metadata file of a stopped broker's data dir, and every topic log whose records are damaged or
missing (each record's checksum is read: the whole log), and what a start would do about it;
nothing is changed. With `--repair` it does what a start would, then checks again.

What a start does with each file is decided where the file is read (core, topics, v1); the
descriptions below say the same in words, for the report.
"""
from __future__ import annotations

import logging
import os
import urllib.parse
from typing import Any, Callable, Sequence, TextIO

from . import metafile
from .storage.record import HEADER_SIZE, count_gap, damaged_records, decode_index, record_at
from .core import BROKER_FILE, LEDGER_IDS_FILE, PARTITION_MARKER, PARTITIONED_FILE, BrokerCore, _broker_state, \
    _ledger_allocation, _partitioned_topics
from .topic_files import CURSORS_FILE, EPOCH_FILE, LEDGERS_FILE, SCHEMA_FILE, STATE_FILE, _cursors, _epoch, \
    _ledger_ranges, _schemas, _topic_state

log = logging.getLogger("pulsarwire.broker.fsck")

GROUPS_FILE, OFFSETS_FILE = "groups.json", "offsets.json"

# file -> (validator, what a start does with the previous copy, what it does with no good copy)
BROKER_FILES: dict[str, tuple[Callable[[Any], Any], str, str]] = {
    BROKER_FILE: (_broker_state, "its previous copy's start count plus two is used",
                  "a start count is taken from the clock (above any earlier one)"),
    LEDGER_IDS_FILE: (_ledger_allocation, "rebuilt from the topics' ledgers and its previous copy",
                      "rebuilt from the topics' ledgers"),
    PARTITIONED_FILE: (_partitioned_topics, "rebuilt from its previous copy and the partitions' directories",
                       "rebuilt from the partitions' directories (a count may miss partitions never written)"),
    GROUPS_FILE: (metafile.expect(dict), "its previous copy is used: later group changes are lost, members join again",
                  "V1 groups start empty: members join again"),
    OFFSETS_FILE: (metafile.expect(dict), "its previous copy is used: offsets committed after it are consumed again",
                   "V1 groups have no committed offsets: they consume again from where their clients start"),
}
TOPIC_FILES: dict[str, tuple[Callable[[Any], Any], str, str]] = {
    LEDGERS_FILE: (_ledger_ranges, "its previous copy is used",
                   "rebuilt: the entries stored so far carry ledger 0 in their message ids"),
    EPOCH_FILE: (_epoch, "its previous copy is used: a producer fenced after it may take the topic again",
                 "epoch 0: a fenced producer may take the topic again"),
    STATE_FILE: (_topic_state, "its previous copy is used; deduplication state after it rebuilt from the log",
                 "deduplication state rebuilt from the log; a termination it held is lost"),
    CURSORS_FILE: (_cursors, "its previous copy is used: what was acknowledged after it is delivered again",
                   "every durable subscription starts again at the earliest entry (everything delivered again)"),
    SCHEMA_FILE: (_schemas, "its previous copy is used: a later version is registered again when declared",
                  "no schema: the next producer or consumer declaring one registers it"),
}


class Finding:
    """One damaged or inconsistent file, and what a start does about it."""

    def __init__(self, path: str, problem: str, action: str) -> None:
        self.path, self.problem, self.action = path, problem, action

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}; a start: {self.action}"


def _check_file(path: str, validate: Callable[[Any], Any], on_previous: str, on_lost: str) -> list[Finding]:
    loaded = metafile.load(path, validate)
    findings = []
    if loaded.source == metafile.PREVIOUS_COPY:
        findings.append(Finding(path, loaded.problem or "damaged", on_previous))
    elif loaded.source == metafile.LOST:
        findings.append(Finding(path, f"{loaded.problem}, and no good previous copy", on_lost))
    elif loaded.source == metafile.CURRENT and os.path.exists(path + metafile.PREVIOUS):
        previous = metafile.load(path + metafile.PREVIOUS, validate)
        if previous.source != metafile.CURRENT:
            findings.append(Finding(path + metafile.PREVIOUS, previous.problem or "damaged",
                                    "nothing (the current file is good; its next write replaces this copy)"))
    return findings


def _topic_directories(data_dir: str) -> list[str]:
    root = os.path.join(data_dir, "topics")
    return sorted(os.path.join(root, name) for name in os.listdir(root)) if os.path.isdir(root) else []


def check(data_dir: str) -> list[Finding]:
    """Every damaged or inconsistent metadata file under `data_dir`; nothing is changed."""
    findings: list[Finding] = []
    for name, (validate, on_previous, on_lost) in BROKER_FILES.items():
        findings += _check_file(os.path.join(data_dir, name), validate, on_previous, on_lost)
    highest_ledger = 0
    partitions: dict[str, int] = {}
    for directory in _topic_directories(data_dir):
        for name, (validate, on_previous, on_lost) in TOPIC_FILES.items():
            findings += _check_file(os.path.join(directory, name), validate, on_previous, on_lost)
        ranges = metafile.load(os.path.join(directory, LEDGERS_FILE), _ledger_ranges).data or []
        highest_ledger = max([highest_ledger] + [ledger for _, ledger in ranges])
        parent, marker, index = urllib.parse.unquote(os.path.basename(directory)).rpartition(PARTITION_MARKER)
        if marker and parent and index.isdigit():
            partitions[parent] = max(partitions.get(parent, 0), int(index) + 1)
        findings += _leftovers(directory)
        findings += check_log(directory)
    findings += _leftovers(data_dir)
    allocation = metafile.load(os.path.join(data_dir, LEDGER_IDS_FILE), _ledger_allocation)
    if allocation.source == metafile.CURRENT and allocation.data <= highest_ledger:
        findings.append(Finding(allocation.path, f"the next ledger id is {allocation.data} but a topic holds "
                                f"ledger {highest_ledger}",
                                f"nothing (--repair sets the next id to {highest_ledger + 1})"))
    registered = metafile.load(os.path.join(data_dir, PARTITIONED_FILE), _partitioned_topics)
    if registered.source == metafile.CURRENT:
        for parent, count in sorted(partitions.items()):
            if parent in registered.data and registered.data[parent] < count:
                findings.append(Finding(registered.path, f"{parent} has {registered.data[parent]} partitions but "
                                        f"partition {count - 1} has a directory",
                                        f"nothing (--repair raises its count to {count})"))
    return findings


def check_log(directory: str) -> list[Finding]:
    """A topic's segments, read whole and each record's checksum checked: entries missing or
    damaged, and index files that disagree with their logs. Nothing is changed."""
    try:
        bases = sorted(int(name[:-4]) for name in os.listdir(directory) if name.endswith(".log") and name[:-4].isdigit())
    except OSError as exc:
        return [Finding(directory, f"cannot be listed ({exc})", "the topic cannot be opened")]
    findings: list[Finding] = []
    if bases and bases[0] > 0:
        findings.append(Finding(directory, f"the segments before entry {bases[0]} are missing: entries 0 to "
                                f"{bases[0] - 1} are lost", "reported at ERROR; a subscription that had not "
                                "acknowledged them goes on after them"))
    for i, base in enumerate(bases):
        log_path = os.path.join(directory, f"{base:020d}.log")
        try:
            with open(log_path, "rb") as fh:
                data = fh.read()
            indexed = None
            if os.path.exists(log_path[:-4] + ".idx"):
                with open(log_path[:-4] + ".idx", "rb") as fh:
                    indexed = decode_index(fh.read())
        except OSError as exc:
            findings.append(Finding(log_path, f"cannot be read ({exc})", "the topic cannot be opened"))
            continue
        last = i == len(bases) - 1
        positions, damaged, torn = _scan_records(data, indexed if indexed is not None else (),
                                                 None if last else bases[i + 1] - base)
        for start, stop, count in damaged:
            findings.append(Finding(log_path, f"bytes {start} to {stop} are damaged ({count} entr"
                                    f"{'y' if count == 1 else 'ies'})", "they read as corrupt; the entries after "
                                    "them are kept"))
        held = len(positions)
        if torn is not None:
            if last and (indexed is None or len(indexed) <= held):
                findings.append(Finding(log_path, f"a record cut short at byte {torn} (a write a crash cut short, "
                                        "never indexed)", "truncated there (WARNING)"))
            else:
                findings.append(Finding(log_path, f"bytes {torn} to {len(data)} hold no readable record",
                                        "they read as lost"))
        expected = bases[i + 1] - base if not last else (len(indexed) if indexed is not None else held)
        if held < expected:
            missing = "" if last else f" (its end cut, or a segment between it and the next, " \
                                      f"{base + held:020d}.log, missing)"
            findings.append(Finding(log_path, f"holds {held} of its {expected} entries: entries {base + held} to "
                                    f"{base + expected - 1} are lost{missing}", "they read as lost; their ids are "
                                    "not given to new messages"))
        elif held > expected and not last:
            findings.append(Finding(log_path, f"holds {held} records but the next segment starts at entry "
                                    f"{bases[i + 1]}", f"the {held - expected} after entry {bases[i + 1] - 1} are ignored"))
        if indexed is not None:
            wrong = next((k for k in range(min(len(indexed), held)) if indexed[k] != positions[k]), None)
            if wrong is not None:
                findings.append(Finding(log_path[:-4] + ".idx", f"puts entry {base + wrong} at byte {indexed[wrong]}, "
                                        f"the log at {positions[wrong]}", "corrected where it is read (WARNING), or "
                                        "rebuilt from the log"))
    return findings


def _scan_records(data: bytes, indexed: Sequence[int],
                  expected: int | None) -> tuple[list[int], list[tuple[int, int, int]], int | None]:
    """Where a segment's records start (damaged ones keep their places, as recovery counts
    them: with the index's positions, or the segment's `expected` count, where the damage leaves
    no header to follow), the damaged byte ranges (start, stop, entries), and where unreadable
    bytes run to the end (None if they do not)."""
    positions: list[int] = []
    damaged: list[tuple[int, int, int]] = []
    uncounted: list[int] = []
    offset, end = 0, len(data)
    while offset < end:
        body_size = record_at(data, offset, end)
        if body_size is not None:
            positions.append(offset)
            offset += HEADER_SIZE + body_size
            continue
        found = next((o for o in range(offset + 1, end - HEADER_SIZE + 1) if record_at(data, o, end) is not None), None)
        if found is None:
            return positions, damaged, offset
        hops, counted = damaged_records(data, offset, found, indexed)
        if not counted:
            uncounted.append(len(positions))
        damaged.append((offset, found, len(hops)))
        positions.extend(hops)
        offset = found
    if expected is not None and uncounted:
        added = count_gap(positions, uncounted, expected, end)
        if added:
            damaged = [(a, b, count + added if a == positions[uncounted[0]] else count) for a, b, count in damaged]
    return positions, damaged, None


def _leftovers(directory: str) -> list[Finding]:
    return [Finding(os.path.join(directory, name), "a temporary file a write left behind (the process stopped in it)",
                    "nothing (--repair removes it)")
            for name in sorted(os.listdir(directory)) if name.endswith(metafile.TEMPORARY)]


def repair(data_dir: str) -> list[Finding]:
    """Do what a start does with every damaged file, and fix what a start leaves; returns what
    check() finds afterwards (nothing, unless the file system refused)."""
    from .v1 import _load_group_file  # the V1 front end reads those two files
    for directory in [data_dir] + _topic_directories(data_dir):
        for finding in _leftovers(directory):
            os.unlink(finding.path)
    for finding in check(data_dir):
        if finding.path.endswith(metafile.PREVIOUS):  # a good file, a damaged copy: the copy made again
            path = finding.path[:-len(metafile.PREVIOUS)]
            os.unlink(finding.path)
            metafile.write(path, metafile.load(path).data)
    core = BrokerCore(data_dir)
    core.open()
    try:
        highest = core._highest_ledger_on_disk()
        if core._next_ledger_id <= highest:
            core._next_ledger_id = highest + 1
            core._reserve_ledger_ids(wait=True)
        grown = dict(core._partitioned)
        for parent, count in core._partition_directories().items():
            if parent in grown and grown[parent] < count:
                grown[parent] = count
        if grown != core._partitioned:
            core._partitioned = grown
            core.metadata.write_now(core._metadata_path(), grown)
        for directory in _topic_directories(data_dir):
            name = urllib.parse.unquote(os.path.basename(directory))
            if name not in core._partitioned:
                core.topic(name)  # opening it repairs its files
        for file_name, what in ((GROUPS_FILE, "the V1 groups"), (OFFSETS_FILE, "the V1 groups' committed offsets")):
            path = os.path.join(data_dir, file_name)
            if metafile.load(path, metafile.expect(dict)).source in (metafile.PREVIOUS_COPY, metafile.LOST):
                core.metadata.write_now(path, _load_group_file(path, what, "as a start would"))
    finally:
        core.close()
    return check(data_dir)


def run(data_dir: str, do_repair: bool, out: TextIO) -> int:
    """The command: 0 when nothing is (or, with repair, remains) damaged, 1 otherwise, 2 when
    `data_dir` is no data dir."""
    if not os.path.isdir(data_dir):
        print(f"{data_dir} is not a directory", file=out)
        return 2
    findings = check(data_dir)
    for finding in findings:
        print(finding, file=out)
    if not findings:
        print(f"{data_dir}: every metadata file and topic log is good", file=out)
        return 0
    if not do_repair:
        print(f"{len(findings)} problems; nothing changed (--repair does what is said above)", file=out)
        return 1
    left = repair(data_dir)
    for finding in left:
        print(f"still: {finding}", file=out)
    print(f"repaired {len(findings) - len(left)} of {len(findings)}", file=out)
    return 1 if left else 0
