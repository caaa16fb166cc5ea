"""The entry cache: recently appended entries in memory, one budget for every log of a broker."""
from __future__ import annotations

import collections
from typing import Iterable

from .record import Body, Entry

Entries = collections.OrderedDict[int, Entry]  # one log's cached entries by id, oldest first

DEFAULT_MAX_CACHE_BYTES = 64 * 1024 * 1024  # cached entry bodies, all logs of a broker together


class Viewed:
    """A bytes object that cached bodies view (a receive buffer), and how many of them do."""

    __slots__ = ("held", "views")

    def __init__(self, held: bytes) -> None:
        self.held = held
        self.views = 1


class EntryCache:
    """Recently appended entries of every log that shares it, at most `max_bytes` in all. Each
    log keeps its own dict of entries (oldest first); this keeps the logs in the order they were
    last used (an append or a cache hit) and, over the budget, takes the oldest entries of the
    least recently used log first.

    It counts the memory the cached bodies keep alive: a body that is bytes counts its size; one
    that is a view of a bytes object (a frame in a receive buffer, kept without a copy) counts
    that whole object, once however many cached bodies view it, until the last of them goes.

    Over the budget it evicts down to `max_bytes - max_bytes // EVICT_STEP`, not just under it:
    a full cache then pays for one eviction pass per few hundred appends, not one per append."""

    EVICT_STEP = 32

    def __init__(self, max_bytes: int = DEFAULT_MAX_CACHE_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_cache_bytes must not be negative")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evicted_entries = 0
        self._logs: collections.OrderedDict[object, Entries] = collections.OrderedDict()
        # id of a bytes object that cached views share -> it, and how many cached bodies view it
        self._viewed: dict[int, Viewed] = {}

    def put(self, owner: object, entries: Entries, entry: Entry) -> None:
        """Add `entry` to `entries`, the cache dict of log `owner`, then evict down to the budget.
        Its body is bytes or a view of bytes (TopicLog.append copies anything else)."""
        self.put_many(owner, entries, (entry,))

    def put_many(self, owner: object, entries: Entries, new: Iterable[Entry]) -> None:
        """put() for each entry of `new`, in order, with one eviction at the end."""
        viewed_of = self._viewed
        added = 0
        for entry in new:
            entries[entry.entry_id] = entry
            body = entry.body
            if type(body) is memoryview:
                held: bytes = body.obj  # type: ignore[assignment]  # TopicLog.append keeps only views of bytes
                viewed = viewed_of.get(id(held))
                if viewed is None:
                    viewed_of[id(held)] = Viewed(held)
                    added += len(held)
                else:
                    viewed.views += 1
            else:
                added += len(body)
        self.bytes += added
        logs = self._logs
        try:
            logs.move_to_end(owner)
        except KeyError:
            logs[owner] = entries
        if self.bytes > self.max_bytes:
            self._evict()

    def _release(self, body: Body) -> None:
        """A cached body leaves: what it counted is given back."""
        if type(body) is memoryview:
            key = id(body.obj)
            viewed = self._viewed[key]
            viewed.views -= 1
            if not viewed.views:
                del self._viewed[key]
                self.bytes -= len(viewed.held)
        else:
            self.bytes -= len(body)

    def touch(self, owner: object) -> None:
        """`owner` was just read from its cache: it is the most recently used log."""
        try:
            self._logs.move_to_end(owner)
        except KeyError:
            pass

    def _evict(self) -> None:
        logs = self._logs
        target = self.max_bytes - self.max_bytes // self.EVICT_STEP
        viewed_of = self._viewed
        held_bytes = self.bytes
        evicted = 0
        while held_bytes > target and logs:
            owner, entries = next(iter(logs.items()))
            popitem = entries.popitem
            while entries and held_bytes > target:
                body = popitem(last=False)[1].body
                evicted += 1
                # _release, inline: this loop runs once per entry appended to a full cache
                if type(body) is memoryview:
                    key = id(body.obj)
                    viewed = viewed_of[key]
                    viewed.views -= 1
                    if not viewed.views:
                        del viewed_of[key]
                        held_bytes -= len(viewed.held)
                else:
                    held_bytes -= len(body)
            if not entries:
                del logs[owner]
        self.bytes = held_bytes
        self.evicted_entries += evicted

    def discard(self, entries: Entries, entry_id: int) -> None:
        old = entries.pop(entry_id, None)
        if old is not None:
            self._release(old.body)

    def drop(self, owner: object, entries: Entries) -> None:
        """Forget every entry of log `owner` (it is closing)."""
        for entry in entries.values():
            self._release(entry.body)
        entries.clear()
        self._logs.pop(owner, None)

    @property
    def log_count(self) -> int:
        return len(self._logs)
