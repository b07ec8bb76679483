"""The models of ``agent.yaml`` (docs/configuration.md): one pydantic model per section.

Unknown keys are forbidden, so a typo fails with its location instead of being ignored.
Validators check values only; files named here (keys, certificates, password files) are read by
the code that uses them, and `agent.config.loading.check_files` reports the missing ones for
``edge-agent config check``. ``python -m agent.config`` prints the JSON Schema (kept as
docs/agent-config.schema.json).
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import re
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from agent.errors import ConfigError
from agent.paths import DEFAULT_STATE_DIR
from pipelines.motion_gate import IDLE_INTERVAL_S, KEEPALIVE_FPS
from pipelines.sources.frames import SourceError
from pipelines.sources.specs import source_kind
from pipelines.tracking.anchors import parse_anchor
from runtimes.registry import RUNTIME_NAMES, RuntimeSettings
from runtimes.selection import Preference

if TYPE_CHECKING:
    from pipelines.camera_health import HealthThresholds
    from pipelines.motion import MotionSettings

_TOPIC_WORD = re.compile(r"^[A-Za-z0-9_.-]+$")  # no MQTT wildcards, separators or spaces


def _topic_word(value: str) -> str:
    if not _TOPIC_WORD.match(value):
        raise ValueError(f"{value!r} may only hold letters, digits, '_', '-' and '.'")
    return value


TopicWord = Annotated[str, AfterValidator(_topic_word)]  # one level of an MQTT topic

#: the deprecation notes of the keys renamed in this release (kept for one release, then refused)
PIPELINES_RENAMED = "pipelines: is deprecated, renamed cameras: (the same list); pipelines: goes in the next release"
SERVING_MOVED = (
    "cameras: as a mapping (share_model, batch, ffmpeg, ...) is deprecated, moved to serving: (the same settings); "
    "cameras: now lists the cameras, and the mapping form goes in the next release"
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # .inf and .nan refused


class BundleLimitsConfig(_Section):
    max_files: int = Field(default=256, ge=1, description="Most files one bundle may hold.")
    max_bytes: int = Field(default=1 << 30, ge=1, description="Most bytes one bundle may unpack to.")
    max_compression_ratio: float = Field(
        default=100.0,
        ge=1,
        allow_inf_nan=False,
        description="Most bytes a compressed (gzip, bz2, xz) bundle may unpack to per byte of the file; more is "
        "refused (TOO_COMPRESSED) as it inflates.",
    )
    max_bundle_bytes: int = Field(
        default=1 << 30,
        ge=1,
        description="Largest bundle file a deployment may download; a larger one is refused (TOO_LARGE) before "
        "a byte is written.",
    )


class DeviceSection(_Section):
    id: TopicWord | None = Field(
        default=None, description="Device id in topic names (letters, digits, '_', '-', '.'); default: the hostname."
    )
    group: TopicWord | None = Field(
        default=None, description="Fleet group: the device follows the group's deployments."
    )


class Secret(_Section):
    """A secret given inline, read from a file (first line), or from an environment variable."""

    value: str | None = Field(default=None, description="The secret itself (prefer file or env).")
    file: Path | None = Field(default=None, description="File whose first line is the secret.")
    env: str | None = Field(default=None, description="Environment variable holding the secret.")

    @model_validator(mode="after")
    def _exactly_one(self) -> Secret:
        given = [k for k in ("value", "file", "env") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of value, file, env (got {', '.join(given) or 'none'})")
        return self

    def resolve(self) -> str:
        """Read the secret; raises `ConfigError` naming the file or variable that is missing."""
        if self.value is not None:
            return self.value
        if self.file is not None:
            try:
                return self.file.read_text(encoding="utf-8").splitlines()[0].strip()
            except (OSError, IndexError) as exc:
                raise ConfigError(f"cannot read the secret file {self.file}: {exc}") from exc
        assert self.env is not None
        if self.env not in os.environ:
            raise ConfigError(f"the environment variable {self.env} (a secret in the config) is not set")
        return os.environ[self.env]


class TlsSection(_Section):
    ca_file: Path | None = Field(default=None, description="CA certificate(s) (PEM); default: the system's.")
    cert_file: Path | None = Field(default=None, description="Client certificate (PEM), for mutual TLS.")
    key_file: Path | None = Field(default=None, description="Client private key (PEM), for mutual TLS.")

    @model_validator(mode="after")
    def _pair(self) -> TlsSection:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class MqttSection(_Section):
    broker: str = Field(description="mqtt://HOST[:PORT] (1883) or mqtts://HOST[:PORT] (8883, TLS).")
    topic_root: str = Field(default="edge", description="First level of every topic.")
    client_id: str | None = Field(default=None, description="MQTT client id; default: edge-agent-<device id>.")
    keepalive_s: int = Field(default=30, ge=5, le=3600, description="MQTT keep-alive in seconds.")
    username: str | None = Field(default=None, description="User name, if the broker wants one.")
    password: Secret | None = Field(default=None, description="Password: {value|file|env: ...}.")
    tls: TlsSection | None = Field(default=None, description="TLS settings (implied by mqtts://).")
    reconnect_min_s: float = Field(default=0.5, gt=0, description="First reconnect delay (doubles, jittered).")
    reconnect_max_s: float = Field(default=60.0, gt=0, description="Longest reconnect delay.")
    offline_queue: int = Field(
        default=1000,
        ge=0,
        description="Messages kept in memory per topic while offline when the outbox cannot write its file "
        "(a full or broken disk); oldest dropped.",
    )

    @field_validator("broker")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ValueError(f"{value!r} is not mqtt://HOST[:PORT] or mqtts://HOST[:PORT]")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ValueError(f"{value!r}: {exc}") from exc
        return value

    @field_validator("topic_root")
    @classmethod
    def _root(cls, value: str) -> str:
        if not all(_TOPIC_WORD.match(level) for level in value.split("/")):
            raise ValueError(f"{value!r} must be topic levels of letters, digits, '_', '-', '.' joined by '/'")
        return value

    @property
    def host(self) -> str:
        return urlsplit(self.broker).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.broker)
        return parts.port or (8883 if parts.scheme == "mqtts" else 1883)

    @property
    def uses_tls(self) -> bool:
        return self.tls is not None or urlsplit(self.broker).scheme == "mqtts"


def _finite_point(point: list[float]) -> list[float]:
    if len(point) != 2 or not all(abs(v) < float("inf") for v in point):
        raise ValueError(f"a point is [x, y] in source-frame pixels, got {point}")
    return point


Point = Annotated[list[float], AfterValidator(_finite_point)]


def _anchor_text(value: str) -> str:
    parse_anchor(value)  # a ValueError naming what is wrong
    return value.strip()


#: an anchor (pipelines.tracking.anchors): center, bottom_center, obb_center or keypoints:I,J,...
AnchorText = Annotated[str, AfterValidator(_anchor_text)]
_ANCHOR_HELP = (
    "center, bottom_center, obb_center (an oriented box's own centre) or keypoints:I,J,... (the mean of those "
    "keypoints of a pose model, e.g. keypoints:15,16 for COCO's ankles; the box's bottom centre while none "
    "scores 0.5)"
)


class LineConfig(_Section):
    """A counting line (docs/analytics.md): crossings of a tracked object's anchor point."""

    name: TopicWord = Field(description="The line's name in telemetry, events and on the page.")
    points: list[Point] = Field(
        description="[[x1, y1], [x2, y2]] in source-frame pixels; 'in' (forward) is crossing from the left of "
        "the first point -> second point to its right, as seen on the image."
    )
    anchor: AnchorText | None = Field(
        default=None, description="The point of a tracked object this line tests (unset: the camera's): " + _ANCHOR_HELP
    )

    @field_validator("points")
    @classmethod
    def _two_points(cls, value: list[list[float]]) -> list[list[float]]:
        if len(value) != 2:
            raise ValueError(f"a line has exactly 2 points [[x1, y1], [x2, y2]], got {len(value)}")
        if value[0] == value[1]:
            raise ValueError(f"a line's two points must differ, got {value[0]} twice")
        return value


class ZoneConfig(_Section):
    """A zone (docs/analytics.md): which tracked objects are inside, and for how long."""

    name: TopicWord = Field(description="The zone's name in telemetry, events and on the page.")
    polygon: list[Point] = Field(description="[[x, y], ...] in source-frame pixels, at least 3 points.")
    labels: list[str] = Field(default_factory=list, description="Labels counted in the zone (empty: all).")
    anchor: AnchorText | None = Field(
        default=None, description="The point of a tracked object this zone tests (unset: the camera's): " + _ANCHOR_HELP
    )

    @field_validator("polygon")
    @classmethod
    def _three_points(cls, value: list[list[float]]) -> list[list[float]]:
        if len(value) < 3:
            raise ValueError(f"a zone's polygon needs at least 3 points, got {len(value)}")
        return value


class TrackerConfig(_Section):
    """The ByteTrack-style tracker of a camera (docs/analytics.md)."""

    high_score: float = Field(default=0.5, ge=0, le=1, description="Detections at or above this are matched first.")
    low_score: float = Field(
        default=0.1, ge=0, le=1, description="Detections from this up to high_score only keep existing tracks alive."
    )
    new_track_score: float = Field(
        default=0.6, ge=0, le=1, description="Least score of a detection that starts a track."
    )
    lost_frames: int = Field(
        default=30, ge=0, le=10_000, description="Frames a lost track keeps its id (hidden objects) before it ends."
    )

    @model_validator(mode="after")
    def _ordered(self) -> TrackerConfig:
        if self.low_score > self.high_score:
            raise ValueError(f"low_score ({self.low_score}) must not exceed high_score ({self.high_score})")
        return self


class ClipSection(_Section):
    """A camera's short clips around object events (docs/analytics.md#clips): kept with the
    snapshots under ``<state_dir>/media`` (``events.media``'s retention) and fetched like them."""

    pre_s: float = Field(default=3.0, ge=0, le=30, description="Seconds of video before the object's start event.")
    post_s: float = Field(default=5.0, gt=0, le=60, description="Seconds of video after the object's start event.")
    buffer_mb: float = Field(
        default=16.0,
        gt=0,
        le=512,
        description="Most MiB of JPEG frames the camera's ring buffer holds (the oldest go first; a 720p frame "
        "at quality 70 is about 0.1 MiB, docs/benchmarks.md).",
    )
    quality: int = Field(default=70, ge=10, le=100, description="JPEG quality of the buffered frames (10-100).")


# -- samples for retraining (issue 40 item 3) ---------------------------------------------------


class SamplesSection(_Section):
    """A camera's samples for retraining (docs/cameras.md#samples-for-retraining): frames kept
    with the serving model's detections as YOLO labels under ``<state_dir>/samples``, within
    their own budget, fetched only by the operator's signed ``samples`` command."""

    enabled: bool = Field(default=False, description="Keep samples of this camera (opt-in; off: nothing is kept).")
    score_band: tuple[float, float] | None = Field(
        default=(0.3, 0.6),
        description="[lo, hi]: a frame with a detection scoring within it (model unsure) is kept; unset: none.",
    )
    random_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of the other frames kept at random (0..1; 0.001: one in a thousand).",
    )
    max_mb: float = Field(
        default=256.0, gt=0, le=65536, description="Most MiB this camera's samples take (the oldest go)."
    )
    max_age_h: float = Field(
        default=168.0, gt=0, le=8760, description="Samples older than this many hours are deleted."
    )
    min_interval_s: float = Field(
        default=10.0, ge=0, le=86400, description="Fewest seconds between two kept frames of this camera."
    )
    quality: int = Field(default=90, ge=10, le=100, description="JPEG quality of a kept frame (10-100).")
    privacy_masks: list[Annotated[list[Point], Field(min_length=3, max_length=64)]] = Field(
        default_factory=list,
        max_length=32,
        description="Polygons [[x, y], ...] in source-frame pixels (3 to 64 points each, at most 32) blanked "
        "(black) in a frame before it is kept: windows, a neighbour's garden, a screen.",
    )

    @field_validator("score_band")
    @classmethod
    def _band(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not 0 <= value[0] < value[1] <= 1:
            raise ValueError(f"score_band is [lo, hi] with 0 <= lo < hi <= 1, got [{value[0]}, {value[1]}]")
        return value


# -- end of samples for retraining ------------------------------------------------------------


class MotionSection(_Section):
    """A camera's motion detection and the inference it gates (pipelines.motion,
    pipelines.motion_gate, pipelines.gating; docs/cameras.md#motion). The detector's defaults
    are `pipelines.motion.MotionSettings`'s (a test holds them equal; that module imports
    OpenCV, which loading the config does not)."""

    enabled: bool = Field(default=False, description="Infer only where something moves (see the other keys).")
    width: int = Field(default=320, ge=64, le=1920, description="Width in pixels of the grey copy motion is judged on.")
    threshold: int = Field(
        default=25,
        ge=1,
        le=255,
        description="Grey levels (1-255) a pixel must differ from the background by to count as changed.",
    )
    min_area: int = Field(
        default=400,
        ge=1,
        le=10_000_000,
        description="Least area of a moving blob, in source-frame pixels; smaller ones (insects, rain) are ignored.",
    )
    learning_rate: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="The background's weight of each new frame (0-1]: higher forgets a stopped object sooner.",
    )
    global_change: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Fraction (0-1] of the unmasked pixels changed at once that is a lighting change (lights, "
        "auto-exposure, IR mode), which recalibrates the background instead of counting as motion.",
    )
    keepalive_fps: float = Field(
        default=KEEPALIVE_FPS,
        gt=0,
        le=60,
        description="Frames per second inferred while a confirmed track is alive and nothing moves.",
    )
    idle_interval_s: float = Field(
        default=IDLE_INTERVAL_S,
        gt=0,
        le=60,
        description="Most seconds between two inferred frames, motion or not (an object that appears without "
        "moving is found within it).",
    )
    masks: list[Annotated[list[Point], Field(min_length=3, max_length=64)]] = Field(
        default_factory=list,
        max_length=32,
        description="Polygons [[x, y], ...] in source-frame pixels (3 to 64 points each, at most 32) where "
        "movement is ignored: an on-screen clock, trees.",
    )
    regions: bool = Field(
        default=False,
        description="Infer frames with motion on square crops around what moved (at most 4, each at least the "
        "model's input), not the whole frame: finds small objects far away on 1080p and 4K cameras (box "
        "detectors only; docs/cameras.md#regions).",
    )
    full_frame_interval_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="With regions: most seconds between two full-frame inferences while crops are inferred.",
    )

    @model_validator(mode="after")
    def _regions_need_motion(self) -> MotionSection:
        if self.regions and not self.enabled:
            raise ValueError("regions: true needs enabled: true (crops follow the motion the gate finds)")
        return self

    def settings(self) -> MotionSettings:
        """The detector's settings from this section."""
        from pipelines.motion import MotionSettings  # OpenCV, only where a detector is built

        masks = tuple(tuple((x, y) for x, y in polygon) for polygon in self.masks)
        return MotionSettings(self.width, self.threshold, self.min_area, self.learning_rate, self.global_change, masks)


# -- drift (issue 40): one camera's detections against its version's baseline ---------------------


class DriftSection(_Section):
    """What a camera's model reports now against its version's first hours (pipelines.drift,
    agent.serving.drift_watch; docs/cameras.md#drift)."""

    enabled: bool = Field(default=True, description="Keep the camera's drift score (a few bytes per frame).")
    baseline_h: float = Field(
        default=24.0,
        gt=0,
        le=24 * 30,
        description="Hours a version watches this camera for its baseline (time the camera was inferring).",
    )
    window_h: float = Field(
        default=24.0,
        gt=0,
        le=24 * 30,
        description="Hours of the current window compared with the baseline; a whole day compares day and "
        "night with day and night, a shorter window reacts sooner but sees the daily cycle as drift.",
    )
    threshold: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="Drift score (0-1) from which the page reports a problem: the largest of the distances "
        "between the class mixes, the confidence and box-size histograms, and half the change in detections "
        "per minute (docs/cameras.md#drift).",
    )


# -- end of drift ------------------------------------------------------------------------------------


class CameraHealthSection(_Section):
    """A camera's health check (pipelines.camera_health, docs/cameras.md#camera-health): frozen,
    dark, overexposed, low contrast, defocused, covered or moved. The thresholds' defaults are
    `pipelines.camera_health.HealthThresholds`'s (a test holds them equal; that module imports
    OpenCV, which loading the config does not). On by default: one small grey frame a second
    costs about 0.2 % of a core (bench/camera_health.py)."""

    enabled: bool = Field(default=True, description="Judge the camera's picture (false: no health check).")
    interval_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="Seconds between two frames judged (0-60]; the check's cost scales with 1/interval_s.",
    )
    width: int = Field(default=160, ge=32, le=640, description="Width in pixels of the grey copy judged (32-640).")
    frozen_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds of near-identical frames from a running source before the camera is frozen.",
    )
    frozen_diff: float = Field(
        default=0.1,
        gt=0,
        le=255,
        description="Mean absolute difference (grey levels) below which two frames are near-identical.",
    )
    hold_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="Seconds every condition but frozen must hold before it is a problem (a passing truck is not).",
    )
    dark_luma: float = Field(default=35.0, ge=0, le=255, description="Mean luminance (0-255) below which: dark.")
    bright_luma: float = Field(
        default=220.0, ge=0, le=255, description="Mean luminance (0-255) above which: overexposed."
    )
    min_contrast: float = Field(
        default=8.0, ge=0, le=128, description="Luminance spread (std, grey levels) below which: low contrast."
    )
    defocus_fraction: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="Sharpness below this share (0-1) of the camera's own baseline: defocused (defocus, fog).",
    )
    covered_fraction: float = Field(
        default=0.25,
        gt=0,
        lt=1,
        description="Spread and edges both suddenly below this share (0-1) of their baselines: covered.",
    )
    baseline_frames: int = Field(
        default=120,
        ge=10,
        le=10_000,
        description="Good frames whose median is the sharpness, spread and edge baseline.",
    )
    moved_fraction: float = Field(
        default=0.05,
        gt=0,
        lt=1,
        description="A shift against the reference image above this share (0-1) of the width: moved.",
    )
    moved_degrees: float = Field(
        default=3.0, gt=0, lt=90, description="A rotation against the reference image above this (degrees): moved."
    )
    reference_after_s: float = Field(
        default=60.0,
        ge=0,
        le=86_400,
        description="Seconds a camera must be good before its frame becomes the reference image (again every "
        "reference_after_s while it stays good).",
    )

    @model_validator(mode="after")
    def _dark_below_bright(self) -> CameraHealthSection:
        if self.dark_luma >= self.bright_luma:
            raise ValueError(f"dark_luma ({self.dark_luma}) must be below bright_luma ({self.bright_luma})")
        return self

    def thresholds(self) -> HealthThresholds:
        """The health check's thresholds from this section."""
        from pipelines.camera_health import HealthThresholds  # OpenCV, only where a check is built

        return HealthThresholds(**self.model_dump(exclude={"enabled"}))


class CameraSection(_Section):
    name: TopicWord = Field(default="cam0", description="Camera name, used in telemetry, events and commands.")
    source: str = Field(
        description="synthetic[:SEED], a video file, /dev/videoN or an index, rtsp://..., gst:PIPELINE, "
        "ffmpeg:[OPTIONS] URL_OR_FILE, rpicam:ARGS (docs/cameras.md), or a GStreamer pipeline for OpenCV."
    )
    loop: bool = Field(default=True, description="Play a video file in a loop.")
    width: int | None = Field(default=None, ge=1, description="Camera capture width.")
    height: int | None = Field(default=None, ge=1, description="Camera capture height.")
    fps: float | None = Field(default=None, gt=0, description="Camera frame rate (synthetic: 15 by default).")
    max_fps: float | None = Field(default=None, gt=0, description="Most frames per second inferred.")
    workers: int | Literal["auto"] = Field(
        default="auto",
        description="Frames in flight at once on this camera's model (1-8): more throughput, each frame slower "
        "(ONNX Runtime; on a runtime that serves one call at a time the camera uses 1). auto: what autotune "
        "chose at activation, else 1.",
    )
    lines: list[LineConfig] = Field(default_factory=list, description="Counting lines (docs/analytics.md).")
    zones: list[ZoneConfig] = Field(default_factory=list, description="Zones: occupancy and dwell time.")
    anchor: AnchorText = Field(
        default="center",
        description="The point of a tracked object that lines and zones test (each may name its own): its box's "
        "centre, or bottom_center, the middle of its bottom edge (where a person or vehicle touches the ground), "
        "or for task models obb_center or keypoints:I,J,... (the mean of those keypoints, e.g. keypoints:15,16 "
        "for COCO's ankles; the box's bottom centre while none scores 0.5).",
    )
    tracker: TrackerConfig = Field(default_factory=TrackerConfig, description="The camera's object tracker.")
    clips: ClipSection | None = Field(
        default=None,
        description="Keep a short clip around each object's start event (unset: no clips).",
    )
    motion: MotionSection | None = Field(
        default=None,
        description="Motion detection and motion-gated inference (unset, or enabled false: every frame inferred).",
    )
    drift: DriftSection = Field(
        default_factory=DriftSection,
        description="The drift score: what the model reports now against the version's first hours.",
    )
    samples: SamplesSection = Field(  # samples for retraining (issue 40 item 3)
        default_factory=SamplesSection,
        description="Frames kept for retraining with the model's detections as labels (opt-in: enabled true).",
    )
    health: CameraHealthSection = Field(
        default_factory=CameraHealthSection,
        description="The camera's health check: frozen, dark, overexposed, low contrast, defocused, covered, moved "
        "(docs/cameras.md#camera-health).",
    )
    conf: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Detections on this camera must score above this (0..1) to be kept; unset: the bundle's "
        "(bundle build --conf, default 0.25).",
    )
    iou: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="NMS overlap threshold on this camera (0..1): a box overlapping a better one of its class "
        "more than this is dropped; unset: the bundle's (bundle build --iou, default: the exporter's, else 0.45).",
    )
    max_det: int | None = Field(
        default=None,
        ge=1,
        description="Most detections kept per frame on this camera; unset: the bundle's (bundle build --max-det, "
        "default 300).",
    )
    classes: list[str] = Field(
        default_factory=list,
        description="Label names of the bundle's classes this camera keeps (empty: all); the others are dropped "
        "before tracking, counting lines and zones, and events. A name the serving version lacks is reported "
        "with its line by config check and when the version is activated.",
    )

    @field_validator("classes", mode="before")
    @classmethod
    def _class_names(cls, value: object) -> object:
        if isinstance(value, list):
            ids = [item for item in value if isinstance(item, int | float) and not isinstance(item, bool)]
            if ids:
                raise ValueError(
                    f"classes are label names (e.g. person, car), not class ids ({ids[0]!r}): an id means another "
                    "class in another model, a name keeps its meaning across versions"
                )
        return value

    @field_validator("classes")
    @classmethod
    def _unique_classes(cls, value: list[str]) -> list[str]:
        blank = [name for name in value if not name.strip()]
        if blank:
            raise ValueError("a class name may not be empty")
        twice = sorted({name for name in value if value.count(name) > 1})
        if twice:
            raise ValueError(f"class {twice[0]!r} is listed twice")
        return value

    def unknown_classes(self, labels: Sequence[str]) -> list[tuple[int, str]]:
        """The entries of `classes` that are none of `labels` (a version's), as (index, name)."""
        known = set(labels)
        return [(i, name) for i, name in enumerate(self.classes) if name not in known]

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 8:
            raise ValueError(f"workers must be 1..8 or auto, got {value}")
        return value

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        try:
            source_kind(value)
        except SourceError as exc:
            raise ValueError(str(exc)) from exc
        return value


class ShadowSection(_Section):
    """Per-device defaults of the shadow (docs/quality.md); a signed desired document's
    ``shadow`` overrides each key it gives."""

    duration_s: float = Field(
        default=0.0,
        ge=0,
        le=86400,
        description="Run every new version beside the serving one on live frames for at least this long before it "
        "switches (0: only when the desired document asks for a shadow); an operator's way to require it fleet-wide.",
    )
    max_s: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="Longest a quiet shadow (too few detections to compare) is extended; default 4 x its duration.",
    )
    min_agreement: float = Field(
        default=0.8,
        ge=0,
        le=1,
        description="The candidate's agreement with the serving version (F1 of its detections matched at IoU 0.5, "
        "same class; per camera, per frequent class, and the task's measure) below which it disagrees.",
    )
    mode: Literal["gate", "report"] = Field(
        default="gate",
        description="gate: a candidate that disagrees ends REJECTED (SHADOW_DISAGREES); report: recorded, then it "
        "switches anyway.",
    )
    quiet: Literal["pass", "fail"] = Field(
        default="pass", description="How a shadow that saw too few detections to compare, up to max_s, ends."
    )
    min_detections: int = Field(
        default=30, ge=1, le=100000, description="Detections (of either version) a camera needs to be judged."
    )
    sample_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="The share of time the candidate may spend inferring (it rests between frames), so the serving "
        "cameras keep their FPS.",
    )


class QualitySection(_Section):
    """Probation's quality check (docs/quality.md)."""

    min_ratio: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="On probation, a camera's confident detections per frame (and each frequent class's) must stay "
        "at or above this fraction of what the previous version saw just before the swap; else PROBATION_BLIND "
        "(0: off). A signed desired document's quality.min_ratio overrides it.",
    )
    min_before: int = Field(
        default=30,
        ge=1,
        le=100000,
        description="Confident detections the previous version must have seen on a camera (in its last 10 minutes) "
        "for that camera to be judged, and detections of either version on the frames the agreement check compared: "
        "a quiet scene never fails a version.",
    )
    min_agreement: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="On probation, run the previous version beside the new one (at deployments.shadow.sample_share "
        "of the time) and hold the new one to this agreement with it on the same frames, as a shadow does; else "
        "PROBATION_BLIND. Catches boxes in the wrong place, which rates do not see (0: off; it keeps a second model "
        "loaded through probation). A signed desired document's quality.min_agreement overrides it.",
    )


class DeploymentSection(_Section):
    max_download_rate: int = Field(
        default=0, ge=0, description="Bundle download limit in bytes per second (0: none), for metered links."
    )
    window: int = Field(default=16, ge=1, le=1024, description="Chunks requested at a time.")
    stall_timeout_s: float = Field(default=60.0, gt=0, description="Re-request chunks after this long without one.")
    http_timeout_s: float = Field(default=30.0, gt=0, description="Timeout of one HTTP request (url sources).")
    autotune: bool = Field(
        default=True,
        description="At activation, measure each way to run the version here (runtime, provider or delegate, "
        "artifact, threads, workers) and serve the fastest within the bundle's parity tolerance.",
    )
    autotune_frames: int = Field(default=30, ge=5, le=1000, description="Frames timed per configuration by autotune.")
    max_latency_ms: float | None = Field(
        default=None,
        gt=0,
        description="Autotune serves only configurations whose p95 latency per frame is within this.",
    )
    report: bool = Field(
        default=False,
        description="After each activation, run the optimisation matrix (edge-agent bench --matrix) and publish "
        "it retained on <device>/report.",
    )
    report_frames: int = Field(default=100, ge=5, le=10000, description="Frames timed per row of that report.")
    download_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="Longest a deployment may wait for its index and chunks, across restarts; then it ends "
        "FAILED with DOWNLOAD_TIMEOUT.",
    )
    probation_s: float = Field(
        default=120.0,
        ge=0,
        description="Seconds a newly activated version is watched before it counts as SUCCEEDED (0: no "
        "probation); it is rolled back if its cameras keep failing, its FPS stays low, or the agent stops.",
    )
    probation_min_fps_ratio: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="On probation, the new version must reach this fraction of the FPS the previous version "
        "had on the same cameras.",
    )
    shadow: ShadowSection = Field(default_factory=ShadowSection)
    quality: QualitySection = Field(default_factory=QualitySection)


class TelemetrySection(_Section):
    interval_s: float = Field(default=10.0, ge=0.2, description="Seconds between telemetry messages.")


class MediaSection(_Section):
    """Where object events' snapshots are kept (``<state_dir>/media``), and for how long."""

    max_mb: float = Field(default=256.0, gt=0, description="Most MiB of snapshots kept; the oldest go first.")
    max_age_h: float = Field(default=168.0, gt=0, description="Snapshots older than this many hours are deleted.")
    min_free_mb: float = Field(
        default=256.0,
        ge=0,
        le=1_048_576,
        description="Least MiB left free on the state directory's disk: under it the oldest snapshots and clips "
        "are deleted, and a new one is not kept when nothing is left to delete (the outbox and deployments need "
        "the room); 0: no floor.",
    )


class EventsSection(_Section):
    enabled: bool = Field(default=True, description="Publish object events (start, update, end of each track).")
    min_interval_s: float = Field(
        default=5.0, ge=0, description="Least time between two 'update' events of one tracked object."
    )
    min_confidence: float = Field(default=0.5, ge=0, le=1, description="Detections below this make no event.")
    labels: list[str] = Field(default_factory=list, description="Labels that make events (empty: all).")
    snapshots: bool = Field(
        default=False,
        description="Keep a JPEG crop of the object's best frame for its 'end' event (under <state_dir>/media, "
        "named by the event's reference; fetched with the media command).",
    )
    media: MediaSection = Field(default_factory=MediaSection, description="Retention of the snapshots kept.")


class OutboxSection(_Section):
    """The durable outbox (docs/mqtt.md#delivery): events, deployment reports and telemetry kept
    on disk (``<state_dir>/outbox.sqlite``) until the broker acknowledges them."""

    max_mb: float = Field(
        default=64.0,
        ge=1,
        description="Largest size of the outbox file (MiB); when full, telemetry summaries are thinned first, "
        "then the oldest object events, then the oldest deployment reports go (counted as dropped).",
    )
    max_age_h: float = Field(default=72.0, gt=0, description="Messages older than this many hours are dropped.")
    synchronous: Literal["normal", "full"] = Field(
        default="normal",
        description="SQLite's synchronous setting in WAL mode: normal survives kill -9 and keeps the file "
        "consistent through a power cut (the last commits may be lost); full also keeps those, at a cost in "
        "writes per second (docs/benchmarks.md).",
    )
    send_rate: float = Field(
        default=50.0, gt=0, description="Most messages per second the outbox sends (a backlog goes out at this rate)."
    )
    in_flight: int = Field(
        default=10,
        ge=1,
        le=15,
        description="Most outbox messages awaiting the broker's acknowledgement at once (the link takes 20: the "
        "rest stays for commands and state documents).",
    )
    backlog_problem_s: float = Field(
        default=900.0,
        gt=0,
        description="A backlog whose oldest message is older than this many seconds is a problem on the page "
        "and in doctor.",
    )


class UpsSection(_Section):
    """An INA219 UPS HAT on I2C (Waveshare UPS HAT (B): address 0x42, 0.1 ohm, a 2S pack)."""

    bus: int = Field(default=1, ge=0, description="I2C bus number (/dev/i2c-N).")
    address: int = Field(default=0x42, ge=0x03, le=0x77, description="The INA219's I2C address (0x42 = 66).")
    shunt_ohms: float = Field(default=0.1, gt=0, description="The shunt resistor in ohms.")
    empty_v: float = Field(default=6.0, gt=0, description="Pack voltage at 0 % (2S: 6.0, 1S: 3.0).")
    full_v: float = Field(default=8.4, gt=0, description="Pack voltage at 100 % (2S: 8.4, 1S: 4.2).")

    @model_validator(mode="after")
    def _range(self) -> UpsSection:
        if self.full_v <= self.empty_v:
            raise ValueError(f"full_v ({self.full_v}) must be above empty_v ({self.empty_v})")
        return self


class SensorsSection(_Section):
    """Optional sensor sources beyond the files under /sys (docs/telemetry.md)."""

    vcgencmd: bool = Field(default=True, description="Ask the Raspberry Pi firmware (vcgencmd on PATH).")
    jtop: bool = Field(
        default=True, description="Use jtop on a Jetson when jetson-stats is installed and its service runs."
    )
    nvml: bool = Field(default=True, description="Read a discrete NVIDIA GPU through NVML (nvidia-ml-py).")
    ups: UpsSection | None = Field(default=None, description="An INA219 UPS HAT on I2C (smbus2).")


class ThermalGovernorSection(_Section):
    """Temperature thresholds in degrees C; a threshold left out comes from the board's trip points."""

    warm_c: float | None = Field(default=None, gt=0, lt=150, description="WARM at or above (default: hot_c - 10).")
    hot_c: float | None = Field(
        default=None, gt=0, lt=150, description="HOT at or above (default: the lowest passive trip point - 5, else 75)."
    )
    critical_c: float | None = Field(
        default=None, gt=0, lt=150, description="CRITICAL at or above (default: the lowest critical trip - 5, else 85)."
    )
    hysteresis_c: float = Field(default=3.0, ge=0, le=20, description="A level is left only this far below it.")
    min_dwell_s: float = Field(default=30.0, ge=0, description="Least time in a level before stepping down.")

    @model_validator(mode="after")
    def _ordered(self) -> ThermalGovernorSection:
        given = [(k, v) for k in ("warm_c", "hot_c", "critical_c") if (v := getattr(self, k)) is not None]
        for (low_key, low), (high_key, high) in itertools.pairwise(given):
            if low >= high:
                raise ValueError(f"{low_key} ({low}) must be below {high_key} ({high})")
        return self


class BatteryGovernorSection(_Section):
    """Battery thresholds in percent of charge."""

    low_pct: float = Field(default=20.0, gt=0, le=100, description="LOW at or below this charge.")
    critical_pct: float = Field(default=5.0, ge=0, lt=100, description="CRITICAL at or below: inference stops.")
    hysteresis_pct: float = Field(default=3.0, ge=0, le=50, description="A level is left only this far above it.")
    min_dwell_s: float = Field(default=60.0, ge=0, description="Least time in a level before stepping back up.")

    @model_validator(mode="after")
    def _ordered(self) -> BatteryGovernorSection:
        if self.critical_pct >= self.low_pct:
            raise ValueError(f"critical_pct ({self.critical_pct}) must be below low_pct ({self.low_pct})")
        return self


#: the most a governor level may stretch a motion gate's idle interval and keepalive period
MAX_GATE_SLOWDOWN = 10.0


class LevelActions(_Section):
    """What the governor does at one level."""

    fps_cap: float | None = Field(
        default=None, gt=0, description="Most frames per second inferred per camera without a motion gate."
    )
    gate_slowdown: float = Field(
        default=1.0,
        ge=1.0,
        le=MAX_GATE_SLOWDOWN,
        description="Cameras with a motion gate: multiply its idle_interval_s and divide its keepalive_fps by "
        "this (1: as configured); the first thing the governor does (docs/telemetry.md, The governor).",
    )
    gated_fps_cap: float | None = Field(
        default=None,
        gt=0,
        description="Most frames per second taken per camera with a motion gate; unset: no cap, only "
        "CRITICAL's pause limits them (docs/telemetry.md, The governor).",
    )
    fan_percent: float | None = Field(default=None, ge=0, le=100, description="Fan duty in percent (with a fan).")
    lighter_artifact: bool = Field(default=False, description="Serve the bundle's lightest artifact (e.g. INT8).")
    pause: bool = Field(default=False, description="Pause inference (capture goes on).")
    stop: bool = Field(default=False, description="Stop inference cleanly, with a final status.")


class GovernorActionsSection(_Section):
    normal: LevelActions = Field(default_factory=lambda: LevelActions(fan_percent=0), description="At NORMAL.")
    warm: LevelActions = Field(
        default_factory=lambda: LevelActions(fan_percent=50, gate_slowdown=2), description="At WARM."
    )
    hot: LevelActions = Field(
        default_factory=lambda: LevelActions(fan_percent=100, fps_cap=5, gate_slowdown=4, lighter_artifact=True),
        description="At HOT.",
    )
    critical: LevelActions = Field(
        default_factory=lambda: LevelActions(fan_percent=100, pause=True), description="At CRITICAL."
    )
    battery_low: LevelActions = Field(
        default_factory=lambda: LevelActions(fps_cap=2, gate_slowdown=4, lighter_artifact=True),
        description="At battery LOW.",
    )
    battery_critical: LevelActions = Field(
        default_factory=lambda: LevelActions(stop=True), description="At battery CRITICAL."
    )


class FanSection(_Section):
    """The fan the governor drives: none, a GPIO pin (gpiozero) or the Jetson's sysfs fan."""

    kind: Literal["none", "gpio", "jetson"] = Field(
        default="none", description="none: leave the fan alone; gpio: a pin; jetson: pwm-fan (stop nvfancontrol)."
    )
    pin: int | str | None = Field(default=None, description="GPIO pin for kind gpio (BCM number, or a name: GPIO14).")
    pwm: bool = Field(default=True, description="Drive the pin with PWM (else on/off: on above 0 %).")
    frequency_hz: float = Field(default=100.0, gt=0, description="PWM frequency of a gpio fan.")

    @model_validator(mode="after")
    def _pin(self) -> FanSection:
        if self.kind == "gpio" and self.pin is None:
            raise ValueError("a gpio fan needs its pin (fan.pin: 14)")
        return self


class GovernorSection(_Section):
    """The thermal and battery governor (docs/telemetry.md)."""

    enabled: bool = Field(default=True, description="Step the governor every telemetry interval.")
    thermal: ThermalGovernorSection = Field(default_factory=ThermalGovernorSection, description="Temperature levels.")
    battery: BatteryGovernorSection = Field(default_factory=BatteryGovernorSection, description="Battery levels.")
    actions: GovernorActionsSection = Field(default_factory=GovernorActionsSection, description="Actions per level.")
    fan: FanSection = Field(default_factory=FanSection, description="The fan it drives.")


class FfmpegSection(_Section):
    """How ``ffmpeg:`` sources run (docs/cameras.md)."""

    hwaccel: Literal["auto", "none"] | list[str] = Field(
        default="auto",
        description="Hardware H.264 decode for ffmpeg: sources (streams and files): auto: the board's decoder "
        "when this ffmpeg lists it (Jetson h264_nvv4l2dec or h264_nvmpi, Raspberry Pi 4 h264_v4l2m2m; "
        "others decode in software); none: software; or the ffmpeg options to put before -i, "
        "e.g. [-c:v, hevc_v4l2m2m].",
    )
    rtsp_transport: Literal["tcp", "udp"] = Field(default="tcp", description="RTSP transport of rtsp:// inputs.")


class ServingSection(_Section):
    """How the cameras are served: one model shared by all of them, batching, the pipe sources."""

    share_model: bool = Field(
        default=True,
        description="Cameras share one loaded model (one runtime in memory); false: each camera loads its own.",
    )
    batch: bool = Field(
        default=True,
        description="Infer frames waiting from several cameras as one batch, on models with a dynamic batch axis.",
    )
    batch_wait_ms: float = Field(
        default=10.0, ge=0, le=1000, description="Longest the first frame of a batch waits for the other cameras."
    )
    max_batch: int = Field(default=8, ge=1, le=64, description="Most frames in one batch (one per camera).")
    stall_timeout_s: float = Field(
        default=15.0, gt=0, description="A pipe source silent this long is restarted (its process killed)."
    )
    ffmpeg: FfmpegSection = Field(default_factory=FfmpegSection, description="ffmpeg: sources.")


def split_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[IPv6]:PORT`` for an IPv6 address) as ``(host, port)``; raises
    `ValueError` saying what is wrong."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:8080, 0.0.0.0:8080 or [::]:8080)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{value!r}: write an IPv6 address in brackets, e.g. [::1]:8080")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1), False for any other."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


class StatusTlsSection(_Section):
    cert_file: Path = Field(description="Certificate (chain) in PEM the page serves HTTPS with.")
    key_file: Path = Field(description="Its private key in PEM.")


class StatusPageSection(_Section):
    """The technician's status page with ``/api``, ``/metrics`` and ``/healthz``
    (docs/status-page.md), served by the daemon itself."""

    listen: str = Field(
        default="127.0.0.1:8080",
        description="HOST:PORT to serve on. Only a loopback address (127.0.0.1, ::1, localhost) without "
        "credentials; any address (0.0.0.0: every interface) once username and a password are set.",
    )
    username: str | None = Field(
        default=None, min_length=1, max_length=64, description="User name for HTTP Basic authentication."
    )
    password_file: Path | None = Field(default=None, description="File whose first line is the password.")
    password_env: str | None = Field(default=None, description="Environment variable holding the password.")
    tls: StatusTlsSection | None = Field(default=None, description="Serve HTTPS with this certificate and key.")
    history_s: float = Field(default=600.0, ge=60, le=86400, description="Seconds of history the charts show.")
    sample_s: float = Field(default=2.0, ge=0.5, le=60, description="Seconds between two points of the charts.")
    max_connections: int = Field(
        default=64,
        ge=4,
        le=1024,
        description="Connections the page holds at once: one more closes the longest-idle one (or itself when "
        "every one has a request in flight), so idle clients cannot take the daemon's file descriptors.",
    )
    idle_timeout_s: int = Field(
        default=10,
        ge=1,
        le=300,
        description="Seconds a connection may stay silent (before its first request, between two) before it is closed.",
    )
    hosts: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Further names the page is reached by (a DNS name, a reverse proxy's name). Requests must "
        "name the device in their Host header: an IP address, localhost, the host name (also .local) or one of "
        "these; others are refused (421 WRONG_HOST), so a rebound DNS name cannot reach the page.",
    )

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?\.?", name):
                raise ValueError(f"hosts: {name!r} is not a host name (letters, digits, '-' and '.')")
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        split_listen(value)
        return value

    @model_validator(mode="after")
    def _credentials(self) -> StatusPageSection:
        if self.password_file is not None and self.password_env is not None:
            raise ValueError("give password_file or password_env, not both")
        has_password = self.password_file is not None or self.password_env is not None
        if (self.username is None) != (not has_password):
            raise ValueError("username and a password (password_file or password_env) go together")
        if not has_password and not is_loopback(self.host):
            raise ValueError(
                f"listen {self.listen!r} is not a loopback address: set username and password_file (or "
                "password_env) to serve the page beyond this device, or listen on 127.0.0.1"
            )
        return self

    @property
    def host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen)[1]

    @property
    def has_credentials(self) -> bool:
        return self.username is not None

    def password(self) -> str | None:
        """Read the password (I/O: the daemon calls it, never a validator); None without
        credentials. Raises `ConfigError` naming the file or variable that is missing."""
        if self.password_file is not None:
            return Secret(file=self.password_file).resolve()
        if self.password_env is not None:
            return Secret(env=self.password_env).resolve()
        return None


class HealthSection(_Section):
    stall_s: float = Field(
        default=60.0,
        gt=0,
        description="A camera, MQTT, sampler or commands loop that has not turned for this many seconds is hung: "
        "/healthz answers 503 and the systemd watchdog is no longer pinged (the service restarts).",
    )


#: where a claim on the boot partition is looked for, in this order (docs/fleet.md#enrolment)
BOOT_CLAIMS = (Path("/boot/firmware/edge-agent-claim.json"), Path("/boot/edge-agent-claim.json"))


class EnrolmentSection(_Section):
    """Enrolment on start (docs/fleet.md#enrolment): used only while agent.yaml has no ``mqtt:``."""

    claim: Path | None = Field(
        default=None,
        description="The claim file (fleet enrol claim) `edge-agent run` enrols with while agent.yaml has no "
        "mqtt: section; absent: the first of boot_claims that exists.",
    )
    boot_claims: list[Path] = Field(
        default_factory=lambda: list(BOOT_CLAIMS),
        max_length=8,
        description="Where a claim on the boot partition is looked for, in this order, when claim is absent.",
    )


class HomeAssistantSection(_Section):
    """Home Assistant MQTT discovery (docs/integrations.md): one HA device with its entities."""

    enabled: bool = Field(default=False, description="Publish Home Assistant discovery configs (needs mqtt).")
    discovery_prefix: str = Field(
        default="homeassistant",
        min_length=1,
        pattern=r"^[^#+\s]+$",
        description="Home Assistant's discovery prefix (its MQTT integration's setting; no wildcards).",
    )
    image_interval_s: float = Field(
        default=10.0,
        ge=1.0,
        description="Least seconds between two annotated frames published for each camera's image entity.",
    )
    reannounce_s: float = Field(
        default=30.0,
        ge=1.0,
        le=3600.0,
        description="Least seconds between two announcements answering Home Assistant's births (anyone can send one).",
    )


class IntegrationsSection(_Section):
    home_assistant: HomeAssistantSection = Field(
        default_factory=HomeAssistantSection, description="Home Assistant MQTT discovery."
    )


class AgentConfig(_Section):
    """Everything the agent reads from agent.yaml; every section has working defaults."""

    device: DeviceSection = Field(default_factory=DeviceSection, description="Who this device is.")
    state_dir: Path = Field(default=DEFAULT_STATE_DIR, description="Where versions and the deployment record live.")
    trust_keys: list[Path] = Field(
        default_factory=list, description="Ed25519 public keys (PEM) whose bundles are accepted."
    )
    allow_unsigned: bool = Field(default=False, description="Accept bundles without a valid signature (testing only).")
    operator_keys: list[Path] = Field(
        default_factory=list,
        description="Ed25519 public keys (PEM) of the operators: desired documents and commands must be signed "
        "by one of them.",
    )
    allow_unsigned_control: bool = Field(
        default=False,
        description="Act on unsigned desired documents and commands (anyone who can publish to the broker can "
        "then steer this device: testing only).",
    )
    max_clock_skew_s: float = Field(
        default=300.0,
        gt=0,
        description="A signed command must be issued within this many seconds of this device's clock, and no "
        "control document may come from further in the future.",
    )
    runtime: Preference = Field(default="auto", description="Runtime preference: auto, or one runtime by name.")
    runtimes: RuntimeSettings = Field(
        default_factory=RuntimeSettings,
        description=f"Settings of each runtime backend ({', '.join(RUNTIME_NAMES)}).",
    )
    runtime_probe_cache: Path | None = Field(
        default=None,
        description="The file where the agent keeps what the runtime probe found, taken back at the next start "
        "while nothing it depends on changed (the Python, the runtimes' libraries, the device files); "
        "default <state_dir>/runtime-probe.json.",
    )
    keep_versions: int = Field(default=3, ge=2, description="Installed versions kept, current and previous included.")
    bundle_limits: BundleLimitsConfig = Field(default_factory=BundleLimitsConfig, description="Unpack limits.")
    mqtt: MqttSection | None = Field(default=None, description="The fleet broker; without it the agent runs alone.")
    enrolment: EnrolmentSection = Field(
        default_factory=EnrolmentSection, description="Enrolment by claim on start, while there is no mqtt: section."
    )
    deployments: DeploymentSection = Field(default_factory=DeploymentSection, description="Bundle downloads.")
    cameras: list[CameraSection] = Field(default_factory=list, description="Cameras to run the active model on.")
    telemetry: TelemetrySection = Field(default_factory=TelemetrySection, description="Telemetry topic.")
    events: EventsSection = Field(default_factory=EventsSection, description="Detection events topic.")
    outbox: OutboxSection = Field(
        default_factory=OutboxSection, description="Events and reports kept on disk until the broker has them."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log verbosity.")
    sensors: SensorsSection = Field(default_factory=SensorsSection, description="Optional sensor sources.")
    governor: GovernorSection = Field(default_factory=GovernorSection, description="Thermal and battery governor.")
    serving: ServingSection = Field(
        default_factory=ServingSection, description="One shared model, batching, pipe sources (docs/cameras.md)."
    )
    deprecations: SkipJsonSchema[tuple[str, ...]] = Field(
        default=(),
        exclude=True,
        description="What this config says in a form kept for one release, and its new form: not a setting, "
        "filled in by the loading (the agent logs it, config check prints it).",
    )
    status_page: StatusPageSection | None = Field(
        default=None, description="The technician's status page, /api, /metrics and /healthz; absent: not served."
    )
    health: HealthSection = Field(default_factory=HealthSection, description="When a loop counts as hung.")
    integrations: IntegrationsSection = Field(
        default_factory=IntegrationsSection, description="Home Assistant discovery (docs/integrations.md)."
    )

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: object) -> object:
        """The keys renamed by issue 36 (one word for a camera), accepted for one release with a
        deprecation: a ``pipelines:`` list is ``cameras:``, a ``cameras:`` mapping is ``serving:``
        (told apart by shape); the notes go to `deprecations`."""
        if not isinstance(data, dict):
            return data
        if "deprecations" in data:
            raise ValueError("deprecations: not a setting (the agent fills it in)")
        data, notes = dict(data), []
        if isinstance(data.get("cameras"), dict):
            if "serving" in data:
                raise ValueError(
                    "both cameras: as a mapping (its old form) and serving: are given: move the mapping's "
                    "settings into serving: and list the cameras under cameras:"
                )
            data["serving"] = data.pop("cameras")
            notes.append(SERVING_MOVED)
        if "pipelines" in data:
            if data.get("cameras") is not None:
                raise ValueError(
                    "both pipelines: (its old name) and cameras: list cameras: keep one list, under cameras:"
                )
            data["cameras"] = data.pop("pipelines")
            notes.append(PIPELINES_RENAMED)
        if notes:
            data["deprecations"] = tuple(notes)
        return data

    @field_validator("cameras")
    @classmethod
    def _unique_names(cls, value: list[CameraSection]) -> list[CameraSection]:
        names = [p.name for p in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"camera names must be unique: {', '.join(duplicates)} repeated")
        return value

    @field_validator("cameras")
    @classmethod
    def _unique_line_and_zone_names(cls, value: list[CameraSection]) -> list[CameraSection]:
        """Telemetry's ``analytics`` is keyed by line and zone name, over every camera."""
        for kind in ("lines", "zones"):
            names = [(item.name, p.name) for p in value for item in getattr(p, kind)]
            seen: dict[str, str] = {}
            for name, camera in names:
                if name in seen:
                    raise ValueError(
                        f"{kind} names must be unique over all cameras: {name!r} is in {seen[name]} and {camera}"
                    )
                seen[name] = camera
        return value

    def runtime_settings(self) -> RuntimeSettings:
        """`runtimes` with what it leaves to the state directory filled in (each backend's
        `with_state_dir`): TensorRT's engine cache defaults to ``<state_dir>/engines``."""
        return self.runtimes.with_state_dir(self.state_dir)

    def probe_cache_path(self) -> Path:
        """`runtime_probe_cache`, by default ``<state_dir>/runtime-probe.json``."""
        return self.runtime_probe_cache or self.state_dir / "runtime-probe.json"

    def device_id(self) -> str:
        """The configured id, else this machine's hostname (made topic-safe)."""
        return self.device.id or re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())
