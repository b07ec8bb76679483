"""`pipelines.measure.matrix`: rows measured in their own process, `choose`, a row that dies or hangs."""

from __future__ import annotations

import functools
import os
import time

import numpy as np
import pytest

from agent.bundles.tuning import candidates, reference_of
from agent.hardware.board import probe
from pipelines.measure.matrix import Row, choose, measure_isolated
from runtimes.registry import RuntimeSettings


def _row(fps: float | None, p95: float = 10.0, within: float = 1.0, error: str | None = None, w: int = 1) -> Row:
    return Row("onnxruntime", "CPU", f"m{fps}.onnx", "fp32", w, None, {"p50": p95 / 2, "p95": p95}, fps,
               parity={"within_tolerance": within}, error=error)  # fmt: skip


def test_choose_the_fastest_within_tolerance_and_latency() -> None:
    rows = [_row(50), _row(90, p95=40), _row(120, within=0.5), _row(None, error="not installed"), _row(70, w=2)]
    best, why = choose(rows, 0.99)
    assert best is rows[1] and "fastest of 3 qualifying" in why
    best, why = choose(rows, 0.99, max_latency_ms=20)
    assert best is rows[4] and "p95 <= 20" in why
    best, why = choose(rows[2:4], 0.99)
    assert best is None
    assert "parity 0.5 below 0.99" in why and "not installed" in why


@pytest.mark.slow
def test_an_isolated_row_that_dies_or_hangs_says_so(unpacked) -> None:
    folder, manifest = unpacked.folder, unpacked.manifest
    reference = reference_of(folder, manifest, unpacked.reference)
    candidate = next(c for c in candidates(folder, manifest, probe(), RuntimeSettings()) if c.runtime == "onnxruntime")
    died = measure_isolated(candidate, reference, 5, energy=functools.partial(os._exit, 3))
    assert died.error == "the measuring process died (exit code 3)"
    hung = measure_isolated(candidate, reference, 5, energy=functools.partial(time.sleep, 60), timeout_s=1.0)
    assert hung.error == "timed out after 1 s"


@pytest.mark.slow
def test_an_isolated_row_reports_its_own_peak_memory(unpacked) -> None:
    """ru_maxrss survives exec on Linux: a spawned process would report its parent's memory."""
    folder, manifest = unpacked.folder, unpacked.manifest
    reference = reference_of(folder, manifest, unpacked.reference)
    candidate = next(c for c in candidates(folder, manifest, probe(), RuntimeSettings()) if c.runtime == "litert")
    ballast = np.ones(600 << 20, np.uint8)  # 600 MB resident here while the row's process starts
    row = measure_isolated(candidate, reference, 5)
    assert ballast[-1] == 1 and row.rss_mb is not None and row.rss_mb < 400, row.rss_mb
