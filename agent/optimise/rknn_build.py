"""``bundle build --rknn PLATFORM``: the ONNX model converted by rknn-toolkit2 for a Rockchip NPU
(`convert`), INT8 calibrated on the bundle's calibration images or FP16, and proven before it
ships: the toolkit's x86 simulator runs the converted model on the validation images, its outputs
decoded by the same path as ONNX Runtime's and measured against them (`agreement.measure`, the
gate of ``--min-agreement`` that ``--precisions`` variants pass).

rknn-toolkit2 pins numpy < 2 and an old torch and onnx, so it lives in an environment of its own
(``--rknn-python``, or ``EDGE_AGENT_RKNN_PYTHON``: that environment's python) and runs as a
subprocess there (`agent/optimise/rknn_convert.py`, which imports nothing of edge-agent), as the
Ultralytics comparisons do. The simulator runs only in the process that converted the model, so
the conversion and the simulation are one call; its outputs come back in an ``.npz``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.errors import BundleError, ErrorCode
from agent.optimise.agreement import Measured, measure
from pipelines.decoding.detector import Detector
from runtimes.base import InferenceError, Runtime
from runtimes.registry import load_runtime
from runtimes.rknn_backend import RKNNRecord, write_record

SIDE = Path(__file__).with_name("rknn_convert.py")
ENV_PYTHON = "EDGE_AGENT_RKNN_PYTHON"
#: the most a conversion may take (a YOLO at 640 with 100 calibration images: a few minutes)
TIMEOUT_S = 1800
_TAIL = 2000  # the characters of the toolkit's log a failure quotes


def toolkit_python(given: Path | None) -> Path:
    """The toolkit environment's python: `given`, else ``$EDGE_AGENT_RKNN_PYTHON``; `BundleError`
    ``BUILD_TOOLS_MISSING`` saying how to make one when there is none."""
    path = given or (Path(os.environ[ENV_PYTHON][:4096]) if os.environ.get(ENV_PYTHON) else None)
    if path is None or not path.is_file():
        raise BundleError(
            ErrorCode.BUILD_TOOLS_MISSING,
            f"--rknn runs rknn-toolkit2 in its own environment ({path or 'none given'}): python3 -m venv "
            f"/opt/rknnvenv && /opt/rknnvenv/bin/pip install rknn-toolkit2, then --rknn-python "
            f"/opt/rknnvenv/bin/python or {ENV_PYTHON} (docs/rknn.md)",
        )
    return path


class _Recording(Runtime):
    """A runtime passing calls to `inner` and keeping the arrays it was given (the tensors the
    pipeline's preprocessing makes, exactly as a runtime receives them)."""

    def __init__(self, inner: Runtime) -> None:
        super().__init__(inner.model_path)
        self.inner = inner
        self.seen: list[npt.NDArray[Any]] = []
        self.inputs, self.outputs, self.metadata = inner.inputs, inner.outputs, inner.metadata

    def infer(self, arrays: Sequence[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        self.seen.append(np.array(arrays[0]))
        return self.inner.infer(arrays)


class Simulated(Runtime):
    """The simulator's outputs, as a runtime: for each input tensor it was run on (by digest),
    what it returned; any other tensor is an `InferenceError`."""

    name = "rknn-simulator"

    def __init__(self, model_path: Path, like: Runtime, answers: dict[str, list[npt.NDArray[Any]]]) -> None:
        super().__init__(model_path)
        self.inputs, self.outputs, self.metadata = like.inputs, like.outputs, like.metadata
        self.answers = answers

    def infer(self, arrays: Sequence[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        found = self.answers.get(_digest(arrays[0]))
        if found is None:
            raise InferenceError("the simulator was not run on this tensor")
        return [spec_shaped(a, s.shape) for a, s in zip(found, self.outputs, strict=True)]


def spec_shaped(array: npt.NDArray[Any], shape: tuple[int | None, ...]) -> npt.NDArray[Any]:
    """`array` in the ONNX output's shape where it is fixed (the toolkit may add or drop unit axes)."""
    if None in shape:
        return array
    return array.reshape(tuple(int(d) for d in shape if d is not None))


def read_images(paths: Sequence[Path], role: str) -> list[npt.NDArray[Any]]:
    """The BGR images at `paths`; `BundleError` naming one that cannot be read."""
    import cv2

    images = []
    for path in paths:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise BundleError(ErrorCode.VALIDATION_REQUIRED, f"{role} image {path} cannot be read as an image")
        images.append(image)
    return images


def _digest(array: npt.NDArray[Any]) -> str:
    return hashlib.sha256(np.ascontiguousarray(array, dtype=np.float32).tobytes()).hexdigest()


@dataclass(frozen=True)
class Converted:
    """An ``.rknn`` model written with its record, and how it answered against ONNX Runtime."""

    path: Path
    record: RKNNRecord
    measured: Measured


def convert(
    onnx_model: Path,
    platform: str,
    out: Path,
    python: Path,
    calibration: Sequence[npt.NDArray[Any]],
    validation: Sequence[npt.NDArray[Any]],
    fp16: bool = False,
    decoder: str = "auto",
) -> Converted:
    """Convert `onnx_model` for `platform` into `out` (its record beside it) with the toolkit of
    `python`, INT8 calibrated on the BGR `calibration` images (or `fp16`), and measure the
    simulator's detections on the BGR `validation` images against ONNX Runtime's. Raises
    `BundleError` ``MODEL_CHECK_FAILED`` when the toolkit refuses the model (its log's end quoted)."""
    with load_runtime("onnxruntime", onnx_model, warmup=False) as ort_rt:
        recording = _Recording(ort_rt)
        baseline = Detector(recording, decoder)
        guard = list(recording.seen)  # the plausibility guard's blank frame: the simulator's runs it too
        recording.seen.clear()
        for image in [*calibration, *validation]:
            baseline.infer(baseline.prepare(image)[0])
        tensors = recording.seen
        shapes = [{"name": s.name, "shape": [1 if d is None else d for d in s.shape]} for s in ort_rt.inputs]
        with tempfile.TemporaryDirectory(prefix="edge-agent-rknn-") as work:
            folder = Path(work)
            dataset = folder / "dataset.txt"
            names = []
            for i, tensor in enumerate(tensors[: len(calibration)]):
                np.save(folder / f"cal{i:04d}.npy", tensor)
                names.append(str(folder / f"cal{i:04d}.npy"))
            dataset.write_text("\n".join(names) + "\n")
            probes = [*guard, *tensors[len(calibration) :]]
            np.savez(folder / "probe.npz", *[t.transpose(0, 2, 3, 1) for t in probes])
            argv = [str(python), "-I", str(SIDE), "--onnx", str(onnx_model), "--platform", platform, "--out", str(out)]
            argv += ["--inputs", json.dumps(shapes), "--probe", str(folder / "probe.npz")]
            argv += ["--outputs", str(folder / "out.npz")]
            argv += ["--fp16"] if fp16 else ["--dataset", str(dataset)]
            try:
                run = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise BundleError(ErrorCode.BUILD_TOOLS_MISSING, f"--rknn: {python} did not run: {exc}") from exc
            if run.returncode != 0:
                tail = (run.stderr or run.stdout)[-_TAIL:].strip()
                raise BundleError(ErrorCode.MODEL_CHECK_FAILED, f"--rknn {platform}: rknn-toolkit2 failed: {tail}")
            try:  # its last line (bounded), then its outputs: anything else is a toolkit that misbehaved
                done = json.loads((run.stdout.strip().splitlines() or [""])[-1][:_TAIL])
                with np.load(folder / "out.npz") as found:
                    answers = {
                        _digest(t): [found[f"{i}_{j}"] for j in range(len(ort_rt.outputs))]
                        for i, t in enumerate(probes)
                    }
                version, quantization = str(done["toolkit_version"])[:64], str(done["quantization"])
            except (ValueError, KeyError, TypeError, OSError) as exc:
                raise BundleError(
                    ErrorCode.MODEL_CHECK_FAILED,
                    f"--rknn {platform}: rknn-toolkit2 exited 0 without its report ({type(exc).__name__}: {exc})",
                ) from exc
        record = write_record(onnx_model, out, platform, version, quantization)
        simulated = Detector(Simulated(out, ort_rt, answers), baseline.decoder)
        measured = measure(Detector(ort_rt, decoder), simulated, validation)
    return Converted(out, record, measured)
