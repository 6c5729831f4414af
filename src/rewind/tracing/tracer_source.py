"""The recorded trace a cached trace replays, found from its first cache lookup.

A trace made with ``Tracer(read_cache=True)`` runs the caller's code again and looks each call
up by its content key. Looking every call up in the store costs a read transaction and a blob
read per call; instead, at the first lookup the trace finds the recorded trace that made that
call (the newest completed trace of the same name whose calls include the key, one with the
same input first; a failed one, when no completed trace of the input made the call: a chain
that raised) and reads, in
one transaction, that trace's rows and the cache entries and result bytes of all its calls.
Later lookups are dictionary reads: a call the source made at the same position with the same
key is served as the source recorded it (lineage first, DESIGN rule 5: a deterministic tool the
source ran twice with the same arguments keeps each run's time) when its cache entry was
recorded here (an imported trace's answers serve its own replays only); any other key comes
from the cache entries read ahead, and a key the source never sent from the store as before.
Within one process, the source's rows (immutable while the run exists, see
:func:`source_rows`) and the result bytes (content-addressed) are kept for the next trace that
replays it; the cache entries are read each time. The trace is then written as a replay of its
source (its ``parent``), stored by reference where it is identical
(:mod:`rewind.store.references`).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, bindparam, select, text

from rewind.context import LineageEntry
from rewind.errors import StoreError
from rewind.store import Store, schema
from rewind.store.records import NOT_ANSWERS
from rewind.store.references import REFERENCE_KEY, SourceRows, load_rows, reference_of
from rewind.store.store import RUNS_EPOCH_KEY, CacheEntry

__all__ = ["CANDIDATES", "RECORDER_CANDIDATES", "FoundSource", "find_source", "lineage_at"]

CANDIDATES = 4
"""How many of the newest traces of the same name are tried."""
RECORDER_CANDIDATES = 16
"""How many traces of the name started by the time a call's cached answer was produced are
looked at for the one that recorded it (:func:`_recorders`): traces that ran at once."""
ROWS_KEPT = 8
"""How many sources' rows this process keeps between traces (see :func:`source_rows`)."""

_ROWS: OrderedDict[tuple[str, str, float, float | None, str | None], SourceRows] = OrderedDict()
_ROWS_LOCK = threading.Lock()


@dataclass
class FoundSource:
    """What the first lookup found: the source's rows, the cache entries of its calls by
    ``(kind, key)``, and their result bytes by hash."""

    rows: SourceRows
    entries: dict[tuple[str, str], CacheEntry] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)


def find_source(
    store: Store, name: str, kind: str, key: str, initial_hash: str | None = None
) -> FoundSource | None:
    """The recorded trace named ``name`` that made the call ``(kind, key)``, with its calls'
    cache entries and result bytes (one read transaction), or None.

    The :data:`CANDIDATES` newest completed traces of the name are tried first (a replay
    usually follows its recording). When none made the call and the name has more traces, the
    call's cache entry says where to look (:func:`_recorders`): a bounded, indexed lookup, and
    none at all for a call never cached (a trace that is genuinely new).

    A replay stored wholly by reference stands for its source: the source is used instead,
    so replays of replays all point at the trace that holds the rows. Among the candidates
    that made the call, the newest whose initial state (its input) hashes to ``initial_hash``
    is taken, else the newest: a trace of another input may send the same first request and
    then take another path (or stop), and would leave the rest of this trace without lineage.
    When the candidates hold the call only with other inputs and the name has more traces, a
    recorder of this input found through the cache entry is taken before them.

    When no completed trace of this input made the call, a failed trace may have (a chain that
    raised after its steps; its cached replay, failing alike, is then stored by reference and
    ends failed like it): the failed traces among the :data:`RECORDER_CANDIDATES` newest of the
    name (or, none of them of this input, among those started by the time the call's answer
    was cached) that made the call (:func:`_failed`, bounded, indexed lookups) are tried, one
    of this input taken before a completed trace of another input. A completed trace of this
    input is always taken before a failed one, even an older one: a chain that failed once and
    then succeeded (or the other way round) replays, every answer cached, as the success did.
    """
    with store.read() as conn:
        driver = _sqlite_driver(conn)
        if driver is not None:
            candidates = driver.execute(_CANDIDATES_SQL, (name, CANDIDATES)).fetchall()
        else:
            candidates = conn.execute(_CANDIDATES, {"name": name}).all()
        tried: set[str] = set()
        found = _holding(store, conn, candidates, tried, kind, key, initial_hash)
        if len(candidates) == CANDIDATES and not _same_input(found, initial_hash):
            recorders = _recorders(conn, driver, name, kind, key)
            if found is not None:
                # Only a recorder of this input is a better source than the candidate of
                # another input (which may take another path after the same first call): the
                # others' rows are not read.
                recorders = [r for r in recorders if r[2] == initial_hash]
            found = _holding(store, conn, recorders, tried, kind, key, initial_hash) or found
        if not _same_input(found, initial_hash):
            # No completed trace of this input made the call: a failed one may have (a chain
            # that raised after its steps). Looked at only here, so a completed trace of the
            # same input is always taken first; another input's completed trace is kept
            # unless a failed trace of this input made the call.
            failed = _failed(conn, driver, name, kind, key, initial_hash)
            if found is not None:
                failed = [r for r in failed if r[2] == initial_hash]
            found = _holding(store, conn, failed, tried, kind, key, initial_hash) or found
        return _prefetch(store, conn, *found) if found is not None else None


def _same_input(
    found: tuple[SourceRows, frozenset[tuple[str, str]]] | None, initial_hash: str | None
) -> bool:
    """Whether ``found`` is a source whose initial state hashes to ``initial_hash`` (any,
    when None); False when nothing was found."""
    if found is None:
        return False
    return initial_hash is None or found[0].initial_state_hash == initial_hash


def _holding(
    store: Store,
    conn: Connection,
    candidates: Any,
    tried: set[str],
    kind: str,
    key: str,
    initial_hash: str | None,
) -> tuple[SourceRows, frozenset[tuple[str, str]]] | None:
    """The rows and call keys of the first of ``candidates`` (run id, config JSON, ...; newest
    first) not in ``tried`` whose calls include ``(kind, key)`` and whose initial state hashes
    to ``initial_hash`` (any, when None), else of the first whose calls include it; None when
    none does. The runs looked at are added to ``tried``."""
    first: tuple[SourceRows, frozenset[tuple[str, str]]] | None = None
    for run_id, config_json, *_ in candidates:
        config = json.loads(config_json or "{}")
        ref = reference_of(config)
        if ref is not None and config[REFERENCE_KEY].get("all"):
            run_id = ref[0]
        if run_id in tried:
            continue
        tried.add(run_id)
        rows = source_rows(store, conn, run_id)
        if not rows.is_trace:
            continue
        calls = _call_keys(rows)
        if (kind, key) not in calls:
            continue
        if initial_hash is None or rows.initial_state_hash == initial_hash:
            return rows, calls
        first = first or (rows, calls)
    return first


def _recorders(
    conn: Connection, driver: Any, name: str, kind: str, key: str
) -> list[tuple[str, str, str | None]]:
    """(run id, config JSON, initial state hash) of the completed traces named ``name`` that
    may have recorded the call ``(kind, key)``, from its cache entry (keyed by the call key, so
    one index lookup):
    the trace an import seeded it for (``origin``), or the traces of the name started by the
    time the entry's answer was produced (``created_at``, the recording call's ``produced_at``)
    whose own call rows hold the key, newest first, among the :data:`RECORDER_CANDIDATES`
    newest started by then (by index: ``ix_runs_pipeline_created``, then each one's call rows
    by its run id). Empty when the call was never cached."""
    entry = _entry(conn, driver, kind, key)
    if entry is None:
        return []
    produced, origin = entry
    if origin is not None:
        return _runs_holding(conn, driver, _ORIGIN_SQL, (origin, name), key)
    return _runs_holding(
        conn, driver, _RECORDERS_SQL, (name, float(produced), RECORDER_CANDIDATES), key
    )


def _entry(conn: Connection, driver: Any, kind: str, key: str) -> Any:
    """(created_at, origin) of the cache entry of the call ``(kind, key)``, or None."""
    table = "llm_cache" if kind == "llm" else "tool_cache"
    if driver is not None:
        return driver.execute(_ENTRY_SQL[table], (schema.digest_bytes(key),)).fetchone()
    return conn.execute(_ENTRY[table], {"key": key}).first()


def _runs_holding(
    conn: Connection, driver: Any, sql: str, args: tuple[Any, ...], key: str
) -> list[tuple[str, str, str | None]]:
    """The rows of ``sql`` (one of this module's statements, positional ``?``, the call key
    last) run with ``args`` and ``key``: through ``driver`` (the sqlite3 connection) when there
    is one, else as its Core statement (:data:`_STATEMENTS`)."""
    if driver is not None:
        return driver.execute(sql, (*args, schema.digest_bytes(key))).fetchall()
    params = {chr(ord("a") + i): value for i, value in enumerate(args)}  # as _named names them
    return [tuple(r) for r in conn.execute(_STATEMENTS[sql], params | {"key": key})]


def _failed(
    conn: Connection, driver: Any, name: str, kind: str, key: str, initial_hash: str | None
) -> list[tuple[str, str, str | None]]:
    """(run id, config JSON, initial state hash) of the failed traces named ``name`` among the
    :data:`RECORDER_CANDIDATES` newest of the name (any status; by index:
    ``ix_runs_pipeline_created``) whose own call rows, or their parent's, hold the call key
    ``key``, newest first. A failed trace's replay stored wholly by reference holds no call rows:
    its source, which does, stands for it (:func:`_holding` takes it instead), so the source
    is found however many of its replays came after it.

    When none of them is of this input (``initial_hash``), the failed traces among the
    :data:`RECORDER_CANDIDATES` newest started by the time the call's cache entry was produced
    follow, as :func:`_recorders` finds a completed one: a failed recording followed by 16
    traces of other inputs was out of the window, and its unchanged cached replay was stored
    unlinked and in full."""
    found = _runs_holding(conn, driver, _FAILED_SQL, (name, RECORDER_CANDIDATES), key)
    if any(initial_hash is None or r[2] == initial_hash for r in found):
        return found
    entry = _entry(conn, driver, kind, key)
    if entry is None:
        return found
    since = (name, float(entry[0]), RECORDER_CANDIDATES)
    seen = {r[0] for r in found}
    older = _runs_holding(conn, driver, _FAILED_BY_SQL, since, key)
    return found + [r for r in older if r[0] not in seen]


# Built once (a cached trace runs both at its first lookup; building a select costs about as
# much as running it).
_runs = schema.runs
_CANDIDATES = (
    select(_runs.c.run_id, _runs.c.config_json)
    .where(_runs.c.pipeline == bindparam("name"), _runs.c.status == "completed")
    .order_by(_runs.c.created_at.desc())
    .limit(CANDIDATES)
)
_RUN_TIMES = select(
    _runs.c.status,
    _runs.c.created_at,
    _runs.c.finished_at,
    select(schema.meta.c.value).where(schema.meta.c.key == RUNS_EPOCH_KEY).scalar_subquery(),
).where(_runs.c.run_id == bindparam("run_id"))
# The same two on SQLite, run through the driver in the read transaction (as _CACHED_SQL):
# rows come back as the driver's tuples (text and floats, as SQLAlchemy returns them there),
# without a compiled statement's execution and result objects (~0.05 ms each, per trace).
_CANDIDATES_SQL = (
    "SELECT run_id, config_json FROM runs WHERE pipeline = ? AND status = 'completed'"
    " ORDER BY created_at DESC LIMIT ?"
)
_RUN_TIMES_SQL = (
    "SELECT status, created_at, finished_at,"
    f" (SELECT value FROM meta WHERE key = '{RUNS_EPOCH_KEY}') FROM runs WHERE run_id = ?"
)

# The fallback of find_source (_recorders): the call's cache entry, then the traces of the name
# started by the time its answer was produced (ix_runs_pipeline_created, newest first, at most
# RECORDER_CANDIDATES) whose own call rows hold its key (each run's calls by its run id).
_ENTRY_SQL = {
    table: f"SELECT created_at, origin FROM {table} WHERE key = ?"
    for table in ("llm_cache", "tool_cache")
}
_HOLDS_KEY = "EXISTS (SELECT 1 FROM calls c WHERE c.run_id = r.run_id AND c.key = ?)"
_RECORDERS_SQL = (
    "SELECT run_id, config_json, initial_state_hash FROM (SELECT run_id, config_json,"
    " initial_state_hash, created_at FROM runs"
    " WHERE pipeline = ? AND status = 'completed' AND created_at <= ?"
    " ORDER BY created_at DESC LIMIT ?) r"
    f" WHERE {_HOLDS_KEY} ORDER BY created_at DESC"
)
_ORIGIN_SQL = (
    "SELECT run_id, config_json, initial_state_hash FROM runs r"
    f" WHERE run_id = ? AND pipeline = ? AND status = 'completed' AND {_HOLDS_KEY}"
)

# The failed traces that may be a cached trace's source (_failed): among the newest of the name
# of any status (bounded by ix_runs_pipeline_created, as _RECORDERS_SQL), those whose own call
# rows, or their parent's, hold the key (a replay stored by reference has none of its own: its
# parent's stand for them, and _holding takes the parent of one stored wholly by reference).
_FAILED_BY = (
    "SELECT run_id, config_json, initial_state_hash FROM (SELECT run_id, config_json,"
    " initial_state_hash, status, parent_run_id, created_at FROM runs WHERE pipeline = ?{since}"
    " ORDER BY created_at DESC LIMIT ?) r"
    " WHERE status = 'failed' AND EXISTS (SELECT 1 FROM calls c"
    " WHERE c.run_id IN (r.run_id, r.parent_run_id) AND c.key = ?) ORDER BY created_at DESC"
)
_FAILED_SQL = _FAILED_BY.format(since="")
# ... and those started by the time the call's cache entry was produced (as _RECORDERS_SQL).
_FAILED_BY_SQL = _FAILED_BY.format(since=" AND created_at <= ?")


def _named(sql: str) -> Any:
    """``sql`` (positional ``?``) as a Core text statement: ``:a``, ``:b``, ... in order, the
    call key (the last) as ``:key``, bound as a :class:`~rewind.store.schema.Digest`."""
    parts = sql.split("?")
    names = [f":{chr(ord('a') + i)}" for i in range(len(parts) - 2)] + [":key"]
    joined = parts[0] + "".join(n + p for n, p in zip(names, parts[1:], strict=True))
    return text(joined).bindparams(bindparam("key", type_=schema.Digest()))


_ENTRY = {
    table: text(sql.replace("?", ":key")).bindparams(bindparam("key", type_=schema.Digest()))
    for table, sql in _ENTRY_SQL.items()
}
_STATEMENTS = {
    sql: _named(sql) for sql in (_RECORDERS_SQL, _ORIGIN_SQL, _FAILED_SQL, _FAILED_BY_SQL)
}


def _sqlite_driver(conn: Connection) -> Any:
    """The ``sqlite3`` connection under ``conn`` (same transaction), or None on another
    database or driver."""
    if conn.dialect.driver != "pysqlite":
        return None
    return conn.connection.driver_connection


def source_rows(store: Store, conn: Connection, run_id: str) -> SourceRows:
    """The rows of ``run_id`` (:func:`rewind.store.references.load_rows`), kept in this process
    for the next trace that replays the same source.

    A completed or failed run's node, call and span rows are never updated (only a running
    run's status changes), only deleted with the run, so
    rows read before are still its rows while a run row with the same id, status, start and end
    exists and no run was deleted since: that row and ``meta.runs_epoch`` (bumped by every
    deletion of a run's rows, :data:`rewind.store.store.RUNS_EPOCH_KEY`) are read first, in
    ``conn``'s transaction (one statement), and they are the key. A run deleted and stored again
    under the same id, by any process, is therefore read again even with the same start and end
    (an OpenTelemetry import takes them from the file). The rows are shared between
    the traces that use them: callers treat them as read-only. The cache entries and result
    bytes of the calls are not kept: a recording may have replaced them since
    (:func:`_prefetch` reads them for each trace).
    """
    driver = _sqlite_driver(conn)
    if driver is not None:
        found = driver.execute(_RUN_TIMES_SQL, (run_id,)).fetchall()
        row = found[0] if found else None
    else:
        row = conn.execute(_RUN_TIMES, {"run_id": run_id}).first()
    if row is None or row[0] not in ("completed", "failed"):
        return load_rows(conn, run_id)
    key = (str(store.engine.url), run_id, float(row[1]), row[2], row[3])
    with _ROWS_LOCK:
        rows = _ROWS.get(key)
        if rows is not None:
            _ROWS.move_to_end(key)
            return rows
    rows = load_rows(conn, run_id)
    with _ROWS_LOCK:
        _ROWS[key] = rows
        while len(_ROWS) > ROWS_KEPT:
            _ROWS.popitem(last=False)
    return rows


def _prefetch(
    store: Store, conn: Connection, rows: SourceRows, calls: frozenset[tuple[str, str]]
) -> FoundSource:
    """The cache entries of the source's calls and their result bytes: joins over the calls of
    the runs holding the source's rows (no list of keys sent to the database)."""
    found = FoundSource(rows, _entries(conn, rows, calls))
    entries = found.entries
    wanted: set[str] = set()
    with _ROWS_LOCK:  # the remembered results, under one lock for all of them
        held = _FOUND_BLOBS.get(id(entries))
        memory = (_BLOBS_DROPPED[0], _BLOBS_SIZE[0])
        if held is not None and held[0] is entries and _kept_since(held[1], memory):
            # The same entries as a trace before, whose results were all remembered then and
            # none was dropped since: the same results (content-addressed), without a lookup
            # per entry (their recency in the memory is left as that trace set it).
            found.blobs = dict(held[2])
            return found
        for entry in entries.values():
            data = _BLOBS.get(entry.result_hash)
            if data is None:
                wanted.add(entry.result_hash)
            else:
                _BLOBS.move_to_end(entry.result_hash)
                found.blobs[entry.result_hash] = data
        if not wanted:
            _FOUND_BLOBS[id(entries)] = (entries, memory, dict(found.blobs))
            while len(_FOUND_BLOBS) > ROWS_KEPT:
                _FOUND_BLOBS.popitem(last=False)
    if wanted:
        # A missing blob is read lazily, and fails there as before.
        with contextlib.suppress(StoreError):
            read = store.get_blobs(wanted, conn)
            found.blobs.update(read)
            _remember(read)
    return found


_FOUND_BLOBS: OrderedDict[int, tuple[dict[Any, CacheEntry], tuple[int, int], dict[str, bytes]]] = (
    OrderedDict()
)
"""Per entries dict (:func:`_entries` hands the same one to traces that read the same rows):
the memory's (results dropped, bytes held) when every result of it was found remembered, and
those results by hash."""


def _kept_since(then: tuple[int, int], now: tuple[int, int]) -> bool:
    """Whether every result the memory held at ``then`` (results dropped so far, bytes held)
    is still held ``now``: none dropped since, and not cleared (its bytes only grew)."""
    return now[0] == then[0] and now[1] >= then[1]


_ENTRIES: OrderedDict[
    int, tuple[SourceRows, list[tuple[Any, ...]], dict[tuple[str, str], CacheEntry]]
] = OrderedDict()


def _entries(
    conn: Connection, rows: SourceRows, calls: frozenset[tuple[str, str]]
) -> dict[tuple[str, str], CacheEntry]:
    """The cache entries of the source's calls by ``(kind, key)``, read in ``conn``'s
    transaction every time (a recording may have replaced them since). When the rows read are,
    value for value, the ones the last trace of the same rows object read, that trace's dict is
    returned again instead of being built anew (entries are immutable; the dict is shared:
    callers only read it)."""
    raw: list[tuple[Any, ...]] = []
    for holder in rows.holders:
        raw.extend(_cached_rows(conn, holder))
    with _ROWS_LOCK:
        held = _ENTRIES.get(id(rows))
        if held is not None and held[0] is rows and held[1] == raw:
            _ENTRIES.move_to_end(id(rows))
            return held[2]
    entries: dict[tuple[str, str], CacheEntry] = {}
    for kind, key, result, created, origin in _hex_digests(raw):
        if (kind, key) in calls:
            entries[(kind, key)] = CacheEntry.read(key, result, created, origin)
    with _ROWS_LOCK:
        _ENTRIES[id(rows)] = (rows, raw, entries)
        while len(_ENTRIES) > ROWS_KEPT:
            _ENTRIES.popitem(last=False)
    return entries


_CALL_KEYS: OrderedDict[int, tuple[SourceRows, frozenset[tuple[str, str]]]] = OrderedDict()


def _call_keys(rows: SourceRows) -> frozenset[tuple[str, str]]:
    """The ``(kind, key)`` of every call of ``rows``, made once per rows object (the rows kept
    by :func:`source_rows` are immutable)."""
    with _ROWS_LOCK:
        held = _CALL_KEYS.get(id(rows))
        if held is not None and held[0] is rows:
            return held[1]
    keys = frozenset((c["kind"], c["key"]) for cs in rows.calls.values() for c in cs)
    with _ROWS_LOCK:
        _CALL_KEYS[id(rows)] = (rows, keys)
        while len(_CALL_KEYS) > ROWS_KEPT:
            _CALL_KEYS.popitem(last=False)
    return keys


_LINEAGE_AT: OrderedDict[
    int, tuple[SourceRows, dict[tuple[int, str], tuple[str, LineageEntry]]]
] = OrderedDict()


_LINEAGE_OUT: OrderedDict[
    int, tuple[dict[Any, CacheEntry], SourceRows, dict[tuple[int, str], LineageEntry]]
] = OrderedDict()
"""Per entries dict: the rows it was read for and :func:`lineage_at`'s index over both (both
immutable, so the index is the same for every trace that gets the same pair)."""


def lineage_at(found: FoundSource) -> dict[tuple[int, str], LineageEntry]:
    """``{(position, cache key): entry}`` of the source's calls that have a result (served and
    dry-run side effects left out, as :func:`rewind.tracing.store.lineage_index` does) and whose
    cache entry was read ahead and was recorded here (``origin`` None: an answer a trace import
    seeded serves that trace's replays only, never a live chain that shares its name).

    The index over the rows is made once per rows object (the rows kept by
    :func:`source_rows` are immutable); the dict returned is the caller's."""
    rows = found.rows
    entries = found.entries
    with _ROWS_LOCK:
        kept = _LINEAGE_OUT.get(id(entries))
        if kept is not None and kept[0] is entries and kept[1] is rows:
            return dict(kept[2])  # the same rows and entries as a trace before: the same index
        held = _LINEAGE_AT.get(id(rows))
        at = held[1] if held is not None and held[0] is rows else None
    if at is None:
        at = {
            (position, c["key"]): (
                c["kind"],
                LineageEntry(
                    c["result_hash"], c["produced_at"], c["run_id"], position, c["call_index"]
                ),
            )
            for position, calls in rows.calls.items()
            for c in calls
            if c["result_hash"] and c["outcome"] not in NOT_ANSWERS
        }
        with _ROWS_LOCK:
            _LINEAGE_AT[id(rows)] = (rows, at)
            while len(_LINEAGE_AT) > ROWS_KEPT:
                _LINEAGE_AT.popitem(last=False)
    out: dict[tuple[int, str], LineageEntry] = {}
    for where, (kind, entry) in at.items():
        cached = entries.get((kind, where[1]))
        if cached is not None and cached.origin is None:
            out[where] = entry
    with _ROWS_LOCK:
        _LINEAGE_OUT[id(entries)] = (entries, rows, out)
        while len(_LINEAGE_OUT) > ROWS_KEPT:
            _LINEAGE_OUT.popitem(last=False)
    return dict(out)


BLOB_MEMORY_BYTES = 16 * 1024 * 1024
"""How many bytes of call results this process keeps by hash between cached traces."""

_BLOBS: OrderedDict[str, bytes] = OrderedDict()
_BLOBS_SIZE = [0]
_BLOBS_DROPPED = [0]
"""How many results :func:`_remember` has dropped from the memory (so far, in this process)."""


def _remember(blobs: dict[str, bytes]) -> None:
    """Keep blobs read from the store (the least recently used go beyond
    :data:`BLOB_MEMORY_BYTES`)."""
    with _ROWS_LOCK:
        for digest, data in blobs.items():
            if digest in _BLOBS or len(data) > BLOB_MEMORY_BYTES // 64:
                continue
            _BLOBS[digest] = data
            _BLOBS_SIZE[0] += len(data)
        while _BLOBS_SIZE[0] > BLOB_MEMORY_BYTES:
            _digest, dropped = _BLOBS.popitem(last=False)
            _BLOBS_SIZE[0] -= len(dropped)
            _BLOBS_DROPPED[0] += 1


def _cached_rows(conn: Connection, run_id: str) -> list[tuple[Any, ...]]:
    """(kind, key, result hash, created at, origin) of the cache entries of one run's calls, as
    plain tuples. On SQLite the driver's values as they are (the digests as stored, 32 bytes:
    :func:`_hex_digests` turns them into hex as :class:`~rewind.store.schema.Digest` does, one
    pass over the rows instead of SQLAlchemy's result processing per value; a 100-step trace
    has 200 of them, read by every cached trace); elsewhere hex already."""
    driver = _sqlite_driver(conn)
    if driver is None:
        return [tuple(r) for r in conn.execute(_CACHED, {"r": run_id}).fetchall()]
    return driver.execute(_CACHED_SQL, (run_id, run_id)).fetchall()


def _hex_digests(rows: list[Any]) -> list[tuple[str, str, str, float, str | None]]:
    """Rows of :data:`_CACHED_SQL` with their 32-byte digests as hex (others as they are)."""
    # The conversion inlined (not a call per value: 400 values per 100-step trace).
    return [
        (
            kind,
            key.hex() if type(key) is bytes and len(key) == 32 else key,
            result.hex() if type(result) is bytes and len(result) == 32 else result,
            created,
            origin,
        )
        for kind, key, result, created, origin in rows
    ]


_CACHED_SQL = (
    "SELECT c.kind, l.key, l.response_hash, l.created_at, l.origin"
    " FROM calls c JOIN llm_cache l ON l.key = c.key"
    " WHERE c.run_id = ? AND c.kind = 'llm'"
    " UNION ALL"
    " SELECT c.kind, t.key, t.result_hash, t.created_at, t.origin"
    " FROM calls c JOIN tool_cache t ON t.key = c.key"
    " WHERE c.run_id = ? AND c.kind = 'tool'"
)
"""The cache entries of one run's calls (SQLite, positional parameters: the run id twice)."""

_CACHED = text(_CACHED_SQL.replace("?", ":r")).columns(
    key=schema.Digest(), response_hash=schema.Digest()
)  # hex on SQLite too (schema.Digest)
"""The cache entries of one run's calls."""
