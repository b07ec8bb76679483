"""`agent.mqtt.device_documents`: a number that is not finite makes a document unreadable, on the
operator's side, and the device's encoder never writes one."""

from __future__ import annotations

import json
import math

import pytest
from testkit.broker import Broker
from testkit.fleet import cli, publish_raw

from agent.mqtt.device_documents import DeploymentDocument, StatusDocument, Unreadable

TOPIC = "edge/dev9/status"


@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e999"])
def test_a_status_with_a_number_that_is_not_finite_is_unreadable(number: str) -> None:
    payload = f'{{"state": "online", "device": "dev9", "fps": {number}}}'.encode()
    read = StatusDocument.read(payload, TOPIC)
    assert read == Unreadable(TOPIC, f"{number} is not a finite number")
    fine = StatusDocument.read(b'{"state": "online", "device": "dev9", "fps": 1e3}', TOPIC)
    assert isinstance(fine, StatusDocument) and fine.fps == 1000.0


def test_a_deployment_record_with_an_infinite_time_is_unreadable() -> None:
    payload = (
        b'{"id": "d", "sha256": "'
        + b"ab" * 32
        + b'", "state": "QUEUED", "history": [{"state": "QUEUED", "ts": Infinity}]}'
    )
    assert DeploymentDocument.read(payload, "edge/dev9/deployment") == Unreadable(
        "edge/dev9/deployment", "Infinity is not a finite number"
    )


def test_the_devices_encoder_writes_a_value_that_is_not_finite_as_null() -> None:
    payload = StatusDocument(state="online", device="dev9", fps=math.inf, temperature_c=math.nan).to_bytes()
    document = json.loads(payload, parse_constant=lambda name: pytest.fail(f"{name} in {payload!r}"))
    assert (document["fps"], document["temperature_c"]) == (None, None)


def test_fleet_status_shows_an_infinite_status_as_unreadable(capsys, broker: Broker) -> None:
    """`fleet status` once crashed (OverflowError) on a retained status with ``Infinity``."""
    publish_raw(broker, [(TOPIC, b'{"state": "online", "device": "dev9", "fps": Infinity, "ts": 1e999}')])
    status, out = cli(capsys, "fleet", "status", "--broker", broker.url)
    assert status == 0, out
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["dev9"])
    assert row[1] == "unreadable", out
    assert f"unreadable document on {TOPIC}: Infinity is not a finite number" in out and "Traceback" not in out
