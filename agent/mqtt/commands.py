"""The commands a device accepts on ``<root>/<device>/cmd/<name>``, in one table (docs/mqtt.md).

`COMMAND_TABLE` is the one place a command is declared, one `Command` row each: its name (the
topic's last level; `agent.mqtt.protocol.COMMANDS` is made from the table), the model of its
arguments (unknown keys forbidden, every value bounded), its rate limit, how long it may hold
the commands thread (`budget_s`, for the daemon's health), and what it does: a function of the
device's `CommandActions` and the checked arguments that returns the answer's ``result`` (a
JSON object), a `Jpeg` or a `Blob`. Adding a command is one row here (plus a field of `CommandActions`
when it needs something the device does not offer yet) and its line in docs/mqtt.md.

`agent.daemon.command_service.CommandService` serves the table on the device: admission,
rate limits, the queue, the signature check, dispatch and the answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from hashlib import sha256
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent.bundles.record import Deployment
from agent.errors import CodedError, ErrorCode

#: longest value echoed back in an error message
ECHO_LIMIT = 80
#: the notes an answer carries for the names renamed in this release (kept for one release)
RESTART_PIPELINE = "restart-pipeline is deprecated: use restart-camera (restart-pipeline goes in the next release)"
PIPELINE_ARGUMENT = "the argument pipeline is deprecated: use camera (pipeline goes in the next release)"
#: how long a rollback may wait for the deployer to get to it (then it is answered ``BUSY``)
ROLLBACK_WAIT_S = 60.0
#: bytes per chunk of a clip sent by the ``media`` command (AWS IoT Core takes 128 KiB a message)
CLIP_CHUNK = 96 * 1024
#: the most samples one ``samples`` answer packs (the device also caps its bytes)
SAMPLES_LIMIT = 1000
#: how long packing the samples (reading up to 64 MiB of files) may hold the commands thread
SAMPLES_BUDGET_S = 30.0


def shorten(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text` cut to `limit` characters (never echo a megabyte back)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def deprecations(self) -> tuple[str, ...]:
        """The notes of the deprecated arguments given (kept for one release), for the answer."""
        return ()


class NoArgs(_Args):
    pass


class CameraArgs(_Args):
    camera: str | None = Field(
        default=None, max_length=64, description="Camera name; default: all (restart) or the first."
    )
    pipeline: str | None = Field(
        default=None, max_length=64, description="The old name of camera (deprecated, removed in the next release)."
    )

    @model_validator(mode="after")
    def _one_name(self) -> CameraArgs:
        if self.camera is not None and self.pipeline is not None:
            raise ValueError("camera and pipeline (its deprecated name) are both given: give camera only")
        return self

    @property
    def name(self) -> str | None:
        """The camera named, by either name (None: all or the first)."""
        return self.camera if self.camera is not None else self.pipeline

    def deprecations(self) -> tuple[str, ...]:
        return (PIPELINE_ARGUMENT,) if self.pipeline is not None else ()


class MediaArgs(_Args):
    event: str = Field(pattern=r"^[0-9a-f]{16}$", description="The event's object_id.")
    clip: bool = Field(default=False, description="The event's clip instead of its snapshot (in chunks).")
    chunk: int | None = Field(
        default=None, ge=0, description="With clip: the chunk to send (unset: the clip's size, chunks and sha256)."
    )
    chunk_size: int = Field(
        default=CLIP_CHUNK, ge=1024, le=1024 * 1024, description="With clip: bytes per chunk (1 KiB .. 1 MiB)."
    )


# -- samples for retraining (issue 40 item 3) ---------------------------------------------------


class SamplesArgs(_Args):
    camera: str | None = Field(
        default=None, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$", description="Camera name; default: every camera."
    )
    since: float = Field(default=0.0, ge=0, le=1e11, description="Samples kept after this time (Unix seconds).")
    until: float | None = Field(
        default=None, ge=0, le=1e11, description="Samples kept up to this time (the first answer's until)."
    )
    limit: int = Field(default=SAMPLES_LIMIT, ge=1, le=SAMPLES_LIMIT, description="Most samples in one answer.")
    chunk: int | None = Field(
        default=None, ge=0, description="The chunk to send (unset: the archive's size, chunks and sha256)."
    )
    chunk_size: int = Field(
        default=CLIP_CHUNK, ge=1024, le=1024 * 1024, description="Bytes per chunk (1 KiB .. 1 MiB)."
    )


# -- end of samples for retraining ------------------------------------------------------------


class CameraReferenceArgs(_Args):
    camera: str = Field(min_length=1, max_length=64, description="The camera whose new view is accepted.")


class SnapshotArgs(CameraArgs):
    quality: int = Field(default=85, ge=1, le=100, description="JPEG quality.")


@dataclass(frozen=True)
class CommandActions:
    """What the commands act on, handed over by the daemon; each is called on the commands
    thread. `state()` is the agent's lifecycle state (``online``, ``stopping``, ...);
    `rollback()` returns to the previous version and gives the deployment record it made;
    `restart(camera)` restarts one camera's pipeline (None: all) and gives the names restarted;
    `camera_jpeg(camera, quality)` is the camera's newest frame, annotated, as JPEG (None: the
    first camera); `clock()` is the wall clock (Unix seconds); `media(event)` is the snapshot
    kept for an event, as JPEG (``NO_MEDIA``; None: the device keeps none); `clip(event)` the
    clip kept for an event (``NO_MEDIA``; None: no camera keeps clips); `samples(args)` the tar of
    the samples for retraining `args` select and what to say of it (``count``, ``until``, ``more``;
    ``NO_PIPELINE`` for a camera that keeps none; None: no camera keeps samples); `reset_counts()` sets every line
    and zone total to zero and answers ``{"since", "before"}`` (None: the device keeps no
    totals, and the command fails); `accept_view(camera)` makes the camera's next frame its
    health reference image (None: the device checks no camera's health). The actions raise
    `agent.errors.CodedError` (``NO_PREVIOUS``, ``BUSY``, ``NO_PIPELINE``, ``NO_FRAME``), which
    the answer carries."""

    state: Callable[[], str]
    rollback: Callable[[], Deployment]
    restart: Callable[[str | None], list[str]]
    camera_jpeg: Callable[[str | None, int], bytes]
    clock: Callable[[], float] = time.time
    reset_counts: Callable[[], Mapping[str, Any]] | None = None
    media: Callable[[str], bytes] | None = None
    clip: Callable[[str], bytes] | None = None
    samples: Callable[[SamplesArgs], tuple[bytes, Mapping[str, Any]]] | None = None
    accept_view: Callable[[str], None] | None = None


@dataclass(frozen=True)
class Jpeg:
    """An answer that is an image: sent as it is, content type ``image/jpeg``."""

    data: bytes


@dataclass(frozen=True)
class Blob:
    """An answer that is bytes of another content type (a chunk of a clip: ``video/mp4``)."""

    data: bytes
    content_type: str


#: what a command gives: the answer's ``result`` object, a JPEG or other bytes
Answer = Mapping[str, Any] | Jpeg | Blob
A = TypeVar("A", bound=_Args)


@dataclass(frozen=True)
class Rate:
    """A command's rate limit: `per_s` requests a second on average, `burst` at once."""

    per_s: float = 5.0
    burst: int = 10


@dataclass(frozen=True)
class Command(Generic[A]):
    """One row of the table: `name`, the `args` model, what it does (`run`), its `rate` limit
    and `budget_s`, the seconds it may hold the commands thread beyond the health stall limit
    before the daemon calls that thread hung (0: a quick command); `deprecated`, for an old name
    kept for one release, the note its answers carry."""

    name: str
    args: type[A]
    run: Callable[[CommandActions, A], Answer]
    rate: Rate = Rate()
    budget_s: float = 0.0
    deprecated: str | None = None


def _media(device: CommandActions, event: str) -> bytes:
    if device.media is None:
        raise CodedError(ErrorCode.NO_MEDIA, "this device keeps no event snapshots (events.snapshots is off)")
    return device.media(event)


def _media_answer(device: CommandActions, args: MediaArgs) -> Answer:
    """The ``media`` command: the snapshot (JPEG); with ``clip``, the clip's size, chunk count
    and sha256 (no ``chunk``) or its chunk ``chunk`` (``video/mp4`` bytes)."""
    if not args.clip:
        return Jpeg(_media(device, args.event))
    if device.clip is None:
        raise CodedError(ErrorCode.NO_MEDIA, "this device keeps no clips (no camera has clips set)")
    return chunked(device.clip(args.event), args.chunk, args.chunk_size, "video/mp4", "the clip")


def chunked(
    data: bytes, chunk: int | None, chunk_size: int, content_type: str, what: str, info: Mapping[str, Any] | None = None
) -> Answer:
    """`data` sent in chunks: without `chunk`, its size, chunk count and sha256 (and `info`);
    with `chunk`, that chunk's bytes as `content_type` (a clip, the samples' archive)."""
    chunks = max(1, -(-len(data) // chunk_size))
    if chunk is None:
        digest = sha256(data).hexdigest()
        return {**(info or {}), "size": len(data), "chunk_size": chunk_size, "chunks": chunks, "sha256": digest}
    if chunk >= chunks:
        raise CodedError(ErrorCode.BAD_PAYLOAD, f"chunk {chunk} is past {what}'s last chunk ({chunks - 1})")
    start = chunk * chunk_size
    return Blob(data[start : start + chunk_size], content_type)


def _samples_answer(device: CommandActions, args: SamplesArgs) -> Answer:
    """The ``samples`` command: the samples for retraining `args` select, as a tar in chunks."""
    if device.samples is None:
        raise CodedError(ErrorCode.NO_MEDIA, "this device keeps no samples (no camera has samples.enabled)")
    data, info = device.samples(args)
    return chunked(data, args.chunk, args.chunk_size, "application/x-tar", "the samples' archive", info)


def _reset_counts(device: CommandActions) -> Mapping[str, Any]:
    if device.reset_counts is None:
        raise RuntimeError("this device keeps no line and zone totals")
    return device.reset_counts()


def _camera_reference(device: CommandActions, args: CameraReferenceArgs) -> Answer:
    """The ``camera-reference`` command: the camera's next frame becomes its health reference
    (its new normal view), so "moved" clears (docs/cameras.md "Camera health")."""
    if device.accept_view is None:
        raise CodedError(ErrorCode.NO_PIPELINE, "this device checks no camera's health")
    device.accept_view(args.camera)
    return {"camera": args.camera, "reference": "the next frame"}


def _restart(device: CommandActions, args: CameraArgs) -> Answer:
    return {"restarted": device.restart(args.name)}


COMMAND_TABLE: tuple[Command[Any], ...] = (
    Command("rollback", NoArgs, lambda device, _: asdict(device.rollback()), budget_s=ROLLBACK_WAIT_S),
    Command("restart-camera", CameraArgs, _restart),
    Command("snapshot", SnapshotArgs, lambda device, a: Jpeg(device.camera_jpeg(a.name, a.quality)), Rate(2.0, 4)),
    Command("ping", NoArgs, lambda device, _: {"pong": round(device.clock(), 3), "state": device.state()}),
    Command("media", MediaArgs, _media_answer, Rate(8.0, 16)),
    Command("samples", SamplesArgs, _samples_answer, Rate(8.0, 16), budget_s=SAMPLES_BUDGET_S),
    Command("reset-counts", NoArgs, lambda device, _: _reset_counts(device), Rate(0.2, 2)),
    Command("restart-pipeline", CameraArgs, _restart, deprecated=RESTART_PIPELINE),
    Command("camera-reference", CameraReferenceArgs, _camera_reference, Rate(0.5, 4)),
)
