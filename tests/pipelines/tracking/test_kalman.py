"""`pipelines.tracking.kalman`: box conversions and one predict / update step against the
constant-velocity filter worked by hand (per coordinate: position and velocity variances)."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.tracking.kalman import KalmanBoxFilter, to_xyah, to_xyxy


def test_xyah_of_a_box_and_back() -> None:
    boxes = np.array([[10, 20, 50, 120], [0, 0, 30, 10]], np.float32)
    assert to_xyah(boxes) == pytest.approx(np.array([[30, 70, 0.4, 100], [15, 5, 3, 10]]))
    assert to_xyxy(to_xyah(boxes)) == pytest.approx(boxes)


def test_predict_moves_each_track_by_its_velocity() -> None:
    kf = KalmanBoxFilter()
    mean, cov = kf.initiate(np.array([100.0, 50.0, 0.5, 100.0]))
    mean[4:] = [3.0, -2.0, 0.0, 1.0]  # per frame
    means, _ = kf.predict(mean[None], cov[None])
    assert means[0] == pytest.approx([103.0, 48.0, 0.5, 101.0, 3.0, -2.0, 0.0, 1.0])


def test_one_predict_and_update_match_the_filter_worked_by_hand() -> None:
    """Height 100 px, ByteTrack's noise: the new track's position std is 2 * h / 20 = 10 px,
    its velocity std 10 * h / 160 = 6.25 px/frame; predict adds (h / 20)^2 and (h / 160)^2 and
    carries the velocity variance into the position's; the measurement's variance is (h / 20)^2."""
    kf = KalmanBoxFilter()
    start = np.array([100.0, 50.0, 0.5, 100.0])
    mean, cov = kf.initiate(start)
    assert np.diag(cov)[[0, 4]] == pytest.approx([10.0**2, 6.25**2])

    means, covs = kf.predict(mean[None], cov[None])
    p_pos, p_cross, p_vel = 100 + 6.25**2 + 5**2, 6.25**2, 6.25**2 + 0.625**2
    assert covs[0, 0, 0] == pytest.approx(p_pos) and covs[0, 0, 4] == pytest.approx(p_cross)
    assert covs[0, 4, 4] == pytest.approx(p_vel)

    measured = np.array([[110.0, 50.0, 0.5, 100.0]])  # 10 px to the right
    updated, after = kf.update(means, covs, measured)
    total = p_pos + 5**2
    assert updated[0, 0] == pytest.approx(100 + 10 * p_pos / total)
    assert updated[0, 4] == pytest.approx(10 * p_cross / total), "the velocity learns from the jump"
    assert updated[0, [1, 3]] == pytest.approx([50.0, 100.0]), "unmoved coordinates stay"
    assert after[0, 0, 0] == pytest.approx(p_pos - p_pos**2 / total)
    assert after[0, 0, 0] < covs[0, 0, 0], "a measurement makes the filter surer"


def test_a_small_box_is_trusted_to_move_less_than_a_big_one() -> None:
    kf = KalmanBoxFilter()
    small, big = kf.initiate(np.array([0, 0, 1, 10.0])), kf.initiate(np.array([0, 0, 1, 200.0]))
    means = np.stack([small[0], big[0]])
    _, covs = kf.predict(means, np.stack([small[1], big[1]]))
    assert covs[0, 0, 0] == pytest.approx(covs[1, 0, 0] / 400), "variances scale with the height squared"
