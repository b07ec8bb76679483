"""`agent.web.app`'s event media routes over real HTTP: an event's kept snapshot and clip
(from a real `MediaStore`, the clip written by OpenCV) with the technician's credentials and the
right content types, 404 ``NO_MEDIA`` for what is not kept, and ids that are not event ids
refused before anything is looked up (no path ever reaches the store)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest
from testkit.net import free_port
from testkit.page import basic, http
from testkit.snapshots import snapshot

from agent.config.models import MediaSection, StatusPageSection
from agent.daemon.clips import Clip, EncodedFrame, write_clip
from agent.daemon.media import MediaStore
from agent.snapshot import DeploymentStatus, Health
from agent.web.controls import AgentControls
from agent.web.server import StatusServer

AUTH = basic("tech", "pass word")
EVENT = "00ab00cd00ef0012"


@dataclass
class Served:
    url: str
    asked: list[tuple[str, str]]
    jpeg: bytes
    clip: bytes


def no_rollback() -> DeploymentStatus:
    raise AssertionError("not asked")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    store = MediaStore(tmp_path / "media", MediaSection())
    ok, encoded = cv2.imencode(".jpg", np.full((48, 64, 3), 200, np.uint8))
    jpeg = encoded.tobytes()
    store.put(EVENT, jpeg)
    frames = tuple(EncodedFrame(i / 10, jpeg) for i in range(10))
    written = write_clip(Clip(EVENT, frames, 10.0), store.folder)
    assert ok and written is not None and store.keep_clip(EVENT, written) == f"{EVENT}.mp4"
    asked: list[tuple[str, str]] = []

    def media(event_id: str, kind: str) -> tuple[bytes, str] | None:
        asked.append((event_id, kind))
        if kind == "clip":
            return store.clip(event_id)
        found = store.get(event_id)
        return None if found is None else (found, "image/jpeg")

    controls = AgentControls(
        snapshot=snapshot,
        health=lambda: Health(True),
        rollback=no_rollback,
        restart=lambda camera: [camera],
        camera_jpeg=lambda camera, quality: b"",
        events=list,
        media=media,
    )
    (tmp_path / "password").write_text("pass word\n")
    section = StatusPageSection(listen=f"127.0.0.1:{free_port()}", username="tech", password_file=tmp_path / "password")
    server = StatusServer(section, controls).start()
    clip = (store.folder / f"{EVENT}.mp4").read_bytes()
    yield Served(server.url.rstrip("/"), asked, jpeg, clip)
    server.stop()


def test_an_events_snapshot_and_clip_come_with_their_content_types(served: Served, tmp_path: Path) -> None:
    snap = http(f"{served.url}/api/events/{EVENT}/snapshot", headers=AUTH)
    assert snap.status == 200 and snap.headers["content-type"] == "image/jpeg"
    assert snap.body == served.jpeg and snap.headers["cache-control"] == "no-store"
    clip = http(f"{served.url}/api/events/{EVENT}/clip", headers=AUTH)
    assert clip.status == 200 and clip.headers["content-type"] == "video/mp4"
    assert clip.body == served.clip
    (tmp_path / "got.mp4").write_bytes(clip.body)
    capture = cv2.VideoCapture(str(tmp_path / "got.mp4"))
    assert int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) == 10, "the clip as written, readable"
    capture.release()
    assert served.asked == [(EVENT, "snapshot"), (EVENT, "clip")]


def test_media_needs_the_technicians_credentials(served: Served) -> None:
    for kind in ("snapshot", "clip"):
        answer = http(f"{served.url}/api/events/{EVENT}/{kind}")
        assert answer.status == 401 and "www-authenticate" in answer.headers
        assert http(f"{served.url}/api/events/{EVENT}/{kind}", headers=basic("tech", "wrong")).status == 401
    assert served.asked == [], "nothing read without the credentials"


@pytest.mark.parametrize(
    "path",
    [
        "/api/events/..%2F..%2Fetc%2Fpasswd/snapshot",
        "/api/events/%2e%2e/snapshot",
        "/api/events/00AB00CD00EF0012/snapshot",  # upper case: not an event id
        "/api/events/00ab00cd00ef0012.jpg/snapshot",
        f"/api/events/{EVENT}/..%2Fclip",
        f"/api/events/{EVENT}/thumbnail",
        "/api/events/0123456789abcdef/clip",  # an id that has nothing kept
    ],
)
def test_anything_but_a_kept_events_media_is_404_and_no_path_is_looked_up(served: Served, path: str) -> None:
    answer = http(served.url + path, headers=AUTH)
    assert answer.status == 404, (path, answer.status)
    if answer.headers.get("content-type") == "application/json":
        assert answer.json()["error"]["code"] == "NO_MEDIA"
    assert all(event == "0123456789abcdef" for event, _ in served.asked), served.asked
