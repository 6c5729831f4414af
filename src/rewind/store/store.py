"""The store: every query Rewind makes, behind one class.

The engine speaks SQLAlchemy Core, so SQLite (default) and PostgreSQL (by URL) share this code;
dialect details live in ``engine.py``. Blobs are content-addressed (sha256 of their bytes) and
artifacts are files under the store's folder, referenced by hash and relative path only.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import os
import re
import socket
import sqlite3
import sys
import threading
import time
import uuid
import weakref
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import psutil
from sqlalchemy import (
    Connection,
    Engine,
    Float,
    Integer,
    String,
    and_,
    bindparam,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import CompileError, IntegrityError, SQLAlchemyError

from rewind.canonical import canonical_bytes, sha256_hex
from rewind.errors import ParentMissing, RewindError, StoreError
from rewind.store import migrate, schema
from rewind.store.checkpoint import CHECKPOINTER, checkpoint_on_close
from rewind.store.codec import (
    PACK_MAX_BYTES,
    PACK_PREFIX,
    pack,
    pack_ref,
    pack_together,
    read_pack_ref,
    read_slice_ref,
    slice_key,
    slice_ref,
    unpack,
    unpack_slice,
)
from rewind.store.engine import (
    close_connections,
    sqlite_engine,
    sqlite_read_only_engine,
    url_engine,
)
from rewind.store.objects import ObjectStore, artifact_key
from rewind.store.objects import offload_min_bytes as offload_min_bytes_env
from rewind.store.records import CallRecord, EffectRecord, NodeRecord, RunGraph, RunRecord
from rewind.store.schema import digest_bytes

DB_FILENAME = "rewind.db"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")
_HOST = socket.gethostname()
_owner_of_pid: tuple[int, str] | None = None
OWNER_START_TOLERANCE_S = 1.0
"""Largest difference between a recorded and a live process start time (s) still taken as the same
process: start times are read from the kernel at 10 ms resolution, pid reuse takes far longer."""
MIN_PREFIX = 4
"""Shortest run id prefix accepted in place of a full id."""
_IN_CHUNK = 500
PRESENCE_CHECK_MIN_BLOBS = 32
"""A write batch with at least this many blobs the store instance has not written asks which are
stored already before packing and inserting them (one query per 500)."""
PRESENCE_PROBE_BLOBS = 16
"""How many of such a batch's blobs are asked about first: when at most a quarter of them are
stored (a new recording: every field, call and document is new), the rest are not asked about,
and the few stored ones are skipped by the insert itself (``ON CONFLICT DO NOTHING``)."""
PACK_ASK_FIRST_BLOBS = 8
"""At most this many packed blobs in one write: which are stored is asked before packing
(:meth:`Store._write_packs`) instead of packing under a savepoint and counting the rows."""
PUT_PROBE_MIN_BYTES = 1024
""":meth:`Store.put_blob` first asks whether a blob this large is stored (a primary-key read)
before compressing and inserting it: every fork of a run stores the same graph document
(~10 KB for 100 nodes), which the store instance may not know as written."""
PACK_GROUP_MAX_BYTES = 256 * 1024
"""Largest uncompressed size of one blob pack (bytes): a group of a write's blobs
(:attr:`WriteBatch.packs`) larger than this is cut into several packs, so reading one small
blob never decompresses more (≈ 0.5 ms)."""
GC_LOCK_KEY = 0x5245_5749_4E47  # "REWING": writers share it, ``rewind gc`` takes it alone (PG)
"""PostgreSQL advisory lock key that orders writers against ``rewind gc``'s blob sweep: every write
transaction holds it shared, the sweep exclusively (on SQLite the database write lock does the
same). See :mod:`rewind.store.retention`."""
BLOB_EPOCH_KEY = "blob_epoch"
"""``meta`` key bumped by every ``rewind gc`` that deletes blobs."""
RUNS_EPOCH_KEY = "runs_epoch"
"""``meta`` key bumped by every deletion of a run's rows (``rewind delete``, ``rewind gc``'s
archiving), in the deleting transaction; no row until the first deletion. A run's rows change
only by a deletion and a new write under the same id, so rows a process keeps for a run id
(:func:`rewind.tracing.tracer_source.source_rows`) are still the run's while it is unchanged."""
_ORPHAN_ERROR = "interrupted: its process ended before the run finished"


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
    spans: list[dict[str, Any]] = field(default_factory=list)
    """A traced chain's ``spans`` rows (:mod:`rewind.tracing.store`); empty for Burr runs."""
    packs: list[set[str]] = field(default_factory=list)
    """Groups of hashes of ``blobs``, each kept together in one pack (``blob_packs``, SQLite)
    when it is written: blobs read together (a traced chain's documents; its call payloads)."""

    def __bool__(self) -> bool:
        return bool(
            self.blobs
            or self.states
            or self.nodes
            or self.llm_cache
            or self.tool_cache
            or self.spans
        )

    def absorb(self, other: WriteBatch) -> None:
        """Append ``other``'s rows and blobs to this batch (``other`` is left as it was)."""
        for digest, data in other.blobs.items():
            self.blobs.setdefault(digest, data)
        self.llm_cache.extend(other.llm_cache)
        self.tool_cache.extend(other.tool_cache)
        self.states.extend(other.states)
        self.nodes.extend(other.nodes)
        self.calls.extend(other.calls)
        self.effects.extend(other.effects)
        self.spans.extend(other.spans)


@dataclass(frozen=True)
class CacheEntry:
    """A cache entry: the stored result blob and when it was written (unix seconds);
    ``origin`` is None for an answer recorded here, else the id of the trace whose import
    seeded it (served only through that trace's lineage)."""

    key: str
    result_hash: str
    created_at: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    origin: str | None = None

    @classmethod
    def read(
        cls,
        key: str,
        result_hash: str,
        created_at: float,
        origin: str | None = None,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> CacheEntry:
        """The entry of a cache row, equal to ``CacheEntry(key, result_hash, created_at,
        prompt_tokens, completion_tokens, origin)`` but built without the frozen dataclass's
        ``__init__`` (one ``object.__setattr__`` per field): a cached trace reads one entry per
        call of its source, 200 for a 100-step trace (~0.2 ms). Every field is set."""
        entry = object.__new__(cls)
        entry.__dict__.update(
            key=key,
            result_hash=result_hash,
            created_at=created_at,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            origin=origin,
        )
        return entry


class Store:
    """Rewind's persistent store: runs, nodes, calls, caches, blobs, Burr state, artifacts.

    Args:
        root: the store's folder (artifacts are written below it; the SQLite file lives in it).
        engine: a SQLAlchemy engine; see :func:`open_store` for the usual way to get one.
        read_only: only read: the schema is checked, never created, :meth:`write` refuses, and
            :meth:`reap_orphans` reports dead runs as ``interrupted`` without writing.
        objects: where blobs of at least ``offload_min_bytes`` (bytes, uncompressed) are
            written, and a copy of every artifact (so a server reads what a worker on another
            machine published); None keeps every blob in the database.
        offload_min_bytes: the threshold; None reads ``$REWIND_OBJECTS_MIN_BYTES`` (unset:
            :data:`rewind.store.objects.OFFLOAD_MIN_BYTES`).

    Raises:
        StoreError: the database has another schema version than this code (or, read-only,
            holds no Rewind store).
    """

    def __init__(
        self,
        root: Path,
        engine: Engine,
        *,
        read_only: bool = False,
        objects: ObjectStore | None = None,
        offload_min_bytes: int | None = None,
    ) -> None:
        self.root = root
        self.engine = engine
        self.read_only = read_only
        self._wal = engine.dialect.name == "sqlite"
        self._orphans: frozenset[str] = frozenset()
        self.objects = objects
        self.offload_min_bytes = (
            offload_min_bytes if offload_min_bytes is not None else offload_min_bytes_env()
        )
        self._known_blobs: set[str] = set()
        self._known_lock = threading.Lock()
        self._blob_epoch: str | None = None
        self._epoch_ready = False  # meta.blob_epoch exists only once the migrations ran
        # SQLite: meta.store_id of the file what this instance remembers was learned on, and
        # how many times a write found another (_same_database).
        self._store_id: str | None = None
        self._files_seen = 0
        try:
            if read_only:
                self._check_schema()
            else:
                self._init_schema()
        except SQLAlchemyError as exc:
            engine.dispose()
            raise StoreError(
                f"cannot open the store at {root}: {_first_line(exc)}",
                "pass a writable --store folder (or a reachable database URL)",
            ) from exc
        except StoreError:
            engine.dispose()
            raise
        # Statements are built once: constructing one costs more than executing it (measured
        # ~150 µs vs ~40 µs per blob insert on the record hot path).
        dialect = engine.dialect.name
        self._insert_blob = _insert_ignore_stmt(dialect, schema.blobs, ("hash",))
        self._insert_blob_data = _insert_ignore_stmt(dialect, schema.blob_data, ("hash",))
        self._insert_slice = _insert_ignore_stmt(dialect, schema.blob_slices, ("key",))
        # SQLite keeps long packed bytes out of its WITHOUT ROWID blobs table (schema.py)
        self._spill = dialect == "sqlite"
        self._upsert_llm = _upsert_stmt(dialect, schema.llm_cache, ("key",))
        self._upsert_tool = _upsert_stmt(dialect, schema.tool_cache, ("key",))
        self._insert_state = insert(schema.burr_state)
        self._insert_node = insert(schema.nodes)
        self._insert_call = insert(schema.calls)
        self._bulk_sql = _sqlite_bulk_sql() if dialect == "sqlite" else None
        # (partition key, app id) -> (sequence id, fields, delta depth) of the last state row
        # this instance committed: the base of the next row's delta (see state_deltas).
        self._state_tails: dict[tuple[str, str], tuple[int, dict[str, str], int]] = {}
        # (store id the edges were written on, pipeline, edges) committed by this instance
        self._edges_written: set[tuple[str | None, str, tuple[tuple[str, ...], ...]]] = set()
        self._epoch_ready = not read_only
        _OPEN_STORES.add(self)

    # -- transactions -------------------------------------------------------------------------
    @contextmanager
    def write(self, *, blobs: bool = True) -> Iterator[Connection]:
        """A write transaction (``BEGIN IMMEDIATE`` on SQLite); commits on success.

        Args:
            blobs: False when the transaction writes no blob and no row :meth:`write_batch`
                checks the blobs of (state, node, call, cache or effect rows): on SQLite it then
                does not read ``meta.blob_epoch`` (:meth:`_enter_write`; ``BEGIN IMMEDIATE``
                orders it against gc, and the next write that relies on the blobs this process
                knows reads it).
        Raises:
            StoreError: the store was opened read-only.
        """
        if self.read_only:
            raise StoreError(
                f"the store at {self.root} is open read-only",
                "run a command that records (or open the store without read_only)",
            )
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            if blobs or self._bulk_sql is None:
                self._enter_write(conn)
            yield conn
        if self._wal:  # SQLite: its WAL is checkpointed off this thread (store.checkpoint)
            CHECKPOINTER.wrote(self.engine)

    def _enter_write(self, conn: Connection) -> None:
        """Order this write transaction against ``rewind gc`` and notice when a gc deleted blobs.

        On PostgreSQL the transaction holds :data:`GC_LOCK_KEY` shared until it ends (gc's sweep
        holds it exclusively); on SQLite ``BEGIN IMMEDIATE`` already serialises every writer.
        When ``meta.blob_epoch`` changed since this store last looked, the blobs this process
        remembers as stored (:meth:`knows_blob`) may be gone: the memory is dropped, so the
        transaction writes every blob it references instead of trusting it.
        """
        if not self._epoch_ready:
            return
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": GC_LOCK_KEY})
        if self._bulk_sql is not None:  # SQLite: the driver's statement cache (every write)
            epoch, store_id = conn.exec_driver_sql(
                _EPOCH_AND_STORE_ID_SQL, (BLOB_EPOCH_KEY, STORE_ID_KEY)
            ).one()
            self._same_database(conn, store_id)
        else:
            epoch = conn.execute(_BLOB_EPOCH).scalar()
        if epoch != self._blob_epoch:
            with self._known_lock:
                self._known_blobs.clear()
                self._blob_epoch = epoch

    def _same_database(self, conn: Connection, store_id: str | None) -> None:
        """Forget what this instance remembers of the database (blobs stored, state rows'
        tails, edges written) when a write finds another SQLite file than the one it learned
        them on: ``meta.store_id`` (``store_id``, read with the epoch; written by the first
        write that finds none) is not the one seen before. The file was deleted and created
        again while this store stayed open (another store opened on the path meanwhile makes
        the shared engine's new connections open the new file): trusting the memory there
        wrote rows naming blobs the new file lacks (a damaged store). A file's inode cannot
        tell them apart (the new file often reuses it), and holding the old file open is
        unsafe (closing that descriptor drops SQLite's POSIX locks)."""
        if store_id is None:
            store_id = uuid.uuid4().hex
            conn.exec_driver_sql(_INSERT_STORE_ID_SQL, (STORE_ID_KEY, store_id))
        if store_id != self._store_id:
            with self._known_lock:
                if self._store_id is not None:
                    self._known_blobs.clear()
                    self._state_tails.clear()
                    self._edges_written.clear()
                    self._files_seen += 1
                self._store_id = store_id

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read-only transaction."""
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def _check_schema(self) -> None:
        with self.read() as conn:
            try:
                version = _schema_version(conn)
            except SQLAlchemyError as exc:
                raise StoreError(
                    f"{self.root} holds no Rewind store ({_first_line(exc)})",
                    "pass --store with a store Rewind recorded into",
                ) from exc
            revision = migrate.current_revision(conn)
        self._check_version(version)
        if revision is not None and not migrate.is_known(revision):
            raise StoreError(
                f"store {self.root} is at schema revision {revision}, unknown to this Rewind "
                f"(newest known: {migrate.HEAD})",
                "upgrade Rewind to the version that wrote this store, or use a new --store",
            )
        if revision != migrate.HEAD:
            # Read-only: nothing can be migrated, and older revisions lack columns this code reads.
            raise StoreError(
                f"store {self.root} is at schema revision {revision or 'pre-migrations'}, this "
                f"Rewind reads revision {migrate.HEAD}",
                "open it once with a command that writes (e.g. rewind run) to upgrade it in place",
            )

    def _check_version(self, version: str | None) -> None:
        try:
            same = version is None or int(version) == schema.SCHEMA_VERSION
        except (TypeError, ValueError):  # a corrupted or foreign meta table: "abc", ""
            same = False
        if not same:
            raise StoreError(
                f"store {self.root} has schema version {version}, this Rewind expects "
                f"{schema.SCHEMA_VERSION}",
                "use a new store folder (--store) or the Rewind version that wrote it",
            )

    def _init_schema(self) -> None:
        """Check the schema, and migrate it (in a write transaction) only when it is not at
        :data:`rewind.store.migrate.HEAD`: opening a current store reads two rows and takes no
        write lock (a traced chain opens its store once per trace)."""
        try:
            if self.engine.dialect.driver == "pysqlite":  # the sqlite3 module
                revision, version = _sqlite_revision_and_version(self.engine)
            else:
                with self.read() as conn:
                    revision, version = _revision_and_version(conn)
            current = revision == migrate.HEAD
        except (SQLAlchemyError, sqlite3.Error):
            current = False  # a new database, or one being created: the write path decides
        if current and version is not None:
            self._check_version(version)
            return
        with self.write() as conn:
            migrate.upgrade(conn, where=str(self.root))
            version = _schema_version(conn)
            if version is None:
                raise StoreError(
                    f"store {self.root} has no schema version after its migrations",
                    "use a new store folder (--store)",
                )
            self._check_version(version)

    def close(self) -> None:
        """Release the engine's connections (and stop the progress thread's reads of this
        store, :mod:`rewind.progress`)."""
        progress = sys.modules.get("rewind.progress")
        if progress is not None:
            progress.store_closing(self)
        checkpoint_on_close(self.engine)
        close_connections(self.engine)

    # -- blobs --------------------------------------------------------------------------------
    def put_blob(self, conn: Connection, data: bytes) -> str:
        """Store bytes content-addressed inside ``conn``'s transaction; returns their sha256 hex."""
        digest = sha256_hex(data)
        if digest in self._known_blobs:
            return digest
        if len(data) >= PUT_PROBE_MIN_BYTES and self._present_in(conn, digest):
            return digest  # stored already: not compressed and sent again (a fork's graph)
        self._insert_blobs(conn, [self._blob_row(digest, data)])
        return digest

    def _present_in(self, conn: Connection, digest: str) -> bool:
        """Whether ``conn`` sees a blob row with this hash (a gc deletes blobs only under the
        write lock, so one seen inside a write transaction stays until it commits)."""
        return bool(self._stored_of(conn, [digest]))

    def _insert_blobs(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Insert (or ignore, when present) blob rows made by :meth:`_blob_row`: the packed
        bytes of spilled ones (codec ``x-...``) into ``blob_data``, the rest into ``blobs``."""
        spilled = [r for r in rows if r["codec"].startswith(schema.SPILL_PREFIX)]
        if spilled:
            data_rows = [{"hash": r["hash"], "data": r["data"]} for r in spilled]
            self._bulk(conn, self._insert_blob_data, data_rows)
            rows = [
                dict(r, data=b"") if r["codec"].startswith(schema.SPILL_PREFIX) else r for r in rows
            ]
        self._bulk(conn, self._insert_blob, rows)

    def _blob_row(self, digest: str, data: bytes) -> dict[str, Any]:
        """The blobs row for these bytes; large ones are written to the object store first, so
        a committed row never refers to an object that is not there."""
        if self.objects is not None and len(data) >= self.offload_min_bytes:
            ref = self.objects.put_blob(digest, data)
            return {"hash": digest, "size": len(data), "codec": "object", "data": b"", "ref": ref}
        codec, packed = pack(data)
        if self._spill and len(packed) >= schema.SPILL_MIN_BYTES:
            codec = schema.SPILL_PREFIX + codec  # _insert_blobs puts the bytes in blob_data
        return {"hash": digest, "size": len(data), "codec": codec, "data": packed, "ref": None}

    def put_json(self, conn: Connection, value: Any) -> str:
        """Store a JSON-like value as canonical bytes; returns its content hash."""
        return self.put_blob(conn, canonical_bytes(value))

    @property
    def blob_epoch(self) -> str | None:
        """The ``meta.blob_epoch`` this instance saw last (``rewind gc`` bumps it when it
        deletes blobs): what it remembers of stored blobs is valid while it stays the same."""
        return self._blob_epoch

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
        t, d = schema.blobs, schema.blob_data
        if self._spill:
            query = select(t.c.hash, t.c.codec, t.c.data, t.c.ref, d.c.data.label("spilled"))
            query = query.select_from(t.outerjoin(d, d.c.hash == t.c.hash))
        else:  # nothing is spilled on other backends
            query = select(t.c.hash, t.c.codec, t.c.data, t.c.ref)
        out: dict[str, bytes] = {}
        in_packs: dict[str, tuple[str, int, int, int]] = {}
        for i in range(0, len(wanted), _IN_CHUNK):
            chunk = wanted[i : i + _IN_CHUNK]
            for row in self._read_blob_rows(conn, query, chunk):
                if row.codec.startswith(PACK_PREFIX):
                    in_packs[row.hash] = _pack_ref_of(row.hash, row.codec, row.data)
                elif row.codec == "object":
                    out[row.hash] = self._object_store_for(row.ref).get_blob(row.ref, row.hash)
                elif row.codec.startswith(schema.SPILL_PREFIX):
                    if not self._spill or row.spilled is None:
                        continue  # reported as missing below
                    codec = row.codec[len(schema.SPILL_PREFIX) :]
                    out[row.hash] = _unpacked(row.hash, codec, row.spilled)
                else:
                    out[row.hash] = _unpacked(row.hash, row.codec, row.data)
        if in_packs:
            out.update(_from_packs(conn, in_packs))
        if self._spill and len(out) < len(wanted):
            # SQLite: most packed blobs are found by the first bytes of their hash (0016)
            rest = [d for d in wanted if d not in out and d not in in_packs]
            out.update(_from_packs(conn, _slice_refs(conn, rest), keyed=True))
        missing = [d for d in wanted if d not in out]
        if missing:
            raise StoreError(
                f"blob {missing[0][:12]} is missing from the store", "the store is damaged"
            )
        return out

    def pack_refs(
        self, digests: Iterable[str], conn: Connection | None = None
    ) -> dict[str, tuple[str, int, int, int]]:
        """Where the packed ones of these blobs are (for checks and tests): sha256 hex →
        (``p-`` codec, pack id, offset, length in the pack's uncompressed bytes), whether a
        ``blobs`` row or a ``blob_slices`` row (migration 0016; only when its bytes match the
        hash) names the slice. Blobs not stored, or not in a pack, are left out.

        Raises:
            StoreError: a damaged pack reference.
        """
        wanted = list(dict.fromkeys(digests))
        if conn is None:
            with self.read() as c:
                return self.pack_refs(wanted, c)
        t = schema.blobs
        out: dict[str, tuple[str, int, int, int]] = {}
        whole: set[str] = set()
        for i in range(0, len(wanted), _IN_CHUNK):
            query = select(t.c.hash, t.c.codec, t.c.data)
            for row in conn.execute(query.where(t.c.hash.in_(wanted[i : i + _IN_CHUNK]))):
                whole.add(row.hash)
                if row.codec.startswith(PACK_PREFIX):
                    out[row.hash] = _pack_ref_of(row.hash, row.codec, row.data)
        if self._spill:
            keyed = _slice_refs(conn, [d for d in wanted if d not in whole])
            found = _from_packs(conn, keyed, keyed=True, strict=False)
            out.update((d, ref) for d, ref in keyed.items() if d in found)
        return out

    def blob_digests(self, conn: Connection | None = None) -> set[str]:
        """The sha256 hex of every stored blob (for checks and tests): the ``blobs`` rows' and
        those of the ``blob_slices`` rows (migration 0016), hashed from their packs' bytes (every
        pack is read). A slice that cannot be read is left out.

        Raises:
            StoreError: a damaged slice reference.
        """
        if conn is None:
            with self.read() as c:
                return self.blob_digests(c)
        out = {r[0] for r in conn.execute(select(schema.blobs.c.hash))}
        if not self._spill:
            return out
        refs: dict[str, tuple[str, int, int, int]] = {}
        for key, ref in conn.execute(select(schema.blob_slices.c.key, schema.blob_slices.c.ref)):
            refs[bytes(key)] = slice_row_ref(key, ref)[:4]
        out.update(sha256_hex(data) for data in _slices(conn, refs, strict=False).values())
        return out

    def _read_blob_rows(self, conn: Connection, query: Any, chunk: list[str]) -> Iterable[Any]:
        """The blob rows of ``chunk``'s hashes (``hash`` as hex, ``codec``, ``data``, ``ref``,
        and ``spilled`` on SQLite). On SQLite through the driver's statement cache: compiling
        the expanding ``IN`` of ``query`` for each read cost more than the read (a fork reads
        the results of its parent's calls: 100 blobs 1.2 -> 0.4 ms)."""
        if not self._spill:  # not SQLite
            return conn.execute(query.where(schema.blobs.c.hash.in_(chunk)))
        marks = ",".join("?" * len(chunk))
        found = conn.exec_driver_sql(
            "SELECT blobs.hash, blobs.codec, blobs.data, blobs.ref, blob_data.data FROM blobs "
            "LEFT OUTER JOIN blob_data ON blob_data.hash = blobs.hash "
            f"WHERE blobs.hash IN ({marks})",
            tuple(schema.digest_bytes(h) for h in chunk),
        )
        return [_BlobRow(_hex_digest(r[0]), *r[1:]) for r in found]

    def _object_store_for(self, ref: str) -> ObjectStore:
        if self.objects is not None and ref.startswith(self.objects.url + "/"):
            return self.objects
        # Written under another object store URL (moved configuration): read it where it is.
        return ObjectStore(ref.rsplit("/blobs/", 1)[0])

    def get_json(self, digest: str, conn: Connection | None = None) -> Any:
        """A JSON value stored with :meth:`put_json`."""
        return json.loads(self.get_blob(digest, conn))

    def write_batch(
        self,
        batch: WriteBatch,
        *,
        before: Callable[[Connection], None] | None = None,
        after: Callable[[Connection], None] | None = None,
    ) -> None:
        """Write a batch in one ``BEGIN IMMEDIATE`` transaction (all or nothing).

        The one write path of node, call, cache and effect rows, for Burr runs (the recorder's
        flushes) and traced chains alike. Blob hashes are remembered as present only after the
        commit, so a rolled-back batch never makes a later write skip a blob that is not there.

        Args:
            batch: the rows.
            before: writes that must precede the rows in the same transaction (a traced chain's
                run row, which its node and span rows refer to).
            after: writes that follow the rows in the same transaction (a run finished with
                its last rows).
        Raises:
            StoreError: a state row of the app id already exists (nothing is written).
        """
        if not batch and before is None and after is None:
            return
        epoch = (self._blob_epoch, self._files_seen)
        new = self._unstored_blobs(batch)
        # Rows are built (and large blobs uploaded) before the write lock is taken.
        rows, packs = self._blob_rows(new, batch.packs)
        # A batch of spans alone (an unchanged trace replay's root span) neither writes blobs
        # nor has rows _check_referenced looks at: the epoch would change nothing it does.
        with self.write(blobs=_has_blob_rows(batch)) as conn:
            if before is not None:
                # First: a run row naming a parent the same gc archived fails as ParentMissing
                # (a trace replay is then stored unlinked), not as a blob its source held.
                before(conn)
            if (self._blob_epoch, self._files_seen) != epoch:
                # A gc deleted blobs since the rows were built (or the store's file is another
                # one, _same_database): write every blob of the batch
                # (insert-or-ignore; objects uploaded again under the lock) and make sure the
                # blobs the batch only refers to are still there.
                new = dict(batch.blobs)
                rows, packs = self._blob_rows(new, batch.packs)
                self._check_referenced(conn, batch)
            else:
                self._check_objects(rows, new)
            if packs:
                self._write_packs(conn, packs)
            # In key order: each index then fills its pages in sequence instead of splitting
            # them at random places (random hashes leave B-tree pages ~2/3 full).
            self._insert_blobs(conn, sorted(rows, key=_by_hash))
            self._bulk(conn, self._upsert_llm, sorted(batch.llm_cache, key=_by_key))
            self._bulk(conn, self._upsert_tool, sorted(batch.tool_cache, key=_by_key))
            tails = self._insert_states(conn, batch.states)
            self._bulk(conn, self._insert_node, self._lean_nodes(batch.nodes))
            self._bulk(conn, self._insert_call, batch.calls)
            self._bulk(conn, _INSERT_EFFECT, batch.effects)
            self._bulk(conn, _INSERT_SPAN, batch.spans)
            if after is not None:
                after(conn)
        with self._known_lock:
            if len(self._known_blobs) > 500_000:
                self._known_blobs.clear()
            self._known_blobs.update(new)
            if len(self._state_tails) > 10_000:
                self._state_tails.clear()
            self._state_tails.update(tails)

    def _blob_rows(
        self, new: dict[str, bytes], groups: list[set[str]]
    ) -> tuple[list[dict[str, Any]], list[_Pack]]:
        """The blob rows for ``new`` (sha256 → bytes) and, on SQLite, packs per group of
        ``groups`` (of its blobs in ``new``, when two or more are at most PACK_MAX_BYTES and not
        offloaded; cut at PACK_GROUP_MAX_BYTES), whose rows :meth:`_insert_pack` makes once
        the pack has its id."""
        packs: list[_Pack] = []
        packed: set[str] = set()
        for group in groups if self._spill else ():
            together = [
                h
                for h in new
                if h in group
                and h not in packed
                and len(new[h]) <= PACK_MAX_BYTES
                and (self.objects is None or len(new[h]) < self.offload_min_bytes)
            ]
            for chunk in _pack_chunks(together, new):
                packed.update(chunk)
                packs.append(_packed({h: new[h] for h in chunk}))
        rows = [self._blob_row(h, data) for h, data in new.items() if h not in packed]
        return rows, packs

    def _write_packs(self, conn: Connection, packs: list[_Pack]) -> None:
        """Insert packs and their blobs' rows inside ``conn``'s write transaction (SQLite).

        A blob another write stored meanwhile (or that this process did not know it had) must
        not be packed: its row would be ignored and its slice named by nobody. Rather than ask
        which blobs are stored before every pack (one query per flush, ~5% of a recording's
        time), the packs and their rows go in under a savepoint and the rows inserted are
        counted: all of them (a new recording) is the usual case. Otherwise the savepoint is
        rolled back and the packs are made again without the stored blobs (one query).

        Since migration 0016 most rows are ``blob_slices`` rows, keyed by the first bytes of a
        hash: an ignored one is a blob stored already *or* another blob holding the key (the
        query then tells which; the second kind keeps a ``blobs`` row). A blob stored as a
        ``blobs`` row of its own (not packed: a Burr run's initial fields) is not noticed by
        the count and gets a slice as well: a few bytes twice, read from its row (measured on
        peerbench's 100-step trace: none).

        A write of at most :data:`PACK_ASK_FIRST_BLOBS` packed blobs (a traced chain's exit
        write: its input map and output, usually stored already by the trace it replays) asks
        first instead: one query, where the savepoint, pack, rows, rollback, query and release
        were six statements whenever a blob was stored, and one fewer when none was.
        """
        digests = [b[0] for pack in packs for b in pack.blobs]
        if len(digests) <= PACK_ASK_FIRST_BLOBS:
            self._insert_packs(conn, packs, self._stored_of(conn, digests), digests)
            return
        conn.exec_driver_sql(f"SAVEPOINT {_PACKS_SAVEPOINT}")
        # No blob asked about: every row is a pack's (codec p-..., never spilled)
        slices, rows = self._pack_rows(conn, packs, set(), set())
        written = self._bulk(conn, self._insert_slice, sorted(slices, key=_by_key))
        written += self._bulk(conn, self._insert_blob, sorted(rows, key=_by_hash))
        if written != len(slices) + len(rows):
            conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {_PACKS_SAVEPOINT}")
            self._insert_packs(conn, packs, self._stored_of(conn, digests), digests)
        conn.exec_driver_sql(f"RELEASE SAVEPOINT {_PACKS_SAVEPOINT}")

    def _insert_packs(
        self, conn: Connection, packs: list[_Pack], present: set[str], digests: list[str]
    ) -> None:
        """Insert packs without the blobs in ``present`` (stored already), a blob whose
        ``blob_slices`` key another blob holds as a ``blobs`` row of its own."""
        keys = sorted({slice_key(d) for d in digests})
        t = schema.blob_slices
        taken: set[bytes] = set()
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = keys[i : i + _IN_CHUNK]
            taken.update(
                bytes(k) for (k,) in conn.execute(select(t.c.key).where(t.c.key.in_(chunk)))
            )
        slices, rows = self._pack_rows(conn, packs, present, taken)
        self._bulk(conn, self._insert_slice, sorted(slices, key=_by_key))
        self._insert_blobs(conn, sorted(rows, key=_by_hash))

    def _pack_rows(
        self, conn: Connection, packs: list[_Pack], present: set[str], taken: set[bytes]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Insert the packs (without the blobs in ``present``); their ``blob_slices`` rows and
        the ``blobs`` rows of the blobs whose key is in ``taken`` (held by another blob) or
        comes twice in these packs (the first keeps it). ``taken`` gains the keys used."""
        slices: list[dict[str, Any]] = []
        rows: list[dict[str, Any]] = []
        for one in packs:
            for row in self._insert_pack(conn, one, present):
                key = slice_key(row["hash"])
                if not row["codec"].startswith(PACK_PREFIX) or key in taken:
                    rows.append(row)
                    continue
                taken.add(key)
                pack_id, offset, length = read_pack_ref(row["data"])
                ref = slice_ref(row["codec"], pack_id, offset, length, row["size"])
                slices.append({"key": key, "ref": ref})
        return slices, rows

    def _insert_pack(
        self, conn: Connection, pack: _Pack, present: set[str]
    ) -> list[dict[str, Any]]:
        """Insert a pack (inside ``conn``'s transaction) without its blobs in ``present`` (stored
        already); the blob rows of the blobs it holds."""
        if not present.isdisjoint(pack.items):
            rest = {h: data for h, data in pack.items.items() if h not in present}
            if len(rest) < 2:
                return [self._blob_row(h, data) for h, data in rest.items()]
            pack = _packed(rest)
        if self._bulk_sql is not None:
            # SQLite: the driver's statement cache, not an insert compiled per pack (~0.1 ms)
            pack_id = conn.exec_driver_sql(_INSERT_PACK_SQL, (pack.data,)).lastrowid
        else:
            pack_id = conn.execute(
                insert(schema.blob_packs).values(data=pack.data)
            ).inserted_primary_key[0]
        return [
            {
                "hash": digest,
                "size": size,
                "codec": codec,
                "data": pack_ref(pack_id, offset, length),
                "ref": None,
            }
            for digest, size, (codec, offset, length) in pack.blobs
        ]

    def _unstored_blobs(self, batch: WriteBatch) -> dict[str, bytes]:
        """The batch's blobs this process does not know as stored; when there are many, the
        ones the store holds already are left out too (asked with a probe, then all)."""
        new = {h: d for h, d in batch.blobs.items() if h not in self._known_blobs}
        if len(new) >= PRESENCE_CHECK_MIN_BLOBS:
            # Many blobs this process has not written: most may be stored already (a replay of
            # a recorded trace through a new Store). Ask once instead of packing and inserting
            # each; a gc that deletes blobs before the commit bumps the epoch, and then every
            # blob of the batch is written (write_batch).
            present = self._present_blobs(_probe(new))
            if len(present) * 4 > PRESENCE_PROBE_BLOBS:
                present |= self._present_blobs(new.keys() - present)
            new = {h: d for h, d in new.items() if h not in present}
        return new

    def _insert_states(
        self, conn: Connection, rows: list[dict[str, Any]]
    ) -> dict[tuple[str, str], tuple[int, dict[str, str], int]]:
        """Insert state rows as deltas of the app's previous rows (:func:`state_deltas`);
        returns the new tails to remember once the transaction commits.

        Raises:
            StoreError: a state row of the app id already exists.
        """
        try:
            apps = {(r["partition_key"], r["app_id"]) for r in rows}
            with self._known_lock:
                known_tails = {a: self._state_tails[a] for a in apps if a in self._state_tails}
            states, tails = state_deltas(rows, known_tails)
            self._bulk(conn, self._insert_state, states)
        except IntegrityError as exc:
            raise StoreError(
                "a state row of this app id already exists",
                "an app id can be recorded once; fork it instead of re-running it",
            ) from exc
        return tails

    def _lean_nodes(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``nodes`` rows as this store keeps them: on SQLite a row's ``src_app_id`` is stored
        as ``""`` when it is the row's own run (:func:`~rewind.store.schema.lean_node_row`);
        the rows themselves are not changed."""
        if self._bulk_sql is None:
            return rows
        return [schema.lean_node_row(r) for r in rows]

    def _bulk(self, conn: Connection, stmt: Any, rows: list[dict[str, Any]]) -> int:
        """Execute ``stmt`` (an insert or upsert of one table) for many rows in ``conn``;
        returns the driver's count of rows changed (an ignored insert changes none).

        On SQLite the rows go to the driver's ``executemany`` as tuples through prepared SQL
        (:func:`_sqlite_bulk_sql`), skipping SQLAlchemy's per-row parameter processing
        (measured on peerbench's 100-step trace, ~2,000 rows: 36 ms of CPU for the whole
        write batch through SQLAlchemy, 27 ms this way). Other dialects execute ``stmt``.
        """
        if not rows:
            return 0
        bulk = self._bulk_sql.get(stmt.table.name) if self._bulk_sql is not None else None
        if bulk is None:
            return conn.execute(stmt, rows).rowcount
        return conn.exec_driver_sql(bulk.sql, [bulk.params(row) for row in rows]).rowcount

    def _present_blobs(self, digests: Collection[str]) -> set[str]:
        """Which of ``digests`` have a blob row (one read, one query per 500 hashes)."""
        with self.read() as conn:
            return self._stored_of(conn, list(digests))

    def _stored_of(
        self, conn: Connection, digests: Sequence[str], *, strict: bool = False
    ) -> set[str]:
        """Which of ``digests`` have a blob row, as ``conn`` sees them (one query per 500).

        A ``blob_slices`` row under a digest's key names it only when the slice's bytes match
        the whole hash. One that does not is absent when the slice holds another blob of the
        same key; otherwise (a damaged pack or slice row) it is absent too (a writer then
        stores the blob again), or, when ``strict`` (gc and archives, which must not go on
        without a blob the store holds damaged), a StoreError.

        Raises:
            StoreError: a damaged slice reference; (``strict``) a damaged pack or slice.
        """
        t = schema.blobs
        present: set[str] = set()
        for i in range(0, len(digests), _IN_CHUNK):
            chunk = digests[i : i + _IN_CHUNK]
            if self._bulk_sql is None:
                found = conn.execute(select(t.c.hash).where(t.c.hash.in_(chunk)))
                present.update(r[0] for r in found)
                continue
            # SQLite: the driver's statement cache instead of compiling an expanding IN
            # for every probe (0.36 -> 0.06 ms for 16 hashes); hashes bound as stored
            marks = ",".join("?" * len(chunk))
            found = conn.exec_driver_sql(
                f"SELECT blobs.hash FROM blobs WHERE blobs.hash IN ({marks})",
                tuple(schema.digest_bytes(h) for h in chunk),
            )
            present.update(_hex_digest(h) for (h,) in found)
        if self._bulk_sql is not None and len(present) < len(digests):
            # a blob_slices row names a blob only if its bytes match the whole hash (0016)
            rest = [d for d in digests if d not in present]
            refs = _slice_refs(conn, rest)
            found = _from_packs(conn, refs, keyed=True, strict=strict, shared_absent=True)
            present.update(found)
        return present

    def _check_objects(self, rows: list[dict[str, Any]], data: dict[str, bytes]) -> None:
        """Upload again the offloaded blobs of ``rows`` whose object is gone (called under the
        write lock: a gc's sweep deletes objects only under the same lock, and only objects no
        blob row names, so an object seen here stays until this transaction's rows commit).

        Args:
            rows: blob rows about to be inserted.
            data: their bytes, by sha256.
        """
        if self.objects is None:
            return
        for row in rows:
            if row["codec"] == "object" and not self.objects.has_blob(row["hash"]):
                self.objects.put_blob(row["hash"], data[row["hash"]])

    def _check_referenced(self, conn: Connection, batch: WriteBatch) -> None:
        """Refuse a batch that refers to a blob a concurrent gc deleted (only checked after a gc
        ran): state fields, node input/output documents and the results of cache hits, when the
        batch does not carry their bytes. The write fails loudly instead of leaving a row that
        names a missing blob.

        Raises:
            StoreError: such a blob is missing.
        """
        wanted: set[str] = set()
        for state in batch.states:
            wanted.update(json.loads(state["fields_json"]).values())
        for node in batch.nodes:
            wanted.update(h for h in (node.get("input_hash"), node.get("output_hash")) if h)
        for call in batch.calls:
            # a hit's answer, or the recorded failure a replay raised again (failed:replayed)
            if call.get("outcome") in ("hit", "failed") and call.get("result_hash"):
                wanted.add(call["result_hash"])
        wanted -= batch.blobs.keys()
        missing = wanted - self._stored_of(conn, sorted(wanted))
        if missing:
            raise StoreError(
                f"blob {min(missing)[:12]} this write refers to was deleted by a concurrent "
                "rewind gc",
                "run the command again",
            )

    # -- runs ---------------------------------------------------------------------------------
    def create_run(self, conn: Connection, **values: Any) -> dict[str, Any]:
        """Insert a run row (``status`` running). Raises StoreError if the id exists.

        The run of a Burr sub-application (``spawning_run_id`` set) belongs to the user the
        spawning run belongs to, unless ``created_by`` is given. Returns the values inserted
        (column -> value; JSON columns as their text), for :meth:`run_as_inserted`."""
        if values.get("spawning_run_id") and "created_by" not in values:
            runs = schema.runs
            values["created_by"] = conn.execute(
                select(runs.c.created_by).where(runs.c.run_id == values["spawning_run_id"])
            ).scalar()
        values.setdefault("created_at", time.time())
        values.setdefault("status", "running")
        values.setdefault("owner", current_owner())
        for key in ("override", "config", "launch"):
            if key in values:
                v = values.pop(key)
                values[f"{key}_json"] = None if v is None else json.dumps(v, sort_keys=True)
        unknown = values.keys() - _RUN_COLUMNS
        if unknown:  # the prebuilt statement would drop them silently; .values() refused them
            raise CompileError(f"Unconsumed column names: {', '.join(sorted(unknown))}")
        try:
            # One statement for every run (its compiled form cached per set of columns), not
            # insert().values(...) built per run.
            if conn.dialect.name == "sqlite":  # a refused statement leaves the transaction usable
                self._insert_run_sqlite(conn, values)
            else:  # PostgreSQL aborts the transaction: a savepoint keeps it readable for the why
                with conn.begin_nested():
                    conn.execute(_INSERT_RUN, values)
        except IntegrityError as exc:
            raise _run_row_refused(conn, values) from exc
        return values

    def run_as_inserted(self, values: dict[str, Any]) -> RunRecord | None:
        """The record of the run row :meth:`create_run` inserted with ``values`` (what it
        returned), as reading it back in the same transaction gives it, or None (read it back).

        Only on SQLite, and only when every value is stored as it is given: a str in a text
        column, an int (not a bool) in an integer one, a float SQLite keeps in a real one (not
        NaN, stored as NULL, nor -0.0, stored as 0.0), or None; a column the row omits takes
        its scalar default (no trigger or server default changes a run row). Saves the read
        of a traced chain's exit (~0.1 ms: a statement prepared on the new connection).
        """
        bulk = self._bulk_sql.get("runs") if self._bulk_sql is not None else None
        if bulk is None or bulk.binds:
            return None
        row = {}
        for name, default, _bind in bulk.columns:
            value = values.get(name, default)
            if value is not None and not _RUN_KINDS[name](value):
                return None
            row[name] = value
        return self._run_record(SimpleNamespace(_mapping=row))

    def _insert_run_sqlite(self, conn: Connection, values: dict[str, Any]) -> None:
        """Insert a run row on SQLite: through the prepared statement of :func:`_sqlite_bulk_sql`
        (the same columns, defaults and stored values as ``_INSERT_RUN``, without SQLAlchemy's
        per-statement work: ~0.1 ms of a traced chain's exit)."""
        bulk = self._bulk_sql.get("runs") if self._bulk_sql is not None else None
        if bulk is None:
            conn.execute(_INSERT_RUN, values)
        else:
            conn.exec_driver_sql(bulk.sql, bulk.params(values))

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
            self.finish_run_in(conn, run_id, status, error)
        progress = sys.modules.get("rewind.progress")
        if progress is not None:  # a finished run's cancel flag is no longer watched
            progress.run_ended(run_id)

    def finish_run_in(
        self, conn: Connection, run_id: str, status: str, error: str | None = None
    ) -> None:
        """:meth:`finish_run` inside ``conn``'s write transaction (with the run's last rows).

        The caller calls :func:`rewind.progress.run_ended` once the transaction committed,
        never inside it: that waits for the progress thread, which may be waiting for a pooled
        connection that writers queued on this transaction's lock hold (a deadlock until the
        busy timeout).
        """
        totals = conn.execute(_RUN_TOTALS, {"r": run_id, "f": False}).one()
        conn.execute(
            _FINISH_RUN,
            {
                "id": run_id,
                "new_status": status,
                "new_finished_at": time.time(),
                "new_prompt_tokens": int(totals[0]),
                "new_completion_tokens": int(totals[1]),
                "new_latency_ms": float(totals[2]),
                "new_error": error,
            },
        )

    def reap_orphans(self, run_ids: Iterable[str] | None = None) -> list[str]:
        """Mark ``running`` runs whose executing process (on this host) is gone as ``interrupted``.

        A run whose process was killed can never finish; without this it would stay ``running``
        forever and could never be forked. A process counts as gone when its pid no longer
        exists, is a zombie (a killed worker its parent has not waited for yet: it still
        answers ``kill(pid, 0)``), or now belongs to a process started at another time (the pid
        was reused). Runs owned by another host are left alone: their process cannot be seen.

        Args:
            run_ids: only look at these runs (None: every running run).
        Returns:
            the ids marked. A read-only store writes nothing: it remembers them and reports
            them as ``interrupted`` when it reads runs.
        """
        t = schema.runs
        query = select(t.c.run_id, t.c.owner).where(t.c.status == "running")
        if run_ids is not None:
            query = query.where(t.c.run_id.in_(list(run_ids)))
        with self.read() as conn:
            rows = conn.execute(query).all()
        dead = [r.run_id for r in rows if r.owner and owner_is_gone(r.owner)]
        if dead and self.read_only:
            self._orphans = frozenset(dead)
        elif dead:
            with self.write() as conn:
                conn.execute(
                    update(t)
                    .where(and_(t.c.run_id.in_(dead), t.c.status == "running"))
                    .values(
                        status="interrupted",
                        finished_at=time.time(),
                        error=_ORPHAN_ERROR,
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

    def get_run(self, run_id: str, *, audit: bool = True) -> RunRecord:
        """The run with this id, or a prefix of it that names exactly one run.

        ``audit=False`` leaves :attr:`RunRecord.last_audit` None without reading the audits
        (a run a caller has just finished, or one it forks: one query less).

        Raises:
            UnknownRun: no run (or more than one) matches.
        """
        from rewind.errors import UnknownRun

        with self.read() as conn:
            row = conn.execute(_RUN_BY_ID, {"run_id": run_id}).first()
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
            run = self._run_record(row)
            return self._with_audits([run], conn)[0] if audit else run

    def list_runs(
        self,
        limit: int = 100,
        *,
        include_sub_runs: bool = False,
        created_by: Collection[str] | None = None,
        pipeline: str | None = None,
        statuses: Collection[str] | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        search: str | None = None,
    ) -> list[RunRecord]:
        """Most recent runs first; the runs of Burr sub-applications only with
        ``include_sub_runs`` (they are listed under the node that spawned them); with
        ``created_by``, only runs created by those users.

        Filters (all optional, combined with AND): ``pipeline`` (exact name), ``statuses``,
        ``created_after`` / ``created_before`` (unix seconds, inclusive / exclusive), ``search``
        (case-insensitive: a run id prefix, or a substring of the pipeline, the fork node, the
        override or the error)."""
        t = schema.runs
        query = select(t)
        if not include_sub_runs:
            query = query.where(t.c.spawning_run_id.is_(None))
        if created_by is not None:
            query = query.where(t.c.created_by.in_(list(created_by)))
        if pipeline:
            query = query.where(t.c.pipeline == pipeline)
        if statuses:
            query = query.where(t.c.status.in_(list(statuses)))
        if created_after is not None:
            query = query.where(t.c.created_at >= created_after)
        if created_before is not None:
            query = query.where(t.c.created_at < created_before)
        if search:
            q = search.lower()
            query = query.where(
                or_(
                    func.lower(t.c.run_id).startswith(q, autoescape=True),
                    *(
                        func.lower(col).contains(q, autoescape=True)
                        for col in (t.c.pipeline, t.c.fork_node, t.c.override_json, t.c.error)
                    ),
                )
            )
        with self.read() as conn:
            rows = conn.execute(query.order_by(schema.runs.c.created_at.desc()).limit(limit)).all()
        return self._with_audits([self._run_record(r) for r in rows])

    def sub_runs(self, run_id: str, position: int | None = None) -> list[RunRecord]:
        """The runs of the Burr sub-applications that ``run_id``'s nodes spawned (only the node
        at ``position`` when given), by node position then spawn key."""
        t = schema.runs
        query = select(t).where(t.c.spawning_run_id == run_id)
        if position is not None:
            query = query.where(t.c.spawning_position == position)
        with self.read() as conn:
            rows = conn.execute(query).all()
        found = [self._run_record(r) for r in rows]
        found.sort(key=lambda r: (r.spawning_position or 0, _key_order(r.spawn_key or "")))
        return self._with_audits(found)

    def sub_runs_of(self, run_ids: Collection[str]) -> list[RunRecord]:
        """The sub-runs spawned by any of ``run_ids``, and theirs in turn (every level), by
        spawning run, node position, then spawn key."""
        t = schema.runs
        found: list[RunRecord] = []
        seen = set(run_ids)
        frontier = sorted(seen)
        with self.read() as conn:
            while frontier:
                rows: list[Any] = []
                for i in range(0, len(frontier), _IN_CHUNK):
                    chunk = frontier[i : i + _IN_CHUNK]
                    rows += conn.execute(select(t).where(t.c.spawning_run_id.in_(chunk))).all()
                level = [self._run_record(r) for r in rows if r.run_id not in seen]
                seen.update(r.run_id for r in level)
                found += level
                frontier = [r.run_id for r in level]
        found.sort(
            key=lambda r: (
                r.spawning_run_id or "",
                r.spawning_position or 0,
                _key_order(r.spawn_key or ""),
            )
        )
        return self._with_audits(found)

    def run_exists(self, run_id: str) -> bool:
        """True when a run has exactly this id (no prefix matching)."""
        t = schema.runs
        with self.read() as conn:
            return conn.execute(select(t.c.run_id).where(t.c.run_id == run_id)).first() is not None

    def run_in(self, conn: Connection, run_id: str) -> RunRecord | None:
        """The run with exactly this id as ``conn``'s transaction sees it (no audits read), or
        None when there is none (a run just finished in that transaction: no read of its own).
        """
        if self._bulk_sql is not None:  # SQLite: the driver's statement cache, same row
            row = conn.exec_driver_sql(_RUN_BY_ID_SQL, (run_id,)).first()
        else:
            row = conn.execute(_RUN_BY_ID, {"run_id": run_id}).first()
        return None if row is None else self._run_record(row)

    def _run_record(self, row: Any) -> RunRecord:
        record = RunRecord.from_row(row)
        if record.run_id in self._orphans and record.status == "running":
            return dataclasses.replace(record, status="interrupted", error=_ORPHAN_ERROR)
        return record

    def ancestors(self, run: str | RunRecord) -> list[RunRecord]:
        """The runs ``run`` was forked from, nearest first: its parent, the parent's parent…

        The one walk up a run's lineage. It is cycle-safe: a run met twice ends the walk (a
        store edited by hand or merged from two stores can hold a cycle), and so does a parent
        that is no longer in the store (removed by retention).

        Args:
            run: a run id (or unique prefix), or the run itself (then it need not be stored
                yet: a queued fork's placeholder).
        Raises:
            UnknownRun: ``run`` is an id no stored run has.
        """
        start = self.get_run(run) if isinstance(run, str) else run
        seen = {start.run_id}
        found: list[RunRecord] = []
        parent_id = start.parent_run_id
        if not parent_id:
            return found  # a recorded run: no read transaction
        t = schema.runs
        with self.read() as conn:
            while parent_id and parent_id not in seen:
                row = conn.execute(select(t).where(t.c.run_id == parent_id)).first()
                if row is None:
                    break
                seen.add(parent_id)
                found.append(self._run_record(row))
                parent_id = row.parent_run_id
            return self._with_audits(found, conn)

    def children(self, run_id: str) -> list[RunRecord]:
        """Forks whose parent is ``run_id``, oldest first."""
        with self.read() as conn:
            rows = conn.execute(
                select(schema.runs)
                .where(schema.runs.c.parent_run_id == run_id)
                .order_by(schema.runs.c.created_at)
            ).all()
        return self._with_audits([self._run_record(r) for r in rows])

    # -- effect audits ------------------------------------------------------------------------
    def record_audit(
        self,
        run_id: str,
        *,
        against: str | None,
        label: str,
        note: str,
        counts: dict[str, int],
    ) -> None:
        """Append one effect audit of a run (its newest becomes the run's ``last_audit``).

        Args:
            run_id: the audited run (full id).
            against: the reference run id, ``"current"`` or None.
            label: ``admissible``, ``vacuous`` or ``not-admissible``.
            note: the report's one-line reason.
            counts: calls per verdict.
        """
        t = schema.audits
        with self.write() as conn:
            seq = conn.execute(
                select(func.coalesce(func.max(t.c.seq), 0)).where(t.c.run_id == run_id)
            ).scalar_one()
            conn.execute(
                insert(t).values(
                    run_id=run_id,
                    seq=int(seq) + 1,
                    audited_at=time.time(),
                    against=against,
                    label=label,
                    note=note,
                    counts_json=json.dumps(counts, sort_keys=True),
                )
            )

    def _with_audits(
        self, runs: list[RunRecord], conn: Connection | None = None
    ) -> list[RunRecord]:
        """The runs with their last audit filled in (one query; in ``conn``'s transaction when
        given, so a lookup reads the run and its audit at once)."""
        if not runs:
            return runs
        if conn is None:
            with self.read() as c:
                return self._with_audits(runs, c)
        rows = conn.execute(_LAST_AUDITS, {"ids": [r.run_id for r in runs]}).all()
        last = {
            r.run_id: {
                "label": r.label,
                "against": r.against,
                "note": r.note,
                "counts": json.loads(r.counts_json or "{}"),
                "audited_at": r.audited_at,
            }
            for r in rows
        }
        return [
            dataclasses.replace(r, last_audit=last[r.run_id]) if r.run_id in last else r
            for r in runs
        ]

    # -- nodes and calls ----------------------------------------------------------------------
    def insert_node(
        self, conn: Connection, node: dict[str, Any], calls: Sequence[CallRecord] = ()
    ) -> None:
        """Insert one node row and its calls (values keyed by column name)."""
        conn.execute(self._insert_node, [self._lean_nodes([node])[0]])
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
        if not rows or rows[0]._mapping["position"] != 0:
            # A replay stored by reference has no rows (or none before its divergence).
            by_reference = self._nodes_by_reference(run_id, with_calls=with_calls)
            if by_reference is not None:
                return by_reference
        return [NodeRecord.from_row(r, tuple(by_pos.get(r._mapping["position"], ()))) for r in rows]

    def _nodes_by_reference(self, run_id: str, *, with_calls: bool) -> list[NodeRecord] | None:
        """The node rows of a replay stored by reference (:mod:`rewind.store.references`),
        the source's shared steps resolved; None when the run is not stored by reference."""
        from rewind.store.references import MappingRow, resolve

        with self.read() as conn:
            run = conn.execute(
                select(schema.runs.c.config_json, schema.runs.c.created_at).where(
                    schema.runs.c.run_id == run_id
                )
            ).first()
            if run is None:
                return None
            rows = resolve(conn, run_id, json.loads(run[0] or "{}"), float(run[1]))
        if rows is None:
            return None
        return [
            NodeRecord.from_row(
                MappingRow(n),
                tuple(CallRecord.from_row(MappingRow(c)) for c in rows.calls.get(n["position"], ()))
                if with_calls
                else (),
            )
            for n in rows.nodes
        ]

    # -- caches -------------------------------------------------------------------------------
    def llm_cache_get(self, key: str) -> CacheEntry | None:
        """The LLM cache entry for a key, if any."""
        t = schema.llm_cache
        with self.read() as conn:
            row = conn.execute(select(t).where(t.c.key == key)).first()
        if row is None:
            return None
        m = row._mapping
        return CacheEntry.read(
            key,
            m["response_hash"],
            m["created_at"],
            m["origin"],
            m["prompt_tokens"],
            m["completion_tokens"],
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
        return CacheEntry.read(key, m["result_hash"], m["created_at"], m["origin"])

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
    def put_edges(
        self,
        pipeline: str,
        edges: Iterable[tuple[str, str, str]],
        conn: Connection | None = None,
    ) -> None:
        """Record a pipeline's graph edges (src, dst, condition); idempotent. With ``conn``,
        inside that write transaction; else in a transaction of its own."""
        rows = [{"pipeline": pipeline, "src": s, "dst": d, "condition": c} for s, d, c in edges]
        if not rows:
            return
        keys = ("pipeline", "src", "dst")
        stmt = _insert_ignore_stmt(self.engine.dialect.name, schema.edges, keys)
        if conn is not None:
            conn.execute(stmt, rows)
            return
        # Every record of a pipeline writes its edges; rows are never deleted, so edges this
        # instance committed once are not written (a write transaction of their own) again,
        # in the same database (on SQLite, a file deleted and created again under this open
        # store is another one: its meta.store_id, read first, is not the one they were
        # written on).
        edges_key = (pipeline, tuple(tuple(r.values()) for r in rows))
        if (self._store_id, *edges_key) in self._edges_written and self._same_store_id():
            return
        with self.write() as own:
            own.execute(stmt, rows)
            written = (self._store_id, *edges_key)  # the database this write found
        if len(self._edges_written) < 1_000:
            self._edges_written.add(written)

    def _same_store_id(self) -> bool:
        """Whether the database is the one this instance's memories were learned on: on SQLite
        its ``meta.store_id``, read now (one statement through the driver on a pooled
        connection, as :func:`_sqlite_revision_and_version` reads), is the one its writes saw
        last (:meth:`_same_database`); True on other databases, which have none. False when it
        cannot be read (the caller then writes, and meets the error there)."""
        if self._bulk_sql is None:
            return True
        if self._store_id is None or self.engine.dialect.driver != "pysqlite":
            return False
        try:
            raw = self.engine.raw_connection()
            try:
                rows = raw.driver_connection.execute(_STORE_ID_SQL, (STORE_ID_KEY,)).fetchall()
            finally:
                raw.close()
        except (SQLAlchemyError, sqlite3.Error):
            return False
        return bool(rows) and rows[0][0] == self._store_id

    def edges_of(self, pipeline: str) -> list[tuple[str, str, str]]:
        """A pipeline's edges as (src, dst, condition)."""
        t = schema.edges
        with self.read() as conn:
            return [
                (r.src, r.dst, r.condition)
                for r in conn.execute(select(t).where(t.c.pipeline == pipeline))
            ]

    # -- run graphs ---------------------------------------------------------------------------
    def put_run_graph(
        self,
        conn: Connection,
        run_id: str,
        document: dict[str, Any],
        drift: dict[str, Any] | None = None,
        data: bytes | None = None,
    ) -> str:
        """Record the graph document a run ran (a blob) and a fork's drift; returns its hash.

        ``data``: the document's canonical bytes when the caller has them already."""
        digest = self.put_blob(conn, canonical_bytes(document) if data is None else data)
        drift_json = None if drift is None else json.dumps(drift, sort_keys=True)
        conn.execute(
            _INSERT_RUN_GRAPH, {"run_id": run_id, "graph_hash": digest, "drift_json": drift_json}
        )
        return digest

    def run_graphs(self, run_ids: Iterable[str]) -> dict[str, RunGraph]:
        """The recorded graphs of these runs, by run id; runs recorded without one are absent
        (a store written before graphs were recorded)."""
        wanted = list(dict.fromkeys(run_ids))
        t = schema.run_graphs
        rows: list[Any] = []
        with self.read() as conn:
            for i in range(0, len(wanted), _IN_CHUNK):
                chunk = wanted[i : i + _IN_CHUNK]
                rows += conn.execute(select(t).where(t.c.run_id.in_(chunk))).all()
            docs = self.get_blobs({r.graph_hash for r in rows}, conn)
        return {
            r.run_id: RunGraph(
                run_id=r.run_id,
                graph_hash=r.graph_hash,
                document=json.loads(docs[r.graph_hash]),
                drift=json.loads(r.drift_json) if r.drift_json else None,
            )
            for r in rows
        }

    def run_graph_hashes(self, run_ids: Iterable[str]) -> dict[str, str]:
        """The hashes of the graph documents these runs recorded, by run id (documents not
        read); runs recorded without one are absent."""
        wanted = list(dict.fromkeys(run_ids))
        t = schema.run_graphs
        found: dict[str, str] = {}
        with self.read() as conn:
            for i in range(0, len(wanted), _IN_CHUNK):
                chunk = wanted[i : i + _IN_CHUNK]
                rows = conn.execute(select(t.c.run_id, t.c.graph_hash).where(t.c.run_id.in_(chunk)))
                found.update((run_id, digest) for run_id, digest in rows)
        return found

    def run_graph(self, run_id: str) -> RunGraph | None:
        """The recorded graph of one run, or None (recorded before graphs were)."""
        return self.run_graphs([run_id]).get(run_id)

    # -- Burr state rows ----------------------------------------------------------------------
    def save_state(self, conn: Connection, row: dict[str, Any]) -> None:
        """Insert one Burr state row (see :func:`state_row`).

        Raises:
            StoreError: the row (app id, sequence id) exists already.
        """
        try:
            conn.execute(self._insert_state, state_deltas([row], {})[0])
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
            derived = None
            if row is None or sequence_id is None:
                derived = self._traced_state_row(conn, partition_key, app_id, sequence_id)
            if derived is not None and (row is None or derived["sequence_id"] > row.sequence_id):
                m = derived
            elif row is None:
                return None
            else:
                m = dict(row._mapping)
            fields = json.loads(m.pop("fields_json"))
            if isinstance(fields, list):  # a delta: rebuild it from the rows before it
                earlier = conn.execute(
                    select(t.c.sequence_id, t.c.fields_json).where(
                        cond,
                        t.c.sequence_id < m["sequence_id"],
                        t.c.sequence_id >= m["sequence_id"] - STATE_DELTA_MAX_DEPTH,
                    )
                ).all()
                fields = _resolve_delta(
                    fields, {r.sequence_id: r.fields_json for r in earlier}, f"{app_id}"
                )
            internal = json.loads(m.pop("internal_json") or "{}")
            blobs = self.get_blobs(fields.values(), conn) if values else {}
        m["fields"] = fields
        m["internal"] = internal
        if not values:
            return m
        from rewind.serde import decode_field  # imports Burr (and pandas): only when values load

        m["values"] = {k: decode_field(k, blobs[h]) for k, h in fields.items()} | internal
        return m

    def _traced_state_row(
        self, conn: Connection, partition_key: str, app_id: str, sequence_id: int | None
    ) -> dict[str, Any] | None:
        """The state row of a traced step, which a trace does not store (migration 0012): the
        step's node row names its state document (``state_hash``: the canonical ``{field: blob
        hash}`` map), which is exactly the row's ``fields``. Only for a trace's own completed
        steps (``src_app_id`` the trace itself; ``sequence_id`` None: its last such step); None
        for anything else, such as a Burr app (whose rows are all stored)."""
        if partition_key != "":
            return None
        n, s = schema.nodes, schema.spans
        is_trace = conn.execute(
            select(s.c.run_id).where(s.c.run_id == app_id, s.c.position == -1)
        ).first()
        if is_trace is None:
            return None
        q = select(n.c.sequence_id, n.c.name, n.c.state_hash, n.c.started_at).where(
            n.c.run_id == app_id,
            n.c.src_app_id.in_((schema.OWN_APP, app_id)),  # "": its own run (SQLite)
            n.c.src_sequence_id == n.c.sequence_id,
            n.c.state_hash.is_not(None),
            n.c.error.is_(None),
        )
        if sequence_id is None:
            q = q.order_by(n.c.sequence_id.desc()).limit(1)
        else:
            q = q.where(n.c.sequence_id == sequence_id)
        node = conn.execute(q).first()
        if node is None:
            return None
        doc = self.get_blobs([node.state_hash], conn)[node.state_hash]
        return {
            "partition_key": partition_key,
            "app_id": app_id,
            "sequence_id": node.sequence_id,
            "position": node.name,
            "status": "completed",
            "fields_json": doc.decode(),
            "internal_json": "{}",
            "created_at": node.started_at,
        }

    def resolve_fields(
        self, fields: dict[str, str], blobs: dict[str, bytes] | None = None
    ) -> dict[str, Any]:
        """Load a {field: blob hash} map into {field: value}, each value of its recorded type.

        ``blobs``: the fields' blob bytes by hash when the caller has them (not read again).

        Raises:
            StateLoadError: a value cannot be rebuilt (see :func:`rewind.serde.decode_field`).
            StoreError: a blob is missing.
        """
        from rewind.serde import decode_field  # imports Burr (and pandas): only when values load

        if blobs is None or not blobs.keys() >= set(fields.values()):
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
        if self.objects is not None:  # servers and workers on other machines read it there
            self.objects.put_object(artifact_key(run_id, name), data)
        with self.write() as conn:
            stmt = _upsert_stmt(conn.dialect.name, schema.artifacts, ("run_id", "name"))
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


def _key_order(key: str) -> tuple[int | str, ...]:
    """Sort order of a spawn key: ``"10.0"`` after ``"2.0"``."""
    return tuple(int(p) if p.isdigit() else p for p in key.split("."))


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
    fields_json: str | None = None,
    since: tuple[dict[str, str], Collection[str], Collection[str]] | None = None,
) -> dict[str, Any]:
    """Column dict of a Burr state row: semantic fields by blob hash, ``__`` keys inline.

    ``fields_json``: ``json.dumps(fields, sort_keys=True)`` when the caller has it already
    (the recorder keeps it up to date field by field). A copy of ``fields`` travels with the
    row (not a column: :func:`state_deltas` reads it instead of parsing ``fields_json`` again
    and drops it).

    ``since``: what changed since the app's previous row, when the caller knows it: (that
    row's own ``_fields`` map — the very dict object —, the fields whose hash may differ
    since, the fields removed since); every other field has the same hash. :func:`state_deltas`
    then compares only those fields, and only when the row it deltas against carries that map.
    """
    row: dict[str, Any] = {
        _FIELDS_KEY: dict(fields),
        "partition_key": partition_key,
        "app_id": app_id,
        "sequence_id": sequence_id,
        "position": position,
        "status": status,
        "fields_json": json.dumps(fields, sort_keys=True) if fields_json is None else fields_json,
        "internal_json": _internal_json(internal),
        "created_at": time.time(),
    }
    if since is not None:
        row[_SINCE_KEY] = since
    return row


_PLAIN_TEXT = re.compile(r"[ !#-\[\]-~]*\Z")
"""Printable ASCII without ``"`` and ``\\``: ``json.dumps`` writes it as it is."""


def _internal_json(internal: dict[str, Any]) -> str:
    """``json.dumps(internal, sort_keys=True)``: Burr's ``__`` fields of a state row.

    Written directly when every name and string is plain and every number an int (Burr's
    ``__PRIOR_STEP`` and ``__SEQUENCE_ID``, at every node: ~3x faster than ``json.dumps``)."""
    plain = _PLAIN_TEXT.match
    parts = []
    for k in sorted(internal) if all(type(k) is str for k in internal) else ():
        v = internal[k]
        if not plain(k):
            break
        if type(v) is int:
            parts.append(f'"{k}": {int.__repr__(v)}')
        elif type(v) is str and plain(v):
            parts.append(f'"{k}": "{v}"')
        else:
            break
    else:
        if len(parts) == len(internal):
            return "{" + ", ".join(parts) + "}"
    return json.dumps(internal, sort_keys=True)


def _last_audits_statement() -> Any:
    t = schema.audits
    newest = (
        select(t.c.run_id, func.max(t.c.seq).label("seq"))
        .where(t.c.run_id.in_(bindparam("ids", expanding=True)))
        .group_by(t.c.run_id)
        .subquery()
    )
    return select(t).join(newest, (t.c.run_id == newest.c.run_id) & (t.c.seq == newest.c.seq))


# Built once: building a select costs more than running it (~0.5 ms for the audits join).
_LAST_AUDITS = _last_audits_statement()
"""The newest audit row of each run in ``:ids``."""
_RUN_BY_ID = select(schema.runs).where(schema.runs.c.run_id == bindparam("run_id"))
_RUN_BY_ID_SQL = f"SELECT {', '.join(schema.runs.c.keys())} FROM runs WHERE run_id = ?"
_BLOB_EPOCH = select(schema.meta.c.value).where(schema.meta.c.key == BLOB_EPOCH_KEY)
_EPOCH_AND_STORE_ID_SQL = (
    "SELECT (SELECT value FROM meta WHERE key = ?), (SELECT value FROM meta WHERE key = ?)"
)
_INSERT_STORE_ID_SQL = "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)"
_STORE_ID_SQL = "SELECT value FROM meta WHERE key = ?"
STORE_ID_KEY = "store_id"
"""``meta`` key of a SQLite store's random id, written by its first write that finds none
(:meth:`Store._same_database`): tells a file deleted and created again at the same path from
the one a store instance learned its memories on."""
_INSERT_RUN = insert(schema.runs)
_INSERT_EFFECT = insert(schema.effects)  # built once (~10 us each per write batch otherwise)
_INSERT_SPAN = insert(schema.spans)
_RUN_COLUMNS = frozenset(schema.runs.c.keys())
"""The columns of a run row (:meth:`Store.create_run` refuses any other key)."""


def _has_blob_rows(batch: WriteBatch) -> bool:
    """Whether ``batch`` writes blobs (its packs group some of them) or rows whose blobs
    :meth:`Store.write_batch` checks."""
    return bool(
        batch.blobs
        or batch.states
        or batch.nodes
        or batch.calls
        or batch.llm_cache
        or batch.tool_cache
        or batch.effects
    )


def _kept_float(value: Any) -> bool:
    """A float SQLite stores and reads back as it is (NaN is stored as NULL, -0.0 as 0.0)."""
    return type(value) is float and value == value and (value != 0.0 or str(value) == "0.0")


def _run_kind(column: Any) -> Callable[[Any], bool]:
    """Whether a value of a run column is stored and read back as it is (SQLite affinity)."""
    if isinstance(column.type, Float):
        return _kept_float
    if isinstance(column.type, Integer):
        return lambda v: type(v) is int
    if isinstance(column.type, String):
        return lambda v: type(v) is str
    return lambda v: False


_RUN_KINDS = {c.name: _run_kind(c) for c in schema.runs.columns}
"""Per run column: whether a value is read back as given (:meth:`Store.run_as_inserted`)."""
_INSERT_RUN_GRAPH = insert(schema.run_graphs)
_RUN_TOTALS = text(
    "SELECT COALESCE(SUM(prompt_tokens),0), COALESCE(SUM(completion_tokens),0),"
    " COALESCE(SUM(latency_ms),0) FROM nodes WHERE run_id=:r AND inherited=:f"
)
_FINISH_RUN = (
    update(schema.runs)
    .where(and_(schema.runs.c.run_id == bindparam("id"), schema.runs.c.status == "running"))
    .values(
        status=bindparam("new_status"),
        finished_at=bindparam("new_finished_at"),
        prompt_tokens=bindparam("new_prompt_tokens"),
        completion_tokens=bindparam("new_completion_tokens"),
        latency_ms=bindparam("new_latency_ms"),
        error=bindparam("new_error"),
    )
)
"""Finish a running run (:meth:`Store.finish_run_in`); a finished run is left as it is."""


class _BlobRow(NamedTuple):
    """A ``blobs`` row (outer-joined with ``blob_data``) read by raw SQL."""

    hash: str
    codec: str
    data: bytes
    ref: str | None
    spilled: bytes | None


def _hex_digest(value: Any) -> Any:
    """A ``blobs.hash`` value read by raw SQL as :class:`schema.Digest` reads it (32 bytes ->
    64 hex; anything else unchanged)."""
    return value.hex() if type(value) is bytes and len(value) == 32 else value


def _probe(blobs: dict[str, bytes]) -> list[str]:
    """:data:`PRESENCE_PROBE_BLOBS` hashes spread evenly over a batch's blobs."""
    listed = list(blobs)
    step = max(1, len(listed) // PRESENCE_PROBE_BLOBS)
    return listed[::step][:PRESENCE_PROBE_BLOBS]


def pack_groups(batch: WriteBatch, exclude: Collection[str] = ()) -> list[set[str]]:
    """The batch's blobs as the packs they may share (:attr:`WriteBatch.packs`): its documents
    and state field values in one, its calls' and cache entries' requests and results in the
    other (a diff reads the first kind, a replay serving calls the second, each of a run's
    nodes at once). ``exclude``: blobs that stay on their own."""
    payloads: set[str] = set()
    for row in batch.calls:
        payloads.update(h for h in (row.get("request_hash"), row.get("result_hash")) if h)
    for row in batch.llm_cache:
        payloads.update(h for h in (row.get("request_hash"), row.get("response_hash")) if h)
    for row in batch.tool_cache:
        payloads.update(h for h in (row.get("args_hash"), row.get("result_hash")) if h)
    blobs = batch.blobs.keys() - exclude
    return [blobs - payloads, payloads & blobs]


_INSERT_PACK_SQL = "INSERT INTO blob_packs (data) VALUES (?)"
_PACKS_SAVEPOINT = "rewind_packs"


def _by_hash(row: dict[str, Any]) -> str:
    return row["hash"]


def _by_key(row: dict[str, Any]) -> str:
    return row["key"]


_BULK_TABLES = {
    # table: (conflict target, what to do on a conflict) as Store.write_batch inserts them
    "blobs": ("hash", "NOTHING"),
    "blob_data": ("hash", "NOTHING"),
    "blob_slices": ("key", "NOTHING"),
    "llm_cache": ("key", "UPDATE"),
    "tool_cache": ("key", "UPDATE"),
    "burr_state": (None, None),
    "nodes": (None, None),
    "calls": (None, None),
    "effects": (None, None),
    "spans": (None, None),
    "runs": (None, None),  # one row at a time (Store.create_run), same prepared statement
}


class _BulkSql(NamedTuple):
    """One table's prepared bulk insert (:func:`_sqlite_bulk_sql`)."""

    sql: str
    columns: list[tuple[str, Any, Callable[[Any], Any] | None]]
    """(column, value when a row omits it, how to bind its value: for a
    :class:`~rewind.store.schema.Digest` as bytes, for a :class:`~rewind.store.schema.Usual`
    its usual value as ``''``, else None), in order."""
    values: Callable[[dict[str, Any]], tuple[Any, ...]]
    """A row's values of every column, in order (``operator.itemgetter``: raises KeyError
    when the row omits one)."""
    binds: tuple[tuple[int, Callable[[Any], Any]], ...]
    """(position, bind) of the columns whose values are bound converted."""

    def params(self, row: dict[str, Any]) -> tuple[Any, ...]:
        """The row's parameters: its values (or a column's default), converted where a column
        binds its values (Digests as bytes, Usual values as stored)."""
        try:
            values = self.values(row)  # C speed: every column of a row the writer built
        except KeyError:
            values = tuple(row.get(c, d) for c, d, _b in self.columns)
        if not self.binds:
            return values
        out = list(values)
        for i, bind in self.binds:
            out[i] = bind(out[i])
        return tuple(out)


@functools.cache
def _sqlite_bulk_sql() -> dict[str, _BulkSql]:
    """Per table of :data:`_BULK_TABLES`: the SQLite ``INSERT`` statement with ``?`` marks for
    every column, and how a row dict becomes its parameters — the same statements, defaults
    and stored values as the SQLAlchemy ones in :class:`Store` (scalar column defaults only)."""
    out: dict[str, _BulkSql] = {}
    for name, (target, action) in _BULK_TABLES.items():
        table = schema.metadata.tables[name]
        columns = []
        for col in table.columns:
            default = col.default
            if default is not None and not default.is_scalar:
                raise AssertionError(f"{name}.{col.name}: a bulk insert needs scalar defaults")
            columns.append(
                (
                    col.name,
                    None if default is None else default.arg,
                    _sqlite_bind(col.type),
                )
            )
        names = [c for c, _d, _dg in columns]
        sql = f"INSERT INTO {name} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
        if action == "NOTHING":
            sql += f" ON CONFLICT ({target}) DO NOTHING"
        elif action == "UPDATE":
            rest = ", ".join(f"{c} = excluded.{c}" for c in names if c != target)
            sql += f" ON CONFLICT ({target}) DO UPDATE SET {rest}"
        binds = tuple((i, bind) for i, (_c, _d, bind) in enumerate(columns) if bind is not None)
        assert len(names) > 1  # itemgetter of one name returns the value, not a 1-tuple
        out[name] = _BulkSql(sql, columns, operator.itemgetter(*names), binds)
    return out


def _sqlite_bind(column_type: Any) -> Callable[[Any], Any] | None:
    """How :func:`_sqlite_bulk_sql` binds a value of a column of this type on SQLite (None: as
    it is)."""
    if isinstance(column_type, schema.Digest):
        return digest_bytes
    if isinstance(column_type, schema.Usual):
        return column_type.stored
    return None


_FIELDS_KEY = "_fields"
"""Key of the parsed {field: hash} map a :func:`state_row` dict carries beside its columns."""
_SINCE_KEY = "_since"
"""Key of the ``since`` hint of :func:`state_row` (not a column either)."""

_NOT_COLUMNS = frozenset({_FIELDS_KEY, _SINCE_KEY})

STATE_DELTA_MAX_DEPTH = 16
"""A state row is stored as a delta of the row before it (same app, previous sequence id) when
that row is known to the writer, at most this many deltas in a row; then a full map again."""


def state_deltas(
    rows: list[dict[str, Any]],
    tails: dict[tuple[str, str], tuple[int, dict[str, str], int]],
) -> tuple[list[dict[str, Any]], dict[tuple[str, str], tuple[int, dict[str, str], int]]]:
    """The rows to insert for Burr state rows (see :func:`state_row`), with ``fields_json``
    stored as a delta wherever the previous row of the same app is in ``rows`` or in ``tails``.

    Storage only: :meth:`Store.load_state_row` rebuilds the full map, hashes are unchanged. A
    full row's ``fields_json`` is a JSON object ``{field: hash}``; a delta is a JSON array
    ``[base sequence id, {changed or new field: hash}, [removed fields]]`` (never ambiguous:
    a full map is always an object). A Burr run that rewrites one of 20 fields per step stores
    one hash per step instead of 20.

    Args:
        rows: state row dicts, ``fields_json`` a full JSON map (its parsed map under
            ``_fields`` when :func:`state_row` built them); not modified. The rows returned
            hold columns only.
        tails: (partition key, app id) → (sequence id, fields, delta depth) of the last row
            already committed per app (the writer's memory); not modified.
    Returns:
        (the rows to insert, the new tails to remember once they are committed).
    """
    out: list[dict[str, Any]] = []
    new_tails: dict[tuple[str, str], tuple[int, dict[str, str], int]] = {}
    for row in rows:
        app = (row["partition_key"], row["app_id"])
        fields = row.get(_FIELDS_KEY)
        since = row.get(_SINCE_KEY)
        if fields is None:
            fields = json.loads(row["fields_json"])
        if _FIELDS_KEY in row or _SINCE_KEY in row:
            row = {k: v for k, v in row.items() if k not in _NOT_COLUMNS}
        seq = row["sequence_id"]
        tail = new_tails.get(app) or tails.get(app)
        depth = 0
        if tail is not None and tail[0] == seq - 1 and tail[2] < STATE_DELTA_MAX_DEPTH:
            delta = _delta_json(seq - 1, *_changes(tail[1], fields, since))
            if len(delta) < len(row["fields_json"]):
                row = row | {"fields_json": delta}
                depth = tail[2] + 1
        out.append(row)
        new_tails[app] = (seq, fields, depth)
    return out, new_tails


def _delta_json(base: int, changed: dict[str, str], removed: list[str]) -> str:
    """``json.dumps([base, changed, removed], sort_keys=True)``: a state row's delta, written
    directly when every name and hash is plain (most rows: one per node)."""
    plain = _PLAIN_TEXT.match
    names = [*changed, *removed]
    if (
        type(base) is int
        and all(type(k) is str and plain(k) for k in names)
        and all(type(v) is str and plain(v) for v in changed.values())
    ):
        fields = ", ".join([f'"{k}": "{changed[k]}"' for k in sorted(changed)])
        gone = ", ".join([f'"{k}"' for k in removed])
        return f"[{int.__repr__(base)}, {{{fields}}}, [{gone}]]"
    return json.dumps([base, changed, removed], sort_keys=True)


def _changes(
    base: dict[str, str], fields: dict[str, str], since: Any
) -> tuple[dict[str, str], list[str]]:
    """(changed or new field → hash, removed fields) from ``base`` to ``fields``; only the
    fields ``since`` names when it says what changed since that very ``base`` (state_row)."""
    if since is not None and since[0] is base:
        changed = {k: fields[k] for k in since[1] if base.get(k) != fields[k]}
        return changed, sorted(k for k in since[2] if k in base)
    changed = {k: h for k, h in fields.items() if base.get(k) != h}
    return changed, sorted(k for k in base if k not in fields)


def state_row_hashes(fields_json: str) -> set[str]:
    """The blob hashes a stored ``burr_state.fields_json`` names itself: every field's of a full
    map, the changed fields' of a delta (the rest are named by the rows before it)."""
    stored = json.loads(fields_json)
    return set((stored[1] if isinstance(stored, list) else stored).values())


def _run_row_refused(conn: Connection, values: dict[str, Any]) -> StoreError:
    """Why the database refused a new run row: its id exists, or the run it names as its
    parent (or spawning run) is not stored (archived by ``rewind gc`` or deleted meanwhile)."""
    runs = schema.runs
    run_id = values["run_id"]
    if conn.execute(select(runs.c.run_id).where(runs.c.run_id == run_id)).first() is not None:
        return StoreError(f"run id {run_id} already exists", "use a new id")
    for key in ("parent_run_id", "spawning_run_id"):
        other = values.get(key)
        found = other and conn.execute(select(runs.c.run_id).where(runs.c.run_id == other)).first()
        if other and found is None:
            return ParentMissing(
                f"run {run_id} cannot be stored: the run it descends from, {other}, is not in "
                "the store (archived by `rewind gc` or deleted after this run started)",
                "restore it (`rewind archive restore`) and record again",
            )
    return StoreError(f"run {run_id} cannot be stored (the database refused its row)", "")


@dataclass(frozen=True)
class _Pack:
    """A pack about to be inserted: its stored bytes and, per blob, (sha256, size, (codec,
    offset, length)) as :func:`rewind.store.codec.pack_together` made them."""

    data: bytes
    blobs: list[tuple[str, int, tuple[str, int, int]]]
    items: dict[str, bytes]
    """The blobs' bytes by sha256."""


def _pack_chunks(digests: list[str], blobs: dict[str, bytes]) -> list[list[str]]:
    """``digests`` cut, in order, into packs of at most :data:`PACK_GROUP_MAX_BYTES` of
    uncompressed bytes (a reader of one blob decompresses its whole pack); a pack holds two
    blobs or more (a blob alone keeps a row of its own)."""
    chunks: list[list[str]] = [[]]
    size = 0
    for h in digests:
        if size + len(blobs[h]) > PACK_GROUP_MAX_BYTES and chunks[-1]:
            chunks.append([])
            size = 0
        chunks[-1].append(h)
        size += len(blobs[h])
    return [c for c in chunks if len(c) >= 2]


def _packed(items: dict[str, bytes]) -> _Pack:
    """A pack of these blobs (sha256 → bytes), in this order."""
    digests = list(items)
    stored, slices = pack_together([items[h] for h in digests])
    sizes = [len(items[h]) for h in digests]
    return _Pack(stored, list(zip(digests, sizes, slices, strict=True)), items)


def _pack_ref_of(digest: str, codec: str, data: bytes) -> tuple[str, int, int, int]:
    """(codec, pack id, offset, length) of a ``blobs`` row of a packed blob.

    Raises:
        StoreError: a damaged reference.
    """
    try:
        return (codec, *read_pack_ref(data))
    except ValueError as exc:
        raise StoreError(f"blob {digest[:12]}: {exc}", "the store is damaged") from exc


def _slice_refs(conn: Connection, digests: Sequence[str]) -> dict[str, tuple[str, int, int, int]]:
    """(codec, pack id, offset, length) of the ``blob_slices`` row under each digest's key
    (:func:`~rewind.store.codec.slice_key`), for the digests that have one. The row may name
    another blob's bytes (two hashes sharing their first bytes): the caller checks the hash.

    Raises:
        StoreError: a damaged reference.
    """
    by_key: dict[bytes, list[str]] = {}
    for d in digests:
        by_key.setdefault(slice_key(d), []).append(d)
    t = schema.blob_slices
    keys = sorted(by_key)
    out: dict[str, tuple[str, int, int, int]] = {}
    for i in range(0, len(keys), _IN_CHUNK):
        found = conn.execute(select(t.c.key, t.c.ref).where(t.c.key.in_(keys[i : i + _IN_CHUNK])))
        for key, ref in found:
            where = slice_row_ref(key, ref)[:4]
            for d in by_key[bytes(key)]:
                out[d] = where
    return out


def slice_row_ref(key: bytes, ref: bytes) -> tuple[str, int, int, int, int]:
    """(``p-`` codec, pack id, offset, length, size in bytes) of a ``blob_slices`` row.

    Raises:
        StoreError: a damaged reference (the store is damaged).
    """
    try:
        return read_slice_ref(ref)
    except ValueError as exc:
        raise StoreError(f"blob slice {bytes(key).hex()}: {exc}", "the store is damaged") from exc


def _from_packs(
    conn: Connection,
    refs: dict[str, tuple[str, int, int, int]],
    *,
    keyed: bool = False,
    strict: bool = True,
    shared_absent: bool = False,
) -> dict[str, bytes]:
    """The bytes of packed blobs (sha256 → (codec, pack id, offset, length)), each pack read
    and decompressed once, every blob checked against its hash; a blob whose pack is gone is
    left out (the caller reports it missing).

    Args:
        conn: a connection to read the packs in.
        refs: where each blob is.
        keyed: the references are ``blob_slices`` rows found by the first bytes of the hash
            (a mismatch may be another blob's slice, not damage).
        strict: raise on a damaged pack or a mismatch; when False such blobs are left out
            (a presence check: a blob found nowhere is written again).
        shared_absent: (``keyed``) a slice holding another blob whose hash has the same first
            bytes leaves the blob out even when ``strict`` (a presence check that must still
            fail on damage: a mismatch whose bytes hash to another key).
    Raises:
        StoreError: (``strict``) a pack is damaged, or a blob does not match its hash.
    """
    out: dict[str, bytes] = {}
    for digest, data in _slices(conn, refs, strict=strict).items():
        actual = sha256_hex(data)
        if actual == digest:
            out[digest] = data
        elif strict and not (shared_absent and slice_key(actual) == slice_key(digest)):
            raise StoreError(
                f"blob {digest[:12]} does not match its hash (its pack {refs[digest][1]} was "
                "altered"
                + (
                    ", or the blob is missing and another shares its hash's first bytes)"
                    if keyed
                    else ")"
                ),
                "the store is damaged; restore it from a backup",
            )
    return out


def _slices(
    conn: Connection, refs: dict[Any, tuple[str, int, int, int]], *, strict: bool
) -> dict[Any, bytes]:
    """The bytes of pack slices (anything → (codec, pack id, offset, length)), unchecked, each
    pack read and decompressed once; a slice whose pack is gone is left out, and (unless
    ``strict``) one that cannot be unpacked.

    Raises:
        StoreError: (``strict``) a pack or a slice reference is damaged.
    """
    p = schema.blob_packs
    ids = sorted({r[1] for r in refs.values()})
    plain: dict[int, bytes] = {}
    for i in range(0, len(ids), _IN_CHUNK):
        for pack_id, data in conn.execute(
            select(p.c.id, p.c.data).where(p.c.id.in_(ids[i : i + _IN_CHUNK]))
        ):
            try:
                plain[pack_id] = zlib.decompress(data)
            except zlib.error as exc:
                if not strict:
                    continue
                raise StoreError(
                    f"blob pack {pack_id} cannot be unpacked: {exc}", "the store is damaged"
                ) from exc
    out: dict[Any, bytes] = {}
    for name, (codec, pack_id, offset, length) in refs.items():
        if pack_id not in plain:
            continue
        try:
            out[name] = unpack_slice(codec, plain[pack_id], offset, length)
        except ValueError as exc:
            if strict:
                label = name[:12] if isinstance(name, str) else bytes(name).hex()
                raise StoreError(f"blob {label}: {exc}", "the store is damaged") from exc
    return out


_CHECKED_CODECS = frozenset({"zd1", "hex1"})
"""Codecs whose bytes carry no checksum of their own: what they unpack to is hashed."""


def _unpacked(digest: str, codec: str, data: bytes) -> bytes:
    """A stored blob's bytes (see :func:`rewind.store.codec.unpack`), ``zd1`` and ``hex1`` ones
    checked against their hash: raw DEFLATE and hex runs carry no checksum, so a truncated or
    altered row would otherwise unpack to other bytes without an error (a blob under 1 KiB:
    ~1 us to hash).

    Raises:
        StoreError: the bytes cannot be unpacked, or a ``zd1``/``hex1`` blob's do not match its
            hash.
        ValueError: an unknown codec (a store written by a newer Rewind).
    """
    try:
        out = unpack(codec, data)
    except zlib.error as exc:
        raise StoreError(
            f"blob {digest[:12]} ({codec}) cannot be unpacked: {exc}", "the store is damaged"
        ) from exc
    except ValueError as exc:
        if codec not in _CHECKED_CODECS:
            raise
        raise StoreError(
            f"blob {digest[:12]} ({codec}) cannot be unpacked: {exc}", "the store is damaged"
        ) from exc
    if codec in _CHECKED_CODECS and sha256_hex(out) != digest:
        raise StoreError(
            f"blob {digest[:12]} does not match its hash (its stored {codec} bytes were altered "
            "or cut short)",
            "the store is damaged; restore it from a backup",
        )
    return out


def _resolve_delta(delta: list[Any], earlier: dict[int, str], where: str) -> dict[str, str]:
    """The full {field: hash} map of a delta state row, from ``earlier`` rows' ``fields_json``
    by sequence id.

    Raises:
        StoreError: a base row is missing (a damaged store).
    """
    chain = [delta]
    while isinstance(chain[-1], list):
        base_seq = chain[-1][0]
        if base_seq not in earlier:
            raise StoreError(
                f"state row {where}#{base_seq} (the base of a stored state delta) is missing",
                "the store is damaged",
            )
        chain.append(json.loads(earlier[base_seq]))
    fields: dict[str, str] = dict(chain.pop())
    for _base, changed, removed in reversed(chain):
        fields.update(changed)
        for k in removed:
            fields.pop(k, None)
    return fields


def dialect_insert(dialect: str, table: Any) -> Any:
    """An ``INSERT`` statement for ``table`` that can take ``ON CONFLICT`` clauses on
    ``dialect`` (``"postgresql"``, else SQLite's): SQLAlchemy's core insert has none.

    Returns the dialect's ``Insert`` construct; callers add ``.values(...)`` and
    ``.on_conflict_do_nothing``/``.on_conflict_do_update``."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table)


# Built once per process and dialect (statements are immutable; building an upsert walks the
# table's columns, ~1 ms, on every store opened — a traced chain opens one per trace).
@functools.cache
def _insert_ignore_stmt(dialect: str, table: Any, keys: tuple[str, ...]) -> Any:
    return dialect_insert(dialect, table).on_conflict_do_nothing(index_elements=list(keys))


@functools.cache
def _upsert_stmt(dialect: str, table: Any, keys: tuple[str, ...]) -> Any:
    stmt = dialect_insert(dialect, table)
    rest = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keys}
    return stmt.on_conflict_do_update(index_elements=list(keys), set_=rest)


_OPEN_STORES: weakref.WeakSet[Store] = weakref.WeakSet()


def _forget_connections_in_child() -> None:
    # A forked worker must not use the parent's pooled database connections (SQLite: "do not
    # carry an open connection across fork()"); dispose(close=False) leaves them to the parent and
    # makes the child's pool open its own.
    for store in list(_OPEN_STORES):
        store.engine.dispose(close=False)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_connections_in_child)


def current_owner() -> str:
    """The owner id written on the runs this process starts: ``host:pid:start`` (start = the
    process's start time, unix seconds with 2 decimals).

    Taken when a run starts, never at import: a worker forked from the importing process (a
    ``multiprocessing`` fork, a Celery or gunicorn prefork child) has another pid, and a run
    recorded there must be reaped when that worker dies while its parent lives on. The start time
    tells a reused pid from the original process.
    """
    global _owner_of_pid
    pid = os.getpid()
    cached = _owner_of_pid
    if cached is not None and cached[0] == pid:
        return cached[1]
    try:
        started = f":{psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        started = ""
    owner = f"{_HOST}:{pid}{started}"
    _owner_of_pid = (pid, owner)
    return owner


def owner_is_gone(owner: str) -> bool:
    """True when ``owner`` (``host:pid[:start]``, see :func:`current_owner`) names a process of
    this host that no longer runs: no such pid, a zombie, or the pid now belongs to a process
    started at another time. False for another host's process (it cannot be seen from here) and
    for an owner that cannot be parsed."""
    host, _, rest = owner.partition(":")
    pid_text, _, started_text = rest.partition(":")
    if host != _HOST or not pid_text.isdigit():
        return False
    try:
        proc = psutil.Process(int(pid_text))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return True
        if started_text:
            return abs(proc.create_time() - float(started_text)) > OWNER_START_TOLERANCE_S
    except psutil.NoSuchProcess:  # includes ZombieProcess on platforms that raise it
        return True
    except (psutil.Error, ValueError):
        return False
    return False


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return lines[0] if lines else type(orig).__name__


def open_store(
    location: str | Path,
    *,
    read_only: bool = False,
    root: Path | None = None,
    objects: str | ObjectStore | None = None,
) -> Store:
    """Open (creating if needed) a store, bringing its schema to the newest migration.

    Args:
        location: a folder (the SQLite file ``rewind.db`` is created in it), a path ending in
            ``.db``/``.sqlite``, or a SQLAlchemy URL (``postgresql+psycopg://…``).
        read_only: only read an existing store (what ``rewind runs``/``show``/``diff``... do):
            nothing is created, migrated or written, so a store on read-only media can be read;
            SQLite reads with ``query_only``, and the last close leaves only the database file
            (see :func:`rewind.store.engine.sqlite_read_only_engine`).
        root: with a URL, the folder artifacts are written below (default ``./.rewind``);
            ignored for SQLite, whose folder is the root.
        objects: object storage for large blobs (``s3://bucket/prefix``, ``file:///folder`` or
            an :class:`ObjectStore`); None reads ``REWIND_OBJECTS`` from the environment (unset:
            every blob stays in the database). Servers and workers share it by configuration.
    Raises:
        StoreError: the location is empty, cannot be created (or, read-only, holds no store at
            the newest revision), or holds a schema this Rewind cannot upgrade (see
            :mod:`rewind.store.migrate`). Nothing is created on disk when this is raised.
    """
    loc = str(location)
    if not loc.strip():
        raise StoreError("the store location is empty", "pass --store FOLDER (default .rewind)")
    object_store = _objects(objects)  # a bad object store URL fails before anything is created
    offload_min_bytes_env()  # so does a bad REWIND_OBJECTS_MIN_BYTES
    if "://" in loc:
        folder = (root or Path(".rewind")).resolve()
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
        store = Store(folder, engine, read_only=read_only, objects=object_store)
        if not read_only:  # the artifact folder, once the database is known to work
            _make_folder(folder)
        return store
    path = Path(loc).expanduser()
    if path.suffix in (".db", ".sqlite", ".sqlite3"):
        folder, db = path.parent, path
    else:
        folder, db = path, path / DB_FILENAME
    if folder.exists() and not folder.is_dir():
        raise StoreError(f"the store location {folder} is a file", "pass a folder or a .db path")
    if read_only:
        try:
            engine = sqlite_read_only_engine(db.resolve())
        except FileNotFoundError:
            raise StoreError(
                f"no store at {folder.resolve()} (nothing was recorded there)",
                "pass --store with the folder you recorded into, or record a run first",
            ) from None
        return Store(folder.resolve(), engine, read_only=True, objects=object_store)
    _make_folder(folder)
    return Store(folder.resolve(), sqlite_engine(db.resolve()), objects=object_store)


_SQLITE_REVISION_AND_VERSION = (
    "SELECT (SELECT version_num FROM alembic_version),"
    " (SELECT value FROM meta WHERE key = 'schema_version')"
)


def _revision_and_version(conn: Connection) -> tuple[str | None, str | None]:
    """(Alembic revision, ``meta.schema_version``) of the store behind ``conn``; the version is
    None when the revision is not :data:`migrate.HEAD` (it is read only then).

    On SQLite one statement through the driver (a store is opened once per trace: SQLAlchemy's
    table reflection and two compiled selects cost ~0.6 ms of the ~1 ms open); a missing table
    raises there, as the reflection-guarded reads find no revision: both send the caller to the
    migration path.

    Raises:
        SQLAlchemyError: the database cannot be read (or, on SQLite, lacks either table).
    """
    if conn.dialect.name == "sqlite":
        revision, version = conn.exec_driver_sql(_SQLITE_REVISION_AND_VERSION).one()
        return revision, version if revision == migrate.HEAD else None
    revision = migrate.current_revision(conn)
    return revision, _schema_version(conn) if revision == migrate.HEAD else None


def _sqlite_revision_and_version(engine: Engine) -> tuple[str | None, str | None]:
    """:func:`_revision_and_version` of a SQLite store, read on one of ``engine``'s pooled
    connections through the driver: one statement in autocommit mode (its own read transaction,
    ended when its rows are fetched), without a SQLAlchemy connection, ``BEGIN``/``COMMIT`` and
    result (~0.1 ms of the ~0.7 ms open of a store opened per trace, measured).

    Raises:
        sqlite3.Error: the database cannot be read, or lacks either table (a new store).
        SQLAlchemyError: the pool could not hand out a connection.
    """
    raw = engine.raw_connection()
    try:
        rows = raw.driver_connection.execute(_SQLITE_REVISION_AND_VERSION).fetchall()
    finally:
        raw.close()
    revision, version = rows[0]
    return revision, version if revision == migrate.HEAD else None


def _schema_version(conn: Connection) -> str | None:
    """``meta.schema_version`` of the store behind ``conn`` (None when it has none)."""
    row = conn.execute(
        select(schema.meta.c.value).where(schema.meta.c.key == "schema_version")
    ).first()
    return None if row is None else row[0]


def _make_folder(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"cannot create store folder {root}: {exc}", "pass a writable --store"
        ) from exc


OBJECTS_ENV = "REWIND_OBJECTS"
"""Environment variable naming the object store URL when ``open_store`` is not given one."""


def _objects(objects: str | ObjectStore | None) -> ObjectStore | None:
    if isinstance(objects, ObjectStore):
        return objects
    url = objects or os.environ.get(OBJECTS_ENV, "").strip()
    return ObjectStore(url) if url else None
