"""Commands a device accepts on ``<root>/<device>/cmd/<name>`` (MQTT 5 request/response).

The payload is a JSON object (or empty) checked against the command's argument model with
unknown keys forbidden; the answer goes to the request's response topic with its correlation
data: ``{"ok": true, "command": ..., "result": {...}}``, or ``{"ok": false, "error": {"code",
"message"}}``, or for ``snapshot`` the JPEG itself (content type ``image/jpeg``). An unknown
command or a bad payload is answered with an error and changes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.errors import CodedError, ErrorCode, validation_problems

log = logging.getLogger(__name__)


class CommandError(CodedError):
    """A command refused or failed; the answer carries its code and message."""


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NoArgs(_Args):
    pass


class PipelineArgs(_Args):
    pipeline: str | None = Field(default=None, description="Pipeline name; default: all (restart) or the first.")


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


def error(name: str, code: str, message: str) -> Response:
    return Response(json.dumps({"ok": False, "command": name, "error": {"code": code, "message": message}}).encode())


def run_command(commands: Mapping[str, Command], name: str, payload: bytes | bytearray) -> Response:
    """Check the payload, run the command and shape its answer; never raises."""
    command = commands.get(name)
    if command is None:
        return error(name, ErrorCode.UNKNOWN_COMMAND, f"unknown command {name!r}; known: {', '.join(sorted(commands))}")
    try:
        raw = json.loads(payload) if payload.strip() else {}
    except (ValueError, UnicodeDecodeError) as exc:
        return error(name, ErrorCode.BAD_PAYLOAD, f"the payload is not JSON: {exc}")
    if not isinstance(raw, dict):
        return error(name, ErrorCode.BAD_PAYLOAD, f"the payload must be a JSON object, got {type(raw).__name__}")
    try:
        args = command.args.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(validation_problems(exc))
        return error(name, ErrorCode.BAD_PAYLOAD, problems)
    try:
        result = command.run(args)
    except CommandError as exc:
        return error(name, exc.code, exc.message)
    except Exception as exc:  # a bug or an I/O failure: answered, logged, and the next command still runs
        log.exception("command %s failed", name)
        return error(name, ErrorCode.COMMAND_FAILED, f"{type(exc).__name__}: {exc}")
    if isinstance(result, Response):
        return result
    return Response(json.dumps({"ok": True, "command": name, "result": result}, default=str).encode())
