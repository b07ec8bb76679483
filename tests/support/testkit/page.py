"""Helpers of the status page, service and doctor tests: a daemon running in this process with
two installed versions, and plain HTTP requests over a real socket (urllib)."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.config.models import AgentConfig
from agent.daemon.agent import Agent
from agent.hardware.board import Board


@contextmanager
def running(config: dict[str, Any], board: Board, root: Path) -> Iterator[Agent]:
    """`Agent.start()` on `config` (agent.yaml as a dict), stopped when the block ends."""
    agent = Agent(AgentConfig.model_validate(config), board, root=root)
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def http(
    url: str,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    context: ssl.SSLContext | None = None,
) -> Answer:
    """One request; HTTP errors are answers too (status, headers, body)."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            return Answer(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read())
    except urllib.error.HTTPError as error:
        return Answer(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())
