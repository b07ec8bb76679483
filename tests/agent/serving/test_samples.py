"""`agent.serving.samples`: which frames are kept and why, privacy masks blanked in the kept
JPEG's pixels, each camera's byte and age budget, YOLO labels per task, and the pack one
``samples`` request gets. Real files, real OpenCV; the clocks and the chance are injected."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import cv2
import numpy as np
import pytest

from agent.config.models import CameraSection, SamplesSection
from agent.serving.samples import MIB, Pending, SampleStore, samples_for, yolo_labels
from pipelines.decoding.detections import Detections
from pipelines.sources.frames import Frame


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def camera(name: str = "door", **samples: object) -> CameraSection:
    return CameraSection(name=name, source="synthetic", samples=SamplesSection(**{"enabled": True, **samples}))


def store_of(tmp_path: Path, *cameras: CameraSection, chance: float = 0.99) -> tuple[SampleStore, Clock, Clock]:
    wall, mono = Clock(1_700_000_000.0), Clock(100.0)
    store = SampleStore(
        tmp_path / "samples",
        cameras,
        lambda: ["person", "car"],
        lambda: "1.2.0",
        clock=wall,
        monotonic=mono,
        chance=lambda: chance,
    )
    return store, wall, mono


def dets(*scores: float) -> Detections:
    n = len(scores)
    return Detections.from_arrays([[10, 20, 50, 80]] * n, list(scores), [0] * n)


def frame(value: int = 200, shape: tuple[int, int] = (120, 160)) -> Frame:
    return Frame(0, 0.0, np.full((*shape, 3), value, np.uint8))


def drain(store: SampleStore) -> list[str]:
    """Write what the sink queued (the writer thread's work, here on the test's thread)."""
    reasons = []
    while not store._queue.empty():
        pending = store._queue.get_nowait()
        assert pending is not None
        store.write(pending)
        reasons.append(pending.reason)
    return reasons


def test_nothing_is_kept_when_samples_are_off(tmp_path: Path) -> None:
    off = CameraSection(name="yard", source="synthetic")
    assert not off.samples.enabled  # opt-in
    assert samples_for([off], tmp_path, list, lambda: None) is None
    store, _, _ = store_of(tmp_path, camera("door"), off)
    seen: list[int] = []
    sink = store.sink("yard", lambda f, d: seen.append(len(d)))
    sink(frame(), dets(0.5))
    assert not store.offer("yard", frame(), dets(0.5), "flagged")
    assert seen == [1] and drain(store) == []
    assert not (tmp_path / "samples" / "cam-yard").exists()


@pytest.mark.parametrize(
    ("scores", "flagged", "expected"),
    [
        ((0.45,), False, ["unsure"]),
        ((0.3,), False, ["unsure"]),  # the band's edges are in it
        ((0.6,), False, ["unsure"]),
        ((0.9, 0.61), False, []),  # sure: above the band
        ((0.29,), False, []),
        ((), False, []),
        ((0.9,), True, ["flagged"]),  # flagged first
    ],
)
def test_a_frame_is_kept_for_the_first_reason_that_holds(
    tmp_path: Path, scores: tuple[float, ...], flagged: bool, expected: list[str]
) -> None:
    store, _, _ = store_of(tmp_path, camera(score_band=(0.3, 0.6)))
    store.flagged = lambda name: flagged and name == "door"
    store.sink("door", lambda f, d: None)(frame(), dets(*scores))
    assert drain(store) == expected


def test_a_random_share_keeps_frames_by_chance(tmp_path: Path) -> None:
    store, _, _ = store_of(tmp_path, camera(random_share=0.1), chance=0.05)
    store.sink("door", lambda f, d: None)(frame(), dets(0.9))
    assert drain(store) == ["random"]
    store, _, _ = store_of(tmp_path, camera(random_share=0.1), chance=0.5)
    store.sink("door", lambda f, d: None)(frame(), dets(0.9))
    assert drain(store) == []


def test_frames_are_kept_at_most_once_per_interval(tmp_path: Path) -> None:
    store, _, mono = store_of(tmp_path, camera(min_interval_s=10))
    sink = store.sink("door", lambda f, d: None)
    sink(frame(), dets(0.5))
    mono.now += 9.9
    sink(frame(), dets(0.5))
    assert not store.offer("door", frame(), dets(0.5), "shadow")
    mono.now += 0.2
    sink(frame(), dets(0.5))
    assert drain(store) == ["unsure", "unsure"]


def test_a_full_queue_drops_the_sample_without_waiting(tmp_path: Path) -> None:
    store, _, _ = store_of(tmp_path, camera(min_interval_s=0))
    for _ in range(6):
        store.offer("door", frame(), dets(0.5), "unsure")
    assert store.dropped == 2 and store._queue.qsize() == 4


def test_privacy_masks_are_blank_in_the_kept_jpeg(tmp_path: Path) -> None:
    mask = [[0, 0], [80, 0], [80, 60], [0, 60]]  # the top-left quarter of 160 x 120
    store, _, _ = store_of(tmp_path, camera(privacy_masks=[mask]))
    original = frame(220)
    assert store.offer("door", original, dets(0.5), "unsure")
    sample = store.write(store._queue.get_nowait())  # type: ignore[arg-type]
    assert sample is not None
    image = cv2.imread(str(tmp_path / "samples" / "cam-door" / f"{sample.id}.jpg"))
    assert image.shape == (120, 160, 3)
    assert image[2:58, 2:78].max() <= 8  # blank, JPEG's ringing aside
    assert image[64:, 84:].min() >= 200  # the rest kept
    assert original.image.min() == 220  # the camera's frame itself untouched
    labels = (tmp_path / "samples" / "cam-door" / f"{sample.id}.txt").read_text()
    assert labels == "", "the detection centred in the mask has no label"


def test_only_detections_centred_in_a_mask_lose_their_labels(tmp_path: Path) -> None:
    store, _, _ = store_of(tmp_path, camera(privacy_masks=[[[0, 0], [80, 0], [80, 60], [0, 60]]]))
    inside_and_out = Detections.from_arrays([[10, 20, 50, 80], [90, 70, 150, 110]], [0.5, 0.5], [0, 1])
    store.offer("door", frame(), inside_and_out, "unsure")
    sample = store.write(store._queue.get_nowait())  # type: ignore[arg-type]
    assert sample is not None
    labels = (tmp_path / "samples" / "cam-door" / f"{sample.id}.txt").read_text().splitlines()
    assert [line.split()[0] for line in labels] == ["1"]


def test_each_camera_stays_within_its_bytes_and_age(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    store, wall, _ = store_of(tmp_path, camera(max_mb=0.2, max_age_h=1, min_interval_s=0, quality=95))
    for _ in range(12):  # noise: each JPEG is tens of KiB
        wall.now += 1
        image = rng.integers(0, 255, (120, 160, 3), dtype=np.uint8)
        store.write(Pending("door", image, dets(0.5), "unsure", int(wall.now * 1000)))
    count, used, newest = store.summary()["door"]
    assert used <= 0.2 * MIB and 1 < count < 12
    assert newest == wall.now
    wall.now += 3600.5  # the newest is now just over an hour old: a new write prunes them all
    store.write(Pending("door", frame().image, dets(0.5), "unsure", int(wall.now * 1000)))
    assert store.summary()["door"][0] == 1


def test_labels_are_yolo_lines_normalised_to_the_frame() -> None:
    detections = Detections.from_arrays([[16, 12, 48, 60], [0, 0, 160, 120]], [0.5, 0.9], [1, 0])
    lines = yolo_labels(detections, 160, 120).splitlines()
    assert lines == ["1 0.200000 0.300000 0.200000 0.400000", "0 0.500000 0.500000 1.000000 1.000000"]


def test_pose_labels_carry_their_keypoints() -> None:
    kpts = np.array([[[16, 12, 0.9], [48, 60, 0.2]]], np.float32)
    detections = Detections(
        np.array([[16, 12, 48, 60]], np.float32), np.array([0.5], np.float32), np.zeros(1, np.int32), keypoints=kpts
    )
    values = yolo_labels(detections, 160, 120).split()
    assert values[0] == "0" and len(values) == 1 + 4 + 2 * 3
    assert [float(v) for v in values[5:]] == pytest.approx([0.1, 0.1, 0.9, 0.3, 0.5, 0.2], abs=1e-5)


def test_a_pack_holds_the_samples_since_a_time_and_says_when_more_remain(tmp_path: Path) -> None:
    store, wall, _ = store_of(tmp_path, camera("door"), camera("yard"))
    stamps = []
    for i in range(5):
        wall.now += 1
        stamps.append(int(wall.now * 1000))
        store.write(Pending("door" if i % 2 else "yard", frame().image, dets(0.5), "unsure", stamps[-1]))
    pack = store.pack(None, 0, None, limit=3)
    assert (pack.count, pack.until_ms, pack.more) == (3, stamps[2], True)
    with tarfile.open(fileobj=io.BytesIO(pack.data)) as tar:
        names = tar.getnames()
    assert sorted(n.split("/")[0] for n in names) == ["images"] * 3 + ["labels"] * 3 + ["meta"] * 3
    rest = store.pack(None, pack.until_ms, None)
    assert (rest.count, rest.until_ms, rest.more) == (2, stamps[4], False)
    assert store.pack(None, 0, None, limit=3).data == pack.data  # the chunks of one answer agree
    door = store.pack("door", 0, None)
    assert door.count == 2
    with tarfile.open(fileobj=io.BytesIO(door.data)) as tar:
        member = tar.extractfile(f"meta/door-{stamps[1]:013d}-0002.json")
        assert member is not None
        meta = json.loads(member.read())
    assert meta["names"] == ["person", "car"] and meta["reason"] == "unsure" and meta["version"] == "1.2.0"
    with pytest.raises(KeyError):
        store.pack("gate", 0, None)


def test_a_write_the_disk_refuses_drops_the_sample_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, wall, _ = store_of(tmp_path, camera(min_interval_s=0))
    folder = tmp_path / "samples" / "cam-door"
    folder.rmdir()
    folder.write_bytes(b"")  # the camera's folder is gone: every write fails, as on a full disk
    for _ in range(3):
        wall.now += 1
        assert store.write(Pending("door", frame().image, dets(0.5), "unsure", int(wall.now * 1000))) is None
    assert (store.kept, store.dropped) == (0, 3)
    refused = [r for r in caplog.records if "cannot keep a sample of door" in r.getMessage()]
    assert len(refused) == 1, "throttled: one line a minute"
    assert store.summary()["door"] == (0, 0, None)
