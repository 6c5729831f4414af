"""Alembic migrations: the declared tables and the revisions agree, stores made before Alembic
upgrade in place keeping every row, and a store from a newer Rewind is refused."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from rewind.errors import StoreError
from rewind.replay import Rewind
from rewind.store import migrate, open_store
from rewind.store.schema import metadata
from rewind.store.store import DB_FILENAME
from tests import pipelines
from tests.conftest import STORE_BACKENDS, StoreTarget, new_store_target
from tests.services import PostgresServer

LEGACY_DUMP = Path(__file__).parent / "data" / "store_v2_before_alembic.sql"
LEGACY_RUN = "96a83670f41848bf894899908d8489b7"
LEGACY_FORK = "294bd67fdbe44ba4877304dc0c6deeaa"


def legacy_store(folder: Path) -> Path:
    """A store folder holding the pre-Alembic database of ``LEGACY_DUMP``."""
    folder.mkdir(parents=True)
    con = sqlite3.connect(folder / DB_FILENAME)
    con.executescript(LEGACY_DUMP.read_text())
    con.close()
    return folder


@pytest.fixture(params=STORE_BACKENDS)
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> StoreTarget:
    """Each test here runs on a new SQLite folder and on an empty PostgreSQL database (the
    shared fixture's databases already hold a migrated store)."""
    return new_store_target(request, tmp_path, migrated=False)


def test_head_constant_is_the_newest_revision() -> None:
    config = Config()
    config.set_main_option("script_location", str(migrate.MIGRATIONS))
    assert ScriptDirectory.from_config(config).get_heads() == [migrate.HEAD]


def test_migrated_schema_equals_the_declared_tables(store_target: StoreTarget) -> None:
    store = store_target.open()
    with store.read() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    store.close()
    assert diff == [], "schema.py changed without a migration: add a revision"


def _schema_and_rows(db: Path) -> tuple[list[tuple[str, str, str]], dict[str, list[tuple]]]:
    with sqlite3.connect(db) as conn:
        objects = conn.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
            "ORDER BY type, name"
        ).fetchall()
        rows = {
            name: sorted(conn.execute(f'SELECT * FROM "{name}"').fetchall())
            for kind, name, _ in objects
            if kind == "table"
        }
    return objects, rows


def test_a_new_sqlite_store_from_the_template_equals_a_migrated_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(migrate, "_SQLITE_TEMPLATE", None)
    open_store(tmp_path / "migrated").close()  # runs Alembic, keeps the template
    assert migrate._SQLITE_TEMPLATE is not None
    calls: list[str] = []
    monkeypatch.setattr("alembic.command.upgrade", lambda *a, **k: calls.append("upgrade"))
    store = open_store(tmp_path / "templated")  # made from the template: no Alembic
    with store.read() as conn:
        assert migrate.current_revision(conn) == migrate.HEAD
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    store.close()
    assert calls == []
    assert _schema_and_rows(tmp_path / "migrated" / DB_FILENAME) == _schema_and_rows(
        tmp_path / "templated" / DB_FILENAME
    )
    # A store that is not new still goes through Alembic (here: already at head, nothing to do).
    open_store(tmp_path / "templated").close()


@pytest.mark.postgres
def test_a_postgres_store_database_from_the_template_equals_a_migrated_one(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """The conformance suites' PostgreSQL databases are copies of one migrated database: each
    must be what ``open_store`` makes of an empty one (schema, revision, rows), and independent."""

    def contents(url: str) -> tuple[list[tuple[str, str, str]], dict[str, list[tuple]]]:
        store = open_store(url, root=tmp_path / "root")
        try:
            with store.read() as conn:
                assert migrate.current_revision(conn) == migrate.HEAD
                assert compare_metadata(MigrationContext.configure(conn), metadata) == []
                columns = conn.execute(
                    text(
                        "SELECT table_name, column_name, data_type FROM information_schema.columns"
                        " WHERE table_schema = 'public' ORDER BY 1, 2"
                    )
                ).all()
                tables = sorted({str(t) for t, _c, _d in columns})
                rows = {t: sorted(conn.execute(text(f'SELECT * FROM "{t}"')).all()) for t in tables}
        finally:
            store.close()
        return [tuple(c) for c in columns], rows

    copied, migrated = postgres_server.new_store_database(), postgres_server.new_database()
    assert contents(copied) == contents(migrated)  # opening the empty one migrates it
    other = open_store(postgres_server.new_store_database(), root=tmp_path / "other")
    try:
        Rewind(other).record(pipelines.pipeline, {"x": 7})
    finally:
        other.close()
    assert contents(postgres_server.new_store_database()) == contents(migrated)


def test_new_store_is_stamped_at_head(store_target: StoreTarget) -> None:
    store = store_target.open()
    with store.read() as conn:
        assert migrate.current_revision(conn) == migrate.HEAD
    store.close()


def test_store_made_before_alembic_upgrades_in_place_keeping_its_runs(tmp_path: Path) -> None:
    folder = legacy_store(tmp_path / "old")
    store = open_store(folder)
    with store.read() as conn:
        assert migrate.current_revision(conn) == migrate.HEAD
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
    run = store.get_run(LEGACY_RUN)
    fork = store.get_run(LEGACY_FORK)
    assert run.status == "completed"
    assert fork.parent_run_id == LEGACY_RUN
    nodes = store.nodes_of(LEGACY_RUN)
    assert [n.name for n in nodes] == ["start", "expand", "small"]
    # Blobs written before the upgrade still load and still hash to their names.
    assert store.get_blobs([n.output_hash for n in nodes if n.output_hash])
    with pytest.raises(DBAPIError, match="immutable"), store.write() as conn:
        conn.execute(text("DELETE FROM nodes WHERE run_id = :r"), {"r": LEGACY_RUN})
    store.close()


def test_upgraded_legacy_store_can_be_forked(tmp_path: Path) -> None:
    folder = legacy_store(tmp_path / "old")
    rw = Rewind(folder)
    child = rw.fork(LEGACY_RUN, at="expand")
    assert rw.store.get_run(child.run_id).status == "completed"
    rw.store.close()


def test_store_at_an_unknown_revision_is_refused(store_target: StoreTarget) -> None:
    store = store_target.open()
    with store.write() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff'"))
    store.close()
    with pytest.raises(StoreError, match="ffff") as info:
        store_target.open()
    assert "upgrade Rewind" in info.value.hint


def test_pre_alembic_store_of_another_version_is_refused(tmp_path: Path) -> None:
    folder = legacy_store(tmp_path / "old")
    con = sqlite3.connect(folder / DB_FILENAME)
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="schema version 1"):
        open_store(folder)


def test_recording_after_the_upgrade_works(tmp_path: Path) -> None:
    folder = legacy_store(tmp_path / "old")
    rw = Rewind(folder)
    run = rw.record(pipelines.pipeline, {"x": 7})
    assert len(rw.store.nodes_of(run.run_id)) == 3
    rw.store.close()


def test_concurrent_first_opens_create_the_schema_once(store_target: StoreTarget) -> None:
    # Several server processes starting together on a new database: one migrates, the others
    # wait for its transaction and then find the store at head.
    opened: list[str | None] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def first_open() -> None:
        barrier.wait()
        try:
            store = store_target.open()
            with store.read() as conn:
                opened.append(migrate.current_revision(conn))
            store.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_open) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert opened == [migrate.HEAD] * 4


def test_a_traced_source_lookup_searches_the_runs_index_not_every_run(tmp_path: Path) -> None:
    """find_source's candidate query (a pipeline's newest completed runs) uses the index of
    migration 0014 instead of scanning every run (a migrated store has the same indexes as a
    new one: test_migrated_schema_equals_the_declared_tables)."""
    from sqlalchemy.dialects import sqlite

    from rewind.store import open_store
    from rewind.tracing.tracer_source import _CANDIDATES, _CANDIDATES_SQL

    sql = str(
        _CANDIDATES.params(name="chain").compile(
            dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}
        )
    )
    store = open_store(tmp_path / "new")
    try:
        with store.read() as conn:
            plans = [
                " ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + q, p))
                for q, p in ((sql, ()), (_CANDIDATES_SQL, ("chain", 4)))  # Core, SQLite's
            ]
    finally:
        store.close()
    for plan in plans:
        assert "USING INDEX ix_runs_pipeline_created" in plan, plan
        assert "SCAN runs" not in plan, plan
