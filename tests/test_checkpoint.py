"""WAL checkpoints off the committing thread (rewind.store.checkpoint)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from rewind.store import Store, open_store
from rewind.store import checkpoint as ckpt


def _insert(store: Store, key: str) -> None:
    with store.write() as conn:
        conn.execute(text("INSERT INTO meta(key, value) VALUES (:k, 'x')"), {"k": key})


def test_a_commit_arms_one_checkpoint_and_close_drops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ckpt, "CHECKPOINT_DELAY_S", 3600.0)  # armed, not run, during the test
    store = open_store(tmp_path)
    _insert(store, "a")
    due = ckpt.CHECKPOINTER.due.get(store.engine)
    assert due is not None
    _insert(store, "b")
    assert ckpt.CHECKPOINTER.due.get(store.engine) == due  # one per delay, however many commits
    busy, frames, done = ckpt.checkpoint(store.engine)
    assert (busy, frames > 0, done) == (0, True, frames)  # every frame copied, nothing waited
    store.close()
    assert store.engine not in ckpt.CHECKPOINTER.due  # a closed store is never reopened


def test_the_background_thread_checkpoints_what_was_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = threading.Event()
    seen: list[tuple[int, int, int]] = []
    real = ckpt.checkpoint

    def spy(engine: Any, min_frames: int = 0) -> tuple[int, int, int]:
        seen.append(real(engine, min_frames))
        ran.set()
        return seen[-1]

    monkeypatch.setattr(ckpt, "CHECKPOINT_DELAY_S", 0.0)
    monkeypatch.setattr(ckpt, "CHECKPOINT_MIN_FRAMES", 1)
    monkeypatch.setattr(ckpt, "checkpoint", spy)
    store = open_store(tmp_path)
    ran.clear()
    seen.clear()
    _insert(store, "a")
    assert ran.wait(120), "the checkpoint thread never ran"
    busy, frames, done = seen[-1]
    assert busy == 0 and done == frames
    with store.read() as conn:
        assert conn.execute(text("SELECT value FROM meta WHERE key = 'a'")).scalar() == "x"
    store.close()


def test_no_checkpoint_recreates_a_deleted_store_file(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    _insert(store, "a")
    store.close()
    for f in (tmp_path / "s").glob("rewind.db*"):
        f.unlink()
    assert ckpt.checkpoint(store.engine) == (0, 0, 0)
    assert not list((tmp_path / "s").glob("rewind.db*"))


def test_a_small_wal_is_left_for_later_and_its_frames_are_counted(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    database = str(store.engine.url.database)
    _insert(store, "a")
    waiting = ckpt.pending_frames(database)
    assert waiting is not None and waiting > 0
    assert ckpt.checkpoint(store.engine, waiting + 1) == (0, 0, 0)  # below the threshold
    assert ckpt.pending_frames(database) == waiting
    busy, frames, done = ckpt.checkpoint(store.engine, waiting)
    assert busy == 0 and done == frames >= waiting
    assert ckpt.pending_frames(database) == 0
    store.close()
    assert ckpt.pending_frames(str(tmp_path / "nothing-here.db")) is None


_SHM_DMS_BYTE = 128
"""The byte of a ``-shm`` file every process with the database open holds a shared POSIX lock
on (SQLite's ``UNIX_SHM_DMS``); a process that can lock it exclusively takes itself for the
only user and truncates and rebuilds the ``-shm``."""

_TRY_DMS = (
    "import fcntl, sys\n"
    "with open(sys.argv[1], 'r+b') as f:\n"
    "    try:\n"
    f"        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, {_SHM_DMS_BYTE})\n"
    "    except OSError:\n"
    "        sys.exit(3)\n"
)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX locks")
def test_reading_the_pending_frames_keeps_this_process_s_sqlite_locks(tmp_path: Path) -> None:
    """Finding (flake26): pending_frames opened and closed the ``-shm`` file; closing any
    descriptor of a file drops every POSIX lock the process holds on it, SQLite's included.
    Another process opening the store then took the ``-shm`` for unused and rebuilt it under
    this one: a queued grid's API process died of SIGBUS in a commit, or read a stale snapshot
    (a variant reported without its run, or without its nodes)."""
    store = open_store(tmp_path)
    database = str(store.engine.url.database)
    _insert(store, "a")
    with store.engine.connect() as conn:  # this process has the database (and -shm) open
        conn.exec_driver_sql("SELECT count(*) FROM meta").fetchone()
        held = subprocess.run([sys.executable, "-c", _TRY_DMS, database + "-shm"], check=False)
        assert held.returncode == 3, "the shared lock on the -shm was not held to begin with"
        assert ckpt.pending_frames(database)
        again = subprocess.run([sys.executable, "-c", _TRY_DMS, database + "-shm"], check=False)
        assert again.returncode == 3, "reading the pending frames dropped SQLite's -shm lock"
    store.close()


def test_the_pending_frames_of_a_new_generation_count_from_its_start(tmp_path: Path) -> None:
    """After a checkpoint copied every frame, the next write restarts the WAL (new salts):
    the frames of the old generation still in the file are not counted."""
    store = open_store(tmp_path)
    database = str(store.engine.url.database)
    for n in range(20):
        _insert(store, f"k{n}")
    many = ckpt.pending_frames(database)
    busy, frames, done = ckpt.checkpoint(store.engine)
    assert busy == 0 and done == frames and ckpt.pending_frames(database) == 0
    _insert(store, "after")
    few = ckpt.pending_frames(database)
    assert many is not None and few is not None and 0 < few < many, (many, few)
    store.close()


def test_a_wal_too_small_to_reach_the_threshold_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """checkpoint(min_frames) first bounds the frames by the ``-wal`` file's size (frames of
    SQLite's smallest page): below the threshold it neither reads the WAL nor connects; at or
    above it the estimate decides as before. A missing ``-wal`` bounds nothing."""
    store = open_store(tmp_path)
    database = str(store.engine.url.database)
    _insert(store, "a")
    waiting = ckpt.pending_frames(database)
    bound = ckpt._frames_at_most(database)
    assert waiting is not None and 0 < waiting <= bound
    read: list[str] = []
    real = ckpt.pending_frames
    monkeypatch.setattr(ckpt, "pending_frames", lambda db: read.append(db) or real(db))
    assert ckpt.checkpoint(store.engine, int(bound) + 1) == (0, 0, 0)
    assert read == []  # the size alone was enough
    busy, frames, done = ckpt.checkpoint(store.engine, waiting)
    assert read == [database] and busy == 0 and done == frames >= waiting
    store.close()
    assert ckpt._frames_at_most(database) == float("inf")  # folded and deleted at close
