#!/usr/bin/env bash
# Set up the development environment and run the checks: ruff, mypy (TensorRT code against
# TensorRT's published stubs), import contracts, pytest.
# Extra arguments go to pytest (e.g. scripts/test.sh -k decoders).
# `scripts/test.sh --oldest [--if-available] [pytest args]`: the suite on Python 3.10 with the
# lowest supported dependency versions instead (scripts/test_oldest.sh, docs/arm64.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --oldest ]; then shift; exec scripts/test_oldest.sh "$@"; fi
scripts/setup.sh dev
.venv/bin/python scripts/tensorrt_stubs.py >/dev/null  # TensorRT 10.13's stubs, repaired, for mypy
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports --no-cache
.venv/bin/pytest "$@"
