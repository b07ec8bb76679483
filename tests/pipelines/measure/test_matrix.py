"""`pipelines.measure.matrix`: rows measured in their own process, `choose`, a row that dies or hangs."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS, FAKES, hailo_double, standin_env

from agent.bundles.archive import Limits, build_bundle, unpack, verify_unpacked
from agent.bundles.tuning import candidates, reference_of
from agent.hardware.board import probe
from pipelines.measure.matrix import Row, choose, measure, measure_isolated
from runtimes import isolation
from runtimes.hailo_backend import write_record
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


@pytest.mark.parametrize("nms", [False, True], ids=["raw", "nms-on-chip"])
def test_a_hef_row_is_read_with_the_decoder_activation_uses(
    nms: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a Pi 5 with the AI HAT+ (the rpi5-hailo8l tree, HailoRT's double), the matrix reads a
    HEF as activation does: raw outputs with the manifest's decoder, compared value by value; NMS
    on the chip with ``end2end``, compared by its detections with the ONNX model's. Both rows
    qualify, as activation serves both."""
    # fails on: the matrix's Detector built with the manifest's decoder for an NMS-on-chip HEF
    # (a DecoderError row), or its final detections compared value by value with raw outputs
    monkeypatch.setattr(isolation, "PROCESS_RUNNER", isolation.ChildRunner(env=standin_env("hailo")))
    model = DEMO_MODELS / "demo_detector.onnx"
    (tmp_path / "hef").mkdir()
    hef = hailo_double.write_hef(tmp_path / "hef" / "demo.hef", model, hw_arch="hailo8l", nms=nms, nms_iou=0.45)
    write_record(hef, model)
    build_bundle([model], tmp_path / "hat.bundle", name="demo", modules=[hef])
    unpack(tmp_path / "hat.bundle", tmp_path / "unpacked", Limits())
    bundle = verify_unpacked(tmp_path / "unpacked", (), allow_unsigned=True)
    board = probe(FAKES / "rpi5-hailo8l", arch="aarch64")
    with hailo_double.installed("hailo8l"):
        reference = reference_of(bundle.folder, bundle.manifest, bundle.reference)
        (candidate,) = [c for c in candidates(bundle.folder, bundle.manifest, board, RuntimeSettings())
                        if c.artifact == "demo.hef"]  # fmt: skip
        assert (candidate.runtime, candidate.unavailable) == ("hailo", None)
        row = measure(candidate, reference, 3)
    assert row.error is None and row.parity is not None, row
    assert reference.decoder == "yolov8", "the manifest's decoder reads raw outputs"
    if nms:  # final detections: no raw values to compare, their agreement with the ONNX model's
        assert row.parity["max_abs_err"] is None and row.parity["detection_agreement"] == 1.0, row.parity
    assert row.parity["within_tolerance"] is not None and row.parity["within_tolerance"] >= 0.99, row.parity
    best, why = choose([row], bundle.manifest.reference.min_fraction)
    assert best is row, why
