"""`agent.deployment.optimisation_report` in this process (test_optimisation_report.py has the daemon
publish it over a broker): the report document of an installed version on an injected clock, with
autotune's choice once saved, and a report thread that finds its version gone publishes nothing."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
from testkit.bundles import install_versions

from agent.bundles.record import Deployment, Tuning
from agent.bundles.store import Store
from agent.deployment.optimisation_report import Reports, report_document
from agent.hardware.board import probe
from runtimes.registry import RuntimeSettings


@pytest.mark.install
def test_the_report_of_an_installed_version(tmp_path: Path, keys, bundles) -> None:
    board = probe()
    install_versions(tmp_path / "state", keys, bundles, board)
    store = Store(tmp_path / "state")
    sha = store.current_sha()
    assert sha is not None
    document = report_document(
        store=store,
        sha=sha,
        device="cam-1",
        board=board,
        settings=RuntimeSettings(),
        frames=3,
        clock=lambda: 1234.56789,
    )
    assert (document["device"], document["ts"], document["frames"]) == ("cam-1", 1234.568, 3)
    assert document["bundle"] == {"name": "demo", "version": "1.1.0", "sha256": sha}
    assert document["board"] == {
        "kind": board.kind,
        "model": board.model,
        "arch": board.arch,
        "cpu_count": board.cpu_count,
    }
    assert document["choice"] is None, "no autotune ran"
    rows = {row["runtime"]: row for row in document["rows"]}
    assert all((row["fps"] is None) == (row["error"] is not None) for row in document["rows"]), "measured or why not"
    assert rows["litert"]["fps"] > 0 and rows["litert"]["precision"] == "int8", "the version's INT8 TFLite artifact"
    json.dumps(document)  # the topic's JSON

    choice = Tuning("litert", "cpu", "demo_int8.tflite", "int8", 2, 1, 30.0, 40.0, "fastest within agreement")
    store.save_tuning(sha, choice)
    again = report_document(
        store=store, sha=sha, device="cam-1", board=board, settings=RuntimeSettings(), frames=3, clock=lambda: 0.0
    )
    assert again["choice"] == dataclasses.asdict(choice)


def test_a_report_thread_whose_version_is_gone_logs_and_publishes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    published: list[bytes] = []
    reports = Reports(
        store=Store(tmp_path / "state").ensure(),
        device="cam-1",
        board=probe(),
        settings=RuntimeSettings(),
        frames=3,
        publish=published.append,
    )
    with caplog.at_level(logging.ERROR, "agent.deployment.optimisation_report"):
        reports.on_succeeded(Deployment(id="d-1", sha256="f" * 64))
        reports.stop()
    assert published == []
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 1 and logged[0].startswith(f"optimisation report of {'f' * 12}: ")
