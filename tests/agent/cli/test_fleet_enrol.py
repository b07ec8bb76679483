"""`edge-agent fleet enrol claim|list|approve` and `fleet retire` with a device's `edge-agent
enrol`, over a real mosquitto with the dynamic security plugin loaded."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from testkit.broker import DYNSEC_OPERATOR, Broker, dynsec_broker
from testkit.net import wait_until

from agent.bundles.signing import generate_keypair
from agent.cli.fleet_enrol import fleet_enrol
from agent.cli.main import main
from agent.mqtt.enrolment import MAX_CLAIM_BYTES, Claim, EnrolRefused
from agent.mqtt.protocol import Topics
from pipelines.worker import Worker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    started = dynsec_broker(tmp_path / "broker")
    yield started
    started.stop()


def operator(broker: Broker, *words: str) -> list[str]:
    return [
        "fleet",
        *words,
        "--broker",
        broker.url,
        "--username",
        DYNSEC_OPERATOR[0],
        "--password-env",
        "DYNSEC_PASSWORD",
    ]


def test_an_operator_makes_a_claim_approves_its_device_and_retires_it(
    tmp_path: Path, broker: Broker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNSEC_PASSWORD", DYNSEC_OPERATOR[1])
    key, _ = generate_keypair(tmp_path / "operator")
    _, bundles_pub = generate_keypair(tmp_path / "bundles")
    claim = tmp_path / "claim.json"
    assert (
        main(
            [
                *operator(broker, "enrol", "claim", "site-a", "--expires", "7d", "--group", "yard"),
                "--key",
                str(key),
                "--out",
                str(claim),
            ]
        )
        == 0
    )
    assert claim.stat().st_mode & 0o777 == 0o600 and Claim.load(claim).group == "yard"
    device = tmp_path / "device"
    words = ["enrol", "--claim", str(claim), "--state-dir", str(device), "--config", str(device / "agent.yaml")]
    outcome: list[int] = []
    worker = Worker.once(
        "enrol", lambda: outcome.append(main([*words, "--device-id", "cam-7", "--wait", "60"])), described="enrol"
    )
    worker.start()

    def waiting() -> list[dict[str, object]] | None:
        capsys.readouterr()
        main([*operator(broker, "enrol", "list", "--json"), "--listen", "1"])
        rows: list[dict[str, object]] = json.loads(capsys.readouterr().out)
        return rows or None

    rows = wait_until(waiting, 30, "the request to be listed")
    assert rows[0]["device"] == "cam-7" and rows[0]["answered"] is False
    approve = operator(broker, "enrol", "approve", str(rows[0]["request"]), "--trust-key", str(bundles_pub))
    assert main([*approve, "--key", str(key)]) == 0
    assert worker.join(60) and outcome == [0]
    config = yaml.safe_load((device / "agent.yaml").read_text())
    assert [Path(p).read_text() for p in config["trust_keys"]] == [bundles_pub.read_text()]
    assert config["device"] == {"id": "cam-7", "group": "yard"}
    assert main(operator(broker, "retire", "cam-7")) == 0
    assert "retired cam-7" in capsys.readouterr().out


def test_a_signed_policy_approves_a_device_without_a_person(
    tmp_path: Path, broker: Broker, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNSEC_PASSWORD", DYNSEC_OPERATOR[1])
    key, _ = generate_keypair(tmp_path / "operator")
    claim, policy = tmp_path / "claim.json", tmp_path / "policy.json"
    made = main(
        [*operator(broker, "enrol", "claim", "site-a", "--expires", "1d"), "--key", str(key), "--out", str(claim)]
    )
    words = ["enrol", "policy", "site-a", "--serial", "*", "--count", "1", "--expires", "1d", "--out", str(policy)]
    assert made == 0 and main(["fleet", *words, "--key", str(key)]) == 0
    device = tmp_path / "device"
    words = ["enrol", "--claim", str(claim), "--state-dir", str(device), "--config", str(device / "agent.yaml")]
    outcome: list[int] = []
    worker = Worker.once(
        "enrol", lambda: outcome.append(main([*words, "--device-id", "cam-8", "--wait", "60"])), described="enrol"
    )
    worker.start()
    auto = [*operator(broker, "enrol", "auto", "--policy", str(policy), "--once"), "--key", str(key), "--listen", "1"]

    def approved() -> bool:
        capsys.readouterr()
        assert main(auto) == 0
        return "approved" in capsys.readouterr().out

    wait_until(approved, 30, "the policy to approve the device")
    assert worker.join(60) and outcome == [0]
    assert yaml.safe_load((device / "agent.yaml").read_text())["device"] == {"id": "cam-8"}


def test_enrol_list_prints_the_waiting_requests_only(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(enrol_command="list", listen=0.0, all=False, json=False)
    assert fleet_enrol(args, None, Topics()) == 0  # type: ignore[arg-type]  # --listen 0 reads nothing
    assert capsys.readouterr().out == "no requests waiting\n"


def test_a_claim_file_is_bounded_and_checked_before_it_is_used(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * MAX_CLAIM_BYTES)
    with pytest.raises(EnrolRefused, match="larger than"):
        Claim.load(big)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "broker": "mqtt://b",
                "claim": "c",
                "username": "u",
                "password": "p",
                "operator_keys": ["nope"],
                "expires_at": 1,
            }
        )
    )
    with pytest.raises(EnrolRefused, match="not a PEM public key"):
        Claim.load(bad)
