"""`agent.hardware.clock`: is the clock synchronised (timesyncd's flag, adjtimex on the real kernel)?"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.hardware.clock import STA_UNSYNC, TIMESYNCD_FLAG, clock_synchronised
from agent.hardware.sysfs import SysFS


@pytest.mark.parametrize(
    ("flag", "kernel", "expected"),
    [(True, OSError(1, "EPERM"), True), (False, (0, 100_000), True), (False, (STA_UNSYNC, 100_000), False),
     (False, (0, 16_000_000), False), (False, OSError(1, "EPERM"), None)],
)  # fmt: skip
def test_clock_synchronised(tmp_path: Path, flag: bool, kernel: Any, expected: bool | None) -> None:
    if flag:
        (tmp_path / TIMESYNCD_FLAG).parent.mkdir(parents=True)
        (tmp_path / TIMESYNCD_FLAG).touch()

    def adjtimex() -> tuple[int, int]:
        if isinstance(kernel, Exception):
            raise kernel
        return kernel  # type: ignore[no-any-return]

    assert clock_synchronised(SysFS(tmp_path), adjtimex) is expected


def test_the_real_kernel_answers_on_this_machine() -> None:
    assert clock_synchronised(SysFS(Path("/nonexistent"))) in (True, False)
