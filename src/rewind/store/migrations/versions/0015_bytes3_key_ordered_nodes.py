"""Key-ordered ``nodes`` and ``archive_permits`` on SQLite.

- ``nodes`` becomes a ``WITHOUT ROWID`` table on SQLite (as 0011 and 0012 did for the others):
  its rows live in the ``(run_id, position)`` key's own b-tree instead of a rowid table plus a
  copy of that key (32 + ~3 bytes a row) in the index ``sqlite_autoindex_nodes_1``. 0011 kept
  its rowids because a node row was ~290 bytes, over the ~230 a ``WITHOUT ROWID`` row keeps on
  a 1 KiB page before the rest spills to an overflow page; since 0011 (binary digests) and 0013
  (usual values as ``''``) a node row is ~190 bytes. A row that is still longer (a long
  ``params_json`` or ``error``) spills its tail to an overflow page: it costs a page more, but
  reads the same.
- ``archive_permits`` (always empty outside ``rewind gc``'s own transaction) becomes
  ``WITHOUT ROWID`` too: one page less in every store. 0012 could not rebuild it because the
  ``nodes`` delete trigger names it and SQLite refuses to rename a table a trigger names; here
  the trigger is dropped first and put back with the rebuilt ``nodes``.

Rows, indexes and triggers are kept as they are; a downgrade rebuilds both with rowids.
PostgreSQL is unchanged (the revision is a no-op there). Nothing an older Rewind reads changes
(the same columns and values), but it would not know the revision, so it refuses the store
("unknown revision") as for every newer store.

Measured with ``benchmarks/storage.py``: peerbench's 100-step trace 258,048 → 246,784 bytes (the
nodes index's 10 pages and archive_permits' index page); the 200-node Burr chain 723,968 →
703,488 bytes.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY_ORDERED = ("archive_permits", "nodes")
"""Tables rebuilt ``WITHOUT ROWID`` on SQLite by this revision, in rebuild order."""
_PERMIT_TRIGGER = "nodes_immutable_delete"
"""The ``nodes`` trigger that names ``archive_permits`` (rule 7's one exception, 0004)."""


def _rebuild(table: str, *, with_rowid: bool) -> None:
    """Revision 0011's table rebuild (rows, indexes and triggers kept), loaded from its file."""
    path = next(Path(__file__).parent.glob("0011_*.py"))
    spec = importlib.util.spec_from_file_location("rewind_revision_0011_for_0015", path)
    module: Any = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module._rebuild(table, with_rowid=with_rowid)


def _rebuild_all(*, with_rowid: bool) -> None:
    """On SQLite, :data:`KEY_ORDERED` rebuilt with or without rowids (rows, indexes and
    triggers kept); the ``nodes`` delete trigger lifted while ``archive_permits`` is renamed."""
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    trigger_sql = conn.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (_PERMIT_TRIGGER,)
    ).scalar()
    # A view of either table (a user's own) is left dangling by the rebuild's DROP TABLE, and
    # SQLite then refuses the RENAME that puts the table back ("error in view ..."): the legacy
    # rename checks no other view or trigger; the view names the table again once it is back.
    legacy = conn.exec_driver_sql("PRAGMA legacy_alter_table").scalar()
    op.execute("PRAGMA legacy_alter_table=ON")
    try:
        op.execute(f"DROP TRIGGER IF EXISTS {_PERMIT_TRIGGER}")
        _rebuild("archive_permits", with_rowid=with_rowid)
        if trigger_sql:
            op.execute(trigger_sql)
        _rebuild("nodes", with_rowid=with_rowid)
    finally:
        op.execute(f"PRAGMA legacy_alter_table={'ON' if legacy else 'OFF'}")


def upgrade() -> None:
    """On SQLite: ``archive_permits`` and ``nodes`` rebuilt ``WITHOUT ROWID``."""
    _rebuild_all(with_rowid=False)


def downgrade() -> None:
    """On SQLite: ``archive_permits`` and ``nodes`` rebuilt with rowids."""
    _rebuild_all(with_rowid=True)
