"""`agent.daemon.download`: size and free disk checked before a byte is written, a full disk mid-download."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit.control import desired
from testkit.needs import missing
from testkit.transfer import DATA

from agent.daemon.transfer import PartialBundle
from agent.errors import BundleError
from agent.mqtt.protocol import ChunkIndex


def test_size_and_free_disk_are_checked_before_a_byte_is_written(tmp_path: Path) -> None:
    import shutil

    from agent.daemon.download import check_size
    from agent.errors import BundleError

    with pytest.raises(BundleError, match=r"more than bundle_limits\.max_bundle_bytes") as too_large:
        check_size(desired(size=10**18, chunks=1, chunk_size=10**18), 1 << 30, tmp_path)
    assert too_large.value.code == "TOO_LARGE"
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(BundleError, match="MB free under") as full:
        check_size(desired(size=free // 2 + 1, chunks=1, chunk_size=free), 1 << 62, tmp_path)
    assert full.value.code == "DISK_FULL"
    check_size(desired(size=1000, chunks=1, chunk_size=1000), 1 << 30, tmp_path)  # fits
    assert list(tmp_path.iterdir()) == [], "nothing was written"


def test_a_full_disk_during_a_download_is_a_clear_error(tmp_path: Path) -> None:
    import subprocess

    folder = tmp_path / "small"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True).returncode:
        missing("root", "mounting a small tmpfs needs root")
    try:
        index = ChunkIndex.of(DATA, 16384)
        partial = PartialBundle(folder / "d", index).open()
        with pytest.raises(BundleError, match="DISK_FULL"):
            for i in range(len(index.chunks)):
                start, length = index.span(i)
                partial.write(i, DATA[start : start + length])
        partial.close()
    finally:
        subprocess.run(["umount", str(folder)], check=False)
