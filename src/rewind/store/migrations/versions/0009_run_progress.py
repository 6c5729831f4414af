"""Live progress and cancellation of a run, kept in the store.

- ``runs.live_node`` / ``runs.live_position`` / ``runs.live_since``: the node the run is
  executing now (name, 0-based position, unix seconds it started), written by the process that
  executes the run at each node start, so a server that does not execute it (a ``rewind run``
  in a terminal, another worker) can show the running node.
- ``runs.cancel_requested``: JSON ``{"by", "at"}`` once someone asked to cancel the run; the
  executing process stops at its next node and ends the run ``cancelled``.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("live_node", sa.String(length=200), nullable=True))
    op.add_column("runs", sa.Column("live_position", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("live_since", sa.Float(), nullable=True))
    op.add_column("runs", sa.Column("cancel_requested", sa.Text(), nullable=True))


def downgrade() -> None:
    for column in ("cancel_requested", "live_since", "live_position", "live_node"):
        op.drop_column("runs", column)
