"""`edge-agent detect`: the COCO models on photos, labels, thresholds, decoders, bad input as one line,
videos every N-th frame, ``--save-dir``, ``--track`` and ``--line``, export layouts never seen before."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from onnx import helper, numpy_helper
from testkit import DEMO_MODELS, REPO
from testkit.detect_output import check_detect_output
from testkit.media import write_video
from testkit.onnx_models import rewrite, two_overlapping_boxes
from testkit.tracking import LINE, MOVERS, true_crossings

from agent.cli import main
from pipelines.sources.tracking_scene import TrackingScene


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

    from pipelines.sources.synthetic import SyntheticScene

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

    from pipelines.sources.synthetic import SyntheticScene

    image, _ = SyntheticScene(seed=5).render(0)
    cv2.imwrite(str(tmp_path / "frame.png"), image)
    video = write_video(tmp_path / "clip.avi", 4, size=(320, 240))
    out = tmp_path / "annotated"
    model = str(DEMO_MODELS / "demo_detector.onnx")
    assert main(["detect", model, str(tmp_path / "frame.png"), str(video), "--every", "2", "--save-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["clip_000000.jpg", "clip_000002.jpg", "frame.jpg"]
    drawn = cv2.imread(str(out / "frame.jpg"))
    assert drawn.shape == image.shape and (abs(drawn.astype(int) - image.astype(int)) > 100).any()


def test_dynamic_model_gets_the_smallest_stride_multiple_input(capsys) -> None:
    """Rect inference: a 640x480 frame into a dynamic 320 model is letterboxed to 320x256."""
    model = str(DEMO_MODELS / "demo_detector_dynamic.onnx")
    assert main(["bench", model, "--frames", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_shape"] == [1, 3, 256, 320]
    assert main(["bench", str(DEMO_MODELS / "demo_detector.onnx"), "--frames", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_shape"] == [1, 3, 320, 320]


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
    model = constant_model(np.zeros((1, 3, 4), np.float32))
    assert main(["detect", str(model), str(photos["coffee"])]) == 1
    err = capsys.readouterr().err
    assert "model outputs match no decoder: found (1, 3, 4)" in err


def test_one_class_score_output_without_metadata_is_a_classifier(constant_model, photos, capsys) -> None:
    """(1, nc) and no task in the metadata: class scores (here logits, so softmax), not detections."""
    model = constant_model(np.log(np.array([[1, 2, 3, 4, 5, 6, 7]], np.float32)))
    assert main(["detect", str(model), str(photos["coffee"]), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert [c["class_id"] for c in record["classes"]] == [6, 5, 4, 3, 2]
    assert record["classes"][0]["score"] == pytest.approx(7 / 28, abs=1e-4)


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


FRAMES = 130


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The crossings clip of test_lines_zones as an MJPG .avi (every frame a keyframe)."""
    path = tmp_path_factory.mktemp("track") / "crossings.avi"
    scene = TrackingScene(movers=MOVERS, seed=5)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 15.0, (640, 480))
    for index in range(FRAMES):
        writer.write(scene.render(index)[0])
    writer.release()
    return path


def test_track_json_gives_ids_and_a_summary_of_the_true_crossings(
    video: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = ",".join(f"{v:g}" for v in (*LINE.start, *LINE.end))
    reverse = ",".join(f"{v:g}" for v in (*LINE.end, *LINE.start))
    model = str(DEMO_MODELS / "demo_detector.onnx")
    assert main(["detect", model, str(video), "--track", "--line", line, "--line", reverse, "--json"]) == 0
    records = [json.loads(text) for text in capsys.readouterr().out.splitlines()]
    frames, summary = records[:-1], records[-1]["summary"]
    assert [r["frame"] for r in frames] == list(range(FRAMES))
    ids = {d["tracker_id"] for r in frames for d in r["detections"]}
    assert all("tracker_id" in d for r in frames for d in r["detections"])
    assert None in ids, "a new object's first frame has no id yet"
    assert ids - {None} == set(range(1, summary["tracks"] + 1))
    assert summary["tracks"] >= len(MOVERS), summary
    truth = true_crossings(MOVERS, FRAMES, LINE)
    down = sum(n for (_, direction), n in truth.items() if direction == "forward")
    up = sum(n for (_, direction), n in truth.items() if direction == "backward")
    assert summary["lines"] == [
        {"points": [list(LINE.start), list(LINE.end)], "forward": down, "backward": up},
        {"points": [list(LINE.end), list(LINE.start)], "forward": up, "backward": down},
    ]


def test_track_text_output_and_bad_lines(video: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(DEMO_MODELS / "demo_detector.onnx")
    assert main(["detect", model, str(video), "--track", "--every", "5", "--line", "0,240,640,240"]) == 0
    out = capsys.readouterr().out
    assert "#1" in out and "object(s) tracked" in out and "line (0, 240) -> (640, 240):" in out
    assert main(["detect", model, str(video), "--line", "0,240,640,240"]) != 0
    assert "--line counts tracked objects: add --track" in capsys.readouterr().err
    for bad, message in (("1,2,3", "got 3 in"), ("1,2,x,4", "four numbers"), ("5,5,5,5", "must differ")):
        with pytest.raises(SystemExit):
            main(["detect", model, str(video), "--track", "--line", bad])
        assert message in capsys.readouterr().err


def test_the_iou_threshold_reaches_the_detector_from_the_cli(tmp_path: Path, constant_model, capsys) -> None:
    from agent.cli import main

    model = two_overlapping_boxes(constant_model)
    image = tmp_path / "grey.png"
    cv2.imwrite(str(image), np.full((64, 64, 3), 114, np.uint8))
    found = {}
    for iou in ("0.6", "0.7"):
        capsys.readouterr()
        assert main(["detect", str(model), str(image), "--decoder", "yolov8", "--iou", iou, "--json"]) == 0
        found[iou] = len(json.loads(capsys.readouterr().out)["detections"])
    assert found == {"0.6": 1, "0.7": 2}


def transposed(src: Path, dst: Path) -> Path:
    return rewrite(src, dst, [helper.make_node("Transpose", ["raw0"], ["output0"], perm=[0, 2, 1])], [], [1, 8400, 84])


def normalised(src: Path, dst: Path) -> Path:
    scale = np.ones((1, 84, 1), np.float32)
    scale[0, :4] = 1 / 640
    return rewrite(
        src,
        dst,
        [helper.make_node("Mul", ["raw0", "scale"], ["output0"])],
        [numpy_helper.from_array(scale, "scale")],
        [1, 84, 8400],
    )


def with_objectness(src: Path, dst: Path) -> Path:
    """(1, 8400, 85): boxes, objectness 1.0, class scores (a YOLOv5-style row layout)."""
    nodes = [
        helper.make_node("Transpose", ["raw0"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Split", ["t", "split"], ["box", "cls"], axis=2),
        helper.make_node("Concat", ["box", "obj", "cls"], ["output0"], axis=2),
    ]
    inits = [
        numpy_helper.from_array(np.array([4, 80], np.int64), "split"),
        numpy_helper.from_array(np.ones((1, 8400, 1), np.float32), "obj"),
    ]
    return rewrite(src, dst, nodes, inits, [1, 8400, 85])


def no_metadata(src: Path, dst: Path) -> Path:
    return rewrite(
        src, dst, [helper.make_node("Identity", ["raw0"], ["output0"])], [], [1, 84, 8400], keep_metadata=False
    )


def detections(capsys, model: Path, image: Path, *extra: str) -> list[dict]:
    assert main(["detect", str(model), str(image), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)["detections"]


@pytest.mark.parametrize("variant", [transposed, normalised, with_objectness, no_metadata])
def test_variants_match_the_original(shared_models, photos, tmp_path, capsys, variant) -> None:
    original = shared_models / "yolov8n_int8_640.onnx"
    model = variant(original, tmp_path / f"{variant.__name__}.onnx")
    labels = ["--labels", str(shared_models / "coco80_labels.txt")]
    for name in ("astronaut", "coffee"):
        want = detections(capsys, original, photos[name])
        got = detections(capsys, model, photos[name], *labels)
        assert [d["label"] for d in got] == [d["label"] for d in want]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g["box"], w["box"], atol=1.0)
            assert g["score"] == pytest.approx(w["score"], abs=1e-3)


def test_detects_help_gives_a_bundles_default_thresholds_and_where_a_device_takes_its_own(capsys) -> None:
    """The defaults detect runs with are those a bundle built without --conf --iou --max-det
    carries (its exporter's, else the project's), and its help says where the values a camera
    serves with come from."""
    from agent.bundles.manifest import DetectionThresholds

    with pytest.raises(SystemExit):
        main(["detect", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    bundle = DetectionThresholds()
    exporter = "default: the model's exporter's (Ultralytics"
    assert f"keep detections scoring above this, 0..1 ({exporter} 0.25), else {bundle.conf})" in text
    assert f"more than this, 0..1 ({exporter} 0.7), else {bundle.iou})" in text
    assert f"most detections kept per image (default {bundle.max_det})" in text
    assert "agent.yaml's cameras[].conf, iou, max_det and classes where set, else by its bundle's" in text
    assert "the status page and /api/status the values in force on each camera" in text


@pytest.mark.models
def test_an_ultralytics_export_defaults_to_ultralytics_thresholds_and_asked_for_ones_win(shared_models: Path) -> None:
    """Issue 37: with edge-agent's NMS default (0.45) two images of twelve differed from `yolo
    predict`'s (0.7). A model whose metadata names Ultralytics as its author takes Ultralytics'
    defaults; the project's demo model (author edge-agent) keeps the project's; a value asked
    for wins over either."""
    from pipelines.decoding.detection_filter import DetectionFilter
    from pipelines.decoding.detector import Detector
    from runtimes.registry import load_runtime

    with load_runtime("onnxruntime", shared_models / "yolov8n_int8_640.onnx") as runtime:
        assert runtime.metadata.raw["author"] == "Ultralytics"
        assert Detector(runtime).detection_filter == DetectionFilter(conf=0.25, iou=0.7, max_det=300)
        assert Detector(runtime, iou=0.5, max_det=9).detection_filter == DetectionFilter(0.25, 0.5, 9)
    with load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx") as runtime:
        assert Detector(runtime).detection_filter == DetectionFilter(conf=0.25, iou=0.45, max_det=300)
        assert Detector(runtime, conf=0.6).detection_filter == DetectionFilter(0.6, 0.45, 300)


def test_detect_imports_only_the_runtime_it_runs_and_those_ranked_before(tmp_path: Path) -> None:
    """A one-shot command probes runtimes in the policy's order until one loads: OpenVINO (0.46 s,
    33 MB to import) is never imported by a `detect` that ONNX Runtime serves, and serves when asked."""
    pytest.importorskip("openvino")
    image = tmp_path / "frame.png"
    cv2.imwrite(str(image), TrackingScene(seed=2).render(0)[0])
    script = (
        "import sys\n"
        "from agent.cli import main\n"
        "code = main(['detect', sys.argv[1], sys.argv[2], '--json'] + sys.argv[3:])\n"
        "names = ('openvino', 'onnxruntime', 'ai_edge_litert')\n"
        "print('libraries', code, *sorted(m for m in names if m in sys.modules))\n"
    )
    model = str(DEMO_MODELS / "demo_detector.onnx")

    def run(*extra: str) -> tuple[dict[str, object], list[str]]:
        proc = subprocess.run([sys.executable, "-c", script, model, str(image), *extra], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        record, last = proc.stdout.splitlines()[0], proc.stdout.splitlines()[-1]
        return json.loads(record), last.split()[1:]

    record, loaded = run()
    assert record["runtime"] == "onnxruntime" and loaded == ["0", "onnxruntime"]
    record, loaded = run("--runtime", "openvino")
    assert record["runtime"] == "openvino" and "openvino" in loaded and "onnxruntime" not in loaded


def test_detect_runs_an_openvino_ir(tmp_path: Path, capsys) -> None:
    """An OpenVINO IR (``.xml`` with its ``.bin``) is a model `detect` takes: OpenVINO runs it."""
    ov = pytest.importorskip("openvino", reason="the openvino extra is not installed")
    from pipelines.sources.synthetic import SyntheticScene

    xml = tmp_path / "demo.xml"
    ov.save_model(ov.Core().read_model(str(DEMO_MODELS / "demo_detector.onnx")), str(xml), compress_to_fp16=False)
    image = tmp_path / "scene.png"
    cv2.imwrite(str(image), SyntheticScene(seed=2, num_shapes=5).render(0)[0])
    (ir,) = run_json(capsys, str(xml), str(image))
    (from_onnx,) = run_json(capsys, str(DEMO_MODELS / "demo_detector.onnx"), str(image))
    assert ir["runtime"] == "openvino" and from_onnx["runtime"] == "onnxruntime"
    assert len(ir["detections"]) >= 3
    assert [d["label"] for d in ir["detections"]] == [d["label"] for d in from_onnx["detections"]]


@pytest.mark.slow
def test_track_with_motion_counts_as_without_and_infers_fewer_frames(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The crossings clip with a triangle standing still all along: ``--motion`` repeats the last
    detections where nothing moved (``"inferred": false``), counts the same crossings, confirms
    every track within a second of the run without it, and its last line says how many frames
    it inferred; every record fits docs/detect-output.schema.json."""
    from pipelines.sources.tracking_scene import Mover

    still = Mover(6, 2, 60, 0, FRAMES - 1, (520.0, 330.0), (0.0, 0.0), (20, 190, 220))
    scene = TrackingScene(movers=[*MOVERS, still], seed=5)
    clip = tmp_path / "still.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter.fourcc(*"MJPG"), 15.0, (640, 480))
    for index in range(FRAMES):
        writer.write(scene.render(index)[0])
    writer.release()
    line = ",".join(f"{v:g}" for v in (*LINE.start, *LINE.end))
    model = str(DEMO_MODELS / "demo_detector.onnx")

    def records(*more: str) -> list[dict[str, Any]]:
        assert main(["detect", model, str(clip), "--track", "--line", line, "--json", *more]) == 0
        found = [json.loads(text) for text in capsys.readouterr().out.splitlines()]
        for record in found:
            check_detect_output(record)
        return found

    def starts(frames: list[dict[str, Any]]) -> list[int]:
        first: dict[int, int] = {}
        for r in frames:
            for d in r["detections"]:
                if d["tracker_id"] is not None:
                    first.setdefault(d["tracker_id"], r["frame"])
        return [first[t] for t in sorted(first)]

    plain, gated = records(), records("--motion")
    assert [r["frame"] for r in gated[:-1]] == list(range(FRAMES))
    summary = gated[-1]["summary"]
    assert summary["lines"] == plain[-1]["summary"]["lines"] and summary["tracks"] == plain[-1]["summary"]["tracks"]
    assert summary["frames"] == FRAMES and 0 < summary["inferred_frames"] < FRAMES
    assert sum(not r["inferred"] for r in gated[:-1]) == FRAMES - summary["inferred_frames"]
    assert all("inferred" not in r for r in plain[:-1]) and "frames" not in plain[-1]["summary"]
    for a, b in zip(starts(plain[:-1]), starts(gated[:-1]), strict=True):
        assert abs(a - b) <= 15, "within a second at 15 FPS"
    repeated = [(a, b) for a, b in itertools.pairwise(gated[:-1]) if not b["inferred"]]
    assert repeated and all(
        [d["box"] for d in a["detections"]] == [d["box"] for d in b["detections"]] for a, b in repeated
    )
    assert main(["detect", model, str(clip), "--motion"]) == 0
    text = capsys.readouterr().out
    untracked = re.search(rf"^motion: (\d+) of {FRAMES} frame\(s\) inferred$", text, re.MULTILINE)
    assert untracked and int(untracked[1]) <= summary["inferred_frames"], "no tracker: no keepalive to add"
    assert ", not inferred: nothing moved]" in text and "object(s) tracked" not in text
