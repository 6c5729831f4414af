"""API users and run ownership.

- ``users``: one row per API user (name, SHA-256 of the bearer token, team, admin flag,
  revocation time); tokens themselves are never stored.
- ``runs.created_by``: the user a run belongs to (existing runs: None, i.e. unowned local runs,
  which only admins see over an API with users).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("created_by", sa.String(length=64), nullable=True))
    op.create_index("ix_runs_created_by", "runs", ["created_by"])
    op.create_table(
        "users",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=True),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("name"),
        sa.UniqueConstraint("token_hash"),
    )


def downgrade() -> None:
    op.drop_table("users")
    op.drop_index("ix_runs_created_by", table_name="runs")
    op.drop_column("runs", "created_by")
