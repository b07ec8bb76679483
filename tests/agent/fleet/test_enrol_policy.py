"""`agent.fleet.enrol_policy`: a signed policy approves the matching requests of its claim, up
to its count and until it expires, over a real mosquitto with the dynamic security plugin; an
edited policy file is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from testkit.broker import DYNSEC_OPERATOR, Broker, dynsec_broker

from agent.config.models import MqttSection
from agent.errors import ErrorCode
from agent.fleet.client import connect, publish_retained, wait_acked
from agent.fleet.enrol_policy import EnrolPolicy, auto_approve, load_policy, sign_policy
from agent.fleet.enrolments import Dynsec, create_claim
from agent.mqtt.enrolment import Claim, DeviceKeys, EnrolRefused, Hardware, enrol_topics, make_request, pem
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import Topics

NOW = 1_800_000_000.0
TOPICS = Topics()
KEY = Ed25519PrivateKey.generate()
#: what the device side reads of the claim `create_claim` made (only its name and group matter here)
CLAIM = Claim(
    broker="mqtt://127.0.0.1:1",
    claim="line-1",
    username="claim-line-1",
    password="-",
    operator_keys=[pem(KEY.public_key())],
    expires_at=NOW + 7200,
)
POLICY = EnrolPolicy(
    claim="line-1", boards=["Raspberry Pi 5*"], serials=["1000*"], count=2, expires_at=NOW + 3600, issued_at=NOW
)


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[MqttLink]:
    broker: Broker = dynsec_broker(tmp_path / "broker")
    user, password = DYNSEC_OPERATOR
    link = connect(MqttSection(broker=broker.url, username=user, password={"value": password}))  # type: ignore[arg-type]
    create_claim(Dynsec(link), TOPICS, "line-1", broker.url, [pem(KEY.public_key())], NOW + 7200, None)
    yield link
    link.stop()
    broker.stop()


def ask(admin: MqttLink, folder: Path, device: str, board: str, serial: str, at: float = NOW) -> str:
    """`device`'s signed request, published on the claim's topic as the device would."""
    hardware = Hardware(board=board, serial=serial, mac="d8:3a:dd:00:00:01")
    request = make_request(DeviceKeys.load_or_make(folder / device), CLAIM, device, hardware, at)
    topic = enrol_topics(TOPICS, "line-1", request.request_id)[0]
    wait_acked([publish_retained(admin, topic, request.to_bytes())], admin, 10)
    return request.request_id


def test_a_policy_approves_matching_requests_up_to_its_count(tmp_path: Path, admin: MqttLink) -> None:
    ask(admin, tmp_path, "cam-1", "Raspberry Pi 5 Model B Rev 1.0", "10000000aa", NOW)
    ask(admin, tmp_path, "cam-2", "NVIDIA Jetson Orin Nano", "10000000bb", NOW + 1)  # another board
    ask(admin, tmp_path, "cam-3", "Raspberry Pi 5 Model B Rev 1.0", "20000000cc", NOW + 2)  # another serial
    ask(admin, tmp_path, "cam-4", "Raspberry Pi 5 Model B Rev 1.0", "10000000dd", NOW + 3)
    ask(admin, tmp_path, "cam-5", "Raspberry Pi 5 Model B Rev 1.0", "10000000ee", NOW + 4)  # one too many
    outcomes = auto_approve(admin, Dynsec(admin), TOPICS, POLICY, KEY, NOW + 10)
    assert {o.device: o.approved for o in outcomes} == {
        "cam-1": True,
        "cam-2": False,
        "cam-3": False,
        "cam-4": True,
        "cam-5": False,
    }
    dynsec = Dynsec(admin)
    assert [d for d in ("cam-1", "cam-2", "cam-3", "cam-4", "cam-5") if dynsec.client(d)] == ["cam-1", "cam-4"]
    assert auto_approve(admin, dynsec, TOPICS, POLICY, KEY, NOW + 10)[-1].why == "the policy's 2 used"  # a new pass


def test_an_expired_policy_approves_nothing(tmp_path: Path, admin: MqttLink) -> None:
    ask(admin, tmp_path, "cam-1", "Raspberry Pi 5 Model B Rev 1.0", "10000000aa")
    outcomes = auto_approve(admin, Dynsec(admin), TOPICS, POLICY, KEY, POLICY.expires_at)
    assert [o.approved for o in outcomes] == [False] and Dynsec(admin).client("cam-1") is None


def test_only_a_policy_an_operator_key_signed_is_read(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text(sign_policy(POLICY, KEY).model_dump_json())
    assert load_policy(path, [KEY.public_key()]) == sign_policy(POLICY, KEY)
    edited = json.loads(path.read_text()) | {"count": 1000}
    path.write_text(json.dumps(edited))
    with pytest.raises(EnrolRefused) as refused:
        load_policy(path, [KEY.public_key()])
    assert refused.value.code == ErrorCode.ENROL_FORGED
    path.write_text(sign_policy(POLICY, Ed25519PrivateKey.generate()).model_dump_json())  # another key's
    with pytest.raises(EnrolRefused, match="not signed by a key given"):
        load_policy(path, [KEY.public_key()])
