"""End to end: a camera's password, planted in its source URLs, appears in none of the agent's
outputs: the status, telemetry and events documents over a real mosquitto, `/api/status`,
`/api/problems`, `/api/logs` and `/metrics` over real HTTP, the daemon's own log, and the
doctor's report. The redacted form (``viewer:***@``) shows where the sources are named."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from testkit.agent_process import AgentProcess
from testkit.broker import Broker, Watcher
from testkit.bundles import install_versions
from testkit.camera_stream import MjpegStream
from testkit.fleet import cli
from testkit.needs import missing
from testkit.net import free_port, wait_until
from testkit.page import basic, http

PLANTED = "Pl4nted-s3cret"
AUTH = basic("tech", "page-password")


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_camera_password_appears_in_no_output(
    tmp_path: Path,
    broker: Broker,
    watcher: Watcher,
    agents: Callable[..., AgentProcess],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    keys: dict[str, Path],
    bundles: dict[str, Path],
) -> None:
    import shutil

    if shutil.which("ffmpeg") is None:
        missing("ffmpeg", "ffmpeg is not installed (apt-get install ffmpeg)")
    camera = MjpegStream(fps=10)
    closed = free_port()
    live = camera.url.replace("http://", f"http://viewer:{PLANTED}@")
    cameras = [
        {"name": "door", "source": live, "max_fps": 10},  # frames flow: its name is in every report
        {"name": "gate", "source": f"rtsp://viewer:{PLANTED}@127.0.0.1:{closed}/stream1"},  # OpenCV cannot open it
        {"name": "yard", "source": f"ffmpeg:http://viewer:{PLANTED}@127.0.0.1:{closed}/cam.mjpg"},  # ffmpeg's stderr
    ]
    port = free_port()
    monkeypatch.setenv("TEST_PAGE_PASSWORD", "page-password")
    page = {"listen": f"127.0.0.1:{port}", "username": "tech", "password_env": "TEST_PAGE_PASSWORD", "sample_s": 0.5}
    install_versions(tmp_path / "creds-1" / "state", keys, bundles)  # where `agents` puts its state
    agent = agents("creds-1", cameras=cameras, status_page=page, env={"TEST_PAGE_PASSWORD": "page-password"})
    url = f"http://127.0.0.1:{port}"
    try:

        def reported(document: dict[str, object]) -> bool:
            cams = {c["name"]: c for c in document.get("cameras") or []}  # type: ignore[attr-defined]
            if set(cams) != {"door", "gate", "yard"}:
                return False
            yard = cams["yard"].get("source_status") or {}
            return (
                bool(cams["door"]["frames"])
                and bool(cams["gate"].get("source_status", {}).get("error"))
                and bool(yard.get("output"))
            )

        telemetry = watcher.wait_json("edge/creds-1/telemetry", reported, 90)
        yard = next(c for c in telemetry["cameras"] if c["name"] == "yard")["source_status"]
        assert any("http://viewer:" in line for line in yard["output"]), yard  # ffmpeg names its input
        wait_until(lambda: listening(port), 30, "the page")  # it may start after the first telemetry
        # the page keeps the lines logged since it started: wait for a source failure among them
        logs = wait_until(lambda: (a := http(url + "/api/logs", headers=AUTH)).body.count(b"viewer:") and a, 60, "logs")
        answers = {path: http(url + path, headers=AUTH) for path in ("/api/status", "/api/problems", "/metrics")}
        answers["/api/logs"] = logs
        assert all(a.status == 200 for a in answers.values()), {p: a.status for p, a in answers.items()}
        watcher.sync("edge/creds-1/sync")
        published = {m.topic: bytes(m.payload) for m in watcher.messages}
        assert {"edge/creds-1/status", "edge/creds-1/telemetry"} <= set(published)
    finally:
        agent.stop()
        camera.close()

    config = yaml.safe_load(agent.config.read_text())
    config["mqtt"] = {"broker": f"mqtt://127.0.0.1:{free_port()}"}  # the doctor's own broker check fails fast
    config_path = tmp_path / "doctor.yaml"
    config_path.write_text(yaml.safe_dump(config))
    _, doctor = cli(capsys, "doctor", "--config", str(config_path), "--timeout", "5")
    assert "camera gate" in doctor and "viewer:" in doctor, doctor

    outputs = {
        **{f"mqtt {topic}": payload.decode(errors="replace") for topic, payload in published.items()},
        **{f"http {path}": answer.body.decode(errors="replace") for path, answer in answers.items()},
        "the daemon's log": agent.output(),
        "doctor": doctor,
    }
    leaking = [name for name, text in outputs.items() if PLANTED in text]
    assert leaking == [], f"the camera's password is in: {', '.join(leaking)}"
    # the sources are still named, without the password
    assert all("viewer:***@" in outputs[name] for name in ("the daemon's log", "http /api/logs", "doctor")), outputs
    status_page = answers["/api/status"].json()
    door = next(c for c in status_page["cameras"] if c["name"] == "door")
    assert door["source"] == camera.url.replace("http://", "http://viewer:***@"), door["source"]
    gate = next(c for c in status_page["cameras"] if c["name"] == "gate")
    assert "rtsp://viewer:***@127.0.0.1" in gate["source_status"]["error"], gate
    assert any("viewer:***@" in line for line in yard["output"]), yard
