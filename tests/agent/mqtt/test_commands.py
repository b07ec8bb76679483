"""`agent.mqtt.commands`: the one table of commands: the protocol's names come from it, docs/mqtt.md
lists each row with its arguments, and each row does what the docs say with the device's actions."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

import pytest
from testkit import REPO

from agent.bundles.record import Deployment, State
from agent.mqtt.commands import (
    COMMAND_TABLE,
    CameraArgs,
    CameraReferenceArgs,
    CommandActions,
    Jpeg,
    MediaArgs,
    NoArgs,
    Rate,
    SamplesArgs,
    SnapshotArgs,
)
from agent.mqtt.protocol import COMMANDS

ROWS = {row.name: row for row in COMMAND_TABLE}


def test_each_command_is_one_row_and_the_protocol_names_come_from_the_table() -> None:
    names = [row.name for row in COMMAND_TABLE]
    assert (
        COMMANDS
        == tuple(names)
        == (
            "rollback",
            "restart-camera",
            "snapshot",
            "ping",
            "media",
            "samples",
            "reset-counts",
            "restart-pipeline",
            "camera-reference",
        )
    )
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", name) for name in names), "one plain topic level each"
    assert {name: (row.rate, row.args) for name, row in ROWS.items()} == {
        "rollback": (Rate(5.0, 10), NoArgs),
        "restart-camera": (Rate(5.0, 10), CameraArgs),
        "snapshot": (Rate(2.0, 4), SnapshotArgs),
        "ping": (Rate(5.0, 10), NoArgs),
        "media": (Rate(8.0, 16), MediaArgs),
        "samples": (Rate(8.0, 16), SamplesArgs),
        "reset-counts": (Rate(0.2, 2), NoArgs),
        "restart-pipeline": (Rate(5.0, 10), CameraArgs),
        "camera-reference": (Rate(0.5, 4), CameraReferenceArgs),
    }
    assert [row.name for row in COMMAND_TABLE if row.deprecated] == ["restart-pipeline"], "kept for one release"


def _documented() -> dict[str, str]:
    """docs/mqtt.md's commands table: {command: its args column}."""
    text = (REPO / "docs" / "mqtt.md").read_text().split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \| ([^|]*) \|", text, re.MULTILINE)
    return dict(rows)


def test_the_docs_list_every_command_with_its_arguments() -> None:
    documented = _documented()
    assert sorted(documented) == sorted(COMMANDS)
    for name, args in documented.items():
        fields = set(ROWS[name].args.model_fields)
        assert set(re.findall(r'"(\w+)"', args)) == fields, f"{name}: the docs say {args}"


class Device:
    """A device's actions that record what they were asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[Any, ...]] = []

    def rollback(self) -> Deployment:
        self.asked.append(("rollback",))
        return Deployment(id="rollback-1", sha256="a" * 64, state=State.ROLLED_BACK, name="demo", version="1.0.0")

    def restart(self, camera: str | None) -> list[str]:
        self.asked.append(("restart", camera))
        return [camera] if camera else ["door", "yard"]

    def camera_jpeg(self, camera: str | None, quality: int) -> bytes:
        self.asked.append(("jpeg", camera, quality))
        return b"\xff\xd8jpeg"

    def reset_counts(self) -> dict[str, Any]:
        self.asked.append(("reset-counts",))
        return {"since": 1234.5, "before": {"lines": {"door": {"in": 3, "out": 1}}, "zones": {}}}

    def media(self, event: str) -> bytes:
        self.asked.append(("media", event))
        return b"\xff\xd8kept"

    def actions(self) -> CommandActions:
        return CommandActions(
            lambda: "online",
            self.rollback,
            self.restart,
            self.camera_jpeg,
            lambda: 1234.56789,
            self.reset_counts,
            self.media,
        )


@pytest.mark.parametrize(
    ("name", "args", "answer", "asked"),
    [
        ("ping", {}, {"pong": 1234.568, "state": "online"}, []),
        (
            "rollback",
            {},
            asdict(Deployment(id="rollback-1", sha256="a" * 64, state=State.ROLLED_BACK, name="demo", version="1.0.0")),
            [("rollback",)],
        ),
        ("restart-camera", {"camera": "door"}, {"restarted": ["door"]}, [("restart", "door")]),
        ("restart-camera", {}, {"restarted": ["door", "yard"]}, [("restart", None)]),
        ("restart-pipeline", {"pipeline": "door"}, {"restarted": ["door"]}, [("restart", "door")]),
        ("snapshot", {"camera": "yard", "quality": 70}, Jpeg(b"\xff\xd8jpeg"), [("jpeg", "yard", 70)]),
        ("snapshot", {"pipeline": "yard", "quality": 70}, Jpeg(b"\xff\xd8jpeg"), [("jpeg", "yard", 70)]),
        ("snapshot", {}, Jpeg(b"\xff\xd8jpeg"), [("jpeg", None, 85)]),
        ("media", {"event": "00ab00cd00ef0012"}, Jpeg(b"\xff\xd8kept"), [("media", "00ab00cd00ef0012")]),
        (
            "reset-counts",
            {},
            {"since": 1234.5, "before": {"lines": {"door": {"in": 3, "out": 1}}, "zones": {}}},
            [("reset-counts",)],
        ),
    ],
)
def test_each_row_does_what_the_docs_say(name: str, args: dict[str, Any], answer: object, asked: list[Any]) -> None:
    device = Device()
    row = ROWS[name]
    assert row.run(device.actions(), row.args.model_validate(args)) == answer
    assert device.asked == asked


def test_media_takes_only_an_event_id_and_says_when_the_device_keeps_none() -> None:
    from pydantic import ValidationError

    from agent.errors import CodedError, ErrorCode

    for bad in ("../../etc/passwd", "00AB00CD00EF0012", "00ab", ""):
        with pytest.raises(ValidationError):
            MediaArgs.model_validate({"event": bad})
    bare = CommandActions(lambda: "online", Device().rollback, Device().restart, Device().camera_jpeg)
    with pytest.raises(CodedError) as raised:
        ROWS["media"].run(bare, MediaArgs(event="00ab00cd00ef0012"))
    assert raised.value.code is ErrorCode.NO_MEDIA


def test_media_with_clip_answers_the_size_then_each_chunk() -> None:
    """A clip goes in chunks: without ``chunk`` its size, chunk count and sha256; each chunk its
    bytes as ``video/mp4``; a chunk past the last is refused."""
    import hashlib

    from agent.errors import CodedError, ErrorCode
    from agent.mqtt.commands import Blob

    clip = bytes(range(256)) * 10  # 2560 bytes: chunks of 1024, 1024 and 512
    asked: list[str] = []

    def kept(event: str) -> bytes:
        asked.append(event)
        return clip

    actions = CommandActions(lambda: "online", Device().rollback, Device().restart, Device().camera_jpeg, clip=kept)
    row = ROWS["media"]
    info = row.run(actions, MediaArgs(event="00ab00cd00ef0012", clip=True, chunk_size=1024))
    assert info == {"size": 2560, "chunk_size": 1024, "chunks": 3, "sha256": hashlib.sha256(clip).hexdigest()}
    parts = [
        row.run(actions, MediaArgs(event="00ab00cd00ef0012", clip=True, chunk=i, chunk_size=1024)) for i in range(3)
    ]
    assert parts == [Blob(clip[:1024], "video/mp4"), Blob(clip[1024:2048], "video/mp4"), Blob(clip[2048:], "video/mp4")]
    assert asked == ["00ab00cd00ef0012"] * 4
    with pytest.raises(CodedError) as raised:
        row.run(actions, MediaArgs(event="00ab00cd00ef0012", clip=True, chunk=3, chunk_size=1024))
    assert raised.value.code is ErrorCode.BAD_PAYLOAD and "last chunk (2)" in raised.value.message
    with pytest.raises(CodedError) as raised:
        row.run(
            CommandActions(lambda: "online", Device().rollback, Device().restart, Device().camera_jpeg),
            MediaArgs(event="00ab00cd00ef0012", clip=True),
        )
    assert raised.value.code is ErrorCode.NO_MEDIA and "clips" in raised.value.message


def test_samples_are_answered_in_chunks_with_what_the_device_says_of_them() -> None:
    import hashlib

    from agent.errors import CodedError, ErrorCode
    from agent.mqtt.commands import Blob

    archive = bytes(range(256)) * 6  # 1536 bytes: chunks of 1024 and 512
    asked: list[SamplesArgs] = []

    def packed(args: SamplesArgs) -> tuple[bytes, dict[str, object]]:
        asked.append(args)
        return archive, {"count": 2, "until": 1700000000.5, "more": False}

    device = Device()
    actions = CommandActions(lambda: "online", device.rollback, device.restart, device.camera_jpeg, samples=packed)
    row = ROWS["samples"]
    info = row.run(actions, SamplesArgs(camera="cam0", since=5.0, chunk_size=1024))
    digest = hashlib.sha256(archive).hexdigest()
    assert info == {"count": 2, "until": 1700000000.5, "more": False, "size": 1536, "chunk_size": 1024} | {
        "chunks": 2,
        "sha256": digest,
    }
    second = row.run(actions, SamplesArgs(camera="cam0", since=5.0, until=1700000000.5, chunk=1, chunk_size=1024))
    assert second == Blob(archive[1024:], "application/x-tar")
    assert [(a.camera, a.since, a.until) for a in asked] == [("cam0", 5.0, None), ("cam0", 5.0, 1700000000.5)]
    with pytest.raises(CodedError) as raised:
        row.run(CommandActions(lambda: "online", device.rollback, device.restart, device.camera_jpeg), SamplesArgs())
    assert raised.value.code is ErrorCode.NO_MEDIA and "samples.enabled" in raised.value.message


@pytest.mark.parametrize(
    "args",
    [{"camera": "a/b"}, {"since": -1}, {"limit": 0}, {"limit": 1001}, {"chunk_size": 100}, {"camera": "x" * 65}],
)
def test_samples_arguments_are_bounded(args: dict[str, object]) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        SamplesArgs.model_validate(args)
