"""`agent.fleet.push`: the hashes a push publishes are the ones the device checks; following a
push reads the devices' records, showing junk as unreadable."""

from __future__ import annotations

import hashlib
from pathlib import Path

from testkit.broker import Broker
from testkit.bundles import read_files, write_tar
from testkit.fleet import publish_raw
from testkit.transfer import DATA

from agent.bundles.installer import InstallPolicy, install
from agent.bundles.record import Deployment, State
from agent.bundles.signing import load_public_key
from agent.bundles.store import Store
from agent.config.models import MqttSection
from agent.daemon.documents import deployment_payload
from agent.fleet.client import connect
from agent.fleet.push import follow, push
from agent.hardware.board import probe
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


def test_a_gzip_bundle_is_pushed_as_install_accepts_it(tmp_path: Path, broker: Broker, keys, bundles) -> None:
    """`fleet push` read the manifest with a plain-tar reader, refusing the gzip bundles that
    `bundle inspect`, `verify` and `install` accept (issue 29, 12)."""
    gz = write_tar(tmp_path / "demo.bundle.tgz", read_files(bundles["v1"]), gz=True)
    link = connect(MqttSection(broker=broker.url))
    try:
        desired = push(link, Topics(), gz, "device:dev1", timeout=30.0)
    finally:
        link.stop()
    assert (desired.name, desired.version) == ("demo", "1.0.0")
    assert desired.sha256 == hashlib.sha256(gz.read_bytes()).hexdigest()
    installed = install(
        gz, Store(tmp_path / "state"), probe(), InstallPolicy(trusted=[load_public_key(keys["public"])])
    )
    assert installed.state is State.SUCCEEDED, installed.error
