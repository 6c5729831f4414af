"""WAL checkpoints off the committing threads (SQLite stores).

A SQLite store runs in WAL mode: a commit appends pages to ``rewind.db-wal``, and a
*checkpoint* copies them into ``rewind.db`` (both files are fsynced) so the WAL can start over.
Left to SQLite, the commit that takes the WAL past ``wal_autocheckpoint`` pages runs the
checkpoint itself, on the thread that commits: a run's node rows waited for a 4 MB copy and two
fsyncs (5–30 ms spikes on the run's thread; a recorded 100-node run writes ~0.75 MB of WAL, so
every fifth or sixth run had one).

Here a background thread does it: a commit of a writable SQLite store only notes that its
database has new WAL frames (:meth:`WalCheckpointer.wrote`, a dict update under a lock), and
:data:`CHECKPOINT_DELAY_S` later the thread estimates how many frames wait in the WAL (from
the ``-wal`` file, :func:`pending_frames`; never from the ``-shm`` file, whose locks a read
would drop) and, from :data:`CHECKPOINT_MIN_FRAMES` on, runs
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

_WAL_MAGIC = (0x377F0682, 0x377F0683)
"""Magic numbers of a WAL file's header (https://sqlite.org/walformat.html, section 1.1)."""
_WAL_HEADER = 32
_FRAME_HEADER = 24

_backfilled: dict[str, tuple[bytes, int]] = {}
"""Per database: the salts of its WAL when this process last checkpointed it, and the frames
that checkpoint copied (:func:`checkpoint` notes them, :func:`pending_frames` subtracts them)."""


def _open_wal(database: str) -> tuple[int, int] | None:
    """``(fd, size in bytes)`` of ``database``'s ``-wal`` file opened read-only, or None when
    it is not a regular file. The caller closes the fd.

    Raises:
        OSError: the file cannot be opened (missing, no permission).
    """
    # Non-blocking, and only a regular file: a FIFO put in its place (a hostile folder)
    # would block the process's one checkpoint thread, and every Store.close with it.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(database + "-wal", flags)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    return fd, info.st_size


def pending_frames(database: str) -> int | None:
    """WAL frames of ``database`` not yet checkpointed, estimated from its ``-wal`` file: the
    frames of the WAL's current generation (those carrying the salts of its header,
    https://sqlite.org/walformat.html) minus the ones this process's last :func:`checkpoint`
    of that generation copied (a checkpoint by another process is not seen: the estimate is
    then high, and the next PASSIVE checkpoint has nothing to copy). None when the file cannot
    be read or has another layout; 0 when it holds no header yet. Read without a lock: an
    estimate, which only decides whether to checkpoint.

    The ``-shm`` file is never opened here: closing a descriptor of a file drops every POSIX
    lock the process holds on it, SQLite's own included — the wal-index locks that keep this
    process's readers' snapshots from being overwritten, and the lock that tells another
    process opening the database that the ``-shm`` is in use (without it that process
    truncates and rebuilds the ``-shm`` under this process's mapping: SIGBUS, or reads of a
    stale snapshot). SQLite takes no lock on the ``-wal`` file.
    """
    try:
        opened = _open_wal(database)
        if opened is None:
            return None
        fd, size = opened
        try:
            return _generation_frames(fd, size, _backfilled.get(database))
        finally:
            os.close(fd)
    except OSError:
        return None


def _generation_frames(fd: int, size: int, backfilled: tuple[bytes, int] | None) -> int | None:
    """Frames of the WAL open at ``fd`` (``size`` bytes) that carry its header's salts, minus
    ``backfilled`` frames when those were copied from this generation."""
    if size < _WAL_HEADER:
        return 0
    head = os.pread(fd, _WAL_HEADER, 0)
    magic, _version, page = struct.unpack_from(">III", head, 0)
    if magic not in _WAL_MAGIC:
        return None
    page = 65536 if page == 1 else page
    salts = head[16:24]
    stride = page + _FRAME_HEADER

    def current(frame: int) -> bool:  # 1-based; a frame of an older generation has old salts
        return os.pread(fd, 8, _WAL_HEADER + (frame - 1) * stride + 8) == salts

    low, high = 0, (size - _WAL_HEADER) // stride  # frames 1..low are current ones
    while low < high:
        mid = (low + high + 1) // 2
        if current(mid):
            low = mid
        else:
            high = mid - 1
    done = backfilled[1] if backfilled is not None and backfilled[0] == salts else 0
    return max(0, low - done)


_MIN_PAGE = 512
"""SQLite's smallest page size (bytes): a WAL frame is at least this plus its header."""


def _frames_at_most(database: str) -> float:
    """An upper bound of the frames in ``database``'s ``-wal`` file from its size alone (one
    ``stat``, no open): what :func:`pending_frames` reads could not exceed it. Infinite when
    the file is missing or not a regular file (the caller then decides as before)."""
    try:
        info = os.stat(database + "-wal")
    except OSError:
        return float("inf")
    if not stat.S_ISREG(info.st_mode):
        return float("inf")
    return max(0, info.st_size - _WAL_HEADER) // (_MIN_PAGE + _FRAME_HEADER)


def _wal_salts(database: str) -> bytes | None:
    """The salts of ``database``'s WAL header, or None."""
    try:
        opened = _open_wal(database)
        if opened is None:
            return None
        fd = opened[0]
        try:
            head = os.pread(fd, _WAL_HEADER, 0)
        finally:
            os.close(fd)
    except OSError:
        return None
    return head[16:24] if len(head) == _WAL_HEADER else None


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
    wait in its WAL (as far as :func:`pending_frames` estimates)."""
    database = engine.url.database
    if not database or not os.path.exists(database):
        return (0, 0, 0)
    if min_frames and _frames_at_most(database) < min_frames:
        return (0, 0, 0)  # a small WAL (a closing trace's store): no need to read it
    pending = pending_frames(database) if min_frames else None
    if pending is not None and pending < min_frames:
        return (0, 0, 0)
    raw = engine.raw_connection()
    try:
        before = _wal_salts(database)
        row = raw.driver_connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        after = _wal_salts(database)
    finally:
        raw.close()
    if before is not None and before == after:  # no writer restarted the WAL meanwhile
        _backfilled[database] = (after, int(row[2]))
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
