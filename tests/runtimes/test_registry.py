"""`runtimes.registry`: the table (in-tree backends, then plugins by entry point, the bad ones left
out), the ``runtimes:`` section derived from it, what is installed, a missing library reported not raised."""

from __future__ import annotations

import dataclasses
import logging
import textwrap
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from runtimes.base import Backend, Lazy, RuntimeUnavailable
from runtimes.litert_settings import LiteRTConfig
from runtimes.openvino_settings import OpenVINOConfig
from runtimes.ort_settings import OnnxRuntimeConfig
from runtimes.registry import (
    BACKENDS,
    GROUP,
    IN_TREE,
    RuntimeSettings,
    available_runtimes,
    collect,
    load_runtime,
    plugins,
)
from runtimes.tensorrt_settings import TensorRTConfig
from runtimes.tvm_settings import TVMConfig

#: a plugin module: a backend named NAME whose settings model is `NpuConfig`
PLUGIN = """
from pathlib import Path
from typing import Literal
from runtimes.base import Backend, BackendConfig, RuntimeInfo


class NpuConfig(BackendConfig):
    type: Literal["{name}"] = "{name}"
    cores: int = 1


def load(path, config, options):
    raise NotImplementedError


BACKEND = Backend(
    name="{name}", config=NpuConfig, summary="An NPU.", formats=("onnx",), rank={{"arm": 5}},
    libraries=("npu_sdk",), availability=lambda: RuntimeInfo("{name}", False, reason="no NPU"), load=load,
)
"""


def _plugin_modules(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plugin modules in `folder`, importable: good ones, one whose import fails, one that names no
    backend, one whose backend is invalid, one that takes an in-tree name."""
    (folder / "npu_plugin.py").write_text(PLUGIN.format(name="npu"))
    (folder / "npu_again.py").write_text(PLUGIN.format(name="npu"))
    (folder / "shadow_plugin.py").write_text(PLUGIN.format(name="onnxruntime"))
    (folder / "missing_library.py").write_text('raise OSError("libnpu.so.2: cannot open shared object file")\n')
    (folder / "not_a_backend.py").write_text("BACKEND = {'name': 'dict'}\n")
    bad_rank = PLUGIN.format(name="gpu").replace('rank={"arm": 5}', 'rank={"gpu": 1}')
    (folder / "bad_rank.py").write_text(textwrap.dedent(bad_rank))
    refusing = PLUGIN.format(name="tpu").replace(
        "    cores: int = 1\n",
        "    cores: int = 1\n\n    @model_validator(mode='after')\n    def _set(self):\n"
        "        raise ValueError('cores must be set')\n",
    )
    (folder / "bad_defaults.py").write_text("from pydantic import model_validator\n" + refusing)
    monkeypatch.syspath_prepend(str(folder))


def test_plugins_join_the_table_and_the_bad_ones_are_logged_and_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _plugin_modules(tmp_path, monkeypatch)
    points = [
        metadata.EntryPoint(name, value, GROUP)
        for name, value in [
            ("zz_missing", "missing_library:BACKEND"),  # found first, sorted by name
            ("npu", "npu_plugin:BACKEND"),
            ("npu", "npu_again:BACKEND"),
            ("onnxruntime", "shadow_plugin:BACKEND"),
            ("dict", "not_a_backend:BACKEND"),
            ("gpu", "bad_rank:BACKEND"),
            ("tpu", "bad_defaults:BACKEND"),
            ("coral", "npu_plugin:BACKEND"),
        ]
    ]
    with caplog.at_level(logging.ERROR, logger="runtimes.registry"):
        registry = collect(IN_TREE, points)
    assert list(registry.backends) == ["tensorrt", "onnxruntime", "litert", "openvino", "tvm", "hailo", "rknn", "npu"]
    assert registry.backends["onnxruntime"] is IN_TREE[1], "an in-tree backend is never replaced"
    assert registry.backends["npu"].config.__module__ == "npu_again"
    errors = {(p.name, p.target): p.error for p in registry.plugins}
    assert errors == {
        ("coral", "npu_plugin:BACKEND"): "the entry point is named 'coral' but its backend 'npu': "
        "the two must be equal",
        ("dict", "not_a_backend:BACKEND"): "not_a_backend:BACKEND is a dict, not a runtimes.base.Backend",
        ("gpu", "bad_rank:BACKEND"): "importing bad_rank:BACKEND failed: ValueError: gpu: rank {'gpu': 1}: "
        "expected nvidia, arm, x86 -> int",
        ("tpu", "bad_defaults:BACKEND"): "its settings (NpuConfig) refuse their own defaults: Value error, "
        "cores must be set",
        ("npu", "npu_again:BACKEND"): None,  # two of one name: the first by target wins, whatever the install order
        ("npu", "npu_plugin:BACKEND"): "the name 'npu' is taken by another plugin",
        ("onnxruntime", "shadow_plugin:BACKEND"): "the name 'onnxruntime' is taken by an in-tree backend",
        ("zz_missing", "missing_library:BACKEND"): "importing missing_library:BACKEND failed: OSError: "
        "libnpu.so.2: cannot open shared object file",
    }
    assert [p.name for p in registry.plugins] == [
        "coral", "dict", "gpu", "npu", "npu", "onnxruntime", "tpu", "zz_missing"
    ]  # fmt: skip
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(logged) == 7 and all(" left out: " in line for line in logged)
    assert "runtime plugin zz_missing (missing_library:BACKEND, from an unknown distribution) left out" in logged[-1]
    with pytest.raises(TypeError):
        registry.backends["x"] = IN_TREE[0]  # type: ignore[index]


def test_this_environment_registers_the_in_tree_backends_only() -> None:
    """The dev environment has no plugin installed (tests/e2e/test_runtime_plugins.py installs
    them in a folder of their own)."""
    assert plugins() == () and tuple(BACKENDS.values()) == IN_TREE


def _lazy_parts(entry: Backend[Any]) -> list[tuple[str, Lazy]]:
    """Each field of `entry` (and of its caches) that names its code lazily, by field name."""
    parts = [(f"{entry.name}.{f.name}", getattr(entry, f.name)) for f in dataclasses.fields(entry)]
    for cache in entry.caches:
        parts += [(f"{entry.name}.{cache.name}.{f.name}", getattr(cache, f.name)) for f in dataclasses.fields(cache)]
    return [(name, value) for name, value in parts if isinstance(value, Lazy)]


@pytest.mark.parametrize("entry", IN_TREE, ids=lambda entry: entry.name)
def test_an_in_tree_entry_loads_through_lazy_names_that_resolve(entry: Backend[Any]) -> None:
    """The entries name their backend's code lazily (importing the registry imports no backend's
    code: tests/house/test_startup.py), so a misspelt name would only fail when that backend is
    probed on a board that has it: each name must resolve to a function here."""
    parts = dict(_lazy_parts(entry))
    assert f"{entry.name}.load" in parts and f"{entry.name}.availability" in parts
    for name, part in parts.items():
        assert callable(part.target()), name


class _Required(OnnxRuntimeConfig):
    """ONNX Runtime's settings and one without a default: a section could not be left out."""

    device_key: str


def _backend(**change: object) -> Backend[OnnxRuntimeConfig]:
    fields: dict[str, object] = {
        "name": "onnxruntime",
        "config": OnnxRuntimeConfig,
        "summary": "x",
        "formats": ("onnx",),
        "rank": {"x86": 1},
        "libraries": ("onnxruntime",),
        "availability": lambda: None,
        "load": lambda path, config, options: None,
    }
    return Backend(**{**fields, **change})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "Onnx Runtime"}, "expected lower-case letters"),
        ({"name": "litert"}, "OnnxRuntimeConfig.type defaults to 'onnxruntime', not to the name"),
        ({"config": dict}, "config must be a subclass of runtimes.base.BackendConfig"),
        ({"formats": ()}, "formats"),
        ({"formats": (".onnx",)}, "expected file suffixes without the dot"),
        ({"rank": {"jetson": 1}}, "rank"),
        ({"rank": {"x86": "first"}}, "rank"),
        ({"libraries": ()}, "libraries"),
        ({"config": _Required}, r"_Required\.device_key has no default"),
    ],
)
def test_an_entry_the_agent_cannot_derive_from_is_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _backend(**change)


def test_an_entry_is_frozen_rank_too() -> None:
    rank = {"x86": 1}
    entry = _backend(rank=rank)
    rank["arm"] = 0
    assert dict(entry.rank) == {"x86": 1}
    with pytest.raises(TypeError):
        entry.rank["arm"] = 0  # type: ignore[index]


def test_the_runtimes_section_has_one_section_per_backend_and_refuses_unknown_keys() -> None:
    adapter = TypeAdapter(RuntimeSettings)
    settings = adapter.validate_python({"litert": {"num_threads": 2}})
    assert settings.of(LiteRTConfig) == LiteRTConfig(num_threads=2)
    assert settings.config_for("onnxruntime") == OnnxRuntimeConfig() and settings == RuntimeSettings(
        litert=LiteRTConfig(num_threads=2)
    )
    assert adapter.validate_python(settings.to_json()) == settings
    with pytest.raises(ValidationError, match="providers"):
        adapter.validate_python({"onnxruntime": {"providers": ["rocm"]}})
    with pytest.raises(ValidationError, match=r"litert\.threads\n  Extra inputs are not permitted"):
        adapter.validate_python({"litert": {"threads": 2}})
    with pytest.raises(ValidationError, match=r"edgetpu\n  Extra inputs are not permitted"):
        adapter.validate_python({"edgetpu": {}})
    with pytest.raises(ValidationError, match="Input should be 'litert'"):
        adapter.validate_python({"litert": {"type": "onnxruntime"}})
    with pytest.raises(TypeError, match=r"runtimes\.litert takes a LiteRTConfig, got OnnxRuntimeConfig"):
        RuntimeSettings(litert=OnnxRuntimeConfig())
    with pytest.raises(TypeError, match="unknown runtime section 'edgetpu'"):
        RuntimeSettings(edgetpu=OnnxRuntimeConfig())


def test_settings_are_replaced_by_section_and_filled_in_from_the_state_dir(tmp_path: Path) -> None:
    settings = RuntimeSettings(tensorrt=TensorRTConfig(precision="int8"))
    tuned = settings.replace(OnnxRuntimeConfig(intra_op_threads=2))
    assert tuned.of(OnnxRuntimeConfig).intra_op_threads == 2 and settings.of(OnnxRuntimeConfig).intra_op_threads == 0
    assert tuned.of(TensorRTConfig).precision == "int8", "the other sections are kept"
    filled = tuned.with_state_dir(tmp_path)
    assert filled.of(TensorRTConfig) == TensorRTConfig(precision="int8", engine_cache_dir=tmp_path / "engines")
    assert filled.of(OnnxRuntimeConfig) == tuned.of(OnnxRuntimeConfig) and filled.of(LiteRTConfig) == LiteRTConfig()
    assert filled.of(OpenVINOConfig) == OpenVINOConfig(cache_dir=tmp_path / "openvino")
    assert filled.of(TVMConfig) == TVMConfig(cache_dir=tmp_path / "tvm")
    chosen = RuntimeSettings(
        tensorrt=TensorRTConfig(engine_cache_dir=tmp_path / "mine"),
        openvino=OpenVINOConfig(cache_dir=tmp_path / "ov"),
        tvm=TVMConfig(cache_dir=tmp_path / "tvm"),
    )
    assert chosen.with_state_dir(tmp_path) == chosen, "a cache the config names is kept"
    with pytest.raises(RuntimeUnavailable, match="unknown runtime 'edgetpu'"):
        settings.config_for("edgetpu")


def test_registry_reports_what_is_installed() -> None:
    infos = available_runtimes()
    assert infos["onnxruntime"].available and "CPUExecutionProvider" in infos["onnxruntime"].devices
    assert infos["litert"].available and infos["litert"].version
    tensorrt = infos["tensorrt"]
    assert tensorrt.available or tensorrt.reason, "an unavailable runtime says why (on a Jetson it is available)"


def test_registry_missing_library_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the probe process runs (`BACKENDS[name].availability`), here in this process with
    the imports refused."""
    import builtins

    real_import = builtins.__import__

    def no_litert(name, *args, **kwargs):
        if name.startswith(("ai_edge_litert", "tflite_runtime")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_litert)
    info = BACKENDS["litert"].availability()
    assert not info.available and "neither ai-edge-litert nor tflite-runtime" in (info.reason or "")
    with pytest.raises(RuntimeUnavailable, match="neither ai-edge-litert"):
        load_runtime("litert", Path("x.tflite"))
    with pytest.raises(RuntimeUnavailable, match=r"no native TensorRT backend|not installed"):
        load_runtime("tensorrt", Path("x.onnx"))
