"""`agent.daemon.checkup`'s checks called one by one (test_checkup.py runs them through `edge-agent
doctor`): the daemon's check before a SIGHUP applies a config, keys, the state directory, a camera's
frame, a board without temperatures, and the running agent's /healthz over real HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import FAKES
from testkit.media import write_video
from testkit.net import free_port
from testkit.snapshots import camera, snapshot

from agent.bundles.signing import generate_keypair
from agent.config.models import AgentConfig, CameraSection, StatusPageSection
from agent.daemon.checkup import (
    check_camera,
    check_camera_health,
    check_keys,
    check_running_agent,
    check_sensors,
    check_startable,
    check_state_dir,
    reloadable,
)
from agent.errors import BundleError, ConfigError
from agent.snapshot import DeploymentStatus, Health
from agent.web.controls import AgentControls
from agent.web.server import StatusServer


def _config(tmp_path: Path, **fields: object) -> AgentConfig:
    return AgentConfig.model_validate({"state_dir": str(tmp_path / "state"), **fields})


def test_a_config_is_startable_only_with_readable_keys_and_a_state_directory(tmp_path: Path) -> None:
    _, public = generate_keypair(tmp_path / "keys")
    check_startable(_config(tmp_path, trust_keys=[str(public)], operator_keys=[str(public)]))
    assert (tmp_path / "state" / ".writable").is_file(), "the state directory was made and written"

    (tmp_path / "junk.pub").write_text("not a key\n")
    with pytest.raises(BundleError, match="KEY_INVALID"):
        check_startable(_config(tmp_path, operator_keys=[str(tmp_path / "junk.pub")]))
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OSError, match="a-file"):
        check_startable(AgentConfig.model_validate({"state_dir": str(tmp_path / "a-file" / "state")}))


def test_the_keys_check_names_the_setting_of_the_key_that_fails(tmp_path: Path) -> None:
    _, public = generate_keypair(tmp_path / "keys")
    (tmp_path / "junk.pub").write_text("not a key\n")
    assert check_keys(_config(tmp_path)).status == "warn"
    good = check_keys(_config(tmp_path, trust_keys=[str(public)], operator_keys=[str(public), str(public)]))
    assert (good.status, good.message) == ("pass", "1 trusted and 2 operator key(s) readable")
    bad = check_keys(_config(tmp_path, trust_keys=[str(public)], operator_keys=[str(tmp_path / "junk.pub")]))
    assert bad.status == "fail" and bad.message.startswith("operator_keys: ") and "junk.pub" in bad.message


def test_the_state_directory_check(tmp_path: Path) -> None:
    config = _config(tmp_path)
    absent = check_state_dir(config)
    assert (absent.status, absent.fix) == ("warn", "the service creates it")
    (tmp_path / "state").mkdir()
    there = check_state_dir(config)
    assert there.status == "pass" and there.message.startswith(f"{tmp_path / 'state'} is writable; ")
    assert list((tmp_path / "state").iterdir()) == [], "the doctor's probe file is gone"


def test_a_camera_is_judged_by_one_frame(tmp_path: Path) -> None:
    empty = write_video(tmp_path / "clip.avi", 0, size=(160, 120))
    found = check_camera(CameraSection(name="door", source=str(empty)), 10.0)
    assert (found.check, found.status) == ("camera door", "fail") and found.message.endswith("no frame after rewinding")
    assert "cameras[].source" in found.fix
    frames = write_video(tmp_path / "two.avi", 2, size=(160, 120))
    assert (
        check_camera(CameraSection(name="door", source=str(frames)), 10.0).message == f"a 160x120 frame from {frames}"
    )


def test_a_board_without_temperatures_warns_that_the_governor_is_blind(tmp_path: Path) -> None:
    sensors, power, battery = check_sensors(_config(tmp_path), FAKES / "x86-generic")
    assert sensors.status == "warn" and "the governor cannot protect the board" in sensors.message
    assert (power.check, battery.check) == ("power", "battery")
    jetson = check_sensors(_config(tmp_path), FAKES / "jetson-orin-nano")[0]
    assert jetson.status == "pass" and " W (" in jetson.message, "the input power beside the temperature"


def _never() -> DeploymentStatus:
    raise AssertionError("not called")


def test_the_running_agent_s_verdict_from_its_healthz() -> None:
    health = [Health(True)]
    controls = AgentControls(
        snapshot=snapshot,
        health=lambda: health[0],
        rollback=_never,
        restart=list,
        camera_jpeg=lambda *a: b"",
        events=list,
    )  # type: ignore[arg-type]
    port = free_port()
    server = StatusServer(StatusPageSection(listen=f"127.0.0.1:{port}"), controls).start()
    try:
        as_localhost = StatusPageSection(listen=f"localhost:{port}")
        found = check_running_agent(as_localhost)
        assert (found.status, found.message) == (
            "pass",
            f"the running agent answers healthy on http://127.0.0.1:{port}/healthz",
        )
        health[0] = Health(False, ("the camera loop of cam0 stalled",))
        hung = check_running_agent(as_localhost)
        assert hung.status == "fail" and "hung" in hung.message and "cam0 stalled" in hung.message
    finally:
        server.stop()
    gone = check_running_agent(StatusPageSection(listen=f"127.0.0.1:{port}"), timeout_s=2)
    assert gone.status == "warn" and "no agent answers" in gone.message and "journalctl" in gone.fix


def test_a_sighup_applies_only_a_config_that_loads_starts_and_has_its_files(tmp_path: Path) -> None:
    video = write_video(tmp_path / "clip.avi", 3, size=(160, 120))
    path = tmp_path / "agent.yaml"

    def text(source: Path) -> str:
        head = f"state_dir: {tmp_path / 'state'}\nallow_unsigned: true\n"
        return head + f"cameras:\n  - {{name: door, source: '{source}'}}\n"

    path.write_text(text(video))
    assert reloadable(path).cameras[0].source == str(video)
    path.write_text(text(tmp_path / "gone.avi"))
    with pytest.raises(ConfigError, match=rf"gone\.avi.*edge-agent config check {path}"):
        reloadable(path)
    path.write_text("cameras: {not: a list}\n")
    with pytest.raises(ConfigError):
        reloadable(path)
    path.write_text(text(video) + f"trust_keys: [{tmp_path / 'missing.pub'}]\n")
    with pytest.raises((ConfigError, BundleError), match=r"missing\.pub"):
        reloadable(path)


def test_doctor_lists_the_running_agent_s_camera_health_problems_with_the_page_s_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over real HTTP, logged in as the page's user: the page's camera health findings, in its
    words, and nothing else of its list; nothing when no agent answers."""
    from pipelines.health_watch import HealthState, ProblemSeen

    health = HealthState((ProblemSeen("covered", 900.0, "spread 1.2"),), 80.0, 1.2, 0.1, 0.0, 0.0, 1000.0)
    cameras = (camera("gate", health=health), camera("yard"))
    controls = AgentControls(
        snapshot=lambda: snapshot(cameras=cameras, serving_error="parity 0.5"),
        health=lambda: Health(True),
        rollback=_never,
        restart=list,
        camera_jpeg=lambda *a: b"",
        events=list,
    )  # type: ignore[arg-type]
    monkeypatch.setenv("PAGE_PASSWORD", "s3cret-pass")
    port = free_port()
    page = StatusPageSection(listen=f"127.0.0.1:{port}", username="tech", password_env="PAGE_PASSWORD")
    server = StatusServer(page, controls).start()
    try:
        found = check_camera_health(page)
        wrong = check_camera_health(page.model_copy(update={"username": "intruder"}))
    finally:
        server.stop()
    assert [(f.check, f.status) for f in found] == [("camera gate health", "fail")]
    assert "camera gate covered since" in found[0].message and "remove what covers it" in found[0].fix
    assert wrong == [], "refused (401): no list"
    assert check_camera_health(page, timeout_s=2) == [], "no agent answers"
