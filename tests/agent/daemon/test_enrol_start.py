"""`agent.daemon.enrol_start`: ``edge-agent run`` on a device with only a claim, over a real
mosquitto with the dynamic security plugin: it waits under systemd's contract, keeps its request
across a restart, enrols once the operator approves and then serves on its own topics; a denial
is final; a claim file that does not read is refused and changes nothing. With a
``status_page:`` section the page (over real HTTP, and in chromium) says all along where the
enrolment stands, then goes on as the agent's own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from testkit.agent_process import AgentProcess
from testkit.broker import DYNSEC_OPERATOR, Broker, Watcher
from testkit.browser import Chromium
from testkit.net import free_port, wait_until
from testkit.page import http

from agent.bundles.signing import generate_keypair
from agent.cli.main import main
from agent.config.models import AgentConfig
from agent.daemon.enrol_start import NOT_ENROLLED, backoff, claim_to_use
from tests.agent.cli.test_fleet_enrol import broker, operator
from tests.agent.daemon.test_service import NotifySocket

__all__ = ["broker"]  # the dynamic security broker fixture, shared


def claim_file(tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(the operator's private key, a claim for the group yard made with it)."""
    monkeypatch.setenv("DYNSEC_PASSWORD", DYNSEC_OPERATOR[1])
    key, _ = generate_keypair(tmp_path / "operator")
    claim = tmp_path / "claim.json"
    words = operator(broker, "enrol", "claim", "site-a", "--expires", "1d", "--group", "yard")
    assert main([*words, "--key", str(key), "--out", str(claim)]) == 0
    return key, claim


def device_config(tmp_path: Path, claim: Path, page: int | None = None) -> Path:
    """agent.yaml as install.sh --claim writes it: no broker, the claim, a camera (`page`: the
    status page on that port of 127.0.0.1, as install.sh writes it too)."""
    config: dict[str, Any] = {
        **({"status_page": {"listen": f"127.0.0.1:{page}"}} if page is not None else {}),
        "device": {"id": "cam-9"},
        "state_dir": str(tmp_path / "device" / "state"),
        "enrolment": {"claim": str(claim), "boot_claims": []},
        "allow_unsigned": True,
        "cameras": [{"name": "cam0", "source": "synthetic", "max_fps": 5}],
        "telemetry": {"interval_s": 0.5},
    }
    written = tmp_path / "device" / "writable" / "agent.yaml"
    written.parent.mkdir(parents=True)
    written.write_text(yaml.safe_dump(config))
    path = tmp_path / "device" / "agent.yaml"
    path.symlink_to(written)  # as install.sh links /etc/edge-agent/agent.yaml into the state directory
    return path


def listed(broker: Broker, capsys: pytest.CaptureFixture[str], count: int, *extra: str) -> list[dict[str, Any]]:
    """The requests `fleet enrol list` shows (`extra`: its options), once there are `count`."""

    def rows() -> list[dict[str, Any]] | None:
        capsys.readouterr()
        main([*operator(broker, "enrol", "list", "--json", *extra), "--listen", "1"])
        found: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
        return found if len(found) >= count else None

    return wait_until(rows, 30, f"{count} request(s) to be listed")  # type: ignore[no-any-return]


def test_a_device_with_only_a_claim_waits_keeps_its_request_and_serves_once_approved(
    tmp_path: Path, broker: Broker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key, claim = claim_file(tmp_path, broker, monkeypatch)
    config = device_config(tmp_path, claim)
    state = tmp_path / "device" / "state" / "enrol"
    notify = NotifySocket(tmp_path / "notify")
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "2000000"}
    device = AgentProcess(config, env=env).start()
    try:
        notify.wait("STATUS=waiting for enrolment approval")
        ready, _ = notify.wait("READY=1")
        notify.wait("WATCHDOG=1", since=ready)  # fed while it waits: systemd would kill it otherwise
        first = listed(broker, capsys, 1)
        keys = (state / "device.key").read_bytes(), (state / "box.key").read_bytes()
        assert device.stop() == 0  # SIGTERM while waiting
        notify.wait("STOPPING=1", since=ready)

        device = AgentProcess(config, env=env).start()
        wait_until(lambda: device.output().count("asked to join as cam-9") == 2, 30, "the second start's request")
        again = listed(broker, capsys, 1)
        assert [row["request"] for row in again] == [row["request"] for row in first]  # the same, not a second
        assert ((state / "device.key").read_bytes(), (state / "box.key").read_bytes()) == keys

        watcher = Watcher(broker, ["edge/cam-9/status"], *DYNSEC_OPERATOR)
        approve = operator(broker, "enrol", "approve", str(first[0]["request"]))
        assert main([*approve, "--key", str(key)]) == 0
        status = watcher.wait_json("edge/cam-9/status", lambda doc: doc.get("state") == "online")
        assert status["group"] == "yard"
        assert config.is_symlink()  # written through the link: /etc/edge-agent is read-only to the service
        written = yaml.safe_load(config.read_text())
        assert written["mqtt"]["username"] == "cam-9" and written["device"] == {"id": "cam-9", "group": "yard"}
        assert not (state / "request.json").exists()
        watcher.close()
    finally:
        code = device.stop()
        notify.close()
    assert code == 0, device.output()
    assert "enrolment: approved" in device.output()


def test_a_denied_device_says_why_and_never_serves(
    tmp_path: Path, broker: Broker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key, claim = claim_file(tmp_path, broker, monkeypatch)
    config = device_config(tmp_path, claim)
    before = config.read_text()
    device = AgentProcess(config).start()
    rows = listed(broker, capsys, 1)
    deny = operator(broker, "enrol", "deny", str(rows[0]["request"]), "--reason", "not one of ours")
    assert main([*deny, "--key", str(key)]) == 0
    wait_until(lambda: not device.alive(), 30, "the denied device to exit")
    assert device.stop() == NOT_ENROLLED
    assert "enrolment refused: ENROL_DENIED" in device.output() and "not one of ours" in device.output()
    assert config.read_text() == before and "online" not in device.output()
    assert not (tmp_path / "device" / "state" / "enrol" / "request.json").exists()  # `enrol` by hand asks anew
    again = AgentProcess(config).start()  # a restart with the same claim does not ask again
    wait_until(lambda: not again.alive(), 30, "the restarted device to exit")
    assert again.stop() == NOT_ENROLLED and "recorded before" in again.output()
    assert len(listed(broker, capsys, 1, "--all")) == 1


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("broker: [unclosed", "neither YAML nor JSON"),
        ('{"broker": "mqtt://b", "claim": "c", "username": "u", "password": "p", "expires_at": 1}', "operator_keys"),
    ],
)
def test_a_claim_file_that_does_not_read_is_named_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, reason: str
) -> None:
    claim = tmp_path / "claim.json"
    claim.write_text(text)
    config = device_config(tmp_path, claim)
    before = config.read_text()
    assert main(["run", "--config", str(config)]) == 1
    error = capsys.readouterr().err
    assert f"cannot enrol: the claim {claim}" in error and reason in error
    assert config.read_text() == before and not (tmp_path / "device" / "state").exists()


def test_the_claim_is_agent_yaml_s_else_the_first_on_the_boot_partition_and_none_once_enrolled(
    tmp_path: Path,
) -> None:
    firmware, boot = tmp_path / "firmware.json", tmp_path / "boot.json"
    config = AgentConfig.model_validate({"enrolment": {"boot_claims": [str(firmware), str(boot)]}})
    assert claim_to_use(config) is None
    boot.write_text("{}")
    assert claim_to_use(config) == boot
    firmware.write_text("{}")
    assert claim_to_use(config) == firmware
    named = config.model_copy(update={"enrolment": config.enrolment.model_copy(update={"claim": tmp_path / "c"})})
    assert claim_to_use(named) == tmp_path / "c"
    enrolled = AgentConfig.model_validate({"mqtt": {"broker": "mqtt://b"}, "enrolment": {"claim": "c"}})
    assert claim_to_use(enrolled) is None


def test_retries_back_off_doubling_to_a_bound() -> None:
    assert [backoff(n) for n in (1, 2, 3, 7, 8, 100)] == [5.0, 10.0, 20.0, 300.0, 300.0, 300.0]


def test_an_attempt_the_broker_refuses_is_tried_again_after_a_backoff(
    tmp_path: Path, broker: Broker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.config.models import MqttSection
    from agent.fleet.client import connect
    from agent.fleet.enrolments import Dynsec

    _, claim = claim_file(tmp_path, broker, monkeypatch)
    admin = connect(
        MqttSection.model_validate({"broker": broker.url, "username": "admin", "password": {"value": "admin-password"}})
    )
    dynsec, role = Dynsec(admin), {"username": "claim-site-a", "rolename": "edge-claim-site-a"}
    port = free_port()
    device = AgentProcess(device_config(tmp_path, claim, page=port))
    try:
        dynsec.must("removeClientRole", **role)  # the claim may not publish its request for now
        device.start()
        wait_until(lambda: "trying again in 5 s" in device.output(), 60, "the refused attempt's retry")
        assert "asked to join" not in device.output()
        status = wait_until(
            lambda: (s := (page_status(port) or {}).get("enrolment")) and s["next_retry"] and s, 30, "the next try"
        )
        assert status["request_id"] is None and status["next_retry"] > status["since"] and status["reason"], status
        (problem,) = page_problems(port)
        assert "next try in" in problem["message"] and status["reason"] in problem["message"], problem
        dynsec.must("addClientRole", **role)
        assert len(listed(broker, capsys, 1)) == 1  # the next attempt, 5 s on, is taken
        assert "asked to join as cam-9" in device.output()
    finally:
        assert device.stop() == 0, device.output()
        admin.stop()


def page_status(port: int) -> dict[str, Any] | None:
    """``/api/status`` of the page on `port`, None while nothing answers there."""
    try:
        answer = http(f"http://127.0.0.1:{port}/api/status")
    except OSError:
        return None
    assert answer.status == 200, answer.body
    return answer.json()  # type: ignore[no-any-return]


def page_problems(port: int) -> list[dict[str, Any]]:
    answer = http(f"http://127.0.0.1:{port}/api/problems")
    assert answer.status == 200, answer.body
    return answer.json()["problems"]  # type: ignore[no-any-return]


def test_while_it_waits_the_page_shows_the_request_to_approve_then_goes_on_as_the_agent_s(
    tmp_path: Path,
    broker: Broker,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    chromium: Chromium,
) -> None:
    key, claim = claim_file(tmp_path, broker, monkeypatch)
    port = free_port()
    device = AgentProcess(device_config(tmp_path, claim, page=port)).start()
    try:
        (row,) = listed(broker, capsys, 1)
        request = (tmp_path / "device" / "state" / "enrol" / "request.json").read_text()
        status = wait_until(
            lambda: (s := (page_status(port) or {}).get("enrolment")) and s["request_id"] and s, 30, "the request"
        )
        assert status["state"] == "waiting" and status["request_id"] == row["request"], status
        assert (status["claim"], status["device_id"], status["next_retry"]) == ("site-a", "cam-9", None)
        assert status["since"] == json.loads(request)["issued_at"], "since the request, kept across restarts"
        (problem,) = page_problems(port)  # the one thing to know, and what the operator does
        assert problem["check"] == "enrolment" and problem["status"] == "warn", problem
        assert row["request"] in problem["message"] and "fleet enrol approve" in problem["fix"]
        assert http(f"http://127.0.0.1:{port}/api/rollback", "POST", body=b"{}").status == 403  # read only
        assert b"edge_agent_build_info" in http(f"http://127.0.0.1:{port}/metrics").body
        page = chromium.page()
        page.open(f"http://127.0.0.1:{port}/")
        assert page.wait_for("document.getElementById('state').textContent === 'waiting for approval'")
        assert page.wait_for("document.getElementById('device').textContent") == "cam-9"
        assert row["request"] in page.wait_for("document.getElementById('problems').textContent")

        approve = operator(broker, "enrol", "approve", str(row["request"]))
        assert main([*approve, "--key", str(key)]) == 0
        agent = wait_until(  # its broker connected with the credentials enrolment wrote
            lambda: (s := page_status(port)) and s["enrolment"] is None and s["broker"]["connected"] and s,
            60,
            "the agent's page",
        )
        assert (agent["state"], agent["group"]) == ("online", "yard"), agent
        assert all(p["check"] != "enrolment" for p in page_problems(port))
        page.open(f"http://127.0.0.1:{port}/")
        assert page.wait_for("document.getElementById('state').textContent === 'online'")
    finally:
        code = device.stop()
    assert code == 0, device.output()


def test_a_denied_device_with_a_page_says_so_there_until_it_is_stopped(
    tmp_path: Path, broker: Broker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key, claim = claim_file(tmp_path, broker, monkeypatch)
    port = free_port()
    config = device_config(tmp_path, claim, page=port)
    device = AgentProcess(config).start()
    try:
        (row,) = listed(broker, capsys, 1)
        deny = operator(broker, "enrol", "deny", str(row["request"]), "--reason", "not one of ours")
        assert main([*deny, "--key", str(key)]) == 0
        status = wait_until(
            lambda: (s := (page_status(port) or {}).get("enrolment")) and s["state"] == "denied" and s, 30, "denied"
        )
        assert "not one of ours" in status["reason"] and status["request_id"] == row["request"]
        (problem,) = page_problems(port)
        assert (problem["check"], problem["status"]) == ("enrolment", "fail") and "denied" in problem["message"]
        assert device.alive(), "it waits for SIGTERM, the page up"
    finally:
        code = device.stop()
    assert code == NOT_ENROLLED, device.output()
    assert page_status(port) is None, "the page stops with it"
