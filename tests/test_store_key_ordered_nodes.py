"""Key-ordered ``nodes`` (migration 0015): on SQLite the node rows live in their key's b-tree
(WITHOUT ROWID, no ``sqlite_autoindex_nodes_1``), ``archive_permits`` too; the immutability
triggers and gc's permit keep working; a downgrade to 0014 and an upgrade back keep every row."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy.exc import DatabaseError

import rewind
from rewind.replay import Rewind
from rewind.store import Store, migrate, open_store, schema
from rewind.store.retention import collect_garbage, restore_run
from rewind.store.store import DB_FILENAME
from rewind.tracing import Tracer, load_trace, step
from tests import pipelines

NEW_KEY_ORDERED = {"nodes", "archive_permits"}


def _double(n: int) -> int:
    return 2 * n


_twice = step("twice", "tool_call")(rewind.tool("key_ordered_double")(_double))


def _record(store: Store) -> tuple[str, str]:
    """A Burr run and a 3-step trace; their ids."""
    run = Rewind(store).record(pipelines.pipeline, {"x": 7})
    tracer = Tracer(store, raise_on_write_error=True)
    with tracer.trace("key-ordered") as trace:
        _twice(_twice(_twice(1)))
    return run.run_id, trace.trace_id


def _tables(db: Path) -> tuple[set[str], set[str], dict[str, list[tuple]]]:
    """WITHOUT ROWID tables, index and trigger names, and the rows of nodes and calls."""
    with sqlite3.connect(db) as conn:
        master = conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
        rows = {
            t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall()) for t in ("nodes", "calls")
        }
    without = {
        n for t, n, sql in master if t == "table" and sql.rstrip().upper().endswith("WITHOUT ROWID")
    }
    return without, {n for t, n, _ in master if t in ("index", "trigger")}, rows


def test_a_new_store_keeps_nodes_in_key_order_and_refuses_deleting_them(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        run_id, trace_id = _record(store)
        without, names, rows = _tables(tmp_path / DB_FILENAME)
        assert without >= NEW_KEY_ORDERED
        assert not {"sqlite_autoindex_nodes_1", "sqlite_autoindex_archive_permits_1"} & names
        assert {"nodes_immutable_update", "nodes_immutable_delete"} <= names
        assert rows["nodes"]
        with pytest.raises(DatabaseError, match="immutable"), store.write() as conn:
            conn.execute(schema.nodes.delete().where(schema.nodes.c.run_id == run_id))
        with pytest.raises(DatabaseError, match="immutable"), store.write() as conn:
            conn.execute(schema.nodes.update().values(name="x"))
        assert [s.name for s in load_trace(store, trace_id).steps] == ["twice"] * 3
        assert [n.position for n in store.nodes_of(run_id)] == list(range(len(rows["nodes"]) - 3))
    finally:
        store.close()


def test_gc_still_archives_and_restores_runs_through_the_permit(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        run_id, _trace_id = _record(store)
        before = [n.output_hash for n in store.nodes_of(run_id)]
        report = collect_garbage(store, 0.0, now=10.0**10)  # every run is that old
        assert run_id in {a.run_id for a in report.archived}
        with store.read() as conn:
            left = conn.execute(schema.nodes.select().where(schema.nodes.c.run_id == run_id)).all()
            permits = conn.execute(schema.archive_permits.select()).all()
        assert left == [] and permits == []
        restore_run(store, run_id)
        assert [n.output_hash for n in store.nodes_of(run_id)] == before
    finally:
        store.close()


def test_downgrade_to_0014_and_upgrade_keep_every_row(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    db = tmp_path / DB_FILENAME
    try:
        _record(store)
        without, names, rows = _tables(db)
        with store.write() as conn:
            command.downgrade(migrate._config(conn), "0014")  # type: ignore[arg-type]
            assert migrate.current_revision(conn) == "0014"
    finally:
        store.close()
    old_without, old_names, old_rows = _tables(db)
    assert not NEW_KEY_ORDERED & old_without
    assert {"sqlite_autoindex_nodes_1", "nodes_immutable_delete"} <= old_names
    assert old_rows == rows
    store = open_store(tmp_path)  # upgraded back to head when opened
    try:
        with store.read() as conn:
            assert migrate.current_revision(conn) == migrate.HEAD
    finally:
        store.close()
    assert _tables(db) == (without, names, rows)
