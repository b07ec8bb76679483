"""`runtimes.metadata`: Ultralytics ONNX strings, TFLite metadata zips, odd values never raise."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from runtimes.metadata import parse_metadata, read_tflite_metadata


def test_ultralytics_onnx_strings() -> None:
    meta = parse_metadata(
        {"names": "{0: 'person', 1: 'bicycle'}", "imgsz": "[384, 640]", "stride": "32", "task": "detect"}
    )
    assert meta.names == {0: "person", 1: "bicycle"}
    assert meta.imgsz == (384, 640)
    assert meta.stride == 32
    assert meta.task == "detect"


@pytest.mark.parametrize(
    ("raw", "names", "imgsz", "stride"),
    [
        ({"names": "['a', 'b']", "imgsz": "320"}, {0: "a", 1: "b"}, (320, 320), None),
        ({"names": "__import__('os').system('x')", "imgsz": "[0, 5]", "stride": "[8, 16, 32]"}, None, None, 32),
        ({"names": {"0": "x"}, "imgsz": [1, 2, 3], "stride": "zz"}, {0: "x"}, None, None),
    ],
)
def test_malformed_or_odd_values_never_raise(raw, names, imgsz, stride) -> None:
    meta = parse_metadata(raw)
    assert (meta.names, meta.imgsz, meta.stride) == (names, imgsz, stride)


@pytest.mark.parametrize("member", ["metadata.json", "temp_meta.txt"])
def test_tflite_appended_zip(tmp_path: Path, member: str) -> None:
    path = tmp_path / "m.tflite"
    path.write_bytes(b"TFL3" + b"\0" * 100)
    content = (
        '{"names": {"0": "cat"}, "imgsz": [320, 320]}'
        if member.endswith("json")
        else "{'names': {0: 'cat'}, 'imgsz': [320, 320]}"
    )
    with zipfile.ZipFile(path, "a") as z:
        z.writestr(member, content)
    meta = read_tflite_metadata(path)
    assert meta.names == {0: "cat"} and meta.imgsz == (320, 320)


def test_tflite_without_metadata(tmp_path: Path) -> None:
    path = tmp_path / "m.tflite"
    path.write_bytes(b"TFL3" + b"\0" * 100)
    assert read_tflite_metadata(path).names is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [("[17, 3]", (17, 3)), ([3, 2], (3, 2)), ("[17, 4]", None), ("[0, 3]", None), ("17", None), ("[a, b]", None)],
)
def test_a_pose_models_keypoint_shape(value: object, expected: tuple[int, int] | None) -> None:
    assert parse_metadata({"task": "pose", "kpt_shape": value}).kpt_shape == expected
    assert parse_metadata({"task": "pose"}).kpt_shape is None
