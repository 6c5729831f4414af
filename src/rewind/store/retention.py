"""Retention: ``rewind gc`` expires cache entries, archives old runs, deletes blobs no row names.

What goes, for an age ``A`` (``--older-than 30d``) and ``cutoff = now - A``:

- **Cache entries** (``llm_cache``, ``tool_cache``) not used since the cutoff. The caches have no
  "last used" column and the lookup path never writes (a hit must stay a read); an entry's last
  use is derived instead: the newest of its ``created_at`` and the ``started_at`` of every node
  whose call rows carry the entry's key (a hit, a miss that wrote it, a lineage hit of a fork),
  and the ``created_at`` of every replay stored by reference whose shared steps made that call
  (such a replay has no call rows of its own; :mod:`rewind.store.references`).
  An expired entry only costs a miss later: recorded runs keep their own call rows, which forks
  replay from (their lineage), so no recorded trajectory loses its cache hits.
- **Runs** finished (``completed`` or ``failed``) before the cutoff (a sub-run, the run of a Burr
  sub-application, only together with the run whose node spawned it), except every ancestor of a
  run that is kept (forks of forks: a kept fork keeps its parent, its parent's parent...). Runs
  still ``running`` or ``interrupted`` are never touched, nor their ancestors. Each archived run
  becomes one self-contained archive object under ``<archive URL>/archive/runs/<run_id>.json.gz``
  — its rows from every run-scoped table, the bytes of every blob they name, its artifact files
  — whose sha256 is kept in ``archived_runs``; the archive is read back and verified before the
  run's rows are deleted, and :func:`restore_run` puts the rows back exactly (same hashes).
  Node rows are immutable (rule 7): the delete runs under a permit row (``archive_permits``)
  that the nodes trigger checks, inserted and removed inside gc's own transaction.
- **Blobs** that no row names any more. Names are found conservatively: every 64-hex value or
  substring in any row of any table (JSON maps such as ``burr_state.fields_json`` included),
  plus every 64-hex string inside the node input/output/state documents and initial-state
  documents those rows name (they map fields to blob hashes; a traced step's state row is its
  state document). A false "reference" only keeps a blob.

Concurrent writers (another process recording while gc runs) are handled by ordering, not by
timing:

- The sweep runs in a write transaction that, on PostgreSQL, holds an advisory lock every
  write transaction holds shared (:data:`rewind.store.store.GC_LOCK_KEY`); on SQLite the
  database write lock does the same. So the references it scans include every committed row,
  and no writer commits between the scan and the delete.
- A writer that skips a blob because it believes it is stored (``Store._known_blobs``,
  :meth:`Store.knows_blob`) would write a dangling reference after a sweep. Each sweep bumps
  ``meta.blob_epoch``; every write transaction reads it, and on a change forgets its known
  blobs, writes every blob of its batch again (insert-or-ignore) and refuses (a clear
  :class:`StoreError`, nothing written) a batch that names a deleted blob whose bytes it does
  not carry, such as the result of a cache hit read just before the sweep.
- Objects (large blobs offloaded to the object store) are deleted in a second locked
  transaction, after their rows' deletion committed, and only when no blob row names them; a
  writer checks, under its lock, that the objects of the blob rows it inserts exist. A gc that
  dies halfway therefore leaks at most an object, never loses a referenced one.
- An archive is written before the transaction that deletes its run. When that transaction
  skips the run (a fork of it was recorded meanwhile, or the run was deleted), the archive is
  deleted after it, unless an ``archived_runs`` row names it (another gc archived the run at
  the same key); a run skipped because its rows changed keeps it (another gc may be about to
  name it; the next gc of the run writes over it). ``rewind delete`` leaves an object an older
  gc left at a deleted run's archive key (a leak, never a loss: a copy of the store sharing the
  object store may name it). A restore deletes the archive after its rows are back, the same
  way: not when a gc archived the run again there meanwhile. Left: a gc committing an archive
  of other bytes at that key between the check and the delete loses it (archive keys are not
  per store or per attempt).

Processes of a Rewind older than this module do not read the epoch: stop them before a gc.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote

from sqlalchemy import (
    BigInteger,
    Connection,
    Table,
    Text,
    cast,
    delete,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.exc import IntegrityError

from rewind.canonical import sha256_hex
from rewind.errors import RewindError, RunBusy, StoreError, UnknownRun
from rewind.store import schema
from rewind.store.codec import PACK_PREFIX, read_pack_ref, slice_key
from rewind.store.objects import ObjectStore
from rewind.store.references import REFERENCE_KEY, load_rows, reference_of
from rewind.store.store import (
    BLOB_EPOCH_KEY,
    GC_LOCK_KEY,
    RUNS_EPOCH_KEY,
    Store,
    dialect_insert,
    slice_row_ref,
)

PACK_SWEEP_KEY = "pack_sweep"
"""The ``meta`` row held while gc deletes blob packs (migration 0016's ``SWEEP_KEY``)."""
ARCHIVE_FORMAT = "rewind-run-archive"
ARCHIVE_VERSION = 1
ARCHIVABLE_STATUSES = ("completed", "failed", "cancelled")
"""Statuses of runs gc may archive; ``running`` and ``interrupted`` runs are left alone."""

RUN_TABLES: tuple[tuple[Table, str], ...] = (
    # (table, the column holding the run id), children before the runs row they reference.
    (schema.calls, "run_id"),
    (schema.effects, "run_id"),
    (schema.spans, "run_id"),
    (schema.audits, "run_id"),
    (schema.run_graphs, "run_id"),
    (schema.artifacts, "run_id"),
    (schema.burr_state, "app_id"),
    (schema.nodes, "run_id"),
    (schema.runs, "run_id"),
)
"""Every table holding rows of one run: an archive carries all of them (a test checks that every
table with a ``run_id`` column is listed)."""

NOT_REFERENCES = frozenset(
    {
        "blobs",
        "blob_data",
        "blob_packs",
        "blob_slices",
        "meta",
        "archived_runs",
        "archive_permits",
        "alembic_version",
    }
)
"""Tables whose values never name a blob that must be kept."""

_HEX64 = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_AGE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_CHUNK = 500


class InvalidAge(RewindError):
    """``--older-than`` is not an age such as ``30d``."""


def parse_age(value: str) -> float:
    """An age as seconds: a non-negative number and one unit, ``s m h d w`` (``30d``, ``12h``).

    Raises:
        InvalidAge: not of that form, or negative.
    """
    match = _AGE.match(value or "")
    if match is None:
        raise InvalidAge(
            f"--older-than {value!r} is not an age",
            "write a number and a unit: 30d, 12h, 90m, 45s or 2w",
        )
    amount = float(match.group(1))
    if amount < 0:
        raise InvalidAge(
            f"--older-than {value!r} is negative",
            "give an age of 0 or more, e.g. 30d (runs finished more than 30 days ago)",
        )
    return amount * _UNITS[match.group(2)]


@dataclass(frozen=True)
class ArchivedRun:
    """One run gc archived (or, in a dry run, would archive).

    ``rows`` counts its rows over every run-scoped table; ``blobs`` the blobs its archive carries;
    ``archive_bytes`` the archive object's size (bytes, gzip); ``archive_ref`` its URL (empty in a
    dry run); ``artifact_bytes`` the artifact files it carries.
    """

    run_id: str
    pipeline: str
    status: str
    created_at: float
    rows: int
    blobs: int
    archive_bytes: int
    archive_ref: str
    artifact_bytes: int


@dataclass
class GcReport:
    """What ``rewind gc`` did, or with ``dry_run`` would do. Sizes are bytes; times unix seconds.

    ``blob_bytes`` is the uncompressed size of the deleted blobs; ``objects_deleted`` how many of
    them lived in the object store. ``kept_ancestors`` are old runs kept because a kept run
    descends from them; ``left_unfinished`` old runs left because they are not finished;
    ``skipped`` runs gc meant to archive but did not (``{"run_id", "reason"}``).
    """

    dry_run: bool
    older_than_s: float
    cutoff: float
    archive_url: str
    llm_cache_expired: int = 0
    tool_cache_expired: int = 0
    archived: list[ArchivedRun] = field(default_factory=list)
    kept_ancestors: list[str] = field(default_factory=list)
    left_unfinished: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    blobs_deleted: int = 0
    blob_bytes: int = 0
    objects_deleted: int = 0

    def to_json(self) -> dict[str, Any]:
        """The report as JSON values (what ``rewind gc --json`` prints)."""
        return {
            "dry_run": self.dry_run,
            "older_than_s": self.older_than_s,
            "cutoff": self.cutoff,
            "archive_url": self.archive_url,
            "cache": {
                "llm_expired": self.llm_cache_expired,
                "tool_expired": self.tool_cache_expired,
            },
            "runs": {
                "archived": [asdict(a) for a in self.archived],
                "kept_ancestors": self.kept_ancestors,
                "left_unfinished": self.left_unfinished,
                "skipped": self.skipped,
            },
            "blobs": {
                "deleted": self.blobs_deleted,
                "bytes": self.blob_bytes,
                "objects_deleted": self.objects_deleted,
            },
        }


@dataclass(frozen=True)
class RestoredRun:
    """A run :func:`restore_run` brought back: its rows and blobs, and the archived ancestors it
    had to restore first (oldest first)."""

    run_id: str
    rows: int
    blobs: int
    ancestors: tuple[str, ...] = ()


def archive_store(store: Store, url: str | None = None) -> ObjectStore:
    """Where archives go: ``url``, else the store's object store, else ``<store folder>``
    (``file://``). Archives are written below ``archive/runs/`` of it.

    Raises:
        StoreError: the URL cannot be used (unknown protocol, missing fsspec package).
    """
    if url:
        return ObjectStore(url)
    if store.objects is not None:
        return store.objects
    return ObjectStore(f"file://{store.root}")


def collect_garbage(
    store: Store,
    older_than_s: float,
    *,
    dry_run: bool = False,
    archive: ObjectStore | None = None,
    now: float | None = None,
) -> GcReport:
    """Expire cache entries, archive old runs and delete unreferenced blobs (see the module doc).

    Args:
        store: a writable store (a dry run only reads it).
        older_than_s: the age in seconds (≥ 0): entries not used and runs not finished within it go.
        dry_run: compute and return the same report without writing anything (not to the
            database, not to the object store, not to the store's folder).
        archive: where archives are written (default :func:`archive_store`).
        now: the current time (unix seconds; tests pass a fixed one).
    Returns:
        the report.
    Raises:
        InvalidAge: ``older_than_s`` is negative.
        StoreError: the store is read-only, or an archive cannot be written or verified (the
            run's rows are then kept).
    """
    if older_than_s < 0:
        raise InvalidAge(f"the age {older_than_s} s is negative", "give an age of 0 or more")
    if store.read_only and not dry_run:
        raise StoreError(f"the store at {store.root} is open read-only", "open it writable")
    now = time.time() if now is None else now
    cutoff = now - older_than_s
    target = archive or archive_store(store)
    report = GcReport(dry_run, older_than_s, cutoff, target.url)
    with store.read() as conn:
        llm_keys, tool_keys = _expired_cache_keys(conn, cutoff)
        doomed, kept_ancestors, unfinished = _runs_to_archive(conn, cutoff)
    report.kept_ancestors = kept_ancestors
    report.left_unfinished = unfinished
    report.llm_cache_expired, report.tool_cache_expired = len(llm_keys), len(tool_keys)
    if not dry_run:
        _expire_cache(store, llm_keys, tool_keys, cutoff)
    archived: set[str] = set()
    for run_id in doomed:
        doc, blob_count, artifact_bytes = _archive_document(store, run_id)
        if not doc["tables"]["runs"]:
            # Archived (or deleted) by another process since the plan: its archive, if any, is
            # that process's, and an archive of no rows written at its key would replace it.
            report.skipped.append({"run_id": run_id, "reason": _GONE})
            continue
        data = _archive_bytes(doc)
        ref = ""
        if not dry_run:
            try:
                ref = _archive_and_delete(store, target, run_id, doc, data)
            except _Skip as exc:
                report.skipped.append({"run_id": run_id, "reason": str(exc)})
                continue
        archived.add(run_id)
        run = doc["tables"]["runs"][0]
        report.archived.append(
            ArchivedRun(
                run_id=run_id,
                pipeline=run["pipeline"],
                status=run["status"],
                created_at=run["created_at"],
                rows=sum(len(rows) for rows in doc["tables"].values()),
                blobs=blob_count,
                archive_bytes=len(data),
                archive_ref=ref,
                artifact_bytes=artifact_bytes,
            )
        )
    if dry_run:
        with store.read() as conn:
            refs = _referenced(
                conn, store, skip_runs=archived, skip_llm=set(llm_keys), skip_tool=set(tool_keys)
            )
            unreferenced = _unreferenced(conn, refs)
        report.blobs_deleted = len(unreferenced)
        report.blob_bytes = sum(size for size, _ref in unreferenced.values())
        report.objects_deleted = sum(1 for _size, ref in unreferenced.values() if ref)
    else:
        _sweep_blobs(store, report)
    return report


class _Skip(Exception):
    """A run gc meant to archive that must stay (a fork of it appeared meanwhile)."""


# -- cache expiry ------------------------------------------------------------------------------
def _expired_cache_keys(conn: Connection, cutoff: float) -> tuple[list[str], list[str]]:
    """Keys of the cache entries whose last use (see the module doc) is before ``cutoff``."""
    c, n = schema.calls, schema.nodes
    last_call = (
        select(c.c.key, func.max(n.c.started_at).label("used"))
        .select_from(c.join(n, (c.c.run_id == n.c.run_id) & (c.c.position == n.c.position)))
        .group_by(c.c.key)
        .subquery()
    )
    out: list[list[str]] = []
    for table in (schema.llm_cache, schema.tool_cache):
        rows = conn.execute(
            select(table.c.key)
            .select_from(table.outerjoin(last_call, table.c.key == last_call.c.key))
            .where(table.c.created_at < cutoff)
            .where((last_call.c.used.is_(None)) | (last_call.c.used < cutoff))
            .order_by(table.c.key)
        )
        out.append([r[0] for r in rows])
    if out[0] or out[1]:
        used = _keys_used_by_references(conn, cutoff)
        if used is None:  # a reference that cannot be resolved: expire nothing (conservative)
            return [], []
        out = [[k for k in keys if k not in used] for keys in out]
    return out[0], out[1]


def _keys_used_by_references(conn: Connection, cutoff: float) -> set[str] | None:
    """Cache keys used since ``cutoff`` by replays stored by reference
    (:mod:`rewind.store.references`): such a replay served the calls of the steps it shares
    with its source from the cache, but has no call rows of its own saying so. Its run's
    ``created_at`` is the time of those uses. None when a reference cannot be resolved (a
    damaged store, a chain too deep): the caller then expires nothing.
    """
    runs = schema.runs
    rows = conn.execute(
        select(runs.c.config_json)
        .where(runs.c.created_at >= cutoff)
        .where(runs.c.config_json.like(f'%"{REFERENCE_KEY}"%'))
    ).all()
    steps: dict[str, int] = {}  # source run -> how many of its leading steps were used
    for (config_json,) in rows:
        ref = reference_of(json.loads(config_json or "{}"))
        if ref is not None:
            steps[ref[0]] = max(steps.get(ref[0], 0), ref[1])
    used: set[str] = set()
    for source, k in steps.items():
        try:
            rows_of = load_rows(conn, source)
        except RuntimeError:
            return None
        for position, calls in rows_of.calls.items():
            if position < k:
                used.update(c["key"] for c in calls)
    return used


def _expire_cache(store: Store, llm_keys: list[str], tool_keys: list[str], cutoff: float) -> None:
    with store.write() as conn:
        for table, keys in ((schema.llm_cache, llm_keys), (schema.tool_cache, tool_keys)):
            for chunk in _chunks(keys):
                # created_at re-checked: an entry rewritten since the plan stays.
                conn.execute(
                    delete(table).where(table.c.key.in_(chunk)).where(table.c.created_at < cutoff)
                )


# -- which runs go -----------------------------------------------------------------------------
def _runs_to_archive(conn: Connection, cutoff: float) -> tuple[list[str], list[str], list[str]]:
    """(runs to archive, deepest forks first; old runs kept as ancestors of kept runs; old runs
    left because they are not finished)."""
    t = schema.runs
    rows = conn.execute(
        select(
            t.c.run_id,
            t.c.parent_run_id,
            t.c.spawning_run_id,
            t.c.status,
            t.c.created_at,
            t.c.finished_at,
        )
    ).all()
    # A sub-run (a Burr sub-application's run) hangs from the run whose node spawned it: it is
    # kept while that run is (its node lists it) and keeps that run while it is kept itself.
    parent = {r.run_id: r.parent_run_id or r.spawning_run_id for r in rows}
    spawner = {r.run_id: r.spawning_run_id for r in rows if r.spawning_run_id}
    old = {
        r.run_id
        for r in rows
        if r.status in ARCHIVABLE_STATUSES and (r.finished_at or r.created_at) < cutoff
    }
    unfinished = sorted(
        r.run_id
        for r in rows
        if r.status not in ARCHIVABLE_STATUSES and (r.finished_at or r.created_at) < cutoff
    )
    needed = _ancestors_of_kept(parent, old)
    doomed = old - needed
    changed = True
    while changed:  # a sub-run goes only with the run that spawned it
        kept_subs = {r for r in doomed if r in spawner and spawner[r] not in doomed}
        changed = bool(kept_subs)
        doomed -= kept_subs
        needed |= kept_subs
    order = sorted(doomed, key=lambda r: (-_depth(parent, r), r))
    return order, sorted(old & needed), unfinished


def _ancestors_of_kept(parent: dict[str, str | None], old: set[str]) -> set[str]:
    """Every ancestor (parent or spawning run) of a run that is not old: they must stay."""
    needed: set[str] = set()
    for run_id in parent:
        if run_id in old:
            continue
        up = parent.get(run_id)
        while up is not None and up not in needed:
            needed.add(up)
            up = parent.get(up)
    return needed


def _depth(parent: dict[str, str | None], run_id: str) -> int:
    """How many ancestors a run has."""
    d, up = 0, parent.get(run_id)
    while up is not None:
        d, up = d + 1, parent.get(up)
    return d


# -- archives ----------------------------------------------------------------------------------
def _json_value(value: Any) -> Any:
    if isinstance(value, bytes | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    return value


def _row_value(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"$bytes"}:
        return base64.b64decode(value["$bytes"])
    return value


_GONE = "archived or deleted by another process during the gc"


def _archive_document(store: Store, run_id: str) -> tuple[dict[str, Any], int, int]:
    """(the archive document of a run, how many blobs it carries, artifact bytes)."""
    with store.read() as conn:
        tables = _run_rows(conn, run_id)
        named: set[str] = set()
        for rows in tables.values():
            for row in rows:
                named.update(_hashes_in(row.values()))
        present = _existing_blobs(store, conn, named)
        maps = [h for h in _map_documents(tables) if h in present]
        for data in store.get_blobs(maps, conn).values():
            named.update(_HEX64.findall(data.decode("utf-8", "replace")))
        present = _existing_blobs(store, conn, named)
        blobs = store.get_blobs(sorted(present), conn)
    artifacts = []
    artifact_bytes = 0
    for row in tables.get("artifacts", []):
        path = store.root / row["path"]
        data = path.read_bytes() if path.is_file() else None
        if data is not None and sha256_hex(data) != row["sha256"]:
            data = None  # changed on disk since it was recorded: the row keeps the truth
        artifact_bytes += len(data or b"")
        artifacts.append(
            {
                "name": row["name"],
                "sha256": row["sha256"],
                "data": None if data is None else base64.b64encode(data).decode(),
            }
        )
    doc = {
        "format": ARCHIVE_FORMAT,
        "version": ARCHIVE_VERSION,
        "run_id": run_id,
        "tables": tables,
        "blobs": {h: base64.b64encode(blobs[h]).decode() for h in sorted(blobs)},
        "artifacts": artifacts,
    }
    return doc, len(blobs), artifact_bytes


def _run_rows(conn: Connection, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """A run's rows in every run-scoped table, as JSON values, by table name."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for table, column in reversed(RUN_TABLES):  # runs first: the order a restore inserts
        rows = conn.execute(
            select(table).where(table.c[column] == run_id).order_by(*table.primary_key.columns)
        ).all()
        tables[table.name] = [{k: _json_value(v) for k, v in r._mapping.items()} for r in rows]
    return tables


def _map_documents(tables: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Hashes of the blobs that are maps of field → blob hash (node input/output/state
    documents, a run's initial state), named by these rows."""
    found = [r["initial_state_hash"] for r in tables.get("runs", []) if r["initial_state_hash"]]
    for node in tables.get("nodes", []):
        # state_hash too: a traced step's state row is its state document (migration 0012)
        found += [h for h in (node["input_hash"], node["output_hash"], node["state_hash"]) if h]
    return found


def _archive_bytes(doc: dict[str, Any]) -> bytes:
    text_ = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return gzip.compress(text_.encode(), compresslevel=6, mtime=0)


_ARCHIVE_NAME_CHARS = 192
"""Longest quoted run id an archive key holds as is (a file name holds 255 bytes)."""


def _archive_key(run_id: str, *, hashed: bool = False) -> str:
    # One path segment whatever the id holds: a trace id is the caller's, and ``../x`` or
    # ``a/b`` would put the archive outside ``archive/runs/`` (a hex or UUID id reads as is).
    # Every ASCII id of a valid length quotes to at most 192 characters; a non-ASCII one can
    # quote to 768 (64 four-byte characters), more than a file name holds: it is named by its
    # hash instead (restore reads the recorded ref, whatever the key), as is one whose key an
    # older archive holds (``hashed``).
    name = quote(run_id, safe="")
    if hashed or len(name) > _ARCHIVE_NAME_CHARS:
        name = "sha256-" + sha256_hex(run_id.encode("utf-8", "surrogatepass"))
    return f"archive/runs/{name}.json.gz"


def _free_archive_key(store: Store, target: ObjectStore, run_id: str) -> str:
    """The key a run's archive is written at: :func:`_archive_key`, unless an archived run
    of another id already holds it. Keys were the bare id before they were quoted, so an
    archive of ``a%2Fb`` made then is at the key ``a/b`` has now: writing there would replace
    it and lose that run."""
    key = _archive_key(run_id)
    done = schema.archived_runs
    with store.read() as conn:
        taken = conn.execute(
            select(done.c.run_id).where(
                done.c.archive_ref == f"{target.url}/{key}", done.c.run_id != run_id
            )
        ).first()
    return key if taken is None else _archive_key(run_id, hashed=True)


def _archive_and_delete(
    store: Store, target: ObjectStore, run_id: str, doc: dict[str, Any], data: bytes
) -> str:
    """Write and verify a run's archive, then delete its rows (one transaction); returns the
    archive's URL. Artifact files are removed after the commit."""
    digest = sha256_hex(data)
    if _archived_now(store, run_id):
        # Another gc archived it after this one read its rows (a snapshot, or artifact files
        # read once that gc had removed them): its archive is at this key, and this one, of
        # other bytes, written over it would no longer match the hash its row recorded.
        raise _Skip(_GONE)
    ref = target.put_object(_free_archive_key(store, target, run_id), data)
    _read_archive(target, ref, digest)  # read back and verified before anything is deleted
    run = doc["tables"]["runs"][0]
    try:
        with store.write() as conn:
            if _run_rows(conn, run_id) != doc["tables"]:
                raise _Skip(_CHANGED)
            _delete_run_rows(conn, run_id)
            conn.execute(
                insert(schema.archived_runs).values(
                    run_id=run_id,
                    # a sub-run's archive hangs from its spawning run (restored with it)
                    parent_run_id=run["parent_run_id"] or run.get("spawning_run_id"),
                    pipeline=run["pipeline"],
                    status=run["status"],
                    created_at=run["created_at"],
                    archived_at=time.time(),
                    archive_ref=ref,
                    archive_sha256=digest,
                    archive_bytes=len(data),
                )
            )
    except IntegrityError as exc:  # a fork of it was recorded after the plan
        _drop_unnamed(store, target, ref, data)
        raise _Skip("a run recorded during the gc refers to it") from exc
    except _Skip:
        if not _run_exists(store, run_id):  # deleted meanwhile: no gc can archive it now
            _drop_unnamed(store, target, ref, data)
        # Its rows are there: another gc that read them afresh may be about to name this
        # object (its own, written at the same key); the next gc of the run writes over it.
        raise
    _remove_artifact_files(store, doc["tables"].get("artifacts", []))
    return ref


_CHANGED = "its rows changed during the gc (an audit, an artifact)"


def _drop_unnamed(store: Store, target: ObjectStore, ref: str, data: bytes) -> None:
    """Delete the archive object this gc wrote at ``ref`` for a run it then skipped, unless an
    archived-run row names it (another gc archived the run there: the object is that gc's).
    Without it the object stayed, named by no row, read and deleted by nothing. A gc that
    committed between the check and the delete finds its object put back, when the bytes are
    the ones it recorded (the same rows make the same archive)."""
    if _naming_row(store, ref) is not None:
        return
    with suppress(OSError):  # the object store is unreachable: it stays (a leak, no loss)
        target.delete(ref)
    row = _naming_row(store, ref)
    if row is not None and row.archive_sha256 == sha256_hex(data):
        target.put_object(ref[len(target.url) + 1 :], data)


def _naming_row(store: Store, ref: str) -> Any:
    """The archived-run row (run_id, archive_sha256) whose archive is at ``ref``, or None."""
    done = schema.archived_runs
    with store.read() as conn:
        return conn.execute(
            select(done.c.run_id, done.c.archive_sha256).where(done.c.archive_ref == ref)
        ).first()


def _run_exists(store: Store, run_id: str) -> bool:
    """Whether the run's row is in the store (committed by any process)."""
    runs = schema.runs
    with store.read() as conn:
        return (
            conn.execute(select(runs.c.run_id).where(runs.c.run_id == run_id)).first() is not None
        )


def _archived_now(store: Store, run_id: str) -> bool:
    """Whether an archived run row of ``run_id`` exists (committed by any process)."""
    done = schema.archived_runs
    with store.read() as conn:
        return (
            conn.execute(select(done.c.run_id).where(done.c.run_id == run_id)).first() is not None
        )


def _delete_run_rows(conn: Connection, run_id: str) -> None:
    """Delete a run's rows from every run-scoped table inside ``conn``'s transaction, under a
    permit row (node rows are immutable otherwise, rule 7), and bump ``meta.runs_epoch``
    (:data:`rewind.store.store.RUNS_EPOCH_KEY`: rows a process keeps for this run id are not
    the rows of a run stored under it later)."""
    conn.execute(insert(schema.archive_permits).values(run_id=run_id))
    for table, column in RUN_TABLES:
        conn.execute(delete(table).where(table.c[column] == run_id))
    permits = schema.archive_permits
    conn.execute(delete(permits).where(permits.c.run_id == run_id))
    _bump(conn, RUNS_EPOCH_KEY)


def _remove_artifact_files(store: Store, rows: Iterable[dict[str, Any]]) -> None:
    """Remove a deleted run's artifact files (and its folder, once empty)."""
    for row in rows:
        path = store.root / row["path"]
        path.unlink(missing_ok=True)
        with suppress(OSError):
            path.parent.rmdir()


def _read_archive(target: ObjectStore | None, ref: str, digest: str) -> dict[str, Any]:
    """The archive document at ``ref``, verified (the archive's sha256, then each blob's and
    artifact's).

    Raises:
        StoreError: missing, unreadable, altered, or not a Rewind run archive.
    """
    return _archive_at(target, ref, digest)[0]


def _archive_at(target: ObjectStore | None, ref: str, digest: str) -> tuple[dict[str, Any], bytes]:
    """(:func:`_read_archive`'s document, the archive's bytes)."""
    raw = _objects_of(ref, target).get_object(ref, digest)
    try:
        doc = json.loads(gzip.decompress(raw))
    except (OSError, ValueError) as exc:
        raise StoreError(
            f"the archive {ref} is not readable: {exc}", "restore it from a backup"
        ) from exc
    if doc.get("format") != ARCHIVE_FORMAT or doc.get("version") != ARCHIVE_VERSION:
        raise StoreError(f"{ref} is not a Rewind run archive of version {ARCHIVE_VERSION}", "")
    for h, b64 in doc["blobs"].items():
        if sha256_hex(base64.b64decode(b64)) != h:
            raise StoreError(f"blob {h[:12]} in the archive {ref} does not match its hash", "")
    return doc, raw


def _objects_of(ref: str, archive: ObjectStore | None) -> ObjectStore:
    """The object store holding the archive at ``ref``: ``archive`` when the URL is below it
    (its credentials and endpoint apply), else one opened from the URL itself."""
    if archive is not None and ref.startswith(archive.url + "/"):
        return archive
    return ObjectStore(ref.rsplit("/archive/runs/", 1)[0])


# -- delete ------------------------------------------------------------------------------------
class RunInUse(RunBusy):
    """A run cannot be deleted: it is running, a kept run descends from it, or it is a sub-run
    (it goes only with the run that spawned it)."""


@dataclass(frozen=True)
class DeletedRun:
    """What :func:`delete_run` removed: the run and the sub-runs its nodes spawned (deepest
    first), their rows over every run-scoped table, and the blobs no row named afterwards
    (``blob_bytes`` uncompressed)."""

    run_id: str
    sub_runs: tuple[str, ...]
    rows: int
    blobs_deleted: int
    blob_bytes: int
    objects_deleted: int

    def to_json(self) -> dict[str, Any]:
        """As JSON values (the API's answer, ``rewind delete --json``)."""
        return asdict(self) | {"sub_runs": list(self.sub_runs)}


def delete_run(store: Store, run_id: str, *, dry_run: bool = False) -> DeletedRun:
    """Delete a run for good (no archive) with gc's rules: never a run a kept run descends
    from (a fork of it, stored or archived), a sub-run only with the run that spawned it (they
    go together), never a ``running`` run; then the blobs no row names any more, as gc sweeps
    them.

    Args:
        store: a writable store.
        run_id: the run's full id.
        dry_run: check and count, delete nothing.
    Raises:
        UnknownRun: no such run.
        RunInUse: a sub-run, a running run (or one of its sub-runs running), or a run with forks
            (their ids in the message); nothing is deleted.
        StoreError: the store is read-only.
    """
    if store.read_only and not dry_run:
        raise StoreError(f"the store at {store.root} is open read-only", "open it writable")
    with store.read() as conn:
        doomed, artifacts, count = _deletion_plan(conn, run_id)
    if dry_run:
        return DeletedRun(doomed[-1], tuple(doomed[:-1]), count, 0, 0, 0)
    try:
        with store.write() as conn:
            doomed, artifacts, count = _deletion_plan(conn, run_id)  # again, under the lock
            for rid in doomed:
                _delete_run_rows(conn, rid)
    except IntegrityError as exc:  # a fork of it was recorded meanwhile (PostgreSQL)
        raise RunInUse(
            f"run {run_id[:12]} got a fork while it was being deleted",
            "delete the fork first",
        ) from exc
    _remove_artifact_files(store, artifacts)
    report = GcReport(False, 0.0, time.time(), "")
    _sweep_blobs(store, report)
    return DeletedRun(
        doomed[-1],
        tuple(doomed[:-1]),
        count,
        report.blobs_deleted,
        report.blob_bytes,
        report.objects_deleted,
    )


def _deletion_plan(conn: Connection, run_id: str) -> tuple[list[str], list[dict[str, Any]], int]:
    """(the run and its sub-runs, deepest first with the run last; their artifact rows; their
    row count) — or RunInUse / UnknownRun."""
    t = schema.runs
    row = conn.execute(select(t).where(t.c.run_id == run_id)).first()
    if row is None:
        raise UnknownRun(f"unknown run {run_id!r}", "list runs with `rewind runs`")
    if row.spawning_run_id:
        raise RunInUse(
            f"run {run_id[:12]} is a sub-run: it goes only with the run that spawned it",
            f"delete run {row.spawning_run_id[:12]} instead",
        )
    family = [run_id]
    frontier = [run_id]
    while frontier:  # the sub-runs its nodes spawned, and theirs
        subs = conn.execute(select(t.c.run_id).where(t.c.spawning_run_id.in_(frontier))).all()
        frontier = [r[0] for r in subs if r[0] not in family]
        family.extend(frontier)
    members = set(family)
    rows = conn.execute(select(t.c.run_id, t.c.status).where(t.c.run_id.in_(family))).all()
    running = sorted(r.run_id for r in rows if r.status in ("running", "queued"))
    if running:
        raise RunInUse(
            f"run {running[0][:12]} is still running",
            "cancel it (or wait for it to finish), then delete it",
        )
    forks = sorted(
        r[0]
        for r in conn.execute(select(t.c.run_id).where(t.c.parent_run_id.in_(family))).all()
        if r[0] not in members
    )
    a = schema.archived_runs
    forks += sorted(
        r[0]
        for r in conn.execute(select(a.c.run_id).where(a.c.parent_run_id.in_(family))).all()
        if r[0] not in members
    )
    if forks:
        shown = ", ".join(f[:12] for f in forks[:5]) + (" …" if len(forks) > 5 else "")
        raise RunInUse(
            f"run {run_id[:12]} has {len(forks)} fork(s) that descend from it: {shown}",
            "a run a kept run descends from is never deleted; delete its forks first",
        )
    count = 0
    artifacts: list[dict[str, Any]] = []
    for table, column in RUN_TABLES:
        count += conn.execute(
            select(func.count()).select_from(table).where(table.c[column].in_(family))
        ).scalar_one()
    art = schema.artifacts
    artifacts = [
        dict(r._mapping) for r in conn.execute(select(art).where(art.c.run_id.in_(family))).all()
    ]
    return list(reversed(family)), artifacts, count


# -- restore -----------------------------------------------------------------------------------
def archived_run_ids(store: Store, run_ids: Iterable[str]) -> set[str]:
    """Which of ``run_ids`` are archived (their rows gone, an archive holds them)."""
    ids = list(run_ids)
    if not ids:
        return set()
    t = schema.archived_runs
    with store.read() as conn:
        return {r[0] for r in conn.execute(select(t.c.run_id).where(t.c.run_id.in_(ids))).all()}


def archived_runs(store: Store) -> list[dict[str, Any]]:
    """The archived runs, newest archive first: run_id, parent_run_id, pipeline, status,
    created_at, archived_at (unix s), archive_ref, archive_sha256, archive_bytes."""
    t = schema.archived_runs
    with store.read() as conn:
        rows = conn.execute(select(t).order_by(t.c.archived_at.desc(), t.c.run_id)).all()
    return [dict(r._mapping) for r in rows]


def restore_run(store: Store, run_id: str, *, archive: ObjectStore | None = None) -> RestoredRun:
    """Bring an archived run back from its archive, exactly as it was (same rows, same hashes),
    restoring its archived ancestors first; the archive object is deleted afterwards.

    Args:
        store: a writable store.
        run_id: the archived run's id or a unique prefix of it (at least 4 characters).
        archive: the object store the archives were written to (default: read each from the URL
            recorded at archive time).
    Raises:
        UnknownRun: no archived run matches (or several do), or another process restored it
            meanwhile (it is in the store).
        StoreError: the archive is missing or altered (nothing is written), or its parent run is
            neither in the store nor archived.
    """
    row = _archived_row(store, run_id)
    chain = [row]
    while chain[-1]["parent_run_id"]:
        up = chain[-1]["parent_run_id"]
        with store.read() as conn:
            present = conn.execute(
                select(schema.runs.c.run_id).where(schema.runs.c.run_id == up)
            ).first()
        if present is not None:
            break
        chain.append(_archived_row(store, up, exact=True))
    restored: list[RestoredRun] = []
    for item in reversed(chain):  # the oldest ancestor first
        try:
            restored.append(_restore_one(store, item, archive))
        except (IntegrityError, StoreError) as exc:
            # Another process restored it between our read of its row and our write (its
            # rows are in, its archive object deleted): not damage, and nothing was written.
            if not _restored_elsewhere(store, item["run_id"]):
                raise
            if item is not row:  # an ancestor: present now, as this restore needs it
                continue
            raise UnknownRun(
                f"run {row['run_id']} was restored by another process meanwhile",
                f"it is in the store: rewind show {row['run_id']}",
            ) from exc
    last = restored[-1]
    subs = _restore_sub_runs(store, last.run_id, archive)
    return RestoredRun(
        last.run_id,
        last.rows + sum(r.rows for r in subs),
        last.blobs + sum(r.blobs for r in subs),
        tuple(r.run_id for r in restored[:-1]),
    )


def _restored_elsewhere(store: Store, run_id: str) -> bool:
    """Whether ``run_id`` is in the store and no longer archived (a restore finished)."""
    with store.read() as conn:
        in_store = conn.execute(
            select(schema.runs.c.run_id).where(schema.runs.c.run_id == run_id)
        ).first()
        archived = conn.execute(
            select(schema.archived_runs.c.run_id).where(schema.archived_runs.c.run_id == run_id)
        ).first()
    return in_store is not None and archived is None


def _restore_sub_runs(store: Store, run_id: str, archive: ObjectStore | None) -> list[RestoredRun]:
    """Restore the archived sub-runs a run's nodes spawned (they were archived with it), and
    theirs in turn; archived forks of the run stay archived."""
    t = schema.archived_runs
    with store.read() as conn:
        rows = [
            dict(r._mapping)
            for r in conn.execute(select(t).where(t.c.parent_run_id == run_id)).all()
        ]
    out: list[RestoredRun] = []
    for row in rows:
        doc = _read_archive(archive, row["archive_ref"], row["archive_sha256"])
        if doc["tables"]["runs"][0].get("spawning_run_id") != run_id:
            continue  # a fork of the run, archived on its own
        out.append(_restore_one(store, row, archive))
        out.extend(_restore_sub_runs(store, row["run_id"], archive))
    return out


def _archived_row(store: Store, run_id: str, *, exact: bool = False) -> dict[str, Any]:
    t = schema.archived_runs
    with store.read() as conn:
        row = conn.execute(select(t).where(t.c.run_id == run_id)).first()
        if row is None and exact:
            raise StoreError(
                f"run {run_id} is neither in the store nor archived",
                "the store is damaged: its fork chain is broken",
            )
        if row is None and len(run_id) >= 4:
            rows = conn.execute(
                select(t).where(t.c.run_id.startswith(run_id, autoescape=True)).limit(2)
            ).all()
            if len(rows) > 1:
                raise UnknownRun(
                    f"archived run id prefix {run_id!r} matches several runs",
                    "give more characters of the id (rewind archive list)",
                )
            row = rows[0] if rows else None
    if row is None:
        raise UnknownRun(
            f"no archived run {run_id!r}", "list archived runs with `rewind archive list`"
        )
    return dict(row._mapping)


def _restore_one(store: Store, row: dict[str, Any], archive: ObjectStore | None) -> RestoredRun:
    doc, raw = _archive_at(archive, row["archive_ref"], row["archive_sha256"])
    blobs = {h: base64.b64decode(b64) for h, b64 in doc["blobs"].items()}
    artifacts = []
    for item in doc["artifacts"]:
        data = None if item["data"] is None else base64.b64decode(item["data"])
        if data is not None and sha256_hex(data) != item["sha256"]:
            raise StoreError(f"artifact {item['name']} in the archive does not match its hash", "")
        artifacts.append((item, data))
    count = 0
    with store.write() as conn:
        blob_rows = [store._blob_row(h, data) for h, data in blobs.items()]
        for chunk in _chunks(blob_rows):
            store._insert_blobs(conn, chunk)
        for table, _column in reversed(RUN_TABLES):  # runs first (foreign keys)
            rows = doc["tables"].get(table.name, [])
            clean = [{k: _row_value(v) for k, v in r.items() if k in table.c} for r in rows]
            if clean:
                conn.execute(insert(table), clean)
            count += len(clean)
        done = schema.archived_runs
        conn.execute(delete(done).where(done.c.run_id == row["run_id"]))
    paths = {r["name"]: r["path"] for r in doc["tables"].get("artifacts", [])}
    for item, data in artifacts:
        if data is None:
            continue
        path = store.root / paths[item["name"]]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    with suppress(OSError, StoreError):  # the rows are back; a leftover archive is harmless
        # Unless a row names it: a gc that ran once the rows were back (the run is old, so at
        # once a candidate again) archived it at the same key; deleting that lost the run.
        ref = row["archive_ref"]
        _drop_unnamed(store, _objects_of(ref, archive), ref, raw)
    return RestoredRun(row["run_id"], count, len(blobs))


# -- blob sweep --------------------------------------------------------------------------------
def _hashes_in(values: Iterable[Any]) -> Iterator[str]:
    for value in values:
        if isinstance(value, str):
            if len(value) == 64:
                if _HEX64.fullmatch(value):
                    yield value
            elif len(value) > 64:
                yield from _HEX64.findall(value)


def _referenced(
    conn: Connection,
    store: Store,
    *,
    skip_runs: set[str] = frozenset(),  # type: ignore[assignment]
    skip_llm: set[str] = frozenset(),  # type: ignore[assignment]
    skip_tool: set[str] = frozenset(),  # type: ignore[assignment]
) -> set[str]:
    """Every blob hash any row names (rows of ``skip_*`` runs and cache keys left out: what a
    dry run pretends is already gone), plus the hashes inside the map documents they name."""
    run_column = {t.name: col for t, col in RUN_TABLES}
    skip_keys = {"llm_cache": skip_llm, "tool_cache": skip_tool}
    refs: set[str] = set()
    maps: set[str] = set()
    for table in schema.metadata.sorted_tables:
        if table.name in NOT_REFERENCES:
            continue
        col = run_column.get(table.name)
        for row in conn.execute(select(table)):
            m = row._mapping
            if col is not None and m[col] in skip_runs:
                continue
            if table.name in skip_keys and m["key"] in skip_keys[table.name]:
                continue
            refs.update(_hashes_in(m.values()))
            if table.name == "nodes":
                maps.update(h for h in (m["input_hash"], m["output_hash"], m["state_hash"]) if h)
            elif table.name == "runs" and m["initial_state_hash"]:
                maps.add(m["initial_state_hash"])
    present = _existing_blobs(store, conn, maps)
    for chunk in _chunks(sorted(present)):
        for data in store.get_blobs(chunk, conn).values():
            refs.update(_HEX64.findall(data.decode("utf-8", "replace")))
    return refs


def _existing_blobs(store: Store, conn: Connection, digests: Iterable[str]) -> set[str]:
    """Which of ``digests`` the store holds (a ``blobs`` row, or a ``blob_slices`` row whose
    bytes match the hash).

    Raises:
        StoreError: a slice under one of their keys is damaged (gc and archives stop rather
            than go on without the blobs it holds or names)."""
    return store._stored_of(conn, sorted(set(digests)), strict=True)


def _unreferenced(conn: Connection, refs: set[str]) -> dict[str | bytes, tuple[int, str | None]]:
    """Blob rows no reference names: hash (``blobs``) or key (``blob_slices``) → (size in
    bytes, object URL or None). A ``blob_slices`` row stays while a reference shares its key
    (the first bytes of a hash, migration 0016): it may be that blob's, and a slice kept too
    long costs a few bytes where one deleted too soon loses a blob."""
    t, s = schema.blobs, schema.blob_slices
    out: dict[str | bytes, tuple[int, str | None]] = {
        r.hash: (r.size, r.ref if r.codec == "object" else None)
        for r in conn.execute(select(t.c.hash, t.c.size, t.c.codec, t.c.ref))
        if r.hash not in refs
    }
    keys = {slice_key(h) for h in refs}
    for key, ref in conn.execute(select(s.c.key, s.c.ref)):
        if bytes(key) not in keys:
            out[bytes(key)] = (slice_row_ref(key, ref)[4], None)
    return out


def _delete_unused_packs(conn: Connection) -> None:
    """Delete the blob packs no blob row or slice names any more (migrations 0012, 0016)."""
    t, s, p = schema.blobs, schema.blob_slices, schema.blob_packs
    used = {
        read_pack_ref(r[0])[0]
        for r in conn.execute(select(t.c.data).where(t.c.codec.like(PACK_PREFIX + "%")))
    }
    used.update(slice_row_ref(k, r)[1] for k, r in conn.execute(select(s.c.key, s.c.ref)))
    unused = [r[0] for r in conn.execute(select(p.c.id)) if r[0] not in used]
    if not unused:
        return
    # Migration 0016's trigger refuses pack deletes outside this marker (an older Rewind's gc)
    m = schema.meta
    conn.execute(insert(m).values(key=PACK_SWEEP_KEY, value="1"))
    for chunk in _chunks(unused):
        conn.execute(delete(p).where(p.c.id.in_(chunk)))
    conn.execute(delete(m).where(m.c.key == PACK_SWEEP_KEY))


def _lock_out_writers(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": GC_LOCK_KEY})


def _sweep_blobs(store: Store, report: GcReport) -> None:
    """Delete unreferenced blob rows (one locked transaction, bumping the blob epoch), then the
    objects no blob row names any more (a second locked transaction)."""
    with _exclusive(store) as conn:
        refs = _referenced(conn, store)
        doomed = _unreferenced(conn, refs)
        hashes = sorted(h for h in doomed if isinstance(h, str))
        for chunk in _chunks(hashes):
            conn.execute(delete(schema.blobs).where(schema.blobs.c.hash.in_(chunk)))
            conn.execute(delete(schema.blob_data).where(schema.blob_data.c.hash.in_(chunk)))
        s = schema.blob_slices
        for keys in _chunks(sorted(k for k in doomed if isinstance(k, bytes))):
            conn.execute(delete(s).where(s.c.key.in_(keys)))
        _delete_unused_packs(conn)
        if doomed:
            bump_blob_epoch(conn)
    report.blobs_deleted = len(doomed)
    report.blob_bytes = sum(size for size, _ref in doomed.values())
    objects = {h: ref for h, (_size, ref) in doomed.items() if ref and isinstance(h, str)}
    if not objects:
        return
    with _exclusive(store) as conn:
        back = _existing_blobs(store, conn, objects)
        for digest, ref in objects.items():
            if digest in back:
                continue  # written again by a writer since: its object is needed
            try:
                store._object_store_for(ref).delete(ref)
            except (OSError, StoreError):
                continue
            report.objects_deleted += 1


@contextmanager
def _exclusive(store: Store) -> Iterator[Connection]:
    """A write transaction no other writer runs beside (see the module doc)."""
    with store.engine.connect().execution_options(immediate=True) as conn, conn.begin():
        _lock_out_writers(conn)
        yield conn


def bump_blob_epoch(conn: Connection) -> None:
    """Bump ``meta.blob_epoch`` inside ``conn``'s write transaction: every writer then stops
    trusting the blobs it remembers as stored (see the module doc)."""
    _bump(conn, BLOB_EPOCH_KEY)


def _bump(conn: Connection, key: str) -> None:
    """Add one to the counter ``meta.<key>`` (made at 1) inside ``conn``'s write transaction, in
    one statement: deletions run side by side under the shared gc lock on PostgreSQL, and a
    read then a write let two of them insert the counter at once (the second failed) or write
    the same next value (the second deletion did not move the epoch)."""
    m = schema.meta
    stmt = dialect_insert(conn.dialect.name, m).values(key=key, value="1")
    added = cast(cast(m.c.value, BigInteger) + 1, Text)
    conn.execute(stmt.on_conflict_do_update(index_elements=[m.c.key], set_={"value": added}))


def _chunks(items: list[Any]) -> Iterator[list[Any]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


__all__ = [
    "ARCHIVABLE_STATUSES",
    "RUN_TABLES",
    "ArchivedRun",
    "DeletedRun",
    "GcReport",
    "InvalidAge",
    "RestoredRun",
    "RunInUse",
    "archive_store",
    "archived_runs",
    "bump_blob_epoch",
    "collect_garbage",
    "delete_run",
    "parse_age",
    "restore_run",
]
