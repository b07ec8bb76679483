"""What the `edge-agent` commands share: argument types (argparse `type=` callables), the runtime
choices, the trust and state-directory options, and the device config those options make."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.paths import DEFAULT_STATE_DIR
from runtimes.selection import RuntimeChoices

if TYPE_CHECKING:
    from agent.config.models import AgentConfig

#: ``--runtime``: auto, or a backend of the registry (in-tree or a plugin)
#: (plugins loaded only when a name not in-tree is checked, so ``--help`` imports none)
RUNTIME_CHOICES = RuntimeChoices()


def unit_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number within 0..1, got {text!r}") from exc
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number within 0..1, got {text}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def number_within(low: float, high: float, unit: str) -> Callable[[str], float]:
    """An argparse type: a number within `low`..`high` (`unit` names it in the error)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected {low:g}..{high:g} {unit}, got {text!r}")
        return value

    return parse


def line_points(text: str) -> tuple[float, float, float, float]:
    """``X1,Y1,X2,Y2``: a counting line in source-frame pixels (``edge-agent detect --line``)."""
    parts = text.split(",")
    try:
        values = tuple(float(p) for p in parts)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected X1,Y1,X2,Y2 (four numbers, pixels), got {text!r}") from exc
    if len(values) != 4:
        raise argparse.ArgumentTypeError(f"expected X1,Y1,X2,Y2 (four numbers, pixels), got {len(values)} in {text!r}")
    if values[:2] == values[2:]:
        raise argparse.ArgumentTypeError(f"a line's two points must differ, got {text!r}")
    return values[0], values[1], values[2], values[3]


def trust_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust-key", type=Path, action="append", default=[], help="trusted signing.pub (repeatable)")
    parser.add_argument("--allow-unsigned", action="store_true", help="accept bundles without a valid signature")
    parser.add_argument("--config", type=Path, help="device config (YAML): state_dir, trust_keys, limits, ...")


def state_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir", type=Path, help=f"state directory (default: the config's, else {DEFAULT_STATE_DIR})"
    )
    if not any(a.dest == "config" for a in parser._actions):
        parser.add_argument("--config", type=Path, help="device config (YAML)")


def device_config(args: argparse.Namespace) -> AgentConfig:
    from agent.config.loading import load_config
    from agent.config.models import AgentConfig

    config = load_config(args.config) if getattr(args, "config", None) else AgentConfig()
    updates: dict[str, Any] = {}
    if getattr(args, "state_dir", None):
        updates["state_dir"] = args.state_dir
    if getattr(args, "trust_key", None):
        updates["trust_keys"] = [*config.trust_keys, *args.trust_key]
    if getattr(args, "allow_unsigned", False):
        updates["allow_unsigned"] = True
    return config.model_copy(update=updates)
