"""`agent.web.app`'s ``/api/samples`` over real HTTP, from a real `SampleStore`: each camera that
keeps samples with their count, bytes and the newest one's time; ``{}`` from a device where no
camera keeps samples; and the page's table of them in headless chromium."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from testkit.net import free_port
from testkit.page import basic, http
from testkit.snapshots import snapshot

from agent.config.models import CameraSection, SamplesSection, StatusPageSection
from agent.serving.samples import Pending, SampleStore
from agent.snapshot import DeploymentStatus, Health
from agent.web.controls import AgentControls, SamplesKept
from agent.web.server import StatusServer
from pipelines.decoding.detections import Detections

AUTH = basic("tech", "pass word")
NOW = 1_765_000_000.0


def no_rollback() -> DeploymentStatus:
    raise AssertionError("not asked")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[[Callable[[], dict[str, SamplesKept]] | None], str]]:
    servers: list[StatusServer] = []
    (tmp_path / "password").write_text("pass word\n")

    def start(samples: Callable[[], dict[str, SamplesKept]] | None) -> str:
        controls = AgentControls(
            snapshot=snapshot,
            health=lambda: Health(True),
            rollback=no_rollback,
            restart=lambda camera: [camera],
            camera_jpeg=lambda camera, quality: b"",
            events=list,
            samples=samples,
        )
        listen = f"127.0.0.1:{free_port()}"
        section = StatusPageSection(listen=listen, username="tech", password_file=tmp_path / "password")
        servers.append(StatusServer(section, controls).start())
        return servers[-1].url.rstrip("/")

    yield start
    for server in servers:
        server.stop()


def kept_store(tmp_path: Path) -> SampleStore:
    on = SamplesSection(enabled=True)
    cameras = [CameraSection(name=n, source="synthetic", samples=on) for n in ("door", "yard")]
    store = SampleStore(tmp_path / "samples", cameras, lambda: ["person"], lambda: "1.0.0", clock=lambda: NOW)
    image = np.full((48, 64, 3), 100, np.uint8)
    for i in range(3):
        store.write(Pending("door", image.copy(), Detections.empty(), "random", int((NOW - 10 + i) * 1000)))
    return store


def test_the_samples_kept_per_camera_are_listed(
    serve: Callable[[Callable[[], dict[str, SamplesKept]] | None], str], tmp_path: Path
) -> None:
    store = kept_store(tmp_path)
    url = serve(lambda: {name: SamplesKept(*kept) for name, kept in store.summary().items()})
    answer = http(f"{url}/api/samples", headers=AUTH)
    assert answer.status == 200 and answer.headers["cache-control"] == "no-store"
    listed: dict[str, Any] = json.loads(answer.body)
    assert listed["door"]["count"] == 3 and listed["door"]["newest"] == NOW - 8
    assert listed["door"]["bytes"] == sum(p.stat().st_size for p in (tmp_path / "samples" / "cam-door").iterdir())
    assert listed["yard"] == {"count": 0, "bytes": 0, "newest": None}
    assert http(f"{url}/api/samples").status == 401


def test_a_device_that_keeps_no_samples_lists_none(
    serve: Callable[[Callable[[], dict[str, SamplesKept]] | None], str],
) -> None:
    answer = http(f"{serve(None)}/api/samples", headers=AUTH)
    assert answer.status == 200 and json.loads(answer.body) == {}


def test_the_page_shows_each_cameras_samples_in_chromium(
    serve: Callable[[Callable[[], dict[str, SamplesKept]] | None], str], tmp_path: Path, chromium: Any
) -> None:
    store = kept_store(tmp_path)
    url = serve(lambda: {name: SamplesKept(*kept) for name, kept in store.summary().items()})
    page = chromium.page()
    page.headers(AUTH)
    page.open(url + "/")
    rows = page.wait_for(
        "(r => r.length === 2 && r)([...document.querySelectorAll('#samples tbody tr')]"
        ".map(tr => [tr.dataset.camera, tr.querySelector('.count').textContent,"
        " tr.querySelector('.newest').textContent]))"
    )
    assert rows[0][:2] == ["door", "3"] and rows[0][2].endswith("ago")
    assert rows[1] == ["yard", "0", "none yet"]
    assert page.evaluate("document.getElementById('samples-section').hidden") is False
