"""The daemon's local faces: the status page's `AgentControls` and systemd's STATUS= line.

`page_controls` is the one place the web room gets hold of the agent: a few callables over
`Agent`'s public methods, the rollback answered as the `DeploymentStatus` the page shows.
`service_line` says in one line what ``systemctl status edge-agent`` should show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.daemon.deployer import deployment_status
from agent.snapshot import AgentSnapshot
from agent.web.controls import AgentControls

if TYPE_CHECKING:
    from agent.daemon.agent import Agent


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
