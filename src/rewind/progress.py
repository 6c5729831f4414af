"""A run's live progress and its cancellation, kept in the store (not in process memory).

The process executing a run (a server's worker, a ``rewind run`` in a terminal, a Celery
worker) writes, at each top-level node start, which node it executes now onto the run's row
(``runs.live_node``, ``live_position``, ``live_since``) and in the same transaction reads
``runs.cancel_requested``. So:

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
import threading
import time
from typing import Any

from sqlalchemy import and_, func, select, update

from rewind.errors import RewindError
from rewind.store import schema
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


def node_started(store: Store, run_id: str, position: int, name: str) -> dict[str, Any] | None:
    """Record that ``run_id`` starts node ``name`` at ``position`` (0-based) now, and say
    whether a cancel was asked.

    Never raises for a store problem (progress must not break a run): it then reports no
    cancel.

    Returns:
        the cancel request (``{"by", "at"}``) when one was made, else None.
    """
    if _take_pending(run_id):
        return {"by": None, "at": time.time()}
    t = schema.runs
    try:
        with store.write() as conn:
            conn.execute(
                update(t)
                .where(and_(t.c.run_id == run_id, t.c.status == "running"))
                .values(live_node=name, live_position=position, live_since=time.time())
            )
            asked = conn.execute(select(t.c.cancel_requested).where(t.c.run_id == run_id)).scalar()
    except Exception:  # a progress write must never break the run
        return None
    if not asked:
        return None
    with contextlib.suppress(ValueError):
        value = json.loads(asked)
        if isinstance(value, dict):
            return value
    return {"by": None, "at": None}


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
    t = schema.runs
    with store.write() as conn:
        result = conn.execute(
            update(t)
            .where(and_(t.c.run_id == run_id, t.c.status == "running"))
            .values(cancel_requested=json.dumps({"by": by, "at": time.time()}))
        )
    return bool(result.rowcount)


def live_progress(store: Store, run_id: str) -> dict[str, Any]:
    """What the store knows of a run in flight, whoever executes it.

    Returns:
        ``{"node": {"name", "position", "number", "since"} | None, "prompt_tokens",
        "completion_tokens", "tokens", "nodes": committed node rows, "cancel_requested":
        {"by", "at"} | None}``; tokens are those of the run's own (not inherited) committed
        nodes.
    """
    t, n = schema.runs, schema.nodes
    with store.read() as conn:
        row = conn.execute(
            select(t.c.live_node, t.c.live_position, t.c.live_since, t.c.cancel_requested).where(
                t.c.run_id == run_id
            )
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
        "nodes": int(totals[0]),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "tokens": prompt + completion,
        "cancel_requested": asked,
    }
