"""`SysFS(root)`: the one way the agent reads the device's files (``/proc``, ``/sys``, ``/etc``).

Every reader of the hardware (the board probe, the sensors) takes a `SysFS` instead of opening
paths itself, so a whole board can be a folder: tests point it at ``tests/fakes/<board>/``
(gpiozero's ``sensor_file=`` idea, for a whole tree). Reads never raise: a file that is
missing, unreadable or garbled reads as None, because on a device a sensor may come and go.
`write_text` (a fan's duty) is the one write, and it does raise.
"""

from __future__ import annotations

import glob
import math
import os
from pathlib import Path


class SysFS:
    """Files under `root` (default ``/``), addressed by paths relative to it
    (``"sys/class/thermal/thermal_zone0/temp"``). Stateless, so any thread may share one."""

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root
        self._root = str(root)  # os.path and glob on strings: a sensor tick reads ~100 files

    def path(self, relative: str) -> Path:
        return self.root / relative.lstrip("/")

    def read_text(self, relative: str) -> str | None:
        """The file's text without NULs and surrounding whitespace (device-tree strings end in
        NUL); None when it cannot be read."""
        try:
            with open(os.path.join(self._root, relative.lstrip("/")), errors="replace") as file:
                return file.read().replace("\x00", "").strip()
        except (OSError, ValueError):
            return None

    def read_text_raw(self, relative: str, limit: int = 4096) -> str | None:
        """The file's first `limit` characters as they are, NULs kept (a device tree's
        ``compatible`` is a NUL-separated list); None when it cannot be read."""
        try:
            with open(os.path.join(self._root, relative.lstrip("/")), errors="replace") as file:
                return file.read(limit)
        except (OSError, ValueError):
            return None

    def read_int(self, relative: str) -> int | None:
        """The file as one integer (``45000``); None when missing or not an integer."""
        text = self.read_text(relative)
        try:
            return int(text) if text is not None else None
        except ValueError:
            return None

    def read_number(self, relative: str) -> float | None:
        """The file as one finite number (``45000``, ``-1.5``); None when it is missing, empty or
        not a number (``N/A``, ``nan``)."""
        text = self.read_text(relative)
        try:
            value = float(text) if text else None
        except ValueError:
            return None
        return value if value is not None and math.isfinite(value) else None

    def write_text(self, relative: str, text: str) -> None:
        """Write `text` to the file (a sysfs control such as a fan's ``pwm1``); raises `OSError`
        naming the path when it cannot be written. The only write the agent does under the root."""
        self.path(relative).write_text(text)

    def glob(self, pattern: str) -> list[str]:
        """Relative paths matching `pattern` (``"sys/class/thermal/thermal_zone*"``), sorted."""
        try:
            return sorted(glob.glob(pattern.lstrip("/"), root_dir=self._root))
        except OSError:
            return []

    def listdir(self, relative: str) -> list[str]:
        """Names in a folder, sorted; empty when it is missing."""
        try:
            return sorted(p.name for p in self.path(relative).iterdir())
        except OSError:
            return []
