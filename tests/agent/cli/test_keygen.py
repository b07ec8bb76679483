"""`edge-agent keygen`: a key pair that signs and verifies, its key id printed, never an overwrite."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.bundles.signing import key_id, load_private_key, load_public_key
from agent.cli import main
from agent.cli.failure import CliError
from agent.cli.keygen import run


def test_keygen_writes_a_pair_that_verifies_and_prints_its_key_id(tmp_path: Path, capsys) -> None:
    out = tmp_path / "keys"
    assert main(["keygen", "--out", str(out)]) == 0
    private, public = load_private_key(out / "signing.key"), load_public_key(out / "signing.pub")
    public.verify(private.sign(b"manifest"), b"manifest")  # raises when the two do not belong together
    assert (out / "signing.key").stat().st_mode & 0o777 == 0o600
    printed = capsys.readouterr().out
    assert f"(key id {key_id(public)})" in printed
    assert f"wrote {out / 'signing.key'} (keep it secret) and {out / 'signing.pub'}" in printed


def test_keygen_refuses_to_overwrite_a_key_as_one_line_and_exit_status_1(tmp_path: Path, capsys) -> None:
    (tmp_path / "signing.key").write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    before = (tmp_path / "signing.key").read_bytes()
    assert main(["keygen", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("edge-agent: error: ") and err.count("\n") == 1
    assert "already exists" in err and str(tmp_path / "signing.key") in err
    assert (tmp_path / "signing.key").read_bytes() == before
    with pytest.raises(CliError) as raised:
        run(argparse.Namespace(out=tmp_path))
    assert raised.value.status == 1
