"""`edge-agent config example`: a config that serves the status page, and the options it needs;
`config check`: a camera's classes against the installed version's labels, and bad health, drift
and privacy mask settings, with their lines."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_config_example_serves_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agent.cli import main
    from agent.config.loading import load_config

    args = ["config", "example", "--state-dir", str(tmp_path), "--status-listen", "0.0.0.0:8080"]
    assert main(args) == 1
    assert "is not a loopback address: set username and password_file" in capsys.readouterr().err
    assert main([*args, "--status-user", "tech", "--status-password-file", str(tmp_path / "pw")]) == 0
    path = tmp_path / "agent.yaml"
    path.write_text(capsys.readouterr().out)
    page = load_config(path).status_page
    assert page is not None and (page.host, page.port, page.username) == ("0.0.0.0", 8080, "tech")
    assert main(["config", "example", "--status-user", "tech"]) == 1
    assert "go with --status-listen" in capsys.readouterr().err


def test_config_check_names_a_class_the_installed_version_lacks_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """The demo version knows circle, square and triangle: 'sqare' is a problem on its own line
    (exit 1); before any version is installed there is nothing to check it against."""
    from testkit.bundles import install_versions

    from agent.cli import main

    path = tmp_path / "agent.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        f"trust_keys: [{keys['public']}]\n"
        "cameras:\n"
        "  - name: door\n"
        "    source: synthetic\n"
        "    conf: 0.5\n"
        "    classes:\n"
        "      - circle\n"
        "      - sqare\n"
    )
    assert main(["config", "check", str(path)]) == 0, "no version installed yet: nothing to say"
    capsys.readouterr()
    install_versions(tmp_path / "state", keys, bundles)
    assert main(["config", "check", str(path)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{path}:9: cameras.0.classes.1: 'sqare' is not a label of demo 1.1.0 (its labels: circle, square, "
        "triangle), so camera door keeps no detections of it"
    ]
    path.write_text(path.read_text().replace("sqare", "square"))
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: no problems found\n"


def test_config_check_names_a_bad_health_threshold_drift_threshold_and_privacy_mask_with_their_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40's settings as a technician mistypes them: each is refused (exit 1) on its own
    line, by its key, all three in one run."""
    from agent.cli import main

    path = tmp_path / "agent.yaml"
    path.write_text(
        f"state_dir: {tmp_path / 'state'}\n"
        "cameras:\n"
        "  - name: door\n"
        "    source: synthetic\n"
        "    health:\n"
        "      dark_luma: 300\n"
        "    drift:\n"
        "      threshold: 1.5\n"
        "    samples:\n"
        "      enabled: true\n"
        "      privacy_masks:\n"
        "        - [[0, 0], [100], [100, 100]]\n"
    )
    assert main(["config", "check", str(path)]) == 1
    said = capsys.readouterr()
    text = said.out + said.err
    for line, key in ((6, "health.dark_luma"), (8, "drift.threshold"), (12, "samples.privacy_masks.0.1")):
        assert f"{path}:{line}: cameras.0.{key}" in text, text


def test_config_check_names_each_bad_motion_setting_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A keepalive of 0 and a mask of two points: both refused, each on its own line (exit 1)."""
    from agent.cli import main

    path = tmp_path / "agent.yaml"
    path.write_text(
        "cameras:\n"
        "  - source: synthetic\n"
        "    motion:\n"
        "      enabled: true\n"
        "      keepalive_fps: 0\n"
        "      masks:\n"
        "        - [[0, 0], [10, 10]]\n"
    )
    assert main(["config", "check", str(path)]) == 1
    captured = capsys.readouterr()
    said = (captured.out + captured.err).splitlines()
    assert f"{path}:5: cameras.0.motion.keepalive_fps: Input should be greater than 0" in said, said
    assert any(
        line.startswith(f"{path}:7: cameras.0.motion.masks.0: List should have at least 3 items") for line in said
    )
