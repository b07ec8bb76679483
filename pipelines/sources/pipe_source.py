"""`PipeSource`: frames read as raw video from a supervised subprocess's stdout.

The camera path of Frigate, the closest peer: the agent never depends on how OpenCV was built.
`open` starts the command of `pipelines.sources.pipe_commands` in its own process group (stdin closed,
stdout and stderr piped), `read` returns one BGR frame at a time, `close` ends the process
group (SIGTERM, then SIGKILL after two seconds). When the process dies, stalls
(`stall_timeout_s` without a byte) or its stream goes out of step, `read` raises `SourceError`
carrying the last lines of its stderr; the pipeline then reopens the source with its backoff, so
the process is restarted. A finite source (a file, a test pattern) whose process exits 0 at a
frame boundary has ended: `read` returns None. A frame cut short by the end of the stream is
dropped (counted in `short_frames`), never decoded.

Threads: `open`, `read` and `close` run in the pipeline's capture thread; `close` may also come
from the thread that stops the pipeline while a `read` waits (it kills the process, which ends
that read). ``<tool>-stderr`` drains the process's stderr into a bounded tail while it runs.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import functools
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO, TypeVar

from pipelines.sources.frames import Frame, SourceError, redact_credentials
from pipelines.sources.pipe_commands import PROGRAMS, PipeCommand
from pipelines.sources.rawvideo import FRAME_MAGIC, FrameReader, RawVideo, RawVideoError, parse_y4m_header, to_bgr
from pipelines.worker import DONE, Worker

log = logging.getLogger(__name__)
_T = TypeVar("_T")

TAIL_LINES = 20  # stderr lines kept for the status
STOP_GRACE_S = 2.0  # between SIGTERM and SIGKILL
PIPE_BYTES = 1 << 20  # the stdout pipe's buffer (Linux' default unprivileged maximum)
INSTALL_HINTS = {
    "gst": "Debian and Raspberry Pi OS: apt install gstreamer1.0-tools gstreamer1.0-plugins-good; JetPack ships it",
    "ffmpeg": "apt install ffmpeg",
    "rpicam": "Raspberry Pi OS: apt install rpicam-apps",
}


class PipeSource:
    """A `FrameSource` fed by `command`'s stdout. `name` is the source string; `which` finds a
    program on ``PATH`` (a seam for tests); `clock` times the stall deadline."""

    def __init__(
        self,
        name: str,
        command: PipeCommand,
        *,
        stall_timeout_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        which: Callable[[str], str | None] = shutil.which,
    ) -> None:
        self.name, self.command, self.live = redact_credentials(name), command, command.live
        self.stall_timeout_s = stall_timeout_s
        self._clock, self._which = clock, which
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: FrameReader | None = None
        self._video: RawVideo | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._first_error: str | None = None
        self._drain: Worker | None = None
        self._read_lock = threading.Lock()  # held by a read; close waits for it before closing the pipe
        self._index = 0
        self._program_name = command.argv[0]  # the program that runs (rpicam-vid or libcamera-vid)
        self.short_frames = 0  # frames cut short at the end of a stream, dropped

    # -- the process ------------------------------------------------------------------------

    def _program(self) -> str:
        names = (self.command.argv[0], *(p for p in PROGRAMS[self.command.tool] if p != self.command.argv[0]))
        for name in names:
            path = self._which(name)
            if path is not None:
                return path
        raise SourceError(f"{' or '.join(names)} is not installed ({INSTALL_HINTS[self.command.tool]})")

    @property
    def output(self) -> tuple[str, ...]:
        """The last lines the process wrote to stderr (from any thread)."""
        return tuple(self._tail)

    def open(self) -> None:
        self.close()
        argv = [self._program(), *self.command.argv[1:]]
        self._tail.clear()
        self._first_error = None
        log.info("starting %s", redact_credentials(" ".join(argv)))
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
            )
        except OSError as exc:
            raise SourceError(f"cannot start {argv[0]}: {exc.strerror}") from exc
        assert process.stdout is not None and process.stderr is not None
        with contextlib.suppress(OSError, AttributeError):  # a larger pipe: fewer wake-ups per frame
            fcntl.fcntl(process.stdout.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._process = process
        self._drain = Worker(
            f"{self.command.tool}-stderr",
            functools.partial(self._drain_stderr, process.stderr),
            described=f"{self.name}'s stderr reader",
            budget_s=None,
        ).start()
        self._program_name = os.path.basename(argv[0])
        self._reader = FrameReader(process.stdout.fileno(), self.stall_timeout_s, self._clock)
        self._video = self.command.video
        if self.command.framing == "y4m":
            try:
                with self._read_lock:
                    self._video = self._guarded(self._read_header)
            except SourceError:
                self.close()
                raise

    def _drain_stderr(self, stream: IO[bytes]) -> float | None:
        """The stderr worker's turn: one line of the tool's stderr into the tail (`DONE` at EOF)."""
        try:
            raw = stream.readline()
        except (ValueError, OSError):  # `close` closed the pipe under it
            return DONE
        if not raw:
            return DONE
        line = redact_credentials(raw.decode("utf-8", "replace").strip())  # ffmpeg names its input
        if line:
            if self._first_error is None and line.startswith("ERROR: from element"):
                self._first_error = line  # GStreamer's root cause; its repetitions follow
            self._tail.append(line)
            log.debug("%s: %s", self.command.tool, line)
        return 0.0

    def close(self) -> None:
        """End the process group and release the pipes (idempotent, any thread)."""
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:  # stuck in the kernel (a hung driver): nothing more to do here
                log.warning("%s: process %d does not die even to SIGKILL", self.name, process.pid)
        locked = self._read_lock.acquire(timeout=STOP_GRACE_S)  # a read in another thread sees the end
        try:
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
            self._reader = None
        finally:
            if locked:
                self._read_lock.release()
        if self._drain is not None:
            self._drain.stop(1.0, finish=True)

    def _ended(self, got: int | None) -> None:
        """The stream ended, `got` bytes into a frame (None: at a frame boundary). Returns for a
        finite source whose process exited 0; raises `SourceError` otherwise."""
        process = self._process
        code = None
        if process is not None:
            try:
                code = process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                code = None
            if self._drain is not None:
                self._drain.join(1.0)  # its last words, which say why
        program = self._program_name
        cut = ""
        if got is not None:
            self.short_frames += 1
            size = self._video.frame_bytes if self._video else 0
            cut = f"; its last frame was cut short ({got} of {size} bytes) and dropped"
            log.warning(
                "%s: a frame cut short at the end of the stream (%d of %d bytes) was dropped", self.name, got, size
            )
        if code == 0 and not self.live:
            return
        if code is None:
            what = f"{program} closed its output but did not exit"
        elif code < 0:
            what = f"{program} was killed by signal {-code}"
        elif code == 0:
            what = f"{program}'s stream ended (exit 0), a live camera should not"
        else:
            what = f"{program} exited with code {code}"
        raise SourceError(self._with_output(what + cut), self.output)

    def _with_output(self, message: str) -> str:
        """`message` with the line of stderr that says most: GStreamer's first ``ERROR: from
        element`` line, else the last line (ffmpeg, rpicam-vid)."""
        tail = self.output
        if not tail:
            return message
        return f"{message}: {self._first_error or tail[-1]}"

    # -- frames -----------------------------------------------------------------------------

    def _guarded(self, read: Callable[[], _T]) -> _T:
        """Run a read, turning a stall, a broken stream or a closed pipe into `SourceError`."""
        try:
            return read()
        except TimeoutError as exc:
            raise SourceError(self._with_output(f"{self.name}: {exc} (stalled)"), self.output) from exc
        except RawVideoError as exc:
            raise SourceError(self._with_output(f"{self.name}: {exc}"), self.output) from exc
        except (OSError, ValueError) as exc:  # the pipe was closed under the read
            raise SourceError(f"{self.name}: the pipe closed ({exc})", self.output) from exc

    def _read_header(self) -> RawVideo:
        assert self._reader is not None
        line = self._reader.read_line()
        if not line and self._reader.eof:
            self._ended(None)
            raise SourceError(f"{self.name}: the stream ended before its first frame", self.output)
        video = parse_y4m_header(line)
        log.info("%s: %dx%d frames (%s)", self.name, video.width, video.height, line.decode("ascii", "replace"))
        return video

    def _next_frame(self, reader: FrameReader, video: RawVideo) -> bytes | None:
        """The next frame's planes; None when a finite stream ended (`_ended` raises otherwise)."""
        if self.command.framing == "y4m":
            marker = reader.read_line()
            if not marker.startswith(FRAME_MAGIC):
                if reader.eof:
                    self._ended(len(marker) or None)
                    return None
                raise RawVideoError(
                    f"stream out of step: expected a FRAME header, got {marker[:16]!r} (GStreamer's y4menc pads "
                    "rows whose width is not a multiple of 8: scale the pipeline to such a width)"
                )
        data = reader.read_exact(video.frame_bytes)
        if len(data) < video.frame_bytes:
            cut = len(data) if data or self.command.framing == "y4m" else None  # y4m: a FRAME without its planes
            self._ended(cut)
            return None
        return data

    def read(self) -> Frame | None:
        if self._reader is None:
            self.open()
        with self._read_lock:
            reader, video = self._reader, self._video
            if reader is None or video is None:
                raise SourceError(f"{self.name}: closed")
            data = self._guarded(lambda: self._next_frame(reader, video))
        if data is None:
            return None
        frame = Frame(self._index, self._clock(), to_bgr(data, video))
        self._index += 1
        return frame
