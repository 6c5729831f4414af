"""Schema migrations: every store is brought to the newest Alembic revision when it is opened.

The schema's history lives in ``migrations/versions`` (Alembic). Revision ``0001`` is the schema
Rewind wrote before migrations existed (``metadata.create_all`` + ``meta.schema_version = 2``):
such a store has no ``alembic_version`` table, so it is stamped ``0001`` and then upgraded in
place, keeping every row. A store already at :data:`HEAD` costs one ``SELECT`` to open (the
record path opens stores often; Alembic's script directory is loaded only when there is work).
"""

from __future__ import annotations

import glob
from pathlib import Path

from sqlalchemy import Connection, inspect, text

from rewind.errors import StoreError

HEAD = "0017"
"""The newest revision in ``migrations/versions`` (a test checks they agree)."""
BASELINE = "0001"
"""The revision equal to the schema of stores made before Alembic (``meta.schema_version`` 2)."""
_BASELINE_SCHEMA_VERSION = "2"
_PG_LOCK_KEY = 0x5245_5749_4E44  # "REWIND": serialises concurrent first opens on PostgreSQL
MIGRATIONS = Path(__file__).with_name("migrations")


def current_revision(conn: Connection) -> str | None:
    """The store's Alembic revision, or None when it has none (new or pre-Alembic store)."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def is_known(revision: str) -> bool:
    """Whether ``revision`` is one of ``migrations/versions`` (False: a newer Rewind wrote it)."""
    return any((MIGRATIONS / "versions").glob(f"{glob.escape(revision)}_*.py"))


def upgrade(conn: Connection, *, where: str) -> None:
    """Bring the database behind ``conn`` to :data:`HEAD`, inside ``conn``'s open transaction.

    Args:
        conn: a connection inside a write transaction (``BEGIN IMMEDIATE`` on SQLite, so two
            processes opening one new store cannot both create it; on PostgreSQL an advisory
            transaction lock does the same).
        where: the store's location, for error messages.
    Raises:
        StoreError: the store was written by a newer Rewind (an unknown revision) or is a
            pre-Alembic store of another schema version.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
    revision = current_revision(conn)
    if revision == HEAD:
        return
    fresh = (
        conn.dialect.name == "sqlite" and revision is None and not inspect(conn).get_table_names()
    )
    template = _SQLITE_TEMPLATE
    if fresh and template is not None:
        for sql, params in template:
            conn.exec_driver_sql(sql, params)
        return
    from alembic import command
    from alembic.script import ScriptDirectory

    config = _config(conn)
    if revision is not None:
        known = {s.revision for s in ScriptDirectory.from_config(config).walk_revisions()}
        if revision not in known:
            raise StoreError(
                f"store {where} is at schema revision {revision}, unknown to this Rewind "
                f"(newest known: {HEAD})",
                "upgrade Rewind to the version that wrote this store, or use a new --store",
            )
    elif inspect(conn).has_table("runs"):
        _check_baseline(conn, where)
        command.stamp(config, BASELINE)
    command.upgrade(config, "head")
    if fresh:
        _remember_template(conn)


_SQLITE_TEMPLATE: tuple[tuple[str, tuple[object, ...]], ...] | None = None
"""The statements (SQL, parameters) that made an empty SQLite database a store at :data:`HEAD`,
taken from the first one this process migrated: a new store costs ~2 ms instead of ~200 ms of
Alembic (a traced chain recorded into a new folder pays it inside the chain's first trace).
A test checks that both ways give the same schema and rows."""


def _remember_template(conn: Connection) -> None:
    """Keep the DDL of every table, index and trigger in creation order, then every row they
    hold, as :data:`_SQLITE_TEMPLATE` (one assignment: a thread sees all of it or none)."""
    global _SQLITE_TEMPLATE
    objects = conn.exec_driver_sql(
        "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL "
        "AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
    ).all()
    out: list[tuple[str, tuple[object, ...]]] = [(sql, ()) for _t, _n, sql in objects]
    for kind, name, _sql in objects:
        if kind != "table":
            continue
        quoted = '"' + name.replace('"', '""') + '"'
        for row in conn.exec_driver_sql(f"SELECT * FROM {quoted}"):
            marks = ",".join("?" * len(row))
            out.append((f"INSERT INTO {quoted} VALUES ({marks})", tuple(row)))
    _SQLITE_TEMPLATE = tuple(out)


def _check_baseline(conn: Connection, where: str) -> None:
    found = conn.execute(text("SELECT value FROM meta WHERE key = 'schema_version'")).scalar()
    if found != _BASELINE_SCHEMA_VERSION:
        raise StoreError(
            f"store {where} has schema version {found}, which this Rewind cannot upgrade "
            f"(it upgrades version {_BASELINE_SCHEMA_VERSION})",
            "use a new store folder (--store) or the Rewind version that wrote it",
        )


def _config(conn: Connection) -> object:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config
