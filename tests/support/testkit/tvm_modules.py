"""Apache TVM in tests: `needs_tvm` skips where tvm does not import (fails where
``EDGE_AGENT_REQUIRE`` lists ``tvm``: scripts/test_tvm.sh), a model cross-compiled for the Pi 5
(`pi5_module`), and a stand-in module that needs no tvm (`fake_module`: its record is real, its
library is not a library) for the checks made before a module is opened."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from testkit.needs import missing

#: the Pi 5's CPU, as `bundle build --tvm-target` takes it
PI5_TARGET = "llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76"


def needs_tvm() -> None:
    """Skip (or fail, where required) unless tvm imports here."""
    try:
        import tvm  # noqa: F401
    except Exception as exc:  # a broken build raises more than ImportError
        missing("tvm", f"tvm does not import ({type(exc).__name__}: {exc}): scripts/test_tvm.sh installs it")


def needs_cross_gcc() -> None:
    """Skip (or fail, where tvm is required) unless the aarch64 cross linker is on the PATH."""
    if shutil.which("aarch64-linux-gnu-gcc") is None:
        missing("tvm", "aarch64-linux-gnu-gcc not found (apt-get install gcc-aarch64-linux-gnu)")


def pi5_module(model: Path, folder: Path) -> Path:
    """`model` compiled for the Pi 5 into `folder` (its record beside it)."""
    from agent.bundles.archive import compile_tvm_modules
    from runtimes.tvm_backend import parse_target

    needs_tvm()
    needs_cross_gcc()
    (module,) = compile_tvm_modules(model, [parse_target(PI5_TARGET)], folder)
    return module


def fake_module(model: Path, folder: Path, arch: str = "aarch64") -> Path:
    """``<stem>.so`` in `folder`, with a record saying it was compiled from the ONNX `model` for
    `arch`; the library itself is junk (what is checked before it is opened needs no tvm)."""
    from runtimes.files import sha256_file

    module = folder / f"{model.stem}.so"
    module.write_bytes(b"\x7fELF not a library")
    record = {
        "target": {"kind": "llvm", "mtriple": f"{arch}-linux-gnu"},
        "arch": arch,
        "tvm_version": "0.27.0",
        "model_sha256": sha256_file(model),
        "inputs": [{"name": "images", "shape": [1, 3, 320, 320], "dtype": "float32"}],
        "outputs": [{"name": "output0", "shape": [1, 7, 2100], "dtype": "float32"}],
        "metadata": {},
    }
    module.with_name(module.name + ".json").write_text(json.dumps(record))
    return module
