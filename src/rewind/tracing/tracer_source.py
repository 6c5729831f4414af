"""The recorded trace a cached trace replays, found from its first cache lookup.

A trace made with ``Tracer(read_cache=True)`` runs the caller's code again and looks each call
up by its content key. Looking every call up in the store costs a read transaction and a blob
read per call; instead, at the first lookup the trace finds the recorded trace that made that
call (the newest completed trace of the same name whose calls include the key) and reads, in
one transaction, that trace's rows and the cache entries and result bytes of all its calls.
Later lookups of those keys are dictionary reads; any other key is looked up in the store as
before, so what a lookup returns is exactly what the cache table holds (as of the first
lookup). The trace is then written as a replay of its source (its ``parent``), stored by
reference where it is identical (:mod:`rewind.store.references`).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field

from sqlalchemy import Connection, select, text

from rewind.errors import StoreError
from rewind.store import Store, schema
from rewind.store.codec import unpack as unpack_blob
from rewind.store.references import REFERENCE_KEY, SourceRows, load_rows, reference_of
from rewind.store.store import CacheEntry

__all__ = ["CANDIDATES", "FoundSource", "find_source"]

CANDIDATES = 4
"""How many of the newest traces of the same name are tried."""


@dataclass
class FoundSource:
    """What the first lookup found: the source's rows, the cache entries of its calls by
    ``(kind, key)``, and their result bytes by hash."""

    rows: SourceRows
    entries: dict[tuple[str, str], CacheEntry] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)


def find_source(store: Store, name: str, kind: str, key: str) -> FoundSource | None:
    """The recorded trace named ``name`` that made the call ``(kind, key)``, with its calls'
    cache entries and result bytes (one read transaction), or None.

    A replay stored wholly by reference stands for its source: the source is used instead,
    so replays of replays all point at the trace that holds the rows.
    """
    runs = schema.runs
    with store.read() as conn:
        candidates = conn.execute(
            select(runs.c.run_id, runs.c.config_json)
            .where(runs.c.pipeline == name, runs.c.status == "completed")
            .order_by(runs.c.created_at.desc())
            .limit(CANDIDATES)
        ).all()
        tried: set[str] = set()
        for run_id, config_json in candidates:
            config = json.loads(config_json or "{}")
            ref = reference_of(config)
            if ref is not None and config[REFERENCE_KEY].get("all"):
                run_id = ref[0]
            if run_id in tried:
                continue
            tried.add(run_id)
            rows = load_rows(conn, run_id)
            if not rows.is_trace:
                continue
            calls = {(c["kind"], c["key"]) for cs in rows.calls.values() for c in cs}
            if (kind, key) not in calls:
                continue
            return _prefetch(store, conn, rows, calls)
    return None


def _prefetch(
    store: Store, conn: Connection, rows: SourceRows, calls: set[tuple[str, str]]
) -> FoundSource:
    """The cache entries of the source's calls and their result bytes: joins over the calls of
    the runs holding the source's rows (no list of keys sent to the database)."""
    found = FoundSource(rows)
    wanted: set[str] = set()
    for holder in rows.holders:
        for kind, key, result, created, origin, codec, data in conn.execute(
            _CACHED, {"r": holder}
        ).fetchall():
            if (kind, key) not in calls:
                continue
            found.entries[(kind, key)] = CacheEntry(key, result, created, origin=origin)
            if codec in ("raw", "zlib") and data is not None:
                found.blobs[result] = unpack_blob(codec, data)
            else:
                wanted.add(result)
    if wanted:
        # A missing blob is read lazily, and fails there as before.
        with contextlib.suppress(StoreError):
            found.blobs.update(store.get_blobs(wanted, conn))
    return found


_CACHED = text(
    "SELECT c.kind, l.key, l.response_hash, l.created_at, l.origin, b.codec, b.data"
    " FROM calls c JOIN llm_cache l ON l.key = c.key"
    " LEFT JOIN blobs b ON b.hash = l.response_hash"
    " WHERE c.run_id = :r AND c.kind = 'llm'"
    " UNION ALL"
    " SELECT c.kind, t.key, t.result_hash, t.created_at, t.origin, b.codec, b.data"
    " FROM calls c JOIN tool_cache t ON t.key = c.key"
    " LEFT JOIN blobs b ON b.hash = t.result_hash"
    " WHERE c.run_id = :r AND c.kind = 'tool'"
).columns(key=schema.Digest(), response_hash=schema.Digest())  # hex on SQLite too (schema.Digest)
"""The cache entries (and stored result blobs) of one run's calls."""
