"""Device configuration (the part bundles and installs use; the daemon's sections come later).

YAML (or JSON) loaded into pydantic models with unknown keys forbidden, so a typo fails with
its location instead of being ignored. Validators check values only; files are read by the
code that uses them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.errors import ConfigError

DEFAULT_STATE_DIR = Path("/var/lib/edge-agent")


class BundleLimitsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_files: int = Field(default=256, ge=1, description="Most files one bundle may hold.")
    max_bytes: int = Field(default=1 << 30, ge=1, description="Most bytes one bundle may unpack to.")


class DeviceConfig(BaseModel):
    """Settings for bundle installs on this device."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: Path = Field(default=DEFAULT_STATE_DIR, description="Where versions and the deployment record live.")
    trust_keys: list[Path] = Field(
        default_factory=list, description="Ed25519 public keys (PEM) whose bundles are accepted."
    )
    allow_unsigned: bool = Field(default=False, description="Accept bundles without a valid signature (testing only).")
    runtime: Literal["auto", "tensorrt", "onnxruntime", "litert"] = Field(
        default="auto", description="Runtime preference."
    )
    keep_versions: int = Field(default=3, ge=2, description="Installed versions kept, current and previous included.")
    bundle_limits: BundleLimitsConfig = Field(default_factory=BundleLimitsConfig, description="Unpack limits.")


def load_config(path: Path) -> DeviceConfig:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from exc
    try:
        return DeviceConfig.model_validate(raw or {})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"config {path}: {problems}") from exc
