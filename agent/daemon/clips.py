"""Short clips around object events: a ring buffer of encoded frames per camera, written to a
video file beside the snapshots (``<state_dir>/media/<event_id>.mp4``) by a thread of its own.

A camera with ``clips: {pre_s, post_s}`` in its ``cameras[]`` entry keeps its last frames as
JPEG (`ClipRing`: at most ``pre_s`` seconds of frame time and ``clips.buffer_mb`` MiB, the
oldest let go first). When one of its objects makes a ``start`` event, the recorder takes the
ring's frames of the last ``pre_s`` seconds, adds the camera's frames for ``post_s`` more, and
hands the clip to the ``clips`` thread through a bounded queue (`QUEUE_CLIPS`): it decodes the
frames and writes them with OpenCV's `cv2.VideoWriter` (``mp4v`` in an MP4 file; Motion JPEG in
an AVI where that codec is missing), at the FPS the frames' timestamps give, then hands the file
to the `MediaStore` (renamed into place, same retention by size and age as the snapshots).

The camera loop never waits for a clip: `frame` and `trigger` run on the camera's inference
thread and only encode one JPEG (when the camera has clips) and append references; a full queue
drops the clip (counted in `ClipStats.dropped`, logged). Clips in the making share the ring's
JPEG bytes (no copy); at most `OPEN_CLIPS` per camera are in the making at once (more are
dropped, counted), so a camera's memory is bounded by ``buffer_mb`` for its ring plus, for each
open clip, its ``post_s`` of frames (a clip that would pass ``buffer_mb`` ends early, shorter),
plus the clips queued for the writer (docs/benchmarks.md#clip-ring-buffer has the figures).

Threads: `frame`, `trigger` on each camera's inference thread (in frame order); the ``clips``
thread writes; `stats`, `loop` and `planned` from any thread. One lock orders them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from agent.config.models import AgentConfig, CameraSection, ClipSection
from agent.daemon.media import FOLDER as MEDIA_FOLDER
from agent.daemon.media import MediaStore
from pipelines.decoding.detections import Detections
from pipelines.sources.frames import Frame
from pipelines.worker import DONE, LoopState, Worker

log = logging.getLogger(__name__)

NAME = "clips"
Sink = Callable[[Frame, Detections], None]  # a camera's sink: each frame with its detections
QUEUE_CLIPS = 4  # finished clips waiting for the writer at most
OPEN_CLIPS = 4  # clips in the making per camera at most
REMEMBERED = 512  # recent event ids whose clip reference the end event repeats
MIB = 1024 * 1024
#: the longest a clip may hold the writer thread before health calls it hung (seconds)
WRITE_BUDGET_S = 60.0


@dataclass(frozen=True)
class EncodedFrame:
    """One frame kept as JPEG: `timestamp` in the frame's seconds (`Frame.timestamp`)."""

    timestamp: float
    jpeg: bytes


class ClipRing:
    """A camera's last frames as JPEG: at most `seconds` of frame time between the oldest and
    the newest, and at most `max_bytes` in all (the oldest go first). Not thread safe: the
    recorder's lock guards it."""

    def __init__(self, seconds: float, max_bytes: int) -> None:
        self.seconds, self.max_bytes = seconds, max_bytes
        self._frames: deque[EncodedFrame] = deque()
        self.bytes = 0

    def add(self, frame: EncodedFrame) -> None:
        self._frames.append(frame)
        self.bytes += len(frame.jpeg)
        while self._frames and (
            self.bytes > self.max_bytes or frame.timestamp - self._frames[0].timestamp > self.seconds
        ):
            self.bytes -= len(self._frames.popleft().jpeg)

    def since(self, timestamp: float) -> list[EncodedFrame]:
        """The frames kept whose time is `timestamp` or later, oldest first."""
        return [f for f in self._frames if f.timestamp >= timestamp]

    def __len__(self) -> int:
        return len(self._frames)


@dataclass
class _Open:
    """A clip in the making: its event, until when (frame seconds) it takes frames, and them."""

    event_id: str
    until: float
    frames: list[EncodedFrame] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(len(f.jpeg) for f in self.frames)


@dataclass(frozen=True)
class Clip:
    """A finished clip for the writer: `frames` oldest first, `fps` to write them at."""

    event_id: str
    frames: tuple[EncodedFrame, ...]
    fps: float


@dataclass(frozen=True)
class ClipStats:
    """The recorder's counters: clips `written`, `dropped` (queue full, too many open, a write
    failed), `buffered_bytes` of JPEG in the cameras' rings now, `queued` clips waiting."""

    written: int
    dropped: int
    buffered_bytes: int
    queued: int


def clip_fps(frames: Sequence[EncodedFrame], fallback: float) -> float:
    """The frame rate the frames' timestamps show ((n - 1) / span), else `fallback`."""
    if len(frames) >= 2 and frames[-1].timestamp > frames[0].timestamp:
        return (len(frames) - 1) / (frames[-1].timestamp - frames[0].timestamp)
    return fallback


def write_clip(clip: Clip, folder: Path) -> Path | None:
    """Write `clip` to a partial file in `folder` (``.<id>.part.mp4``, or ``.avi`` with Motion
    JPEG where OpenCV lacks ``mp4v``); its path, or None when OpenCV could write neither."""
    first = cv2.imdecode(np.frombuffer(clip.frames[0].jpeg, np.uint8), cv2.IMREAD_COLOR)
    if first is None:
        return None
    height, width = first.shape[:2]
    for fourcc, suffix in (("mp4v", ".mp4"), ("MJPG", ".avi")):
        path = folder / f".{clip.event_id}.part{suffix}"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*fourcc), clip.fps, (width, height))
        if not writer.isOpened():
            writer.release()
            path.unlink(missing_ok=True)
            continue
        try:
            for frame in clip.frames:
                image = cv2.imdecode(np.frombuffer(frame.jpeg, np.uint8), cv2.IMREAD_COLOR)
                if image is not None and image.shape[:2] == (height, width):
                    writer.write(image)
        finally:
            writer.release()
        return path
    return None


class ClipRecorder:
    """The clips of the cameras in `sections` that have ``clips`` set; `keep(event_id, path)`
    moves a written file into the media store and gives its reference (None: refused)."""

    def __init__(
        self,
        sections: Sequence[CameraSection],
        folder: Path,
        keep: Callable[[str, Path], str | None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.folder, self._keep, self._monotonic = folder, keep, monotonic
        self._settings: dict[str, ClipSection] = {s.name: s.clips for s in sections if s.clips is not None}
        self._fps = {s.name: s.fps or 15.0 for s in sections}
        self._rings = {name: ClipRing(c.pre_s, round(c.buffer_mb * MIB)) for name, c in self._settings.items()}
        self._open: dict[str, list[_Open]] = {name: [] for name in self._settings}
        self._last: dict[str, float] = {}
        self._planned: OrderedDict[str, str] = OrderedDict()
        self._queue: queue.Queue[Clip | None] = queue.Queue(maxsize=QUEUE_CLIPS)
        self._lock = threading.Lock()
        self._worker = Worker(NAME, self._turn, described=NAME, budget_s=WRITE_BUDGET_S, monotonic=monotonic)
        self.written = 0
        self.dropped = 0

    @property
    def enabled(self) -> bool:
        return bool(self._settings)

    # -- the cameras' inference threads --------------------------------------------------------

    def frame(self, pipeline: str, frame: Frame) -> None:
        """One frame of `pipeline`, in frame order: into its ring and the clips it completes."""
        settings = self._settings.get(pipeline)
        if settings is None:
            return
        ok, encoded = cv2.imencode(".jpg", frame.image, [cv2.IMWRITE_JPEG_QUALITY, settings.quality])
        if not ok:
            return
        kept = EncodedFrame(frame.timestamp, encoded.tobytes())
        finished: list[_Open] = []
        with self._lock:
            self._rings[pipeline].add(kept)
            self._last[pipeline] = frame.timestamp
            still: list[_Open] = []
            limit = self._rings[pipeline].max_bytes
            for clip in self._open[pipeline]:
                clip.frames.append(kept)
                full = clip.bytes + len(kept.jpeg) > limit  # the next frame would pass buffer_mb: end it here
                (finished if frame.timestamp >= clip.until or full else still).append(clip)
            self._open[pipeline] = still
        for clip in finished:
            self._hand_on(pipeline, clip)

    def trigger(self, pipeline: str, event_id: str) -> str | None:
        """Start the clip of event `event_id` around `pipeline`'s newest frame (called right
        after `frame` gave it); the reference the clip will have, or None (no clips on this
        camera, or too many in the making)."""
        settings = self._settings.get(pipeline)
        if settings is None:
            return None
        with self._lock:
            now = self._last.get(pipeline)
            if now is None:
                return None
            if len(self._open[pipeline]) >= OPEN_CLIPS:
                self.dropped += 1
                log.warning("clips: %s has %d clips in the making: event %s gets none", pipeline, OPEN_CLIPS, event_id)
                return None
            pre = self._rings[pipeline].since(now - settings.pre_s)
            self._open[pipeline].append(_Open(event_id, now + settings.post_s, pre))
            name = f"{event_id}.mp4"
            self._planned[event_id] = name
            while len(self._planned) > REMEMBERED:
                self._planned.popitem(last=False)
        return name

    def planned(self, event_id: str) -> str | None:
        """The clip reference `trigger` gave event `event_id` (the ``end`` event repeats it)."""
        with self._lock:
            return self._planned.get(event_id)

    def _hand_on(self, pipeline: str, clip: _Open) -> None:
        frames = tuple(clip.frames)
        try:
            self._queue.put_nowait(Clip(clip.event_id, frames, clip_fps(frames, self._fps[pipeline])))
        except queue.Full:
            with self._lock:
                self.dropped += 1
            log.warning("clips: the writer is behind (%d waiting): event %s gets no clip", QUEUE_CLIPS, clip.event_id)

    def finish(self) -> None:
        """The cameras stopped: clips still in the making are written with what they have."""
        with self._lock:
            found = [(name, clip) for name, clips in self._open.items() for clip in clips]
            self._open = {name: [] for name in self._open}
        for name, clip in found:
            self._hand_on(name, clip)

    # -- the writer thread ---------------------------------------------------------------------

    def start(self) -> None:
        if not self.enabled or self._worker.alive:
            return
        self._worker.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued (clips `finish` handed on included), then end the thread."""
        if not self._worker.alive:  # never started, or ended (logged): nobody would take the marker
            self._worker.stop(0)
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.error("clips: the writer did not take its stop within %.0f s", timeout)
            self._worker.stop(0)
            return
        self._worker.stop(timeout, finish=True)

    def _turn(self) -> float | None:
        """Write the next clip handed on (waiting for one at most half the budget); `DONE` at
        the stop marker."""
        try:
            clip = self._queue.get(timeout=WRITE_BUDGET_S / 2)
        except queue.Empty:
            return 0.0
        if clip is None:
            return DONE
        self._worker.beat(WRITE_BUDGET_S)
        self._write(clip)
        return 0.0

    def _write(self, clip: Clip) -> None:
        """Encode `clip` and hand it to `keep`; a clip that fails (even by a bug, which then
        fails the turn) is counted dropped and leaves no file behind."""
        path = name = None
        try:
            path = write_clip(clip, self.folder) if clip.frames else None
            name = self._keep(clip.event_id, path) if path is not None else None
        except (OSError, cv2.error) as exc:
            log.error("clips: cannot write the clip of event %s: %s", clip.event_id, exc)
        finally:
            if path is not None and name is None:
                path.unlink(missing_ok=True)
            with self._lock:
                if name is None:
                    self.dropped += 1
                else:
                    self.written += 1

    def stats(self) -> ClipStats:
        with self._lock:
            buffered = sum(ring.bytes for ring in self._rings.values())
            return ClipStats(self.written, self.dropped, buffered, self._queue.qsize())

    def loop(self) -> LoopState:
        """How far the ``clips`` thread is past its turn, whether its turns fail, or why it ended
        (any thread)."""
        return self._worker.state()


def media_for(config: AgentConfig) -> tuple[MediaStore | None, ClipRecorder | None]:
    """The media store (with ``events.snapshots`` or any camera's ``clips``) and the clip
    recorder (with any camera's ``clips``) for `config`; None where it has neither."""
    clips_wanted = any(p.clips is not None for p in config.cameras)
    if not (config.events.snapshots or clips_wanted):
        return None, None
    media = MediaStore(config.state_dir / MEDIA_FOLDER, config.events.media)
    return media, ClipRecorder(config.cameras, media.folder, media.keep_clip) if clips_wanted else None


def with_clips(clips: ClipRecorder | None, pipeline: str, sink: Sink) -> Sink:
    """What a camera's inference thread hands each frame to: the clips' ring (when `clips`),
    then `sink` (the events)."""
    if clips is None:
        return sink

    def feed(frame: Frame, detections: Detections) -> None:
        clips.frame(pipeline, frame)
        sink(frame, detections)

    return feed
