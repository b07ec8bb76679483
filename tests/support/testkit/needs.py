"""Skips that CI may turn into failures.

A test that needs something this machine may lack (mosquitto, the COCO models, root, chromium,
systemd-analyze, gst-launch-1.0 with y4menc, ffmpeg, Debian's prometheus with promtool, Home
Assistant core in build/ha-env, qemu and debootstrap for the booted VM, Apache TVM, rknn-toolkit2's
own venv) calls
`missing(what, reason)`: it skips, unless `what` is listed in the ``EDGE_AGENT_REQUIRE``
environment variable (comma-separated, or ``all``), where it fails instead. `.ci/run` lists what
CI installs, so a CI run cannot pass with those tests silently skipped.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

#: every name passed to `missing`; ``EDGE_AGENT_REQUIRE=all`` requires them all
NEEDS = (
    "mosquitto",
    "mosquitto_passwd",
    "models",
    "root",
    "chromium",
    "systemd",
    "gst",
    "ffmpeg",
    "prometheus",
    "home_assistant",
    "vm",
    "tvm",
    "rknn",
)


def required() -> set[str]:
    """The needs this run must have (``EDGE_AGENT_REQUIRE``); unknown names are an error."""
    names = {n.strip() for n in os.environ.get("EDGE_AGENT_REQUIRE", "").split(",") if n.strip()}
    if "all" in names:
        return set(NEEDS)
    unknown = names - set(NEEDS)
    if unknown:
        raise pytest.UsageError(f"EDGE_AGENT_REQUIRE names {sorted(unknown)}; known: all, {', '.join(NEEDS)}")
    return names


def missing(what: str, reason: str) -> NoReturn:
    """Skip the calling test because `what` is missing, or fail it where it is required."""
    assert what in NEEDS, what
    if what in required():
        pytest.fail(f"{reason}; EDGE_AGENT_REQUIRE says this run must have {what}", pytrace=False)
    pytest.skip(reason)
