"""The table of runtime backends, filled once at import: the in-tree ones and the third-party
ones registered through the ``edge_agent.runtimes`` entry point group.

`BACKENDS` maps each name to its entry, a `runtimes.base.Backend`: the backend's settings model,
artifact formats, rank per class of board, device label, library modules, availability probe
and loader, what autotune tries of it and its caches. What names backends is derived from it:
`RUNTIME_NAMES`; `RuntimeSettings`, the ``runtimes:`` section of agent.yaml (one section per
backend); `runtimes.selection` (the ``runtime:`` preference and the CLI's ``--runtime`` choices,
formats, ranks, device labels); the check processes (`runtimes.isolation`, which names a
crashing library by its modules); the loaders (`load_runtime` here, `agent.serving.loader`
above); autotune's candidates (`tune_candidates`, `prepare`; `agent.bundles.tuning` names no
backend); the pruning of every backend's caches (`prune_caches`, from the bundle store's gc).
This is the only module outside a backend's own that names a backend's settings model
(``tests/house/test_backends.py``). A new in-tree backend is its code,
``runtimes/<name>_backend.py``, its settings and ``BACKEND`` in a light
``runtimes/<name>_settings.py`` (naming the code with `runtimes.base.lazy`: importing this
module imports no backend's code, nor the check processes' until one is started), and one item
of `IN_TREE`.

Plugins: each entry point of the group names a `Backend` object (``coral =
"edge_agent_coral:BACKEND"`` in a package's ``[project.entry-points."edge_agent.runtimes"]``),
the entry point's name equal to the backend's. Importing this module imports no plugin: a
plugin's import is third-party code that may raise `SystemExit`, kill the process (SIGSEGV,
``abort``) or never return, so plugins are loaded only when a backend is needed, by
`load_plugins` (called by `backend` for a name not in-tree, `available_runtimes`, `plugins`,
the CLI's ``--runtime`` check and `agent.config.loading` before it validates a file). It first
imports every plugin in a child process (`runtimes.isolation.vet_plugins_isolated`, within
`plugin_timeout_s`): one that dies there, hangs or raises anything (a `BaseException` too) is
left out with the reason, never imported here; the others are imported here (a `BaseException`
caught again). One whose object is not a valid `Backend`, or whose name is taken, is left out
too. Each left out is logged and listed by `plugins` (``edge-agent probe``, the page's
problems): a plugin never stops the agent, nor a command that needs no backend (``--help``,
``--version``, ``keygen`` import none).

`BACKENDS` is a read-only view of the table: the in-tree backends from import, the plugins
added once by the first `load_plugins`, never changed after. Config validation reads it and does
no I/O: the ``runtimes:`` section and ``runtime:`` take a plugin's name and settings once
plugins are loaded, which the config loader does before validating (before that, a plugin's
section is an unknown key). The JSON Schema (`RuntimeSettings` as the config class was built)
describes the in-tree backends.

A backend whose library is missing is reported unavailable with the reason; asking to load it
raises `RuntimeUnavailable`. Libraries are probed, and a model's first load checked, in a child
process (`runtimes.isolation`), so one that crashes on import or load is reported instead of
taking the agent down. Every function here may be called from any thread.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ValidationError,
    ValidatorFunctionWrapHandler,
    create_model,
)
from pydantic_core import CoreSchema, core_schema

from runtimes import (
    hailo_settings,
    litert_settings,
    openvino_settings,
    ort_settings,
    rknn_settings,
    tensorrt_settings,
    tvm_settings,
)
from runtimes.base import (
    Backend,
    BackendConfig,
    BackendError,
    BundleHints,
    BundleModel,
    LoadOptions,
    ModelLoadError,
    Progress,
    Runtime,
    RuntimeInfo,
    RuntimeName,
    RuntimeUnavailable,
    TuneCandidate,
    first_line,
)
from runtimes.caches import InUse, prune

log = logging.getLogger(__name__)

#: the entry point group third-party backends register in
GROUP = "edge_agent.runtimes"
#: the environment variable that sets how long importing the plugins may take in the child
#: process, in seconds (bounded to `PLUGIN_TIMEOUT_BOUNDS_S`; default `PLUGIN_TIMEOUT_S`)
PLUGIN_TIMEOUT_ENV = "EDGE_AGENT_PLUGIN_TIMEOUT_S"
PLUGIN_TIMEOUT_S = 60.0
PLUGIN_TIMEOUT_BOUNDS_S = (1.0, 600.0)
#: the backends of this distribution, in the order of the table (and of the schema, the CLI's choices)
IN_TREE: tuple[Backend[Any], ...] = (
    tensorrt_settings.BACKEND,
    ort_settings.BACKEND,
    litert_settings.BACKEND,
    openvino_settings.BACKEND,
    tvm_settings.BACKEND,
    hailo_settings.BACKEND,
    rknn_settings.BACKEND,
)


@dataclass(frozen=True)
class Plugin:
    """One entry point of the group: its name, the object it names (``module:attribute``), the
    distribution that declares it (``"edge-agent-coral 1.2.0"``), and why it was left out (None:
    it is in the table under its name)."""

    name: str
    target: str
    distribution: str | None
    error: str | None = None


@dataclass(frozen=True)
class Registry:
    """The table of backends by name, and the plugins found (registered or left out)."""

    backends: Mapping[RuntimeName, Backend[Any]]
    plugins: tuple[Plugin, ...]


def collect(
    in_tree: Iterable[Backend[Any]],
    entry_points: Iterable[metadata.EntryPoint],
    refused: Mapping[tuple[str, str], str] | None = None,
) -> Registry:
    """The table: `in_tree` in order, then each entry point's backend in the order of their
    names; one that cannot be registered is logged and left out (its `Plugin.error` says why).
    An entry point in `refused` (by name and target: what its import did in a check process) is
    left out with that reason without being imported here."""
    refused = refused or {}
    backends: dict[RuntimeName, Backend[Any]] = {entry.name: entry for entry in in_tree}
    builtin = frozenset(backends)
    plugins = []
    for point in sorted(entry_points, key=lambda p: (p.name, p.value)):
        error = refused.get((point.name, point.value)) or _register(point, backends, builtin)
        plugin = Plugin(point.name, point.value, _distribution(point), error)
        if error is None:
            log.debug("runtime plugin %s registered from %s (%s)", plugin.name, plugin.target, plugin.distribution)
        else:
            log.error(
                "runtime plugin %s (%s, from %s) left out: %s",
                plugin.name,
                plugin.target,
                plugin.distribution or "an unknown distribution",
                error,
            )
        plugins.append(plugin)
    return Registry(MappingProxyType(backends), tuple(plugins))


def _register(
    point: metadata.EntryPoint, backends: dict[RuntimeName, Backend[Any]], builtin: frozenset[str]
) -> str | None:
    """Add the backend `point` names to `backends`; why not, when it cannot be."""
    try:
        entry = point.load()
    except BaseException as exc:  # a plugin's import may fail any way: a missing library, SystemExit
        return f"importing {point.value} failed: {type(exc).__name__}: {first_line(exc)}"
    if not isinstance(entry, Backend):
        return f"{point.value} is a {type(entry).__name__}, not a runtimes.base.Backend"
    if entry.name != point.name:
        return f"the entry point is named {point.name!r} but its backend {entry.name!r}: the two must be equal"
    try:  # an in-tree model is built when first used (its tests build it); a plugin's here, once
        entry.config.model_validate({})
    except Exception as exc:  # a ValidationError; or any error of the plugin's own validators
        return f"its settings ({entry.config.__name__}) refuse their own defaults: {_first_error(exc)}"
    if entry.name in backends:
        owner = "an in-tree backend" if entry.name in builtin else "another plugin"
        return f"the name {entry.name!r} is taken by {owner}"
    backends[entry.name] = entry
    return None


def _first_error(exc: Exception) -> str:
    """The first of pydantic's errors in `exc` in words (or the exception's first line)."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    return str(errors[0]["msg"]) if errors else first_line(exc)


def _distribution(point: metadata.EntryPoint) -> str | None:
    dist = getattr(point, "dist", None)
    return None if dist is None else f"{dist.name} {dist.version}"


_TABLE: dict[RuntimeName, Backend[Any]] = {entry.name: entry for entry in IN_TREE}
#: every backend known here, by name, in-tree first: a read-only view that plugins join once,
#: at the first `load_plugins`
BACKENDS: Mapping[RuntimeName, Backend[Any]] = MappingProxyType(_TABLE)
#: the in-tree backends' names (`runtime_names` adds the plugins loaded)
RUNTIME_NAMES: tuple[RuntimeName, ...] = tuple(_TABLE)
_BUILTIN = frozenset(entry.name for entry in IN_TREE)
_LOADING = threading.Lock()
_PLUGINS: tuple[Plugin, ...] | None = None  # None: not loaded yet


def plugin_timeout_s(environ: Mapping[str, str] = os.environ) -> float:
    """How long the plugins' imports may take in the check process: `PLUGIN_TIMEOUT_ENV` when it
    is a number (clamped to `PLUGIN_TIMEOUT_BOUNDS_S`), else `PLUGIN_TIMEOUT_S`."""
    low, high = PLUGIN_TIMEOUT_BOUNDS_S
    text = environ.get(PLUGIN_TIMEOUT_ENV, "")
    try:
        value = float(text) if len(text) <= 32 else float("nan")  # bounded before parsing
    except ValueError:
        return PLUGIN_TIMEOUT_S
    return min(max(value, low), high) if value == value else PLUGIN_TIMEOUT_S  # NaN: the default


def load_plugins(isolated: bool = True, names: Iterable[str] | None = None) -> tuple[Plugin, ...]:
    """Load the plugins once per process and add the good ones to `BACKENDS`; the plugins found,
    registered or left out. With `isolated` (the agent, the CLI), each is imported in a check
    process first (`runtimes.isolation.vet_plugins_isolated`) and only those whose import
    returned there are imported here; a check process imports its own in place (`isolated`
    false), only those of `names` (default: all)."""
    global _PLUGINS
    with _LOADING:
        if _PLUGINS is None:
            wanted = None if names is None else frozenset(names)
            points = [p for p in metadata.entry_points(group=GROUP) if wanted is None or p.name in wanted]
            refused: Mapping[tuple[str, str], str] = {}
            if isolated and points:
                from runtimes.isolation import vet_plugins_isolated  # check processes: not `detect`'s

                refused = vet_plugins_isolated([(p.name, p.value) for p in points], plugin_timeout_s())
            registry = collect(IN_TREE, points, refused)
            for name, entry in registry.backends.items():
                _TABLE.setdefault(name, entry)
            _PLUGINS = registry.plugins
        return _PLUGINS


def plugins() -> tuple[Plugin, ...]:
    """The entry points of `GROUP`, registered or left out (`load_plugins`)."""
    return load_plugins()


def plugin_problems() -> list[str]:
    """One line per plugin left out (for the page's problems); none before plugins are loaded."""
    found = _PLUGINS or ()
    return [f"runtime plugin {p.name} ({p.target}) left out: {p.error}" for p in found if p.error is not None]


def runtime_names() -> tuple[RuntimeName, ...]:
    """Every backend's name known now: the in-tree ones, then the plugins loaded."""
    return tuple(_TABLE)


def backend(name: RuntimeName) -> Backend[Any]:
    """The entry of `name`; `RuntimeUnavailable` when no backend of that name is registered."""
    entry = BACKENDS.get(name)
    if entry is None:
        load_plugins()
        entry = BACKENDS.get(name)
    if entry is None:
        raise RuntimeUnavailable(f"unknown runtime {name!r}; known: {', '.join(runtime_names())}")
    return entry


ConfigT = TypeVar("ConfigT", bound=BackendConfig)


@dataclass(frozen=True, init=False)
class RuntimeSettings:
    """The ``runtimes:`` section of agent.yaml: one section per backend of `BACKENDS`, each
    optional (a left-out section is that backend's defaults). `configs` holds one settings
    model per backend, in the table's order.

    Built from keyword arguments by backend name (``RuntimeSettings(litert=LiteRTConfig(...))``)
    or validated by pydantic from YAML through a model with one field per backend, so a wrong
    section or key fails with its location, and the JSON Schema lists every section."""

    configs: tuple[BackendConfig, ...]

    def __init__(self, **sections: BackendConfig) -> None:
        for name, config in sections.items():
            if name not in BACKENDS:
                raise TypeError(f"unknown runtime section {name!r}; known: {', '.join(runtime_names())}")
            kind = BACKENDS[name].config
            if not isinstance(config, kind):
                raise TypeError(f"runtimes.{name} takes a {kind.__name__}, got {type(config).__name__}")
        configs = tuple(sections[name] if name in sections else entry.config() for name, entry in BACKENDS.items())
        object.__setattr__(self, "configs", configs)

    def config_for(self, name: RuntimeName) -> BackendConfig:
        """The settings of the backend `name` (`RuntimeUnavailable` for an unknown one); a
        plugin's defaults when these settings were made before it was loaded."""
        entry = backend(name)
        return next((config for config in self.configs if config.type == name), None) or entry.config()

    def of(self, kind: type[ConfigT]) -> ConfigT:
        """The settings of the backend whose model is `kind` (``settings.of(TensorRTConfig)``)."""
        for config in self.configs:
            if isinstance(config, kind):
                return config
        raise KeyError(f"no backend takes {kind.__name__}")

    def replace(self, config: BackendConfig) -> RuntimeSettings:
        """These settings with `config` as its backend's section."""
        return RuntimeSettings(**{**self.sections(), config.type: config})

    def with_state_dir(self, state_dir: Path) -> RuntimeSettings:
        """These settings with what they leave to the agent's state directory filled in, by
        each backend that leaves something (`Backend.with_state_dir`: TensorRT's engine cache)."""
        settings = self
        for entry in BACKENDS.values():
            if entry.with_state_dir is not None:
                settings = settings.replace(entry.with_state_dir(settings.config_for(entry.name), state_dir))
        return settings

    def for_bundle(self, hints: BundleHints) -> RuntimeSettings:
        """These settings with what a bundle's manifest says about its model, by each backend
        that takes something of it (`Backend.for_bundle`: TensorRT's input profile)."""
        settings = self
        for entry in BACKENDS.values():
            if entry.for_bundle is not None:
                settings = settings.replace(entry.for_bundle(settings.config_for(entry.name), hints))
        return settings

    def sections(self) -> dict[RuntimeName, BackendConfig]:
        """Each backend's settings by name."""
        return {config.type: config for config in self.configs}

    def to_json(self) -> dict[RuntimeName, dict[str, Any]]:
        """The section as agent.yaml writes it (every key, at its value)."""
        return {config.type: config.model_dump(mode="json") for config in self.configs}

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """Validated (and described in the JSON Schema) as `_in_tree_sections`; an instance passes as it is."""

        def validate(value: Any, sections: ValidatorFunctionWrapHandler) -> RuntimeSettings:
            if isinstance(value, RuntimeSettings):
                return value
            # plugins loaded since the schema was built: validate with a model of the whole table
            model = sections(value) if len(BACKENDS) == len(IN_TREE) else _sections_model().model_validate(value)
            return cls(**{name: getattr(model, name) for name in BACKENDS})

        return core_schema.no_info_wrap_validator_function(
            validate,
            handler.generate_schema(_in_tree_sections()),
            serialization=core_schema.plain_serializer_function_ser_schema(lambda settings: settings.to_json()),
        )


def _sections_model(entries: Iterable[Backend[Any]] | None = None) -> type[BaseModel]:
    """The ``runtimes:`` section as pydantic validates it: one field per backend of `entries`
    (default: the table now), unknown ones refused."""
    fields: dict[str, Any] = {
        entry.name: (entry.config, Field(default_factory=entry.config, description=entry.summary))
        for entry in (BACKENDS.values() if entries is None else entries)
    }
    return create_model(
        "RuntimeSettings",
        __config__=ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False),
        __doc__="The ``runtimes:`` section of agent.yaml: one section per backend, each optional.",
        **fields,
    )


@functools.cache
def _in_tree_sections() -> type[BaseModel]:
    """The section of the in-tree backends (what the JSON Schema describes), made when a
    model holding `RuntimeSettings` is first built (agent.yaml's), not at import: a command
    that reads no agent.yaml (``detect``) never builds it."""
    return _sections_model(IN_TREE)


def tune_candidates(
    name: RuntimeName, config: BackendConfig, model: BundleModel, info: RuntimeInfo, variants: bool = False
) -> list[TuneCandidate]:
    """What autotune measures of `model` on the backend `name` with these settings (`Backend.
    candidates`; with `variants`, several calls in flight too), given what its probe found. A
    backend that declares none gets one: its settings as they are, on the device it names, or
    why it cannot run here; one whose list fails (a plugin's bug), one row saying why. (A
    declared list may be empty: nothing of the backend can run this artifact here, no row.)"""
    entry = backend(name)
    if entry.candidates is None:
        why = None if info.available else info.reason or "unavailable"
        return [TuneCandidate(entry.device_label(info), model.precision, config, unavailable=why)]
    try:
        found = entry.candidates(config, model, info, variants)
    except Exception as exc:  # a third-party backend's bug costs its rows, never the others'
        if name in _BUILTIN:
            raise
        why = f"its candidates failed: {type(exc).__name__}: {first_line(exc)}"
        return [TuneCandidate(entry.device_label(info), model.precision, config, unavailable=why)]
    return found


def prepare(
    name: RuntimeName,
    config: BackendConfig,
    model: BundleModel,
    on_progress: Callable[[Progress], None] = lambda progress: None,
) -> None:
    """Make `model` ready for the backend `name` to load with these settings before it is
    measured (`Backend.prepare`: TensorRT's engine, built or found); nothing for a backend that
    needs nothing. Raises `BackendError` when it cannot (a third-party backend's other errors too)."""
    entry = backend(name)
    if entry.prepare is None:
        return
    try:
        entry.prepare(config, model, on_progress)
    except Exception as exc:
        if isinstance(exc, BackendError) or name in _BUILTIN:
            raise
        why = f"{type(exc).__name__}: {first_line(exc)}"
        raise ModelLoadError(f"{name} failed to prepare {model.path.name}: {why}") from exc


def prune_caches(settings: RuntimeSettings, models: Sequence[InUse]) -> list[Path]:
    """Prune every registered backend's caches (`Backend.caches`, where `settings` put them) to
    the entries the installed versions' `models` use, each within its size bound
    (`runtimes.caches.prune`). Returns the files removed. Never raises: a cache that cannot be
    read, or a plugin's cache whose listing fails, is logged and left as it is."""
    removed: list[Path] = []
    for entry in BACKENDS.values():
        config = settings.config_for(entry.name)
        for cache in entry.caches:
            try:
                folder = cache.folder(config)
                if folder is not None:
                    removed += prune(cache, folder, models, cache.max_mb(config))
            except Exception as exc:  # OSError, or a plugin's bug: the store's gc goes on
                log.warning("cannot prune %s's %s cache: %s: %s", entry.name, cache.name, type(exc).__name__, exc)
    return removed


def probe_here(name: RuntimeName, root: Path | None = None) -> RuntimeInfo:
    """`name`'s availability probed in this process (what a probe process runs), its devices
    looked for under `root` where it reads device files (`Backend.availability_at`; None: ``/``);
    a probe that raises (a plugin's bug) reads as unavailable with the reason."""
    entry = backend(name)
    try:
        info = entry.availability() if root is None or entry.availability_at is None else entry.availability_at(root)
    except Exception as exc:  # the contract is to say why, not raise; a third-party probe may not keep it
        reason = f"its probe failed: {type(exc).__name__}: {first_line(exc)}"
        return RuntimeInfo(name=name, available=False, reason=reason)
    return info if info.name == name else dataclasses.replace(info, name=name)


@dataclass(frozen=True)
class ProbeCache:
    """Where the daemon keeps the probe's answer between starts (`runtimes.probe_cache`) and the
    agent's version, part of its key."""

    path: Path
    version: str


def available_runtimes(
    names: Iterable[RuntimeName] | None = None,
    isolated: bool = True,
    root: Path | None = None,
    cache: ProbeCache | None = None,
) -> dict[RuntimeName, RuntimeInfo]:
    """Probe the named backends' libraries, each imported in a child process once per process
    (`runtimes.isolation`: a library that crashes there is unavailable, with `crashed` set);
    unavailable ones carry the reason. `isolated=False` imports them here instead, for a
    one-shot command that loads the model in this process right after anyway. Default: every
    backend, the plugins loaded first (`load_plugins`). `root`: where the backends that drive a
    device look for it (``probe --root``, a board's fake tree; None: ``/``). `cache` (the daemon,
    isolated only): the answer of an earlier start taken from that file when nothing it depends
    on changed, else probed and written there (`runtimes.probe_cache`)."""
    if names is None:
        load_plugins()
    wanted = [backend(name).name for name in (runtime_names() if names is None else names)]
    root = None if root == Path("/") else root  # one probe of / however it is named
    if isolated:
        from runtimes.isolation import PROCESS_RUNNER, probe_isolated  # check processes: not `detect`'s

        libraries = {name: BACKENDS[name].libraries for name in wanted}
        known = PROCESS_RUNNER.known(wanted, root)  # probed in this process already (simulated devices)
        if known is not None or cache is None:
            infos = known or probe_isolated(wanted, lambda name: probe_here(name, root), libraries, root)
        else:
            from runtimes import probe_cache

            key = probe_cache.probe_key(wanted, libraries, root, cache.version, GROUP)
            cached = probe_cache.read(cache.path, key)
            if cached is not None:
                infos = cached
                PROCESS_RUNNER.remember(cached, cache.path, root)  # an activation's probe here takes it too
            else:
                infos = probe_isolated(wanted, lambda name: probe_here(name, root), libraries, root)
                probe_cache.write(cache.path, key, infos)
    else:
        infos = {name: probe_here(name, root) for name in wanted}
    for info in infos.values():
        if not info.available:
            log.info("runtime %s unavailable: %s", info.name, info.reason)
    return infos


def load_runtime(
    name: RuntimeName,
    model_path: Path,
    config: BackendConfig | None = None,
    warmup: bool = True,
    workers: int = 1,
    root: Path = Path("/"),
) -> Runtime:
    """Load `model_path` with the named backend, warmed up unless `warmup` is false (one-shot
    commands skip it); a backend that drives a device finds it under `root` (`LoadOptions`).
    Raises `RuntimeUnavailable` when the backend cannot run here and `ModelLoadError` when it
    refuses the model (a third-party backend's other exceptions too).

    TensorRT serves only an engine already in its cache (`tensorrt_backend.open_engine`); without
    one it raises `EngineNotReady` (a `RuntimeUnavailable`) and the caller builds it.

    `workers` is how many calls the caller will have in flight at once; when the ONNX Runtime
    settings leave the thread count to it (0), each call then gets an equal share of the cores
    (other backends ignore it: they serve one call at a time)."""
    entry = backend(name)
    config = config if config is not None else entry.config()
    if not isinstance(config, entry.config):
        raise TypeError(f"{name} takes a {entry.config.__name__}, got {type(config).__name__}")
    try:
        return entry.load(model_path, config, LoadOptions(warmup=warmup, workers=workers, root=root))
    except Exception as exc:
        if isinstance(exc, RuntimeUnavailable) and not isinstance(exc, tensorrt_settings.EngineNotReady):
            _distrust(entry.name, f"{entry.name} cannot run here: {first_line(exc)}")
        if isinstance(exc, BackendError) or name in _BUILTIN:
            raise
        # a third-party backend's bug refuses the model (the next runtime serves); it never stops the agent
        why = f"{type(exc).__name__}: {first_line(exc)}"
        raise ModelLoadError(f"{name} failed to load {model_path.name}: {why}") from exc


def check_load(name: RuntimeName, model_path: Path, config: BackendConfig) -> None:
    """Load and warm up `model_path` with these settings once in a child process (once per
    process, content and settings); raises `runtimes.isolation.RuntimeCrashed` when the backend's
    library killed that child. Errors the backend reports are left to the caller's own load."""
    from runtimes.isolation import RuntimeCrashed, check_load_isolated

    entry = backend(name)
    try:
        check_load_isolated(entry.name, model_path, config.model_dump_json(), entry.libraries)
    except RuntimeCrashed as exc:
        _distrust(entry.name, str(exc))
        raise


def _distrust(name: RuntimeName, why: str) -> None:
    """`name`'s library failed to load after the probe cache said it would: remove the cache
    file, so that the next start probes again (once per process: the file is gone)."""
    from runtimes.isolation import PROCESS_RUNNER  # only after a failed load

    path = PROCESS_RUNNER.distrust(name)
    if path is not None:
        from runtimes import probe_cache

        probe_cache.forget(path, why)


def load_runtime_checked(
    name: RuntimeName,
    model_path: Path,
    config: BackendConfig,
    workers: int = 1,
    warmup: bool = True,
    root: Path = Path("/"),
) -> Runtime:
    """`load_runtime` (warmed up unless `warmup` is false; its device under `root`), once a child
    process has loaded and warmed up the same model with the same settings without dying
    (`check_load`). Raises `runtimes.isolation.RuntimeCrashed` when that child died, else as
    `load_runtime`."""
    check_load(name, model_path, config)
    return load_runtime(name, model_path, config, warmup=warmup, workers=workers, root=root)
