"""`edge-agent doctor`'s checks (`agent.daemon.checkup`): a working device passes, each broken part fails
with its fix, pipe sources are checked."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from testkit import FAKES
from testkit.broker import Broker
from testkit.bundles import install_versions
from testkit.fleet import cli
from testkit.needs import missing
from testkit.net import free_port, wait_until
from testkit.page import running
from testkit.tls import secured_listener

from agent.cli import main
from agent.config.models import AgentConfig
from agent.config.recipes import recipe
from agent.hardware.board import probe


def test_the_doctor_checks_pipe_sources(gst: str, tmp_path: Path, capsys) -> None:
    """``edge-agent doctor`` shares `source_problems`: the Jetson CSI recipe fails unopened with
    what to install; a gst: camera this machine can run delivers a real frame through gst-launch."""
    csi = recipe("jetson-csi")
    assert csi is not None
    config = tmp_path / "agent.yaml"
    test = "gst:videotestsrc ! video/x-raw,width=320,height=240"
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\nallow_unsigned: true\npipelines:\n"
        f"  - {{name: test, source: '{test}'}}\n"
        f"  - {{name: csi, source: '{csi.source}'}}\n"
    )
    status = main(["doctor", "--config", str(config), "--root", str(FAKES / "rpi5"), "--timeout", "30", "--json"])
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert status == 1
    assert checks["camera test"]["status"] == "pass", checks["camera test"]
    assert checks["camera test"]["message"] == f"a 320x240 frame from {test}"
    csi_check = checks["camera csi"]
    assert csi_check["status"] == "fail"
    assert "GStreamer element nvarguscamerasrc is not installed" in csi_check["message"]
    assert "docs/cameras.md" in csi_check["fix"]


TREE = FAKES / "laptop-battery"


@pytest.fixture
def device(tmp_path: Path, bundles: dict[str, Path], keys: dict[str, Path]) -> dict[str, Any]:
    """A TLS broker with a password file, and an agent.yaml (as a dict) that reaches it."""
    if shutil.which("mosquitto_passwd") is None:
        missing("mosquitto_passwd", "mosquitto_passwd is not installed (apt-get install mosquitto)")
    certs, listener = secured_listener(tmp_path, client_certificate=False)
    broker = Broker(tmp_path / "broker", listener=listener).start()
    (tmp_path / "mqtt-password").write_text("s3cret\n")
    install_versions(tmp_path / "state", keys, bundles, probe(TREE))
    config = {
        "device": {"id": "cam-1"},
        "state_dir": str(tmp_path / "state"),
        "trust_keys": [str(keys["public"])],
        "operator_keys": [str(keys["operator_pub"])],
        "mqtt": {
            "broker": f"mqtts://127.0.0.1:{broker.port}",
            "username": "cam-1",
            "password": {"file": str(tmp_path / "mqtt-password")},
            "tls": {"ca_file": str(certs["ca.pem"])},
        },
        "cameras": [{"name": "cam0", "source": "synthetic"}],
        "status_page": {"listen": f"127.0.0.1:{free_port()}"},
    }
    yield config
    broker.stop()


def doctor(capsys: pytest.CaptureFixture[str], tmp_path: Path, config: dict[str, Any], *extra: str) -> tuple[int, str]:
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    return cli(capsys, "doctor", "--config", str(path), "--root", str(TREE), "--timeout", "5", *extra)


def test_doctor_passes_on_a_working_device(
    tmp_path: Path, device: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with running(device, probe(TREE), TREE):
        status, out = doctor(capsys, tmp_path, device, "--json")
    assert status == 0, out
    report = json.loads(out)
    checks = {c["check"]: c for c in report["checks"]}
    assert report["ok"] is True
    assert list(checks) == ["config", "state", "keys", "broker", "outbox", "camera cam0", "runtime", "sensors",
                            "power", "battery", "clock", "agent"]  # fmt: skip
    assert {c["status"] for name, c in checks.items() if name != "clock"} == {"pass"}, out
    assert checks["broker"]["message"].endswith("with TLS")
    assert "message(s) waiting" in checks["outbox"]["message"], "the running agent's outbox, read beside it"
    assert checks["camera cam0"]["message"] == "a 640x480 frame from synthetic"
    assert checks["runtime"]["message"].startswith("demo 1.1.0 loads on litert")
    assert "52.0 °C, 12.1 W" in checks["sensors"]["message"] and "57 %" in checks["battery"]["message"]
    assert "answers healthy" in checks["agent"]["message"]


def test_doctor_fails_with_the_fix_for_each_broken_part(
    tmp_path: Path, device: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mqtt-password").write_text("wrong\n")
    device["cameras"].append({"name": "door", "source": f"http://127.0.0.1:{free_port()}/camera.mjpg"})
    current = Path(device["state_dir"]) / "current"
    for artifact in current.resolve().glob("*.tflite"):
        artifact.write_bytes(b"not a model")
    status, out = doctor(capsys, tmp_path, device)
    assert status == 1
    lines = out.splitlines()

    def line(check: str) -> str:
        return next(i for i in lines if i[6:].startswith(check + " "))

    assert line("broker").startswith("FAIL") and "refused the connection" in line("broker")
    assert line("camera door").startswith("FAIL") and line("camera cam0").startswith("PASS")
    assert line("runtime").startswith("FAIL") and "demo 1.1.0 does not load" in line("runtime")
    assert line("agent").startswith("WARN") and "no agent answers" in line("agent")
    fixes = [lines[i + 1] for i, text in enumerate(lines) if text.startswith("FAIL")]
    assert all("fix: " in fix for fix in fixes), out
    assert "edge-agent rollback" in out and "mqtt.broker, the credentials and mqtt.tls" in out
    assert lines[-1].startswith("3 failed")


def test_doctor_stops_at_a_config_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("cameras:\n  - {name: cam0, source: synthetic, fps: -1}\n")
    status, out = cli(capsys, "doctor", "--config", str(path))
    assert status == 1
    assert out.startswith("FAIL  config  ") and f"{path}:2" in out and "edge-agent config check" in out


def test_the_doctor_reads_the_outbox_backlog_without_writing(tmp_path: Path) -> None:
    """Beside a running agent (its outbox open), the doctor reads the backlog read only; a stuck
    backlog warns with its age, a file SQLite cannot read fails."""
    from agent.config.models import AgentConfig
    from agent.daemon.checkup import check_outbox
    from agent.mqtt.outbox import FILE_NAME, Outbox

    config = AgentConfig.model_validate(
        {"state_dir": str(tmp_path), "mqtt": {"broker": "mqtt://127.0.0.1:1"}, "outbox": {"backlog_problem_s": 60}}
    )
    assert check_outbox(config).status == "pass" and "no outbox yet" in check_outbox(config).message
    written = [1_000.0]
    outbox = Outbox(tmp_path / FILE_NAME, config.outbox, lambda: written[0])
    for i in range(3):
        outbox.append("event", "edge/d/events", b'{"i":%d}' % i)
    found = check_outbox(config)
    assert found.status == "warn", found  # written at Unix time 1000: far older than 60 s
    assert "3 message(s) wait for the broker" in found.message
    outbox.acked(outbox.pending(0, 10))
    fine = check_outbox(config)
    assert fine.status == "pass" and fine.message.startswith("0 message(s) waiting"), fine
    assert outbox.append("event", "edge/d/events", b"{}") is not None, "the agent's outbox still writes"
    outbox.close()
    (tmp_path / FILE_NAME).write_bytes(b"junk" * 1024)
    for suffix in ("-wal", "-shm"):
        (tmp_path / (FILE_NAME + suffix)).unlink(missing_ok=True)
    broken = check_outbox(config)
    assert broken.status == "fail" and "moves it aside" in broken.fix


def test_the_doctor_says_how_much_the_event_snapshots_take(tmp_path: Path) -> None:
    from agent.config.models import AgentConfig
    from agent.daemon.checkup import check_media

    config = AgentConfig.model_validate({"state_dir": str(tmp_path), "events": {"snapshots": True}})
    assert check_media(config).message.startswith("0 event snapshot(s) and clip(s) kept, 0.0 of 256 MiB")
    folder = tmp_path / "media"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i:016x}.jpg").write_bytes(b"x" * 512 * 1024)
    (folder / f"{9:016x}.mp4").write_bytes(b"v" * 512 * 1024)  # a clip counts too
    (folder / f".{8:016x}.part.mp4").write_bytes(b"v" * 512 * 1024)  # one being written does not
    found = check_media(config)
    assert found.status == "pass", found
    assert found.message.startswith("4 event snapshot(s) and clip(s) kept, 2.0 of 256"), found


def test_the_doctor_warns_while_the_disk_is_under_the_media_floor(tmp_path: Path) -> None:
    """Issue 37, item 8: under ``events.media.min_free_mb`` the agent keeps no new snapshot or
    clip; doctor says so from a shell, with the page's fix (the free space read is injected)."""
    from agent.daemon.checkup import check_media
    from agent.mqtt.outbox import MIB

    config = AgentConfig.model_validate({"state_dir": str(tmp_path), "events": {"snapshots": True}})
    found = check_media(config, free_bytes=lambda folder: 100 * MIB)
    assert (found.status, found.check) == ("warn", "media"), found
    assert "100 MiB free" in found.message and "events.media.min_free_mb (256)" in found.message
    assert "events.media.min_free_mb" in found.fix
    assert check_media(config, free_bytes=lambda folder: 256 * MIB).status == "pass", "at the floor: room"
    config = AgentConfig.model_validate(
        {"state_dir": str(tmp_path), "events": {"snapshots": True, "media": {"min_free_mb": 0}}}
    )
    assert check_media(config, free_bytes=lambda folder: 0).status == "pass", "no floor"


def test_doctor_probes_the_acl_for_home_assistant_and_names_what_it_refuses(tmp_path: Path) -> None:
    """Issue 37, item 6, from a shell: with Home Assistant enabled, doctor publishes a probe on a
    discovery config and a frame nobody reads; an ACL `fleet acl` wrote without
    ``--home-assistant`` refuses both, and doctor says so in the page's words."""
    from testkit.broker import secured_broker

    from agent.daemon.checkup import check_broker
    from agent.fleet.acl import mosquitto_acl
    from agent.mqtt.protocol import Topics

    broker = secured_broker(tmp_path / "broker", {"cam-1": "pw"}, mosquitto_acl([("cam-1", None)], [], Topics()))
    secret = tmp_path / "password"
    secret.write_text("pw\n")
    settings = {"broker": broker.url, "username": "cam-1", "password": {"file": str(secret)}}

    def doctor(enabled: bool) -> list[tuple[str, str, str]]:
        config = AgentConfig.model_validate(
            {
                "device": {"id": "cam-1"},
                "state_dir": str(tmp_path / "state"),
                "mqtt": settings,
                "integrations": {"home_assistant": {"enabled": enabled}},
            }
        )
        return [(f.check, f.status, f.message + f.fix) for f in check_broker(config, 10)]

    try:
        found = doctor(True)
        assert [(check, status) for check, status, _ in found] == [("broker", "pass"), ("broker acl", "fail")]
        assert "refused 1 publish(es) on" in found[1][2] and "and 1 on 1 other topic(s)" in found[1][2]
        assert "--home-assistant" in found[1][2]
        assert [check for check, _, _ in doctor(False)] == ["broker"], "nothing to probe without Home Assistant"
        acl = mosquitto_acl([("cam-1", None)], [], Topics(), "homeassistant")
        (tmp_path / "broker" / "edge-agent.acl").write_text(acl)
        assert broker.process is not None
        broker.process.send_signal(signal.SIGHUP)  # mosquitto reads its ACL file again
        wait_until(lambda: doctor(True)[1][1] == "pass", 20, "the probes taken once the ACL has the rules")
    finally:
        broker.stop()


def test_the_doctor_says_where_a_device_without_a_broker_stands_with_its_claim(tmp_path: Path) -> None:
    from agent.daemon.checkup import check_enrolment
    from agent.daemon.enrol_start import Refusal

    claim, state = tmp_path / "claim.json", tmp_path / "state"
    config = AgentConfig.model_validate({"state_dir": str(state), "enrolment": {"claim": str(claim)}})
    begun = check_enrolment(config)
    assert begun is not None and begun.status == "warn" and f"edge-agent run enrols with {claim}" in begun.message
    (state / "enrol").mkdir(parents=True)
    (state / "enrol" / "request.json").write_text("{}")
    waiting = check_enrolment(config)
    assert waiting is not None and "waiting for the operator" in waiting.message
    Refusal("site-a", "ENROL_DENIED", "not one of ours").write(state)
    refused = check_enrolment(config)
    assert refused is not None and refused.status == "fail"
    assert "ENROL_DENIED: not one of ours" in refused.message and "new claim" in refused.fix
    enrolled = config.model_copy(update={"mqtt": AgentConfig.model_validate({"mqtt": {"broker": "mqtt://b"}}).mqtt})
    assert check_enrolment(enrolled) is None
