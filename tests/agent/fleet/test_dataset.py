"""`agent.fleet.dataset`: a device's samples archive written in Ultralytics' layout, a second
fetch added to the first, and an archive no device sends refused before anything is written."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml
from testkit.yolo import validate_dataset

from agent.fleet.dataset import DatasetError, write_dataset

JPEG = cv2.imencode(".jpg", np.full((48, 64, 3), 128, np.uint8))[1].tobytes()


def archive(*members: tuple[str, bytes], kind: bytes = tarfile.REGTYPE) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.type = len(data), kind
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def sample(stem: str, names: list[str], time: float, version: str = "1.0.0") -> list[tuple[str, bytes]]:
    meta = {"camera": "cam0", "time": time, "reason": "unsure", "version": version, "names": names}
    return [
        (f"images/{stem}.jpg", JPEG),
        (f"labels/{stem}.txt", b"1 0.5 0.5 0.25 0.5\n"),
        (f"meta/{stem}.json", json.dumps(meta).encode()),
    ]


def test_samples_are_written_as_a_yolo_dataset_and_a_second_fetch_adds_to_it(tmp_path: Path) -> None:
    out = tmp_path / "set"
    written = write_dataset(archive(*sample("cam0-1", ["person", "car"], 10.0)), out)
    assert (written.samples, written.names, written.mixed) == (1, ["person", "car"], ())
    written = write_dataset(archive(*sample("cam0-2", ["person", "car"], 20.0)), out)
    assert written.samples == 1
    assert validate_dataset(out) == {"images": 2, "lines": 2}
    data = yaml.safe_load((out / "data.yaml").read_text())
    assert data["names"] == {0: "person", 1: "car"} and data["train"] == data["val"] == "images"


def test_samples_of_versions_with_other_names_are_reported(tmp_path: Path) -> None:
    members = [*sample("cam0-1", ["person"], 10.0, "0.9.0"), *sample("cam0-2", ["person", "car"], 20.0)]
    written = write_dataset(archive(*members), tmp_path)
    assert written.names == ["person", "car"] and written.mixed == ("0.9.0",)


@pytest.mark.parametrize(
    ("members", "kind", "refusal"),
    [
        ([("../evil.jpg", JPEG)], tarfile.REGTYPE, "which no device sends"),
        ([("images/a.txt", b"")], tarfile.REGTYPE, "which no device sends"),
        ([("images/x/a.jpg", JPEG)], tarfile.REGTYPE, "which no device sends"),
        ([("images/a.jpg", b"")], tarfile.SYMTYPE, "which no device sends"),
        ([("meta/a.json", b"{}")], tarfile.REGTYPE, "not a sample's JSON"),
        ([("meta/a.json", b'{"names": "x", "time": 1}')], tarfile.REGTYPE, "names is not a list"),
    ],
)
def test_an_archive_no_device_sends_is_refused_before_anything_is_written(
    tmp_path: Path, members: list[tuple[str, bytes]], kind: bytes, refusal: str
) -> None:
    with pytest.raises(DatasetError, match=refusal):
        write_dataset(archive(*members, kind=kind), tmp_path / "set")
    assert not (tmp_path / "set").exists()
    with pytest.raises(DatasetError, match="not a tar"):
        write_dataset(b"\x00garbage" * 100, tmp_path / "set")
