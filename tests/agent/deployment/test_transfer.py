"""`agent.deployment.transfer`: resumable downloads over MQTT (a real mosquitto) and HTTP Range requests:
retries, stalls, cuts, chunks checked and written in the downloading thread."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from testkit.broker import Broker
from testkit.net import RangeServer, TcpProxy, wait_until
from testkit.transfer import DATA, link_to

from agent.deployment import transfer
from agent.deployment.transfer import Cancelled, PartialBundle, fetch_over_http, fetch_over_mqtt
from agent.errors import BundleError
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import ChunkIndex, Topics
from pipelines.backoff import Backoff


def test_partial_bundle_checks_chunks_resumes_from_disk_and_checks_the_whole(tmp_path: Path) -> None:
    index = ChunkIndex.of(DATA, 16384)
    partial = PartialBundle(tmp_path / "d", index).open()
    with pytest.raises(BundleError, match=r"CHUNK_CORRUPT: chunk 2 .* has 100 bytes, the index says 16384"):
        partial.write(2, bytes(100))
    for i in (0, 1, 4):
        start, length = index.span(i)
        assert partial.write(i, DATA[start : start + length])
    assert not partial.write(0, DATA[:16384]) and partial.duplicates == 1
    partial.write(3, bytes([0xA5]) * 16384)  # the right length, the wrong (non-zero) bytes: not present
    partial.close()

    resumed = PartialBundle(tmp_path / "d", index).open()  # a new process finds what is on disk
    assert resumed.resumed == 3 and resumed.missing() == [2, 3, 5, 6], "the bad chunk is fetched again"
    for i in resumed.missing():
        start, length = index.span(i)
        resumed.write(i, DATA[start : start + length])
    assert resumed.finish().read_bytes() == DATA

    bad = PartialBundle(tmp_path / "b", index).open()
    for i in range(len(index.chunks)):
        start, length = index.span(i)
        bad.write(i, DATA[start : start + length] if i not in (4, 5) else bytes(length))
    with pytest.raises(BundleError, match=r"CHUNK_CORRUPT: chunk 4 of bundle \w+ does not match .* \(and 1 more\)"):
        bad.finish()

    for sha, folder in ((index.sha256, "r"), ("ab" * 32, "e")):
        announced = ChunkIndex(sha256=sha, size=index.size, chunk_size=index.chunk_size, chunks=index.chunks)
        other = PartialBundle(tmp_path / folder, announced).open()
        for i in reversed(range(len(index.chunks))):  # out of order: hashed from the disk, in order, at the end
            start, length = index.span(i)
            other.write(i, DATA[start : start + length])
        if sha == index.sha256:
            assert other.finish().read_bytes() == DATA
        else:
            with pytest.raises(BundleError, match="BUNDLE_HASH_MISMATCH"):
                other.finish()


def test_a_partial_bundle_names_what_is_wrong_and_is_removed_whole(tmp_path: Path) -> None:
    index = ChunkIndex.of(DATA, 16384)
    partial = PartialBundle(tmp_path / "d", index).open()
    for i, words in ((-1, "chunk -1 is outside the index (0..6)"), (7, "chunk 7 is outside the index (0..6)")):
        with pytest.raises(BundleError, match=re.escape(words)):
            partial.write(i, DATA[:16384])
    too_short = f"chunk 6 of bundle {index.sha256[:12]} has 100 bytes, the index says 1696; push the bundle again"
    with pytest.raises(BundleError, match=re.escape(too_short)):
        partial.write(6, DATA[:100])
    assert partial.write(0, DATA[:16384]) and (partial.written, partial.duplicates) == (1, 0)
    with pytest.raises(BundleError, match=re.escape(f"6 chunks of {partial.path} are missing")) as incomplete:
        partial.finish()
    assert incomplete.value.code == "INSTALL_FAILED"
    partial.remove()
    assert not (tmp_path / "d").exists()
    partial.remove()  # twice is harmless


def http_download(
    tmp_path: Path, range_server, progress: Callable[[int, int], None] = lambda done, total: None, **options: Any
) -> PartialBundle:
    """DATA served by a `RangeServer` with `options`, downloaded as the deployer does (retries
    after 10 ms); returns the partial bundle it filled."""
    source = tmp_path / "bundle.tar"
    source.write_bytes(DATA)
    partial = PartialBundle(tmp_path / "d", ChunkIndex.of(DATA, 16384)).open()
    fetch_over_http(
        range_server(source, **options),
        partial,
        max_rate=0,
        timeout=5,
        cancel=threading.Event(),
        progress=progress,
        backoff=Backoff(initial=0.01),
    )
    return partial


def test_http_range_download_retries_a_dropped_connection(tmp_path: Path, range_server) -> None:
    seen: list[int] = []
    partial = http_download(tmp_path, range_server, lambda done, total: seen.append(done), drop_after=2)
    assert partial.finish().read_bytes() == DATA
    assert seen == sorted(seen) and set(seen) == set(range(8)), "reports after each chunk and while reading one"
    assert (partial.written, partial.duplicates) == (7, 0), "none fetched twice"


def test_http_download_retries_an_overloaded_server_until_it_answers(
    tmp_path: Path, range_server, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        partial = http_download(tmp_path, range_server, unavailable=3)
    assert partial.finish().read_bytes() == DATA
    assert sum("HTTP 503" in r.getMessage() for r in caplog.records) == 3, "each 503 retried, then served"


def test_http_download_retries_a_connection_dropped_in_the_middle_of_a_chunk(
    tmp_path: Path, range_server, caplog: pytest.LogCaptureFixture
) -> None:
    """Half of chunk 2 then a closed connection: fetched again after a backoff, not CHUNK_CORRUPT."""
    with caplog.at_level(logging.WARNING):
        partial = http_download(tmp_path, range_server, cut_at=2 * 16384)
    assert partial.finish().read_bytes() == DATA
    assert any("closed after 8192 of the chunk's 16384 bytes" in r.getMessage() for r in caplog.records)


def test_a_dripping_server_reports_progress_and_is_left_when_cancelled(tmp_path: Path) -> None:
    """From chunk 3 on the server sends 100 bytes per release (the test is the clock): while it
    drips, the download reports the 3 chunks on disk again (so the record is not stuck at its
    last report), and a cancel (the deadline, a rollback) ends it at the next piece although the
    HTTP timeout (600 s) is far away."""
    source = tmp_path / "bundle.tar"
    source.write_bytes(DATA)
    drip = threading.Semaphore(0)
    server = RangeServer(source, drip=drip, drip_from=3 * 16384)
    partial = PartialBundle(tmp_path / "d", ChunkIndex.of(DATA, 16384)).open()
    cancel, seen, outcome = threading.Event(), [], []

    def download() -> None:
        try:
            fetch_over_http(
                server.url, partial, max_rate=0, timeout=600, cancel=cancel, progress=lambda d, t: seen.append(d)
            )
        except Cancelled:
            outcome.append("cancelled")

    thread = threading.Thread(target=download, daemon=True)
    try:
        thread.start()
        drip.release()
        wait_until(lambda: seen.count(3) >= 2, 10, "progress reported again while chunk 3 drips")
        cancel.set()
        drip.release()
        thread.join(10)
        assert outcome == ["cancelled"] and not thread.is_alive(), "left at the next piece"
        assert len(partial.done) == 3
    finally:
        cancel.set()
        server.close()
        thread.join(10)


@pytest.mark.parametrize(
    ("options", "path", "words"), [({"ignore_range": True}, "bundle.tar", "must send 206"), ({}, "nope", "HTTP 404")]
)
def test_http_servers_that_cannot_serve_ranges_fail_clearly(tmp_path: Path, range_server, options, path, words) -> None:
    source = tmp_path / "bundle.tar"
    source.write_bytes(DATA)
    url = range_server(source, **options).rsplit("/", 1)[0] + "/" + path
    partial = PartialBundle(tmp_path / "d", ChunkIndex.of(DATA, 16384)).open()
    with pytest.raises(BundleError, match=words) as error:
        fetch_over_http(url, partial, max_rate=0, timeout=5, cancel=threading.Event(), progress=lambda d, t: None)
    assert error.value.code == "DOWNLOAD_FAILED"


def publish_retained(broker: Broker, messages: list[tuple[str, bytes]]) -> None:
    link = link_to(broker.url).start()
    assert link.wait_connected(10)
    infos = [link.publish(topic, payload, qos=1, retain=True) for topic, payload in messages]
    for info in infos:
        assert info is not None
        assert info.wait(10)
    link.stop()


def test_bulk_download_switches_to_missing_chunks_only_after_a_network_cut(tmp_path: Path, broker: Broker) -> None:
    topics, index = Topics(), ChunkIndex.of(DATA, 8192)  # 13 chunks
    first = [(topics.chunk(index.sha256, i), DATA[i * 8192 : (i + 1) * 8192]) for i in range(6)]
    rest = [(topics.chunk(index.sha256, i), DATA[i * 8192 : (i + 1) * 8192]) for i in range(6, 13)]
    publish_retained(broker, first)  # only the first six are on the broker yet
    proxy = TcpProxy(broker.port).restore()
    link = link_to(proxy.url).start()
    assert link.wait_connected(10)
    partial = PartialBundle(tmp_path / "d", index).open()
    cancel, errors = threading.Event(), []

    def fetch() -> None:
        try:
            fetch_over_mqtt(
                link, topics, partial, window=2, max_rate=0, stall_timeout=60, cancel=cancel, progress=lambda d, t: None
            )
        except (BundleError, Cancelled) as exc:
            errors.append(exc)

    worker = threading.Thread(target=fetch)
    worker.start()
    try:
        wait_until(lambda: len(partial.done) == 6, 10, "the bulk subscription to deliver the retained chunks")
        proxy.cut()
        time.sleep(0.5)
        proxy.restore()
        assert link.wait_connected(10)
        wait_until(lambda: link.reconnects >= 1 and link.connected, 10, "the reconnect")
        publish_retained(broker, rest)
        worker.join(20)
        assert not worker.is_alive() and not errors, errors
    finally:
        cancel.set()
        worker.join(5)
        link.stop()
        proxy.cut()
    assert partial.finish().read_bytes() == DATA
    assert (partial.written, partial.duplicates) == (13, 0), "finished chunks were not sent again"


class _CountedFetch(transfer._MqttFetch):
    """The real `_MqttFetch`, remembered when made so a test can read its counters (a spy)."""

    made: ClassVar[list[transfer._MqttFetch]] = []

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        _CountedFetch.made.append(self)


def test_a_stray_retained_chunk_just_past_the_index_is_ignored(
    tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A retained chunk at index len(chunks) (left by an older push of a longer bundle) reaches
    the bulk subscription before the real ones: it is counted as a stray, never written, and
    the download completes.

    Catches the planted `i <= len(chunks)` in `_MqttFetch.store`: the stray then goes down the
    corrupt path (a corrupt attempt spent on chunk 13, "asking again later") and the download
    still completes, so only the counters tell."""
    monkeypatch.setattr(_CountedFetch, "made", [])
    monkeypatch.setattr(transfer, "_MqttFetch", _CountedFetch)
    caplog.set_level(logging.WARNING, logger=transfer.log.name)
    topics, index = Topics(), ChunkIndex.of(DATA, 8192)  # 13 chunks: 0..12
    stray = (topics.chunk(index.sha256, len(index.chunks)), DATA[:8192])
    publish_retained(
        broker, [stray, *((topics.chunk(index.sha256, i), DATA[i * 8192 : (i + 1) * 8192]) for i in range(12))]
    )
    link = link_to(broker.url).start()
    assert link.wait_connected(10)
    partial = PartialBundle(tmp_path / "d", index).open()
    errors: list[Exception] = []

    def fetch() -> None:
        try:
            fetch_over_mqtt(
                link,
                topics,
                partial,
                window=1,
                max_rate=0,
                stall_timeout=60,
                cancel=threading.Event(),
                progress=lambda d, t: None,
            )
        except (BundleError, Cancelled) as exc:
            errors.append(exc)

    worker = threading.Thread(target=fetch)
    worker.start()
    try:
        wait_until(lambda: len(partial.done) == 12 or bool(errors), 20, "the retained chunks")
        # the last chunk is published after the retained ones (the stray among them) were handed over
        publish_retained(broker, [(topics.chunk(index.sha256, 12), DATA[12 * 8192 :])])
        worker.join(20)
        assert not worker.is_alive() and not errors, errors
    finally:
        link.stop()
    assert partial.finish().read_bytes() == DATA and partial.written == 13
    [fetch] = _CountedFetch.made
    assert (fetch.strays, fetch.corrupt) == (1, {}), "the stray spent a corrupt attempt instead of counting as a stray"
    assert not [r for r in caplog.records if "asking again later" in r.getMessage()]


class ForgetfulLink:
    """A real link whose first subscription to `forget` is dropped on the way to the broker (a
    test double of a subscription the broker lost); everything else goes through."""

    def __init__(self, link: MqttLink, forget: str) -> None:
        self.link, self.forget, self.dropped = link, forget, 0

    def subscribe(self, topic: str, handler: Any, resubscribe: bool = True) -> None:
        if topic == self.forget and not self.dropped:
            self.dropped += 1
            return
        self.link.subscribe(topic, handler, resubscribe=resubscribe)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.link, name)


def test_a_chunk_that_never_arrives_is_asked_for_again_after_the_stall_timeout(
    tmp_path: Path, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    topics, index = Topics(), ChunkIndex.of(DATA, 8192)
    publish_retained(broker, [(topics.chunk(index.sha256, i), DATA[i * 8192 : (i + 1) * 8192]) for i in range(13)])
    link = link_to(broker.url).start()
    assert link.wait_connected(10)
    forgetful = ForgetfulLink(link, topics.chunk(index.sha256, 3))
    partial, cancel = PartialBundle(tmp_path / "d", index).open(), threading.Event()

    def fetch() -> None:
        with contextlib.suppress(Cancelled):
            fetch_over_mqtt(
                forgetful,  # type: ignore[arg-type]
                topics,
                partial,
                window=2,
                max_rate=10**9,  # throttled: chunk by chunk from the start
                stall_timeout=0.3,
                cancel=cancel,
                progress=lambda d, t: None,
            )

    worker = threading.Thread(target=fetch)
    with caplog.at_level(logging.WARNING):
        worker.start()
        worker.join(20)
    cancel.set()
    worker.join(5)
    link.stop()
    assert forgetful.dropped == 1 and partial.complete, "chunk 3 was never asked for again"
    assert partial.finish().read_bytes() == DATA
    assert any("asking again" in r.getMessage() for r in caplog.records)


class ThreadRecordingBundle(PartialBundle):
    """A real partial bundle that records which thread wrote each chunk."""

    writers: set[str]

    def write(self, i: int, data: bytes) -> bool:
        self.writers.add(threading.current_thread().name)
        return super().write(i, data)


@pytest.mark.parametrize("window", [0, 3], ids=["bulk", "chunk-by-chunk"])
def test_chunks_are_checked_and_written_in_the_downloading_thread(tmp_path: Path, broker: Broker, window: int) -> None:
    """Hashing and writing a chunk must not run in paho's network thread (it would stop
    answering the broker while a large chunk is hashed); the downloader's thread does it."""
    topics, index = Topics(), ChunkIndex.of(DATA, 8192)
    publish_retained(broker, [(topics.chunk(index.sha256, i), DATA[i * 8192 : (i + 1) * 8192]) for i in range(13)])
    link = link_to(broker.url).start()
    assert link.wait_connected(10)
    partial = ThreadRecordingBundle(tmp_path / "d", index)
    partial.writers = set()
    partial.open()
    if window:  # a resumed download fetches chunk by chunk
        partial.write(0, DATA[:8192])
        partial.writers.clear()

    def fetch() -> None:
        fetch_over_mqtt(
            link,
            topics,
            partial,
            window=max(window, 1),
            max_rate=0,
            stall_timeout=60,
            cancel=threading.Event(),
            progress=lambda d, t: None,
        )

    downloader = threading.Thread(target=fetch, name="downloader")
    downloader.start()
    downloader.join(30)
    link.stop()
    assert partial.finish().read_bytes() == DATA
    assert partial.writers == {"downloader"}
