"""`agent.deployment.deployer.Deployer` over a real mosquitto: a flood of refused desired documents
writes a bounded number of log lines, with how many were held back."""

from __future__ import annotations

import logging
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from testkit.broker import Broker
from testkit.control import Clock, desired, gate
from testkit.net import wait_until

from agent.bundles.installer import InstallPolicy
from agent.bundles.store import Store
from agent.config.models import AgentConfig, MqttSection
from agent.daemon.documents import deployment_payload
from agent.deployment.deployer import Deployer
from agent.hardware.board import probe
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import Topics

FLOOD = 20_000


@pytest.mark.slow
def test_20000_refused_desired_documents_write_a_few_lines_that_count_the_rest(
    tmp_path: Path, keys: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """The red team's 20,000 unsigned desired documents in 0.4 s once wrote 20,000 ERROR lines
    (and wiped the page's log ring): each is still refused, but logged once per 10 s with the
    count of those held back."""
    broker = Broker(tmp_path / "broker", extra="max_queued_messages 0\n").start()  # the broker keeps every one
    config = AgentConfig.model_validate(
        {
            "device": {"id": "cam-1"},
            "state_dir": str(tmp_path / "state"),
            "trust_keys": [str(keys["public"])],
            "operator_keys": [str(keys["operator_pub"])],
            "mqtt": {"broker": broker.url},
        }
    )
    clock = Clock(0.0)  # the deployer's monotonic clock: its log windows (no deployment starts here)
    link = MqttLink(MqttSection(broker=broker.url), "edge-agent-cam-1")
    policy = InstallPolicy.from_config(config)
    check = gate(tmp_path, keys, Clock())
    deployer = Deployer(
        config=config,
        device="cam-1",
        store=Store(config.state_dir),
        board=probe(),
        link=link,
        topics=Topics(),
        policy=policy,
        gate=check,
        on_switched=print,
        payload=deployment_payload,
        clock=clock,
    )
    flooder = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    topic = "edge/cam-1/desired"

    sent: list[mqtt.MQTTMessageInfo] = []

    def publish(payload: bytes) -> mqtt.MQTTMessageInfo:
        sent.append(flooder.publish(topic, payload, qos=1))
        return sent[-1]

    def send(payload: bytes, problem: str) -> None:
        """Publish `payload` once the broker has every message before it (paho may send a new one
        before older ones it queued), and wait until the deployer has refused it with `problem`."""
        for info in sent:
            info.wait_for_publish(60)
        publish(payload).wait_for_publish(10)
        wait_until(lambda: problem in (deployer.problem or ""), 60, problem)

    try:
        deployer.start()
        link.start()
        assert link.wait_connected(10)
        flooder.connect("127.0.0.1", broker.port)
        flooder.loop_start()
        unsigned = desired(target="device:cam-1").to_bytes()
        with caplog.at_level(logging.WARNING, logger="agent.deployment.deployer"):
            # the subscription may not be acknowledged yet: send until the first refusal shows
            wait_until(lambda: publish(unsigned) and deployer.problem, 10, "a first refusal")
            send(b'{"id": "warm-up"}', "name: Field required")  # after the ones sent until then
            clock.now = 10.0
            send(b"[1]", "Input should be an object")
            caplog.clear()
            for _ in range(FLOOD):
                publish(unsigned)
            send(b'{"id": "marker"}', "name: Field required")  # in order after the flood: all refused by now
            clock.now = 20.0  # the next line after the window counts the ones held back
            send(b"[1]", "Input should be an object")
        lines = [r for r in caplog.records if r.name == "agent.deployment.deployer"]
    finally:
        flooder.disconnect()
        flooder.loop_stop()
        deployer.stop()
        link.stop()
        broker.stop()
    assert len(lines) == 1, [r.getMessage() for r in lines[:5]]
    held = FLOOD + 1  # and the marker that waited for them
    assert lines[0].levelname == "ERROR" and f"({held} more like it not logged)" in lines[0].getMessage(), lines


def test_the_snapshot_of_a_record_carries_its_shadow_and_quality_bounded() -> None:
    """The page and /metrics read the record through `deployment_status`: the shadow's and
    probation's results as the deployment document carries them (20 classes per camera)."""
    from dataclasses import replace

    from testkit.quality_records import agreement_class, quality, shadow, shadow_camera

    from agent.bundles.record import Deployment, State
    from agent.deployment.deployer import deployment_status

    many = shadow_camera("cam0", classes=tuple(agreement_class(c, serving=c) for c in range(100)))
    record = Deployment(id="d", sha256="a" * 64, state=State.SUCCEEDED, shadow=shadow(cameras=(many,)))
    status = deployment_status(replace(record, quality=quality("blind")))
    assert status.shadow is not None and status.quality == quality("blind")
    assert [c.class_id for c in status.shadow.cameras[0].classes] == list(range(80, 100))
    assert deployment_status(replace(record, shadow=None)).shadow is None
