"""`agent.serving.cameras`: the daemon's cameras serve, swap, restart and share one model; the IoU
threshold from the manifest; each camera's own thresholds and classes on one shared model,
through a hot swap and the lighter artifact; pipe sources."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.bundles import install_versions
from testkit.net import wait_until
from testkit.onnx_models import two_overlapping_boxes

from agent.bundles.archive import build_bundle
from agent.bundles.installer import InstallPolicy, install
from agent.bundles.manifest import DetectionThresholds
from agent.bundles.signing import load_private_key, load_public_key
from agent.bundles.store import Store
from agent.config.models import CameraSection, ServingSection
from agent.config.recipes import recipe
from agent.hardware.board import probe
from agent.serving.cameras import Cameras
from agent.serving.loader import open_detector
from pipelines.decoding.detector import Detector
from pipelines.shared_model import CameraModel
from runtimes.registry import load_runtime


def test_the_daemons_cameras_on_pipe_sources(
    gst: str, tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path], caplog
) -> None:
    """A gst: camera runs beside the Jetson CSI recipe, which this machine cannot run: the
    missing elements are logged at start and gst-launch's own words are in the camera's status."""
    versions = install_versions(tmp_path / "state", keys, bundles)
    csi = recipe("jetson-csi")
    assert csi is not None
    sections = [
        CameraSection(name="test", source="gst:videotestsrc is-live=true ! video/x-raw,width=320,height=240"),
        CameraSection(name="csi", source=csi.source),
    ]
    cameras = Cameras(sections, probe(), "auto", options=ServingSection(stall_timeout_s=5))
    try:
        cameras.activate(versions[0])
        wait_until(lambda: cameras.get("test").frames > 3, 60, "frames from gst-launch-1.0")
        status = wait_until(
            lambda: (s := cameras.get("csi").source_status.snapshot()).error and s, 60, "the CSI camera's failure"
        )
    finally:
        cameras.stop()
    assert "pipeline csi: GStreamer element nvarguscamerasrc is not installed" in caplog.text
    assert status.error is not None and "gst-launch-1.0 exited with code 1" in status.error
    assert any('no element "nvarguscamerasrc"' in line for line in status.output)
    assert cameras.stats() == []


def test_cameras_serve_swap_and_restart(tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]) -> None:
    versions = install_versions(tmp_path / "state", keys, bundles)
    events: list[tuple[str, int]] = []
    sections = [
        CameraSection(name="a", source="synthetic:1", fps=30),
        CameraSection(name="b", source="synthetic:2"),
    ]
    cameras = Cameras(sections, probe(), "auto", lambda name: lambda frame, found: events.append((name, len(found))))
    try:
        cameras.activate(versions[0])
        wait_until(lambda: all(s.frames > 5 for s in cameras.stats()), 30, "frames on both cameras")
        assert {name for name, _ in events} == {"a", "b"} and max(n for _, n in events) > 0
        assert [s.runtime for s in cameras.stats()] == ["onnxruntime", "onnxruntime"]
        assert cameras.label(1) == "square"

        before = cameras.get("a").frames
        cameras.activate(versions[1])  # the int8 TFLite version, swapped in between frames
        wait_until(lambda: all(s.runtime == "litert" for s in cameras.stats()), 30, "the swap")
        assert cameras.get("a").frames > before and cameras.get("a").swaps == 1

        jpeg = cameras.get(None).snapshot()
        assert jpeg is not None
        image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == (480, 640, 3)

        assert cameras.restart("b") == ["b"]
        wait_until(lambda: cameras.get("b").frames > 3, 30, "frames after the restart")
        assert cameras.get("b").stats().runtime == "litert", "a restart keeps the serving model"
    finally:
        cameras.stop()
    assert cameras.stats() == []


def test_camera_workers_follow_the_runtime(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path], caplog
) -> None:
    """Two workers on ONNX Runtime (one intra-op thread each on 2 cores); a deployment to the
    LiteRT version restarts the camera with one worker instead of swapping, and back again."""
    versions = install_versions(tmp_path / "state", keys, bundles)
    cameras = Cameras([CameraSection(name="a", source="synthetic:1", fps=30, workers=2)], probe(), "auto")
    try:
        cameras.activate(versions[0])
        first = cameras.get("a")
        wait_until(lambda: first.frames > 5, 30, "frames with two workers")
        assert first.workers == 2 and first.stats().runtime == "onnxruntime"
        threads = first.detector.runtime._session.get_session_options().intra_op_num_threads
        assert threads == max(1, (os.cpu_count() or 1) // 2)

        cameras.activate(versions[1])
        second = cameras.get("a")
        assert second is not first and second.workers == 1 and second.stats().runtime == "litert"
        assert "litert serves one frame at a time; running 1 worker instead of 2" in caplog.text
        wait_until(lambda: second.frames > 3, 30, "frames after the restart")

        cameras.activate(versions[0])
        assert cameras.get("a").workers == 2
    finally:
        cameras.stop()


@pytest.mark.install
def test_the_iou_threshold_reaches_the_cameras_from_the_manifest(tmp_path: Path, constant_model, keys) -> None:
    model = two_overlapping_boxes(constant_model)
    store = Store(tmp_path / "state")
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])])
    counts = []
    for version, iou in (("1.0.0", 0.45), ("1.1.0", 0.7)):
        built = tmp_path / f"{version}.bundle"
        key = load_private_key(keys["private"])
        thresholds = DetectionThresholds(iou=iou)
        build_bundle([model], built, name="pair", version=version, decoder="yolov8", key=key, thresholds=thresholds)
        deployment = install(built, store, probe(), policy)
        assert deployment.state == "SUCCEEDED", deployment.error
        loaded = open_detector(store.versions / deployment.sha256, probe())
        assert loaded.detector.iou == iou
        counts.append(len(loaded.detector.detect(np.full((64, 64, 3), 114, np.uint8))))
    assert counts == [1, 2]


def camera_sections(count: int) -> list[CameraSection]:
    return [CameraSection(name=f"cam{i}", source=f"synthetic:{i + 1}", fps=10) for i in range(count)]


def test_four_cameras_hold_one_runtime_and_get_their_own_results(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """One runtime object serves the four cameras; each camera's detections are those of its
    own frames (checked against a model of its own on the same images)."""
    versions = install_versions(tmp_path / "state", keys, bundles)
    seen: dict[str, list] = {f"cam{i}": [] for i in range(4)}
    lock = threading.Lock()

    def sink_for(name: str):
        def sink(frame, detections) -> None:
            with lock:
                if len(seen[name]) < 5:
                    seen[name].append((frame.image.copy(), detections))

        return sink

    cameras = Cameras(camera_sections(4), probe(), "auto", sink_for)
    try:
        cameras.activate(versions[0])  # v1: INT8 Q/DQ ONNX with a dynamic batch axis
        wait_until(lambda: all(len(found) == 5 for found in seen.values()), 60, "five frames on every camera")
        holds = [cameras.get(f"cam{i}").detector for i in range(4)]
        assert all(isinstance(hold, CameraModel) for hold in holds)
        assert len({id(hold.runtime) for hold in holds}) == 1 and len({id(hold.shared) for hold in holds}) == 1
        assert {s.shared_by for s in cameras.stats()} == {4}
        runtime = holds[0].runtime
    finally:
        cameras.stop()
    assert runtime._session is None, "stopping the cameras closed the shared model"
    own = Detector(load_runtime("onnxruntime", runtime.model_path))
    for name, found in seen.items():
        for image, detections in found:
            alone = own.detect(image)
            assert len(alone) == len(detections), name
            np.testing.assert_allclose(alone.xyxy, detections.xyxy, atol=0.5)
            assert list(alone.class_id) == list(detections.class_id)
    assert not np.array_equal(seen["cam0"][0][0], seen["cam1"][0][0]), "each camera sees its own scene"
    own.close()


def test_hot_swap_and_rollback_replace_the_shared_model_of_every_camera(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    versions = install_versions(tmp_path / "state", keys, bundles)
    cameras = Cameras(camera_sections(3), probe(), "auto")
    names = [f"cam{i}" for i in range(3)]
    try:
        cameras.activate(versions[0])
        wait_until(lambda: all(s.frames > 2 for s in cameras.stats()), 60, "frames on v1")
        first = cameras.get("cam0").detector.shared
        cameras.activate(versions[1])  # the INT8 TFLite version, swapped in between frames
        wait_until(lambda: all(s.runtime == "litert" and s.frames > 0 for s in cameras.stats()), 60, "v2 everywhere")
        second = cameras.get("cam0").detector.shared
        assert second is not first and {id(cameras.get(n).detector.shared) for n in names} == {id(second)}
        wait_until(lambda: first.closed, 30, "v1's model closed once its last camera let go")
        before = {n: cameras.get(n).frames for n in names}
        cameras.activate(versions[0])  # a rollback: the same path back
        wait_until(lambda: all(s.runtime == "onnxruntime" for s in cameras.stats()), 60, "v1 again")
        wait_until(lambda: second.closed, 30, "v2's model closed")
        assert all(cameras.get(n).swaps == 2 and cameras.get(n).frames >= before[n] for n in names)
        assert [p.name for p in cameras.stats()] == names, "the same pipelines: capture never stopped"
    finally:
        cameras.stop()


def test_pause_cap_and_separate_models_still_work(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    versions = install_versions(tmp_path / "state", keys, bundles)
    cameras = Cameras(camera_sections(2), probe(), "auto", options=ServingSection(share_model=False))
    try:
        cameras.activate(versions[0])
        runtimes = {id(cameras.get(f"cam{i}").detector.runtime) for i in range(2)}
        assert len(runtimes) == 2, "share_model: false loads a model per camera"
        assert {s.shared_by for s in cameras.stats()} == {1}
    finally:
        cameras.stop()
    shared = Cameras(camera_sections(2), probe(), "auto")
    try:
        shared.activate(versions[0])
        wait_until(lambda: all(s.frames > 2 for s in shared.stats()), 60, "frames")
        shared.govern(fps_cap=2, paused=True)
        assert all(s.paused and s.max_fps == 2 for s in shared.stats())
        shared.govern(fps_cap=None, paused=False)
        counts = [s.frames for s in shared.stats()]
        wait_until(lambda: all(s.frames > c for s, c in zip(shared.stats(), counts, strict=True)), 60, "resumed")
    finally:
        shared.stop()


def install_demo(store: Store, keys: dict[str, Path], tmp_path: Path, version: str, conf: float, *models: str) -> Path:
    """A signed demo version of `models` whose manifest says `conf`, installed; its folder."""
    built = tmp_path / f"demo-{version}.bundle"
    key = load_private_key(keys["private"])
    paths = [DEMO_MODELS / m for m in models]
    build_bundle(paths, built, name="demo", version=version, key=key, thresholds=DetectionThresholds(conf=conf))
    deployment = install(built, store, probe(), InstallPolicy(trusted=[load_public_key(keys["public"])]))
    assert deployment.state == "SUCCEEDED", deployment.error
    return store.versions / deployment.sha256


class Seen:
    """Each camera's detections since the last `clear` (the pipelines' sinks, any thread)."""

    def __init__(self, names: list[str]) -> None:
        self.names, self._lock = names, threading.Lock()
        self.clear()

    def clear(self) -> None:
        with self._lock:
            self.found: dict[str, list] = {name: [] for name in self.names}

    def sink_for(self, name: str):
        def sink(frame, detections) -> None:
            with self._lock:
                self.found[name].append(detections)

        return sink

    def scores(self, name: str) -> list[float]:
        with self._lock:
            return [float(s) for d in self.found[name] for s in d.confidence]

    def classes(self, name: str) -> set[int]:
        with self._lock:
            return {int(c) for d in self.found[name] for c in d.class_id}


@pytest.mark.slow
def test_cameras_sharing_one_model_keep_their_own_thresholds_through_the_lighter_artifact_and_a_swap(
    tmp_path: Path, keys: dict[str, Path]
) -> None:
    """Three cameras on one scene, one shared (batched) model: `low` keeps the manifest's conf,
    `high` its own 0.95, `squares` only squares. The governor's lighter artifact and a
    deployment of a version whose manifest says conf 0.5 keep each camera's own settings; the
    manifest's reach `low` only."""
    store = Store(tmp_path / "state")
    first = install_demo(store, keys, tmp_path, "2.0.0", 0.3, "demo_detector.onnx", "demo_detector_int8.tflite")
    second = install_demo(store, keys, tmp_path, "2.1.0", 0.5, "demo_detector_int8_qdq.onnx")
    sections = [
        CameraSection(name="low", source="synthetic:2", fps=15),
        CameraSection(name="high", source="synthetic:2", fps=15, conf=0.95),
        CameraSection(name="squares", source="synthetic:2", fps=15, classes=["square"]),
    ]
    seen = Seen(["low", "high", "squares"])
    cameras = Cameras(sections, probe(), "auto", seen.sink_for, options=ServingSection(batch_wait_ms=300))

    def check(low_conf: float, runtime: str) -> None:
        seen.clear()
        wait_until(
            lambda: (
                any(low_conf < s <= 0.95 for s in seen.scores("low"))
                and all(len(seen.found[n]) >= 10 for n in seen.names)
                and seen.classes("low") - {1}
            ),
            60,
            f"a detection between {low_conf} and 0.95, and other classes than squares, on {runtime}",
        )
        assert min(seen.scores("low")) > low_conf, "low keeps the manifest's conf"
        assert min(seen.scores("high")) > 0.95, "high keeps its own conf"
        assert seen.classes("squares") == {1}, "squares keeps squares only"
        assert {s.runtime for s in cameras.stats()} == {runtime}

    try:
        cameras.activate(first)
        check(0.3, "onnxruntime")
        holds = [cameras.get(s.name).detector for s in sections]
        assert all(isinstance(h, CameraModel) for h in holds) and len({id(h.shared) for h in holds}) == 1
        assert holds[0].shared.stats().mean_batch > 1, "the cameras' frames were batched"
        assert [(t.camera, t.conf, t.classes, t.configured) for t in cameras.thresholds()] == [
            ("low", 0.3, None, ()),
            ("high", 0.95, None, ("conf",)),
            ("squares", 0.3, ("square",), ("classes",)),
        ]

        assert cameras.use_lighter(True)
        wait_until(lambda: all(s.runtime == "litert" for s in cameras.stats()), 60, "the lighter artifact")
        check(0.3, "litert")

        assert cameras.use_lighter(False)
        cameras.activate(second)
        wait_until(lambda: cameras.thresholds()[0].conf == 0.5, 60, "the new version's conf on low")
        check(0.5, "onnxruntime")
        in_force = [(t.conf, t.iou, t.max_det) for t in cameras.thresholds()]
        assert in_force == [(0.5, 0.45, 300), (0.95, 0.45, 300), (0.5, 0.45, 300)]
    finally:
        cameras.stop()
    assert cameras.thresholds() == []


def test_cameras_with_models_of_their_own_keep_their_own_thresholds(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    versions = install_versions(tmp_path / "state", keys, bundles)
    sections = [
        CameraSection(name="low", source="synthetic:2", fps=15),
        CameraSection(name="high", source="synthetic:2", fps=15, conf=0.95, classes=["circle", "square"]),
    ]
    seen = Seen(["low", "high"])
    cameras = Cameras(sections, probe(), "auto", seen.sink_for, options=ServingSection(share_model=False))
    try:
        cameras.activate(versions[0])
        wait_until(
            lambda: any(0.25 < s <= 0.95 for s in seen.scores("low")) and 2 in seen.classes("low"),
            60,
            "a detection between 0.25 and 0.95 and a triangle on low",
        )
        wait_until(lambda: len(seen.found["high"]) >= 10, 60, "frames on high")
        assert len({id(cameras.get(s.name).detector.runtime) for s in sections}) == 2
        assert min(seen.scores("low")) > 0.25 and min(seen.scores("high")) > 0.95
        assert seen.classes("high") <= {0, 1}
        assert cameras.thresholds()[1].classes == ("circle", "square")
    finally:
        cameras.stop()


@pytest.mark.slow
def test_a_camera_with_motion_enabled_is_gated_and_its_keepalive_asks_its_tracker(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """agent.yaml's ``cameras[].motion`` reaches the camera's pipeline: a still clip is mostly
    let through uninferred there, while the camera beside it without ``motion`` infers every
    frame; the gate asks the daemon's tracker of that camera (`tracks_alive_for`)."""
    from testkit.motion_clips import still_scene
    from testkit.real_models import write_clip

    clip = write_clip(tmp_path / "still.avi", still_scene().frames(100), fps=10.0)
    versions = install_versions(tmp_path / "state", keys, bundles)
    asked: list[str] = []

    def tracks_alive_for(name: str):  # type: ignore[no-untyped-def]
        asked.append(name)
        return lambda: False

    motion = {"enabled": True, "idle_interval_s": 5.0, "regions": True, "full_frame_interval_s": 3.0}
    sections = [
        CameraSection.model_validate({"name": "gated", "source": str(clip), "max_fps": 200, "motion": motion}),
        CameraSection.model_validate({"name": "plain", "source": str(clip), "max_fps": 200}),
    ]
    cameras = Cameras(sections, probe(), "onnxruntime", tracks_alive_for=tracks_alive_for)
    try:
        cameras.activate(versions[0])
        gated, plain = cameras.get("gated"), cameras.get("plain")
        wait_until(lambda: gated.stats().frames >= 150 and plain.stats().frames >= 150, 120, "frames on both")
        assert gated.gating is not None and plain.gating is None
        assert gated.gating.detector.settings.width == 320 and gated.gating.gate.idle_interval_s == 5.0
        assert gated.gating.gate.track_hold_frames == 30, "the camera's tracker's lost_frames"
        assert gated.regions is not None and gated.regions.full_frame_interval_s == 3.0 and plain.regions is None
        stats = gated.stats()
    finally:
        cameras.stop()
    assert asked == ["gated"], "only the gated camera asks for its tracker"
    assert stats.inferred is not None and stats.inferred < stats.frames, stats
    assert stats.gate is not None and stats.gate.inferred_ratio < 0.9
    assert plain.stats().inferred is None and plain.stats().gate is None


def test_a_gated_cameras_motion_view_has_its_newest_regions_and_its_masks_in_frame_pixels() -> None:
    """What the status page draws (`motion_view`): a square that moved on a 1280x720 frame (the
    detector judges a 320-wide copy) is a region around it in frame pixels, beside agent.yaml's
    mask and the gate's ratios; before a frame, none."""
    from agent.config.models import MotionSection
    from agent.serving.cameras import motion_view
    from pipelines.gating import Gating
    from pipelines.motion import MotionDetector
    from pipelines.motion_gate import MotionGate

    mask = [[0.0, 0.0], [200.0, 0.0], [200.0, 100.0]]
    section = CameraSection(name="yard", source="synthetic", motion=MotionSection(enabled=True, masks=[mask]))
    assert section.motion is not None
    gating = Gating(MotionDetector(section.motion.settings()), MotionGate())
    before = motion_view(section, gating)
    polygon = ((0.0, 0.0), (200.0, 0.0), (200.0, 100.0))
    assert (before.regions, before.masks, before.changed) == ((), (polygon,), 0.0)
    still = np.full((720, 1280, 3), 90, np.uint8)
    moved = still.copy()
    moved[400:560, 800:960] = 250
    gating.admit(still, 0.0)
    gating.admit(moved, 0.1)
    view = motion_view(section, gating)
    ((x0, y0, x1, y1),) = view.regions
    assert abs(x0 - 800) <= 12 and abs(y0 - 400) <= 12 and abs(x1 - 960) <= 12 and abs(y1 - 560) <= 12, view.regions
    assert view.masks == (polygon,) and view.camera == "yard"
    assert 0 < view.changed < 0.1 and not view.recalibrated and view.inferred_ratio == 1.0


def test_the_governor_slows_a_gated_camera_and_caps_only_the_plain_one_even_on_a_later_start(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """`govern` before the cameras start (a restart, a deployment) reaches them when they do: the
    gated camera's gate slowed and its FPS left to `gated_fps_cap`, the plain one capped."""
    versions = install_versions(tmp_path / "state", keys, bundles)
    motion = {"enabled": True, "idle_interval_s": 2.0, "keepalive_fps": 2.0}
    sections = [
        CameraSection.model_validate({"name": "gated", "source": "synthetic", "max_fps": 8, "motion": motion}),
        CameraSection.model_validate({"name": "plain", "source": "synthetic", "max_fps": 8}),
    ]
    cameras = Cameras(sections, probe(), "onnxruntime")
    try:
        cameras.govern(fps_cap=3, paused=False, gated_fps_cap=None, gate_slowdown=4.0)
        cameras.activate(versions[0])
        gated, plain = cameras.get("gated"), cameras.get("plain")
        assert gated.gating is not None and gated.gating.gate.idle_interval_in_force_s == 8.0
        assert (gated.max_fps, plain.max_fps, plain.gating) == (8, 3, None)
        cameras.govern(fps_cap=3, paused=False, gated_fps_cap=5, gate_slowdown=2.0)
        assert (gated.max_fps, gated.gating.gate.keepalive_fps_in_force) == (5, 1.0)
        cameras.govern(fps_cap=None, paused=False)  # cooled: as configured
        assert (gated.gating.gate.slowdown, gated.max_fps, plain.max_fps) == (1.0, 8, 8)
    finally:
        cameras.stop()
