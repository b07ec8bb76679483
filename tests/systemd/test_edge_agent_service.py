"""`systemd/edge-agent.service`: `systemd-analyze verify` and `security`, notify with a watchdog, a
user, the devices."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from testkit import REPO
from testkit.needs import missing

UNIT = REPO / "systemd" / "edge-agent.service"


SYSTEMD_ANALYZE = shutil.which("systemd-analyze") or ""


@pytest.fixture
def systemd_analyze() -> str:
    if not SYSTEMD_ANALYZE:
        missing("systemd", "systemd-analyze is missing (apt-get install systemd)")
    return SYSTEMD_ANALYZE


def unit_settings() -> dict[str, list[str]]:
    """Every ``Key=value`` of the unit's [Service] section, repeated keys in order."""
    settings: dict[str, list[str]] = {}
    section = None
    for line in UNIT.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_systemd_analyze_verify_passes(tmp_path: Path, systemd_analyze: str) -> None:
    """The unit as it is in the repository. Its ExecStart, /opt/edge-agent/venv/bin/edge-agent,
    exists on a device, not here: in a private mount namespace (root) a stub takes its place;
    without the right to make one, a copy naming this checkout's own edge-agent is verified."""
    stub = (
        'mount -t tmpfs tmpfs /opt && mkdir -p /opt/edge-agent/venv/bin && printf "#!/bin/sh\\n" > {0} && chmod +x {0}'
    )
    script = stub.format("/opt/edge-agent/venv/bin/edge-agent") + f" && {systemd_analyze} verify {UNIT}"
    result = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True)
    if "unshare failed" in result.stderr or "Operation not permitted" in result.stderr:
        copy = tmp_path / "edge-agent.service"
        copy.write_text(
            UNIT.read_text().replace("/opt/edge-agent/venv/bin/edge-agent", str(REPO / ".venv/bin/edge-agent"))
        )
        result = subprocess.run([systemd_analyze, "verify", str(copy)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "edge-agent.service" not in result.stderr, result.stderr  # no warning about our unit


def test_the_unit_exposure_is_at_most_2_5(systemd_analyze: str) -> None:
    result = subprocess.run(
        [systemd_analyze, "security", "--offline=yes", str(UNIT)], capture_output=True, text=True, check=False
    )
    found = re.search(r"Overall exposure level for edge-agent\.service: ([\d.]+)", result.stdout)
    assert found, result.stdout + result.stderr
    assert float(found.group(1)) <= 2.5, result.stdout


def test_the_unit_is_notify_with_a_watchdog_a_user_and_the_devices_it_needs() -> None:
    configparser.ConfigParser(strict=False).read_string(UNIT.read_text())  # well formed
    s = unit_settings()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"] and s["Restart"] == ["on-failure"]
    assert s["WatchdogSec"] and s["User"] == ["edge-agent"]
    assert set(s["SupplementaryGroups"][0].split()) == {"video", "gpio", "i2c", "render"}
    assert s["StateDirectory"] == ["edge-agent"] and s["ConfigurationDirectory"] == ["edge-agent"]
    assert s["DevicePolicy"] == ["closed"] and s["ProtectSystem"] == ["strict"] and s["CapabilityBoundingSet"] == [""]
    allowed = {value.split()[0] for value in s["DeviceAllow"]}
    assert {"char-video4linux", "char-gpiochip", "char-i2c", "/dev/nvmap", "char-drm"} <= allowed
    assert "ProcSubset" not in s, "psutil reads /proc/stat"
    assert s["ExecStart"][0].split()[1:] == ["run", "--config", "/etc/edge-agent/agent.yaml"]


def test_the_open_files_limit_leaves_a_reserve_beyond_the_page_s_bound() -> None:
    """The red team took all 1024 descriptors (systemd's soft default) with idle connections to
    the page; the page now holds at most ``status_page.max_connections``, and the unit raises the
    limit well past the most that bound allows."""
    from agent.config.models import StatusPageSection

    [limit] = unit_settings()["LimitNOFILE"]
    most = StatusPageSection.model_fields["max_connections"].metadata
    bound = max(m.le for m in most if hasattr(m, "le"))
    assert int(limit) >= 4 * bound, f"LimitNOFILE={limit} leaves too little beyond the page's {bound} connections"
