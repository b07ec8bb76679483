"""Getting a deployment's bundle onto the disk: the size cap, the free-disk check, the chunk
index and the chunks (agent/deployment/transfer.py does the chunk work).

`BundleDownload.run` runs in the deployer's thread. It raises `BundleError` for a bundle that
must be refused (``TOO_LARGE``, ``DISK_FULL``, ``INDEX_MISMATCH``, ``CHUNK_CORRUPT``, ...) and
`Cancelled` when its `cancel` event is set (the agent stops, a newer document replaced it, a
rollback command, or the deadline the deployer set).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.config.models import AgentConfig
from agent.deployment.transfer import CORRUPT_ATTEMPTS, Cancelled, PartialBundle, fetch_over_http, fetch_over_mqtt
from agent.errors import BundleError, ErrorCode
from agent.mqtt.device_documents import DownloadProgress
from agent.mqtt.link import Message, MqttLink
from agent.mqtt.protocol import ChunkIndex, Desired, ProtocolError, Topics
from agent.throttle import ThrottledLog
from pipelines.backoff import Backoff

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5
#: free disk kept beyond what a bundle needs (the bundle file, then its unpacked copy)
DISK_RESERVE = 16 << 20


def check_size(desired: Desired, max_bundle_bytes: int, folder: Path, already: int = 0) -> None:
    """Refuse a bundle over the size cap (``TOO_LARGE``) or that the disk under `folder` cannot
    hold twice (the download and its unpacked copy; ``DISK_FULL``) before a byte is written;
    `already` bytes of it are on disk from an earlier run."""
    if desired.size > max_bundle_bytes:
        raise BundleError(
            ErrorCode.TOO_LARGE,
            f"the bundle has {desired.size} bytes, more than bundle_limits.max_bundle_bytes ({max_bundle_bytes})",
        )
    free = shutil.disk_usage(folder).free
    needed = 2 * desired.size - already + DISK_RESERVE
    if free < needed:
        raise BundleError(
            ErrorCode.DISK_FULL,
            f"the bundle needs {needed / 2**20:.0f} MB free under {folder} (download and unpacked copy), "
            f"only {free / 2**20:.0f} MB are free",
        )


class BundleDownload:
    """Fetches one desired bundle into ``<state>/downloads/<sha256>``, reporting progress."""

    def __init__(
        self,
        *,
        config: AgentConfig,
        link: MqttLink,
        topics: Topics,
        downloads: Path,
        cancel: threading.Event,
        report: Callable[[DownloadProgress], None],
        problem: Callable[[str | None], None],
        backoff: Backoff | None = None,
    ) -> None:
        """`backoff` paces fetching corrupt chunks again (default 2 s doubling to 30 s)."""
        self.config, self.link, self.topics, self.downloads = config, link, topics, downloads
        self.cancel, self._report, self._problem = cancel, report, problem
        self._backoff = backoff or Backoff(initial=2.0, maximum=30.0)
        self._arrived = threading.Condition()
        self._index: ChunkIndex | None = None
        self._throttled = ThrottledLog(log)  # anyone on the broker may publish junk indexes

    def run(self, desired: Desired, on_downloading: Callable[[], None]) -> PartialBundle:
        """The complete, checked bundle file; `on_downloading` is called when chunks start."""
        self.downloads.mkdir(parents=True, exist_ok=True)
        folder = self.downloads / desired.sha256
        part = folder / "bundle.part"
        check_size(desired, self.config.bundle_limits.max_bundle_bytes, self.downloads, _allocated(part))
        index = self._wait_index(desired)
        partial = PartialBundle(folder, index).open()
        _remove_others(self.downloads, keep=desired.sha256)
        on_downloading()
        try:
            for attempt in range(1, CORRUPT_ATTEMPTS + 1):
                self._fetch(desired, partial)
                try:
                    partial.finish()
                    break
                except BundleError as exc:
                    if exc.code != ErrorCode.CHUNK_CORRUPT or attempt == CORRUPT_ATTEMPTS:
                        raise
                    self._refetch(partial, exc)
            self._problem(None)
        except BundleError:
            partial.remove()
            raise
        finally:
            partial.close()
        return partial

    def _refetch(self, partial: PartialBundle, error: BundleError) -> None:
        """Forget the chunks `finish` found corrupt and wait a backoff before fetching them again."""
        self._problem(f"{error.message.removesuffix('; push the bundle again')}: fetching it again")
        partial.discard(partial.corrupt)
        if self.cancel.wait(self._backoff.next_delay()):
            raise Cancelled()

    def _on_index(self, message: Message) -> None:  # paho's network thread
        if not message.payload:
            return
        try:
            index = ChunkIndex.parse(message.payload, message.topic)
        except ProtocolError as exc:
            self._problem(str(exc))
            self._throttled.error("index", "deployment: %s; ignored", exc)
            return
        with self._arrived:
            self._index = index
            self._arrived.notify_all()

    def _wait_index(self, desired: Desired) -> ChunkIndex:
        """The chunk index that matches `desired`. One that does not (replaced on the broker by
        someone else, or left from another push) is waited past for up to
        ``deployments.stall_timeout_s``, then refused (``INDEX_MISMATCH``)."""
        topic = self.topics.index(desired.sha256)
        self.link.subscribe(topic, self._on_index)
        stall = self.config.deployments.stall_timeout_s
        warn_at, refuse_at = time.monotonic() + stall, float("inf")
        announced = (desired.sha256, desired.size, desired.chunk_size, desired.chunks)
        try:
            with self._arrived:
                while True:
                    index = self._index
                    if (
                        index is not None
                        and (index.sha256, index.size, index.chunk_size, len(index.chunks)) == announced
                    ):
                        break
                    if index is not None and refuse_at == float("inf"):
                        refuse_at = time.monotonic() + stall
                        self._problem(
                            f"the chunk index on {topic} does not match the desired document (sha256, size, chunk "
                            f"size or count differ); waiting up to {stall:.0f} s for the right one"
                        )
                    if time.monotonic() > refuse_at:
                        raise BundleError(
                            ErrorCode.INDEX_MISMATCH,
                            f"the chunk index of {desired.sha256[:12]} does not match the desired document "
                            "(sha256, size, chunk size or count differ); push the bundle again",
                        )
                    if self.cancel.is_set():
                        raise Cancelled()
                    self._arrived.wait(0.5)
                    if index is None and time.monotonic() > warn_at:
                        warn_at = float("inf")
                        self._problem(f"no chunk index {topic} on the broker (removed by fleet gc?); still waiting")
        finally:
            self.link.unsubscribe(topic)
        self._problem(None)
        return index

    def _fetch(self, desired: Desired, partial: PartialBundle) -> None:
        index, last = partial.index, 0.0

        reported: tuple[int, int] | None = None

        def progress(done: int, total: int) -> None:
            """Report at most every `PROGRESS_EVERY_S` (and the end at once); the transfers call
            it again while they wait, so the record catches up with what is on disk."""
            nonlocal last, reported
            now = time.monotonic()
            if (done, total) != reported and (done == total or now - last >= PROGRESS_EVERY_S):
                last, reported = now, (done, total)
                self._report(
                    DownloadProgress(
                        chunks_done=done,
                        chunks_total=total,
                        bytes_done=min(done * index.chunk_size, index.size),
                        bytes_total=index.size,
                        resumed=partial.resumed,
                        fetched=partial.written,
                        duplicates=partial.duplicates,
                    )
                )

        progress(len(partial.done), len(index.chunks))
        settings = self.config.deployments
        if desired.source == "url":
            assert desired.url is not None  # the Desired model requires it for a url source
            fetch_over_http(
                desired.url,
                partial,
                max_rate=settings.max_download_rate,
                timeout=settings.http_timeout_s,
                cancel=self.cancel,
                progress=progress,
            )
        else:
            fetch_over_mqtt(
                self.link,
                self.topics,
                partial,
                window=settings.window,
                max_rate=settings.max_download_rate,
                stall_timeout=settings.stall_timeout_s,
                cancel=self.cancel,
                progress=progress,
            )


def _allocated(path: Path) -> int:
    """Bytes a partial download already takes on disk (it is sparse until its chunks arrive)."""
    try:
        return path.stat().st_blocks * 512
    except OSError:
        return 0


def _remove_others(downloads: Path, keep: str) -> None:
    """Only one download is kept for resuming: the one the device follows now."""
    for folder in downloads.iterdir():
        if folder.name != keep:
            shutil.rmtree(folder, ignore_errors=True)
