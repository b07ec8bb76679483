"""End to end on real model exports: NMS and end-to-end exports, RT-DETR and DETR-style models through
detect, bundle build and activation; nonsense refused."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from testkit import REPO
from testkit.bundles import read_files, resign, write_tar

from agent.bundles.archive import build_bundle
from agent.bundles.installer import InstallPolicy, install
from agent.bundles.signing import load_private_key, load_public_key
from agent.bundles.store import Store
from agent.cli import main
from agent.errors import BundleError, ErrorCode
from agent.hardware.board import probe
from runtimes.registry import load_runtime

onnx_tools = pytest.importorskip("testkit.onnx_models")


PHOTOS = ("astronaut", "chelsea", "coffee")


@pytest.fixture(scope="module")
def models(shared_models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("end2end")
    base = shared_models / "yolov8n_int8_640.onnx"
    e2e = onnx_tools.end2end_topk(base, folder / "e2e.onnx")
    return {
        "base": base,
        "end2end": e2e,
        "end2end-plain": onnx_tools.end2end_topk(base, folder / "e2e_plain.onnx", keep_metadata=False),
        "batch-index": onnx_tools.with_batch_index(e2e, folder / "e2e_batch.onnx"),
        "nms": onnx_tools.nms_export(base, folder / "nms.onnx"),
        "nms-normalised": onnx_tools.nms_export(base, folder / "nms_normalised.onnx", scale=1 / 640),
        "nonsense": onnx_tools.nonsense(e2e, folder / "nonsense.onnx"),
    }


def detect(capsys, model: Path, image: Path, *extra: str) -> dict:
    assert main(["detect", str(model), str(image), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def refused(capsys, *argv: str) -> str:
    assert main(list(argv)) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("edge-agent: error:")
    return err


def same(a: dict, b: dict) -> bool:
    return (
        a["class_id"] == b["class_id"]
        and np.allclose(a["box"], b["box"], atol=1.0)
        and abs(a["score"] - b["score"]) < 2e-3
    )


@pytest.mark.parametrize("variant", ["nms", "nms-normalised"])
def test_nms_exports_match_the_base_model(models, photos, capsys, variant) -> None:
    """Ultralytics `nms=True`: NMS inside the graph at the same thresholds gives the base model's detections."""
    labels = ["--labels", str(models["base"].parent / "coco80_labels.txt")]
    for name in PHOTOS:
        want = detect(capsys, models["base"], photos[name])["detections"]
        got = detect(capsys, models[variant], photos[name], *labels)
        assert got["decoder"] == "end2end"
        assert len(got["detections"]) == len(want) > 0
        assert all(same(g, w) for g, w in zip(got["detections"], want, strict=True)), (got, want)


@pytest.mark.parametrize("variant", ["end2end", "end2end-plain", "batch-index"])
def test_end2end_exports_keep_the_base_models_detections(models, photos, capsys, variant) -> None:
    """YOLOv10 / YOLO26-style top-300 rows (no NMS; this head is one-to-many, so duplicates stay):
    the best detection is the base model's, and every base detection is among the rows."""
    for name in PHOTOS:
        want = detect(capsys, models["base"], photos[name])["detections"]
        got = detect(
            capsys, models[variant], photos[name], "--labels", str(models["base"].parent / "coco80_labels.txt")
        )
        assert got["decoder"] == "end2end"
        assert same(got["detections"][0], want[0])
        assert all(any(same(g, w) for g in got["detections"]) for w in want)
        assert all(0.25 < d["score"] <= 1.0 for d in got["detections"])


def test_the_issues_cat_is_a_cat(models, photos, capsys) -> None:
    """The report: an end-to-end model printed `person 12.84` on chelsea. Now auto reads it as
    end2end, and the YOLOv5 reading is refused naming the shape and the impossible score."""
    result = detect(capsys, models["end2end"], photos["chelsea"])
    top = result["detections"][0]
    assert (result["decoder"], top["label"]) == ("end2end", "cat") and top["score"] < 1
    err = refused(capsys, "detect", str(models["end2end"]), str(photos["chelsea"]), "--decoder", "yolov5")
    assert "decoder yolov5 does not fit this model's outputs (1, 300, 6)" in err
    assert "scores outside [0, 1]" in err and "12.8" in err


def test_nonsense_is_refused_by_detect(models, photos, capsys) -> None:
    model, image = str(models["nonsense"]), str(photos["chelsea"])
    err = refused(capsys, "detect", model, image, "--decoder", "end2end")
    assert "decoder end2end does not fit this model's outputs (1, 300, 6)" in err
    assert "scores outside [0, 1]" in err and "inverted" in err
    err = refused(capsys, "detect", model, image)
    assert "(1, 300, 6)" in err and "end2end:" in err


@pytest.mark.parametrize("decoder", ["auto", "end2end"])
def test_nonsense_is_refused_at_bundle_build(models, tmp_path, decoder) -> None:
    with pytest.raises(BundleError) as caught:
        build_bundle([models["nonsense"]], tmp_path / "b.bundle", version="1.0.0", decoder=decoder)
    assert caught.value.code == ErrorCode.DECODER_MISMATCH
    assert "nonsense.onnx" in caught.value.message and "(1, 300, 6)" in caught.value.message
    assert not (tmp_path / "b.bundle").exists()


def test_bundle_build_records_end2end_and_activation_refuses_nonsense(models, tmp_path, keys) -> None:
    good = tmp_path / "good.bundle"
    manifest = build_bundle([models["end2end"]], good, version="1.0.0", key=load_private_key(keys["private"]))
    assert manifest.decoder == "end2end" and manifest.input.resize == "letterbox"
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])])
    store = Store(tmp_path / "state")
    assert install(good, store, probe(), policy).state == "SUCCEEDED"
    # The same bundle with the artifact forced to nonsense, and reference outputs that match it,
    # so only the guard can tell.
    files = read_files(good)
    files["e2e.onnx"] = models["nonsense"].read_bytes()
    with np.load(io.BytesIO(files["reference.npz"])) as npz:
        reference = dict(npz)
    with load_runtime("onnxruntime", models["nonsense"]) as runtime:
        reference["e2e.onnx__output0"] = runtime.infer([reference["e2e.onnx__input"]])[0]
    buffer = io.BytesIO()
    np.savez(buffer, **reference)
    files["reference.npz"] = buffer.getvalue()
    bad = write_tar(tmp_path / "bad.bundle", resign(files, keys["private"], lambda m: m.update(version="1.0.1")))
    deployment = install(bad, store, probe(), policy)
    assert deployment.state == "ROLLED_BACK"
    assert deployment.error and deployment.error.code == "DECODER_MISMATCH"
    assert "(1, 300, 6)" in deployment.error.message
    assert store.info(store.current_sha() or "") and store.current_sha() != deployment.sha256


#: what Ultralytics 8.4.190 writes into an RT-DETR export (read from a real export)
RTDETR_META = {
    "description": "Ultralytics rtdetr-l model ",
    "author": "Ultralytics",
    "version": "8.4.190",
    "task": "detect",
    "stride": "32",
    "imgsz": "[640, 640]",
    "names": str({i: str(i) for i in range(80)}),
    "args": onnx_tools.ULTRALYTICS_ARGS.format(nms=None),
    "end2end": "False",
}


# stretched onto coffee (600 x 400): a cat in the middle, a person top left
WANT = [(15, [150, 40, 450, 360], 0.91), (0, [120, 80, 180, 160], 0.66)]


def rtdetr_rows(path: Path, metadata: dict | None) -> Path:
    """Ultralytics 8.4's RT-DETR head: (1, 300, 6) rows cx, cy, w, h, score, class (normalised),
    the top 300 (query, class) pairs, best first."""
    rng = np.random.default_rng(5)
    out = np.zeros((1, 300, 6), np.float32)
    out[0, :, :4] = rng.uniform(0.2, 0.4, (300, 4))
    out[0, :, 4] = np.sort(rng.uniform(0.001, 0.02, 300))[::-1]
    out[0, :, 5] = rng.integers(0, 80, 300)
    out[0, :2] = [[0.5, 0.5, 0.5, 0.8, 0.91, 15], [0.25, 0.3, 0.1, 0.2, 0.66, 0]]
    return onnx_tools.constant_outputs_model({"output0": out}, path, size=640, metadata=metadata)


def rtdetr_class_scores(path: Path, metadata: dict | None) -> Path:
    """Earlier RT-DETR exports: (1, 300, 4+nc) normalised boxes and per-class scores, nc = 2 here."""
    rng = np.random.default_rng(5)
    out = np.zeros((1, 300, 6), np.float32)
    out[0, :, :4] = rng.uniform(0.2, 0.4, (300, 4))
    out[0, :, 4:] = rng.uniform(0.001, 0.1, (300, 2))
    out[0, 17] = [0.5, 0.5, 0.5, 0.8, 0.02, 0.91]  # class 1
    out[0, 42] = [0.25, 0.3, 0.1, 0.2, 0.66, 0.03]  # class 0
    return onnx_tools.constant_outputs_model({"output0": out}, path, size=640, metadata=metadata)


def assert_found(result: dict, want: list) -> None:
    assert result["decoder"] == "rtdetr"
    got = [(d["class_id"], d["box"], d["score"]) for d in result["detections"]]
    assert [g[0] for g in got] == [w[0] for w in want]
    for (_, box, score), (_, want_box, want_score) in zip(got, want, strict=True):
        np.testing.assert_allclose(box, want_box, atol=0.5)
        assert score == pytest.approx(want_score, abs=1e-3)


def test_rtdetr_rows_from_metadata_and_from_content(photos, tmp_path, capsys) -> None:
    """Ultralytics 8.4.190 RT-DETR exports: (1, 300, 6) rows with the metadata a real export carries,
    and the same rows without metadata, recognised by content."""
    assert_found(detect(capsys, rtdetr_rows(tmp_path / "named.onnx", RTDETR_META), photos["coffee"]), WANT)
    assert_found(detect(capsys, rtdetr_rows(tmp_path / "plain.onnx", None), photos["coffee"]), WANT)


def test_rtdetr_class_scores_from_metadata_or_by_name(photos, tmp_path, capsys) -> None:
    meta = {**RTDETR_META, "names": "{0: 'person', 1: 'cat'}"}
    want = [(1, *WANT[0][1:]), WANT[1]]
    assert_found(detect(capsys, rtdetr_class_scores(tmp_path / "named.onnx", meta), photos["coffee"]), want)
    plain = rtdetr_class_scores(tmp_path / "plain.onnx", None)
    assert_found(detect(capsys, plain, photos["coffee"], "--decoder", "rtdetr"), want)
    # without metadata the shape is also YOLOv5's: auto does not guess RT-DETR
    assert detect(capsys, plain, photos["coffee"])["decoder"] == "yolov5"


def detr_graph(path: Path, softmax: bool, reverse: bool = False) -> Path:
    """boxes (1, Q, 4) + logits (1, Q, C): RF-DETR-like (300 queries, 91 sigmoid classes) or
    DETR-like (100 queries, 91 classes + 'no object', softmax). One object: class 17 at query 9."""
    queries, columns = (100, 92) if softmax else (300, 91)
    rng = np.random.default_rng(6)
    boxes = rng.uniform(0.2, 0.4, (1, queries, 4)).astype(np.float32)
    boxes[0, 9] = [0.5, 0.5, 0.5, 0.8]
    logits = rng.uniform(-9.0, -5.0, (1, queries, columns)).astype(np.float32)
    if softmax:
        logits[0, :, -1] = 5.0
    logits[0, 9, 17] = 8.0
    outputs = {"dets": boxes, "labels": logits}
    if reverse:
        outputs = {"labels": logits, "dets": boxes}
    return onnx_tools.constant_outputs_model(outputs, path, size=560)


@pytest.mark.parametrize(("softmax", "reverse"), [(False, False), (True, False), (False, True)])
def test_detr_style_models(photos, tmp_path, capsys, softmax, reverse) -> None:
    result = detect(capsys, detr_graph(tmp_path / "detr.onnx", softmax, reverse), photos["coffee"])
    assert result["decoder"] == "detr"
    (found,) = result["detections"]
    assert found["class_id"] == 17 and found["score"] > 0.9
    np.testing.assert_allclose(found["box"], [150, 40, 450, 360], atol=0.5)


def test_bundle_build_records_rtdetr_and_detr(photos, tmp_path) -> None:
    plain = rtdetr_class_scores(tmp_path / "rtdetr_plain.onnx", None)
    assert build_bundle([plain], tmp_path / "r.bundle", version="1.0.0", decoder="rtdetr").decoder == "rtdetr"
    manifest = build_bundle([detr_graph(tmp_path / "detr.onnx", False)], tmp_path / "d.bundle", version="1.0.0")
    assert (manifest.decoder, manifest.input.resize) == ("detr", "stretch")


def test_auto_moves_to_the_next_candidate_when_a_frame_reads_implausibly(tmp_path, capsys, caplog) -> None:
    """Both candidates read the blank (black) frame plausibly (nothing there); on a grey frame the
    rows are YOLOv5's (cx, cy, w, h, objectness, class score), impossible as end2end (x2 < x1)."""
    import cv2

    rows = np.zeros((1, 10, 6), np.float32)
    rows[0, 0] = [32, 32, 10, 10, 0.9, 0.8]
    model = onnx_tools.brightness_model(rows, tmp_path / "m.onnx", metadata={"end2end": "True"})
    grey = tmp_path / "grey.png"
    cv2.imwrite(str(grey), np.full((64, 64, 3), 114, np.uint8))
    result = detect(capsys, model, grey)
    assert result["decoder"] == "yolov5"
    (found,) = result["detections"]
    np.testing.assert_allclose(found["box"], [27, 27, 37, 37], atol=0.01)
    assert found["score"] == pytest.approx(0.72, abs=1e-3)
    assert "decoder end2end read a frame implausibly" in caplog.text and "switching to yolov5" in caplog.text
    err = refused(capsys, "detect", str(model), str(grey), "--decoder", "end2end")
    assert "decoder end2end does not fit this model's outputs (1, 10, 6)" in err and "1 inverted" in err


QUERY_MODELS = REPO / "tests" / "data" / "query_models"


@pytest.mark.parametrize(("name", "score"), [("end2end", 0.91), ("rtdetr", 0.91), ("detr", 0.9997)])
def test_query_decoders_on_litert(photos, capsys, name, score) -> None:
    """The project's own LiteRT graphs with known rows (converted by litert-torch with
    scripts/make_query_models.py): one object, the same box on the square astronaut photo
    (end2end letterboxes, rtdetr and detr stretch: no padding either way)."""
    result = detect(capsys, QUERY_MODELS / f"{name}.tflite", photos["astronaut"])
    assert (result["runtime"], result["decoder"]) == ("litert", name)
    (found,) = result["detections"]
    assert found["class_id"] == 15 and found["score"] == pytest.approx(score, abs=1e-3)
    np.testing.assert_allclose(found["box"], [128, 51.2, 384, 460.8], atol=0.5)
