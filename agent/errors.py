"""Errors of the device side that carry a machine-readable code (published on MQTT, shown on
the status page) and a message a technician can act on."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class CodedError(Exception):
    """An error with an upper-case `code` for machines and a `message` for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class BundleError(CodedError):
    """A bundle was refused or could not be installed or activated.

    `code` is one of the upper-case codes listed in ``docs/bundles.md``.
    """


class ConfigError(ValueError):
    """The configuration file cannot be read or is invalid; the message lists every problem."""


def validation_problems(exc: ValidationError) -> list[str]:
    """Each problem pydantic found, as ``dotted.location: message`` (``(top)`` for the whole)."""
    return [f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()]
