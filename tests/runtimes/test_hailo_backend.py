"""`runtimes.hailo_backend` on the double of HailoRT (`testkit.hailo_double`, the ONNX model under
it): both output forms (raw, NMS on the chip) decode to the ONNX model's detections on the demo
detector; the HEF's chip read from its header and checked against the Pi 5 trees' chips
(``TARGET_MISMATCH``); a ``hailo_platform`` that does not import disables this backend only."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS, FAKES, hailo_double

from pipelines.decoding.detector import Detector
from pipelines.measure.parity import detection_agreement
from pipelines.sources.synthetic import SyntheticScene
from runtimes.base import BundleModel, NotAModelError, RuntimeUnavailable
from runtimes.hailo_backend import HailoBackend, availability, candidates, input_quantization, nms_rows, target_problem
from runtimes.hailo_device import TargetMismatch, find_devices, hef_hw_arch
from runtimes.hailo_settings import HailoConfig
from runtimes.ort_backend import OnnxRuntimeBackend
from runtimes.registry import available_runtimes

DEMO = DEMO_MODELS / "demo_detector.onnx"
HAT = FAKES / "rpi5-hailo8l"  # the AI HAT+: Hailo-8L
HAT2 = FAKES / "rpi5-hailo10h"  # the AI HAT+ 2: Hailo-10H


@pytest.fixture
def double():  # type: ignore[no-untyped-def]
    hailo_double.VDevice.opened.clear()
    with hailo_double.installed("hailo8l") as module:
        yield module


@pytest.mark.parametrize(
    "form",
    [
        pytest.param({"nms": False}, id="raw"),
        pytest.param({"nms": True}, id="nms-on-chip"),
        pytest.param({"nms": True, "input_scale": 1.0, "normalisation_in_hef": True}, id="nms-normalised-in-hef"),
    ],
)
def test_both_output_forms_decode_to_the_onnx_model_s_detections(double, tmp_path: Path, form: dict) -> None:
    # fails on: y and x of HailoRT's boxes swapped, the input's quantization ignored or misread
    hef = hailo_double.write_hef(tmp_path / "demo.hef", DEMO, **form)
    with OnnxRuntimeBackend(DEMO) as reference:
        (tmp_path / "demo.hef.json").write_text(json.dumps({"metadata": reference.metadata.raw}))
    frames = [SyntheticScene(seed=7, width=640, height=480).render(i)[0] for i in range(0, 40, 8)]
    with OnnxRuntimeBackend(DEMO) as ort_rt, HailoBackend(hef, root=HAT) as hailo_rt:
        assert hailo_rt.inputs[0].shape == (1, 320, 320, 3) and hailo_rt.inputs[0].dtype == np.uint8
        assert hailo_rt.metadata.names == {0: "circle", 1: "square", 2: "triangle"}, "from the record beside it"
        assert hailo_rt.device == "Hailo-8/8L"
        ort_det, hailo_det = Detector(ort_rt), Detector(hailo_rt)
        assert hailo_det.decoder == ("end2end" if form["nms"] else "yolov8")
        counts = 0
        for frame in frames:
            want, got = ort_det.detect(frame), hailo_det.detect(frame)
            counts += len(want)
            assert len(got) == len(want) and detection_agreement(got, want) == 1.0
            order_w, order_g = np.argsort(-want.confidence), np.argsort(-got.confidence)
            np.testing.assert_array_equal(got.class_id[order_g], want.class_id[order_w])
            np.testing.assert_allclose(got.confidence[order_g], want.confidence[order_w], atol=1e-5)
            np.testing.assert_allclose(got.xyxy[order_g], want.xyxy[order_w], atol=0.01)
    assert counts > 10


def test_nms_boxes_are_y_first_and_normalised() -> None:
    # fails on: HailoRT's [y_min, x_min, y_max, x_max, score] read as x first, or not scaled to the input
    per_class = [np.empty((0, 5)), np.array([[0.1, 0.2, 0.5, 0.6, 0.9], [0.0, 0.0, 0.25, 0.5, 0.4]], np.float32)]
    rows = nms_rows(per_class, (200, 100))
    assert rows.shape == (1, 300, 6)
    np.testing.assert_allclose(rows[0, :2], [[20, 20, 60, 100, 0.9, 1], [0, 0, 50, 50, 0.4, 1]], rtol=1e-6)
    assert not rows[0, 2:].any(), "zeros after the boxes found"


def test_the_input_quantization_says_whether_pixels_or_the_normalised_input_go_in() -> None:
    # fails on: every uint8 input treated as raw pixels (a HEF compiled from the model as exported)
    assert input_quantization(1 / 255, 0) is not None and input_quantization(1 / 255, 0).scale == pytest.approx(1 / 255)
    assert input_quantization(1.0, 0) is None, "normalisation compiled into the HEF: pixels go in"


@pytest.mark.parametrize("version", [0, 1, 2, 3])
@pytest.mark.parametrize("arch", ["hailo8", "hailo8l", "hailo1xh"])
def test_the_chip_is_read_from_every_header_version(tmp_path: Path, version: int, arch: str) -> None:
    # fails on: a header version's size wrong (the protobuf read from the wrong offset), hw_arch 0 left out
    hef = hailo_double.write_hef(tmp_path / "m.hef", DEMO, hw_arch=arch, header_version=version)
    assert hef_hw_arch(hef) == arch


def test_a_file_that_is_not_a_hef_is_refused(tmp_path: Path) -> None:
    junk = tmp_path / "m.hef"
    junk.write_bytes(b"\x7fELF" + bytes(100))
    with pytest.raises(NotAModelError, match=r"m\.hef is not a HEF: magic 0x7f454c46"):
        hef_hw_arch(junk)


@pytest.mark.parametrize(
    ("tree", "arch", "message"),
    [
        (HAT2, "hailo8l", r"demo\.hef was compiled for hailo8l \(runs on Hailo-8/Hailo-8L\), .*hailo0 is Hailo-10H"),
        (HAT, "hailo1xh", r"demo\.hef was compiled for hailo1xh \(runs on Hailo-10H/Hailo-15H\), .*is Hailo-8/8L"),
    ],
)
def test_a_hef_for_the_other_generation_is_a_target_mismatch_before_hailort_opens_the_chip(
    double, tmp_path: Path, tree: Path, arch: str, message: str
) -> None:
    # fails on: the check left to HailoRT (the device opened first), or the generations' table wrong
    hef = hailo_double.write_hef(tmp_path / "demo.hef", DEMO, hw_arch=arch)
    with pytest.raises(TargetMismatch, match="^TARGET_MISMATCH: " + message):
        HailoBackend(hef, root=tree)
    assert hailo_double.VDevice.opened == [], "refused before HailoRT opened the device"
    family = find_devices(tree)[0].family
    assert target_problem(hef, family) is not None and target_problem(hef, family).startswith("TARGET_MISMATCH")


def test_hailort_s_own_refusal_is_a_target_mismatch_and_the_device_is_released(double, tmp_path: Path) -> None:
    # a Hailo-8 HEF on a Hailo-8L: one PCIe id, so only HailoRT's configure can tell
    # fails on: HailoRTHEFNotCompatibleWithDevice reported as any load error, the VDevice left open
    hef = hailo_double.write_hef(tmp_path / "demo.hef", DEMO, hw_arch="hailo8")
    assert target_problem(hef, find_devices(HAT)[0].family) is None
    with pytest.raises(TargetMismatch, match=r"^TARGET_MISMATCH: demo\.hef was compiled for hailo8 .*HailoRT refuses"):
        HailoBackend(hef, root=HAT)
    assert [v.released for v in hailo_double.VDevice.opened] == [True]


def test_a_hailo_platform_that_does_not_import_disables_this_backend_only(monkeypatch, caplog) -> None:
    # fails on: the import error raised out of the probe, or logged more than once
    monkeypatch.setitem(sys.modules, "hailo_platform", None)  # a missing or broken HailoRT, to import
    info = availability(HAT)
    assert not info.available and info.reason is not None and info.reason.startswith("hailo_platform does not import")
    with caplog.at_level(logging.INFO, "runtimes.registry"):
        found = available_runtimes(["onnxruntime", "hailo"], isolated=False)
    assert found["onnxruntime"].available and not found["hailo"].available
    assert [r.message for r in caplog.records].count(f"runtime hailo unavailable: {found['hailo'].reason}") == 1
    hef = FAKES.parent / "no.hef"
    with pytest.raises(RuntimeUnavailable, match="hailo_platform does not import"):
        HailoBackend(hef, root=HAT)


def test_no_hailo_chip_is_unavailable_saying_what_to_check(double, tmp_path: Path) -> None:
    # fails on: a board without the HAT reported able to run HEFs (selection would pick hailo there)
    info = availability(FAKES / "rpi5")
    assert not info.available and "no Hailo device: no /dev/hailo*" in (info.reason or "")
    here = availability(HAT)
    assert here.available and here.version == "4.23.0" and here.devices == ("Hailo-8/8L",)
    hef = hailo_double.write_hef(tmp_path / "demo.hef", DEMO)
    row = candidates(HailoConfig(), BundleModel(hef, "hef", "int8", "0" * 64), info, False)
    assert row[0].unavailable == info.reason


def test_a_closed_model_says_so_and_closing_twice_is_harmless(double, tmp_path: Path) -> None:
    hef = hailo_double.write_hef(tmp_path / "demo.hef", DEMO, nms=True)
    backend = HailoBackend(hef, root=HAT, warmup=False)
    backend.close()
    backend.close()
    assert [v.released for v in hailo_double.VDevice.opened] == [True]
    with pytest.raises(Exception, match="was closed"):
        backend.infer([np.zeros((1, 320, 320, 3), np.uint8)])
