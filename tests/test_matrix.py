"""The optimisation matrix (`edge-agent bench BUNDLE --matrix`), autotune at activation and the
daemon's report on ``<device>/report``, on real ONNX Runtime and LiteRT (TensorRT rows through the
test double where it matters)."""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from agent.bundles.archive import Limits, build_bundle, unpack, verify_unpacked
from agent.bundles.install import InstallPolicy, install
from agent.bundles.store import Store
from agent.bundles.tuning import Tuning, autotune, candidates, reference_of, with_engines, worker_variants
from agent.cli import main
from agent.config.models import PipelineSection
from agent.hardware.probe import probe
from agent.serving.cameras import Cameras
from pipelines.detections import Detections
from pipelines.matrix import Row, choose, measure, measure_isolated
from pipelines.parity import detection_agreement, max_abs_error
from runtimes import isolation
from runtimes.base import TensorSpec
from runtimes.isolation import ChildRunner
from runtimes.litert_backend import LiteRTConfig
from runtimes.registry import RuntimeSettings
from runtimes.tensorrt_backend import TensorRTConfig
from tests.conftest import DEMO_MODELS
from tests.mqtt_tools import AgentProcess, Broker, Watcher, agent_config, wait_until
from tests.test_isolation import standin_env
from tests.trt_double import TrtDouble, trt_double

__all__ = ["trt_double"]

ROW_FIELDS = {"runtime", "provider", "artifact", "precision", "latency_ms", "fps", "rss_mb", "energy_mj_per_frame"}


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("matrix") / "demo.bundle"
    models = [DEMO_MODELS / "demo_detector.onnx", DEMO_MODELS / "demo_detector_int8.tflite"]
    build_bundle(models, out, name="demo", version="1.0.0")
    return out


@pytest.fixture
def unpacked(tmp_path: Path, demo_bundle: Path):
    folder = tmp_path / "demo"
    folder.mkdir()
    unpack(demo_bundle, folder, Limits())
    return verify_unpacked(folder, (), allow_unsigned=True)


def boxes(*rows: tuple[float, float, float, float, int]) -> Detections:
    return Detections.from_arrays([r[:4] for r in rows], [0.9] * len(rows), [r[4] for r in rows])


@pytest.mark.parametrize(
    ("found", "reference", "agreement"),
    [
        (boxes(), boxes(), 1.0),
        (boxes((0, 0, 10, 10, 1)), boxes((0, 0, 10, 10, 1)), 1.0),
        (boxes((1, 1, 11, 11, 1)), boxes((0, 0, 10, 10, 1)), 1.0),  # IoU 0.68
        (boxes((5, 5, 15, 15, 1)), boxes((0, 0, 10, 10, 1)), 0.0),  # IoU 0.14
        (boxes((0, 0, 10, 10, 2)), boxes((0, 0, 10, 10, 1)), 0.0),  # another label
        (boxes((0, 0, 10, 10, 1), (20, 20, 30, 30, 1)), boxes((0, 0, 10, 10, 1)), 0.5),  # one extra box
        (boxes(), boxes((0, 0, 10, 10, 1)), 0.0),
    ],
)
def test_detection_agreement(found: Detections, reference: Detections, agreement: float) -> None:
    assert detection_agreement(found, reference) == agreement


def test_max_abs_error_dequantizes_and_refuses_other_shapes() -> None:
    from runtimes.base import Quantization

    spec = TensorSpec("out", (1, 3), np.dtype(np.int8), quantization=Quantization(0.5, 0))
    got, want = np.array([[2, 4, 6]], np.int8), np.array([[2, 4, 8]], np.int8)
    assert max_abs_error([got], [want], [spec]) == 1.0
    assert max_abs_error([got], [np.zeros((1, 4), np.int8)], [spec]) is None


def _row(fps: float | None, p95: float = 10.0, within: float = 1.0, error: str | None = None, w: int = 1) -> Row:
    return Row("onnxruntime", "CPU", f"m{fps}.onnx", "fp32", w, None, {"p50": p95 / 2, "p95": p95}, fps,
               parity={"within_tolerance": within}, error=error)  # fmt: skip


def test_choose_the_fastest_within_tolerance_and_latency() -> None:
    rows = [_row(50), _row(90, p95=40), _row(120, within=0.5), _row(None, error="not installed"), _row(70, w=2)]
    best, why = choose(rows, 0.99)
    assert best is rows[1] and "fastest of 3 qualifying" in why
    best, why = choose(rows, 0.99, max_latency_ms=20)
    assert best is rows[4] and "p95 <= 20" in why
    best, why = choose(rows[2:4], 0.99)
    assert best is None
    assert "parity 0.5 below 0.99" in why and "not installed" in why


def test_candidates_cover_every_runtime_and_say_why_not(unpacked) -> None:
    folder, manifest = unpacked.folder, unpacked.manifest
    settings = RuntimeSettings(litert=LiteRTConfig(delegate=Path("/nonexistent/libedgetpu.so.1")))
    found = candidates(folder, manifest, probe(), settings, variants=True)
    table = [(c.runtime, c.provider, c.artifact, c.precision, c.workers, c.unavailable is None) for c in found]
    variants = worker_variants(os.cpu_count() or 1)
    assert table == [
        ("tensorrt", "GPU", "demo_detector.onnx", "fp32", 1, False),
        ("tensorrt", "GPU", "demo_detector.onnx", "fp16", 1, False),
        ("tensorrt", "GPU", "demo_detector.onnx", "int8", 1, False),
        *[("onnxruntime", "CPUExecutionProvider", "demo_detector.onnx", "fp32", w, True) for w, _ in variants],
        ("litert", "xnnpack", "demo_detector_int8.tflite", "int8", 1, True),
        ("litert", "libedgetpu.so.1", "demo_detector_int8.tflite", "int8", 1, True),
    ]
    assert "tensorrt (JetPack / TensorRT wheel) is not installed" in (found[0].unavailable or "")
    reference = reference_of(folder, manifest, unpacked.reference)
    assert reference.reference_artifact == "demo_detector.onnx" and len(reference.detections) > 0
    row = measure_isolated(found[-1], reference, 5)
    assert row.error is not None and "cannot load LiteRT delegate /nonexistent/libedgetpu.so.1" in row.error


def test_bench_matrix_json_has_a_row_for_everything(demo_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(demo_bundle), "--matrix", "--json", "--frames", "10"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3 + len(worker_variants(os.cpu_count() or 1)) + 1
    for row in rows:
        assert set(row) >= ROW_FIELDS and row["energy_mj_per_frame"] is None
        if row["runtime"] == "tensorrt":
            assert row["latency_ms"] is None and "not installed" in row["error"]
            continue
        assert row["error"] is None, row
        assert row["latency_ms"]["p95"] >= row["latency_ms"]["p50"] > 0 and row["fps"] > 0
        assert 30 < row["rss_mb"] < 1000
        assert row["parity"]["max_abs_err"] < 1e-3 and row["parity"]["within_tolerance"] == 1.0
    tflite = next(r for r in rows if r["runtime"] == "litert")
    assert 0.5 <= tflite["parity"]["detection_agreement"] <= 1.0, "the INT8 model against the FP32 one"
    assert main(["bench", str(demo_bundle), "--matrix", "--frames", "5"]) == 0
    table = capsys.readouterr().out
    assert "autotune would serve:" in table and "p50 ms" in table.splitlines()[1]


def test_an_isolated_row_that_dies_or_hangs_says_so(unpacked) -> None:
    folder, manifest = unpacked.folder, unpacked.manifest
    reference = reference_of(folder, manifest, unpacked.reference)
    candidate = next(c for c in candidates(folder, manifest, probe(), RuntimeSettings()) if c.runtime == "onnxruntime")
    died = measure_isolated(candidate, reference, 5, energy=functools.partial(os._exit, 3))
    assert died.error == "the measuring process died (exit code 3)"
    hung = measure_isolated(candidate, reference, 5, energy=functools.partial(time.sleep, 60), timeout_s=1.0)
    assert hung.error == "timed out after 1 s"


def test_tensorrt_rows_are_built_then_measured(trt_double: TrtDouble, unpacked, tmp_path: Path) -> None:
    folder, manifest = unpacked.folder, unpacked.manifest
    settings = RuntimeSettings(tensorrt=TensorRTConfig(engine_cache_dir=tmp_path / "engines"))
    found = with_engines(candidates(folder, manifest, probe(), settings), folder, manifest)
    trt = [c for c in found if c.runtime == "tensorrt"]
    assert [c.unavailable is None for c in trt] == [True, True, False]
    assert trt[2].unavailable == "int8 needs a Q/DQ model or calibration images in the bundle"
    reference = reference_of(folder, manifest, unpacked.reference)
    fp32, fp16 = (measure(c, reference, 5) for c in trt[:2])
    assert fp32.error is None and fp32.parity["max_abs_err"] == 0.0 and fp32.parity["within_tolerance"] == 1.0
    assert 0 < fp16.parity["max_abs_err"] < 0.05 and fp16.parity["detection_agreement"] == 1.0
    assert fp16.provider == "Orin (test double) (sm 8.7)"


def test_autotune_at_activation_is_recorded_and_served(
    tmp_path: Path, keys: dict[str, Path], demo_bundle: Path
) -> None:
    store = Store(tmp_path / "state")
    policy = InstallPolicy(allow_unsigned=True, autotune=True, autotune_frames=10)
    deployment = install(demo_bundle, store, probe(), policy)
    assert deployment.state == "SUCCEEDED", deployment.error
    assert deployment.tuning is not None and len(deployment.tuning["rows"]) >= 5
    tuning = Tuning.from_json(store.tuning(deployment.sha256) or {})
    assert tuning is not None and tuning.to_json() == deployment.tuning["choice"]
    assert json.loads((store.root / "deployment.json").read_text())["tuning"]["choice"] == tuning.to_json()

    fixed = Tuning("onnxruntime", "CPUExecutionProvider", "demo_detector.onnx", "fp32", 1, 2, 100.0, 9.0, "test")
    section = PipelineSection(name="cam", source="synthetic:1", fps=30)
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
    assert deployment.state == "SUCCEEDED" and deployment.tuning["choice"] is None, "nothing is that fast: policy"


def test_autotune_checks_each_configuration_in_a_child_first(unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library that crashes on an artifact kills a check process, not the agent: its rows say
    so and autotune chooses among the others (stand-in: an onnxruntime whose loads die by SIGILL
    in the check processes only; this process has the real one)."""
    monkeypatch.setattr(isolation, "PROCESS_RUNNER", ChildRunner(env=standin_env("crash_on_load")))
    tuning, rows = autotune(unpacked.folder, unpacked.manifest, unpacked.reference, probe(), RuntimeSettings(), 5)
    ort = [row for row in rows if row.runtime == "onnxruntime"]
    assert ort and all("RuntimeCrashed" in (row.error or "") and "SIGILL" in (row.error or "") for row in ort)
    assert tuning is not None and tuning.runtime == "litert"


def test_the_daemon_publishes_its_report_and_the_tuning(
    tmp_path: Path, keys: dict[str, Path], demo_bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = Broker(tmp_path / "broker").start()
    watcher = Watcher(broker, ["edge/#"])
    deployments = {"autotune": True, "report": True, "report_frames": 5, "autotune_frames": 5}
    agent = AgentProcess(agent_config(tmp_path, broker, "dev1", None, deployments=deployments)).start()
    try:
        watcher.wait_json("edge/dev1/status", lambda d: d["state"] == "online", 60)
        assert main(["fleet", "push", str(demo_bundle), "--target", "device:dev1", "--broker", broker.url]) == 0
        record = watcher.wait_json("edge/dev1/deployment", lambda d: d["state"] == "SUCCEEDED", 120)
        choice = record["tuning"]["choice"]
        assert choice is not None and choice["runtime"] in ("onnxruntime", "litert")
        report = watcher.wait_json("edge/dev1/report", lambda d: len(d["rows"]) > 0, 120)
        assert report["bundle"]["name"] == "demo" and report["choice"] == choice
        assert {r["runtime"] for r in report["rows"]} == {"tensorrt", "onnxruntime", "litert"}
        assert watcher.wait_json("edge/dev1/status", lambda d: d.get("runtime") == choice["runtime"], 60)
    finally:
        agent.stop()
        watcher.close()
        broker.stop()


def test_bench_workers_auto_takes_the_faster_measured_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(DEMO_MODELS / "demo_detector.onnx"), "--frames", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    measured = report["workers_auto_fps"]
    assert set(measured) == {str(w) for w, _ in worker_variants(os.cpu_count() or 1)}
    assert report["workers"] == int(max(measured, key=measured.__getitem__))
    assert main(["bench", str(DEMO_MODELS / "demo_detector_int8.tflite"), "--frames", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["workers"] == 1 and "workers_auto_fps" not in report, "LiteRT serves one call at a time"


def test_an_isolated_row_reports_its_own_peak_memory(unpacked) -> None:
    """ru_maxrss survives exec on Linux: a spawned process would report its parent's memory."""
    folder, manifest = unpacked.folder, unpacked.manifest
    reference = reference_of(folder, manifest, unpacked.reference)
    candidate = next(c for c in candidates(folder, manifest, probe(), RuntimeSettings()) if c.runtime == "litert")
    ballast = np.ones(600 << 20, np.uint8)  # 600 MB resident here while the row's process starts
    row = measure_isolated(candidate, reference, 5)
    assert ballast[-1] == 1 and row.rss_mb is not None and row.rss_mb < 400, row.rss_mb
