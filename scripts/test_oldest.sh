#!/usr/bin/env bash
# The test suite on the oldest versions edge-agent supports (docs/arm64.md): Python 3.10 (JetPack
# 6's) in .venv-oldest, every direct dependency at the lowest version its range in pyproject.toml
# allows (uv's --resolution lowest-direct: numpy 1.24.0, onnxruntime 1.17.0, ai-edge-litert 1.2.0,
# ...). Run as `scripts/test.sh --oldest [--if-available] [pytest args]`.
# Python 3.10 is $PYTHON_OLDEST, else python3.10 on PATH, else pyenv's newest 3.10.x. With
# --if-available and none found, it says so and exits 0 (CI on a machine without one).
# Skips the `schema_docs` tests: older pydantic writes the same JSON Schema in other words.
set -euo pipefail
cd "$(dirname "$0")/.."
if_available=no
if [ "${1:-}" = --if-available ]; then if_available=yes; shift; fi

is_310() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; }
if [ -n "${PYTHON_OLDEST:-}" ]; then
  candidates=("$PYTHON_OLDEST")
else  # a pyenv shim on PATH may name a version that is not active: each is tried
  mapfile -t candidates < <(command -v python3.10; ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10.*/bin/python 2>/dev/null | sort -rV)
fi
python=
for candidate in "${candidates[@]}"; do
  if [ -n "$candidate" ] && is_310 "$candidate"; then python=$candidate; break; fi
done
if [ -z "$python" ]; then
  message="no Python 3.10 found (set PYTHON_OLDEST to one)"
  if [ "$if_available" = yes ]; then echo "oldest-versions run skipped: $message"; exit 0; fi
  echo "$message" >&2
  exit 1
fi

scripts/setup.sh dev  # .venv brings uv
stamp=$({ cat pyproject.toml tests/support/pyproject.toml; "$python" -VV; } | sha256sum | cut -c1-16)
if [ ! -x .venv-oldest/bin/python ] || [ "$(cat .venv-oldest/.stamp 2>/dev/null)" != "$stamp" ]; then
  rm -rf .venv-oldest
  "$python" -m venv .venv-oldest
  .venv/bin/uv pip install --quiet --python .venv-oldest/bin/python --resolution lowest-direct -e ".[dev]"
  .venv/bin/uv pip install --quiet --python .venv-oldest/bin/python --no-deps -e tests/support
  echo "$stamp" > .venv-oldest/.stamp
fi
versions=$(.venv/bin/uv pip list --python .venv-oldest/bin/python 2>/dev/null \
  | awk 'tolower($1) ~ /^(numpy|onnxruntime|ai-edge-litert|opencv-python-headless|pydantic|cryptography|paho-mqtt|semver|psutil|pyyaml|tqdm)$/ {printf "%s %s, ", $1, $2}')
echo "oldest versions: $("$python" -V), ${versions%, }"
exec .venv-oldest/bin/python -m pytest -m "not schema_docs and not vm" "$@"
