"""`agent.daemon.command_service`: payloads checked, answers shaped, the gate and echo limits, rate
limits; over a real mosquitto: bad input of any shape and size answered with the
thread alive, and the thread's turns and its end as `Health` sees them."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from testkit.broker import Broker
from testkit.control import NOW, Clock, gate, junk, newer_protocol, request
from testkit.fleet import Requester
from testkit.net import wait_until

from agent.bundles.record import Deployment
from agent.config.models import MqttSection
from agent.daemon.command_service import CommandError, CommandService, RateLimits, run_command, vouched_for
from agent.errors import CodedError, ErrorCode
from agent.mqtt.commands import COMMAND_TABLE, CameraArgs, Command, CommandActions, NoArgs
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import MAX_CONTROL_BYTES, PROTOCOL, Topics
from agent.snapshot import judge_health


def no_rollback() -> Deployment:
    raise CodedError(ErrorCode.NO_PREVIOUS, "no previous version")


def no_frame(camera: str | None, quality: int) -> bytes:
    raise CodedError(ErrorCode.NO_FRAME, "no frame yet")


def actions(**changes: Any) -> CommandActions:
    """Actions of a device with one camera, cam0, that has no previous version and no frame yet."""
    fields: dict[str, Any] = {
        "state": lambda: "online",
        "rollback": no_rollback,
        "restart": lambda camera: [camera or "cam0"],
        "camera_jpeg": no_frame,
        "clock": Clock(),
    }
    return CommandActions(**{**fields, **changes})


def table(*rows: Command[Any]) -> dict[str, Command[Any]]:
    return {row.name: row for row in rows}


def test_command_answers_with_gate_and_echo_limits(tmp_path: Path, keys, operator) -> None:
    commands = table(
        Command("rollback", NoArgs, lambda device, a: {"done": True}),
        Command("restart-pipeline", CameraArgs, lambda device, a: {}),
    )
    check = gate(tmp_path, keys, Clock())
    unsigned = json.loads(run_command(commands, actions(), "rollback", b"{}", check).payload)
    assert unsigned["error"]["code"] == "UNAUTHORIZED"
    signed = json.loads(run_command(commands, actions(), "rollback", request(operator).to_bytes(), check).payload)
    assert signed == {"ok": True, "command": "rollback", "result": {"done": True}}
    huge = request(operator, name="restart-pipeline", id="big", args={"pipeline": "p" * 10_000})
    answer = run_command(commands, actions(), "restart-pipeline", huge.to_bytes(), check)
    assert len(answer.payload) < 2000 and json.loads(answer.payload)["error"]["code"] == "BAD_PAYLOAD"
    unknown = json.loads(run_command(commands, actions(), "x" * 100_000, b"", check).payload)
    assert unknown["error"]["code"] == "UNKNOWN_COMMAND" and len(json.dumps(unknown)) < 1000


def test_rate_limits_keep_one_flooded_command_from_starving_the_others() -> None:
    clock = Clock(0.0)
    limits = RateLimits(COMMAND_TABLE, clock=clock)
    allowed = sum(limits.allow("snapshot") for _ in range(5000))
    assert allowed == 4, "a burst of 4 snapshots, then 2 a second"
    assert limits.allow("ping"), "ping has its own bucket"
    clock.now = 1.0
    assert sum(limits.allow("snapshot") for _ in range(10)) == 2
    assert sum(limits.allow(f"junk-{i}") for i in range(100)) == 10, "every unknown name shares one bucket"
    assert limits.dropped == 4996 + 8 + 90


def test_requests_not_vouched_for_have_one_bucket_of_their_own() -> None:
    """What does not pass the gate's check of who sent it is charged to one bucket shared by
    every name, never to the name's own, which the operator's signed requests keep."""
    clock = Clock(0.0)
    limits = RateLimits(COMMAND_TABLE, clock=clock)
    junk = RateLimits.UNVERIFIED
    assert sum(limits.allow(name, vouched=False) for name in ["rollback", "ping"] * 2500) == junk.burst
    assert sum(limits.allow("rollback") for _ in range(100)) == 10, "rollback's own burst is all there"
    clock.now = 1.0
    assert sum(limits.allow("ping", vouched=False) for _ in range(100)) == int(junk.per_s)
    assert limits.dropped == 5000 - junk.burst + 90 + 100 - int(junk.per_s)


def test_admission_vouches_only_for_what_an_operator_key_signed_for_this_device_now(
    tmp_path: Path, keys: dict[str, Path], operator
) -> None:
    """`vouched_for` tells the operator's requests from junk before a rate limit is charged; where
    unsigned control is allowed only a signature that fails is junk."""
    strict, lab = gate(tmp_path, keys, Clock()), gate(tmp_path, keys, Clock(), allow_unsigned=True)
    signed = request(operator, id="fresh").to_bytes()
    assert vouched_for(signed, "rollback", strict) and vouched_for(signed, "rollback", lab)
    assert not vouched_for(signed, "ping", strict), "a rollback's signature sent to ping"
    flood = junk(keys, operator, "rollback")[:-1]  # the caller never passes a payload over 16 KiB
    assert [vouched_for(payload, "rollback", strict) for payload in flood] == [False] * len(flood)
    assert [vouched_for(payload, "rollback", lab) for payload in flood] == [True, True, True, False, False, False, True]
    assert vouched_for(b'{"pipeline": "signature"}', "restart-pipeline", lab), "bare arguments that mention it"
    assert not vouched_for(b'{"signature": ' + b"[" * 5000, "rollback", strict)


def test_commands_check_payloads_and_shape_answers() -> None:
    calls: list[str] = []

    def restart(device: CommandActions, args: CameraArgs) -> dict[str, object]:
        if args.pipeline == "ghost":
            raise CommandError("NO_PIPELINE", "no pipeline named 'ghost'")
        calls.append(args.pipeline or "all")
        return {"restarted": [args.pipeline]}

    def broken(device: CommandActions, _: NoArgs) -> dict[str, object]:
        raise OSError("disk on fire")

    commands = table(
        Command("restart-pipeline", CameraArgs, restart),
        Command("ping", NoArgs, lambda device, _: {"pong": 1}),
        Command("broken", NoArgs, broken),
    )
    nested = b"[" * 1000 + b"]" * 1000
    answers = {
        (name, payload): json.loads(run_command(commands, actions(), name, payload).payload)
        for name, payload in [
            ("ping", b""),
            ("restart-pipeline", b'{"pipeline": "cam0"}'),
            ("restart-pipeline", b'{"pipeline": "ghost"}'),
            ("restart-pipeline", b'{"pipe": "cam0"}'),
            ("restart-pipeline", b"[1]"),
            ("restart-pipeline", b"\xff"),
            ("format-disk", b""),
            ("broken", b""),
            ("restart-pipeline", nested),
            ("restart-pipeline", b'{"pipeline": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
            ("ping", b"{}" + b" " * MAX_CONTROL_BYTES),
        ]
    }
    codes = [a["error"]["code"] if not a["ok"] else "ok" for a in answers.values()]
    assert codes == [
        "ok",
        "ok",
        "NO_PIPELINE",
        "BAD_PAYLOAD",
        "BAD_PAYLOAD",
        "BAD_PAYLOAD",
        "UNKNOWN_COMMAND",
        "COMMAND_FAILED",
        "BAD_PAYLOAD",
        "BAD_PAYLOAD",
        "BAD_PAYLOAD",
    ]
    assert calls == ["cam0"], "bad payloads never reach the command"
    assert "nested too deeply" in answers[("restart-pipeline", nested)]["error"]["message"]
    oversize = answers[("ping", b"{}" + b" " * MAX_CONTROL_BYTES)]["error"]["message"]
    assert f"{MAX_CONTROL_BYTES + 2} bytes, more than the {MAX_CONTROL_BYTES}" in oversize


@pytest.mark.parametrize(
    "payload",
    [b"\xff" * (MAX_CONTROL_BYTES + 1), b"[" * (MAX_CONTROL_BYTES + 1), b"not json".ljust(MAX_CONTROL_BYTES + 1)],
    ids=["not utf-8", "nested", "not json"],
)
def test_an_oversize_payload_is_refused_by_its_size_before_it_is_parsed(payload: bytes) -> None:
    """Junk over 16 KiB is refused as too large, not as junk: its size is checked before the
    parser reads it. Catches the size check planted after `json.loads` in `read_arguments`,
    which the padded JSON of the other tests hides (it parses, then is refused alike)."""
    answer = json.loads(run_command(table(*COMMAND_TABLE), actions(), "ping", payload).payload)
    assert (answer["ok"], answer["error"]["code"]) == (False, "BAD_PAYLOAD")
    assert answer["error"]["message"] == (
        f"the request is {len(payload)} bytes, more than the {MAX_CONTROL_BYTES} a command may be; it was not read"
    )


# -- over a real mosquitto --------------------------------------------------------------------


@pytest.fixture
def operator_client(broker: Broker) -> Iterator[Requester]:
    requester = Requester(broker, "cam-1")
    yield requester
    requester.close()


@pytest.fixture
def served(
    tmp_path: Path, broker: Broker, keys: dict[str, Path], operator: Ed25519PrivateKey, operator_client: Requester
) -> Iterator[Callable[..., CommandService]]:
    """``served(actions, monotonic=..., allow_unsigned=True)``: a `CommandService` for device
    cam-1 on its own link to the test's broker, unsigned bare arguments allowed unless
    `allow_unsigned` is False, answering (its subscription is in place) when it is returned;
    stopped at the end."""
    started: list[tuple[MqttLink, CommandService]] = []

    def serve(
        device: CommandActions, monotonic: Callable[[], float] | None = None, allow_unsigned: bool = True
    ) -> CommandService:
        link = MqttLink(MqttSection(broker=broker.url), "edge-agent-cam-1")
        check = gate(tmp_path, keys, Clock(), allow_unsigned=allow_unsigned)
        extra = {"monotonic": monotonic} if monotonic is not None else {}
        service = CommandService(link, Topics(), "cam-1", check, device, **extra)
        service.start()
        link.start()
        assert link.wait_connected(10)
        started.append((link, service))
        pings = (request(operator, "ping", id=f"warm-up-{n}").to_bytes() for n in itertools.count())

        def ping() -> bytes:
            return b"" if allow_unsigned else next(pings)

        # a ping sent before the broker acknowledged the subscription is lost: ask until one is answered
        wait_until(lambda: operator_client.answered(operator_client.send("ping", ping()), 1.0), 20, "a first answer")
        return service

    yield serve
    for link, service in started:
        service.stop()
        link.stop()


def test_bad_payloads_of_any_shape_are_answered_and_the_commands_thread_lives_on(
    served: Callable[..., CommandService], operator_client: Requester
) -> None:
    """A 2 KB ``[[[...]]]`` nested 1000 deep once raised RecursionError past the checks and ended
    the commands thread for good: nothing was answered after it."""
    service = served(actions())
    for name, payload in [
        ("snapshot", b"[" * 1000 + b"]" * 1000),
        ("snapshot", b'{"pipeline": "cam0", "quality": ' + b"[" * 3000 + b"]" * 3000 + b"}"),
        ("restart-pipeline", b'{"command": "restart-pipeline", "args": ' + b"[" * 2000),
        ("ping", b"\xff\xfe" * 100),
    ]:
        answer = operator_client.ask(name, payload)
        assert (answer["ok"], answer["error"]["code"]) == (False, "BAD_PAYLOAD"), answer
    pong = operator_client.ask("ping", b"")
    assert pong == {"ok": True, "command": "ping", "result": {"pong": 1_800_000_000.0, "state": "online"}}
    assert service.loop().ended is None


def test_a_request_over_16_kib_is_refused_unread(
    served: Callable[..., CommandService], operator_client: Requester
) -> None:
    """The size is the first check: a ping of an empty object padded with JSON whitespace would
    parse and run, and a megabyte of it is never parsed, queued or echoed."""
    restarted: list[str | None] = []
    served(actions(restart=lambda camera: restarted.append(camera) or ["cam0"]))
    fits = b"{}" + b" " * (MAX_CONTROL_BYTES - 2)
    assert operator_client.ask("ping", fits)["ok"] is True, "16 KiB exactly is let in"
    for size in (MAX_CONTROL_BYTES + 1, 1 << 20):
        answer = operator_client.ask("restart-pipeline", b'{"pipeline": "cam0"}'.ljust(size))
        assert (answer["ok"], answer["error"]["code"]) == (False, "BAD_PAYLOAD")
        assert answer["error"]["message"] == (
            f"the request is {size} bytes, more than the {MAX_CONTROL_BYTES} a command may be; it was not read"
        )
    assert restarted == []
    assert operator_client.ask("restart-pipeline", b'{"pipeline": "cam0"}')["result"] == {"restarted": ["cam0"]}


def test_a_command_of_a_newer_protocol_is_answered_protocol_too_new_and_not_run(
    served: Callable[..., CommandService], operator_client: Requester, operator: Ed25519PrivateKey
) -> None:
    """An operator of a newer protocol signs a restart with a member this agent does not know:
    it is answered ``PROTOCOL_TOO_NEW`` naming both protocols, never run as a restart of what
    protocol 1 would make of it; the operator's protocol 1 request after it runs."""
    restarted: list[str | None] = []
    served(actions(restart=lambda camera: restarted.append(camera) or ["cam0"]), allow_unsigned=False)
    members = {"id": "newer", "command": "restart-camera", "args": {"camera": "cam0"}, "target": "device:cam-1"}
    payload = newer_protocol(operator, "CommandRequest", PROTOCOL + 1, **members, issued_at=NOW, drain_s=30)
    answer = operator_client.ask("restart-camera", payload)
    assert (answer["ok"], answer["error"]["code"]) == (False, "PROTOCOL_TOO_NEW"), answer
    assert answer["error"]["message"] == (
        f"the restart-camera request is a protocol {PROTOCOL + 1} document; this agent reads protocol {PROTOCOL} "
        "and older: update edge-agent on this device"
    )
    assert restarted == []
    current = request(operator, "restart-camera", id="current", args={"camera": "cam0"}).to_bytes()
    assert operator_client.ask("restart-camera", current)["result"] == {"restarted": ["cam0"]}


def test_a_command_that_holds_the_thread_past_its_budget_shows_in_health(
    served: Callable[..., CommandService], operator_client: Requester
) -> None:
    """A restart that hangs (a camera that will not stop) makes the commands thread hung once it
    is the stall limit past its turn; a rollback may wait for the deployer its budget longer."""
    clock = Clock(100.0)
    entered, release = threading.Event(), threading.Event()

    def hanging(camera: str | None = None) -> list[str]:
        entered.set()
        assert release.wait(30)
        entered.clear()
        return ["cam0"]

    def hanging_rollback() -> Deployment:
        hanging()
        return no_rollback()

    service = served(actions(restart=hanging, rollback=hanging_rollback), monotonic=clock)
    stall_s = 5.0
    rollback = next(row for row in COMMAND_TABLE if row.name == "rollback")
    for name, hung_after_s in [("restart-pipeline", stall_s), ("rollback", rollback.budget_s + stall_s)]:
        release.clear()
        correlation = operator_client.send(name, b"{}")
        assert entered.wait(20), f"{name} did not start"
        clock.now += hung_after_s
        assert judge_health((), None, (service.loop(),), stall_s).ok, f"{name}: not hung yet"
        clock.now += 1.0
        health = judge_health((), None, (service.loop(),), stall_s)
        assert health.problems == ("the commands thread (MQTT commands) has not turned for 6 s",)
        release.set()
        operator_client.answer(correlation)
        wait_until(lambda: service.loop().stalled_s == 0.0, 10, "the thread to turn again")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's end is the point
def test_a_commands_thread_that_ended_shows_in_health_at_once(
    served: Callable[..., CommandService], operator_client: Requester
) -> None:
    """What no request can do, a bug can: an exception that is not an `Exception` ends the thread,
    and `Health` says so without waiting for the stall limit."""

    def exits(camera: str | None) -> list[str]:
        raise SystemExit("a bug that escapes the answer")

    service = served(actions(restart=exits))
    assert judge_health((), None, (service.loop(),), 60.0).ok
    operator_client.send("restart-pipeline", b"{}")
    wait_until(lambda: service.loop().ended is not None, 20, "the thread to end")
    health = judge_health((), None, (service.loop(),), 60.0)
    assert health.problems == (
        "the commands thread (MQTT commands) is not running: SystemExit: a bug that escapes the answer",
    )


def test_a_junk_flood_on_a_command_leaves_its_signed_requests_their_rate(
    served: Callable[..., CommandService], operator_client: Requester, keys: dict[str, Path], operator
) -> None:
    """Issue 37, item 4: 20 anonymous messages a second on ``cmd/rollback`` and none of 5 signed
    rollbacks was answered, the rate limit of the name being charged before the signature was
    checked. The clock stands still, so no bucket refills: 80 junk rollbacks, then 5 signed ones,
    in that order on one connection. Every signed one is answered; of the junk only the burst of
    the unverified bucket is, with the usual refusal, and the rest is dropped unanswered."""
    rolled: list[str] = []

    def rollback() -> Deployment:
        rolled.append("rollback")
        return no_rollback()

    service = served(actions(rollback=rollback), monotonic=Clock(100.0), allow_unsigned=False)
    flood = junk(keys, operator, "rollback") * 10
    flooded = operator_client.send_many("rollback", flood)
    signed = [request(operator, "rollback", id=f"operator-{n}").to_bytes() for n in range(5)]
    for correlation in operator_client.send_many("rollback", signed):
        answer = json.loads(operator_client.answer(correlation)[0])
        assert answer == {
            "ok": False,
            "command": "rollback",
            "error": {"code": "NO_PREVIOUS", "message": "no previous version"},
        }, answer
    assert rolled == ["rollback"] * 5, "only the signed ones reached the device"
    burst = RateLimits.UNVERIFIED.burst
    refused = [json.loads(body)["error"]["code"] for body, _ in operator_client.answers(flooded)]
    assert len(refused) == burst and set(refused) <= {"UNAUTHORIZED", "BAD_PAYLOAD"}, refused
    assert service.limits.dropped == len(flood) - burst


def test_restart_camera_and_its_old_name_restart_pipeline_both_restart_the_old_one_saying_so(
    served: Callable[..., CommandService], operator_client: Requester, caplog: pytest.LogCaptureFixture
) -> None:
    """``restart-camera`` with ``camera`` is the command; ``restart-pipeline`` and the argument
    ``pipeline`` still work for one release, the answer carrying a ``deprecated`` note and the
    log saying it at most once per window."""
    restarted: list[str | None] = []
    served(actions(restart=lambda camera: restarted.append(camera) or [camera or "cam0"]))
    new = operator_client.ask("restart-camera", b'{"camera": "cam0"}')
    assert new == {"ok": True, "command": "restart-camera", "result": {"restarted": ["cam0"]}}
    with caplog.at_level("WARNING", logger="agent.daemon.command_service"):
        for _ in range(3):
            old = operator_client.ask("restart-pipeline", b'{"pipeline": "cam0"}')
            assert (old["ok"], old["result"]) == (True, {"restarted": ["cam0"]}), old
            assert "restart-pipeline is deprecated: use restart-camera" in old["deprecated"]
            assert "pipeline is deprecated: use camera" in old["deprecated"]
    assert restarted == ["cam0"] * 4
    said = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(said) == 1, said
    alias = operator_client.ask("restart-camera", b'{"pipeline": "cam0"}')
    assert alias["result"] == {"restarted": ["cam0"]} and "use restart-camera" not in alias["deprecated"]
    both = operator_client.ask("restart-camera", b'{"camera": "cam0", "pipeline": "cam1"}')
    assert (both["ok"], both["error"]["code"]) == (False, "BAD_PAYLOAD"), both
    assert "camera" in both["error"]["message"] and "pipeline" in both["error"]["message"]
    assert restarted == ["cam0"] * 5
