"""Engine creation: which database backs the store.

SQLite (a file in the store's folder) is the default; any SQLAlchemy URL selects another backend
(``postgresql+psycopg://…``). Only this module knows the dialect's quirks.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.pool import QueuePool

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a writer waits for another writer's lock before failing (ms)."""
SQLITE_PAGE_SIZE = 1024
"""Page size (bytes) of a SQLite store this module creates; an existing file keeps its own.

A store has ~45 tables and indexes and each takes at least one page, so at SQLite's default
4 KiB the empty schema alone is ~180 KB; at 1 KiB it is ~55 KB. Recorded rows are small (node,
call and span rows of 100-350 bytes, most blobs under 1 KiB once compressed), so 1 KiB pages
also leave less slack: measured on peerbench's 100-step trace, 893 KB at 4 KiB, 806 KB at 1 KiB
(512: 921 KB, more page overhead; 2048: 829 KB), with no measurable change of the record time.
It must be set before the database's first write (the ``journal_mode`` pragma below)."""

SQLITE_WAL_AUTOCHECKPOINT_PAGES = 16_384
"""WAL pages (of :data:`SQLITE_PAGE_SIZE`) after which a commit copies the WAL into the database
file itself (a checkpoint: both files are fsynced), on the committing thread. A writable store's
checkpoints normally run on a background thread well before that (:mod:`rewind.store.checkpoint`:
from 4 MB of WAL, within 0.5 s): this is the backstop, should that thread fall behind.
SQLite's default of 1,000 pages assumes 4 KiB pages; at 1 KiB it checkpointed every 1 MB, i.e.
every two or three recorded 100-node runs, and the fsyncs landed inside the run (measured in
``benchmarks/record_overhead.py``); 16,384 pages are 16 MB of WAL."""


_ENGINES: OrderedDict[tuple[int, str], Engine] = OrderedDict()
_ENGINES_LOCK = threading.Lock()
_ENGINES_KEPT = 8


def sqlite_engine(db_path: Path) -> Engine:
    """An engine for a SQLite file (see :func:`new_sqlite_engine`), reused when this process
    opened the same file before: SQLAlchemy caches compiled statements per engine, and a store
    opened per trace (a :class:`rewind.tracing.Tracer` per run) otherwise compiles its ~13
    statements again every time (~30 ms). A reused engine's idle connections are closed first
    (``dispose``), so every connection it hands out is opened on the file as it is now; stores
    still open on it keep theirs. An engine whose pool holds no connection (its last store
    closed them: a traced chain's next trace) is handed out as it is, since a dispose would
    only replace the empty pool (~0.15 ms). The last few paths are kept, per process.
    """
    key = (os.getpid(), str(db_path))
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is not None:
            _ENGINES.move_to_end(key)
    if engine is not None:
        pool = engine.pool
        if not isinstance(pool, QueuePool) or pool.checkedin() or pool.checkedout():
            engine.dispose()
        return engine
    engine = new_sqlite_engine(db_path)
    with _ENGINES_LOCK:
        _ENGINES[key] = engine
        while len(_ENGINES) > _ENGINES_KEPT:
            _ENGINES.popitem(last=False)
    return engine


def close_connections(engine: Engine) -> None:
    """Close ``engine``'s pooled connections (what a closing store does): the last connection of
    a SQLite file folds its WAL into the file and deletes the ``-wal`` and ``-shm`` files.

    A SQLite file's engine (:func:`sqlite_engine`, reused by the next store opened on the path)
    keeps its pool when no connection is checked out: the idle connections are closed and the
    next checkout opens a new one on the file as it is then, as after ``Engine.dispose``, which
    would also build a new pool (~0.1-0.2 ms per closed store; a traced chain closes one per
    trace). Any other engine, or one with a connection checked out (another store open on the
    same file), is disposed as before.
    """
    pool = engine.pool
    if type(pool) is QueuePool and engine.dialect.name == "sqlite" and not pool.checkedout():
        # Closes the checked-in connections and resets the pool's count; the pool stays
        # usable. A checkout racing this (another thread's store) keeps its connection, which
        # goes back to this pool; the count is then off by one until the next open or close
        # on the engine sees a connection and disposes (a pool size, never a kept file).
        pool.dispose()
    else:
        engine.dispose()


def new_sqlite_engine(db_path: Path) -> Engine:
    """Create an engine for a SQLite file with WAL, ``synchronous=NORMAL`` and ``busy_timeout``.

    Writes open with ``BEGIN IMMEDIATE`` (pass ``execution_options(immediate=True)``): a deferred
    transaction that later needs the write lock can fail with SQLITE_BUSY at once instead of
    waiting; taking the lock up front makes concurrent writers queue on ``busy_timeout``.
    Measured in DESIGN: default pragmas cost 2–18 ms per step, WAL + NORMAL about 0.1 ms.
    """
    engine = create_engine(
        f"sqlite+pysqlite:///{db_path}",
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's begin event, not pysqlite, decide how transactions start.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA wal_autocheckpoint={SQLITE_WAL_AUTOCHECKPOINT_PAGES}")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        if conn.get_execution_options().get("immediate"):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")

    return engine


def sqlite_read_only_engine(db_path: Path) -> Engine:
    """Create an engine that only reads an existing SQLite file (``query_only``; never created).

    Read commands (``rewind runs``, ``show``, ``diff``...) use it so a store on read-only media
    (a mounted snapshot, a CI artifact, another user's folder) can be listed, and so reading
    never changes the database's rows. A WAL reader needs the ``-shm`` index and a ``-wal`` file
    beside the database (SQLite creates them when the folder is writable, so readers see a
    concurrent writer's commits); when the folder is not writable the file is opened
    ``immutable`` instead (SQLite then assumes nobody changes it while it is open — true of
    read-only media).

    A file this process may write is opened ``mode=rw`` (not created: ``mode=rwc`` is not
    given) with ``PRAGMA query_only`` refusing every write statement, not ``mode=ro``: SQLite
    cannot checkpoint through a ``mode=ro`` connection, so when it was the file's last
    connection its close left the ``-wal`` and ``-shm`` files behind (a 32 KiB ``-shm`` after
    every ``rewind runs``). A read-write connection's close, when it is the last connection
    of any process (it takes the file's exclusive lock, or does nothing), copies committed WAL
    frames into the file (none after a store's own close) and deletes both files, as the last
    writer's close does; one still open elsewhere keeps them. A file this process may not
    write is opened ``mode=ro`` (its ``-wal``/``-shm`` stay: SQLite could not delete them).

    Raises:
        FileNotFoundError: ``db_path`` does not exist (read-only never creates it).
    """
    if not db_path.is_file():
        raise FileNotFoundError(db_path)
    uri = f"file:{quote(str(db_path))}"
    if not os.access(db_path.parent, os.W_OK):
        uri += "?mode=ro&immutable=1"
    elif os.access(db_path, os.W_OK):
        uri += "?mode=rw"
    else:
        uri += "?mode=ro"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(
            uri, uri=True, check_same_thread=False, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000
        )

    engine = create_engine("sqlite+pysqlite://", creator=connect)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA query_only=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def url_engine(url: str) -> Engine:
    """Create an engine for a database URL other than a SQLite file (e.g. PostgreSQL)."""
    return create_engine(url, pool_pre_ping=True)
