"""What every route of a server shares (:class:`ServerContext`), and the dependency that hands
it to a route (``ctx: Ctx``): one store, one run manager, one report manager, one
:class:`~rewind.replay.Rewind` for reads and validation — per server, not per request."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import Annotated, Any

from fastapi import Depends, Request

from rewind.api import access
from rewind.api.access import check_visible
from rewind.api.pipelines import PipelineEntry
from rewind.api.runner import ReportManager, RunManager
from rewind.errors import RewindError, UnknownRun
from rewind.replay import Rewind
from rewind.store import RunRecord, Store
from rewind.store.store import MIN_PREFIX
from rewind.store.users import run_ids_with_prefix

__all__ = ["Ctx", "ServerContext", "UnknownJob", "server_context"]


class UnknownJob(RewindError):
    """No grid or stability job of this server has this id."""


class ServerContext:
    """What the routes share: store, run and report managers, pipelines, model client,
    settings."""

    def __init__(
        self,
        store: Store,
        manager: RunManager,
        pipelines: Mapping[str, PipelineEntry],
        chat_client: Any,
        *,
        token_required: bool,
        interrupted_at_start: list[str],
        reports: ReportManager | None = None,
    ) -> None:
        self.store = store
        self.manager = manager
        self.reports = reports or ReportManager(store, chat_client, pipelines=manager.pipelines)
        self.pipelines = pipelines
        self.chat_client = chat_client
        self.token_required = token_required
        self.interrupted_at_start = interrupted_at_start
        self.started_at = time.time()
        self.auth_on: Callable[[], bool] = lambda: token_required
        self._rewind: Rewind | None = None
        self._rewind_lock = threading.Lock()

    def resolve(self, run_id: str) -> RunRecord:
        """The run (or a queued job's placeholder) if the requester may see it.

        Raises:
            UnknownRun: no such run, or one the requester may not see (the same 404: run ids
                of other users do not leak).
        """
        who = access.current()
        try:
            return check_visible(self.manager.resolve(run_id), run_id)
        except UnknownRun:
            if who.admin or len(run_id) < MIN_PREFIX:
                raise
        # A prefix shared with runs the user does not see would say "matches several runs":
        # resolve it among the user's runs only.
        found = run_ids_with_prefix(self.store, run_id, who.sees)
        if len(found) > 1:
            raise UnknownRun(
                f"run id prefix {run_id!r} matches several runs",
                "give more characters of the id (see `rewind runs`)",
            )
        if not found:
            raise UnknownRun(f"unknown run {run_id!r}", "list runs with `rewind runs`")
        return check_visible(self.manager.resolve(found[0]), run_id)

    def session(self) -> Rewind:
        """The server's one Rewind on the shared store, for reads and validation (never
        executes here), with the server's pipelines registered; built on first use."""
        with self._rewind_lock:
            if self._rewind is None:
                rw = Rewind(self.store, chat_client=self.chat_client)
                for entry in self.pipelines.values():
                    with suppress(Exception):
                        rw.register(entry.build())
                self._rewind = rw
            return self._rewind


async def server_context(request: Request) -> ServerContext:
    """The :class:`ServerContext` of the app serving ``request`` (a route dependency)."""
    ctx: ServerContext = request.app.state.rewind
    return ctx


Ctx = Annotated[ServerContext, Depends(server_context)]
"""A route parameter receiving the server's context: ``def route(ctx: Ctx, ...)``."""
