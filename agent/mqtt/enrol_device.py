"""The device's side of enrolment by claim (`edge-agent enrol`; docs/fleet.md#enrolment).

`enrol` connects with the claim's narrow credentials, publishes this device's signed
`EnrolRequest` (retained, so an operator who looks later still sees it) and waits for the
operator's answer on the request's own answer topic; an answer that is not signed by one of the
claim's operator keys, or is for another request, is ignored (a throttled log line) and the
device goes on waiting. An approval is written into agent.yaml (`write_credentials`, atomic):
the device id and group, the broker with the device's own user name and a password file
(0600), the operator and trust keys as PEM files in the state directory. The claim's password is
never written there.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agent.config.models import MqttSection, Secret, TlsSection
from agent.errors import ErrorCode
from agent.hardware.board import probe
from agent.mqtt.enrolment import (
    DEFAULT_MAX_AGE_S,
    MAX_ENROL_BYTES,
    Claim,
    DeviceKeys,
    EnrolAnswer,
    EnrolRefused,
    EnrolRequest,
    Hardware,
    accept_answer,
    enrol_topics,
    make_request,
    read_bounded,
    unseal,
)
from agent.mqtt.link import Message, MqttLink, NotSent
from agent.mqtt.protocol import Topics
from agent.throttle import ThrottledLog
from runtimes.files import atomic_write

log = logging.getLogger(__name__)

#: the request sent and not yet answered, in ``<state_dir>/enrol/``
PENDING = "request.json"


def hardware_identity(root: Path = Path("/")) -> Hardware:
    """Board (`probe`), serial (the device tree's, else /etc/machine-id) and the MAC of the first
    interface that is not loopback, read under `root`."""
    serial = ""
    for name in ("proc/device-tree/serial-number", "etc/machine-id"):
        try:
            serial = (root / name).read_bytes()[:200].decode(errors="replace").strip("\x00 \n")
        except OSError:
            continue
        if serial:
            break
    mac = ""
    net = root / "sys/class/net"
    for interface in sorted(net.iterdir()) if net.is_dir() else []:
        if interface.name == "lo":
            continue
        try:
            address = (interface / "address").read_text()[:64].strip()
        except OSError:
            continue
        if address and address != "00:00:00:00:00:00":
            mac = address
            break
    return Hardware(board=probe(root).model[:200], serial=serial, mac=mac)


def claim_settings(claim: Claim) -> MqttSection:
    """The broker settings of the claim's credentials."""
    tls = None
    if claim.ca_file is not None or claim.cert_file is not None:
        tls = TlsSection(ca_file=claim.ca_file, cert_file=claim.cert_file, key_file=claim.key_file)
    password = Secret(value=claim.password) if claim.password is not None else None
    return MqttSection(
        broker=claim.broker, topic_root=claim.topic_root, username=claim.username, password=password, tls=tls
    )


def enrol(
    claim: Claim,
    state_dir: Path,
    config_path: Path,
    device_id: str,
    group: str | None = None,
    hardware: Hardware | None = None,
    wait_s: float | None = None,
    clock: Callable[[], float] = time.time,
    on_request: Callable[[EnrolRequest], None] = lambda request: None,
    wait_answer: Callable[[threading.Event], bool] | None = None,
) -> EnrolAnswer:
    """Ask to join with `claim`, wait for the answer (`wait_s`: None waits for ever; or
    `wait_answer`, given the event set by the answer, True once it is set), and on an approval
    write agent.yaml's credentials. Returns the answer; `EnrolRefused` when the claim has expired
    (``ENROL_EXPIRED``), the operator denied it (``ENROL_DENIED``) or no answer came.

    The request is kept in ``<state_dir>/enrol/request.json`` until it is answered: asked again
    (a restart, the broker unreachable) the device sends that same request, whose answer is
    retained, instead of a second one."""
    now = clock()
    if now >= claim.expires_at:
        raise EnrolRefused(ErrorCode.ENROL_EXPIRED, f"the claim {claim.claim} expired; ask the operator for a new one")
    keys = DeviceKeys.load_or_make(state_dir)
    request = pending_request(state_dir, keys, claim, device_id, group, now)
    if request is None:
        request = make_request(keys, claim, device_id, hardware or hardware_identity(), now, group)
        atomic_write(state_dir / "enrol" / PENDING, request.to_bytes())
    request_topic, answer_topic = enrol_topics(Topics(claim.topic_root), claim.claim, request.request_id)
    trusted = claim.public_keys()
    answered = threading.Event()
    answers: list[EnrolAnswer] = []
    throttled = ThrottledLog(log)

    def on_answer(message: Message) -> None:
        if not message.payload or answered.is_set():
            return
        try:
            answer = accept_answer(EnrolAnswer.parse(message.payload, answer_topic), request, trusted)
        except EnrolRefused as exc:
            throttled.warning("enrol-answer", "ignoring an answer on %s: %s", answer_topic, exc)
            return
        answers.append(answer)
        answered.set()

    link = MqttLink(claim_settings(claim), f"enrol-{request.request_id[:16]}").start()
    try:
        if not link.wait_connected(30):
            raise EnrolRefused(ErrorCode.ENROL_INVALID, f"cannot reach {claim.broker}: {link.last_error}")
        link.subscribe(answer_topic, on_answer).wait(30)
        delivery = link.publish(request_topic, request.to_bytes(), qos=1, retain=True)
        if isinstance(delivery, NotSent) or not delivery.wait(30) or delivery.refused is not None:
            raise EnrolRefused(
                ErrorCode.ENROL_INVALID, f"the broker did not take the request on {request_topic}: a revoked claim?"
            )
        on_request(request)
        if not (wait_answer(answered) if wait_answer is not None else answered.wait(wait_s)):
            within = f" within {wait_s:.0f} s" if wait_s is not None else ""
            raise EnrolRefused(ErrorCode.ENROL_DENIED, f"no answer to request {request.request_id}{within}")
    finally:
        link.stop()
    answer = answers[0]
    kept = state_dir / "enrol" / PENDING  # forgotten once answered: a denial, or the credentials written
    if not answer.approved or answer.password is None or answer.username is None or answer.device_id is None:
        kept.unlink(missing_ok=True)
        raise EnrolRefused(ErrorCode.ENROL_DENIED, f"the operator denied request {request.request_id}: {answer.reason}")
    password = unseal(answer.password, keys.box, request.request_id)
    write_credentials(config_path, claim, answer, password, state_dir)
    kept.unlink(missing_ok=True)
    return answer


def pending_request(
    state_dir: Path, keys: DeviceKeys, claim: Claim, device_id: str, group: str | None, now: float
) -> EnrolRequest | None:
    """The request kept from an earlier start when it is still the one to send: read (bounded),
    made with these keys, for this claim, id and group, and young enough for the operator to
    approve (`DEFAULT_MAX_AGE_S`); None otherwise (a new one is made, with the same keys)."""
    path = state_dir / "enrol" / PENDING
    if not path.exists():
        return None
    try:
        request: EnrolRequest = EnrolRequest.parse(read_bounded(path, MAX_ENROL_BYTES, "the request"), str(path))
    except EnrolRefused as exc:
        log.warning("enrol: not sending the kept request again: %s", exc)
        return None
    fresh = make_request(keys, claim, device_id, request.hardware, now, group)
    same = (request.public_key, request.box_key, request.claim, request.device_id, request.group)
    if same != (fresh.public_key, fresh.box_key, fresh.claim, fresh.device_id, fresh.group):
        return None
    return request if now - request.issued_at < DEFAULT_MAX_AGE_S else None


def write_credentials(config_path: Path, claim: Claim, answer: EnrolAnswer, password: str, state_dir: Path) -> None:
    """agent.yaml's device, mqtt, operator_keys and trust_keys, the rest of the file kept; the
    password in ``<state_dir>/enrol/mqtt.password`` (0600), the keys as PEM files beside it."""
    config_path = config_path.resolve()  # a link into the state directory (install.sh --claim) is written through
    folder = state_dir / "enrol"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    password_file = folder / "mqtt.password"
    atomic_write(password_file, password.encode() + b"\n")
    os.chmod(password_file, 0o600)
    operator_keys = _write_keys(folder, "operator", answer.operator_keys or claim.operator_keys)
    trust_keys = _write_keys(folder, "trust", answer.trust_keys)
    try:
        raw: Any = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
    except (OSError, yaml.YAMLError) as exc:
        raise EnrolRefused(ErrorCode.ENROL_INVALID, f"cannot read {config_path} to add the credentials: {exc}") from exc
    config: dict[str, Any] = raw if isinstance(raw, dict) else {}
    device = {"id": answer.device_id} | ({"group": answer.group} if answer.group else {})
    mqtt: dict[str, Any] = dict(config.get("mqtt") or {})
    mqtt |= {"broker": claim.broker, "topic_root": claim.topic_root, "username": answer.username}
    mqtt["password"] = {"file": str(password_file)}
    mqtt.pop("client_id", None)  # its broker user may connect only as edge-agent-<id>, the default
    if claim.ca_file is not None:
        mqtt["tls"] = {"ca_file": str(claim.ca_file)}
    config |= {"device": device, "state_dir": str(state_dir), "mqtt": mqtt}
    config |= {"operator_keys": [str(p) for p in operator_keys], "trust_keys": [str(p) for p in trust_keys]}
    config_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(config_path, yaml.safe_dump(config, sort_keys=False).encode())


def _write_keys(folder: Path, kind: str, pems: list[str]) -> list[Path]:
    paths = []
    for i, pem in enumerate(pems):
        path = folder / f"{kind}-{i}.pub"
        atomic_write(path, pem.encode())
        paths.append(path)
    return paths
