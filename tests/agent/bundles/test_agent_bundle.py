"""Agent bundles (kind: agent): built from wheels for one target and signed, unpacked only when
signed by a trusted key, told apart from model bundles. Pushed and installed over MQTT:
tests/e2e/test_agent_update.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.bundles.agent_bundle import build_agent_bundle, bundle_kind, read_agent_head, unpack_agent
from agent.bundles.archive import Limits, parse_manifest, read_bundle_manifest, write_tar
from agent.bundles.signing import load_private_key, load_public_key
from agent.errors import BundleError

AGENT = "edge_agent-0.3.0-py3-none-any.whl"
NUMPY_ARM = "numpy-2.1.0-cp311-cp311-manylinux_2_17_aarch64.whl"


def wheels(folder: Path, *names: str) -> list[Path]:
    """Files named as wheels (their content is never opened as a zip by the bundle)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(f"the wheel {name}".encode())
    return [folder / name for name in names]


@pytest.mark.parametrize(
    ("names", "target", "expected"),
    [
        ([AGENT], {}, ("py3", "any")),
        ([AGENT, NUMPY_ARM], {}, ("cp311", "aarch64")),  # the target from the wheels
        ([AGENT], {"python": "cp312", "arch": "riscv64"}, ("cp312", "riscv64")),  # pure wheels fit any
        ([AGENT, NUMPY_ARM], {"python": "cp310"}, "AGENT_UPDATE_WRONG_PYTHON"),
        ([AGENT, NUMPY_ARM], {"arch": "x86_64"}, "AGENT_UPDATE_WRONG_ARCHITECTURE"),
        ([AGENT, NUMPY_ARM], {"python": "py3"}, "AGENT_UPDATE_WRONG_PYTHON"),
        ([NUMPY_ARM], {}, "AGENT_UPDATE_MALFORMED"),  # no edge-agent wheel
        ([AGENT, "edge_agent-0.3.1-py3-none-any.whl"], {}, "AGENT_UPDATE_MALFORMED"),
        (["edge-agent.tar.gz"], {}, "AGENT_UPDATE_MALFORMED"),
    ],
)
def test_build_checks_every_wheel_against_the_target(
    tmp_path: Path, keys: dict[str, Path], names: list[str], target: dict[str, str], expected: object
) -> None:
    out, key = tmp_path / "agent.bundle", load_private_key(keys["private"])
    if isinstance(expected, str):
        with pytest.raises(BundleError) as raised:
            build_agent_bundle(wheels(tmp_path / "w", *names), out, key, **target)
        assert raised.value.code.value == expected
        assert not out.exists()
        if "WRONG" in expected:
            assert NUMPY_ARM in raised.value.message and "the bundle for" in raised.value.message
        return
    manifest = build_agent_bundle(wheels(tmp_path / "w", *names), out, key, **target)
    assert (manifest.python, manifest.arch) == expected
    assert manifest.version == "0.3.0" and [w.path for w in manifest.wheels] == names
    head = read_agent_head(out)
    assert head.signature is not None and head.manifest == manifest and bundle_kind(out) == "agent"


def test_an_agent_bundle_unpacks_only_signed_by_a_trusted_key(tmp_path: Path, keys: dict[str, Path]) -> None:
    signed = tmp_path / "agent.bundle"
    build_agent_bundle(wheels(tmp_path / "w", AGENT), signed, load_private_key(keys["private"]))
    trusted = [load_public_key(keys["public"])]
    manifest, _ = unpack_agent(signed, tmp_path / "ok", Limits(), trusted)
    assert (tmp_path / "ok" / AGENT).read_bytes() == f"the wheel {AGENT}".encode()
    assert manifest.wheels[0].sha256 and not (tmp_path / "ok" / "other").exists()

    forged = tmp_path / "forged.bundle"
    build_agent_bundle(wheels(tmp_path / "w", AGENT), forged, load_private_key(keys["other"]))
    head = read_agent_head(signed)
    unsigned = tmp_path / "unsigned.bundle"
    write_tar(unsigned, [("manifest.json", head.data), (AGENT, tmp_path / "w" / AGENT)])
    for bundle, trust, code in (
        (forged, trusted, "UNKNOWN_SIGNER"),
        (unsigned, trusted, "SIGNATURE_MISSING"),
        (unsigned, [], "NO_TRUSTED_KEYS"),  # no key trusted: never the unsigned model bundles' allowance
    ):
        dest = tmp_path / f"{bundle.stem}-{len(trust)}"
        dest.mkdir()
        with pytest.raises(BundleError) as raised:
            unpack_agent(bundle, dest, Limits(), trust)
        assert raised.value.code.value == code
        assert not (dest / AGENT).exists(), "no wheel is inflated before the signature is checked"


def test_a_changed_wheel_is_refused(tmp_path: Path, keys: dict[str, Path]) -> None:
    signed = tmp_path / "agent.bundle"
    (wheel,) = wheels(tmp_path / "w", AGENT)
    build_agent_bundle([wheel], signed, load_private_key(keys["private"]))
    head = read_agent_head(signed)
    wheel.write_bytes(f"the whee! {AGENT}".encode())  # same size, other bytes
    changed = tmp_path / "changed.bundle"
    write_tar(changed, [("manifest.json", head.data), ("manifest.sig", head.signature or b""), (AGENT, wheel)])
    (tmp_path / "dest").mkdir()
    with pytest.raises(BundleError) as raised:
        unpack_agent(changed, tmp_path / "dest", Limits(), [load_public_key(keys["public"])])
    assert raised.value.code.value == "ARTIFACT_HASH_MISMATCH"


def test_each_kind_of_bundle_is_refused_where_the_other_is_expected(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    agent = tmp_path / "agent.bundle"
    build_agent_bundle(wheels(tmp_path / "w", AGENT), agent, load_private_key(keys["private"]))
    with pytest.raises(BundleError) as raised:
        read_bundle_manifest(agent)
    assert raised.value.code.value == "WRONG_BUNDLE_KIND" and "--agent" in raised.value.message
    with pytest.raises(BundleError) as raised:
        read_agent_head(bundles["v1"])
    assert raised.value.code.value == "WRONG_BUNDLE_KIND" and bundle_kind(bundles["v1"]) == "model"


def test_a_model_manifest_says_no_kind_and_one_without_kind_is_a_model(bundles: dict[str, Path]) -> None:
    head = read_bundle_manifest(bundles["v1"])
    assert "kind" not in json.loads(head.data), "agents older than the field refuse unknown keys"
    assert head.manifest.kind == "model" and parse_manifest(head.data).kind == "model"
