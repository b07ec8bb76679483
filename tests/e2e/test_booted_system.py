"""The agent on a booted Debian 12 VM (`scripts/vm_test.sh --json`): every named check true.

Marked `vm` and left out of the default run (pyproject.toml's addopts): under emulation (no
usable KVM) it takes about 20 minutes. Run it with ``pytest -m vm tests/e2e/test_booted_system.py``;
`.ci/run` runs it after the suite, under KVM where a guest boots and emulated elsewhere
(docs/testing.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from testkit import REPO
from testkit.needs import missing

pytestmark = pytest.mark.vm

#: the checks scripts/vm_test.py runs, in order (docs/service.md: what was seen on a booted system)
CHECKS = (
    "install",
    "ready",
    "detect_runtimes",
    "push_probation",
    "v4l2_camera",
    "reload_broken",
    "reload_good",
    "rollback",
    "watchdog_sigstop",
    "kill9",
    "enrol_claim",
    "agent_update",
    "reboot",
    "agent_rollback",
    "security",
    "journal_clean",
    "uninstall",
)


def test_every_check_passes_on_a_booted_debian_vm() -> None:
    for tool in (
        "qemu-system-x86_64",
        "qemu-img",
        "debootstrap",
        "mkfs.ext4",
        "ssh",
        "mosquitto_ctrl",
        "mosquitto_pub",
    ):
        if shutil.which(tool) is None:
            missing(
                "vm",
                f"{tool} is missing (apt-get install qemu-system-x86 qemu-utils debootstrap openssh-client "
                "mosquitto-clients)",
            )
    if os.geteuid() != 0:
        missing("vm", "debootstrap builds the VM's image as root")
    done = subprocess.run(
        [str(REPO / "scripts/vm_test.sh"), "--arch", "amd64", "--json"],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert done.stdout.strip(), done.stderr[-5000:]
    result = json.loads(done.stdout)
    assert tuple(result["checks"]) == CHECKS, done.stderr[-3000:]
    failed = {name: check for name, check in result["checks"].items() if check["ok"] is not True}
    assert not failed, json.dumps(failed, indent=2)
    assert result["ok"] is True and done.returncode == 0
    assert result["checks"]["security"]["exposure"] <= 2.0
    assert (
        result["checks"]["watchdog_sigstop"]["nrestarts_after"]
        >= result["checks"]["watchdog_sigstop"]["nrestarts_before"] + 1
    )
    # the update survives the reboot, and the broken one after it ends on the same version
    updated = result["checks"]["agent_update"]["to"]
    assert result["checks"]["reboot"]["agent_version"] == updated
    assert result["checks"]["agent_rollback"]["back_on"] == updated
