"""`runtimes.ort_backend`: specs, metadata, session options, dynamic axes, wrong inputs, providers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtimes.base import InferenceError, ModelLoadError
from runtimes.ort_backend import OnnxRuntimeBackend, OnnxRuntimeConfig, provider_list


def test_ort_specs_metadata_and_infer(constant_model) -> None:
    out = np.arange(2 * 6, dtype=np.float32).reshape(1, 2, 6)
    path = constant_model(out, metadata={"names": "{0: 'a', 1: 'b'}", "imgsz": "[64, 64]", "stride": "32"})
    with OnnxRuntimeBackend(path, OnnxRuntimeConfig(intra_op_threads=1, graph_optimization="basic")) as rt:
        (spec,) = rt.inputs
        assert (spec.name, spec.shape, spec.dtype, spec.layout) == ("images", (1, 3, 64, 64), np.float32, "NCHW")
        assert rt.outputs[0].shape == (1, 2, 6)
        assert rt.metadata.names == {0: "a", 1: "b"} and rt.metadata.imgsz == (64, 64)
        assert rt.device == "CPUExecutionProvider"
        (result,) = rt.infer([np.ones((1, 3, 64, 64), np.float32)])
        np.testing.assert_array_equal(result, out)


def test_ort_session_options_follow_the_config(constant_model) -> None:
    path = constant_model(np.zeros((1, 2, 6), np.float32))
    with OnnxRuntimeBackend(path) as rt:
        options = rt._session.get_session_options()
        assert not options.enable_mem_pattern and options.intra_op_num_threads == 0
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0", "idle threads sleep"
        assert rt.concurrent
    config = OnnxRuntimeConfig(memory_pattern=True, intra_op_threads=1, spinning=True)
    with OnnxRuntimeBackend(path, config) as rt:
        options = rt._session.get_session_options()
        assert options.enable_mem_pattern and options.intra_op_num_threads == 1
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1", "the old way, when set"


def test_ort_dynamic_axes_are_none(constant_model) -> None:
    path = constant_model(np.zeros((1, 5, 10), np.float32), input_shape=("batch", 3, "height", "width"))
    with OnnxRuntimeBackend(path) as rt:
        assert rt.inputs[0].shape == (None, 3, None, None)
        assert rt.inputs[0].layout == "NCHW"
        assert rt.infer([np.zeros((1, 3, 32, 48), np.float32)])[0].shape == (1, 5, 10)


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.zeros((1, 3, 32, 32), np.float32), r"expected shape \(1, 3, 64, 64\), got \(1, 3, 32, 32\)"),
        (np.zeros((1, 3, 64, 64), np.float64), "expected dtype float32, got float64"),
    ],
)
def test_ort_rejects_wrong_inputs(constant_model, array, message) -> None:
    with (
        OnnxRuntimeBackend(constant_model(np.zeros((1, 5, 10), np.float32))) as rt,
        pytest.raises(InferenceError, match=message),
    ):
        rt.infer([array])


def test_ort_not_a_model_and_missing_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a protobuf" * 10)
    with pytest.raises(ModelLoadError, match=r"ONNX Runtime cannot load .*junk\.onnx"):
        OnnxRuntimeBackend(junk)
    with pytest.raises(ModelLoadError, match="model file not found"):
        OnnxRuntimeBackend(tmp_path / "missing.onnx")


def test_provider_list_keeps_preference_order_and_ends_on_cpu(tmp_path: Path) -> None:
    config = OnnxRuntimeConfig(providers=["cuda", "tensorrt"], trt_engine_cache_dir=tmp_path, trt_fp16=False)
    installed = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert provider_list(config, installed) == [
        ("CUDAExecutionProvider", {}),
        (
            "TensorrtExecutionProvider",
            {"trt_fp16_enable": False, "trt_engine_cache_enable": True, "trt_engine_cache_path": str(tmp_path)},
        ),
        ("CPUExecutionProvider", {}),
    ]
    assert provider_list(OnnxRuntimeConfig(), ["CPUExecutionProvider"]) == [("CPUExecutionProvider", {})]


def test_ort_threads_stay_inside_the_affinity_mask() -> None:
    """Under ``taskset -c 0`` (here: the child's own affinity) ONNX Runtime's default pool pinned
    a thread to every CPU of the machine; the registry's loader keeps every thread on the mask."""
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs Linux and at least two CPUs")
    script = (
        "import os, sys; from pathlib import Path\n"
        "cpu = sorted(os.sched_getaffinity(0))[0]; os.sched_setaffinity(0, {cpu})\n"
        "import numpy as np\n"
        "from runtimes.registry import load_runtime\n"
        "rt = load_runtime('onnxruntime', Path(sys.argv[1]))\n"
        "spec = rt.inputs[0]\n"
        "rt.infer([np.zeros([d or 1 for d in spec.shape], spec.dtype)])\n"
        "masks = set()\n"
        "for task in Path('/proc/self/task').iterdir():\n"
        "    for line in (task / 'status').read_text().splitlines():\n"
        "        if line.startswith('Cpus_allowed_list:'):\n"
        "            masks.add(line.split()[1])\n"
        "print(cpu, ' '.join(sorted(masks)))\n"
    )
    model = str(Path(__file__).resolve().parents[2] / "agent" / "demo" / "demo_detector.onnx")
    proc = subprocess.run([sys.executable, "-c", script, model], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    cpu, *masks = proc.stdout.split()
    assert masks == [cpu], proc.stdout


def test_ort_hands_back_what_building_the_session_freed(constant_model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading trims glibc's heap once the session is built (and again when it is closed): the
    model's protobuf and unoptimised graph are freed by then, and glibc would keep them resident."""
    import runtimes.ort_backend as ort_backend

    trims = []
    monkeypatch.setattr(ort_backend, "return_freed_memory", lambda: trims.append("trim"))
    runtime = OnnxRuntimeBackend(constant_model(np.zeros((1, 2, 6), np.float32)), OnnxRuntimeConfig(), warmup=True)
    assert trims == ["trim"], "after the session is built and warmed up"
    runtime.close()
    assert trims == ["trim", "trim"]
