"""Blobs may be stored with the ``zd1`` codec (raw DEFLATE primed with a preset dictionary).

No table changes: ``blobs.codec`` gains a value (see :mod:`rewind.store.codec`). The revision
exists so a Rewind that does not know ``zd1`` refuses the store ("unknown revision") instead of
returning a compressed blob as if it were raw bytes. A downgrade rewrites every ``zd1`` row as
``raw``, so the older Rewind reads the same bytes.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nothing to change: new rows may use the ``zd1`` codec from now on."""


def downgrade() -> None:
    """Store every ``zd1`` blob as ``raw`` again."""
    from rewind.store.codec import unpack

    blobs = sa.table(
        "blobs",
        sa.column("hash", sa.String),
        sa.column("codec", sa.String),
        sa.column("data", sa.LargeBinary),
    )
    conn = op.get_bind()
    rows = conn.execute(sa.select(blobs.c.hash, blobs.c.data).where(blobs.c.codec == "zd1")).all()
    for digest, data in rows:
        conn.execute(
            blobs.update()
            .where(blobs.c.hash == digest)
            .values(codec="raw", data=unpack("zd1", data))
        )
