"""Where the agent keeps its files by default (stdlib only, so the CLI's parser can use them
without importing the config models)."""

from __future__ import annotations

from pathlib import Path

DEFAULT_CONFIG = Path("/etc/edge-agent/agent.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/edge-agent")
