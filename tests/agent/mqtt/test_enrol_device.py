"""`agent.mqtt.enrol_device`: the hardware identity read under a root, and the claim's broker
settings, by password or client certificate (the whole enrolment: tests/agent/fleet/test_enrolments.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.mqtt.enrol_device import claim_settings, hardware_identity
from agent.mqtt.enrolment import Claim, EnrolRefused, pem


def test_the_identity_is_the_device_tree_s_serial_and_the_first_real_mac(tmp_path: Path) -> None:
    for name, text in {
        "proc/device-tree/model": "Raspberry Pi 5 Model B Rev 1.0\x00",
        "proc/device-tree/serial-number": "10000000abcdef\x00",
        "etc/machine-id": "ffffffff\n",
        "sys/class/net/lo/address": "00:00:00:00:00:00\n",
        "sys/class/net/eth0/address": "d8:3a:dd:00:00:01\n",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    identity = hardware_identity(tmp_path)
    assert (identity.board, identity.serial, identity.mac) == (
        "Raspberry Pi 5 Model B Rev 1.0",
        "10000000abcdef",
        "d8:3a:dd:00:00:01",
    )
    (tmp_path / "proc/device-tree/serial-number").unlink()  # not a device tree board: the machine id
    assert hardware_identity(tmp_path).serial == "ffffffff"


PEM = pem(Ed25519PrivateKey.generate().public_key())
BASE = {"broker": "mqtts://broker:8883", "claim": "c", "username": "claim-c", "operator_keys": [PEM], "expires_at": 1}


def test_a_claim_logs_in_with_its_password_or_its_client_certificate(tmp_path: Path) -> None:
    by_password = claim_settings(Claim.model_validate(BASE | {"password": "p", "ca_file": "ca.pem"}))
    assert by_password.password is not None and by_password.password.resolve() == "p"
    assert by_password.tls is not None and by_password.tls.cert_file is None
    by_cert = claim_settings(Claim.model_validate(BASE | {"cert_file": "c.pem", "key_file": "c.key"}))
    assert by_cert.password is None and by_cert.tls is not None and by_cert.tls.key_file == Path("c.key")
    claim = tmp_path / "claim.yaml"
    claim.write_text(yaml.safe_dump(BASE))  # neither
    with pytest.raises(EnrolRefused, match="password, or its cert_file"):
        Claim.load(claim)
