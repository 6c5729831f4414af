"""A run's live progress and its cancellation, kept in the store (not in process memory).

The process executing a run (a server's worker, a ``rewind run`` in a terminal, a Celery
worker) writes, at each top-level node start, which node it executes now onto the run's row
(``runs.live_node``, ``live_position``, ``live_since``) and in the same transaction reads
``runs.cancel_requested`` — at most every :data:`WRITE_INTERVAL_S` per run (a start within it is
written by a background thread at the end of the interval, which also reads the cancel flags of
the runs in flight that often). So:

- any server reading the same store shows the running node of a run it does not execute, and
  the tokens so far (the sum over the node rows committed so far: the recorder commits a
  finished node within its flush interval, 50 ms);
- a cancel asked anywhere (:func:`request_cancel`, ``POST /api/runs/{id}/cancel``) stops the
  run at its next node start: the recorder raises :class:`RunCancelled` from Burr's pre-step
  hook, Burr aborts before the node executes, and the run ends ``cancelled`` — never left
  ``running``. A node already executing finishes first (a model call is not torn down).

A run queued on a server but not started yet has no row: its cancel is kept in this process
(:func:`cancel_pending`) and takes effect at its first node.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, func, select

from rewind.errors import RewindError
from rewind.store import schema
from rewind.store.live import mark_live_node, set_cancel_requested
from rewind.store.references import reference_of
from rewind.store.store import Store

__all__ = [
    "CANCELLED",
    "RunCancelled",
    "cancel_pending",
    "live_progress",
    "node_started",
    "request_cancel",
]

CANCELLED = "cancelled"
"""The status of a run stopped by a cancel request."""

_pending: set[str] = set()
_pending_lock = threading.Lock()


class RunCancelled(RewindError):
    """The run was cancelled (someone asked, the executing process stopped at a node start)."""


def cancel_pending(run_id: str) -> None:
    """Cancel a run this process has queued but not started: it stops at its first node."""
    with _pending_lock:
        _pending.add(run_id)


def _take_pending(run_id: str) -> bool:
    with _pending_lock:
        return run_id in _pending


WRITE_INTERVAL_S = 0.1
"""Shortest time between two progress writes of one run: a node start within it is written by a
background thread at the end of the interval (the latest start only), so a pipeline of fast
nodes costs at most ten small writes a second, off its own thread."""


@dataclass
class _RunMarks:
    store: Store
    last_write: float = 0.0  # time.monotonic() of the last write
    waiting: tuple[int, str, float] | None = None  # (position, name, unix s) not written yet
    cancel: dict[str, Any] | None = None  # the cancel request seen by the last write
    check_first: bool = False  # created(): the first node start reads the cancel flag itself
    before_write: Callable[[], None] | None = None  # commits the run's earlier nodes (never raises)


class _ProgressWriter:
    """Coalesces node-start marks per run and reads the cancel flag with each write."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.runs: dict[str, _RunMarks] = {}
        self.thread: threading.Thread | None = None
        self.pid = 0

    def mark(
        self,
        store: Store,
        run_id: str,
        position: int,
        name: str,
        before_write: Callable[[], None] | None = None,
    ) -> dict[str, Any] | None:
        """Mark node ``name`` (0-based ``position``) of ``run_id`` started: written now, or by
        the background thread at the end of :data:`WRITE_INTERVAL_S`, with ``before_write``
        run first wherever it is written (see :func:`node_started`). Returns the cancel request
        last seen (``{"by", "at"}``) or None; never raises for a store problem."""
        now = time.monotonic()
        with self.lock:
            marks = self.runs.get(run_id)
            if marks is None or marks.store is not store:
                marks = self.runs[run_id] = _RunMarks(store)
            marks.before_write = before_write
            late = now - marks.last_write >= WRITE_INTERVAL_S
            if marks.waiting is None or self.thread is None or late:
                # A mark waiting found the thread running less than an interval ago (a forked
                # child's hook clears the thread): checked about once per write interval
                # instead of at every node start.
                self._ensure_thread()
            first, marks.check_first = marks.check_first, False
            if not late:
                if marks.waiting is None:
                    self.lock.notify()  # a new deadline; a mark already waiting has its own
                marks.waiting = (position, name, time.time())
                if not first:
                    return marks.cancel
                write = False
            else:
                marks.waiting = None
                marks.last_write = now
                write = True
        if write:
            if before_write is not None:
                before_write()  # the nodes before this one are committed before its mark
            asked = _write(store, run_id, position, name, time.time())
        else:  # a run's first node start: a cancel asked since its row was written stops it
            asked = _read_cancel(store, run_id)
        with self.lock:
            marks.cancel = asked or marks.cancel
            return marks.cancel

    def created(self, store: Store, run_id: str) -> None:
        """The run row was just written ``running``: that counts as the run's last progress
        write, so a first node start within :data:`WRITE_INTERVAL_S` is written by the
        background thread (a run shorter than that writes no mark at all)."""
        with self.lock:
            self.runs[run_id] = _RunMarks(store, last_write=time.monotonic(), check_first=True)

    def _ensure_thread(self) -> None:
        if self.thread is None or not self.thread.is_alive() or self.pid != os.getpid():
            self.pid = os.getpid()
            self.thread = threading.Thread(target=self._loop, name="rewind-progress", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        """Write the waiting marks when their interval ends; between writes, read the cancel
        flags of the runs this process executes every :data:`WRITE_INTERVAL_S` (one query per
        store), so a cancel asked during a long node is seen by the next node start."""
        last_poll = 0.0
        while True:
            with self.lock:
                now = time.monotonic()
                jobs = []
                for rid, m in self.runs.items():
                    if m.waiting is not None and now - m.last_write >= WRITE_INTERVAL_S:
                        jobs.append((rid, m, m.waiting))
                        m.waiting = None
                        m.last_write = now
                poll = bool(self.runs) and now - last_poll >= WRITE_INTERVAL_S
                watched = list(self.runs.items()) if poll else []
                if not jobs and not poll:
                    waits = [
                        WRITE_INTERVAL_S - (now - m.last_write)
                        for m in self.runs.values()
                        if m.waiting is not None
                    ]
                    if self.runs:
                        waits.append(WRITE_INTERVAL_S - (now - last_poll))
                    self.lock.wait(timeout=max(0.005, min(waits)) if waits else 60.0)
                    continue
            for rid, m, (position, name, since) in jobs:
                with self.lock:
                    if self.runs.get(rid) is not m:
                        continue  # the run ended meanwhile (forget): never touch its store
                    before_write = m.before_write
                if before_write is not None:
                    # The nodes before this one are committed before its mark, so no reader
                    # sees a node running while an earlier one it finished is still unstored.
                    before_write()
                asked = _write(m.store, rid, position, name, since)
                with self.lock:
                    m.cancel = asked or m.cancel
            if poll:
                last_poll = time.monotonic()
                self._poll(watched)

    def forget(self, run_id: str | None = None, store: Store | None = None) -> None:
        """Stop watching a run (it finished) or every run of a store (it is closing). Waits for
        a poll in flight, so no read of that store happens afterwards (a closed SQLite store
        must not be reopened: that would recreate its -wal/-shm files)."""
        with self.lock:
            for rid in [
                r
                for r, m in self.runs.items()
                if (run_id is not None and r == run_id) or (store is not None and m.store is store)
            ]:
                del self.runs[rid]

    def _poll(self, watched: list[tuple[str, _RunMarks]]) -> None:
        by_store: dict[int, list[tuple[str, _RunMarks]]] = {}
        for rid, m in watched:
            by_store.setdefault(id(m.store), []).append((rid, m))
        t = schema.runs
        for items in by_store.values():
            store = items[0][1].store
            # Under the lock (one small read every WRITE_INTERVAL_S), so forget() cannot let a
            # store close while this reads it.
            with self.lock:
                items = [(rid, m) for rid, m in items if self.runs.get(rid) is m]
                if not items:
                    continue
                try:
                    with store.read() as conn:
                        rows = {
                            r.run_id: r
                            for r in conn.execute(
                                select(t.c.run_id, t.c.status, t.c.cancel_requested).where(
                                    t.c.run_id.in_([rid for rid, _ in items])
                                )
                            ).all()
                        }
                except Exception:  # a lost connection: try again later
                    continue
                for rid, m in items:
                    row = rows.get(rid)
                    if row is not None and row.status != "running":
                        if self.runs.get(rid) is m and m.waiting is None:
                            del self.runs[rid]  # finished: stop watching it
                        continue
                    if row is not None and row.cancel_requested:
                        m.cancel = _cancel_value(row.cancel_requested)


_WRITER = _ProgressWriter()


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: a lock the progress thread held at the
    fork (it polls the cancel flags under ``_WRITER.lock``) would never be released, and the
    child's first node start or ``Store.close`` would wait for it forever. The child gets new
    locks; the runs it inherited stay watched, by its own thread once it marks one."""
    global _pending_lock
    _pending_lock = threading.Lock()
    _WRITER.lock = threading.Condition()
    _WRITER.thread = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def run_created(store: Store, run_id: str) -> None:
    """This process just committed ``run_id``'s row as ``running`` and is about to execute it:
    the row counts as its first progress write, so its first node start is written by the
    background thread at the end of :data:`WRITE_INTERVAL_S` (no write transaction of its own
    in the run's thread; a run that ends sooner writes none). Cancels are seen as before: one
    asked in this process at once, one asked elsewhere before the first node by that node's
    start (it reads the flag: a read, not a write), later ones by the next poll."""
    _WRITER.created(store, run_id)


def run_ended(run_id: str) -> None:
    """A run finished: stop watching its cancel flag (called by :meth:`Store.finish_run`)."""
    _WRITER.forget(run_id=run_id)


def store_closing(store: Store) -> None:
    """A store closes: stop every read and write of it (called by :meth:`Store.close`)."""
    _WRITER.forget(store=store)


def _write(
    store: Store, run_id: str, position: int, name: str, since: float
) -> dict[str, Any] | None:
    """Write one node-start mark; returns the run's cancel request, if any. Never raises."""
    try:
        asked = mark_live_node(store, run_id, position, name, since)
    except Exception:  # a progress write must never break the run
        return None
    return _cancel_value(asked) if asked else None


def _read_cancel(store: Store, run_id: str) -> dict[str, Any] | None:
    """The run's cancel request as stored (one read, no write), or None. Never raises."""
    try:
        with store.read() as conn:
            raw = conn.execute(_CANCEL_OF, {"run_id": run_id}).scalar_one_or_none()
    except Exception:  # a progress read must never break the run
        return None
    return _cancel_value(raw) if raw else None


_CANCEL_OF = select(schema.runs.c.cancel_requested).where(
    schema.runs.c.run_id == bindparam("run_id")
)
"""A run's ``cancel_requested`` (built once: building a select costs more than running it)."""


def _cancel_value(raw: str) -> dict[str, Any]:
    with contextlib.suppress(ValueError):
        value = json.loads(raw)
        if isinstance(value, dict):
            return value
    return {"by": None, "at": None}


def node_started(
    store: Store,
    run_id: str,
    position: int,
    name: str,
    before_write: Callable[[], None] | None = None,
) -> dict[str, Any] | None:
    """Record that ``run_id`` starts node ``name`` at ``position`` (0-based) now, and say
    whether a cancel was asked.

    ``before_write`` (the run's recorder's ``flush``: must never raise) runs just before the
    mark is written, wherever that happens, so the rows of the nodes before this one are
    committed before any reader can see this one running.

    The mark is written at once, or — within :data:`WRITE_INTERVAL_S` of the run's last write —
    by a background thread at the end of the interval. The cancel request is the one last seen:
    a cancel asked in this process is seen at once; one asked by another process within
    :data:`WRITE_INTERVAL_S` (the background thread reads the flags that often). Never raises
    for a store problem (progress must not break a run): it then reports no cancel.

    Returns:
        the cancel request (``{"by", "at"}``) when one was seen, else None.
    """
    if _take_pending(run_id):
        return {"by": None, "at": time.time()}
    return _WRITER.mark(store, run_id, position, name, before_write)


def request_cancel(store: Store, run_id: str, by: str | None) -> bool:
    """Ask the process executing ``run_id`` to stop it at its next node start.

    Args:
        store: the run's store (writable).
        run_id: the full run id.
        by: who asks (a user name; None: unowned / local).
    Returns:
        True when the request was recorded (the run is still ``running``), False when the run
        had already finished.
    """
    if not set_cancel_requested(store, run_id, json.dumps({"by": by, "at": time.time()})):
        return False
    with _WRITER.lock:  # a run this process executes sees it at its very next node start
        marks = _WRITER.runs.get(run_id)
        if marks is not None and marks.store is store:
            marks.cancel = {"by": by, "at": time.time()}
    return True


def _referenced_nodes(config_json: str | None) -> int:
    """How many leading nodes a replay stored by reference shares with its source
    (:mod:`rewind.store.references`): cache hits of its own with no rows (0 tokens). Only a
    trace's config says so (a Burr run's config is the user's, any key allowed)."""
    with contextlib.suppress(ValueError):
        config = json.loads(config_json or "{}")
        ref = reference_of(config)
        return ref[1] if ref is not None else 0
    return 0


def live_progress(store: Store, run_id: str) -> dict[str, Any]:
    """What the store knows of a run in flight, whoever executes it.

    Returns:
        ``{"node": {"name", "position", "number", "since"} | None, "prompt_tokens",
        "completion_tokens", "tokens", "nodes": committed node rows (with the nodes a replay
        stored by reference shares with its source), "cancel_requested":
        {"by", "at"} | None}``; tokens are those of the run's own (not inherited) committed
        nodes.
    """
    t, n = schema.runs, schema.nodes
    with store.read() as conn:
        row = conn.execute(
            select(
                t.c.live_node,
                t.c.live_position,
                t.c.live_since,
                t.c.cancel_requested,
                t.c.config_json,
            ).where(t.c.run_id == run_id)
        ).first()
        totals = conn.execute(
            select(
                func.count(),
                func.coalesce(func.sum(n.c.prompt_tokens), 0),
                func.coalesce(func.sum(n.c.completion_tokens), 0),
            ).where(and_(n.c.run_id == run_id, n.c.inherited.is_(False)))
        ).one()
    node = None
    asked = None
    if row is not None and row.live_node is not None and row.live_position is not None:
        node = {
            "name": row.live_node,
            "position": row.live_position,
            "number": row.live_position + 1,
            "since": row.live_since,
        }
    if row is not None and row.cancel_requested:
        with contextlib.suppress(ValueError):
            asked = json.loads(row.cancel_requested)
    prompt, completion = int(totals[1]), int(totals[2])
    return {
        "node": node,
        "nodes": int(totals[0]) + _referenced_nodes(row.config_json if row is not None else None),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "tokens": prompt + completion,
        "cancel_requested": asked,
    }
