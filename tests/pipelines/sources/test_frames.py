"""`pipelines.sources.frames`: credentials redacted wherever a source is shown (`redact_credentials`,
`SourceError`, `SourceStatus`, the logging filter)."""

from __future__ import annotations

import io
import logging

import pytest

from pipelines.sources.capture import CameraSource
from pipelines.sources.frames import CredentialsFilter, SourceError, SourceStatus, redact_credentials


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
