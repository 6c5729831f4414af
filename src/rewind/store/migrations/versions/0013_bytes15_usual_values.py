"""Usual values: ``determinism`` ``deterministic`` is stored as ``''`` on SQLite.

A node or call row's ``determinism`` is ``deterministic`` on nearly every row; on SQLite the
column type :class:`rewind.store.schema.Usual` now binds that value as the empty string and
reads the empty string back as it, so every reader sees the same values. Upgrading rewrites the
stored ``deterministic`` of ``nodes`` and ``calls`` as ``''`` (immutability triggers lifted
inside the transaction and put back); a downgrade writes it back. PostgreSQL is unchanged.

An older Rewind would read ``''`` as a determinism of its own, so the revision exists for it to
refuse the store ("unknown revision").

Measured on peerbench's 100-step trace (``benchmarks/storage.py``'s trace figure): a call row
shrinks from ~202 to ~189 bytes, so the ``calls`` table keeps 5 rows a 1 KiB page instead of 4
(53 → 41 pages): 279,552 → 267,264 bytes.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS: dict[str, dict[str, str]] = {
    "nodes": {"determinism": "deterministic"},
    "calls": {"determinism": "deterministic"},
}
"""Frozen copy of ``schema.USUAL_COLUMNS`` as of this revision (a test checks they agree)."""
_UPDATE_TRIGGERS = {"nodes": "nodes_immutable_update", "calls": "calls_immutable_update"}
"""Immutability triggers (rule 7) lifted while their table's values are rewritten."""


def _rewrite(*, to_usual: bool) -> None:
    """On SQLite, every usual value of :data:`COLUMNS` as ``''`` (or back, ``to_usual``), with
    the immutability triggers lifted inside this transaction and put back as they were."""
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    for table, columns in COLUMNS.items():
        trigger = _UPDATE_TRIGGERS[table]
        trigger_sql = conn.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (trigger,)
        ).scalar()
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        for column, usual in columns.items():
            old, new = ("", usual) if to_usual else (usual, "")
            conn.exec_driver_sql(f"UPDATE {table} SET {column} = ? WHERE {column} = ?", (new, old))
        if trigger_sql:
            op.execute(trigger_sql)


def upgrade() -> None:
    """Store the usual values of :data:`COLUMNS` as ``''`` (SQLite)."""
    _rewrite(to_usual=False)


def downgrade() -> None:
    """Store the usual values of :data:`COLUMNS` as themselves again (SQLite)."""
    _rewrite(to_usual=True)
