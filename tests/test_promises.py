"""Promises an audit found no test keeping: each test here failed on a bug planted in the code it
guards (docs/testing.md lists them)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from agent.bundles.archive import Limits, build_bundle, read_reference, unpack, verify_unpacked
from agent.bundles.install import InstallPolicy, install
from agent.bundles.signing import load_private_key, load_public_key
from agent.bundles.store import Store
from agent.errors import BundleError
from agent.hardware.probe import probe
from agent.serving.loader import open_detector
from pipelines.nms import box_iou, nms_indices
from tests.bundle_tools import read_files, resign, write_tar
from tests.conftest import REPO

MODEL = "demo_detector_int8_qdq.onnx"


def test_nms_keeps_a_box_exactly_at_the_threshold() -> None:
    """A box is dropped only when its IoU *exceeds* the threshold (Ultralytics' rule too)."""
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 20]], np.float32)  # IoU exactly 100 / 200
    assert box_iou(boxes[0], boxes[1:])[0] == 0.5
    assert nms_indices(boxes, np.array([0.9, 0.8], np.float32), 0.5).tolist() == [0, 1]
    assert nms_indices(boxes, np.array([0.9, 0.8], np.float32), 0.49).tolist() == [0]


def two_overlapping_boxes(constant_model) -> Path:  # type: ignore[no-untyped-def]
    """A YOLOv8-layout model (1, 4 + 1, 8) on a 64x64 input: two boxes 20 px wide, 4 px apart
    (IoU 2/3), scores 0.9 and 0.8; six more anchors score 0."""
    rows = np.zeros((1, 5, 8), np.float32)
    rows[0, :, 0] = [32.0, 32.0, 20.0, 20.0, 0.9]
    rows[0, :, 1] = [36.0, 32.0, 20.0, 20.0, 0.8]
    rows[0, :4, 2:] = [[10.0], [10.0], [4.0], [4.0]]
    return constant_model(rows, metadata={"names": "{0: 'thing'}"})  # type: ignore[no-any-return]


def test_the_iou_threshold_reaches_the_detector_from_the_cli(tmp_path: Path, constant_model, capsys) -> None:
    from agent.cli import main

    model = two_overlapping_boxes(constant_model)
    image = tmp_path / "grey.png"
    cv2.imwrite(str(image), np.full((64, 64, 3), 114, np.uint8))
    found = {}
    for iou in ("0.6", "0.7"):
        capsys.readouterr()
        assert main(["detect", str(model), str(image), "--decoder", "yolov8", "--iou", iou, "--json"]) == 0
        found[iou] = len(json.loads(capsys.readouterr().out)["detections"])
    assert found == {"0.6": 1, "0.7": 2}


@pytest.mark.install
def test_the_iou_threshold_reaches_the_cameras_from_the_manifest(tmp_path: Path, constant_model, keys) -> None:
    model = two_overlapping_boxes(constant_model)
    store = Store(tmp_path / "state")
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])])
    counts = []
    for version, iou in (("1.0.0", 0.45), ("1.1.0", 0.7)):
        built = tmp_path / f"{version}.bundle"
        build_bundle(
            [model], built, name="pair", version=version, decoder="yolov8", key=load_private_key(keys["private"])
        )
        files = resign(read_files(built), keys["private"], lambda m, i=iou: m.update(thresholds={"iou": i}))  # type: ignore[misc]
        deployment = install(write_tar(tmp_path / f"{version}.signed", files), store, probe(), policy)
        assert deployment.state == "SUCCEEDED", deployment.error
        loaded = open_detector(store.versions / deployment.sha256, probe())
        assert loaded.detector.iou == iou
        counts.append(len(loaded.detector.detect(np.full((64, 64, 3), 114, np.uint8))))
    assert counts == [1, 2]


def listed(files: dict[str, bytes], key: Path, name: str, data: bytes) -> dict[str, bytes]:
    """`files` plus `name`, listed (hashed) in the manifest and signed again."""

    def add(manifest: dict) -> None:  # type: ignore[type-arg]
        manifest["files"].append({"path": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})

    return resign({**files, name: data}, key, add)


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        # the allow-list in unpack alone: the script is listed in the manifest, so only unpack can refuse it
        ("listed script", "UNEXPECTED_FILE", "is not a file a bundle may carry"),
        # the listing check in verify alone: an .onnx is a file a bundle may carry, but this one is not listed
        ("unlisted model", "UNEXPECTED_FILE", "files not listed in the manifest: extra.onnx"),
        ("no manifest", "MANIFEST_MISSING", "no manifest.json"),
        ("artifact of another size", "ARTIFACT_HASH_MISMATCH", "bytes, the manifest says"),
        ("reference without an artifact's arrays", "REFERENCE_INVALID", f"has no reference for {MODEL}"),
    ],
)
def test_each_check_of_a_bundle_refuses_on_its_own(
    case: str, code: str, words: str, tmp_path: Path, keys, bundles
) -> None:
    files = read_files(bundles["v1"])
    made = {
        "listed script": lambda: listed(files, keys["private"], "install.sh", b"#!/bin/sh\nrm -rf /\n"),
        "unlisted model": lambda: {**files, "extra.onnx": files[MODEL]},
        "no manifest": lambda: {k: v for k, v in files.items() if k != "manifest.json"},
        "artifact of another size": lambda: {**files, MODEL: files[MODEL] + b"\x00"},
        "reference without an artifact's arrays": lambda: resign(
            {**files, "reference.npz": reference_without_outputs(files)}, keys["private"]
        ),
    }[case]()
    bundle = write_tar(tmp_path / "b.bundle", made)
    folder = tmp_path / "unpacked"
    folder.mkdir()
    with pytest.raises(BundleError, match=words) as refused:
        unpacked = unpack(bundle, folder, Limits())
        verify_unpacked(folder, [load_public_key(keys["public"])], False, unpacked.files)
    assert refused.value.code == code


def reference_without_outputs(files: dict[str, bytes]) -> bytes:
    with np.load(io.BytesIO(files["reference.npz"]), allow_pickle=False) as npz:
        kept = {k: npz[k] for k in npz.files if not k.endswith("__output0")}
    buffer = io.BytesIO()
    np.savez(buffer, **kept)
    return buffer.getvalue()


def test_a_pointer_switch_never_leaves_the_device_without_current(tmp_path: Path, monkeypatch) -> None:
    """The switch replaces `current` with one rename: if the process dies before it (here: the
    new link cannot be made), `current` still names the old version, never nothing."""
    from tests.test_manifest_store import fake_version

    store = Store(tmp_path).ensure()
    fake_version(store, "a" * 64, 1000)
    fake_version(store, "b" * 64, 2000)
    store.switch("a" * 64)

    make_link = os.symlink

    def power_cut(target: object, link: object) -> None:  # the power fails as the new current is made
        if "current" in str(link):
            raise OSError("power cut")
        make_link(target, link)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "symlink", power_cut)
    with pytest.raises(OSError, match="power cut"):
        store.switch("b" * 64)
    assert store.current_sha() == "a" * 64


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
def test_the_first_calibration_image_is_the_parity_input(tmp_path: Path, keys) -> None:
    from pipelines.detector import Detector
    from runtimes.registry import load_runtime
    from tests.conftest import DEMO_MODELS

    calibration = []
    for i, value in enumerate((40, 200)):
        path = tmp_path / f"calib{i}.png"
        cv2.imwrite(str(path), np.full((240, 320, 3), value, np.uint8))
        calibration.append(path)
    bundle = tmp_path / "c.bundle"
    build_bundle(
        [DEMO_MODELS / MODEL], bundle, name="c", calibration=calibration, key=load_private_key(keys["private"])
    )
    folder = tmp_path / "unpacked"
    folder.mkdir()
    unpack(bundle, folder, Limits())
    verified = verify_unpacked(folder, [load_public_key(keys["public"])])
    reference = read_reference(folder, verified.manifest)[f"{MODEL}__input"]
    with load_runtime("onnxruntime", DEMO_MODELS / MODEL) as runtime:
        expected, _ = Detector(runtime).prepare(cv2.imread(str(calibration[0])))
    np.testing.assert_array_equal(reference, expected)


def test_the_tensorrt_probe_answers_for_the_machine_it_runs_on() -> None:
    """Whether TensorRT is installed decides the answer; a Jetson must pass this test too."""
    from runtimes.registry import available_runtimes

    info = available_runtimes(["tensorrt"])["tensorrt"]
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert not info.available and "not installed" in (info.reason or "")
    else:
        assert info.version is not None


def test_scripts_run_from_the_repository(tmp_path: Path) -> None:
    """`python -m agent.cli` (what the tests and the service use) prints its help."""
    run = subprocess.run([sys.executable, "-m", "agent.cli", "--help"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0 and "fleet" in run.stdout
