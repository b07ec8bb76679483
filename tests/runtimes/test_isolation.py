"""`runtimes.isolation`: libraries probed and models first loaded in a child process (stand-ins that crash or hang)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import pytest
from testkit import DEMO_MODELS, standin_env

from runtimes.base import ModelLoadError
from runtimes.isolation import ChildResult, ChildRunner, IsolationUnavailable, RuntimeCrashed, exit_description
from runtimes.registry import load_runtime

ORT_VERSION = metadata.version("onnxruntime")


class CountingRunner(ChildRunner):
    """A real `ChildRunner` that also records the arguments of every child it starts."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.started: list[list[str]] = []

    def run(self, args: Sequence[str], timeout_s: float) -> ChildResult:
        self.started.append(list(args))
        return super().run(args, timeout_s)


@pytest.mark.parametrize(
    ("returncode", "expected"),
    [(-11, "SIGSEGV"), (-4, "SIGILL"), (-6, "SIGABRT"), (1, "exit status 1"), (None, "timeout"), (-200, "signal 200")],
)
def test_how_a_child_ended_reads_as_its_signal(returncode: int | None, expected: str) -> None:
    assert exit_description(returncode) == expected


def test_a_library_that_crashes_on_import_is_unavailable_and_the_others_are_probed() -> None:
    runner = CountingRunner(env=standin_env("crash_on_import"))
    infos = runner.probe(["litert", "onnxruntime", "tensorrt"])
    ort = infos["onnxruntime"]
    assert not ort.available and ort.crashed == "SIGSEGV" and ort.version == ORT_VERSION
    assert f"onnxruntime {ORT_VERSION} crashed on import (SIGSEGV)" in (ort.reason or "")
    assert infos["litert"].available and infos["litert"].crashed is None
    assert not infos["tensorrt"].available and infos["tensorrt"].crashed is None, "probed after the crash"
    assert runner.started == [["probe", "litert", "onnxruntime", "tensorrt"], ["probe", "tensorrt"]]

    assert runner.probe(["onnxruntime", "litert"]) == {"onnxruntime": ort, "litert": infos["litert"]}
    assert len(runner.started) == 2, "probed once per process"


def test_a_healthy_probe_takes_one_child_and_imports_nothing_here() -> None:
    runner = CountingRunner()
    infos = runner.probe(["onnxruntime", "litert"])
    assert infos["onnxruntime"].available and "CPUExecutionProvider" in infos["onnxruntime"].devices
    assert infos["onnxruntime"].version == ORT_VERSION and infos["litert"].available
    assert runner.started == [["probe", "onnxruntime", "litert"]]
    assert runner.probe(["litert"]) == {"litert": infos["litert"]} and len(runner.started) == 1


def test_a_model_whose_load_crashes_raises_runtime_crashed_once_checked(tmp_path: Path) -> None:
    runner = CountingRunner(env=standin_env("crash_on_load"))
    model = tmp_path / "model.onnx"
    model.write_bytes((DEMO_MODELS / "demo_detector.onnx").read_bytes())
    with pytest.raises(RuntimeCrashed, match=r"crashed \(SIGILL\) while loading model\.onnx") as crash:
        runner.check_load("onnxruntime", model, "{}")
    assert (crash.value.runtime, crash.value.how) == ("onnxruntime", "SIGILL")
    assert crash.value.library == f"onnxruntime {ORT_VERSION}"
    with pytest.raises(RuntimeCrashed):
        runner.check_load("onnxruntime", model, "{}")
    assert len(runner.started) == 1, "each file version is checked once"
    os.utime(model, ns=(0, 0))  # touched, the same bytes: not checked again
    copy = tmp_path / "other-device" / "model.onnx"  # a simulated device's copy in its own store
    copy.parent.mkdir()
    copy.write_bytes(model.read_bytes())
    with pytest.raises(RuntimeCrashed, match=r"while loading model\.onnx"):
        runner.check_load("onnxruntime", copy, "{}")
    assert len(runner.started) == 1, "the same content is checked once"
    model.write_bytes(model.read_bytes() + b"\0")  # another version of the file: checked again
    with pytest.raises(RuntimeCrashed):
        runner.check_load("onnxruntime", model, "{}")
    with pytest.raises(RuntimeCrashed):
        runner.check_load("onnxruntime", copy, '{"intra_op_threads": 1}')  # other settings: checked again
    assert len(runner.started) == 3


def test_a_model_that_loads_or_is_refused_passes_the_check(tmp_path: Path) -> None:
    runner = ChildRunner()
    runner.check_load("litert", DEMO_MODELS / "demo_detector_int8.tflite", "{}")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    runner.check_load("onnxruntime", junk, "{}")  # the backend's own error is the caller's to raise
    with pytest.raises(ModelLoadError, match="ONNX Runtime cannot load"):
        load_runtime("onnxruntime", junk)
    runner.check_load("onnxruntime", tmp_path / "missing.onnx", "{}")  # the load reports the missing file


def test_a_child_that_cannot_start_is_reported_as_such(tmp_path: Path) -> None:
    with pytest.raises(IsolationUnavailable, match="cannot start"):
        ChildRunner(python=[str(tmp_path / "no-python")]).probe(["litert"])
    with pytest.raises(IsolationUnavailable, match=r"ended \(exit status 1\) before it started"):
        ChildRunner(python=["false"]).probe(["litert"])


@pytest.mark.slow
def test_a_library_that_hangs_on_import_is_given_up_on(tmp_path: Path) -> None:
    """A probe process that never answers is killed after its timeout (15 s here, generous so a
    slow start is not mistaken for the hang)."""
    hang = tmp_path / "onnxruntime"
    hang.mkdir()
    (hang / "__init__.py").write_text('"""A stand-in for onnxruntime that never finishes importing."""\n' + HANG)
    runner = ChildRunner(env={**os.environ, "PYTHONPATH": str(tmp_path)}, probe_timeout_s=15)
    infos = runner.probe(["onnxruntime", "litert"])
    ort = infos["onnxruntime"]
    assert ort.crashed == "timeout" and "did not finish within 15 s" in (ort.reason or "")
    assert infos["litert"].available


HANG = "import time\ntime.sleep(3600)\n"
