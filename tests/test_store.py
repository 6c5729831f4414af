"""The store conformance suite: every test taking ``store_target`` or ``rw_any`` runs on SQLite
and on a real throwaway PostgreSQL server (schema version, immutability triggers, blobs,
concurrent writers, content-addressed state rows, artifacts); SQLite pragmas and store
locations are SQLite-only."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
from burr.core import State
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from rewind.errors import RewindError, StoreError
from rewind.persister import RewindPersister
from rewind.replay import Rewind
from rewind.store import Store, open_store
from rewind.store.engine import SQLITE_WAL_AUTOCHECKPOINT_PAGES
from rewind.store.schema import SCHEMA_VERSION
from rewind.store.store import DB_FILENAME
from tests import pipelines
from tests.conftest import StoreTarget


def scalar(store: Store, sql: str, **params: object) -> object:
    with store.read() as conn:
        return conn.execute(text(sql), params).scalar_one()


def blob_rows(store: Store) -> tuple[int, int]:
    """(number of blob rows, total bytes stored in blobs)."""
    with store.read() as conn:
        count, size = conn.execute(text("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM blobs")).one()
    return int(count), int(size)


# -- schema version ------------------------------------------------------------------------------


def test_schema_version_is_stored_in_meta(store_target: StoreTarget) -> None:
    store = store_target.open()
    value = scalar(store, "SELECT value FROM meta WHERE key = 'schema_version'")
    assert value == str(SCHEMA_VERSION)
    store.close()


def test_store_with_other_schema_version_is_refused(store_target: StoreTarget) -> None:
    store = store_target.open()
    with store.write() as conn:
        conn.execute(text("UPDATE meta SET value = :v WHERE key = 'schema_version'"), {"v": "999"})
    store.close()

    with pytest.raises(StoreError, match="schema version 999") as info:
        store_target.open()
    assert str(SCHEMA_VERSION) in info.value.message


@pytest.mark.parametrize("version", ["abc", "", "3.0"])
def test_store_with_a_garbled_schema_version_is_refused_not_crashed(
    tmp_path: Path, version: str
) -> None:
    store = open_store(tmp_path)
    with store.write() as conn:
        conn.execute(
            text("UPDATE meta SET value = :v WHERE key = 'schema_version'"), {"v": version}
        )
    store.close()

    for read_only in (False, True):
        with pytest.raises(StoreError, match="schema version"):
            open_store(tmp_path, read_only=read_only)


def test_reopening_a_store_with_the_same_version_keeps_its_runs(store_target: StoreTarget) -> None:
    first = Rewind(store_target.open())
    run = first.record(pipelines.pipeline, {"x": 5})
    first.store.close()

    again = store_target.open()
    assert again.get_run(run.run_id).status == "completed"
    # one schema version row (a SQLite store also holds its store_id, Store._same_database)
    assert scalar(again, "SELECT COUNT(*) FROM meta WHERE key = 'schema_version'") == 1
    again.close()


# -- SQLite pragmas ------------------------------------------------------------------------------


def test_sqlite_connection_uses_wal_normal_sync_and_busy_timeout(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    with store.engine.connect() as conn:
        journal = conn.exec_driver_sql("PRAGMA journal_mode").scalar_one()
        synchronous = conn.exec_driver_sql("PRAGMA synchronous").scalar_one()
        busy = conn.exec_driver_sql("PRAGMA busy_timeout").scalar_one()
        foreign_keys = conn.exec_driver_sql("PRAGMA foreign_keys").scalar_one()
        checkpoint = conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar_one()
    assert str(journal).lower() == "wal"
    assert synchronous == 1  # NORMAL
    assert busy == 30_000
    assert foreign_keys == 1
    assert checkpoint == SQLITE_WAL_AUTOCHECKPOINT_PAGES  # the backstop (rewind.store.checkpoint)
    store.close()


# -- immutability --------------------------------------------------------------------------------


def test_node_rows_cannot_be_updated(rw_any: Rewind) -> None:
    run = rw_any.record(pipelines.pipeline, {"x": 5})
    before = rw_any.store.nodes_of(run.run_id)

    with pytest.raises(DBAPIError, match="immutable"), rw_any.store.write() as conn:
        conn.execute(
            text("UPDATE nodes SET output_hash = :h WHERE run_id = :r AND position = 0"),
            {"h": "0" * 64, "r": run.run_id},
        )
    assert rw_any.store.nodes_of(run.run_id) == before


def test_node_rows_cannot_be_deleted(rw_any: Rewind) -> None:
    run = rw_any.record(pipelines.pipeline, {"x": 5})

    with pytest.raises(DBAPIError, match="immutable"), rw_any.store.write() as conn:
        conn.execute(text("DELETE FROM nodes WHERE run_id = :r"), {"r": run.run_id})
    assert len(rw_any.store.nodes_of(run.run_id)) == 3


def test_call_and_state_rows_cannot_be_updated(rw_any: Rewind) -> None:
    run = rw_any.record(pipelines.pipeline, {"x": 5})

    with pytest.raises(DBAPIError, match="immutable"), rw_any.store.write() as conn:
        conn.execute(text("UPDATE calls SET outcome = 'hit' WHERE run_id = :r"), {"r": run.run_id})
    with pytest.raises(DBAPIError, match="immutable"), rw_any.store.write() as conn:
        conn.execute(
            text("UPDATE burr_state SET status = 'failed' WHERE app_id = :r"), {"r": run.run_id}
        )


# -- blobs ---------------------------------------------------------------------------------------


def test_same_bytes_stored_twice_make_one_blob_row(store_target: StoreTarget) -> None:
    store = store_target.open()
    data = b'{"same":"bytes"}'
    with store.write() as conn:
        first = store.put_blob(conn, data)
    with store.write() as conn:
        second = store.put_blob(conn, data)
    assert first == second == hashlib.sha256(data).hexdigest()
    assert blob_rows(store) == (1, len(data))
    assert store.get_blob(first) == data
    store.close()


def test_blob_dedup_holds_across_store_instances(store_target: StoreTarget) -> None:
    # A second Store has an empty in-memory "known blobs" set: the database itself must dedupe.
    data = b"payload"
    one = store_target.open()
    with one.write() as conn:
        one.put_blob(conn, data)
    two = store_target.open()
    with two.write() as conn:
        two.put_blob(conn, data)
        two.put_blob(conn, b"other")
    assert blob_rows(two) == (2, len(data) + len(b"other"))
    one.close()
    two.close()


def test_blob_written_in_a_rolled_back_transaction_is_written_again(
    store_target: StoreTarget,
) -> None:
    store = store_target.open()
    data = b"written, then rolled back"
    with pytest.raises(RuntimeError), store.write() as conn:
        store.put_blob(conn, data)
        raise RuntimeError("abort the transaction")
    assert blob_rows(store) == (0, 0)

    with store.write() as conn:
        digest = store.put_blob(conn, data)
    assert store.get_blob(digest) == data
    store.close()


def test_missing_blob_raises_store_error(store_target: StoreTarget) -> None:
    store = store_target.open()
    with pytest.raises(StoreError, match="missing"):
        store.get_blob("f" * 64)
    store.close()


WRITERS = 4
RUNS_EACH = 3


def test_concurrent_writers_keep_every_run_and_share_blobs(store_target: StoreTarget) -> None:
    # Several Store instances (own engines, like separate server processes) record the same
    # pipeline at once: every run lands whole, and identical payloads stay one blob row each.
    first = Rewind(store_target.open())
    first.record(pipelines.pipeline, {"x": 5})
    blobs_after_one = blob_rows(first.store)
    writers = [Rewind(store_target.open()) for _ in range(WRITERS)]
    barrier = threading.Barrier(WRITERS)
    recorded: list[str] = []
    errors: list[BaseException] = []

    def write(rw: Rewind) -> None:
        barrier.wait()
        try:
            recorded.extend(
                rw.record(pipelines.pipeline, {"x": 5}).run_id for _ in range(RUNS_EACH)
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(rw,)) for rw in writers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for rw in writers:
        rw.store.close()

    assert errors == []
    assert len(set(recorded)) == WRITERS * RUNS_EACH
    for run_id in recorded:
        assert first.store.get_run(run_id).status == "completed"
        assert [n.name for n in first.store.nodes_of(run_id)] == ["start", "expand", "small"]
    assert blob_rows(first.store) == blobs_after_one
    first.store.close()


def test_blob_hash_is_the_sha256_of_its_bytes_on_every_backend(store_target: StoreTarget) -> None:
    store = store_target.open()
    big = b"x" * 10_000  # compressed in the row; the hash is over the uncompressed bytes
    with store.write() as conn:
        digests = [store.put_blob(conn, data) for data in (b"", b"\x00\xff", big)]
    assert digests == [hashlib.sha256(d).hexdigest() for d in (b"", b"\x00\xff", big)]
    assert store.get_blobs(digests) == dict(zip(digests, (b"", b"\x00\xff", big), strict=True))
    store.close()


# -- the persister -------------------------------------------------------------------------------

BIG_DOC = "a long document that does not change between steps " * 200


def three_states() -> list[State]:
    return [
        State(
            {
                "doc": BIG_DOC,
                "config": {"k": [1, 2, 3], "name": "fixed"},
                "counter": i,
                "__PRIOR_STEP": "step",
            }
        )
        for i in range(3)
    ]


def test_persister_stores_each_field_once_when_only_one_field_changes(
    store_target: StoreTarget,
) -> None:
    store = store_target.open()
    persister = RewindPersister(store)
    for seq, state in enumerate(three_states()):
        persister.save("", "app-1", seq, "step", state, "completed")

    count, size = blob_rows(store)
    # doc and config once each + three distinct counter values; Burr's __PRIOR_STEP is kept
    # inline in the state row, not as a blob
    assert count == 5
    doc_bytes = len(json.dumps(BIG_DOC).encode())
    assert doc_bytes < size < 2 * doc_bytes
    with store.read() as conn:
        rows = conn.execute(
            text("SELECT sequence_id, fields_json FROM burr_state ORDER BY sequence_id")
        ).all()
    # Each row after the first is stored as a delta naming only the field that changed.
    stored = [json.loads(r.fields_json) for r in rows]
    assert [s[1].keys() for s in stored[1:]] == [{"counter"}, {"counter"}]
    loaded = [store.load_state_row("", "app-1", seq, values=False) for seq in range(3)]
    field_maps = [row["fields"] for row in loaded if row is not None]
    assert [r.sequence_id for r in rows] == [0, 1, 2]
    assert all("__PRIOR_STEP" not in m for m in field_maps)
    for key in ("doc", "config"):
        assert len({m[key] for m in field_maps}) == 1
    assert len({m["counter"] for m in field_maps}) == 3
    store.close()


def test_persister_load_returns_an_equal_state(store_target: StoreTarget) -> None:
    store = store_target.open()
    persister = RewindPersister(store)
    states = three_states()
    for seq, state in enumerate(states):
        persister.save("", "app-1", seq, "step", state, "completed")

    loaded = persister.load("", "app-1", 1)
    assert loaded is not None
    assert loaded["state"].get_all() == states[1].get_all()
    assert loaded["state"]["__PRIOR_STEP"] == "step"
    assert loaded["sequence_id"] == 1
    assert loaded["position"] == "step"
    assert loaded["status"] == "completed"

    latest = persister.load("", "app-1")
    assert latest is not None
    assert latest["sequence_id"] == 2
    assert latest["state"]["counter"] == 2

    assert persister.load("", "app-1", 7) is None
    assert persister.load("", "no-such-app") is None
    assert persister.list_app_ids("") == ["app-1"]
    store.close()


def test_persister_refuses_to_save_the_same_row_twice(store_target: StoreTarget) -> None:
    store = store_target.open()
    persister = RewindPersister(store)
    state = three_states()[0]
    persister.save("", "app-1", 0, "step", state, "completed")
    with pytest.raises(StoreError, match="already exists"):
        persister.save("", "app-1", 0, "step", state, "completed")
    assert scalar(store, "SELECT COUNT(*) FROM burr_state") == 1
    store.close()


# -- artifacts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../x", "a/b", "", "..", "/etc/passwd", "a\\b", ".hidden"])
def test_artifact_names_that_are_paths_are_refused(tmp_path: Path, name: str) -> None:
    store = open_store(tmp_path / "store")
    with pytest.raises(RewindError, match="not a plain file name"):
        store.put_artifact("run-1", name, b"data")
    assert scalar(store, "SELECT COUNT(*) FROM artifacts") == 0
    assert not (tmp_path / "store" / "artifacts" / "x").exists()
    assert not (tmp_path / "x").exists()
    store.close()


def test_artifact_with_plain_name_is_written_under_the_run_folder(
    store_target: StoreTarget,
) -> None:
    store = store_target.open()
    digest, path = store.put_artifact("run-1", "report.md", b"# hello\n")
    assert digest == hashlib.sha256(b"# hello\n").hexdigest()
    assert path == store_target.root.resolve() / "artifacts" / "run-1" / "report.md"
    assert path.read_bytes() == b"# hello\n"
    [row] = store.artifacts_of("run-1")
    assert (row["name"], row["sha256"], row["size"]) == ("report.md", digest, 8)
    store.close()


# -- locations -----------------------------------------------------------------------------------


def test_open_store_on_a_folder_creates_the_database_inside(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "folder"
    store = open_store(folder)
    assert store.root == folder.resolve()
    assert (folder / DB_FILENAME).is_file()
    store.close()


def test_open_store_on_a_db_path_uses_that_file(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "mine.db"
    store = open_store(db)
    assert store.root == db.parent.resolve()
    assert db.is_file()
    assert not (db.parent / DB_FILENAME).exists()
    store.close()

    again = open_store(str(db))
    assert scalar(again, "SELECT value FROM meta WHERE key = 'schema_version'") == str(
        SCHEMA_VERSION
    )
    again.close()


def test_open_store_on_an_unwritable_location_raises_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="cannot create store folder"):
        open_store(blocker / "store")


def test_a_batch_of_mostly_stored_blobs_writes_only_the_missing_ones(tmp_path: Path) -> None:
    from rewind.store.store import PRESENCE_CHECK_MIN_BLOBS, WriteBatch

    old = {hashlib.sha256(b"%d" % i).hexdigest(): b"%d" % i for i in range(40)}
    first = open_store(tmp_path / "s")
    first.write_batch(WriteBatch(blobs=dict(old)))
    first.close()
    new = {hashlib.sha256(b"new %d" % i).hexdigest(): b"new %d" % i for i in range(5)}
    assert len(old) + len(new) >= PRESENCE_CHECK_MIN_BLOBS
    second = open_store(tmp_path / "s")  # a new instance: it has written none of them
    inserted: list[int] = []

    def count(conn: object, cursor: object, statement: str, params: object, *a: object) -> None:
        if statement.lstrip().upper().startswith("INSERT") and "blobs" in statement:
            inserted.append(len(params) if isinstance(params, list) else 1)

    from sqlalchemy import event

    event.listen(second.engine, "before_cursor_execute", count)
    second.write_batch(WriteBatch(blobs=old | new))
    assert sum(inserted) == len(new)  # the 40 stored ones were not sent again
    assert second.get_blobs([*old, *new]) == old | new
    assert scalar(second, "SELECT COUNT(*) FROM blobs") == len(old) + len(new)
    second.close()


def test_a_store_reopened_in_this_process_reuses_its_engine_on_the_file_as_it_is_now(
    tmp_path: Path,
) -> None:
    import shutil

    folder = tmp_path / "s"
    first = open_store(folder)
    with first.write() as conn:
        first.create_run(conn, run_id="r" * 32, pipeline="p", pipeline_ref="")
    kept_open = open_store(folder)  # shares the engine while the first is still open
    assert kept_open.engine is first.engine
    first.close()
    assert kept_open.run_exists("r" * 32)  # closing one store does not break the other
    kept_open.close()
    shutil.rmtree(folder)  # a new store at the same path must not see the old file
    again = open_store(folder)
    assert again.engine is first.engine
    assert not again.run_exists("r" * 32)
    again.close()


def test_opening_a_current_store_takes_no_write_lock(tmp_path: Path) -> None:
    """A store at the newest schema is checked with a read: opening it writes nothing, so it
    does not queue behind (or block) a writer. A new store is still created in a write. Every
    statement SQLite runs is seen (the check reads through the driver, not SQLAlchemy)."""
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    seen: list[str] = []

    def statement(sql: str) -> None:
        seen.append(sql.strip().split()[0].upper() + (" IMMEDIATE" if "IMMEDIATE" in sql else ""))

    def traced(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        dbapi_connection.set_trace_callback(statement)

    event.listen(Pool, "connect", traced)
    try:
        open_store(tmp_path / "s").close()
        created = list(seen)
        seen.clear()
        open_store(tmp_path / "s").close()
    finally:
        event.remove(Pool, "connect", traced)
    assert "BEGIN IMMEDIATE" in created
    assert "SELECT" in seen and "BEGIN IMMEDIATE" not in seen
    assert not {"INSERT", "UPDATE", "DELETE", "CREATE"} & set(seen)
