#!/usr/bin/env bash
# One entry point for newcomers and CI. Each command creates or refreshes
# ./.venv (Python 3.11), installs pulsarwire with its test extras, builds the
# Cython codec in place, then does its job.
#   ./dev.sh demo [args]   embedded broker + produce/consume, throughput report
#   ./dev.sh test [args]   the whole suite, against the Cython and the pure-Python codec
#   ./dev.sh bench [args]  the benchmark harness (benchmarks/run_all.py)
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=.venv
STAMP=$VENV/.pulsarwire-setup

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        "$PYTHON" -m venv "$VENV"
    fi
    local want
    want=$(cat pyproject.toml setup.py | sha256sum | cut -d' ' -f1)
    if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
        "$VENV/bin/python" -m pip install -q --upgrade pip setuptools wheel cython
        "$VENV/bin/python" -m pip install -q -e ".[test,bench]"
        echo "$want" > "$STAMP"
    fi
    # Always rebuild in place: cheap when nothing changed, right when the .pyx did.
    "$VENV/bin/python" setup.py -q build_ext --inplace >/dev/null
}

cmd=${1:-help}
shift || true
case "$cmd" in
    demo)
        setup
        exec "$VENV/bin/python" -m pulsarwire "$@"
        ;;
    test)
        setup
        "$VENV/bin/python" -c "import pulsarwire._codec" || { echo "Cython codec did not build" >&2; exit 1; }
        echo "=== test suite, Cython codec ==="
        "$VENV/bin/python" -m pytest -q "$@"
        echo "=== test suite, pure-Python codec (PULSARWIRE_PURE_PYTHON=1) ==="
        PULSARWIRE_PURE_PYTHON=1 "$VENV/bin/python" -m pytest -q "$@"
        ;;
    bench)
        setup
        exec "$VENV/bin/python" benchmarks/run_all.py "$@"
        ;;
    *)
        sed -n '2,8p' "$0"
        exit 2
        ;;
esac
