"""`agent.bundles.record`: the deployment record as typed values (`ErrorInfo`, `TuningRecord`),
written to ``deployment.json`` and read back; records written before they were typed still load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from testkit import REPO

from agent.bundles.record import Deployment, ReportRow, State, Tuning, TuningRecord
from agent.bundles.store import Store
from agent.errors import BundleError, ErrorCode, ErrorInfo

#: written by edge-agent before issue 23 (error and tuning as plain dicts): an autotuned install
#: of the demo bundle, a rejected one, and the store's tuning file of the first
OLD_RECORDS = REPO / "tests" / "data" / "records"
SHA = "0b7b041ffd37e29f756dfc33da35e7d5fd5924794eaa9cdbec4b59809351debf"


def _state_with(tmp_path: Path, record: str) -> Store:
    store = Store(tmp_path / "state").ensure()
    shutil.copy(OLD_RECORDS / record, store.root / "deployment.json")
    return store


def test_a_record_written_before_the_types_loads_with_its_tuning(tmp_path: Path) -> None:
    store = _state_with(tmp_path, "deployment-tuned.json")
    (store.root / "tuning").mkdir()
    shutil.copy(OLD_RECORDS / "tuning.json", store.root / "tuning" / f"{SHA}.json")
    record = store.last_deployment()
    assert record is not None and not store.problems
    assert (record.state, record.name, record.version, record.error) == (State.SUCCEEDED, "demo", "1.0.0", None)
    assert [state for state, _ in record.history] == ["VERIFYING", "INSTALLING", "ACTIVATING", "SUCCEEDED"]
    assert record.history[0] == (State.VERIFYING, 1796163725.881)
    assert record.tuning is not None and record.tuning.choice is not None
    choice = record.tuning.choice
    assert (choice.runtime, choice.provider, choice.artifact, choice.threads, choice.fps) == (
        "litert", "xnnpack", "demo_detector_int8.tflite", None, 87.54,
    )  # fmt: skip
    assert store.tuning(SHA) == choice, "the store's tuning file is the record's choice"
    rows = record.tuning.rows
    assert len(rows) == 6 and all(isinstance(row, ReportRow) for row in rows)
    assert rows[0].error is not None and "tensorrt" in rows[0].error and rows[0].latency_ms is None
    measured = [row for row in rows if row.error is None]
    assert measured and all(row.latency_ms and row.latency_ms["p95"] > 0 and row.parity for row in measured)


def test_a_rejected_record_written_before_the_types_loads_with_its_error(tmp_path: Path) -> None:
    record = _state_with(tmp_path, "deployment-rejected.json").last_deployment()
    assert record is not None and record.state == State.REJECTED and record.tuning is None
    message = "this device trusts no signing key and unsigned bundles are not allowed"
    assert record.error == ErrorInfo(ErrorCode.NO_TRUSTED_KEYS, message)
    assert str(record.error) == f"NO_TRUSTED_KEYS: {message}"


def test_a_record_reads_back_as_it_was_written(tmp_path: Path) -> None:
    store = Store(tmp_path / "state").ensure()
    choice = Tuning("onnxruntime", "CPUExecutionProvider", "m.onnx", "fp32", 2, 1, 31.5, 40.25, "fastest")
    row = ReportRow("onnxruntime", "CPUExecutionProvider", "m.onnx", "fp32", 1, 2, {"p50": 30.0, "p95": 40.25}, 31.5)
    failed = ReportRow("litert", "xnnpack", "m.tflite", "int8", 1, None, error="cannot load")
    record = Deployment(id="d1", sha256="b" * 64, name="m", version="1.2.0", tuning=TuningRecord(choice, (row, failed)))
    record.to(State.VERIFYING)
    record.to(State.REJECTED, BundleError(ErrorCode.PARITY_FAILED, "0.91 of the outputs within tolerance"))
    store.record(record)
    assert store.last_deployment() == record
    assert record.error == ErrorInfo(ErrorCode.PARITY_FAILED, "0.91 of the outputs within tolerance")


@pytest.mark.parametrize(
    ("junk", "named"),
    [
        (b'{"id": "d", "sha256": "x", "error": "boom"}', "error"),
        (b'{"id": "d", "sha256": "x", "error": {"code": "NOT_A_CODE", "message": "m"}}', "error.code"),
        (b'{"id": "d", "sha256": "x", "state": "HALF_DONE"}', "state"),
        (b'{"id": "d", "sha256": "x", "history": [["QUEUED", "soon"]]}', "history.0.1"),
        (b'{"id": "d", "sha256": "x", "tuning": {"choice": "fast"}}', "tuning.choice"),
        (b'{"sha256": "x"}', "id"),
        (b'{"id": "d", "sha', "(top)"),
    ],
)
def test_a_record_that_is_not_one_is_reported_naming_the_field(tmp_path: Path, junk: bytes, named: str) -> None:
    store = Store(tmp_path / "state").ensure()
    (store.root / "deployment.json").write_bytes(junk)
    assert store.last_deployment() is None
    store.recover()
    assert len(store.problems) == 1 and "is not a deployment record" in store.problems[0]
    assert f"{named}: " in store.problems[0], store.problems[0]


def test_a_tuning_file_that_is_not_one_is_no_tuning(tmp_path: Path) -> None:
    store = Store(tmp_path / "state").ensure()
    (store.root / "tuning").mkdir()
    (store.root / "tuning" / f"{SHA}.json").write_text('{"runtime": "abacus", "provider": "fingers"}')
    assert store.tuning(SHA) is None
    choice = Tuning("litert", "xnnpack", "m.tflite", "int8", None, 1, 80.0, 12.5, "fastest")
    store.save_tuning(SHA, choice)
    assert store.tuning(SHA) == choice
