#!/usr/bin/env bash
# Set up the development environment and run the checks: ruff, mypy (TensorRT code against
# TensorRT's published stubs), import contracts, pytest on every core (pytest-xdist: a worker per
# core and two more; the quick tier a worker per core).
# Extra arguments go to pytest (e.g. scripts/test.sh -k decoders; -n 0 runs in this process).
# `scripts/test.sh --quick [pytest args]`: the inner loop, under 3 minutes on two cores: ruff and
# the unit tests that start no serving process and take no CPU-heavy minute (`-m "not daemons and
# not slow"`, docs/testing.md "Tiers"); mypy and the contracts are left to the whole run.
# `scripts/test.sh --oldest [--if-available] [pytest args]`: the suite on Python 3.10 with the
# lowest supported dependency versions instead (scripts/test_oldest.sh, docs/arm64.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --oldest ]; then shift; exec scripts/test_oldest.sh "$@"; fi
# The whole suite: a worker per core and two more. Many of its tests wait on what they start (an
# agent's start, a broker, a browser, a pip install) and leave a core idle meanwhile: on two
# cores, in fresh clones, four workers took 11 min 28 s, three 13 min 24 s, two 15 min 14 s
# (docs/testing.md).
workers=${EDGE_AGENT_TEST_WORKERS:-$(($(nproc) + 2))}
if [ "${1:-}" = --quick ]; then
  shift
  workers=${EDGE_AGENT_TEST_WORKERS:-auto}  # the unit tests keep the cores busy: a worker per core
  [ -x .venv/bin/pytest ] && .venv/bin/python -c "import xdist" 2>/dev/null || scripts/setup.sh dev
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  exec .venv/bin/pytest -n "$workers" -m "not daemons and not slow and not vm" "$@"
fi
scripts/setup.sh dev
.venv/bin/python scripts/tensorrt_stubs.py >/dev/null  # TensorRT 10.13's stubs, repaired, for mypy
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
.venv/bin/pytest -n "$workers" "$@"
