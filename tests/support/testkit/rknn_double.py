"""A double of rknn-toolkit-lite2's ``rknnlite.api.RKNNLite`` (aarch64 only, not obtainable
here) that runs the ONNX model underneath with ONNX Runtime.

Checked against the API as read (the toolkit's lite2 examples and user guide, release 2.3):
``RKNNLite(verbose=False, verbose_file=None)``; ``load_rknn(path)`` and
``init_runtime(core_mask=NPU_CORE_AUTO)`` return 0 on success and -1 on failure (a model for
another platform than the board's fails in ``init_runtime``; a core mask other than AUTO only on
the RK3588/RK3576); ``inference(inputs, data_format=None, inputs_pass_through=None,
get_frame_id=False)`` returns a list of float32 ``numpy`` arrays in the ONNX outputs' shapes, or
None on failure (a 4-D input is NHWC unless ``data_format`` says ``nchw``); ``release()``; the
``NPU_CORE_*`` constants. The board is the device tree's ``compatible`` file `COMPATIBLE` names.

A double's ``.rknn`` (`double_rknn`) is a header naming its platform, then the ONNX model's bytes;
its record beside it is the real one (`runtimes.rknn_backend.write_record`).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

MAGIC = b"RKNN-DOUBLE\n"


class RKNNLite:
    NPU_CORE_AUTO = 0
    NPU_CORE_0 = 1
    NPU_CORE_1 = 2
    NPU_CORE_2 = 4
    NPU_CORE_0_1 = 3
    NPU_CORE_0_1_2 = 7
    NPU_CORE_ALL = 0xFFFF
    #: the board's device tree (the real library reads /proc/device-tree/compatible)
    COMPATIBLE = Path("/proc/device-tree/compatible")
    #: every call made, for tests to read: (method, arguments)
    calls: ClassVar[list[tuple[str, dict[str, Any]]]] = []

    def __init__(self, verbose: bool = False, verbose_file: str | None = None) -> None:
        self._platform: str | None = None
        self._onnx: bytes | None = None
        self._session: Any = None

    def load_rknn(self, path: str) -> int:
        RKNNLite.calls.append(("load_rknn", {"path": path}))
        try:
            data = Path(path).read_bytes()
        except OSError:
            return -1
        if not data.startswith(MAGIC):
            return -1
        header, _, onnx = data[len(MAGIC) :].partition(b"\n")
        self._platform, self._onnx = json.loads(header)["target_platform"], onnx
        return 0

    def init_runtime(self, core_mask: int = NPU_CORE_AUTO) -> int:
        RKNNLite.calls.append(("init_runtime", {"core_mask": core_mask}))
        if self._onnx is None:
            return -1
        compatible = self.COMPATIBLE.read_bytes().decode().split("\x00") if self.COMPATIBLE.exists() else []
        board = next((c.split(",")[1][:6] for c in compatible if c.startswith("rockchip,rk3")), None)
        if board != self._platform:
            return -1  # "The target platform of the RKNN model does not match the device"
        masks = {0, 1, 2, 4, 3, 7, 0xFFFF}
        if core_mask not in masks or (core_mask != self.NPU_CORE_AUTO and board not in ("rk3588", "rk3576")):
            return -1
        import onnxruntime as ort

        self._session = ort.InferenceSession(self._onnx, providers=["CPUExecutionProvider"])
        return 0

    def inference(
        self,
        inputs: list[np.ndarray[Any, Any]],
        data_format: str | list[str] | None = None,
        inputs_pass_through: list[int] | None = None,
        get_frame_id: bool = False,
    ) -> list[np.ndarray[Any, Any]] | None:
        RKNNLite.calls.append(("inference", {"data_format": data_format, "shapes": [np.shape(a) for a in inputs]}))
        if self._session is None or not isinstance(inputs, list):
            return None
        specs = self._session.get_inputs()
        if len(inputs) != len(specs):
            return None
        formats = data_format if isinstance(data_format, list) else [data_format or "nhwc"] * len(inputs)
        feed = {}
        for spec, array, fmt in zip(specs, inputs, formats, strict=False):
            array = np.asarray(array, dtype=np.float32)
            if array.ndim == 4 and fmt == "nhwc":
                array = array.transpose(0, 3, 1, 2)
            if list(array.shape) != [d if isinstance(d, int) else array.shape[i] for i, d in enumerate(spec.shape)]:
                return None  # the real runtime logs the size mismatch and returns None
            feed[spec.name] = np.ascontiguousarray(array)
        return [np.asarray(o, dtype=np.float32) for o in self._session.run(None, feed)]

    def get_sdk_version(self) -> str:
        return "librknnrt version: 2.3.2 (double)"

    def release(self) -> None:
        RKNNLite.calls.append(("release", {}))
        self._session = self._onnx = None


def toolkit_python() -> Path:
    """The python of rknn-toolkit2's own venv (``$EDGE_AGENT_RKNN_PYTHON``, else ``.venv-rknn``):
    skips (or fails, where ``EDGE_AGENT_REQUIRE`` lists ``rknn``: scripts/test_rknn.sh) without one."""
    import os

    from testkit import REPO
    from testkit.needs import missing

    python = Path(os.environ.get("EDGE_AGENT_RKNN_PYTHON") or REPO / ".venv-rknn" / "bin" / "python")
    if not python.is_file():
        missing("rknn", f"no rknn-toolkit2 venv at {python}: scripts/test_rknn.sh makes one")
    return python


def install(monkeypatch: pytest.MonkeyPatch, compatible: Path) -> type[RKNNLite]:
    """Make ``from rknnlite.api import RKNNLite`` give the double, on the board whose device
    tree's ``compatible`` is the file `compatible` (for the backend and the double alike)."""
    import runtimes.rknn_backend as backend

    package, api = types.ModuleType("rknnlite"), types.ModuleType("rknnlite.api")
    api.RKNNLite = RKNNLite  # type: ignore[attr-defined]
    package.api = api  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rknnlite", package)
    monkeypatch.setitem(sys.modules, "rknnlite.api", api)
    monkeypatch.setattr(RKNNLite, "COMPATIBLE", compatible)
    monkeypatch.setattr(RKNNLite, "calls", [])
    monkeypatch.setattr(backend, "COMPATIBLE", compatible)
    return RKNNLite


def double_rknn(onnx_model: Path, folder: Path, platform: str = "rk3588") -> Path:
    """``<stem>.rknn`` in `folder` that the double runs as `onnx_model` on `platform`, with the
    real record beside it."""
    from runtimes.rknn_backend import write_record

    out = folder / f"{onnx_model.stem}.rknn"
    header = json.dumps({"target_platform": platform}).encode()
    out.write_bytes(MAGIC + header + b"\n" + onnx_model.read_bytes())
    write_record(onnx_model, out, platform, "2.3.2", "i8")
    return out
