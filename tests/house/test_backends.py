"""Backends do not leak: the registry is the only module that names a backend's settings model (its
`runtimes.base.BackendConfig` subclass: `TensorRTConfig`, `OnnxRuntimeConfig`, ...) besides the
backend's own modules (``runtimes/<prefix>_*.py`` of the module that defines it: TensorRT's are
``tensorrt_backend.py``, ``tensorrt_settings.py``, ``tensorrt_engines.py``, ``tensorrt_build.py``),
and autotune (``agent/bundles/tuning.py``) names no backend at all. What differs between backends
is in their registry entries (`runtimes.base.Backend`), so a plugin is autotuned, pruned and
configured like the in-tree ones. `ALLOWED` lists the few other modules that may, each with why.

The checks read the sources (`ast`) and import nothing of the package; the last test runs them on
planted sources whose answers are known, so a check that can no longer fail fails there.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping

from testkit import REPO

PACKAGES = ("agent", "pipelines", "runtimes")
#: the one module besides a backend's own that names backends' settings models
REGISTRY = "runtimes/registry.py"
#: the base every backend's settings model derives from (not itself a backend's)
BASE = "BackendConfig"
#: the modules whose code must not differ by backend: no backend named, no backend's module imported
BLIND = ("agent/bundles/tuning.py",)

_TENSORRT_CLI = (
    "TensorRT's own command, ``edge-agent engine build``: its flags (--precision, --workspace-mb, --profile) "
    "are fields of TensorRT's settings, which it sets before building"
)
_TENSORRT_BUILDER = (
    "TensorRT's engine life cycle while serving (built on the device in the background while another runtime "
    "serves, then swapped in: docs/architecture.md) has no counterpart in other backends; the builder reads "
    "TensorRT's settings of a version (its profile, precision) to build and to report"
)
#: modules that may name a backend's settings model besides the registry and the backend's own:
#: path -> (the models it may name, why)
ALLOWED: dict[str, tuple[frozenset[str], str]] = {
    "agent/cli/engine.py": (frozenset({"TensorRTConfig"}), _TENSORRT_CLI),
    "agent/serving/engine_builder.py": (frozenset({"TensorRTConfig"}), _TENSORRT_BUILDER),
}


def _sources() -> dict[str, ast.Module]:
    paths = sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))
    return {str(p.relative_to(REPO)): ast.parse(p.read_text(), filename=str(p)) for p in paths}


def _base_name(node: ast.expr) -> str | None:
    """``BackendConfig`` of a class's base ``BackendConfig`` or ``base.BackendConfig``."""
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def settings_models(trees: Mapping[str, ast.Module]) -> dict[str, str]:
    """Every backend's settings model in `trees`: each class deriving from `BASE` (or from one of
    those), by name -> the module that defines it."""
    found: dict[str, str] = {}
    grew = True
    while grew:
        grew = False
        for path, tree in trees.items():
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef) or node.name in found:
                    continue
                bases = {_base_name(base) for base in node.bases}
                if BASE in bases or bases & found.keys():
                    found[node.name] = path
                    grew = True
    return found


def named(tree: ast.Module, names: Iterable[str]) -> list[tuple[int, str]]:
    """The (line, name) where `tree` names one of `names`: imports it (``from m import X``,
    ``import m.X``), uses it (``X``, ``module.X``) or spells it in a string (an annotation in
    quotes). Prose that mentions it (a docstring) is not naming it."""
    wanted = frozenset(names)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found |= {(node.lineno, a.name.split(".")[-1]) for a in node.names if a.name.split(".")[-1] in wanted}
        elif isinstance(node, ast.Name) and node.id in wanted:
            found.add((node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr in wanted:
            found.add((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in wanted:
            found.add((node.lineno, node.value))
    return sorted(found)


def own_modules_prefix(defining: str) -> str:
    """The path prefix of a backend's own modules, from the module defining its settings model:
    ``runtimes/tensorrt_settings.py`` -> ``runtimes/tensorrt_``."""
    folder, _, name = defining.rpartition("/")
    return f"{folder}/{name.split('_')[0]}_"


def leaks(
    trees: Mapping[str, ast.Module], allowed: Mapping[str, tuple[frozenset[str], str]]
) -> dict[str, list[tuple[int, str]]]:
    """The modules of `trees` that name a backend's settings model although they are neither the
    registry, nor one of that backend's own modules, nor allowed to name it; with where."""
    models = settings_models(trees)
    found: dict[str, list[tuple[int, str]]] = {}
    for path, tree in trees.items():
        if path == REGISTRY:
            continue
        may = allowed.get(path, (frozenset(), ""))[0]
        hits = [
            (line, name)
            for line, name in named(tree, models)
            if name not in may and not path.startswith(own_modules_prefix(models[name]))
        ]
        if hits:
            found[path] = hits
    return found


def backends(trees: Mapping[str, ast.Module]) -> dict[str, str]:
    """The backends defined in `trees`: each ``KEY = "name"`` of a module that builds a
    ``Backend(...)``, by name -> the dotted prefix of its own modules (``runtimes.ort_``)."""
    found = {}
    for path, tree in trees.items():
        builds = any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Backend" for n in ast.walk(tree)
        )
        for node in tree.body if builds else []:
            if (
                isinstance(node, ast.Assign)
                and [ast.unparse(t) for t in node.targets] == ["KEY"]
                and isinstance(node.value, ast.Constant)
            ):
                found[str(node.value.value)] = own_modules_prefix(path).replace("/", ".")
    return found


def not_blind(tree: ast.Module, backends: Mapping[str, str]) -> list[tuple[int, str]]:
    """Where `tree` names a backend (a string equal to its name) or imports one of a backend's
    own modules (`backends`' prefixes: ``runtimes.tensorrt_...``)."""
    prefixes = tuple(backends.values())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in backends:
            found.add((node.lineno, node.value))
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        found |= {(node.lineno, m) for m in modules if m.startswith(prefixes)}
    return sorted(found)


def test_the_settings_models_of_the_in_tree_backends_are_found() -> None:
    models = settings_models(_sources())
    assert {
        "TensorRTConfig": "runtimes/tensorrt_settings.py",
        "OnnxRuntimeConfig": "runtimes/ort_settings.py",
        "LiteRTConfig": "runtimes/litert_settings.py",
        "OpenVINOConfig": "runtimes/openvino_settings.py",
    }.items() <= models.items()


def test_only_the_registry_and_a_backend_s_own_modules_name_its_settings_model() -> None:
    """Route it through the registry (`runtimes.registry`: `RuntimeSettings.config_for`, a hook
    of `runtimes.base.Backend`), or add the module to `ALLOWED` with the reason."""
    assert leaks(_sources(), ALLOWED) == {}


def test_every_allowed_module_still_names_what_it_is_allowed_to() -> None:
    """An entry of `ALLOWED` that is no longer needed goes: the list stays the exceptions there are."""
    trees = _sources()
    for path, (may, why) in ALLOWED.items():
        assert why and path in trees, path
        assert {name for _, name in named(trees[path], may)} == may, f"{path} no longer names {sorted(may)}"


def test_autotune_names_no_backend() -> None:
    trees = _sources()
    found = backends(trees)
    assert {"tensorrt": "runtimes.tensorrt_", "onnxruntime": "runtimes.ort_"}.items() <= found.items()
    assert {"litert", "openvino"} <= found.keys()
    assert {path: not_blind(trees[path], found) for path in BLIND} == {path: [] for path in BLIND}


def test_the_checks_find_what_is_planted() -> None:
    """The readers above on planted sources: a settings model found through a subclass, each way
    of naming it found on its line, a backend's own modules, the registry and an allowed name
    passed over, a name that is only prose passed over too."""
    planted = {
        "runtimes/npu_backend.py": """
from runtimes import base
KEY = "npu"
class NpuConfig(base.BackendConfig):
    type: str = "npu"
class NpuProConfig(NpuConfig):
    cores: int = 2
class NotSettings(Thing):
    pass
BACKEND = Backend(name=KEY, config=NpuConfig)
""",
        "runtimes/npu_compiler.py": """
from runtimes.npu_backend import NpuConfig
def compile(config: NpuConfig) -> None: ...
""",
        "runtimes/registry.py": """
from runtimes.npu_backend import NpuConfig
""",
        "agent/serving/leaky.py": """
'''Documents NpuConfig in prose: not naming it.'''
from runtimes.npu_backend import NpuConfig, KEY
import runtimes.npu_backend as npu
def settings(s):
    return s.of(npu.NpuProConfig)
def annotated(config: "NpuConfig") -> None: ...
""",
        "agent/cli/allowed.py": """
from runtimes.npu_backend import NpuConfig, NpuProConfig
""",
        "agent/bundles/tuning.py": """
from runtimes.registry import BACKENDS
from runtimes.npu_backend import candidates
name = "npu"
note = "an npu, not a name"
""",
    }
    trees = {path: ast.parse(source) for path, source in planted.items()}
    assert settings_models(trees) == {"NpuConfig": "runtimes/npu_backend.py", "NpuProConfig": "runtimes/npu_backend.py"}
    allowed = {"agent/cli/allowed.py": (frozenset({"NpuConfig"}), "planted")}
    assert leaks(trees, allowed) == {
        "agent/serving/leaky.py": [(3, "NpuConfig"), (6, "NpuProConfig"), (7, "NpuConfig")],
        "agent/cli/allowed.py": [(2, "NpuProConfig")],
    }
    assert backends(trees) == {"npu": "runtimes.npu_"}
    assert not_blind(trees["agent/bundles/tuning.py"], {"npu": "runtimes.npu_"}) == [
        (3, "runtimes.npu_backend"),
        (4, "npu"),
    ]
    assert own_modules_prefix("runtimes/tensorrt_settings.py") == "runtimes/tensorrt_"
