"""End to end: an object event's snapshot kept on the device's disk, the event carrying its
reference, fetched by the operator with ``edge-agent fleet media`` (a real mosquitto, an agent
process serving the demo bundle on the tracking scene)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import pytest
from testkit.broker import Broker, Watcher
from testkit.fleet import cli, finished, online, push, serving
from testkit.net import wait_until

pytestmark = pytest.mark.usefixtures("operator_key")


def test_an_events_snapshot_is_kept_on_disk_and_fetched_by_its_reference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], broker: Broker, watcher: Watcher, agents: Any, bundles: Any
) -> None:
    camera = {"name": "cam0", "source": "tracking:5", "max_fps": 15}
    agents("dev1", pipelines=[camera], events={"snapshots": True, "min_confidence": 0.3})
    online(watcher, "dev1")
    finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "device:dev1"))
    serving(watcher, "dev1", "1.0.0")

    def an_end_with_its_snapshot() -> Any:
        ends = [e for e in watcher.all_json("edge/dev1/events") if e.get("type") == "end" and e.get("snapshot")]
        return ends[0] if ends else None

    end = wait_until(an_end_with_its_snapshot, 120, "an end event with its snapshot's reference")
    assert "snapshot_jpeg" not in end, "a reference, not the base64 blob"
    assert end["snapshot"] == f"{end['object_id']}.jpg"
    kept = tmp_path / "dev1" / "state" / "media" / end["snapshot"]
    assert kept.is_file()

    out = tmp_path / "fetched.jpg"
    status, text = cli(capsys, "fleet", "media", "dev1", end["object_id"], "-o", str(out), "--broker", broker.url)
    assert status == 0, text
    assert out.read_bytes() == kept.read_bytes()
    image = cv2.imread(str(out))
    x1, y1, x2, y2 = end["box"]
    assert image is not None and abs(image.shape[1] - (x2 - x1)) <= 2 and abs(image.shape[0] - (y2 - y1)) <= 2

    status, text = cli(capsys, "fleet", "media", "dev1", "0123456789abcdef", "--broker", broker.url)
    assert status != 0 and "NO_MEDIA" in text, text
