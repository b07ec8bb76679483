"""The durable outbox: what the device must not lose while its uplink is down, on disk until the
broker acknowledges it (docs/mqtt.md#delivery).

One SQLite file (``<state_dir>/outbox.sqlite``, stdlib `sqlite3`, WAL mode) holds each message
as one row: its sequence number (`seq`, the device's, increasing, never reused while the file
lives), a stable id (`msg_id`, random), its kind (`deployment`, `event`, `telemetry`), topic,
the time it was made (Unix seconds) and its payload: a JSON object whose first three fields are
``"msg_id"``, ``"seq"`` and ``"topic_seq"`` (the topic's own sequence, kept per topic in the
same file), so a consumer can drop the duplicates QoS 1 allows and see gaps, also one that reads
a single topic.
The sender (`agent.mqtt.outbox_sender`) reads the rows oldest first and deletes each once its
PUBACK came (`acked`).

Bounded and honest: the file is kept under ``outbox.max_mb`` (the main file and its WAL
together) and rows older than ``outbox.max_age_h`` are dropped. When full, telemetry summaries
are thinned first (every other one of the oldest half goes, so the backlog keeps a coarser
picture of the whole outage), then the oldest object events, then the oldest deployment
reports. Every dropped message is counted by kind and why (``full``, ``expired``,
``unwritten``: the disk refused the write and nothing else kept it; the sender's ``too_big`` and
``refused``: the broker refused it, `discard`), in the file, so the counts survive restarts. A
write the disk refuses (full, read-only) never raises into detection: `append` returns None and
counts it, unless the caller keeps the message in memory instead (`kept_in_memory`: the daemon
hands it to the link's queue, which counts its own losses), so a message delivered from memory
is never counted as dropped.

Space comes back: the file is made with ``auto_vacuum`` ``incremental`` (a file made before is
switched once, with a ``VACUUM``, when it is opened), and once the pages freed by thinning,
expiry or acknowledgements exceed `RECLAIM_SHARE` of max_mb they are given back to the disk
(``incremental_vacuum`` and a checkpoint that truncates the WAL), so the file shrinks back
under max_mb after a message bigger than the rest or a burst.

A file deleted (or replaced) while the agent runs is noticed at the next append, `pending` or
`stats` (the path no longer names the file opened): the messages, counts and sequence numbers
the open connection still reads are written into a new file at the path (a file found there in
its place is moved aside to ``outbox.sqlite.replaced-<unix time>``), logged at ERROR once and
said in `problem`.

Durability: WAL with ``synchronous`` ``normal`` (the default) survives ``kill -9`` (a committed
row is in the WAL, which the OS holds) and a power cut keeps the file consistent but may lose
the last commits since the WAL was last synced; ``full`` syncs every commit (docs/benchmarks.md
has what each costs). A file SQLite cannot read (a corrupt page, not a database) is moved aside
to ``outbox.sqlite.corrupt-<unix time>`` and a new one started, with `problem` saying so.

The line and zone totals live in the same file (`counts` / `save_counts`: agent/serving/events.py
restores them at start), each with the time it started counting.

Threads: every method may be called from any thread (one connection under a lock): appends come
from the cameras' inference threads and the sampler, deletes from the sender's thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.config.models import OutboxSection

log = logging.getLogger(__name__)

Kind = Literal["deployment", "event", "telemetry"]
#: what goes last when the file is full: the first kind present is dropped first
DROP_ORDER: tuple[Kind, ...] = ("telemetry", "event", "deployment")
Reason = Literal["full", "expired", "unwritten", "too_big", "refused"]
FILE_NAME = "outbox.sqlite"
MIB = 1024 * 1024
#: a row's bytes beside its payload and topic: the id, seq, kind, time and the (kind, seq) index
ROW_OVERHEAD = 80
#: the most batches one append evicts when the pages in use, not the rows' bytes, exceed the file's share
HARD_BATCHES = 16
#: the least time between two "full" warnings in the log (seconds)
WARN_EVERY_S = 60.0
#: the free pages' share of max_mb above which they are given back to the disk
RECLAIM_SHARE = 8
#: the tables a recreated file is given again from the file deleted under the agent, in order
_TABLES = ("messages", "topic_seqs", "dropped", "counts", "meta")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    msg_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    topic TEXT NOT NULL,
    created REAL NOT NULL,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_kind ON messages (kind, seq);
CREATE TABLE IF NOT EXISTS topic_seqs (
    topic TEXT PRIMARY KEY,
    last INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dropped (
    kind TEXT NOT NULL,
    reason TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (kind, reason)
);
CREATE TABLE IF NOT EXISTS counts (
    pipeline TEXT NOT NULL,
    name TEXT NOT NULL,
    a INTEGER NOT NULL,
    b INTEGER NOT NULL,
    since REAL NOT NULL,
    PRIMARY KEY (pipeline, name)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Pending:
    """One message waiting for the broker: `seq`, `msg_id`, `topic`, the `payload` as sent."""

    seq: int
    msg_id: str
    kind: Kind
    topic: str
    created: float
    payload: bytes


@dataclass(frozen=True)
class Dropped:
    """Messages the outbox let go of, by kind (all reasons together) and by reason."""

    telemetry: int = 0
    event: int = 0
    deployment: int = 0
    full: int = 0
    expired: int = 0
    unwritten: int = 0
    too_big: int = 0
    refused: int = 0  # the broker's PUBACK refused them (an ACL that denies the topic): it dropped them

    @property
    def total(self) -> int:
        return self.telemetry + self.event + self.deployment


@dataclass(frozen=True)
class OutboxStats:
    """The outbox as `stats()` found it: `messages` waiting, the file's `bytes` (with its WAL),
    the oldest waiting message's age (seconds, None when empty), what was `dropped` since the file
    was made (`since`, Unix seconds), the last `seq` given out, a `problem` (the file was
    corrupt and moved aside, or the disk refuses writes) and the times the file was deleted or
    replaced under this run and made again (`recreated`)."""

    messages: int
    bytes: int
    max_bytes: int
    oldest_age_s: float | None
    dropped: Dropped
    since: float
    last_seq: int
    problem: str | None = None
    backlog_problem_s: float = 900.0  # a backlog whose oldest message is older is a problem
    recreated: int = 0  # times the file was deleted or replaced under the agent (this run)

    @property
    def stuck(self) -> bool:
        """The oldest waiting message is older than `backlog_problem_s`."""
        return self.oldest_age_s is not None and self.oldest_age_s > self.backlog_problem_s


@dataclass(frozen=True)
class SavedCount:
    """A line's (`a` in, `b` out) or a zone's (`a` total, `b` unused) count as persisted, with
    the Unix time it started counting."""

    pipeline: str
    name: str
    a: int
    b: int
    since: float


def _row_bytes(topic: str, payload: bytes) -> int:
    return len(payload) + len(topic.encode()) + ROW_OVERHEAD


def with_ids(payload: bytes, msg_id: str, seq: int, topic_seq: int) -> bytes:
    """A compact JSON object `payload` with ``"msg_id"``, ``"seq"`` and ``"topic_seq"`` put first."""
    body = payload.strip()
    if not body.startswith(b"{") or not body.endswith(b"}"):
        raise ValueError("an outbox payload is a JSON object")
    head = b'{"msg_id":"%s","seq":%d,"topic_seq":%d' % (msg_id.encode(), seq, topic_seq)
    rest = body[1:].lstrip()
    return head + (b"}" if rest == b"}" else b"," + rest)


def _stats(
    db: sqlite3.Connection,
    path: Path,
    settings: OutboxSection,
    now: float,
    problem: str | None,
    unwritten: int,
    recreated: int = 0,
) -> OutboxStats:
    (count,) = db.execute("SELECT COUNT(*) FROM messages").fetchone()
    oldest = db.execute("SELECT created FROM messages ORDER BY seq LIMIT 1").fetchone()
    drops = db.execute("SELECT kind, reason, n FROM dropped").fetchall()
    since = db.execute("SELECT value FROM meta WHERE key = 'since'").fetchone()
    last = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
    by_kind = {kind: 0 for kind in DROP_ORDER}
    by_reason = {"full": 0, "expired": 0, "unwritten": unwritten, "too_big": 0, "refused": 0}
    for kind, reason, n in drops:
        by_kind[kind] = by_kind.get(kind, 0) + int(n)
        by_reason[reason] = by_reason.get(reason, 0) + int(n)
    size = sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())
    return OutboxStats(
        messages=int(count),
        bytes=size,
        max_bytes=int(settings.max_mb * MIB),
        oldest_age_s=round(max(0.0, now - float(oldest[0])), 3) if oldest is not None else None,
        dropped=Dropped(
            telemetry=by_kind["telemetry"],
            event=by_kind["event"],
            deployment=by_kind["deployment"],
            full=by_reason["full"],
            expired=by_reason["expired"],
            unwritten=by_reason["unwritten"],
            too_big=by_reason["too_big"],
            refused=by_reason["refused"],
        ),
        since=float(since[0]) if since is not None else 0.0,
        last_seq=int(last[0]) if last is not None else 0,
        problem=problem,
        backlog_problem_s=settings.backlog_problem_s,
        recreated=recreated,
    )


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at `path` (device, inode); None when there is none."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


def peek(path: Path, settings: OutboxSection, now: float) -> OutboxStats | None:
    """The outbox at `path` read without writing (``edge-agent doctor`` beside the running
    agent); None when there is none yet. Raises `sqlite3.DatabaseError` for a file SQLite
    cannot read."""
    if not path.exists():
        return None
    db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)  # a URI names an absolute path
    try:
        return _stats(db, path, settings, now, None, 0)
    finally:
        db.close()


class Outbox:
    """The outbox file at `path` with `settings`; `clock` gives Unix seconds (the messages' age)."""

    def __init__(self, path: Path, settings: OutboxSection, clock: Callable[[], float] = time.time) -> None:
        self.path, self.settings, self._clock = path, settings, clock
        self.max_bytes = int(settings.max_mb * MIB)
        self._lock = threading.Lock()
        self._problem: str | None = None
        self._warned_at: float | None = None  # when the outbox last said it is full
        self._unwritten: dict[Kind, int] = {}  # refused writes not yet counted in the file (it may be what refused)
        self._refusing = False  # the disk refused the last write (logged once until one works)
        self._identity: tuple[int, int] | None = None  # the file opened (None: in memory)
        self.recreated = 0  # times the file was deleted under the agent and made again
        self._db = self._open()
        self._content = self._content_now()  # the rows' bytes, kept as rows come and go

    # -- opening -------------------------------------------------------------------------------

    def _content_now(self) -> int:
        (content,) = self._db.execute(
            f"SELECT COALESCE(SUM(LENGTH(payload) + LENGTH(topic) + {ROW_OVERHEAD}), 0) FROM messages"
        ).fetchone()
        return int(content)

    def _open(self) -> sqlite3.Connection:
        """The file; one SQLite cannot read is moved aside for a new one; without a usable file
        (a read-only or missing state directory) a database in memory (lost on restart), said in
        `problem`."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return self._connect(self.path)
        except sqlite3.DatabaseError as exc:
            if self.path.exists() and "unable to open" not in str(exc):
                return self._move_aside(exc)
            failure: Exception = exc
        except OSError as exc:
            failure = exc
        self._problem = f"the outbox cannot open {self.path} ({failure}): messages are kept in memory only"
        log.error("%s", self._problem)
        return self._connect(":memory:")

    def _move_aside(self, exc: sqlite3.DatabaseError) -> sqlite3.Connection:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(self._clock())}")
        for suffix in ("", "-wal", "-shm"):
            part = self.path.with_name(self.path.name + suffix)
            if part.exists():
                part.replace(aside.with_name(aside.name + suffix))
        self._problem = (
            f"the outbox {self.path} could not be read ({exc}); moved aside to {aside.name} and a new one "
            "started: the messages it held were not sent"
        )
        log.error("%s", self._problem)
        try:
            return self._connect(self.path)
        except (sqlite3.DatabaseError, OSError) as again:
            self._problem += f"; the new one cannot be opened either ({again}): messages are kept in memory only"
            return self._connect(":memory:")

    def _connect(self, where: Path | str) -> sqlite3.Connection:
        db = sqlite3.connect(where, check_same_thread=False, isolation_level=None)
        try:
            self._incremental_vacuum(db)
            db.execute("PRAGMA journal_mode=WAL").fetchone()
            db.execute(f"PRAGMA synchronous={self.settings.synchronous.upper()}")
            page = int(db.execute("PRAGMA page_size").fetchone()[0])
            self._wal_pages = max(8, self.max_bytes // page // 32)  # the WAL's share of max_mb
            db.execute(f"PRAGMA wal_autocheckpoint={self._wal_pages}")
            db.execute(f"PRAGMA journal_size_limit={self._wal_pages * page}")
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check}")
            db.executescript(_SCHEMA)
            db.execute("INSERT OR IGNORE INTO meta VALUES ('since', ?)", (repr(self._clock()),))
        except sqlite3.DatabaseError:
            db.close()
            raise
        self._page = page
        self._identity = _identity(Path(where)) if where != ":memory:" else None
        return db

    def _incremental_vacuum(self, db: sqlite3.Connection) -> None:
        """Make `db` give freed pages back on request: set at once on a new file; a file made
        before is switched by a ``VACUUM`` (left as it was when the disk refuses one)."""
        if int(db.execute("PRAGMA auto_vacuum").fetchone()[0]) == 2:
            return
        db.execute("PRAGMA auto_vacuum=INCREMENTAL")
        if db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is None:
            return  # a new file: in force from the first table on
        try:
            db.execute("VACUUM")
        except sqlite3.OperationalError as exc:  # no room for the copy VACUUM makes: next time
            log.warning("outbox: cannot switch %s to reclaim freed space yet: %s", self.path, exc)

    @property
    def problem(self) -> str | None:
        """Why the outbox is not what it should be (None: it is)."""
        return self._problem

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- messages ------------------------------------------------------------------------------

    def append(self, kind: Kind, topic: str, payload: bytes, kept_in_memory: bool = False) -> Pending | None:
        """Keep a message (a compact JSON object) until the broker acknowledges it; None when the
        disk refused it (logged at the first of a run; counted as ``unwritten`` unless the caller
        keeps it in memory instead, `kept_in_memory`)."""
        now = self._clock()
        msg_id = uuid.uuid4().hex
        with self._lock:
            self._replaced_locked()
            try:
                self._db.execute("BEGIN IMMEDIATE")
                seq, topic_seq = self._next_seq(), self._next_topic_seq(topic)
                body = with_ids(payload, msg_id, seq, topic_seq)
                self._db.execute(
                    "INSERT INTO messages (seq, msg_id, kind, topic, created, payload) VALUES (?, ?, ?, ?, ?, ?)",
                    (seq, msg_id, kind, topic, now, body),
                )
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                if not kept_in_memory:
                    self._unwritten[kind] = self._unwritten.get(kind, 0) + 1
                if not self._refusing:
                    log.error("outbox: cannot write %s (%s): messages go out only while connected", self.path, exc)
                self._refusing = True
                self._problem = self._problem or f"the outbox cannot write {self.path}: {exc}"
                return None
            self._content += _row_bytes(topic, body)
            if self._refusing or self._unwritten:
                self._recovered_locked()
            self._bound_locked(now)
            return Pending(seq, msg_id, kind, topic, now, body)

    def _recovered_locked(self) -> None:
        """A write works again: the refused ones go into the file's counts."""
        self._refusing = False
        try:
            for kind, n in sorted(self._unwritten.items()):
                self._count_locked(kind, "unwritten", n)
                del self._unwritten[kind]
        except sqlite3.Error:
            return
        if self._problem is not None and "cannot write" in self._problem:
            self._problem = None

    def _next_seq(self) -> int:
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
        return (int(row[0]) if row else 0) + 1

    def _next_topic_seq(self, topic: str) -> int:
        """The next number of `topic`'s own sequence, counted in the append's transaction."""
        self._db.execute(
            "INSERT INTO topic_seqs (topic, last) VALUES (?, 1) ON CONFLICT (topic) DO UPDATE SET last = last + 1",
            (topic,),
        )
        return int(self._db.execute("SELECT last FROM topic_seqs WHERE topic = ?", (topic,)).fetchone()[0])

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("ROLLBACK")

    def pending(self, after: int, limit: int) -> list[Pending]:
        """Up to `limit` waiting messages with a sequence number above `after`, oldest first."""
        with self._lock:
            self._replaced_locked()
            rows = self._db.execute(
                "SELECT seq, msg_id, kind, topic, created, payload FROM messages WHERE seq > ? ORDER BY seq LIMIT ?",
                (after, limit),
            ).fetchall()
        return [Pending(int(r[0]), r[1], r[2], r[3], float(r[4]), bytes(r[5])) for r in rows]

    def acked(self, messages: Iterable[Pending]) -> None:
        """The broker has these: forget them."""
        batch = list(messages)
        if not batch:
            return
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for message in batch:
                    if self._db.execute("DELETE FROM messages WHERE seq = ?", (message.seq,)).rowcount:
                        self._content -= _row_bytes(message.topic, message.payload)
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                log.warning(
                    "outbox: cannot forget %d acknowledged message(s): %s (they may be sent again)", len(batch), exc
                )

    def discard(self, message: Pending, reason: Reason) -> None:
        """Let `message` go unsent, counted: the broker would refuse it (``too_big``) or did
        (``refused``)."""
        with self._lock:
            try:
                self._drop_locked("seq = ?", (message.seq,), reason)
            except sqlite3.Error as exc:
                log.warning("outbox: cannot drop message %d: %s", message.seq, exc)

    def bound(self) -> None:
        """Drop what is too old and what does not fit (`append` does this as it goes)."""
        with self._lock:
            self._bound_locked(self._clock())

    def _bound_locked(self, now: float) -> None:
        """Expire, then evict while the rows' bytes exceed their share of max_mb (half: pages
        left part full by deletes in the middle) or the
        pages in use exceed the main file's share."""
        try:
            cutoff = now - self.settings.max_age_h * 3600
            oldest = self._db.execute("SELECT created FROM messages ORDER BY seq LIMIT 1").fetchone()
            if oldest is not None and float(oldest[0]) < cutoff:
                self._drop_locked("created < ?", (cutoff,), "expired")
            budget = self._budget()
            while self._content > budget // 2 and self._evict_locked():
                pass
            for _ in range(HARD_BATCHES):  # pages part full after thinning: drop more until they free
                if self._used_bytes() <= budget or not self._evict_locked():
                    break
            self._reclaim_locked()
        except sqlite3.Error as exc:
            self._rollback()
            log.warning("outbox: cannot keep %s within its bounds: %s", self.path, exc)

    def _reclaim_locked(self) -> None:
        """Give the free pages back to the disk once they exceed their share of max_mb (the
        checkpoint moves the shorter file from the WAL into place and empties the WAL)."""
        free = int(self._db.execute("PRAGMA freelist_count").fetchone()[0])
        if free * self._page <= self.max_bytes // RECLAIM_SHARE:
            return
        self._db.executescript("PRAGMA incremental_vacuum;")  # stepped to the end: one page a step
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()

    def _replaced_locked(self) -> None:
        """When the path no longer names the file opened (deleted or replaced under the agent),
        write what the open connection still reads into a new file there (see the module text)."""
        if self._identity is None or _identity(self.path) == self._identity:
            return
        found = self.path.exists()
        old = self._db
        try:
            held = {table: old.execute(f"SELECT * FROM {table}").fetchall() for table in _TABLES}
            (last,) = old.execute("SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence").fetchone()
        except sqlite3.Error as exc:
            held, last = {}, 0
            log.error("outbox: cannot read the outbox deleted under the agent: %s", exc)
        self.recreated += 1
        aside = self.path.with_name(f"{self.path.name}.replaced-{int(self._clock())}")
        for suffix in ("", "-wal", "-shm"):  # a file put in its place is kept; the old one's journals go
            part = self.path.with_name(self.path.name + suffix)
            with contextlib.suppress(OSError):
                if found:
                    part.replace(aside.with_name(aside.name + suffix))
                else:
                    part.unlink(missing_ok=True)
        with contextlib.suppress(sqlite3.Error):  # after: closing may checkpoint into, and unlink, journals by name
            old.close()
        self._db = self._open()
        try:
            self._db.execute("BEGIN IMMEDIATE")
            for table, rows in held.items():
                for row in rows:
                    marks = ",".join("?" * len(row))
                    self._db.execute(f"INSERT OR REPLACE INTO {table} VALUES ({marks})", row)
            self._db.execute("DELETE FROM sqlite_sequence WHERE name = 'messages'")
            self._db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('messages', ?)", (last,))
            self._db.execute("COMMIT")
            self._content = self._content_now()
        except sqlite3.Error as exc:
            self._rollback()
            log.error("outbox: cannot write the held messages into the new %s: %s", self.path, exc)
        kept = len(held.get("messages", []))
        what = "deleted" if not found else f"replaced (that file moved aside to {aside.name})"
        self._problem = (
            f"the outbox {self.path} was {what} while the agent ran ({self.recreated} time(s)); made again with "
            f"the {kept} message(s) still held"
        )
        log.error("%s", self._problem)

    def _budget(self) -> int:
        """What the main file may hold: max_mb less the WAL's room (it is checkpointed at a
        32nd of max_mb and cut back to that, so it reaches about twice that) and a margin for
        the pages one append adds before it is bounded."""
        return self.max_bytes - 4 * self._wal_pages * self._page

    def _used_bytes(self) -> int:
        pages = int(self._db.execute("PRAGMA page_count").fetchone()[0])
        free = int(self._db.execute("PRAGMA freelist_count").fetchone()[0])
        return (pages - free) * self._page

    def _evict_locked(self) -> bool:
        """Drop one batch by the priorities; False when nothing is left to drop."""
        for kind in DROP_ORDER:
            seqs = [
                int(r[0]) for r in self._db.execute("SELECT seq FROM messages WHERE kind = ? ORDER BY seq", (kind,))
            ]
            if not seqs:
                continue
            if kind == "telemetry" and len(seqs) > 1:
                victims = seqs[: max(2, len(seqs) // 2)][1::2]  # every other of the oldest half: still covered
            else:
                victims = seqs[: max(1, len(seqs) // 20)]
            marks = ",".join("?" * len(victims))
            self._drop_locked(f"seq IN ({marks})", tuple(victims), "full")
            if self._warned_at is None or self._clock() - self._warned_at >= WARN_EVERY_S:
                self._warned_at = self._clock()
                log.warning(
                    "outbox: full (%.1f MiB): dropping %s messages (%d now; the counts are in telemetry)",
                    self.settings.max_mb,
                    kind,
                    len(victims),
                )
            return True
        return False

    def _drop_locked(self, where: str, args: tuple[float, ...] | tuple[int, ...], reason: Reason) -> None:
        rows = self._db.execute(
            f"SELECT kind, COUNT(*), SUM(LENGTH(payload) + LENGTH(topic)) FROM messages WHERE {where} GROUP BY kind",
            args,
        ).fetchall()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.execute(f"DELETE FROM messages WHERE {where}", args)
            for kind, n, size in rows:
                self._count_locked(kind, reason, int(n))
                self._content -= int(size) + ROW_OVERHEAD * int(n)
            self._db.execute("COMMIT")
        except sqlite3.Error:
            self._rollback()
            raise

    def _count_locked(self, kind: str, reason: Reason, n: int) -> None:
        if n:
            self._db.execute(
                "INSERT INTO dropped VALUES (?, ?, ?) ON CONFLICT (kind, reason) DO UPDATE SET n = n + excluded.n",
                (kind, reason, n),
            )

    # -- what it holds ---------------------------------------------------------------------------

    def stats(self) -> OutboxStats:
        """A consistent reading (any thread)."""
        with self._lock:
            self._replaced_locked()
            unwritten = sum(self._unwritten.values())
            try:
                return _stats(
                    self._db, self.path, self.settings, self._clock(), self._problem, unwritten, self.recreated
                )
            except sqlite3.Error as exc:
                log.warning("outbox: cannot read %s: %s", self.path, exc)
                dropped = Dropped(unwritten=unwritten)
                return OutboxStats(0, 0, self.max_bytes, None, dropped, 0.0, 0, str(exc), recreated=self.recreated)

    # -- line and zone totals ----------------------------------------------------------------------

    def counts(self) -> list[SavedCount]:
        """The line and zone totals as last saved."""
        with self._lock:
            rows = self._db.execute("SELECT pipeline, name, a, b, since FROM counts ORDER BY pipeline, name").fetchall()
        return [SavedCount(r[0], r[1], int(r[2]), int(r[3]), float(r[4])) for r in rows]

    def save_counts(self, counts: Sequence[SavedCount], replace: bool = False) -> None:
        """Write the totals (each row replaced); `replace` first forgets every other one (a reset)."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                if replace:
                    self._db.execute("DELETE FROM counts")
                self._db.executemany(
                    "INSERT OR REPLACE INTO counts VALUES (?, ?, ?, ?, ?)",
                    [(c.pipeline, c.name, c.a, c.b, c.since) for c in counts],
                )
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._rollback()
                log.warning("outbox: cannot save the line and zone totals: %s", exc)
