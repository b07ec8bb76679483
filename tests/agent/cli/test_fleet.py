"""`edge-agent fleet status`: the table and `--json` from the devices' retained documents; a
document that cannot be read is shown as unreadable and named on stderr with why. `fleet push`'s
quality options: refused naming the flag, signed into the desired document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit.broker import Broker, Watcher
from testkit.fleet import cli, publish_raw, push
from testkit.quality_records import quality, shadow
from testkit.snapshots import snapshot

from agent.bundles.record import Deployment, State
from agent.cli.main import main
from agent.daemon.documents import deployment_payload, status_payload
from agent.mqtt import protocol
from agent.mqtt.protocol import PROTOCOL


def test_fleet_status_shows_junk_as_unreadable_and_the_rest_as_reported(
    capsys: pytest.CaptureFixture[str], broker: Broker
) -> None:
    record = Deployment(id="d1", sha256="b" * 64, state=State.SUCCEEDED, name="demo", version="1.0.0")
    publish_raw(
        broker,
        [
            ("edge/good/status", status_payload(snapshot(device="good", group="lobby"))),
            ("edge/good/deployment", deployment_payload(record)),
            ("edge/junk1/status", b'{"bundle":"x"}'),
            ("edge/junk2/deployment", b'{"error":"boom"}'),
            ("edge/junk3/deployment", b'{"progress":"half"}'),
        ],
    )
    status, out = cli(capsys, "fleet", "status", "--broker", broker.url, "--listen", "5")
    assert status == 0 and "Traceback" not in out, out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("good", "junk"))}
    assert rows["good"][:6] == ["good", "online", "lobby", "demo", "1.0.0", "SUCCEEDED"]
    assert rows["junk1"][1] == "unreadable" and rows["junk2"][4] == "unreadable" and rows["junk3"][4] == "unreadable"
    assert "unreadable document on edge/junk1/status: bundle: Input should be" in out
    assert "unreadable document on edge/junk2/deployment: error: Input should be" in out
    assert "unreadable document on edge/junk3/deployment: progress: Input should be" in out

    assert main(["fleet", "status", "--broker", broker.url, "--listen", "5", "--json"]) == 0
    printed = capsys.readouterr()
    devices = json.loads(printed.out)
    assert printed.err.count("unreadable document on") == 3
    assert list(devices) == ["good"], "unreadable documents are left out of --json (and named on stderr)"
    assert devices["good"]["status"] == json.loads(status_payload(snapshot(device="good", group="lobby")))
    assert devices["good"]["deployment"] == json.loads(deployment_payload(record)), "as the device published it"


def test_fleet_status_has_a_quality_column_and_json_carries_the_results(
    capsys: pytest.CaptureFixture[str], broker: Broker
) -> None:
    rejected = Deployment(
        id="d2", sha256="c" * 64, state=State.REJECTED, name="demo", version="2.0.0", shadow=shadow("disagrees")
    )
    kept = Deployment(
        id="d2", sha256="c" * 64, state=State.SUCCEEDED, name="demo", version="2.0.0", quality=quality("kept")
    )
    publish_raw(
        broker,
        [
            ("edge/busy/status", status_payload(snapshot(device="busy", group="lobby"))),
            ("edge/busy/deployment", deployment_payload(rejected)),
            ("edge/quiet/status", status_payload(snapshot(device="quiet", group="lobby"))),
            ("edge/quiet/deployment", deployment_payload(kept)),
        ],
    )
    status, out = cli(capsys, "fleet", "status", "--broker", broker.url, "--listen", "5")
    assert status == 0, out
    lines = out.splitlines()
    at = lines[0].index("QUALITY")
    assert lines[0][at:].split()[:2] == ["QUALITY", "WAVE"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["busy"][at:].startswith("shadow disagrees 0.31<0.8  ")
    assert rows["quiet"][at:].startswith("probation kept 0.97  ")
    assert main(["fleet", "status", "--broker", broker.url, "--listen", "5", "--json"]) == 0
    devices = json.loads(capsys.readouterr().out)
    assert devices["busy"]["deployment"]["shadow"]["cameras"][0]["agreement"] == 0.31
    assert devices["quiet"]["deployment"]["quality"]["outcome"] == "kept"


@pytest.mark.parametrize(
    ("size", "refusal"), [("2m", "over a clip's 1 MiB"), ("512", "outside 1 KiB"), ("x", "not a size")]
)
def test_fleet_media_refuses_a_clip_chunk_size_out_of_range(
    capsys: pytest.CaptureFixture[str], size: str, refusal: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "fleet",
                "media",
                "dev1",
                "00ab00cd00ef0012",
                "--clip",
                "--chunk-size",
                size,
                "--broker",
                "mqtt://127.0.0.1:1",
            ]
        )
    assert exited.value.code == 2 and refusal in capsys.readouterr().err


def test_fleet_acl_home_assistant_takes_the_discovery_prefix_or_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    status, out = cli(capsys, "fleet", "acl", "--device", "cam-1", "--home-assistant", "--home-assistant-user", "hass")
    assert status == 0 and "topic write homeassistant/+/cam_1/+/config" in out and "user hass" in out
    status, out = cli(capsys, "fleet", "acl", "--device", "cam-1", "--home-assistant", "ha/disc")
    assert status == 0 and "topic read ha/disc/status" in out and "homeassistant" not in out
    status, out = cli(capsys, "fleet", "acl", "--device", "cam-1")
    assert status == 0 and "/config" not in out and "ha/+/image" not in out, "no Home Assistant rules unasked"
    status, out = cli(capsys, "fleet", "acl", "--device", "cam-1", "--home-assistant", "ha/#")
    assert status == 1 and "without wildcards" in out
    status, out = cli(capsys, "fleet", "acl", "--device", "cam-1", "--home-assistant-user", "hass")
    assert status == 1 and "needs --home-assistant" in out


def test_fleet_snapshot_names_the_camera_with_camera_and_keeps_pipeline_as_a_hidden_alias(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from agent.cli.main import build_parser

    parser = build_parser("fleet")
    common = ["fleet", "snapshot", "--target", "device:d1", "-o", "x.jpg"]
    assert parser.parse_args([*common, "--camera", "door"]).camera == "door"
    assert parser.parse_args([*common, "--pipeline", "door"]).camera == "door", "the old flag, for one release"
    with pytest.raises(SystemExit):
        parser.parse_args(["fleet", "snapshot", "--help"])
    shown = capsys.readouterr().out
    assert "--camera" in shown and "--pipeline" not in shown


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (
            ["--shadow", "20s", "--min-agreement", "1.5"],
            "argument --min-agreement: expected a number within 0..1, got 1.5",
        ),
        (["--shadow", "0"], "argument --shadow: duration '0' must be above 0"),
        (["--shadow", "20s", "--shadow-max", "2d"], "argument --shadow-max: duration '2d' must be above 0"),
        (["--min-detection-ratio", "-0.1"], "argument --min-detection-ratio: expected a number within 0..1, got -0.1"),
        (["--probation-agreement", "1.5"], "argument --probation-agreement: expected a number within 0..1, got 1.5"),
        (["--shadow", "20s", "--shadow-mode", "strict"], "argument --shadow-mode: invalid choice: 'strict'"),
        (["--shadow", "20s", "--shadow-frames", "0"], "argument --shadow-frames: 0 frames is outside"),
    ],
)
def test_fleet_push_refuses_bad_quality_options_naming_the_flag(
    capsys: pytest.CaptureFixture[str], bundles: dict[str, Path], flags: list[str], refusal: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["fleet", "push", str(bundles["v1"]), "--target", "device:d", "--broker", "mqtt://127.0.0.1:1", *flags])
    assert exited.value.code == 2 and refusal in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--shadow-mode", "report"], "--shadow-mode shapes a shadow: add --shadow DURATION"),
        (["--min-agreement", "0.9"], "--min-agreement shapes a shadow"),
        (["--shadow", "1m", "--shadow-max", "30s"], "--shadow-max: max_s (30) is shorter than duration_s (60)"),
    ],
)
def test_fleet_push_refuses_a_shadow_option_without_a_shadow(
    capsys: pytest.CaptureFixture[str], bundles: dict[str, Path], flags: list[str], refusal: str
) -> None:
    status, out = cli(
        capsys, "fleet", "push", str(bundles["v1"]), "--target", "device:d", "--broker", "mqtt://127.0.0.1:1", *flags
    )
    assert status == 1 and refusal in out and "Traceback" not in out, out


def test_fleet_push_signs_the_shadow_and_the_quality_threshold(
    capsys: pytest.CaptureFixture[str], broker: Broker, watcher: Watcher, bundles: dict[str, Path], operator_key: Path
) -> None:
    flags = ("--shadow", "2m", "--shadow-frames", "900", "--min-agreement", "0.85", "--shadow-mode", "report")
    deployment = push(
        capsys, broker, bundles["v1"], "device:d", *flags, "--shadow-quiet", "fail", "--min-detection-ratio", "0.6",
        "--probation-agreement", "0.7",
    )  # fmt: skip
    document = watcher.wait_json("edge/d/desired", lambda d: d["id"] == deployment, 30)
    assert document["shadow"] == {
        "duration_s": 120.0,
        "frames": 900,
        "min_agreement": 0.85,
        "mode": "report",
        "quiet": "fail",
    }
    assert document["quality"] == {"min_ratio": 0.6, "min_agreement": 0.7} and "signature" in document
    plain = push(capsys, broker, bundles["v1"], "device:d")
    assert watcher.wait_json("edge/d/desired", lambda d: d["id"] == plain, 30).get("shadow") is None


def _status(device: str, version: str, group: str | None = "lobby", protocol: int | None = PROTOCOL) -> bytes:
    """A device's status as an agent of `version` publishes it (`protocol` None: one before 0.2.0)."""
    sent = json.loads(status_payload(snapshot(device=device, group=group, agent_version=version)))
    return json.dumps(
        {k: v for k, v in sent.items() if k != "protocol"} | ({"protocol": protocol} if protocol else {})
    ).encode()


def test_fleet_status_shows_each_devices_version_and_filters_by_it(
    capsys: pytest.CaptureFixture[str], broker: Broker
) -> None:
    """The VERSION column is the status' agent version; ``--version-filter`` compares by SemVer
    (0.10.0 is above 0.2.0), for the table and ``--json``; a device of unknown version (the will
    of an agent before 0.2.0) matches no filter and is named on stderr; a bad filter is refused."""
    publish_raw(
        broker,
        [
            ("edge/old/status", _status("old", "0.1.0", protocol=None)),
            ("edge/cur/status", _status("cur", "0.2.0")),
            ("edge/next/status", _status("next", "0.10.0")),
            ("edge/gone/status", b'{"state": "offline", "device": "gone"}'),
        ],
    )
    base = ("fleet", "status", "--broker", broker.url, "--listen", "5")
    status, out = cli(capsys, *base)
    lines = out.splitlines()
    assert status == 0 and lines[0].split()[-1] == "VERSION", out
    versions = {line.split()[0]: line.split()[-1] for line in lines[1:]}
    assert versions == {"cur": "0.2.0", "gone": "-", "next": "0.10.0", "old": "0.1.0"}
    status, out = cli(capsys, *base, "--version-filter", "<0.2.0")
    assert status == 0 and [line.split()[0] for line in out.splitlines()[1:] if "left out" not in line] == ["old"]
    assert (
        "left out 1 device(s) of unknown version (no readable status, or an agent before 0.2.0 that is "
        "offline): gone" in out
    )
    assert main([*base, "--version-filter", ">=0.2.0", "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)) == ["cur", "next"]
    with pytest.raises(SystemExit) as refused:
        main([*base, "--version-filter", "<0.2"])
    assert refused.value.code == 2 and "'0.2' in '<0.2' is not a SemVer version" in capsys.readouterr().err


def test_fleet_push_and_commands_say_which_devices_are_too_old_for_the_protocol_they_write(
    capsys: pytest.CaptureFixture[str],
    broker: Broker,
    watcher: Watcher,
    bundles: dict[str, Path],
    operator_key: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An operator's CLI of protocol 2 (this one, its protocol raised) writes ``protocol: 2``
    inside what it signs and names each target whose status reads an older protocol (an agent
    before 0.2.0 names none: 1); a group still gets the document, a single device that is too
    old gets nothing."""
    monkeypatch.setattr(protocol, "PROTOCOL", 2)
    publish_raw(
        broker,
        [
            ("edge/old/status", _status("old", "0.1.0", protocol=None)),
            ("edge/cur/status", _status("cur", "0.2.0", protocol=1)),
            ("edge/next/status", _status("next", "0.3.0", protocol=2)),
        ],
    )
    status, out = cli(capsys, "fleet", "push", str(bundles["v1"]), "--target", "group:lobby", "--broker", broker.url)
    assert status == 0, out
    deployment = out.split(" as deployment ")[1].split()[0]
    document = watcher.wait_json("edge/groups/lobby/desired", lambda d: d["id"] == deployment, 30)
    assert document["protocol"] == 2 and "signature" in document
    assert "edge-agent: old runs edge-agent 0.1.0, which reads control documents of protocol 1 and older" in out
    assert "edge-agent: cur runs edge-agent 0.2.0, which reads control documents of protocol 1" in out
    assert "next runs" not in out
    for args in (("rollback", "--target", "device:cur"), ("release", "--target", "device:old")):
        status, out = cli(capsys, "fleet", *args, "--broker", broker.url)
        assert status == 1 and f"nothing sent to {args[-1][7:]}: it is too old for a protocol 2 document" in out, out
    watcher.sync("edge/sync")
    assert watcher.json("edge/cur/cmd/rollback") is None and watcher.json("edge/old/desired") is None


@pytest.mark.parametrize(
    ("which", "flags", "refusal"),
    [
        (
            "agent",
            [],
            "WRONG_BUNDLE_KIND: this is an agent bundle (edge-agent 0.3.0), not a model bundle: push it with",
        ),
        ("model", ["--agent"], "WRONG_BUNDLE_KIND: this is a model bundle, not an agent bundle (kind: agent)"),
        ("agent", ["--agent", "--shadow", "20s"], "an agent bundle has no shadow or quality check"),
    ],
)
def test_fleet_push_says_which_kind_of_bundle_it_was_given_before_connecting(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    keys: dict[str, Path],
    bundles: dict[str, Path],
    which: str,
    flags: list[str],
    refusal: str,
) -> None:
    from agent.bundles.agent_bundle import build_agent_bundle
    from agent.bundles.signing import load_private_key

    wheel = tmp_path / "edge_agent-0.3.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    agent = build_agent_bundle([wheel], tmp_path / "agent.bundle", load_private_key(keys["private"]))
    assert agent.version == "0.3.0"
    bundle = tmp_path / "agent.bundle" if which == "agent" else bundles["v1"]
    status, out = cli(
        capsys, "fleet", "push", str(bundle), "--target", "device:d", "--broker", "mqtt://127.0.0.1:1", *flags
    )
    assert status == 1 and refusal in out and "Traceback" not in out, out
