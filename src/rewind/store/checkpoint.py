"""WAL checkpoints off the committing threads (SQLite stores).

A SQLite store runs in WAL mode: a commit appends pages to ``rewind.db-wal``, and a
*checkpoint* copies them into ``rewind.db`` (both files are fsynced) so the WAL can start over.
Left to SQLite, the commit that takes the WAL past ``wal_autocheckpoint`` pages runs the
checkpoint itself, on the thread that commits: a run's node rows waited for a 4 MB copy and two
fsyncs (5–30 ms spikes on the run's thread; a recorded 100-node run writes ~0.75 MB of WAL, so
every fifth or sixth run had one).

Here a background thread does it: a commit of a writable SQLite store only notes that its
database has new WAL frames (:meth:`WalCheckpointer.wrote`, a dict update under a lock), and
:data:`CHECKPOINT_DELAY_S` later the thread reads how many frames wait in the WAL (the
wal-index header in the ``-shm`` file) and, from :data:`CHECKPOINT_MIN_FRAMES` on, runs
``PRAGMA wal_checkpoint(PASSIVE)`` on one of that store's pooled connections: as many
checkpoints as SQLite's own, at most one per database per delay. A PASSIVE checkpoint never
waits for a lock and never blocks a writer or a reader (it copies the frames no reader still
needs), and it changes no committed data: durability stays what ``synchronous=NORMAL``
gives, and a crash during a checkpoint is recovered by SQLite as any other. The writers' own
``wal_autocheckpoint`` stays as a backstop at a larger size
(:data:`rewind.store.engine.SQLITE_WAL_AUTOCHECKPOINT_PAGES`), in case this thread falls
behind."""

from __future__ import annotations

import logging
import os
import stat
import struct
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

CHECKPOINT_DELAY_S = 0.5
"""Time from a database's first commit after its last checkpoint to the next checkpoint (s).
A recording writes at most ~20 MB of WAL a second (100-node chain of cheap nodes, 2 cores), so
the WAL stays under the writers' 16 MB backstop; a recording of slower nodes writes far less
and gets at most two small checkpoints a second."""


CHECKPOINT_MIN_FRAMES = 4096
"""WAL frames (pages) not yet copied into the database below which the thread leaves the WAL
as it is: 4 MB at 1 KiB pages, the size after which SQLite's default checkpoints, so the copies
and fsyncs are as many as before, only off the committing thread."""

_WAL_INDEX_VERSION = 3007000
"""``iVersion`` of the wal-index header in the ``-shm`` file (https://sqlite.org/walformat.html)."""


def pending_frames(database: str) -> int | None:
    """WAL frames of ``database`` not yet checkpointed, read from the wal-index header in its
    ``-shm`` file (``mxFrame`` minus ``nBackfill``, native byte order, see
    https://sqlite.org/walformat.html, section 2.2); None when the file cannot be read or has
    another layout. Read without a lock: an estimate, which only decides whether to checkpoint.
    """
    try:
        # Non-blocking, and only a regular file: a FIFO put in its place (a hostile folder)
        # would block the process's one checkpoint thread, and every Store.close with it.
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(database + "-shm", flags)
        try:
            head = os.read(fd, 100) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
    except OSError:
        return None
    if len(head) < 100:
        return None
    version, _unused, _change, _init, _endian, _page, max_frame = struct.unpack_from(
        "=IIIBBHI", head, 0
    )
    (backfilled,) = struct.unpack_from("=I", head, 96)
    if version != _WAL_INDEX_VERSION or backfilled > max_frame:
        return None
    return max_frame - backfilled


class WalCheckpointer:
    """Checkpoints the WAL of SQLite engines whose connections committed, from one background
    thread per process (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.due: dict[Any, float] = {}  # engine -> time.monotonic() of its next checkpoint
        self.busy: Any = None  # the engine being checkpointed
        self.thread: threading.Thread | None = None
        self.pid = 0

    def wrote(self, engine: Any) -> None:
        """Note that ``engine`` (a SQLite engine) committed: its WAL is checkpointed within
        :data:`CHECKPOINT_DELAY_S`. Cheap (no I/O); never raises."""
        with self.lock:
            if engine in self.due:
                return
            self.due[engine] = time.monotonic() + CHECKPOINT_DELAY_S
            if self.thread is None or self.pid != os.getpid() or not self.thread.is_alive():
                self.pid = os.getpid()
                self.thread = threading.Thread(
                    target=self._loop, name="rewind-checkpoint", daemon=True
                )
                try:
                    self.thread.start()
                except RuntimeError as exc:  # at the thread limit, or at interpreter shutdown
                    # The commit is done: raising would report it lost. The writers' own
                    # autocheckpoint remains; the next commit tries again.
                    self.thread = None
                    del self.due[engine]
                    logger.debug("no WAL checkpoint thread: %s", exc)
            else:
                self.lock.notify()

    def forget(self, engine: Any) -> bool:
        """Drop ``engine``'s pending checkpoint and wait for one in flight (its store is
        closing: the engine must not open a connection afterwards, which would recreate the
        ``-wal``/``-shm`` files of a closed store). Returns whether one was pending: the
        closing store then runs it itself (:func:`checkpoint_on_close`)."""
        with self.lock:
            pending = self.due.pop(engine, None) is not None
            while self.busy is engine and self.pid == os.getpid():
                self.lock.wait(1.0)
        return pending and self.pid == os.getpid()

    def _loop(self) -> None:
        while True:
            with self.lock:
                while not self.due:
                    self.lock.wait()
                engine, when = min(self.due.items(), key=lambda item: item[1])
                wait = when - time.monotonic()
                if wait > 0:
                    self.lock.wait(wait)
                    continue
                del self.due[engine]
                self.busy = engine
            try:
                checkpoint(engine, CHECKPOINT_MIN_FRAMES)
            except Exception as exc:  # a lost connection, a closed file: the backstop remains
                logger.debug("WAL checkpoint failed: %s", exc)
            finally:
                with self.lock:
                    self.busy = None
                    self.lock.notify_all()


def checkpoint(engine: Any, min_frames: int = 0) -> tuple[int, int, int]:
    """Run ``PRAGMA wal_checkpoint(PASSIVE)`` on one of ``engine``'s pooled connections
    (outside any transaction); returns SQLite's (busy, WAL frames, frames checkpointed), or
    (0, 0, 0) without connecting when the database file is gone (a deleted store folder: a new
    connection would create an empty database there) or when fewer than ``min_frames`` frames
    wait in its WAL (as far as its ``-shm`` file tells, :func:`pending_frames`)."""
    database = engine.url.database
    if not database or not os.path.exists(database):
        return (0, 0, 0)
    pending = pending_frames(database) if min_frames else None
    if pending is not None and pending < min_frames:
        return (0, 0, 0)
    raw = engine.raw_connection()
    try:
        row = raw.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        raw.close()
    return tuple(row)


CHECKPOINTER = WalCheckpointer()


def checkpoint_on_close(engine: Any) -> None:
    """A closing store's part (call before its engine's ``dispose``): drop its pending
    checkpoint and, when one was pending, run it now on this thread if
    :data:`CHECKPOINT_MIN_FRAMES` or more frames wait. Without it a store closed within
    :data:`CHECKPOINT_DELAY_S` of its first commit (a traced chain opens one per trace) while
    another connection keeps the file open (``rewind serve``, another store), so that its own
    close does not checkpoint, left its WAL to grow to the writers' backstop. Never raises (a
    failed checkpoint leaves the WAL to the next one)."""
    if not CHECKPOINTER.forget(engine):
        return
    try:
        checkpoint(engine, CHECKPOINT_MIN_FRAMES)
    except Exception as exc:  # a lost connection, a closed file: the backstop remains
        logger.debug("WAL checkpoint on close failed: %s", exc)


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: new lock, no thread, nothing due (the
    parent's engines are the parent's; the child's first commit arms its own)."""
    CHECKPOINTER.lock = threading.Condition()
    CHECKPOINTER.due = {}
    CHECKPOINTER.busy = None
    CHECKPOINTER.thread = None


os.register_at_fork(after_in_child=_after_fork_in_child)
