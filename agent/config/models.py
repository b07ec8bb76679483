"""The models of ``agent.yaml`` (docs/configuration.md): one pydantic model per section.

Unknown keys are forbidden, so a typo fails with its location instead of being ignored.
Validators check values only; files named here (keys, certificates, password files) are read by
the code that uses them, and `agent.config.loading.check_files` reports the missing ones for
``edge-agent config check``. ``python -m agent.config`` prints the JSON Schema (kept as
docs/agent-config.schema.json).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from agent.errors import ConfigError
from agent.paths import DEFAULT_STATE_DIR
from pipelines.sources import SourceError, source_kind
from runtimes.registry import RuntimeSettings
from runtimes.selection import Preference

_TOPIC_WORD = re.compile(r"^[A-Za-z0-9_.-]+$")  # no MQTT wildcards, separators or spaces


def _topic_word(value: str) -> str:
    if not _TOPIC_WORD.match(value):
        raise ValueError(f"{value!r} may only hold letters, digits, '_', '-' and '.'")
    return value


TopicWord = Annotated[str, AfterValidator(_topic_word)]  # one level of an MQTT topic


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BundleLimitsConfig(_Section):
    max_files: int = Field(default=256, ge=1, description="Most files one bundle may hold.")
    max_bytes: int = Field(default=1 << 30, ge=1, description="Most bytes one bundle may unpack to.")
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
        default=1000, ge=0, description="Messages kept per topic (telemetry, events) while offline; oldest dropped."
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


class PipelineSection(_Section):
    name: TopicWord = Field(default="cam0", description="Pipeline (camera) name, used in telemetry and events.")
    source: str = Field(
        description="synthetic[:SEED], a video file, /dev/videoN or an index, rtsp://..., or a GStreamer pipeline."
    )
    loop: bool = Field(default=True, description="Play a video file in a loop.")
    width: int | None = Field(default=None, ge=1, description="Camera capture width.")
    height: int | None = Field(default=None, ge=1, description="Camera capture height.")
    fps: float | None = Field(default=None, gt=0, description="Camera frame rate (synthetic: 15 by default).")
    max_fps: float | None = Field(default=None, gt=0, description="Most frames per second inferred.")
    workers: int = Field(
        default=1,
        ge=1,
        le=8,
        description="Frames in flight at once on this camera's model: more throughput, each frame slower "
        "(ONNX Runtime; on a runtime that serves one call at a time the camera uses 1).",
    )

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        try:
            source_kind(value)
        except SourceError as exc:
            raise ValueError(str(exc)) from exc
        return value


class DeploymentSection(_Section):
    max_download_rate: int = Field(
        default=0, ge=0, description="Bundle download limit in bytes per second (0: none), for metered links."
    )
    window: int = Field(default=16, ge=1, le=1024, description="Chunks requested at a time.")
    stall_timeout_s: float = Field(default=60.0, gt=0, description="Re-request chunks after this long without one.")
    http_timeout_s: float = Field(default=30.0, gt=0, description="Timeout of one HTTP request (url sources).")
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


class TelemetrySection(_Section):
    interval_s: float = Field(default=10.0, ge=0.2, description="Seconds between telemetry messages.")


class EventsSection(_Section):
    enabled: bool = Field(default=True, description="Publish detection events.")
    min_interval_s: float = Field(default=5.0, ge=0, description="Least time between events of one label per camera.")
    min_confidence: float = Field(default=0.5, ge=0, le=1, description="Detections below this make no event.")
    labels: list[str] = Field(default_factory=list, description="Labels that make events (empty: all).")


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
        default_factory=RuntimeSettings, description="Settings of each runtime backend (onnxruntime, litert, tensorrt)."
    )
    keep_versions: int = Field(default=3, ge=2, description="Installed versions kept, current and previous included.")
    bundle_limits: BundleLimitsConfig = Field(default_factory=BundleLimitsConfig, description="Unpack limits.")
    mqtt: MqttSection | None = Field(default=None, description="The fleet broker; without it the agent runs alone.")
    deployments: DeploymentSection = Field(default_factory=DeploymentSection, description="Bundle downloads.")
    pipelines: list[PipelineSection] = Field(default_factory=list, description="Cameras to run the active model on.")
    telemetry: TelemetrySection = Field(default_factory=TelemetrySection, description="Telemetry topic.")
    events: EventsSection = Field(default_factory=EventsSection, description="Detection events topic.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log verbosity.")

    @field_validator("pipelines")
    @classmethod
    def _unique_names(cls, value: list[PipelineSection]) -> list[PipelineSection]:
        names = [p.name for p in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"pipeline names must be unique: {', '.join(duplicates)} repeated")
        return value

    def device_id(self) -> str:
        """The configured id, else this machine's hostname (made topic-safe)."""
        return self.device.id or re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())
