"""Client for the broker's V1 text protocol (`V1|<id>|<command>|<args>` lines).

    async with await V1Client.connect("127.0.0.1", port) as v1:
        placed = await v1.produce("orders", "k", "v", acks="all")   # {'partition': 0, 'offset': 3, 'hw': 4}
        batch = await v1.consume("orders", 0, 0)                    # {'messages': [(0, 'v'), ...], 'hw': 4}
"""
from __future__ import annotations

import asyncio
import itertools
import re

from .errors import PulsarWireError


class V1Error(PulsarWireError):
    """An ERR answer: `code` is BAD_REQUEST, UNKNOWN_COMMAND, REPLICATION_TIMEOUT, NOT_LEADER, ..."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


_FIELD = re.compile(r"(\w+)=(\[[^\]]*\]|\S*)")


def parse_payload(payload: str) -> dict:
    """`a=1 b=[0,2] c=x` -> {'a': 1, 'b': [0, 2], 'c': 'x'}; `messages=` becomes (offset, value) pairs."""
    out: dict = {}
    if payload.startswith("messages="):
        body, _, rest = payload[len("messages="):].rpartition(" ")
        records = [item.partition(":") for item in body.split(",") if item]
        out["messages"] = [(int(offset), value) for offset, _, value in records]
        payload = rest
    for key, value in _FIELD.findall(payload):
        if value.startswith("["):
            out[key] = [int(v) for v in value[1:-1].split(",") if v]
        elif value in ("true", "false"):
            out[key] = value == "true"
        else:
            try:
                out[key] = int(value)
            except ValueError:
                out[key] = value
    return out


class V1Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, host: str, port: int) -> "V1Client":
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        return cls(reader, writer)

    async def __aenter__(self) -> "V1Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except ConnectionError:
            pass

    async def raw(self, line: str) -> str:
        """Send one raw line and return the raw response line (for tests and debugging)."""
        async with self._lock:
            self._writer.write(line.encode() + b"\n")
            await self._writer.drain()
            return (await self._reader.readline()).decode().rstrip("\n")

    async def request(self, command: str, *args) -> str:
        correlation = next(self._ids)
        response = await self.raw(f"V1|{correlation}|{command}|{' '.join(str(a) for a in args)}")
        parts = response.split("|", 4)
        if len(parts) < 3 or parts[0] != "V1":
            raise V1Error("BAD_RESPONSE", response)
        if parts[2] == "ERR":
            raise V1Error(parts[3] if len(parts) > 3 else "UNKNOWN", parts[4] if len(parts) > 4 else "")
        if parts[1] != str(correlation):
            raise V1Error("BAD_RESPONSE", f"correlation id {parts[1]} for request {correlation}")
        return parts[3] if len(parts) > 3 else ""

    async def ping(self) -> str:
        return await self.request("PING")

    async def produce(self, topic: str, key: str, value: str, acks: str = "1") -> dict:
        return parse_payload(await self.request("PRODUCE", topic, f"{key}:{value}", f"acks={acks}"))

    async def consume(self, topic: str, partition: int, offset: int) -> dict:
        return parse_payload(await self.request("CONSUME", topic, partition, offset))

    async def join(self, group: str, topic: str, consumer_id: str, assignor: str = "round_robin") -> dict:
        return parse_payload(await self.request("JOIN", group, topic, consumer_id, f"assignor={assignor}"))

    async def sync(self, group: str, consumer_id: str) -> dict:
        return parse_payload(await self.request("SYNC", group, consumer_id))

    async def heartbeat(self, group: str, consumer_id: str, generation: int) -> dict:
        return parse_payload(await self.request("HEARTBEAT", group, consumer_id, generation))

    async def leave(self, group: str, consumer_id: str) -> dict:
        return parse_payload(await self.request("LEAVE", group, consumer_id))

    async def commit(self, group: str, topic: str, partition: int, offset: int, consumer_id: str,
                     generation: int) -> dict:
        return parse_payload(await self.request("COMMIT", group, topic, partition, offset, consumer_id, generation))

    async def offset(self, group: str, topic: str, partition: int) -> int:
        return parse_payload(await self.request("OFFSET", group, topic, partition))["offset"]

    async def replica_fetch(self, topic: str, partition: int, replica_id: int, offset: int) -> dict:
        return parse_payload(await self.request("REPLICA_FETCH", topic, partition, replica_id, offset))

    async def set_partition_role(self, topic: str, partition: int, role: str) -> dict:
        return parse_payload(await self.request("SET_PARTITION_ROLE", topic, partition, role))
