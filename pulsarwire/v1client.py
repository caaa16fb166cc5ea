"""Client for the broker's V1 text protocol (`V1|<id>|<command>|<args>` lines), as
/work/shared/reference/v1_protocol.md specifies it, plus the broker's additive AUTH and PING.

    async with await V1Client.connect("127.0.0.1", port, token=None) as v1:
        placed = await v1.produce("orders", "user1", "created", acks="all")  # {'partition': 0, 'offset': 3, 'hw': 4}
        batch = await v1.consume("orders", 0, 0)     # {'messages': [(0, 'created'), ...], 'hw': 4}
        member = await v1.join("g", "orders", "c1")  # {'generation': 1, 'assigned': [0, 1, 2]}
        await v1.heartbeat("g", "orders", "c1", member["generation"])
        await v1.commit("g", "orders", "c1", member["generation"], 0, 4)

Every argument travels as one token without ASCII space, tab, `|`, newline or carriage return
(and a value without a comma, which a CONSUME reply could not carry): such keys, values, topic,
group and consumer names cannot be sent (ValueError before anything is sent).
A CONSUME reply returns whole entries up to the high watermark and within the broker's
byte budget; continue from the last offset + 1. An entry too large for one reply (or one
that does not decode) answers V1Error with code RECORD_TOO_LARGE (or CORRUPT_RECORD) and
`offset` set: skip it by consuming from `offset + 1`, or read it with a Pulsar client.
"""
from __future__ import annotations

import asyncio
import itertools
import re
from typing import Any

from .errors import PulsarWireError

DEFAULT_MAX_LINE = 64 * 1024 * 1024  # longest reply line accepted (a CONSUME reply is the long one)


class V1Error(PulsarWireError):
    """An ERR answer. `code` is one of the specification's BAD_REQUEST, UNKNOWN_COMMAND,
    REPLICATION_TIMEOUT, NOT_LEADER, GENERATION_MISMATCH or the broker's additive UNAUTHORIZED,
    RECORD_TOO_LARGE, CORRUPT_RECORD, INTERNAL_ERROR (BAD_RESPONSE: the reply itself was wrong).
    `offset`: for RECORD_TOO_LARGE and CORRUPT_RECORD, the offset of the record concerned."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        found = re.match(r"offset=(\d+)", message)
        self.offset: int | None = int(found.group(1)) if found else None


_FIELD = re.compile(r"(\w+)=(\[[^\]]*\]|\S*)")
_TRAILING_FIELD = re.compile(r"\w+=\S*")
_RECORD_START = re.compile(r"(0|[1-9][0-9]*):")
_OFFSETS = re.compile(r"(?:0|[1-9][0-9]*)(?:,(?:0|[1-9][0-9]*))*")  # offsets joined by commas
_TEXT_FIELDS = {"topic", "role", "heartbeat"}  # never read as numbers


def _value(key: str, text: str) -> str | int | bool | list[int]:
    if key in _TEXT_FIELDS:
        return text
    if text.startswith("["):
        return [int(v) for v in text[1:-1].split(",") if v]
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        return text


def _records(body: str, hw: int | None) -> list[tuple[int, str]]:
    """`0:a,1:b,c` -> [(0, 'a'), (1, 'b,c')]. The format has no escaping, so a comma
    starts a new record only where an offset in order (>= the last one, below hw) follows."""
    if body:
        # the common reply, parsed in bulk: every piece is `offset:value`; if the offsets are in
        # order each piece is a record (else the loop below decides which commas are values')
        pieces = body.split(",")
        heads, colons, values = zip(*[piece.partition(":") for piece in pieces])
        if len("".join(colons)) == len(pieces) and _OFFSETS.fullmatch(",".join(heads)):
            offsets = list(map(int, heads))
            if offsets == sorted(offsets) and (len(offsets) < 2 or offsets[-1] < (hw if hw is not None else 1 << 63)):
                return list(zip(offsets, values))
    return _records_one_by_one(body, hw)


def _records_one_by_one(body: str, hw: int | None) -> list[tuple[int, str]]:
    """_records for any reply, deciding piece by piece which comma starts a record."""
    records: list[tuple[int, str]] = []
    for piece in body.split(",") if body else []:
        start = _RECORD_START.match(piece)
        if start and (not records or records[-1][0] <= int(start.group(1)) < (hw if hw is not None else 1 << 63)):
            records.append((int(start.group(1)), piece[start.end():]))
        elif records:
            offset, value = records[-1]
            records[-1] = (offset, f"{value},{piece}")
        else:
            raise V1Error("BAD_RESPONSE", f"CONSUME record without an offset: {piece[:80]!r}")
    return records


def parse_payload(payload: str) -> dict[str, Any]:
    """`a=1 b=[0,2] c=x` -> {'a': 1, 'b': [0, 2], 'c': 'x'}; `messages=` becomes (offset, value) pairs."""
    out: dict[str, Any] = {}
    if payload.startswith("messages="):
        tokens = payload[len("messages="):].split(" ")
        fields: list[str] = []
        while len(tokens) > 1 and _TRAILING_FIELD.fullmatch(tokens[-1]):
            fields.insert(0, tokens.pop())
        for key, value in _FIELD.findall(" ".join(fields)):
            out[key] = _value(key, value)
        out["messages"] = _records(" ".join(tokens), out.get("hw"))
        return out
    for key, value in _FIELD.findall(payload):
        out[key] = _value(key, value)
    return out


_SEPARATORS = frozenset(" \t|\n\r")  # what ends an argument, a section or the line


def _token(value: object, what: str, allow_empty: bool = False, refuse: str = "") -> str:
    """One argument: without ASCII space, tab, '|', newline, carriage return (nor `refuse`).
    Other characters, Unicode spaces included, travel as they are."""
    text = str(value)
    if (not text and not allow_empty) or any(c in _SEPARATORS or c in refuse for c in text):
        raise ValueError(f"{what} must be one non-empty token without space, tab, '|', newline"
                         f"{', ' + repr(refuse) if refuse else ''} or carriage return, got {text!r}")
    return text


class V1Client:
    """One V1 connection. Requests on it are answered in order; calls may be concurrent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, host: str, port: int, *, token: str | None = None,
                      max_line: int = DEFAULT_MAX_LINE) -> "V1Client":
        """Connect, and authenticate with `token` when given (a broker with token auth
        serves nothing else before AUTH), else PING: the broker closes a connection that has
        not sent a valid request within its handshake timeout (10 s by default)."""
        reader, writer = await asyncio.open_connection(host, port, limit=max_line)
        client = cls(reader, writer)
        try:
            if token is not None:
                await client.auth(token)
            else:
                await client.raw(f"V1|{next(client._ids)}|PING|")  # answered UNAUTHORIZED on a broker with tokens
        except BaseException:
            await client.close()
            raise
        return client

    async def __aenter__(self) -> "V1Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
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
            response = await self._reader.readline()
        if not response.endswith(b"\n"):
            raise V1Error("BAD_RESPONSE", "the broker closed the connection")
        return response.decode("utf-8", "replace")[:-1]

    async def request(self, command: str, *args: object) -> str:
        """Send a command; the OK payload ('' when there is none), or V1Error for ERR."""
        correlation = str(next(self._ids))
        response = await self.raw(f"V1|{correlation}|{command}|{' '.join(str(a) for a in args)}")
        parts = response.split("|", 4)
        if len(parts) < 3 or parts[0] != "V1":
            raise V1Error("BAD_RESPONSE", response[:200])
        if parts[2] == "ERR":
            raise V1Error(parts[3] if len(parts) > 3 else "UNKNOWN", parts[4] if len(parts) > 4 else "")
        if parts[1] != correlation or parts[2] != "OK":
            raise V1Error("BAD_RESPONSE", f"{response[:200]!r} answers request {correlation}")
        return response.split("|", 3)[3] if len(parts) > 3 else ""

    async def auth(self, token: str) -> dict[str, Any]:
        """AUTH <token> -> {'authenticated': True}; a wrong token raises V1Error UNAUTHORIZED
        and the broker closes the connection."""
        return parse_payload(await self.request("AUTH", _token(token, "token")))

    async def ping(self) -> str:
        """PING -> 'PONG'."""
        return await self.request("PING")

    async def produce(self, topic: str, key: str, value: str, acks: str | int | None = None) -> dict[str, Any]:
        """Append `key:value` -> {'partition', 'offset', 'hw'}. `acks`: 0, 1 (the broker's
        default when None) or 'all' (wait for min in-sync replicas, else REPLICATION_TIMEOUT;
        the record stays stored). An empty key spreads records round-robin."""
        key = _token(key, "key", allow_empty=True)
        if ":" in key:
            raise ValueError(f"key must not contain ':', got {key!r}")
        # a comma cannot come back in a CONSUME reply (the broker refuses it: BAD_REQUEST)
        args = [_token(topic, "topic"), f"{key}:{_token(value, 'value', allow_empty=True, refuse=',')}"]
        if acks is not None:
            if str(acks) not in ("0", "1", "all"):
                raise ValueError(f"acks must be 0, 1 or 'all', got {acks!r}")
            args.append(f"acks={acks}")
        return parse_payload(await self.request("PRODUCE", *args))

    async def consume(self, topic: str, partition: int, offset: int) -> dict[str, Any]:
        """Committed records from `offset` -> {'messages': [(offset, value), ...], 'hw': n}.
        Messages of one Pulsar batch share their offset; continue from the last offset + 1."""
        return parse_payload(await self.request("CONSUME", _token(topic, "topic"), int(partition), int(offset)))

    async def join(self, group: str, topic: str, consumer_id: str, assignor: str | None = None) -> dict[str, Any]:
        """Join (or re-join) a group -> {'generation', 'assigned': [partitions]}. `assignor`:
        'round_robin' or 'range'; None keeps the group's (round_robin for a new group)."""
        args = [_token(group, "group"), _token(topic, "topic"), _token(consumer_id, "consumer_id")]
        if assignor is not None:
            args.append(f"assignor={_token(assignor, 'assignor')}")
        return parse_payload(await self.request("JOIN", *args))

    async def sync(self, group: str, topic: str, consumer_id: str, generation: int) -> dict[str, Any]:
        """The member's assignment at `generation` -> {'generation', 'assigned'};
        GENERATION_MISMATCH when stale or no longer a member (JOIN again)."""
        return parse_payload(await self.request("SYNC", _token(group, "group"), _token(topic, "topic"),
                                                _token(consumer_id, "consumer_id"), int(generation)))

    async def heartbeat(self, group: str, topic: str, consumer_id: str, generation: int) -> dict[str, Any]:
        """Keep the membership alive -> {'heartbeat': 'ok'}; GENERATION_MISMATCH: JOIN again."""
        return parse_payload(await self.request("HEARTBEAT", _token(group, "group"), _token(topic, "topic"),
                                                _token(consumer_id, "consumer_id"), int(generation)))

    async def leave(self, group: str, topic: str, consumer_id: str, generation: int) -> dict[str, Any]:
        """Leave the group (the others rebalance) -> {'left': True}."""
        return parse_payload(await self.request("LEAVE", _token(group, "group"), _token(topic, "topic"),
                                                _token(consumer_id, "consumer_id"), int(generation)))

    async def commit(self, group: str, topic: str, consumer_id: str, generation: int, partition: int,
                     offset: int) -> dict[str, Any]:
        """Persist progress on an owned partition -> {'committed': True} (durable when answered)."""
        return parse_payload(await self.request("COMMIT", _token(group, "group"), _token(topic, "topic"),
                                                _token(consumer_id, "consumer_id"), int(generation),
                                                int(partition), int(offset)))

    async def offset(self, group: str, topic: str, partition: int) -> int:
        """The committed offset, -1 when none."""
        payload = await self.request("OFFSET", _token(group, "group"), _token(topic, "topic"), int(partition))
        return parse_payload(payload)["offset"]

    async def replica_fetch(self, topic: str, partition: int, replica_id: int, offset: int) -> dict[str, Any]:
        """A follower reports that it holds everything below `offset` ->
        {'replica', 'acked_offset', 'hw', 'isr': [...], 'under_replicated': bool}."""
        return parse_payload(await self.request("REPLICA_FETCH", _token(topic, "topic"), int(partition),
                                                int(replica_id), int(offset)))

    async def set_partition_role(self, topic: str, partition: int, role: str) -> dict[str, Any]:
        """Make this broker 'leader' or 'follower' of a partition -> {'topic', 'partition', 'role', 'hw'}."""
        return parse_payload(await self.request("SET_PARTITION_ROLE", _token(topic, "topic"), int(partition),
                                                _token(role, "role")))
