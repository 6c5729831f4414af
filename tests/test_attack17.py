"""Attack 17: the changes merged for issue #13 since ec98759 (key-ordered ``nodes`` and
``archive_permits`` (0015), WAL checkpoints on a background thread, packs of at most 8 blobs
asked about first, an empty-pool engine reused without dispose).

Each test is a finding (fixed, or xfail strict with the reason) or a regression test of what
held.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from rewind.store import Store, open_store
from rewind.store import checkpoint as ckpt


def _fill(store: Store, rows: int, tag: str) -> None:
    """``rows`` commits of ~1 KB each (about two WAL frames a commit at 1 KiB pages)."""
    value = os.urandom(450).hex()
    for i in range(rows):
        with store.write() as conn:
            conn.execute(
                text("INSERT INTO meta(key, value) VALUES (:k, :v)"), {"k": f"{tag}{i}", "v": value}
            )


def test_a_store_closed_before_its_checkpoint_ran_leaves_no_big_wal_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding: Store.close dropped the pending checkpoint. Stores that live less than
    CHECKPOINT_DELAY_S (a traced chain opens one per trace) while another connection keeps the
    file open (``rewind serve``, another store of the process) then never had their WAL
    checkpointed by the thread, nor by their close (not the last connection): the WAL grew to
    the writers' 16 MB backstop, checkpointed on a committing thread (before: 4 MB)."""
    monkeypatch.setattr(ckpt, "CHECKPOINT_DELAY_S", 3600.0)  # the thread never gets to it
    monkeypatch.setattr(ckpt, "CHECKPOINT_MIN_FRAMES", 64)
    open_store(tmp_path).close()
    database = str(tmp_path / "rewind.db")
    other = sqlite3.connect(database)  # a reader elsewhere keeps the file open
    try:
        other.execute("SELECT count(*) FROM meta").fetchone()
        for n in range(4):
            store = open_store(tmp_path)
            _fill(store, 60, f"t{n}-")
            store.close()
        pending = ckpt.pending_frames(database)
        assert pending is not None and pending < 64, pending
    finally:
        other.close()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_shm_that_is_a_fifo_does_not_hang_the_checkpoint_thread(tmp_path: Path) -> None:
    """Finding: pending_frames opened ``-shm`` with a blocking open(); a ``-shm`` replaced by
    a FIFO (a hostile folder) blocked the one checkpoint thread of the process for good (no
    store of the process was checkpointed any more) and Store.close, waiting for that
    checkpoint in flight, hung."""
    database = str(tmp_path / "rewind.db")
    os.mkfifo(database + "-shm")
    seen: list[int | None] = []
    reader = threading.Thread(target=lambda: seen.append(ckpt.pending_frames(database)))
    reader.daemon = True
    reader.start()
    reader.join(60)  # a guard against hanging the suite, not a timing assertion
    blocked = reader.is_alive()
    if blocked:
        with open(database + "-shm", "wb"):  # unblock the reader's open
            pass
        reader.join()
    assert not blocked
    assert seen == [None]


def test_0015_upgrades_and_downgrades_a_store_with_a_view_of_nodes(tmp_path: Path) -> None:
    """Finding: 0015 rebuilt ``nodes`` and ``archive_permits`` by new table, copy, drop,
    rename; a view of either (a user's own, e.g. for a dashboard) left dangling by the drop
    made SQLite refuse the rename ("error in view ...: no such table: main.nodes"), so the
    store could not be opened by this Rewind at all (nor downgraded)."""
    from alembic import command

    from rewind.store import migrate

    store = open_store(tmp_path)
    try:
        _fill(store, 1, "x")
        with store.write() as conn:
            command.downgrade(migrate._config(conn), "0014")  # type: ignore[arg-type]
    finally:
        store.close()
    db = tmp_path / "rewind.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE VIEW my_nodes AS SELECT run_id, name FROM nodes")
        conn.execute("CREATE VIEW my_permits AS SELECT run_id FROM archive_permits")
    store = open_store(tmp_path)  # upgraded to head
    try:
        with store.read() as conn:
            assert migrate.current_revision(conn) == migrate.HEAD
            assert conn.execute(text("SELECT count(*) FROM my_nodes")).scalar() == 0
        with store.write() as conn:
            command.downgrade(migrate._config(conn), "0014")  # type: ignore[arg-type]
            assert conn.execute(text("SELECT count(*) FROM my_permits")).scalar() == 0
    finally:
        store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA legacy_alter_table").fetchone() == (0,)


def test_many_stores_closed_while_the_thread_checkpoints_leave_single_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held: more stores than the engine cache keeps (8), checkpointed by the thread at every
    commit; once each is closed no connection of this process is left open on it (its ``-wal``
    and ``-shm`` are gone: ``rewind.db`` alone is the whole store, a plain ``cp`` copies it)."""
    monkeypatch.setattr(ckpt, "CHECKPOINT_DELAY_S", 0.0)
    monkeypatch.setattr(ckpt, "CHECKPOINT_MIN_FRAMES", 1)
    stores = [open_store(tmp_path / f"s{i}") for i in range(12)]
    for round_ in range(5):
        for i, store in enumerate(stores):
            _fill(store, 3, f"r{round_}-{i}-")
    for store in stores:
        store.close()
    for i in range(12):
        folder = tmp_path / f"s{i}"
        assert sorted(p.name for p in folder.glob("rewind.db*")) == ["rewind.db"], i
        with sqlite3.connect(folder / "rewind.db") as conn:
            (count,) = conn.execute("SELECT count(*) FROM meta WHERE key LIKE 'r%'").fetchone()
            assert count == 15


class _NoThreads(threading.Thread):
    """A thread that cannot be started (a process at its thread limit: RLIMIT_NPROC, a
    container's pids.max; or Python 3.12+ at interpreter shutdown)."""

    def start(self) -> None:
        raise RuntimeError("can't start new thread")


def test_a_commit_is_not_reported_failed_when_no_checkpoint_thread_can_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finding: WalCheckpointer.wrote ("never raises") started the thread after the commit
    without catching the RuntimeError of Thread.start: a committed write raised from
    Store.write, so its caller (a recorder's flush, a trace's exit write) took committed rows
    for lost. Without the thread the writers' own autocheckpoint remains."""
    from rewind.store import store as store_module

    fresh = ckpt.WalCheckpointer()
    monkeypatch.setattr(ckpt, "CHECKPOINTER", fresh)
    monkeypatch.setattr(store_module, "CHECKPOINTER", fresh)
    monkeypatch.setattr(ckpt.threading, "Thread", _NoThreads)
    store = open_store(tmp_path)
    try:
        _fill(store, 2, "k")  # raised RuntimeError after the first commit
        with store.read() as conn:
            assert conn.execute(text("SELECT count(*) FROM meta WHERE key LIKE 'k%'")).scalar() == 2
    finally:
        store.close()
