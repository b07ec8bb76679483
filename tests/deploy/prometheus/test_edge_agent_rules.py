"""deploy/prometheus/edge-agent.rules.yml: valid for `promtool check rules`, its unit tests
(edge-agent.rules.test.yml) pass under `promtool test rules`, every alert is seen both firing and
not firing there, and a planted bug in a rule makes those unit tests fail."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from testkit import REPO
from testkit.needs import missing

FOLDER = REPO / "deploy" / "prometheus"
RULES = FOLDER / "edge-agent.rules.yml"
UNIT_TESTS = FOLDER / "edge-agent.rules.test.yml"


def promtool(*args: str, cwd: Path = FOLDER) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        missing("prometheus", "promtool is not installed (Debian: apt-get install prometheus)")
    return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def alerts() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_checks_the_rules() -> None:
    answer = promtool("check", "rules", RULES.name)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    assert "SUCCESS: 15 rules found" in answer.stdout


def test_the_unit_tests_pass_and_see_every_alert_firing_and_not_firing() -> None:
    answer = promtool("test", "rules", UNIT_TESTS.name)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    seen: dict[str, set[bool]] = {}
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            seen.setdefault(check["alertname"], set()).add(bool(check["exp_alerts"]))
    assert set(seen) == set(alerts()), "every alert has unit tests, and only the alerts of the rules"
    assert {name: states for name, states in seen.items() if states != {True, False}} == {}, (
        "each alert is expected firing at one time and silent at another"
    )


#: (alert, the rule's text, a realistic mistake in it): each must fail the unit tests
PLANTED = [
    ("EdgeAgentDown", "for: 5m\n        labels:\n          severity: critical",
     "for: 4m\n        labels:\n          severity: critical"),
    ("EdgeAgentHot", '> ignoring(level) edge_agent_governor_threshold_celsius{level="HOT"}',
     '>= ignoring(level) edge_agent_governor_threshold_celsius{level="HOT"}'),
    ("EdgeAgentHot", '{level="HOT"}', '{level="WARM"}'),
    ("EdgeAgentBatteryLow", "edge_agent_battery_percent < 20", "edge_agent_battery_percent <= 20"),
    ("EdgeAgentBatteryLow", 'edge_agent_governor_battery=~"LOW|CRITICAL"', 'edge_agent_governor_battery=~"CRITICAL"'),
    ("EdgeAgentCameraSlow", "fps < 0.5 * quantile_over_time", "fps <= 0.5 * quantile_over_time"),
    ("EdgeAgentCameraSlow", "\n          unless on(job, instance) edge_agent_governor_fps_cap", ""),
    ("EdgeAgentCameraSlow", "0.5 * quantile_over_time(0.5, edge_agent_camera_fps[1h])",
     "0.5 * quantile_over_time(0.5, edge_agent_camera_fps[10m])"),
    ("EdgeAgentDeploymentFailed", '=~"FAILED|ROLLED_BACK"', '=~"FAILED"'),
    ("EdgeAgentVersionNotSeeing", 'shadow_outcome="disagrees"', 'shadow_outcome="agrees"'),
    ("EdgeAgentVersionNotSeeing", "\n          or edge_agent_probation", "\n          and edge_agent_probation"),
    ("EdgeAgentCameraDown", "edge_agent_camera_source_up == 0", "edge_agent_camera_source_up == 1"),
    ("EdgeAgentCameraProblem", "edge_agent_camera_problem == 1", "edge_agent_camera_problem >= 0"),
    ("EdgeAgentCameraProblem", "problem == 1\n        for: 5m", "problem == 1\n        for: 3m"),
    ("EdgeAgentDiskNearlyFull", "edge_agent_disk_free_bytes < 0.1 *", "edge_agent_disk_free_bytes <= 0.1 *"),
    ("EdgeAgentDiskNearlyFull", "0.1 * edge_agent_disk_size_bytes", "0.01 * edge_agent_disk_size_bytes"),
]  # fmt: skip


@pytest.mark.parametrize(("alert", "right", "wrong"), PLANTED, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(PLANTED)])
def test_a_planted_bug_in_a_rule_fails_the_unit_tests(tmp_path: Path, alert: str, right: str, wrong: str) -> None:
    text = RULES.read_text()
    assert text.count(right) == 1, f"the rule text to break is in {RULES.name} once"
    (tmp_path / RULES.name).write_text(text.replace(right, wrong))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    answer = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert answer.returncode != 0, f"{alert}: the unit tests passed with {wrong!r} for {right!r}"
    assert alert in answer.stdout + answer.stderr
