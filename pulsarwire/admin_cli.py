"""`pulsarwire admin ...`: the common `pulsar-admin` operations, with its subcommand names, over
the admin REST API of any Pulsar broker (the embedded broker's `--http-port` included).

    pulsarwire admin topics create-partitioned-topic persistent://public/default/t -p 4
    pulsarwire admin topics stats t
    pulsarwire admin namespaces set-deduplication public/default --enable

Output is what pulsar-admin prints: JSON for stats and lists, message dumps for peek-messages.
"""
from __future__ import annotations

import json
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

DEFAULT_ADMIN_URL = "http://127.0.0.1:8080"
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class AdminError(Exception):
    """The admin API refused (status, reason) or could not be reached (status 0)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class AdminClient:
    def __init__(self, admin_url: str, token: str | None = None, timeout: float = 30,
                 tls_trust_certs_file: str | None = None, tls_allow_insecure: bool = False) -> None:
        self.base = admin_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.context: ssl.SSLContext | None = None
        if self.base.startswith("https://"):
            self.context = ssl.create_default_context(cafile=tls_trust_certs_file)
            if tls_allow_insecure:
                self.context.check_hostname = False
                self.context.verify_mode = ssl.CERT_NONE

    def request(self, method: str, path: str, body: Any = None, raw: bool = False) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as response:
                payload = response.read(MAX_RESPONSE_BYTES)
                if raw:
                    return response.headers, payload
                return json.loads(payload) if payload.strip() else None
        except urllib.error.HTTPError as exc:
            text = exc.read(64 * 1024)
            try:
                reason = json.loads(text).get("reason", "")
            except (ValueError, AttributeError):
                reason = text.decode("utf-8", "replace")[:500]
            raise AdminError(exc.code, reason or exc.reason) from None
        except (urllib.error.URLError, OSError) as exc:
            raise AdminError(0, f"cannot reach {self.base}: {getattr(exc, 'reason', exc)}") from None


def topic_path(topic: str) -> str:
    """`persistent/tenant/namespace/topic` of a topic name as pulsar-admin takes it."""
    if "://" in topic:
        domain, _, rest = topic.partition("://")
    else:
        domain, rest = "persistent", topic
    parts = rest.split("/")
    if len(parts) == 1:
        parts = ["public", "default", parts[0]]
    if len(parts) != 3 or not all(parts) or domain not in ("persistent", "non-persistent"):
        raise AdminError(400, f"invalid topic name {topic!r}: expected [persistent://]tenant/namespace/topic")
    return "/".join([domain] + [urllib.parse.quote(p, safe="") for p in parts])


def namespace_path(namespace: str) -> str:
    parts = namespace.split("/")
    if len(parts) != 2 or not all(parts):
        raise AdminError(400, f"invalid namespace {namespace!r}: expected tenant/namespace")
    return "/".join(urllib.parse.quote(p, safe="") for p in parts)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `admin` subcommand and its pulsar-admin-style subcommands."""
    admin = sub.add_parser("admin", help="administer a Pulsar broker over its admin REST API (as pulsar-admin)",
                           description="The common pulsar-admin operations, over the admin REST API.")
    admin.add_argument("--admin-url", default=DEFAULT_ADMIN_URL, help=f"admin service URL (default {DEFAULT_ADMIN_URL})")
    admin.add_argument("--auth-token", dest="admin_token", help="authentication token")
    admin.add_argument("--tls-trust-certs-file", dest="admin_trust", help="CA certificates for an https:// URL")
    admin.add_argument("--tls-allow-insecure", action="store_true", help="do not verify the server's certificate")
    groups = admin.add_subparsers(dest="admin_group", required=True)

    topics = groups.add_parser("topics", help="topics and their subscriptions").add_subparsers(
        dest="admin_command", required=True)
    cmd = _command(topics, "create-partitioned-topic", "create a partitioned topic", "topic")
    cmd.add_argument("-p", "--partitions", type=int, required=True, help="number of partitions")
    cmd = _command(topics, "update-partitioned-topic", "add partitions to a partitioned topic", "topic")
    cmd.add_argument("-p", "--partitions", type=int, required=True, help="new number of partitions")
    for name, help_text, target in (
            ("get-partitioned-topic-metadata", "a topic's partitions", "topic"),
            ("create", "create a non-partitioned topic", "topic"),
            ("list", "the topics of a namespace", "namespace"),
            ("list-partitioned-topics", "the partitioned topics of a namespace", "namespace"),
            ("stats", "a topic's stats", "topic"), ("stats-internal", "a topic's internal stats", "topic"),
            ("partitioned-stats", "a partitioned topic's stats", "topic"),
            ("subscriptions", "a topic's subscriptions", "topic"), ("unload", "unload a topic", "topic"),
            ("terminate", "terminate a topic", "topic"), ("compact", "start compacting a topic", "topic"),
            ("compaction-status", "how a topic's last compaction went", "topic")):
        _command(topics, name, help_text, target)
    cmd = _command(topics, "delete", "delete a topic", "topic")
    cmd.add_argument("-f", "--force", action="store_true", help="close its producers and consumers first")
    cmd = _command(topics, "delete-partitioned-topic", "delete a partitioned topic", "topic")
    cmd.add_argument("-f", "--force", action="store_true", help="close its producers and consumers first")
    cmd = _command(topics, "create-subscription", "create a subscription", "topic", subscription=True)
    cmd.add_argument("-m", "--messageId", default="latest", help="latest, earliest or ledgerId:entryId")
    cmd = _command(topics, "unsubscribe", "delete a subscription", "topic", subscription=True)
    cmd.add_argument("-f", "--force", action="store_true", help="close its consumers first")
    cmd = _command(topics, "skip", "skip messages of a subscription", "topic", subscription=True)
    cmd.add_argument("-n", "--count", type=int, required=True)
    _command(topics, "clear-backlog", "skip every message of a subscription", "topic", subscription=True)
    cmd = _command(topics, "peek-messages", "show messages of a subscription without consuming them", "topic",
                   subscription=True)
    cmd.add_argument("-n", "--count", type=int, default=1)
    cmd = _command(topics, "reset-cursor", "move a subscription to a time or a message id", "topic", subscription=True)
    where = cmd.add_mutually_exclusive_group(required=True)
    where.add_argument("-t", "--time", help="how long ago: 10s, 5m, 2h, 1d, 1w (or milliseconds)")
    where.add_argument("-m", "--messageId", help="ledgerId:entryId")

    namespaces = groups.add_parser("namespaces", help="namespaces and their policies").add_subparsers(
        dest="admin_command", required=True)
    for name, help_text, target in (
            ("list", "the namespaces of a tenant", "tenant"), ("create", "create a namespace", "namespace"),
            ("delete", "delete an empty namespace", "namespace"), ("policies", "a namespace's policies", "namespace"),
            ("topics", "the topics of a namespace", "namespace")):
        _command(namespaces, name, help_text, target)
    cmd = _command(namespaces, "set-deduplication", "turn deduplication on or off for a namespace", "namespace")
    onoff = cmd.add_mutually_exclusive_group(required=True)
    onoff.add_argument("-e", "--enable", action="store_true")
    onoff.add_argument("-d", "--disable", action="store_true")
    _command(namespaces, "get-deduplication", "a namespace's deduplication policy", "namespace")
    cmd = _command(namespaces, "set-schema-compatibility-strategy", "a namespace's schema compatibility", "namespace")
    cmd.add_argument("-c", "--compatibility", required=True,
                     help="ALWAYS_INCOMPATIBLE, ALWAYS_COMPATIBLE, BACKWARD, FORWARD, FULL, BACKWARD_TRANSITIVE, "
                          "FORWARD_TRANSITIVE, FULL_TRANSITIVE or UNDEFINED")
    _command(namespaces, "get-schema-compatibility-strategy", "a namespace's schema compatibility", "namespace")

    tenants = groups.add_parser("tenants", help="tenants").add_subparsers(dest="admin_command", required=True)
    tenants.add_parser("list", help="the tenants")
    cmd = _command(tenants, "create", "create a tenant", "tenant")
    cmd.add_argument("-c", "--allowed-clusters", default="standalone", help="comma-separated clusters")
    cmd.add_argument("-r", "--admin-roles", default="", help="comma-separated roles")
    _command(tenants, "delete", "delete a tenant without namespaces", "tenant")


def _command(group: "argparse._SubParsersAction[argparse.ArgumentParser]", name: str, help_text: str, target: str,
             subscription: bool = False) -> argparse.ArgumentParser:
    """A subcommand taking the topic, namespace or tenant it acts on (and -s, the subscription)."""
    cmd = group.add_parser(name, help=help_text)
    cmd.add_argument(target)
    if subscription:
        cmd.add_argument("-s", "--subscription", required=True)
    return cmd


def _duration_ms(text: str) -> int:
    units = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
    try:
        if text[-1:] in units:
            return int(float(text[:-1]) * units[text[-1]])
        return int(text)
    except ValueError:
        raise AdminError(400, f"invalid time {text!r}: a number with s, m, h, d or w") from None


def _message_id(text: str) -> dict:
    if text == "latest":
        return {"ledgerId": (1 << 63) - 1, "entryId": (1 << 63) - 1}
    if text == "earliest":
        return {"ledgerId": -1, "entryId": -1}
    ledger, sep, entry = text.partition(":")
    if sep:
        try:
            return {"ledgerId": int(ledger), "entryId": int(entry.split(":")[0])}
        except ValueError:
            pass
    raise AdminError(400, f"invalid message id {text!r}: ledgerId:entryId, latest or earliest")


def _print(value: Any) -> None:
    if value is not None:
        print(json.dumps(value, indent=2) if not isinstance(value, str) else value)


def _peek(client: AdminClient, args: argparse.Namespace) -> None:
    from . import codec
    from ._proto import PulsarApi_pb2 as pb
    base = f"/admin/v2/{topic_path(args.topic)}/subscription/{urllib.parse.quote(args.subscription, safe='')}"
    for n in range(1, args.count + 1):
        try:
            headers, payload = client.request("GET", f"{base}/position/{n}", raw=True)
        except AdminError as exc:
            if exc.status == 404 and n > 1:
                return  # fewer messages than asked for
            raise
        message_id = headers.get("X-Pulsar-Message-ID", "?")
        count = headers.get("X-Pulsar-num-batch-message")
        metadata = pb.MessageMetadata(producer_name="", sequence_id=0, publish_time=0)
        if count is not None:
            metadata.num_messages_in_batch = int(count)
            messages = [(m.batch_index, m.partition_key, m.properties, bytes(m.payload))
                        for m in codec.split_messages(metadata, payload)]
        else:
            properties = {k[len("X-Pulsar-PROPERTY-"):]: v for k, v in headers.items()
                          if k.startswith("X-Pulsar-PROPERTY-")}
            messages = [(-1, headers.get("X-Pulsar-partition-key"), properties, payload)]
        for batch_index, key, properties, data in messages:
            suffix = f":{batch_index}" if batch_index >= 0 else ""
            print(f"Message ID: {message_id}{suffix}")
            print(f"Publish time: {headers.get('X-Pulsar-publish-time', '')}")
            if key:
                print(f"Key: {key}")
            if properties:
                print(f"Properties: {json.dumps(properties)}")
            print(_hexdump(data))


def _hexdump(data: bytes) -> str:
    """Data as pulsar-admin shows it: offset, 16 hex bytes, their printable characters."""
    lines = ["+--------+-------------------------------------------------+----------------+"]
    for offset in range(0, max(len(data), 1), 16):
        chunk = data[offset:offset + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk).ljust(47)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk).ljust(16)
        lines.append(f"|{offset:08x}| {hexes} |{text}|")
    lines.append(lines[0])
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    client = AdminClient(args.admin_url, args.admin_token, tls_trust_certs_file=args.admin_trust,
                         tls_allow_insecure=args.tls_allow_insecure)
    try:
        _run(client, args)
    except AdminError as exc:
        where = f"HTTP {exc.status}: " if exc.status else ""
        print(f"pulsarwire admin: {where}{exc}", file=sys.stderr)
        return 1
    return 0


def _run(client: AdminClient, args: argparse.Namespace) -> None:
    group, command = args.admin_group, args.admin_command
    call = client.request
    if group == "topics":
        if command in ("list", "list-partitioned-topics"):
            domain_path = f"/admin/v2/persistent/{namespace_path(args.namespace)}"
            _print(call("GET", domain_path + ("/partitioned" if command == "list-partitioned-topics" else "")))
            return
        base = f"/admin/v2/{topic_path(args.topic)}"
        sub = f"{base}/subscription/{urllib.parse.quote(getattr(args, 'subscription', '') or '', safe='')}"
        if command == "create-partitioned-topic":
            call("PUT", f"{base}/partitions", args.partitions)
        elif command == "update-partitioned-topic":
            call("POST", f"{base}/partitions", args.partitions)
        elif command == "get-partitioned-topic-metadata":
            _print(call("GET", f"{base}/partitions"))
        elif command == "create":
            call("PUT", base)
        elif command == "stats":
            _print(call("GET", f"{base}/stats"))
        elif command == "stats-internal":
            _print(call("GET", f"{base}/internalStats"))
        elif command == "partitioned-stats":
            _print(call("GET", f"{base}/partitioned-stats"))
        elif command == "subscriptions":
            _print(call("GET", f"{base}/subscriptions"))
        elif command == "unload":
            call("PUT", f"{base}/unload")
        elif command == "terminate":
            last = call("POST", f"{base}/terminate")
            print(f"Topic successfully terminated at {last['ledgerId']}:{last['entryId']}")
        elif command == "compact":
            call("PUT", f"{base}/compaction")
            print(f"Topic compaction requested for {args.topic}")
        elif command == "compaction-status":
            _print(call("GET", f"{base}/compaction"))
        elif command in ("delete", "delete-partitioned-topic"):
            force = "?force=true" if args.force else ""
            call("DELETE", (f"{base}/partitions" if command == "delete-partitioned-topic" else base) + force)
        elif command == "create-subscription":
            call("PUT", sub, _message_id(args.messageId))
        elif command == "unsubscribe":
            call("DELETE", sub + ("?force=true" if args.force else ""))
        elif command == "skip":
            call("POST", f"{sub}/skip/{args.count}")
        elif command == "clear-backlog":
            call("POST", f"{sub}/skip_all")
        elif command == "peek-messages":
            _peek(client, args)
        elif command == "reset-cursor":
            if args.time is not None:
                import time
                call("POST", f"{sub}/resetcursor/{int(time.time() * 1000) - _duration_ms(args.time)}")
            else:
                call("POST", f"{sub}/resetcursor", _message_id(args.messageId))
        return
    if group == "namespaces":
        if command == "list":
            _print(call("GET", f"/admin/v2/namespaces/{urllib.parse.quote(args.tenant, safe='')}"))
            return
        base = f"/admin/v2/namespaces/{namespace_path(args.namespace)}"
        if command == "create":
            call("PUT", base)
        elif command == "delete":
            call("DELETE", base)
        elif command == "policies":
            _print(call("GET", base))
        elif command == "topics":
            _print(call("GET", f"{base}/topics"))
        elif command == "set-deduplication":
            call("POST", f"{base}/deduplication", bool(args.enable))
        elif command == "get-deduplication":
            _print(call("GET", f"{base}/deduplication"))
        elif command == "set-schema-compatibility-strategy":
            call("PUT", f"{base}/schemaCompatibilityStrategy", args.compatibility.upper())
        elif command == "get-schema-compatibility-strategy":
            _print(call("GET", f"{base}/schemaCompatibilityStrategy"))
        return
    if command == "list":
        _print(call("GET", "/admin/v2/tenants"))
    elif command == "create":
        call("PUT", f"/admin/v2/tenants/{urllib.parse.quote(args.tenant, safe='')}",
             {"allowedClusters": [c for c in args.allowed_clusters.split(",") if c],
              "adminRoles": [r for r in args.admin_roles.split(",") if r]})
    elif command == "delete":
        call("DELETE", f"/admin/v2/tenants/{urllib.parse.quote(args.tenant, safe='')}")

