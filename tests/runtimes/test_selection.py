"""`runtimes.selection`: the policy's table, its reasons, artifacts by suffix; a plugin's entry
(formats, rank per board class, device label) placing it in the order."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import TypeAdapter, ValidationError
from testkit import FAKES

from agent.hardware.board import Board, probe
from runtimes.base import Backend, BackendConfig, RuntimeInfo
from runtimes.registry import BACKENDS
from runtimes.selection import (
    Artifact,
    Preference,
    SelectionError,
    board_class,
    known_formats,
    runtimes_for,
    select_runtimes,
)

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


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        ("a/b.onnx", "onnx"),
        ("x.TFLITE", "tflite"),
        ("ir/model.xml", "openvino"),
        ("M.XML", "openvino"),
        ("m.so", "tvm"),
    ],
)
def test_artifact_format_from_suffix(path: str, fmt: str) -> None:
    assert Artifact.from_path(path).format == fmt


def test_artifact_unknown_suffix() -> None:
    with pytest.raises(SelectionError, match=r"unknown model format '\.pt'; expected \.onnx or \.tflite or \.xml"):
        Artifact.from_path("yolov8n.pt")
    with pytest.raises(SelectionError, match=r"unknown model format '\.xml'; expected \.onnx"):
        Artifact.from_path("model.xml", formats=("onnx",))  # an IR where no backend loads one


class NpuConfig(BackendConfig):
    type: Literal["npu"] = "npu"


def _npu(rank: dict, formats: tuple[str, ...] = ("npumodel", "onnx")) -> Backend[NpuConfig]:
    """A plugin's entry: an NPU on ARM boards that loads its own format and ONNX."""
    return Backend(
        name="npu",
        config=NpuConfig,
        summary="An NPU.",
        formats=formats,
        rank=rank,
        libraries=("npu_sdk",),
        availability=lambda: NPU,
        load=lambda path, config, options: None,  # type: ignore[arg-type,return-value]
        device_label=lambda info: f"NPU core {len(info.devices)}",
    )


NPU = RuntimeInfo("npu", True, "2.0", ("core0",))


NO_NPU = RuntimeInfo("npu", False, reason="no NPU found (is its driver loaded?)")


NPU_ART = Artifact("m.npumodel", "npumodel", "int8")


WITH_NPU = {**BACKENDS, "npu": _npu({"arm": 5})}


@pytest.mark.parametrize(
    ("board", "available", "artifacts", "preference", "expected"),
    [
        # ranked 5 on ARM: ahead of LiteRT (10) and ONNX Runtime (20), with its own format first
        (
            PI5,
            runtimes(ORT_CPU, LITERT, NPU),
            [ONNX, TFLITE8, NPU_ART],
            "auto",
            [
                ("npu", "m.npumodel", "NPU core 1"),
                ("litert", "m_int8.tflite", "xnnpack"),
                ("onnxruntime", "m.onnx", "CPU"),
            ],
        ),
        (
            ARM_BOX,
            runtimes(ORT_CPU, NPU),
            [ONNX],
            "auto",
            [("npu", "m.onnx", "NPU core 1"), ("onnxruntime", "m.onnx", "CPU")],
        ),
        (PI5, runtimes(ORT_CPU, LITERT, NO_NPU), [ONNX, NPU_ART], "auto", [("onnxruntime", "m.onnx", "CPU")]),
        # not ranked on x86: auto never picks it there, naming it still does
        (X86, runtimes(ORT_CPU, LITERT, NPU), [ONNX, NPU_ART], "auto", [("onnxruntime", "m.onnx", "CPU")]),
        (X86, runtimes(ORT_CPU, LITERT, NPU), [ONNX, NPU_ART], "npu", [("npu", "m.onnx", "NPU core 1")]),  # fp32 first
        (X86, runtimes(NPU), [ONNX, Artifact("m.npumodel", "npumodel")], "npu", [("npu", "m.npumodel", "NPU core 1")]),
    ],
)
def test_a_plugin_takes_its_place_by_its_entry(board, available, artifacts, preference, expected) -> None:
    choices = select_runtimes(board, available, artifacts, preference, WITH_NPU)
    assert [(c.runtime, c.artifact.path, c.device) for c in choices] == expected


def test_a_plugin_s_reasons_name_it_and_ties_keep_the_table_s_order() -> None:
    available = runtimes(ORT_CPU, LITERT, NO_NPU)
    first, second = select_runtimes(PI5, available, [TFLITE8, NPU_ART, ONNX], "auto", WITH_NPU)
    why = "(npu: no NPU found (is its driver loaded?))"
    assert first.reason == f"Raspberry Pi aarch64: fallback to litert on xnnpack {why}"
    assert second.reason == f"Raspberry Pi aarch64: fallback to onnxruntime on CPU {why}"
    with pytest.raises(SelectionError, match=r"npu: needs a \.npumodel or \.onnx artifact"):
        select_runtimes(PI5, runtimes(NPU), [TFLITE8], "npu", WITH_NPU)
    tied = {**BACKENDS, "npu": _npu({"arm": 10})}  # LiteRT's rank on ARM: LiteRT stays first
    top = select_runtimes(PI5, runtimes(ORT_CPU, LITERT, NPU), [TFLITE8, NPU_ART], "auto", tied)
    assert [c.runtime for c in top] == ["litert", "npu"]
    assert top[0].reason == "Raspberry Pi aarch64: litert on xnnpack is preferred for a .tflite artifact"
    with pytest.raises(SelectionError, match="unknown runtime 'npu'"):
        select_runtimes(PI5, runtimes(NPU), [NPU_ART], "npu")  # the registry's table has no npu


def test_formats_and_probing_follow_the_table() -> None:
    assert known_formats() == ("onnx", "tflite", "openvino", "tvm", "hef", "rknn")
    assert known_formats(WITH_NPU) == ("onnx", "tflite", "openvino", "tvm", "hef", "rknn", "npumodel")
    assert runtimes_for([ONNX]) == ("tensorrt", "onnxruntime", "openvino", "tvm")
    assert runtimes_for([NPU_ART, TFLITE8], WITH_NPU) == ("litert", "npu")
    assert Artifact.from_path("a/m.NPUMODEL", "int8", known_formats(WITH_NPU)) == Artifact(
        "a/m.NPUMODEL", "npumodel", "int8"
    )
    with pytest.raises(SelectionError, match=r"expected \.onnx or \.tflite or \.xml or \.so or \.hef or \.rknn$"):
        Artifact.from_path("m.npumodel")


@pytest.mark.parametrize(
    ("board", "expected"), [(JETSON, "nvidia"), (X86_GPU, "nvidia"), (PI5, "arm"), (ARM_BOX, "arm"), (X86, "x86")]
)
def test_board_classes(board: Board, expected: str) -> None:
    assert board_class(board) == expected


def test_the_configured_preference_is_checked_against_the_table() -> None:
    adapter = TypeAdapter(Preference)
    assert adapter.validate_python("litert") == "litert" and adapter.validate_python("auto") == "auto"
    names = ["auto", "tensorrt", "onnxruntime", "litert", "openvino", "tvm", "hailo", "rknn"]
    with pytest.raises(ValidationError, match=f"unknown runtime 'npu': expected {', '.join(names)}"):
        adapter.validate_python("npu")
    assert adapter.json_schema() == {"enum": names, "type": "string"}


TVM = RuntimeInfo("tvm", True, "0.27.0.post1", ("CPU",))
PI5_MODULE = Artifact("m.aarch64-cortex-a76.so", "tvm", "fp32", "aarch64")


@pytest.mark.parametrize(
    ("board", "artifacts", "expected"),
    [
        (PI5, [ONNX, PI5_MODULE], "m.aarch64-cortex-a76.so"),  # the module first, on its own CPU
        (X86, [ONNX, PI5_MODULE], "m.onnx"),  # elsewhere the ONNX model, compiled there
        (X86, [ONNX, Artifact("m.x86.so", "tvm", "fp32", "x86_64")], "m.x86.so"),
    ],
)
def test_a_compiled_artifact_is_chosen_only_on_its_own_cpu(board: Board, artifacts: list, expected: str) -> None:
    (choice,) = select_runtimes(board, runtimes(TVM), artifacts, "tvm")
    assert choice.artifact.path == expected


def test_only_a_module_for_another_cpu_is_a_target_mismatch_naming_both() -> None:
    with pytest.raises(
        SelectionError, match=r"tvm: TARGET_MISMATCH: m\.aarch64-cortex-a76\.so for aarch64, this board is x86_64"
    ):
        select_runtimes(X86, runtimes(TVM), [PI5_MODULE], "tvm")


HAILO = RuntimeInfo("hailo", True, "4.23.0", ("Hailo-8/8L",))
NO_HAILO = RuntimeInfo("hailo", False, reason="no Hailo device: no /dev/hailo*")
HEF = Artifact("m.hef", "hef", "int8")


def test_a_pi_5_with_the_ai_hat_runs_the_hef_on_it() -> None:
    # fails on: hailo unranked on ARM (auto never picks it), or ranked below LiteRT and ONNX Runtime
    board = probe(FAKES / "rpi5-hailo8l", arch="aarch64")
    first, *rest = select_runtimes(board, runtimes(HAILO, ORT_CPU, LITERT), [ONNX, TFLITE8, HEF])
    assert (first.runtime, first.artifact.path, first.device) == ("hailo", "m.hef", "Hailo-8/8L")
    assert first.reason == "Raspberry Pi aarch64: hailo on Hailo-8/8L is preferred for a .hef artifact"
    assert [c.runtime for c in rest] == ["litert", "onnxruntime"]


def test_without_the_chip_the_hef_is_passed_over_saying_why() -> None:
    first, _ = select_runtimes(PI5, runtimes(NO_HAILO, ORT_CPU, LITERT), [ONNX, TFLITE8, HEF])
    assert first.runtime == "litert" and "hailo: no Hailo device: no /dev/hailo*" in first.reason


ROCK5B = Board("generic", "Radxa ROCK 5B", "aarch64", 8, False, soc="rk3588")
RK3566_BOARD = Board("generic", "Pine64 Quartz64 Model A", "aarch64", 4, False, soc="rk3566")
RKNN = RuntimeInfo("rknn", True, "2.3.2", ("RK3588 NPU",))
NO_RKNN = RuntimeInfo("rknn", False, reason="rknnlite does not import")
RK3588_MODEL = Artifact("m.rk3588.rknn", "rknn", "int8", "aarch64", "rk3588")


@pytest.mark.parametrize(
    ("board", "available", "expected"),
    [
        # the NPU first on its own SoC, then the CPU runtimes
        (
            ROCK5B,
            runtimes(RKNN, ORT_CPU, LITERT),
            [
                ("rknn", "m.rk3588.rknn", "RK3588 NPU"),
                ("litert", "m_int8.tflite", "xnnpack"),
                ("onnxruntime", "m.onnx", "CPU"),
            ],
        ),
        # rknnlite missing: the CPU runtimes, as on any ARM board
        (
            ROCK5B,
            runtimes(NO_RKNN, ORT_CPU, LITERT),
            [("litert", "m_int8.tflite", "xnnpack"), ("onnxruntime", "m.onnx", "CPU")],
        ),
        # another SoC (an RK3566) or a Pi: the rk3588 model is never chosen
        (
            RK3566_BOARD,
            runtimes(RKNN, ORT_CPU, LITERT),
            [("litert", "m_int8.tflite", "xnnpack"), ("onnxruntime", "m.onnx", "CPU")],
        ),
        (
            PI5,
            runtimes(RKNN, ORT_CPU, LITERT),
            [("litert", "m_int8.tflite", "xnnpack"), ("onnxruntime", "m.onnx", "CPU")],
        ),
    ],
)
def test_an_rknn_model_is_chosen_first_on_its_own_soc_only(board: Board, available: dict, expected: list) -> None:
    chosen = select_runtimes(board, available, [*ALL, RK3588_MODEL])
    assert [(c.runtime, c.artifact.path, c.device) for c in chosen] == expected


def test_an_rknn_model_for_another_soc_is_a_target_mismatch_naming_both() -> None:
    with pytest.raises(
        SelectionError, match=r"rknn: TARGET_MISMATCH: m\.rk3588\.rknn for rk3588 aarch64, this board is rk3566 aarch64"
    ):
        select_runtimes(RK3566_BOARD, runtimes(RKNN), [RK3588_MODEL], "rknn")


HAT = probe(FAKES / "rpi5-hailo8l", arch="aarch64")  # the AI HAT+: Hailo-8L (one PCIe id with Hailo-8)
HAT2 = probe(FAKES / "rpi5-hailo10h", arch="aarch64")  # the AI HAT+ 2: Hailo-10H
HAILO10H = RuntimeInfo("hailo", True, "5.1.0", ("Hailo-10H",))


@pytest.mark.parametrize(
    ("board", "chip", "first"),
    [
        (HAT, "hailo8l", "hailo"),
        (HAT, "hailo8", "hailo"),  # one PCIe id: HailoRT tells Hailo-8 from 8L when configuring
        (HAT, "hailo1xh", "onnxruntime"),
        (HAT2, "hailo1xh", "hailo"),
        (HAT2, "hailo8l", "onnxruntime"),
        (HAT2, "hailo8", "onnxruntime"),
        (PI5, "hailo8l", "onnxruntime"),  # no chip: not a mismatch, the backend says there is none
    ],
)
def test_a_hef_is_chosen_only_on_the_chip_generation_it_was_compiled_for(board: Board, chip: str, first: str) -> None:
    # fails on: the chip recorded with a HEF ignored (a Hailo-8L HEF sent to a Hailo-10H), or
    # Hailo-8 and 8L told apart by a PCIe id that cannot tell them
    hailo = HAILO10H if board is HAT2 else HAILO if board is HAT else NO_HAILO
    hef = Artifact("m.hef", "hef", "int8", chip=chip)
    chosen = select_runtimes(board, runtimes(hailo, ORT_CPU), [ONNX, hef])
    assert chosen[0].runtime == first, chosen
    if first == "onnxruntime" and board is not PI5:
        assert "hailo: TARGET_MISMATCH: m.hef for " + chip in chosen[0].reason, chosen[0].reason


def test_a_hef_for_the_other_generation_is_a_target_mismatch_naming_both_chips() -> None:
    hef = Artifact("m.hef", "hef", "int8", chip="hailo8l")
    with pytest.raises(
        SelectionError,
        match=r"hailo: TARGET_MISMATCH: m\.hef for hailo8l \(Hailo-8/Hailo-8L\), this board is Hailo-10H aarch64",
    ):
        select_runtimes(HAT2, runtimes(HAILO10H), [hef], "hailo")
