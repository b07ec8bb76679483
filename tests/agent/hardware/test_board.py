"""`agent.hardware.board`: the fake boards probe as themselves; an empty root is a generic board."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from testkit import FAKES

from agent.hardware.board import Board, probe


@pytest.mark.parametrize(
    ("tree", "arch", "expected"),
    [
        (
            "jetson-orin-nano",
            "aarch64",
            Board(
                "jetson",
                "NVIDIA Jetson Orin Nano Developer Kit",
                "aarch64",
                6,
                True,
                "NVIDIA Jetson Orin Nano Developer Kit",
                "36.3.0",
            ),
        ),
        (
            "jetson-nano",
            "aarch64",
            Board(
                "jetson",
                "NVIDIA Jetson Nano Developer Kit",
                "aarch64",
                4,
                True,
                "NVIDIA Jetson Nano Developer Kit",
                "32.7.4",
            ),
        ),
        ("rpi5", "aarch64", Board("raspberry_pi", "Raspberry Pi 5 Model B Rev 1.0", "aarch64", 4, False)),
        (
            "rpi5-hailo8l",  # the AI HAT+: /dev/hailo0, PCIe 1e60:2864 under HailoRT 4's hailo_chardev class
            "aarch64",
            Board("raspberry_pi", "Raspberry Pi 5 Model B Rev 1.0", "aarch64", 4, False, hailo="Hailo-8/8L"),
        ),
        (
            "rpi5-hailo10h",  # the AI HAT+ 2: PCIe 1e60:45c4 under HailoRT 5's hailo1x class
            "aarch64",
            Board("raspberry_pi", "Raspberry Pi 5 Model B Rev 1.0", "aarch64", 4, False, hailo="Hailo-10H"),
        ),
        ("rpi4", "armv7l", Board("raspberry_pi", "Raspberry Pi 4 Model B Rev 1.4", "armv7l", 4, False)),
        ("x86-nvidia", "x86_64", Board("generic", "generic x86_64", "x86_64", 16, True, "NVIDIA GeForce RTX 3060")),
        ("x86-generic", "x86_64", Board("generic", "generic x86_64", "x86_64", 4, False)),
        # the SoC from the device tree's NUL-separated compatible list, not from the model string
        ("rock5b", "aarch64", Board("generic", "Radxa ROCK 5B", "aarch64", 8, False, soc="rk3588")),
        # the RK3588S (``rockchip,rk3588s``) has the RK3588's NPU: rknn's platform rk3588
        ("orangepi5", "aarch64", Board("generic", "Xunlong Orange Pi 5", "aarch64", 8, False, soc="rk3588")),
    ],
)
def test_probe_fake_boards(tree: str, arch: str, expected: Board) -> None:
    assert probe(FAKES / tree, arch=arch) == replace(expected, root=str(FAKES / tree))


def test_probe_empty_root_is_a_generic_board_with_this_machines_cpus(tmp_path: Path) -> None:
    board = probe(tmp_path, arch="riscv64")
    assert board.kind == "generic"
    assert board.model == "generic riscv64"
    assert board.cpu_count >= 1
    assert not board.nvidia_gpu


def test_probe_ignores_a_malformed_tegra_release(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nv_tegra_release").write_text("garbage\n")
    (tmp_path / "sys/devices/system/cpu").mkdir(parents=True)
    (tmp_path / "sys/devices/system/cpu/online").write_text("0-x\n")
    board = probe(tmp_path, arch="x86_64")
    assert board.kind == "generic"
    assert board.l4t_release is None
    assert board.cpu_count >= 1  # unparsable list: falls back to os.cpu_count()


def test_a_hailo_node_without_its_class_folder_takes_the_pci_bus_s_id(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "hailo0").touch()
    pci = tmp_path / "sys/bus/pci/devices/0001:01:00.0"
    pci.mkdir(parents=True)
    (pci / "vendor").write_text("0x1e60\n")
    (pci / "device").write_text("0x45c4\n")
    assert probe(tmp_path, arch="aarch64").hailo == "Hailo-10H"
    (pci / "vendor").write_text("0x10de\n")  # another vendor's device is not the chip
    assert probe(tmp_path, arch="aarch64").hailo == "a Hailo device of unknown PCIe id"
    (tmp_path / "dev" / "hailo0").unlink()
    assert probe(tmp_path, arch="aarch64").hailo is None, "no node, no chip: the PCIe device alone is no driver"
