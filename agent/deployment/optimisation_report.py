"""The optimisation report the daemon publishes on ``<device>/report`` (retained) after an
activation when ``deployments.report`` is true: the same matrix as ``edge-agent bench BUNDLE
--matrix``, measured on the device for the version now current, with autotune's choice.

`Reports.on_succeeded` starts the daemon's ``report`` thread for a version that passed its
probation (the deployer's ``on_succeeded``); `report_document` runs there (minutes with
TensorRT engines to build; each row in its own process, while the cameras keep serving, which
the rows' numbers share the CPU with). It is the JSON edge of that topic (docs/mqtt.md).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from agent.bundles.archive import verify_unpacked
from agent.bundles.engine_settings import version_settings
from agent.bundles.record import Deployment
from agent.bundles.store import Store
from agent.bundles.tuning import candidates, reference_of, run_matrix, with_prepared
from agent.errors import BundleError
from agent.hardware.board import Board
from agent.mqtt.protocol import json_payload
from pipelines.measure.matrix import EnergyMeter, no_energy_meter
from pipelines.worker import Worker
from runtimes.registry import RuntimeSettings

log = logging.getLogger(__name__)


def report_document(
    *,
    store: Store,
    sha: str,
    device: str,
    board: Board,
    settings: RuntimeSettings,
    frames: int,
    energy: Callable[[], EnergyMeter | None] = no_energy_meter,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Measure installed version `sha` every way this device can run it; the report document.
    Raises `BundleError` when the version is no longer installed intact."""
    verified = verify_unpacked(store.versions / sha, (), allow_unsigned=True)  # hashes only: installed already
    manifest, folder = verified.manifest, verified.folder
    settings = version_settings(settings, manifest)
    found = with_prepared(candidates(folder, manifest, board, settings, variants=True), folder, manifest)
    rows = run_matrix(found, reference_of(folder, manifest, verified.reference), frames, energy)
    return {
        "device": device,
        "ts": round(clock(), 3),
        "bundle": {"name": manifest.name, "version": manifest.version, "sha256": sha},
        "board": {"kind": board.kind, "model": board.model, "arch": board.arch, "cpu_count": board.cpu_count},
        "frames": frames,
        "choice": asdict(choice) if (choice := store.tuning(sha)) else None,
        "rows": [row.to_json() for row in rows],
    }


class Reports:
    """The ``report`` threads: one per version that succeeded, measuring its report with
    `settings` over `frames` frames and handing the document's JSON to `publish` (the daemon:
    retained on ``<device>/report``); nothing is published once `stop` was called."""

    def __init__(
        self,
        *,
        store: Store,
        device: str,
        board: Board,
        settings: RuntimeSettings,
        frames: int,
        publish: Callable[[bytes], None],
    ) -> None:
        self.store, self.device, self.board, self.settings, self.frames = store, device, board, settings, frames
        self._publish = publish
        self._stopped = threading.Event()
        self._threads: list[Worker] = []

    def on_succeeded(self, deployment: Deployment) -> None:
        """A new version passed its probation (or had none): its report is measured now (not on
        probation, where it would take the cameras' CPU), in a ``report`` thread."""
        report = functools.partial(self._report, deployment.sha256)
        self._threads.append(Worker.once("report", report, described="the optimisation report", logger=log).start())

    def stop(self, timeout: float = 10.0) -> None:
        self._stopped.set()
        for thread in self._threads:
            thread.stop(timeout, finish=True)
        self._threads.clear()

    def _report(self, sha: str) -> None:
        try:
            document = report_document(
                store=self.store,
                sha=sha,
                device=self.device,
                board=self.board,
                settings=self.settings,
                frames=self.frames,
            )
        except (BundleError, OSError) as exc:
            log.error("optimisation report of %s: %s", sha[:12], exc)
            return
        if not self._stopped.is_set():
            self._publish(json_payload(document))
            log.info("published the optimisation report of %s (%d rows)", sha[:12], len(document["rows"]))
