"""`agent.errors.error_envelope`: the refusal's body, byte for byte as each wire serialises it
(`json.dumps` for a command's answer and the page's access refusals, Starlette's `JSONResponse`
for the page's other errors)."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse

from agent.errors import ErrorCode, error_envelope


def test_the_envelope_of_a_command_s_answer_names_the_command_between_ok_and_error() -> None:
    body = error_envelope(ErrorCode.BAD_PAYLOAD, "no such field: x", command="rollback")
    assert json.dumps(body) == (
        '{"ok": false, "command": "rollback", "error": {"code": "BAD_PAYLOAD", "message": "no such field: x"}}'
    )


def test_the_envelope_of_the_page_is_the_same_without_the_command() -> None:
    body = error_envelope(ErrorCode.NO_MEDIA, "gone, ünd so")
    assert json.dumps(body) == '{"ok": false, "error": {"code": "NO_MEDIA", "message": "gone, \\u00fcnd so"}}'
    assert JSONResponse(body).body == '{"ok":false,"error":{"code":"NO_MEDIA","message":"gone, ünd so"}}'.encode()


def test_a_code_given_as_its_name_makes_the_same_envelope() -> None:
    """Untyped callers (a plugin, a test double) raise `CodedError("NO_PIPELINE", ...)`: the
    command service always answered those as it answers `ErrorCode.NO_PIPELINE`."""
    named = error_envelope("NO_PIPELINE", "no pipeline named 'ghost'", command="restart-pipeline")  # type: ignore[arg-type]
    assert named == error_envelope(ErrorCode.NO_PIPELINE, "no pipeline named 'ghost'", command="restart-pipeline")
