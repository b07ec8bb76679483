"""`pipelines.sources.tracking_scene`: identities, occlusions, comings and goings."""

from __future__ import annotations

import numpy as np

from pipelines.sources.tracking_scene import EPOCH, TrackingScene


def test_tracking_scene_truth_has_identities_occlusions_and_comings_and_goings() -> None:
    scene = TrackingScene(seed=11)
    seen: dict[int, list[int]] = {}
    hidden = 0
    for index in range(0, 2 * EPOCH, 3):
        image, truth = scene.render(index)
        assert image.shape == (480, 640, 3) and truth.ids is not None
        assert len(set(truth.ids.tolist())) == len(truth.ids), "an id appears once a frame"
        for object_id in truth.ids.tolist():
            seen.setdefault(object_id, []).append(index)
        hidden += int((truth.visible < 0.5).sum())
    assert len(seen) >= 15, "objects come and go: more identities than fit at once"
    assert all(frames[-1] - frames[0] < EPOCH for frames in seen.values()), "each object leaves"
    assert hidden > 0, "some objects are hidden or half out of the frame"
    again, truth = TrackingScene(seed=11).render(2 * EPOCH - 3)
    assert np.array_equal(again, scene.render(2 * EPOCH - 3)[0]), "a frame is a pure function of (seed, index)"
