"""`pulsarwire` command line (also `python -m pulsarwire`).

    pulsarwire                       the main job: embedded broker + produce/consume + report
    pulsarwire --service-url URL     the same workload against a real cluster
    pulsarwire broker                serve the embedded broker
    pulsarwire fsck DATA_DIR         check (--repair: fix) a stopped broker's metadata files
    pulsarwire produce / consume     send or receive a few messages
    pulsarwire perf produce|consume|e2e   load test with a final throughput/latency table
    pulsarwire admin topics|namespaces|tenants ...   pulsar-admin's common operations (admin_cli.py)
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import signal
import sys
import tempfile
import time

from . import codec
from ._version import __version__
from .client import Client, InitialPosition


# produce and consume talk to a running broker: a throwaway embedded one would take their messages
# and drop them. This is where `pulsarwire broker` listens by default.
DEFAULT_SERVICE_URL = "pulsar://127.0.0.1:6650"


def _add_client_options(parser: argparse.ArgumentParser, service_url: str = "start the embedded broker",
                        top_level: bool = False) -> None:
    # A subcommand's copies default to SUPPRESS, so that `pulsarwire --service-url URL produce ...`
    # keeps the URL given before the subcommand instead of overwriting it with the default.
    unset: dict = {} if top_level else {"default": argparse.SUPPRESS}
    parser.add_argument("--service-url", help=f"pulsar://host:port of a cluster; default: {service_url}", **unset)
    parser.add_argument("--token", help="authentication token", **unset)
    parser.add_argument("--operation-timeout", type=float, **({"default": 30} if top_level else unset),
                        help="seconds an operation may take, connection retries included (default 30)")


def _add_load_options(parser: argparse.ArgumentParser, messages: int, duration: float) -> None:
    parser.add_argument("--topic", default=None, help="topic (default: a fresh one per run)")
    parser.add_argument("-n", "--messages", type=int, default=messages, help="messages to send (0: use --duration)")
    parser.add_argument("-d", "--duration", type=float, default=duration, help="seconds to run when --messages is 0")
    parser.add_argument("-s", "--size", type=int, default=1024, help="message size in bytes")
    parser.add_argument("-r", "--rate", type=float, default=0, help="messages per second (0: as fast as possible)")
    parser.add_argument("--no-batching", action="store_true", help="send every message in its own frame")
    parser.add_argument("-z", "--compression", default="NONE", choices=["NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY"])
    parser.add_argument("--json", help="also write the results as JSON to this file")
    parser.add_argument("--quiet", action="store_true", help="no live progress")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pulsarwire", description="Apache Pulsar binary protocol, fast.")
    parser.add_argument("--version", action="version", version=f"pulsarwire {__version__} ({codec.IMPLEMENTATION} codec)")
    parser.add_argument("-v", "--verbose", action="store_true")
    _add_client_options(parser, top_level=True)
    _add_load_options(parser, messages=200_000, duration=0)
    sub = parser.add_subparsers(dest="command")

    broker = sub.add_parser("broker", help="serve the embedded broker")
    broker.add_argument("--data-dir", default="./pulsarwire-data")
    broker.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    broker.add_argument("--port", type=int, default=6650, help="plaintext Pulsar port (-1 to disable; needs --tls-port)")
    broker.add_argument("--http-port", type=int, default=8080,
                        help="admin REST API, HTTP lookup and /metrics port (-1 to disable; default 8080)")
    broker.add_argument("--max-http-connections", type=int, default=None, metavar="N",
                        help="HTTP connections open at once; past it one is answered 503 (default 256)")
    broker.add_argument("--tls-port", type=int, default=None, help="Pulsar over TLS port (needs the two files below)")
    broker.add_argument("--tls-cert-file", help="PEM certificate chain of the TLS listener")
    broker.add_argument("--tls-key-file", help="PEM private key of the TLS listener")
    broker.add_argument("--v1-port", type=int, default=6680, help="V1 text protocol port (-1 to disable)")
    broker.add_argument("--partitioned-topic", action="append", default=[], metavar="TOPIC=N",
                        help="create a partitioned topic (repeatable)")
    broker.add_argument("--tenant", action="append", default=[], metavar="NAME",
                        help="a tenant topics may be made in, besides public and pulsar and those of stored "
                             "topics (repeatable; a topic of another tenant is not found, as in Pulsar)")
    broker.add_argument("--advertised-listener", action="append", default=[], metavar="NAME=URL",
                        help="a listener clients name in lookups (listener_name), answered with URL "
                             "(pulsar://host:port or pulsar+ssl://host:port; repeatable)")
    broker.add_argument("--auth-token", action="append", default=None,
                        help="accepted token (repeatable; enables auth; an empty token is refused)")
    broker.add_argument("--auth-basic", action="append", default=None, metavar="USER:PASSWORD",
                        help="accepted basic credentials (repeatable; enables auth)")
    broker.add_argument("--tls-trust-certs-file",
                        help="CA for client certificates: verified, and accepted as auth method tls")
    broker.add_argument("--anonymous-role", metavar="ROLE",
                        help="with auth on, the role of a client offering no credentials (or credentials of a "
                             "method this broker does not serve) instead of refusing it (Pulsar's anonymousUserRole)")
    broker.add_argument("--grant", action="append", default=None, metavar="TENANT/NAMESPACE=ROLE",
                        help="turns authorization on: a role may look up, produce and consume only in the "
                             "namespaces granted to it (repeatable; needs auth)")
    broker.add_argument("--super-user-role", action="append", default=[], metavar="ROLE",
                        help="a role authorized on every namespace (repeatable)")
    broker.add_argument("--deduplication", action="store_true",
                        help="drop a send whose sequence id is not above its producer's last one, in namespaces "
                             "and topics without a deduplication policy of their own (default off, as Pulsar's "
                             "brokerDeduplicationEnabled)")
    broker.add_argument("--sync-policy", default="interval", choices=["always", "interval", "never"])
    broker.add_argument("--max-open-files", type=int, default=None, metavar="N",
                        help="most segment files open at once; idle ones are closed and reopened on "
                             "demand (default: a quarter of the descriptor limit, 16 to 1024)")
    broker.add_argument("--max-cache-bytes", type=int, default=None, metavar="BYTES",
                        help="recently written entries kept in memory, all topics together; past it the "
                             "least recently used topic's oldest are dropped and read from disk (default 64 MiB)")
    broker.add_argument("--page-cache-bytes", type=int, default=None, metavar="BYTES",
                        help="page cache each topic's appends keep behind its end once written back: older "
                             "pages are given back to the OS, and readers of what is past the entry cache "
                             "read ahead from disk in large reads (0: keep everything cached; default 16 MiB)")
    broker.add_argument("--max-unacked-messages-per-consumer", type=int, default=None, metavar="N",
                        help="a consumer of a Shared or Key_Shared subscription holding this many "
                             "unacknowledged messages gets no more until it acknowledges half, as Pulsar's "
                             "maxUnackedMessagesPerConsumer (0: no limit; default 50 000)")
    broker.add_argument("--replication-factor", type=int, default=3)
    broker.add_argument("--min-insync-replicas", type=int, default=2)
    broker.add_argument("--v1-partitions", type=int, default=3, help="partitions of a topic V1 creates")
    broker.add_argument("--replication-timeout", type=float, default=5.0, metavar="SECONDS",
                        help="how long a V1 acks=all produce waits for the in-sync replicas")
    broker.add_argument("--replica-lag-time", type=float, default=10.0, metavar="SECONDS",
                        help="a V1 replica silent this long leaves the ISR")
    broker.add_argument("--session-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="a V1 group member silent this long is removed")
    broker.add_argument("--max-connections", type=int, default=None,
                        help="connections served at once per protocol (Pulsar, V1); more are refused (default "
                             "1000, lowered to fit the descriptor limit beside --max-open-files)")
    broker.add_argument("--max-output-bytes", type=int, default=4 * 1024 * 1024, metavar="BYTES",
                        help="unsent output per connection before the broker stops dispatching to it and "
                             "reading from it (V1: answering it) (default 4 MiB)")
    broker.add_argument("--handshake-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="a connection without an accepted CONNECT (V1: a successful AUTH with --auth-token, "
                             "else a valid request) this long is closed (default 10)")
    broker.add_argument("--max-frame-before-connect", type=int, default=64 * 1024, metavar="BYTES",
                        help="largest frame before CONNECT is accepted (default 64 KiB)")
    broker.add_argument("--max-input-bytes", type=int, default=256 * 1024 * 1024, metavar="BYTES",
                        help="unfinished frames held across all connections before the broker stops "
                             "reading from those adding to them (default 256 MiB)")
    broker.add_argument("--frame-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="a frame (V1: a request line) still incomplete after this long closes its "
                             "connection; so does a V1 client taking none of its replies this long (default 30)")
    broker.add_argument("--v1-max-connections-per-address", type=int, default=None, metavar="N",
                        help="V1 connections one client address may hold at once; more are refused (default 100)")
    broker.add_argument("--max-connections-per-address", type=int, default=None, metavar="N",
                        help="Pulsar connections one client address may hold (default: half of "
                             "--max-connections, at least 8)")
    broker.add_argument("--authenticated-share", type=float, default=0.25, metavar="FRACTION",
                        help="share of --max-connections kept for Pulsar connections past CONNECT "
                             "(authenticated, with auth on): connections before it hold the rest (default 0.25)")
    broker.add_argument("--idle-timeout", type=float, default=300.0, metavar="SECONDS",
                        help="a Pulsar connection with no producer or consumer that makes no request but "
                             "PING this long is closed (default 300)")
    broker.add_argument("--memory-budget", type=int, default=None, metavar="BYTES",
                        help="unsent output of all Pulsar connections plus the entry cache (--max-cache-bytes); "
                             "past it, connections holding output get no more until they take it (default: "
                             "--max-cache-bytes plus 192 MiB, 256 MiB in all)")
    broker.add_argument("--v1-max-total-output-bytes", type=int, default=None, metavar="BYTES",
                        help="unsent V1 replies of all connections together before connections holding some "
                             "are answered no more until they fall (default 256 MiB)")
    broker.add_argument("--v1-consume-max-bytes", type=int, default=None, metavar="BYTES",
                        help="most record bytes in one V1 CONSUME reply (default 8 MiB)")
    broker.add_argument("--topic-idle-timeout", type=float, default=None, metavar="SECONDS",
                        help="a topic without producers, consumers or readers this long is closed (its "
                             "files and memory given back) until it is used again (default 600)")
    broker.add_argument("--check", nargs="?", const="", default=None, metavar="DATA_DIR",
                        help="report every damaged or inconsistent metadata file of DATA_DIR (default: "
                             "--data-dir) and what a start would do about it, change nothing, and exit")
    broker.add_argument("--repair", action="store_true",
                        help="with --check: do what a start would do about each damaged file, then exit")

    fsck = sub.add_parser("fsck", help="check a stopped broker's metadata files (the same as broker --check)")
    fsck.add_argument("data_dir", metavar="DATA_DIR")
    fsck.add_argument("--repair", action="store_true", help="do what a start would do about each damaged file")

    produce = sub.add_parser("produce", help="send messages")
    _add_client_options(produce, service_url=DEFAULT_SERVICE_URL)
    produce.add_argument("topic")
    produce.add_argument("-m", "--message", action="append", default=[], help="message text (repeatable)")
    produce.add_argument("-k", "--key")
    produce.add_argument("-n", "--count", type=int, default=1, help="send each message this many times")

    consume = sub.add_parser("consume", help="receive and acknowledge messages")
    _add_client_options(consume, service_url=DEFAULT_SERVICE_URL)
    consume.add_argument("topic")
    consume.add_argument("-s", "--subscription", default="pulsarwire-cli")
    consume.add_argument("-n", "--count", type=int, default=1, help="messages to receive (0: until interrupted)")
    consume.add_argument("--earliest", action="store_true", help="a new subscription starts at the beginning")
    consume.add_argument("--timeout", type=float, default=30, help="seconds to wait for each message")

    perf = sub.add_parser("perf", help="load test")
    perf.add_argument("mode", choices=["produce", "consume", "e2e"])
    _add_client_options(perf)
    _add_load_options(perf, messages=0, duration=10)
    perf.add_argument("--subscription", default="perf")
    from . import admin_cli
    admin_cli.add_parser(sub)
    return parser


BROKER_GC_THRESHOLD = 10_000  # allocations between young collections (Python's default is 700)


def _tune_collector() -> None:
    """The broker process's garbage collector, as long-running Python servers tune it: what
    exists once it has started (modules, protobuf descriptors) is frozen, so that collections
    no longer walk it, and young collections run less often. The broker's hot path makes a few
    objects per entry, nearly none in cycles: this lifts raw ingest of small entries by a
    fifth to a third (benchmarks/bench_broker.py raw-10)."""
    gc.freeze()
    gc.set_threshold(BROKER_GC_THRESHOLD, *gc.get_threshold()[1:])


@contextlib.asynccontextmanager
async def _target(service_url: str | None):
    """Yield a service URL: the given one, or an embedded broker's in a temporary directory."""
    if service_url:
        yield service_url, None
        return
    from .broker.server import Broker
    with tempfile.TemporaryDirectory(prefix="pulsarwire-") as data_dir:
        async with Broker(data_dir, v1_port=None) as broker:
            yield broker.service_url, broker


def _client(url: str, args) -> Client:
    from .client import AuthenticationToken
    return Client(url, authentication=AuthenticationToken(args.token) if args.token else None,
                  operation_timeout_seconds=args.operation_timeout)


async def main_job(args) -> int:
    from . import perf
    async with _target(args.service_url) as (url, broker):
        where = "embedded broker at " + url if broker else url
        topic = args.topic or f"pulsarwire-demo-{int(time.time())}"
        print(f"pulsarwire {__version__} ({codec.IMPLEMENTATION} codec) -> {where}")
        print(f"workload: {args.messages or 'for ' + str(args.duration) + 's'} messages of {args.size} B, "
              f"batching {'off' if args.no_batching else 'on'}, compression {args.compression}, topic {topic}")
        async with _client(url, args) as client:
            results = await perf.end_to_end(client, topic, messages=args.messages, duration=args.duration,
                                            size=args.size, rate=args.rate, batching=not args.no_batching,
                                            compression=args.compression, progress=not args.quiet)
        print()
        print(perf.format_table(results))
        produced, consumed = results
        ok = consumed.messages == produced.messages and produced.errors == 0
        print(f"\n{'OK' if ok else 'MISMATCH'}: {produced.messages:,} produced, {consumed.messages:,} consumed")
        _write_json(args, results)
        return 0 if ok else 1


def _write_json(args, results) -> None:
    if getattr(args, "json", None):
        with open(args.json, "w") as fh:
            json.dump({"codec": codec.IMPLEMENTATION, "results": [r.as_dict() for r in results]}, fh, indent=1)


async def run_fsck(args) -> int:
    from .broker import fsck
    return fsck.run(args.data_dir, args.repair, sys.stdout)


async def run_broker(args) -> int:
    from .broker.server import Broker
    from .broker.core import DEFAULT_MAX_UNACKED_MESSAGES_PER_CONSUMER, DEFAULT_TOPIC_IDLE_TIMEOUT
    if args.check is not None:
        args.data_dir = args.check or args.data_dir
        return await run_fsck(args)
    if args.repair:
        print("pulsarwire broker: --repair goes with --check", file=sys.stderr)
        return 2
    from .broker.storage import DEFAULT_MAX_CACHE_BYTES, DEFAULT_PAGE_CACHE_BYTES, StorageError
    from .broker.v1 import DEFAULT_CONSUME_MAX_BYTES
    if args.auth_token is not None and not all(args.auth_token):
        print("pulsarwire broker: --auth-token must not be empty", file=sys.stderr)
        return 2
    ssl_context = None
    if args.tls_port is not None or args.tls_cert_file or args.tls_key_file:
        if args.tls_port is None or not args.tls_cert_file or not args.tls_key_file:
            print("pulsarwire broker: TLS needs --tls-port, --tls-cert-file and --tls-key-file", file=sys.stderr)
            return 2
        from .broker.server import tls_context
        ssl_context = tls_context(args.tls_cert_file, args.tls_key_file, args.tls_trust_certs_file)
    if args.tls_trust_certs_file and args.tls_port is None:
        print("pulsarwire broker: --tls-trust-certs-file needs --tls-port", file=sys.stderr)
        return 2
    if args.auth_basic is not None and not all(":" in c and c.partition(":")[0] for c in args.auth_basic):
        print("pulsarwire broker: --auth-basic takes USER:PASSWORD", file=sys.stderr)
        return 2
    if args.port < 0 and args.tls_port is None:
        print("pulsarwire broker: --port -1 turns plaintext off and needs --tls-port", file=sys.stderr)
        return 2
    if not 1 <= args.min_insync_replicas <= args.replication_factor:
        print(f"pulsarwire broker: --min-insync-replicas {args.min_insync_replicas} must be between 1 and "
              f"--replication-factor {args.replication_factor}: V1 acks=all could never be met", file=sys.stderr)
        return 2
    listeners = {}
    for spec in args.advertised_listener:
        name, _, url = spec.partition("=")
        if not name or not url.startswith(("pulsar://", "pulsar+ssl://")):
            print(f"pulsarwire broker: --advertised-listener {spec}: takes NAME=pulsar://host:port "
                  "(or pulsar+ssl://)", file=sys.stderr)
            return 2
        listeners[name] = url
    grants: dict[str, set[str]] | None = None
    for spec in args.grant or ():
        namespace, _, role = spec.partition("=")
        if namespace.count("/") != 1 or not all(namespace.split("/")) or not role:
            print(f"pulsarwire broker: --grant {spec}: takes TENANT/NAMESPACE=ROLE", file=sys.stderr)
            return 2
        grants = grants if grants is not None else {}
        grants.setdefault(namespace, set()).add(role)
    if (args.anonymous_role or grants is not None or args.super_user_role) and \
            args.auth_token is None and not args.auth_basic and not args.tls_trust_certs_file:
        print("pulsarwire broker: --anonymous-role, --grant and --super-user-role need authentication "
              "(--auth-token, --auth-basic or --tls-trust-certs-file)", file=sys.stderr)
        return 2
    partitioned = []
    for spec in args.partitioned_topic:
        name, _, count = spec.partition("=")
        try:
            partitions = int(count or 1)
        except ValueError:
            partitions = 0
        if partitions < 1:
            print(f"pulsarwire broker: --partitioned-topic {spec}: takes TOPIC=N, N a partition count of "
                  "at least 1", file=sys.stderr)
            return 2
        partitioned.append((spec, name, partitions))
    broker = Broker(args.data_dir, host=args.host, port=None if args.port < 0 else args.port,
                    tls_port=args.tls_port, ssl_context=ssl_context,
                    v1_port=None if args.v1_port < 0 else args.v1_port,
                    auth_tokens=set(args.auth_token) if args.auth_token is not None else None,
                    auth_basic=dict(c.partition(":")[::2] for c in args.auth_basic) if args.auth_basic else None,
                    auth_tls=bool(args.tls_trust_certs_file),
                    sync_policy=args.sync_policy, deduplication=args.deduplication,
                    http_port=None if args.http_port < 0 else args.http_port,
                    max_http_connections=args.max_http_connections,
                    replication_factor=args.replication_factor,
                    min_insync_replicas=args.min_insync_replicas, v1_partitions=args.v1_partitions,
                    replication_timeout=args.replication_timeout, replica_lag_time=args.replica_lag_time,
                    session_timeout=args.session_timeout, max_open_files=args.max_open_files, max_connections=args.max_connections,
                    max_output_bytes=args.max_output_bytes, handshake_timeout=args.handshake_timeout,
                    max_frame_before_connect=args.max_frame_before_connect, frame_timeout=args.frame_timeout,
                    max_input_bytes=args.max_input_bytes, max_connections_per_address=args.max_connections_per_address,
                    authenticated_share=args.authenticated_share, idle_timeout=args.idle_timeout,
                    memory_budget=args.memory_budget,
                    max_unacked_messages_per_consumer=DEFAULT_MAX_UNACKED_MESSAGES_PER_CONSUMER
                    if args.max_unacked_messages_per_consumer is None else args.max_unacked_messages_per_consumer,
                    max_cache_bytes=DEFAULT_MAX_CACHE_BYTES if args.max_cache_bytes is None else args.max_cache_bytes,
                    page_cache_bytes=DEFAULT_PAGE_CACHE_BYTES if args.page_cache_bytes is None else args.page_cache_bytes,
                    v1_consume_max_bytes=DEFAULT_CONSUME_MAX_BYTES if args.v1_consume_max_bytes is None
                    else args.v1_consume_max_bytes,
                    topic_idle_timeout=DEFAULT_TOPIC_IDLE_TIMEOUT if args.topic_idle_timeout is None
                    else args.topic_idle_timeout,
                    advertised_listeners=listeners, tenants=tuple(args.tenant),
                    anonymous_role=args.anonymous_role or None, grants=grants,
                    super_user_roles=tuple(args.super_user_role),
                    **({} if args.v1_max_connections_per_address is None
                       else {"v1_max_connections_per_address": args.v1_max_connections_per_address}),
                    **({} if args.v1_max_total_output_bytes is None
                       else {"v1_max_total_output_bytes": args.v1_max_total_output_bytes}))
    await broker.start()
    _tune_collector()
    from .client import topic_name
    for spec, name, count in partitioned:
        try:  # a bad name, a non-partitioned topic of that name, fewer partitions than it has, a full disk
            await broker.create_partitioned_topic(topic_name(name), count)
        except (ValueError, StorageError) as exc:
            print(f"pulsarwire broker: --partitioned-topic {spec}: {exc}", file=sys.stderr)
            await broker.stop()
            return 2
    # SIGTERM (kill, docker stop, systemd) stops the broker as Ctrl-C does: cursors and state
    # written. Set before the line below, which tells a supervisor the broker is up.
    with contextlib.suppress(NotImplementedError):  # no signal handlers on Windows' event loops
        serving = asyncio.current_task()
        assert serving is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, serving.cancel)
    urls = ", ".join(url for url in (broker.service_url, broker.service_url_tls) if url)
    print(f"broker: {urls}" + (f", V1 on {args.host}:{broker.v1_port}" if broker.v1 else "")
          + (f", HTTP on {broker.http_url}" if broker.http_url else ""), flush=True)
    try:
        await broker.serve_forever()
    except asyncio.CancelledError:
        pass
    finally:
        await broker.stop()
    return 0


async def run_produce(args) -> int:
    async with _target(args.service_url) as (url, _):
        async with _client(url, args) as client:
            producer = await client.create_producer(args.topic)
            for text in args.message or ["hello from pulsarwire"]:
                for _ in range(args.count):
                    message_id = await producer.send(text.encode(), partition_key=args.key)
                    print(f"sent {message_id}")
            await producer.close()
    return 0


async def run_consume(args) -> int:
    async with _target(args.service_url) as (url, _):
        async with _client(url, args) as client:
            consumer = await client.subscribe(args.topic, args.subscription,
                                              initial_position=InitialPosition.Earliest if args.earliest
                                              else InitialPosition.Latest)
            received = 0
            while not args.count or received < args.count:
                message = await consumer.receive(int(args.timeout * 1000))
                print(f"{message.message_id()} key={message.partition_key()} {message.data()!r}")
                consumer.acknowledge(message)
                received += 1
            await consumer.close()
    return 0


async def run_perf(args) -> int:
    from . import perf
    async with _target(args.service_url) as (url, _):
        topic = args.topic or f"perf-{int(time.time())}"
        async with _client(url, args) as client:
            options = dict(messages=args.messages, duration=args.duration, progress=not args.quiet)
            if args.mode == "consume":
                results = [await perf.consume(client, topic, subscription=args.subscription, **options)]
            else:
                options.update(size=args.size, rate=args.rate, batching=not args.no_batching,
                               compression=args.compression)
                if args.mode == "produce":
                    results = [await perf.produce(client, topic, **options)]
                else:
                    results = await perf.end_to_end(client, topic, **options)
        print(perf.format_table(results))
        _write_json(args, results)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.command in ("produce", "consume") and not args.service_url:
        args.service_url = DEFAULT_SERVICE_URL
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.command == "admin":  # synchronous HTTP calls: no event loop
        from . import admin_cli
        return admin_cli.run(args)
    runner = {None: main_job, "broker": run_broker, "produce": run_produce, "consume": run_consume,
              "perf": run_perf, "fsck": run_fsck}[args.command]
    try:
        return asyncio.run(runner(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a CLI reports, it does not dump a traceback
        if args.verbose:
            raise
        print(f"pulsarwire: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
