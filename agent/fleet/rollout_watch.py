"""Staged rollouts on the operator's side: the staging a push asks for, the tally of a rollout,
the watch that halts it past its failure limit, and halting and resuming it by hand.

The rollout lives in the group's retained desired document (agent/mqtt/rollout_schedule.py): devices
start when their wave opens whether or not any operator process runs. `watch` follows the
devices' ``deployment`` records and statuses (to know the group's members) and, once failures
among the devices that started exceed the schedule's `max_failures`, publishes the halt: the
same document signed again with `halted` set. A halt or resume is always a newly signed document
with a later `issued_at`, so each device's gate keeps refusing the older ones.

Who counts: with the fleet's list (`FleetList`: the ``ID[:GROUP]`` file `fleet acl` reads,
``--devices-file``), the group is the listed devices of that group (and listed devices without a
group that report it); a status or record of any other device is ignored and named in the tally
(`ignored`), so reports forged for a device that does not exist can neither halt a rollout nor
complete it. Without a list every device that reports the group counts, which only the broker's
ACL (a device writes only its own topics) makes trustworthy (docs/security.md).

The devices' documents are read into their models (agent/mqtt/device_documents.py); a record
that cannot be read is named in the tally (`unreadable`) and counts as not started, so it can
neither halt a rollout nor let it complete. `tally` is pure; `watch` runs in the caller's thread
(paho's network thread only files the messages it receives under a condition).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.bundles.record import FINAL_STATES, State
from agent.errors import ErrorCode
from agent.fleet.acl import parse_devices
from agent.fleet.client import FleetError, collect, publish_retained, wait_acked
from agent.fleet.state import quality_text
from agent.mqtt.control import sign
from agent.mqtt.device_documents import DeploymentDocument, StatusDocument, Unreadable
from agent.mqtt.link import Message, MqttLink
from agent.mqtt.protocol import Desired, ProtocolError, ProtocolTooNew, Topics
from agent.mqtt.rollout_schedule import FailureLimit, OnHalt, Rollout

#: codes of deployments that ended for another reason than the version (not counted as failures)
NOT_FAILURES = frozenset({ErrorCode.ROLLOUT_HALTED, ErrorCode.CANCELLED, ErrorCode.SUPERSEDED})


@dataclass(frozen=True)
class Staging:
    """What `fleet push --waves` asks for; `schedule(start)` makes the document's `Rollout`
    (checked here already, so a bad schedule fails before anything is published)."""

    waves: tuple[float, ...]
    interval_s: float
    max_failures: FailureLimit
    on_halt: OnHalt = "keep"

    def __post_init__(self) -> None:
        self.schedule(0.0)  # raises pydantic's ValidationError (a ValueError) naming the problem

    def schedule(self, start: float) -> Rollout:
        return Rollout(
            waves=list(self.waves),
            start=start,
            interval_s=self.interval_s,
            max_failures=self.max_failures,
            on_halt=self.on_halt,
        )


@dataclass(frozen=True)
class WaveTally:
    """One wave: its number (from 1), the share of the group it reaches, when it opens, and its
    known devices: how many started, succeeded, failed and are still running."""

    wave: int
    share: float
    opens_at: float
    devices: int
    started: int
    succeeded: int
    failed: int
    running: int


@dataclass(frozen=True)
class Tally:
    """A rollout as the devices report it (`failed` counts devices whose deployment ended for
    a reason of the version's, not halted or cancelled ones)."""

    deployment: str
    group: str
    rollout: Rollout
    waves: tuple[WaveTally, ...]
    members: int
    started: int
    succeeded: int
    failed: int
    opened: int  # waves opened by the time of the tally (halts aside)
    failed_devices: tuple[str, ...]
    unreadable: tuple[str, ...] = ()  # members whose deployment record cannot be read (not started)
    ignored: tuple[str, ...] = ()  # devices that reported but are not the group's in the fleet list
    quality: tuple[tuple[str, str], ...] = ()  # (device, what its shadow and probation judged) for each judged

    @property
    def exceeded(self) -> bool:
        return self.rollout.max_failures.exceeded(self.failed, self.started)

    @property
    def complete(self) -> bool:
        """Every known member has ended the deployment (devices that never reported a status are
        not known: `fleet status` lists who did)."""
        running = sum(w.running for w in self.waves)
        return self.members > 0 and running == 0 and self.started == self.members

    def summary(self) -> str:
        state = "halted" if self.rollout.halted else "complete" if self.complete else "running"
        unreadable = f", {len(self.unreadable)} unreadable" if self.unreadable else ""
        ignored = f", {len(self.ignored)} ignored (not the group's in the fleet list)" if self.ignored else ""
        return (
            f"{self.deployment} on group {self.group}: {state}, {self.opened}/{len(self.waves)} waves open, "
            f"{self.started}/{self.members} started, {self.succeeded} succeeded, {self.failed} failed{unreadable}"
            f"{ignored} (halts past {self.rollout.max_failures})"
        )


@dataclass(frozen=True)
class FleetList:
    """The devices as the operator knows them: {device id: its group, or None when the list
    does not say} (the ``ID[:GROUP]`` lines of `agent.fleet.acl.parse_devices`)."""

    devices: Mapping[str, str | None]

    @classmethod
    def parse(cls, lines: Iterable[str]) -> FleetList:
        """From ``ID[:GROUP]`` lines; `ValueError` naming the first bad one."""
        return cls(dict(parse_devices(lines)))

    def group(self, group: str, reporting: Iterable[str]) -> set[str]:
        """The members of `group`: the devices listed in it, and those listed without a group
        among `reporting` (devices whose status says they are in `group`)."""
        said = set(reporting)
        return {d for d, g in self.devices.items() if g == group or (g is None and d in said)}


def is_failure(record: DeploymentDocument) -> bool:
    """Whether the deployment ended without the version, for a reason of the version's own (not
    halted by the rollout or cancelled)."""
    ended_without = record.state in FINAL_STATES and record.state != State.SUCCEEDED
    return ended_without and (record.error is None or record.error.code not in NOT_FAILURES)


def tally(
    desired: Desired,
    group: str,
    members: Iterable[str],
    records: Mapping[str, DeploymentDocument],
    now: float,
    unreadable: Iterable[str] = (),
    fleet: FleetList | None = None,
) -> Tally:
    """The rollout of `desired` (which carries one) over `members` (devices whose status says
    they are in the group) and `records` ({device: its latest deployment record of this
    deployment}); `unreadable` names devices whose record cannot be read (those of members are
    listed). With `fleet`, the group is `fleet`'s (`FleetList.group`) and every other device
    that reported is `ignored`."""
    rollout = desired.rollout
    assert rollout is not None, "tally a document that carries a rollout"
    devices = set(members) | set(records)
    ignored: set[str] = set()
    if fleet is not None:
        known = fleet.group(group, members)
        ignored, devices = devices - known, known
        records = {d: r for d, r in records.items() if d in known}
    rows: list[dict[str, int]] = [
        dict.fromkeys(("devices", "started", "succeeded", "failed", "running"), 0) for _ in rollout.waves
    ]
    failed_devices, judged = [], []
    for device in sorted(devices):
        row = rows[rollout.wave_of(desired.id, device)]
        row["devices"] += 1
        record = records.get(device)
        if record is None:
            continue
        row["started"] += 1
        if (judgement := quality_text(record)) is not None:
            judged.append((device, judgement))
        if record.state == State.SUCCEEDED:
            row["succeeded"] += 1
        elif is_failure(record):
            row["failed"] += 1
            failed_devices.append(device)
        elif record.state not in FINAL_STATES:
            row["running"] += 1
    waves = tuple(
        WaveTally(i + 1, share, rollout.opens_at(i), **row)
        for i, (share, row) in enumerate(zip(rollout.waves, rows, strict=True))
    )
    return Tally(
        deployment=desired.id,
        group=group,
        rollout=rollout,
        waves=waves,
        members=len(devices),
        started=sum(w.started for w in waves),
        succeeded=sum(w.succeeded for w in waves),
        failed=sum(w.failed for w in waves),
        opened=rollout.opened(now),
        failed_devices=tuple(failed_devices),
        unreadable=tuple(sorted((set(unreadable) & devices) - set(records))),
        ignored=tuple(sorted(ignored)),
        quality=tuple(judged),
    )


def find_rollout(link: MqttLink, topics: Topics, deployment_id: str, wait: float = 2.0) -> tuple[str, Desired]:
    """The group and its desired document whose id is `deployment_id` and that carries a rollout;
    `FleetError` when no group's document is that rollout."""
    newer = []  # a document of a newer protocol may be the rollout: say so rather than "none"
    for topic, payload in collect(link, [topics.group_desired("+")], wait).items():
        try:
            desired = Desired.parse(payload, topic)
        except ProtocolTooNew:
            newer.append(topic)
            continue
        except ProtocolError:
            continue
        if desired.id == deployment_id:
            if desired.rollout is None:
                raise FleetError(f"deployment {deployment_id} on {topic} was pushed without waves: it has no rollout")
            return topic.split("/")[-2], desired
    unread = f"; this edge-agent cannot read the newer protocol of {', '.join(sorted(newer))}" if newer else ""
    missing = f"no group's desired document is deployment {deployment_id} (pushed over? see fleet status)"
    raise FleetError(missing + unread)


def republish(
    link: MqttLink, topics: Topics, group: str, desired: Desired, rollout: Rollout, key: Ed25519PrivateKey | None
) -> Desired:
    """`desired` with `rollout`, signed again (a later issue time) and left retained on the
    group's desired topic once the broker acknowledged it."""
    target = f"group:{group}"
    document = desired.model_copy(update={"rollout": rollout, "signature": None, "issued_at": None})
    if key is not None:
        document = sign(document, key, target, now=max(time.time(), (desired.issued_at or 0.0) + 0.001))
    wait_acked([publish_retained(link, topics.group_desired(group), document.to_bytes())], link, 60.0)
    return document


def halt(
    link: MqttLink,
    topics: Topics,
    group: str,
    desired: Desired,
    key: Ed25519PrivateKey | None,
    reason: str,
    on_halt: OnHalt | None = None,
) -> Desired:
    """Halt the rollout of `desired` (optionally changing what started devices do)."""
    rollout = desired.rollout
    assert rollout is not None
    if on_halt is not None:
        rollout = rollout.model_copy(update={"on_halt": on_halt})
    return republish(link, topics, group, desired, rollout.halt(time.time(), reason), key)


def resume(link: MqttLink, topics: Topics, group: str, desired: Desired, key: Ed25519PrivateKey | None) -> Desired:
    """Resume a halted rollout: the waves that were open stay open, the next opens as much later
    as it stood still; devices rolled back by the halt take the deployment again. A document that
    is not halted (say, one replayed over the halt: the devices refuse it) is signed again as it
    is, so it is the newest the devices accept."""
    rollout = desired.rollout
    assert rollout is not None
    return republish(link, topics, group, desired, rollout.resume(time.time()), key)


class _Reports:
    """Statuses and deployment records as they arrive (paho's network thread files them)."""

    def __init__(self, topics: Topics, deployment_id: str, group: str) -> None:
        self.topics, self.deployment_id, self.group = topics, deployment_id, group
        self.changed = threading.Condition()
        self.members: set[str] = set()
        self.records: dict[str, DeploymentDocument] = {}
        self.unreadable: set[str] = set()  # devices whose deployment record cannot be read
        self.document: bytes | None = None  # the group's desired document, newest
        self.version = 0

    def settle(self, wait: float, quiet: float = 0.3) -> None:
        """Let the retained statuses and records arrive: until `quiet` seconds pass without one
        (at most `wait` seconds)."""
        start = time.monotonic()
        while time.monotonic() - start < wait:
            before = self.version
            time.sleep(quiet)
            if self.version == before and before > 0:
                return

    def add(self, message: Message) -> None:
        with self.changed:
            if message.topic == self.topics.group_desired(self.group):
                self.document = message.payload
            else:
                device, leaf = self.topics.split_device(message.topic)
                if leaf == "status":
                    status = StatusDocument.read(message.payload, message.topic)
                    if isinstance(status, StatusDocument) and status.group == self.group:
                        self.members.add(device)
                elif leaf == "deployment":
                    self._file_record(device, DeploymentDocument.read(message.payload, message.topic))
            self.version += 1
            self.changed.notify_all()

    def _file_record(self, device: str, record: DeploymentDocument | Unreadable) -> None:
        """A device's record replaces what it had: this deployment's, or unreadable (no record
        of this deployment then: the retained one is gone), or another deployment's (ignored)."""
        if isinstance(record, Unreadable):
            self.records.pop(device, None)
            self.unreadable.add(device)
        elif record.id == self.deployment_id:
            self.records[device] = record
            self.unreadable.discard(device)
        else:
            self.unreadable.discard(device)


def watch(
    link: MqttLink,
    topics: Topics,
    deployment_id: str,
    key: Ed25519PrivateKey | None,
    timeout: float,
    on_tally: Callable[[Tally], None] = lambda t: None,
    listen: float = 2.0,
    clock: Callable[[], float] = time.time,
    fleet: FleetList | None = None,
) -> Tally:
    """Follow the rollout until it completes, halts, or `timeout` seconds pass; halt it (signed
    by `key`) as soon as failures exceed its limit. `on_tally` gets every new tally. With
    `fleet`, only its devices of the group count (see the module text)."""
    group, desired = find_rollout(link, topics, deployment_id, listen)
    reports = _Reports(topics, deployment_id, group)
    filters = [f"{topics.root}/+/status", f"{topics.root}/+/deployment", topics.group_desired(group)]
    link.subscribe_many(filters, reports.add)
    deadline, seen = time.monotonic() + timeout, -1
    try:
        reports.settle(listen)
        while True:
            with reports.changed:
                if reports.version == seen:
                    reports.changed.wait(1.0)
                seen = reports.version
                members, records, payload = set(reports.members), dict(reports.records), reports.document
                unreadable = set(reports.unreadable)
            if payload:
                with contextlib.suppress(ProtocolError):  # junk on the topic: the devices refuse it too
                    desired = Desired.parse(payload, topics.group_desired(group))
                if desired.id != deployment_id or desired.rollout is None:
                    raise FleetError(f"group {group} follows another deployment now ({desired.id})")
            current = tally(desired, group, members, records, clock(), unreadable, fleet)
            on_tally(current)
            if current.exceeded and current.rollout.halted is None:
                named = ", ".join(current.failed_devices[:5])
                why = f"{current.failed} of {current.started} started devices failed: {named}"
                desired = halt(link, topics, group, desired, key, why)
                current = tally(desired, group, members, records, clock(), unreadable, fleet)
                on_tally(current)
            if current.rollout.halted is not None or current.complete or time.monotonic() > deadline:
                return current
    finally:
        for topic_filter in filters:
            link.unsubscribe(topic_filter)
