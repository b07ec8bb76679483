"""`pipelines.decoding.labels`: label files, with a background line, and their errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.decoding.labels import Labels, LabelsError


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
