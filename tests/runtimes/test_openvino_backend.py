"""`runtimes.openvino_backend`: specs and metadata, the compiled-model cache and its key, hints and
threads, devices, bad files, concurrent calls, OpenVINO's own IR (``.xml`` + ``.bin``), and parity
with ONNX Runtime (the demo detector on synthetic scenes; the real COCO models on photos)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.bad_bundles import mystery_model

from pipelines.decoding.detector import Detector
from pipelines.measure.parity import detection_agreement
from pipelines.sources.synthetic import SyntheticScene
from runtimes.base import InferenceError, LoadOptions, ModelLoadError, NotAModelError, RuntimeUnavailable
from runtimes.openvino_backend import OpenVINOBackend, availability, hint_for, load, model_files, tune
from runtimes.openvino_settings import BACKEND, OpenVINOConfig, with_state_dir
from runtimes.ort_backend import OnnxRuntimeBackend
from runtimes.registry import BACKENDS, RuntimeSettings, load_runtime

ov = pytest.importorskip("openvino", reason="the openvino extra is not installed")


def _load(path: Path, config: OpenVINOConfig | None = None, workers: int = 1) -> OpenVINOBackend:
    return load(path, config or OpenVINOConfig(), LoadOptions(warmup=True, workers=workers))


def test_specs_metadata_and_infer(constant_model) -> None:
    out = np.arange(2 * 6, dtype=np.float32).reshape(1, 2, 6)
    path = constant_model(out, metadata={"names": "{0: 'a', 1: 'b'}", "imgsz": "[64, 64]", "stride": "32"})
    with _load(path) as rt:
        (spec,) = rt.inputs
        assert (spec.name, spec.shape, spec.dtype, spec.layout) == ("images", (1, 3, 64, 64), np.float32, "NCHW")
        assert rt.outputs[0].shape == (1, 2, 6) and rt.outputs[0].dtype == np.float32
        assert rt.metadata.names == {0: "a", 1: "b"} and rt.metadata.imgsz == (64, 64) and rt.metadata.stride == 32
        assert rt.device == "CPU" and rt.concurrent
        (result,) = rt.infer([np.ones((1, 3, 64, 64), np.float32)])
        np.testing.assert_array_equal(result, out)
    with pytest.raises(InferenceError, match="was closed"):
        rt.infer([np.ones((1, 3, 64, 64), np.float32)])


def test_wrong_inputs_are_refused(constant_model) -> None:
    with _load(constant_model(np.zeros((1, 2, 6), np.float32))) as rt:
        with pytest.raises(InferenceError, match=r"expected shape \(1, 3, 64, 64\), got \(1, 3, 32, 32\)"):
            rt.infer([np.zeros((1, 3, 32, 32), np.float32)])
        with pytest.raises(InferenceError, match="expected dtype float32, got float64"):
            rt.infer([np.zeros((1, 3, 64, 64), np.float64)])


def test_the_compiled_model_is_cached_and_keyed(tmp_path: Path) -> None:
    model, cache = DEMO_MODELS / "demo_detector.onnx", tmp_path / "cache"
    config = OpenVINOConfig(cache_dir=cache)
    with _load(model, config) as first:
        assert not first.from_cache
        key = first.key
    files = sorted(p.name for p in cache.iterdir())
    assert files == [f"{key.digest}.blob", f"{key.digest}.json"]
    assert (key.device, key.hint, key.threads, key.requests, key.precision) == ("CPU", "LATENCY", 0, 1, "fp32")
    with _load(model, config) as second:
        assert second.from_cache and second.key == key
        assert second.metadata.names == {0: "circle", 1: "square", 2: "triangle"}, "the record keeps the metadata"
    # another hint, thread count or precision is another compiled model, beside the first
    with _load(model, config.model_copy(update={"threads": 1}), workers=2) as other:
        assert not other.from_cache and other.key.digest != key.digest
        assert (other.key.hint, other.key.threads, other.key.requests) == ("THROUGHPUT", 1, 2)
    with _load(model, config.model_copy(update={"inference_precision": "auto"})) as auto:
        assert not auto.from_cache and auto.key.digest != key.digest
    assert len(list(cache.glob("*.blob"))) == 3


def test_a_broken_cached_blob_is_discarded_and_compiled_again(tmp_path: Path) -> None:
    model, config = DEMO_MODELS / "demo_detector.onnx", OpenVINOConfig(cache_dir=tmp_path)
    with _load(model, config) as first:
        digest = first.key.digest
    (tmp_path / f"{digest}.blob").write_bytes(b"not a compiled model")
    with _load(model, config) as again:
        assert not again.from_cache
        tensor, _ = Detector(again).prepare(SyntheticScene(seed=1).render(0)[0])
        assert again.infer([tensor])[0].shape == (1, 7, 2100)
    assert (tmp_path / f"{digest}.blob").stat().st_size > 1000, "compiled and cached again"
    # a blob without its record (a crash between the two writes) is not trusted either
    (tmp_path / f"{digest}.json").unlink()
    with _load(model, config) as third:
        assert not third.from_cache


def test_a_cached_model_of_another_key_is_not_used(tmp_path: Path, constant_model) -> None:
    """A blob and record under this key's digest whose record names another model's key (files
    renamed or restored by hand, two keys sharing a digest) are discarded and the model compiled
    again: the record's key must be this key. Catches a planted `_import_cached` that does not compare
    the record's key (it would run the other model's blob)."""
    first_out, second_out = np.full((1, 2, 6), 1.0, np.float32), np.full((1, 2, 6), 2.0, np.float32)
    first, second = constant_model(first_out, name="first"), constant_model(second_out, name="second")
    cache, tensor = tmp_path / "cache", np.ones((1, 3, 64, 64), np.float32)
    config = OpenVINOConfig(cache_dir=cache)
    with _load(first, config) as rt:
        key = rt.key
    with _load(second, config) as rt:
        other = rt.key
    for suffix in (".blob", ".json"):  # the second model's entry under the first's name
        (cache / f"{key.digest}{suffix}").write_bytes((cache / f"{other.digest}{suffix}").read_bytes())
    with _load(first, config) as again:
        assert not again.from_cache and again.key == key
        np.testing.assert_array_equal(again.infer([tensor])[0], first_out)
    with _load(first, config) as cached:  # compiled again and cached under its own key
        assert cached.from_cache
        np.testing.assert_array_equal(cached.infer([tensor])[0], first_out)


def _demo_ir(folder: Path) -> Path:
    """The demo detector saved as OpenVINO IR (FP32 weights): ``demo.xml`` and ``demo.bin``."""
    folder.mkdir(parents=True, exist_ok=True)
    model = ov.Core().read_model(str(DEMO_MODELS / "demo_detector.onnx"))
    ov.save_model(model, str(folder / "demo.xml"), compress_to_fp16=False)
    return folder / "demo.xml"


def test_an_ir_loads_with_its_weights_and_answers_like_its_onnx(tmp_path: Path) -> None:
    xml = _demo_ir(tmp_path)
    assert model_files(xml) == (xml, tmp_path / "demo.bin")
    assert model_files(DEMO_MODELS / "demo_detector.onnx") == (DEMO_MODELS / "demo_detector.onnx",)
    tensor, _ = Detector(OnnxRuntimeBackend(DEMO_MODELS / "demo_detector.onnx")).prepare(
        SyntheticScene(seed=2).render(3)[0]
    )
    with _load(DEMO_MODELS / "demo_detector.onnx") as from_onnx, load_runtime("openvino", xml) as from_ir:
        assert from_ir.metadata.names == {0: "circle", 1: "square", 2: "triangle"}, "the ONNX metadata travels"
        assert from_ir.metadata.imgsz == (320, 320)
        np.testing.assert_allclose(from_ir.infer([tensor])[0], from_onnx.infer([tensor])[0], atol=1e-4)


def test_an_ir_without_its_weights_is_refused_naming_them(tmp_path: Path) -> None:
    xml = _demo_ir(tmp_path)
    (tmp_path / "demo.bin").unlink()
    with pytest.raises(ModelLoadError, match=r"OpenVINO IR demo\.xml needs its weights demo\.bin beside it"):
        _load(xml)


def test_an_irs_cache_key_covers_its_weights(tmp_path: Path, constant_model) -> None:
    """The same .xml with other weights is another compiled model, not the first one from the cache."""
    first_out, second_out = np.full((1, 2, 6), 1.0, np.float32), np.full((1, 2, 6), 2.0, np.float32)
    xml, cache = tmp_path / "ir" / "m.xml", tmp_path / "cache"
    ov.save_model(ov.Core().read_model(str(constant_model(first_out))), str(xml), compress_to_fp16=False)
    config, tensor = OpenVINOConfig(cache_dir=cache), np.ones((1, 3, 64, 64), np.float32)
    with _load(xml, config) as first:
        key = first.key
        np.testing.assert_array_equal(first.infer([tensor])[0], first_out)
    weights = xml.with_suffix(".bin")
    assert weights.read_bytes().count(first_out.tobytes()) == 1
    weights.write_bytes(weights.read_bytes().replace(first_out.tobytes(), second_out.tobytes()))
    with _load(xml, config) as second:
        assert not second.from_cache and second.key.model_sha256 != key.model_sha256
        np.testing.assert_array_equal(second.infer([tensor])[0], second_out)


def test_hints_and_threads_reach_the_compiled_model() -> None:
    model = DEMO_MODELS / "demo_detector.onnx"
    assert hint_for(OpenVINOConfig(), 1) == "LATENCY" and hint_for(OpenVINOConfig(), 2) == "THROUGHPUT"
    assert hint_for(OpenVINOConfig(performance_hint="latency"), 4) == "LATENCY"
    assert hint_for(OpenVINOConfig(performance_hint="throughput"), 1) == "THROUGHPUT"
    with _load(model, OpenVINOConfig(threads=1)) as rt:
        compiled = rt._shared.compiled
        assert str(compiled.get_property("PERFORMANCE_HINT")) == "LATENCY"
        assert compiled.get_property("INFERENCE_NUM_THREADS") == 1
        assert str(compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"
    with _load(model, OpenVINOConfig(), workers=2) as rt:
        assert str(rt._shared.compiled.get_property("PERFORMANCE_HINT")) == "THROUGHPUT"


def test_a_device_openvino_does_not_list_is_refused_with_the_ones_it_does() -> None:
    missing = next(d for d in ("NPU", "GPU") if d not in ov.Core().available_devices)
    with pytest.raises(RuntimeUnavailable, match=rf"no {missing} device here \(it lists CPU"):
        _load(DEMO_MODELS / "demo_detector.onnx", OpenVINOConfig(device=missing))


def test_junk_and_missing_files_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00garbage" * 50)
    with pytest.raises(NotAModelError, match=r"OpenVINO cannot read .*Unable to read the model"):
        _load(junk)
    mystery = tmp_path / "mystery.onnx"
    mystery.write_bytes(mystery_model())
    with pytest.raises(ModelLoadError, match=r"cannot run mystery\.onnx: .*com\.example\.Mystery") as refused:
        _load(mystery)
    assert not isinstance(refused.value, NotAModelError), "a model with an operator it lacks is a model"
    with pytest.raises(Exception, match="model file not found"):
        _load(tmp_path / "absent.onnx")


def test_threads_calling_at_once_get_the_same_results() -> None:
    model = DEMO_MODELS / "demo_detector.onnx"
    frames = [SyntheticScene(seed=3).render(i)[0] for i in range(4)]
    with _load(model, workers=2) as rt:
        detector = Detector(rt)
        tensors = [detector.prepare(f)[0] for f in frames]
        expected = [rt.infer([t])[0] for t in tensors]
        assert not np.array_equal(expected[0], expected[1]), "the frames differ"
        np.testing.assert_array_equal(expected[0], rt.infer([tensors[0]])[0])  # a result outlives the next call
        got: dict[int, list[np.ndarray]] = {}

        def run(index: int) -> None:
            got[index] = [rt.infer([t])[0] for t in tensors]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for results in got.values():
        for want, have in zip(expected, results, strict=True):
            np.testing.assert_array_equal(want, have)


def test_the_entry_probe_tune_and_state_dir() -> None:
    assert BACKENDS["openvino"] is BACKEND and BACKEND.formats == ("onnx", "openvino")
    assert "nvidia" not in BACKEND.rank and BACKEND.rank["arm"] > BACKENDS["onnxruntime"].rank["arm"]
    info = availability()
    assert info.available and "CPU" in info.devices and info.version and info.version[0].isdigit()
    assert BACKEND.device_label(info) == "OpenVINO CPU"
    tuned = tune(OpenVINOConfig(threads=4), "GPU", None)
    assert (tuned.device, tuned.threads) == ("GPU", 0)
    assert tune(OpenVINOConfig(), "CPU", 2).threads == 2
    assert with_state_dir(OpenVINOConfig(), Path("/var/lib/x")).cache_dir == Path("/var/lib/x/openvino")
    assert with_state_dir(OpenVINOConfig(cache_dir=Path("/c")), Path("/var/lib/x")).cache_dir == Path("/c")
    settings = RuntimeSettings().with_state_dir(Path("/s"))
    assert settings.of(OpenVINOConfig).cache_dir == Path("/s/openvino")


def _agreement(model: Path, frames: list[np.ndarray]) -> list[tuple[int, float, float]]:
    """Per frame: ONNX Runtime's detection count, OpenVINO's agreement with them, and the largest
    confidence difference of the matched boxes."""
    with OnnxRuntimeBackend(model) as ort_rt, load_runtime("openvino", model) as ov_rt:
        ort_det, ov_det = Detector(ort_rt), Detector(ov_rt)
        rows = []
        for frame in frames:
            want, got = ort_det.detect(frame), ov_det.detect(frame)
            diff = float(np.abs(want.confidence - got.confidence).max()) if len(want) == len(got) > 0 else 0.0
            rows.append((len(want), detection_agreement(got, want), diff))
    return rows


def test_same_detections_as_onnx_runtime_on_the_demo_detector() -> None:
    frames = [SyntheticScene(seed=7, width=640, height=480).render(i)[0] for i in range(0, 40, 8)]
    rows = _agreement(DEMO_MODELS / "demo_detector.onnx", frames)
    assert sum(count for count, _, _ in rows) > 10
    assert all(agreement == 1.0 and diff < 1e-4 for _, agreement, diff in rows), rows


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize(("model", "max_diff"), [("yolox_nano_416.onnx", 1e-4), ("yolov8n_int8_640.onnx", 0.03)])
def test_same_detections_as_onnx_runtime_on_the_coco_models(shared_models: Path, photos, model, max_diff) -> None:
    """FP32 YOLOX agrees to float error; ONNX Runtime's dynamically quantized YOLOv8n is computed
    by OpenVINO's own int8 kernels, the same boxes with confidences a little apart."""
    import cv2

    frames = [cv2.imread(str(photos[name])) for name in ("astronaut", "chelsea", "coffee")]
    rows = _agreement(shared_models / model, frames)
    assert all(count > 0 for count, _, _ in rows), rows
    assert all(agreement == 1.0 and diff < max_diff for _, agreement, diff in rows), rows
