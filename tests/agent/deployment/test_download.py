"""`agent.deployment.download`: size and free disk checked before a byte is written, a full disk
mid-download; over a real mosquitto, a replaced chunk fetched again (a bounded number of times)
and a wrong index waited past."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from testkit.broker import Broker
from testkit.control import desired
from testkit.fleet import publish_raw
from testkit.needs import missing
from testkit.net import wait_until
from testkit.transfer import DATA, link_to

from agent.config.models import AgentConfig
from agent.deployment.download import BundleDownload
from agent.deployment.transfer import CORRUPT_ATTEMPTS, PartialBundle
from agent.errors import BundleError
from agent.mqtt.protocol import ChunkIndex, Topics
from pipelines.backoff import Backoff


def test_size_and_free_disk_are_checked_before_a_byte_is_written(tmp_path: Path) -> None:
    import shutil

    from agent.deployment.download import check_size
    from agent.errors import BundleError

    with pytest.raises(BundleError, match=r"more than bundle_limits\.max_bundle_bytes") as too_large:
        check_size(desired(size=10**18, chunks=1, chunk_size=10**18), 1 << 30, tmp_path)
    assert too_large.value.code == "TOO_LARGE"
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(BundleError, match="MB free under") as full:
        check_size(desired(size=free // 2 + 1, chunks=1, chunk_size=free), 1 << 62, tmp_path)
    assert full.value.code == "DISK_FULL"
    check_size(desired(size=1000, chunks=1, chunk_size=1000), 1 << 30, tmp_path)  # fits
    assert list(tmp_path.iterdir()) == [], "nothing was written"


def test_a_full_disk_during_a_download_is_a_clear_error(tmp_path: Path) -> None:
    import subprocess

    folder = tmp_path / "small"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], capture_output=True).returncode:
        missing("root", "mounting a small tmpfs needs root")
    try:
        index = ChunkIndex.of(DATA, 16384)
        partial = PartialBundle(folder / "d", index).open()
        with pytest.raises(BundleError, match="DISK_FULL"):
            for i in range(len(index.chunks)):
                start, length = index.span(i)
                partial.write(i, DATA[start : start + length])
        partial.close()
    finally:
        subprocess.run(["umount", str(folder)], check=False)


CHUNK = 16384
INDEX = ChunkIndex.of(DATA, CHUNK)  # 7 chunks
ANNOUNCED = desired(sha256=INDEX.sha256, size=INDEX.size, chunk_size=CHUNK, chunks=len(INDEX.chunks))


def chunk_messages(replaced: dict[int, bytes] | None = None) -> list[tuple[str, bytes]]:
    """The retained chunk topics of DATA, with `replaced` chunks' bytes swapped."""
    topics = Topics()
    return [
        (topics.chunk(INDEX.sha256, i), (replaced or {}).get(i, DATA[i * CHUNK : (i + 1) * CHUNK]))
        for i in range(len(INDEX.chunks))
    ]


class Download:
    """A `BundleDownload` of `ANNOUNCED` over a real broker in a thread, recording the problems
    it reports (the deployer shows them on the status document)."""

    def __init__(
        self,
        tmp_path: Path,
        broker: Broker,
        stall_timeout_s: float = 60.0,
        on_problem: Callable[[str | None], None] = lambda problem: None,
    ) -> None:
        self.link = link_to(broker.url).start()
        assert self.link.wait_connected(10)
        config = AgentConfig.model_validate({"deployments": {"stall_timeout_s": stall_timeout_s}})
        self.problems: list[str | None] = []
        self.cancel = threading.Event()
        self.download = BundleDownload(
            config=config,
            link=self.link,
            topics=Topics(),
            downloads=tmp_path / "downloads",
            cancel=self.cancel,
            report=lambda progress: None,
            problem=lambda problem: (self.problems.append(problem), on_problem(problem)),
            backoff=Backoff(initial=0.01, maximum=0.05),
        )
        self.outcome: list[object] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.outcome.append(self.download.run(ANNOUNCED, lambda: None))
        except Exception as exc:  # the test looks at what ended it
            self.outcome.append(exc)

    def said(self, words: str) -> bool:
        return any(p is not None and words in p for p in self.problems)

    def result(self) -> object:
        self.thread.join(30)
        assert not self.thread.is_alive(), "the download ended"
        return self.outcome[0]

    def close(self) -> None:
        self.cancel.set()
        self.thread.join(10)
        self.link.stop()


def test_a_replaced_chunk_is_fetched_again_before_the_download_gives_up(tmp_path: Path, broker: Broker) -> None:
    """Chunk 2 replaced on the broker (the right length, the wrong bytes): the whole-file hash
    fails, the index names chunk 2, and the device fetches it again instead of REJECTED at once;
    the operator's push putting it back ends the download well."""
    topics = Topics()
    publish_raw(broker, [(topics.index(INDEX.sha256), INDEX.to_bytes()), *chunk_messages({2: bytes(CHUNK)})])

    def push_again(problem: str | None) -> None:  # in the download's thread, before it fetches again
        if problem and "chunk 2 of bundle" in problem:
            publish_raw(broker, chunk_messages()[2:3])

    download = Download(tmp_path, broker, on_problem=push_again)
    try:
        partial = download.result()
        assert isinstance(partial, PartialBundle) and partial.path.read_bytes() == DATA
        assert download.problems[-1] is None, "the problem cleared"
    finally:
        download.close()


@pytest.mark.parametrize("wrong", [bytes(CHUNK), bytes(100)], ids=["wrong bytes", "wrong length"])
def test_a_chunk_corrupt_every_time_ends_chunk_corrupt_after_the_attempts(
    tmp_path: Path, broker: Broker, wrong: bytes
) -> None:
    topics = Topics()
    publish_raw(broker, [(topics.index(INDEX.sha256), INDEX.to_bytes()), *chunk_messages({2: wrong})])
    download = Download(tmp_path, broker, stall_timeout_s=0.2)  # a wrong length is asked for again at the stall
    try:
        error = download.result()
        assert isinstance(error, BundleError) and error.code == "CHUNK_CORRUPT", error
        assert "chunk 2 of bundle" in error.message
        if len(wrong) == CHUNK:
            refetched = [p for p in download.problems if p and "fetching it again" in p]
            assert len(refetched) == CORRUPT_ATTEMPTS - 1, download.problems
        else:
            assert f"arrived {CORRUPT_ATTEMPTS} times with the wrong length" in error.message
    finally:
        download.close()


def test_a_wrong_index_is_waited_past_for_the_right_one(tmp_path: Path, broker: Broker) -> None:
    """An index that does not match the signed desired document (someone replaced it) is not
    refused at once: the right one, published later, is taken."""
    topics = Topics()
    wrong = ChunkIndex.of(DATA, CHUNK // 2)  # the same bytes, but not the chunk size the operator signed
    publish_raw(broker, [(topics.index(INDEX.sha256), wrong.to_bytes()), *chunk_messages()])
    download = Download(tmp_path, broker)
    try:
        wait_until(lambda: download.said("does not match the desired document"), 20, "the wrong index reported")
        publish_raw(broker, [(topics.index(INDEX.sha256), INDEX.to_bytes())])
        partial = download.result()
        assert isinstance(partial, PartialBundle) and partial.path.read_bytes() == DATA
    finally:
        download.close()
    publish_raw(broker, [(topics.index(INDEX.sha256), wrong.to_bytes())])
    only_wrong = Download(tmp_path / "again", broker, stall_timeout_s=0.2)
    try:
        error = only_wrong.result()
        assert isinstance(error, BundleError) and error.code == "INDEX_MISMATCH", error
    finally:
        only_wrong.close()
