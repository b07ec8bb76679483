"""`agent.fleet.push`: the hashes a push publishes are the ones the device checks; following a
push reads the devices' records, showing junk as unreadable."""

from __future__ import annotations

import hashlib

from testkit.broker import Broker
from testkit.fleet import publish_raw
from testkit.transfer import DATA

from agent.bundles.record import Deployment, State
from agent.config.models import MqttSection
from agent.daemon.documents import deployment_payload
from agent.fleet.client import connect
from agent.fleet.push import follow
from agent.mqtt.device_documents import DeploymentDocument, Unreadable
from agent.mqtt.protocol import ChunkIndex, Topics


def test_hashes_match_what_the_fleet_publishes() -> None:
    index = ChunkIndex.of(DATA, 30000)
    assert index.sha256 == hashlib.sha256(DATA).hexdigest()
    assert index.chunks[-1] == hashlib.sha256(DATA[90000:]).hexdigest()


def test_follow_shows_a_junk_record_as_unreadable_until_the_device_writes_its_own(broker: Broker) -> None:
    topics = Topics()
    succeeded = Deployment(id="d1", sha256="b" * 64, state=State.SUCCEEDED, name="demo", version="1.0.0")
    publish_raw(
        broker,
        [
            (topics.deployment("dev1"), b'{"progress":"half"}'),
            (topics.deployment("dev2"), deployment_payload(succeeded)),
        ],
    )
    link = connect(MqttSection(broker=broker.url))
    try:
        records = follow(link, topics, ["dev1", "dev2"], "d1", timeout=1.0)
        junk, done = records["dev1"], records["dev2"]
        assert isinstance(junk, Unreadable) and junk.topic == "edge/dev1/deployment" and "progress" in junk.problem
        assert isinstance(done, DeploymentDocument) and done.state is State.SUCCEEDED
        publish_raw(broker, [(topics.deployment("dev1"), deployment_payload(succeeded))])
        records = follow(link, topics, ["dev1", "dev2"], "d1", timeout=30.0)
        assert all(isinstance(r, DeploymentDocument) and r.state is State.SUCCEEDED for r in records.values())
    finally:
        link.stop()
