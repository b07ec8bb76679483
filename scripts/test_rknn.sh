#!/usr/bin/env bash
# The tests that convert with rknn-toolkit2 and run its x86 simulator (docs/rknn.md). The toolkit
# pins numpy<2 and torch<=2.4 (about 3 GB with torch's CUDA wheels), so it lives in a venv of its
# own that `bundle build --rknn` runs as a subprocess; the tests themselves run in the project's.
# (The venv's python is named by its path in the venv: resolving its link would lose the venv.)
# EDGE_AGENT_REQUIRE=rknn turns their skips into failures, so this run cannot pass without it.
#   scripts/test_rknn.sh            # creates .venv-rknn once (x86-64 only), then runs the tests
#   scripts/test_rknn.sh -x         # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
toolkit=${EDGE_AGENT_RKNN_PYTHON:-.venv-rknn/bin/python}
if [ ! -x "$toolkit" ]; then
  python3 -m venv .venv-rknn
  .venv-rknn/bin/pip install -q rknn-toolkit2
  toolkit=.venv-rknn/bin/python
fi
python=${EDGE_AGENT_PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD:$PWD/tests/support${PYTHONPATH:+:$PYTHONPATH}"
EDGE_AGENT_RKNN_PYTHON="$(cd "$(dirname "$toolkit")" && pwd)/$(basename "$toolkit")" EDGE_AGENT_REQUIRE=${EDGE_AGENT_REQUIRE:-rknn} \
  "$python" -m pytest -n 0 -q -m rknn tests/agent/cli/test_bundle.py tests/agent/optimise/test_rknn_build.py tests/house/test_rknn_double.py "$@"
