"""`edge-agent detect`: a model on images or videos (every N-th frame), the detections printed or
drawn, objects followed with ``--track`` and counted on ``--line``s. Task models print more per
detection (a mask's polygons, keypoints, an oriented box); a classification model prints its
top classes per image instead (docs/detect-output.schema.json).

Heavy libraries (OpenCV, ONNX Runtime, LiteRT) are imported inside the command, so ``edge-agent
--help`` and a first detection start fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cli.args import line_points, positive_int, unit_interval
from pipelines.decoding.decoders import DECODER_CHOICES
from pipelines.decoding.detection_filter import DEFAULTS, exporter_default

if TYPE_CHECKING:
    import numpy.typing as npt

    from pipelines.decoding.classifier import Classification
    from pipelines.decoding.detections import Detections
    from pipelines.decoding.labels import Labels
    from pipelines.sources.capture import FileSource
    from pipelines.tracking.analytics import SceneAnalytics
from agent.cli.args import RUNTIME_CHOICES
from agent.cli.failure import CliError


def add_parser(commands: Any) -> None:
    """Add ``edge-agent detect`` to the subparsers."""
    detect = commands.add_parser(
        "detect", help="run a detection, segmentation, pose, oriented-box or classification model on images"
    )
    detect.add_argument("model", type=Path, metavar="MODEL", help="an .onnx or .tflite model")
    detect.add_argument("images", type=Path, nargs="+", metavar="IMAGE", help="image or video files")
    detect.add_argument("--labels", type=Path, help="labels file, one per line (default: the model's metadata)")
    detect.add_argument("--runtime", choices=RUNTIME_CHOICES, default="auto")
    detect.add_argument(
        "--decoder",
        choices=DECODER_CHOICES,
        default="auto",
        help="output decoder (default auto: from the outputs and the model's metadata; docs/models.md lists exports)",
    )
    thresholds = detect.add_argument_group(
        "thresholds",
        "the defaults are a bundle's (bundle build --conf --iou --max-det); on a device each camera keeps "
        "detections by agent.yaml's cameras[].conf, iou, max_det and classes where set, else by its bundle's: "
        "bundle inspect shows a bundle's, the status page and /api/status the values in force on each camera",
    )
    thresholds.add_argument(
        "--conf",
        type=unit_interval,
        help=f"keep detections scoring above this, 0..1 (default: {exporter_default('conf')})",
    )
    thresholds.add_argument(
        "--iou",
        type=unit_interval,
        help=f"NMS: drop a box overlapping a better one of its class more than this, 0..1 "
        f"(default: {exporter_default('iou')})",
    )
    thresholds.add_argument(
        "--max-det",
        type=positive_int,
        help=f"most detections kept per image (default {DEFAULTS.max_det})",
    )
    detect.add_argument("--save-dir", type=Path, help="also write each image with its boxes drawn, as JPEG, here")
    detect.add_argument("--every", type=positive_int, default=1, help="videos: detect on every N-th frame")
    detect.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per image (or video frame) per line (docs/detect-output.schema.json)",
    )
    detect.add_argument(
        "--track",
        action="store_true",
        help="follow objects across each video's frames: a tracker_id on each detection, and a last summary line",
    )
    detect.add_argument(
        "--line",
        type=line_points,
        action="append",
        default=[],
        metavar="X1,Y1,X2,Y2",
        help="with --track: count crossings of this line (pixels; forward = from the left of point 1 -> point 2 "
        "to its right, as seen on the image); repeat for more lines",
    )
    detect.add_argument(
        "--motion",
        action="store_true",
        help="videos: infer only the frames where something moves (and a tracked object's keepalive, and one frame "
        "every 2 s), as a camera with motion.enabled does (its defaults; docs/cameras.md); a frame not inferred "
        'repeats the last detections (--json: "inferred": false) and the last line counts the frames inferred',
    )


#: most points of one mask's polygons in the JSON output
MASK_POINTS = 200
#: classes printed for a classification model
TOP_CLASSES = 5


def _task_fields(detections: Detections, i: int) -> dict[str, Any]:
    """A detection's mask polygons, keypoints and oriented box, where the model gives them."""
    from pipelines.decoding.rotated import corners

    fields: dict[str, Any] = {}
    if detections.masks is not None:
        polygons = detections.masks.outline(i, MASK_POINTS)
        fields["mask"] = {"polygons": [[[round(float(x), 1), round(float(y), 1)] for x, y in p] for p in polygons]}
    if detections.keypoints is not None:
        fields["keypoints"] = [
            [round(float(v), 1) for v in point[:2]] + [round(float(v), 4) for v in point[2:]]
            for point in detections.keypoints[i]
        ]
    if detections.xywhr is not None:
        cx, cy, w, h, angle = (float(v) for v in detections.xywhr[i])
        points = corners(detections.xywhr[i : i + 1])[0]
        fields["obb"] = {
            "cx": round(cx, 1),
            "cy": round(cy, 1),
            "w": round(w, 1),
            "h": round(h, 1),
            "angle": round(angle, 4),
            "corners": [[round(float(x), 1), round(float(y), 1)] for x, y in points],
        }
    return fields


def _class_rows(result: Classification, labels: Labels) -> list[dict[str, Any]]:
    return [
        {"label": labels(class_id), "class_id": class_id, "score": round(score, 4)}
        for class_id, score in result.top(TOP_CLASSES)
    ]


VIDEO_SUFFIXES = frozenset({".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ts", ".mjpeg"})


def _detection_rows(detections: Detections, labels: Labels) -> list[dict[str, Any]]:
    rows = []
    for i, (box, score, class_id) in enumerate(
        zip(detections.xyxy, detections.confidence, detections.class_id, strict=True)
    ):
        row = {
            "label": labels(int(class_id)),
            "class_id": int(class_id),
            "score": round(float(score), 4),
            "box": [round(float(v), 1) for v in box],
        }
        if detections.tracker_id is not None:  # --track: null until a track is confirmed
            row["tracker_id"] = int(detections.tracker_id[i]) if detections.tracker_id[i] >= 0 else None
        row.update(_task_fields(detections, i))
        rows.append(row)
    return rows


class _Tracking:
    """``detect --track``: one tracker (and the `--line` counters) per input file; the summary
    adds them up over the files."""

    def __init__(self, lines: list[tuple[float, float, float, float]]) -> None:
        self.lines, self.tracks = lines, 0
        self.counts = [[0, 0] for _ in lines]
        self.scene: SceneAnalytics | None = None

    def start(self) -> None:
        from pipelines.tracking.analytics import SceneAnalytics
        from pipelines.tracking.zones import LineSpec

        self.finish()
        specs = [LineSpec(f"line{i}", (x1, y1), (x2, y2)) for i, (x1, y1, x2, y2) in enumerate(self.lines)]
        self.scene = SceneAnalytics("detect", lines=specs)

    def update(self, index: int, image: npt.NDArray[Any], detections: Detections, inferred: bool = True) -> Detections:
        """`detections` tracked (a frame not `inferred` coasts: `SceneAnalytics.update`)."""
        from pipelines.sources.frames import Frame

        if self.scene is None:
            raise RuntimeError("_Tracking.start() must come before update()")
        return self.scene.update(Frame(index, float(index), image, inferred=inferred), detections).detections

    def tracks_alive(self) -> bool:
        return self.scene is not None and self.scene.tracks_alive()

    def finish(self) -> None:
        if self.scene is None:
            return
        self.tracks += self.scene.tracker.confirmed
        for total, count in zip(self.counts, self.scene.counts().lines, strict=True):
            total[0] += count.forward
            total[1] += count.backward
        self.scene = None

    def summary(self) -> dict[str, Any]:
        self.finish()
        lines = [
            {"points": [[x1, y1], [x2, y2]], "forward": f, "backward": b}
            for (x1, y1, x2, y2), (f, b) in zip(self.lines, self.counts, strict=True)
        ]
        return {"summary": {"tracks": self.tracks, "lines": lines}}


def run(args: argparse.Namespace) -> int:
    from agent.serving.loader import load_model
    from pipelines.decoding.detector import Detector
    from pipelines.decoding.labels import Labels

    model: Path = args.model
    if not model.is_file():
        raise CliError(f"model file not found: {model}")
    if args.line and not args.track:
        raise CliError("--line counts tracked objects: add --track")
    tracking = _Tracking(args.line) if args.track else None
    labels = Labels.from_file(args.labels) if args.labels else None
    runtime, choice = load_model(model, args.runtime, warmup=False)  # the first image warms it up
    with runtime:
        if labels is None:
            labels = Labels(runtime.metadata.names or {})
        if _is_classifier(runtime):
            if args.track or args.save_dir:
                raise CliError(
                    "a classification model gives classes per image, not detections: drop --track and --save-dir"
                )
            return _classify(args, runtime, choice.device, labels)
        detector = Detector(runtime, args.decoder, conf=args.conf, iou=args.iou, max_det=args.max_det)
        save = _annotated_writer(args.save_dir, labels) if args.save_dir else None
        status, counted = 0, _Counted()
        for path in args.images:
            video = path.suffix.lower() in VIDEO_SUFFIXES
            if tracking is not None:
                tracking.start()
            gate = _MotionGated(tracking) if args.motion and video else None
            frames = _video_frames(path, args.every, gate.opened if gate else None) if video else _image_frame(path)
            try:
                for index, image in frames:
                    inferred = gate is None or gate.admit(index or 0, image)
                    found = detector.detect(image) if inferred or gate is None else gate.last
                    if gate is not None and inferred:
                        gate.last = found
                    counted.add(inferred)
                    detections = found if tracking is None else tracking.update(index or 0, image, found, inferred)
                    if save is not None:
                        save(path, index, image, detections)
                    rows = _detection_rows(detections, labels)
                    _print_detections(
                        args.json, path, index, runtime.name, choice.device, detector.decoder, rows,
                        inferred if args.motion else None,
                    )  # fmt: skip
            except CliError as exc:
                print(f"edge-agent: error: {exc}", file=sys.stderr)
                status = 1
        summary: dict[str, Any] = tracking.summary()["summary"] if tracking is not None else {}
        if args.motion:
            summary.update(frames=counted.frames, inferred_frames=counted.inferred)
        if summary:
            _print_summary(args.json, {"summary": summary})
    return status


class _Counted:
    """Frames detected on and, of them, those inferred (``--motion``'s last line)."""

    def __init__(self) -> None:
        self.frames = self.inferred = 0

    def add(self, inferred: bool) -> None:
        self.frames += 1
        self.inferred += inferred


class _MotionGated:
    """``detect --motion``: one video's motion gate with a camera's defaults, on the video's own
    time (frame index / its FPS, learnt when the video is `opened`; 30 where the file does not
    say), its keepalive asking the tracker where ``--track`` runs; `last` the last inferred
    frame's detections."""

    def __init__(self, tracking: _Tracking | None) -> None:
        from pipelines.decoding.detections import Detections
        from pipelines.gating import Gating
        from pipelines.motion import MotionDetector
        from pipelines.motion_gate import MotionGate
        from pipelines.tracking.tracker import TrackerSettings

        self.fps = 30.0
        hold = TrackerSettings().lost_frames if tracking else None  # the tracker `_Tracking` builds
        self.gating = Gating(
            MotionDetector(), MotionGate(track_hold_frames=hold), tracking.tracks_alive if tracking else None
        )
        self.last = Detections.empty()

    def opened(self, source: FileSource) -> None:
        self.fps = source.fps or self.fps

    def admit(self, index: int, image: npt.NDArray[Any]) -> bool:
        return self.gating.admit(image, index / self.fps)


def _is_classifier(runtime: Any) -> bool:
    """The model's task is ``classify`` (its metadata, else its one ``(1, nc)`` output); a task
    nobody decodes, or outputs contradicting the task, raise `DecoderError` naming them."""
    from pipelines.decoding.decoder_choice import ModelHints
    from pipelines.decoding.tasks import model_task

    hints = ModelHints.from_metadata(runtime.metadata)
    shapes = [tuple(spec.shape) for spec in runtime.outputs]
    return model_task(hints.task, shapes, hints.num_classes, hints.kpt_shape) == "classify"


def _classify(args: argparse.Namespace, runtime: Any, device: str, labels: Labels) -> int:
    """Print a classification model's top classes for each image (or video frame)."""
    from pipelines.decoding.classifier import Classifier

    classifier = Classifier(runtime)
    status = 0
    for path in args.images:
        frames = _video_frames(path, args.every) if path.suffix.lower() in VIDEO_SUFFIXES else _image_frame(path)
        try:
            for index, image in frames:
                rows = _class_rows(classifier.classify(image), labels)
                if args.json:
                    record: dict[str, Any] = {"image": str(path)}
                    if index is not None:
                        record["frame"] = index
                    record.update(runtime=runtime.name, task="classify", classes=rows)
                    print(json.dumps(record), flush=True)
                    continue
                where = f"{path}" if index is None else f"{path} frame {index}"
                best = ", ".join(f"{r['label']} {r['score']:.2f}" for r in rows)
                print(f"{where}: {best} [{runtime.name} on {device}, classify]")
        except CliError as exc:
            print(f"edge-agent: error: {exc}", file=sys.stderr)
            status = 1
    return status


def _print_summary(as_json: bool, summary: dict[str, Any]) -> None:
    if as_json:
        print(json.dumps(summary), flush=True)
        return
    found = summary["summary"]
    if "tracks" in found:
        print(f"summary: {found['tracks']} object(s) tracked")
        for line in found["lines"]:
            (x1, y1), (x2, y2) = line["points"]
            print(
                f"  line ({x1:g}, {y1:g}) -> ({x2:g}, {y2:g}): {line['forward']} forward, {line['backward']} backward"
            )
    if "inferred_frames" in found:
        print(f"motion: {found['inferred_frames']} of {found['frames']} frame(s) inferred")


def _annotated_writer(folder: Path, labels: Labels) -> Callable[[Path, int | None, npt.NDArray[Any], Detections], None]:
    import cv2

    from pipelines.annotate import BoxAnnotator

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {folder}: {exc.strerror}") from exc
    annotator = BoxAnnotator(labels)

    def save(path: Path, index: int | None, image: npt.NDArray[Any], detections: Detections) -> None:
        name = f"{path.stem}.jpg" if index is None else f"{path.stem}_{index:06d}.jpg"
        if not cv2.imwrite(str(folder / name), annotator.annotate(image, detections)):
            raise CliError(f"cannot write {folder / name}")

    return save


def _image_frame(path: Path) -> Iterator[tuple[int | None, npt.NDArray[Any]]]:
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_COLOR) if path.is_file() else None
    if image is None:
        raise CliError(f"image {path}: {'not found' if not path.exists() else 'cannot be decoded as an image'}")
    yield None, image


def _video_frames(
    path: Path, every: int, opened: Callable[[FileSource], None] | None = None
) -> Iterator[tuple[int | None, npt.NDArray[Any]]]:
    """Every `every`-th frame of the video at `path`, with its index; `opened` is handed the
    source once it is open (``--motion`` reads its FPS there)."""
    from pipelines.sources.capture import FileSource
    from pipelines.sources.frames import SourceError

    source = FileSource(path)
    try:
        source.open()
        if opened is not None:
            opened(source)
        while (frame := source.read()) is not None:
            if frame.index % every == 0:
                yield frame.index, frame.image
    except SourceError as exc:
        raise CliError(str(exc)) from exc
    finally:
        source.close()


def _print_detections(
    as_json: bool,
    path: Path,
    frame: int | None,
    runtime: str,
    device: str,
    decoder: str,
    rows: list[dict[str, Any]],
    inferred: bool | None = None,
) -> None:
    """One image's or frame's detections; `inferred` (``--motion``): whether the model ran on
    it (False: the last detections, repeated), None without ``--motion``."""
    if as_json:
        record: dict[str, Any] = {"image": str(path)}
        if frame is not None:
            record["frame"] = frame
        record.update(runtime=runtime, decoder=decoder, detections=rows)
        if inferred is not None:
            record["inferred"] = inferred
        print(json.dumps(record), flush=True)
        return
    where = f"{path}" if frame is None else f"{path} frame {frame}"
    repeated = ", not inferred: nothing moved" if inferred is False else ""
    print(f"{where}: {len(rows)} detection(s) [{runtime} on {device}, {decoder}{repeated}]")
    for row in rows:
        x1, y1, x2, y2 = row["box"]
        track = f"  #{row['tracker_id']}" if row.get("tracker_id") is not None else ""
        extra = ""
        if "obb" in row:
            extra += f"  angle {row['obb']['angle']:.2f} rad"
        if "keypoints" in row:
            extra += f"  {len(row['keypoints'])} keypoints"
        if "mask" in row:
            extra += f"  mask of {sum(len(p) for p in row['mask']['polygons'])} points"
        print(f"  {row['label']:<16} {row['score']:.2f}  ({x1:.0f}, {y1:.0f}) - ({x2:.0f}, {y2:.0f}){track}{extra}")
