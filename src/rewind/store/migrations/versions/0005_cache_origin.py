"""Cache entries keep where their answer came from.

- ``llm_cache.origin`` / ``tool_cache.origin``: NULL for an answer recorded by a run here; the
  trace id for an answer seeded by importing a trace (OTLP). An imported answer serves only
  replays of its own trace and their forks (through their lineage), never another run: a
  crafted trace file must not be able to plant answers for requests other runs will send.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("llm_cache", sa.Column("origin", sa.String(length=64), nullable=True))
    op.add_column("tool_cache", sa.Column("origin", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("tool_cache", "origin")
    op.drop_column("llm_cache", "origin")
