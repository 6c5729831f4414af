"""Usual values: a node or call row's usual ``determinism`` and a node row's own app id are
stored as ``''`` on SQLite.

- A node or call row's ``determinism`` is ``deterministic`` on nearly every row; on SQLite the
  column type :class:`rewind.store.schema.Usual` binds that value as the empty string and reads
  the empty string back as it, so every Core query sees the same values.
- A node row's ``src_app_id`` is its own ``run_id`` on nearly every row (a run's own nodes;
  inherited rows name another run); on SQLite the store writes it as ``''`` then
  (:func:`rewind.store.schema.lean_node_row`) and its readers resolve ``''`` to the row's run id
  (:func:`rewind.store.schema.src_app_of`).

Upgrading rewrites both as ``''`` (immutability triggers lifted inside the transaction and put
back); a downgrade writes the values back. PostgreSQL is unchanged. An older Rewind would read
``''`` as a value of its own, so the revision exists for it to refuse the store ("unknown
revision").

Measured on peerbench's 100-step trace (``benchmarks/storage.py``'s trace figure): a call row
shrinks from ~202 to ~189 bytes and a node row from ~233 to ~188, so both tables keep 5 rows a
1 KiB page instead of 4 (calls 53 → 41 pages, nodes 51 → 41): 279,552 → 257,024 bytes.

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
    """On SQLite, every usual value of :data:`COLUMNS` and every node row's own run id as its
    ``src_app_id`` as ``''`` (or back, ``to_usual``), with the immutability triggers lifted
    inside this transaction and put back as they were."""
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
        if table == "nodes":  # a row's own run id as its src_app_id
            if to_usual:
                op.execute("UPDATE nodes SET src_app_id = run_id WHERE src_app_id = ''")
            else:
                op.execute("UPDATE nodes SET src_app_id = '' WHERE src_app_id = run_id")
        if trigger_sql:
            op.execute(trigger_sql)


def upgrade() -> None:
    """Store the usual values of :data:`COLUMNS` and own app ids as ``''`` (SQLite)."""
    _rewrite(to_usual=False)


def downgrade() -> None:
    """Store the usual values of :data:`COLUMNS` and own app ids as themselves (SQLite)."""
    _rewrite(to_usual=True)
