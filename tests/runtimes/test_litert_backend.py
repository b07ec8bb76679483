"""`runtimes.litert_backend`: int8 and uint8 models, bad delegates and models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtimes.base import ModelLoadError, RuntimeUnavailable
from runtimes.litert_backend import LiteRTBackend, LiteRTConfig


def test_litert_int8_model_specs_and_infer(shared_models: Path) -> None:
    with LiteRTBackend(shared_models / "yolov8n_int8io_640.tflite", LiteRTConfig(num_threads=2)) as rt:
        (spec,) = rt.inputs
        assert (spec.shape, spec.dtype, spec.layout) == ((1, 640, 640, 3), np.int8, "NHWC")
        assert spec.quantization is not None and spec.quantization.zero_point == -128
        assert spec.quantization.scale == pytest.approx(1 / 255)
        assert rt.outputs[0].is_quantized
        assert rt.metadata.names is not None and rt.metadata.names[0] == "person"
        (out,) = rt.infer([np.full((1, 640, 640, 3), -14, np.int8)])
        assert out.shape == (1, 84, 8400) and out.dtype == np.int8


def test_litert_uint8_ssd_has_four_outputs(shared_models: Path) -> None:
    with LiteRTBackend(shared_models / "ssd_mobilenet_v1_coco_quant_300.tflite") as rt:
        assert rt.inputs[0].dtype == np.uint8
        assert [o.shape for o in rt.outputs] == [(1, 10, 4), (1, 10), (1, 10), (1,)]
        assert rt.metadata.names is None


def test_litert_bad_delegate_and_bad_model(tmp_path: Path) -> None:
    model = tmp_path / "junk.tflite"
    model.write_bytes(b"\0" * 64)
    with pytest.raises(RuntimeUnavailable, match=r"cannot load LiteRT delegate .*libnope\.so"):
        LiteRTBackend(model, LiteRTConfig(delegate=tmp_path / "libnope.so"))
    with pytest.raises(ModelLoadError, match=r"LiteRT cannot load .*junk\.tflite"):
        LiteRTBackend(model)
