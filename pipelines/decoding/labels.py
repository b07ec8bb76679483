"""Class labels: from a labels file, a model's metadata, or the class ids themselves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: a first line like these marks a labelmap whose line 0 is the background class, so class id
#: ``c`` (as TFLite's detection post-process numbers them) is on line ``c + 1``
BACKGROUND_LINES = frozenset({"???", "background", "__background__"})


class LabelsError(ValueError):
    """A labels file cannot be read."""


@dataclass(frozen=True)
class Labels:
    """Maps a class id to its label; ids it does not know come back as the id in text."""

    names: Mapping[int, str] = field(default_factory=dict)

    @classmethod
    def from_lines(cls, lines: Sequence[str]) -> Labels:
        """One label per line; a leading background line (``???``) shifts ids by one."""
        lines = [line.strip() for line in lines]
        while lines and not lines[-1]:
            lines.pop()
        offset = 1 if lines and lines[0].lower() in BACKGROUND_LINES else 0
        return cls({i - offset: name for i, name in enumerate(lines) if i >= offset})

    @classmethod
    def from_file(cls, path: Path) -> Labels:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise LabelsError(f"cannot read labels file {path}: {exc}") from exc
        return cls.from_lines(text.splitlines())

    def __call__(self, class_id: int) -> str:
        return self.names.get(class_id, str(class_id))
