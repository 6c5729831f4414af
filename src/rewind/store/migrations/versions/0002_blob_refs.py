"""Blobs may live in an object store: ``blobs.ref`` holds the object's URL.

A row with ``codec = 'object'`` keeps an empty ``data`` and the reference; every other row is
unchanged, so the upgrade adds one nullable column and rewrites nothing.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("blobs") as batch:
        batch.add_column(sa.Column("ref", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("blobs") as batch:
        batch.drop_column("ref")
