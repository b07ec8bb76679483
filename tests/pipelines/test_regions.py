"""`pipelines.regions`: the crops a frame with motion is inferred on (merged, squared, grown to
the model's input, never enlarged, inside the frame, capped), their detections back in frame
pixels, the schedule of full frames; then a rendered 1080p clip of a small person far away
through the shared COCO YOLOv8n, directly and through `Pipeline(gating=..., regions=...)`:
on crops the person is found with a score of 0.5 or more (0.57-0.79 on the rendered frames, on
at least 9 in 10 of the clip's JPEG frames), on the full 640 letterbox never (found on most
frames at 0.25-0.45, missed on some)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.motion_clips import MotionClip, far_away_scene
from testkit.real_models import COCO_MODEL, write_clip

from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.decoding.nms import box_iou
from pipelines.gating import Gating
from pipelines.motion import Motion, MotionDetector
from pipelines.motion_gate import MotionGate
from pipelines.pipeline import Pipeline
from pipelines.regions import Crop, RegionSchedule, carry_over, merge_crop_detections, plan_crops
from pipelines.sources.capture import FileSource
from pipelines.sources.frames import Frame
from pipelines.sources.scene_source import SyntheticSource
from pipelines.sources.synthetic import SyntheticScene
from runtimes.registry import load_runtime

HD = (1080, 1920)  # frame (height, width)
IN = (640, 640)  # model input (height, width)
Box = tuple[int, int, int, int]


def regions(*boxes: Box) -> np.ndarray:
    return np.asarray(boxes, np.float32).reshape(-1, 4)


@pytest.mark.parametrize(
    ("boxes", "frame_hw", "input_hw", "expected"),
    [
        # one small region: a square of the input's side centred on it
        ([(900, 500, 1000, 600)], HD, IN, [(630, 230, 1270, 870)]),
        # at a corner: shifted inside the frame, not cut
        ([(0, 0, 50, 50)], HD, IN, [(0, 0, 640, 640)]),
        ([(1900, 1060, 1920, 1080)], HD, IN, [(1280, 440, 1920, 1080)]),
        # larger than the input: squared on its longer side (the letterbox shrinks it), shifted inside
        ([(500, 200, 1400, 700)], HD, IN, [(500, 0, 1400, 900)]),
        # two regions 20 pixels apart: merged
        ([(100, 100, 500, 500), (520, 100, 900, 500)], HD, IN, [(100, 0, 900, 800)]),
        # far apart but within one input square: one crop sees both at 1:1
        ([(100, 100, 150, 150), (600, 500, 650, 550)], HD, IN, [(55, 5, 695, 645)]),
        # far apart: one crop each, the larger region first
        ([(100, 100, 150, 150), (1500, 800, 1600, 900)], HD, IN, [(1230, 440, 1870, 1080), (0, 0, 640, 640)]),
        # four far-apart regions: four crops (the cap)
        ([(0, 0, 9, 9), (1900, 0, 1910, 10), (0, 1070, 11, 1080), (1900, 1070, 1912, 1080)], HD, IN, 4),
        # five: one full-frame pass instead
        (
            [(0, 0, 9, 9), (1900, 0, 1910, 10), (0, 1070, 11, 1080), (1900, 1070, 1912, 1080), (950, 0, 960, 9)],
            HD,
            IN,
            None,
        ),
        # wider than the frame's shorter side: the crop would shrink as much as the frame
        ([(0, 0, 1200, 100)], HD, IN, None),
        ([], HD, IN, None),  # no motion
        ([(10, 10, 20, 20)], (480, 640), IN, None),  # a frame not larger than the input
        ([(900, 500, 1000, 600)], HD, (384, 640), [(758, 358, 1142, 742)]),  # the input's shorter side
    ],
)
def test_crops_are_merged_squared_grown_clamped_and_capped(
    boxes: list[Box], frame_hw: tuple[int, int], input_hw: tuple[int, int], expected: list[Box] | int | None
) -> None:
    crops = plan_crops(regions(*boxes), frame_hw, input_hw)
    if expected is None or crops is None:
        assert crops == expected
        return
    if isinstance(expected, int):
        assert len(crops) == expected
    else:
        assert [c.xyxy for c in crops] == expected
    h, w = frame_hw
    for crop in crops:
        side = crop.x2 - crop.x1
        assert side == crop.y2 - crop.y1 >= min(input_hw), f"{crop}: square, never enlarged by the letterbox"
        assert crop.x2 <= w and crop.y2 <= h, f"{crop}: inside the frame"


def test_a_crop_s_boxes_map_back_by_its_offset_exactly() -> None:
    crop = Crop(600, 300, 1240, 940)
    found = Detections.from_arrays([[10, 20, 110, 220], [0, 0, 640, 640]], [0.9, 0.5], [0, 2])
    mapped = crop.to_frame(found)
    np.testing.assert_array_equal(mapped.xyxy, [[610, 320, 710, 520], [600, 300, 1240, 940]])
    assert mapped.confidence.tolist() == pytest.approx([0.9, 0.5]) and mapped.class_id.tolist() == [0, 2]


LEFT, RIGHT = Crop(0, 0, 640, 640), Crop(500, 0, 1140, 640)  # overlapping 500..640


@pytest.mark.parametrize(
    ("left", "right", "expected"),
    [
        # whole in the left crop, cut by the right crop's inner left edge: the cut one goes
        ([(520, 100, 600, 300, 0.6, 0)], [(0, 100, 100, 300, 0.9, 0)], [(520, 100, 600, 300)]),
        # cut with no whole counterpart (another class is not one): kept, cut
        ([(520, 100, 600, 300, 0.6, 1)], [(0, 100, 100, 300, 0.9, 0)], [(500, 100, 600, 300), (520, 100, 600, 300)]),
        # seen whole by both crops: NMS keeps the better
        ([(540, 100, 600, 300, 0.6, 0)], [(40, 100, 100, 300, 0.8, 0)], [(540, 100, 600, 300)]),
        # at the frame's edge (the left crop's left edge): not cut, kept
        ([(0, 100, 50, 300, 0.6, 0)], [], [(0, 100, 50, 300)]),
    ],
)
def test_crops_detections_merge_without_cut_duplicates(
    left: list[tuple[float, ...]], right: list[tuple[float, ...]], expected: list[Box]
) -> None:
    def detections(rows: list[tuple[float, ...]]) -> Detections:
        return Detections.from_arrays([r[:4] for r in rows], [r[4] for r in rows], [r[5] for r in rows])

    merged = merge_crop_detections([(LEFT, detections(left)), (RIGHT, detections(right))], HD, 0.7, 100)
    assert sorted(map(tuple, merged.xyxy.tolist())) == sorted(expected)


def test_the_last_detections_outside_every_crop_stand() -> None:
    previous = Detections.from_arrays([[1500, 100, 1600, 300], [600, 100, 700, 300]], [0.7, 0.8], [0, 0])
    crops_found = Detections.from_arrays([[300, 100, 400, 300]], [0.9], [0])
    both = carry_over(crops_found, previous, [LEFT], 100)
    assert both.xyxy.tolist() == [[300, 100, 400, 300], [1500, 100, 1600, 300]], "the one touching the crop is its"


def test_the_schedule_infers_crops_on_motion_and_a_full_frame_when_due_or_still() -> None:
    schedule = RegionSchedule(full_frame_interval_s=2.0)
    small, big = Motion(regions((900, 500, 1000, 600))), Motion(regions((0, 0, 1500, 900)))
    plans = [
        schedule.plan(now, motion, HD, IN)
        for now, motion in [
            (0.0, small),
            (0.5, small),
            (1.0, Motion()),
            (1.5, None),
            (1.9, big),
            (2.0, small),
            (3.8, small),
            (3.9, small),
        ]
    ]
    assert [p is None for p in plans] == [True, False, True, True, True, False, False, True]
    assert (schedule.full_frames, schedule.crop_frames, schedule.crops) == (5, 3, 3)


# -- a small person far away on a 1080p clip, through the shared COCO detector ---------------------

PERSON, FRAMES, FPS = 0, 40, 10.0


@pytest.fixture(scope="module")
def scene(photos: dict[str, Path]) -> MotionClip:
    import cv2

    return far_away_scene(np.asarray(cv2.imread(str(photos["astronaut"]))), frames=FRAMES)


@pytest.fixture(scope="module")
def coco(shared_models: Path) -> Detector:
    return Detector(load_runtime("onnxruntime", shared_models / COCO_MODEL))


def best_person(detections: Detections, truth: np.ndarray) -> float:
    """The best score of a person box overlapping the true box (IoU >= 0.3), 0 when none."""
    people = detections[detections.class_id == PERSON]
    if len(people) == 0 or len(truth) == 0:
        return 0.0
    near = box_iou(truth[0], people.xyxy) >= 0.3
    return float(people.confidence[near].max()) if near.any() else 0.0


@pytest.mark.slow
def test_crops_find_a_small_far_person_the_full_frame_scores_low(scene: MotionClip, coco: Detector) -> None:
    texture = scene.texture()
    full, cropped = [], []
    for index in range(0, FRAMES, 4):
        image, truth = scene.frame(index, texture), scene.boxes(index)
        crops = plan_crops(truth, HD, coco.input_hw)
        assert crops is not None and len(crops) == 1
        per_crop = [(crop, coco.detect(crop.cut(image))) for crop in crops]
        cropped.append(best_person(merge_crop_detections(per_crop, HD, coco.iou, coco.max_det), truth))
        full.append(best_person(coco.detect(image), truth))
    assert min(cropped) >= 0.5, cropped
    assert max(full) < 0.5, full


def run(clip: Path, model: Path, with_regions: bool) -> tuple[Pipeline, list[tuple[Frame, Detections]]]:
    seen: list[tuple[Frame, Detections]] = []
    detector = Detector(load_runtime("onnxruntime", model))
    gating = Gating(MotionDetector(), MotionGate(2.0, 60.0))
    schedule = RegionSchedule(full_frame_interval_s=60.0) if with_regions else None
    pipeline = Pipeline(
        "cam", FileSource(clip), detector, sinks=[lambda f, d: seen.append((f, d))], gating=gating, regions=schedule
    )
    pipeline.start()
    assert pipeline.wait(300)
    pipeline.stop()
    detector.close()
    return pipeline, seen


@pytest.mark.slow
def test_a_pipeline_with_regions_finds_the_far_person_on_its_frames_with_motion(
    scene: MotionClip, shared_models: Path, tmp_path: Path
) -> None:
    clip = write_clip(tmp_path / "far.avi", scene.frames(FRAMES), fps=FPS)
    scores = {}
    for with_regions in (False, True):
        pipeline, seen = run(clip, shared_models / COCO_MODEL, with_regions)
        assert [f.index for f, _ in seen] == list(range(FRAMES))
        scores[with_regions] = [best_person(d, scene.boxes(f.index)) for f, d in seen[2:] if f.inferred]
        if with_regions:
            assert pipeline.regions is not None and pipeline.regions.crop_frames >= FRAMES - 5
    assert len(scores[True]) >= FRAMES - 5, "the walk keeps the gate open"
    found = [score >= 0.5 for score in scores[True]]
    assert sum(found) >= 0.9 * len(found), scores[True]  # a JPEG frame or two scores lower
    assert max(scores[False]) < 0.5, scores[False]


@pytest.mark.parametrize(("model", "crops"), [("demo_detector.onnx", True), ("demo_pose.onnx", False)])
def test_only_a_box_detector_is_inferred_on_crops(model: str, crops: bool, caplog: pytest.LogCaptureFixture) -> None:
    """The demo's shapes moving on a 1280x720 scene: the box detector (320 input) gets crops,
    the pose model full frames (its keypoints kept) and one log line saying so."""
    source = SyntheticSource(SyntheticScene(width=1280, height=720, num_shapes=3), frames=12)
    detector = Detector(load_runtime("onnxruntime", DEMO_MODELS / model))
    seen: list[Detections] = []
    schedule = RegionSchedule(full_frame_interval_s=60.0)
    gating = Gating(MotionDetector(), MotionGate(2.0, 60.0))
    pipeline = Pipeline("cam", source, detector, sinks=[lambda f, d: seen.append(d)], gating=gating, regions=schedule)
    with caplog.at_level(logging.WARNING, logger="pipelines.pipeline"):
        pipeline.start()
        assert pipeline.wait(120)
        pipeline.stop()
    detector.close()
    assert (schedule.crop_frames > 0) is crops, (schedule.crop_frames, schedule.full_frames)
    refused = [r for r in caplog.records if "motion.regions is for box detectors" in r.getMessage()]
    assert len(refused) == (0 if crops else 1)
    if not crops:
        assert all(d.keypoints is not None for d in seen if len(d)), "the pose model's keypoints kept"
