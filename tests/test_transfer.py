"""Protocol documents, chunked downloads (disk, HTTP Range, MQTT bulk and chunk by chunk), the
MQTT link's offline queue and TLS, commands and events."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config.models import MqttSection
from agent.daemon.transfer import Cancelled, PartialBundle, fetch_over_http, fetch_over_mqtt
from agent.errors import BundleError
from agent.fleet.state import status_rows
from agent.mqtt.commands import Command, CommandError, NoArgs, PipelineArgs, run_command
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import ChunkIndex, Desired, ProtocolError, Topics
from pipelines.backoff import Backoff
from tests.mqtt_tools import Broker, TcpProxy, Watcher, wait_until
from tests.needs import missing

DATA = os.urandom(100_000)


def test_chunk_index_and_desired_documents_are_checked() -> None:
    index = ChunkIndex.of(DATA, 16384)
    assert len(index.chunks) == 7 and index.span(6) == (6 * 16384, 100_000 - 6 * 16384)
    assert ChunkIndex.parse(index.to_bytes(), "t") == index
    with pytest.raises(ProtocolError, match="make 7 chunks, not 6"):
        ChunkIndex.parse(index.model_copy(update={"chunks": index.chunks[:6]}).to_bytes(), "t")
    good = {"id": "d1", "name": "demo", "version": "1.0.0", "sha256": index.sha256, "size": 1, "chunk_size": 1}
    with pytest.raises(ProtocolError, match="chunks"):
        Desired.parse(json.dumps(good).encode(), "edge/x/desired")
    for bad, words in [
        ({"chunks": 1, "source": "url"}, "url source needs url"),
        ({"chunks": 1, "source": "url", "url": "ftp://x"}, "is not http"),
        ({"chunks": 1, "sha256": "nothex"}, "sha256"),
        ({"chunks": 1, "extra": 1}, "extra"),
    ]:
        with pytest.raises(ProtocolError, match=words):
            Desired.parse(json.dumps({**good, **bad}).encode(), "edge/x/desired")


def test_partial_bundle_checks_chunks_resumes_from_disk_and_checks_the_whole(tmp_path: Path) -> None:
    index = ChunkIndex.of(DATA, 16384)
    partial = PartialBundle(tmp_path / "d", index).open()
    with pytest.raises(BundleError, match=r"CHUNK_CORRUPT: chunk 2 .* has 100 bytes, the index says 16384"):
        partial.write(2, bytes(100))
    for i in (0, 1, 4):
        start, length = index.span(i)
        assert partial.write(i, DATA[start : start + length])
    assert not partial.write(0, DATA[:16384]) and partial.duplicates == 1
    partial.write(3, bytes(16384))  # the right length, the wrong bytes: found when the whole is checked
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
    assert seen == list(range(1, 8)), "one progress report per chunk, none fetched twice"


def test_http_download_retries_an_overloaded_server_until_it_answers(
    tmp_path: Path, range_server, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        partial = http_download(tmp_path, range_server, unavailable=3)
    assert partial.finish().read_bytes() == DATA
    assert sum("HTTP 503" in r.getMessage() for r in caplog.records) == 3, "each 503 retried, then served"


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


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    broker = Broker(tmp_path / "broker").start()
    yield broker
    broker.stop()


def link_to(url: str, **settings: object) -> MqttLink:
    link = MqttLink(MqttSection(broker=url, reconnect_min_s=0.1, reconnect_max_s=0.3, **settings), "test-link")
    return link


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


def test_offline_queue_keeps_the_newest_messages_per_topic_and_counts_the_dropped(broker: Broker) -> None:
    link = link_to(broker.url, offline_queue=3)
    for i in range(5):
        link.publish_queued("edge/q/telemetry", str(i).encode())
    for i in range(10):
        link.publish_queued("edge/q/events", f"e{i}".encode())  # a burst of events
    link.publish_state("edge/q/status", b"online")
    assert link.dropped == 2 + 7 and link.stats().queued == 6
    watcher = Watcher(broker, ["edge/q/#"])
    try:
        link.start()
        wait_until(lambda: len(watcher.messages) == 7, 10, "the queued messages")
        assert [m.payload for m in watcher.messages if m.topic.endswith("telemetry")] == [b"2", b"3", b"4"]
        assert [m.payload for m in watcher.messages if m.topic.endswith("events")] == [b"e7", b"e8", b"e9"]
        assert watcher.latest["edge/q/status"] == b"online"
    finally:
        link.stop()
        watcher.close()


def test_link_stats_read_the_offline_queues_under_the_lock() -> None:
    """stats() runs in the telemetry thread while events are queued from camera threads: it
    must read the queues under the link's lock (a topic added mid-read is a torn count, or a
    'dictionary changed size during iteration')."""
    link = link_to("mqtt://127.0.0.1:1")  # never started: every message waits in the queues
    link.publish_queued("edge/d/telemetry", b"1")
    writer_waited = []

    class WatchedQueues(dict):  # the link's own queues, noticing a write while stats() reads them
        def values(self):  # type: ignore[override]
            if not writer_waited:  # the first read only
                writer = threading.Thread(target=link.publish_queued, args=("edge/d/events", b"2"))
                writer.start()
                writer.join(0.3)
                writer_waited.append(writer.is_alive())
            return super().values()

    link._queues = WatchedQueues(link._queues)
    assert link.stats().queued == 1
    assert writer_waited == [True], "a camera thread changed the queues while stats() read them"
    wait_until(lambda: link.stats().queued == 2, 5, "the waiting write")


def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    paths: dict[str, Path] = {}

    def issue(name: str, issuer_key, issuer_name, ca: bool, san: x509.GeneralName | None = None):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer_name or subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if san is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName([san]), critical=False)
        cert = builder.sign(issuer_key or key, hashes.SHA256())
        paths[f"{name}.pem"] = folder / f"{name}.pem"
        paths[f"{name}.pem"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        paths[f"{name}.key"] = folder / f"{name}.key"
        paths[f"{name}.key"].write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return key, subject

    ca_key, ca_name = issue("ca", None, None, True)
    issue("server", ca_key, ca_name, False, x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    issue("device", ca_key, ca_name, False)
    return paths


def secured_listener(folder: Path, client_certificate: bool) -> tuple[dict[str, Path], str]:
    """Certificates in `folder` and a mosquitto listener with TLS and the password file of one
    user, ``cam-1`` / ``s3cret`` (and client certificates required, when asked)."""
    import shutil
    import subprocess

    if shutil.which("mosquitto_passwd") is None:
        missing("mosquitto_passwd", "mosquitto_passwd is not installed (apt-get install mosquitto)")
    certs = make_certificates(folder)
    passwords = folder / "passwords"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwords), "cam-1", "s3cret"], check=True)
    listener = (
        f"cafile {certs['ca.pem']}\ncertfile {certs['server.pem']}\nkeyfile {certs['server.key']}\n"
        f"{'require_certificate true' if client_certificate else ''}\n"
        f"password_file {passwords}\nallow_anonymous false\n"
    )
    return certs, listener


def test_tls_with_client_certificate_and_password(tmp_path: Path, capsys) -> None:
    from agent.cli import main

    certs, listener = secured_listener(tmp_path, client_certificate=True)
    broker = Broker(tmp_path / "broker", listener=listener)
    (tmp_path / "pw").write_text("s3cret\n")
    tls = {"ca_file": certs["ca.pem"], "cert_file": certs["device.pem"], "key_file": certs["device.key"]}
    url = f"mqtts://127.0.0.1:{broker.port}"
    broker.start()
    try:
        good = link_to(url, username="cam-1", password={"file": tmp_path / "pw"}, tls=tls).start()
        assert good.wait_connected(10), good.last_error
        good.publish_state("edge/cam-1/status", b'{"state": "online"}')
        good.stop()  # waits for the broker's ack of the retained state

        wrong = link_to(url, username="cam-1", password={"value": "nope"}, tls=tls).start()
        wait_until(lambda: wrong.last_error, 10, "the refusal")
        assert not wrong.connected and "refused" in (wrong.last_error or "")
        wrong.stop()
        no_cert = link_to(url, username="cam-1", password={"value": "s3cret"}, tls={"ca_file": certs["ca.pem"]})
        no_cert.start()
        wait_until(lambda: no_cert.last_error, 10, "the TLS failure")
        assert not no_cert.connected
        # TLS 1.3 refuses the missing certificate after the handshake (the broker closes before its
        # CONNACK); older TLS fails the handshake itself: either way the reason names the certificate
        assert "certificate" in (no_cert.last_error or ""), no_cert.last_error
        no_cert.stop()

        args = ["fleet", "status", "--json", "--broker", url, "--username", "cam-1", "--password-file"]
        args += [str(tmp_path / "pw"), "--ca-file", str(certs["ca.pem"]), "--cert-file", str(certs["device.pem"])]
        assert main([*args, "--key-file", str(certs["device.key"])]) == 0
        assert json.loads(capsys.readouterr().out)["cam-1"]["status"] == {"state": "online"}
    finally:
        broker.stop()


def test_commands_check_payloads_and_shape_answers() -> None:
    calls: list[str] = []

    def restart(args: PipelineArgs) -> dict[str, object]:
        if args.pipeline == "ghost":
            raise CommandError("NO_PIPELINE", "no pipeline named 'ghost'")
        calls.append(args.pipeline or "all")
        return {"restarted": [args.pipeline]}

    def broken(_: NoArgs) -> dict[str, object]:
        raise OSError("disk on fire")

    commands = {
        "restart-pipeline": Command(PipelineArgs, restart),
        "ping": Command(NoArgs, lambda _: {"pong": 1}),
        "broken": Command(NoArgs, broken),
    }
    answers = {
        (name, payload): json.loads(run_command(commands, name, payload).payload)
        for name, payload in [
            ("ping", b""),
            ("restart-pipeline", b'{"pipeline": "cam0"}'),
            ("restart-pipeline", b'{"pipeline": "ghost"}'),
            ("restart-pipeline", b'{"pipe": "cam0"}'),
            ("restart-pipeline", b"[1]"),
            ("restart-pipeline", b"\xff"),
            ("format-disk", b""),
            ("broken", b""),
        ]
    }
    codes = [a["error"]["code"] if not a["ok"] else "ok" for a in answers.values()]
    assert codes == [
        "ok",
        "ok",
        "NO_PIPELINE",
        "BAD_PAYLOAD",
        "BAD_PAYLOAD",
        "BAD_PAYLOAD",
        "UNKNOWN_COMMAND",
        "COMMAND_FAILED",
    ]
    assert calls == ["cam0"], "bad payloads never reach the command"


def test_fleet_status_rows_show_progress_and_error_codes() -> None:
    rows = status_rows(
        {
            "a": {
                "status": {"state": "online", "group": "g", "bundle": {"name": "demo", "version": "1.0.0"}, "fps": 9},
                "deployment": {"state": "DOWNLOADING", "progress": {"chunks_done": 3, "chunks_total": 4}},
            },
            "b": {"status": {"state": "offline"}, "deployment": {"state": "REJECTED", "error": {"code": "X"}}},
        }
    )
    assert [(r["device"], r["state"], r["bundle"], r["deployment"], r["fps"]) for r in rows] == [
        ("a", "online", "demo 1.0.0", "DOWNLOADING 75%", 9),
        ("b", "offline", None, "REJECTED (X)", None),
    ]


def test_hashes_match_what_the_fleet_publishes() -> None:
    index = ChunkIndex.of(DATA, 30000)
    assert index.sha256 == hashlib.sha256(DATA).hexdigest()
    assert index.chunks[-1] == hashlib.sha256(DATA[90000:]).hexdigest()
