"""An agent bundle's deployment on the device: its declared target against this device, and its
end read from the switch record by whichever process runs next (the whole path over MQTT:
tests/e2e/test_agent_update.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.bundles.agent_bundle import build_agent_bundle
from agent.bundles.archive import Limits
from agent.bundles.manifest import AgentManifest, WheelEntry
from agent.bundles.record import Deployment, State
from agent.bundles.signing import load_private_key, load_public_key
from agent.deployment.agent_deploy import settle, target_problem, verify
from agent.deployment.agent_switch import AgentDirs, SwitchRecord
from agent.errors import BundleError


def manifest(python: str, arch: str) -> AgentManifest:
    wheel = WheelEntry(path="edge_agent-0.3.0-py3-none-any.whl", sha256="0" * 64, size=1)
    return AgentManifest(
        schema_version=1, kind="agent", version="0.3.0", created="now", python=python, arch=arch, wheels=[wheel]
    )


@pytest.mark.parametrize(
    ("python", "arch", "code"),
    [
        ("py3", "any", None),
        ("cp311", "aarch64", None),
        ("py311", "aarch64", None),
        ("cp310", "aarch64", "AGENT_UPDATE_WRONG_PYTHON"),
        ("cp312", "any", "AGENT_UPDATE_WRONG_PYTHON"),
        ("py3", "x86_64", "AGENT_UPDATE_WRONG_ARCHITECTURE"),
        ("cp311", "riscv64", "AGENT_UPDATE_WRONG_ARCHITECTURE"),
    ],
)
def test_the_bundles_target_must_be_this_device(python: str, arch: str, code: str | None) -> None:
    problem = target_problem(manifest(python, arch), python=(3, 11), machine="aarch64")
    assert (problem.code.value if problem else None) == code
    if problem is not None:  # both named: what the bundle is for, what the device is
        wanted = python if "PYTHON" in code else arch  # type: ignore[operator]
        assert wanted in problem.message and ("3.11" in problem.message or "aarch64" in problem.message)


def test_verify_refuses_a_bundle_for_another_architecture_after_its_signature(
    tmp_path: Path, keys: dict[str, Path]
) -> None:
    wheel = tmp_path / "edge_agent-0.3.0-py3-none-any.whl"
    wheel.write_bytes(b"a wheel")
    bundle = tmp_path / "agent.bundle"
    build_agent_bundle([wheel], bundle, load_private_key(keys["private"]), arch="riscv64")
    trusted = [load_public_key(keys["public"])]
    (tmp_path / "a").mkdir()
    with pytest.raises(BundleError) as raised:
        verify(bundle, tmp_path / "a", Limits(), trusted, python=(3, 11), machine="x86_64")
    assert raised.value.code.value == "AGENT_UPDATE_WRONG_ARCHITECTURE"
    (tmp_path / "b").mkdir()
    found, wheels = verify(bundle, tmp_path / "b", Limits(), trusted, python=(3, 11), machine="riscv64")
    assert found.version == "0.3.0" and wheels == [tmp_path / "b" / wheel.name]


def switched(state: str, version: str = "0.3.0", deployment: str = "d1", reason: str = "") -> SwitchRecord:
    return SwitchRecord(version=version, previous=None, state=state, starts=1, reason=reason, deployment=deployment)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("switch", "ends", "code"),
    [
        (switched("pending"), None, None),  # the new version is on its probation
        (switched("confirmed"), State.SUCCEEDED, None),
        (
            switched("rolled_back", reason="0.3.0 did not confirm within 3 starts"),
            State.ROLLED_BACK,
            "AGENT_UPDATE_ROLLED_BACK",
        ),
        (switched("confirmed", deployment=""), State.SUCCEEDED, None),  # an older launcher dropped the id
        (switched("confirmed", deployment="d0"), State.FAILED, "INTERRUPTED"),  # an earlier deployment's switch
        (switched("confirmed", version="0.2.9"), State.FAILED, "INTERRUPTED"),  # killed before it switched
        (None, State.FAILED, "INTERRUPTED"),
    ],
)
def test_the_deployment_ends_as_its_switch_ended(
    tmp_path: Path, switch: SwitchRecord | None, ends: State | None, code: str | None
) -> None:
    dirs = AgentDirs(tmp_path / "state", tmp_path / "venv")
    if switch is not None:
        dirs.root.mkdir(parents=True)
        dirs.write(switch)
    record = Deployment(id="d1", sha256="1" * 64, name="edge-agent", version="0.3.0", kind="agent")
    record = record.to(State.VERIFYING).to(State.INSTALLING).to(State.ACTIVATING).to(State.PROBATION)
    ended = settle(record, dirs)
    assert (ended.state if ended else None) == ends
    assert (ended.error.code if ended and ended.error else None) == code
    if code == "AGENT_UPDATE_ROLLED_BACK":
        assert ended is not None and ended.error is not None and "within 3 starts" in ended.error.message


@pytest.mark.parametrize(
    ("signed", "allow", "back_to_group", "allowed"),
    [
        (True, True, False, True),
        (True, False, True, True),  # a release hands the device back to its group's (older) version
        (True, False, False, False),
        (False, True, False, False),  # a replay on a broker without signed control sends no one back
        (False, False, True, False),
    ],
)
def test_an_older_agent_only_from_a_signed_document_that_allows_it(
    keys: dict[str, Path], signed: bool, allow: bool, back_to_group: bool, allowed: bool
) -> None:
    from testkit.control import desired

    from agent.deployment.agent_deploy import downgrade_allowed
    from agent.mqtt.control import sign

    document = desired(name="edge-agent", version="0.1.0", allow_downgrade=allow)
    if signed:
        document = sign(document, load_private_key(keys["operator"]), "device:cam-1")
    assert downgrade_allowed(document, back_to_group) is allowed
