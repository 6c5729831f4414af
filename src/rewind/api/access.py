"""Who is asking: the principal of the request being served, and which runs they may see.

The security middleware (:func:`rewind.api.middleware.install_security`) authenticates every API
request and sets its :class:`Principal` for the request's context; routes then read runs through
:func:`check_visible` (every run lookup of the API goes through ``ServerContext.resolve``), so a
run the principal may not see answers exactly like a run that does not exist: 404
``UnknownRun``, never 403, so run ids of other users do not leak. The rule itself is
:func:`rewind.store.users.can_see`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rewind.errors import UnknownRun
from rewind.store import RunRecord
from rewind.store.users import UserRecord, can_see

__all__ = [
    "OPEN",
    "SERVER_TOKEN",
    "Principal",
    "acting_as",
    "check_visible",
    "current",
    "visible",
]


@dataclass(frozen=True)
class Principal:
    """The requester of the request being served.

    Attributes:
        name: the user's name; None for the server's shared ``--token`` and for a server without
            authentication (their runs are unowned).
        admin: sees every run.
        sees: the users whose runs they see (themself and their team), when not admin.
    """

    name: str | None
    admin: bool
    sees: frozenset[str] = frozenset()

    @classmethod
    def of(cls, user: UserRecord, teammates: frozenset[str]) -> Principal:
        """The principal of an authenticated user; ``teammates`` from
        :func:`rewind.store.users.teammates`."""
        return cls(user.name, user.admin, teammates)

    def can_see(self, created_by: str | None) -> bool:
        """Whether this principal sees a run (or job) created by ``created_by``."""
        return can_see(created_by, admin=self.admin, sees=self.sees)


OPEN = Principal(None, admin=True)
"""A server without authentication (loopback, no users, no token): every run is visible."""
SERVER_TOKEN = Principal(None, admin=True)
"""The server's shared ``--token``: an admin whose runs are unowned."""

_PRINCIPAL: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "rewind_principal", default=None
)


def current() -> Principal:
    """The principal of the request being served; outside any request (library use, tests of
    the engine) there is no one to restrict: :data:`OPEN`."""
    return _PRINCIPAL.get() or OPEN


@contextmanager
def acting_as(principal: Principal) -> Iterator[None]:
    """Serve the code inside as ``principal`` (the middleware wraps each request in it)."""
    token = _PRINCIPAL.set(principal)
    try:
        yield
    finally:
        _PRINCIPAL.reset(token)


def check_visible(run: RunRecord, asked: str | None = None) -> RunRecord:
    """``run`` when the current principal may see it.

    Args:
        run: the run looked up.
        asked: the id (or prefix) the client gave, for the error message.
    Raises:
        UnknownRun: the principal may not see it — the same error, message and hint as a run
            that does not exist.
    """
    if current().can_see(run.created_by):
        return run
    raise UnknownRun(f"unknown run {asked or run.run_id!r}", "list runs with `rewind runs`")


def visible(runs: Iterable[RunRecord]) -> list[RunRecord]:
    """The runs of ``runs`` the current principal may see, in order."""
    who = current()
    return [r for r in runs if who.can_see(r.created_by)]
