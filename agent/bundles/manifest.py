"""The bundle manifest: what a model bundle holds and how to run it (`Manifest`), or what an
agent bundle holds, edge-agent's own wheels and the target they are for (`AgentManifest`,
``kind: agent``; a manifest without ``kind`` is a model bundle's, as every one was before).

Pydantic models with unknown keys forbidden and every field described; the JSON Schema is
exported to ``docs/manifest.schema.json`` (``python -m agent.bundles.manifest > docs/manifest.schema.json``).
Validators only check values: no file or network access happens here.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    field_validator,
    model_serializer,
    model_validator,
)

from pipelines.decoding.decoders import DecoderName
from pipelines.decoding.detection_filter import DEFAULTS
from runtimes.base import Precision

SCHEMA_VERSION: Literal[1] = 1
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: the longest class label (characters): a label goes into every event, the page's events and a
#: Prometheus label value, so a longer one refuses the manifest (docs/bundles.md)
MAX_LABEL_CHARS = 128


def _semver(value: str) -> str:
    if not _SEMVER.match(value):
        raise ValueError(f"version {value!r} is not a semantic version like 1.2.3")
    return value


#: a version string checked to be SemVer
SemVer = Annotated[str, AfterValidator(_semver)]


def _bounded_labels(value: list[str], what: str) -> list[str]:
    """`value` when every label is at most `MAX_LABEL_CHARS` characters; else the first longer
    one named by its index and length."""
    for i, label in enumerate(value):
        if len(label) > MAX_LABEL_CHARS:
            raise ValueError(
                f"{what}[{i}] is {len(label)} characters long, more than {MAX_LABEL_CHARS} (starts {label[:20]!r})"
            )
    return value


#: a model file's format: ONNX, LiteRT's flatbuffer, OpenVINO's IR (``.xml`` + ``.bin``), a
#: module compiled by Apache TVM (``.so`` + its record ``.so.json``), a model converted by
#: rknn-toolkit2 for a Rockchip NPU (``.rknn`` + its record ``.rknn.json``), or a HEF compiled for a
#: Hailo chip by Hailo's Dataflow Compiler (``.hef`` + its record ``.hef.json``, docs/hailo.md)
ModelFormat = Literal["onnx", "tflite", "openvino", "tvm", "rknn", "hef"]
_SUFFIXES: dict[str, str] = {
    "onnx": ".onnx",
    "tflite": ".tflite",
    "openvino": ".xml",
    "tvm": ".so",
    "rknn": ".rknn",
    "hef": ".hef",
}
#: the formats built for one target (`CompiledTarget`), each with its record beside it (``.json``)
COMPILED_FORMATS = frozenset({"tvm", "rknn", "hef"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class InputSpec(_Strict):
    """How frames become the model's input."""

    size: tuple[int, int] = Field(description="Input height and width in pixels.")
    color: Literal["RGB", "BGR"] = Field(description="Channel order the model expects.")
    resize: Literal["letterbox", "letterbox-topleft", "stretch"] = Field(
        description="letterbox: keep aspect ratio, pad both sides; letterbox-topleft: pad right and "
        "bottom only; stretch: resize to the input size."
    )
    pad_value: int = Field(default=114, ge=0, le=255, description="Padding pixel value.")
    mean: float = Field(default=0.0, description="Input = (pixel - mean) / std, pixel in 0..255.")
    std: float = Field(default=255.0, gt=0, description="See mean.")


class DetectionThresholds(_Strict):
    """Post-processing thresholds (``bundle build --conf --iou --max-det``): every camera's
    defaults on a device, which agent.yaml's ``cameras[]`` may override per camera."""

    conf: float = Field(
        default=DEFAULTS.conf, ge=0, le=1, description="Detections must score above this to be kept (0..1)."
    )
    iou: float = Field(
        default=DEFAULTS.iou,
        ge=0,
        le=1,
        description="NMS IoU threshold: a box overlapping a better one of its class more than this is dropped.",
    )
    max_det: int = Field(default=DEFAULTS.max_det, ge=1, description="Most detections kept per frame.")


class Agreement(_Strict):
    """How an artifact answered against the FP32 model it was made from, measured by `bundle build`
    on the validation images (docs/optimising.md). An autotune picks among artifacts by it."""

    baseline: str = Field(description="File name of the FP32 ONNX model it was compared with.")
    images: int = Field(ge=1, description="Validation images both models ran on.")
    iou: float = Field(default=0.5, gt=0, le=1, description="IoU at which two boxes of one label match.")
    detections: float = Field(
        ge=0, le=1, description="Detection agreement: matched FP32 detections / FP32 detections (0..1)."
    )
    baseline_detections: int = Field(ge=1, description="Detections of the FP32 model on the validation images.")
    matched: int = Field(ge=0, description="FP32 detections this artifact found too (same label, IoU >= iou).")
    extra: int = Field(ge=0, description="Detections of this artifact that match no FP32 detection.")
    max_abs_error: float = Field(ge=0, description="Largest |output - FP32 output| over all raw output values.")
    mean_abs_error: float = Field(ge=0, description="Mean |output - FP32 output| over all raw output values.")
    min_agreement: float = Field(ge=0, le=1, description="The gate it passed (bundle build --min-agreement).")


class CompiledTarget(_Strict):
    """What a compiled artifact (format ``tvm``, ``rknn`` or ``hef``) was built for: a device whose
    architecture, SoC (rknn), Hailo chip (hef) or runtime release (tvm) differs refuses it
    (``TARGET_MISMATCH``)."""

    target: str = Field(
        max_length=1000,
        description='The compiler\'s target: TVM\'s as JSON, e.g. {"kind": "llvm", "mtriple": '
        '"aarch64-linux-gnu", "mcpu": "cortex-a76"}; for rknn the SoC rknn-toolkit2 converted for, e.g. "rk3588"; '
        'for hef the HEF\'s hw_arch, e.g. "hailo8l" (Hailo-8L, runs on Hailo-8 too) or "hailo1xh" (Hailo-10H).',
    )
    arch: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9_]{1,32}$",
        description="CPU architecture it runs on: x86_64, aarch64, ...; null for a HEF (HailoRT runs it from any CPU).",
    )
    runtime_version: str = Field(
        max_length=64,
        description="The release that compiled it, e.g. '0.27.0' (TVM), '2.3.2' (rknn-toolkit2), '3.31.0' (Hailo's "
        "Dataflow Compiler, from the HEF's header; 'unknown' where the header names none).",
    )


class ArtifactEntry(_Strict):
    """One model file in the bundle."""

    path: str = Field(description="File name inside the bundle (no folders).")
    format: ModelFormat = Field(
        description="Model format: onnx, tflite, openvino (OpenVINO's IR: the path names the .xml, whose "
        "weights, the .bin of the same name, are listed in files; agents older than the format refuse it), or "
        "tvm (a module compiled by Apache TVM, a .so whose record, the .so.json, is listed in files), rknn (a "
        "model converted by rknn-toolkit2 for a Rockchip NPU, its record, the .rknn.json, listed in files), or hef "
        "(a HEF compiled for a Hailo chip by Hailo's Dataflow Compiler, its record, the .hef.json, listed in files).",
    )
    precision: Precision = Field(description="Numeric precision of the weights.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the file, lower-case hex.")
    size: int = Field(ge=1, description="File size in bytes.")
    agreement: Agreement | None = Field(
        default=None,
        description="Measured against the FP32 model at build time (variants of bundle build --precisions).",
    )
    target: CompiledTarget | None = Field(
        default=None,
        description="What a compiled artifact (format tvm, rknn or hef) was built for; none for the other formats.",
    )

    @model_serializer(mode="wrap")
    def _omit_unmeasured(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """No ``agreement`` key when nothing was measured, no ``target`` on an artifact that is not
        compiled: such a manifest stays readable by agents older than the fields (they refuse
        unknown keys)."""
        data: dict[str, Any] = handler(self)
        if self.agreement is None:
            data.pop("agreement", None)
        if self.target is None:
            data.pop("target", None)
        return data

    @field_validator("path")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _SAFE_NAME.match(value) or value in (".", ".."):
            raise ValueError(f"artifact path {value!r} must be a plain file name (letters, digits, . _ -)")
        return value

    @model_validator(mode="after")
    def _suffix_fits_format(self) -> ArtifactEntry:
        suffix = _SUFFIXES[self.format]
        if not self.path.lower().endswith(suffix):
            raise ValueError(f"artifact {self.path!r} of format {self.format} must be a {suffix} file")
        if (self.format in COMPILED_FORMATS) != (self.target is not None):
            raise ValueError(
                f"artifact {self.path!r}: a target is recorded for a tvm, rknn or hef artifact, and only for one"
            )
        if self.target is not None and (self.target.arch is None) != (self.format == "hef"):
            raise ValueError(f"artifact {self.path!r}: a {self.format} target names a CPU architecture unless a HEF's")
        return self

    @property
    def weights(self) -> str | None:
        """An OpenVINO IR's weights file (``model.bin`` beside ``model.xml``); None for other formats."""
        return self.path[: -len(".xml")] + ".bin" if self.format == "openvino" else None

    @property
    def companion(self) -> str | None:
        """The file the artifact needs beside it: an IR's weights, a compiled artifact's record
        (``model.so.json``, ``model.rknn.json``, ``model.hef.json``); None for other formats."""
        return self.path + ".json" if self.format in COMPILED_FORMATS else self.weights


class FileEntry(_Strict):
    """A data file of the bundle other than an artifact (labels, reference, calibration)."""

    path: str = Field(description="Path inside the bundle: a file name, or calibration/<name>.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the file, lower-case hex.")
    size: int = Field(ge=0, description="File size in bytes.")

    @field_validator("path")
    @classmethod
    def _safe(cls, value: str) -> str:
        parts = value.split("/")
        if not (len(parts) == 1 or (len(parts) == 2 and parts[0] == "calibration")) or not all(
            _SAFE_NAME.match(p) for p in parts
        ):
            raise ValueError(f"file path {value!r} must be a plain name or calibration/<name>")
        return value


class Reference(_Strict):
    """Inputs and expected raw outputs for the on-device parity check."""

    path: str = Field(default="reference.npz", description="The .npz file (no pickled objects).")
    atol: float = Field(default=0.02, ge=0, description="Absolute tolerance on dequantized outputs.")
    rtol: float = Field(default=0.05, ge=0, description="Relative tolerance on dequantized outputs.")
    min_fraction: float = Field(
        default=0.99, gt=0, le=1, description="Fraction of output values that must be within tolerance."
    )


class Calibration(_Strict):
    """Calibration images shipped for INT8 engines built on the device."""

    folder: str = Field(default="calibration", description="Folder inside the bundle.")
    count: int = Field(ge=1, description="Number of images.")


class TensorRTProfile(_Strict):
    """Optimisation profile for a dynamic-shape ONNX input (N, C, H, W)."""

    min: tuple[int, int, int, int] = Field(description="Smallest input shape.")
    opt: tuple[int, int, int, int] = Field(description="Shape the engine is tuned for.")
    max: tuple[int, int, int, int] = Field(description="Largest input shape.")

    @model_validator(mode="after")
    def _ordered(self) -> TensorRTProfile:
        if not all(a <= b <= c for a, b, c in zip(self.min, self.opt, self.max, strict=True)):
            raise ValueError(f"profile must satisfy min <= opt <= max per axis, got {self.min}, {self.opt}, {self.max}")
        return self


class EngineTags(_Strict):
    """A prebuilt TensorRT engine in the bundle (also listed in `files`) and what it was built
    for: a device uses it only when every tag equals its own (docs/tensorrt.md)."""

    path: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}\.engine$", description="The .engine file.")
    artifact: str = Field(description="The ONNX artifact it was built from.")
    tensorrt_version: str = Field(description="TensorRT version that built it, e.g. '10.3.0.30'.")
    gpu_name: str = Field(description="GPU name as CUDA reports it, e.g. 'Orin'.")
    compute_capability: tuple[int, int] = Field(description="GPU compute capability, e.g. [8, 7].")
    precision: Precision = Field(description="Engine precision.")
    profile: TensorRTProfile | None = Field(default=None, description="Optimization profile it was built with.")


class ClassifierStage(_Strict):
    """A second stage (optional): a classification model run on each confirmed track's crop, once
    when the track is confirmed and again every `every_s` seconds while it lives; its answer goes
    on the track's object events (docs/bundles.md, docs/analytics.md). Older bundles have none."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    artifacts: list[ArtifactEntry] = Field(
        min_length=1, description="The classifier's model files, one per format/precision (like the detector's)."
    )
    labels: list[str] = Field(
        min_length=1,
        description=f"The classifier's class labels, index = its class id; each at most {MAX_LABEL_CHARS} characters.",
    )
    for_labels: list[str] = Field(
        default_factory=list,
        alias="for",
        description="The detector labels whose tracks are classified (empty: every label).",
    )
    every_s: float = Field(
        default=5.0, gt=0, description="Seconds between two classifications of one live track (after the first)."
    )

    @model_serializer(mode="wrap")
    def _keyed_for(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``for`` (a Python keyword, so the field is `for_labels`) as the manifest writes it."""
        data: dict[str, Any] = handler(self)
        data["for"] = data.pop("for_labels", list(self.for_labels))
        return data

    @field_validator("labels")
    @classmethod
    def _named(cls, value: list[str]) -> list[str]:
        if any(not label.strip() for label in value):
            raise ValueError(f"classifier labels must not be empty, got {value}")
        return _bounded_labels(value, "classifier.labels")


BundleTask = Literal["detect", "segment", "pose", "obb"]


def decoder_task(decoder: str) -> BundleTask:
    """The task a decoder reads: ``*-seg`` segment, ``*-pose`` pose, ``*-obb`` obb, else detect."""
    for suffix, task in (("-seg", "segment"), ("-pose", "pose"), ("-obb", "obb")):
        if decoder.endswith(suffix):
            return task  # type: ignore[return-value]  # one of BundleTask's
    return "detect"


class Manifest(_Strict):
    """manifest.json of a model bundle."""

    schema_version: Literal[1] = Field(description="Manifest format version.")
    kind: Literal["model"] = Field(
        default="model",
        description="A model bundle (left out when written, so agents older than the field read it).",
    )
    name: str = Field(pattern=_SAFE_NAME.pattern, description="Bundle name, e.g. 'people-counter'.")
    version: SemVer = Field(description="Semantic version of the bundle, e.g. '1.4.0'.")
    task: BundleTask = Field(
        default="detect",
        description="What the model does: detect (boxes), segment (boxes and masks), pose (boxes and keypoints) "
        "or obb (oriented boxes); bundle build takes it from the model (its decoder, chosen from the metadata's "
        "task). Older bundles say detect, whatever their decoder, and stay valid.",
    )
    description: str = Field(default="", max_length=1000, description="Free text for operators.")
    created: str = Field(description="When the bundle was built, ISO 8601 UTC.")
    decoder: DecoderName = Field(description="Output decoder.")
    input: InputSpec = Field(description="Input preprocessing.")
    labels: list[str] = Field(
        min_length=1, description=f"Class labels, index = class id; each at most {MAX_LABEL_CHARS} characters."
    )
    thresholds: DetectionThresholds = Field(
        default_factory=DetectionThresholds, description="Post-processing thresholds."
    )
    artifacts: list[ArtifactEntry] = Field(min_length=1, description="Model files, one per format/precision.")
    files: list[FileEntry] = Field(
        default_factory=list, description="Every other file of the bundle (labels, reference, calibration), hashed."
    )
    reference: Reference = Field(default_factory=Reference, description="Parity check data.")
    calibration: Calibration | None = Field(default=None, description="INT8 calibration images, if shipped.")
    tensorrt_profile: TensorRTProfile | None = Field(default=None, description="TensorRT optimisation profile.")
    engines: list[EngineTags] = Field(
        default_factory=list, description="Prebuilt TensorRT engines, used only on an exact match of their tags."
    )
    classifier: ClassifierStage | None = Field(
        default=None, description="A second stage: a classifier of each confirmed track's crop (optional)."
    )

    @model_serializer(mode="wrap")
    def _omit_no_classifier(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """No ``classifier`` key without a second stage: such a manifest stays readable by agents
        older than the field (they refuse unknown keys)."""
        data: dict[str, Any] = handler(self)
        if self.classifier is None:
            data.pop("classifier", None)
        data.pop("kind", None)  # "model" is what a manifest without kind is
        return data

    @field_validator("labels")
    @classmethod
    def _short_labels(cls, value: list[str]) -> list[str]:
        return _bounded_labels(value, "labels")

    @model_validator(mode="after")
    def _task_fits_decoder(self) -> Manifest:
        # "detect" is what every bundle said before tasks: it stays valid over any decoder
        if self.task != "detect" and self.task != decoder_task(self.decoder):
            raise ValueError(
                f"task {self.task!r} does not fit decoder {self.decoder!r}, which reads "
                f"{decoder_task(self.decoder)} models"
            )
        return self

    @model_validator(mode="after")
    def _unique_paths(self) -> Manifest:
        stage = self.classifier.artifacts if self.classifier is not None else []
        paths = [a.path for a in [*self.artifacts, *stage]] + [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            raise ValueError(f"artifact and file paths must be unique, got {paths}")
        return self

    @model_validator(mode="after")
    def _engines_listed(self) -> Manifest:
        onnx = {a.path for a in self.artifacts if a.format == "onnx"}
        files = {f.path for f in self.files}
        for engine in self.engines:
            if engine.artifact not in onnx:
                raise ValueError(f"engine {engine.path}: artifact {engine.artifact!r} is not an ONNX artifact")
            if engine.path not in files:
                raise ValueError(f"engine {engine.path} must also be listed in files (its sha256 and size)")
        return self

    @model_validator(mode="after")
    def _weights_listed(self) -> Manifest:
        stage = self.classifier.artifacts if self.classifier is not None else []
        files = {f.path for f in self.files}
        for artifact in [*self.artifacts, *stage]:
            if artifact.companion is not None and artifact.companion not in files:
                kind, what = {
                    "tvm": ("TVM module", "record"),
                    "rknn": ("RKNN model", "record"),
                    "hef": ("HEF", "record"),
                }.get(artifact.format, ("OpenVINO IR", "weights"))
                raise ValueError(
                    f"{kind} {artifact.path}: its {what} {artifact.companion} must also be listed in files "
                    "(their sha256 and size)"
                )
        return self

    @model_validator(mode="after")
    def _classifies_known_labels(self) -> Manifest:
        if self.classifier is not None:
            unknown = [label for label in self.classifier.for_labels if label not in self.labels]
            if unknown:
                raise ValueError(
                    f"classifier.for names {', '.join(unknown)}, which the detector's labels "
                    f"({', '.join(self.labels[:10])}) do not have"
                )
        return self

    def to_bytes(self) -> bytes:
        """The canonical bytes that are signed and stored (sorted keys, UTF-8)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=2).encode() + b"\n"


_WHEEL_NAME = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}\.whl$"
#: how many wheels an agent bundle may carry (edge-agent's and the dependencies it changes)
MAX_WHEELS = 50


class WheelEntry(_Strict):
    """One wheel of an agent bundle."""

    path: str = Field(pattern=_WHEEL_NAME, description="The wheel's file name (PEP 427: name-version-tags.whl).")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the file, lower-case hex.")
    size: int = Field(ge=1, description="File size in bytes.")


class AgentManifest(_Strict):
    """manifest.json of an agent bundle: edge-agent's own wheels for one target (docs/fleet.md)."""

    schema_version: Literal[1] = Field(description="Manifest format version.")
    kind: Literal["agent"] = Field(description="An agent bundle: edge-agent itself, not a model.")
    name: Literal["edge-agent"] = Field(default="edge-agent", description="Always edge-agent.")
    version: SemVer = Field(description="The edge-agent version its edge-agent wheel carries, e.g. '0.2.1'.")
    description: str = Field(default="", max_length=1000, description="Free text for operators.")
    created: str = Field(description="When the bundle was built, ISO 8601 UTC.")
    python: str = Field(
        pattern=r"^(py3|cp3\d{1,2}|py3\d{1,2})$",
        description="The Python it is for: py3 (any Python 3: every wheel is py3) or one version, e.g. cp311.",
    )
    arch: str = Field(
        pattern=r"^[a-z0-9_]{1,32}$",
        description="The architecture it is for: any (every wheel is pure Python) or one, e.g. aarch64, x86_64.",
    )
    wheels: list[WheelEntry] = Field(
        min_length=1,
        max_length=MAX_WHEELS,
        description="edge-agent's wheel and any dependency's whose version changes.",
    )

    @model_validator(mode="after")
    def _unique_wheels(self) -> AgentManifest:
        paths = [wheel.path for wheel in self.wheels]
        if len(set(paths)) != len(paths):
            raise ValueError(f"wheel paths must be unique, got {paths}")
        return self

    def to_bytes(self) -> bytes:
        """The canonical bytes that are signed and stored (sorted keys, UTF-8)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=2).encode() + b"\n"


def schema_json() -> str:
    """The JSON Schema of manifest.json: a model bundle's or (``kind: agent``) an agent bundle's."""
    schema = TypeAdapter(Manifest | AgentManifest).json_schema()
    schema["title"] = "manifest.json of an edge-agent bundle"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(schema_json(), end="")
