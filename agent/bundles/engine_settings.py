"""What a bundle means for the backends: the hints its manifest gives their settings (its
optimization profile: `version_settings`, through each backend's `Backend.for_bundle`), and per
artifact what autotune hands a backend (`bundle_model`: the prebuilt engines it carries, used
only on an exact match of their tags, and its calibration images as calibration batches).

Pure functions of a verified version folder and its manifest; no backend is named here, nor its
settings: the builds themselves run in `runtimes.tensorrt_engines` (from the CLI's ``engine
build``, the daemon's background builder, or a backend's `prepare` before a row is measured).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.bundles.manifest import ArtifactEntry, EngineTags, InputSpec, Manifest, TensorRTProfile
from agent.errors import BundleError, ErrorCode
from pipelines.decoding.preprocess import PreprocessConfig, preprocess
from runtimes.base import BundleHints, BundleModel, Calibration, Prebuilt
from runtimes.engine_cache import EngineKey
from runtimes.registry import RuntimeSettings

#: image suffixes of calibration files (the same the bundle accepts)
_IMAGES = (".jpg", ".jpeg", ".png")


def bundle_hints(manifest: Manifest) -> BundleHints:
    """What the manifest says about its model for the backends' settings: its optimization profile."""
    profile = manifest.tensorrt_profile
    return BundleHints(None if profile is None else (profile.min, profile.opt, profile.max))


def version_settings(settings: RuntimeSettings, manifest: Manifest) -> RuntimeSettings:
    """The runtime settings for serving one version: each backend's with what the manifest says
    (`Backend.for_bundle`: TensorRT's with the manifest's profile, which wins over the device's
    `runtimes.tensorrt.profile`: the bundle knows its model)."""
    return settings.for_bundle(bundle_hints(manifest))


def bundle_model(folder: Path, manifest: Manifest, artifact: ArtifactEntry) -> BundleModel:
    """`artifact` of the version in `folder` as autotune hands it to a backend: its file, format,
    precision and sha256, the bundle's calibration batches and its prebuilt engines."""
    return BundleModel(
        folder / artifact.path,
        artifact.format,
        artifact.precision,
        artifact.sha256,
        bundle_calibration(folder, manifest),
        tuple(prebuilt_engines(folder, manifest)),
    )


def prebuilt_engines(folder: Path, manifest: Manifest) -> list[Prebuilt]:
    """The engines the bundle carries, each with the key it was built for (its ONNX artifact's
    sha256 and the tags the manifest gives)."""
    artifacts = {a.path: a for a in manifest.artifacts}
    found = []
    for engine in manifest.engines:
        profile = engine.profile
        key = EngineKey(
            onnx_sha256=artifacts[engine.artifact].sha256,
            tensorrt_version=engine.tensorrt_version,
            gpu_name=engine.gpu_name,
            compute_capability=engine.compute_capability,
            precision=engine.precision,
            profile=None if profile is None else (profile.min, profile.opt, profile.max),
        )
        found.append(Prebuilt(key, folder / engine.path))
    return found


def engine_tags(path: Path, key: EngineKey, artifacts: Sequence[ArtifactEntry]) -> EngineTags:
    """The manifest's tags of a prebuilt engine from its key; raises `BundleError` when its ONNX
    model is not among `artifacts` or its profile is not 4-D."""
    source = [a for a in artifacts if a.sha256 == key.onnx_sha256 and a.format == "onnx"]
    if not source:
        raise BundleError(
            ErrorCode.NO_MODEL,
            f"{path.name} was built from an ONNX model that is not in this bundle (bundle build simplifies "
            "ONNX models: build the engine from the model it ships, or build the bundle with --no-simplify)",
        )
    profile = None
    if key.profile is not None:
        if any(len(shape) != 4 for shape in key.profile):
            raise BundleError(ErrorCode.UNKNOWN_FORMAT, f"{path.name}: only 4-D (N, C, H, W) profiles can be tagged")
        profile = TensorRTProfile.model_validate({"min": key.profile[0], "opt": key.profile[1], "max": key.profile[2]})
    return EngineTags(
        path=path.name,
        artifact=source[0].path,
        tensorrt_version=key.tensorrt_version,
        gpu_name=key.gpu_name,
        compute_capability=key.compute_capability,
        precision=key.precision,
        profile=profile,
    )


def calibration_images(folder: Path, manifest: Manifest) -> list[Path]:
    """The bundle's calibration images, in name order (empty when it ships none)."""
    if manifest.calibration is None:
        return []
    images = folder / manifest.calibration.folder
    return sorted(p for p in images.iterdir() if p.suffix.lower() in _IMAGES) if images.is_dir() else []


def calibration_batches(images: Sequence[Path], spec: InputSpec) -> Calibration | None:
    """INT8 calibration batches: each image preprocessed as `spec` says (size, colour order,
    resize, normalisation) into a (1, 3, H, W) float32 tensor, read one at a time when TensorRT
    asks; None without images."""
    if not images:
        return None
    config = PreprocessConfig(
        size=spec.size, resize=spec.resize, pad_value=spec.pad_value, color=spec.color, mean=spec.mean, std=spec.std
    )

    def batches() -> Iterator[npt.NDArray[Any]]:
        import cv2

        for path in images:
            image = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if image is not None:
                yield np.ascontiguousarray(preprocess(np.asarray(image), config)[0])

    return batches


def bundle_calibration(folder: Path, manifest: Manifest) -> Calibration | None:
    """The bundle's calibration images as calibration batches (None when it ships none)."""
    return calibration_batches(calibration_images(folder, manifest), manifest.input)
