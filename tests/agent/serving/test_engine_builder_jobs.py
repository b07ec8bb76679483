"""`agent.serving.engine_builder.EngineBuilder` on its own (test_engine_builder.py runs it inside
the cameras), against the TensorRT test double: the status through a build on an injected clock,
one build per version, a newer version or a stop cancelling the build in progress, an engine
from the cache, a failure with its code."""

from __future__ import annotations

import itertools
import shutil
import threading
from pathlib import Path

import pytest
from testkit.trt_double import TrtDouble

from agent.bundles.archive import Verified
from agent.errors import ErrorCode
from agent.serving.engine_builder import EngineBuilder
from agent.snapshot import EngineStatus
from runtimes.registry import RuntimeSettings
from runtimes.tensorrt_backend import TensorRTConfig


class Done:
    """`on_done`'s calls, and an event per version folder."""

    def __init__(self) -> None:
        self.calls: list[tuple[Path, EngineStatus]] = []
        self.events: dict[Path, threading.Event] = {}

    def __call__(self, version: Path, status: EngineStatus) -> None:
        self.calls.append((version, status))
        self.events.setdefault(version, threading.Event()).set()

    def wait(self, version: Path) -> EngineStatus:
        assert self.events.setdefault(version, threading.Event()).wait(60), f"no build of {version.name} ended"
        return next(status for folder, status in self.calls if folder == version)


def _onnx(verified: Verified) -> Path:
    return next(verified.folder / a.path for a in verified.manifest.artifacts if a.format == "onnx")


def _builds_end() -> None:
    for thread in threading.enumerate():
        if thread.name == "engine-build":
            thread.join(60)


@pytest.fixture
def builder() -> tuple[EngineBuilder, Done]:
    done, ticks = Done(), itertools.count(100)
    return EngineBuilder(done, clock=lambda: float(next(ticks))), done


def test_a_build_reports_its_progress_and_ends_ready(
    trt_double: TrtDouble, tmp_path: Path, unpacked: Verified, builder
) -> None:
    engines, done = builder
    trt_double.internals.build_gate = gate = threading.Event()
    settings = RuntimeSettings(tensorrt=TensorRTConfig(engine_cache_dir=tmp_path / "engines", precision="fp16"))
    assert engines.status() is None
    engines.request(unpacked.folder, unpacked.manifest, _onnx(unpacked), "a" * 64, settings)
    building = engines.status()
    assert building is not None and (building.state, building.progress, building.started) == ("building", 0.0, 100.0)
    assert (building.bundle, building.artifact, building.precision) == ("demo 1.0.0", _onnx(unpacked).name, "fp16")
    assert engines.building(unpacked.folder) and not engines.building(tmp_path / "other")
    engines.request(unpacked.folder, unpacked.manifest, _onnx(unpacked), "a" * 64, settings)
    assert engines.status() is building, "the same build is not started again"
    engines.note("ONNX Runtime serves meanwhile")
    gate.set()

    status = done.wait(unpacked.folder)
    assert (status.state, status.progress, status.started, status.finished) == ("ready", 1.0, 100.0, 101.0)
    assert status.note == "ONNX Runtime serves meanwhile" and status.message is not None
    assert status.message.startswith("engine built: ") and status.error_code is None
    assert engines.status() == status and not engines.building(unpacked.folder)
    assert len(trt_double.internals.builds) == 1
    engines.fail(ErrorCode.PARITY_FAILED, "outputs differ from the reference")
    failed = engines.status()
    assert failed is not None and (failed.state, failed.error_code) == ("failed", "PARITY_FAILED")
    assert len(done.calls) == 1


def test_a_newer_version_cancels_the_build_in_progress(
    trt_double: TrtDouble, tmp_path: Path, unpacked: Verified, builder
) -> None:
    engines, done = builder
    newer = Path(shutil.copytree(unpacked.folder, tmp_path / "newer"))
    trt_double.internals.build_gate = gate = threading.Event()
    settings = RuntimeSettings(tensorrt=TensorRTConfig(engine_cache_dir=tmp_path / "engines"))
    engines.request(unpacked.folder, unpacked.manifest, _onnx(unpacked), "a" * 64, settings)
    engines.request(newer, unpacked.manifest, newer / _onnx(unpacked).name, "b" * 64, settings)
    assert engines.building(newer) and not engines.building(unpacked.folder)
    gate.set()
    status = done.wait(newer)
    _builds_end()
    assert status.state == "ready" and status.started == 101.0
    assert [folder for folder, _ in done.calls] == [newer], "the cancelled build calls nobody"
    assert engines.status() == status
    assert len(trt_double.internals.builds) == 1, "the older build stopped before TensorRT finished it"


def test_a_build_stopped_is_cancelled_and_calls_nobody(
    trt_double: TrtDouble, tmp_path: Path, unpacked: Verified, builder
) -> None:
    engines, done = builder
    trt_double.internals.build_gate = gate = threading.Event()
    engines.request(
        unpacked.folder,
        unpacked.manifest,
        _onnx(unpacked),
        "a" * 64,
        RuntimeSettings(tensorrt=TensorRTConfig(engine_cache_dir=tmp_path)),
    )
    engines.stop(timeout=0)  # the build waits at the gate: stop asks it to cancel, then the gate opens
    gate.set()
    _builds_end()
    status = engines.status()
    assert status is not None and status.state == "cancelled" and status.finished == 101.0
    assert done.calls == [] and trt_double.internals.builds == []


def test_an_engine_from_the_cache_is_ready_at_once(
    trt_double: TrtDouble, tmp_path: Path, unpacked: Verified, builder
) -> None:
    """A second version with the same ONNX file finds its engine cached: no TensorRT progress is
    reported, and the status still ends at 1.0."""
    engines, done = builder
    settings = RuntimeSettings(tensorrt=TensorRTConfig(engine_cache_dir=tmp_path / "engines"))
    engines.request(unpacked.folder, unpacked.manifest, _onnx(unpacked), "a" * 64, settings)
    done.wait(unpacked.folder)
    newer = Path(shutil.copytree(unpacked.folder, tmp_path / "newer"))
    engines.request(newer, unpacked.manifest, newer / _onnx(unpacked).name, "a" * 64, settings)
    status = done.wait(newer)
    assert status.message is not None and status.message.startswith("engine cache")
    assert (status.state, status.progress) == ("ready", 1.0) and len(trt_double.internals.builds) == 1


def test_a_failed_build_names_its_code_and_still_calls_back(
    trt_double: TrtDouble, tmp_path: Path, unpacked: Verified, builder, caplog: pytest.LogCaptureFixture
) -> None:
    engines, done = builder
    trt_double.internals.UNSUPPORTED_OPS.add("Conv")
    engines.request(
        unpacked.folder,
        unpacked.manifest,
        _onnx(unpacked),
        "a" * 64,
        RuntimeSettings(tensorrt=TensorRTConfig(engine_cache_dir=tmp_path)),
    )
    status = done.wait(unpacked.folder)
    assert (status.state, status.error_code) == ("failed", ErrorCode.ENGINE_BUILD_FAILED.value)
    assert status.progress < 1.0 and status.finished == 101.0
    assert status.message is not None and "Conv" in status.message
    assert "ONNX Runtime serves instead" in caplog.text
    engines.stop()
