"""A pytest plugin that writes the CPU-seconds each test cost, for docs/testing.md's budget.

    scripts/test.sh -p testkit.cpu_times          # writes cpu-times.jsonl in the working directory

Each line: ``{"test": nodeid, "cpu_s": ..., "wall_s": ...}``. `cpu_s` is the user + system time of
the worker (pytest's process or an xdist worker) and of its children that ended during the test,
from its setup to its teardown: an agent, a broker or a CLI started by the test counts once
it is waited for, which its fixture does at teardown. A module- or session-scoped fixture counts
where it is set up or torn down, so read the per-folder sums rather than a single small test.
Workers append to the same file, one line per write (O_APPEND).
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Generator
from pathlib import Path

import pytest

OUTPUT = Path("cpu-times.jsonl")


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    cpu, wall = _cpu_s(), time.monotonic()
    yield
    line = json.dumps(
        {"test": item.nodeid, "cpu_s": round(_cpu_s() - cpu, 3), "wall_s": round(time.monotonic() - wall, 3)}
    )
    descriptor = os.open(OUTPUT, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(descriptor, (line + "\n").encode())
    finally:
        os.close(descriptor)
