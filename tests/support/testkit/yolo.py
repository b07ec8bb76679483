"""A YOLO-format dataset validator for the samples tests (ultralytics is not installed in the
test environment): what Ultralytics' ``check_det_dataset`` and its label loader
(``verify_image_label``) refuse, checked the same way, so a dataset that passes here loads there."""

from __future__ import annotations

from pathlib import Path

import cv2
import yaml

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


def validate_dataset(root: Path, task: str = "detect", keypoints: int = 0) -> dict[str, int]:
    """Check `root`'s ``data.yaml``, ``images/`` and ``labels/``: ``names`` a dict of class id ->
    name with ids 0..n-1 (or a list), ``train`` and ``val`` folders that exist, each image
    readable with a label file beside it (none: a background image) whose lines are a class
    within ``names`` and values normalised to 0..1, as many as `task` wants (detect: 4; segment:
    an even number, at least 6; pose: 4 + 3 per keypoint, or 2 per keypoint). Raises
    AssertionError with what is wrong; returns counts of images and label lines."""
    data = yaml.safe_load((root / "data.yaml").read_text())
    names = data["names"]
    names = dict(enumerate(names)) if isinstance(names, list) else names
    assert sorted(names) == list(range(len(names))), f"names must be ids 0..n-1, got {sorted(names)}"
    base = Path(data.get("path", root))
    base = base if base.is_absolute() else root / base
    for split in ("train", "val"):
        assert (base / data[split]).is_dir(), f"{split}: {base / data[split]} is not a folder"
    images = sorted(p for p in (base / data["train"]).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    assert images, "no images"
    lines = 0
    for image in images:
        assert cv2.imread(str(image)) is not None, f"{image.name} is not a readable image"
        label = base / "labels" / f"{image.stem}.txt"
        if not label.exists():
            continue
        for number, line in enumerate(label.read_text().splitlines(), 1):
            where = f"{label.name}:{number}"
            parts = line.split()
            assert parts, f"{where}: empty line"
            cls, values = int(parts[0]), [float(v) for v in parts[1:]]
            assert cls in names, f"{where}: class {cls} is not in names"
            assert all(0.0 <= v <= 1.0 for v in values), f"{where}: a value outside 0..1: {values}"
            if task == "detect":
                assert len(values) == 4, f"{where}: a box has 4 values, got {len(values)}"
            elif task == "segment":
                assert len(values) >= 6 and len(values) % 2 == 0, f"{where}: a polygon's values: {len(values)}"
            elif task == "pose":
                assert len(values) in (4 + 3 * keypoints, 4 + 2 * keypoints), f"{where}: pose values: {len(values)}"
            lines += 1
    return {"images": len(images), "lines": lines}
