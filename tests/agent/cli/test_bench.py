"""`edge-agent bench`: pipeline and runtime modes on files, synthetic and pipe sources, ``--workers``
(and ``auto``), ``--matrix``, bad sources; ``--against``, a candidate against the serving model."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
from testkit import DEMO_MODELS
from testkit.media import write_video
from testkit.onnx_models import altered
from testkit.tvm_modules import pi5_module

from agent.bundles.archive import build_bundle
from agent.cli import main
from runtimes.base import usable_cores, worker_variants


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


def test_bench_ends_with_the_error_when_the_file_breaks(tmp_path: Path, capsys) -> None:
    """A source that fails mid-run ends the benchmark with its error instead of reconnecting forever."""
    video = write_video(tmp_path / "clip.avi", 40, size=(320, 240))
    data = video.read_bytes()
    video.write_bytes(data[: len(data) // 3])  # the header still promises 40 frames
    assert main(["bench", str(DEMO_MODELS / "demo_detector.onnx"), "--source", str(video), "--json"]) == 1
    assert "read failed at frame" in capsys.readouterr().err


ROW_FIELDS = {"runtime", "provider", "artifact", "precision", "latency_ms", "fps", "rss_mb", "energy_mj_per_frame"}


@pytest.mark.slow
def test_bench_matrix_json_has_a_row_for_everything(demo_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(demo_bundle), "--matrix", "--json", "--frames", "10"]) == 0
    rows = json.loads(capsys.readouterr().out)
    variants = len(worker_variants(usable_cores()))
    openvino = variants if importlib.util.find_spec("openvino") else 0  # the openvino extra: CPU rows
    assert len(rows) == 3 + variants + openvino + 1 + 1  # TVM's one row: measured, or why it cannot run
    assert [r["workers"] for r in rows if r["runtime"] == "openvino"] == [w for w, _ in worker_variants(2)][:openvino]
    for row in rows:
        assert set(row) >= ROW_FIELDS and row["energy_mj_per_frame"] is None
        if row["runtime"] == "tensorrt":
            assert row["latency_ms"] is None and "not installed" in row["error"]
            continue
        if row["runtime"] == "tvm" and importlib.util.find_spec("tvm") is None:  # the tvm extra: scripts/test_tvm.sh
            assert row["latency_ms"] is None and "tvm does not import" in row["error"]
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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("standin", "reason"),
    [(False, "hailo_platform does not import"), (True, "no Hailo device: no /dev/hailo*")],
    ids=["no-hailort", "no-chip"],
)
def test_bench_matrix_shows_a_hef_as_a_row_that_cannot_run_here_with_why(
    standin: bool, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bundle with a HEF for the AI HAT+ (`bundle build --hef`): on this machine its row cannot
    run and says why (no HailoRT; with HailoRT's stand-in, no chip); the ONNX rows are measured."""
    # fails on: the HEF left out of the matrix, or its row measured / failing without a reason
    from testkit import hailo_double, standin_env

    from runtimes import isolation
    from runtimes.hailo_backend import write_record

    if standin:
        monkeypatch.setattr(isolation, "PROCESS_RUNNER", isolation.ChildRunner(env=standin_env("hailo")))
    model = DEMO_MODELS / "demo_detector.onnx"
    (tmp_path / "hef").mkdir()
    hef = hailo_double.write_hef(tmp_path / "hef" / "demo.hef", model, hw_arch="hailo8l")
    write_record(hef, model)
    build_bundle([model], tmp_path / "hat.bundle", name="demo", modules=[hef])
    assert main(["bench", str(tmp_path / "hat.bundle"), "--matrix", "--json", "--frames", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    (row,) = [r for r in rows if r["artifact"] == "demo.hef"]
    assert row["runtime"] == "hailo" and row["latency_ms"] is None and reason in row["error"], row
    assert any(r["artifact"] == "demo_detector.onnx" and r["error"] is None for r in rows), rows


@pytest.mark.slow
@pytest.mark.tvm
def test_bench_matrix_shows_a_module_for_another_cpu_as_a_target_mismatch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bundle with the demo detector cross-compiled for a Pi 5 (`bundle build --tvm-target`):
    its row cannot run here and says why, naming both CPUs; the ONNX rows are measured."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # TVM's ONNX row compiles into it
    model = DEMO_MODELS / "demo_detector.onnx"
    build_bundle([model], tmp_path / "pi5.bundle", name="demo", modules=[pi5_module(model, tmp_path)])
    assert main(["bench", str(tmp_path / "pi5.bundle"), "--matrix", "--json", "--frames", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    (row,) = [r for r in rows if r["artifact"].endswith(".so")]
    assert row["runtime"] == "tvm" and row["latency_ms"] is None
    assert row["error"].startswith("TARGET_MISMATCH:") and "aarch64" in row["error"] and "x86_64" in row["error"]
    assert any(r["runtime"] == "onnxruntime" and r["error"] is None for r in rows)


def test_bench_workers_auto_takes_the_faster_measured_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(DEMO_MODELS / "demo_detector.onnx"), "--frames", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    measured = report["workers_auto_fps"]
    assert set(measured) == {str(w) for w, _ in worker_variants(usable_cores())}
    assert report["workers"] == int(max(measured, key=measured.__getitem__))
    assert main(["bench", str(DEMO_MODELS / "demo_detector_int8.tflite"), "--frames", "10", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["workers"] == 1 and "workers_auto_fps" not in report, "LiteRT serves one call at a time"


def test_bench_on_gst_and_ffmpeg_sources(gst: str, ffmpeg: str, tmp_path: Path, capsys) -> None:
    model = str(DEMO_MODELS / "demo_detector.onnx")
    gst = "gst:videotestsrc num-buffers=30 ! video/x-raw,width=640,height=480"
    assert main(["bench", model, "--source", gst, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["frames"], report["source"], report["dropped"]) == (30, gst, 0) and report["fps"] > 0
    clip = write_video(tmp_path / "clip.avi", 20, size=(320, 240))
    assert main(["bench", model, "--source", f"ffmpeg:{clip}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["frames"] == 20
    assert main(["bench", model, "--source", "gst:filesrc location=/nowhere.mp4 ! decodebin"]) == 1
    assert "gst-launch-1.0 exited with code" in capsys.readouterr().err


@pytest.mark.parametrize("classifier", ["demo_classify.onnx", "demo_classify_int8.tflite"])
def test_bench_measures_the_second_stage_per_tracked_object(capsys, classifier: str) -> None:
    model = str(DEMO_MODELS / "demo_detector.onnx")
    argv = ["bench", model, "--mode", "runtime", "--frames", "5", "--workers", "1"]
    assert main([*argv, "--classifier", str(DEMO_MODELS / classifier), "--crops", "12", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)["classifier"]
    assert cost["model"] == classifier and cost["crops"] == 12
    assert cost["runtime"] == ("onnxruntime" if classifier.endswith(".onnx") else "litert")
    ms = cost["ms_per_object"]
    assert 0 < ms["p50"] <= ms["p95"] and ms["mean"] > 0
    assert main([*argv, "--classifier", str(DEMO_MODELS / classifier), "--crops", "3"]) == 0
    assert f"second stage {classifier} on " in capsys.readouterr().out


def test_bench_refuses_a_detector_as_the_classifier(capsys) -> None:
    model = str(DEMO_MODELS / "demo_detector.onnx")
    argv = ["bench", model, "--mode", "runtime", "--frames", "3", "--workers", "1", "--classifier", model]
    assert main(argv) == 1
    assert "--classifier demo_detector.onnx: a classifier gives one output of class scores" in capsys.readouterr().err
    assert main([*argv[:-1], "missing.onnx"]) == 1
    assert "classifier model file not found: missing.onnx" in capsys.readouterr().err


# -- bench --against: a candidate against the serving model on the same frames ----------------------


def _against(capsys: pytest.CaptureFixture[str], *argv: str, status: int = 0) -> dict:
    assert main(["bench", *argv, "--json"]) == status
    return json.loads(capsys.readouterr().out)


def test_bench_against_the_same_bundle_agrees_fully(demo_bundle: Path, tmp_path: Path, capsys) -> None:
    clip = write_video(tmp_path / "clip.avi", 25, size=(320, 240))
    argv = [str(demo_bundle), "--against", str(demo_bundle), "--source", str(clip), "--min-agreement", "1"]
    result = _against(capsys, *argv)
    assert result["verdict"]["outcome"] == "agrees", "judged as the shadow judges: at 1.0, 1.0 agrees"
    assert result["serving"]["model"] == result["candidate"]["model"] == "demo 1.0.0"
    compared = result["comparison"]
    assert (compared["camera"], compared["frames"]) == (str(clip), 25), "every frame of the clip, once"
    assert compared["serving"] == compared["candidate"] == compared["matched"] > 25
    assert compared["precision"] == compared["recall"] == compared["agreement"] == compared["confident_ratio"] == 1.0
    assert compared["serving_ms"] > 0 and compared["candidate_ms"] > 0
    assert {c["label"] for c in compared["classes"]} <= {"circle", "square", "triangle"}, "the bundle's labels"
    assert all(c["agreement"] == 1.0 for c in compared["classes"])


@pytest.mark.slow
def test_bench_against_wrong_versions_disagrees_with_the_numbers(
    demo_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The three wrong versions of issue 38 (testkit's `altered`), each as a bundle against the
    serving demo bundle: the numbers say what went wrong."""
    clip = str(write_video(tmp_path / "clip.avi", 20, size=(320, 240)))

    def against(name: str, **change: Any) -> dict[str, Any]:
        model = altered(DEMO_MODELS / "demo_detector.onnx", tmp_path / f"{name}.onnx", **change)
        bundle = tmp_path / f"{name}.bundle"
        build_bundle([model], bundle, name=name, version="1.1.0")
        argv = [str(demo_bundle), "--against", str(bundle), "--source", clip, "--min-agreement", "0.8"]
        result = _against(capsys, *argv, status=1)
        assert result["verdict"]["outcome"] == "disagrees", "judged as the shadow judges: the exit says so"
        assert result["candidate"]["model"] == f"{name} 1.1.0"
        compared: dict[str, Any] = result["comparison"]
        assert compared["frames"] == 20 and compared["serving"] > 40
        return compared

    weak = against("weak", score_scale=0.2)
    assert weak["candidate"] < 0.2 * weak["serving"], "scores x 0.2: most fall below the threshold"
    assert weak["recall"] < 0.2 and weak["agreement"] < 0.35 and weak["confident_ratio"] == 0.0
    assert weak["precision"] > 0.8, "nothing it finds is wrong: it is blind, not confused"
    moved = against("moved", shift=0.2)
    assert moved["candidate"] > 0.5 * moved["serving"], "boxes as many, as sure..."
    assert moved["matched"] < 0.1 * moved["serving"] and moved["agreement"] < 0.15, "... in the wrong place"
    swapped = against("swapped", swap=(1, 2))
    classes = {c["label"]: c for c in swapped["classes"]}
    assert classes["circle"]["agreement"] > 0.9, "the class left alone agrees"
    assert classes["square"]["matched"] == classes["triangle"]["matched"] == 0, "squares found as triangles"
    assert classes["square"]["candidate"] > 0 and classes["triangle"]["candidate"] > 0


@pytest.mark.slow
def test_bench_against_two_stage_bundles_compares_the_second_stages_top1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The classifier's labels slipped in the candidate: its boxes agree, its crops are named
    otherwise; the text says it, the verdict fails it. Without a second stage on both: no top-1."""
    from agent.bundles.archive import ClassifierInput
    from pipelines.sources.synthetic import CLASS_NAMES

    clip = str(write_video(tmp_path / "clip.avi", 20, size=(320, 240)))
    two_stage = {}
    for name, labels in (("shapes", CLASS_NAMES), ("slipped", CLASS_NAMES[1:] + CLASS_NAMES[:1])):
        stage = ClassifierInput((DEMO_MODELS / "demo_classify.onnx",), labels)
        two_stage[name] = tmp_path / f"{name}.bundle"
        build_bundle([DEMO_MODELS / "demo_detector.onnx"], two_stage[name], name=name, classifier=stage)
    argv = [str(two_stage["shapes"]), "--against", str(two_stage["slipped"]), "--source", clip]
    result = _against(capsys, *argv, "--min-agreement", "0.8", status=1)
    compared = result["comparison"]
    assert compared["agreement"] == 1.0 and compared["crops"] >= 20 and compared["top1"] == 0.0
    assert "the second stage's top-1 agreement 0.00 < 0.8" in result["verdict"]["message"]
    assert main(["bench", *argv]) == 0
    assert f"second stage: top-1 agreement 0.00 over {compared['crops']} crops" in capsys.readouterr().out
    same = _against(capsys, str(two_stage["shapes"]), "--against", str(two_stage["shapes"]), "--source", clip)
    assert same["comparison"]["top1"] == 1.0 and same["comparison"]["crops"] == compared["crops"]
    plain = _against(capsys, str(two_stage["shapes"]), "--against", str(DEMO_MODELS / "demo_detector.onnx"),
                     "--source", clip)  # fmt: skip
    assert (plain["comparison"]["crops"], plain["comparison"]["top1"]) == (0, None)


def test_bench_against_text_shows_the_numbers_of_the_json(tmp_path: Path, capsys) -> None:
    clip = write_video(tmp_path / "clip.avi", 12, size=(320, 240))
    argv = [str(DEMO_MODELS / "demo_detector.onnx"), "--against", str(DEMO_MODELS / "demo_detector_int8.tflite")]
    argv += ["--source", str(clip), "--every", "2"]
    compared = _against(capsys, *argv)["comparison"]
    assert main(["bench", *argv]) == 0
    text = capsys.readouterr().out
    assert f"{compared['frames']} frames compared (one in 2)" in text and compared["frames"] == 6
    detections = f"serving {compared['serving']}, candidate {compared['candidate']}, matched {compared['matched']}"
    assert detections in text
    ratios = ("precision", "recall", "agreement", "confident ratio")
    values = (compared["precision"], compared["recall"], compared["agreement"], compared["confident_ratio"])
    assert "   ".join(f"{name} {value:.2f}" for name, value in zip(ratios, values, strict=True)) in text
    assert re.search(r"latency p50: serving \d+\.\d\d ms   candidate \d+\.\d\d ms", text), "timed anew: the form"
    rows = {
        line.split()[0]: line.split()[1:]
        for line in text.splitlines()
        if line.startswith("  ") and len(line.split()) == 6
    }
    for c in compared["classes"]:
        ratio = "-" if c["confident_ratio"] is None else f"{c['confident_ratio']:.2f}"
        assert rows[c["label"]] == [
            str(c["serving"]),
            str(c["candidate"]),
            str(c["matched"]),
            f"{c['agreement']:.2f}",
            ratio,
        ]


def test_bench_against_reads_each_frame_of_a_file_once(tmp_path: Path, capsys) -> None:
    clip = write_video(tmp_path / "clip.avi", 10, size=(320, 240))
    model = str(DEMO_MODELS / "demo_detector.onnx")
    argv = [model, "--against", model, "--source", str(clip)]
    assert _against(capsys, *argv, "--frames", "40")["comparison"]["frames"] == 10, "no second pass of the file"
    assert _against(capsys, *argv, "--frames", "4")["comparison"]["frames"] == 4
    assert _against(capsys, *argv, "--every", "3")["comparison"]["frames"] == 4, "frames 0, 3, 6 and 9"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["missing.onnx", "--against", "MODEL", "--source", "synthetic"], "MODEL|BUNDLE: file not found: missing.onnx"),
        (
            ["MODEL", "--against", "missing.bundle", "--source", "synthetic"],
            "--against: file not found: missing.bundle",
        ),
        (["MODEL", "--against", "MODEL"], "--against compares two models on the same frames: give them with --source"),
        (["MODEL", "--against", "MODEL", "--source", "synthetic", "--matrix"], "not with --matrix"),
        (["MODEL", "--against", "MODEL", "--source", "synthetic", "--mode", "runtime"], "not with --mode runtime"),
        (["MODEL", "--every", "2"], "--every picks the frames --against compares: give --against OTHER"),
        (
            ["MODEL", "--against", "MODEL", "--source", "synthetic", "--every", "0"],
            "argument --every: expected a positive integer, got 0",
        ),
        (["MODEL", "--against", "LABELS", "--source", "synthetic"], "--against labels.txt: "),
        (["MODEL", "--against", "MODEL", "--source", "none.mp4"], "cannot open video file none.mp4"),
        (["MODEL", "--min-agreement", "0.8"], "--min-agreement judges what --against compares: give --against"),
        (
            ["MODEL", "--against", "MODEL", "--source", "synthetic", "--min-agreement", "2"],
            "argument --min-agreement: expected a number within 0..1, got 2",
        ),
    ],
)
def test_bench_against_refuses_bad_input_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "labels.txt").write_text("circle\n")
    names = {"MODEL": str(DEMO_MODELS / "demo_detector.onnx"), "LABELS": "labels.txt"}
    try:
        code = main(["bench", *[names.get(a, a) for a in argv]])
    except SystemExit as exc:  # argparse's own refusal
        code = exc.code
    assert code == (2 if error.startswith("argument --") else 1)
    assert error in capsys.readouterr().err


@pytest.mark.slow
def test_bench_motion_reports_the_frames_it_inferred(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from testkit.motion_clips import still_scene
    from testkit.real_models import write_clip

    clip = str(write_clip(tmp_path / "still.avi", still_scene().frames(100), fps=10.0))
    model = str(DEMO_MODELS / "demo_detector.onnx")
    assert main(["bench", model, "--source", clip, "--workers", "1", "--motion", "--json"]) == 0
    gated = json.loads(capsys.readouterr().out)
    assert gated["frames"] == 100 and 0 < gated["inferred_frames"] < 100, gated
    assert main(["bench", model, "--source", clip, "--workers", "1", "--json"]) == 0
    assert "inferred_frames" not in json.loads(capsys.readouterr().out)
    assert main(["bench", model, "--source", clip, "--workers", "1", "--motion"]) == 0
    assert re.search(r"motion: \d+ of 100 frames inferred", capsys.readouterr().out)
    assert main(["bench", model, "--mode", "runtime", "--motion"]) != 0
    assert "--motion gates a camera's frames: only in --mode pipeline" in capsys.readouterr().err
