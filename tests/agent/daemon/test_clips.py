"""`agent.daemon.clips`: the ring of encoded frames (bounded by seconds and by bytes), a clip
written with OpenCV around an object's start and read back (its frames cover ``pre_s + post_s``
at the camera's FPS, from a synthetic source with exact frame times), the camera loop never
waiting for the writer, the clips in the media store's retention (an injected clock), and the
writer thread in health."""

from __future__ import annotations

import threading
from pathlib import Path

import cv2
import numpy as np
import pytest
from testkit.net import wait_until

from agent.config.models import CameraSection, ClipSection, MediaSection
from agent.daemon.clips import (
    NAME,
    OPEN_CLIPS,
    QUEUE_CLIPS,
    WRITE_BUDGET_S,
    ClipRecorder,
    ClipRing,
    EncodedFrame,
    clip_fps,
)
from agent.daemon.media import MIB, MediaStore
from agent.snapshot import judge_health
from pipelines.sources.frames import Frame

FPS = 8.0  # frame times i / 8 are exact in binary, so the bounds are met exactly


def ident(i: int) -> str:
    return f"{i:016x}"


def scene(i: int, size: tuple[int, int] = (160, 120)) -> np.ndarray:
    """A synthetic frame: a bright square that moves one step a frame, on a grey ground."""
    width, height = size
    image = np.full((height, width, 3), 60, np.uint8)
    x = (i * 7) % (width - 20)
    image[40:60, x : x + 20] = (255, 200, 40)
    return image


def frames(start: int, stop: int) -> list[Frame]:
    return [Frame(i, i / FPS, scene(i)) for i in range(start, stop)]


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def camera(pre_s: float = 1.0, post_s: float = 2.0, buffer_mb: float = 4.0) -> CameraSection:
    return CameraSection(
        name="cam0", source="synthetic", fps=FPS, clips=ClipSection(pre_s=pre_s, post_s=post_s, buffer_mb=buffer_mb)
    )


def test_the_ring_keeps_pre_s_of_frame_time() -> None:
    ring = ClipRing(seconds=1.0, max_bytes=10**9)
    for i in range(40):
        ring.add(EncodedFrame(i / FPS, b"x" * 10))
    kept = ring.since(0.0)
    assert [f.timestamp for f in kept] == [i / FPS for i in range(31, 40)], "one second at 8 fps: 9 frames"
    assert ring.bytes == 90 and len(ring) == 9
    assert [f.timestamp for f in ring.since(39 / FPS - 0.5)] == [i / FPS for i in range(35, 40)]


def test_the_ring_is_bounded_by_bytes_before_seconds() -> None:
    ring = ClipRing(seconds=60.0, max_bytes=1000)
    for i in range(50):
        ring.add(EncodedFrame(i / FPS, b"x" * (100 + i)))  # each larger than the one before
        assert ring.bytes <= 1000
    kept = ring.since(0.0)
    assert kept[-1].timestamp == 49 / FPS, "the newest stays"
    assert sum(len(f.jpeg) for f in kept) == ring.bytes
    assert len(kept) == 6, "frames of 144..149 bytes: six fit under 1000, a seventh would not"


def test_clip_fps_from_the_frame_times() -> None:
    assert clip_fps([EncodedFrame(i / FPS, b"") for i in range(9)], 15.0) == pytest.approx(FPS)
    assert clip_fps([EncodedFrame(1.0, b"")], 15.0) == 15.0


def test_a_clip_covers_pre_and_post_at_the_cameras_fps_and_reads_back(tmp_path: Path) -> None:
    media = MediaStore(tmp_path / "media", MediaSection())
    recorder = ClipRecorder([camera(pre_s=1.0, post_s=2.0)], media.folder, media.keep_clip)
    recorder.start()
    for frame in frames(0, 20):
        recorder.frame("cam0", frame)
    name = recorder.trigger("cam0", ident(5))  # at frame 19 (t = 2.375 s)
    assert name == f"{ident(5)}.mp4" and recorder.planned(ident(5)) == name
    for frame in frames(20, 40):
        recorder.frame("cam0", frame)
    recorder.stop()  # writes what was handed on, then ends
    found = media.clip(ident(5))
    assert found is not None and found[1] == "video/mp4"
    path = media.folder / name
    capture = cv2.VideoCapture(str(path))
    read = []
    while True:
        ok, image = capture.read()
        if not ok:
            break
        read.append(image)
    fps = capture.get(cv2.CAP_PROP_FPS)
    capture.release()
    # frames 11..19 (1 s before the start, both ends in) and 20..35 (2 s after): (1 + 2) * 8 + 1
    assert len(read) == 25
    assert fps == pytest.approx(FPS, rel=0.01)
    assert read[0].shape == (120, 160, 3)
    # the first frame is frame 11 of the scene, the last frame 35: the square's position says so
    for image, index in ((read[0], 11), (read[-1], 35)):
        column = int(np.argmax(image[50, :, 0] > 180))
        assert abs(column - (index * 7) % 140) <= 3, (index, column)
    assert recorder.stats().written == 1 and recorder.stats().dropped == 0
    assert not list(media.folder.glob(".*")), "no partial file left"


def test_a_camera_without_clips_gets_none(tmp_path: Path) -> None:
    plain = CameraSection(name="cam1", source="synthetic")
    recorder = ClipRecorder([camera(), plain], tmp_path, lambda event, path: None)
    recorder.frame("cam1", frames(0, 1)[0])
    assert recorder.trigger("cam1", ident(1)) is None
    assert recorder.trigger("cam0", ident(2)) is None, "no frame seen yet on cam0"
    assert recorder.stats().buffered_bytes == 0


def test_the_camera_loop_never_waits_for_the_writer(tmp_path: Path) -> None:
    """The writer thread not running (as if stuck): every clip past the queue's room and every
    clip past the open limit is dropped and counted, and `frame` keeps returning."""
    recorder = ClipRecorder([camera(pre_s=0.25, post_s=0.25)], tmp_path, lambda event, path: None)
    made = 0
    for i in range(60):
        recorder.frame("cam0", frames(i, i + 1)[0])
        if i % 3 == 0:
            made += recorder.trigger("cam0", ident(i)) is not None
    stats = recorder.stats()
    assert stats.queued == QUEUE_CLIPS
    assert stats.dropped == 20 - QUEUE_CLIPS, "20 clips done (the last at frame 59); 4 queued, the rest dropped"
    assert made == 20


def test_more_open_clips_than_the_limit_are_dropped(tmp_path: Path) -> None:
    recorder = ClipRecorder([camera()], tmp_path, lambda event, path: None)
    recorder.frame("cam0", frames(0, 1)[0])
    names = [recorder.trigger("cam0", ident(i)) for i in range(OPEN_CLIPS + 2)]
    assert names[:OPEN_CLIPS] == [f"{ident(i)}.mp4" for i in range(OPEN_CLIPS)]
    assert names[OPEN_CLIPS:] == [None, None]
    assert recorder.stats().dropped == 2


def test_clips_and_snapshots_share_the_retention_by_size_and_age(tmp_path: Path) -> None:
    clock = Clock()
    media = MediaStore(tmp_path / "media", MediaSection(max_mb=0.1, max_age_h=1), clock)

    def written(i: int, size: int) -> Path:
        path = media.folder / f".{ident(i)}.part.mp4"
        path.write_bytes(b"v" * size)
        return path

    assert media.keep_clip(ident(1), written(1, 40_000)) == f"{ident(1)}.mp4"
    clock.now += 1
    media.put(ident(2), b"j" * 40_000)
    clock.now += 1
    assert media.clip(ident(1)) is not None
    media.keep_clip(ident(3), written(3, 40_000))  # 120 000 bytes > 0.1 MiB: the oldest (the clip) goes
    assert media.clip(ident(1)) is None and media.get(ident(2)) is not None and media.clip(ident(3)) is not None
    assert media.usage().files == 2 and media.usage().bytes <= 0.1 * MIB
    clock.now += 3600  # the snapshot is now 3601 s old, the clip 3600 s: exactly the limit, kept
    media.put(ident(4), b"j")
    assert media.get(ident(2)) is None and media.clip(ident(3)) is not None
    assert media.clip("../../etc/passwd") is None
    with pytest.raises(ValueError):
        media.keep_clip("../x", written(5, 1))


def test_a_partial_clip_is_cleared_at_start(tmp_path: Path) -> None:
    folder = tmp_path / "media"
    folder.mkdir()
    (folder / f".{ident(7)}.part.mp4").write_bytes(b"half")
    MediaStore(folder, MediaSection())
    assert not list(folder.iterdir())


def test_the_writer_thread_is_in_health(tmp_path: Path) -> None:
    now = [100.0]
    entered = threading.Event()
    release = threading.Event()

    def keep(event: str, path: Path) -> str | None:
        entered.set()
        release.wait(30)
        return None

    recorder = ClipRecorder([camera(pre_s=0.25, post_s=0.25)], tmp_path, keep, monotonic=lambda: now[0])
    assert recorder.loop().name == NAME and recorder.loop().stalled_s == 0 and recorder.loop().ended is None
    recorder.start()
    for frame in frames(0, 4):
        recorder.frame("cam0", frame)
    recorder.trigger("cam0", ident(1))
    for frame in frames(4, 8):
        recorder.frame("cam0", frame)
    assert entered.wait(30), "the writer took the clip"
    now[0] += WRITE_BUDGET_S + 5  # the write takes longer than its budget
    assert recorder.loop().stalled_s == pytest.approx(5)
    release.set()
    recorder.stop()
    assert recorder.stats().dropped == 1, "the store refused it: counted, not raised"


def test_a_clip_that_would_pass_buffer_mb_ends_early(tmp_path: Path) -> None:
    """Each frame's JPEG is about 3 kB: with a 0.02 MiB buffer (20 971 bytes) a clip holds at
    most that much, however long ``post_s`` is, and is handed on shorter."""
    recorder = ClipRecorder([camera(pre_s=0.5, post_s=30.0, buffer_mb=0.02)], tmp_path, lambda event, path: None)
    for frame in frames(0, 8):
        recorder.frame("cam0", frame)
    recorder.trigger("cam0", ident(1))
    for frame in frames(8, 60):
        recorder.frame("cam0", frame)
    assert recorder.stats().queued == 1, "handed on long before 30 s of frames"
    clip = recorder._queue.get_nowait()
    assert clip is not None and 2 < len(clip.frames) < 52
    assert sum(len(f.jpeg) for f in clip.frames) <= 0.02 * MIB
    assert recorder.stats().buffered_bytes <= 0.02 * MIB


def test_a_clip_that_fails_by_a_bug_costs_that_clip_not_the_writer(tmp_path: Path) -> None:
    """`keep` raising what `_write` does not expect (a bug) fails that turn: the clip is counted
    dropped and leaves no file, health says the writer fails its turns, the next clips are
    written, and `stop` returns with the queue drained."""
    kept: list[str] = []
    broken = threading.Event()
    broken.set()

    def keep(event: str, path: Path) -> str | None:
        if broken.is_set():
            raise RuntimeError("a bug")
        kept.append(event)
        return path.name

    recorder = ClipRecorder([camera(pre_s=0.25, post_s=0.25)], tmp_path, keep)
    recorder._worker._backoff.next_delay = lambda: 0.0  # type: ignore[method-assign]
    recorder.start()
    recorder.frame("cam0", frames(0, 1)[0])
    recorder.trigger("cam0", ident(0))
    recorder.finish()  # the clip goes to the writer now
    wait_until(lambda: recorder.loop().failures == 1, 30, "the writer to fail on the clip")
    assert recorder.stats().dropped == 1, "the clip is counted dropped"
    state = recorder.loop()
    assert state.ended is None and state.failures == 1 and state.failing == "RuntimeError: a bug", state
    assert list(tmp_path.glob("*.mp4")) == [], "the failed clip left no partial file"
    broken.clear()
    recorder.frame("cam0", frames(1, 2)[0])
    recorder.trigger("cam0", ident(1))
    recorder.finish()
    wait_until(lambda: kept == [ident(1)], 30, "the writer to write the next clip")
    wait_until(lambda: recorder.loop().failing is None, 10, "the good turn to clear the failure")
    recorder.stop(timeout=30)
    assert judge_health((), None, (recorder.loop(),), 60.0).ok, "stopped on purpose: nothing to say"


def test_media_and_clips_only_where_the_config_asks_and_frames_reach_the_ring_first(tmp_path: Path) -> None:
    from agent.config.models import AgentConfig
    from agent.daemon.clips import media_for, with_clips

    def config(**camera: object) -> AgentConfig:
        return AgentConfig.model_validate(
            {
                "state_dir": str(tmp_path),
                "events": {"snapshots": False},
                "cameras": [{"name": "cam0", "source": "synthetic", **camera}],
            }
        )

    assert media_for(config()) == (None, None), "neither snapshots nor clips: nothing on disk"
    media, clips = media_for(config(clips={"pre_s": 1, "post_s": 1}))
    assert media is not None and clips is not None and media.folder == tmp_path / "media"
    seen: list[str] = []

    class Ring:
        def frame(self, pipeline: str, frame: object) -> None:
            seen.append(f"ring:{pipeline}")

    sink = with_clips(Ring(), "cam0", lambda frame, detections: seen.append("events"))  # type: ignore[arg-type]
    sink(None, None)  # type: ignore[arg-type]
    assert seen == ["ring:cam0", "events"], "the ring first, then the events"
    events = lambda frame, detections: None  # noqa: E731
    assert with_clips(None, "cam0", events) is events, "without clips the events' sink as it is"
