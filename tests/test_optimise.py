"""`bundle build`'s optimisation: ONNX hygiene, FP16 / INT8 variants made by the real converters
(ONNX Runtime's float16 converter and static quantizer, onnxslim), proven against FP32 by running
them in ONNX Runtime on the demo model with the synthetic scene; the agreement gate; the errors."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from agent.bundles.archive import Limits, unpack
from agent.errors import BundleError, ErrorCode
from agent.optimise.agreement import measure
from agent.optimise.hygiene import check_model, describe, simplify
from agent.optimise.operators import unsupported_operators
from agent.optimise.variants import quantize_qdq
from pipelines.detector import Detector
from pipelines.synthetic import SyntheticScene
from runtimes.registry import load_runtime
from tests.conftest import DEMO_MODELS, REPO

FP32 = DEMO_MODELS / "demo_detector.onnx"


def _write_frames(folder: Path, frames: list[np.ndarray]) -> Path:
    folder.mkdir()
    for i, frame in enumerate(frames):
        cv2.imwrite(str(folder / f"{i:03d}.png"), frame)
    return folder


@pytest.fixture(scope="module")
def scenes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Synthetic scenes (640x480, five shapes each) as PNG files: calibration and validation."""
    frames = [SyntheticScene(seed=7_000 + i, num_shapes=5).render(i * 9)[0] for i in range(8)]
    return _write_frames(tmp_path_factory.mktemp("opt") / "scenes", frames)


@pytest.fixture(scope="module")
def blank(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deliberately bad calibration set: black frames."""
    return _write_frames(tmp_path_factory.mktemp("opt") / "blank", [np.zeros((480, 640, 3), np.uint8)] * 8)


def _build(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    from agent.cli import main

    status = main(["bundle", "build", *map(str, argv)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def _manifest(capsys: pytest.CaptureFixture[str], bundle: Path) -> dict:
    from agent.cli import main

    assert main(["bundle", "inspect", str(bundle), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_variants_ship_with_their_agreement(tmp_path: Path, scenes: Path, capsys) -> None:
    from agent.cli import main

    out = tmp_path / "demo.bundle"
    status, printed, _ = _build(
        capsys, "--model", FP32, "--precisions", "fp32,fp16,int8", "--calibration", scenes, "--name", "demo", "-o", out
    )
    assert status == 0, printed
    assert "demo_detector.onnx: opset 17, IR 8, fp32" in printed and "images[0]=batch" in printed
    manifest = _manifest(capsys, out)
    artifacts = {a["precision"]: a for a in manifest["artifacts"]}
    assert [a["precision"] for a in manifest["artifacts"]] == ["fp32", "fp16", "int8"]
    assert "agreement" not in artifacts["fp32"]  # the baseline; and older agents read such entries
    for precision in ("fp16", "int8"):
        agreement = artifacts[precision]["agreement"]
        assert agreement["baseline"] == "demo_detector.onnx" and agreement["images"] == 8
        assert agreement["baseline_detections"] >= 8  # five shapes a frame: the FP32 model finds them
        assert agreement["detections"] == pytest.approx(agreement["matched"] / agreement["baseline_detections"], 1e-3)
        assert 0.9 <= agreement["detections"] <= 1.0 and agreement["min_agreement"] == 0.9
        assert agreement["max_abs_error"] > 0  # a different model, measured: not a copy of FP32
    assert artifacts["fp16"]["agreement"]["max_abs_error"] < 0.01 < artifacts["int8"]["agreement"]["max_abs_error"]
    assert artifacts["int8"]["size"] * 2.5 <= artifacts["fp32"]["size"]
    assert artifacts["fp16"]["size"] * 1.8 <= artifacts["fp32"]["size"]
    assert main(["bundle", "inspect", str(out)]) == 0
    table = capsys.readouterr().out
    assert re.search(r"demo_detector_int8\.onnx\s+int8\s+\d+\s+(0\.9\d\d|1\.000)\s+\d+/\d+", table), table
    # a device installs it: verified, loaded, parity checked against the reference of its artifact
    state = ["--state-dir", str(tmp_path / "state"), "--allow-unsigned"]
    assert main(["install", str(out), *state]) == 0, capsys.readouterr().err
    folder = tmp_path / "unpacked"
    folder.mkdir()
    unpack(out, folder, Limits())
    for name in ("demo_detector_fp16.onnx", "demo_detector_int8.onnx"):
        model = onnx.load(str(folder / name))
        assert [i.type.tensor_type.elem_type for i in model.graph.input] == [TensorProto.FLOAT], "FP32 input kept"
        assert {p.key for p in model.metadata_props} >= {"names", "imgsz", "stride"}
    int8_ops = {n.op_type for n in onnx.load(str(folder / "demo_detector_int8.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= int8_ops


def test_a_blank_calibration_set_gives_an_int8_variant_the_gate_refuses(
    tmp_path: Path, scenes: Path, blank: Path, capsys
) -> None:
    out = tmp_path / "b.bundle"
    argv = ["--model", FP32, "--calibration", blank, "--validation", scenes, "-o", out]
    status, printed, _ = _build(capsys, *argv, "--precisions", "fp32,int8")
    assert status == 0, printed
    found = re.search(r"int8\.onnx \(int8\): left out: detection agreement (\d\.\d+) is (\d\.\d+) below", printed)
    assert found, printed
    agreement, gap = map(float, found.groups())
    assert agreement < 0.5 and gap == pytest.approx(0.9 - agreement, abs=1e-3)
    assert "--int8-activations asymmetric" in printed  # what to try next
    assert [a["precision"] for a in _manifest(capsys, out)["artifacts"]] == ["fp32"]
    # nothing else asked for: no bundle at all, and the number says why
    status, _, err = _build(capsys, *argv, "--precisions", "int8")
    assert status == 1 and "NO_ARTIFACT_KEPT" in err and f"agreement {agreement:.3f}" in err


def _save_model(path: Path, nodes: list, initializers: tuple = (), shape: tuple = (1, 3, 32, 32)) -> Path:
    """Write a graph of `nodes` from ``images`` to ``output0`` (both float `shape`), unchecked;
    IR 8, which every supported ONNX Runtime (1.17 on) loads."""
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, list(shape))],
        list(initializers),
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _broken_model(path: Path) -> Path:
    """A model whose Add reads a tensor no node makes: the checker refuses it."""
    return _save_model(path, [helper.make_node("Add", ["images", "nowhere"], ["output0"])])


def test_a_model_the_checker_refuses_is_refused_with_its_message(tmp_path: Path, scenes: Path, capsys) -> None:
    broken = _broken_model(tmp_path / "broken.onnx")
    with pytest.raises(onnx.checker.ValidationError) as checker:
        onnx.checker.check_model(onnx.load(str(broken)), full_check=True)
    expected = " ".join(str(checker.value).split())
    for extra in ([], ["--precisions", "fp32,fp16", "--calibration", scenes]):
        status, _, err = _build(capsys, "--model", broken, *extra, "-o", tmp_path / "x.bundle")
        assert status == 1
        assert err.startswith("edge-agent: error: MODEL_CHECK_FAILED: broken.onnx: the ONNX checker refused it:")
        assert expected in err
        assert not (tmp_path / "x.bundle").exists()


def test_strict_shape_inference_refuses_inconsistent_shapes(tmp_path: Path) -> None:
    bias = numpy_helper.from_array(np.zeros((5, 7), np.float32), "bias")
    path = _save_model(
        tmp_path / "inconsistent.onnx", [helper.make_node("Add", ["images", "bias"], ["output0"])], (bias,)
    )
    with pytest.raises(BundleError) as refused:
        check_model(path)
    assert refused.value.code == ErrorCode.MODEL_CHECK_FAILED and "inconsistent.onnx" in refused.value.message
    (tmp_path / "junk.onnx").write_bytes(b"\x00 not a model")
    with pytest.raises(BundleError, match=r"junk\.onnx is not an ONNX model"):
        check_model(tmp_path / "junk.onnx")


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["--precisions", "int8"], "CALIBRATION_REQUIRED", "--calibration DIR"),
        (["--precisions", "fp32,fp16"], "VALIDATION_REQUIRED", "--validation DIR"),
        (["--precisions", "fp16", "--calibration", "{scenes}", "--model-instead", "int8"], "NOT_FP32_MODEL", "is int8"),
        (["--precisions", "fp16", "--model-instead", "tflite"], "NOT_FP32_MODEL", "needs an FP32 .onnx model"),
    ],
)
def test_clear_errors_before_any_work(argv: list[str], code: str, words: str, tmp_path: Path, scenes: Path, capsys):
    model = FP32
    if "--model-instead" in argv:
        kind = argv[argv.index("--model-instead") + 1]
        argv = argv[: argv.index("--model-instead")]
        model = DEMO_MODELS / ("demo_detector_int8_qdq.onnx" if kind == "int8" else "demo_detector_fp32.tflite")
    argv = [a.replace("{scenes}", str(scenes)) for a in argv]
    status, _, err = _build(capsys, "--model", model, *argv, "-o", tmp_path / "x.bundle")
    assert status == 1 and f"error: {code}:" in err and words in err, err


@pytest.mark.parametrize("bad", ["int9", "fp32,,bf16", ""])
def test_unknown_precisions_are_a_usage_error(bad: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as usage:
        _build(capsys, "--model", FP32, "--precisions", bad, "-o", tmp_path / "x.bundle")
    assert usage.value.code == 2
    assert "--precisions: expected a comma-separated list of fp32, fp16, int8" in capsys.readouterr().err


def test_describe_reports_opset_ir_and_dynamic_axes() -> None:
    facts = describe(check_model(DEMO_MODELS / "demo_detector_dynamic.onnx"))
    assert (facts.opset, facts.ir_version, facts.precision) == (17, 8, "fp32")
    assert [str(a) for a in facts.dynamic_axes if a.tensor == "images"] == [
        "images[0]=batch",
        "images[2]=height",
        "images[3]=width",
    ]
    assert facts.warnings == ()  # every operator of the demo model: TensorRT 10 and LiteRT take it
    assert describe(check_model(DEMO_MODELS / "demo_detector_int8_qdq.onnx")).precision == "int8"


@pytest.mark.models
def test_operator_warnings_on_a_dynamically_quantized_coco_model(shared_models: Path) -> None:
    """ORT's dynamic quantization (ConvInteger, DynamicQuantizeLinear): TensorRT cannot parse it."""
    facts = describe(check_model(shared_models / "yolov8n_int8_640.onnx"))
    warnings = {w.target: w.operators for w in facts.warnings}
    assert {"ConvInteger", "DynamicQuantizeLinear"} <= set(warnings["tensorrt"])
    assert "ConvInteger" in warnings["litert"] and "DynamicQuantizeLinear" not in warnings["litert"]
    assert facts.precision == "int8"


@pytest.mark.parametrize(
    ("nodes", "opset", "expected"),
    [
        ([("", "Conv"), ("", "Sigmoid")], 17, []),
        ([("", "Conv"), ("", "NonZero")], 17, []),
        ([("", "Unique")], 17, ["tensorrt: Unique"]),
        ([("", "GridSample")], 17, ["litert: GridSample"]),
        ([("", "Conv")], 21, ["tensorrt: opset 21"]),
        (
            [("com.microsoft", "FusedConv")],
            17,
            ["tensorrt: com.microsoft:FusedConv", "litert: com.microsoft:FusedConv"],
        ),
    ],
)
def test_operator_table(nodes: list[tuple[str, str]], opset: int, expected: list[str]) -> None:
    found = [f"{w.target}: {', '.join(w.operators)}" for w in unsupported_operators(nodes, opset)]
    assert found == expected


def _redundant_model(path: Path) -> Path:
    """``(images + (a + b)) -> Identity -> Identity``: onnxslim folds ``a + b`` and drops the Identities."""
    rng = np.random.default_rng(3)
    a, b = (numpy_helper.from_array(rng.random((1, 3, 1, 1), dtype=np.float32), n) for n in ("a", "b"))
    nodes = [
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Add", ["images", "ab"], ["sum"]),
        helper.make_node("Identity", ["sum"], ["copy"]),
        helper.make_node("Identity", ["copy"], ["output0"]),
    ]
    return _save_model(path, nodes, (a, b), shape=(1, 3, 8, 8))


def test_simplification_is_kept_only_when_lossless(tmp_path: Path) -> None:
    source = _redundant_model(tmp_path / "redundant.onnx")
    tensor = np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32)
    result = simplify(check_model(source), source, tmp_path / "slim.onnx", tensor)
    assert result.kept and result.path == tmp_path / "slim.onnx", result.note
    assert re.search(r"4 -> [12] nodes, outputs identical", result.note), result.note  # 2 with onnxslim 0.1.48
    with load_runtime("onnxruntime", source) as a, load_runtime("onnxruntime", result.path) as b:
        assert np.array_equal(a.infer([tensor])[0], b.infer([tensor])[0])
    minimal = _save_model(tmp_path / "minimal.onnx", [helper.make_node("Relu", ["images"], ["output0"])])
    already = simplify(check_model(minimal), minimal, tmp_path / "again.onnx", np.zeros((1, 3, 32, 32), np.float32))
    assert not already.kept and already.path == minimal and "already simple (1 node)" in already.note


def _activation_scales(model: onnx.ModelProto) -> dict[str, float]:
    """The per-tensor (activation) scales of a Q/DQ model, by initializer name."""
    arrays = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    return {name: float(a) for name, a in arrays.items() if name.endswith("_scale") and a.size == 1}


def test_each_calibration_method_reaches_the_quantizer(tmp_path: Path) -> None:
    """minmax, entropy and percentile each give a checked Q/DQ model; percentile clips the ranges
    minmax takes whole (ONNX Runtime's entropy search, at its default 128 bins, may end at the
    whole range too: docs/optimising.md)."""
    with load_runtime("onnxruntime", FP32) as runtime:
        detector = Detector(runtime)
        frames = [SyntheticScene(seed=7_200 + i, num_shapes=5).render(0)[0] for i in range(4)]
        tensors = [detector.prepare(frame)[0] for frame in frames]
        name = runtime.inputs[0].name
    scales = {}
    for method in ("minmax", "entropy", "percentile"):
        model = quantize_qdq(FP32, tmp_path / f"{method}.onnx", name, tensors, method)
        assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in model.graph.node}
        scales[method] = _activation_scales(model)
    assert scales["minmax"].keys() == scales["percentile"].keys() and len(scales["minmax"]) >= 20
    clipped = [k for k, v in scales["percentile"].items() if v < scales["minmax"][k] * (1 - 1e-6)]
    assert len(clipped) >= len(scales["minmax"]) // 2, clipped
    assert all(scales["entropy"][k] <= v * (1 + 1e-6) for k, v in scales["minmax"].items())


def test_agreement_of_a_model_with_itself_is_complete_and_errors_are_zero() -> None:
    frames = [SyntheticScene(seed=7_100 + i, num_shapes=4).render(3)[0] for i in range(3)]
    with load_runtime("onnxruntime", FP32) as one, load_runtime("onnxruntime", FP32) as two:
        measured = measure(Detector(one), Detector(two), frames)
        assert measured.agreement == 1.0 and measured.extra == 0 and measured.max_abs_error == 0.0
        assert measured.baseline_detections >= 3
        with pytest.raises(ValueError, match="at least one validation image"):
            measure(Detector(one), Detector(two), [])
        blank = [np.zeros((480, 640, 3), np.uint8)]
        assert measure(Detector(one), Detector(two), blank).agreement is None  # nothing to compare


@pytest.mark.models
def test_a_real_coco_model_gets_a_checked_fp16_variant(tmp_path: Path, shared_models: Path, photos, capsys) -> None:
    """YOLOX-Nano (FP32, opset 11): simplified only where that is lossless, its FP16 variant proven
    on photos."""
    validation = tmp_path / "photos"
    validation.mkdir()
    for name, path in photos.items():
        image = cv2.imread(str(path))
        cv2.imwrite(str(validation / f"{name}.png"), image)
        cv2.imwrite(str(validation / f"{name}_flipped.png"), image[:, ::-1])
    out = tmp_path / "yolox.bundle"
    labels = shared_models / "coco80_labels.txt"
    argv = ["--model", shared_models / "yolox_nano_416.onnx", "--labels", labels, "--validation", validation]
    status, printed, _ = _build(capsys, *argv, "--precisions", "fp32,fp16", "-o", out)
    assert status == 0, printed
    assert "yolox_nano_416.onnx: opset 11, IR 6, fp32, 369 nodes" in printed
    manifest = _manifest(capsys, out)
    assert manifest["decoder"] == "yolox"
    # onnxslim 0.1.98 simplifies it losslessly; 0.1.48 (the oldest supported) changed its outputs
    # (by up to 2.07): then the model must ship exactly as given
    shipped = manifest["artifacts"][0]
    original = hashlib.sha256((shared_models / "yolox_nano_416.onnx").read_bytes()).hexdigest()
    if "simplified by onnxslim: 369 -> 365 nodes, outputs identical" in printed:
        assert shipped["sha256"] != original
    else:
        assert "kept as given: the simplified model's outputs differ (max |difference|" in printed, printed
        assert shipped["sha256"] == original
    fp16 = manifest["artifacts"][1]
    assert fp16["precision"] == "fp16" and fp16["agreement"]["detections"] >= 0.9
    assert fp16["agreement"]["baseline_detections"] >= 4  # a person, a cat, a cup...: found on the photos


def test_the_device_never_imports_the_build_tools() -> None:
    """`edge-agent run`'s imports (the CLI and the daemon) load neither agent.optimise's modules
    nor onnx, onnxslim, sympy or ONNX Runtime's quantization and transformers tooling."""
    code = (
        "import sys; import agent.daemon.agent, agent.daemon.page, agent.web.server, agent.serving.loader; "
        "from agent.cli.main import build_parser; build_parser(); "
        "print('\\n'.join(m for m in sys.modules if m.split('.')[0] in ('onnx', 'onnxslim', 'sympy') "
        "or m.startswith(('agent.optimise.', 'onnxruntime.quantization', 'onnxruntime.transformers'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.split() == []
