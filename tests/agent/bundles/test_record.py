"""`agent.bundles.record`: the deployment record as typed values (`ErrorInfo`, `TuningRecord`),
written to ``deployment.json`` and read back; records written before they were typed still load.
The record is frozen and moves only along `TRANSITIONS`."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from testkit import REPO

from agent.bundles.record import (
    FINAL_STATES,
    TRANSITIONS,
    Deployment,
    IllegalTransition,
    ReportRow,
    State,
    Tuning,
    TuningRecord,
)
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
    assert isinstance(record.history, tuple), "the file's lists load as the frozen record's tuple"
    assert record.to(State.ROLLED_BACK).history[:-1] == record.history, "and it moves on from there"
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
    record = record.to(State.VERIFYING)
    record = record.to(State.REJECTED, BundleError(ErrorCode.PARITY_FAILED, "0.91 of the outputs within tolerance"))
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


Q, DL, V, I, A, SH, P, S, RJ, F, RB = State  # noqa: E741 (the states in their order, for the table below)

#: every step the code takes, written out apart from the table (where each is taken): the table
#: must allow each and no other
STEPS = [
    (Q, Q),  # the deployer queues a new record, or one resumed after a restart
    (Q, DL),  # the first chunk (BundleDownload.run)
    (Q, V),  # `edge-agent install` of a file
    (Q, S),  # the version desired is already current
    (Q, RJ),  # too large, superseded, cancelled or halted before a chunk (deployer, undo_halted)
    (Q, F),  # no index before deployments.download_timeout_s
    (Q, RB),  # a rollback's own record (installer.rollback)
    (DL, DL),  # a download resumed after a restart
    (DL, V),  # the bundle arrived: install
    (DL, RJ),  # a bad chunk, a newer document, a rollback, a halt (deployer, undo_halted)
    (DL, F),  # DOWNLOAD_TIMEOUT
    (V, I),
    (V, RJ),  # a bad bundle, or a crash while verifying (Store.recover)
    (I, A),
    (I, RJ),  # a full disk, or a crash while installing
    (A, P),
    (A, S),  # no probation; or recovery finds it switched
    (A, F),  # it would not run here, or a crash while activating
    (A, SH),  # a shadow was asked for: the candidate runs beside the serving version
    (SH, P),  # the shadow passed: switched, on probation
    (SH, S),  # the shadow passed, no probation
    (SH, RJ),  # SHADOW_DISAGREES, a rollback, a halt, a newer document, or a crash in the shadow
    (P, S),  # end_probation passed
    (P, F),  # end_probation failed, or a crash on probation
    (S, RB),  # a rollout halted with on_halt: rollback (undo_halted)
    (F, RB),  # the pointers put back, in the same record
]


def test_the_table_allows_exactly_the_steps_the_code_takes() -> None:
    assert set(TRANSITIONS) == set(State), "a row for every state"
    table = {(here, there) for here, theres in TRANSITIONS.items() for there in theres}
    assert table == set(STEPS)
    assert all(TRANSITIONS[state] <= {RB} for state in FINAL_STATES), "an ended deployment is at most rolled back"


@pytest.mark.parametrize(("here", "there"), STEPS)
def test_an_allowed_step_gives_a_new_record_and_leaves_the_old_one(here: State, there: State) -> None:
    before = Deployment(id="d1", sha256="b" * 64, state=here, history=((here, 1000.0),))
    error = BundleError(ErrorCode.DOWNLOAD_TIMEOUT, "no index") if there in (RJ, F) else None
    after = before.to(there, error)
    assert after.state is there and after.history[:-1] == ((here, 1000.0),) and after.history[-1][0] is there
    assert (after.error is not None) == (error is not None) and after.id == "d1"
    assert before.state is here and before.history == ((here, 1000.0),), "the value it came from is unchanged"


@pytest.mark.parametrize(
    ("here", "there"),
    [
        *[(S, DL), (RB, P), (RJ, V), (RB, RB), (F, S), (P, RB), (Q, A), (V, A), (A, RB), (DL, Q), (S, S), (I, V)],
        *[(SH, F), (SH, RB), (I, SH)],
    ],
)
def test_an_illegal_step_raises_naming_both_states(here: State, there: State) -> None:
    before = Deployment(id="d1", sha256="b" * 64, state=here)
    with pytest.raises(IllegalTransition, match=f"d1 cannot go from {here} to {there}") as raised:
        before.to(there)
    assert isinstance(raised.value, ValueError)
    assert before.state is here and before.history == ()


def test_a_record_cannot_be_changed_in_place() -> None:
    record = Deployment(id="d1", sha256="b" * 64).to(State.VERIFYING)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.state = State.SUCCEEDED  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.error = ErrorInfo(ErrorCode.PARITY_FAILED, "no")  # type: ignore[misc]
    assert isinstance(record.history, tuple) and not hasattr(record.history, "append")
