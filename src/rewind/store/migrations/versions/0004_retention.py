"""Retention (``rewind gc``): archived runs, the sanctioned exception to node immutability, and
the blob epoch.

- ``archived_runs``: one row per run moved to the object store by ``rewind gc`` (where its
  archive is, the archive's sha256 and size), so ``rewind archive restore RUN`` can find and
  verify it, and a run id stays taken while it is archived.
- ``archive_permits``: node rows stay immutable (rule 7) except for a run that has a permit row.
  ``rewind gc`` inserts the permit, deletes the run's rows and deletes the permit again, all in
  one transaction: no other transaction ever sees a permit, and no ordinary writer inserts one,
  so an accidental ``DELETE FROM nodes`` still fails with "recorded node rows are immutable".
- ``meta.blob_epoch`` (no row until the first gc that deletes blobs writes it): bumped by every
  such gc; a writer that sees it change forgets which blobs it believed were stored (see
  :mod:`rewind.store.retention`).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TRIGGER = "nodes_immutable_delete"
_MESSAGE = "recorded node rows are immutable"
_PG_FUNCTION = "rewind_refuse_delete_without_permit"


def upgrade() -> None:
    op.create_table(
        "archived_runs",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("parent_run_id", sa.String(length=64), nullable=True),
        sa.Column("pipeline", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("archived_at", sa.Float(), nullable=False),
        sa.Column("archive_ref", sa.Text(), nullable=False),
        sa.Column("archive_sha256", sa.String(length=64), nullable=False),
        sa.Column("archive_bytes", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("run_id"),
    )
    op.create_table(
        "archive_permits",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("run_id"),
    )
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER}")
        op.execute(
            f"CREATE TRIGGER {_TRIGGER} BEFORE DELETE ON nodes WHEN NOT EXISTS"
            " (SELECT 1 FROM archive_permits WHERE run_id = OLD.run_id)"
            f" BEGIN SELECT RAISE(ABORT, '{_MESSAGE}'); END"
        )
    elif dialect == "postgresql":
        op.execute(
            f"CREATE OR REPLACE FUNCTION {_PG_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN IF EXISTS (SELECT 1 FROM archive_permits WHERE run_id = OLD.run_id)"
            " THEN RETURN OLD; END IF; RAISE EXCEPTION '%', TG_ARGV[0]; END $$"
        )
        op.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER} ON nodes")
        op.execute(
            f"CREATE TRIGGER {_TRIGGER} BEFORE DELETE ON nodes FOR EACH ROW"
            f" EXECUTE FUNCTION {_PG_FUNCTION}('{_MESSAGE}')"
        )
    else:
        raise NotImplementedError(f"no immutability triggers for the {dialect} dialect")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER}")
        op.execute(
            f"CREATE TRIGGER {_TRIGGER} BEFORE DELETE ON nodes"
            f" BEGIN SELECT RAISE(ABORT, '{_MESSAGE}'); END"
        )
    else:
        op.execute(f"DROP TRIGGER IF EXISTS {_TRIGGER} ON nodes")
        op.execute(
            f"CREATE TRIGGER {_TRIGGER} BEFORE DELETE ON nodes FOR EACH ROW"
            f" EXECUTE FUNCTION rewind_refuse_change('{_MESSAGE}')"
        )
        op.execute(f"DROP FUNCTION IF EXISTS {_PG_FUNCTION}()")
    op.execute("DELETE FROM meta WHERE key = 'blob_epoch'")
    op.drop_table("archive_permits")
    op.drop_table("archived_runs")
