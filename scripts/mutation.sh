#!/usr/bin/env bash
# Mutation testing of the core modules: mutmut changes one small thing at a time (a comparison,
# a constant, a call) in NMS, the decoders, preprocessing, signing, bundle unpack and verify, the
# store and recovery, the transfer's chunk checks, the selection policy and the governor, and
# runs the tests that reach the changed function; a mutant no test notices "survived".
#
#   scripts/mutation.sh [--json] [--max-children N] [--keep]
#
# Runs in a copy of the checkout (the working tree is never touched), within about 30 minutes on
# a 2-core machine. Prints mutmut's survivors and the counts; --json prints only
# {"mutants", "killed", "survived", "timeout", "no_tests", "score"}; a mutant that no selected test
# reaches counts against the score like a survivor. --keep leaves the copy (its path is printed
# last) for `mutmut show NAME` there. The modules and test files are
# [tool.mutmut] in pyproject.toml; docs/testing.md lists the survivors and why each is left.
# Not part of CI (too slow). Needs scripts/setup.sh dev.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
json=no
keep=no
children=$(nproc)
while [ $# -gt 0 ]; do
  case $1 in
    --json) json=yes ;;
    --keep) keep=yes ;;
    --max-children) children=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "mutation.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
venv=$repo/.venv
[ -x "$venv/bin/python" ] || { echo "no $venv: run scripts/setup.sh dev first" >&2; exit 1; }
"$venv/bin/python" -c 'import mutmut' 2>/dev/null || "$venv/bin/pip" install -q -e "$repo[mutation]" >&2

work=$(mktemp -d /tmp/edge-agent-mutation.XXXXXX)
cleanup() {  # a mutant killed mid-test can leave the full-disk test's tmpfs mounted in the copy
  awk -v w="$work/" 'index($2, w) == 1 {print $2}' /proc/mounts | xargs -r umount -l 2>/dev/null || true
  if [ "$keep" = yes ]; then echo "kept: $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
(cd "$repo" && git ls-files -co --exclude-standard -z | xargs -0 tar --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$work"
mkdir "$work/.pytest-tmp"
export EDGE_AGENT_SHARED_MODELS=${EDGE_AGENT_SHARED_MODELS:-$repo/../shared/models}
export PYTEST_DEBUG_TEMPROOT=$work/.pytest-tmp  # the many test sessions keep their temp dirs here
cd "$work"
started=$(date +%s)
# the core functions (mutmut's mutant names, fnmatch patterns; ǁ separates class and method)
core=(
  'pipelines.decoding.nms.*'                                  # NMS
  'pipelines.decoding.decoders.*'                             # the grid decoders
  'pipelines.decoding.query_decoders.x_decode_*' 'pipelines.decoding.query_decoders.x__*'  # end2end, RT-DETR, DETR
  'pipelines.decoding.preprocess.*'                           # letterbox, stretch, layouts, quantised inputs
  'agent.bundles.signing.x_verify__*' 'agent.bundles.signing.x_key_id__*' 'agent.bundles.signing.x_load_public_key__*'
  'agent.bundles.archive.x_unpack__*' 'agent.bundles.archive.x_verify_unpacked__*'  # unpack and verify
  'agent.bundles.archive.x__allowed__*' 'agent.bundles.archive.x__member_path__*'
  'agent.bundles.archive.x_read_manifest__*' 'agent.bundles.archive.x_read_reference__*'
  'agent.bundles.store.xǁStoreǁswitch__*' 'agent.bundles.store.xǁStoreǁ_set_pointer__*'  # the store
  'agent.bundles.store.xǁStoreǁundo_switch__*' 'agent.bundles.store.xǁStoreǁrollback__*'
  'agent.bundles.store.xǁStoreǁgc__*' 'agent.bundles.store.xǁStoreǁrecover__*'         # and recovery
  'agent.bundles.store.xǁStoreǁ_repair_pointers__*' 'agent.bundles.store.xǁStoreǁ_pointer_problem__*'
  'agent.daemon.transfer.xǁPartialBundleǁ*'           # the transfer's chunk checks
  'runtimes.selection.*'                             # the selection policy
  'agent.governor.policy.*' 'agent.governor.levels.*'  # the governor
)
"$venv/bin/mutmut" run --max-children "$children" "${core[@]}" >"$work/run.log" 2>&1 \
  || { tr '\r' '\n' <"$work/run.log" | tail -n 40 >&2; exit 1; }
if [ "$json" = no ]; then
  "$venv/bin/mutmut" results 2>/dev/null | grep -v ': not checked$' || true
fi
"$venv/bin/mutmut" export-cicd-stats >/dev/null 2>&1
"$venv/bin/python" - "$json" "$(($(date +%s) - started))" <<'PY'
import json
import sys
from pathlib import Path

stats = json.loads(Path("mutants/mutmut-cicd-stats.json").read_text())
counted = ("killed", "survived", "timeout", "suspicious", "segfault", "no_tests")
mutants = sum(stats[k] for k in counted)
summary = {
    "mutants": mutants,
    "killed": stats["killed"],
    "survived": stats["survived"],
    "timeout": stats["timeout"],
    "no_tests": stats["no_tests"],
    "score": round((stats["killed"] + stats["timeout"]) / mutants, 4) if mutants else 0.0,
}
if sys.argv[1] == "yes":
    print(json.dumps(summary))
else:
    extra = {k: stats[k] for k in ("suspicious", "segfault") if stats[k]}
    print(f"{summary} {extra or ''} in {int(sys.argv[2]) // 60} min {int(sys.argv[2]) % 60} s")
PY
