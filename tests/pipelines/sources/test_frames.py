"""`pipelines.sources.frames`: credentials redacted wherever a source is shown (`redact_credentials`,
`SourceError`, `SourceStatus`, the logging filter); frames that come as JPEG (`jpeg_size`,
`JpegImage`, `Frame.image` decoding once), their decodes counted with a counting decoder."""

from __future__ import annotations

import io
import logging
from dataclasses import replace

import cv2
import numpy as np
import numpy.typing as npt
import pytest
from testkit.media import CountingDecoder

from pipelines.sources import frames
from pipelines.sources.capture import CameraSource
from pipelines.sources.frames import (
    CredentialsFilter,
    Frame,
    JpegImage,
    SourceError,
    SourceStatus,
    jpeg_size,
    redact_credentials,
)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("rtsp://viewer:secret@10.0.0.41:554/stream1", "rtsp://viewer:***@10.0.0.41:554/stream1"),
        ("rtsps://viewer:p@ss@cam/s", "rtsps://viewer:***@cam/s"),  # an unescaped @ in the password
        ("http://:secret@cam/", "http://:***@cam/"),
        ("from 'rtsp://a:b@h/x': refused", "from 'rtsp://a:***@h/x': refused"),  # ffmpeg's quoting
        ("ffmpeg:-rtsp_transport tcp rtsp://a:b@h/x", "ffmpeg:-rtsp_transport tcp rtsp://a:***@h/x"),
        (
            "rtspsrc location=rtsp://h/x user-id=v user-pw=secret ! fakesink",
            "rtspsrc location=rtsp://h/x user-id=v user-pw=*** ! fakesink",
        ),
        ('rtspsrc user-pw="two words" !', "rtspsrc user-pw=*** !"),
        ("rtsp://token@cam/x", "rtsp://token@cam/x"),  # a user name alone is not a password
        ("http://cam/a?b=c:d@e", "http://cam/a?b=c:d@e"),  # not in the authority
        ("/dev/video0", "/dev/video0"),
    ],
)
def test_redact_credentials(text: str, shown: str) -> None:
    assert redact_credentials(text) == shown


def test_what_a_source_reports_carries_no_password(caplog: pytest.LogCaptureFixture) -> None:
    camera = CameraSource("rtsp://viewer:secret@10.0.0.41:554/stream1")
    assert camera.name == "rtsp://viewer:***@10.0.0.41:554/stream1" and "secret" in camera.target
    error = SourceError("cannot open rtsp://viewer:secret@h/x", ["[rtsp] rtsp://viewer:secret@h/x: 401"])
    assert "secret" not in str(error) and error.output == ("[rtsp] rtsp://viewer:***@h/x: 401",)
    status = SourceStatus()
    status.set("reconnecting", "error: cv2 failed on rtsp://v:secret@h/", ["rtsp://v:secret@h/"])
    assert "secret" not in f"{status.snapshot()}"
    logger = logging.getLogger("test.redact")
    journal = io.StringIO()
    handler = logging.StreamHandler(journal)
    handler.addFilter(CredentialsFilter())
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="test.redact"):
            logger.warning("camera %s failed", "rtsp://viewer:secret@h/x")
    finally:
        logger.removeHandler(handler)
    assert journal.getvalue() == "camera rtsp://viewer:***@h/x failed\n"
    assert [r.getMessage() for r in caplog.records] == ["camera rtsp://viewer:***@h/x failed"], "the record itself"


# -- frames that come as JPEG ----------------------------------------------------------------


def _jpeg(height: int = 90, width: int = 160, seed: int = 0) -> npt.NDArray[np.uint8]:
    image = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    ok, data = cv2.imencode(".jpg", image)
    assert ok
    return np.asarray(data, np.uint8).reshape(-1)


def test_jpeg_size_reads_the_frame_header_without_decoding() -> None:
    data = _jpeg(90, 160)
    assert jpeg_size(data.data) == (90, 160)
    assert jpeg_size(bytes(data)) == (90, 160)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "empty"),
        (b"\x89PNG\r\n\x1a\n" + bytes(20), "not a JPEG"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "cut inside its first segment"),
        (b"\xff\xd8\xff\xda\x00\x08" + bytes(8), "a scan before any frame header"),
        (b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x00\x00\xa0", "a frame header of height 0"),
        (b"\xff\xd8" + b"\xff\xfe\x00\x02" * 100 + b"\xff\xc0\x00\x11\x08\x00\x5a\x00\xa0", "65+ segments first"),
    ],
)
def test_jpeg_size_is_none_for_what_is_not_a_readable_jpeg(data: bytes, why: str) -> None:
    assert jpeg_size(data) is None, why


def test_jpeg_size_skips_segments_before_the_frame_header() -> None:
    header = b"\xff\xd8" + b"\xff\xfe\x00\x04ab" + b"\xff\xc4\x00\x03x" + b"\xff\xc2\x00\x11\x08\x02\xd0\x05\x00"
    assert jpeg_size(header) == (720, 1280)  # a comment, a Huffman table (C4: not a frame), progressive


def test_a_jpeg_frame_is_decoded_once_on_first_use_and_shared_by_its_copies() -> None:
    decoder = CountingDecoder()
    data = _jpeg()
    jpeg = JpegImage.of(data, decoder)
    assert jpeg is not None and (jpeg.height, jpeg.width) == (90, 160)
    frame = Frame(0, 1.0, jpeg)
    assert frame.size == (90, 160) and decoder.calls == [], "its size comes from the header"
    first = frame.image
    passed = replace(frame, inferred=False)  # as the pipeline hands on a frame it did not infer
    assert passed.image is first and frame.image is first
    assert decoder.full == 1
    assert np.array_equal(first, cv2.imdecode(data, cv2.IMREAD_COLOR))


def test_a_jpeg_frames_grey_is_a_reduced_decode_that_never_decodes_it_whole() -> None:
    decoder = CountingDecoder()
    data = _jpeg(720, 1280)
    jpeg = JpegImage.of(data, decoder)
    assert jpeg is not None
    assert jpeg.grey(320).shape == (180, 320)  # 1/4: the smallest still 320 wide
    assert jpeg.grey(100).shape == (90, 160)  # 1/8
    assert jpeg.grey(600).shape == (360, 640)  # 1/2
    assert jpeg.grey(1000).shape == (720, 1280)  # none: whole, in grey
    assert decoder.full == 0 and not jpeg.decoded
    jpeg.pixels()
    assert jpeg.grey(320).shape == (720, 1280), "once decoded, its pixels in grey"
    assert decoder.full == 1 and len(decoder.calls) == 5


def test_a_jpeg_that_cannot_be_decoded_is_a_black_frame_of_its_size() -> None:
    data = _jpeg()
    broken = data.copy()
    broken[data.size // 2 :] = 0  # the header kept, the entropy-coded data and its end gone
    header_only = np.frombuffer(b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x5a\x00\xa0" + bytes(12), np.uint8)
    jpeg = JpegImage.of(header_only.copy())
    assert jpeg is not None
    with pytest.raises(ValueError, match="cannot be decoded"):
        jpeg.grey(80)  # the motion check fails on it: the gate then infers the frame
    assert jpeg.pixels().shape == (90, 160, 3) and not jpeg.pixels().any() and jpeg.failed
    cut = JpegImage.of(broken)
    assert cut is not None and cut.pixels().shape == (90, 160, 3)  # what libjpeg makes of it


def test_jpeg_image_of_refuses_what_is_not_a_jpeg_or_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    assert JpegImage.of(np.zeros(100, np.uint8)) is None
    assert JpegImage.of(np.zeros((4, 4), np.uint16)) is None
    monkeypatch.setattr(frames, "MAX_JPEG_BYTES", 100)
    assert JpegImage.of(_jpeg()) is None
