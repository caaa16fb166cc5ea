"""Packaging: wheel and sdist build, type hints check, the pure-Python fallback warns."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.skipif(bool(os.environ.get("PULSARWIRE_PURE_PYTHON")),
                                reason="not codec-dependent: runs once, in the Cython pass")


def test_wheel_and_sdist_build(tmp_path):
    pytest.importorskip("build")
    # Build from a copy without build outputs: a stale ./build or *.egg-info/SOURCES.txt would
    # carry modules into the artifacts that pyproject.toml no longer (or never did) list.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
        "*.so", "*.pyd", "_codec.c", "_codec.html", "_staging.c", "_staging.html", "_receiving.c",
        "_receiving.html"))
    sdist = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(tmp_path),
                            str(source)], capture_output=True, text=True, timeout=600)
    assert sdist.returncode == 0, sdist.stderr[-2000:]
    (archive,) = tmp_path.glob("pulsarwire-*.tar.gz")
    members = [m.split("/", 1)[1] for m in tarfile.open(archive).getnames() if "/" in m]
    for expected in ("setup.py", "pyproject.toml", "pulsarwire/_codec.pyx", "pulsarwire/_codec.pxd",
                     "pulsarwire/broker/_staging.pyx", "pulsarwire/client/_receiving.pyx",
                     "proto/PulsarApi.proto"):
        assert expected in members

    # The wheel is built from the sdist, as pip does from an index.
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", str(archive), "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path)],
                           capture_output=True, text=True, timeout=600)
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    (built,) = tmp_path.glob("pulsarwire-*.whl")
    names = zipfile.ZipFile(built).namelist()
    for extension in ("pulsarwire/_codec", "pulsarwire/broker/_staging", "pulsarwire/client/_receiving"):
        assert any(n.startswith(extension) and n.endswith((".so", ".pyd")) for n in names), extension
    for expected in ("pulsarwire/py.typed", "pulsarwire/_codec.pyi", "pulsarwire/_proto/PulsarApi_pb2.py",
                     "pulsarwire/_proto/PulsarApi_pb2.pyi", "pulsarwire/_codec_py.py"):
        assert expected in names
    # Every module of every subpackage ships (a package left out of pyproject.toml would not).
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "pulsarwire").rglob("*.py")}
    assert {"pulsarwire/broker/__init__.py", "pulsarwire/client/__init__.py"} <= sources
    missing = sorted(sources - set(names))
    assert not missing
    assert any(n.endswith("entry_points.txt") for n in names)


def test_type_hints_check():
    pytest.importorskip("mypy")
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize("extension, selector, warning", [
    ("pulsarwire._codec", "pulsarwire.codec", "pure-Python codec"),
    # the broker's staging and the consumer's receiving helpers follow the Cython codec; without
    # their own extension, their pure twins
    ("pulsarwire.broker._staging", "pulsarwire.broker.staging", "broker staging not built"),
    ("pulsarwire.client._receiving", "pulsarwire.client.receiving", "receiving helpers not built"),
])
def test_a_missing_extension_falls_back_with_a_warning(extension, selector, warning):
    code = (f"import sys, warnings; sys.modules[{extension!r}] = None\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            f"    import {selector} as chosen\n"
            "print(chosen.IMPLEMENTATION, [str(w.message) for w in caught])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("python ") and warning in result.stdout


def test_env_var_forces_the_pure_twin():
    env = dict(os.environ, PULSARWIRE_PURE_PYTHON="1")
    code = ("import pulsarwire.codec as c, pulsarwire.broker.staging as s, pulsarwire.client.receiving as r; "
            "print(c.IMPLEMENTATION, s.IMPLEMENTATION, r.IMPLEMENTATION)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert result.stdout.strip() == "python python python"
