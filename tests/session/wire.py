"""Frames for session tests, built with the codec's encoders (no sockets, no broker)."""
from __future__ import annotations

from pulsarwire import codec
from pulsarwire._proto import PulsarApi_pb2 as pb
from pulsarwire.session import ClientSession, State

T = pb.BaseCommand
ALL_TYPES = sorted(T.Type.values())


def _sub_field(kind: int):
    """BaseCommand's sub-command field for a command type, or None (the transaction and
    topic-watch commands have none in this proto)."""
    name = "Command" + "".join(part.capitalize() for part in T.Type.Name(kind).split("_"))
    for field in T.DESCRIPTOR.fields:
        if field.message_type is not None and field.message_type.name.lower() == name.lower():
            return field.name
    by_number = T.DESCRIPTOR.fields_by_number.get(kind)
    return by_number.name if by_number is not None and by_number.name != "type" else None


SUB_FIELD = {kind: _sub_field(kind) for kind in ALL_TYPES}


def fill_required(message) -> None:
    """Give every proto2 `required` field a value (recursively), so the codec accepts it."""
    for field in message.DESCRIPTOR.fields:
        if not field.is_required or message.HasField(field.name):
            continue
        if field.message_type is not None:
            getattr(message, field.name).SetInParent()
            fill_required(getattr(message, field.name))
        else:
            setattr(message, field.name, field.default_value)


def command(kind: int, **fields) -> pb.BaseCommand:
    """A well-formed BaseCommand of `kind` whose sub-command holds `fields`."""
    cmd = T(type=kind)
    name = SUB_FIELD[kind]
    if name is not None:
        sub = getattr(cmd, name)
        sub.SetInParent()
        for key, value in fields.items():
            target = getattr(sub, key, None)
            if hasattr(target, "CopyFrom") and not isinstance(value, (int, str, bytes)):
                target.CopyFrom(value)
            elif hasattr(target, "extend"):
                target.extend(value)
            else:
                setattr(sub, key, value)
        fill_required(sub)
    return cmd


def frame(kind: int, **fields) -> bytes:
    return codec.encode_command(command(kind, **fields))


METADATA = pb.MessageMetadata(producer_name="p", sequence_id=7, publish_time=1_700_000_000_000)


def message_frame(consumer_id: int = 3, ledger: int = 1, entry: int = 2, payload: bytes = b"payload",
                  metadata: pb.MessageMetadata = METADATA) -> bytes:
    """A MESSAGE payload frame with magic and CRC32C, as a broker sends it."""
    cmd = command(T.MESSAGE, consumer_id=consumer_id,
                  message_id=pb.MessageIdData(ledgerId=ledger, entryId=entry))
    return codec.encode_payload_command(cmd, metadata, payload)


def connected_frame(server_version: str = "broker-1", protocol_version: int = 21,
                    max_message_size: int | None = None) -> bytes:
    fields = {"server_version": server_version, "protocol_version": protocol_version}
    if max_message_size is not None:
        fields["max_message_size"] = max_message_size
    return frame(T.CONNECTED, **fields)


def session_in(state: State, **options) -> ClientSession:
    """A session driven into `state` through its public API and frames alone."""
    session = ClientSession(**options)
    if state is State.IDLE:
        return session
    session.connect()
    if state is State.CONNECTED:
        session.receive_data(connected_frame())
    elif state is State.CLOSED:
        session.connection_lost()
    session.data_to_send()  # the handshake's bytes are not the test's
    assert session.state is state
    return session


def decode_all(data: bytes) -> list[pb.BaseCommand]:
    """The commands in a stream the session emitted (every frame must be whole)."""
    reader = codec.FrameReader()
    reader.feed(data)
    commands = [f.command for f in reader]
    reader.close()
    return commands


def decode_one(data: bytes) -> pb.BaseCommand:
    (cmd,) = decode_all(data)
    return cmd


def normalize(event):
    """An event as a comparable value: errors by class, code and text; frames by content."""
    from pulsarwire import session as s
    from pulsarwire.errors import PulsarWireError

    def plain(value):
        if isinstance(value, PulsarWireError):
            return (type(value), getattr(value, "code", None), str(value))
        return value

    if isinstance(event, s.MessageArrived):
        f = event.frame
        return ("MessageArrived", event.consumer_id, event.command, f.metadata, bytes(f.payload),
                f.broker_entry_metadata)
    if isinstance(event, s.CorruptMessage):
        return ("CorruptMessage", event.consumer_id, event.message_id, type(event.error))
    return (type(event).__name__, *(plain(getattr(event, name)) for name in event.__dataclass_fields__))


def normalized(events) -> list:
    return [normalize(e) for e in events]
