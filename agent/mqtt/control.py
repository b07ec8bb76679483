"""Signed control: only the operator can steer a device (docs/security.md).

Desired documents, releases and commands (`protocol.Signed`) carry an Ed25519 signature by an
operator key over their `canonical_bytes`. `sign` makes it (the operator's side); a device's
`ControlGate` accepts a document only when

- it is signed by one of the device's operator keys (`UNAUTHORIZED` otherwise), unless the
  config allows unsigned control (then a signature is still checked if the device has keys);
- it names this device, or its group for a group's desired document;
- it is fresh: a command issued within `max_clock_skew_s` of the device's clock; a desired
  document or release not from the future and not older than the newest one the device accepted
  from the same topic (they are retained, so a device that was offline reads them late);
- it was not seen before: command ids are remembered across restarts (`SeenIds`), desired ids
  through the deployer's followed record.

A refusal raises `ControlRefused` with a message a person can act on; nothing is changed.
Thread safety: `ControlGate` and `SeenIds` take their own lock; the gate is called from the
network thread (desired documents, and `vouches_for` when a command is admitted) and the
commands thread.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agent.bundles.signing import key_id, load_public_key
from agent.config.models import AgentConfig
from agent.errors import CodedError, ErrorCode
from agent.mqtt.protocol import CommandRequest, ControlSignature, Signed
from runtimes.files import atomic_write

SignedT = TypeVar("SignedT", bound=Signed)
Kind = Literal["device", "group"]


class ControlRefused(CodedError):
    """A control document the device will not act on; `code` is ``UNAUTHORIZED``."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNAUTHORIZED, message)


def sign(document: SignedT, key: Ed25519PrivateKey, target: str, now: float | None = None) -> SignedT:
    """`document` for `target` (``device:ID`` or ``group:NAME``), issued now, signed by `key`."""
    issued = document.model_copy(update={"target": target, "issued_at": round(now or time.time(), 3)})
    value = base64.b64encode(key.sign(issued.canonical_bytes())).decode()
    signature = ControlSignature(key_id=key_id(key.public_key()), value=value)
    return issued.model_copy(update={"signature": signature})


def verify(document: Signed, keys: Sequence[Ed25519PublicKey]) -> str:
    """The id of the operator key whose signature `document` carries; `ControlRefused` otherwise."""
    signature = document.signature
    if signature is None:
        raise ControlRefused("it is not signed, and this device obeys only signed control (operator_keys)")
    by_id = {key_id(k): k for k in keys}
    key = by_id.get(signature.key_id)
    if key is None:
        trusted = ", ".join(by_id) or "none"
        raise ControlRefused(f"it is signed by key {signature.key_id}, not an operator key of this device ({trusted})")
    try:
        key.verify(base64.b64decode(signature.value, validate=True), document.canonical_bytes())
    except (InvalidSignature, ValueError) as exc:
        raise ControlRefused(f"the signature of key {signature.key_id} does not match: changed after signing?") from exc
    return signature.key_id


class SeenIds:
    """Command ids this device has run, with when they were issued, in ``control.json`` of the
    state directory; entries older than `keep_s` are dropped (the freshness check refuses those)."""

    def __init__(self, path: Path, keep_s: float) -> None:
        self.path, self.keep_s = path, keep_s
        self._lock = threading.Lock()
        try:
            raw = json.loads(path.read_bytes())
            self._ids = {str(k): float(v) for k, v in raw.get("seen", {}).items()}
        except (OSError, ValueError, AttributeError, TypeError):
            self._ids = {}

    def __contains__(self, request_id: object) -> bool:
        """Whether `request_id` was run (any thread)."""
        with self._lock:
            return request_id in self._ids

    def add(self, request_id: str, issued_at: float, now: float) -> bool:
        """Record `request_id`; False when it was seen before (a replay)."""
        with self._lock:
            if request_id in self._ids:
                return False
            self._ids = {k: v for k, v in self._ids.items() if v >= now - self.keep_s}
            self._ids[request_id] = issued_at
            with contextlib.suppress(OSError):  # a full disk: still remembered in memory until a restart
                atomic_write(self.path, json.dumps({"seen": self._ids}).encode())
            return True


class ControlGate:
    """Decides whether this device acts on a control document (see the module docstring)."""

    def __init__(
        self,
        keys: Sequence[Ed25519PublicKey],
        allow_unsigned: bool,
        max_clock_skew_s: float,
        device: str,
        group: str | None,
        seen: SeenIds,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys, self.allow_unsigned, self.skew = list(keys), allow_unsigned, max_clock_skew_s
        self.device, self.group, self.seen, self._clock = device, group, seen, clock

    @classmethod
    def from_config(cls, config: AgentConfig, clock: Callable[[], float] = time.time) -> ControlGate:
        """The gate agent.yaml sets up: its operator keys (read now; `BundleError` names a bad
        one), unsigned control allowed or not, the clock skew, the device and its group, the
        ids already run in the state directory's ``control.json``."""
        seen = SeenIds(config.state_dir / "control.json", keep_s=2 * config.max_clock_skew_s)
        keys = [load_public_key(path) for path in config.operator_keys]
        skew, group = config.max_clock_skew_s, config.device.group
        return cls(keys, config.allow_unsigned_control, skew, config.device_id(), group, seen, clock)

    def _check(self, document: Signed, expected_target: str) -> None:
        if self.allow_unsigned and (document.signature is None or not self.keys):
            # unsigned control is allowed: a signature is checked only against keys the device has
            if document.target is not None and document.target != expected_target:
                raise ControlRefused(f"it is for {document.target}, not {expected_target}")
            return
        verify(document, self.keys)
        if document.target != expected_target:
            raise ControlRefused(f"it is for {document.target}, not {expected_target}")
        if document.issued_at is None:
            raise ControlRefused("it carries no issued_at time")
        if document.issued_at > self._clock() + self.skew:
            raise ControlRefused(
                f"it was issued {document.issued_at - self._clock():.0f} s in the future: is this device's "
                f"clock synchronised? (max_clock_skew_s is {self.skew:.0f})"
            )

    def accept_document(self, document: SignedT, kind: Kind, newest_accepted: float | None) -> SignedT:
        """A desired document or release read from this device's topic (`kind` ``device``) or its
        group's; `newest_accepted` is the issue time of the newest one followed from that topic."""
        target = f"device:{self.device}" if kind == "device" else f"group:{self.group}"
        self._check(document, target)
        issued = document.issued_at
        signed = document.signature is not None
        if signed and newest_accepted is not None and issued is not None and issued < newest_accepted:
            raise ControlRefused(f"it was issued before the {kind} document this device already followed (a replay?)")
        return document

    def accept_command(self, request: CommandRequest, name: str) -> CommandRequest:
        """A command request arrived on ``cmd/<name>``: checked, and a signed one's id recorded
        (the commands thread, which runs it)."""
        self._check_command(request, name)
        if request.signature is None:
            return request
        assert request.issued_at is not None  # _check refused a signed request without one
        if not self.seen.add(request.id, request.issued_at, self._clock()):
            raise ControlRefused(f"request {request.id} was run before (a replay)")
        return request

    def vouches_for(self, request: CommandRequest, name: str) -> bool:
        """Whether `request` on ``cmd/<name>`` passes every check of `accept_command`, its id not
        recorded (whoever runs it records it; one queued twice is refused there as a replay):
        what admission asks before it charges the command's own rate limit. One signature
        verify, no write."""
        try:
            self._check_command(request, name)
        except ControlRefused:
            return False
        return request.signature is None or request.id not in self.seen

    def _check_command(self, request: CommandRequest, name: str) -> None:
        if request.command != name:
            raise ControlRefused(f"it is a {request.command!r} request sent to the {name!r} command")
        self._check(request, f"device:{self.device}")
        if request.signature is None:
            return
        now = self._clock()
        assert request.issued_at is not None  # _check refused a signed request without one
        if request.issued_at < now - self.skew:
            raise ControlRefused(
                f"it was issued {now - request.issued_at:.0f} s ago, more than max_clock_skew_s "
                f"({self.skew:.0f}): a replay, or an unsynchronised clock"
            )
