"""Argument types shared by the `edge-agent` subcommands (argparse `type=` callables)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


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
