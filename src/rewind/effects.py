"""Side effects: fingerprints of the resources a tool touches, pinned snapshots, idempotency salts.

Same output is not the same effect (seed 004): a tool can return an identical result while it
left the world in a different state. So every side-effecting tool declares the resources it
touches; Rewind fingerprints each one before and after every call (content hash, row-version or
ETag, plus an *epoch* — when or at which version that state was observed) and keeps a pinned
snapshot of the pre-state where the resource can provide one. The audit (:mod:`rewind.audit`)
compares post-call fingerprints; replay in ``live`` mode re-executes only when the resource's
pre-state matches the recorded one (or after restoring the pinned snapshot).
"""

from __future__ import annotations

import abc
import base64
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from rewind.canonical import canonical_bytes, key_of, sha256_hex
from rewind.context import LineageEntry, NodeScope, RunContext, current
from rewind.errors import RewindError
from rewind.store.records import CallRecord

if TYPE_CHECKING:
    from rewind.cache import Call, CallPolicy

EFFECT_MODES = ("recorded", "dry-run", "live")
"""How a replay treats side-effecting calls: serve the recorded result (default), log the call and
execute nothing, or re-execute against a verified (or restored) pre-state."""

ABSENT = "absent"
"""Fingerprint digest of a resource that does not exist."""


@dataclass(frozen=True)
class Fingerprint:
    """The state of one resource at one moment.

    Attributes:
        digest: sha256 hex of the resource's content (``"absent"`` when it does not exist).
        epoch: when/at which version this state was observed, as the resource tells it (a file
            tree's newest mtime in ns, a database's data version, an HTTP ``Last-Modified``);
            ``None`` when the resource has no notion of it. Two fingerprints with equal digests
            but different epochs are different states (same rows, another epoch).
    """

    digest: str
    epoch: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"digest", "epoch"}``."""
        return {"digest": self.digest, "epoch": self.epoch}


class Fingerprinter(abc.ABC):
    """A resource a side-effecting tool touches, able to fingerprint (and maybe snapshot) itself.

    Implementations: :class:`FileTree`, :class:`SQLiteTable`, :class:`HttpResource`.
    """

    kind: str = "resource"

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """A stable, human-readable name (``file:/path``, ``sqlite:/db#table``, a URL)."""

    @abc.abstractmethod
    def fingerprint(self) -> Fingerprint:
        """The resource's current state. Never raises for an absent resource."""

    def snapshot(self) -> bytes | None:
        """Bytes that :meth:`restore` can turn back into the current state; None if unsupported."""
        return None

    def spec(self) -> dict[str, Any]:
        """The settings that rebuild this fingerprinter (recorded with each effect row)."""
        return {}

    def restore(self, snapshot: bytes) -> None:
        """Put the resource back into a snapshotted state.

        Raises:
            RewindError: this resource cannot be restored.
        """
        raise RewindError(f"{self.name} cannot be restored from a snapshot", "")


class FileTree(Fingerprinter):
    """A file or a directory tree: the sha256 of every file's content with paths relative to the
    root (so the same content at another location fingerprints the same). Epoch: newest mtime (ns).

    Args:
        path: the file or directory.
    """

    kind = "file-tree"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def name(self) -> str:
        return f"file:{self.path}"

    def spec(self) -> dict[str, Any]:
        return {"path": str(self.path)}

    def _files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        if self.path.is_dir():
            return sorted(p for p in self.path.rglob("*") if p.is_file())
        return []

    def _rel(self, p: Path) -> str:
        return p.name if p == self.path else p.relative_to(self.path).as_posix()

    def fingerprint(self) -> Fingerprint:
        if not self.path.exists():
            return Fingerprint(ABSENT, None)
        files = self._files()
        listing = {self._rel(p): sha256_hex(p.read_bytes()) for p in files}
        epoch = str(max((p.stat().st_mtime_ns for p in files), default=0))
        return Fingerprint(sha256_hex(canonical_bytes(listing)), epoch)

    def snapshot(self) -> bytes:
        if not self.path.exists():
            return canonical_bytes({"absent": True})
        files = {self._rel(p): base64.b64encode(p.read_bytes()).decode() for p in self._files()}
        return canonical_bytes({"dir": self.path.is_dir(), "files": files})

    def restore(self, snapshot: bytes) -> None:
        doc = json.loads(snapshot)
        if self.path.is_dir():
            for p in sorted(self.path.rglob("*"), reverse=True):
                p.unlink() if p.is_file() else p.rmdir()
        elif self.path.exists():
            self.path.unlink()
        if doc.get("absent"):
            if self.path.is_dir():
                self.path.rmdir()
            return
        if not doc["dir"]:
            (content,) = doc["files"].values()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(base64.b64decode(content))
            return
        self.path.mkdir(parents=True, exist_ok=True)
        for rel, content in doc["files"].items():
            target = self.path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(base64.b64decode(content))


class SQLiteTable(Fingerprinter):
    """A table of a SQLite database: row count + sha256 of its rows ordered by primary key.

    Args:
        db_path: the database file.
        table: table name (a plain identifier).
        order_by: the primary key column(s), comma-separated.
        epoch_sql: optional query returning the database's epoch (e.g. ``SELECT max(version)
            FROM meta`` or ``PRAGMA user_version``); part of the fingerprint, so identical rows
            read from another epoch do not pass as the same state.
    """

    kind = "sqlite-table"

    def __init__(
        self, db_path: str | Path, table: str, order_by: str = "rowid", epoch_sql: str | None = None
    ) -> None:
        if not table.replace("_", "").isalnum():
            raise ValueError(f"table must be a plain identifier, not {table!r}")
        self.db_path = Path(db_path)
        self.table = table
        self.order_by = order_by
        self.epoch_sql = epoch_sql

    @property
    def name(self) -> str:
        return f"sqlite:{self.db_path}#{self.table}"

    def spec(self) -> dict[str, Any]:
        return {
            "db_path": str(self.db_path),
            "table": self.table,
            "order_by": self.order_by,
            "epoch_sql": self.epoch_sql,
        }

    def fingerprint(self) -> Fingerprint:
        if not self.db_path.exists():
            return Fingerprint(ABSENT, None)
        con = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True)
        try:
            try:
                rows = con.execute(
                    f"SELECT * FROM {self.table} ORDER BY {self.order_by}"
                ).fetchall()
            except sqlite3.OperationalError:
                return Fingerprint(ABSENT, None)
            epoch = None
            if self.epoch_sql:
                value = con.execute(self.epoch_sql).fetchone()
                epoch = None if value is None else str(value[0])
        finally:
            con.close()
        body = canonical_bytes({"count": len(rows), "rows": [list(_plain(r)) for r in rows]})
        digest = sha256_hex(body) if epoch is None else key_of(body, epoch)
        return Fingerprint(digest, epoch)


def _plain(row: tuple[Any, ...]) -> list[Any]:
    return [v.hex() if isinstance(v, bytes) else v for v in row]


class HttpResource(Fingerprinter):
    """An HTTP resource: its ``ETag`` when the server sends one, else the sha256 of the body.

    Args:
        url: the resource's URL.
        client: an ``httpx.Client`` (tests pass one with a MockTransport); a new one otherwise.
    """

    kind = "http"

    def __init__(self, url: str, client: httpx.Client | None = None) -> None:
        self.url = url
        self.client = client

    @property
    def name(self) -> str:
        return self.url

    def spec(self) -> dict[str, Any]:
        return {"url": self.url}

    def fingerprint(self) -> Fingerprint:
        client = self.client or httpx.Client(timeout=10.0)
        try:
            response = client.get(self.url)
        except httpx.HTTPError:
            return Fingerprint(ABSENT, None)
        finally:
            if self.client is None:
                client.close()
        if response.status_code == 404:
            return Fingerprint(ABSENT, None)
        etag = response.headers.get("etag")
        epoch = response.headers.get("last-modified") or etag
        digest = key_of("etag", etag) if etag else sha256_hex(response.content)
        return Fingerprint(digest, epoch)


def idempotency_key(base: str) -> str:
    """An idempotency key salted per replay attempt.

    A key consumed by the original run must not let a replay look perfect by returning the
    cached original (seed 004, third class): inside a run the key is
    ``sha256(len-prefixed base, run id)``, so every run and every replay attempt gets its own.
    Outside a run it is the base unchanged. Declare the argument that carries it with
    ``@tool(..., idempotency_arg=...)`` so it stays out of the cache key.
    """
    ctx = current()
    if ctx is None:
        return base
    return key_of("idempotency/v1", base, ctx.run_id)


class SideEffectBlocked(RewindError):
    """A replay in ``recorded`` mode reached a side-effecting call it has no record of."""


class EffectPreconditionFailed(RewindError):
    """``live`` replay: the resource's pre-state differs from the recorded one, with no snapshot."""


def side_effect_call(ctx: RunContext, call: Call) -> tuple[bytes, CallRecord]:
    """Run (or serve, or skip) one side-effecting call according to the run's effects mode.

    Recording executes the call with pre/post fingerprints of every declared resource and a
    pinned pre-state snapshot. A replay never re-executes silently:

    - ``recorded`` (default): serve the result the source trajectory recorded for these exact
      arguments (``served:side-effect-recorded``; the audit verdict is ``not-re-executed``). A
      call whose arguments changed upstream has no record: :class:`SideEffectBlocked`.
    - ``dry-run``: log the intended call, execute nothing; the recorded result is returned when
      there is one, else ``{"dry_run": true, "tool": name, "request_sha256": …}``.
    - ``live``: re-execute, but only after each resource's pre-state fingerprint matches the
      recorded pre-state (or after restoring the recorded pinned snapshot);
      :class:`EffectPreconditionFailed` otherwise.

    Side-effect results are kept as blobs on the run but never become shared cache entries, and
    hash-stability runs always serve them from record.
    """
    from rewind.cache import execute_call

    scope = ctx.node
    policy, key, index = call.policy, call.key, call.index
    entry = ctx.lineage.get(key) if ctx.read_cache or not ctx.write_cache else None
    mode = "record" if not ctx.read_cache and ctx.write_cache else ctx.effects_mode
    if not ctx.write_cache:
        # Stability runs never repeat effects: serve the record, or log the call when its
        # arguments spread upstream (there is then no record to serve).
        mode = "recorded" if entry is not None else "dry-run"
    resources: list[Fingerprinter] = [r for r in policy.resources if isinstance(r, Fingerprinter)]
    where = f"node {scope.name!r}: " if scope is not None else ""

    if mode == "recorded" or (mode == "dry-run" and entry is not None):
        if entry is None:
            raise SideEffectBlocked(
                f"{where}side-effecting tool {call.name!r} is called with arguments the source "
                "run never used, so there is no recorded result to serve",
                "replay with --effects live (re-execute against a verified pre-state) or "
                "--effects dry-run (log the call, execute nothing)",
            )
        data = ctx.lineage_blobs.get(entry.result_hash) or ctx.store.get_blob(entry.result_hash)
        outcome, reason = (
            ("served", "side-effect-recorded")
            if mode == "recorded"
            else ("dry-run", "side-effect-dry-run")
        )
        record = call.record(entry.result_hash, outcome, reason, produced_at=entry.produced_at)
        if mode == "recorded" and policy.on_served is not None:
            policy.on_served(call.request, data)
        _effect_rows(ctx, scope, index, resources, mode, None, None, None, policy)
    elif mode == "dry-run":
        data = canonical_bytes(
            {"dry_run": True, "tool": call.name, "request_sha256": call.request_hash}
        )
        record = call.record(
            sha256_hex(data), "dry-run", "side-effect-dry-run", produced_at=ctx.clock()
        )
        _effect_rows(ctx, scope, index, resources, mode, None, None, None, policy)
        if scope is not None:
            scope.pending[f"dry-run:{key}:{index}"] = call.pending(
                record.result_hash or "", data, cacheable=False, produced_at=None
            )
    else:
        pre = {r.name: r.fingerprint() for r in resources}
        if mode == "live" and entry is not None:
            pre = _verify_pre_state(ctx, entry, resources, pre, where, call.name)
        # Pinned after any restore: the snapshot is the pre-state this call really ran against.
        snapshots = {r.name: r.snapshot() for r in resources}
        reason = "bypass" if mode == "record" else "side-effect-live"
        # Two identical side-effecting calls are two effects: keep both results.
        data, record = execute_call(
            ctx,
            scope,
            call,
            "miss",
            reason,
            cacheable=False,
            pending_key=f"effect:{key}:{index}",
        )
        post = {r.name: r.fingerprint() for r in resources}
        _effect_rows(ctx, scope, index, resources, mode, pre, post, snapshots, policy)
    if scope is not None:
        scope.add_call(record)
    return data, record


def _verify_pre_state(
    ctx: RunContext,
    entry: LineageEntry,
    resources: list[Fingerprinter],
    pre: dict[str, Fingerprint],
    where: str,
    name: str,
) -> dict[str, Fingerprint]:
    recorded = {
        e.resource: e
        for e in ctx.store.effects_of(entry.run_id)
        if e.position == entry.position and e.call_index == entry.call_index
    }
    for r in resources:
        rec = recorded.get(r.name)
        if rec is None or rec.pre_digest == pre[r.name].digest:
            continue
        if rec.snapshot_hash is not None:
            r.restore(ctx.store.get_blob(rec.snapshot_hash))
            pre[r.name] = r.fingerprint()
            if pre[r.name].digest == rec.pre_digest:
                continue
        raise EffectPreconditionFailed(
            f"{where}{r.name} is not in the state {name!r} was recorded against "
            f"(pre-state {pre[r.name].digest[:12]} vs recorded {str(rec.pre_digest)[:12]})",
            "restore the resource, or replay with --effects recorded or --effects dry-run",
        )
    return pre


def _effect_rows(
    ctx: RunContext,
    scope: NodeScope | None,
    index: int,
    resources: list[Fingerprinter],
    mode: str,
    pre: dict[str, Fingerprint] | None,
    post: dict[str, Fingerprint] | None,
    snapshots: dict[str, bytes | None] | None,
    policy: CallPolicy,
) -> None:
    if scope is None:
        return
    for r in resources:
        snap = (snapshots or {}).get(r.name)
        snap_hash = sha256_hex(snap) if snap is not None else None
        scope.effects.append(
            {
                "run_id": ctx.run_id,
                "position": scope.position,
                "call_index": index,
                "resource": r.name,
                "kind": r.kind,
                "mode": mode,
                "pre_digest": pre[r.name].digest if pre else None,
                "pre_epoch": pre[r.name].epoch if pre else None,
                "post_digest": post[r.name].digest if post else None,
                "post_epoch": post[r.name].epoch if post else None,
                "snapshot_hash": snap_hash,
                "idempotency_key": policy.idempotency_key,
                "spec_json": canonical_bytes(r.spec()).decode() if r.spec() else None,
                "_snapshot": snap,
            }
        )
