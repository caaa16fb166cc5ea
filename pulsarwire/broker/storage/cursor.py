"""A durable subscription's position in a log, as acknowledgements move it and as stored."""
from __future__ import annotations

from typing import Any, Iterable


class Cursor:
    """A durable subscription's position: everything <= mark_delete is acknowledged,
    plus individually acknowledged entries and partially acknowledged batches."""

    def __init__(self, mark_delete: int = -1, acked: Iterable[int] = (), partial: dict[int, int] | None = None) -> None:
        self.mark_delete = mark_delete
        self.acked: set[int] = set(acked)
        self.partial: dict[int, int] = dict(partial or {})  # entry -> bitmask of unacked indexes

    def is_acked(self, entry_id: int) -> bool:
        return entry_id <= self.mark_delete or entry_id in self.acked

    def ack(self, entry_id: int) -> None:
        if entry_id > self.mark_delete:
            self.acked.add(entry_id)
            self.partial.pop(entry_id, None)
            self._advance()

    def ack_partial(self, entry_id: int, remaining: int) -> None:
        """Batch-index ack: `remaining` has a bit set for each index still unacknowledged."""
        if self.is_acked(entry_id):
            return
        current = self.partial.get(entry_id)
        remaining = remaining if current is None else current & remaining
        if remaining == 0:
            self.ack(entry_id)
        else:
            self.partial[entry_id] = remaining

    def ack_cumulative(self, entry_id: int) -> None:
        if entry_id > self.mark_delete:
            self.mark_delete = entry_id
            self.acked = {e for e in self.acked if e > entry_id}
            self.partial = {e: b for e, b in self.partial.items() if e > entry_id}
            self._advance()

    def reset(self, next_entry_id: int) -> None:
        self.mark_delete = next_entry_id - 1
        self.acked.clear()
        self.partial.clear()

    def _advance(self) -> None:
        while self.mark_delete + 1 in self.acked:
            self.mark_delete += 1
            self.acked.discard(self.mark_delete)

    def to_json(self) -> dict[str, Any]:
        return {"mark_delete": self.mark_delete, "acked": sorted(self.acked),
                "partial": {str(k): v for k, v in self.partial.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cursor:
        return cls(data["mark_delete"], data.get("acked", ()),
                   {int(k): v for k, v in data.get("partial", {}).items()})
