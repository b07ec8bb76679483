"""Start-up: a command line imports what its command needs, and ``--help`` and ``--version`` need
only argparse (issue 36 item 9; the times are bench/cli_startup.py's, docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from testkit import DEMO_MODELS, REPO

#: what ``--help`` and ``--version`` must not import: each costs tens of milliseconds or more
HEAVY = ("numpy", "pydantic", "cv2", "onnxruntime", "runtimes.registry", "agent.config.models")


def imported_by(argv: list[str], cwd: Path = REPO) -> tuple[int, list[str]]:
    """`agent.cli.main` run on `argv` in a fresh process (in `cwd`): its exit status and every
    module it left imported, sorted."""
    code = (
        "import json, sys\nfrom agent.cli.main import main\n"
        f"try:\n    status = main({argv!r})\nexcept SystemExit as exc:\n    status = exc.code\n"
        "print(json.dumps([status, sorted(sys.modules)]))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    status, modules = json.loads(run.stdout.splitlines()[-1])
    return status, modules


def heavy_in(modules: list[str]) -> list[str]:
    return [m for m in modules if m in HEAVY]


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--version"], ["-v", "--help"], ["nosuch"], []])
def test_help_and_version_import_no_heavy_library(argv: list[str]) -> None:
    status, modules = imported_by(argv)
    heavy = heavy_in(modules)
    assert status in (0, 2)
    assert heavy == [], f"edge-agent {' '.join(argv)} imported {heavy}"


def test_a_light_command_imports_no_heavy_library(tmp_path: Path) -> None:
    """``keygen`` (signing keys) needs neither numpy nor the runtimes: the errors `main` turns
    into one line are imported only when one is raised."""
    status, modules = imported_by(["keygen", "--out", str(tmp_path)])
    assert status == 0 and (tmp_path / "signing.pub").is_file()
    assert heavy_in(modules) == []


def test_detect_and_bench_import_no_operator_code(tmp_path: Path) -> None:
    """A detection and a default bench (``--workers auto``) run without the config models, MQTT,
    the fleet or the bundles' code (signing, archives, the optimisation matrix: 9 MB resident
    in bench's peak, imported for one helper)."""
    model, image = str(DEMO_MODELS / "demo_detector.onnx"), tmp_path / "frame.png"
    cv2.imwrite(str(image), np.zeros((64, 96, 3), np.uint8))
    operator = ("agent.config.models", "agent.mqtt", "agent.fleet", "agent.bundles", "cryptography", "paho")
    for argv in (["detect", model, str(image), "--json"],
                 ["bench", model, "--frames", "4", "--json"]):  # fmt: skip
        status, modules = imported_by(argv, tmp_path)
        imported = [m for m in modules if m.startswith(operator)]
        assert status == 0 and imported == [], f"{argv[0]} imported {imported}"


#: the code of the backends ``detect --runtime onnxruntime`` does not run: TensorRT's (its
#: engines, CUDA memory), OpenVINO's, LiteRT's, and the check processes' (a one-shot command
#: loads in its own process)
OTHER_BACKENDS = (
    "runtimes.tensorrt_backend",
    "runtimes.tensorrt_build",
    "runtimes.tensorrt_engines",
    "runtimes.cuda_memory",
    "runtimes.engine_cache",
    "runtimes.openvino_backend",
    "runtimes.litert_backend",
    "runtimes.isolation",
)


def test_detect_on_onnx_runtime_imports_no_other_backends_code(tmp_path: Path) -> None:
    """The registry names each backend's code lazily: a detection on ONNX Runtime imports ONNX
    Runtime's backend and none of the others' modules (30 ms of `detect`'s first detection)."""
    model, image = str(DEMO_MODELS / "demo_detector.onnx"), tmp_path / "frame.png"
    cv2.imwrite(str(image), np.zeros((64, 96, 3), np.uint8))
    argv = ["detect", model, str(image), "--runtime", "onnxruntime", "--json"]
    watched = ("runtimes.ort_backend", *OTHER_BACKENDS)
    status, modules = imported_by(argv, tmp_path)
    imported = [m for m in modules if m in watched]
    assert status == 0 and imported == ["runtimes.ort_backend"], f"detect imported {imported}"


def test_detect_on_onnx_runtime_builds_no_other_settings_model(tmp_path: Path) -> None:
    """The backends' settings models are built when first used, not at import: a detection on
    ONNX Runtime builds ONNX Runtime's alone, not the other backends', TensorRT's profile or the
    ``runtimes:`` section's (about 1 ms each of `detect`'s first detection, docs/benchmarks.md)."""
    model, image = str(DEMO_MODELS / "demo_detector.onnx"), tmp_path / "frame.png"
    cv2.imwrite(str(image), np.zeros((64, 96, 3), np.uint8))
    argv = ["detect", model, str(image), "--runtime", "onnxruntime", "--json"]
    code = (
        "import json, sys\nfrom pydantic import BaseModel\nfrom agent.cli.main import main\n"
        f"status = main({argv!r})\n"
        "from runtimes.registry import _in_tree_sections\n"
        "models = {m for name, module in list(sys.modules.items()) if name.startswith('runtimes.')\n"
        "          for m in vars(module).values() if isinstance(m, type) and issubclass(m, BaseModel)}\n"
        "built = sorted(m.__name__ for m in models if m.__pydantic_complete__)\n"
        "print(json.dumps([status, built, _in_tree_sections.cache_info().currsize]))"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    status, built, sections = json.loads(run.stdout.splitlines()[-1])
    assert status == 0 and built == ["OnnxRuntimeConfig"], f"detect built {built}"
    assert sections == 0, "the runtimes: section's model is built for agent.yaml only"


def test_the_daemon_imports_no_scipy_until_a_tracker_matches() -> None:
    """An agent's start imports the daemon's modules, and scipy.optimize (the tracker's Hungarian
    matching, with what it pulls in: scipy.linalg, scipy.special, numpy.ma, unittest) was a third
    of them: 0.5 of 1.45 CPU-seconds, at every start of every agent a test runs. It is imported
    when a tracker first matches tracks to boxes, which a camera without detections never does."""
    code = (
        "import json, sys\nimport agent.cli.run, agent.daemon.agent\n"
        "from pipelines.tracking.tracker import ByteTracker\n"
        "ByteTracker()\n"
        "before = sorted(m for m in sys.modules if m.split('.')[0] == 'scipy')\n"
        "import numpy as np\nfrom pipelines.decoding.detections import Detections\n"
        "tracker = ByteTracker()\n"
        "box = Detections(np.array([[10, 10, 50, 50]], np.float32), np.array([0.9], np.float32),\n"
        "                 np.array([0], np.int32))\n"
        "steps = [tracker.update(box) for _ in range(3)]\n"
        "print(json.dumps([before, 'scipy.optimize' in sys.modules, tracker.active_ids]))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    before, after, ids = json.loads(run.stdout.splitlines()[-1])
    assert before == [], f"the daemon's modules imported {before}"
    assert after and ids == [1], "a tracker matching a box over three frames imports it and keeps one track"
