"""`agent.serving.shadow`: a candidate version beside the serving one on a synthetic camera (real
ONNX Runtime, real `Pipeline`): the same version agrees with itself under each camera's own
filter; the rest after each inference skips the frames offered meanwhile; a candidate that
raises is counted, compares as finding nothing, and the thread goes on; no camera, no shadow."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy.typing as npt
import pytest
from testkit.bundles import install_versions
from testkit.net import wait_until

from agent.config.models import CameraSection
from agent.errors import BundleError, ErrorCode
from agent.hardware.board import probe
from agent.serving.cameras import Cameras
from agent.serving.loader import open_detector
from agent.serving.shadow import ShadowCamera, ShadowSession, one_thread, rest_s
from pipelines.decoding.detection_filter import DetectionFilter
from pipelines.decoding.detector import CameraDetector
from runtimes.ort_settings import OnnxRuntimeConfig
from runtimes.registry import RuntimeSettings


def test_the_same_version_agrees_with_itself_under_each_cameras_filter(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    versions = install_versions(tmp_path / "state", keys, bundles)
    sections = [
        CameraSection(name="all", source="synthetic:1", fps=30),
        CameraSection(name="circles", source="synthetic:2", fps=30, classes=["circle"], conf=0.4),
    ]
    cameras = Cameras(sections, probe(), "onnxruntime")
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
        assert report.serving_ms is None and report.candidate_ms is not None and report.candidate_ms > 0
    assert {c.class_id for c in reports["circles"].classes} == {0}  # the camera's own classes, both sides
    assert len(reports["all"].classes) > 1
    assert session.failures() == {"all": 0, "circles": 0}


def test_frames_offered_while_it_rests_are_skipped(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """Each inference "takes" 1 s on the session's clock: at a share of 0.1 it rests 9 s, and
    the frames the camera offers meanwhile are skipped, not compared later."""
    versions = install_versions(tmp_path / "state", keys, bundles)
    cameras = Cameras([CameraSection(name="a", source="synthetic:1", fps=30)], probe(), "onnxruntime")
    try:
        cameras.activate(versions[0])
        loaded = open_detector(versions[0], probe(), "onnxruntime")
        candidate = CameraDetector(loaded.detector, cameras.get("a").detector.detection_filter)
        ticks = itertools.count()
        session = ShadowSession(
            loaded.detector, {"a": ShadowCamera(cameras.get("a"), candidate)}, 0.1, clock=lambda: float(next(ticks))
        ).start()
        try:
            wait_until(lambda: session.reports()["a"].frames == 1 and session.skipped >= 5, 30, "frames skipped")
            assert session.reports()["a"].frames == 1
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


def test_no_camera_serving_is_shadow_unavailable(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    versions = install_versions(tmp_path / "state", keys, bundles)
    with pytest.raises(BundleError) as raised:
        Cameras([], probe()).shadow(versions[0], 0.1)
    assert raised.value.code == ErrorCode.SHADOW_UNAVAILABLE and "no camera is serving" in raised.value.message


def test_the_candidate_runs_on_one_thread() -> None:
    settings = one_thread(RuntimeSettings(onnxruntime=OnnxRuntimeConfig(intra_op_threads=4)))
    ort = settings.of(OnnxRuntimeConfig)
    assert (ort.intra_op_threads, ort.inter_op_threads, ort.spinning) == (1, 1, False)
