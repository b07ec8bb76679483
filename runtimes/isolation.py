"""Native runtime libraries probed, runtime plugins first imported, and models first loaded, in a
child process.

A native library can kill the process that imports it: a wheel built for another CPU (SIGILL on
an older core), a JetPack / wheel mismatch, a bug hit under emulation (SIGSEGV). So the agent
never imports a backend's library, nor loads an artifact for the first time, in its own
process: a short-lived child (``python -m runtimes.isolation_child``) does it and answers with
one JSON record per step on its stdout. A child that dies before answering for a backend (by a
signal, or by exiting) marks that backend unavailable (`ChildRunner.probe`) or that artifact as
one that crashes its runtime (`RuntimeCrashed` from `ChildRunner.check_load`), naming how it
died and the library's version; the caller carries on with the other backends. Runtime plugins
(third-party code run at import) are imported there first (`ChildRunner.vet_plugins`, within a
time limit): one that raises, dies or hangs is refused with the reason, and the registry never
imports it in the agent's process.

Threads: every method may be called from any thread. Results are memoised per `ChildRunner`
under its lock (what imports here cannot change while the process runs): `PROCESS_RUNNER`, the
one the registry uses, probes each backend once per process start and checks each artifact's
content (SHA-256, hashed once per path, size and mtime) with each settings once, so that the
byte-identical copies in the stores of many simulated devices in one process
(`agent.daemon.simulation`) take one child, not one each. Invariants: this module never imports a backend's library;
a child that cannot start at all (`IsolationUnavailable`) is the caller's to handle.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from importlib import metadata
from pathlib import Path
from typing import Any

from runtimes.base import BackendError, RuntimeInfo, RuntimeName
from runtimes.files import sha256_file

log = logging.getLogger(__name__)

#: prefix of the child's answer lines (its other output goes to stderr)
RECORD_PREFIX = "edge-agent-child: "
CHILD_MODULE = "runtimes.isolation_child"
PROBE_TIMEOUT_S = 120.0
#: a first load may build a TensorRT engine (minutes on a Jetson)
LOAD_TIMEOUT_S = 1800.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


class IsolationUnavailable(BackendError):
    """The child process could not start or died before it began (no interpreter, a broken
    environment): nothing is known about the backends."""


class RuntimeCrashed(BackendError):
    """A backend's library killed the process that loaded a model with it (checked in a child,
    so the agent itself lives on). `how` is e.g. ``"SIGSEGV"`` or ``"exit status 1"``."""

    def __init__(self, runtime: str, model: Path, how: str, library: str) -> None:
        super().__init__(
            f"{library} crashed ({how}) while loading {model.name} in a check process; the agent did not load it. "
            f"Check that this {runtime} build is made for this device and Python, or use another runtime or artifact"
        )
        self.runtime, self.model, self.how, self.library = runtime, model, how, library


@dataclass(frozen=True)
class ChildResult:
    """What one child run left: its answer records in order, how it ended (`returncode`, None
    when it was killed after `timeout_s`) and the end of its stderr (for the log)."""

    records: tuple[dict[str, Any], ...]
    returncode: int | None
    stderr_tail: str

    @property
    def ended(self) -> str:
        """How the child ended, for people: ``"SIGSEGV"``, ``"exit status 3"``, ``"timeout"``."""
        return exit_description(self.returncode)


def exit_description(returncode: int | None) -> str:
    """``"SIGSEGV"`` for -11, ``"exit status 1"`` for 1, ``"timeout"`` for None."""
    if returncode is None:
        return "timeout"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit status {returncode}"


def library_version(modules: Sequence[str]) -> str:
    """The installed distribution(s) of a library with version, by its top-level `modules`
    (`runtimes.base.Backend.libraries`), e.g. ``"onnxruntime 1.32.0"`` or ``"onnxruntime-gpu
    1.17.0"``, read from package metadata without importing it; the first module's name when no
    distribution provides one."""
    providers = metadata.packages_distributions()
    found = []
    for module in modules:
        for dist in providers.get(module, []):
            try:
                found.append(f"{dist} {metadata.version(dist)}")
            except metadata.PackageNotFoundError:
                continue
    return ", ".join(dict.fromkeys(found)) or f"{modules[0]} (version unknown)"


def _version_only(library: str) -> str | None:
    """``"1.32.0"`` from ``"onnxruntime 1.32.0"``; None when unknown."""
    first = library.split(", ")[0]
    return None if first.endswith("(version unknown)") else first.rsplit(" ", 1)[-1]


class ChildRunner:
    """Starts the child processes and memoises what they found.

    `python` is the command that starts this Python (default ``[sys.executable]``; a wrapper
    works too, e.g. an emulator's); `env` the child's environment (default: this process's).
    The directory holding the `runtimes` package is appended to the child's ``PYTHONPATH`` so
    it runs this same code.
    """

    def __init__(
        self,
        python: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        load_timeout_s: float = LOAD_TIMEOUT_S,
    ) -> None:
        self._python = list(python) if python else [sys.executable]
        self._env = dict(env) if env is not None else None
        self.probe_timeout_s, self.load_timeout_s = probe_timeout_s, load_timeout_s
        self._lock = threading.Lock()
        self._infos: dict[str | None, dict[RuntimeName, RuntimeInfo]] = {}  # by the root probed (None: /)
        self._loads: dict[tuple[str, ...], RuntimeCrashed | None] = {}  # by (runtime, SHA-256, settings)
        self._digests: dict[tuple[str, ...], str] = {}  # SHA-256 by (path, size, mtime)
        self._cached_in: dict[RuntimeName, Path] = {}  # the probe cache file an answer was taken from

    # -- running a child -----------------------------------------------------------------------

    def run(self, args: Sequence[str], timeout_s: float) -> ChildResult:
        """Run ``python -m runtimes.isolation_child ARGS`` and collect its records; raises
        `IsolationUnavailable` when it cannot be started."""
        if not self._python[0]:
            raise IsolationUnavailable("this Python does not know its own interpreter (sys.executable is empty)")
        env = dict(os.environ if self._env is None else self._env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), _PACKAGE_ROOT) if p)
        command = [*self._python, "-X", "faulthandler", "-m", CHILD_MODULE, *args]
        try:
            done = subprocess.run(command, capture_output=True, env=env, timeout=timeout_s, stdin=subprocess.DEVNULL)
            stdout, stderr, returncode = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            stdout, stderr, returncode = _bytes(exc.stdout), _bytes(exc.stderr), None
        except OSError as exc:
            raise IsolationUnavailable(f"cannot start {self._python[0]}: {exc.strerror or exc}") from exc
        records = []
        for line in stdout.decode(errors="replace").splitlines():
            if line.startswith(RECORD_PREFIX):
                try:
                    records.append(json.loads(line[len(RECORD_PREFIX) :]))
                except json.JSONDecodeError:
                    continue
        return ChildResult(tuple(records), returncode, stderr.decode(errors="replace")[-2000:])

    def _started(self, result: ChildResult) -> None:
        if not any("ready" in record for record in result.records):
            raise IsolationUnavailable(
                f"the check process ended ({result.ended}) before it started: {result.stderr_tail.strip()[-300:]}"
            )

    # -- probing libraries ---------------------------------------------------------------------

    def probe(
        self,
        names: Iterable[RuntimeName],
        libraries: Mapping[RuntimeName, Sequence[str]] | None = None,
        root: Path | None = None,
    ) -> dict[RuntimeName, RuntimeInfo]:
        """Whether each named backend's library imports here, probed in child processes (one
        child for all; after a crash a new one for the rest), its devices looked for under `root`
        (None: ``/``; `runtimes.registry.probe_here`). A backend whose child died is
        unavailable with `RuntimeInfo.crashed` set, naming its library found by its top-level
        modules in `libraries` (default: the module named as the backend). Raises
        `IsolationUnavailable`."""
        wanted = list(dict.fromkeys(names))
        modules = libraries or {}
        where = [] if root is None else ["--root", str(root)]
        with self._lock:
            infos = self._infos.setdefault(None if root is None else str(root), {})
            pending = [name for name in wanted if name not in infos]
            while pending:
                result = self.run(["probe", *where, *pending], self.probe_timeout_s)
                self._started(result)
                for record in result.records:
                    if "info" in record and record["info"].get("name") in pending:
                        infos[record["info"]["name"]] = _info(record["info"])
                started = [record["probing"] for record in result.records if "probing" in record]
                culprit = next((name for name in started if name not in infos), None)
                if culprit is None:  # ended between backends: blame the next one
                    culprit = next((name for name in pending if name not in infos), None)
                if culprit is not None and culprit not in infos:
                    infos[culprit] = self._crashed_info(culprit, result, modules.get(culprit, (culprit,)))
                pending = [name for name in pending if name not in infos]
            return {name: infos[name] for name in wanted}

    def known(self, names: Iterable[RuntimeName], root: Path | None = None) -> dict[RuntimeName, RuntimeInfo] | None:
        """What `probe` found for every one of `names` under `root` in this process, without
        starting a child; None when one of them was not probed yet."""
        with self._lock:
            infos = self._infos.get(None if root is None else str(root), {})
            wanted = list(dict.fromkeys(names))
            return {name: infos[name] for name in wanted} if all(n in infos for n in wanted) else None

    def remember(self, infos: Mapping[RuntimeName, RuntimeInfo], cache_file: Path, root: Path | None = None) -> None:
        """Take `infos`, read from `cache_file` (an answer kept from the last start,
        `runtimes.probe_cache`), as what probing found under `root` in this process: the later
        probes of this process (an activation's) start no child for them, as after a probe here."""
        with self._lock:
            self._infos.setdefault(None if root is None else str(root), {}).update(infos)
            self._cached_in.update(dict.fromkeys(infos, cache_file))

    def distrust(self, name: RuntimeName) -> Path | None:
        """The probe cache file `name`'s answer was taken from (`remember`), for the caller to
        remove once that backend failed to load after all; None when the answer was not taken
        from a file, or the file was already named for this or another of its backends."""
        with self._lock:
            path = self._cached_in.get(name)
            for each in [n for n, p in self._cached_in.items() if p == path]:
                del self._cached_in[each]
            return path

    def _crashed_info(self, name: RuntimeName, result: ChildResult, modules: Sequence[str]) -> RuntimeInfo:
        library = library_version(modules)
        how = result.ended
        log.error(
            "runtime %s: %s killed its probe process (%s); carrying on without it. The probe's stderr:\n%s",
            name,
            library,
            how,
            result.stderr_tail.strip(),
        )
        if how == "timeout":
            reason = f"importing {library} did not finish within {self.probe_timeout_s:.0f} s (probe process killed)"
        else:
            reason = (
                f"{library} crashed on import ({how}) in a probe process; the agent carries on without it. "
                "Install a build of it made for this device and Python, or remove it"
            )
        return RuntimeInfo(name=name, available=False, version=_version_only(library), reason=reason, crashed=how)

    # -- plugins -------------------------------------------------------------------------------

    def vet_plugins(self, points: Sequence[tuple[str, str]], timeout_s: float) -> dict[tuple[str, str], str]:
        """Import each entry point (name, ``module:attribute``) in child processes (one for all;
        after one that dies or hangs, a new one for the rest), each child within `timeout_s`.
        Returns why each that must not be imported in this process was refused: its import
        raised (anything, `SystemExit` too), killed the child or did not return. Not memoised
        (the registry loads plugins once). Raises `IsolationUnavailable`."""
        refused: dict[tuple[str, str], str] = {}
        pending = list(dict.fromkeys(points))
        while pending:
            result = self.run(["plugins", *(f"{name}={target}" for name, target in pending)], timeout_s)
            self._started(result)
            answered = set()
            for record in result.records:
                if "imported" in record:
                    answered.add(tuple(record["imported"]))
                elif "refused" in record:
                    point = tuple(record["refused"])
                    answered.add(point)
                    refused[point] = str(record.get("why", "its import failed"))[:500]
            started = [tuple(record["importing"]) for record in result.records if "importing" in record]
            culprit = next((point for point in started if point not in answered), None)
            if culprit is None:  # ended between plugins: blame the next one
                culprit = next((point for point in pending if point not in answered), None)
            if culprit is not None:
                name, target = culprit[0], culprit[1]
                if result.returncode is None:
                    why = f"importing {target} did not finish within {timeout_s:g} s (check process killed)"
                else:
                    why = f"importing {target} killed its check process ({result.ended})"
                log.error("runtime plugin %s: %s. The check process's stderr:\n%s", name, why, result.stderr_tail)
                refused[(name, target)] = why
                answered.add(culprit)
            pending = [point for point in pending if point not in answered]
        return refused

    # -- first loads ---------------------------------------------------------------------------

    def check_load(
        self, name: RuntimeName, model: Path, settings_json: str, libraries: Sequence[str] | None = None
    ) -> None:
        """Load `model` with backend `name` (settings as JSON) and warm it up once in a child
        (once per content and settings: a byte-identical copy elsewhere is not checked again);
        raises `RuntimeCrashed` when the child dies doing it, naming the library found by its
        top-level modules `libraries` (default: the module named as the backend). Load errors
        that the backend reports (a missing file, a refused model) are left to the caller's own
        load. Raises `IsolationUnavailable` when no child can run."""
        digest = self._digest(model)
        if digest is None:
            return  # the caller's load reports the missing file
        key = (name, digest, settings_json)
        with self._lock:
            if key not in self._loads:
                self._loads[key] = self._load_in_child(name, model, settings_json, libraries or (name,))
            crash = self._loads[key]
        if crash is not None:
            raise RuntimeCrashed(crash.runtime, model, crash.how, crash.library)

    def _digest(self, model: Path) -> str | None:
        """The SHA-256 of `model`'s bytes (hex), hashed once per path, size and mtime; the
        path, size and mtime themselves for what cannot be read as one file (a folder); None
        when it does not exist."""
        try:
            stat = model.stat()
        except OSError:
            return None
        version = (str(model.resolve()), str(stat.st_size), str(stat.st_mtime_ns))
        with self._lock:
            known = self._digests.get(version)
        if known is not None:
            return known
        try:
            found = sha256_file(model)
        except OSError:
            found = "\0".join(version)
        with self._lock:
            self._digests[version] = found
        return found

    def _load_in_child(
        self, name: RuntimeName, model: Path, settings_json: str, libraries: Sequence[str]
    ) -> RuntimeCrashed | None:
        result = self.run(["load", name, str(model), settings_json], self.load_timeout_s)
        self._started(result)
        if any("loaded" in record or "error" in record for record in result.records):
            return None
        library = library_version(libraries)
        log.error(
            "runtime %s: %s killed the process loading %s (%s). Its stderr:\n%s",
            name,
            library,
            model,
            result.ended,
            result.stderr_tail.strip(),
        )
        how = f"no answer within {self.load_timeout_s:.0f} s" if result.returncode is None else result.ended
        return RuntimeCrashed(name, model, how, library)


def _bytes(data: bytes | str | None) -> bytes:
    if data is None:
        return b""
    return data.encode() if isinstance(data, str) else data


def _info(record: Mapping[str, Any]) -> RuntimeInfo:
    known = {f.name for f in fields(RuntimeInfo)}
    values = {key: value for key, value in record.items() if key in known}
    values["devices"] = tuple(values.get("devices") or ())
    return RuntimeInfo(**values)


#: the runner of this process (the registry's): probes once per process start
PROCESS_RUNNER = ChildRunner()


def probe_isolated(
    names: Iterable[RuntimeName],
    in_process: Callable[[RuntimeName], RuntimeInfo],
    libraries: Mapping[RuntimeName, Sequence[str]] | None = None,
    root: Path | None = None,
) -> dict[RuntimeName, RuntimeInfo]:
    """`PROCESS_RUNNER.probe(names, libraries, root)`; when no child can run at all, `in_process`
    (the old way, logged as a warning) so that a broken interpreter path never leaves the agent blind."""
    wanted = list(names)
    try:
        return PROCESS_RUNNER.probe(wanted, libraries, root)
    except IsolationUnavailable as exc:
        log.warning("probing runtimes in this process (a crashing library would stop it): %s", exc)
        return {name: in_process(name) for name in wanted}


def vet_plugins_isolated(points: Sequence[tuple[str, str]], timeout_s: float) -> dict[tuple[str, str], str]:
    """`PROCESS_RUNNER.vet_plugins`; when no child can run at all, none is refused (the registry
    then imports them here, catching what they raise; a crash would stop this process: logged)."""
    try:
        return PROCESS_RUNNER.vet_plugins(points, timeout_s)
    except IsolationUnavailable as exc:
        log.warning("importing runtime plugins in this process (one that crashes would stop it): %s", exc)
        return {}


def check_load_isolated(
    name: RuntimeName, model: Path, settings_json: str, libraries: Sequence[str] | None = None
) -> None:
    """`PROCESS_RUNNER.check_load`; when no child can run at all, the check is skipped (logged)."""
    try:
        PROCESS_RUNNER.check_load(name, model, settings_json, libraries)
    except IsolationUnavailable as exc:
        log.warning("loading %s without a check process first: %s", model.name, exc)
