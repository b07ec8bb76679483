"""The child process of `runtimes.isolation`: imports a backend's library, or loads one model,
where a crash cannot take the agent with it.

``python -m runtimes.isolation_child probe [--root ROOT] NAME...`` answers, for each backend in turn
(its devices looked for under ROOT: `runtimes.registry.probe_here`),
``{"probing": NAME}`` then ``{"info": RuntimeInfo}``; ``... load NAME MODEL SETTINGS_JSON``
answers ``{"loading": NAME}`` then ``{"loaded": [input shapes]}`` or ``{"error": type, "message"}``
(a load error the backend reports; the parent's own load reports it again); ``... plugins
NAME=MODULE:ATTRIBUTE...`` imports each runtime plugin's entry point in turn, answering
``{"importing": [NAME, TARGET]}`` then ``{"imported": [...]}`` or ``{"refused": [...], "why"}``
(whatever it raised, a `BaseException` too). Every answer is one
line on stdout starting with `RECORD_PREFIX`; the first is ``{"ready": true}``, once this
module's own imports worked. Anything else written to stdout (native libraries print) goes to
stderr. One thread; no core dumps (a library crashing at every start must not fill the disk).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from runtimes.base import BackendError, RuntimeName, first_line
from runtimes.isolation import RECORD_PREFIX
from runtimes.registry import BACKENDS, GROUP, load_plugins, load_runtime, probe_here, runtime_names


def _answer(out: TextIO, record: dict[str, Any]) -> None:
    out.write(RECORD_PREFIX + json.dumps(record) + "\n")
    out.flush()


def _runtime(name: str) -> RuntimeName:
    """A backend of the table (in-tree or a plugin, found as the agent found them: this child
    runs the same Python with the same environment; a plugin imported here, the parent having
    vetted it)."""
    if name not in BACKENDS:
        load_plugins(isolated=False, names=[name])
    if name in BACKENDS:
        return name
    raise SystemExit(f"unknown runtime {name!r}; known: {', '.join(runtime_names())}")


def _import_plugins(out: TextIO, points: list[str]) -> None:
    for point in points:
        name, _, target = point.partition("=")
        _answer(out, {"importing": [name, target]})
        try:
            metadata.EntryPoint(name, target, GROUP).load()
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: a plugin may raise anything
            why = f"importing {target} failed: {type(exc).__name__}: {first_line(exc)}"
            _answer(out, {"refused": [name, target], "why": why})
            continue
        _answer(out, {"imported": [name, target]})


def main(argv: list[str]) -> int:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints (ours or a library's) cannot be mistaken for answers
    sys.stdout = sys.stderr
    _answer(out, {"ready": True})
    if len(argv) >= 1 and argv[0] == "probe":
        names, root = argv[1:], None
        if names[:1] == ["--root"] and len(names) >= 2:
            names, root = names[2:], Path(names[1])
        for name in map(_runtime, names):
            _answer(out, {"probing": name})
            _answer(out, {"info": asdict(probe_here(name, root))})
        return 0
    if len(argv) >= 1 and argv[0] == "plugins":
        _import_plugins(out, argv[1:])
        return 0
    if len(argv) == 4 and argv[0] == "load":
        name, model, settings = _runtime(argv[1]), Path(argv[2]), argv[3]
        _answer(out, {"loading": name})
        try:
            config = BACKENDS[name].config.model_validate_json(settings)
            with load_runtime(name, model, config, warmup=True) as runtime:
                _answer(out, {"loaded": [list(spec.shape) for spec in runtime.inputs]})
        except (BackendError, ValueError) as exc:  # ValueError: settings pydantic refused
            _answer(out, {"error": type(exc).__name__, "message": str(exc)})
        return 0
    usage = "probe NAME... | load NAME MODEL SETTINGS_JSON | plugins NAME=TARGET..."
    print(f"usage: python -m runtimes.isolation_child {usage}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
