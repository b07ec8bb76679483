"""Exporter metadata parsing and label files."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from pipelines.labels import Labels, LabelsError
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


def test_labels_plain_and_with_background_line() -> None:
    plain = Labels.from_lines(["person", "bicycle", ""])
    assert (plain(0), plain(1), plain(7)) == ("person", "bicycle", "7")
    ssd = Labels.from_lines(["???", "person", "bicycle", "car"])
    assert (ssd(0), ssd(2)) == ("person", "car")


def test_labels_file_errors(tmp_path: Path) -> None:
    with pytest.raises(LabelsError, match="cannot read labels file"):
        Labels.from_file(tmp_path / "missing.txt")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(LabelsError, match="cannot read labels file"):
        Labels.from_file(bad)
