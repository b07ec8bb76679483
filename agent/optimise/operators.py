"""Which ONNX operators TensorRT 10 and the ONNX-to-LiteRT converter cannot take: tables kept here,
each with its source, read by `agent.optimise.hygiene` to warn at build time.

A warning, not a refusal: ONNX Runtime runs every standard operator, and a bundle for devices
that never use TensorRT or LiteRT is fine. Operators outside the standard domains (``com.microsoft``
fusions, custom ops) are listed for both, since neither knows them without a plugin.
Pure data and one pure function; no imports of the ONNX tooling.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: Source: onnx/onnx-tensorrt ``docs/operators.md`` at 96e78110 (the ONNX-TensorRT 10.1 GA
#: release, 2024-06-17): every operator marked "N" in its support matrix, which covers opsets
#: 9 to 20.
_TENSORRT_NO = frozenset(
    [
        "AffineGrid",
        "Bernoulli",
        "BitShift",
        "BitwiseAnd",
        "BitwiseNot",
        "BitwiseOr",
        "BitwiseXor",
        "BlackmanWindow",
        "CenterCropPad",
        "Col2Im",
        "Compress",
        "ConcatFromSequence",
        "ConvInteger",
        "DFT",
        "Det",
        "DynamicQuantizeLinear",
        "HammingWindow",
        "HannWindow",
        "ImageDecoder",
        "MatMulInteger",
        "MaxRoiPool",
        "MaxUnpool",
        "MelWeightMatrix",
        "Multinomial",
        "NegativeLogLikelihoodLoss",
        "Optional",
        "OptionalGetElement",
        "OptionalHasElement",
        "QLinearConv",
        "QLinearMatMul",
        "RegexFullMatch",
        "STFT",
        "SequenceAt",
        "SequenceConstruct",
        "SequenceEmpty",
        "SequenceErase",
        "SequenceInsert",
        "SequenceLength",
        "SequenceMap",
        "SoftmaxCrossEntropyLoss",
        "SplitToSequence",
        "StringConcat",
        "StringNormalizer",
        "StringSplit",
        "TfIdfVectorizer",
        "Unique",
    ]
)
#: Operators newer than that matrix (opset 21 and later, from onnx 1.23's schemas): not in it at all.
_TENSORRT_UNLISTED = frozenset(
    [
        "Attention",
        "BitCast",
        "CausalConvWithState",
        "CumProd",
        "LinearAttention",
        "RMSNormalization",
        "RotaryEmbedding",
        "SwiGLU",
        "Swish",
        "TensorScatter",
    ]
)
#: Opsets the matrix covers ("TensorRT 10.0 supports operators in the inclusive range of opset 9 to 20").
TENSORRT_OPSETS = (9, 20)

#: Source: PINTO0309/onnx2tf ``README.md`` at 2c0cb019 (2026-07-20), the "supported layers"
#: table of its converter: operators marked partial support (":white_check_mark:").
_LITERT_PARTIAL = frozenset(
    [
        "Col2Im",
        "ConvInteger",
        "DeformConv",
        "DFT",
        "GridSample",
        "HammingWindow",
        "HannWindow",
        "ImageDecoder",
        "STFT",
        "TfIdfVectorizer",
    ]
)
#: Standard operators (onnx 1.23's schemas) that table does not list at all.
_LITERT_UNLISTED = frozenset(
    [
        "BitCast",
        "CastLike",
        "CausalConvWithState",
        "LinearAttention",
        "RMSNormalization",
        "SequenceMap",
        "SwiGLU",
        "Swish",
    ]
)

#: domains whose operators are the standard ones
_STANDARD_DOMAINS = frozenset({"", "ai.onnx"})


@dataclass(frozen=True)
class OperatorWarning:
    """Operators of one model that a target cannot take: `target` is ``tensorrt`` or ``litert``,
    `operators` the sorted names (``domain:Name`` outside the standard domain), `why` one phrase."""

    target: str
    operators: tuple[str, ...]
    why: str

    def __str__(self) -> str:
        return f"{self.target}: {', '.join(self.operators)} ({self.why})"


def _name(domain: str, op_type: str) -> str:
    return op_type if domain in _STANDARD_DOMAINS else f"{domain}:{op_type}"


def unsupported_operators(nodes: Iterable[tuple[str, str]], opset: int) -> list[OperatorWarning]:
    """Warnings for a model whose graph has `nodes` as ``(domain, op_type)`` pairs (subgraphs
    included) and default-domain `opset`; empty when both targets take every operator."""
    used = set(nodes)
    custom = {_name(d, t) for d, t in used if d not in _STANDARD_DOMAINS}
    standard = {t for d, t in used if d in _STANDARD_DOMAINS}
    warnings = []
    trt = sorted((standard & (_TENSORRT_NO | _TENSORRT_UNLISTED)) | custom)
    if trt:
        warnings.append(OperatorWarning("tensorrt", tuple(trt), "not supported by TensorRT 10's ONNX parser"))
    low, high = TENSORRT_OPSETS
    if not low <= opset <= high:
        warnings.append(
            OperatorWarning("tensorrt", (f"opset {opset}",), f"TensorRT 10's ONNX parser covers opsets {low} to {high}")
        )
    litert = sorted((standard & (_LITERT_PARTIAL | _LITERT_UNLISTED)) | custom)
    if litert:
        warnings.append(
            OperatorWarning("litert", tuple(litert), "not or only partly supported by the onnx2tf LiteRT converter")
        )
    return warnings
