"""`agent.fleet.enrolments` with `agent.mqtt.enrol_device`, over a real mosquitto with the dynamic
security plugin loaded: a claim-only device enrols after approval and is held to its own topics;
forged, replayed, expired and duplicate-id requests get nothing; retire revokes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from testkit.broker import DYNSEC_OPERATOR, Broker, dynsec_broker

from agent.config.models import AgentConfig, MqttSection
from agent.errors import ErrorCode
from agent.fleet.client import connect, publish_retained, wait_acked
from agent.fleet.enrolments import Dynsec, approve, create_claim, deny, dynsec_acls, requests, retire
from agent.mqtt.enrol_device import enrol
from agent.mqtt.enrolment import (
    Claim,
    DeviceKeys,
    EnrolAnswer,
    EnrolRefused,
    EnrolRequest,
    Hardware,
    enrol_topics,
    make_request,
    pem,
)
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import Topics
from pipelines.worker import Worker

NOW = 1_800_000_000.0
TOPICS = Topics()
HARDWARE = Hardware(board="Raspberry Pi 5 Model B", serial="10000000abcdef", mac="d8:3a:dd:00:00:01")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    started = dynsec_broker(tmp_path / "broker")
    yield started
    started.stop()


@pytest.fixture
def admin(broker: Broker) -> Iterator[MqttLink]:
    user, password = DYNSEC_OPERATOR
    link = connect(MqttSection(broker=broker.url, username=user, password={"value": password}))  # type: ignore[arg-type]
    yield link
    link.stop()


KEY = Ed25519PrivateKey.generate()


def new_claim(admin: MqttLink, broker: Broker, expires_at: float = NOW + 3600, name: str = "line-1") -> Claim:
    return create_claim(Dynsec(admin), TOPICS, name, broker.url, [pem(KEY.public_key())], expires_at, "yard")


class Device:
    """`enrol` in a thread of its own (a `Worker.once`), as `edge-agent enrol` waits for its answer."""

    def __init__(self, folder: Path, claim: Claim, device_id: str = "cam-1", clock: float = NOW) -> None:
        self.folder, self.config = folder, folder / "agent.yaml"
        self.requested = threading.Event()
        self.request: EnrolRequest | None = None
        self.outcome: EnrolAnswer | Exception | None = None

        def on_request(request: EnrolRequest) -> None:
            self.request = request
            self.requested.set()

        def job() -> None:
            try:
                self.outcome = enrol(
                    claim, folder / "state", self.config, device_id, None, HARDWARE, 60, lambda: clock, on_request
                )
            except Exception as exc:
                self.outcome = exc

        self.worker = Worker.once(f"enrol-{device_id}", job, described="a device's enrolment").start()
        assert self.requested.wait(30), "the device published no request"

    def result(self) -> EnrolAnswer | Exception | None:
        self.worker.join(60)
        return self.outcome

    @property
    def request_id(self) -> str:
        assert self.request is not None
        return self.request.request_id


def device_link(config_path: Path) -> MqttLink:
    """A link with the credentials `enrol` wrote into agent.yaml, its client id as the daemon picks it."""
    config = AgentConfig.model_validate(yaml.safe_load(config_path.read_text()))
    assert config.mqtt is not None
    return MqttLink(config.mqtt, config.mqtt.client_id or f"edge-agent-{config.device_id()}").start()


def refusal(publish: Any) -> str | None:
    assert publish.wait(10)
    return publish.refused  # type: ignore[no-any-return]


def test_a_claim_only_device_enrols_after_approval_and_then_uses_only_its_own_topics(
    tmp_path: Path, broker: Broker, admin: MqttLink
) -> None:
    claim_file = tmp_path / "claim.yaml"
    claim_file.write_text(yaml.safe_dump(new_claim(admin, broker).model_dump(mode="json")))
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/agent.yaml").write_text(
        "mqtt: {broker: 'mqtt://old', client_id: mine}\ncameras: [{source: synthetic}]\n"
    )
    device = Device(tmp_path / "dev", Claim.load(claim_file))
    seen = requests(admin, TOPICS, 5)
    assert [(p.request_id, p.answered) for p in seen] == [(device.request_id, False)]  # pending, no credentials yet
    assert seen[0].request is not None and seen[0].request.hardware == HARDWARE
    approve(admin, Dynsec(admin), TOPICS, device.request_id, KEY, NOW)
    answer = device.result()
    assert isinstance(answer, EnrolAnswer) and answer.device_id == "cam-1"
    config = yaml.safe_load(device.config.read_text())
    assert config["device"] == {"id": "cam-1", "group": "yard"} and config["mqtt"]["username"] == "cam-1"
    assert config["cameras"] == [{"source": "synthetic"}]  # the rest of agent.yaml kept
    assert "password" not in device.config.read_text() or config["mqtt"]["password"].keys() == {"file"}
    for secret in ("device.key", "box.key", "mqtt.password"):
        assert (tmp_path / "dev/state/enrol" / secret).stat().st_mode & 0o777 == 0o600
    link = device_link(device.config)
    try:
        assert link.wait_connected(10), link.last_error
        assert refusal(link.publish(TOPICS.status("cam-1"), b"{}", qos=1)) is None
        assert refusal(link.publish(TOPICS.status("cam-2"), b"{}", qos=1)) is not None  # another device's
        got = threading.Event()
        link.subscribe(TOPICS.desired("cam-1"), lambda message: got.set()).wait(10)
        wait_acked([publish_retained(admin, TOPICS.desired("cam-1"), b"{}")], admin, 10)
        assert got.wait(10), "the device cannot read its own desired document"
    finally:
        link.stop()


def test_a_forged_request_gets_nothing(tmp_path: Path, broker: Broker, admin: MqttLink) -> None:
    claim = new_claim(admin, broker)
    signed = make_request(DeviceKeys.load_or_make(tmp_path), claim, "cam-1", HARDWARE, NOW)
    forged = signed.model_copy(update={"device_id": "cam-9"})  # changed after signing
    wait_acked(
        [publish_retained(admin, enrol_topics(TOPICS, "line-1", forged.request_id)[0], forged.to_bytes())], admin, 10
    )
    with pytest.raises(EnrolRefused) as refused:
        approve(admin, Dynsec(admin), TOPICS, forged.request_id, KEY, NOW)
    assert refused.value.code == ErrorCode.ENROL_FORGED
    assert Dynsec(admin).client("cam-9") is None


def test_expired_requests_and_claims_get_nothing(tmp_path: Path, broker: Broker, admin: MqttLink) -> None:
    claim = new_claim(admin, broker, expires_at=NOW + 3600)
    old = Device(tmp_path / "old", claim, clock=NOW - 2 * 24 * 3600)  # its request is two days old
    with pytest.raises(EnrolRefused) as refused:
        approve(admin, Dynsec(admin), TOPICS, old.request_id, KEY, NOW)
    assert refused.value.code == ErrorCode.ENROL_EXPIRED
    deny(admin, TOPICS, old.request_id, KEY, NOW, "expired")
    fresh = Device(tmp_path / "fresh", claim, device_id="cam-2")
    with pytest.raises(EnrolRefused) as refused:
        approve(admin, Dynsec(admin), TOPICS, fresh.request_id, KEY, NOW + 3600)  # the claim has just expired
    assert refused.value.code == ErrorCode.ENROL_EXPIRED
    deny(admin, TOPICS, fresh.request_id, KEY, NOW, "expired")
    assert Dynsec(admin).client("cam-1") is None and Dynsec(admin).client("cam-2") is None
    for device in (old, fresh):
        outcome = device.result()
        assert isinstance(outcome, EnrolRefused) and outcome.code == ErrorCode.ENROL_DENIED
        assert not device.config.exists()
    with pytest.raises(EnrolRefused, match="expired"):
        enrol(claim, tmp_path / "late", tmp_path / "late.yaml", "cam-3", None, HARDWARE, 1, lambda: NOW + 3600)


def test_two_devices_asking_for_one_id_do_not_both_get_it(tmp_path: Path, broker: Broker, admin: MqttLink) -> None:
    claim = new_claim(admin, broker)
    first, second = Device(tmp_path / "a", claim), Device(tmp_path / "b", claim)
    approve(admin, Dynsec(admin), TOPICS, first.request_id, KEY, NOW)
    with pytest.raises(EnrolRefused) as refused:
        approve(admin, Dynsec(admin), TOPICS, second.request_id, KEY, NOW)
    assert refused.value.code == ErrorCode.ENROL_TAKEN
    assert isinstance(first.result(), EnrolAnswer)
    outcome = second.result()  # told so, signed: it stops waiting
    assert isinstance(outcome, EnrolRefused) and outcome.code == ErrorCode.ENROL_DENIED and "taken" in str(outcome)
    assert not (tmp_path / "b" / "agent.yaml").exists()


def test_retire_revokes_and_a_replayed_request_gets_nothing_after(
    tmp_path: Path, broker: Broker, admin: MqttLink
) -> None:
    device = Device(tmp_path / "dev", new_claim(admin, broker))
    approve(admin, Dynsec(admin), TOPICS, device.request_id, KEY, NOW)
    assert isinstance(device.result(), EnrolAnswer)
    retire(Dynsec(admin), "cam-1")
    link = device_link(device.config)
    try:
        assert link.wait_attempted(10) and not link.connected, "a retired device still connects"
    finally:
        link.stop()
    with pytest.raises(EnrolRefused) as refused:  # its request, still on the broker, approved again
        approve(admin, Dynsec(admin), TOPICS, device.request_id, KEY, NOW)
    assert refused.value.code == ErrorCode.ENROL_REPLAYED
    assert Dynsec(admin).client("cam-1") is None


def test_a_device_cannot_ask_for_another_group_than_its_claim_s(
    tmp_path: Path, broker: Broker, admin: MqttLink
) -> None:
    claim = new_claim(admin, broker)  # for the group yard
    request = make_request(DeviceKeys.load_or_make(tmp_path), claim, "cam-1", HARDWARE, NOW, group="prod")
    topic = enrol_topics(TOPICS, "line-1", request.request_id)[0]
    wait_acked([publish_retained(admin, topic, request.to_bytes())], admin, 10)
    with pytest.raises(EnrolRefused, match="its claim is for yard"):
        approve(admin, Dynsec(admin), TOPICS, request.request_id, KEY, NOW)
    assert Dynsec(admin).client("cam-1") is None


@pytest.mark.parametrize(
    ("line", "types"),
    [
        ("topic read edge/a", {"subscribePattern", "publishClientReceive"}),
        ("topic write edge/a", {"publishClientSend"}),
        ("topic readwrite edge/a", {"subscribePattern", "publishClientReceive", "publishClientSend"}),
        ("# a comment", set()),
    ],
)
def test_an_acl_line_grants_the_plugin_types_of_its_access(line: str, types: set[str]) -> None:
    # fails on: readwrite granting only the read types (it once added them twice and never send)
    acls = dynsec_acls(line)
    assert {a["acltype"] for a in acls} == types and len(acls) == len(types)
    assert all(a["topic"] == "edge/a" and a["allow"] is True for a in acls)
