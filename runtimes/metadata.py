"""Reading the metadata that model exporters embed (Ultralytics ONNX properties, TFLite zips).

Ultralytics writes Python literals as strings (``names = "{0: 'person', ...}"``,
``imgsz = "[640, 640]"``); they are parsed with `ast.literal_eval`, never `eval`.
"""

from __future__ import annotations

import ast
import json
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtimes.base import ModelMetadata

#: files that Ultralytics appends as a zip to a .tflite (older versions: temp_meta.txt)
_TFLITE_METADATA_FILES = ("metadata.json", "temp_meta.txt")
#: refuse to parse metadata blobs larger than this (bytes): a model is not a zip bomb carrier
_MAX_METADATA_BYTES = 1 << 20


def _literal(value: Any) -> Any:
    """Turn a string holding a Python/JSON literal into the value; other values pass through."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        try:
            return json.loads(text)
        except ValueError:
            return value


def _names(value: Any) -> dict[int, str] | None:
    value = _literal(value)
    if isinstance(value, Mapping):
        try:
            return {int(k): str(v) for k, v in value.items()}
        except (TypeError, ValueError):
            return None
    if isinstance(value, (list, tuple)):
        return {i: str(v) for i, v in enumerate(value)}
    return None


def _imgsz(value: Any) -> tuple[int, int] | None:
    value = _literal(value)
    if isinstance(value, int) and value > 0:
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2:
        try:
            h, w = int(value[0]), int(value[1])
        except (TypeError, ValueError):
            return None
        if h > 0 and w > 0:
            return h, w
    return None


def _stride(value: Any) -> int | None:
    value = _literal(value)
    if isinstance(value, (list, tuple)) and value:
        value = max(value)
    try:
        stride = int(value)
    except (TypeError, ValueError):
        return None
    return stride if stride > 0 else None


def _kpt_shape(value: Any) -> tuple[int, int] | None:
    """A pose model's ``[K, d]``: K keypoints of d = 2 (x, y) or 3 (x, y, score) values."""
    value = _literal(value)
    if isinstance(value, (list, tuple)) and len(value) == 2:
        try:
            k, d = int(value[0]), int(value[1])
        except (TypeError, ValueError):
            return None
        if k > 0 and d in (2, 3):
            return k, d
    return None


def _flag(value: Any) -> bool:
    """True for ``True`` or its text (``"True"``, ``"true"``); anything else is false."""
    value = _literal(value)
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def _end2end(raw: Mapping[str, Any]) -> bool:
    """Ultralytics marks final-detection outputs with ``end2end`` (YOLOv10, YOLO26) or with
    ``nms`` in the export ``args`` (``export(nms=True)``)."""
    args = _literal(raw.get("args"))
    return _flag(raw.get("end2end")) or (isinstance(args, Mapping) and _flag(args.get("nms")))


def parse_metadata(raw: Mapping[str, Any]) -> ModelMetadata:
    """Build `ModelMetadata` from an exporter's key/value map; unknown or malformed keys are kept
    only in `raw`, never raise."""
    as_text = {str(k): v if isinstance(v, str) else repr(v) for k, v in raw.items()}
    task = raw.get("task")
    description = raw.get("description")
    return ModelMetadata(
        names=_names(raw["names"]) if "names" in raw else None,
        imgsz=_imgsz(raw["imgsz"]) if "imgsz" in raw else None,
        stride=_stride(raw["stride"]) if "stride" in raw else None,
        task=str(task) if task is not None else None,
        description=str(description) if description is not None else None,
        raw=as_text,
        end2end=_end2end(raw),
        kpt_shape=_kpt_shape(raw["kpt_shape"]) if "kpt_shape" in raw else None,
    )


def read_tflite_metadata(path: Path) -> ModelMetadata:
    """Read the metadata zip that Ultralytics appends to a .tflite file; empty if there is none."""
    try:
        with zipfile.ZipFile(path) as archive:
            for name in _TFLITE_METADATA_FILES:
                if name in archive.namelist():
                    info = archive.getinfo(name)
                    if info.file_size > _MAX_METADATA_BYTES:
                        return ModelMetadata()
                    value = _literal(archive.read(name).decode("utf-8", errors="replace"))
                    if isinstance(value, Mapping):
                        return parse_metadata(value)
    except (zipfile.BadZipFile, OSError, ValueError):
        pass
    return ModelMetadata()
