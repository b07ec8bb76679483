"""Signed control as the tests make it: a fixed clock, a desired document, the device's gate, the
operator's key, signed requests, and requests nobody with an operator key sent."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.bundles.signing import key_id, load_private_key, load_public_key
from agent.mqtt.control import ControlGate, SeenIds, sign
from agent.mqtt.protocol import MAX_CONTROL_BYTES, CommandRequest, Desired, Topics
from agent.mqtt.rollout_schedule import FailureLimit, Rollout

NOW = 1_800_000_000.0


SHA = "ab" * 32


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def desired(**fields: object) -> Desired:
    base: dict[str, object] = {
        "id": "d1",
        "name": "demo",
        "version": "1.0.0",
        "sha256": SHA,
        "size": 10,
        "chunk_size": 10,
        "chunks": 1,
    }
    return Desired.model_validate({**base, **fields})


def gate(tmp_path: Path, keys: dict[str, Path], clock: Clock, allow_unsigned: bool = False) -> ControlGate:
    seen = SeenIds(tmp_path / "control.json", keep_s=600)
    operators = [load_public_key(keys["operator_pub"])]
    return ControlGate(operators, allow_unsigned, 300, "cam-1", "lobby", seen, clock)


def request(key: Ed25519PrivateKey | None, name: str = "rollback", target: str = "device:cam-1", **fields: object):
    document = CommandRequest(id=str(fields.pop("id", "r1")), command=name, args=dict(fields.pop("args", {})))  # type: ignore[call-overload]
    at = float(fields.pop("at", NOW))  # type: ignore[arg-type]
    return sign(document, key, target, now=at) if key is not None else document.model_copy(update={"target": target})


def junk(
    keys: dict[str, Path], operator: Ed25519PrivateKey, name: str, device: str = "cam-1", at: float = NOW
) -> list[bytes]:
    """Requests on ``cmd/<name>`` of `device` that nobody with an operator key sent: unsigned ones,
    ones signed by a stranger, by the operator but changed after, or for another device (each
    issued `at`), and ones that are not JSON or too large to read."""
    stranger = load_private_key(keys["other"])
    target = f"device:{device}"
    changed = json.loads(request(operator, name, target, id="changed", at=at).to_bytes())
    changed["args"] = {"pipeline": "cam0"}
    return [
        b"",
        b"{}",
        json.dumps({"id": "unsigned", "command": name, "args": {}}).encode(),
        request(stranger, name, target, id="stranger", at=at).to_bytes(),
        json.dumps(changed).encode(),
        request(operator, name, "device:someone-else", id="elsewhere", at=at).to_bytes(),
        b"\xff" * 100,
        b"{}".ljust(MAX_CONTROL_BYTES + 1),
    ]


TOPICS = Topics("fleet/a")


def unchecked_rollout(
    operator: Ed25519PrivateKey, target: str = "group:lobby", issued_at: float = NOW, **rollout: object
) -> bytes:
    """A group document with a rollout schedule (`rollout` over a valid one) as an operator's
    key would sign it, built without the models' checks (as a tool of one's own could), in JSON
    that writes non-finite numbers (``Infinity``)."""
    fields = {"id": "d", "name": "demo", "version": "1.0.0", "sha256": SHA, "size": 1, "chunk_size": 1, "chunks": 1}
    schedule = {"waves": [100.0], "start": NOW, "interval_s": 0.0, "max_failures": FailureLimit(devices=1), **rollout}
    document = Desired.model_construct(**fields, rollout=Rollout.model_construct(**schedule))  # type: ignore[arg-type]
    signed = sign(document, operator, target, now=issued_at)
    return json.dumps(signed.model_dump(mode="json", exclude_none=True)).encode()


def newer_protocol(operator: Ed25519PrivateKey, kind: str, protocol: int = 2, **members: object) -> bytes:
    """A control document of `kind` (``Desired``, ``CommandRequest``) as an operator of a newer
    `protocol` signs it: its members, `protocol` and whatever the newer protocol added, signed
    over the same canonical form (docs/fleet.md#protocol-versions)."""
    members = {**members, "protocol": protocol}
    body = json.dumps(members, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    value = base64.b64encode(operator.sign(f"edge-agent {kind} v1\n{body}".encode())).decode()
    return json.dumps({**members, "signature": {"key_id": key_id(operator.public_key()), "value": value}}).encode()
