"""The store: every query Rewind makes, behind one class.

The engine speaks SQLAlchemy Core, so SQLite (default) and PostgreSQL (by URL) share this code;
dialect details live in ``engine.py``. Blobs are content-addressed (sha256 of their bytes) and
artifacts are files under the store's folder, referenced by hash and relative path only.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, and_, insert, select, text, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from rewind.canonical import canonical_bytes, sha256_hex
from rewind.errors import RewindError, StoreError
from rewind.serde import decode_field
from rewind.store import migrate, schema
from rewind.store.engine import sqlite_engine, url_engine
from rewind.store.objects import OFFLOAD_MIN_BYTES, ObjectStore
from rewind.store.records import CallRecord, EffectRecord, NodeRecord, RunRecord

DB_FILENAME = "rewind.db"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
OWNER = f"{socket.gethostname()}:{os.getpid()}"
"""Written on every run this process executes, so a crashed process's runs can be recognised."""
MIN_PREFIX = 4
"""Shortest run id prefix accepted in place of a full id."""
COMPRESS_MIN_BYTES = 1024
"""Blobs at least this large are stored zlib-compressed when that saves 10% or more; the hash
is always taken over the uncompressed bytes."""
_IN_CHUNK = 500


@dataclass
class WriteBatch:
    """Rows to write in one transaction: what the recorder accumulates between flushes.

    ``blobs`` maps sha256 → uncompressed bytes; the row lists hold column → value dicts.
    """

    blobs: dict[str, bytes] = field(default_factory=dict)
    llm_cache: list[dict[str, Any]] = field(default_factory=list)
    tool_cache: list[dict[str, Any]] = field(default_factory=list)
    states: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    effects: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.blobs or self.states or self.nodes or self.llm_cache or self.tool_cache)


def _pack(data: bytes) -> tuple[str, bytes]:
    if len(data) >= COMPRESS_MIN_BYTES:
        packed = zlib.compress(data, 6)
        if len(packed) <= len(data) * 0.9:
            return "zlib", packed
    return "raw", data


def _unpack(codec: str, data: bytes) -> bytes:
    return zlib.decompress(data) if codec == "zlib" else bytes(data)


@dataclass(frozen=True)
class CacheEntry:
    """A cache entry: the stored result blob and when it was written (unix seconds)."""

    key: str
    result_hash: str
    created_at: float
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Store:
    """Rewind's persistent store: runs, nodes, calls, caches, blobs, Burr state, artifacts.

    Args:
        root: the store's folder (artifacts are written below it; the SQLite file lives in it).
        engine: a SQLAlchemy engine; see :func:`open_store` for the usual way to get one.
        objects: where blobs of at least ``offload_min_bytes`` (bytes, uncompressed) are
            written; None keeps every blob in the database.

    Raises:
        StoreError: the database has another schema version than this code.
    """

    def __init__(
        self,
        root: Path,
        engine: Engine,
        *,
        objects: ObjectStore | None = None,
        offload_min_bytes: int = OFFLOAD_MIN_BYTES,
    ) -> None:
        self.root = root
        self.engine = engine
        self.objects = objects
        self.offload_min_bytes = offload_min_bytes
        self._known_blobs: set[str] = set()
        self._known_lock = threading.Lock()
        try:
            self._init_schema()
        except SQLAlchemyError as exc:
            engine.dispose()
            raise StoreError(
                f"cannot open the store at {root}: {_first_line(exc)}",
                "pass a writable --store folder (or a reachable database URL)",
            ) from exc
        # Statements are built once: constructing one costs more than executing it (measured
        # ~150 µs vs ~40 µs per blob insert on the record hot path).
        dialect = engine.dialect.name
        self._insert_blob = _insert_ignore_stmt(dialect, schema.blobs, ["hash"])
        self._upsert_llm = _upsert_stmt(dialect, schema.llm_cache, ["key"])
        self._upsert_tool = _upsert_stmt(dialect, schema.tool_cache, ["key"])
        self._insert_state = insert(schema.burr_state)
        self._insert_node = insert(schema.nodes)
        self._insert_call = insert(schema.calls)

    # -- transactions -------------------------------------------------------------------------
    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite); commits on success."""
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            yield conn

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction."""
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def _init_schema(self) -> None:
        with self.write() as conn:
            migrate.upgrade(conn, where=str(self.root))
            row = conn.execute(
                select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")
            ).first()
            if row is None or int(row[0]) != schema.SCHEMA_VERSION:
                raise StoreError(
                    f"store {self.root} has schema version {row[0]}, this Rewind expects "
                    f"{schema.SCHEMA_VERSION}",
                    "use a new store folder (--store) or the Rewind version that wrote it",
                )

    def close(self) -> None:
        """Release the engine's connections."""
        self.engine.dispose()

    # -- blobs --------------------------------------------------------------------------------
    def put_blob(self, conn: Connection, data: bytes) -> str:
        """Store bytes content-addressed inside ``conn``'s transaction; returns their sha256 hex."""
        digest = sha256_hex(data)
        if digest not in self._known_blobs:
            conn.execute(self._insert_blob, [self._blob_row(digest, data)])
        return digest

    def _blob_row(self, digest: str, data: bytes) -> dict[str, Any]:
        """The blobs row for these bytes; large ones are written to the object store first, so
        a committed row never refers to an object that is not there."""
        if self.objects is not None and len(data) >= self.offload_min_bytes:
            ref = self.objects.put_blob(digest, data)
            return {"hash": digest, "size": len(data), "codec": "object", "data": b"", "ref": ref}
        codec, packed = _pack(data)
        return {"hash": digest, "size": len(data), "codec": codec, "data": packed, "ref": None}

    def put_json(self, conn: Connection, value: Any) -> str:
        """Store a JSON-like value as canonical bytes; returns its content hash."""
        return self.put_blob(conn, canonical_bytes(value))

    def knows_blob(self, digest: str) -> bool:
        """True when this store instance has committed a blob with this hash (a cheap skip)."""
        return digest in self._known_blobs

    def get_blob(self, digest: str, conn: Connection | None = None) -> bytes:
        """Uncompressed bytes of a blob. Raises StoreError if it is missing (a damaged store)."""
        found = self.get_blobs([digest], conn)
        return found[digest]

    def get_blobs(self, digests: Iterable[str], conn: Connection | None = None) -> dict[str, bytes]:
        """Bytes of many blobs in as few queries as possible.

        Raises:
            StoreError: one of them is missing (a damaged store).
        """
        wanted = list(dict.fromkeys(digests))
        if conn is None:
            with self.read() as c:
                return self.get_blobs(wanted, c)
        t = schema.blobs
        out: dict[str, bytes] = {}
        for i in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[i : i + _IN_CHUNK]
            for row in conn.execute(
                select(t.c.hash, t.c.codec, t.c.data, t.c.ref).where(t.c.hash.in_(chunk))
            ):
                if row.codec == "object":
                    out[row.hash] = self._object_store_for(row.ref).get_blob(row.ref, row.hash)
                else:
                    out[row.hash] = _unpack(row.codec, row.data)
        missing = [d for d in wanted if d not in out]
        if missing:
            raise StoreError(
                f"blob {missing[0][:12]} is missing from the store", "the store is damaged"
            )
        return out

    def _object_store_for(self, ref: str) -> ObjectStore:
        if self.objects is not None and ref.startswith(self.objects.url + "/"):
            return self.objects
        # Written under another object store URL (moved configuration): read it where it is.
        return ObjectStore(ref.rsplit("/blobs/", 1)[0])

    def get_json(self, digest: str, conn: Connection | None = None) -> Any:
        """A JSON value stored with :meth:`put_json`."""
        return json.loads(self.get_blob(digest, conn))

    def write_batch(self, batch: WriteBatch) -> None:
        """Write a batch in one ``BEGIN IMMEDIATE`` transaction (all or nothing).

        Blob hashes are remembered as present only after the commit, so a rolled-back batch
        never makes a later write skip a blob that is not there.
        """
        if not batch:
            return
        new = {h: d for h, d in batch.blobs.items() if h not in self._known_blobs}
        # Rows are built (and large blobs uploaded) before the write lock is taken.
        rows = [self._blob_row(digest, data) for digest, data in new.items()]
        with self.write() as conn:
            if rows:
                conn.execute(self._insert_blob, rows)
            if batch.llm_cache:
                conn.execute(self._upsert_llm, batch.llm_cache)
            if batch.tool_cache:
                conn.execute(self._upsert_tool, batch.tool_cache)
            if batch.states:
                try:
                    conn.execute(self._insert_state, batch.states)
                except IntegrityError as exc:
                    raise StoreError(
                        "a state row of this app id already exists",
                        "an app id can be recorded once; fork it instead of re-running it",
                    ) from exc
            if batch.nodes:
                conn.execute(self._insert_node, batch.nodes)
            if batch.calls:
                conn.execute(self._insert_call, batch.calls)
            if batch.effects:
                conn.execute(insert(schema.effects), batch.effects)
        with self._known_lock:
            if len(self._known_blobs) > 500_000:
                self._known_blobs.clear()
            self._known_blobs.update(new)

    # -- runs ---------------------------------------------------------------------------------
    def create_run(self, conn: Connection, **values: Any) -> None:
        """Insert a run row (``status`` running). Raises StoreError if the id exists."""
        values.setdefault("created_at", time.time())
        values.setdefault("status", "running")
        values.setdefault("owner", OWNER)
        for key in ("override", "config"):
            if key in values:
                v = values.pop(key)
                values[f"{key}_json"] = None if v is None else json.dumps(v, sort_keys=True)
        try:
            conn.execute(insert(schema.runs).values(**values))
        except IntegrityError as exc:
            raise StoreError(f"run id {values['run_id']} already exists", "use a new id") from exc

    def finish_run(
        self,
        run_id: str,
        status: str,
        *,
        error: str | None = None,
    ) -> None:
        """Mark a running run finished and fill its totals from its node rows.

        A run already finished is left as it is (recorded runs are immutable, rule 7).
        """
        with self.write() as conn:
            totals = conn.execute(
                text(
                    "SELECT COALESCE(SUM(prompt_tokens),0), COALESCE(SUM(completion_tokens),0),"
                    " COALESCE(SUM(latency_ms),0) FROM nodes WHERE run_id=:r AND inherited=:f"
                ),
                {"r": run_id, "f": False},
            ).one()
            conn.execute(
                update(schema.runs)
                .where(and_(schema.runs.c.run_id == run_id, schema.runs.c.status == "running"))
                .values(
                    status=status,
                    finished_at=time.time(),
                    prompt_tokens=int(totals[0]),
                    completion_tokens=int(totals[1]),
                    latency_ms=float(totals[2]),
                    error=error,
                )
            )

    def reap_orphans(self) -> list[str]:
        """Mark ``running`` runs whose executing process (on this host) is gone as ``interrupted``.

        A run whose process was killed can never finish; without this it would stay ``running``
        forever and could never be forked. Returns the ids marked.
        """
        host = OWNER.rsplit(":", 1)[0]
        t = schema.runs
        with self.read() as conn:
            rows = conn.execute(select(t.c.run_id, t.c.owner).where(t.c.status == "running")).all()
        dead = [
            r.run_id
            for r in rows
            if r.owner
            and r.owner.rsplit(":", 1)[0] == host
            and not _alive(int(r.owner.rsplit(":", 1)[1]))
        ]
        if dead:
            with self.write() as conn:
                conn.execute(
                    update(t)
                    .where(and_(t.c.run_id.in_(dead), t.c.status == "running"))
                    .values(
                        status="interrupted",
                        finished_at=time.time(),
                        error="interrupted: its process ended before the run finished",
                    )
                )
        return dead

    def mark_interrupted(self) -> list[str]:
        """Mark every run still ``running`` as ``interrupted`` (after a crash or restart)."""
        with self.write() as conn:
            ids = [
                r[0]
                for r in conn.execute(
                    select(schema.runs.c.run_id).where(schema.runs.c.status == "running")
                )
            ]
            if ids:
                conn.execute(
                    update(schema.runs)
                    .where(schema.runs.c.status == "running")
                    .values(status="interrupted", finished_at=time.time())
                )
        return ids

    def get_run(self, run_id: str) -> RunRecord:
        """The run with this id, or a prefix of it that names exactly one run.

        Raises:
            UnknownRun: no run (or more than one) matches.
        """
        from rewind.errors import UnknownRun

        with self.read() as conn:
            row = conn.execute(select(schema.runs).where(schema.runs.c.run_id == run_id)).first()
            if row is None and run_id and len(run_id) < MIN_PREFIX:
                raise UnknownRun(
                    f"unknown run {run_id!r}",
                    f"give the full id or at least {MIN_PREFIX} characters of it (rewind runs)",
                )
            if row is None and run_id:
                t = schema.runs
                rows = conn.execute(
                    select(t).where(t.c.run_id.startswith(run_id, autoescape=True)).limit(2)
                ).all()
                if len(rows) == 1:
                    row = rows[0]
                elif len(rows) > 1:
                    raise UnknownRun(
                        f"run id prefix {run_id!r} matches several runs",
                        "give more characters of the id (see `rewind runs`)",
                    )
        if row is None:
            raise UnknownRun(f"unknown run {run_id!r}", "list runs with `rewind runs`")
        return RunRecord.from_row(row)

    def list_runs(self, limit: int = 100) -> list[RunRecord]:
        """Most recent runs first."""
        with self.read() as conn:
            rows = conn.execute(
                select(schema.runs).order_by(schema.runs.c.created_at.desc()).limit(limit)
            ).all()
        return [RunRecord.from_row(r) for r in rows]

    def children(self, run_id: str) -> list[RunRecord]:
        """Forks whose parent is ``run_id``, oldest first."""
        with self.read() as conn:
            rows = conn.execute(
                select(schema.runs)
                .where(schema.runs.c.parent_run_id == run_id)
                .order_by(schema.runs.c.created_at)
            ).all()
        return [RunRecord.from_row(r) for r in rows]

    # -- nodes and calls ----------------------------------------------------------------------
    def insert_node(
        self, conn: Connection, node: dict[str, Any], calls: Sequence[CallRecord] = ()
    ) -> None:
        """Insert one node row and its calls (values keyed by column name)."""
        conn.execute(self._insert_node, [node])
        if calls:
            conn.execute(self._insert_call, call_rows(node["run_id"], node["position"], calls))

    def effects_of(self, run_id: str) -> list[EffectRecord]:
        """Effect rows of a run, in call order."""
        t = schema.effects
        with self.read() as conn:
            rows = conn.execute(
                select(t).where(t.c.run_id == run_id).order_by(t.c.position, t.c.call_index)
            ).all()
        return [EffectRecord.from_row(r) for r in rows]

    def nodes_of(self, run_id: str, *, with_calls: bool = True) -> list[NodeRecord]:
        """Node rows of a run in position order."""
        with self.read() as conn:
            rows = conn.execute(
                select(schema.nodes)
                .where(schema.nodes.c.run_id == run_id)
                .order_by(schema.nodes.c.position)
            ).all()
            by_pos: dict[int, list[CallRecord]] = {}
            if with_calls:
                for r in conn.execute(
                    select(schema.calls)
                    .where(schema.calls.c.run_id == run_id)
                    .order_by(schema.calls.c.position, schema.calls.c.call_index)
                ):
                    by_pos.setdefault(r._mapping["position"], []).append(CallRecord.from_row(r))
        return [NodeRecord.from_row(r, tuple(by_pos.get(r._mapping["position"], ()))) for r in rows]

    # -- caches -------------------------------------------------------------------------------
    def llm_cache_get(self, key: str) -> CacheEntry | None:
        """The LLM cache entry for a key, if any."""
        t = schema.llm_cache
        with self.read() as conn:
            row = conn.execute(select(t).where(t.c.key == key)).first()
        if row is None:
            return None
        m = row._mapping
        return CacheEntry(
            key, m["response_hash"], m["created_at"], m["prompt_tokens"], m["completion_tokens"]
        )

    def llm_cache_put(self, conn: Connection, **values: Any) -> None:
        """Write (or refresh) an LLM cache entry: key, model, request/response hashes, tokens."""
        values.setdefault("created_at", time.time())
        conn.execute(self._upsert_llm, [values])

    def tool_cache_get(self, key: str) -> CacheEntry | None:
        """The tool cache entry for a key, if any."""
        t = schema.tool_cache
        with self.read() as conn:
            row = conn.execute(select(t).where(t.c.key == key)).first()
        if row is None:
            return None
        m = row._mapping
        return CacheEntry(key, m["result_hash"], m["created_at"])

    def tool_cache_put(self, conn: Connection, **values: Any) -> None:
        """Write (or refresh) a tool cache entry: key, tool, args_hash, result_hash."""
        values.setdefault("created_at", time.time())
        conn.execute(self._upsert_tool, [values])

    def cache_sizes(self) -> dict[str, int]:
        """Row counts of the two caches."""
        with self.read() as conn:
            return {
                "llm_cache": conn.execute(text("SELECT COUNT(*) FROM llm_cache")).scalar_one(),
                "tool_cache": conn.execute(text("SELECT COUNT(*) FROM tool_cache")).scalar_one(),
            }

    # -- edges --------------------------------------------------------------------------------
    def put_edges(self, pipeline: str, edges: Iterable[tuple[str, str, str]]) -> None:
        """Record a pipeline's graph edges (src, dst, condition); idempotent."""
        rows = [{"pipeline": pipeline, "src": s, "dst": d, "condition": c} for s, d, c in edges]
        if not rows:
            return
        with self.write() as conn:
            stmt = _insert_ignore_stmt(conn.dialect.name, schema.edges, ["pipeline", "src", "dst"])
            conn.execute(stmt, rows)

    def edges_of(self, pipeline: str) -> list[tuple[str, str, str]]:
        """A pipeline's edges as (src, dst, condition)."""
        t = schema.edges
        with self.read() as conn:
            return [
                (r.src, r.dst, r.condition)
                for r in conn.execute(select(t).where(t.c.pipeline == pipeline))
            ]

    # -- Burr state rows ----------------------------------------------------------------------
    def save_state(self, conn: Connection, row: dict[str, Any]) -> None:
        """Insert one Burr state row (see :func:`state_row`).

        Raises:
            StoreError: the row (app id, sequence id) exists already.
        """
        try:
            conn.execute(self._insert_state, [row])
        except IntegrityError as exc:
            raise StoreError(
                f"state row {row['app_id']}#{row['sequence_id']} already exists",
                "an app id can be recorded once; fork it instead of re-running it",
            ) from exc

    def load_state_row(
        self, partition_key: str, app_id: str, sequence_id: int | None, *, values: bool = True
    ) -> dict[str, Any] | None:
        """A state row (the latest when ``sequence_id`` is None), or None.

        Returns:
            the row's columns plus ``fields`` ({field: blob hash}), ``internal`` (Burr's ``__``
            keys) and ``values`` (every field loaded with its recorded type, internal keys
            included; omitted when ``values`` is False, which only checks the row).
        Raises:
            StateLoadError: a field's value cannot be rebuilt in this process.
        """
        t = schema.burr_state
        cond = and_(t.c.partition_key == partition_key, t.c.app_id == app_id)
        with self.read() as conn:
            q = select(t).where(cond)
            if sequence_id is None:
                q = q.order_by(t.c.sequence_id.desc()).limit(1)
            else:
                q = q.where(t.c.sequence_id == sequence_id)
            row = conn.execute(q).first()
            if row is None:
                return None
            m = dict(row._mapping)
            fields = json.loads(m.pop("fields_json"))
            internal = json.loads(m.pop("internal_json") or "{}")
            blobs = self.get_blobs(fields.values(), conn) if values else {}
        m["fields"] = fields
        m["internal"] = internal
        if not values:
            return m
        m["values"] = {k: decode_field(k, blobs[h]) for k, h in fields.items()} | internal
        return m

    def resolve_fields(self, fields: dict[str, str]) -> dict[str, Any]:
        """Load a {field: blob hash} map into {field: value}, each value of its recorded type.

        Raises:
            StateLoadError: a value cannot be rebuilt (see :func:`rewind.serde.decode_field`).
            StoreError: a blob is missing.
        """
        blobs = self.get_blobs(fields.values())
        return {k: decode_field(k, blobs[h]) for k, h in fields.items()}

    def state_app_ids(self, partition_key: str) -> list[str]:
        """App ids with state rows in a partition."""
        t = schema.burr_state
        with self.read() as conn:
            return [
                r[0]
                for r in conn.execute(
                    select(t.c.app_id).where(t.c.partition_key == partition_key).distinct()
                )
            ]

    # -- artifacts ----------------------------------------------------------------------------
    def put_artifact(self, run_id: str, name: str, data: bytes) -> tuple[str, Path]:
        """Write an artifact file under ``<root>/artifacts/<run_id>/<name>`` and record it.

        The name is never trusted as a path: it must be a plain file name.

        Returns:
            (sha256 hex of the bytes, absolute path)
        Raises:
            RewindError: the name is not a plain file name.
        """
        if not _SAFE_NAME.match(name) or ".." in name:
            raise RewindError(
                f"artifact name {name!r} is not a plain file name", "use [A-Za-z0-9._-]"
            )
        rel = Path("artifacts") / run_id / name
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        digest = sha256_hex(data)
        with self.write() as conn:
            stmt = _upsert_stmt(conn.dialect.name, schema.artifacts, ["run_id", "name"])
            row = {"run_id": run_id, "name": name, "sha256": digest, "size": len(data)}
            conn.execute(stmt, [row | {"path": rel.as_posix()}])
        return digest, path

    def artifacts_of(self, run_id: str) -> list[dict[str, Any]]:
        """Artifacts of a run: name, sha256, size (bytes), absolute path."""
        t = schema.artifacts
        with self.read() as conn:
            rows = conn.execute(select(t).where(t.c.run_id == run_id).order_by(t.c.name)).all()
        return [
            {"name": r.name, "sha256": r.sha256, "size": r.size, "path": self.root / r.path}
            for r in rows
        ]


def call_rows(run_id: str, position: int, calls: Sequence[CallRecord]) -> list[dict[str, Any]]:
    """Column dicts of a node's call rows."""
    return [
        {
            "run_id": run_id,
            "position": position,
            "call_index": c.call_index,
            "kind": c.kind,
            "name": c.name,
            "key": c.key,
            "request_hash": c.request_hash,
            "result_hash": c.result_hash,
            "outcome": c.outcome,
            "reason": c.reason,
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens,
            "latency_ms": c.latency_ms,
            "determinism": c.determinism,
            "produced_at": c.produced_at,
        }
        for c in calls
    ]


def state_row(
    *,
    partition_key: str,
    app_id: str,
    sequence_id: int,
    position: str,
    status: str,
    fields: dict[str, str],
    internal: dict[str, Any],
) -> dict[str, Any]:
    """Column dict of a Burr state row: semantic fields by blob hash, ``__`` keys inline."""
    return {
        "partition_key": partition_key,
        "app_id": app_id,
        "sequence_id": sequence_id,
        "position": position,
        "status": status,
        "fields_json": json.dumps(fields, sort_keys=True),
        "internal_json": json.dumps(internal, sort_keys=True),
        "created_at": time.time(),
    }


def _dialect_insert(dialect: str, table: Any) -> Any:
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table)


def _insert_ignore_stmt(dialect: str, table: Any, keys: list[str]) -> Any:
    return _dialect_insert(dialect, table).on_conflict_do_nothing(index_elements=keys)


def _upsert_stmt(dialect: str, table: Any, keys: list[str]) -> Any:
    stmt = _dialect_insert(dialect, table)
    rest = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys}
    return stmt.on_conflict_do_update(index_elements=keys, set_=rest)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return lines[0] if lines else type(orig).__name__


def open_store(
    location: str | Path,
    *,
    root: Path | None = None,
    objects: str | ObjectStore | None = None,
) -> Store:
    """Open (creating if needed) a store, bringing its schema to the newest migration.

    Args:
        location: a folder (the SQLite file ``rewind.db`` is created in it), a path ending in
            ``.db``/``.sqlite``, or a SQLAlchemy URL (``postgresql+psycopg://…``).
        root: with a URL, the folder artifacts are written below (default ``./.rewind``);
            ignored for SQLite, whose folder is the root.
        objects: object storage for large blobs (``s3://bucket/prefix``, ``file:///folder`` or
            an :class:`ObjectStore`); None reads ``REWIND_OBJECTS`` from the environment (unset:
            every blob stays in the database). Servers and workers share it by configuration.
    Raises:
        StoreError: the location cannot be created, or holds a schema this Rewind cannot
            upgrade (see :mod:`rewind.store.migrate`).
    """
    loc = str(location)
    if not loc.strip():
        raise StoreError("the store location is empty", "pass --store FOLDER (default .rewind)")
    object_store = _objects(objects)  # a bad object store URL fails before anything is created
    if "://" in loc:
        root = (root or Path(".rewind")).resolve()
        root.mkdir(parents=True, exist_ok=True)
        try:
            engine = url_engine(loc)
        except ModuleNotFoundError as exc:
            raise StoreError(
                f"the database driver for {loc.split('://')[0]} is not installed ({exc.name})",
                "pip install 'rewind-replay[postgres]' for PostgreSQL",
            ) from exc
        except Exception as exc:  # SQLAlchemy's ArgumentError, NoSuchModuleError...
            raise StoreError(
                f"cannot use the store URL {loc!r}: {_first_line(exc)}",
                "pass a folder, a .db file, or a URL like postgresql+psycopg://user@host/db",
            ) from exc
        return Store(root, engine, objects=object_store)
    path = Path(loc).expanduser()
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        root, db = path.parent, path
    else:
        root, db = path, path / DB_FILENAME
    if root.exists() and not root.is_dir():
        raise StoreError(f"the store location {root} is a file", "pass a folder or a .db path")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"cannot create store folder {root}: {exc}", "pass a writable --store"
        ) from exc
    return Store(root.resolve(), sqlite_engine(db.resolve()), objects=object_store)


OBJECTS_ENV = "REWIND_OBJECTS"
"""Environment variable naming the object store URL when ``open_store`` is not given one."""


def _objects(objects: str | ObjectStore | None) -> ObjectStore | None:
    if isinstance(objects, ObjectStore):
        return objects
    url = objects or os.environ.get(OBJECTS_ENV, "").strip()
    return ObjectStore(url) if url else None
