"""Fingerprints of the resources a side-effecting tool touches, and their pinned snapshots.

Pure resource state, no execution: a :class:`Fingerprinter` (:class:`FileTree`,
:class:`SQLiteTable`, :class:`HttpResource`) says what a resource holds now (content hash plus an
*epoch*), snapshots it and restores a snapshot. :mod:`rewind.effects` executes side-effecting
calls between these fingerprints; :mod:`rewind.audit` compares them.
"""

from __future__ import annotations

import abc
import base64
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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from rewind.canonical import canonical_bytes, key_of, sha256_hex
from rewind.errors import RewindError

if TYPE_CHECKING:
    import httpx

ABSENT = "absent"
"""Fingerprint digest of a resource that does not exist."""

RestoreMode = Literal["refuse", "replace"]

RESTORE_MODES: tuple[RestoreMode, ...] = get_args(RestoreMode)
"""What a ``live`` restore does with files the pinned snapshot does not hold: ``refuse`` (the
default: the restore stops and names them, nothing is touched) or ``replace`` (they are deleted;
the user asked for it explicitly with ``--restore=replace``)."""


class EffectPreconditionFailed(RewindError):
    """``live`` replay: the resource's pre-state differs from the recorded one, with no snapshot."""


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
        self._refuse_extra(set(files) | set(links) | set(dirs), replace)
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
                _write_snapshot(target, doc, files, links, dirs)
            _swap_in(target, where, staging / "old")
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _refuse_extra(self, kept: set[str], replace: bool) -> None:
        """Refuse (unless ``replace``) when the tree holds entries outside ``kept`` (the
        snapshot's), which a restore would delete."""
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


def _write_snapshot(
    target: Path,
    doc: Mapping[str, Any],
    files: Mapping[str, str],
    links: Mapping[str, str],
    dirs: list[str],
) -> None:
    """Write a (present) :class:`FileTree` snapshot at ``target``: a folder with its files,
    modes, links and empty folders, or a single file."""
    modes: dict[str, int] = doc.get("modes", {})
    if not doc["dir"]:
        ((rel, content),) = files.items()
        target.write_bytes(base64.b64decode(content))
        if rel in modes:
            os.chmod(target, modes[rel])
        return
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
        import httpx  # loaded with the first HTTP resource: `import rewind.cache` stays light

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
        import httpx

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
