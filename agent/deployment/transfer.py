"""Resumable bundle downloads: chunks checked one by one, over MQTT or HTTP Range requests.

A download lives in ``<state>/downloads/<sha256>/bundle.part``, written at each chunk's offset.
The file itself is the progress record: on (re)start every chunk range is hashed against the
index and only the ranges that do not match are fetched again, so a crash, a broker restart or
a network cut costs at most the chunks that were in flight. While the chunks arrive the whole
file is hashed once, in order (a chunk that arrives in order is hashed from memory), and checked
against the bundle's sha256 at the end; only when that fails are the chunks hashed one by one
against the index, to name the bad one (``CHUNK_CORRUPT``, else ``BUNDLE_HASH_MISMATCH``). So a
download costs one pass of SHA-256 over the bundle, not two: the signed sha256 covers every
byte, and the index's chunk hashes serve resuming and naming a bad chunk.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import logging
import os
import queue
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path

from agent.errors import BundleError, ErrorCode
from agent.mqtt.link import Message, MqttLink
from agent.mqtt.protocol import ChunkIndex, Topics
from pipelines.backoff import Backoff

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # chunks done, chunks total; called on arrivals and again while waiting

#: times one chunk may arrive corrupt (the wrong length, or bytes that fail its hash) before the
#: download gives up with ``CHUNK_CORRUPT``: the index's hashes let the device fetch it again
CORRUPT_ATTEMPTS = 3


class Cancelled(Exception):
    """The download was stopped (agent stopping, or the desired bundle changed); it can resume."""


class PartialBundle:
    """One bundle being assembled from chunks in `folder`."""

    def __init__(self, folder: Path, index: ChunkIndex) -> None:
        self.folder, self.index = folder, index
        self.path = folder / "bundle.part"
        self._lock = threading.Lock()
        self.done: set[int] = set()
        self.resumed = 0  # chunks already on disk when the download (re)started
        self.written = 0  # chunks written by this process
        self.duplicates = 0  # chunks received again after they were complete
        self._fd: int | None = None
        self._digest = hashlib.sha256()  # of the chunks before `_hashed`, in order
        self._hashed = 0
        self.corrupt: list[int] = []  # the chunks the last `finish` found not matching the index

    def open(self) -> PartialBundle:
        """Create the file, or find which chunks an earlier run already wrote."""
        self.folder.mkdir(parents=True, exist_ok=True)
        resuming = self.path.exists()
        with self.path.open("r+b" if resuming else "w+b") as part:
            part.truncate(self.index.size)
            for i, expected in enumerate(self.index.chunks if resuming else ()):
                start, length = self.index.span(i)
                part.seek(start)
                if hashlib.sha256(part.read(length)).hexdigest() == expected:
                    self.done.add(i)
        self.resumed = len(self.done)
        self._fd = os.open(self.path, os.O_RDWR)
        return self

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def missing(self) -> list[int]:
        return [i for i in range(len(self.index.chunks)) if i not in self.done]

    @property
    def complete(self) -> bool:
        return len(self.done) == len(self.index.chunks)

    def write(self, i: int, data: bytes) -> bool:
        """Store chunk `i` (of the right length: its hash is checked with the whole file, in
        `finish`); False when it was already there."""
        if not 0 <= i < len(self.index.chunks):
            raise BundleError(
                ErrorCode.CHUNK_CORRUPT, f"chunk {i} is outside the index (0..{len(self.index.chunks) - 1})"
            )
        start, length = self.index.span(i)
        if len(data) != length:
            raise BundleError(
                ErrorCode.CHUNK_CORRUPT,
                f"chunk {i} of bundle {self.index.sha256[:12]} has {len(data)} bytes, the index says {length}; "
                "push the bundle again",
            )
        with self._lock:
            if i in self.done:
                self.duplicates += 1
                return False
            assert self._fd is not None, "open() the partial bundle first"
            try:
                os.pwrite(self._fd, data, start)
            except OSError as exc:
                code = ErrorCode.DISK_FULL if exc.errno == errno.ENOSPC else ErrorCode.DOWNLOAD_FAILED
                raise BundleError(code, f"cannot write chunk {i} to {self.path}: {exc.strerror}") from exc
            self.done.add(i)
            self.written += 1
        if i == self._hashed:  # in order: hash it from memory
            self._digest.update(data)
            self._hashed += 1
        return True

    def hash_ready(self) -> None:
        """Feed the whole-file digest with the chunks now contiguous after the hashed prefix.
        The downloading thread calls it while it waits, so the hashing overlaps the transfer."""
        assert self._fd is not None, "open() the partial bundle first"
        while self._hashed in self.done:
            start, length = self.index.span(self._hashed)
            self._digest.update(os.pread(self._fd, length, start))
            self._hashed += 1

    def finish(self) -> Path:
        """Check the complete file against the bundle's sha256 and return it. No fsync: a torn
        file after a power cut fails its chunk hashes and is fetched again."""
        if not self.complete:
            raise BundleError(ErrorCode.INSTALL_FAILED, f"{len(self.missing())} chunks of {self.path} are missing")
        self.hash_ready()
        if self._digest.hexdigest() != self.index.sha256:
            bad = self.corrupt = self._corrupt_chunks()
            if bad:
                raise BundleError(
                    ErrorCode.CHUNK_CORRUPT,
                    f"chunk {bad[0]} of bundle {self.index.sha256[:12]} does not match its sha256 in the index"
                    + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else "")
                    + "; push the bundle again",
                )
            raise BundleError(
                ErrorCode.BUNDLE_HASH_MISMATCH,
                f"the downloaded chunks make a bundle hashing to {self._digest.hexdigest()[:12]}, not "
                f"{self.index.sha256[:12]} as announced; push it again",
            )
        self.close()
        return self.path

    def discard(self, chunks: list[int]) -> None:
        """Forget `chunks` (found corrupt by `finish`), so they are fetched again; the whole-file
        hash starts over (it read them)."""
        with self._lock:
            self.done.difference_update(chunks)
            self._digest, self._hashed = hashlib.sha256(), 0

    def _corrupt_chunks(self) -> list[int]:
        """The chunks on disk that do not match their hash in the index."""
        bad = []
        with self.path.open("rb") as part:
            for i, expected in enumerate(self.index.chunks):
                start, length = self.index.span(i)
                part.seek(start)
                if hashlib.sha256(part.read(length)).hexdigest() != expected:
                    bad.append(i)
        return bad

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class _RateLimit:
    """Lets through `rate` bytes per second on average (0: unlimited), one chunk of burst."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self._clock = rate, clock
        self._start = clock()
        self._granted = 0

    def wait_time(self, size: int) -> float:
        if self.rate <= 0 or self._granted == 0:
            return 0.0
        return max(0.0, (self._granted + size) / self.rate - (self._clock() - self._start))

    def grant(self, size: int) -> None:
        self._granted += size


#: bytes of chunks that may wait between the network thread and the downloading thread
QUEUED_BYTES = 16 << 20


class _MqttFetch:
    """The state of one download over MQTT.

    `on_chunk` runs in paho's network thread and only queues the chunk: hashing and writing it
    happen in the downloading thread (`store`), so the network thread keeps answering the
    broker. The queue is bounded (`QUEUED_BYTES`); when it is full the network thread waits,
    which slows the broker down through TCP, until the download is closed.
    """

    def __init__(self, link: MqttLink, topics: Topics, partial: PartialBundle) -> None:
        self.link, self.topics, self.partial = link, topics, partial
        self.sha = partial.index.sha256
        capacity = max(2, min(64, QUEUED_BYTES // partial.index.chunk_size))
        self.arrivals: queue.Queue[tuple[int, bytes]] = queue.Queue(maxsize=capacity)
        self.closed = threading.Event()
        self.outstanding: set[int] = set()  # asked for one by one and not arrived (downloading thread)
        self.bulk: str | None = None  # the wildcard filter while in bulk mode
        self.strays = 0  # retained chunk topics beyond the index (a stray left on the broker): ignored
        self.corrupt: dict[int, int] = {}  # chunk -> arrivals of the wrong length

    def on_chunk(self, message: Message) -> None:
        leaf = message.topic.rsplit("/", 1)[1]
        if not leaf.isdigit():
            return  # the index, which the bulk wildcard matches too
        while not self.closed.is_set():
            try:
                self.arrivals.put((int(leaf), message.payload), timeout=0.1)
                return
            except queue.Full:
                continue

    def store(self, timeout: float) -> int:
        """Write the chunks that arrived (waiting up to `timeout` seconds for the first); returns
        how many. Raises `BundleError` for a chunk that does not match the index."""
        try:
            arrivals = [self.arrivals.get(timeout=timeout)]
        except queue.Empty:
            return 0
        while True:
            try:
                arrivals.append(self.arrivals.get_nowait())
            except queue.Empty:
                break
        for i, data in arrivals:
            if not 0 <= i < len(self.partial.index.chunks):
                self.strays += 1
                continue
            if len(data) != self.partial.index.span(i)[1]:
                if i not in self.partial.done:  # a late copy of a chunk stored already is no harm
                    self._corrupt(i, len(data))
                continue
            self.partial.write(i, data)
            if self.bulk is None:
                self.link.unsubscribe(self.topics.chunk(self.sha, i))
            self.outstanding.discard(i)
        return len(arrivals)

    def _corrupt(self, i: int, size: int) -> None:
        """Chunk `i` arrived with `size` bytes, not its length: left missing, so it is asked for
        again after the stall timeout; `BundleError` ``CHUNK_CORRUPT`` the `CORRUPT_ATTEMPTS`th time."""
        self.corrupt[i] = self.corrupt.get(i, 0) + 1
        length = self.partial.index.span(i)[1]
        if self.corrupt[i] >= CORRUPT_ATTEMPTS:
            raise BundleError(
                ErrorCode.CHUNK_CORRUPT,
                f"chunk {i} of bundle {self.sha[:12]} arrived {self.corrupt[i]} times with the wrong length "
                f"({size} bytes, the index says {length}); push the bundle again",
            )
        log.warning("download %s: chunk %d has %d bytes, not %d; asking again later", self.sha[:12], i, size, length)

    def start_bulk(self) -> int:
        """Subscribe to every chunk at once; returns the link's reconnect count at that time."""
        self.bulk = f"{self.topics.root}/bundles/{self.sha}/+"
        generation = self.link.reconnects
        self.link.subscribe(self.bulk, self.on_chunk, resubscribe=False)
        return generation

    def end_bulk(self) -> None:
        if self.bulk is not None:
            self.link.unsubscribe(self.bulk)
            self.bulk = None
        self.outstanding.clear()

    def ask(self, i: int) -> None:
        self.outstanding.add(i)
        self.link.subscribe(self.topics.chunk(self.sha, i), self.on_chunk)

    def close(self) -> None:
        self.closed.set()
        self.end_bulk()
        for i in self.partial.missing():
            self.link.unsubscribe(self.topics.chunk(self.sha, i))


def fetch_over_mqtt(
    link: MqttLink,
    topics: Topics,
    partial: PartialBundle,
    *,
    window: int,
    max_rate: int,
    stall_timeout: float,
    cancel: threading.Event,
    progress: Progress,
) -> None:
    """Fetch the missing chunks from their retained topics until all are stored.

    A fresh, unthrottled download subscribes to all chunks with one wildcard (bulk mode: the
    broker streams them back to back). Otherwise, and as soon as the connection drops during a
    bulk download, chunks are asked for one topic each, at most `window` at a time, so only the
    missing ones travel; the link re-subscribes those after a reconnect. Raises `BundleError`
    for a corrupt chunk and `Cancelled` when `cancel` is set.

    Runs in the calling (deployer) thread, which checks, writes and hashes every chunk; paho's
    network thread only hands the chunks over.
    """
    fetch = _MqttFetch(link, topics, partial)
    limit = _RateLimit(max_rate)
    pending: deque[int] = deque()
    generation = fetch.start_bulk() if max_rate <= 0 and not partial.done else None
    if generation is None:
        pending.extend(partial.missing())
    last_arrival, reported = time.monotonic(), len(partial.done)
    try:
        while not partial.complete:
            if cancel.is_set():
                raise Cancelled()
            stalled = time.monotonic() - last_arrival > stall_timeout
            if fetch.bulk is not None and (link.reconnects != generation or stalled):
                log.info("download %s: continuing chunk by chunk (%d missing)", fetch.sha[:12], len(partial.missing()))
                fetch.end_bulk()
                pending = deque(partial.missing())
            elif stalled and fetch.outstanding:
                log.warning("download %s: no chunk for %.0f s, asking again", fetch.sha[:12], stall_timeout)
                for i in list(fetch.outstanding):
                    link.unsubscribe(topics.chunk(fetch.sha, i))
                    fetch.ask(i)
                last_arrival = time.monotonic()
            while fetch.bulk is None and pending and len(fetch.outstanding) < window:
                size = partial.index.span(pending[0])[1]
                if limit.wait_time(size) > 0:
                    break
                limit.grant(size)
                fetch.ask(pending.popleft())
            paced = limit.rate > 0 and bool(pending)  # wake up for the next grant, else for a chunk
            fetch.store(min(0.5, max(0.005, limit.wait_time(partial.index.chunk_size))) if paced else 0.5)
            partial.hash_ready()
            if len(partial.done) != reported:
                last_arrival, reported = time.monotonic(), len(partial.done)
            progress(reported, len(partial.index.chunks))  # also while waiting: the throttled last report
    finally:
        fetch.close()
    progress(len(partial.done), len(partial.index.chunks))


def fetch_over_http(
    url: str,
    partial: PartialBundle,
    *,
    max_rate: int,
    timeout: float,
    cancel: threading.Event,
    progress: Progress,
    backoff: Backoff | None = None,
) -> None:
    """Fetch the missing chunks with HTTP Range requests; transient failures (a connection
    refused or dropped, also in the middle of a chunk, a 5xx answer) are retried with backoff, a
    client error (4xx) or a server without Range support ends it (``DOWNLOAD_FAILED``).

    A chunk is read a piece at a time (`READ_PIECE`): `cancel` is checked and `progress` called
    between pieces, so a server that drips bytes cannot hold the download past its deadline (the
    deployer sets `cancel` then) nor keep it from reporting what is on disk. `timeout` bounds
    each wait for the server (connecting, and each piece)."""
    backoff = backoff or Backoff(initial=1.0, maximum=60.0)
    total = len(partial.index.chunks)
    limit = _RateLimit(max_rate)
    for i in partial.missing():
        start, length = partial.index.span(i)
        if cancel.wait(limit.wait_time(length)):
            raise Cancelled()
        limit.grant(length)
        while True:
            if cancel.is_set():
                raise Cancelled()
            request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{start + length - 1}"})
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    if response.status != 206:
                        raise BundleError(
                            ErrorCode.DOWNLOAD_FAILED,
                            f"{url} answered {response.status} to a Range request; it must send 206",
                        )
                    data = _read_piecewise(response, length, cancel, lambda: progress(len(partial.done), total))
                break
            except _CutShort as exc:
                error = str(exc)
            except urllib.error.HTTPError as exc:
                if 400 <= exc.code < 500:
                    raise BundleError(ErrorCode.DOWNLOAD_FAILED, f"{url}: HTTP {exc.code} {exc.reason}") from exc
                error = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                error = str(getattr(exc, "reason", exc))
            delay = backoff.next_delay()
            log.warning("download %s: %s; retrying in %.1f s", url, error, delay)
            if cancel.wait(delay):
                raise Cancelled()
        backoff.reset()
        partial.write(i, data)
        partial.hash_ready()
        progress(len(partial.done), total)


#: bytes read from an HTTP response at a time, checking for cancellation in between
READ_PIECE = 64 << 10


class _CutShort(Exception):
    """The server closed the connection before the whole chunk arrived (retried)."""


def _read_piecewise(
    response: http.client.HTTPResponse, length: int, cancel: threading.Event, waiting: Callable[[], None]
) -> bytes:
    """Up to `length` + 1 bytes of `response` (one more shows a server sending too much), read
    as they arrive; `waiting` is called between pieces. Raises `Cancelled` when `cancel` is set
    and `_CutShort` when the body ends before `length` bytes."""
    data = bytearray()
    while len(data) <= length:
        if cancel.is_set():
            raise Cancelled()
        piece = response.read1(min(READ_PIECE, length + 1 - len(data)))
        if not piece:
            break
        data += piece
        waiting()
    if len(data) < length:
        raise _CutShort(f"the connection closed after {len(data)} of the chunk's {length} bytes")
    return bytes(data)
