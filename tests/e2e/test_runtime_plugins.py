"""Third-party runtime backends through the ``edge_agent.runtimes`` entry point group, for real:
the plugin packages under tests/plugins/ are installed with pip into a folder of their own, and
``edge-agent`` runs in a subprocess with that folder on ``PYTHONPATH`` (the dev environment
never sees them). ``toy_npu`` is a working backend, probed, selected, configured and autotuned
like the in-tree ones; ``broken_npu``'s import fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import pytest
from testkit import DEMO_MODELS, FAKES, REPO

from agent.bundles.archive import Verified
from pipelines.sources.synthetic import SyntheticScene

PLUGINS = REPO / "tests" / "plugins"
X86 = ["--root", str(FAKES / "x86-generic"), "--arch", "x86_64"]


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the installed plugins (their code and dist-info with the entry points).
    Each is built from a copy of its source, so that the build leaves nothing in the checkout."""
    site = tmp_path_factory.mktemp("plugin-site")
    sources = tmp_path_factory.mktemp("plugin-sources")
    for name in ("toy_npu", "broken_npu"):
        source = shutil.copytree(PLUGINS / name, sources / name)
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
        subprocess.run([*pip, "--target", str(site), str(source)], check=True, capture_output=True)
    return site


def python_module(
    module: str, *args: str, site: Path | None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` in a fresh interpreter, with the plugins of `site` importable (or
    none) and this checkout's code (not an installed copy's)."""
    environment = {**os.environ, **(env or {})}
    environment["PYTHONPATH"] = os.pathsep.join(str(path) for path in (site, REPO) if path is not None)
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=environment, timeout=300
    )


def edge_agent(*args: str, site: Path | None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``edge-agent ARGS`` (`python_module`)."""
    return python_module("agent.cli", *args, site=site, env=env)


def python_script(script: str, *args: str, site: Path) -> subprocess.CompletedProcess[str]:
    """``python -c SCRIPT ARGS`` in a fresh interpreter, with the plugins of `site` importable."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join((str(site), str(REPO)))}
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=environment, timeout=300
    )


#: autotune of the demo bundle with the plugin installed, the plugin's rows made the fastest (an
#: injected figure: which is faster on a shared machine is noise), then the version served as tuned
AUTOTUNE = """
import json, sys
from dataclasses import asdict, replace
from pathlib import Path
from agent.bundles.archive import verify_unpacked
from agent.bundles.tuning import autotune, candidates, with_prepared
from agent.hardware.board import probe
from agent.serving.loader import open_detector
from pipelines.measure.matrix import measure
from runtimes.registry import RuntimeSettings

bundle = verify_unpacked(Path(sys.argv[1]), (), allow_unsigned=True)
settings = RuntimeSettings().with_state_dir(Path(sys.argv[2]))
found = candidates(bundle.folder, bundle.manifest, probe(), settings, True)
toy = [c for c in with_prepared(found, bundle.folder, bundle.manifest) if c.runtime == "toynpu"]

def plugin_fastest(candidate, reference, frames):
    row = measure(candidate, reference, frames)
    return row if row.fps is None else replace(row, fps=row.fps * (100 if row.runtime == "toynpu" else 0.01))

tuning, rows = autotune(
    bundle.folder, bundle.manifest, bundle.reference, probe(), settings, 3, measure_row=plugin_fastest
)
loaded = open_detector(bundle.folder, probe(), settings=settings, tuning=tuning)
served = [loaded.choice.runtime, loaded.choice.reason, loaded.detector.runtime.device]
loaded.detector.close()
print(json.dumps({
    "candidates": [[c.provider, c.artifact, c.precision, c.workers, c.threads, c.unavailable, c.config.model_dump()]
                   for c in toy],
    "rows": [row.to_json() for row in rows if row.runtime == "toynpu"],
    "runtimes": sorted({row.runtime for row in rows}),
    "tuning": asdict(tuning) if tuning else None,
    "served": served,
}))
"""


def test_autotune_measures_a_plugin_like_the_in_tree_backends_and_serves_its_choice(
    plugin_site: Path, unpacked: Verified, tmp_path: Path
) -> None:
    """The toy declares no candidates: autotune measures its one default (its settings as they
    are, on the device it names), checked against the bundle's reference like every row, and the
    camera serves it when it is the choice (through the plugin's `tune`)."""
    proc = python_script(AUTOTUNE, str(unpacked.folder), str(tmp_path / "state"), site=plugin_site)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.splitlines()[-1])
    assert report["candidates"] == [
        ["toy-npu0", "demo_detector.onnx", "fp32", 1, None, None, {"type": "toynpu", "threads": 1}]
    ]
    assert {"onnxruntime", "litert", "toynpu"} <= set(report["runtimes"]), "measured beside the in-tree ones"
    (row,) = report["rows"]
    assert row["error"] is None and row["fps"] > 0 and row["latency_ms"]["p50"] > 0
    assert row["parity"]["within_tolerance"] == 1.0 and row["parity"]["detection_agreement"] == 1.0
    assert report["tuning"]["runtime"] == "toynpu" and report["tuning"]["provider"] == "toy-npu0"
    runtime, reason, device = report["served"]
    assert (runtime, device) == ("toynpu", "toy-npu0") and reason.startswith("autotune: "), reason


def test_an_installed_plugin_is_probed_and_ranked_like_the_in_tree_backends(plugin_site: Path) -> None:
    proc = edge_agent("probe", "--json", *X86, site=plugin_site)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    toy = report["runtimes"]["toynpu"]
    assert toy["available"] and toy["devices"] == ["toy-npu0"], "probed in the check process, as the others"
    assert list(report["runtimes"]) == [
        "tensorrt",
        "onnxruntime",
        "litert",
        "openvino",
        "tvm",
        "hailo",
        "rknn",
        "toynpu",
    ]
    onnx = report["selection"]["onnx"]
    assert onnx["runtime"] == "toynpu" and onnx["device"] == "toy-npu0"
    assert onnx["reason"] == "generic x86_64: toynpu on toy-npu0 is preferred for a .onnx artifact"
    assert report["selection"]["tflite"]["runtime"] == "litert", "the plugin loads no .tflite"
    plugins = {p["name"]: p for p in report["runtime_plugins"]}
    assert plugins["toynpu"] == {
        "name": "toynpu",
        "target": "toy_npu:BACKEND",
        "distribution": "edge-agent-toy-npu 0.1.0",
        "error": None,
    }
    broken = plugins["brokennpu"]
    assert "brokennpu" not in report["runtimes"], "a plugin whose import fails is left out"
    assert broken["error"].startswith("importing broken_npu:BACKEND failed: ImportError: libbroken_npu.so.1")
    assert "runtime plugin brokennpu (broken_npu:BACKEND, from edge-agent-broken-npu 0.1.0) left out" in proc.stderr

    without = json.loads(edge_agent("probe", "--json", *X86, site=None).stdout)
    assert list(without["runtimes"]) == ["tensorrt", "onnxruntime", "litert", "openvino", "tvm", "hailo", "rknn"]
    assert without["runtime_plugins"] == []
    assert without["selection"]["onnx"]["runtime"] == "onnxruntime"


def test_detect_runs_a_model_on_the_plugin_as_on_onnx_runtime(plugin_site: Path, tmp_path: Path) -> None:
    image, _ = SyntheticScene(seed=4_242, num_shapes=4).render(0)
    frame = tmp_path / "frame.png"
    cv2.imwrite(str(frame), image)
    model = str(DEMO_MODELS / "demo_detector.onnx")
    on_plugin = edge_agent("detect", model, str(frame), "--json", site=plugin_site)  # auto: the plugin ranks first
    on_ort = edge_agent("detect", model, str(frame), "--runtime", "onnxruntime", "--json", site=plugin_site)
    assert on_plugin.returncode == 0 == on_ort.returncode, on_plugin.stderr + on_ort.stderr
    plugin_record, ort_record = json.loads(on_plugin.stdout), json.loads(on_ort.stdout)
    assert (plugin_record["runtime"], ort_record["runtime"]) == ("toynpu", "onnxruntime")
    assert plugin_record["detections"] == ort_record["detections"] and len(plugin_record["detections"]) >= 3

    refused = edge_agent("detect", model, str(frame), "--runtime", "toynpu", site=None)
    assert refused.returncode == 2 and "invalid choice: 'toynpu'" in refused.stderr, "choices come from the table"


def test_the_config_takes_a_plugin_section_and_preference_only_where_it_is_installed(
    plugin_site: Path, tmp_path: Path
) -> None:
    config = tmp_path / "agent.yaml"
    signed = "allow_unsigned: true\n"  # (a config without trust keys is a problem of its own)
    config.write_text(signed + "runtime: toynpu\nruntimes:\n  toynpu:\n    threads: 2\n  litert:\n    num_threads: 2\n")
    checked = edge_agent("config", "check", str(config), site=plugin_site)
    assert checked.returncode == 0 and "no problems found" in checked.stdout, checked.stdout + checked.stderr
    missing = edge_agent("config", "check", str(config), site=None)
    assert missing.returncode == 1
    assert f"{config}:2: runtime: Value error, unknown runtime 'toynpu': expected auto, tensorrt," in missing.stdout
    assert f"{config}:4: runtimes.toynpu: Extra inputs are not permitted" in missing.stdout, missing.stdout

    config.write_text(signed + "runtimes:\n  toynpu:\n    threads: 0\n")
    bad = edge_agent("config", "check", str(config), site=plugin_site)
    assert bad.returncode == 1 and f"{config}:4: runtimes.toynpu.threads: " in bad.stdout, "the plugin's own model"

    # the schema describes the in-tree backends: writing it imports no plugin (runtimes.registry)
    schema = json.loads(python_module("agent.config", site=plugin_site).stdout)
    in_tree = ["tensorrt", "onnxruntime", "litert", "openvino", "tvm", "hailo", "rknn"]
    assert schema["properties"]["runtime"]["enum"] == ["auto", *in_tree]
    assert list(schema["$defs"]["RuntimeSettings"]["properties"]) == in_tree


def test_a_plugin_whose_library_crashes_its_probe_is_named_and_the_others_serve(plugin_site: Path) -> None:
    proc = edge_agent("probe", "--json", *X86, site=plugin_site, env={"TOY_NPU_CRASH": "probe"})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    toy = report["runtimes"]["toynpu"]
    assert not toy["available"] and toy["crashed"] == "SIGABRT" and toy["version"] == "0.1.0"
    assert toy["reason"].startswith("edge-agent-toy-npu 0.1.0 crashed on import (SIGABRT) in a probe process")
    assert report["runtimes"]["onnxruntime"]["available"]
    assert report["selection"]["onnx"]["runtime"] == "onnxruntime"
