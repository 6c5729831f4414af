"""open_store(read_only=True): reads an existing store, creates and writes nothing."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from rewind.errors import StoreError
from rewind.replay import Rewind
from rewind.store import open_store, schema
from rewind.store.store import current_owner
from tests import pipelines
from tests.conftest import row_counts


def _database(folder: Path) -> tuple[bytes, int]:
    """The database file's bytes and mtime. (In a writable folder SQLite may add its ``-shm``
    index next to it even for a read-only connection: a WAL reader needs one.)"""
    db = folder / "rewind.db"
    return db.read_bytes(), db.stat().st_mtime_ns


def test_read_only_store_reads_runs_and_writes_nothing(tmp_path: Path) -> None:
    rw = Rewind(tmp_path)
    run_id = rw.record(pipelines.pipeline, {"x": 5}).run_id
    rw.store.close()
    before = _database(tmp_path)
    store = open_store(tmp_path, read_only=True)
    try:
        assert store.get_run(run_id[:8]).status == "completed"
        assert [n.name for n in store.nodes_of(run_id)] == ["start", "expand", "small"]
        with pytest.raises(StoreError, match="read-only"), store.write():
            pass
    finally:
        store.close()
    assert _database(tmp_path) == before


def test_read_only_store_reports_a_dead_process_run_as_interrupted_without_writing(
    tmp_path: Path,
) -> None:
    pid = int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    store = open_store(tmp_path)
    host = current_owner().split(":", 1)[0]
    with store.write() as conn:
        store.create_run(conn, run_id="orphan00", pipeline="tiny", owner=f"{host}:{pid}")
    counts = row_counts(store)
    store.close()

    ro = Rewind(open_store(tmp_path, read_only=True))  # Rewind reaps orphans when it opens
    try:
        shown = ro.store.get_run("orphan00")
        assert shown.status == "interrupted" and "process ended" in (shown.error or "")
        assert [r.status for r in ro.store.list_runs()] == ["interrupted"]
    finally:
        ro.store.close()
    raw = open_store(tmp_path, read_only=True)
    try:
        # The row itself is unchanged: only a writable open marks it.
        with raw.read() as conn:
            status = conn.execute(
                select(schema.runs.c.status).where(schema.runs.c.run_id == "orphan00")
            ).scalar_one()
        assert status == "running"
        assert row_counts(raw) == counts
    finally:
        raw.close()


def test_read_only_open_of_a_missing_store_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no store at"):
        open_store(tmp_path / "nothing", read_only=True)
    assert not (tmp_path / "nothing").exists()
    with pytest.raises(StoreError, match="no store at"):
        open_store(tmp_path / "x.db", read_only=True)
    assert list(tmp_path.iterdir()) == []


def test_read_only_open_of_a_foreign_database_is_a_store_error(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="holds no Rewind store"):
        open_store(tmp_path / "other.db", read_only=True)


def test_unknown_url_scheme_creates_no_artifact_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match="foo://bar"):
        open_store("foo://bar")
    assert list(tmp_path.iterdir()) == []
