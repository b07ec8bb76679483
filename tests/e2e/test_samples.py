"""End to end: samples for retraining kept by an agent process serving the demo bundle on the
tracking scene, fetched with ``edge-agent fleet samples`` over a real mosquitto (signed, in
chunks) into a dataset folder that a YOLO-format validator accepts (`testkit.yolo`: ultralytics is
not installed in the test environment), the privacy mask blank in the fetched pixels, the
device's samples within their byte budget, and nothing kept for the camera that keeps none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import pytest
import yaml
from testkit.broker import Broker, Watcher
from testkit.fleet import cli, finished, online, push, serving
from testkit.net import wait_until
from testkit.yolo import validate_dataset

pytestmark = pytest.mark.usefixtures("operator_key")

MASK = [[0, 0], [160, 0], [160, 120], [0, 120]]  # the top-left corner of the scene's 640 x 480
MAX_MB = 0.4


def test_a_camera_with_samples_on_yields_a_dataset_over_mqtt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], broker: Broker, watcher: Watcher, agents: Any, bundles: Any
) -> None:
    samples = {
        "enabled": True,
        "score_band": [0.25, 1.0],  # every detection: each inferred frame with one is a sample
        "min_interval_s": 0.2,
        "max_mb": MAX_MB,
        "privacy_masks": [MASK],
    }
    cameras = [
        {"name": "cam0", "source": "tracking:5", "max_fps": 15, "samples": samples},
        {"name": "cam1", "source": "tracking:6", "max_fps": 15},  # samples off (the default)
    ]
    agents("dev1", cameras=cameras)
    online(watcher, "dev1")
    finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "device:dev1"))
    serving(watcher, "dev1", "1.0.0")
    kept = tmp_path / "dev1" / "state" / "samples"

    def kept_now(least: int = 3) -> list[Path] | None:
        found = sorted((kept / "cam-cam0").glob("*.json")) if (kept / "cam-cam0").is_dir() else []
        return found if len(found) >= least else None

    first = wait_until(kept_now, 120, "samples kept on cam0")[0]
    wait_until(lambda: not first.exists(), 120, "the oldest sample dropped for the byte budget (max_age_h is a week)")

    out = tmp_path / "dataset"
    status, text = cli(capsys, "fleet", "samples", "dev1", "--out", str(out), "--broker", broker.url)
    assert status == 0, text
    counts = validate_dataset(out)
    assert counts["images"] >= 3 and counts["lines"] >= 1, counts
    names = yaml.safe_load((out / "data.yaml").read_text())["names"]
    assert names == {0: "circle", 1: "square", 2: "triangle"}
    for image_path in sorted((out / "images").glob("*.jpg")):
        image = cv2.imread(str(image_path))
        assert image.shape == (480, 640, 3)
        assert image[4:116, 4:156].max() <= 16, f"{image_path.name}: the privacy mask is not blank"
        meta = json.loads((out / "meta" / f"{image_path.stem}.json").read_text())
        assert meta["camera"] == "cam0" and meta["reason"] == "unsure" and meta["version"] == "1.0.0"
    assert not any(path.name.startswith("cam1") for path in (out / "images").iterdir())

    # the device's samples stay within their budget (its files, as they are now)
    used = sum(path.stat().st_size for path in (kept / "cam-cam0").iterdir() if not path.name.endswith(".tmp"))
    assert used <= MAX_MB * 1024 * 1024
    assert not (kept / "cam-cam1").exists(), "nothing is kept for a camera with samples off"

    status, text = cli(
        capsys, "fleet", "samples", "dev1", "cam1", "--out", str(tmp_path / "no"), "--broker", broker.url
    )
    assert status != 0 and "NO_PIPELINE" in text and "keeps no samples" in text, text
