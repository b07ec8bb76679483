"""The optimisation report the daemon publishes on ``<device>/report`` (retained) after an
activation when ``deployments.report`` is true: the same matrix as ``edge-agent bench BUNDLE
--matrix``, measured on the device for the version now current, with autotune's choice.

`report_document` runs in the daemon's ``report`` thread (minutes with TensorRT engines to build;
each row in its own process, while the cameras keep serving, which the rows' numbers share the
CPU with). It is the JSON edge of that topic (docs/mqtt.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agent.bundles.archive import verify_unpacked
from agent.bundles.engines import version_settings
from agent.bundles.store import Store
from agent.bundles.tuning import candidates, reference_of, run_matrix, with_engines
from agent.hardware.probe import Board
from pipelines.matrix import EnergyMeter, no_energy_meter
from runtimes.registry import RuntimeSettings


def report_document(
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
    found = with_engines(candidates(folder, manifest, board, settings, variants=True), folder, manifest)
    rows = run_matrix(found, reference_of(folder, manifest, verified.reference), frames, energy)
    return {
        "device": device,
        "ts": round(clock(), 3),
        "bundle": {"name": manifest.name, "version": manifest.version, "sha256": sha},
        "board": {"kind": board.kind, "model": board.model, "arch": board.arch, "cpu_count": board.cpu_count},
        "frames": frames,
        "choice": store.tuning(sha),
        "rows": [row.to_json() for row in rows],
    }
