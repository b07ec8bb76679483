"""The child process of `runtimes.isolation`: imports a backend's library, or loads one model,
where a crash cannot take the agent with it.

``python -m runtimes.isolation_child probe NAME...`` answers, for each backend in turn,
``{"probing": NAME}`` then ``{"info": RuntimeInfo}``; ``... load NAME MODEL SETTINGS_JSON``
answers ``{"loading": NAME}`` then ``{"loaded": [input shapes]}`` or ``{"error": type, "message"}``
(a load error the backend reports; the parent's own load reports it again). Every answer is one
line on stdout starting with `RECORD_PREFIX`; the first is ``{"ready": true}``, once this
module's own imports worked. Anything else written to stdout (native libraries print) goes to
stderr. One thread; no core dumps (a library crashing at every start must not fill the disk).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from runtimes.base import BackendError, RuntimeName
from runtimes.isolation import RECORD_PREFIX
from runtimes.registry import BACKENDS, RUNTIME_NAMES, load_runtime, probe_here


def _answer(out: TextIO, record: dict[str, Any]) -> None:
    out.write(RECORD_PREFIX + json.dumps(record) + "\n")
    out.flush()


def _runtime(name: str) -> RuntimeName:
    """A backend of the table (in-tree or a plugin, found as the agent found them: this child
    runs the same Python with the same environment)."""
    if name in BACKENDS:
        return name
    raise SystemExit(f"unknown runtime {name!r}; known: {', '.join(RUNTIME_NAMES)}")


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
        for name in map(_runtime, argv[1:]):
            _answer(out, {"probing": name})
            _answer(out, {"info": asdict(probe_here(name))})
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
    print("usage: python -m runtimes.isolation_child probe NAME... | load NAME MODEL SETTINGS_JSON", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
