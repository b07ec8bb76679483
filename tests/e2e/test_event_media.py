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
    agents("dev1", cameras=[camera], events={"snapshots": True, "min_confidence": 0.3})
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


def test_a_clip_around_an_objects_start_is_kept_fetched_in_chunks_and_linked_from_the_page(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    broker: Broker,
    watcher: Watcher,
    agents: Any,
    bundles: Any,
    chromium: Any,
) -> None:
    """A camera with ``clips``: its objects' events carry the clip's reference; the clip is an
    MP4 on the device's disk that OpenCV reads back, ``fleet media --clip`` fetches it over MQTT
    in chunks (byte for byte), and the page's event list links to it and to the snapshot, served
    with the technician's credentials."""
    from testkit.net import free_port
    from testkit.page import basic, http

    (tmp_path / "password").write_text("pass word\n")
    port = free_port()
    camera = {"name": "cam0", "source": "tracking:5", "max_fps": 15, "clips": {"pre_s": 0.5, "post_s": 1.0}}
    agents(
        "dev1",
        cameras=[camera],
        events={"snapshots": True, "min_confidence": 0.3},
        status_page={"listen": f"127.0.0.1:{port}", "username": "tech", "password_file": str(tmp_path / "password")},
    )
    online(watcher, "dev1")
    finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "device:dev1"))
    serving(watcher, "dev1", "1.0.0")
    media = tmp_path / "dev1" / "state" / "media"

    def an_end_with_its_clip_written() -> Any:
        for end in watcher.all_json("edge/dev1/events"):
            if end.get("type") == "end" and end.get("clip") and end.get("snapshot") and (media / end["clip"]).is_file():
                return end
        return None

    end = wait_until(an_end_with_its_clip_written, 120, "an end event whose clip is written")
    assert end["clip"] == f"{end['object_id']}.mp4"
    starts = [e for e in watcher.all_json("edge/dev1/events") if e.get("type") == "start"]
    assert any(s["object_id"] == end["object_id"] and s.get("clip") == end["clip"] for s in starts)
    kept = (media / end["clip"]).read_bytes()
    capture = cv2.VideoCapture(str(media / end["clip"]))
    count, fps = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), capture.get(cv2.CAP_PROP_FPS)
    capture.release()
    assert fps > 0 and count / fps >= 1.0 - 2 / fps, f"at least post_s of video: {count} frames at {fps:.1f} fps"

    out = tmp_path / "fetched.mp4"
    status, text = cli(
        capsys,
        "fleet",
        "media",
        "dev1",
        end["object_id"],
        "--clip",
        "--chunk-size",
        "16k",
        "-o",
        str(out),
        "--broker",
        broker.url,
    )
    assert status == 0, text
    assert f"({len(kept)} bytes)" in text and len(kept) > 3 * 16 * 1024, "a clip of several chunks"
    assert out.read_bytes() == kept, "the chunks put back together are the kept file"
    status, text = cli(capsys, "fleet", "media", "dev1", "0123456789abcdef", "--clip", "--broker", broker.url)
    assert status != 0 and "NO_MEDIA" in text, text

    url, auth = f"http://127.0.0.1:{port}", basic("tech", "pass word")
    assert http(f"{url}/api/events/{end['object_id']}/clip").status == 401
    page = chromium.page()
    page.headers(auth)
    page.open(url + "/")
    linked = "[...document.querySelectorAll('#events a.%s')].map(a => a.getAttribute('href'))"

    def a_written_clip_linked() -> str | None:  # the list shows the newest 15 events, clips written or not
        for href in page.evaluate(linked % "clip"):
            if (media / f"{href.split('/')[3]}.mp4").is_file():
                return str(href)
        return None

    clip_href = wait_until(a_written_clip_linked, 60, "the page's event list to link to a written clip")
    snapshot_href = page.wait_for(f"({linked % 'snapshot'})[0]")
    fetched = (
        "fetch('%s').then(r => r.arrayBuffer().then(b => [r.status, r.headers.get('content-type'), b.byteLength]))"
    )
    clip_file, snapshot_file = media / f"{clip_href.split('/')[3]}.mp4", media / f"{snapshot_href.split('/')[3]}.jpg"
    assert page.evaluate(fetched % clip_href) == [200, "video/mp4", clip_file.stat().st_size]
    assert page.evaluate(fetched % snapshot_href) == [200, "image/jpeg", snapshot_file.stat().st_size]
    # the media store's use beside the backlog: at least this snapshot and this clip
    shown = page.wait_for("(t => /media\\d+ file\\(s\\)/.test(t) && t)(document.getElementById('broker').textContent)")
    files = int(shown.split("media", 1)[1].split(" file(s)")[0])
    assert files >= 2 and "backlog" in shown
