"""`edge-agent bench` and `edge-agent detect` on video files, with the demo model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.cli import main
from tests.conftest import DEMO_MODELS, REPO, write_video


@pytest.mark.parametrize("model", ["demo_detector.onnx", "demo_detector_int8.tflite"])
def test_bench_pipeline_json_on_a_file_processes_every_frame(tmp_path: Path, capsys, model: str) -> None:
    video = write_video(tmp_path / "clip.avi", 25, size=(320, 240))
    assert main(["bench", str(DEMO_MODELS / model), "--source", str(video), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["frames"] == 25 and report["dropped"] == 0
    assert report["fps"] > 0 and report["rss_mb"] > 0
    assert 0 < report["latency_ms"]["p50"] <= report["latency_ms"]["p95"]
    assert {"preprocess", "inference", "postprocess"} <= set(report["stages_ms"])
    assert report["runtime"] == ("onnxruntime" if model.endswith(".onnx") else "litert")


def test_bench_frames_loops_a_short_file_and_runtime_mode(tmp_path: Path, capsys) -> None:
    video = write_video(tmp_path / "clip.avi", 10, size=(320, 240))
    model = str(DEMO_MODELS / "demo_detector.onnx")
    assert main(["bench", model, "--source", str(video), "--frames", "23", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["frames"] == 23
    assert main(["bench", model, "--mode", "runtime", "--frames", "15", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["mode"], report["frames"], report["input_shape"]) == ("runtime", 15, [1, 3, 320, 320])


def test_bench_workers_in_pipeline_and_runtime_mode(tmp_path: Path, capsys) -> None:
    video = write_video(tmp_path / "clip.avi", 25, size=(320, 240))
    model = str(DEMO_MODELS / "demo_detector.onnx")
    assert main(["bench", model, "--source", str(video), "--workers", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["frames"], report["workers"], report["dropped"]) == (25, 2, 0)
    assert main(["bench", model, "--mode", "runtime", "--frames", "15", "--workers", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["frames"], report["workers"]) == (15, 2)


def test_bench_workers_refused_for_a_runtime_without_concurrent_calls(capsys) -> None:
    assert main(["bench", str(DEMO_MODELS / "demo_detector_int8.tflite"), "--workers", "2"]) != 0
    assert "--workers 2: litert cannot run one model from several threads" in capsys.readouterr().err


def test_bench_text_output_and_synthetic_default(capsys) -> None:
    assert main(["bench", str(DEMO_MODELS / "demo_detector.onnx"), "--frames", "12"]) == 0
    out = capsys.readouterr().out
    assert "12 frames in" in out and "peak RSS" in out and "inference" in out


def test_bench_bad_source(tmp_path: Path, capsys) -> None:
    assert main(["bench", str(DEMO_MODELS / "demo_detector.onnx"), "--source", str(tmp_path / "none.mp4")]) == 1
    assert "cannot open video file" in capsys.readouterr().err


def test_detect_on_a_video_every_nth_frame(tmp_path: Path, capsys) -> None:
    video = write_video(tmp_path / "clip.avi", 10, size=(320, 240), seed=4)
    assert main(["detect", str(DEMO_MODELS / "demo_detector.onnx"), str(video), "--every", "3", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["frame"] for line in lines] == [0, 3, 6, 9]
    assert all(line["image"] == str(video) for line in lines)
    assert all(d["label"] in {"circle", "square", "triangle"} for line in lines for d in line["detections"])
    assert any(line["detections"] for line in lines)


def test_detect_on_a_broken_video(tmp_path: Path, capsys) -> None:
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00" * 1000)
    assert main(["detect", str(DEMO_MODELS / "demo_detector.onnx"), str(broken)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("edge-agent: error: cannot open video file") and len(err.splitlines()) == 1


def test_demo_model_finds_the_shapes_of_a_synthetic_frame(tmp_path: Path) -> None:
    """The demo model through the real console entry point, on a frame it never saw."""
    import cv2

    from pipelines.synthetic import SyntheticScene

    image, truth = SyntheticScene(seed=123_456, num_shapes=4).render(0)
    path = tmp_path / "frame.png"
    cv2.imwrite(str(path), image)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent.cli",
            "detect",
            str(DEMO_MODELS / "demo_detector_int8.tflite"),
            str(path),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    found = sorted(d["label"] for d in json.loads(proc.stdout)["detections"])
    names = ("circle", "square", "triangle")
    expected = sorted(names[c] for c, v in zip(truth.detections.class_id, truth.visible, strict=True) if v > 0.5)
    assert found == expected


def test_detect_save_dir_writes_annotated_jpegs(tmp_path: Path, capsys) -> None:
    import cv2

    from pipelines.synthetic import SyntheticScene

    image, _ = SyntheticScene(seed=5).render(0)
    cv2.imwrite(str(tmp_path / "frame.png"), image)
    video = write_video(tmp_path / "clip.avi", 4, size=(320, 240))
    out = tmp_path / "annotated"
    model = str(DEMO_MODELS / "demo_detector.onnx")
    assert main(["detect", model, str(tmp_path / "frame.png"), str(video), "--every", "2", "--save-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["clip_000000.jpg", "clip_000002.jpg", "frame.jpg"]
    drawn = cv2.imread(str(out / "frame.jpg"))
    assert drawn.shape == image.shape and (abs(drawn.astype(int) - image.astype(int)) > 100).any()


def test_eval_script_reports_every_artifact_above_0_9() -> None:
    proc = subprocess.run(
        [sys.executable, "scripts/eval_demo_model.py", "--frames", "25", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert set(results) == {
        "demo_detector.onnx",
        "demo_detector_dynamic.onnx",
        "demo_detector_int8_qdq.onnx",
        "demo_detector_fp32.tflite",
        "demo_detector_int8.tflite",
    }
    for name, r in results.items():
        assert r["precision"] >= 0.9 and r["recall"] >= 0.9, (name, r)


def test_dynamic_model_gets_the_smallest_stride_multiple_input(capsys) -> None:
    """Rect inference: a 640x480 frame into a dynamic 320 model is letterboxed to 320x256."""
    model = str(DEMO_MODELS / "demo_detector_dynamic.onnx")
    assert main(["bench", model, "--frames", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_shape"] == [1, 3, 256, 320]
    assert main(["bench", str(DEMO_MODELS / "demo_detector.onnx"), "--frames", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_shape"] == [1, 3, 320, 320]


def test_bench_ends_with_the_error_when_the_file_breaks(tmp_path: Path, capsys) -> None:
    """A source that fails mid-run ends the benchmark with its error instead of reconnecting forever."""
    video = write_video(tmp_path / "clip.avi", 40, size=(320, 240))
    data = video.read_bytes()
    video.write_bytes(data[: len(data) // 3])  # the header still promises 40 frames
    assert main(["bench", str(DEMO_MODELS / "demo_detector.onnx"), "--source", str(video), "--json"]) == 1
    assert "read failed at frame" in capsys.readouterr().err
