"""The daemon's local faces: the status page (started with its `AgentControls`) and systemd's
STATUS= line.

`page_controls` is the one place the web room gets hold of the agent: a few callables over
`Agent`'s public methods, the rollback answered as the `DeploymentStatus` the page shows.
`start_page` serves the page when agent.yaml asks for it; one that cannot start is logged and
the agent serves on without it. `service_line` says in one line what ``systemctl status
edge-agent`` should show.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from agent.daemon.telemetry import deployment_status
from agent.errors import ConfigError
from agent.snapshot import AgentSnapshot
from agent.web.controls import AgentControls

if TYPE_CHECKING:
    from agent.daemon.agent import Agent
    from agent.web.server import StatusServer

log = logging.getLogger(__name__)


def start_page(agent: Agent) -> StatusServer | None:
    """The page for `agent`'s ``status_page`` settings, started; None when not configured or
    when it cannot start (logged: an address in use, a password file missing)."""
    settings = agent.config.status_page
    if settings is None:
        return None
    from agent.web.server import StatusServer  # Starlette and uvicorn load only when the page is on

    try:
        return StatusServer(settings, page_controls(agent)).start()
    except (OSError, ConfigError) as exc:
        log.error("status page not served: %s", exc)
        return None


def page_controls(agent: Agent) -> AgentControls:
    """What the page may read and do, over `agent` (every callable from any thread)."""
    return AgentControls(
        snapshot=agent.snapshot,
        health=agent.health,
        rollback=lambda: deployment_status(agent.rollback()),
        restart=agent.restart_camera,
        camera_jpeg=agent.camera_jpeg,
        events=lambda: list(agent.recent_events),
    )


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
