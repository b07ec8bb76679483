"""The runtime selection policy, table-tested over boards, runtimes and artifacts."""

from __future__ import annotations

import pytest

from agent.hardware.probe import Board
from runtimes.base import RuntimeInfo
from runtimes.selection import Artifact, SelectionError, select_runtimes

JETSON = Board("jetson", "NVIDIA Jetson Orin Nano Developer Kit", "aarch64", 6, True, "Orin", "36.3.0")
PI5 = Board("raspberry_pi", "Raspberry Pi 5 Model B Rev 1.0", "aarch64", 4, False)
X86 = Board("generic", "generic x86_64", "x86_64", 8, False)
X86_GPU = Board("generic", "generic x86_64", "x86_64", 8, True, "NVIDIA RTX 3060")
ARM_BOX = Board("generic", "Rockchip RK3588", "aarch64", 8, False)

TRT = RuntimeInfo("tensorrt", True, "10.3.0")
NO_TRT = RuntimeInfo("tensorrt", False, reason="tensorrt is not installed")
ORT_CPU = RuntimeInfo("onnxruntime", True, "1.20.0", ("CPUExecutionProvider",))
ORT_GPU = RuntimeInfo(
    "onnxruntime", True, "1.20.0", ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
)
ORT_CUDA = RuntimeInfo("onnxruntime", True, "1.20.0", ("CUDAExecutionProvider", "CPUExecutionProvider"))
ORT_OPENVINO = RuntimeInfo("onnxruntime", True, "1.20.0", ("OpenVINOExecutionProvider", "CPUExecutionProvider"))
NO_ORT = RuntimeInfo("onnxruntime", False, reason="onnxruntime is not installed")
LITERT = RuntimeInfo("litert", True, "2.3.0", ("xnnpack",))
NO_LITERT = RuntimeInfo("litert", False, reason="neither ai-edge-litert nor tflite-runtime is installed")

ONNX = Artifact("m.onnx", "onnx", "fp32")
TFLITE32 = Artifact("m_fp32.tflite", "tflite", "fp32")
TFLITE8 = Artifact("m_int8.tflite", "tflite", "int8")
ALL = [ONNX, TFLITE32, TFLITE8]


def runtimes(*infos: RuntimeInfo) -> dict:
    return {info.name: info for info in infos}


@pytest.mark.parametrize(
    ("board", "available", "artifacts", "preference", "expected"),
    [
        # Jetson: TensorRT first, then ONNX Runtime on its best EP, then LiteRT.
        (
            JETSON,
            runtimes(TRT, ORT_GPU, LITERT),
            ALL,
            "auto",
            [
                ("tensorrt", "m.onnx", "GPU (FP16)"),
                ("onnxruntime", "m.onnx", "TensorRT EP"),
                ("litert", "m_int8.tflite", "xnnpack"),
            ],
        ),
        (
            JETSON,
            runtimes(NO_TRT, ORT_CUDA, LITERT),
            ALL,
            "auto",
            [("onnxruntime", "m.onnx", "CUDA EP"), ("litert", "m_int8.tflite", "xnnpack")],
        ),
        (JETSON, runtimes(NO_TRT, ORT_GPU, LITERT), [TFLITE32], "auto", [("litert", "m_fp32.tflite", "xnnpack")]),
        # x86 with an NVIDIA GPU behaves like Jetson.
        (
            X86_GPU,
            runtimes(TRT, ORT_GPU, LITERT),
            [ONNX],
            "auto",
            [("tensorrt", "m.onnx", "GPU (FP16)"), ("onnxruntime", "m.onnx", "TensorRT EP")],
        ),
        # Raspberry Pi: LiteRT with int8 first, then ONNX Runtime on the CPU.
        (
            PI5,
            runtimes(NO_TRT, ORT_CPU, LITERT),
            ALL,
            "auto",
            [("litert", "m_int8.tflite", "xnnpack"), ("onnxruntime", "m.onnx", "CPU")],
        ),
        (PI5, runtimes(NO_TRT, ORT_CPU, LITERT), [ONNX], "auto", [("onnxruntime", "m.onnx", "CPU")]),
        (PI5, runtimes(NO_TRT, ORT_CPU, NO_LITERT), ALL, "auto", [("onnxruntime", "m.onnx", "CPU")]),
        (
            ARM_BOX,
            runtimes(NO_TRT, ORT_CPU, LITERT),
            [ONNX, TFLITE32],
            "auto",
            [("litert", "m_fp32.tflite", "xnnpack"), ("onnxruntime", "m.onnx", "CPU")],
        ),
        # x86 CPU: ONNX Runtime first (OpenVINO EP when present), LiteRT fp32 as fallback.
        (
            X86,
            runtimes(NO_TRT, ORT_CPU, LITERT),
            ALL,
            "auto",
            [("onnxruntime", "m.onnx", "CPU"), ("litert", "m_fp32.tflite", "xnnpack")],
        ),
        (X86, runtimes(NO_TRT, ORT_OPENVINO, LITERT), [ONNX], "auto", [("onnxruntime", "m.onnx", "OpenVINO EP")]),
        (X86, runtimes(NO_TRT, NO_ORT, LITERT), ALL, "auto", [("litert", "m_fp32.tflite", "xnnpack")]),
        # An explicit preference keeps only that runtime.
        (JETSON, runtimes(TRT, ORT_GPU, LITERT), ALL, "litert", [("litert", "m_int8.tflite", "xnnpack")]),
        (PI5, runtimes(NO_TRT, ORT_CPU, LITERT), ALL, "onnxruntime", [("onnxruntime", "m.onnx", "CPU")]),
    ],
)
def test_selection_table(board, available, artifacts, preference, expected) -> None:
    choices = select_runtimes(board, available, artifacts, preference)
    assert [(c.runtime, c.artifact.path, c.device) for c in choices] == expected
    assert all(c.reason for c in choices)


@pytest.mark.parametrize(
    ("board", "available", "artifacts", "preference", "message"),
    [
        (X86, runtimes(NO_TRT, ORT_CPU, LITERT), [ONNX], "litert", "litert: needs a .tflite artifact"),
        (X86, runtimes(NO_TRT, ORT_CPU, LITERT), [ONNX], "tensorrt", "tensorrt: tensorrt is not installed"),
        (PI5, runtimes(NO_TRT, NO_ORT, NO_LITERT), ALL, "auto", "onnxruntime: onnxruntime is not installed"),
        (X86, runtimes(NO_TRT, ORT_CPU, NO_LITERT), [TFLITE8], "auto", "litert: neither ai-edge-litert"),
    ],
)
def test_selection_explains_why_nothing_fits(board, available, artifacts, preference, message) -> None:
    with pytest.raises(SelectionError, match=message):
        select_runtimes(board, available, artifacts, preference)


def test_reason_names_the_board_and_fallbacks() -> None:
    first, _ = select_runtimes(JETSON, runtimes(NO_TRT, ORT_CUDA, LITERT), ALL)
    assert first.reason.startswith("Jetson aarch64: fallback to onnxruntime on CUDA EP")
    assert "tensorrt is not installed" in first.reason
    top = select_runtimes(PI5, runtimes(NO_TRT, ORT_CPU, LITERT), ALL)[0]
    assert "Raspberry Pi aarch64" in top.reason and "int8 artifact preferred" in top.reason


@pytest.mark.parametrize(("path", "fmt"), [("a/b.onnx", "onnx"), ("x.TFLITE", "tflite")])
def test_artifact_format_from_suffix(path: str, fmt: str) -> None:
    assert Artifact.from_path(path).format == fmt


def test_artifact_unknown_suffix() -> None:
    with pytest.raises(SelectionError, match=r"unknown model format '\.pt'"):
        Artifact.from_path("yolov8n.pt")
