"""The device's command service: `agent.mqtt.commands.COMMAND_TABLE` served over MQTT 5
request/response on ``<root>/<device>/cmd/<name>`` (docs/mqtt.md#commands).

Admission (`offer`, on paho's network thread): a retained request is never run; one that asks
to be answered outside the reply space is not run; then the request is charged to a rate limit
(`RateLimits`), and which one depends on who sent it (`vouched_for`): a request the gate vouches
for (signed by an operator key, for this device, fresh, not run before; or any, where unsigned
control is allowed) to its command's own, so a flood of one command neither fills the queue nor
starves the others; one it does not (unsigned, badly signed, not JSON, larger than
`MAX_CONTROL_BYTES`) to one bucket shared by every name, so junk on a command's topic never
uses up what the operator's signed requests of that name need; a name the table lacks to one
more. Telling them apart costs a scan for ``"signature"`` and, where there is one, a parse of at
most 16 KiB and one Ed25519 verify (about 100 µs). A payload larger than 16 KiB is not kept: it
is answered ``BAD_PAYLOAD`` unread; the queue holds `QUEUE_SIZE` requests, the rest are dropped.
Refusals are logged at most once per 10 s with a count (`ThrottledLog`).

The ``commands`` thread takes the requests in order and answers each on its response topic
with its correlation data. `run_command` checks and runs one: the envelope through the
`ControlGate` (``UNAUTHORIZED``), the arguments through the row's model (``BAD_PAYLOAD``), then
the row's action; the answer is ``{"ok": true, "command", "result"}`` (with ``"deprecated"``,
a note, when the request used a name kept for one release: logged at most once per 10 s too),
``{"ok": false, "command", "error": {"code", "message"}}`` or the JPEG itself. Nothing a
request carries ends the thread: a payload of any shape (nested a thousand deep, not UTF-8, not
JSON) is answered ``BAD_PAYLOAD``, a failing action ``COMMAND_FAILED``, and the next request runs.

Health: the thread announces its next turn (a second ahead while it waits for requests, the
row's `budget_s` ahead while a command runs), and `loop()` says how far it is past that turn or
that its thread is not running, which `Agent.health()` counts (``/healthz``, the watchdog).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from agent.errors import CodedError, ErrorCode, error_envelope, validation_problems
from agent.mqtt.commands import COMMAND_TABLE, Blob, Command, CommandActions, Jpeg, Rate, shorten
from agent.mqtt.control import ControlGate, ControlRefused
from agent.mqtt.link import Message, MqttLink
from agent.mqtt.protocol import MAX_CONTROL_BYTES, CommandRequest, ProtocolError, ProtocolTooNew, Topics
from agent.throttle import ThrottledLog, TokenBucket
from pipelines.worker import DONE, LoopState, Worker

log = logging.getLogger(__name__)

#: requests waiting for the commands thread, at most
QUEUE_SIZE = 64
#: seconds the idle thread waits for a request before it turns again
IDLE_TURN_S = 1.0
#: the commands thread in `Health`'s words
NAME = "the commands thread (MQTT commands)"


class CommandError(CodedError):
    """A command refused or failed; the answer carries its code and message."""


@dataclass(frozen=True)
class Response:
    """An answer: its bytes and content type."""

    payload: bytes
    content_type: str = "application/json"
    deprecated: tuple[str, ...] = ()  # what the request named by a name kept for one release

    @property
    def ok(self) -> bool:
        return self.content_type != "application/json" or bool(json.loads(self.payload).get("ok"))


def error(name: str, code: ErrorCode, message: str) -> Response:
    return Response(json.dumps(error_envelope(code, message, command=shorten(name))).encode())


def too_large(size: int) -> str:
    return f"the request is {size} bytes, more than the {MAX_CONTROL_BYTES} a command may be; it was not read"


def read_arguments(payload: bytes, name: str, gate: ControlGate | None) -> dict[str, Any]:
    """The arguments of a request on ``cmd/<name>``, once its envelope passed `gate` (None: no
    checks, for tests of the commands themselves). A payload over `MAX_CONTROL_BYTES` is
    refused before it is parsed. Raises `CommandError`."""
    if len(payload) > MAX_CONTROL_BYTES:
        raise CommandError(ErrorCode.BAD_PAYLOAD, too_large(len(payload)))
    try:
        raw = json.loads(payload) if payload.strip() else {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise CommandError(ErrorCode.BAD_PAYLOAD, f"the payload is not JSON: {shorten(str(exc))}") from exc
    except RecursionError as exc:  # json's parser recurses once per level of nesting
        raise CommandError(ErrorCode.BAD_PAYLOAD, "the payload is nested too deeply to be a command") from exc
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
    except ProtocolTooNew as exc:
        raise CommandError(exc.code, exc.message) from exc
    except ProtocolError as exc:
        raise CommandError(ErrorCode.BAD_PAYLOAD, str(exc)) from exc
    except ControlRefused as exc:
        raise CommandError(ErrorCode.UNAUTHORIZED, exc.message) from exc
    return request.args


def run_command(
    commands: Mapping[str, Command[Any]],
    actions: CommandActions,
    name: str,
    payload: bytes | bytearray,
    gate: ControlGate | None = None,
) -> Response:
    """Check the request on ``cmd/<name>``, run its row of `commands` on `actions` and shape
    the answer; never raises for what the request carries."""
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
    except RecursionError:  # arguments nested deeper than pydantic's checks go
        return error(name, ErrorCode.BAD_PAYLOAD, "the arguments are nested too deeply")
    notes = (*((command.deprecated,) if command.deprecated else ()), *args.deprecations())
    try:
        result = command.run(actions, args)
    except CodedError as exc:  # a CommandError, or the agent's own refusal (NO_PREVIOUS, BUSY, ...)
        return error(name, exc.code, exc.message)
    except Exception as exc:  # a bug or an I/O failure: answered, logged, and the next command still runs
        log.exception("command %s failed", name)
        return error(name, ErrorCode.COMMAND_FAILED, shorten(f"{type(exc).__name__}: {exc}", 300))
    if isinstance(result, Jpeg):
        return Response(result.data, "image/jpeg", notes)
    if isinstance(result, Blob):
        return Response(result.data, result.content_type, notes)
    answer = {"ok": True, "command": name, "result": result, **({"deprecated": "; ".join(notes)} if notes else {})}
    return Response(json.dumps(answer, default=str).encode(), deprecated=notes)


def vouched_for(payload: bytes, name: str, gate: ControlGate) -> bool:
    """Whether `gate` vouches for who sent a request on ``cmd/<name>`` (`ControlGate.vouches_for`),
    asked at admission, before the command's rate limit is charged; never raises. A payload that
    does not mention ``"signature"`` is unsigned: vouched for where unsigned control is allowed.
    One that does is parsed (callers pass at most `MAX_CONTROL_BYTES`) and checked: one Ed25519
    verify. Where unsigned control is allowed, only a signature that fails is not vouched for."""
    if b'"signature"' not in payload:
        return gate.allow_unsigned
    try:
        request: CommandRequest = CommandRequest.parse(payload, f"the {name} request")
    except Exception:  # not an envelope (bare arguments that mention "signature"), or junk
        return gate.allow_unsigned
    try:
        return gate.vouches_for(request, name)
    except Exception:  # whatever the document makes a check raise: not vouched for, and answered in turn
        return False


class RateLimits:
    """One bucket per command of `table` (at its row's `Rate`) for the requests the gate vouches
    for, one (`UNVERIFIED`) shared by every command for those it does not, and one shared by every
    name the table lacks: a flood of one command neither fills the queue nor starves the others,
    and junk never uses up what the operator's own requests need (`allow` from paho's network
    thread)."""

    DEFAULT = (5.0, 10)
    #: every request nobody with an operator key sent (unsigned, badly signed, too large), all names together
    UNVERIFIED = Rate(5.0, 10)

    def __init__(self, table: Iterable[Command[Any]], clock: Callable[[], float] = time.monotonic) -> None:
        self._buckets = {c.name: TokenBucket(c.rate.per_s, c.rate.burst, clock=clock) for c in table}
        self._other = TokenBucket(*self.DEFAULT, clock=clock)
        self._unverified = TokenBucket(self.UNVERIFIED.per_s, self.UNVERIFIED.burst, clock=clock)
        self._lock = threading.Lock()
        self.dropped = 0

    def allow(self, name: str, vouched: bool = True) -> bool:
        """Take a token for a request on ``cmd/<name>`` that the gate vouched for, or did not."""
        with self._lock:
            bucket = self._buckets.get(name)
            if bucket is None:
                bucket = self._other
            elif not vouched:
                bucket = self._unverified
            allowed = bucket.take()
            self.dropped += not allowed
            return allowed


@dataclass(frozen=True)
class _Request:
    """A request let in, and its answer when admission already knows it (a payload too large)."""

    message: Message
    refusal: Response | None = None


class CommandService:
    """Serves `table` (default: the device's commands) for `device` on `link`: requests under
    `topics` pass `gate` and run on `actions` (see the module text). `monotonic` is the clock
    of the rate limits, the throttled log and the thread's announced turns (seconds)."""

    def __init__(
        self,
        link: MqttLink,
        topics: Topics,
        device: str,
        gate: ControlGate,
        actions: CommandActions,
        table: Iterable[Command[Any]] = COMMAND_TABLE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.link, self.topics, self.device, self.gate, self.actions = link, topics, device, gate, actions
        self.commands = {command.name: command for command in table}
        self.limits = RateLimits(self.commands.values(), monotonic)
        self._throttled = ThrottledLog(log, clock=monotonic)
        self._queue: queue.Queue[_Request | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self._stopping = threading.Event()
        self._worker = Worker("commands", self._turn, described=NAME, budget_s=IDLE_TURN_S, monotonic=monotonic)

    def start(self) -> None:
        """Subscribe to this device's commands and start the ``commands`` thread."""
        self._stopping.clear()
        self.link.subscribe(self.topics.command(self.device, "+"), self.offer)
        self._worker.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Answer what is queued, then end the thread; later requests are ignored."""
        self._stopping.set()
        with contextlib.suppress(queue.Full):  # when full, the thread sees `_stopping` once it is empty
            self._queue.put_nowait(None)
        self._worker.stop(timeout, finish=True)

    def loop(self) -> LoopState:
        """How far the ``commands`` thread is past its announced turn, whether its turns fail, or
        why it ended (any thread)."""
        return self._worker.state()

    # -- admission (paho's network thread) -----------------------------------------------------

    def offer(self, message: Message) -> None:
        """Refuse at once what must never run, queue the rest (see the module text)."""
        if self._stopping.is_set():
            return
        name = message.topic.rsplit("/", 1)[1]
        if message.retain:
            self._throttled.warning("retained", "commands: a retained %s was not run (clear it)", shorten(name))
            return
        reply = message.response_topic
        if reply is not None and not self.topics.is_reply_topic(reply):
            self._throttled.warning(
                "reply",
                "commands: %s not run: it asks to be answered on %s, outside %s/",
                shorten(name),
                shorten(reply),
                self.topics.replies,
            )
            return
        fits = len(message.payload) <= MAX_CONTROL_BYTES
        vouched = fits and name in self.commands and vouched_for(message.payload, name, self.gate)
        if not self.limits.allow(name, vouched):
            if vouched or name not in self.commands:
                self._throttled.warning("rate", "commands: %s requests over the rate limit dropped", shorten(name))
            else:
                self._throttled.warning(
                    "unverified",
                    "commands: requests no operator key vouches for (unsigned, badly signed, too large) "
                    "over their rate limit dropped (%s among them)",
                    shorten(name),
                )
            return
        request = _Request(message)
        if not fits:
            self._throttled.warning("size", "commands: a %d-byte %s request refused unread", len(message.payload), name)
            refusal = error(name, ErrorCode.BAD_PAYLOAD, too_large(len(message.payload)))
            request = _Request(dataclasses.replace(message, payload=b""), refusal)
        try:
            self._queue.put_nowait(request)
        except queue.Full:
            self._throttled.warning("full", "commands: the queue is full, %s dropped", shorten(name))

    # -- the commands thread -------------------------------------------------------------------

    def _turn(self) -> float | None:
        """Answer the next request, waiting for one at most `IDLE_TURN_S`; `DONE` at the stop
        marker, or once stopping with nothing left."""
        try:
            request = self._queue.get(timeout=IDLE_TURN_S)
        except queue.Empty:
            return DONE if self._stopping.is_set() else 0.0
        if request is None:
            return DONE
        self._answer(request)
        return 0.0

    def _answer(self, request: _Request) -> None:
        message = request.message
        name = message.topic.rsplit("/", 1)[1]
        command = self.commands.get(name)
        self._worker.beat(command.budget_s if command is not None else 0.0)
        try:
            response = request.refusal or run_command(self.commands, self.actions, name, message.payload, self.gate)
            if response.ok:
                log.info("command %s: ok", shorten(name))
                if response.deprecated:  # at most once per window: anyone vouched for can send them
                    self._throttled.warning("deprecated", "command %s: %s", name, "; ".join(response.deprecated))
            else:  # refusals: anyone on the broker can cause them
                self._throttled.log(
                    logging.INFO, "refused", "command %s: %s", shorten(name), response.payload.decode()[:200]
                )
            self.link.reply(message, response.payload, response.content_type)
        except Exception:  # a bug here must cost one answer, not the commands thread
            log.exception("commands: %s could not be answered", shorten(name))
