"""The operator's side of enrolment by claim: claims, approvals, retirement (docs/fleet.md#enrolment).

The broker's clients and roles are made through mosquitto's dynamic security plugin
(`Dynsec`: JSON commands on ``$CONTROL/dynamic-security/v1``, answered on ``.../response``), so
the operator's broker user must hold the plugin's admin role (`mosquitto_ctrl dynsec init`).

- A claim (`create_claim`) is a broker client ``claim-<name>`` with the role ``edge-claim-<name>``:
  it may publish only ``<root>/enrol/<name>/+/request`` and read ``.../answer``. Its expiry and
  group live in the client's text description, which `approve` reads: a request through an
  expired or deleted claim, or asking for another group than the claim's, is refused.
- `approve` checks the request (`check_request`: the topic's claim and id, the device's own
  signature, its age), that no answer was given to it before (a replay) and that no broker client
  has the device id (``ENROL_TAKEN``; the plugin's createClient refuses a second one too, so two
  approvals racing for one id give it once); then it creates the role ``edge-device-<id>`` with
  the ACL `fleet acl` writes for the device and the client ``<id>`` (client id
  ``edge-agent-<id>``, the daemon's default) with a random password, and publishes the signed
  answer, the password sealed to the device's X25519 key.
- `retire` deletes the client (the plugin disconnects it) and its role.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.errors import ErrorCode
from agent.fleet.acl import mosquitto_acl
from agent.fleet.client import FleetError, collect, publish_retained, wait_acked
from agent.mqtt.enrolment import (
    DEFAULT_MAX_AGE_S,
    Claim,
    EnrolAnswer,
    EnrolRefused,
    EnrolRequest,
    check_request,
    enrol_topics,
    pem,
    seal,
    sign_answer,
)
from agent.mqtt.link import Message, MqttLink
from agent.mqtt.protocol import Topics

CONTROL = "$CONTROL/dynamic-security/v1"
#: the longest dynamic security answer read (a client listing of a large fleet stays below it)
MAX_DYNSEC_BYTES = 1024 * 1024
_ACL_LINE = re.compile(r"^topic (read|write|readwrite) (\S+)$")
#: the plugin's ACL types that each access of an ACL line grants
_ACL_TYPES = {
    "read": ("subscribePattern", "publishClientReceive"),
    "write": ("publishClientSend",),
    "readwrite": ("subscribePattern", "publishClientReceive", "publishClientSend"),
}


class Dynsec:
    """Commands to mosquitto's dynamic security plugin over `link` (its admin role needed)."""

    def __init__(self, link: MqttLink, timeout: float = 10.0) -> None:
        self.link, self.timeout = link, timeout
        self._answers: dict[object, dict[str, Any]] = {}
        self._waiting: set[object] = set()
        self._arrived = threading.Condition()
        link.subscribe(f"{CONTROL}/response", self._on_response).wait(timeout)

    def _on_response(self, message: Message) -> None:
        if len(message.payload) > MAX_DYNSEC_BYTES:
            return
        try:
            responses = json.loads(message.payload).get("responses", [])
        except (ValueError, AttributeError):
            return
        with self._arrived:
            for response in responses if isinstance(responses, list) else []:
                token = response.get("correlationData") if isinstance(response, dict) else None
                if token in self._waiting:  # not other administrators' answers: kept only when asked for
                    self._answers[token] = response
            self._arrived.notify_all()

    def call(self, command: str, **fields: Any) -> dict[str, Any]:
        """One command; its response (``error`` set when the plugin refused it)."""
        token = uuid.uuid4().hex
        payload = json.dumps({"commands": [{"command": command, "correlationData": token, **fields}]}).encode()
        with self._arrived:
            self._waiting.add(token)
        try:
            wait_acked([publish_retained(self.link, CONTROL, payload, retain=False)], self.link, self.timeout)
            with self._arrived:
                if not self._arrived.wait_for(lambda: token in self._answers, self.timeout):
                    raise FleetError(f"the broker's dynamic security plugin did not answer {command}: is it loaded?")
                return self._answers.pop(token)
        finally:
            with self._arrived:
                self._waiting.discard(token)
                self._answers.pop(token, None)

    def must(self, command: str, **fields: Any) -> dict[str, Any]:
        response = self.call(command, **fields)
        if response.get("error"):
            raise FleetError(f"the broker refused {command}: {response['error']}")
        return response

    def client(self, username: str) -> dict[str, Any] | None:
        """The client's record, or None when there is none."""
        response = self.call("getClient", username=username)
        client = (response.get("data") or {}).get("client") if not response.get("error") else None
        return client if isinstance(client, dict) else None


def dynsec_acls(acl_text: str) -> list[dict[str, Any]]:
    """`fleet acl`'s ``topic read|write|readwrite T`` lines as the plugin's ACL entries."""
    acls: list[dict[str, Any]] = []
    for line in acl_text.splitlines():
        match = _ACL_LINE.match(line.strip())
        if match is None:
            continue
        access, topic = match.groups()
        acls += [{"acltype": kind, "topic": topic, "allow": True} for kind in _ACL_TYPES[access]]
    return acls


def device_role_acls(device: str, group: str | None, topics: Topics) -> list[dict[str, Any]]:
    return dynsec_acls(mosquitto_acl([(device, group)], [], topics))


def create_claim(
    dynsec: Dynsec, topics: Topics, name: str, broker: str, keys: list[str], expires_at: float, group: str | None
) -> Claim:
    """A claim client and role on the broker; the `Claim` to hand to the installer."""
    role = f"edge-claim-{name}"
    base = f"{topics.root}/enrol/{name}/+"
    acls = [
        {"acltype": "publishClientSend", "topic": f"{base}/request", "allow": True},
        {"acltype": "subscribePattern", "topic": f"{base}/answer", "allow": True},
        {"acltype": "publishClientReceive", "topic": f"{base}/answer", "allow": True},
    ]
    password = secrets.token_urlsafe(24)
    record = json.dumps({"expires_at": expires_at, "group": group})
    dynsec.must("createRole", rolename=role, acls=acls)
    roles = [{"rolename": role}]
    dynsec.must("createClient", username=f"claim-{name}", password=password, textdescription=record, roles=roles)
    return Claim(
        broker=broker,
        topic_root=topics.root,
        claim=name,
        username=f"claim-{name}",
        password=password,
        operator_keys=keys,
        group=group,
        expires_at=expires_at,
    )


@dataclass(frozen=True)
class Pending:
    """One request seen on the broker: parsed, or why it is not, and whether it was answered."""

    claim: str
    request_id: str
    request: EnrolRequest | None
    problem: str | None
    answered: bool
    approved: bool = False


def requests(link: MqttLink, topics: Topics, wait: float) -> list[Pending]:
    """Every retained request under ``<root>/enrol/``, and whether it was answered (yes or no)."""
    found = collect(link, [f"{topics.root}/enrol/+/+/request", f"{topics.root}/enrol/+/+/answer"], wait)
    answered = {topic.rsplit("/", 1)[0]: payload for topic, payload in found.items() if topic.endswith("/answer")}
    pending = []
    for topic, payload in sorted(found.items()):
        if not topic.endswith("/request"):
            continue
        claim, request_id = topic.split("/")[-3:-1]
        request, problem = None, None
        try:
            request = EnrolRequest.parse(payload, topic)
        except EnrolRefused as exc:
            problem = str(exc)
        answer = answered.get(topic.rsplit("/", 1)[0])
        approved = answer is not None and _approved(answer)
        pending.append(Pending(claim, request_id, request, problem, answer is not None, approved))
    return pending


def _approved(payload: bytes) -> bool:
    """Whether a retained answer is an approval (read, not trusted: it only counts approvals)."""
    try:
        return bool(EnrolAnswer.parse(payload, "an answer").approved)
    except EnrolRefused:
        return False


def _find(link: MqttLink, topics: Topics, request_id: str, wait: float) -> Pending:
    for pending in requests(link, topics, wait):
        if pending.request_id == request_id:
            return pending
    raise FleetError(f"no enrolment request {request_id} on the broker (edge-agent fleet enrol list)")


def approve(
    link: MqttLink,
    dynsec: Dynsec,
    topics: Topics,
    request_id: str,
    key: Ed25519PrivateKey,
    now: float,
    trust_keys: Sequence[str] = (),
    operator_keys: Sequence[str] = (),
    wait: float = 2.0,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    skew_s: float = 300.0,
) -> EnrolAnswer:
    """Create the device's client and role and publish the signed answer (see the module text);
    `EnrolRefused` says why a request gets nothing."""
    pending = _find(link, topics, request_id, wait)
    if pending.request is None:
        raise EnrolRefused(ErrorCode.ENROL_INVALID, pending.problem or "unreadable")
    if pending.answered:
        raise EnrolRefused(ErrorCode.ENROL_REPLAYED, f"request {request_id} was answered before (a replay?)")
    request = pending.request
    check_request(request, pending.claim, request_id, now, max_age_s, skew_s)
    claim = dynsec.client(f"claim-{pending.claim}")
    if claim is None:
        raise EnrolRefused(ErrorCode.ENROL_EXPIRED, f"the claim {pending.claim} no longer exists on the broker")
    try:
        record = json.loads(str(claim.get("textdescription") or "{}")[:4096])
        expires_at = float(record["expires_at"])
    except (ValueError, KeyError, TypeError) as exc:
        raise EnrolRefused(ErrorCode.ENROL_INVALID, f"the claim {pending.claim} has no readable expiry") from exc
    if now >= expires_at:
        raise EnrolRefused(ErrorCode.ENROL_EXPIRED, f"the claim {pending.claim} expired")
    group = record.get("group")
    if group is not None and request.group != group:  # a claim's devices join its group, no other
        raise EnrolRefused(
            ErrorCode.ENROL_INVALID, f"request {request_id} asks for group {request.group}; its claim is for {group}"
        )
    device = request.device_id
    if dynsec.client(device) is not None:
        _refuse(link, topics, pending, key, now, f"the id {device} is taken: enrol with another --device-id")
    role = f"edge-device-{device}"
    acls = device_role_acls(device, request.group, topics)
    created_role = dynsec.call("createRole", rolename=role, acls=acls)
    if created_role.get("error"):  # never a role left by someone else: its ACL may be another group's
        _refuse(link, topics, pending, key, now, f"the id {device} is taken ({role}: {created_role['error']})")
    password = secrets.token_urlsafe(24)
    client_id = f"edge-agent-{device}"
    created = dynsec.call(
        "createClient", username=device, password=password, clientid=client_id, roles=[{"rolename": role}]
    )
    if created.get("error"):
        dynsec.call("deleteRole", rolename=role)
        _refuse(link, topics, pending, key, now, f"the id {device} is taken ({created['error']})")
    answer = EnrolAnswer(
        request_id=request_id,
        device_key=request.public_key,
        approved=True,
        device_id=device,
        group=request.group,
        username=device,
        password=seal(password, request.box_key, request_id),
        trust_keys=list(trust_keys),
        operator_keys=list(operator_keys) or [pem(key.public_key())],
        issued_at=round(now, 3),
    )
    _answer(link, topics, pending, sign_answer(answer, key))
    return answer


def _refuse(link: MqttLink, topics: Topics, pending: Pending, key: Ed25519PrivateKey, now: float, reason: str) -> None:
    """The id is taken: tell the device (a signed refusal), then raise ``ENROL_TAKEN``."""
    _deny(link, topics, pending, key, now, reason)
    raise EnrolRefused(ErrorCode.ENROL_TAKEN, reason)


def deny(link: MqttLink, topics: Topics, request_id: str, key: Ed25519PrivateKey, now: float, reason: str) -> None:
    """Publish a signed refusal: the device stops waiting, and the request counts as answered."""
    _deny(link, topics, _find(link, topics, request_id, 2.0), key, now, reason)


def _deny(link: MqttLink, topics: Topics, pending: Pending, key: Ed25519PrivateKey, now: float, reason: str) -> None:
    device_key = pending.request.public_key if pending.request is not None else "A" * 43 + "="
    answer = EnrolAnswer(
        request_id=pending.request_id,
        device_key=device_key,
        approved=False,
        reason=reason[:500],
        issued_at=round(now, 3),
    )
    _answer(link, topics, pending, sign_answer(answer, key))


def _answer(link: MqttLink, topics: Topics, pending: Pending, answer: EnrolAnswer) -> None:
    answer_topic = enrol_topics(topics, pending.claim, pending.request_id)[1]
    wait_acked([publish_retained(link, answer_topic, answer.to_bytes())], link, 10.0)


def retire(dynsec: Dynsec, device: str) -> None:
    """Delete the device's broker client (the plugin disconnects it) and its role. Its answer
    stays retained: its sealed password no longer opens anything, and it marks the request as
    answered, so a replay of it is refused."""
    if dynsec.client(device) is None:
        raise FleetError(f"no broker client {device} (the dynamic security plugin knows none by that name)")
    dynsec.must("deleteClient", username=device)
    dynsec.call("deleteRole", rolename=f"edge-device-{device}")
