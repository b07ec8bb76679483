"""What edge-agent's tests and benchmarks share (tests/support/pyproject.toml installs it editable
with `scripts/setup.sh dev`): the repository's paths here; brokers, agents, models, bundles, the
page and the TensorRT double in the modules. Pytest fixtures live in tests/conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

#: the checkout (testkit is installed editable, so this file lies in it)
REPO = Path(__file__).resolve().parents[3]
#: the real COCO models beside the checkout (their licences keep them out of it)
SHARED_MODELS = Path(os.environ.get("EDGE_AGENT_SHARED_MODELS", REPO.parent / "shared" / "models"))
#: fake sysfs trees per board
FAKES = REPO / "tests" / "fakes"
#: the demo detector's artifacts
DEMO_MODELS = REPO / "agent" / "demo"
#: stand-in runtime packages that crash on import or load
STANDINS = REPO / "tests" / "standins"


def standin_env(folder: str) -> dict[str, str]:
    """This environment with the stand-in `folder` (under `STANDINS`) first on ``PYTHONPATH``."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(STANDINS / folder), str(REPO)])}
