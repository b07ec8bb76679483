"""The status page's pure parts, table by table: access rules, the problem judges, the history
and its reference FPS, health, the systemd notifier and watchdog schedule, the clock reader,
the ``status_page`` settings. The page over a socket is tests/test_status_page.py."""

from __future__ import annotations

import base64
import dataclasses
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.config.models import StatusPageSection
from agent.daemon.service import Notifier, Service, watchdog_interval_s
from agent.hardware.clock import STA_UNSYNC, TIMESYNCD_FLAG, clock_synchronised
from agent.hardware.probe import Board
from agent.hardware.readings import Battery, SensorReadings, Throttled
from agent.hardware.sysfs import SysFS
from agent.hardware.system import SystemReadings
from agent.mqtt.link import LinkStats
from agent.snapshot import AgentSnapshot, EngineStatus, EventCounts, Health, VersionRef, judge_health
from agent.web.auth import Guard, cross_site
from agent.web.history import REFERENCE_S, History
from agent.web.logs import RecentLogs
from agent.web.problems import (
    judge_battery,
    judge_camera,
    judge_clock,
    judge_disk,
    judge_engine,
    judge_power,
    page_problems,
)
from pipelines.metrics import Percentiles
from pipelines.pipeline import PipelineStats
from pipelines.sources import SourceState

# -- builders --------------------------------------------------------------------------------


def camera(name: str = "cam0", **changes: Any) -> PipelineStats:
    stats = PipelineStats(
        name=name,
        source="synthetic",
        fps=10.0,
        frames=100,
        dropped=0,
        errors=0,
        swaps=0,
        paused=False,
        max_fps=None,
        workers=1,
        latency_ms={"total": Percentiles(40.0, 60.0)},
        source_status=SourceState("running", None, 0),
        runtime="onnxruntime",
        model="m.onnx",
    )
    return dataclasses.replace(stats, **changes)


def link(**changes: Any) -> LinkStats:
    return dataclasses.replace(LinkStats("mqtt://b:1883", True, 0, 0, 0, None), **changes)


def snapshot(**changes: Any) -> AgentSnapshot:
    base = AgentSnapshot(
        ts=1000.0,
        state="online",
        device="cam-1",
        group=None,
        agent_version="0",
        board=Board("generic", "generic x86_64", "x86_64", 2, False),
        bundle=VersionRef("demo", "1.0.0", "a" * 64),
        previous=None,
        serving=None,
        serving_error=None,
        deployment=None,
        deployment_problem=None,
        cameras=(camera(),),
        broker=None,
        system=SystemReadings(1.0, 1.0, 1.0, 1.0, 1.0, 50_000.0, 100_000.0, True),
        events=EventCounts(0, 0),
    )
    return dataclasses.replace(base, **changes)


def battery(percent: float, status: str = "Discharging") -> Battery:
    return Battery(percent, status, 7.4, -1.0, 7.4, "power_supply/BAT0")


# -- access ----------------------------------------------------------------------------------


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("authorization", "ok"),
    [
        (header("tech", "pa:ss"), True),  # a colon in the password belongs to it
        (header("tech", "pa:s"), False),
        (header("tech", "pa:ss "), False),
        (header("Tech", "pa:ss"), False),
        (header("", "pa:ss"), False),
        ("Bearer " + base64.b64encode(b"tech:pa:ss").decode(), False),
        ("Basic not*base64", False),
        ("Basic", False),
        (None, False),
    ],
)
def test_basic_credentials(authorization: str | None, ok: bool) -> None:
    assert Guard("tech", "pa:ss").authenticated(authorization) is ok


@pytest.mark.parametrize(
    ("credentials", "method", "path", "headers", "refused"),
    [
        (False, "GET", "/api/status", {}, None),  # read only, open on loopback
        (False, "POST", "/api/rollback", {}, 403),  # actions need credentials
        (True, "GET", "/api/status", {}, 401),
        (True, "GET", "/metrics", {}, 401),
        (True, "GET", "/healthz", {}, None),  # probes
        (True, "GET", "/api/status", {"authorization": header("tech", "pw")}, None),
        (True, "POST", "/api/rollback", {"authorization": header("tech", "pw")}, None),
        (True, "POST", "/api/rollback", {"authorization": header("tech", "pw"), "origin": "http://evil"}, 403),
        (True, "POST", "/api/rollback", {"authorization": header("tech", "nope"), "origin": "http://evil"}, 401),
    ],
)
def test_who_may_read_and_act(
    credentials: bool, method: str, path: str, headers: dict[str, str], refused: int | None
) -> None:
    guard = Guard("tech", "pw") if credentials else Guard(None, None)
    refusal = guard.refusal(method, path, {"host": "10.0.0.5:8080", **headers}, "http")
    assert (refusal.status if refusal else None) == refused


@pytest.mark.parametrize(
    ("headers", "scheme", "is_cross"),
    [
        ({}, "http", False),  # curl and friends send neither header
        ({"origin": "http://10.0.0.5:8080"}, "http", False),
        ({"origin": "https://10.0.0.5:8080"}, "https", False),
        ({"origin": "http://10.0.0.5:8080"}, "https", True),
        ({"origin": "http://10.0.0.5:8081"}, "http", True),
        ({"origin": "null"}, "http", True),
        ({"sec-fetch-site": "same-origin", "origin": "http://10.0.0.5:8080"}, "http", False),
        ({"sec-fetch-site": "none"}, "http", False),
        ({"sec-fetch-site": "same-site"}, "http", True),
        ({"sec-fetch-site": "cross-site"}, "http", True),
    ],
)
def test_cross_site_requests(headers: dict[str, str], scheme: str, is_cross: bool) -> None:
    assert cross_site({"host": "10.0.0.5:8080", **headers}, scheme) is is_cross


# -- the problem judges ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("free_mb", "total_mb", "status"),
    [(50_000, 100_000, "pass"), (9_000, 100_000, "warn"), (900, 4_000, "warn"), (1_500, 100_000, "fail"),
     (150, 1_000, "fail"), (None, 100_000, "warn")],
)  # fmt: skip
def test_disk(free_mb: float | None, total_mb: float, status: str) -> None:
    assert judge_disk(free_mb, total_mb, "/var/lib/edge-agent").status == status


def test_clock() -> None:
    assert [judge_clock(v).status for v in (True, False, None)] == ["pass", "warn", "warn"]
    assert "timedatectl set-ntp true" in judge_clock(False).fix


@pytest.mark.parametrize(
    ("bits", "status", "words"),
    [(0x0, "pass", "no under-voltage"), (0x50005, "fail", "under-voltage now"), (0x50000, "warn", "since boot"),
     (0x4, "warn", "throttling the CPU now"), (0x8, "warn", "throttling")],
)  # fmt: skip
def test_power_flags(bits: int, status: str, words: str) -> None:
    finding = judge_power(Throttled.from_bits(bits))
    assert finding.status == status and words in finding.message


@pytest.mark.parametrize(
    ("charge", "state", "level", "status"),
    [(57, "Discharging", None, "pass"), (15, "Discharging", None, "warn"), (4, "Discharging", None, "fail"),
     (15, "Charging", None, "pass"), (50, "Discharging", "LOW", "warn"), (4, "Charging", "OK", "pass")],
)  # fmt: skip
def test_battery(charge: float, state: str, level: str | None, status: str) -> None:
    from agent.governor.levels import BatteryLevel

    finding = judge_battery(battery(charge, state), BatteryLevel(level) if level else None)
    assert finding.status == status


@pytest.mark.parametrize(
    ("changes", "reference", "status", "words"),
    [
        ({}, 10.0, "pass", "10.0 FPS"),
        ({"fps": 4.0}, 10.0, "warn", "under half the 10.0 FPS"),
        ({"fps": 4.0, "max_fps": 5.0}, 10.0, "pass", ""),  # a cap explains it
        ({"fps": 2.0, "max_fps": 5.0}, 10.0, "warn", "under half the 5.0 FPS"),
        ({"fps": 0.0, "paused": True}, 10.0, "pass", ""),
        ({"fps": 4.0}, None, "pass", ""),  # no reference measured yet
        ({"source_status": SourceState("reconnecting", "cannot open camera /dev/video0", 2)}, 10.0, "fail", "lost"),
        ({"source_status": SourceState("ended", None, 0)}, None, "warn", "ended"),
    ],
)
def test_camera(changes: dict[str, Any], reference: float | None, status: str, words: str) -> None:
    finding = judge_camera(camera(**changes), reference)
    assert finding.status == status and words in finding.message


def engine(state: str, **changes: Any) -> EngineStatus:
    base = EngineStatus("demo 1.0.0", "m.onnx", "fp16", "building", "building", 0.4, 1000.0)
    return dataclasses.replace(base, state=state, **changes)


@pytest.mark.parametrize(
    ("status", "state", "words"),
    [
        (None, "pass", "no TensorRT engine build"),
        (engine("building", note="onnxruntime serves until the engine is ready"), "pass", "building (40%)"),
        (engine("ready", progress=1.0), "pass", "ready"),
        (
            engine("failed", error_code="ENGINE_BUILD_FAILED", message="node Conv_3: unsupported"),
            "warn",
            "fp16 engine of m.onnx (demo 1.0.0) is not served: ENGINE_BUILD_FAILED: node Conv_3: unsupported",
        ),
    ],
)
def test_engine(status: EngineStatus | None, state: str, words: str) -> None:
    finding = judge_engine(status)
    assert finding.status == state and words in finding.message
    if state == "warn":
        assert "ONNX Runtime serves instead" in finding.fix and "engine build --force" in finding.fix
        assert [f.check for f in page_problems(snapshot(engine=status), Health(True), {})] == ["engine"]


def test_page_problems_put_failures_first_and_name_what_to_do() -> None:
    down = link(connected=False, last_error="cannot connect to mqtt://b:1883: refused", queued=12)
    throttled = SensorReadings(throttled=Throttled.from_bits(0x50005), battery=battery(12))
    state = snapshot(broker=down, sensors=throttled, warnings=("allow_unsigned is true",))
    found = page_problems(state, Health(True), {"cam0": 10.0})
    assert [f.check for f in found] == ["power", "battery", "broker", "config"]
    assert [f.status for f in found] == ["fail", "warn", "warn", "warn"]
    assert "12 message(s) wait" in found[2].message and found[2].fix
    assert page_problems(snapshot(), Health(True), {}) == []
    nothing = page_problems(snapshot(bundle=None, cameras=()), Health(True), {})
    assert [f.check for f in nothing] == ["model"] and "edge-agent install" in nothing[0].fix
    hung = page_problems(snapshot(), Health(False, ("the sampler (sensors) has not turned for 99 s",)), {})
    assert [(f.check, f.status) for f in hung] == [("health", "fail")]
    camera_hung = page_problems(snapshot(), Health(False, ("camera cam0: a thread has not turned for 9 s",)), {})
    assert [(f.check, f.status, f.message[:17]) for f in camera_hung] == [("camera cam0", "fail", "hung: camera cam0")]


# -- history ---------------------------------------------------------------------------------


def test_history_points_and_the_reference_fps_of_each_version() -> None:
    history = History(points=5)
    sha1, sha2 = VersionRef("demo", "1", "1" * 64), VersionRef("demo", "2", "2" * 64)
    for i, fps in enumerate([8.0, 12.0, 9.0]):
        history.record(snapshot(ts=1000.0 + i, bundle=sha1, cameras=(camera(fps=fps),)))
    assert history.reference_fps(1000.0 + REFERENCE_S) == {}, "still measuring"
    history.record(snapshot(ts=1000.0 + REFERENCE_S + 1, bundle=sha1, cameras=(camera(fps=30.0),)))
    assert history.reference_fps(1000.0 + REFERENCE_S + 1) == {"cam0": 12.0}, "only the first minute counts"
    history.record(snapshot(ts=2000.0, bundle=sha2, cameras=(camera(fps=5.0), camera("cam1", fps=3.0))))
    assert history.reference_fps(2000.0 + REFERENCE_S + 1) == {"cam0": 5.0, "cam1": 3.0}, "a new version, anew"
    points = history.to_json(since=1000.0)
    assert points["ts"] == [1001.0, 1002.0, 1000.0 + REFERENCE_S + 1, 2000.0]
    assert points["cameras"]["cam1"]["fps"] == [None, None, None, 3.0]
    assert points["cameras"]["cam0"]["latency_ms"] == [40.0] * 4
    assert len(history.to_json()["ts"]) == 5  # bounded


# -- health ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cameras", "broker", "sampler_s", "problems"),
    [
        ((camera(stalled_s=1.0),), link(stalled_s=1.0), 1.0, []),
        ((camera(stalled_s=9.0), camera("cam1")), None, 0.0, ["camera cam0"]),
        ((), link(stalled_s=30.0), 0.0, ["the MQTT link"]),
        ((), None, 6.0, ["the sampler"]),
    ],
)
def test_health(
    cameras: tuple[PipelineStats, ...], broker: LinkStats | None, sampler_s: float, problems: list[str]
) -> None:
    health = judge_health(cameras, broker, sampler_s, stall_s=5.0)
    assert health.ok is (not problems)
    assert [p.split(":")[0].split(" loop")[0].split("'s")[0].split(" (")[0] for p in health.problems] == problems


# -- systemd ---------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Recorder(Notifier):
    def __init__(self) -> None:
        super().__init__("/run/test")
        self.sent: list[tuple[float, tuple[str, ...]]] = []
        self.clock: Clock | None = None

    def send(self, *lines: str) -> None:
        self.sent.append((self.clock.now if self.clock else 0.0, lines))


def test_the_watchdog_is_pinged_every_half_interval_only_while_healthy() -> None:
    clock, notifier = Clock(), Recorder()
    notifier.clock = clock
    service = Service(notifier, watchdog_s=4.0, clock=clock)
    assert service.tick_s == 0.5
    service.ready(None, lambda: "serving demo")
    for step in range(40):  # 20 s healthy, then hung from 10 s to 16 s
        clock.now = step * 0.5
        hung = 10.0 <= clock.now < 16.0
        health = Health(False, ("camera cam0: hung",)) if hung else Health(True)
        service.tick(lambda: health, lambda: "serving demo")  # noqa: B023 - called before the next turn
    pings = [t for t, lines in notifier.sent if lines == ("WATCHDOG=1",)]
    assert pings == [0.0, 2.0, 4.0, 6.0, 8.0, 16.0, 18.0]
    statuses = [(t, lines[0]) for t, lines in notifier.sent if lines[0].startswith("STATUS=")]
    assert (10.0, "STATUS=hung: camera cam0: hung") in statuses and (16.0, "STATUS=serving demo") in statuses
    assert notifier.sent[0] == (0.0, ("READY=1", "STATUS=serving demo"))


@pytest.mark.parametrize(
    ("environ", "interval"),
    [({}, None), ({"WATCHDOG_USEC": "30000000"}, 30.0), ({"WATCHDOG_USEC": "0"}, None),
     ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "7"}, 2.0),
     ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "8"}, None), ({"WATCHDOG_USEC": "junk"}, None)],
)  # fmt: skip
def test_watchdog_settings_from_the_environment(environ: dict[str, str], interval: float | None) -> None:
    assert watchdog_interval_s(environ, pid=7) == interval


@pytest.mark.parametrize("abstract", [False, True])
def test_the_notifier_sends_datagrams_to_a_socket_path_or_an_abstract_name(tmp_path: Path, abstract: bool) -> None:
    address = f"@edge-agent-test-{id(tmp_path)}" if abstract else str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + address[1:] if abstract else address)
        server.settimeout(5)
        Notifier.from_environment({"NOTIFY_SOCKET": address}).send("READY=1", "STATUS=up")
        assert server.recv(4096) == b"READY=1\nSTATUS=up"
    Notifier(str(tmp_path / "gone")).send("WATCHDOG=1")  # logged, never raised
    assert not Notifier.from_environment({}).enabled


# -- the clock -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "kernel", "expected"),
    [(True, OSError(1, "EPERM"), True), (False, (0, 100_000), True), (False, (STA_UNSYNC, 100_000), False),
     (False, (0, 16_000_000), False), (False, OSError(1, "EPERM"), None)],
)  # fmt: skip
def test_clock_synchronised(tmp_path: Path, flag: bool, kernel: Any, expected: bool | None) -> None:
    if flag:
        (tmp_path / TIMESYNCD_FLAG).parent.mkdir(parents=True)
        (tmp_path / TIMESYNCD_FLAG).touch()

    def adjtimex() -> tuple[int, int]:
        if isinstance(kernel, Exception):
            raise kernel
        return kernel  # type: ignore[no-any-return]

    assert clock_synchronised(SysFS(tmp_path), adjtimex) is expected


def test_the_real_kernel_answers_on_this_machine() -> None:
    assert clock_synchronised(SysFS(Path("/nonexistent"))) in (True, False)


# -- settings and logs -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ({}, None),
        ({"listen": "[::1]:8080"}, None),
        ({"listen": "0.0.0.0:8080", "username": "tech", "password_file": "/etc/edge-agent/page-password"}, None),
        ({"listen": "0.0.0.0:8080"}, "not a loopback address: set username and password_file"),
        ({"listen": "cam-1.local:8080"}, "not a loopback address"),
        ({"listen": "8080"}, "is not HOST:PORT"),
        ({"listen": "127.0.0.1:99999"}, "is not HOST:PORT"),
        ({"listen": "::1:8080"}, "IPv6 address in brackets"),
        ({"username": "tech"}, "username and a password"),
        ({"password_env": "X"}, "username and a password"),
        ({"username": "t", "password_env": "X", "password_file": "/f"}, "not both"),
    ],
)
def test_status_page_settings(section: dict[str, Any], error: str | None) -> None:
    if error is None:
        StatusPageSection.model_validate(section)
        return
    with pytest.raises(ValidationError, match=error):
        StatusPageSection.model_validate(section)


def test_recent_logs_keep_the_newest_lines_as_they_were_logged() -> None:
    logs = RecentLogs(size=2)
    logger = logging.getLogger("test.recent")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(logs)
    try:
        values = [1]
        logger.warning("first %s", values)
        values.append(2)
        logger.info("second")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("third")
        logger.debug("not kept (below INFO)")
    finally:
        logger.removeHandler(logs)
    lines = logs.to_json()
    assert [line["message"] for line in lines] == ["second", "third (ValueError: boom)"]
    logs = RecentLogs(size=5)
    logger.addHandler(logs)
    logger.warning("first %s", values)
    values.append(3)
    logger.removeHandler(logs)
    assert logs.to_json()[0]["message"] == "first [1, 2]", "formatted when logged, not when read"
    assert lines[1]["level"] == "ERROR" and lines[1]["logger"] == "test.recent"


def test_config_example_serves_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agent.cli import main
    from agent.config.loading import load_config

    args = ["config", "example", "--state-dir", str(tmp_path), "--status-listen", "0.0.0.0:8080"]
    assert main(args) == 1
    assert "is not a loopback address: set username and password_file" in capsys.readouterr().err
    assert main([*args, "--status-user", "tech", "--status-password-file", str(tmp_path / "pw")]) == 0
    path = tmp_path / "agent.yaml"
    path.write_text(capsys.readouterr().out)
    page = load_config(path).status_page
    assert page is not None and (page.host, page.port, page.username) == ("0.0.0.0", 8080, "tech")
    assert main(["config", "example", "--status-user", "tech"]) == 1
    assert "go with --status-listen" in capsys.readouterr().err
