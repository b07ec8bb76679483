"""`edge-agent install`: its settings from the config, ``--allow-unsigned`` from the command line."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from testkit.bad_bundles import BOMB, MODEL
from testkit.bundles import read_files, resign, write_tar

from agent.bundles.store import Store


@pytest.mark.install
def test_install_takes_its_settings_from_config_and_allow_unsigned_from_the_command_line(
    tmp_path: Path, keys, bundles, capsys
) -> None:
    from agent.cli import main

    config = tmp_path / "agent.yaml"
    config.write_text(f"state_dir: {tmp_path / 'from-config'}\ntrust_keys: [{keys['public']}]\nkeep_versions: 2\n")
    assert main(["install", str(bundles["v1"]), "--config", str(config)]) == 0
    assert Store(tmp_path / "from-config").current_sha() == hashlib.sha256(bundles["v1"].read_bytes()).hexdigest()

    files = read_files(bundles["v2"])
    unsigned = write_tar(tmp_path / "unsigned.bundle", {k: v for k, v in files.items() if k != "manifest.sig"})
    assert main(["install", str(unsigned), "--config", str(config)]) == 1
    assert "SIGNATURE_MISSING" in capsys.readouterr().err
    assert main(["install", str(unsigned), "--config", str(config), "--allow-unsigned"]) == 0
    assert Store(tmp_path / "from-config").info(Store(tmp_path / "from-config").current_sha()).version == "1.1.0"  # type: ignore[union-attr]


@pytest.mark.install
def test_install_refuses_a_gzip_bomb_by_its_signature_before_inflating_it(
    tmp_path: Path, keys, bundles, capsys
) -> None:
    """A stranger's 64 MB model of zeros in a gzip bundle: refused for its signer, not for its
    size (bundle_limits.max_bytes is below it), so nothing past the manifest was inflated."""
    from agent.cli import main

    bomb = resign({**read_files(bundles["v1"]), MODEL: bytes(BOMB)}, keys["other"])
    bundle = write_tar(tmp_path / "bomb.bundle", bomb, gz=True)
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\ntrust_keys: [{keys['public']}]\nbundle_limits: {{max_bytes: {BOMB // 2}}}\n"
    )
    assert main(["install", str(bundle), "--config", str(config)]) == 1
    assert "UNKNOWN_SIGNER" in capsys.readouterr().err
    assert Store(tmp_path / "state").current_sha() is None
