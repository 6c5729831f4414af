"""Row writes of a running run's live columns (:mod:`rewind.progress` decides when).

Every write of a table lives in :mod:`rewind.store`; these set ``runs.live_node``,
``live_position``, ``live_since`` and ``runs.cancel_requested``. Each call is one write
transaction.
"""

from __future__ import annotations

from sqlalchemy import and_, select, update

from rewind.store import schema
from rewind.store.store import Store

__all__ = ["mark_live_node", "set_cancel_requested"]


def mark_live_node(store: Store, run_id: str, position: int, name: str, since: float) -> str | None:
    """Write that ``run_id`` (when still ``running``) executes node ``name`` at ``position``
    since ``since`` (unix seconds), and read its cancel request in the same transaction.

    Returns:
        the run's ``cancel_requested`` column (JSON text) or None.
    Raises:
        sqlalchemy.exc.SQLAlchemyError, StoreError: the store refused the write.
    """
    t = schema.runs
    with store.write() as conn:
        conn.execute(
            update(t)
            .where(and_(t.c.run_id == run_id, t.c.status == "running"))
            .values(live_node=name, live_position=position, live_since=since)
        )
        return conn.execute(select(t.c.cancel_requested).where(t.c.run_id == run_id)).scalar()


def set_cancel_requested(store: Store, run_id: str, request: str) -> bool:
    """Set ``runs.cancel_requested`` of ``run_id`` to ``request`` (JSON text) when the run is
    still ``running``.

    Returns:
        True when a row was changed, False when the run is not running (or not there).
    """
    t = schema.runs
    with store.write() as conn:
        result = conn.execute(
            update(t)
            .where(and_(t.c.run_id == run_id, t.c.status == "running"))
            .values(cancel_requested=request)
        )
    return bool(result.rowcount)
