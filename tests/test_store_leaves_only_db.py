"""After the last user of a SQLite store is done with it, its folder holds only ``rewind.db``:
no ``-wal`` or ``-shm`` file (issue #13 counts every file of the folder as stored bytes; a
``-shm`` is 32 KiB). Read-only uses left both behind (SQLite cannot checkpoint through a
``mode=ro`` connection, so its close never deletes them); a store another process or another
store of this process still holds keeps them, with its committed rows."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from rewind.api import create_app
from rewind.replay import Rewind
from rewind.store import open_store
from tests import pipelines
from tests.cli_process import run_rewind


def _db_files(folder: Path) -> list[str]:
    """The SQLite files of the store folder (artifacts aside)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("rewind.db"))


def _recorded(folder: Path) -> str:
    """A store with one recorded run, closed; returns the run's id."""
    rw = Rewind(folder)
    try:
        run_id = rw.record(pipelines.pipeline, {"x": 5}).run_id
    finally:
        rw.store.close()
    assert _db_files(folder) == ["rewind.db"]
    return run_id


def _held(folder: Path) -> str:
    """The value of ``meta.held``, read through a new read-only store (closed after)."""
    store = open_store(folder, read_only=True)
    try:
        with store.read() as conn:
            return conn.execute(text("SELECT value FROM meta WHERE key = 'held'")).scalar_one()
    finally:
        store.close()


def test_a_read_only_store_opened_read_and_closed_leaves_only_the_database(
    tmp_path: Path,
) -> None:
    run_id = _recorded(tmp_path)
    store = open_store(tmp_path, read_only=True)
    try:
        assert store.get_run(run_id).status == "completed"
        assert [n.name for n in store.nodes_of(run_id)] == ["start", "expand", "small"]
        assert "rewind.db-shm" in _db_files(tmp_path)  # a WAL reader's index, while open
        # its connections refuse a write statement (query_only), not only Store.write
        with pytest.raises(OperationalError, match="readonly"), store.read() as conn:
            conn.execute(text("INSERT INTO meta(key, value) VALUES ('ro', 'no')"))
        with pytest.raises(OperationalError, match="readonly"), store.read() as conn:
            conn.execute(text("DELETE FROM runs"))
    finally:
        store.close()
    assert _db_files(tmp_path) == ["rewind.db"]
    assert _run_count(tmp_path) == 1


def _run_count(folder: Path) -> int:
    con = sqlite3.connect(folder / "rewind.db")
    try:
        return con.execute("SELECT count(*) FROM runs").fetchone()[0]
    finally:
        con.close()


def test_a_read_command_leaves_only_the_database(tmp_path: Path) -> None:
    run_id = _recorded(tmp_path)
    for args in (["runs", "--json"], ["show", run_id]):
        proc = run_rewind("--store", str(tmp_path), *args)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert run_id in proc.stdout
        assert _db_files(tmp_path) == ["rewind.db"], args


def test_the_api_server_started_and_stopped_leaves_only_the_database(tmp_path: Path) -> None:
    run_id = _recorded(tmp_path)
    with TestClient(create_app(str(tmp_path))) as client:
        assert client.get(f"/api/runs/{run_id}").json()["status"] == "completed"
    assert _db_files(tmp_path) == ["rewind.db"]


def test_a_read_only_store_of_a_file_it_may_not_write_still_reads(tmp_path: Path) -> None:
    """A database this process may not write (another user's file in a shared folder) is read
    through ``mode=ro``: its ``-wal``/``-shm`` stay (SQLite cannot delete them), rows read."""
    run_id = _recorded(tmp_path)
    (tmp_path / "rewind.db").chmod(0o444)
    try:
        proc = run_rewind("--store", str(tmp_path), "runs", "--json", obey_file_modes=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert run_id in proc.stdout
    finally:
        (tmp_path / "rewind.db").chmod(0o644)
    assert _recorded(tmp_path) != run_id  # still a good store, written after


def test_a_store_held_open_by_this_process_keeps_its_wal_when_a_reader_closes(
    tmp_path: Path,
) -> None:
    holder = open_store(tmp_path)
    try:
        with holder.write() as conn:
            conn.execute(text("INSERT INTO meta(key, value) VALUES ('held', 'yes')"))
        wal = tmp_path / "rewind.db-wal"
        size = wal.stat().st_size
        assert size > 0  # the row is only in the WAL (far below a checkpoint's size)
        assert _held(tmp_path) == "yes"
        assert _db_files(tmp_path) == ["rewind.db", "rewind.db-shm", "rewind.db-wal"]
        assert wal.stat().st_size == size
        with holder.read() as conn:
            assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 0
    finally:
        holder.close()
    assert _db_files(tmp_path) == ["rewind.db"]
    assert _held(tmp_path) == "yes"


_HOLDER = """
import sys
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from rewind.store import open_store

store = open_store(sys.argv[1])
with store.write() as conn:
    conn.execute(text("INSERT INTO meta(key, value) VALUES ('held', 'yes')"))
print("ready", flush=True)
sys.stdin.readline()
with store.write() as conn:
    conn.execute(text("UPDATE meta SET value = 'again' WHERE key = 'held'"))
store.close()
print("closed", flush=True)
"""


def test_a_store_another_process_holds_keeps_its_wal_and_rows_when_readers_close(
    tmp_path: Path,
) -> None:
    run_id = _recorded(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "ready"
        wal = tmp_path / "rewind.db-wal"
        size = wal.stat().st_size
        assert size > 0
        # readers of every kind come and go while the other process keeps the store open
        assert _held(tmp_path) == "yes"
        proc = run_rewind("--store", str(tmp_path), "runs", "--json")
        assert proc.returncode == 0 and run_id in proc.stdout, proc.stderr[-2000:]
        con = sqlite3.connect(tmp_path / "rewind.db")
        assert con.execute("SELECT value FROM meta WHERE key = 'held'").fetchone() == ("yes",)
        con.close()
        assert _db_files(tmp_path) == ["rewind.db", "rewind.db-shm", "rewind.db-wal"]
        assert wal.stat().st_size == size
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "closed"
        assert holder.wait() == 0  # it said closed: no time limit (CI may be loaded)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert _db_files(tmp_path) == ["rewind.db"]
    assert _held(tmp_path) == "again"
    assert _db_files(tmp_path) == ["rewind.db"]


@pytest.mark.parametrize("read_only", [True, False])
def test_a_store_reopened_after_a_reader_left_the_files_is_cleaned_by_its_close(
    tmp_path: Path, read_only: bool
) -> None:
    """Files an older reader left (a ``mode=ro`` connection, as before) go with the next last
    close."""
    _recorded(tmp_path)
    con = sqlite3.connect(f"file:{tmp_path / 'rewind.db'}?mode=ro", uri=True)
    con.execute("SELECT count(*) FROM runs").fetchone()
    con.close()
    assert _db_files(tmp_path) == ["rewind.db", "rewind.db-shm", "rewind.db-wal"]
    store = open_store(tmp_path, read_only=read_only)
    with store.read() as conn:
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 1
    store.close()
    assert _db_files(tmp_path) == ["rewind.db"]


_DIES = """
import os, sys
from sqlalchemy import text
from rewind.store import open_store

store = open_store(sys.argv[1])
with store.write() as conn:
    conn.execute(text("INSERT INTO meta(key, value) VALUES ('held', 'yes')"))
os._exit(0)  # killed with the store open: its committed row only in the WAL
"""


def test_a_reader_after_a_writer_died_keeps_its_committed_rows(tmp_path: Path) -> None:
    run_id = _recorded(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", _DIES, str(tmp_path)], check=True, env=env)
    assert (tmp_path / "rewind.db-wal").stat().st_size > 0
    proc = run_rewind("--store", str(tmp_path), "runs", "--json")
    assert proc.returncode == 0 and run_id in proc.stdout, proc.stderr[-2000:]
    assert _db_files(tmp_path) == ["rewind.db"]  # the last close folded the WAL
    con = sqlite3.connect(tmp_path / "rewind.db")
    try:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert con.execute("SELECT value FROM meta WHERE key = 'held'").fetchone() == ("yes",)
    finally:
        con.close()
    assert _held(tmp_path) == "yes"
    assert _db_files(tmp_path) == ["rewind.db"]


def test_a_reader_closing_after_the_writer_removes_the_files_the_writer_could_not(
    tmp_path: Path,
) -> None:
    _recorded(tmp_path)
    reader = open_store(tmp_path, read_only=True)
    try:
        with reader.read() as conn:
            assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 1
        writer = open_store(tmp_path)
        with writer.write() as conn:
            conn.execute(text("INSERT INTO meta(key, value) VALUES ('held', 'yes')"))
        writer.close()  # not the last connection: the reader's keeps the files
        assert _db_files(tmp_path) == ["rewind.db", "rewind.db-shm", "rewind.db-wal"]
        with reader.read() as conn:
            held = conn.execute(text("SELECT value FROM meta WHERE key = 'held'")).scalar()
        assert held == "yes"
    finally:
        reader.close()
    assert _db_files(tmp_path) == ["rewind.db"]
    assert _held(tmp_path) == "yes"
