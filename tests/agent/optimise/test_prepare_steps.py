"""`agent.optimise.prepare` step by step beside test_prepare.py (which runs it through `bundle
build`): the options refused before any model loads, each verdict at its boundary, and the
models as given passing through the hygiene with their precision noted."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import DEMO_MODELS

from agent.bundles.archive import ArtifactNotes
from agent.errors import BundleError, ErrorCode
from agent.optimise.agreement import Measured
from agent.optimise.prepare import Options, _variant_name, _verdict, check_options, prepare

ONNX, TFLITE = DEMO_MODELS / "demo_detector.onnx", DEMO_MODELS / "demo_detector_int8.tflite"
QDQ = DEMO_MODELS / "demo_detector_int8_qdq.onnx"
IMAGES = (Path("a.png"),)


@pytest.mark.parametrize(
    ("models", "options", "code"),
    [
        ((TFLITE,), Options(precisions=("fp16",), calibration=IMAGES), ErrorCode.NOT_FP32_MODEL),
        ((ONNX,), Options(precisions=("int8",), validation=IMAGES), ErrorCode.CALIBRATION_REQUIRED),
        ((ONNX,), Options(precisions=("fp16",)), ErrorCode.VALIDATION_REQUIRED),
        ((ONNX,), Options(openvino_int8=True, calibration=IMAGES), ErrorCode.NOT_FP32_MODEL),
        ((ONNX,), Options(precisions=("fp32",), openvino_int8=True), ErrorCode.CALIBRATION_REQUIRED),
    ],
)
def test_options_that_cannot_work_are_refused_first(
    models: tuple[Path, ...], options: Options, code: ErrorCode
) -> None:
    with pytest.raises(BundleError) as refused:
        check_options(models, options)
    assert refused.value.code == code


def test_options_that_can_work_pass() -> None:
    check_options((TFLITE,), Options())
    check_options((ONNX,), Options(precisions=("fp32",)))  # the baseline needs no images
    check_options((ONNX,), Options(precisions=("int8", "fp16"), calibration=IMAGES))  # proven on the calibration set


def test_the_openvino_int8_variant_without_its_tools_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.optimise import nncf_int8

    monkeypatch.setattr(nncf_int8, "missing_tools", lambda: ["nncf"])
    with pytest.raises(BundleError, match=r"--openvino-int8 needs nncf: pip install 'edge-agent\[nncf\]'") as refused:
        check_options((ONNX,), Options(precisions=("fp32",), calibration=IMAGES, openvino_int8=True))
    assert refused.value.code == ErrorCode.BUILD_TOOLS_MISSING
    assert Options(calibration=IMAGES).proof_images == IMAGES
    assert Options(calibration=IMAGES, validation=(Path("v.png"),)).proof_images == (Path("v.png"),)


def _measured(matched: int, baseline: int = 100, extra: int = 0) -> Measured:
    return Measured(
        images=5, baseline_detections=baseline, matched=matched, extra=extra, max_abs_error=0.5, mean_abs_error=0.1
    )


def test_a_variant_ships_at_exactly_the_minimum_agreement_and_not_below() -> None:
    options = Options(min_agreement=0.9)
    ok, line = _verdict("m_fp16.onnx (fp16)", _measured(90, extra=2), options)
    assert ok and line == (
        "m_fp16.onnx (fp16): kept: detection agreement 0.900 (90 of 100 FP32 detections matched on 5 validation "
        "images, 2 extra), max |output error| 0.5"
    )
    ok, line = _verdict("m_int8.onnx (int8)", _measured(89), options)
    assert not ok and "detection agreement 0.890 is 0.010 below --min-agreement 0.90" in line
    ok, line = _verdict("m_int8.onnx (int8)", _measured(0, baseline=0), options)
    assert not ok and "found nothing on the 5 validation images" in line


def test_variant_names() -> None:
    assert _variant_name(Path("yolo_fp32.onnx"), "int8") == "yolo_int8.onnx"
    assert _variant_name(Path("yolo.onnx"), "fp16") == "yolo_fp16.onnx"


def test_models_as_given_pass_the_hygiene_with_their_precision(tmp_path: Path) -> None:
    said: list[str] = []
    prepared = prepare([ONNX, TFLITE, QDQ], Options(), tmp_path, said.append)
    assert prepared.models == (ONNX, TFLITE, tmp_path / QDQ.name), "a simple model stays, a slimmer one is written"
    assert prepared.notes == {ONNX.name: ArtifactNotes(precision="fp32"), QDQ.name: ArtifactNotes(precision="int8")}
    assert said[0].startswith("demo_detector.onnx: opset 17, IR 8, fp32")
    assert "  kept as given: already simple" in said[1]
    assert said[3].startswith("  simplified by onnxslim") and said[3].endswith("outputs identical")
    assert not any("tflite" in line for line in said), "LiteRT models are shipped as they are"

    unsimplified = prepare([QDQ], Options(simplify=False), tmp_path / "plain", said.append)
    assert unsimplified.models == (QDQ,)
