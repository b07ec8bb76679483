"""The one error type CLI commands raise for an expected failure."""

from __future__ import annotations


class CliError(Exception):
    """An error to print as one line, with the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status
