"""What the daemon hands the status page: `AgentControls`, a few typed callables.

The web room reads the agent only through them (an import contract keeps it from reaching
into the daemon), so the page can be served, and tested, against anything that provides them.
Every callable may be called from any thread (the server's worker threads); the actions raise
`agent.errors.CodedError` with ``NO_PREVIOUS``, ``BUSY``, ``NO_PIPELINE`` or ``NO_FRAME``.
The daemon makes them in `agent.daemon.actions.DeviceActions.controls`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.event_values import Event
from agent.snapshot import AgentSnapshot, DeploymentStatus, Health


@dataclass(frozen=True)
class AgentControls:
    """`snapshot` and `health` read the agent now; `rollback` returns to the previous version
    (the deployment record it made); `restart(camera)` restarts one camera's pipeline with a
    fresh source (the names restarted); `camera_jpeg(camera, quality)` is its newest frame with
    the detections drawn; `events` the recent object and governor events, oldest first, without
    their JPEG crops (each one's `to_json` is the ``events`` topic's document less ``device``);
    `media(event_id, kind)` an event's kept ``snapshot`` or ``clip`` with its content type
    (None: not kept; the field None: the device keeps no media); `samples()` the samples for
    retraining kept per camera, `SamplesKept` (the field None: no camera keeps samples);
    `camera_reference(camera)` the camera's health reference image as JPEG and
    `accept_view(camera)` makes its next frame the new reference (docs/cameras.md "Camera
    health"; the fields None: no health checks)."""

    snapshot: Callable[[], AgentSnapshot]
    health: Callable[[], Health]
    rollback: Callable[[], DeploymentStatus]
    restart: Callable[[str], list[str]]
    camera_jpeg: Callable[[str, int], bytes]
    events: Callable[[], list[Event]]
    media: Callable[[str, str], tuple[bytes, str] | None] | None = None
    samples: Callable[[], dict[str, SamplesKept]] | None = None  # samples for retraining (issue 40)
    camera_reference: Callable[[str], bytes] | None = None
    accept_view: Callable[[str], None] | None = None


# -- samples for retraining (issue 40 item 3) -----------------------------------------------------


@dataclass(frozen=True)
class SamplesKept:
    """One camera's samples for retraining on the device: how many, their bytes, and the newest
    one's time (Unix seconds; None: none kept yet)."""

    count: int
    bytes: int
    newest: float | None

    def to_json(self) -> dict[str, int | float | None]:
        return {"count": self.count, "bytes": self.bytes, "newest": self.newest}
