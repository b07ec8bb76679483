"""`edge-agent doctor`'s report: one line per check, the fix under what did not pass, the counts,
and exit status 1 only when a check fails (warnings pass). The checks themselves:
tests/agent/daemon/test_checkup.py."""

from __future__ import annotations

import json
from pathlib import Path

from testkit import FAKES

from agent.bundles.signing import generate_keypair
from agent.cli import main
from agent.web.problems import Finding


def _doctor(config: Path, capsys, *extra: str) -> tuple[int, str]:
    status = main(["doctor", "--config", str(config), "--root", str(FAKES / "rpi5"), "--timeout", "1", *extra])
    return status, capsys.readouterr().out


def test_warnings_alone_pass_and_a_failed_check_fails(tmp_path: Path, capsys) -> None:
    _, public = generate_keypair(tmp_path / "keys")
    (tmp_path / "state").mkdir()
    config = tmp_path / "agent.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\ntrust_keys: [{public}]\n")
    status, out = _doctor(config, capsys)
    lines = out.splitlines()
    assert status == 0, out
    warned = [line for line in lines if line.startswith("WARN  ")]
    passed = [line for line in lines if line.startswith("PASS  ")]
    assert any(line.startswith("WARN  runtime  no version is installed") for line in warned)
    assert any(line.startswith("PASS  keys     1 trusted and 0 operator key(s) readable") for line in passed)
    fixes = [i for i, line in enumerate(lines) if line.lstrip().startswith("fix: ")]
    assert len(fixes) == len(warned), "a fix under each warning, none under a pass"
    assert all(lines[i - 1].startswith("WARN") for i in fixes)
    assert lines[-1] == f"0 failed, {len(warned)} warning(s), {len(passed)} passed"

    public.unlink()
    status, out = _doctor(config, capsys)
    assert status == 1
    assert "FAIL  keys     trust_keys: KEY_INVALID" in out
    assert "fix: copy the public key there (edge-agent keygen made it)" in out
    assert out.splitlines()[-1].startswith("2 failed, ")  # the config's own check names the missing file too

    status, out = _doctor(config, capsys, "--json")
    report = json.loads(out)
    assert status == 1 and report["ok"] is False
    assert [c["status"] for c in report["checks"] if c["check"] in ("config", "keys")] == ["fail", "fail"]


def test_a_fix_is_printed_only_under_what_did_not_pass(tmp_path: Path, capsys, monkeypatch) -> None:
    """The report's layout on findings made by hand (the checks stand aside: monkeypatched)."""
    findings = [
        Finding("config", "pass", "agent.yaml is valid", "never shown"),
        Finding("camera door", "warn", "no frame yet", "check its cable"),
        Finding("keys", "fail", "no key", "copy it"),
    ]
    monkeypatch.setattr("agent.daemon.checkup.run_checks", lambda config, root, timeout: findings)
    assert main(["doctor", "--config", str(tmp_path / "agent.yaml")]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "PASS  config       agent.yaml is valid",
        "WARN  camera door  no frame yet",
        "                   fix: check its cable",
        "FAIL  keys         no key",
        "                   fix: copy it",
        "1 failed, 1 warning(s), 1 passed",
    ]
