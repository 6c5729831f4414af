"""API users: bearer tokens kept as hashes, teams, admins, and who a run belongs to.

A user is created with ``rewind user add NAME``, which prints a new token once; the store keeps
only its SHA-256. The token is 32 random bytes (``secrets.token_urlsafe``), so a plain SHA-256
is enough: a slow password hash protects low-entropy secrets people choose, and nobody can
guess 256 random bits from their hash. Users are revoked, never deleted, so the runs they created
keep naming them (``runs.created_by``).

Who sees a run over the API (:func:`can_see`): an admin sees every run; a user sees the runs they
created and the runs created by users of the same team (a run is shared with its creator's
team, looked up when it is read: moving a user to another team moves their runs with them). A
run without a creator (recorded by the CLI or the library without ``REWIND_USER``, or before
users existed) is an unowned local run: only admins see it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import time
from dataclasses import dataclass

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError

from rewind.errors import RewindError
from rewind.store import schema
from rewind.store.store import Store

__all__ = [
    "USER_ENV",
    "InvalidUser",
    "UnknownUser",
    "UserRecord",
    "add_user",
    "authenticate",
    "can_see",
    "has_users",
    "hash_token",
    "list_users",
    "local_user",
    "revoke_user",
    "rotate_token",
    "run_ids_with_prefix",
    "teammates",
]

USER_ENV = "REWIND_USER"
"""Names the user the runs a CLI or library process records belong to (unset: unowned)."""
TOKEN_PREFIX = "rwd_"
"""Tokens start with it, so a leaked one is recognisable (secret scanners, logs)."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class InvalidUser(RewindError):
    """A user or team name that cannot be used, or a user that already exists."""


class UnknownUser(RewindError):
    """No user of this store has this name."""


@dataclass(frozen=True)
class UserRecord:
    """One API user. Timestamps are unix seconds; ``revoked_at`` None: the token works."""

    name: str
    team: str | None
    admin: bool
    created_at: float
    revoked_at: float | None = None

    @property
    def active(self) -> bool:
        """True while the user's token is accepted."""
        return self.revoked_at is None

    def to_json(self) -> dict[str, object]:
        """The user as JSON (never the token or its hash)."""
        return {
            "name": self.name,
            "team": self.team,
            "admin": self.admin,
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
            "active": self.active,
        }


def hash_token(token: str) -> str:
    """SHA-256 (64 hex) of a bearer token's UTF-8 bytes: what the store keeps."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_name(value: str, what: str = "user name") -> str:
    """``value`` when it is a valid user or team name (1–64 of ``A-Za-z0-9._-``, not starting
    with ``.``, ``_`` or ``-``).

    Raises:
        InvalidUser: it is not.
    """
    if not _NAME.fullmatch(value):
        shown = value if len(value) <= 80 else value[:80] + "…"
        raise InvalidUser(
            f"{what} {shown!r} is not valid",
            "use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return value


def local_user() -> str | None:
    """The user named by ``$REWIND_USER`` (runs recorded by this process belong to them), or
    None when it is unset or empty.

    Raises:
        InvalidUser: ``$REWIND_USER`` is not a valid user name.
    """
    value = os.environ.get(USER_ENV, "").strip()
    return check_name(value, f"${USER_ENV}") if value else None


def add_user(
    store: Store, name: str, *, team: str | None = None, admin: bool = False
) -> tuple[UserRecord, str]:
    """Create a user with a new random token.

    Args:
        name: the user's name (see :func:`check_name`).
        team: the user's team (same rules), or None: no team.
        admin: the user sees every run.
    Returns:
        the user and their token — shown once: only its hash is stored.
    Raises:
        InvalidUser: a bad name or team, or a user of this name already exists.
    """
    check_name(name)
    if team is not None:
        check_name(team, "team name")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    user = UserRecord(name=name, team=team, admin=admin, created_at=time.time())
    try:
        with store.write() as conn:
            conn.execute(
                insert(schema.users).values(
                    name=name,
                    token_hash=hash_token(token),
                    team=team,
                    admin=admin,
                    created_at=user.created_at,
                )
            )
    except IntegrityError as exc:
        raise InvalidUser(
            f"user {name!r} already exists",
            f"choose another name, or give them a new token: rewind user rotate {name}",
        ) from exc
    return user, token


def list_users(store: Store) -> list[UserRecord]:
    """Every user, revoked ones included, by name."""
    with store.read() as conn:
        rows = conn.execute(select(schema.users).order_by(schema.users.c.name)).all()
    return [_record(r) for r in rows]


def get_user(store: Store, name: str) -> UserRecord:
    """The user of this name.

    Raises:
        UnknownUser: there is none.
    """
    with store.read() as conn:
        row = conn.execute(select(schema.users).where(schema.users.c.name == name)).first()
    if row is None:
        raise UnknownUser(f"unknown user {name!r}", "list users with `rewind user list`")
    return _record(row)


def revoke_user(store: Store, name: str) -> UserRecord:
    """Refuse the user's token from now on (their runs stay theirs). Idempotent.

    Raises:
        UnknownUser: no user of this name.
    """
    user = get_user(store, name)
    if user.revoked_at is not None:
        return user
    now = time.time()
    with store.write() as conn:
        conn.execute(update(schema.users).where(schema.users.c.name == name).values(revoked_at=now))
    return UserRecord(user.name, user.team, user.admin, user.created_at, now)


def rotate_token(store: Store, name: str) -> tuple[UserRecord, str]:
    """Give the user a new token: the old one stops working at once (a revoked user is
    re-enabled with the new token).

    Returns:
        the user and the new token (shown once).
    Raises:
        UnknownUser: no user of this name.
    """
    user = get_user(store, name)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with store.write() as conn:
        conn.execute(
            update(schema.users)
            .where(schema.users.c.name == name)
            .values(token_hash=hash_token(token), revoked_at=None)
        )
    return UserRecord(user.name, user.team, user.admin, user.created_at, None), token


def authenticate(store: Store, token: str) -> UserRecord | None:
    """The active user whose token this is, or None (unknown or revoked token)."""
    digest = hash_token(token)
    t = schema.users
    with store.read() as conn:
        row = conn.execute(select(t).where(t.c.token_hash == digest)).first()
    # The lookup compares hashes, not the token: timing tells nothing about the token itself.
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        return None
    user = _record(row)
    return user if user.active else None


def has_users(store: Store) -> bool:
    """True when the store has any user (revoked ones count: auth, once on, stays on)."""
    with store.read() as conn:
        return bool(conn.execute(select(func.count()).select_from(schema.users)).scalar())


def teammates(store: Store, user: UserRecord) -> frozenset[str]:
    """Names whose runs ``user`` sees: themself and every user of their team."""
    if user.team is None:
        return frozenset({user.name})
    t = schema.users
    with store.read() as conn:
        names = conn.execute(select(t.c.name).where(t.c.team == user.team)).scalars().all()
    return frozenset({user.name, *names})


def can_see(created_by: str | None, *, admin: bool, sees: frozenset[str]) -> bool:
    """Whether a viewer sees a run created by ``created_by``.

    Args:
        created_by: the run's ``created_by`` (None: an unowned local run).
        admin: the viewer is an admin (sees every run).
        sees: the viewer's :func:`teammates`.
    """
    return admin or (created_by is not None and created_by in sees)


def run_ids_with_prefix(store: Store, prefix: str, created_by: frozenset[str]) -> list[str]:
    """At most two ids of runs created by ``created_by`` that start with ``prefix`` (so a
    prefix is resolved among the runs a user sees, never hinting at anyone else's)."""
    t = schema.runs
    query = (
        select(t.c.run_id)
        .where(t.c.run_id.startswith(prefix, autoescape=True))
        .where(t.c.created_by.in_(sorted(created_by)))
        .limit(2)
    )
    with store.read() as conn:
        return list(conn.execute(query).scalars().all())


def _record(row: object) -> UserRecord:
    m = row._mapping  # type: ignore[attr-defined]
    return UserRecord(
        name=m["name"],
        team=m["team"],
        admin=bool(m["admin"]),
        created_at=float(m["created_at"]),
        revoked_at=m["revoked_at"],
    )
