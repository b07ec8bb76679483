"""`agent.web.history`: chart points and each version's reference FPS."""

from __future__ import annotations

from testkit.snapshots import camera, snapshot

from agent.snapshot import VersionRef
from agent.web.history import REFERENCE_S, History


def test_history_points_and_the_reference_fps_of_each_version() -> None:
    history = History(points=5)
    sha1, sha2 = VersionRef("demo", "1", "1" * 64), VersionRef("demo", "2", "2" * 64)
    for i, fps in enumerate([8.0, 12.0, 9.0]):
        history.record(snapshot(ts=1000.0 + i, bundle=sha1, cameras=(camera(fps=fps),)))
    assert history.reference_fps(1000.0 + REFERENCE_S) == {}, "still measuring"
    history.record(snapshot(ts=1000.0 + REFERENCE_S + 1, bundle=sha1, cameras=(camera(fps=30.0),)))
    assert history.reference_fps(1000.0 + REFERENCE_S + 1) == {"cam0": 12.0}, "only the first minute counts"
    history.record(snapshot(ts=2000.0, bundle=sha2, cameras=(camera(fps=5.0), camera("cam1", fps=3.0))))
    assert history.reference_fps(2000.0 + REFERENCE_S + 1) == {"cam0": 5.0, "cam1": 3.0}, "a new version, anew"
    points = history.to_json(since=1000.0)
    assert points["ts"] == [1001.0, 1002.0, 1000.0 + REFERENCE_S + 1, 2000.0]
    assert points["cameras"]["cam1"]["fps"] == [None, None, None, 3.0]
    assert points["cameras"]["cam0"]["latency_ms"] == [40.0] * 4
    assert len(history.to_json()["ts"]) == 5  # bounded
