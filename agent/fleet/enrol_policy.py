"""Auto-approval of enrolment requests by a policy the operator signed (docs/fleet.md#enrolment).

An `EnrolPolicy` names one claim, the board and serial glob patterns a request's hardware must
match (`fnmatch`, case-sensitive; every list given must have a match), how many devices it may
approve on that claim in all (`count`, the approved answers already on the broker count, manual
ones too) and when it expires. It is signed by an operator key (`sign_policy`), and `load_policy`
reads it only when one of the operator keys given signed it, so a policy file edited on the
machine that runs `fleet enrol auto` approves nothing. `auto_approve` makes one pass: each
waiting request of the claim that matches is approved (`agent.fleet.enrolments.approve`, with all its
checks) while the count lasts; the others wait for a person.
"""

from __future__ import annotations

import base64
import fnmatch
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.bundles.signing import key_id
from agent.config.models import TopicWord
from agent.errors import ErrorCode, validation_problems
from agent.fleet.enrolments import Dynsec, approve, requests
from agent.mqtt.enrolment import EnrolRefused, EnrolRequest, read_bounded, verify_signed
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import ControlSignature, Topics

#: a policy file larger than this is refused before it is parsed
MAX_POLICY_BYTES = 16 * 1024


class EnrolPolicy(BaseModel):
    """Which requests of one claim are approved without a person, how many, until when."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    claim: TopicWord = Field(description="The claim whose requests it approves.")
    boards: list[str] = Field(default_factory=list, max_length=64, description="Board glob patterns (any).")
    serials: list[str] = Field(default_factory=list, max_length=64, description="Serial glob patterns (any).")
    count: int = Field(ge=1, le=100_000, description="Most devices approved on the claim in all.")
    expires_at: float = Field(ge=0, description="Unix seconds after which it approves nothing.")
    issued_at: float = Field(ge=0)
    signature: ControlSignature | None = None

    def canonical_bytes(self) -> bytes:
        members = self.model_dump(mode="json", exclude={"signature"})
        body = json.dumps(members, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return f"edge-agent EnrolPolicy v1\n{body}".encode()

    def matches(self, request: EnrolRequest) -> bool:
        """The request's claim is this one and its board and serial match the patterns given."""
        hardware = request.hardware
        boards = not self.boards or any(fnmatch.fnmatchcase(hardware.board, p) for p in self.boards)
        serials = not self.serials or any(fnmatch.fnmatchcase(hardware.serial, p) for p in self.serials)
        return request.claim == self.claim and boards and serials


def sign_policy(policy: EnrolPolicy, key: Ed25519PrivateKey) -> EnrolPolicy:
    value = base64.b64encode(key.sign(policy.canonical_bytes())).decode()
    return policy.model_copy(update={"signature": ControlSignature(key_id=key_id(key.public_key()), value=value)})


def load_policy(path: Path, keys: Sequence[Ed25519PublicKey]) -> EnrolPolicy:
    """A policy file (bounded before it is parsed) signed by one of `keys`; `EnrolRefused` otherwise."""
    data = read_bounded(path, MAX_POLICY_BYTES, "the policy")
    try:
        policy = EnrolPolicy.model_validate_json(data)
    except ValidationError as exc:
        problems = "; ".join(validation_problems(exc))
        raise EnrolRefused(ErrorCode.ENROL_INVALID, f"the policy {path}: {problems}") from exc
    verify_signed(policy.canonical_bytes(), policy.signature, keys, f"the policy {path}")
    return policy


@dataclass(frozen=True)
class Outcome:
    """What one pass did with one request of the policy's claim."""

    request_id: str
    device: str | None
    approved: bool
    why: str


def auto_approve(
    link: MqttLink,
    dynsec: Dynsec,
    topics: Topics,
    policy: EnrolPolicy,
    key: Ed25519PrivateKey,
    now: float,
    wait: float = 2.0,
    **checks: Any,
) -> list[Outcome]:
    """One pass over the claim's waiting requests, oldest first (see the module text)."""
    found = [p for p in requests(link, topics, wait) if p.claim == policy.claim]
    approved = sum(p.approved for p in found)
    waiting = [(p, p.request) for p in found if not p.answered and p.request is not None]
    outcomes = []
    for pending, request in sorted(waiting, key=lambda pair: pair[1].issued_at):
        if now >= policy.expires_at:
            outcomes.append(Outcome(pending.request_id, request.device_id, False, "the policy expired"))
        elif not policy.matches(request):
            outcomes.append(Outcome(pending.request_id, request.device_id, False, "does not match the policy"))
        elif approved >= policy.count:
            outcomes.append(Outcome(pending.request_id, request.device_id, False, f"the policy's {policy.count} used"))
        else:
            try:
                approve(link, dynsec, topics, pending.request_id, key, now, wait=wait, **checks)
            except EnrolRefused as exc:
                outcomes.append(Outcome(pending.request_id, request.device_id, False, str(exc)))
                continue
            approved += 1
            outcomes.append(Outcome(pending.request_id, request.device_id, True, "matches the policy"))
    return outcomes
