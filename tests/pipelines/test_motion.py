"""`MotionDetector` on rendered clips (testkit.motion_clips): noise, an object entering, stopping
and leaving, masks, a lighting change, a busy scene; `Motion`'s shapes; a JPEG frame judged on
its reduced decode as on its full frame."""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt
import pytest
from testkit.media import CountingDecoder
from testkit.motion_clips import MotionClip, Mover, busy_scene, still_scene

from pipelines.motion import MAX_REGIONS, Motion, MotionDetector, MotionSettings, merge_boxes
from pipelines.sources.frames import JpegImage


def _iou(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    x0, y0 = max(a[0], b[0]), max(a[1], b[1])
    x1, y1 = min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, float(x1 - x0)) * max(0.0, float(y1 - y0))
    union = float((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])) - inter
    return inter / union if union else 0.0


def _run(clip: MotionClip, frames: int, settings: MotionSettings | None = None) -> list[Motion]:
    detector = MotionDetector(settings)
    return [detector.detect(frame) for frame in clip.frames(frames)]


def test_sensor_noise_on_a_textured_scene_is_no_motion() -> None:
    motions = _run(MotionClip(seed=3), 30)
    assert not motions[0].moving  # the first frame only initialises
    assert [i for i, m in enumerate(motions) if m.moving or m.recalibrated] == []
    assert max(m.changed for m in motions) < 0.001


@pytest.mark.parametrize(("width", "height"), [(640, 360), (1280, 720)])
def test_an_entering_object_gives_a_region_over_its_true_box(width: int, height: int) -> None:
    clip = still_scene(width, height, seed=5)
    motions = _run(clip, 26)
    assert [m.moving for m in motions[:10]] == [False] * 10  # before it enters
    for index in range(14, 26):  # wholly in view, walking
        truth = clip.boxes(index)[0]
        regions = motions[index].regions
        assert regions.dtype == np.float32 and regions.shape[1] == 4
        best = max(_iou(region, truth) for region in regions)
        assert best > 0.3, f"frame {index}: regions {regions.tolist()} against {truth.tolist()}"
        assert regions[:, 2].max() <= width and regions[:, 3].max() <= height


def test_an_object_that_stops_fades_into_the_background_and_its_leaving_moves() -> None:
    clip = still_scene(seed=6)
    motions = _run(clip, 70)
    assert not motions[59].moving  # stopped since frame 25: learnt
    assert all(m.moving for m in motions[61:70])


def test_a_masked_mover_gives_no_motion() -> None:
    clock = Mover(((0, 560.0, 40.0), (60, 560.0, 40.0)), size=(100, 40), blink=True)  # an on-screen clock
    clip = MotionClip(seed=7, movers=(clock,))
    unmasked = _run(clip, 20)
    assert all(m.moving for m in unmasked[1::2])  # it does move: each frame it turns to its inverse
    cover = ((500.0, 10.0), (620.0, 10.0), (620.0, 70.0), (500.0, 70.0))
    masked = _run(clip, 20, MotionSettings(masks=(cover,)))
    assert [i for i, m in enumerate(masked) if m.moving] == []
    assert max(m.changed for m in masked) < 0.001


def test_a_mask_leaves_motion_elsewhere_seen() -> None:
    cover = ((0.0, 0.0), (100.0, 0.0), (100.0, 100.0), (0.0, 100.0))
    motions = _run(still_scene(seed=8), 20, MotionSettings(masks=(cover,)))
    assert all(m.moving for m in motions[14:20])


def test_a_lighting_change_recalibrates_and_is_no_motion_after() -> None:
    clip = MotionClip(seed=9, light_at=12)
    motions = _run(clip, 30)
    assert [i for i, m in enumerate(motions) if m.recalibrated] == [12]
    assert motions[12].changed > 0.5 and not motions[12].moving
    assert [i for i, m in enumerate(motions) if m.moving] == []  # nor on the frames after it


def test_an_object_in_view_after_a_lighting_change_still_moves() -> None:
    motions = _run(still_scene(seed=10, light_at=16), 26)
    assert motions[16].recalibrated
    assert all(m.moving for m in motions[18:26])


def test_a_busy_scene_keeps_regions_bounded_and_largest_first() -> None:
    motions = _run(busy_scene(seed=11, objects=40), 40)
    assert sum(m.moving for m in motions[1:]) == 39
    for motion in motions:
        assert len(motion.regions) <= MAX_REGIONS
        areas = (motion.regions[:, 2] - motion.regions[:, 0]) * (motion.regions[:, 3] - motion.regions[:, 1])
        assert list(areas) == sorted(areas, reverse=True)


def test_small_blobs_below_min_area_are_no_motion() -> None:
    fly = Mover(((2, 0.0, 100.0), (40, 640.0, 100.0)), size=(6, 6))
    motions = _run(MotionClip(seed=12, movers=(fly,)), 20, MotionSettings(min_area=400))
    assert [i for i, m in enumerate(motions) if m.moving] == []
    motions = _run(MotionClip(seed=12, movers=(fly,)), 20, MotionSettings(min_area=20))
    assert all(m.moving for m in motions[4:])


def test_a_new_frame_size_starts_again() -> None:
    detector = MotionDetector()
    detector.detect(MotionClip(seed=13).frame(0))
    motion = detector.detect(MotionClip(640, 480, seed=13).frame(0))
    assert (motion.regions.shape, motion.changed, motion.recalibrated) == ((0, 4), 0.0, False)


def test_merge_boxes_joins_near_boxes_only() -> None:
    assert merge_boxes([(0, 0, 10, 10), (15, 0, 20, 10)], gap=8) == [(0, 0, 20, 10)]
    assert merge_boxes([(0, 0, 10, 10), (30, 0, 40, 10)], gap=8) == [(0, 0, 10, 10), (30, 0, 40, 10)]
    assert merge_boxes([(0, 0, 10, 10), (30, 0, 40, 10), (12, 0, 28, 10)], gap=8) == [(0, 0, 40, 10)]


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (np.zeros((10, 10), np.uint8), r"expected \(H, W, 3\) uint8, got \(10, 10\)"),
        (np.zeros((10, 10, 3), np.float32), r"expected \(H, W, 3\) uint8, got \(10, 10, 3\) float32"),
        (np.zeros((0, 10, 3), np.uint8), r"H, W >= 1, got \(0, 10, 3\)"),
    ],
)
def test_a_frame_of_the_wrong_shape_is_refused(frame: npt.NDArray[np.uint8], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        MotionDetector().detect(frame)


def test_motion_regions_are_checked_and_frozen() -> None:
    with pytest.raises(ValueError, match=r"regions: expected \(_, 4\), got \(2, 3\)"):
        Motion(np.zeros((2, 3), np.float32))
    motion = Motion(np.ones((1, 4), np.float32), changed=0.1)
    assert motion.moving
    assert not Motion(np.ones((1, 4), np.float32), changed=0.9, recalibrated=True).moving
    with pytest.raises(ValueError, match="read-only"):
        motion.regions[0, 0] = 5


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"width": 8}, "width: expected 16..4096"),
        ({"threshold": 0}, "threshold: expected 1..255"),
        ({"min_area": 0}, "min_area: expected at least 1"),
        ({"learning_rate": 0.0}, r"learning_rate: expected \(0, 1\]"),
        ({"global_change": 1.5}, r"global_change: expected \(0, 1\]"),
        ({"masks": (((0.0, 0.0), (1.0, 1.0)),)}, r"masks\[0\]: expected at least 3 points, got 2"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(settings: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        MotionSettings(**settings)  # type: ignore[arg-type]


def _compare_reduced(clip: MotionClip, frames: int, quality: int = 90) -> list[tuple[Motion, Motion]]:
    """Each frame of `clip` as a JPEG, judged by one detector on its full decode (a downscale of
    the full frame, as today) and by another on its reduced decode (`JpegImage`)."""
    full, reduced = MotionDetector(), MotionDetector()
    decoder = CountingDecoder()
    pairs = []
    for image in clip.frames(frames):
        ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
        jpeg = JpegImage.of(np.asarray(data, np.uint8), decoder)
        assert ok and jpeg is not None
        pairs.append((full.detect(cv2.imdecode(data, cv2.IMREAD_COLOR)), reduced.detect(jpeg)))
    assert decoder.full == 0, "the reduced path never decodes a frame whole"
    return pairs


@pytest.mark.parametrize(
    ("clip", "frames"),
    [
        (still_scene(1280, 720, seed=5, light_at=70), 90),  # enters, stops, leaves; the lights at 70
        pytest.param(busy_scene(1920, 1080, seed=2, frames=40), 40, marks=pytest.mark.slow),  # 1/4: 480 wide
    ],
    ids=["still-720p-lights", "busy-1080p"],
)
def test_a_reduced_decode_gives_the_decisions_of_the_full_frame(clip: MotionClip, frames: int) -> None:
    """The same frames moving, the same lighting change, the same share changed, and the largest
    region in the same place (but on the odd frame where a stopped object's last traces fade
    into the background: a few pixels at the threshold)."""
    pairs = _compare_reduced(clip, frames)
    assert [(f.moving, f.recalibrated) for f, _ in pairs] == [(r.moving, r.recalibrated) for _, r in pairs]
    moving = [(f, r) for f, r in pairs if f.moving]
    assert len(moving) > 10, "the clip moves"
    assert all(abs(f.changed - r.changed) < 0.005 for f, r in pairs)
    placed = [max(_iou(f.regions[0], other) for other in r.regions) > 0.8 for f, r in moving]
    assert sum(placed) >= 0.95 * len(moving), placed
