"""`edge-agent detect --track --line`: tracker ids per detection and the crossings counted on a
video of the traffic scene (the demo model on ONNX Runtime), against the scene's ground truth."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest

from agent.cli import main
from pipelines.traffic import TrafficScene
from tests.conftest import DEMO_MODELS
from tests.test_lines_zones import LINE, MOVERS, true_crossings

FRAMES = 130


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The crossings clip of test_lines_zones as an MJPG .avi (every frame a keyframe)."""
    path = tmp_path_factory.mktemp("track") / "crossings.avi"
    scene = TrafficScene(movers=MOVERS, seed=5)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 15.0, (640, 480))
    for index in range(FRAMES):
        writer.write(scene.render(index)[0])
    writer.release()
    return path


def test_track_json_gives_ids_and_a_summary_of_the_true_crossings(
    video: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = ",".join(f"{v:g}" for v in (*LINE.start, *LINE.end))
    reverse = ",".join(f"{v:g}" for v in (*LINE.end, *LINE.start))
    model = str(DEMO_MODELS / "demo_detector.onnx")
    assert main(["detect", model, str(video), "--track", "--line", line, "--line", reverse, "--json"]) == 0
    records = [json.loads(text) for text in capsys.readouterr().out.splitlines()]
    frames, summary = records[:-1], records[-1]["summary"]
    assert [r["frame"] for r in frames] == list(range(FRAMES))
    ids = {d["tracker_id"] for r in frames for d in r["detections"]}
    assert all("tracker_id" in d for r in frames for d in r["detections"])
    assert None in ids, "a new object's first frame has no id yet"
    assert ids - {None} == set(range(1, summary["tracks"] + 1))
    assert summary["tracks"] >= len(MOVERS), summary
    truth = true_crossings(MOVERS, FRAMES, LINE)
    down = sum(n for (_, direction), n in truth.items() if direction == "forward")
    up = sum(n for (_, direction), n in truth.items() if direction == "backward")
    assert summary["lines"] == [
        {"points": [list(LINE.start), list(LINE.end)], "forward": down, "backward": up},
        {"points": [list(LINE.end), list(LINE.start)], "forward": up, "backward": down},
    ]


def test_track_text_output_and_bad_lines(video: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(DEMO_MODELS / "demo_detector.onnx")
    assert main(["detect", model, str(video), "--track", "--every", "5", "--line", "0,240,640,240"]) == 0
    out = capsys.readouterr().out
    assert "#1" in out and "object(s) tracked" in out and "line (0, 240) -> (640, 240):" in out
    assert main(["detect", model, str(video), "--line", "0,240,640,240"]) != 0
    assert "--line counts tracked objects: add --track" in capsys.readouterr().err
    for bad, message in (("1,2,3", "got 3 in"), ("1,2,x,4", "four numbers"), ("5,5,5,5", "must differ")):
        with pytest.raises(SystemExit):
            main(["detect", model, str(video), "--track", "--line", bad])
        assert message in capsys.readouterr().err
