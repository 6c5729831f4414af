"""Side effects: fingerprints of the resources a tool touches, pinned snapshots, idempotency salts.

Same output is not the same effect (seed 004): a tool can return an identical result while it
left the world in a different state. So every side-effecting tool declares the resources it
touches; Rewind fingerprints each one before and after every call (content hash, row-version or
ETag, plus an *epoch* — when or at which version that state was observed) and keeps a pinned
snapshot of the pre-state where the resource can provide one. The audit (:mod:`rewind.audit`)
compares (output, post-state) pairs; replay in ``live`` mode re-executes only when the same
resource's pre-state matches the one recorded at the call's slot (or after restoring the pinned
snapshot), one writer per resource at a time.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from rewind.canonical import canonical_bytes, key_of, sha256_hex
from rewind.context import LineageEntry, NodeScope, RunContext, current
from rewind.errors import ContextLost, RewindError
from rewind.store.records import CallRecord, EffectRecord

if TYPE_CHECKING:
    from rewind.cache import Call, CallPolicy

EFFECT_MODES = ("recorded", "dry-run", "live")
"""How a replay treats side-effecting calls: serve the recorded result (default), log the call and
execute nothing, or re-execute against a verified (or restored) pre-state."""

ABSENT = "absent"
"""Fingerprint digest of a resource that does not exist."""

RESTORE_MODES = ("refuse", "replace")
"""What a ``live`` restore does with files the pinned snapshot does not hold: ``refuse`` (the
default: the restore stops and names them, nothing is touched) or ``replace`` (they are deleted;
the user asked for it explicitly with ``--restore=replace``)."""


class FingerprintUnavailable(RewindError):
    """A resource cannot be fingerprinted now (unreachable, non-2xx answer, permission denied).

    Never a digest: an error page or a connection failure is not the resource's state (seed 004:
    absence of a mismatch is not evidence of a match). The audit turns it into
    ``audit-incomplete``; a ``live`` replay refuses to re-execute against it.
    """


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
        """The resource's current state. Never raises for an absent resource.

        Raises:
            FingerprintUnavailable: the state cannot be read now (unreachable, non-2xx,
                permission denied).
        """

    def snapshot(self) -> bytes | None:
        """Bytes that :meth:`restore` can turn back into the current state; None if unsupported."""
        return None

    def spec(self) -> dict[str, Any]:
        """The settings that rebuild this fingerprinter (recorded with each effect row)."""
        return {}

    def changes_from(self, snapshot: bytes) -> list[str]:
        """What differs now from a snapshot, one short text per entry (``changed a.txt``);
        empty when the resource cannot say."""
        return []

    def restore(self, snapshot: bytes, *, replace: bool = False) -> None:
        """Put the resource back into a snapshotted state, atomically (a failure leaves the
        state it found).

        Args:
            snapshot: bytes from :meth:`snapshot`.
            replace: delete data the snapshot does not hold; without it such data makes the
                restore refuse (restore never destroys data silently).
        Raises:
            EffectPreconditionFailed: data outside the snapshot would be destroyed.
            RewindError: this resource cannot be restored.
        """
        raise RewindError(f"{self.name} cannot be restored from a snapshot", "")


class FileTree(Fingerprinter):
    """A file or a directory tree: the sha256 of every file's content with paths relative to the
    root (so the same content at another location fingerprints the same). Epoch: newest mtime (ns).

    Inside a directory nothing is followed: a symbolic link is part of the tree as the link
    (its target path), never as the file or folder it points to, so a link out of the folder
    does not make another place part of its state. Empty folders, links and other entries
    (FIFOs, sockets) count as content too. The pinned snapshot keeps files, their permission
    bits, links and empty folders; a tree with other entries, or whose files hold more than
    :attr:`max_snapshot_bytes`, gets no snapshot (a ``live`` replay then refuses on drift).

    Args:
        path: the file or directory (a link given here is followed: it is what was declared).
    """

    kind = "file-tree"
    max_snapshot_bytes: int = 64 * 1024 * 1024
    """Largest total file size (bytes) a pinned snapshot holds; a bigger tree is fingerprinted
    (streamed) but not snapshotted."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def name(self) -> str:
        return f"file:{self.path}"

    def spec(self) -> dict[str, Any]:
        return {"path": str(self.path)}

    def _entries(self) -> list[tuple[str, str, os.stat_result, Path]]:
        """``(relative path, kind, lstat, path)`` of every entry, in path order; kind is
        ``file``, ``link``, ``dir`` (only empty folders: the others are implied by what they
        hold) or ``other``. Raises OSError when something cannot be read."""
        if self.path.is_file():
            return [(self.path.name, "file", self.path.stat(), self.path)]
        if not self.path.is_dir():
            return []
        out: list[tuple[str, str, os.stat_result, Path]] = []

        def walk(folder: Path, prefix: str) -> bool:
            with os.scandir(folder) as it:
                found = sorted(it, key=lambda e: e.name)
            for entry in found:
                rel, p = prefix + entry.name, Path(entry.path)
                st = p.lstat()
                if stat.S_ISLNK(st.st_mode):
                    out.append((rel, "link", st, p))
                elif stat.S_ISDIR(st.st_mode):
                    if not walk(p, rel + "/"):
                        out.append((rel, "dir", st, p))
                elif stat.S_ISREG(st.st_mode):
                    out.append((rel, "file", st, p))
                else:
                    out.append((rel, "other", st, p))
            return bool(found)

        walk(self.path, "")
        return sorted(out, key=lambda e: e[0])

    def fingerprint(self) -> Fingerprint:
        try:
            if not self.path.exists():
                return Fingerprint(ABSENT, None)
            entries = self._entries()
            listing: dict[str, Any] = {}
            for rel, kind, st, p in entries:
                if kind == "file":
                    listing[rel] = _file_sha256(p)
                elif kind == "link":
                    listing[rel] = {"symlink": os.readlink(p)}
                elif kind == "dir":
                    listing[rel] = {"dir": True}
                else:
                    listing[rel] = {"special": stat.S_IFMT(st.st_mode)}
            epoch = str(max((st.st_mtime_ns for _, k, st, _ in entries if k == "file"), default=0))
        except OSError as exc:
            raise FingerprintUnavailable(
                f"cannot read {self.name}: {exc.strerror or exc}",
                "give this user read access to the folder, then audit or replay again",
            ) from exc
        return Fingerprint(sha256_hex(canonical_bytes(listing)), epoch)

    def snapshot(self) -> bytes | None:
        if not self.path.exists():
            return canonical_bytes({"absent": True})
        entries = self._entries()
        size = sum(st.st_size for _, kind, st, _ in entries if kind == "file")
        if size > self.max_snapshot_bytes or any(kind == "other" for _, kind, _, _ in entries):
            return None
        files = {
            rel: base64.b64encode(p.read_bytes()).decode()
            for rel, kind, _, p in entries
            if kind == "file"
        }
        modes = {rel: stat.S_IMODE(st.st_mode) for rel, kind, st, _ in entries if kind == "file"}
        links = {rel: os.readlink(p) for rel, kind, _, p in entries if kind == "link"}
        dirs = [rel for rel, kind, _, _ in entries if kind == "dir"]
        return canonical_bytes(
            {
                "dir": self.path.is_dir(),
                "files": files,
                "modes": modes,
                "links": links,
                "dirs": dirs,
            }
        )

    def changes_from(self, snapshot: bytes) -> list[str]:
        doc = json.loads(snapshot)
        files: dict[str, str] = {} if doc.get("absent") else doc["files"]
        links: dict[str, str] = {} if doc.get("absent") else doc.get("links", {})
        dirs = set() if doc.get("absent") else set(doc.get("dirs", []))
        now = {rel: (kind, p) for rel, kind, _, p in self._entries()}
        out = []
        for rel in sorted(set(now) | set(files) | set(links) | dirs):
            kind, p = now.get(rel, ("", None))
            if p is None:
                out.append(f"removed {rel}")
            elif rel in files:
                same = kind == "file" and _file_sha256(p) == sha256_hex(
                    base64.b64decode(files[rel])
                )
                out += [] if same else [f"changed {rel}"]
            elif rel in links:
                out += [] if kind == "link" and os.readlink(p) == links[rel] else [f"changed {rel}"]
            elif rel not in dirs:
                out.append(f"added {rel}")
        return out

    def restore(self, snapshot: bytes, *, replace: bool = False) -> None:
        doc = json.loads(snapshot)
        absent = bool(doc.get("absent"))
        files: dict[str, str] = {} if absent else doc["files"]
        links: dict[str, str] = {} if absent else doc.get("links", {})
        dirs: list[str] = [] if absent else doc.get("dirs", [])
        kept = set(files) | set(links) | set(dirs)
        extra = sorted(
            rel
            for rel, kind, _, _ in self._entries()
            if rel not in kept
            # an empty folder the snapshot fills again is not lost
            and not (kind == "dir" and any(k.startswith(rel + "/") for k in kept))
        )
        if extra and not replace:
            shown = ", ".join(extra[:3]) + (f" (+{len(extra) - 3} more)" if len(extra) > 3 else "")
            raise EffectPreconditionFailed(
                f"restoring {self.name} would delete {len(extra)} "
                f"{'entry' if len(extra) == 1 else 'entries'} the recorded pre-state "
                f"does not hold: {shown}",
                "move them away, or replay with --effects live --restore=replace to delete them",
            )
        # Build the restored state beside the resource, then swap it in with one atomic exchange
        # (renameat2): a failure while writing, or a crash at any point, leaves the resource
        # either as it was found or restored, never missing. A declared path that is a link is
        # followed (its folder is the resource; the link stays).
        where = self.path.resolve() if self.path.is_symlink() else self.path
        where.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{where.name}.restore-", dir=where.parent))
        try:
            target = staging / "new"
            if not absent:
                modes: dict[str, int] = doc.get("modes", {})
                if doc["dir"]:
                    target.mkdir()
                    for rel, content in files.items():
                        out = target / rel
                        out.parent.mkdir(parents=True, exist_ok=True)
                        out.write_bytes(base64.b64decode(content))
                        if rel in modes:
                            os.chmod(out, modes[rel])
                    for rel, dest in links.items():
                        (target / rel).parent.mkdir(parents=True, exist_ok=True)
                        os.symlink(dest, target / rel)
                    for rel in dirs:
                        (target / rel).mkdir(parents=True, exist_ok=True)
                else:
                    ((rel, content),) = files.items()
                    target.write_bytes(base64.b64decode(content))
                    if rel in modes:
                        os.chmod(target, modes[rel])
            _swap_in(target, where, staging / "old")
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _file_sha256(path: Path) -> str:
    """sha256 hex of a file's bytes, read in 1 MiB chunks (a huge file is never held whole)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``);
    False when the system cannot (then the caller falls back to two renames)."""
    if sys.platform != "linux":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    at_fdcwd = -100
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(new: Path, path: Path, old: Path) -> None:
    """Put ``new`` (which may not exist: the restored state is "absent") at ``path``, moving
    what was there to ``old``; each branch is a single rename or exchange where the system
    allows it, so a crash never leaves ``path`` missing when both states hold it."""
    if new.exists() or new.is_symlink():
        if path.exists() or path.is_symlink():
            if _exchange(new, path):
                os.replace(new, old)  # ``new`` now holds what was found: out of the way
                return
            os.replace(path, old)
            try:
                os.replace(new, path)
            except OSError:
                os.replace(old, path)
                raise
        else:
            os.replace(new, path)
    elif path.exists() or path.is_symlink():
        os.replace(path, old)


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
        try:
            if not self.db_path.exists():
                return Fingerprint(ABSENT, None)
        except OSError as exc:  # a folder on the way that this user cannot enter
            raise self._unavailable(exc) from exc
        try:
            con = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True)
        except sqlite3.Error as exc:
            raise self._unavailable(exc) from exc
        try:
            try:
                rows = con.execute(
                    f"SELECT * FROM {self.table} ORDER BY {self.order_by}"
                ).fetchall()
            except sqlite3.OperationalError as exc:
                if str(exc).startswith("no such table"):
                    return Fingerprint(ABSENT, None)
                raise self._unavailable(exc) from exc
            except sqlite3.Error as exc:
                raise self._unavailable(exc) from exc
            epoch = None
            if self.epoch_sql:
                # The epoch is part of the state: a query that fails leaves it unknown, and a
                # fingerprint without it would pass rows from another epoch as this one.
                try:
                    value = con.execute(self.epoch_sql).fetchone()
                except sqlite3.Error as exc:
                    raise self._unavailable(exc, f"epoch query {self.epoch_sql!r}: ") from exc
                epoch = None if value is None else str(value[0])
        finally:
            con.close()
        body = canonical_bytes({"count": len(rows), "rows": [list(_plain(r)) for r in rows]})
        digest = sha256_hex(body) if epoch is None else key_of(body, epoch)
        return Fingerprint(digest, epoch)

    def _unavailable(self, exc: Exception, what: str = "") -> FingerprintUnavailable:
        return FingerprintUnavailable(
            f"cannot read {self.name}: {what}{exc}",
            "another connection holds a lock on the database: retry once it commits"
            if "locked" in str(exc)
            else "check the database file's permissions, that it is a SQLite database and "
            "that the queries' tables exist",
        )


def _plain(row: tuple[Any, ...]) -> list[Any]:
    return [v.hex() if isinstance(v, bytes) else v for v in row]


class HttpResource(Fingerprinter):
    """An HTTP resource, fingerprinted by a GET: its strong ``ETag`` when the server sends one,
    else (no ETag, or a weak ``W/`` one) the sha256 of the body; ``Last-Modified`` (or the ETag)
    is the epoch.

    Only a 2xx answer is a state; 404 is ``absent``; anything else (401, 5xx, a redirect left
    unfollowed, a refused connection, a timeout) raises :class:`FingerprintUnavailable` — an
    error page hashed as the resource would let an audit pass on nothing.

    Args:
        url: the resource's URL.
        headers: headers the GET needs (``Authorization``, an API key header…); never recorded.
            A ``user:password@`` in ``url`` is taken out of it and used as ``auth``.
        auth: an ``httpx`` auth (``("user", "password")`` or an ``httpx.Auth``); never recorded.
        client: an ``httpx.Client`` (tests pass one with a MockTransport); a new one otherwise.
        timeout_s: timeout of a GET through a new client, in seconds.
    """

    kind = "http"

    def __init__(
        self,
        url: str,
        client: httpx.Client | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        auth: Any = None,
        timeout_s: float = 10.0,
    ) -> None:
        parsed = httpx.URL(url)
        if parsed.userinfo:
            # Credentials in the URL become the GET's basic auth; the name (stored with every
            # effect row) never holds them.
            if auth is None:
                auth = (parsed.username, parsed.password)
            url = str(parsed.copy_with(username=None, password=None))
        self.url = url
        self.client = client
        self.headers = dict(headers or {})
        self.auth = auth
        self.timeout_s = timeout_s

    @property
    def name(self) -> str:
        return self.url

    def spec(self) -> dict[str, Any]:
        # Credentials stay out of the store: the audit rebuilds them from the declaring tool.
        return {"url": self.url}

    def fingerprint(self) -> Fingerprint:
        client = self.client or httpx.Client(timeout=self.timeout_s)
        kwargs: dict[str, Any] = {"headers": self.headers}
        if self.auth is not None:
            kwargs["auth"] = self.auth
        try:
            response = client.get(self.url, **kwargs)
        except httpx.HTTPError as exc:
            raise FingerprintUnavailable(
                f"cannot reach {self.url}: {type(exc).__name__}: {exc}",
                "start the server or fix the URL, then audit or replay again",
            ) from exc
        finally:
            if self.client is None:
                client.close()
        if response.status_code == 404:
            return Fingerprint(ABSENT, None)
        if not 200 <= response.status_code < 300:
            raise FingerprintUnavailable(
                f"{self.url} answered HTTP {response.status_code}, which is not the resource's "
                "state",
                "pass the headers or auth the GET needs to HttpResource(headers=..., auth=...)"
                if response.status_code in (401, 403)
                else "point HttpResource at the final URL (or pass a client with "
                "follow_redirects=True)"
                if 300 <= response.status_code < 400
                else "retry when the server answers 2xx",
            )
        etag = response.headers.get("etag")
        epoch = response.headers.get("last-modified") or etag
        # A weak ETag (W/"…") only promises an equivalent representation, not these bytes.
        strong = etag is not None and not etag.startswith("W/")
        digest = key_of("etag", etag) if strong else sha256_hex(response.content)
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
    scope = ctx.node
    if scope is None:
        # No node or step to hang the call and its fingerprints on (a traced chain gives such
        # a call a step of its own first): it would execute unrecorded and audit vacuously.
        raise ContextLost(
            f"side-effecting tool {call.name!r} was called outside any step of run "
            f"{ctx.run_id[:12]}, so it would execute unrecorded",
            'call it inside a step: with rewind.tracing.step("name", "tool_call"): ...',
        )
    policy, key, index = call.policy, call.key, call.index
    entry = ctx.lineage.get(key) if ctx.read_cache or not ctx.write_cache else None
    mode = "record" if not ctx.read_cache and ctx.write_cache else ctx.effects_mode
    if not ctx.write_cache:
        # Stability runs never repeat effects: serve the record, or log the call when its
        # arguments spread upstream (there is then no record to serve).
        mode = "recorded" if entry is not None else "dry-run"
    where = f"node {scope.name!r}: " if scope is not None else ""
    wrong = [r for r in policy.resources if not isinstance(r, Fingerprinter)]
    if wrong:
        raise RewindError(
            f"{where}side-effecting tool {call.name!r} declares a resource that cannot be "
            f"fingerprinted: {type(wrong[0]).__name__} {str(wrong[0])[:80]!r}",
            "declare resources as rewind.effects.FileTree(path), SQLiteTable(db, table) or "
            "HttpResource(url)",
        )
    resources: list[Fingerprinter] = list(policy.resources)

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
        with _holding(resources):
            data, record = _execute_effect(ctx, call, resources, mode, where)
    if scope is not None:
        scope.add_call(record)
    return data, record


_RESOURCE_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


LOCK_DIR = Path(tempfile.gettempdir()) / "rewind-effect-locks"
"""Where the per-resource lock files live (one per resource name, shared by every process of
this machine that runs Rewind)."""


@contextlib.contextmanager
def _holding(resources: list[Fingerprinter]) -> Iterator[None]:
    """Hold every resource's lock (by name, in name order, so two calls never deadlock) for a
    whole verify → restore → execute → fingerprint sequence: what-if grid variants, parallel
    forks and other processes on this machine (worker processes, a second ``rewind fork``)
    touching one resource run one after the other, never interleaved. A thread lock orders the
    threads of this process; an ``flock`` on a lock file in :data:`LOCK_DIR` orders processes."""
    names = sorted({r.name for r in resources})
    with _LOCKS_GUARD:
        locks = [_RESOURCE_LOCKS.setdefault(n, threading.Lock()) for n in names]
    with contextlib.ExitStack() as stack:
        for name, lock in zip(names, locks, strict=True):
            stack.enter_context(lock)
            stack.enter_context(_process_lock(name))
        yield


@contextlib.contextmanager
def _process_lock(name: str) -> Iterator[None]:
    """An exclusive ``flock`` on the resource's lock file (no-op where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = LOCK_DIR / f"{sha256_hex(name.encode())[:32]}.lock"
    try:
        if not LOCK_DIR.is_dir():
            LOCK_DIR.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):  # shared by every user, like /tmp itself
                os.chmod(LOCK_DIR, 0o1777)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # another user's lock file: a read-only descriptor locks too
            fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise EffectPreconditionFailed(
            f"cannot take the lock of {name} ({path}): {exc.strerror or exc}",
            f"make {LOCK_DIR} writable for this user, or replay with --effects recorded",
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _execute_effect(
    ctx: RunContext, call: Call, resources: list[Fingerprinter], mode: str, where: str
) -> tuple[bytes, CallRecord]:
    """Execute one side-effecting call (``record`` or ``live``) between pre and post
    fingerprints, with its pre-state pinned; ``live`` verifies (or restores) the slot's recorded
    pre-state first."""
    from rewind.cache import execute_call

    scope, key, index, policy = ctx.node, call.key, call.index, call.policy
    reason = "bypass" if mode == "record" else "side-effect-live"
    if mode == "live":
        slot = ctx.lineage_slots.get((scope.position, index)) if scope is not None else None
        pre, drift = _verify_pre_state(ctx, slot, resources, where, call.name, index)
        if drift:
            reason = "side-effect-live-restored"
            ctx.emit("effect-drift", tool=call.name, call_index=index, drift=drift)
    else:
        pre = _observe(resources)
    # Pinned after any restore: the snapshot is the pre-state this call really ran against.
    snapshots = {r.name: _pin(r) for r in resources}
    # Two identical side-effecting calls are two effects: keep both results.
    try:
        data, record = execute_call(
            ctx, scope, call, "miss", reason, cacheable=False, pending_key=f"effect:{key}:{index}"
        )
    except BaseException:
        # A call that raised may have written half its effect: keep what it found (and the
        # pinned snapshot of it) and what it left, on its failed node.
        with contextlib.suppress(Exception):  # never hide the call's own error
            post = _observe(resources)
            _effect_rows(ctx, scope, index, resources, mode, pre, post, snapshots, policy)
        raise
    post = _observe(resources)
    _remember_left(post)
    _effect_rows(ctx, scope, index, resources, mode, pre, post, snapshots, policy)
    return data, record


_LEFT: dict[str, dict[str, None]] = {}
"""Per resource name, the post-state digests the latest calls this process executed left
(newest last, at most 64): a later live call may replace such a state without asking."""


def _remember_left(post: dict[str, Fingerprint | None]) -> None:
    with _LOCKS_GUARD:
        for name, fp in post.items():
            if fp is None or fp.digest == ABSENT:
                continue
            seen = _LEFT.setdefault(name, {})
            seen.pop(fp.digest, None)
            seen[fp.digest] = None
            while len(seen) > 64:
                seen.pop(next(iter(seen)))


def _left_by_rewind(ctx: RunContext, name: str, digest: str, rec: EffectRecord) -> bool:
    """Whether ``digest`` (the resource's state now) is exactly what a call Rewind executed
    left: the recorded call, a call this process ran (a grid sibling), or a live fork of the
    recorded run (another process)."""
    if digest == rec.post_digest:
        return True
    with _LOCKS_GUARD:
        if digest in _LEFT.get(name, {}):
            return True
    for child in ctx.store.children(rec.run_id):
        for e in ctx.store.effects_of(child.run_id):
            if e.resource == name and e.mode == "live" and e.post_digest == digest:
                return True
    return False


def _pin(resource: Fingerprinter) -> bytes | None:
    """The resource's snapshot, or None when it cannot be read now (the call still runs; a
    ``live`` replay of it then refuses on drift instead of restoring)."""
    try:
        return resource.snapshot()
    except (OSError, RewindError):
        return None


def _observe(resources: list[Fingerprinter]) -> dict[str, Fingerprint | None]:
    """Fingerprints while recording: a resource that cannot be read now gets None (no
    fingerprint captured, so the audit says ``audit-incomplete``), never a guess."""
    out: dict[str, Fingerprint | None] = {}
    for r in resources:
        try:
            out[r.name] = r.fingerprint()
        except FingerprintUnavailable:
            out[r.name] = None
    return out


def _verify_pre_state(
    ctx: RunContext,
    slot: LineageEntry | None,
    resources: list[Fingerprinter],
    where: str,
    name: str,
    index: int,
) -> tuple[dict[str, Fingerprint | None], list[str]]:
    """Before a ``live`` re-execution: the call's slot (node position + call index, never its
    arguments: changed arguments must not skip the check) must find every resource in the
    recorded pre-state, restoring the pinned snapshot where it drifted.

    Returns:
        (the pre-state the call runs against, one ``"resource found→recorded"`` line per drifted
        and restored resource).
    Raises:
        EffectPreconditionFailed: no recorded call at this slot, a resource without a recorded
            pre-state, one that cannot be fingerprinted now, or a drifted one without a snapshot
            (or whose restore would delete data; see :data:`RESTORE_MODES`).
    """
    fix = "replay with --effects recorded or --effects dry-run"
    if not resources:
        raise EffectPreconditionFailed(
            f"{where}{name!r} declares no resource, so nothing can verify the pre-state it "
            "would re-execute against",
            "declare what it touches with @rewind.tool(..., resources=...), or "
            + fix[0].lower()
            + fix[1:],
        )
    if slot is None:
        raise EffectPreconditionFailed(
            f"{where}{name!r} (call {index} of the node) has no recorded execution at this "
            "place in the source run, so its pre-state cannot be verified",
            fix,
        )
    rows = [
        e
        for e in ctx.store.effects_of(slot.run_id)
        if e.position == slot.position and e.call_index == slot.call_index
    ]
    pre: dict[str, Fingerprint | None] = {}
    drift: list[str] = []
    for r in resources:
        # Only the same resource: a call that now touches another folder is a new effect, and
        # the recorded folder's snapshot must never be restored into it.
        rec = next(
            (
                e
                for e in rows
                if e.kind == r.kind and same_resource(r.name, ctx.run_id, e.resource, e.run_id)
            ),
            None,
        )
        if rec is None or rec.pre_digest is None:
            touched = ", ".join(sorted(e.resource for e in rows)) or "nothing"
            raise EffectPreconditionFailed(
                f"{where}the source run recorded no pre-state of {r.name} for {name!r} (that "
                f"call touched {touched}): a call on another resource is a new effect",
                fix,
            )
        try:
            now = r.fingerprint()
        except FingerprintUnavailable as exc:
            raise EffectPreconditionFailed(
                f"{where}cannot verify the pre-state of {r.name} before re-executing {name!r}: "
                f"{exc.message}",
                exc.hint or fix,
            ) from exc
        if now.digest == rec.pre_digest:
            pre[r.name] = now
            continue
        found = f"{r.name}: found {now.digest[:12]}, recorded {rec.pre_digest[:12]}"
        if rec.snapshot_hash is None:
            raise EffectPreconditionFailed(
                f"{where}{r.name} is not in the state {name!r} was recorded against "
                f"(pre-state {now.digest[:12]} vs recorded {rec.pre_digest[:12]}) and there is "
                "no pinned snapshot to restore it from (a SQLite table, or a folder over "
                "FileTree.max_snapshot_bytes or holding special files)",
                "restore the resource, or replay with --effects recorded or --effects dry-run",
            )
        # Data outside the snapshot may go only when the user asked for it, or when the world
        # holds exactly what a call Rewind executed left (the recorded call, a grid sibling, an
        # earlier live fork of the same slot): then that call wrote the data, not a person.
        replace = ctx.restore_mode == "replace" or _left_by_rewind(ctx, r.name, now.digest, rec)
        snapshot = ctx.store.get_blob(rec.snapshot_hash)
        try:
            changes = r.changes_from(snapshot)
        except (OSError, ValueError):
            changes = []
        r.restore(snapshot, replace=replace)
        after = r.fingerprint()
        if after.digest != rec.pre_digest:
            raise EffectPreconditionFailed(
                f"{where}restoring {r.name} did not give the recorded pre-state of {name!r} "
                f"({after.digest[:12]} vs {rec.pre_digest[:12]})",
                fix,
            )
        pre[r.name] = after
        if changes:
            shown = ", ".join(changes[:5]) + (f" (+{len(changes) - 5} more)" if changes[5:] else "")
            found += f" ({shown})"
        drift.append(found)
        ctx.emit(
            "warning",
            run_id=ctx.run_id,
            message=f"{where}restored {found} from the pinned snapshot before re-executing "
            f"{name!r}: what was found there is replaced",
        )
    return pre, drift


def same_resource(name: str, run_id: str, other: str, other_run_id: str) -> bool:
    """Whether resource ``name`` touched by run ``run_id`` is the resource ``other`` touched by
    run ``other_run_id``: the same name, or a run-scoped name (a run's own artifact folder holds
    the run id) that differs only by the run id."""
    if name == other:
        return True
    return (
        bool(other_run_id) and other_run_id in other and other.replace(other_run_id, run_id) == name
    )


def _effect_rows(
    ctx: RunContext,
    scope: NodeScope | None,
    index: int,
    resources: list[Fingerprinter],
    mode: str,
    pre: dict[str, Fingerprint | None] | None,
    post: dict[str, Fingerprint | None] | None,
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
                "pre_digest": _digest(pre, r.name),
                "pre_epoch": _epoch(pre, r.name),
                "post_digest": _digest(post, r.name),
                "post_epoch": _epoch(post, r.name),
                "snapshot_hash": snap_hash,
                "idempotency_key": policy.idempotency_key,
                "spec_json": canonical_bytes(r.spec()).decode() if r.spec() else None,
                "_snapshot": snap,
            }
        )


def _digest(observed: dict[str, Fingerprint | None] | None, name: str) -> str | None:
    fp = (observed or {}).get(name)
    return None if fp is None else fp.digest


def _epoch(observed: dict[str, Fingerprint | None] | None, name: str) -> str | None:
    fp = (observed or {}).get(name)
    return None if fp is None else fp.epoch
