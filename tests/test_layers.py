"""Module structure. The broker's layers import one way: storage -> metafile -> topic, subscription -> core ->
front ends -> server; each client module imports alone; the client package keeps its public names; the spark
package's modules import one way and the package keeps its public names.

Each module is imported alone in a fresh interpreter; the broker modules it pulls
in must all lie at or below its own layer. Imports for type checking alone (under
`if TYPE_CHECKING:`) must name modules at or below it too: a contract a lower module
needs from a higher one is declared below (a Protocol), not imported from above."""
from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import pytest

# The storage package's modules, each importing only those before it (storage.files at the
# bottom), and the package itself, which offers their names to the layers above.
STORAGE_MODULES = ["storage.files", "storage.record", "storage.cache", "storage.segment", "storage.reader",
                   "storage.log", "storage.cursor"]
LAYERS = ["staging", *STORAGE_MODULES, "storage", "settings", "listener", "metafile", "entries", "topic_files",
          "subscription", "topic", "policies", "compatibility", "core", "fsck", "pulsar", "v1", "stats", "metrics",
          "admin_http", "server"]
# broker/staging.py and the twin it loads (_staging.pyx or _staging_py.py, as the codec was
# chosen): runs of Send frames planned, staged as records and answered; below storage, which
# hands in its record layout
STAGING = {"staging", "_staging", "_staging_py"}
STORAGE = {"storage", *STORAGE_MODULES}
# the domain: what is read of a stored entry, a topic's metadata files, subscriptions, topics
DOMAIN = {"entries", "topic_files", "subscription", "topic"}
BELOW = {
    "staging": {"_staging", "_staging_py"},
    "storage.files": set(),  # file system calls, descriptors, read buffers
    "storage.record": {"storage.files"},  # a record's layout, the Entry read back
    "storage.cache": {"storage.files", "storage.record"},
    "storage.segment": {"storage.files", "storage.record"},
    "storage.reader": {"storage.files", "storage.record", "storage.segment"},
    "storage.log": {"storage.files", "storage.record", "storage.cache", "storage.segment", "storage.reader"} | STAGING,
    "storage.cursor": set(),
    "storage": set(STORAGE_MODULES) | STAGING,
    "settings": STORAGE | STAGING,  # every broker setting with its default and flag, read by the layers above
    "listener": set(),  # accepting sockets within the descriptor budget
    "metafile": STORAGE | STAGING,  # the broker's small metadata files, beside the log
    "entries": STORAGE | STAGING,
    "topic_files": {"metafile"} | STORAGE | STAGING,
    "subscription": {"metafile", "entries", "topic_files"} | STORAGE | STAGING,
    "topic": {"metafile"} | DOMAIN | STORAGE | STAGING,
    "policies": {"metafile"} | STORAGE | STAGING,  # namespace and topic policies, beside the domain
    "compatibility": set(),  # schema versions, on protocol types alone
    "core": {"settings", "metafile", "policies"} | DOMAIN | STORAGE | STAGING,
    "fsck": {"settings", "metafile", "policies", "core"} | DOMAIN | STORAGE | STAGING,  # checks a stopped broker's files
    "pulsar": {"settings", "listener", "metafile", "policies", "core", "compatibility"} | DOMAIN | STORAGE | STAGING,
    "v1": {"settings", "metafile", "policies", "core"} | DOMAIN | STORAGE | STAGING,
    "stats": {"metafile", "policies"} | DOMAIN | STORAGE | STAGING,
    "metrics": {"metafile", "policies", "stats", "settings", "listener", "compatibility", "core", "pulsar"} | DOMAIN | STORAGE | STAGING,  # core and pulsar: the ServedBroker it declares (type only)
    # the HTTP front end: admin API, HTTP lookup, /metrics; server imports it only when it serves HTTP
    "admin_http": {"settings", "metafile", "policies", "core", "compatibility", "stats", "metrics"} | DOMAIN | STORAGE
    | STAGING,
    "server": {"settings", "listener", "metafile", "policies", "core", "compatibility", "pulsar", "v1"} | DOMAIN
    | STORAGE | STAGING,
}


def _loaded_after_import(module: str) -> set[str]:
    """The broker modules (named below pulsarwire.broker: "topic", "storage.log") loaded by
    importing `module` alone. A module of the storage package is imported under an empty
    stand-in for the package, whose __init__ would load every module of it."""
    code = "import importlib, importlib.util, json, sys, types\n"
    if module.startswith("storage."):
        code += ("import pulsarwire.broker\n"
                 "package = types.ModuleType('pulsarwire.broker.storage')\n"
                 "package.__path__ = [importlib.util.find_spec('pulsarwire.broker').submodule_search_locations[0]"
                 " + '/storage']\n"
                 "sys.modules['pulsarwire.broker.storage'] = package\n")
    code += (f"importlib.import_module('pulsarwire.broker.{module}')\n"
             "print(json.dumps(sorted(m[len('pulsarwire.broker.'):] for m in sys.modules "
             "if m.startswith('pulsarwire.broker.'))))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = set(json.loads(out))
    return loaded - {"storage"} if module.startswith("storage.") else loaded


@pytest.mark.parametrize("module", LAYERS)
def test_broker_layer_imports_only_layers_below(module):
    loaded = _loaded_after_import(module) - {module}
    assert loaded <= BELOW[module], f"{module} pulls in {sorted(loaded - BELOW[module])}"


PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "pulsarwire"


def _type_only_imports(path: pathlib.Path) -> set[str]:
    """The modules `path` imports under `if TYPE_CHECKING:`, named relative to pulsarwire
    ("client.consumer", "broker.server", "session")."""
    return _type_only_imports_in(path.read_text(), path.relative_to(PACKAGE).parent.parts)


def _type_only_imports_in(source: str, package: tuple[str, ...]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
            continue
        for statement in node.body:
            for imported in ast.walk(statement):
                if isinstance(imported, ast.ImportFrom):
                    if imported.level:
                        base = list(package[:len(package) - imported.level + 1])
                    else:
                        base = []
                        if (imported.module or "").split(".")[0] != "pulsarwire":
                            continue
                    module = [*base, *(imported.module or "").split(".")] if imported.module else base
                    if module and module[0] == "pulsarwire":
                        module = module[1:]
                    if PACKAGE.joinpath(*module).is_dir():  # from a package: its modules, or the package's names
                        found.update(".".join([*module, alias.name])
                                     if PACKAGE.joinpath(*module, alias.name + ".py").exists()
                                     or PACKAGE.joinpath(*module, alias.name).is_dir()
                                     else ".".join(module) for alias in imported.names)
                    else:
                        found.add(".".join(module))
                elif isinstance(imported, ast.Import):
                    found.update(alias.name.removeprefix("pulsarwire.") for alias in imported.names
                                 if alias.name.startswith("pulsarwire."))
    return found


# Type-only imports of a higher broker layer still there (the admin front end and the metrics
# read the Broker object they are handed); to be replaced by declared contracts.
BROKER_TYPE_ONLY_UPWARD: set[tuple[str, str]] = set()


@pytest.mark.parametrize("module", LAYERS)
def test_broker_type_only_imports_name_layers_below(module):
    path = PACKAGE / "broker" / f"{module.replace('.', '/')}.py"
    if not path.exists():  # a package: its __init__
        path = path.with_suffix("") / "__init__.py"
    imported = {name.split(".", 1)[1] for name in _type_only_imports(path) if name.startswith("broker.")}
    upward = {name for name in imported - BELOW[module] if (module, name) not in BROKER_TYPE_ONLY_UPWARD}
    assert not upward, f"{module} imports {sorted(upward)} for type checking"


@pytest.mark.parametrize("module", sorted(DOMAIN))
def test_domain_layer_knows_no_front_end(module):
    source = (PACKAGE / "broker" / f"{module}.py").read_text()
    for word in ("BrokerConnection", "V1Server", "encode_payload_frame", "asyncio.Protocol"):
        assert word not in source


# Each client module and the client modules it pulls in at import time, which are also all it
# may import for type checking alone: producers and consumers know nothing of each other or of
# `Client`; the connection knows them only by the contracts it declares (`ConsumerHandler`,
# `ProducerHandler`, `ClientContext`), and the dead letter router the consumer by its own.
CLIENT_DEPENDS = {
    "options": set(),
    "auth": set(),
    "http_lookup": set(),
    "connection": {"options", "http_lookup"},
    "reconnect": {"options", "connection", "http_lookup"},
    "producer": {"options", "reconnect", "connection", "http_lookup"},
    "dead_letter": set(),
    "receiving": set(),
    "consumer": {"options", "reconnect", "connection", "http_lookup", "dead_letter", "receiving"},
    "reader": {"options", "reconnect", "connection", "http_lookup", "consumer", "dead_letter", "receiving"},
    "table_view": {"options", "reconnect", "connection", "http_lookup", "consumer", "dead_letter", "receiving"},
    "entries": {"options", "reconnect", "connection", "http_lookup"},
    "client": {"options", "reconnect", "connection", "http_lookup", "producer", "consumer", "dead_letter", "reader",
               "table_view", "entries", "receiving"},
}
# a module's Cython and pure-Python twins: loaded with it (which one follows the codec's choice)
CLIENT_TWINS = {"_receiving", "_receiving_py"}
# Every name `pulsarwire.client` offered when it was one module and that user code may import
# from it: its own public names, the message and routing types in its signatures, the errors
# it raises. (Its stdlib modules, session events and private helpers are not kept.)
CLIENT_NAMES = [
    "Address", "AuthenticationToken", "Client", "CompressionType", "Consumer", "ConsumerType",
    "DEFAULT_PORT", "DEFAULT_TLS_PORT", "InitialPosition", "Producer", "Reader", "partition_name",
    "topic_name",
    "HashingScheme", "Message", "MessageId", "RoutingMode",
    "AuthenticationError", "AuthorizationError", "CodecError", "ConnectionClosedError", "NotAllowedError",
    "ProducerFencedError", "ProducerQueueFullError", "PulsarWireError", "ServerError", "TimeoutError",
    "TopicNotFoundError", "TopicTerminatedError",
]


@pytest.mark.parametrize("module", sorted(CLIENT_DEPENDS))
def test_each_client_module_imports_alone(module):
    subprocess.run([sys.executable, "-c", f"import pulsarwire.client.{module}"], check=True)


@pytest.mark.parametrize("module", sorted(CLIENT_DEPENDS))
def test_client_module_imports_without_the_package_init(module):
    # `import pulsarwire.client.x` runs the package __init__ first, which imports every module
    # in one order; empty stand-ins for `pulsarwire` and `pulsarwire.client` make `x` the first
    # client module loaded, so a cycle through it fails here whatever order __init__ uses.
    code = ("import importlib, importlib.util, json, sys, types\n"
            "root = importlib.util.find_spec('pulsarwire').submodule_search_locations[0]\n"
            "for name, path in (('pulsarwire', root), ('pulsarwire.client', root + '/client')):\n"
            "    package = types.ModuleType(name)\n"
            "    package.__path__ = [path]\n"
            "    sys.modules[name] = package\n"
            f"importlib.import_module('pulsarwire.client.{module}')\n"
            "print(json.dumps(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
            "if m.startswith('pulsarwire.client.'))))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = set(json.loads(out)) - {module} - CLIENT_TWINS
    assert loaded == CLIENT_DEPENDS[module], f"{module} pulls in {sorted(loaded)}"


@pytest.mark.parametrize("module", sorted(CLIENT_DEPENDS))
def test_client_type_only_imports_name_modules_below(module):
    imported = {name.split(".", 1)[1] for name in _type_only_imports(PACKAGE / "client" / f"{module}.py")
                if name.startswith("client.")} - CLIENT_TWINS
    assert imported <= CLIENT_DEPENDS[module], \
        f"{module} imports {sorted(imported - CLIENT_DEPENDS[module])} for type checking"


def test_type_only_import_scan_sees_relative_imports():
    # the scan itself: imports like those the connection module had under TYPE_CHECKING are found
    source = ("from typing import TYPE_CHECKING\nfrom .options import Address\nif TYPE_CHECKING:\n"
              "    from .client import Client\n    from ..session import ClientSession\n    from . import producer\n"
              "    from pulsarwire.broker import server\n")
    assert _type_only_imports_in(source, ("client",)) == {"client.client", "session", "client.producer",
                                                          "broker.server"}


def test_client_package_keeps_its_public_names():
    import pulsarwire.client as client
    missing = [name for name in CLIENT_NAMES if not hasattr(client, name)]
    assert not missing
    assert set(CLIENT_NAMES) <= set(client.__all__)
    from pulsarwire import Client, Consumer, Producer, Reader
    assert (client.Client, client.Producer, client.Consumer, client.Reader) == (Client, Producer, Consumer, Reader)


# Each module of the Spark data source and the spark modules it may pull in at import time: one
# concern each, importing one way (options and offsets below the source, the sink and the reader;
# typed values imported where a topic has a schema, not at import).
SPARK_DEPENDS = {
    "errors": set(),
    "columns": set(),
    "types": set(),
    "offsets": {"errors"},
    "options": {"errors", "columns", "offsets"},
    "connect": {"errors", "columns", "offsets", "options"},
    "positions": {"errors", "columns", "offsets", "options"},
    "arrow": {"columns"},
    "reader": {"errors", "columns", "offsets", "options", "connect", "positions", "arrow"},
    "source": {"errors", "columns", "offsets", "options", "connect", "positions", "arrow", "reader"},
    "sink": {"errors", "columns", "offsets", "options", "connect"},
    "datasource": {"errors", "columns", "offsets", "options", "connect", "positions", "arrow", "reader", "source",
                   "sink"},
}
# Every public name `pulsarwire.spark` offered when it was one module.
SPARK_NAMES = [
    "PulsarDataSource", "register", "SCHEMA", "HEADERS", "Boundary", "canonical", "PulsarSparkError",
    "PulsarDataLossError", "message_id_topic", "ClientSettings", "SourceOptions", "SinkOptions", "source_options",
    "sink_options", "source_schema", "with_value_type", "RangePartition", "RangeGroup", "PulsarBatchReader",
    "PulsarStreamReader", "PulsarBatchWriter", "PulsarStreamWriter", "SentMessage", "WriteIdentity",
]


@pytest.mark.parametrize("module", sorted(SPARK_DEPENDS))
def test_spark_module_imports_only_what_it_builds_on(module):
    pytest.importorskip("pyspark")
    # stand-ins for the packages, as for the client: `module` is the first spark module loaded
    code = ("import importlib, importlib.util, json, sys, types\n"
            "root = importlib.util.find_spec('pulsarwire').submodule_search_locations[0]\n"
            "for name, path in (('pulsarwire', root), ('pulsarwire.spark', root + '/spark')):\n"
            "    package = types.ModuleType(name)\n"
            "    package.__path__ = [path]\n"
            "    sys.modules[name] = package\n"
            "sys.modules['pulsarwire'].__version__ = '0'\n"
            f"importlib.import_module('pulsarwire.spark.{module}')\n"
            "print(json.dumps(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
            "if m.startswith('pulsarwire.spark.'))))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = set(json.loads(out)) - {module}
    assert loaded == SPARK_DEPENDS[module], f"{module} pulls in {sorted(loaded)}"


def test_spark_package_keeps_its_public_names():
    pytest.importorskip("pyspark")
    import pulsarwire.spark as spark
    missing = [name for name in SPARK_NAMES if not hasattr(spark, name)]
    assert not missing
    assert spark.PulsarDataSource.name() == "pulsarwire"
