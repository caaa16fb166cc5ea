"""`pulsarwire` command line (also `python -m pulsarwire`).

    pulsarwire                       the main job: embedded broker + produce/consume + report
    pulsarwire --service-url URL     the same workload against a real cluster
    pulsarwire broker                serve the embedded broker
    pulsarwire fsck DATA_DIR         check (--repair: fix) a stopped broker's metadata files and logs
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
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from . import codec
from ._version import __version__
from .client import Client, InitialPosition

if TYPE_CHECKING:
    from .broker.server import Broker
    from .perf import Result


# produce and consume talk to a running broker: a throwaway embedded one would take their messages
# and drop them. This is where `pulsarwire broker` listens by default.
DEFAULT_SERVICE_URL = "pulsar://127.0.0.1:6650"


def _add_client_options(parser: argparse.ArgumentParser, service_url: str = "start the embedded broker",
                        top_level: bool = False) -> None:
    # A subcommand's copies default to SUPPRESS, so that `pulsarwire --service-url URL produce ...`
    # keeps the URL given before the subcommand instead of overwriting it with the default.
    unset: dict[str, Any] = {} if top_level else {"default": argparse.SUPPRESS}
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


def _add_broker_options(parser: argparse.ArgumentParser) -> None:
    """`pulsarwire broker`'s flags: one per field of BrokerSettings that declares one (settings.py),
    and those a setting is made of by hand (TLS files) or that are no setting (data dir, checks)."""
    from .broker import settings
    parser.add_argument("--data-dir", default="./pulsarwire-data")
    for field in settings.flags():
        parser.add_argument(settings.flag_name(field), dest=field.name, **field.metadata[settings.ARGUMENT])
    parser.add_argument("--tls-cert-file", help="PEM certificate chain of the TLS listener")
    parser.add_argument("--tls-key-file", help="PEM private key of the TLS listener")
    parser.add_argument("--tls-trust-certs-file",
                        help="CA for client certificates: verified, and accepted as auth method tls")
    parser.add_argument("--partitioned-topic", action="append", default=[], metavar="TOPIC=N",
                        help="create a partitioned topic (repeatable)")
    parser.add_argument("--check", nargs="?", const="", default=None, metavar="DATA_DIR",
                        help="report every damaged or inconsistent metadata file of DATA_DIR (default: "
                             "--data-dir) and what a start would do about it, change nothing, and exit")
    parser.add_argument("--repair", action="store_true",
                        help="with --check: do what a start would do about each damaged file, then exit")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pulsarwire", description="Apache Pulsar binary protocol, fast.")
    parser.add_argument("--version", action="version", version=f"pulsarwire {__version__} ({codec.IMPLEMENTATION} codec)")
    parser.add_argument("-v", "--verbose", action="store_true")
    _add_client_options(parser, top_level=True)
    _add_load_options(parser, messages=200_000, duration=0)
    sub = parser.add_subparsers(dest="command")

    broker = sub.add_parser("broker", help="serve the embedded broker")
    _add_broker_options(broker)

    fsck = sub.add_parser("fsck", help="check a stopped broker's metadata files and topic logs (the same as broker --check)")
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
async def _target(service_url: str | None) -> AsyncIterator[tuple[str, Broker | None]]:
    """Yield a service URL: the given one, or an embedded broker's in a temporary directory."""
    if service_url:
        yield service_url, None
        return
    from .broker.server import Broker
    with tempfile.TemporaryDirectory(prefix="pulsarwire-") as data_dir:
        async with Broker(data_dir, v1_port=None) as broker:
            yield broker.service_url, broker


def _client(url: str, args: argparse.Namespace) -> Client:
    from .client import AuthenticationToken
    return Client(url, authentication=AuthenticationToken(args.token) if args.token else None,
                  operation_timeout_seconds=args.operation_timeout)


async def main_job(args: argparse.Namespace) -> int:
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


def _write_json(args: argparse.Namespace, results: list[Result]) -> None:
    if getattr(args, "json", None):
        with open(args.json, "w") as fh:
            json.dump({"codec": codec.IMPLEMENTATION, "results": [r.as_dict() for r in results]}, fh, indent=1)


async def run_fsck(args: argparse.Namespace) -> int:
    from .broker import fsck
    return fsck.run(args.data_dir, args.repair, sys.stdout)


async def run_broker(args: argparse.Namespace) -> int:
    from .broker.server import Broker
    if args.check is not None:
        args.data_dir = args.check or args.data_dir
        return await run_fsck(args)
    if args.repair:
        print("pulsarwire broker: --repair goes with --check", file=sys.stderr)
        return 2
    from .broker.settings import from_flags
    from .broker.storage import StorageError
    if args.auth_tokens is not None and not all(args.auth_tokens):
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
    for spec in args.advertised_listeners:
        name, _, url = spec.partition("=")
        if not name or not url.startswith(("pulsar://", "pulsar+ssl://")):
            print(f"pulsarwire broker: --advertised-listener {spec}: takes NAME=pulsar://host:port "
                  "(or pulsar+ssl://)", file=sys.stderr)
            return 2
    for spec in args.grants or ():
        namespace, _, role = spec.partition("=")
        if namespace.count("/") != 1 or not all(namespace.split("/")) or not role:
            print(f"pulsarwire broker: --grant {spec}: takes TENANT/NAMESPACE=ROLE", file=sys.stderr)
            return 2
    if (args.anonymous_role or args.grants is not None or args.super_user_roles) and \
            args.auth_tokens is None and not args.auth_basic and not args.tls_trust_certs_file:
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
    broker = Broker(args.data_dir, ssl_context=ssl_context, auth_tls=bool(args.tls_trust_certs_file),
                    **from_flags(vars(args)))
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


async def run_produce(args: argparse.Namespace) -> int:
    async with _target(args.service_url) as (url, _):
        async with _client(url, args) as client:
            producer = await client.create_producer(args.topic)
            for text in args.message or ["hello from pulsarwire"]:
                for _ in range(args.count):
                    message_id = await producer.send(text.encode(), partition_key=args.key)
                    print(f"sent {message_id}")
            await producer.close()
    return 0


async def run_consume(args: argparse.Namespace) -> int:
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


async def run_perf(args: argparse.Namespace) -> int:
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
