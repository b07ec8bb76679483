"""An agent bundle's deployment on the device: the fleet's way to ``edge-agent upgrade``
(docs/fleet.md#agent-updates), run by the deployer in its thread.

The deployer hands over a downloaded bundle whose manifest says ``kind: agent``. `verify`
unpacks it with the signature checked first against the device's trust keys (never unsigned:
an agent bundle is code, whatever ``allow_unsigned`` says for models), then checks the target
the manifest declares against this device (`target_problem`, naming both) and every wheel's
own tags. The deployer then installs it the way ``edge-agent upgrade`` does
(`agent_env.install_update`) and switches with the deployment's id in ``agents/switch.json``::

    VERIFYING -> INSTALLING -> ACTIVATING (switch) -> PROBATION -> SUCCEEDED
                                                               | FAILED -> ROLLED_BACK

From the switch on, the deployment's end is not this process's to decide: the new version
confirms itself (agent_switch.Probation) or is switched back (its probation, or the launcher
after `MAX_STARTS` starts). Whichever process runs next reads the deployment record (kind
agent, ACTIVATING or PROBATION: `Store.recover` leaves it alone) and the switch record, and
`settle` ends the deployment as the switch ended.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from agent.bundles.agent_bundle import unpack_agent
from agent.bundles.archive import Limits
from agent.bundles.manifest import AgentManifest
from agent.bundles.record import Deployment, State
from agent.bundles.wheels import platform_fits, python_version
from agent.deployment.agent_env import AgentUpdateError, check_wheels
from agent.deployment.agent_switch import AgentDirs
from agent.errors import BundleError, ErrorCode
from agent.mqtt.protocol import Desired

#: the states in which an agent deployment waits for the switch to end (the switch happened, or was about to)
SWITCHING = frozenset({State.ACTIVATING, State.PROBATION})


def target_problem(
    manifest: AgentManifest, python: tuple[int, int] | None = None, machine: str | None = None
) -> AgentUpdateError | None:
    """Why the bundle's declared target is not this device (`python`, `machine`: this
    interpreter's and this machine's by default), both named; None when it fits."""
    major, minor = python or sys.version_info[:2]
    arch = (machine or platform.machine()).lower()
    wanted = python_version(manifest.python)
    if (wanted is None and major != 3) or (wanted is not None and wanted != (major, minor)):
        return AgentUpdateError(
            ErrorCode.AGENT_UPDATE_WRONG_PYTHON,
            f"this agent bundle (edge-agent {manifest.version}) is for {manifest.python}; "
            f"this device runs Python {major}.{minor}",
        )
    if not platform_fits(manifest.arch, arch):
        return AgentUpdateError(
            ErrorCode.AGENT_UPDATE_WRONG_ARCHITECTURE,
            f"this agent bundle (edge-agent {manifest.version}) is for {manifest.arch}; this device is {arch}",
        )
    return None


def verify(
    bundle: Path,
    staging: Path,
    limits: Limits,
    trusted: Sequence[Ed25519PublicKey],
    python: tuple[int, int] | None = None,
    machine: str | None = None,
) -> tuple[AgentManifest, list[Path]]:
    """Unpack the agent bundle into the empty folder `staging` (signature first) and check it
    fits this device; its manifest and wheels. `BundleError` (`AgentUpdateError`) else."""
    manifest, _ = unpack_agent(bundle, staging, limits, trusted)
    problem = target_problem(manifest, python, machine)
    if problem is not None:
        raise problem
    wheels = [staging / wheel.path for wheel in manifest.wheels]
    carried = check_wheels(wheels, python, machine)  # each wheel's own tags, and one edge-agent wheel
    if carried != manifest.version:
        reason = f"the manifest says edge-agent {manifest.version}, its wheel is {carried}"
        raise AgentUpdateError(ErrorCode.AGENT_UPDATE_MALFORMED, reason)
    return manifest, wheels


def downgrade_allowed(desired: Desired, back_to_group: bool) -> bool:
    """Whether `desired` may install an older edge-agent: as for model bundles (its
    ``allow_downgrade``, or a release handing the device back to its group's version), and only
    when an operator signed it: an older version is older code, with the holes since fixed, and
    a document replayed on a broker without signed control must not send the fleet back to it."""
    return desired.signature is not None and (desired.allow_downgrade or back_to_group)


def settle(record: Deployment, dirs: AgentDirs) -> Deployment | None:
    """The agent deployment `record` (ACTIVATING or PROBATION) moved to its end as the switch
    record says; None while the switch is pending (the new version is on its probation)."""
    switch = dirs.record()
    ours = (
        switch is not None
        and switch.version == record.version
        and switch.deployment in (record.id, "")  # "": a launcher older than the field rewrote it
    )
    if switch is None or not ours:
        error = BundleError(ErrorCode.INTERRUPTED, f"the agent stopped before it switched to {record.version}")
        return record.to(State.FAILED, error)
    if switch.state == "pending":
        return None
    if switch.state == "confirmed":
        return record.to(State.SUCCEEDED)
    reason = switch.reason or f"edge-agent {record.version} was switched back"
    return record.to(State.FAILED, BundleError(ErrorCode.AGENT_UPDATE_ROLLED_BACK, reason)).to(State.ROLLED_BACK)
