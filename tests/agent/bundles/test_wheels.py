"""Wheels' tags against a declared target (`bundle build --agent`'s check)."""

from __future__ import annotations

import pytest

from agent.bundles.wheels import fits_target, wheel_tags

AGENT = "edge_agent-0.3.0-py3-none-any.whl"
NUMPY_ARM = "numpy-2.1.0-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"


@pytest.mark.parametrize(
    ("name", "python", "arch", "misfit"),
    [
        (AGENT, "py3", "any", None),
        (AGENT, "cp311", "aarch64", None),
        ("pyyaml-6.0-py2.py3-none-any.whl", "py3", "any", None),
        (NUMPY_ARM, "cp311", "aarch64", None),
        (NUMPY_ARM, "py3", "aarch64", "python"),  # a CPython 3.11 wheel in a bundle for any Python 3
        (NUMPY_ARM, "cp310", "aarch64", "python"),
        (NUMPY_ARM, "cp311", "x86_64", "arch"),
        (NUMPY_ARM, "cp311", "any", "arch"),  # native code in a bundle for any architecture
        ("edge_agent-0.3.0-py2-none-any.whl", "py3", "any", "python"),
    ],
)
def test_a_wheel_fits_the_target_its_bundle_declares(name: str, python: str, arch: str, misfit: str | None) -> None:
    tags = wheel_tags(name)
    assert tags is not None
    found = fits_target(tags, python, arch)
    assert (found[0] if found else None) == misfit, found
    if found is not None:
        assert python in found[1] or arch in found[1] or "any" in found[1], "the target is named"


def test_wheel_names() -> None:
    agent = wheel_tags(AGENT)
    assert agent is not None and agent.is_agent and agent.version == "0.3.0"
    numpy = wheel_tags(NUMPY_ARM)
    assert numpy is not None and not numpy.is_agent and numpy.platforms[-1] == "manylinux2014_aarch64"
    assert wheel_tags("edge-agent.tar.gz") is None
