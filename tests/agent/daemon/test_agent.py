"""`agent.daemon.agent.Agent`: its snapshot without a broker; its commands over a real mosquitto."""

from __future__ import annotations

import json
import logging
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from testkit.broker import Broker, Watcher
from testkit.bundles import install_versions
from testkit.fleet import request, signed_request
from testkit.net import wait_until

from agent.config.loading import check_config
from agent.event_values import ObjectEvent
from agent.hardware.board import probe


def test_the_agent_snapshot_without_a_broker(tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]) -> None:
    """The daemon's state is one typed value, readable with no broker configured (the status
    page serves it when the uplink is down)."""
    from agent.config.models import AgentConfig
    from agent.daemon.agent import Agent

    install_versions(tmp_path / "state", keys, bundles)  # v1 then v2: v2 (int8 TFLite) is current, v1 previous
    config = AgentConfig.model_validate(
        {
            "device": {"id": "bench-7", "group": "lab"},
            "state_dir": str(tmp_path / "state"),
            "trust_keys": [str(keys["public"])],
            "cameras": [{"name": "door", "source": "synthetic:3", "fps": 20}],
            "telemetry": {"interval_s": 0.2},
        }
    )
    agent = Agent(config, probe())
    agent.start()
    try:
        snapshot = wait_until(
            lambda: (s := agent.snapshot()).cameras and s.cameras[0].frames > 3 and s.system is not None and s,
            30,
            "frames and a system sample",
        )
    finally:
        agent.stop()
    assert (snapshot.device, snapshot.group, snapshot.state, snapshot.broker) == ("bench-7", "lab", "online", None)
    assert snapshot.bundle is not None and (snapshot.bundle.name, snapshot.bundle.version) == ("demo", "1.1.0")
    assert snapshot.previous is not None and snapshot.previous.version == "1.0.0"
    assert snapshot.serving is not None and snapshot.serving.runtime == "litert"
    assert snapshot.serving.artifact == "demo_detector_int8.tflite" and "litert on" in snapshot.serving.reason
    assert snapshot.deployment is not None and snapshot.deployment.state == "SUCCEEDED"
    assert snapshot.cameras[0].name == "door" and snapshot.cameras[0].source_status.state == "running"
    assert snapshot.fps > 0 and snapshot.system is not None and snapshot.system.process_rss_mb > 0
    document = json.loads(json.dumps(snapshot.to_json()))
    assert document["cameras"][0]["latency_ms"]["inference"]["p50"] > 0
    assert document["board"]["kind"] == snapshot.board.kind and document["broker"] is None
    assert agent.snapshot().state == "offline" and agent.snapshot().cameras == ()


def test_the_agent_answers_after_bad_commands_and_counts_its_commands_thread_in_health(
    tmp_path: Path, broker: Broker, watcher: Watcher, keys: dict[str, Path]
) -> None:
    """Over a real mosquitto: a 2 KB ``[[[...]]]`` nested 1000 deep on ``cmd/snapshot`` once
    ended the agent's command handling for good; a request over 16 KiB is refused unread; and
    `health()` (``/healthz``, the watchdog) sees the commands thread."""
    from agent.config.models import AgentConfig
    from agent.daemon.agent import Agent

    config = AgentConfig.model_validate(
        {
            "device": {"id": "cmd-1"},
            "state_dir": str(tmp_path / "state"),
            "trust_keys": [str(keys["public"])],
            "operator_keys": [str(keys["operator_pub"])],
            "mqtt": {"broker": broker.url, "reconnect_min_s": 0.2},
            "telemetry": {"interval_s": 0.5},
        }
    )
    agent = Agent(config, probe())
    agent.start()
    try:
        watcher.wait_json("edge/cmd-1/status", lambda d: d["state"] == "online")
        for payload, words in [
            (b"[" * 1000 + b"]" * 1000, "nested too deeply"),
            (b"{}" + b" " * 20_000, "the request is 20002 bytes, more than the 16384"),
        ]:
            answer = json.loads(request(broker, "cmd-1", "snapshot", payload)[0])
            assert answer["error"]["code"] == "BAD_PAYLOAD" and words in answer["error"]["message"], answer
        pong = json.loads(request(broker, "cmd-1", "ping", signed_request(keys["operator"], "cmd-1", "ping"))[0])
        assert pong["ok"] is True and pong["result"]["state"] == "online"
        assert agent.health().ok
        assert agent.commands is not None
        commands = agent.commands

        def leave() -> float:
            raise SystemExit("planted")

        commands._worker._turn = leave  # its next turn ends the thread: the agent still runs, its commands do not
        assert commands._worker.join(10)
        assert agent.health().problems == ("the commands thread (MQTT commands) is not running: SystemExit: planted",)
    finally:
        agent.stop()


def test_a_cameras_classes_come_before_tracking_counting_and_events_and_a_reload_changes_them(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """Two cameras on one scene: `all` keeps every class, `picky` only squares. The circles never
    reach picky's tracker (its zone for circles stays empty), nor its events; the snapshot says
    what each camera keeps. A reload (what SIGHUP does) with new thresholds: the running
    pipelines use them."""
    import json

    import yaml

    from agent.config.loading import load_config
    from agent.daemon.agent import Agent

    install_versions(tmp_path / "state", keys, bundles)  # the demo: circle, square, triangle
    everywhere = [[0, 0], [640, 0], [640, 480], [0, 480]]
    config = {
        "state_dir": str(tmp_path / "state"),
        "trust_keys": [str(keys["public"])],
        "cameras": [
            {
                "name": "all",
                "source": "synthetic:2",
                "fps": 15,
                "zones": [{"name": "all-circles", "polygon": everywhere, "labels": ["circle"]}],
            },
            {
                "name": "picky",
                "source": "synthetic:2",
                "fps": 15,
                "classes": ["square"],
                "conf": 0.6,
                "zones": [{"name": "picky-circles", "polygon": everywhere, "labels": ["circle"]}],
            },
        ],
        "events": {"min_confidence": 0.3, "min_interval_s": 0.5},
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    agent = Agent(load_config(path), probe(), config_path=path)

    def labels(camera: str) -> set[object]:
        return {e.label for e in list(agent.outgoing.recent) if isinstance(e, ObjectEvent) and e.camera == camera}

    def zone(camera: str) -> int:
        return next(c for c in agent.events.counts() if c.camera == camera).zones[0].total

    agent.start()
    try:
        wait_until(lambda: zone("all") > 0 and len(labels("all")) == 3 and labels("picky"), 60, "circles on all")
        assert labels("picky") == {"square"} and zone("picky") == 0, "picky never tracked a circle"
        snapshot = agent.snapshot()
        shown = {t.camera: (t.conf, t.classes, t.configured) for t in snapshot.thresholds}
        assert shown == {"all": (0.25, None, ()), "picky": (0.6, ("square",), ("conf", "classes"))}
        document = json.loads(json.dumps(snapshot.to_json()))
        assert [c["thresholds"]["classes"] for c in document["cameras"]] == [None, ["square"]]
        assert document["cameras"][1]["thresholds"] == {
            "conf": 0.6,
            "iou": 0.45,
            "max_det": 300,
            "classes": ["square"],
            "configured": ["conf", "classes"],
            "problems": [],
        }

        config["cameras"][1].update(classes=["circle", "squircle"], conf=0.3)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        agent.reload()
        wait_until(lambda: zone("picky") > 0 and labels("picky"), 60, "circles on picky after the reload")
        assert labels("picky") == {"circle"}
        picky = agent.cameras.get("picky").detector.detection_filter
        assert (picky.conf, picky.classes) == (0.3, frozenset({0})), "the running pipeline uses the new ones"
        in_force = agent.snapshot().thresholds[1]
        assert (in_force.conf, in_force.classes) == (0.3, ("circle",))
        line = path.read_text().splitlines().index("  - squircle") + 1
        assert in_force.problems == (
            f"{path}:{line}: cameras.1.classes.1: 'squircle' is not a label of demo 1.1.0 (its labels: circle, "
            "square, triangle), so camera picky keeps no detections of it",
        )
    finally:
        agent.stop()


def test_sighup_refuses_a_config_that_config_check_finds_a_problem_in(broker: Broker, watcher: Watcher, agents) -> None:
    """A camera whose video file is missing: ``config check`` reports it (exit 1), and a SIGHUP
    with it once applied the config anyway. It is refused with the same words, the running
    config kept; the next good config applies."""
    agent = agents("dev1")
    watcher.wait_json("edge/dev1/status", lambda d: d["state"] == "online")
    good = yaml.safe_load(agent.config.read_text())
    missing = agent.config.parent / "door.avi"
    door = {"name": "door", "source": str(missing)}
    agent.config.write_text(yaml.safe_dump({**good, "cameras": [*good["cameras"], door]}))
    (problem,) = check_config(agent.config)
    assert problem == f"cameras.1.source: no such video file {missing}"
    assert agent.process is not None
    agent.process.send_signal(signal.SIGHUP)
    wait_until(lambda: f"SIGHUP: keeping the running config: {problem}" in agent.output(), 30, "the refusal")
    cam1 = {"name": "cam1", "source": "synthetic"}
    agent.config.write_text(yaml.safe_dump({**good, "cameras": [*good["cameras"], cam1]}))
    agent.process.send_signal(signal.SIGHUP)

    def starts() -> list[str]:
        """The cameras of each start of the agent, from its log."""
        return re.findall(r"running as dev1 \(.*?\), (\d+) pipeline", agent.output())

    wait_until(lambda: len(starts()) == 2, 30, "the good config applied")
    assert starts() == ["1", "2"], "the config with the missing file never ran"


@pytest.mark.parametrize(
    ("raised", "logged"),
    [
        (RecursionError("maximum recursion depth exceeded"), "RecursionError: maximum recursion depth exceeded"),
        (MemoryError(), "MemoryError"),
        (KeyError("a bug"), "KeyError: 'a bug'"),
    ],
)
def test_a_reload_keeps_the_running_config_whatever_checking_the_new_one_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, raised: Exception, logged: str
) -> None:
    """Only `ConfigError`, `BundleError` and `OSError` were caught: the RecursionError of a YAML
    file nested 20,000 deep and the MemoryError of one linked to /dev/zero ended the daemon
    (issue 37). Anything checking the new config raises is logged as a refusal, and the agent
    serves on with the config it had."""
    from agent.config.loading import load_config
    from agent.daemon import agent as daemon

    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"device": {"id": "kept"}, "state_dir": str(tmp_path / "state")}))
    agent = daemon.Agent(load_config(path), probe(), config_path=path)
    running = agent.config

    def fails(config_path: Path) -> None:
        raise raised

    monkeypatch.setattr(daemon, "reloadable", fails)
    agent.start()
    try:
        with caplog.at_level(logging.ERROR, logger=daemon.__name__):
            agent.reload()
        assert [r.getMessage() for r in caplog.records] == [f"SIGHUP: keeping the running config: {logged}"]
        assert agent.config is running and agent.snapshot().state == "online"
    finally:
        agent.stop()


def test_the_classify_thread_runs_with_the_agent_and_counts_in_health(tmp_path: Path, keys: dict[str, Path]) -> None:
    """The second stage's ``classify`` thread starts with the agent (with or without a bundle),
    classifies what it is offered (counted in the snapshot, telemetry and /metrics), and
    `health()` names it when it ended while the agent runs."""
    import threading

    import numpy as np
    from prometheus_client import generate_latest
    from testkit.classifying import demo_classifier

    from agent.config.models import AgentConfig
    from agent.daemon.agent import Agent
    from agent.daemon.documents import telemetry_payload
    from agent.web.metrics import metrics_registry

    config = AgentConfig.model_validate(
        {"device": {"id": "cls-1"}, "state_dir": str(tmp_path / "state"), "trust_keys": [str(keys["public"])]}
    )
    agent = Agent(config, probe())
    agent.start()
    try:
        assert "classify" in {t.name for t in threading.enumerate()}
        assert agent.health().ok
        stage = agent.classifying
        stage.serve(demo_classifier())  # as a version with a second stage would
        image = np.full((480, 640, 3), 40, np.uint8)
        for track_id in range(3):
            assert stage.offer("cam0", track_id, "circle", image, [10.0, 10.0, 60.0, 60.0])
        wait_until(lambda: stage.counts().classified + stage.counts().dropped == 3, 30, "three crops handled")
        counts = agent.snapshot().events
        assert (counts.classified, counts.classify_dropped) == (stage.classified, stage.dropped)
        assert counts.classified >= 1
        telemetry = json.loads(telemetry_payload(agent.snapshot()))["events"]
        assert (telemetry["classified"], telemetry["classify_dropped"]) == (counts.classified, counts.classify_dropped)
        metrics = generate_latest(metrics_registry(agent.snapshot, agent.health)).decode()
        assert f"edge_agent_classifications_total {float(counts.classified)}" in metrics
        assert f"edge_agent_classifications_dropped_total {float(counts.classify_dropped)}" in metrics
        worker = stage._worker

        def leave(wait: bool = False) -> bool:
            raise SystemExit("planted")

        stage.step = leave  # type: ignore[method-assign]
        with stage._cond:  # its waiting step returns; the next one ends the thread, not the agent's stop
            stage._stopping = True
            stage._cond.notify_all()
        assert worker.join(10)
        stage._stopping = False
        assert agent.health().problems == (
            "the classify thread (the second stage) is not running: SystemExit: planted",
        )
    finally:
        agent.stop()
    assert "classify" not in {t.name for t in threading.enumerate()}


def test_the_agent_names_its_version_in_status_telemetry_and_home_assistant(
    tmp_path: Path, broker: Broker, watcher: Watcher
) -> None:
    """Over a real mosquitto, every place the agent says its version says `agent.__version__`
    (the code that runs), with the protocol it reads beside it in the status (the will: in
    tests/agent/daemon/test_documents.py): the
    daemon once read importlib.metadata, which an editable install keeps at the version it was
    installed at (0.1.0 after a bump to 0.2.0)."""
    import agent as package
    from agent.config.models import AgentConfig
    from agent.daemon.agent import Agent
    from agent.mqtt.protocol import PROTOCOL

    config = AgentConfig.model_validate(
        {
            "device": {"id": "ver-1"},
            "state_dir": str(tmp_path / "state"),
            "mqtt": {"broker": broker.url},
            "telemetry": {"interval_s": 0.5},
            "cameras": [{"name": "cam0", "source": "synthetic"}],
            "integrations": {"home_assistant": {"enabled": True}},
        }
    )
    discovery = Watcher(broker, ["homeassistant/#"])
    agent = Agent(config, probe())
    agent.start()
    try:
        status = watcher.wait_json("edge/ver-1/status", lambda d: d["state"] == "online")
        assert (status["agent_version"], status["protocol"]) == (package.__version__, PROTOCOL)
        assert watcher.wait_json("edge/ver-1/telemetry", bool)["agent_version"] == package.__version__
        fps = "homeassistant/sensor/ver_1/fps/config"  # the device id as an object id (slug)
        assert discovery.wait_json(fps, bool, 30)["device"]["sw_version"] == package.__version__
    finally:
        agent.stop()
        discovery.close()
    stopped = watcher.wait_json("edge/ver-1/status", lambda d: d["state"] == "offline")
    assert (stopped["agent_version"], stopped["protocol"]) == (package.__version__, PROTOCOL)


def test_home_assistant_discovery_the_acl_refuses_is_a_problem_on_the_page(tmp_path: Path) -> None:
    """Issue 37, item 6: behind an ACL `fleet acl` wrote without ``--home-assistant``, the
    broker refused every discovery config (25 in 40 s) and the page said nothing. Now the
    agent's snapshot counts the refusals and the page's problems name the topic and the fix."""
    from testkit.broker import secured_broker

    from agent.config.models import AgentConfig
    from agent.daemon.agent import Agent
    from agent.fleet.acl import mosquitto_acl
    from agent.mqtt.protocol import Topics
    from agent.web.problems import page_problems

    broker = secured_broker(tmp_path / "broker", {"cam-1": "pw"}, mosquitto_acl([("cam-1", None)], [], Topics()))
    secret = tmp_path / "password"
    secret.write_text("pw\n")
    config = AgentConfig.model_validate(
        {
            "device": {"id": "cam-1"},
            "state_dir": str(tmp_path / "state"),
            "mqtt": {"broker": broker.url, "username": "cam-1", "password": {"file": str(secret)}},
            "cameras": [{"name": "cam0", "source": "synthetic"}],
            "integrations": {"home_assistant": {"enabled": True}},
        }
    )
    agent = Agent(config, probe())
    agent.start()
    try:
        refused = wait_until(lambda: (s := agent.snapshot()).broker and s.broker.refused, 20, "refused publishes")
        assert all(r.topic.startswith("homeassistant/") and r.reason == "Not authorized" for r in refused), refused
        found = [f for f in page_problems(agent.snapshot(), agent.health(), {}) if f.check == "broker acl"]
        assert (
            found and found[0].status == "fail" and "the ACL does not let this device write there" in found[0].message
        )
        assert "/config" in found[0].message and "--home-assistant" in found[0].fix
        assert json.loads(json.dumps(agent.snapshot().to_json()))["broker"]["refused"][0]["reason"] == "Not authorized"
    finally:
        agent.stop()
        broker.stop()


def test_media_the_agent_cannot_keep_is_a_problem_on_its_page(tmp_path: Path) -> None:
    """Issue 37, item 8, through the real Agent: what the media store says (here its folder is a
    file, so it cannot be used) reaches the snapshot the page reads, and the page's problems."""
    from agent.config.models import AgentConfig
    from agent.daemon.agent import Agent
    from agent.snapshot import Health
    from agent.web.problems import page_problems

    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "media").write_bytes(b"not a folder")
    config = AgentConfig.model_validate({"state_dir": str(tmp_path / "state"), "events": {"snapshots": True}})
    snapshot = Agent(config, probe()).snapshot()
    assert snapshot.media is not None and snapshot.media.problem is not None
    found = [f for f in page_problems(snapshot, Health(True), {}) if f.check == "media"]
    assert len(found) == 1 and "cannot be used" in found[0].message, found


def test_a_config_in_the_old_names_is_served_the_same_and_the_agent_warns_of_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``pipelines:`` and ``cameras:`` as a mapping (deprecated for one release): the cameras run
    with the serving settings given, and the log, the status warnings and the page say so."""
    from agent.config.loading import load_config
    from agent.daemon.agent import Agent
    from agent.web.problems import page_problems

    path = tmp_path / "agent.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\nallow_unsigned: true\n"
        "cameras: {share_model: false}\npipelines:\n  - {name: door, source: synthetic}\n"
    )
    agent = Agent(load_config(path), probe(), config_path=path)
    assert [s.name for s in agent.cameras.sections] == ["door"] and agent.cameras.options.share_model is False
    with caplog.at_level(logging.WARNING, logger="agent.daemon.agent"):
        agent.start()
    try:
        logged = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
        assert len(logged) == 2 and any("renamed cameras:" in line for line in logged), logged
        warnings = agent.snapshot().to_json()["warnings"]
        assert [w for w in warnings if "pipelines: is deprecated" in w], warnings
        found = [f.message for f in page_problems(agent.snapshot(), agent.health(), {}) if f.check == "config"]
        assert [m for m in found if "serving:" in m], found
    finally:
        agent.stop()


def test_a_camera_health_problem_is_an_event_and_in_telemetry_and_a_signed_command_resets_its_reference(
    tmp_path: Path,
    broker: Broker,
    watcher: Watcher,
    keys: dict[str, Path],
    bundles: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Over a real mosquitto: a camera whose picture is darker than its ``health.dark_luma`` (the
    synthetic scene under a threshold of 250, held for 0 s) sends a ``camera`` event on
    ``events`` and its telemetry says ``dark``; a camera with the check off has no ``health``.
    ``fleet camera-reference`` (signed) makes the camera's next frame its reference (a dark
    picture never becomes one by itself); unsigned it is refused, and a camera without the check
    is ``NO_PIPELINE``."""
    from testkit.fleet import cli

    from agent.config.models import AgentConfig
    from agent.daemon.agent import Agent

    install_versions(tmp_path / "state", keys, bundles)
    dark = {"interval_s": 0.1, "hold_s": 0, "dark_luma": 250, "bright_luma": 255}
    config = AgentConfig.model_validate(
        {
            "device": {"id": "eye-1"},
            "state_dir": str(tmp_path / "state"),
            "trust_keys": [str(keys["public"])],
            "operator_keys": [str(keys["operator_pub"])],
            "mqtt": {"broker": broker.url, "reconnect_min_s": 0.2},
            "telemetry": {"interval_s": 0.3},
            "cameras": [
                {"name": "gate", "source": "synthetic:3", "fps": 20, "health": dark},
                {"name": "yard", "source": "synthetic:4", "fps": 20, "health": {"enabled": False}},
            ],
        }
    )
    agent = Agent(config, probe())
    agent.start()
    try:

        def camera_event() -> dict[str, object] | None:
            documents = [json.loads(m.payload) for m in list(watcher.messages) if m.topic == "edge/eye-1/events"]
            return next((d for d in documents if d["type"] == "camera"), None)

        event = wait_until(camera_event, 60, "a camera event")
        telemetry = watcher.wait_json("edge/eye-1/telemetry", lambda d: "health" in d["cameras"][0])

        gate = agent.cameras.health_watch("gate")
        assert gate.reference is None, "a dark picture is no reference"
        fleet = ("--broker", broker.url, "--timeout", "20")
        status, out = cli(capsys, "fleet", "camera-reference", "eye-1", "gate", *fleet)
        assert status == 1 and "UNAUTHORIZED" in out and gate.reference is None, out
        signed = (*fleet, "--key", str(keys["operator"]))
        status, out = cli(capsys, "fleet", "camera-reference", "eye-1", "yard", *signed)
        assert status == 1 and "NO_PIPELINE" in out, out
        status, out = cli(capsys, "fleet", "camera-reference", "eye-1", "gate", *signed)
        assert status == 0 and "camera gate's next frame becomes its reference view" in out, out
        wait_until(lambda: gate.reference is not None, 30, "the next frame kept as the reference")
    finally:
        agent.stop()
    assert event is not None
    assert {k: event[k] for k in ("device", "camera", "problem", "change")} == {
        "device": "eye-1",
        "camera": "gate",
        "problem": "dark",
        "change": "start",
    }
    assert "lighting" in str(event["action"]) and float(str(event["since"])) <= float(str(event["ts"]))
    assert telemetry["cameras"][0]["health"]["problems"] == ["dark"]
    assert "health" not in telemetry["cameras"][1]


def test_a_reload_keeps_a_cameras_health_check_so_a_problem_still_present_is_not_announced_again(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """Two dark cameras (the synthetic scene under ``dark_luma`` 250) each send one ``start``.
    A SIGHUP's reload that changes only yard's ``health:`` keeps gate's check (its problem still
    present, no second ``start``) and gives yard a new one, whose ``start`` comes again."""
    from agent.event_values import CameraEvent

    agent, config, path = _dark_cameras_agent(tmp_path, keys, bundles, ("gate", "yard"))

    def starts(camera: str) -> int:
        found = list(agent.outgoing.recent)  # a reload starts a new list
        return sum(isinstance(e, CameraEvent) and e.camera == camera and e.change == "start" for e in found)

    agent.start()
    try:
        wait_until(lambda: starts("gate") == 1 and starts("yard") == 1, 60, "both cameras dark")
        gate = agent.cameras.health_watch("gate")
        config["cameras"][1]["health"] = {**DARK_HEALTH, "dark_luma": 251}  # type: ignore[index]
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        agent.reload()
        judged = gate.state.at if gate.state is not None else 0.0
        wait_until(lambda: starts("yard") == 1, 60, "yard's new check announcing its problem")

        def judged_again() -> bool:
            state = agent.cameras.health_watch("gate").state
            return state is not None and state.at > judged

        wait_until(judged_again, 30, "gate judged after the reload")
        assert starts("gate") == 0, "gate's problem, still present, was not announced again"
        assert agent.cameras.health_watch("gate") is gate, "gate's health section did not change: its check goes on"
        assert gate.state is not None and gate.state.kinds == ("dark",)
    finally:
        agent.stop()


def test_a_reload_ends_the_open_problems_of_a_camera_removed_or_rebuilt_and_keeps_no_metric_for_it(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """Three dark cameras each send one ``start``. A reload that removes shed and changes
    yard's ``health:`` sends one ``end`` for each of their open problems, saying why (``camera
    removed``, ``camera reconfigured``), and none for gate, whose check goes on; shed then has no
    ``edge_agent_camera_problem`` series and no problem on the page."""
    from agent.event_values import CameraEvent
    from agent.web.metrics import SnapshotCollector
    from agent.web.problems import page_problems

    agent, config, path = _dark_cameras_agent(tmp_path, keys, bundles, ("gate", "yard", "shed"))

    def events(change: str) -> list[CameraEvent]:
        return [e for e in list(agent.outgoing.recent) if isinstance(e, CameraEvent) and e.change == change]

    agent.start()
    try:
        wait_until(lambda: len(events("start")) == 3, 60, "three cameras dark")
        config["cameras"] = config["cameras"][:2]  # type: ignore[index]
        config["cameras"][1]["health"] = {**DARK_HEALTH, "dark_luma": 251}  # type: ignore[index]
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        agent.reload()
        ended = {(e.camera, e.problem, e.reason) for e in events("end")}
        gate = agent.cameras.health_watch("gate")
        judged = gate.state.at if gate.state is not None else 0.0
        wait_until(lambda: (s := gate.state) is not None and s.at > judged, 30, "gate judged after the reload")
        snapshot = agent.snapshot()
        metric = next(
            m for m in SnapshotCollector(lambda: snapshot, agent.health).collect() if m.name.endswith("problem")
        )
        problems = page_problems(snapshot, agent.health(), {})
    finally:
        agent.stop()
    assert ended == {("yard", "dark", "camera reconfigured"), ("shed", "dark", "camera removed")}
    assert {s.labels["camera"] for s in metric.samples} <= {"gate", "yard"}
    assert not [p for p in problems if "shed" in p.check], problems


# -- drift (issue 40) ----------------------------------------------------------------------------------


def test_the_agent_keeps_each_cameras_drift_against_the_version_serving(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """The cameras' inferred frames reach the drift, whose baseline is kept under the serving
    version's digest in the state directory and whose score reaches the snapshot."""
    from agent.config.models import AgentConfig
    from agent.daemon.agent import Agent

    install_versions(tmp_path / "state", keys, bundles)
    drift = {"baseline_h": 0.0003, "window_h": 0.0003}  # about a second each, on the camera's clock
    config = AgentConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "trust_keys": [str(keys["public"])],
            "cameras": [{"name": "door", "source": "synthetic:3", "fps": 20, "drift": drift}],
        }
    )
    agent = Agent(config, probe())
    agent.start()
    try:
        found = wait_until(lambda: (d := agent.snapshot().drift) and d[0].score is not None and d[0], 60, "a score")
    finally:
        agent.stop()
    current = agent.store.current_sha()
    assert found.camera == "door" and found.version == current and found.complete
    assert (tmp_path / "state" / "drift" / f"door@{current}.json").is_file()
    assert 0 <= found.score.score < 1  # type: ignore[union-attr]


def test_a_camera_with_a_health_problem_is_flagged_for_samples_and_one_without_the_check_is_not(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """`samples_flagged` (the samples' ``flagged`` reason) asks camera health and drift: a
    camera whose picture is darker than its ``dark_luma`` is flagged once judged; a camera
    without the health check, whose drift has no score yet, is not."""
    from agent.config.models import AgentConfig
    from agent.daemon.agent import Agent

    install_versions(tmp_path / "state", keys, bundles)
    dark = {"interval_s": 0.1, "hold_s": 0, "dark_luma": 250, "bright_luma": 255}
    config = AgentConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "trust_keys": [str(keys["public"])],
            "cameras": [
                {"name": "gate", "source": "synthetic:3", "fps": 20, "health": dark},
                {"name": "yard", "source": "synthetic:4", "fps": 20, "health": {"enabled": False}},
            ],
        }
    )
    agent = Agent(config, probe())
    agent.start()
    try:
        wait_until(lambda: agent.samples_flagged("gate"), 60, "the dark camera flagged")
        assert not agent.samples_flagged("yard")
        assert not agent.samples_flagged("nowhere")
    finally:
        agent.stop()


#: camera health thresholds that call the synthetic scene dark at once (its luma is under 250)
DARK_HEALTH = {"interval_s": 0.1, "hold_s": 0, "dark_luma": 250, "bright_luma": 255}


def _dark_cameras_agent(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path], names: tuple[str, ...]
) -> tuple[Any, dict[str, Any], Path]:
    """An `Agent` (not started) over installed versions with one dark synthetic camera per name
    (``synthetic:3`` onwards), and the config dict and agent.yaml path a test edits to reload."""
    from agent.config.loading import load_config
    from agent.daemon.agent import Agent

    install_versions(tmp_path / "state", keys, bundles)
    config: dict[str, Any] = {
        "state_dir": str(tmp_path / "state"),
        "trust_keys": [str(keys["public"])],
        "cameras": [
            {"name": name, "source": f"synthetic:{i + 3}", "fps": 20, "health": DARK_HEALTH}
            for i, name in enumerate(names)
        ],
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return Agent(load_config(path), probe(), config_path=path), config, path
