#!/usr/bin/env bash
# Mutation testing of the core modules: mutmut changes one small thing at a time (a comparison
# or its boundary, a constant, a call's argument, and with scripts/mutation_operators.py a dropped
# call, two arguments swapped, min for max) in NMS, the decoders and the detector's mapping back
# to the frame, preprocessing, signing, bundle unpack and verify, the store and recovery, the
# transfer's chunk checks, the control gate, the selection policy, the governor and thermal
# zones, the tracker and zones, the rollout schedule and its tally, probation and the page's
# access rules, and runs the tests that reach the changed function; a mutant no test notices
# "survived".
#
#   scripts/mutation.sh [--json] [--max-children N] [--keep] [--module FILE --tests PATH...]
#
# Sets up the development environment first (scripts/setup.sh dev, as scripts/test.sh does, and
# mutmut). Runs in a copy of the checkout (the working tree is never touched). Prints mutmut's
# survivors and the counts; --json prints only {"mutants", "killed", "survived", "timeout",
# "no_tests", "score"}; a mutant that no selected test reaches counts against the score like a
# survivor. --keep leaves the copy (its path is printed last) for `mutmut show NAME` there.
# --module FILE (a source file, e.g. pipelines/tracking/zones.py) mutates only that module and
# --tests PATH (repeatable) runs only those tests: a run of minutes for one module. The modules
# and test files are [tool.mutmut] in pyproject.toml; docs/testing.md lists the survivors.
# Not part of CI (too slow).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
json=no
keep=no
module=
tests=()
children=$(nproc)
while [ $# -gt 0 ]; do
  case $1 in
    --json) json=yes ;;
    --keep) keep=yes ;;
    --max-children) children=$2; shift ;;
    --module) module=$2; shift ;;
    --tests) tests+=("$2"); shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "mutation.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "$module" ]; then
  [ -f "$repo/$module" ] || { echo "mutation.sh: --module $module is not a file of the checkout" >&2; exit 2; }
  [ ${#tests[@]} -gt 0 ] || { echo "mutation.sh: --module needs --tests (the tests that check it)" >&2; exit 2; }
elif [ ${#tests[@]} -gt 0 ]; then
  echo "mutation.sh: --tests goes with --module" >&2; exit 2
fi
venv=$repo/.venv
"$repo/scripts/setup.sh" dev >&2  # the tests import the dev tools' packages (onnx, testkit): as scripts/test.sh
"$venv/bin/python" -c 'import mutmut' 2>/dev/null || "$venv/bin/python" -m pip install -q -e "$repo[mutation]" >&2

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
if [ -n "$module" ]; then  # one module and its tests: the copy's [tool.mutmut] says so
  "$venv/bin/python" - "$module" "${tests[@]}" <<'PY'
import json
import re
import sys
from pathlib import Path

module, tests = sys.argv[1], sys.argv[2:]
config = Path("pyproject.toml")
text = config.read_text()
for key, values in (("only_mutate", [module]), ("pytest_add_cli_args_test_selection", tests)):
    text, found = re.subn(rf"^{key} = \[.*?^\]", f"{key} = {json.dumps(values)}", text, flags=re.M | re.S)
    assert found == 1, f"[tool.mutmut] {key} not found in pyproject.toml"
config.write_text(text)
PY
fi
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
  'agent.deployment.transfer.xǁPartialBundleǁ*'           # the transfer's chunk checks
  'runtimes.selection.*'                             # the selection policy
  'agent.governor.policy.*' 'agent.governor.levels.*'  # the governor
  'agent.hardware.thermal.x_read_thermal_zones__*'     # thermal zones in kernel order
  'pipelines.decoding.detector.xǁDetectorǁpostprocess__*'  # boxes back to frame pixels
  'agent.deployment.transfer.xǁ_MqttFetchǁ*'              # chunks as they arrive
  'agent.mqtt.control.*'                             # the control gate
  'pipelines.tracking.tracker.*' 'pipelines.tracking.zones.*'  # tracker, lines and zones
  'agent.mqtt.rollout_schedule.*' 'agent.fleet.rollout_watch.x_tally__*' 'agent.fleet.rollout_watch.xǁTallyǁ*'
  'agent.deployment.probation.*'                         # probation's verdict
  'agent.web.auth.*'                                 # who may read and act on the page
)
if [ -n "$module" ]; then
  name=${module%.py}
  core=("${name//\//.}.*")
fi
# mutmut with the extra operators (dropped calls, swapped arguments, min/max)
"$venv/bin/python" scripts/mutation_operators.py run --max-children "$children" "${core[@]}" >"$work/run.log" 2>&1 \
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
