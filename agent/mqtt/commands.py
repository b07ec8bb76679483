"""Commands a device accepts on ``<root>/<device>/cmd/<name>`` (MQTT 5 request/response).

The payload is a `CommandRequest`: the operator's signed envelope naming the command, the
device, when it was issued and the arguments (a device that allows unsigned control also takes
the bare arguments object). The envelope passes the `ControlGate` (``UNAUTHORIZED``), then the
arguments are checked against the command's model with unknown keys forbidden
(``BAD_PAYLOAD``). The answer goes to the request's response topic with its correlation data:
``{"ok": true, "command": ..., "result": {...}}``, or ``{"ok": false, "error": {"code",
"message"}}``, or for ``snapshot`` the JPEG itself (content type ``image/jpeg``). A refused
command changes nothing.

`RateLimits` keeps a flood of one command (a request storm for camera frames) from filling the
queue or starving the others; `ThrottledLog` keeps such a flood from filling the log.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.errors import CodedError, ErrorCode, validation_problems
from agent.mqtt.control import ControlGate, ControlRefused
from agent.mqtt.protocol import CommandRequest, ProtocolError

log = logging.getLogger(__name__)

#: longest value echoed back in an error message
ECHO_LIMIT = 80


class CommandError(CodedError):
    """A command refused or failed; the answer carries its code and message."""


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NoArgs(_Args):
    pass


class PipelineArgs(_Args):
    pipeline: str | None = Field(
        default=None, max_length=64, description="Pipeline name; default: all (restart) or the first."
    )


class SnapshotArgs(PipelineArgs):
    quality: int = Field(default=85, ge=1, le=100, description="JPEG quality.")


@dataclass(frozen=True)
class Response:
    payload: bytes
    content_type: str = "application/json"

    @property
    def ok(self) -> bool:
        return self.content_type != "application/json" or bool(json.loads(self.payload).get("ok"))


@dataclass(frozen=True)
class Command:
    args: type[_Args]
    run: Callable[[Any], dict[str, Any] | Response]


ARGUMENTS: dict[str, type[_Args]] = {
    "ping": NoArgs,
    "rollback": NoArgs,
    "restart-pipeline": PipelineArgs,
    "snapshot": SnapshotArgs,
}


def shorten(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text` cut to `limit` characters (never echo a megabyte back)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def error(name: str, code: ErrorCode, message: str) -> Response:
    body = {"ok": False, "command": shorten(name), "error": {"code": code, "message": message}}
    return Response(json.dumps(body).encode())


def read_arguments(payload: bytes, name: str, gate: ControlGate | None) -> dict[str, Any]:
    """The arguments of a request on ``cmd/<name>``, once its envelope passed `gate` (None: no
    checks, for tests of the commands themselves). Raises `CommandError`."""
    try:
        raw = json.loads(payload) if payload.strip() else {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise CommandError(ErrorCode.BAD_PAYLOAD, f"the payload is not JSON: {shorten(str(exc))}") from exc
    if not isinstance(raw, dict):
        raise CommandError(ErrorCode.BAD_PAYLOAD, f"the payload must be a JSON object, got {type(raw).__name__}")
    if "command" not in raw:  # the bare arguments: an unsigned request
        if gate is not None and not gate.allow_unsigned:
            raise CommandError(ErrorCode.UNAUTHORIZED, "the request is not signed (edge-agent fleet ... --key)")
        return raw
    try:
        request: CommandRequest = CommandRequest.parse(payload, f"the {name} request")
        if gate is not None:
            request = gate.accept_command(request, name)
    except ProtocolError as exc:
        raise CommandError(ErrorCode.BAD_PAYLOAD, str(exc)) from exc
    except ControlRefused as exc:
        raise CommandError(ErrorCode.UNAUTHORIZED, exc.message) from exc
    return request.args


def run_command(
    commands: Mapping[str, Command], name: str, payload: bytes | bytearray, gate: ControlGate | None = None
) -> Response:
    """Check the request, run the command and shape its answer; never raises."""
    command = commands.get(name)
    if command is None:
        known = ", ".join(sorted(commands))
        return error(name, ErrorCode.UNKNOWN_COMMAND, f"unknown command {shorten(name)!r}; known: {known}")
    try:
        raw = read_arguments(bytes(payload), name, gate)
        args = command.args.model_validate(raw)
    except CommandError as exc:
        return error(name, exc.code, exc.message)
    except ValidationError as exc:
        return error(name, ErrorCode.BAD_PAYLOAD, "; ".join(validation_problems(exc)))
    try:
        result = command.run(args)
    except CodedError as exc:  # a CommandError, or the agent's own refusal (NO_PREVIOUS, BUSY, ...)
        return error(name, exc.code, exc.message)
    except Exception as exc:  # a bug or an I/O failure: answered, logged, and the next command still runs
        log.exception("command %s failed", name)
        return error(name, ErrorCode.COMMAND_FAILED, shorten(f"{type(exc).__name__}: {exc}", 300))
    if isinstance(result, Response):
        return result
    return Response(json.dumps({"ok": True, "command": name, "result": result}, default=str).encode())


class TokenBucket:
    """`rate` events a second on average, `burst` at once (times from `clock`, seconds)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._at = float(burst), clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class RateLimits:
    """One bucket per known command and one for every other name, so a flood of one command
    neither fills the command queue nor starves the others (`allow` from paho's network thread)."""

    #: requests per second and burst, per command (a snapshot encodes a JPEG)
    RATES: Mapping[str, tuple[float, int]] = {"snapshot": (2.0, 4)}
    DEFAULT = (5.0, 10)

    def __init__(self, names: tuple[str, ...], clock: Callable[[], float] = time.monotonic) -> None:
        self._buckets = {name: TokenBucket(*self.RATES.get(name, self.DEFAULT), clock=clock) for name in names}
        self._other = TokenBucket(*self.DEFAULT, clock=clock)
        self._lock = threading.Lock()
        self.dropped = 0

    def allow(self, name: str) -> bool:
        with self._lock:
            allowed = self._buckets.get(name, self._other).take()
            self.dropped += not allowed
            return allowed


class ThrottledLog:
    """Logs a recurring warning at most once per `every_s` seconds, with how many were held back."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self._log, self.every_s, self._clock = logger, every_s, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, key: str, message: str, *args: object) -> None:
        now = self._clock()
        with self._lock:
            if now - self._last.get(key, -self.every_s) < self.every_s:
                self._held[key] = self._held.get(key, 0) + 1
                return
            self._last[key] = now
            held = self._held.pop(key, 0)
        self._log.warning(message + (f" ({held} more like it not logged)" if held else ""), *args)
