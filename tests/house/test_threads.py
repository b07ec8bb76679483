"""One thread owner: every thread of `agent`, `pipelines` and `runtimes` is started by
`pipelines.worker.Worker`, so each one survives a failed turn, stops by a deadline and is
reported when it does not. The check reads the sources (`ast`), imports nothing of the package,
and is run on planted sources too (the last test), so a check that can no longer fail fails there.

Not ours, so not found here: the threads of paho's network loop, uvicorn's server and the
page's blocking handlers (``anyio.to_thread``), ONNX Runtime's and OpenCV's pools.
"""

from __future__ import annotations

import ast

from testkit import REPO

PACKAGES = ("agent", "pipelines", "runtimes")
WORKER = REPO / "pipelines" / "worker.py"
#: modules allowed a thread pool of their own, and why
POOLS = {
    REPO / "agent" / "daemon" / "simulation.py": "many simulated agents in one process (bench/fleet_sim.py and "
    "the rollout tests): a pool whose every task ends, joined by its `with` block",
}
#: what starts a thread: ``threading.Thread``, ``Timer``, a pool, ``_thread``'s own start
STARTERS = frozenset({"Thread", "Timer", "ThreadPoolExecutor", "start_new_thread", "start_joinable_thread"})


def thread_starts(tree: ast.Module) -> list[int]:
    """The lines that name a thread starter: called, subclassed or imported (``threading.Thread``,
    ``Thread`` from threading, ``concurrent.futures.ThreadPoolExecutor``, ``_thread.start_new_thread``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in STARTERS:
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom):
            found += [node.lineno for alias in node.names if alias.name in STARTERS]
    return sorted(set(found))


def test_only_the_worker_starts_threads() -> None:
    offenders = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path == WORKER or path in POOLS:
                continue
            lines = thread_starts(ast.parse(path.read_text(), filename=str(path)))
            offenders += [f"{path.relative_to(REPO)}:{line}" for line in lines]
    assert offenders == [], (
        "threads started outside pipelines.worker.Worker (use a Worker, or Worker.once for a job):\n"
        + "\n".join(offenders)
    )
    assert thread_starts(ast.parse(WORKER.read_text())), "the worker itself starts its thread with threading.Thread"


def test_the_check_finds_each_way_to_start_a_thread() -> None:
    cases = {
        "import threading\nthreading.Thread(target=f).start()\n": [2],
        "from threading import Thread\n": [1],
        "import threading\nclass T(threading.Thread):\n    pass\n": [2],
        "import threading\nthreading.Timer(1.0, f).start()\n": [2],
        "from concurrent.futures import ThreadPoolExecutor\n": [1],
        "import concurrent.futures as cf\ncf.ThreadPoolExecutor(2)\n": [2],
        "import _thread\n_thread.start_new_thread(f, ())\n": [2],
        "import threading\nthreading.Event().wait(1)\nthreading.current_thread().name\n": [],
        "worker = Worker('x', turn, described='x', budget_s=None).start()\n": [],
    }
    for source, lines in cases.items():
        assert thread_starts(ast.parse(source)) == lines, source
