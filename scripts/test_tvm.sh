#!/usr/bin/env bash
# The tests that compile with Apache TVM (docs/tvm.md), in a venv of their own: the tvm extra is
# about 100 MB (apache-tvm, x86-64 wheels only), too much for every CI run's `dev` install.
# EDGE_AGENT_REQUIRE=tvm turns their skips into failures, so this run cannot pass without tvm.
# Cross-compiling for the Pi 5 needs aarch64-linux-gnu-gcc (Debian: gcc-aarch64-linux-gnu).
#   scripts/test_tvm.sh            # creates .venv-tvm once, then runs the tests
#   scripts/test_tvm.sh -x         # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${EDGE_AGENT_TVM_VENV:-.venv-tvm}
if [ ! -x "$venv/bin/pytest" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -e '.[dev,build,tvm]'
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -q gcc-aarch64-linux-gnu >/dev/null
fi
export PYTHONPATH="$PWD:$PWD/tests/support${PYTHONPATH:+:$PYTHONPATH}"
EDGE_AGENT_REQUIRE=${EDGE_AGENT_REQUIRE:-tvm} "$venv/bin/pytest" -n 0 -q \
  tests/runtimes/test_tvm_backend.py \
  "tests/agent/cli/test_bench.py::test_bench_matrix_shows_a_module_for_another_cpu_as_a_target_mismatch" \
  "tests/agent/cli/test_bundle.py::test_tvm_modules_and_their_target_are_in_the_manifest" \
  "tests/agent/bundles/test_installer.py::test_a_compiled_module_is_installed_only_from_a_signed_bundle" "$@"
