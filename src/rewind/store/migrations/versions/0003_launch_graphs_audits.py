"""Runs keep how a Burr app was launched, the graph and code they ran, and their effect audits.

- ``runs.launch_json``: runtime inputs and halt conditions a fork replays (existing runs: ``{}``).
- ``run_graphs``: each run's graph document (nodes with code fingerprints, transitions) and, for
  a fork, the drift from its parent's recording; immutable once written (rule 7).
- ``audits``: one row per effect audit; the newest is the run's "admissible" label.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TRIGGER = "run_graphs_immutable_update"
_MESSAGE = "recorded run graphs are immutable"


def upgrade() -> None:
    op.add_column("runs", sa.Column("launch_json", sa.Text(), nullable=False, server_default="{}"))
    op.create_table(
        "run_graphs",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("graph_hash", sa.String(length=64), nullable=False),
        sa.Column("drift_json", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
        sa.PrimaryKeyConstraint("run_id"),
    )
    op.create_table(
        "audits",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("audited_at", sa.Float(), nullable=False),
        sa.Column("against", sa.String(length=64), nullable=True),
        sa.Column("label", sa.String(length=24), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("counts_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"]),
        sa.PrimaryKeyConstraint("run_id", "seq"),
    )
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute(
            f"CREATE TRIGGER IF NOT EXISTS {_TRIGGER} BEFORE UPDATE ON run_graphs"
            f" BEGIN SELECT RAISE(ABORT, '{_MESSAGE}'); END"
        )
    elif dialect == "postgresql":
        op.execute(
            f"CREATE TRIGGER {_TRIGGER} BEFORE UPDATE ON run_graphs FOR EACH ROW"
            f" EXECUTE FUNCTION rewind_refuse_change('{_MESSAGE}')"
        )
    else:
        raise NotImplementedError(f"no immutability triggers for the {dialect} dialect")


def downgrade() -> None:
    on = " ON run_graphs" if op.get_bind().dialect.name == "postgresql" else ""
    op.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER}{on}")
    op.drop_table("audits")
    op.drop_table("run_graphs")
    op.drop_column("runs", "launch_json")
