"""An agent update's wheels checked against the device's Python and architecture before anything
is installed (installing them: tests/e2e/test_agent_update.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.deployment.agent_env import BASE_PTH, AgentUpdateError, base_site_packages, check_wheels

AGENT = "edge_agent-0.3.0-py3-none-any.whl"


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ([AGENT], "0.3.0"),
        ([AGENT, "numpy-2.1.0-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"], "0.3.0"),
        ([AGENT, "pyyaml-6.0-py2.py3-none-any.whl"], "0.3.0"),
        ([AGENT, "numpy-2.1.0-cp310-cp310-manylinux_2_17_aarch64.whl"], "AGENT_UPDATE_WRONG_PYTHON"),
        ([AGENT, "numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.whl"], "AGENT_UPDATE_WRONG_ARCHITECTURE"),
        (["edge_agent-0.3.0-py2-none-any.whl"], "AGENT_UPDATE_WRONG_PYTHON"),
        (["numpy-2.1.0-cp311-cp311-manylinux_2_17_aarch64.whl"], "AGENT_UPDATE_MALFORMED"),
        ([AGENT, "edge_agent-0.3.1-py3-none-any.whl"], "AGENT_UPDATE_MALFORMED"),
        (["edge_agent-latest-py3-none-any.whl"], "AGENT_UPDATE_MALFORMED"),
        (["edge-agent.tar.gz"], "AGENT_UPDATE_MALFORMED"),
    ],
)
def test_wheels_must_fit_this_python_and_architecture(names: list[str], expected: str) -> None:
    wheels = [Path(name) for name in names]
    if expected.startswith("AGENT_"):
        with pytest.raises(AgentUpdateError) as raised:
            check_wheels(wheels, python=(3, 11), machine="aarch64")
        assert raised.value.code.value == expected
    else:
        assert check_wheels(wheels, python=(3, 11), machine="aarch64") == expected


def test_a_new_environment_layers_on_the_installed_one_never_on_another_layer(tmp_path: Path) -> None:
    import sysconfig

    base, layered = tmp_path / "venv", tmp_path / "agents" / "0.3.0"
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(base), "platbase": str(base)}))
    assert base_site_packages(base) == purelib, "the installed environment: its own site-packages"
    own = Path(sysconfig.get_path("purelib", vars={"base": str(layered), "platbase": str(layered)}))
    own.mkdir(parents=True)
    (own / BASE_PTH).write_text(f"{purelib}\n")
    assert base_site_packages(layered) == purelib, "an agent version's: the one it layers on"
