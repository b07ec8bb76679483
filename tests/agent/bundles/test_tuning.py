"""`agent.bundles.tuning`: a bundle's candidates on this device (each runtime, or why not), TensorRT
rows built then measured, autotune at activation, each configuration checked in a child first."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from testkit import standin_env
from testkit.net import wait_until
from testkit.trt_double import TrtDouble

from agent.bundles.installer import InstallPolicy, install
from agent.bundles.store import Store
from agent.bundles.tuning import Tuning, autotune, candidates, reference_of, with_prepared
from agent.config.models import CameraSection
from agent.hardware.board import probe
from agent.serving.cameras import Cameras
from pipelines.measure.matrix import Candidate, Reference, Row, measure, measure_isolated
from runtimes import isolation
from runtimes.base import usable_cores, worker_variants
from runtimes.isolation import ChildRunner
from runtimes.litert_backend import LiteRTConfig
from runtimes.registry import RuntimeSettings
from runtimes.tensorrt_backend import TensorRTConfig


def test_candidates_cover_every_runtime_and_say_why_not(unpacked) -> None:
    folder, manifest = unpacked.folder, unpacked.manifest
    settings = RuntimeSettings(litert=LiteRTConfig(delegate=Path("/nonexistent/libedgetpu.so.1")))
    found = candidates(folder, manifest, probe(), settings, variants=True)
    table = [(c.runtime, c.provider, c.artifact, c.precision, c.workers, c.unavailable is None) for c in found]
    variants = worker_variants(usable_cores())
    assert table == [
        ("tensorrt", "GPU", "demo_detector.onnx", "fp32", 1, False),
        ("tensorrt", "GPU", "demo_detector.onnx", "fp16", 1, False),
        ("tensorrt", "GPU", "demo_detector.onnx", "int8", 1, False),
        *[("onnxruntime", "CPUExecutionProvider", "demo_detector.onnx", "fp32", w, True) for w, _ in variants],
        *[("openvino", "CPU", "demo_detector.onnx", "fp32", w, True) for w, _ in variants],
        ("tvm", "CPU", "demo_detector.onnx", "fp32", 1, importlib.util.find_spec("tvm") is not None),
        ("litert", "xnnpack", "demo_detector_int8.tflite", "int8", 1, True),
        ("litert", "libedgetpu.so.1", "demo_detector_int8.tflite", "int8", 1, True),
    ]
    assert "tensorrt (JetPack / TensorRT wheel) is not installed" in (found[0].unavailable or "")
    reference = reference_of(folder, manifest, unpacked.reference)
    assert reference.reference_artifact == "demo_detector.onnx" and len(reference.detections) > 0
    row = measure_isolated(found[-1], reference, 5)
    assert row.error is not None and "cannot load LiteRT delegate /nonexistent/libedgetpu.so.1" in row.error


def test_tensorrt_rows_are_built_then_measured(trt_double: TrtDouble, unpacked, tmp_path: Path) -> None:
    folder, manifest = unpacked.folder, unpacked.manifest
    settings = RuntimeSettings(tensorrt=TensorRTConfig(engine_cache_dir=tmp_path / "engines"))
    found = with_prepared(candidates(folder, manifest, probe(), settings), folder, manifest)
    trt = [c for c in found if c.runtime == "tensorrt"]
    assert [c.unavailable is None for c in trt] == [True, True, False]
    assert trt[2].unavailable == "int8 needs a Q/DQ model or calibration images in the bundle"
    reference = reference_of(folder, manifest, unpacked.reference)
    fp32, fp16 = (measure(c, reference, 5) for c in trt[:2])
    assert fp32.error is None and fp32.parity["max_abs_err"] == 0.0 and fp32.parity["within_tolerance"] == 1.0
    assert 0 < fp16.parity["max_abs_err"] < 0.05 and fp16.parity["detection_agreement"] == 1.0
    assert fp16.provider == "Orin (test double) (sm 8.7)"


@pytest.mark.slow
def test_autotune_at_activation_is_recorded_and_served(
    tmp_path: Path, keys: dict[str, Path], demo_bundle: Path
) -> None:
    store = Store(tmp_path / "state")
    policy = InstallPolicy(allow_unsigned=True, autotune=True, autotune_frames=10)
    deployment = install(demo_bundle, store, probe(), policy)
    assert deployment.state == "SUCCEEDED", deployment.error
    assert deployment.tuning is not None and len(deployment.tuning.rows) >= 5
    tuning = store.tuning(deployment.sha256)
    assert tuning is not None and tuning == deployment.tuning.choice
    assert json.loads((store.root / "deployment.json").read_text())["tuning"]["choice"] == asdict(tuning)
    assert store.last_deployment() == deployment, "the record reads back as it was written"

    fixed = Tuning("onnxruntime", "CPUExecutionProvider", "demo_detector.onnx", "fp32", 1, 2, 100.0, 9.0, "test")
    section = CameraSection(name="cam", source="synthetic:1", fps=30)
    cameras = Cameras([section], probe(), "auto")
    try:
        cameras.activate(store.versions / deployment.sha256, fixed)
        camera = cameras.get("cam")
        wait_until(lambda: camera.frames > 3, 30, "frames")
        stats = camera.stats()
        assert (stats.runtime, stats.model, stats.workers) == ("onnxruntime", "demo_detector.onnx", 2)
        assert camera.detector.runtime._session.get_session_options().intra_op_num_threads == 1
        assert cameras.choice is not None and cameras.choice.reason == "autotune: test"
    finally:
        cameras.stop()
    with_latency = InstallPolicy(allow_unsigned=True, autotune=True, autotune_frames=5, max_latency_ms=1e-6)
    deployment = install(demo_bundle, Store(tmp_path / "state2"), probe(), with_latency)
    assert deployment.state == "SUCCEEDED" and deployment.tuning is not None, deployment.error
    assert deployment.tuning.choice is None and deployment.tuning.rows, "nothing is that fast: policy"


def test_autotune_checks_each_configuration_in_a_child_first(unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library that crashes on an artifact kills a check process, not the agent: its rows say
    so and autotune chooses among the others (stand-in: an onnxruntime whose loads die by SIGILL
    in the check processes only; this process has the real one)."""
    monkeypatch.setattr(isolation, "PROCESS_RUNNER", ChildRunner(env=standin_env("crash_on_load")))
    tuning, rows = autotune(unpacked.folder, unpacked.manifest, unpacked.reference, probe(), RuntimeSettings(), 5)
    ort = [row for row in rows if row.runtime == "onnxruntime"]
    assert ort and all("RuntimeCrashed" in (row.error or "") and "SIGILL" in (row.error or "") for row in ort)
    assert tuning is not None and tuning.runtime in ("litert", "openvino")


def _faster(runtime: str, factor: float) -> Callable[[Candidate, Reference, int], Row]:
    """The real measurement, with `runtime`'s throughput multiplied by `factor` (an injected
    figure: which is faster on a shared 2-core machine is noise, the decision is what is tested)."""

    def measure_row(candidate: Candidate, reference: Reference, frames: int) -> Row:
        row = measure(candidate, reference, frames)
        if row.runtime == runtime and row.fps is not None:
            return replace(row, fps=row.fps * factor)
        if row.runtime != runtime and row.fps is not None:
            return replace(row, fps=row.fps / factor)
        return row

    return measure_row


@pytest.mark.slow
def test_autotune_serves_openvino_when_it_is_faster_and_another_when_not(unpacked) -> None:
    pytest.importorskip("openvino")
    args = (unpacked.folder, unpacked.manifest, unpacked.reference, probe(), RuntimeSettings(), 3)
    tuning, rows = autotune(*args, measure_row=_faster("openvino", 10.0))
    openvino = [row for row in rows if row.runtime == "openvino"]
    assert openvino and all(row.error is None for row in openvino), openvino
    assert all(row.parity and row.parity["within_tolerance"] == 1.0 for row in openvino), "fp32: the same outputs"
    assert tuning is not None and (tuning.runtime, tuning.provider) == ("openvino", "CPU"), tuning
    slower, _ = autotune(*args, measure_row=_faster("openvino", 0.1))
    assert slower is not None and slower.runtime in ("onnxruntime", "litert"), slower


def test_autotune_never_serves_openvino_outside_the_parity_tolerance(unpacked) -> None:
    """Faster but wrong loses: an OpenVINO row whose outputs are off is rejected by the gate."""
    pytest.importorskip("openvino")
    fast = _faster("openvino", 10.0)

    def off(candidate: Candidate, reference: Reference, frames: int) -> Row:
        row = fast(candidate, reference, frames)
        if row.runtime == "openvino" and row.parity is not None:
            return replace(row, parity={**row.parity, "within_tolerance": 0.5})
        return row

    args = (unpacked.folder, unpacked.manifest, unpacked.reference, probe(), RuntimeSettings(), 3)
    tuning, _ = autotune(*args, measure_row=off)
    assert tuning is not None and tuning.runtime != "openvino"


def test_a_tuned_openvino_choice_is_what_the_camera_serves(unpacked) -> None:
    pytest.importorskip("openvino")
    from agent.serving.loader import open_detector

    fixed = Tuning("openvino", "CPU", "demo_detector.onnx", "fp32", 1, 2, 100.0, 9.0, "test")
    settings = RuntimeSettings().with_state_dir(unpacked.folder.parent / "state")
    loaded = open_detector(unpacked.folder, probe(), workers=2, settings=settings, tuning=fixed)
    try:
        assert (loaded.choice.runtime, loaded.choice.reason) == ("openvino", "autotune: test")
        runtime = loaded.detector.runtime
        assert runtime.key.threads == 1 and runtime.key.hint == "THROUGHPUT" and runtime.key.requests == 2
    finally:
        loaded.detector.close()


@pytest.mark.slow
def test_autotune_measures_openvino_in_a_child_so_this_process_never_loads_it(unpacked) -> None:
    """Loaded here, OpenVINO would keep ~90 MB resident after its rows (docs/benchmarks.md)."""
    pytest.importorskip("openvino")
    script = (
        "import sys; from pathlib import Path\n"
        "from agent.bundles.archive import Limits, verify_unpacked\n"
        "from agent.bundles.tuning import autotune\n"
        "from agent.hardware.board import probe\n"
        "from runtimes.registry import RuntimeSettings\n"
        "v = verify_unpacked(Path(sys.argv[1]), (), allow_unsigned=True)\n"
        "tuning, rows = autotune(v.folder, v.manifest, v.reference, probe(), RuntimeSettings(), 3)\n"
        "ov = [r for r in rows if r.runtime == 'openvino']\n"
        "print(len(ov), all(r.error is None and r.fps for r in ov), 'openvino' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(unpacked.folder)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2" if usable_cores() >= 2 else "1", "True", "False"], proc.stdout


def test_an_affinity_mask_of_one_cpu_is_one_core_for_workers_and_threads() -> None:
    """Under ``taskset -c 0`` (here: the child's own affinity) on a machine of more CPUs, autotune
    and ``--workers auto`` try one call in flight, not two calls splitting one core."""
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs Linux and at least two CPUs")
    script = (
        "import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
        "from runtimes.base import LoadOptions, usable_cores, worker_variants\n"
        "from runtimes.ort_backend import OnnxRuntimeConfig, load\n"
        "import sys; from pathlib import Path\n"
        "rt = load(Path(sys.argv[1]), OnnxRuntimeConfig(), LoadOptions(warmup=False, workers=2))\n"
        "print(usable_cores(), worker_variants(usable_cores()), rt.config.intra_op_threads, os.cpu_count() > 1)\n"
    )
    model = str(Path(__file__).resolve().parents[3] / "agent" / "demo" / "demo_detector.onnx")
    proc = subprocess.run([sys.executable, "-c", script, model], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "[(1,", "1)]", "1", "True"], proc.stdout
