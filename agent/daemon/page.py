"""The daemon's local faces: the status page (started with its `AgentControls`) and systemd's
STATUS= line.

`start_page` serves the page with the `AgentControls` the agent hands it (the one way the web
room gets hold of the agent) when agent.yaml asks for it; one that cannot start is logged and
the agent serves on without it. `service_line` says in one line what ``systemctl status
edge-agent`` should show.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from agent.config.models import StatusPageSection
from agent.errors import ConfigError
from agent.snapshot import AgentSnapshot
from agent.web.controls import AgentControls

if TYPE_CHECKING:
    from agent.web.server import StatusServer

log = logging.getLogger(__name__)


def start_page(settings: StatusPageSection | None, controls: Callable[[], AgentControls]) -> StatusServer | None:
    """The page for the ``status_page`` `settings`, started with `controls()`; None when not
    configured or when it cannot start (logged: an address in use, a password file missing)."""
    if settings is None:
        return None
    from agent.web.server import StatusServer  # Starlette and uvicorn load only when the page is on

    try:
        return StatusServer(settings, controls()).start()
    except (OSError, ConfigError) as exc:
        log.error("status page not served: %s", exc)
        return None


def service_line(snapshot: AgentSnapshot) -> str:
    """``serving demo 1.2.0 on onnxruntime: 2 camera(s) at 29.8 FPS; broker connected;
    governor NORMAL`` (or what is missing instead)."""
    bundle, serving = snapshot.bundle, snapshot.serving
    if snapshot.serving_error:
        parts = [f"cannot serve: {snapshot.serving_error}"]
    elif bundle is None:
        parts = ["no model installed"]
    else:
        runtime = f" on {serving.runtime}" if serving else ""
        parts = [
            f"serving {bundle.name} {bundle.version}{runtime}: {len(snapshot.cameras)} camera(s) at {snapshot.fps} FPS"
        ]
    if snapshot.broker is not None:
        parts.append("broker connected" if snapshot.broker.connected else "broker unreachable")
    if snapshot.governor is not None:
        parts.append(f"governor {snapshot.governor.decision.level}")
    return "; ".join(parts)
