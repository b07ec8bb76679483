"""End to end: keygen, bundle build, verify, install, status, rollback as a technician types them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import DEMO_MODELS


@pytest.mark.install
def test_cli_end_to_end(tmp_path: Path, capsys) -> None:
    from agent.cli import main

    models = DEMO_MODELS
    state = ["--state-dir", str(tmp_path / "state")]
    assert main(["keygen", "--out", str(tmp_path / "keys")]) == 0
    assert oct((tmp_path / "keys" / "signing.key").stat().st_mode & 0o777) == "0o600"
    trust = ["--trust-key", str(tmp_path / "keys" / "signing.pub")]
    for version, model in (("1.0.0", "demo_detector_int8_qdq.onnx"), ("1.1.0", "demo_detector_fp32.tflite")):
        out = tmp_path / f"demo-{version}.bundle"
        argv = [
            "bundle",
            "build",
            "--model",
            str(models / model),
            "--labels",
            str(models / "labels.txt"),
            "--name",
            "demo",
            "--version",
            version,
            "--key",
            str(tmp_path / "keys" / "signing.key"),
            "-o",
            str(out),
        ]
        assert main(argv) == 0
        assert main(["bundle", "verify", str(out), *trust]) == 0
        assert "signed by key" in capsys.readouterr().out
        assert main(["install", str(out), *state, *trust]) == 0
        assert main(["status", *state, "--json"]) == 0
        report = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert report["current"]["version"] == version and report["deployment"] == {
            "state": "SUCCEEDED",
            "error": None,
            "shadow": None,  # a local install is judged by no shadow and no probation
            "quality": None,
        }
    assert report["previous"]["version"] == "1.0.0"
    assert main(["bundle", "inspect", str(tmp_path / "demo-1.1.0.bundle")]) == 0
    assert "demo 1.1.0 (detect, decoder yolov8)" in capsys.readouterr().out
    assert main(["rollback", *state]) == 0
    assert main(["status", *state, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (report["current"]["version"], report["previous"]["version"]) == ("1.0.0", "1.1.0")
    assert report["deployment"]["state"] == "ROLLED_BACK"


@pytest.mark.install
def test_cli_errors_are_one_line(tmp_path: Path, capsys, keys, bundles) -> None:
    from agent.cli import main

    state = ["--state-dir", str(tmp_path / "state")]
    assert main(["install", str(bundles["v1"]), *state]) == 1
    assert capsys.readouterr().err.strip() == (
        "edge-agent: error: REJECTED: NO_TRUSTED_KEYS: "
        "this device trusts no signing key and unsigned bundles are not allowed"
    )
    assert main(["bundle", "verify", str(bundles["v1"]), "--trust-key", str(tmp_path / "nokey.pub")]) == 1
    assert "cannot read public key" in capsys.readouterr().err
    assert main(["rollback", *state]) == 1
    assert "no previous version" in capsys.readouterr().err
    config = tmp_path / "agent.yaml"
    config.write_text("state_dir: /tmp/x\ntrust_key: []\n")
    assert main(["status", "--config", str(config)]) == 1
    assert "trust_key: Extra inputs are not permitted" in capsys.readouterr().err
    assert main(["keygen", "--out", str(keys["public"].parent)]) == 1
    assert "already exists" in capsys.readouterr().err
