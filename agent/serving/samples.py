"""Samples for retraining: frames a camera's model was unsure about, kept on the device with the
serving model's detections as YOLO-format labels, until the operator fetches them (the signed
``samples`` command, ``edge-agent fleet samples``; docs/cameras.md#samples-for-retraining).

Opt-in per camera (``cameras[].samples.enabled``). A frame is kept, at most one per
``min_interval_s`` per camera, for the first reason that holds, in this order: ``flagged`` (the
daemon's `flagged(camera)` says drift or camera health flagged the camera), ``shadow`` (a
shadow evaluation's per-frame comparison disagreed: `SampleStore.offer` is its hook), ``unsure``
(a detection scores within ``score_band``) or ``random`` (``random_share`` of the other frames).

A sample is three files under ``<state_dir>/samples/cam-<camera>/``, named by its id
(``<unix ms>-<seq>``): ``.jpg`` (the frame, ``privacy_masks`` blanked black before it is
encoded), ``.txt`` (YOLO labels, `yolo_labels`) and ``.json`` (camera, time, reason, bundle
version, the labels' class names), the ``.json`` written last so a listing never sees half a
sample. Each camera's samples stay within its ``max_mb`` and ``max_age_h`` (the oldest go first).

The camera thread never waits: `sink` decides and copies the frame; a bounded queue
(`QUEUE_FRAMES`) hands it to the ``samples`` thread (a `pipelines.worker.Worker`), which masks,
encodes and writes (the labels of detections centred in a mask left out). A full queue or a disk
that refuses the write drops the sample (counted in `dropped`) with a throttled log line;
detection goes on.

Threads: `sink`'s feed on each camera's inference thread, `offer` there or on the shadow's
thread; the ``samples`` thread writes and prunes; `pack` (the commands thread) and `summary`
(the page) from any thread. One lock orders the files.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import queue
import random
import re
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from agent.config.models import CameraSection, SamplesSection
from agent.errors import CodedError, ErrorCode
from agent.throttle import ThrottledLog
from pipelines.decoding.detections import Detections
from pipelines.sources.frames import Frame
from pipelines.worker import DONE, LoopState, Worker
from runtimes.files import atomic_write

log = logging.getLogger(__name__)

NAME = "samples"
FOLDER = "samples"
REASONS = ("flagged", "shadow", "unsure", "random")
QUEUE_FRAMES = 4  # frames waiting for the writer at most
MIB = 1024 * 1024
#: the longest one sample's write may hold the writer thread before health calls it hung (seconds)
WRITE_BUDGET_S = 30.0
#: the most one ``samples`` answer packs (bytes of files; the device's cap on one request)
PACK_MAX_BYTES = 64 * MIB
PACK_MAX_COUNT = 1000
#: a sample's id: Unix milliseconds and a sequence number (a file name only, never a path)
SAMPLE_ID = re.compile(r"(\d{13})-(\d{4})")
SUFFIXES = (".jpg", ".txt", ".json")

Sink = Callable[[Frame, Detections], None]


def never_flagged(camera: str) -> bool:
    """The default `flagged`: no camera is flagged (the daemon passes drift's and health's)."""
    return False


def _normalised(points: npt.NDArray[Any], width: int, height: int) -> list[float]:
    xy = np.asarray(points, np.float64).reshape(-1, 2) / (width, height)
    return [float(v) for v in np.clip(xy, 0.0, 1.0).reshape(-1)]


def yolo_labels(detections: Detections, width: int, height: int) -> str:
    """`detections` in a `width` x `height` frame as YOLO label lines, one per detection:
    ``cls cx cy w h`` (boxes, normalised to 0..1); with keypoints (pose) ``cls cx cy w h`` then
    ``x y v`` per keypoint (``x y`` for models without keypoint scores); with oriented boxes
    ``cls x1 y1 .. x4 y4`` (the four corners); with masks (segmentation) ``cls x1 y1 x2 y2 ...``
    (the mask's largest outline; the box where it has none)."""
    lines = []
    for i in range(len(detections)):
        cls = int(detections.class_id[i])
        x1, y1, x2, y2 = (float(v) for v in np.clip(detections.xyxy[i], 0, [width, height, width, height]))
        box = [(x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height]
        values: list[float]
        if detections.keypoints is not None:
            kpts = np.asarray(detections.keypoints[i], np.float64)
            values = list(box)
            for point in kpts:
                values += _normalised(point[:2].astype(np.float32), width, height)
                if point.shape[0] == 3:
                    values.append(float(min(max(point[2], 0.0), 1.0)))
        elif detections.xywhr is not None:
            cx, cy, w, h, r = (float(v) for v in detections.xywhr[i])
            corners = cv2.boxPoints(((cx, cy), (w, h), float(np.degrees(r))))
            values = _normalised(corners.astype(np.float32), width, height)
        elif detections.masks is not None:
            outlines = detections.masks.outline(i)
            corners = np.array([[x1, y1], [x2, y1], [x2, y2], [x1, y2]], np.float32)
            values = _normalised(outlines[0] if outlines else corners, width, height)
        else:
            values = box
        lines.append(" ".join([str(cls), *(f"{v:.6f}" for v in values)]))
    return "".join(f"{line}\n" for line in lines)


def blank(image: npt.NDArray[np.uint8], polygons: Sequence[Sequence[Sequence[float]]]) -> npt.NDArray[np.uint8]:
    """`image` with each of `polygons` (``[[x, y], ...]`` frame pixels) filled black, in place."""
    if polygons:
        shapes = [np.round(np.asarray(p, np.float64)).astype(np.int32).reshape(-1, 1, 2) for p in polygons]
        cv2.fillPoly(image, shapes, (0, 0, 0))
    return image


def unmasked(detections: Detections, polygons: Sequence[Sequence[Sequence[float]]]) -> Detections:
    """`detections` less those whose box centre lies within one of `polygons` (blanked: a label
    of an object nobody can see would teach a model black patches)."""
    if not polygons or not len(detections):
        return detections
    centres = (detections.xyxy[:, :2] + detections.xyxy[:, 2:]) / 2
    shapes = [np.asarray(p, np.float32).reshape(-1, 1, 2) for p in polygons]
    hidden = np.array(
        [any(cv2.pointPolygonTest(shape, (float(x), float(y)), False) >= 0 for shape in shapes) for x, y in centres]
    )
    return detections[~hidden]


@dataclass(frozen=True)
class Sample:
    """One kept sample: its camera, `id` (the files' stem), `time_ms` (Unix milliseconds) and
    the bytes its three files take."""

    camera: str
    id: str
    time_ms: int
    bytes: int


@dataclass(frozen=True)
class Pending:
    """A frame on its way to the writer."""

    camera: str
    image: npt.NDArray[np.uint8]
    detections: Detections
    reason: str
    time_ms: int


@dataclass(frozen=True)
class Pack:
    """What one ``samples`` request gets: `data`, a tar of ``images/``, ``labels/`` and
    ``meta/`` files; `count` samples, the newest at `until_ms`; `more` when the caps left some
    out (ask again from `until_ms`)."""

    data: bytes
    count: int
    until_ms: int
    more: bool


def _folder_name(camera: str) -> str:
    return f"cam-{camera}"  # never "." or "..", whatever the camera's name


class SampleStore:
    """Samples of `cameras` (their ``samples`` sections) under `folder`. `labels()` and
    `version()` are the serving version's class names and version (for the labels' names);
    `flagged(camera)` whether drift or health flagged the camera (the daemon's; default none);
    `clock` Unix seconds, `monotonic` the interval's clock, `chance()` a number in [0, 1)."""

    def __init__(
        self,
        folder: Path,
        cameras: Sequence[CameraSection],
        labels: Callable[[], list[str]],
        version: Callable[[], str | None],
        flagged: Callable[[str], bool] = never_flagged,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        chance: Callable[[], float] = random.random,
    ) -> None:
        self.folder = folder
        self.settings: dict[str, SamplesSection] = {c.name: c.samples for c in cameras if c.samples.enabled}
        self._labels, self._version, self.flagged = labels, version, flagged
        self._clock, self._monotonic, self._chance = clock, monotonic, chance
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # monotonic time of each camera's last frame handed on
        self._seq = 0
        self._queue: queue.Queue[Pending | None] = queue.Queue(maxsize=QUEUE_FRAMES)
        self._throttled = ThrottledLog(log, 60.0)
        self.kept = self.dropped = 0
        self._packed: tuple[tuple[str | None, int, int | None, int], Pack] | None = None  # the last pack
        self._worker = Worker(NAME, self._turn, described="samples", budget_s=WRITE_BUDGET_S, monotonic=monotonic)
        for camera in self.settings:
            try:
                (folder / _folder_name(camera)).mkdir(parents=True, exist_ok=True)
                for partial in (folder / _folder_name(camera)).glob("*.tmp"):
                    partial.unlink(missing_ok=True)
            except OSError as exc:
                log.error("samples: the folder %s cannot be used: %s", folder, exc)

    @property
    def enabled(self) -> bool:
        return bool(self.settings)

    # -- the cameras' threads ------------------------------------------------------------------

    def sink(self, camera: str, then: Sink) -> Sink:
        """What camera `camera`'s inference thread hands each frame to: the samples' choice,
        then `then` (`then` itself when the camera keeps no samples)."""
        settings = self.settings.get(camera)
        if settings is None:
            return then

        def feed(frame: Frame, detections: Detections) -> None:
            reason = self._reason(camera, settings, detections) if frame.inferred else None
            if reason is not None:
                self.offer(camera, frame, detections, reason)
            then(frame, detections)

        return feed

    def _reason(self, camera: str, settings: SamplesSection, detections: Detections) -> str | None:
        if self._monotonic() - self._last.get(camera, -np.inf) < settings.min_interval_s:
            return None
        if self.flagged(camera):
            return "flagged"
        band = settings.score_band
        if band is not None and len(detections):
            scores = detections.confidence
            if bool(np.any((scores >= band[0]) & (scores <= band[1]))):
                return "unsure"
        if settings.random_share > 0 and self._chance() < settings.random_share:
            return "random"
        return None

    def offer(self, camera: str, frame: Frame, detections: Detections, reason: str) -> bool:
        """Hand `frame` of `camera` on to be kept for `reason` (one of `REASONS`; the shadow's
        hook calls it with ``shadow``); False when the camera keeps no samples, its interval
        has not passed, or the queue is full (dropped). Never waits."""
        settings = self.settings.get(camera)
        if settings is None or reason not in REASONS:
            return False
        with self._lock:
            now = self._monotonic()
            if now - self._last.get(camera, -np.inf) < settings.min_interval_s:
                return False
            pending = Pending(camera, frame.image.copy(), detections, reason, int(self._clock() * 1000))
            try:
                self._queue.put_nowait(pending)
            except queue.Full:
                self.dropped += 1
                self._throttled.warning("full", "samples: the writer is behind; a sample of %s is dropped", camera)
                return False
            self._last[camera] = now
        return True

    # -- the writer thread ---------------------------------------------------------------------

    def start(self) -> None:
        if self.enabled and not self._worker.alive:
            self._worker.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued, then end the thread."""
        if not self._worker.alive:
            self._worker.stop(0)
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            self._worker.stop(0)
            return
        self._worker.stop(timeout, finish=True)

    def _turn(self) -> float | None:
        try:
            pending = self._queue.get(timeout=WRITE_BUDGET_S / 2)
        except queue.Empty:
            return 0.0
        if pending is None:
            return DONE
        self.write(pending)
        return 0.0

    def write(self, pending: Pending) -> Sample | None:
        """Mask, encode and keep `pending`, then prune its camera (the ``samples`` thread; a
        test calls it directly). None when the disk refused it (logged, throttled)."""
        settings = self.settings[pending.camera]
        image = blank(pending.image, settings.privacy_masks)
        height, width = image.shape[:2]
        detections = unmasked(pending.detections, settings.privacy_masks)
        ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, settings.quality])
        if not ok:
            self.dropped += 1
            return None
        labels = self._labels()
        meta = {
            "camera": pending.camera,
            "time": pending.time_ms / 1000,
            "reason": pending.reason,
            "version": self._version(),
            "names": labels,
            "width": width,
            "height": height,
            "detections": len(detections),
        }
        files = {
            ".jpg": encoded.tobytes(),
            ".txt": yolo_labels(detections, width, height).encode(),
            ".json": json.dumps(meta, sort_keys=True).encode(),
        }
        folder = self.folder / _folder_name(pending.camera)
        with self._lock:
            self._seq = (self._seq + 1) % 10000
            stem = f"{pending.time_ms:013d}-{self._seq:04d}"
            try:
                for suffix in SUFFIXES:  # .json last: a listing sees whole samples only
                    atomic_write(folder / f"{stem}{suffix}", files[suffix], mtime=pending.time_ms / 1000)
            except OSError as exc:
                for suffix in SUFFIXES:
                    with contextlib.suppress(OSError):  # the disk that refused the write may refuse this too
                        (folder / f"{stem}{suffix}").unlink(missing_ok=True)
                self.dropped += 1
                self._throttled.error("write", "samples: cannot keep a sample of %s: %s", pending.camera, exc)
                return None
            self.kept += 1
            self._prune_locked(pending.camera, settings)
        return Sample(pending.camera, stem, pending.time_ms, sum(len(b) for b in files.values()))

    def _prune_locked(self, camera: str, settings: SamplesSection) -> None:
        """Delete `camera`'s oldest samples while they take more than ``max_mb``, and any older
        than ``max_age_h``."""
        samples = self._listing_locked(camera)
        total = sum(s.bytes for s in samples)
        cutoff_ms = (self._clock() - settings.max_age_h * 3600) * 1000
        limit = settings.max_mb * MIB
        folder = self.folder / _folder_name(camera)
        for sample in samples:
            if sample.time_ms >= cutoff_ms and total <= limit:
                break
            for suffix in reversed(SUFFIXES):  # .json first: never a listed sample without its image
                (folder / f"{sample.id}{suffix}").unlink(missing_ok=True)
            total -= sample.bytes

    def loop(self) -> LoopState:
        return self._worker.state()

    # -- reading (any thread) ------------------------------------------------------------------

    def _listing_locked(self, camera: str) -> list[Sample]:
        """`camera`'s whole samples, oldest first."""
        folder = self.folder / _folder_name(camera)
        found = []
        for meta in folder.glob("*.json") if folder.is_dir() else ():
            match = SAMPLE_ID.fullmatch(meta.stem)
            if match is None:
                continue
            try:
                size = sum((folder / f"{meta.stem}{suffix}").stat().st_size for suffix in SUFFIXES)
            except OSError:
                continue
            found.append(Sample(camera, meta.stem, int(match.group(1)), size))
        return sorted(found, key=lambda s: s.id)

    def summary(self) -> dict[str, tuple[int, int, float | None]]:
        """Per camera that keeps samples: how many, their bytes and the newest's time (Unix s)."""
        with self._lock:
            found = {camera: self._listing_locked(camera) for camera in self.settings}
        return {
            camera: (len(s), sum(x.bytes for x in s), s[-1].time_ms / 1000 if s else None)
            for camera, s in found.items()
        }

    def pack(
        self,
        camera: str | None,
        since_ms: int,
        until_ms: int | None,
        limit: int = PACK_MAX_COUNT,
        max_bytes: int = PACK_MAX_BYTES,
    ) -> Pack:
        """The samples of `camera` (None: every camera) newer than `since_ms` and not newer than
        `until_ms` (None: all), oldest first, at most `limit` of them and `max_bytes` of files,
        as a tar (`Pack`). The same arguments give the same bytes while the samples stay (a
        chunked answer asks for it again). Raises KeyError for a camera that keeps no samples."""
        cameras = sorted(self.settings) if camera is None else [camera]
        if camera is not None and camera not in self.settings:
            raise KeyError(camera)
        with self._lock:
            chosen = [
                s
                for name in cameras
                for s in self._listing_locked(name)
                if s.time_ms > since_ms and (until_ms is None or s.time_ms <= until_ms)
            ]
            chosen.sort(key=lambda s: (s.time_ms, s.camera, s.id))
            taken, total = 0, 0
            while taken < len(chosen) and taken < limit and (not taken or total + chosen[taken].bytes <= max_bytes):
                total += chosen[taken].bytes
                taken += 1
            more = taken < len(chosen)
            while more and taken > 1 and chosen[taken - 1].time_ms == chosen[taken].time_ms:
                taken -= 1  # the next request starts after a millisecond: never cut one in two
            out, count, newest = io.BytesIO(), 0, since_ms
            with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
                for sample in chosen[:taken]:
                    folder = self.folder / _folder_name(sample.camera)
                    try:
                        files = {suffix: (folder / f"{sample.id}{suffix}").read_bytes() for suffix in SUFFIXES}
                    except OSError:
                        continue  # pruned meanwhile
                    stem = f"{sample.camera}-{sample.id}"
                    for suffix, kind in ((".jpg", "images"), (".txt", "labels"), (".json", "meta")):
                        _add(tar, f"{kind}/{stem}{suffix}", files[suffix], sample.time_ms // 1000)
                    count, newest = count + 1, sample.time_ms
        return Pack(out.getvalue(), count, newest, more)

    def packed(
        self, camera: str | None, since: float, until: float | None, limit: int = PACK_MAX_COUNT
    ) -> tuple[bytes, Mapping[str, Any]]:
        """`pack` for the ``samples`` command (times in Unix seconds): the tar and what its
        answer says (``count``, ``until``, ``more``). The last pack is kept, so a chunk asked
        for with the first answer's ``until`` is cut from the same bytes, not packed again.
        Raises `CodedError` ``NO_PIPELINE`` for a camera that keeps no samples."""
        since_ms, until_ms = round(since * 1000), None if until is None else round(until * 1000)
        key = (camera, since_ms, until_ms, limit)
        with self._lock:
            cached = self._packed
        if cached is not None and cached[0] == key:
            return cached[1].data, pack_info(cached[1])
        try:
            pack = self.pack(camera, since_ms, until_ms, limit)
        except KeyError:
            kept = ", ".join(sorted(self.settings)) or "none"
            raise CodedError(
                ErrorCode.NO_PIPELINE, f"camera {camera!r} keeps no samples here (cameras keeping samples: {kept})"
            ) from None
        with self._lock:  # the chunks ask with `until` set: found under that key
            self._packed = ((camera, since_ms, pack.until_ms, limit), pack)
        return pack.data, pack_info(pack)


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), mtime, 0o644
    tar.addfile(info, io.BytesIO(data))


def samples_for(
    cameras: Sequence[CameraSection],
    state_dir: Path,
    labels: Callable[[], list[str]],
    version: Callable[[], str | None],
    flagged: Callable[[str], bool] = never_flagged,
) -> SampleStore | None:
    """The sample store when any camera keeps samples (None: none does, and nothing is kept)."""
    if not any(c.samples.enabled for c in cameras):
        return None
    return SampleStore(state_dir / FOLDER, cameras, labels, version, flagged)


def pack_info(pack: Pack) -> Mapping[str, Any]:
    """What the ``samples`` answer says of `pack` besides its chunks."""
    return {"count": pack.count, "until": pack.until_ms / 1000, "more": pack.more}
