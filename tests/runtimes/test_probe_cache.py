"""`runtimes.probe_cache` through `runtimes.registry.available_runtimes(cache=...)`, as the daemon
starts: real probe processes, counted; the key's parts changed one at a time on a fake device root."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from testkit import DEMO_MODELS, standin_env

from runtimes import isolation, probe_cache
from runtimes.base import RuntimeUnavailable
from runtimes.isolation import ChildResult, ChildRunner, RuntimeCrashed
from runtimes.ort_settings import OnnxRuntimeConfig
from runtimes.registry import ProbeCache, available_runtimes, check_load, load_runtime

#: onnxruntime (a library), hailo (its devices under the root) and tvm (not installed here)
NAMES = ["onnxruntime", "hailo", "tvm"]


class Probes(ChildRunner):
    """The real runner, counting the probe processes it starts."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        super().__init__(env=env)
        self.count = 0

    def run(self, args: Sequence[str], timeout_s: float) -> ChildResult:
        self.count += args[0] == "probe"
        return super().run(args, timeout_s)


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> Probes:
    """A fresh process runner (nothing memoised) and no answer taken from a cache yet."""
    runner = Probes()
    monkeypatch.setattr(isolation, "PROCESS_RUNNER", runner)
    return runner


@pytest.fixture
def board(tmp_path: Path) -> Path:
    """A device root with a ``dev/`` folder and a device tree, as a board's fake tree."""
    root = tmp_path / "board"
    (root / "dev").mkdir(parents=True)
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/compatible").write_bytes(b"raspberrypi,5-model-b\0brcm,bcm2712\0")
    return root


def test_a_second_start_takes_the_answer_from_the_file_without_a_probe(probes: Probes, board: Path) -> None:
    cache = ProbeCache(board.parent / "state" / "runtime-probe.json", "1.0.0")
    cache.path.parent.mkdir()
    first = available_runtimes(NAMES, root=board, cache=cache)
    assert probes.count == 1 and cache.path.is_file()
    assert first["onnxruntime"].available and not first["tvm"].available and not first["hailo"].available

    isolation.PROCESS_RUNNER = fresh = Probes()  # the next start: a new process
    assert available_runtimes(NAMES, root=board, cache=cache) == first
    assert fresh.count == 0, "the answer came from the file"
    assert available_runtimes(["onnxruntime"], root=board) == {"onnxruntime": first["onnxruntime"]}
    assert fresh.count == 0, "a later probe in the process (an activation's) takes it too"

    isolation.PROCESS_RUNNER = fresh = Probes()
    assert list(available_runtimes(["tvm", "onnxruntime", "hailo"], root=board, cache=cache)) != list(first)
    assert fresh.count == 1, "other backends, or in another order, are another key"


#: each changes one part of the key between two starts, as an upgrade or a device change does
#: (the agent's version: by the new version it returns)
CHANGES: dict[str, Callable[[pytest.MonkeyPatch, Path, Path], str | None]] = {
    "the agent's version": lambda patch, board, tmp: "1.0.1",
    "where a library imports from": lambda patch, board, tmp: _shadow_onnxruntime(patch, tmp),
    "the library path": lambda patch, board, tmp: patch.setenv("LD_LIBRARY_PATH", str(tmp)),
    "a device node": lambda patch, board, tmp: (board / "dev/hailo0").touch(),
    "a device in dev/dri": lambda patch, board, tmp: (board / "dev/dri").mkdir(),
    "the device tree": lambda patch, board, tmp: _write(board / "proc/device-tree/compatible", b"radxa,rock-5b\0"),
}


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _shadow_onnxruntime(patch: pytest.MonkeyPatch, tmp: Path) -> None:
    """An onnxruntime package earlier on the path (the probe process does not see it: only the
    key's line about where the library imports from changes)."""
    (tmp / "site" / "onnxruntime").mkdir(parents=True)
    (tmp / "site" / "onnxruntime" / "__init__.py").write_text("")
    patch.syspath_prepend(str(tmp / "site"))


@pytest.mark.parametrize("change", CHANGES)
def test_a_change_to_any_part_of_the_key_probes_again_and_rewrites_the_file(
    probes: Probes, board: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    cache = ProbeCache(tmp_path / "runtime-probe.json", "1.0.0")
    available_runtimes(NAMES, root=board, cache=cache)
    written = json.loads(cache.path.read_text())

    isolation.PROCESS_RUNNER = fresh = Probes()
    version = CHANGES[change](monkeypatch, board, tmp_path)
    cache = ProbeCache(cache.path, version or cache.version)
    infos = available_runtimes(NAMES, root=board, cache=cache)
    assert fresh.count == 1, f"{change}: probed again"
    assert json.loads(cache.path.read_text())["key"] != written["key"], "the file holds the new key"
    if change == "a device node":
        assert "no Hailo device" not in (infos["hailo"].reason or ""), "the new device was probed"


CORRUPT: dict[str, Callable[[bytes], bytes]] = {
    "not JSON": lambda good: b"\x00garbage",
    "cut short": lambda good: good[: len(good) // 2],
    "empty": lambda good: b"",
    "no answers": lambda good: json.dumps({"key": json.loads(good)["key"]}).encode(),
    "an answer of the wrong type": lambda good: good.replace(b'"available": true', b'"available": "yes"'),
    "a backend missing": lambda good: _drop_answer(good, "tvm"),
    "too large": lambda good: good + b" " * probe_cache.MAX_BYTES,
}


def _drop_answer(good: bytes, name: str) -> bytes:
    document = json.loads(good)
    document["infos"] = [info for info in document["infos"] if info["name"] != name]
    return json.dumps(document).encode()


@pytest.mark.parametrize("damage", CORRUPT)
def test_a_corrupt_file_is_probed_again_and_written_whole(
    probes: Probes, board: Path, tmp_path: Path, damage: str
) -> None:
    cache = ProbeCache(tmp_path / "runtime-probe.json", "1.0.0")
    first = available_runtimes(NAMES, root=board, cache=cache)
    good = cache.path.read_bytes()
    cache.path.write_bytes(CORRUPT[damage](good))

    isolation.PROCESS_RUNNER = fresh = Probes()
    assert available_runtimes(NAMES, root=board, cache=cache) == first
    assert fresh.count == 1, f"{damage}: probed again"
    assert cache.path.read_bytes() == good, "written whole again"


def test_a_state_directory_that_cannot_be_written_leaves_the_probe_as_it_was(probes: Probes, board: Path) -> None:
    cache = ProbeCache(board / "no such folder" / "runtime-probe.json", "1.0.0")
    assert available_runtimes(NAMES, root=board, cache=cache)["onnxruntime"].available
    assert probes.count == 1 and not cache.path.exists()


def test_a_runtime_the_file_calls_available_that_then_fails_to_load_drops_the_file(
    probes: Probes, board: Path, tmp_path: Path
) -> None:
    """The file says TVM runs here (what the key missed: a library removed without a trace in
    it); its load fails as it would have without the file, and the next start probes again."""
    cache = ProbeCache(tmp_path / "runtime-probe.json", "1.0.0")
    available_runtimes(NAMES, root=board, cache=cache)
    document = json.loads(cache.path.read_text())
    for info in document["infos"]:
        if info["name"] == "tvm":
            info.update(available=True, version="0.21.0", reason=None)
    cache.path.write_text(json.dumps(document))

    isolation.PROCESS_RUNNER = fresh = Probes()
    assert available_runtimes(NAMES, root=board, cache=cache)["tvm"].available and fresh.count == 0
    with pytest.raises(RuntimeUnavailable, match="tvm does not import"):
        load_runtime("tvm", DEMO_MODELS / "demo_detector.onnx")
    assert not cache.path.exists(), "a runtime that fails to load is not trusted from the file again"

    isolation.PROCESS_RUNNER = fresh = Probes()
    assert not available_runtimes(NAMES, root=board, cache=cache)["tvm"].available
    assert fresh.count == 1 and cache.path.is_file()


def test_a_runtime_from_the_file_that_crashes_its_check_process_drops_the_file(
    probes: Probes, board: Path, tmp_path: Path
) -> None:
    """onnxruntime rebuilt in place so that it crashes on a model (what the key cannot see: a
    stand-in in the check process's path only): the first load's check fails as it would have
    without the file, and the file goes."""
    cache = ProbeCache(tmp_path / "runtime-probe.json", "1.0.0")
    available_runtimes(NAMES, root=board, cache=cache)

    isolation.PROCESS_RUNNER = Probes(env=standin_env("crash_on_load"))
    assert available_runtimes(NAMES, root=board, cache=cache)["onnxruntime"].available
    with pytest.raises(RuntimeCrashed):
        check_load("onnxruntime", DEMO_MODELS / "demo_detector.onnx", OnnxRuntimeConfig())
    assert not cache.path.exists()
