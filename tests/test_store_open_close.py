"""Opening and closing a SQLite store (a traced chain does both once per trace): the schema
check read through the driver, the pool kept across closes, and what must not change."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from rewind.errors import StoreError
from rewind.store import open_store


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_close_folds_the_wal_and_keeps_the_engines_pool(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    pool = store.engine.pool
    with store.write() as conn:
        conn.execute(text("INSERT INTO meta(key, value) VALUES ('oc', 'one')"))
    store.close()
    assert _files(tmp_path) == ["rewind.db"]  # no -wal, no -shm after the last close
    assert store.engine.pool is pool and pool.checkedin() == 0 and pool.checkedout() == 0
    again = open_store(tmp_path)
    assert again.engine is store.engine
    with again.read() as conn:
        assert conn.execute(text("SELECT value FROM meta WHERE key = 'oc'")).scalar() == "one"
    again.close()
    assert _files(tmp_path) == ["rewind.db"]


def test_closing_while_another_store_holds_a_connection_disposes_the_pool(
    tmp_path: Path,
) -> None:
    first = open_store(tmp_path)
    second = open_store(tmp_path)
    assert second.engine is first.engine
    with second.read() as conn:  # a connection checked out while the first store closes
        pool = first.engine.pool
        first.close()
        assert first.engine.pool is not pool  # disposed as before: counts stay exact
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 0
    with second.write() as conn:
        conn.execute(text("INSERT INTO meta(key, value) VALUES ('oc', 'two')"))
    second.close()
    with sqlite3.connect(tmp_path / "rewind.db") as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'oc'").fetchone() == ("two",)


def test_a_file_that_is_no_database_is_a_store_error_and_left_as_it_is(tmp_path: Path) -> None:
    db = tmp_path / "rewind.db"
    db.write_bytes(b"not a database at all " * 64)
    with pytest.raises(StoreError, match="not a database"):
        open_store(tmp_path)
    assert db.read_bytes() == b"not a database at all " * 64
    assert _files(tmp_path) == ["rewind.db"]


def test_a_store_of_a_newer_version_or_unknown_revision_is_refused(tmp_path: Path) -> None:
    open_store(tmp_path).close()
    with sqlite3.connect(tmp_path / "rewind.db") as conn:
        conn.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 999"):
        open_store(tmp_path)
    with sqlite3.connect(tmp_path / "rewind.db") as conn:
        conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
        conn.execute("UPDATE alembic_version SET version_num = 'zzzz'")
    with pytest.raises(StoreError, match="revision zzzz"):
        open_store(tmp_path)


def test_a_foreign_sqlite_file_gets_the_schema_beside_its_own_tables(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "rewind.db") as conn:
        conn.execute("CREATE TABLE theirs (a)")
        conn.execute("INSERT INTO theirs VALUES (1)")
    store = open_store(tmp_path)  # no alembic_version: the write path migrates
    assert store.list_runs() == []
    store.close()
    with sqlite3.connect(tmp_path / "rewind.db") as conn:
        assert conn.execute("SELECT a FROM theirs").fetchall() == [(1,)]


def _payload(x: int) -> dict[str, str]:
    return {"v": f"payload-{x}"}


def test_a_store_kept_open_while_its_file_is_deleted_and_created_again_writes_every_blob(
    tmp_path: Path,
) -> None:
    """A Store (here a Tracer's, kept for many traces) remembers the blobs it wrote. When its
    file is deleted and another store creates it again in this process, the engine's next
    connections open the new file: the remembered blobs are not in it, and trusting them
    wrote rows naming missing blobs (a damaged store: "blob ... is missing"). The write sees
    the other file (meta.store_id) and writes every blob to it."""
    import rewind
    from rewind.tracing import Tracer, step
    from rewind.tracing.store import load_trace

    tool = step("payload", "tool_call")(rewind.tool("open_close_payload")(_payload))
    store = open_store(tmp_path)
    kept = Tracer(store)
    try:
        with kept.trace("kept"):
            for i in range(3):
                tool(i)
        for p in list(tmp_path.iterdir()):
            if p.name.startswith("rewind.db"):
                p.unlink()
        other = Tracer(tmp_path)  # creates the file again (and closes the pool's connections)
        with other.trace("other"):
            pass
        other.close()
        with kept.trace("kept") as t:
            for i in range(3):
                tool(i)
        assert t.write_error is None
    finally:
        store.close()
    reader = open_store(tmp_path)
    try:
        view = load_trace(reader, t.trace_id, payloads=True)
        assert [s.output for s in view.steps] == [_payload(i) for i in range(3)]
    finally:
        reader.close()


def _recreate(folder: Path) -> None:
    """Delete the store's files under whatever holds them open, and let another store create
    them again (closing the shared engine's connections, so the next ones open the new file)."""
    for p in list(folder.iterdir()):
        if p.name.startswith("rewind.db"):
            p.unlink()
    other = open_store(folder)
    try:
        other.put_edges("someone-else", [("x", "y", "")])  # its first write: a new store id
    finally:
        other.close()


def test_edges_written_once_are_written_again_to_a_file_deleted_and_created_again(
    tmp_path: Path,
) -> None:
    """A Store remembers the edges it committed and does not write them again; the memory
    holds for the database it was learned on only. With the file deleted and created again
    under the open store, the same edges (the first write there, nothing else first noticing
    the other file) were skipped: the new file had none."""
    edges = [("a", "b", ""), ("b", "c", "x > 1")]
    store = open_store(tmp_path)
    writes = []
    write = store.write

    def counted(**kwargs: Any) -> Any:
        writes.append(1)
        return write(**kwargs)

    store.write = counted  # type: ignore[method-assign]
    try:
        store.put_edges("p", edges)
        store.put_edges("p", edges)  # remembered: not written again
        assert len(writes) == 1
        assert sorted(store.edges_of("p")) == edges
        _recreate(tmp_path)
        assert store.edges_of("p") == []  # the store reads the new file
        store.put_edges("p", edges)
        assert sorted(store.edges_of("p")) == edges
        store.put_edges("p", edges)  # remembered for the new file
        assert len(writes) == 2
    finally:
        store.close()
    reader = open_store(tmp_path)
    try:
        assert sorted(reader.edges_of("p")) == edges
        assert reader.edges_of("someone-else") == [("x", "y", "")]
    finally:
        reader.close()
