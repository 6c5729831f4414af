"""The store: every query Rewind makes, behind one class.

The engine speaks SQLAlchemy Core, so SQLite (default) and PostgreSQL (by URL) share this code;
dialect details live in ``engine.py``. Blobs are content-addressed (sha256 of their bytes) and
artifacts are files under the store's folder, referenced by hash and relative path only.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, and_, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from rewind.canonical import canonical_bytes, sha256_hex
from rewind.errors import RewindError, StoreError
from rewind.store import schema
from rewind.store.engine import sqlite_engine, url_engine
from rewind.store.records import CallRecord, NodeRecord, RunRecord

DB_FILENAME = "rewind.db"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")


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

    Raises:
        StoreError: the database has another schema version than this code.
    """

    def __init__(self, root: Path, engine: Engine) -> None:
        self.root = root
        self.engine = engine
        self._known_blobs: set[str] = set()
        self._known_lock = threading.Lock()
        self._init_schema()

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
            schema.metadata.create_all(conn)
            if conn.dialect.name == "sqlite":
                for ddl in schema.IMMUTABLE_TRIGGERS:
                    conn.exec_driver_sql(ddl)
            row = conn.execute(
                select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")
            ).first()
            if row is None:
                conn.execute(
                    insert(schema.meta).values(
                        key="schema_version", value=str(schema.SCHEMA_VERSION)
                    )
                )
            elif int(row[0]) != schema.SCHEMA_VERSION:
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
        """Store bytes content-addressed; returns their sha256 hex. Existing blobs cost nothing."""
        digest = sha256_hex(data)
        self.put_blob_hashed(conn, digest, data)
        return digest

    def put_blob_hashed(self, conn: Connection, digest: str, data: bytes) -> None:
        """Store bytes whose sha256 the caller already computed (saves hashing twice)."""
        if digest in self._known_blobs:
            return
        conn.execute(
            _insert_ignore(conn, schema.blobs, ["hash"]).values(
                hash=digest, size=len(data), data=data
            )
        )
        with self._known_lock:
            if len(self._known_blobs) > 200_000:
                self._known_blobs.clear()
            self._known_blobs.add(digest)

    def put_json(self, conn: Connection, value: Any) -> str:
        """Store a JSON-like value as canonical bytes; returns its content hash."""
        return self.put_blob(conn, canonical_bytes(value))

    def get_blob(self, digest: str, conn: Connection | None = None) -> bytes:
        """Bytes of a blob. Raises StoreError if it is missing (a corrupted store)."""
        if conn is None:
            with self.read() as c:
                return self.get_blob(digest, c)
        row = conn.execute(select(schema.blobs.c.data).where(schema.blobs.c.hash == digest)).first()
        if row is None:
            raise StoreError(
                f"blob {digest[:12]} is missing from the store", "the store is damaged"
            )
        return bytes(row[0])

    def get_json(self, digest: str, conn: Connection | None = None) -> Any:
        """A JSON value stored with :meth:`put_json`."""
        return json.loads(self.get_blob(digest, conn))

    # -- runs ---------------------------------------------------------------------------------
    def create_run(self, conn: Connection, **values: Any) -> None:
        """Insert a run row (``status`` running). Raises StoreError if the id exists."""
        values.setdefault("created_at", time.time())
        values.setdefault("status", "running")
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
            if row is None and run_id and len(run_id) >= 4:
                rows = conn.execute(
                    select(schema.runs).where(schema.runs.c.run_id.startswith(run_id)).limit(2)
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
        conn.execute(insert(schema.nodes), [node])
        if calls:
            conn.execute(
                insert(schema.calls),
                [
                    {
                        "run_id": node["run_id"],
                        "position": node["position"],
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
                    }
                    for c in calls
                ],
            )

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
        conn.execute(_upsert(conn, schema.llm_cache, ["key"], values))

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
        conn.execute(_upsert(conn, schema.tool_cache, ["key"], values))

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
            conn.execute(_insert_ignore(conn, schema.edges, ["pipeline", "src", "dst"]), rows)

    def edges_of(self, pipeline: str) -> list[tuple[str, str, str]]:
        """A pipeline's edges as (src, dst, condition)."""
        t = schema.edges
        with self.read() as conn:
            return [
                (r.src, r.dst, r.condition)
                for r in conn.execute(select(t).where(t.c.pipeline == pipeline))
            ]

    # -- Burr state rows ----------------------------------------------------------------------
    def save_state(
        self,
        conn: Connection,
        *,
        partition_key: str,
        app_id: str,
        sequence_id: int,
        position: str,
        status: str,
        fields: dict[str, str],
    ) -> None:
        """Insert a Burr state row; ``fields`` maps each top-level state key to a blob hash."""
        try:
            conn.execute(
                insert(schema.burr_state).values(
                    partition_key=partition_key,
                    app_id=app_id,
                    sequence_id=sequence_id,
                    position=position,
                    status=status,
                    fields_json=json.dumps(fields, sort_keys=True),
                    created_at=time.time(),
                )
            )
        except IntegrityError as exc:
            raise StoreError(
                f"state row {app_id}#{sequence_id} already exists",
                "an app id can be recorded once; fork it instead of re-running it",
            ) from exc

    def load_state_row(
        self, partition_key: str, app_id: str, sequence_id: int | None
    ) -> dict[str, Any] | None:
        """The state row (latest when ``sequence_id`` is None) with ``fields`` decoded, or None."""
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
            m["values"] = {k: json.loads(self.get_blob(h, conn)) for k, h in fields.items()}
            m["fields"] = fields
        return m

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
            conn.execute(
                _upsert(
                    conn,
                    schema.artifacts,
                    ["run_id", "name"],
                    {
                        "run_id": run_id,
                        "name": name,
                        "sha256": digest,
                        "size": len(data),
                        "path": rel.as_posix(),
                    },
                )
            )
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


def _insert_ignore(conn: Connection, table: Any, keys: list[str]) -> Any:
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing(index_elements=keys)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table).on_conflict_do_nothing(index_elements=keys)


def _upsert(conn: Connection, table: Any, keys: list[str], values: dict[str, Any]) -> Any:
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        stmt = pg_insert(table).values(**values)
    else:
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        stmt = sqlite_insert(table).values(**values)
    rest = {k: stmt.excluded[k] for k in values if k not in keys}
    return stmt.on_conflict_do_update(index_elements=keys, set_=rest)


def open_store(location: str | Path) -> Store:
    """Open (creating if needed) a store.

    Args:
        location: a folder (the SQLite file ``rewind.db`` is created in it), a path ending in
            ``.db``/``.sqlite``, or a SQLAlchemy URL (``postgresql+psycopg://…``; artifacts then
            go to ``./.rewind``).
    Raises:
        StoreError: the location cannot be created or holds another schema version.
    """
    loc = str(location)
    if "://" in loc:
        root = Path(".rewind").resolve()
        root.mkdir(parents=True, exist_ok=True)
        return Store(root, url_engine(loc))
    path = Path(loc).expanduser()
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        root, db = path.parent, path
    else:
        root, db = path, path / DB_FILENAME
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"cannot create store folder {root}: {exc}", "pass a writable --store"
        ) from exc
    return Store(root.resolve(), sqlite_engine(db.resolve()))
