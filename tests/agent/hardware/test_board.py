"""`agent.hardware.board`: the fake boards probe as themselves; an empty root is a generic board."""

from __future__ import annotations

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
        ("rpi4", "armv7l", Board("raspberry_pi", "Raspberry Pi 4 Model B Rev 1.4", "armv7l", 4, False)),
        ("x86-nvidia", "x86_64", Board("generic", "generic x86_64", "x86_64", 16, True, "NVIDIA GeForce RTX 3060")),
        ("x86-generic", "x86_64", Board("generic", "generic x86_64", "x86_64", 4, False)),
        # the SoC from the device tree's NUL-separated compatible list, not from the model string
        ("rock5b", "aarch64", Board("generic", "Radxa ROCK 5B", "aarch64", 8, False, soc="rk3588")),
    ],
)
def test_probe_fake_boards(tree: str, arch: str, expected: Board) -> None:
    assert probe(FAKES / tree, arch=arch) == expected


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
