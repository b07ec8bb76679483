"""`pipelines.camera_health`: rendered clips (`testkit.health_clips`, one frame a second on an
injected clock: the synthetic scene, and COCO photos seen by a camera panning slowly across them)
gone wrong are reported with the right kind within the stated time; normal clips, a gradual dusk
and a light switched on raise nothing; bad thresholds are refused by name."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from testkit.health_clips import PhotoScene, Scene, clip
from testkit.real_models import photo_frame

from pipelines.camera_health import MIN_BASELINE, CameraHealth, HealthReport, HealthThresholds

DEFAULTS = HealthThresholds()
#: a variant starts once the baselines are learnt (`MIN_BASELINE` good frames) ...
EARLY = MIN_BASELINE + 5
#: ... or, for "moved", once the reference is kept (`reference_after_s` of good frames)
AFTER_REFERENCE = int(DEFAULTS.reference_after_s) + 5


def run(
    variant: str,
    frames: int,
    at: int,
    seed: int = 0,
    health: CameraHealth | None = None,
    start: float = 0.0,
    scene: Scene | None = None,
) -> list[HealthReport]:
    """`frames` frames of the clip (of `scene`, the synthetic one of `seed` by default) through
    `health` (a new one by default), its clock from `start`."""
    health = health or CameraHealth()
    frames_ = clip(variant, frames, at=at, seed=seed, scene=scene)
    return [health.observe(frame, start + now) for frame, now in frames_]


@pytest.fixture(scope="module")
def photo_scene(request: pytest.FixtureRequest) -> PhotoScene:
    """astronaut, chelsea and coffee side by side (`photo_frame`'s top row, 1536 x 512), seen
    through a 16:9 window panning 0.2 pixels of the photo a second: a real picture (dark
    background, skin, fur, a cup) rather than rendered texture. Skips without scikit-image."""
    pytest.importorskip("skimage")
    photos: dict[str, Path] = request.getfixturevalue("photos")
    return PhotoScene(photo_frame(photos)[:512])


def first_seen(reports: list[HealthReport]) -> dict[str, int]:
    """Each kind reported: the frame (= second) it was first reported at."""
    seen: dict[str, int] = {}
    for second, report in enumerate(reports):
        for kind in report.kinds:
            seen.setdefault(kind, second)
    return seen


# (variant, its kind, the frame it starts at, seconds after that by which it is reported)
BAD_CLIPS = [
    # the frame at `at` is the last new one; the repeats begin a frame later
    ("frozen", "frozen", EARLY, DEFAULTS.frozen_s + 1),
    ("dark", "dark", EARLY, DEFAULTS.hold_s),
    ("overexposed", "overexposed", EARLY, DEFAULTS.hold_s),
    ("blurred", "defocused", EARLY, DEFAULTS.hold_s),
    ("covered", "covered", EARLY, DEFAULTS.hold_s),
    # with a reference: a picture too dark or covered is judged for nothing else (not "moved")
    ("dark", "dark", AFTER_REFERENCE, DEFAULTS.hold_s),
    ("covered", "covered", AFTER_REFERENCE, DEFAULTS.hold_s),
    ("shifted", "moved", AFTER_REFERENCE, DEFAULTS.hold_s),
    ("rotated", "moved", AFTER_REFERENCE, DEFAULTS.hold_s),
]


@pytest.mark.parametrize(
    ("variant", "kind", "at", "within_s"), BAD_CLIPS, ids=[f"{row[0]}@{row[2]}" for row in BAD_CLIPS]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_a_clip_gone_wrong_is_reported_with_its_kind_in_time(
    variant: str, kind: str, at: int, within_s: float, seed: int
) -> None:
    deadline = at + int(within_s)
    reports = run(variant, deadline + 3, at, seed)
    assert first_seen(reports) == {kind: deadline}, "held exactly hold_s (frozen_s), then reported, and nothing else"
    problem = reports[-1].problems[0]
    assert problem.since == (at + 1 if variant == "frozen" else at)
    assert problem.detail


@pytest.mark.parametrize(
    ("variant", "kind", "at", "within_s"), BAD_CLIPS, ids=[f"{row[0]}@{row[2]}" for row in BAD_CLIPS]
)
def test_a_photo_gone_wrong_is_reported_with_its_kind_in_time(
    variant: str, kind: str, at: int, within_s: float, photo_scene: PhotoScene
) -> None:
    """The same as on the synthetic scene, on real photos while the camera creeps: overexposed
    here is a third of the picture still darker than `bright_luma` (the astronaut's black sky),
    blurred is a photo's soft focus, shifted and rotated are on top of the creep."""
    deadline = at + int(within_s)
    reports = run(variant, deadline + 3, at, scene=photo_scene)
    assert first_seen(reports) == {kind: deadline}, "held exactly hold_s (frozen_s), then reported, and nothing else"
    assert reports[-1].problems[0].since == (at + 1 if variant == "frozen" else at)


GOOD_CLIPS = [("normal", 150, 0), ("dusk", 150, 20), ("light_on", 100, AFTER_REFERENCE)]


@pytest.mark.parametrize(("variant", "frames", "at"), GOOD_CLIPS)
def test_a_photo_panned_slowly_raises_nothing(variant: str, frames: int, at: int, photo_scene: PhotoScene) -> None:
    """A camera creeping 0.2 photo pixels a second (a mount settling) for minutes, through dusk or
    a light switched on: no alarm, since the reference follows a camera that stays good."""
    reports = run(variant, frames, at, scene=photo_scene)
    assert first_seen(reports) == {}
    assert reports[-1].reference is not None, "the clip was long enough to keep a reference and compare with it"
    assert max(r.shift_px for r in reports) > 0.5, "the creep was seen, and stayed below moved_fraction"


@pytest.mark.parametrize(("variant", "frames", "at"), GOOD_CLIPS)
def test_a_good_clip_raises_nothing_over_its_length(variant: str, frames: int, at: int) -> None:
    reports = run(variant, frames, at)
    assert first_seen(reports) == {}
    assert reports[-1].reference is not None, "the clip was long enough to keep a reference and compare with it"
    if variant == "dusk":
        assert reports[-1].luminance < 0.45 * reports[0].luminance, "the dusk did fall to 40 %"


def test_a_problem_stays_while_its_cause_does() -> None:
    """A blurred camera is still defocused a minute on: its blurred frames never become its baseline."""
    reports = run("blurred", EARLY + 60, EARLY)
    assert [r.kinds for r in reports[-45:]] == [("defocused",)] * 45
    assert reports[-1].baseline_sharpness == reports[EARLY].baseline_sharpness


def test_a_passing_truck_is_no_problem() -> None:
    """Dark for less than hold_s (something dark fills the view), then the scene again."""
    health = CameraHealth()
    frames = list(clip("normal", 40, seed=2))
    dark = list(clip("dark", 40, seed=2))
    truck = range(EARLY, EARLY + int(DEFAULTS.hold_s) - 1)
    reports = [health.observe((dark if i in truck else frames)[i][0], float(i)) for i in range(40)]
    assert first_seen(reports) == {}
    assert health.observe(dark[0][0], 40.0).kinds == ()  # a new dark spell starts its hold afresh


def test_reset_reference_after_a_move_clears_moved() -> None:
    health = CameraHealth()
    reports = run("shifted", AFTER_REFERENCE + 15, AFTER_REFERENCE, health=health)
    assert reports[-1].kinds == ("moved",)
    before = reports[-1].reference
    health.reset_reference()
    after = run("shifted", 2 * AFTER_REFERENCE, 0, health=health, start=AFTER_REFERENCE + 15)
    assert after[0].reference is not None, "the first frame after the reset is the reference"
    assert not np.array_equal(after[0].reference, before)
    assert [r.kinds for r in after] == [()] * len(after), "the moved view is the new normal"
    assert after[-1].shift_px < 2
    assert after[-1].reference is not None and before is not None
    assert not np.array_equal(after[-1].reference, before)


def test_the_reference_is_kept_after_reference_after_s_of_good_frames() -> None:
    reports = run("normal", AFTER_REFERENCE, 0)
    kept = [r.reference is not None for r in reports]
    assert kept.index(True) == int(DEFAULTS.reference_after_s)
    reference = reports[-1].reference
    assert reference is not None and reference.dtype == np.uint8 and reference.shape == (90, DEFAULTS.width)
    with pytest.raises(ValueError, match="read-only"):
        reference[0, 0] = 0  # a report's reader cannot change what the next frame is compared with


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("hold_s", -1.0),
        ("frozen_s", 0.0),
        ("interval_s", float("nan")),
        ("dark_luma", 230.0),
        ("bright_luma", 300.0),
        ("defocus_fraction", 1.0),
        ("covered_fraction", 0.0),
        ("moved_fraction", 1.5),
        ("moved_degrees", 90.0),
        ("width", 8),
        ("baseline_frames", MIN_BASELINE - 1),
    ],
)
def test_bad_thresholds_are_refused_naming_the_field(field: str, value: float) -> None:
    changes: dict[str, Any] = {field: value}
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(DEFAULTS, **changes)


@pytest.mark.parametrize(
    "frame",
    [np.zeros((90, 160), np.uint8), np.zeros((90, 160, 3), np.float32), np.zeros((8, 160, 3), np.uint8)],
    ids=["grey", "float", "tiny"],
)
def test_a_frame_not_bgr_uint8_is_refused(frame: np.ndarray) -> None:
    with pytest.raises(ValueError, match="expected a BGR frame"):
        CameraHealth().observe(frame, 0.0)


def test_a_clock_going_back_is_refused() -> None:
    health = CameraHealth()
    frame = next(clip("normal", 1))[0]
    health.observe(frame, 5.0)
    with pytest.raises(ValueError, match="never decrease"):
        health.observe(frame, 4.0)
