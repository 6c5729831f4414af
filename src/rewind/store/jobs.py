"""Row writes of the ``jobs`` table (:mod:`rewind.jobs.state` decides what they are).

Every write of a table lives in :mod:`rewind.store`; these are the jobs table's. Each call is
one write transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, insert, update

from rewind.store import schema
from rewind.store.store import Store

__all__ = ["delete_job_row", "fail_active_job_row", "insert_job_row", "update_job_row"]


def insert_job_row(store: Store, **values: Any) -> None:
    """Insert one job row; ``values`` are its columns (see :data:`rewind.store.schema.jobs`).

    Raises:
        sqlalchemy.exc.IntegrityError: a row with this ``job_id`` exists.
    """
    with store.write() as conn:
        conn.execute(insert(schema.jobs).values(**values))


def delete_job_row(store: Store, job_id: str) -> None:
    """Delete the job row ``job_id`` (nothing when there is none)."""
    with store.write() as conn:
        conn.execute(delete(schema.jobs).where(schema.jobs.c.job_id == job_id))


def update_job_row(store: Store, job_id: str, **values: Any) -> None:
    """Set columns of the job row ``job_id`` (nothing when there is none)."""
    with store.write() as conn:
        conn.execute(update(schema.jobs).where(schema.jobs.c.job_id == job_id).values(**values))


def fail_active_job_row(store: Store, job_id: str, reason: str, at: float) -> None:
    """Mark the job row ``job_id`` ``failed`` with ``reason`` at ``at`` (unix seconds) when it
    is still ``queued`` or ``running``; a finished job's row is left as it is."""
    t = schema.jobs
    with store.write() as conn:
        conn.execute(
            update(t)
            .where(t.c.job_id == job_id, t.c.state.in_(("queued", "running")))
            .values(state="failed", error=reason, finished_at=at)
        )
