"""`agent.serving.shadow`: a candidate version beside the serving one on a synthetic camera (real
ONNX Runtime, real `Pipeline`): the same version agrees with itself under each camera's own
filter; the rest after each inference skips the frames offered meanwhile; a candidate that
raises is counted, compares as finding nothing, and the thread goes on; no camera, no shadow."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from testkit import DEMO_MODELS
from testkit.bundles import bundle_of, install_versions, new_version
from testkit.net import wait_until
from testkit.real_models import COCO_MODEL, WRONG, photo_frame, write_clip, wrong_versions

from agent.bundles.installer import InstallPolicy, install
from agent.bundles.signing import load_public_key
from agent.bundles.store import Store
from agent.config.models import CameraSection, ShadowSection
from agent.deployment.quality import ShadowJudge, ShadowPlan, agreement_record, passes, shadow_plan
from agent.errors import BundleError, ErrorCode
from agent.hardware.board import probe
from agent.mqtt.quality_request import ShadowRequest
from agent.serving.cameras import Cameras
from agent.serving.loader import open_detector
from agent.serving.shadow import ShadowCamera, ShadowSession, disagree, one_thread, rest_s
from pipelines.decoding.detection_filter import DetectionFilter
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import CameraDetector
from pipelines.measure.comparison import AgreementReport
from pipelines.sources.synthetic import CLASS_NAMES, SyntheticScene
from runtimes.ort_settings import OnnxRuntimeConfig
from runtimes.registry import RuntimeSettings


def shadow_report(
    versions: list[Path], section: CameraSection, share: float, enough: Callable[[AgreementReport], bool], what: str
) -> AgreementReport:
    """`versions[1]` shadowing `versions[0]` on the one camera `section` at `share`, until its
    report is `enough` (`what`, for the timeout's message)."""
    cameras = Cameras([section], probe(), "onnxruntime")
    try:
        cameras.activate(versions[0])
        session = cameras.shadow(versions[1], share=share)

        def ready() -> AgreementReport | None:
            report = session.reports()[section.name]
            return report if enough(report) else None

        try:
            found: AgreementReport = wait_until(ready, 60, what)
        finally:
            session.close()
    finally:
        cameras.stop()
    return found


def test_the_same_version_agrees_with_itself_under_each_cameras_filter(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    versions = install_versions(tmp_path / "state", keys, bundles)
    sections = [
        CameraSection(name="all", source="synthetic:1", fps=30),
        CameraSection(name="circles", source="synthetic:2", fps=30, classes=["circle"], conf=0.4),
    ]
    cameras = Cameras(sections, probe(), "onnxruntime")
    disagreed: list[str] = []
    cameras.shadow_disagreed = lambda name, frame, serving: disagreed.append(name)  # the samples' hook
    try:
        cameras.activate(versions[0])
        session = cameras.shadow(versions[0], share=0.5)
        try:
            reports = wait_until(
                lambda: (r := session.reports()) and all(x.frames >= 8 and x.serving >= 10 for x in r.values()) and r,
                60,
                "frames compared on both cameras",
            )
        finally:
            session.close()
        assert {name: cameras.get(name)._sinks for name in ("all", "circles")} == {"all": [], "circles": []}
    finally:
        cameras.stop()
    for report in reports.values():
        assert report.agreement == pytest.approx(1.0)
        assert report.serving == report.candidate == report.matched
        assert report.serving_ms is not None and report.serving_ms > 0, "the camera's own latency"
        assert report.candidate_ms is not None and report.candidate_ms > 0
    assert {c.class_id for c in reports["circles"].classes} == {0}  # the camera's own classes, both sides
    assert len(reports["all"].classes) > 1
    assert session.failures() == {"all": 0, "circles": 0}
    assert disagreed == []  # no frame of a version against itself is a sample


@pytest.mark.parametrize(
    ("serving", "loaded", "expected"),
    [
        ([], [], False),
        ([(0, 0, 10, 10, 0)], [(0, 0, 10, 10, 0)], False),
        ([(0, 0, 10, 10, 0)], [(1, 1, 10, 10, 0)], False),  # IoU 0.68
        ([(0, 0, 10, 10, 0)], [(0, 0, 10, 10, 1)], True),  # another class
        ([(0, 0, 10, 10, 0)], [], True),  # the loaded one missed it
        ([], [(0, 0, 10, 10, 0)], True),  # the loaded one found more
        ([(0, 0, 10, 10, 0)], [(5, 5, 15, 15, 0)], True),  # IoU 0.14
    ],
)
def test_a_frame_disagrees_when_a_box_of_either_has_no_match(
    serving: list[tuple[int, ...]], loaded: list[tuple[int, ...]], expected: bool
) -> None:
    def of(rows: list[tuple[int, ...]]) -> Detections:
        return Detections.from_arrays([r[:4] for r in rows], [0.9] * len(rows), [r[4] for r in rows])

    assert disagree(of(serving), of(loaded)) is expected


def test_a_frame_the_candidate_disagrees_on_is_handed_to_the_hook(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    versions = install_versions(tmp_path / "state", keys, bundles)
    cameras = Cameras([CameraSection(name="a", source="synthetic:1", fps=30)], probe(), "onnxruntime")
    handed: list[tuple[str, int, int]] = []
    try:
        cameras.activate(versions[0])
        loaded = open_detector(versions[0], probe(), "onnxruntime")
        blind = CameraDetector(loaded.detector, DetectionFilter(conf=0.999, iou=0.45, max_det=100))
        session = ShadowSession(
            loaded.detector,
            {"a": ShadowCamera(cameras.get("a"), blind)},
            1.0,
            disagreed=lambda name, frame, serving: handed.append((name, frame.index, len(serving))),
        ).start()
        try:
            wait_until(lambda: len(handed) >= 2, 60, "frames handed to the samples' hook")
        finally:
            session.close()
    finally:
        cameras.stop()
    assert all(name == "a" and count > 0 for name, _, count in handed)


def test_frames_offered_while_it_rests_are_skipped(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """Each inference "takes" 1 s on the session's clock: at a share of 0.01 it rests 99 s, and
    the frames the camera offers meanwhile are skipped, not compared later. A wake of the thread
    during the rest does not end it: an offer that comes while the thread is taking a frame wakes
    it, and that wake outlives the inference (on a loaded machine it cut the rest short)."""
    versions = install_versions(tmp_path / "state", keys, bundles)
    cameras = Cameras([CameraSection(name="a", source="synthetic:1", fps=30)], probe(), "onnxruntime")
    try:
        cameras.activate(versions[0])
        loaded = open_detector(versions[0], probe(), "onnxruntime")
        candidate = CameraDetector(loaded.detector, cameras.get("a").detector.detection_filter)
        ticks = itertools.count()
        session = ShadowSession(
            loaded.detector, {"a": ShadowCamera(cameras.get("a"), candidate)}, 0.01, clock=lambda: float(next(ticks))
        ).start()
        try:
            wait_until(lambda: session.reports()["a"].frames == 1 and session.skipped >= 5, 60, "frames skipped")
            skipped = session.skipped
            session._worker.wake()  # as an offer made while the thread took its frame does
            wait_until(lambda: session.skipped >= skipped + 60, 60, "60 more frames skipped")
            assert session.reports()["a"].frames == 1, "the rest went on"
        finally:
            session.close()
    finally:
        cameras.stop()
    assert rest_s(0.02, 0.1) == pytest.approx(0.18) and rest_s(0.02, 1.0) == 0.0


class _Failing(CameraDetector):
    def infer(self, tensor: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
        raise RuntimeError("the candidate's runtime broke")


def test_a_candidate_that_raises_is_counted_and_compares_as_blind(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    versions = install_versions(tmp_path / "state", keys, bundles)
    cameras = Cameras([CameraSection(name="a", source="synthetic:1", fps=30)], probe(), "onnxruntime")
    try:
        cameras.activate(versions[0])
        loaded = open_detector(versions[0], probe(), "onnxruntime")
        failing = _Failing(loaded.detector, DetectionFilter(conf=0.25, iou=0.45, max_det=100))
        session = ShadowSession(loaded.detector, {"a": ShadowCamera(cameras.get("a"), failing)}, 1.0).start()
        try:
            report = wait_until(lambda: (r := session.reports()["a"]).frames >= 5 and r.serving and r, 60, "frames")
            assert session.failures()["a"] >= 5
        finally:
            session.close()
    finally:
        cameras.stop()
    assert report.candidate == 0 and report.agreement == 0.0  # a broken candidate never passes as quiet


def test_roles_reversed_the_loaded_version_is_the_reference(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """Probation's agreement check: the loaded (previous) version keeps circles only here, the
    camera (the new version) keeps every class, so the new version's precision falls and its
    recall holds; the loaded one's latency (1 s a frame on the session's clock) is the
    reference's, the camera's own the candidate's. A reference that raises leaves its frames out."""
    versions = install_versions(tmp_path / "state", keys, bundles)
    cameras = Cameras([CameraSection(name="a", source="synthetic:1", fps=30)], probe(), "onnxruntime")
    try:
        cameras.activate(versions[0])
        loaded = open_detector(versions[0], probe(), "onnxruntime")
        circles = CameraDetector(
            loaded.detector, DetectionFilter(conf=0.25, iou=0.45, max_det=100, classes=frozenset({0}))
        )
        ticks = itertools.count()
        session = ShadowSession(
            loaded.detector,
            {"a": ShadowCamera(cameras.get("a"), circles)},
            1.0,
            clock=lambda: float(next(ticks)),
            loaded_is="reference",
        ).start()
        try:
            report = wait_until(
                lambda: (r := session.reports()["a"]).frames >= 5 and r.serving >= 3 and r, 60, "frames"
            )
        finally:
            session.close()
        failing = _Failing(loaded.detector, DetectionFilter(conf=0.25, iou=0.45, max_det=100))
        broken = ShadowSession(
            loaded.detector, {"a": ShadowCamera(cameras.get("a"), failing)}, 1.0, loaded_is="reference"
        ).start()
        try:
            wait_until(lambda: broken.failures()["a"] >= 5, 60, "the reference failing")
            assert broken.reports()["a"].frames == 0
        finally:
            broken.close()
    finally:
        cameras.stop()
    assert report.recall == 1.0 and report.precision < 1.0 and report.candidate > report.serving
    assert {c.class_id for c in report.classes if c.serving} == {0}
    assert report.serving_ms == 1000.0
    assert report.candidate_ms is not None and 0 < report.candidate_ms < 1000


def test_no_camera_serving_is_shadow_unavailable(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    versions = install_versions(tmp_path / "state", keys, bundles)
    with pytest.raises(BundleError) as raised:
        Cameras([], probe()).shadow(versions[0], 0.1)
    assert raised.value.code == ErrorCode.SHADOW_UNAVAILABLE and "no camera is serving" in raised.value.message


def test_the_candidate_runs_on_one_thread() -> None:
    settings = one_thread(RuntimeSettings(onnxruntime=OnnxRuntimeConfig(intra_op_threads=4, spinning=True)))
    ort = settings.of(OnnxRuntimeConfig)
    assert (ort.intra_op_threads, ort.inter_op_threads, ort.spinning) == (1, 1, False)


@pytest.mark.slow
def test_the_shadow_reports_what_bench_against_prints_on_the_same_clip(
    tmp_path: Path, keys: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 38: ``bench --against`` agrees with the daemon's shadow on the same clip. The clip
    is one frame of six shapes, repeated: whichever of its frames the shadow's share lets it
    compare, they are the frames bench compares, so every ratio is the same and every count the
    same per frame. The candidate (testkit's `altered`) names squares triangles and the other
    way round, and scores lower, so one shape falls below its threshold: the numbers are not all
    ones, and precision is not recall."""
    import cv2
    from testkit import DEMO_MODELS
    from testkit.onnx_models import altered

    from agent.bundles.archive import build_bundle
    from agent.bundles.installer import InstallPolicy, install
    from agent.bundles.signing import load_private_key, load_public_key
    from agent.bundles.store import Store
    from agent.cli import main
    from pipelines.sources.synthetic import SyntheticScene

    image = SyntheticScene(width=320, height=240, num_shapes=6, seed=5, size_range=(24, 50)).render(0)[0]
    clip = tmp_path / "still.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter.fourcc(*"MJPG"), 30.0, (320, 240))
    for _ in range(20):
        writer.write(image)
    writer.release()
    key = load_private_key(keys["private"])
    serving, candidate = tmp_path / "demo-1.0.0.bundle", tmp_path / "demo-1.1.0.bundle"
    build_bundle([DEMO_MODELS / "demo_detector.onnx"], serving, name="demo", version="1.0.0", key=key)
    swapped = altered(DEMO_MODELS / "demo_detector.onnx", tmp_path / "swapped.onnx", swap=(1, 2), score_scale=0.29)
    build_bundle([swapped], candidate, name="demo", version="1.1.0", key=key)

    argv = ["--against", str(candidate), "--source", str(clip), "--runtime", "onnxruntime", "--json"]
    assert main(["bench", str(serving), *argv]) == 0
    bench = json.loads(capsys.readouterr().out)["comparison"]

    store = Store(tmp_path / "state")
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])], autotune=False)
    versions = [store.versions / install(b, store, probe(), policy).sha256 for b in (serving, candidate)]
    section = CameraSection(name="still", source=str(clip), loop=True)
    report = shadow_report(versions, section, 1.0, lambda r: r.frames >= 6, "frames compared")
    shadow = asdict(agreement_record(str(clip), report, {0: "circle", 1: "square", 2: "triangle"}.get))
    assert bench["matched"] < bench["candidate"] < bench["serving"], "not all ones, and precision is not recall"
    for key_ in ("precision", "recall", "agreement", "confident_ratio"):
        assert shadow[key_] == bench[key_], key_
    for key_ in ("serving", "candidate", "matched"):
        assert shadow[key_] / shadow["frames"] == bench[key_] / bench["frames"], key_
    per_frame = [
        [
            c["class_id"],
            c["label"],
            c["serving"] / frames,
            c["candidate"] / frames,
            c["matched"] / frames,
            c["agreement"],
        ]
        for side, frames in ((shadow, shadow["frames"]), (bench, bench["frames"]))
        for c in side["classes"]
    ]
    half = len(per_frame) // 2
    assert per_frame[:half] == per_frame[half:] and half > 1


def test_a_camera_restarted_during_the_shadow_keeps_offering_frames(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """A restart (the command, or a new worker count) replaces a camera's pipeline: the shadow
    moves its sink to the new one, or the camera would read as quiet and a bad version pass."""
    versions = install_versions(tmp_path / "state", keys, bundles)
    cameras = Cameras([CameraSection(name="a", source="synthetic:1", fps=30)], probe(), "onnxruntime")
    try:
        cameras.activate(versions[0])
        session = cameras.shadow(versions[0], share=0.5)
        try:
            wait_until(lambda: session.reports()["a"].frames >= 2, 60, "frames compared before the restart")
            old = cameras.get("a")
            cameras.restart("a")
            assert old._sinks == [], "the stopped pipeline lets go of the sink"
            compared = session.reports()["a"].frames
            wait_until(lambda: session.reports()["a"].frames >= compared + 3, 60, "frames compared after the restart")
        finally:
            session.close()
        assert cameras.get("a")._sinks == []
    finally:
        cameras.stop()


# -- the project's real models: the shadow tells each wrong version from a good one (issue 38) --


@dataclass(frozen=True)
class RealModel:
    """A real detector's versions installed in one store, by name, and the camera's two clips:
    the subject's frames, and grey frames of the same size (no object)."""

    versions: dict[str, Path]
    clip: Path
    grey: Path
    frames: int  # frames compared before judging: 30 detections and more, 10 of each class


@pytest.fixture(scope="module")
def real_models(
    request: pytest.FixtureRequest, keys: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], RealModel]:
    """A subject's `RealModel` by name, built once per module."""
    built: dict[str, RealModel] = {}

    def get(name: str) -> RealModel:
        if name not in built:
            built[name] = real_model(name, request, keys, tmp_path_factory.mktemp(f"real-{name}"))
        return built[name]

    return get


def real_model(name: str, request: pytest.FixtureRequest, keys: dict[str, Path], folder: Path) -> RealModel:
    """The demo detector on the synthetic scene (squares, triangles, no circle: circles and
    squares swapped), or YOLOv8n on the tiled photos (person and dog swapped: a person, no dog),
    with the wrong versions, the same network signed again, and for the demo its INT8 variant,
    installed in one store."""
    if name == "demo":
        original, swap = DEMO_MODELS / "demo_detector.onnx", (0, 1)
        scene = SyntheticScene()
        images = [scene.render(i)[0] for i in range(30)]
        models = {"int8": DEMO_MODELS / "demo_detector_int8_qdq.onnx"}
    else:
        original, swap = request.getfixturevalue("shared_models") / COCO_MODEL, (0, 16)
        images = [photo_frame(request.getfixturevalue("photos"))] * 3
        models = {}
    models |= wrong_versions(original, folder, swap)
    serving = bundle_of(original, folder / "original.bundle", keys["private"], version="1.0.0")
    bundles = {
        "original": serving,
        "resigned": new_version(serving, folder / "resigned.bundle", keys["private"], "1.0.1"),
    }
    for i, (model_name, model) in enumerate(models.items()):
        bundles[model_name] = bundle_of(model, folder / f"{model_name}.bundle", keys["private"], version=f"2.0.{i}")
    store = Store(folder / "state", keep=len(bundles))  # every version stays installed
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])], autotune=False)
    versions = {
        name: store.versions / install(bundle, store, probe(), policy).sha256 for name, bundle in bundles.items()
    }
    clip = write_clip(folder / "clip.avi", images)
    grey = write_clip(folder / "grey.avi", [np.full_like(images[0], 114)] * 3)
    return RealModel(versions, clip, grey, frames=12)


def shadowed(real: RealModel, candidate: str, clip: Path) -> dict[str, AgreementReport]:
    """The shadow's reports once `real.frames` frames of `clip` were compared: the original
    version serving a looping camera, `candidate` beside it on every frame."""
    cameras = Cameras([CameraSection(name="cam", source=str(clip), loop=True)], probe(), "onnxruntime")
    try:
        cameras.activate(real.versions["original"])
        session = cameras.shadow(real.versions[candidate], share=1.0)
        try:
            return wait_until(
                lambda: (r := session.reports()) and r["cam"].frames >= real.frames and r, 120, "frames compared"
            )
        finally:
            session.close()
    finally:
        cameras.stop()


def _real(name: str, *cases: tuple[str, str]) -> list[Any]:
    marks = [pytest.mark.slow] if name == "coco" else []
    return [
        pytest.param(name, candidate, outcome, marks=marks, id=f"{name}-{candidate}") for candidate, outcome in cases
    ]


WRONG_AND_GOOD = [(name, "disagrees") for name in WRONG] + [("resigned", "agrees"), ("grey", "quiet")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("subject", "candidate", "outcome"),
    _real("demo", *WRONG_AND_GOOD, ("int8", "agrees")) + _real("coco", *WRONG_AND_GOOD),
)
def test_the_shadow_rejects_each_wrong_version_of_a_real_model(
    real_models: Callable[[str], RealModel], subject: str, candidate: str, outcome: str
) -> None:
    """Under the device's defaults (agreement 0.8, 30 detections), each wrong version disagrees and
    does not pass; the same network signed again, and the demo's INT8 variant, agree; on a grey
    clip (the scaled version as the candidate) the shadow is quiet, which passes by default."""
    real = real_models(subject)
    clip = real.grey if candidate == "grey" else real.clip
    reports = shadowed(real, "score_scale" if candidate == "grey" else candidate, clip)
    plan = shadow_plan(ShadowRequest(frames=real.frames), ShadowSection())
    assert plan is not None and (plan.min_agreement, plan.min_detections) == (0.8, 30)
    record = ShadowJudge(plan, 0.0).verdict(reports, 10.0)
    assert record.outcome == outcome, record.message
    assert passes(record, "pass") == (outcome != "disagrees")
    if outcome == "agrees":
        assert record.cameras[0].agreement >= 0.9 and record.cameras[0].serving >= 30, record.cameras


# -- the second stage: both versions' classifiers on the same crops ------------------------------


def two_stage(folder: Path, keys: dict[str, Path], version: str, labels: tuple[str, ...]) -> Path:
    """The demo detector with the demo shape classifier as its second stage, its classifier
    labels `labels` (CLASS_NAMES rotated: a label order that slipped)."""
    from agent.bundles.archive import ClassifierInput, build_bundle
    from agent.bundles.signing import load_private_key

    out = folder / f"shapes-{version}.bundle"
    stage = ClassifierInput((DEMO_MODELS / "demo_classify.onnx",), labels, for_labels=("square", "triangle"))
    key = load_private_key(keys["private"])
    build_bundle([DEMO_MODELS / "demo_detector.onnx"], out, name="shapes", version=version, key=key, classifier=stage)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("labels", "agrees"), [(CLASS_NAMES, True), (CLASS_NAMES[1:] + CLASS_NAMES[:1], False)])
def test_the_second_stages_top1_is_compared_on_the_same_crops(
    tmp_path: Path, keys: dict[str, Path], labels: tuple[str, ...], agrees: bool
) -> None:
    """A candidate whose classifier labels slipped finds the same boxes (agreement 1.0) and
    names the crops otherwise: the shadow's top-1 agreement fails it."""
    store = Store(tmp_path / "state")
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])])
    versions = []
    for version, names in (("1.0.0", CLASS_NAMES), ("1.1.0", labels)):
        deployment = install(two_stage(tmp_path, keys, version, names), store, probe(), policy)
        assert deployment.state == "SUCCEEDED", deployment.error
        versions.append(store.versions / deployment.sha256)
    section = CameraSection(name="a", source="synthetic:1", fps=30)
    report = shadow_report(versions, section, 0.5, lambda r: r.crops >= 20, "crops classified")
    assert report.agreement == pytest.approx(1.0)
    assert report.top1 is not None and (report.top1 == 1.0) == agrees and (report.top1 < 0.5) != agrees
    plan = ShadowPlan(duration_s=1, frames=None, max_s=1, min_agreement=0.8)
    record = ShadowJudge(plan, 0.0).verdict({"a": report}, 1.0)
    assert record.outcome == ("agrees" if agrees else "disagrees"), record.message
    assert agrees or "camera a: the second stage's top-1 agreement" in record.message
    assert record.cameras[0].crops == report.crops and record.cameras[0].top1 == round(report.top1, 4)
