"""`edge-agent detect` and `edge-agent probe` end to end, on the real COCO models and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent.cli import main
from tests.conftest import FAKES, REPO

# model file, labels file (None: the model's metadata), expected decoder
COCO_MODELS = [
    ("yolov8n_int8_640.onnx", None, "yolov8"),
    ("yolov8n_int8io_640.tflite", None, "yolov8"),
    ("yolox_nano_416.onnx", "coco80_labels.txt", "yolox"),
    ("ssd_mobilenet_v1_coco_quant_300.tflite", "ssd_mobilenet_v1_coco_labelmap.txt", "ssd"),
]
# photo -> (label that must be found, a box it must overlap with IoU >= 0.5 (x1, y1, x2, y2))
EXPECTED = {
    "astronaut": ("person", (5, 10, 365, 510)),
    "chelsea": ("cat", (0, 0, 440, 298)),
    "coffee": ("cup", (168, 17, 423, 320)),
}


def iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def run_json(capsys, *argv: str) -> list[dict]:
    assert main(["detect", *argv, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize(("model", "labels", "decoder"), COCO_MODELS)
def test_coco_models_find_the_right_objects(shared_models, photos, capsys, model, labels, decoder) -> None:
    argv = [str(shared_models / model), *(str(photos[name]) for name in EXPECTED)]
    if labels:
        argv += ["--labels", str(shared_models / labels)]
    results = run_json(capsys, *argv)
    assert [r["image"] for r in results] == [str(photos[name]) for name in EXPECTED]
    for result, (name, (label, box)) in zip(results, EXPECTED.items(), strict=True):
        assert result["decoder"] == decoder
        assert result["runtime"] == ("onnxruntime" if model.endswith(".onnx") else "litert")
        dets = result["detections"]
        scores = [d["score"] for d in dets]
        assert scores == sorted(scores, reverse=True), "highest score first"
        matches = [d for d in dets if d["label"] == label]
        assert matches, f"{model} on {name}: no {label} in {[d['label'] for d in dets]}"
        best = max(iou(d["box"], box) for d in matches)
        assert best >= 0.5, f"{model} on {name}: best {label} box IoU {best:.2f}"
        h, w = {"astronaut": (512, 512), "chelsea": (300, 451), "coffee": (400, 600)}[name]
        for d in dets:
            x1, y1, x2, y2 = d["box"]
            assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h, f"box {d['box']} outside the {w}x{h} image"
            assert 0.25 < d["score"] <= 1.0


def test_ssd_labelmap_with_leading_question_marks(shared_models, photos, capsys) -> None:
    """Class 0 of the SSD post-process is 'person', on line 1 of the labelmap (line 0 is ???)."""
    model = shared_models / "ssd_mobilenet_v1_coco_quant_300.tflite"
    labelmap = shared_models / "ssd_mobilenet_v1_coco_labelmap.txt"
    (result,) = run_json(capsys, str(model), str(photos["astronaut"]), "--labels", str(labelmap))
    top = result["detections"][0]
    assert (top["label"], top["class_id"]) == ("person", 0)


def test_labels_fall_back_to_class_ids(shared_models, photos, capsys) -> None:
    (result,) = run_json(capsys, str(shared_models / "yolox_nano_416.onnx"), str(photos["chelsea"]))
    assert result["detections"][0]["label"] == "15"  # cat is COCO-80 class 15


def test_conf_and_decoder_options(shared_models, photos, capsys) -> None:
    model = str(shared_models / "yolov8n_int8_640.onnx")
    (low,) = run_json(capsys, model, str(photos["coffee"]), "--conf", "0.05", "--decoder", "yolov8")
    (high,) = run_json(capsys, model, str(photos["coffee"]), "--conf", "0.8", "--max-det", "1")
    assert len(low["detections"]) > len(high["detections"]) == 1
    assert min(d["score"] for d in low["detections"]) > 0.05


def test_subprocess_text_output_and_exit_status(shared_models, photos) -> None:
    """The installed console script, as a technician runs it."""
    cmd = [
        sys.executable,
        "-m",
        "agent.cli",
        "detect",
        str(shared_models / "yolov8n_int8_640.onnx"),
        str(photos["astronaut"]),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "person" in proc.stdout and "onnxruntime" in proc.stdout


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("make_argv", "message"),
    [
        (lambda t, m, p: [str(t / "missing.onnx"), str(p)], "model file not found: .*missing.onnx"),
        (
            lambda t, m, p: [str(write(t / "junk.onnx", b"\x00garbage" * 50)), str(p)],
            "ONNX Runtime cannot load .*junk.onnx",
        ),
        (
            lambda t, m, p: [str(write(t / "junk.tflite", b"\x00garbage" * 50)), str(p)],
            "LiteRT cannot load .*junk.tflite",
        ),
        (lambda t, m, p: [str(write(t / "model.pt", b"PK")), str(p)], "unknown model format '.pt'"),
        (lambda t, m, p: [str(m), str(p), "--labels", str(t / "nolabels.txt")], "cannot read labels file"),
    ],
)
def test_bad_model_input_is_one_line_and_nonzero(tmp_path, photos, constant_model, capsys, make_argv, message) -> None:
    model = constant_model(np.zeros((1, 84, 8400), np.float32))
    assert main(["detect", *make_argv(tmp_path, model, photos["coffee"])]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("edge-agent: error:")
    import re

    assert re.search(message, err), err


def test_outputs_matching_no_decoder_name_the_shapes(constant_model, photos, capsys) -> None:
    model = constant_model(np.zeros((1, 7), np.float32))
    assert main(["detect", str(model), str(photos["coffee"])]) == 1
    err = capsys.readouterr().err
    assert "model outputs match no decoder: found (1, 7)" in err


def test_bad_images_are_reported_and_good_ones_still_run(tmp_path, constant_model, photos, capsys) -> None:
    model = constant_model(np.zeros((1, 84, 8400), np.float32))
    text = write(tmp_path / "notes.jpg", b"not an image")
    status = main(["detect", str(model), str(text), str(photos["coffee"]), str(tmp_path / "gone.png"), "--json"])
    captured = capsys.readouterr()
    assert status == 1
    assert [json.loads(line)["image"] for line in captured.out.splitlines()] == [str(photos["coffee"])]
    errors = captured.err.strip().splitlines()
    assert errors == [
        f"edge-agent: error: image {text}: cannot be decoded as an image",
        f"edge-agent: error: image {tmp_path / 'gone.png'}: not found",
    ]


def test_unavailable_runtime_request(constant_model, photos, capsys) -> None:
    model = constant_model(np.zeros((1, 84, 8400), np.float32))
    assert main(["detect", str(model), str(photos["coffee"]), "--runtime", "litert"]) == 1
    assert "litert: needs a .tflite artifact" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["detect", "m.onnx", "i.png", "--conf", "1.5"])
    assert exit_info.value.code == 2
    assert "expected a number within 0..1, got 1.5" in capsys.readouterr().err


def test_no_traceback_in_a_real_process(tmp_path) -> None:
    junk = write(tmp_path / "junk.onnx", b"nope")
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "detect", str(junk), str(junk)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "ONNX Runtime cannot load" in proc.stderr


@pytest.mark.parametrize(
    ("tree", "arch", "kind", "onnx_runtime", "tflite_runtime"),
    [
        ("rpi5", "aarch64", "raspberry_pi", "onnxruntime", "litert"),
        ("x86-generic", "x86_64", "generic", "onnxruntime", "litert"),
        ("jetson-orin-nano", "aarch64", "jetson", "onnxruntime", "litert"),
    ],
)
def test_probe_json(capsys, tree, arch, kind, onnx_runtime, tflite_runtime) -> None:
    assert main(["probe", "--json", "--root", str(FAKES / tree), "--arch", arch]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["board"]["kind"] == kind
    assert report["runtimes"]["onnxruntime"]["available"]
    assert report["selection"]["onnx"]["runtime"] == onnx_runtime
    assert report["selection"]["tflite"]["runtime"] == tflite_runtime
    assert report["selection"]["onnx"]["reason"]


def test_probe_text(capsys) -> None:
    assert main(["probe", "--root", str(FAKES / "rpi5"), "--arch", "aarch64"]) == 0
    out = capsys.readouterr().out
    assert "Raspberry Pi 5 Model B Rev 1.0 (raspberry_pi, aarch64, 4 CPUs)" in out
    assert ".tflite  -> litert: Raspberry Pi aarch64: litert on xnnpack is preferred" in out
