"""Runs of Burr sub-applications (``MapStates``/``MapActions`` children, recursive apps) are
recorded as runs of their own, linked to the node that spawned them.

- ``runs.spawning_run_id``: the run whose node spawned this sub-run (None for top-level runs);
- ``runs.spawning_position``: that node's position (0-based) in the spawning run;
- ``runs.spawn_key``: which child of that node execution it is (stable across forks: the worker
  lane it was built in and its order there, e.g. ``"2.0"``).

Existing runs are top-level (all three None).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("spawning_run_id", sa.String(length=64), nullable=True))
    op.add_column("runs", sa.Column("spawning_position", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("spawn_key", sa.String(length=64), nullable=True))
    op.create_index("ix_runs_spawning_run_id", "runs", ["spawning_run_id"])


def downgrade() -> None:
    op.drop_index("ix_runs_spawning_run_id", table_name="runs")
    for column in ("spawn_key", "spawning_position", "spawning_run_id"):
        op.drop_column("runs", column)
