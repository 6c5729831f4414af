"""Lean traces: no state row per completed traced step, step spans packed, more key-ordered
tables on SQLite.

- A traced step's state row repeated its state document: the row's ``{field: blob hash}`` map is
  exactly the blob its node row names as ``state_hash``. ``write_trace`` no longer stores the
  rows of a trace's completed steps (a failed step's row, the state before it, has no such
  document and stays); :meth:`rewind.store.Store.load_state_row` derives them from the node row
  and its state document. Upgrading deletes the derivable rows of every trace (a run with a
  root span row), after writing a kept row that was stored as a delta of a deleted one as its
  full map. A downgrade writes every derived row back (a full map).
- On SQLite, :data:`KEY_ORDERED` become ``WITHOUT ROWID`` tables (as 0011 did for four
  others): their rows are small, and a rowid table keeps a second copy of its key in an index
  of its own — a page even when the table is empty. ``spans`` is the one that matters (a row
  per traced step); the others are usually empty.

- A trace's step spans are packed into its root span row (new column ``spans.steps``, see
  :mod:`rewind.store.spans`): nobody queries a step span on its own. Upgrading packs the step
  span rows of every stored trace the same way (readers take both forms anyway); a downgrade
  writes packed step spans back as rows and drops the column.
- A traced chain's small blobs are written as two zlib-compressed packs (new table
  ``blob_packs``; their ``blobs`` rows, codec ``p-raw``/``p-hex1``, name a slice of one;
  :func:`rewind.store.codec.pack_together`): its documents (node input, output and state maps,
  field values) and its calls' requests and results (a replay reads those all at once).
  Upgrading leaves stored blobs as they are; a downgrade stores every packed blob on its own
  again and drops the table.

Measured on peerbench's 100-step trace (``benchmarks/storage.py``'s trace figure): 431,104 →
278,528 bytes (state rows −46 KB; spans −38 KB of rows and index, +8 KB packed; the small
tables' key indexes −6 KB; the two packs −64 KB).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import importlib.util
import json
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY_ORDERED = (
    "spans",
    "meta",
    "edges",
    "artifacts",
    "run_graphs",
    "audits",
    "users",
)
"""Tables rebuilt ``WITHOUT ROWID`` on SQLite by this revision (not ``archive_permits``: a
trigger on ``nodes`` names it, and SQLite refuses to rename a table over it)."""

_DERIVABLE = sa.text(
    # A trace's own completed steps: each names its state document (the row's full map).
    "SELECT n.run_id, n.sequence_id, n.name, n.state_hash, n.started_at FROM nodes n"
    " WHERE n.src_app_id = n.run_id AND n.src_sequence_id = n.sequence_id"
    " AND n.state_hash IS NOT NULL AND n.error IS NULL"
    " AND EXISTS (SELECT 1 FROM spans s WHERE s.run_id = n.run_id AND s.position = -1)"
)
_STATES = sa.table(
    "burr_state",
    sa.column("partition_key", sa.String),
    sa.column("app_id", sa.String),
    sa.column("sequence_id", sa.Integer),
    sa.column("position", sa.String),
    sa.column("status", sa.String),
    sa.column("fields_json", sa.Text),
    sa.column("internal_json", sa.Text),
    sa.column("created_at", sa.Float),
)


def _revision_0011() -> Any:
    """Revision 0011's module (its table rebuild is this revision's too)."""
    path = next(Path(__file__).parent.glob("0011_*.py"))
    spec = importlib.util.spec_from_file_location("rewind_revision_0011_for_0012", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _derivable(conn: sa.Connection) -> dict[tuple[str, int], tuple[str, Any, float]]:
    """(trace id, sequence id) → (step name, state hash as stored, started_at) of every step
    whose state row is derivable."""
    return {(r[0], r[1]): (r[2], r[3], r[4]) for r in conn.execute(_DERIVABLE).all()}


def upgrade() -> None:
    """Delete the derivable state rows of traces; on SQLite rebuild :data:`KEY_ORDERED`
    ``WITHOUT ROWID``."""
    conn = op.get_bind()
    derivable = _derivable(conn)
    apps = sorted({app for app, _seq in derivable})
    s = _STATES.c
    for app in apps:
        rows = conn.execute(
            sa.select(s.sequence_id, s.status, s.fields_json)
            .where(s.partition_key == "", s.app_id == app)
            .order_by(s.sequence_id)
        ).all()
        full: dict[int, dict[str, str]] = {}
        gone: set[int] = set()
        for seq, status, stored in rows:
            value = json.loads(stored)
            base = None
            if isinstance(value, list):
                base, changed, removed = value
                fields = dict(full[base]) | changed
                for name in removed:
                    fields.pop(name, None)
                value = fields
            full[seq] = value
            if status == "completed" and (app, seq) in derivable:
                gone.add(seq)
                continue
            if base is not None and base in gone:
                # kept, but a delta of a row that goes: delete and insert it as its full map
                # (state rows are immutable: no UPDATE)
                (row,) = conn.execute(
                    sa.select(_STATES).where(
                        s.partition_key == "", s.app_id == app, s.sequence_id == seq
                    )
                ).all()
                conn.execute(
                    _STATES.delete().where(
                        s.partition_key == "", s.app_id == app, s.sequence_id == seq
                    )
                )
                conn.execute(
                    _STATES.insert().values(
                        dict(row._mapping) | {"fields_json": json.dumps(value, sort_keys=True)}
                    )
                )
        for seq in gone:
            conn.execute(
                _STATES.delete().where(s.partition_key == "", s.app_id == app, s.sequence_id == seq)
            )
    op.add_column("spans", sa.Column("steps", sa.LargeBinary, nullable=True))
    _pack_spans(conn)
    op.create_table(
        "blob_packs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    if conn.dialect.name == "sqlite":
        rebuild = _revision_0011()._rebuild
        for table in KEY_ORDERED:
            rebuild(table, with_rowid=False)


def downgrade() -> None:
    """Write every derivable state row of a trace that is not stored (a full map); on SQLite
    rebuild :data:`KEY_ORDERED` with rowids."""
    from rewind.store.codec import unpack

    conn = op.get_bind()
    _blobs_out_of_packs(conn)
    _unpack_spans(conn)
    if conn.dialect.name == "sqlite":
        rebuild = _revision_0011()._rebuild
        for table in KEY_ORDERED:
            rebuild(table, with_rowid=True)
    s = _STATES.c
    stored = {
        (r[0], r[1])
        for r in conn.execute(sa.select(s.app_id, s.sequence_id).where(s.partition_key == ""))
    }
    missing = {k: v for k, v in _derivable(conn).items() if k not in stored}
    read = sa.text(
        "SELECT b.codec, b.data, (SELECT d.data FROM blob_data d WHERE d.hash = b.hash)"
        " FROM blobs b WHERE b.hash = :h"
    )
    rows = []
    for (app, seq), (name, state_hash, started_at) in sorted(missing.items()):
        found = conn.execute(read, {"h": state_hash}).first()
        if found is None:
            raise RuntimeError(f"state document of {app}#{seq} is missing: the store is damaged")
        codec, data, spilled = found
        if codec.startswith("x-"):
            codec, data = codec[2:], spilled
        fields = json.loads(unpack(codec, data))
        rows.append(
            {
                "partition_key": "",
                "app_id": app,
                "sequence_id": seq,
                "position": name,
                "status": "completed",
                "fields_json": json.dumps(fields, sort_keys=True),
                "internal_json": "{}",
                "created_at": started_at,
            }
        )
    if rows:
        conn.execute(_STATES.insert(), rows)


def _spans_table() -> sa.TableClause:
    return sa.table(
        "spans",
        *(sa.column(c) for c in (*_STEP_COLUMNS, "run_id", "output_hash")),
        sa.column("steps", sa.LargeBinary),
    )


def _pack_spans(conn: sa.Connection) -> None:
    """Every trace's step span rows packed into its root row (as ``write_trace`` now writes
    them: the same bytes)."""
    spans = _spans_table()
    roots = [
        r[0] for r in conn.execute(sa.select(spans.c.run_id).where(spans.c.position == -1)).all()
    ]
    for run_id in roots:
        rows = conn.execute(
            sa.select(*(spans.c[c] for c in _STEP_COLUMNS))
            .where(spans.c.run_id == run_id, spans.c.position != -1)
            .order_by(spans.c.position)
        ).all()
        if not rows:
            continue
        columns = {c: [r._mapping[c] for r in rows] for c in _STEP_COLUMNS}
        doc = {"v": 1, "columns": columns}
        data = zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)
        conn.execute(spans.delete().where(spans.c.run_id == run_id, spans.c.position != -1))
        conn.execute(
            spans.update()
            .where(spans.c.run_id == run_id, spans.c.position == -1)
            .values(steps=data)
        )


def _unpack_spans(conn: sa.Connection) -> None:
    """Every packed root span row's step spans back as rows of their own; the column dropped."""
    spans = _spans_table()
    packed = conn.execute(
        sa.select(spans.c.run_id, spans.c.steps).where(
            spans.c.position == -1, spans.c.steps.is_not(None)
        )
    ).all()
    for run_id, data in packed:
        doc = json.loads(zlib.decompress(bytes(data)))
        if doc.get("v") != 1:
            raise RuntimeError(f"packed step spans of trace {run_id}: unknown version")
        columns = doc["columns"]
        rows = [
            {"run_id": run_id, **{c: columns[c][i] for c in _STEP_COLUMNS}, "output_hash": None}
            for i in range(len(columns["position"]))
        ]
        if rows:
            conn.execute(spans.insert(), rows)
    op.execute("ALTER TABLE spans DROP COLUMN steps")


_STEP_COLUMNS = (
    "position",
    "span_id",
    "parent_position",
    "step_type",
    "status",
    "error_type",
    "error_message",
    "attributes_json",
    "started_at",
    "ended_at",
    "duration_ms",
)
"""Frozen copy of ``rewind.store.spans.STEP_COLUMNS`` (pack version 1)."""


def _blobs_out_of_packs(conn: sa.Connection) -> None:
    """Every packed blob (codec ``p-...``) stored on its own as 0011 stores blobs (its packed
    bytes in ``blob_data`` when they are SPILL_MIN_BYTES or longer); ``blob_packs`` dropped."""
    from rewind.store.codec import pack, read_pack_ref, unpack_slice

    blobs = sa.table(
        "blobs",
        sa.column("hash"),
        sa.column("codec", sa.String),
        sa.column("data", sa.LargeBinary),
    )
    blob_data = sa.table("blob_data", sa.column("hash"), sa.column("data", sa.LargeBinary))
    packs = sa.table("blob_packs", sa.column("id", sa.Integer), sa.column("data", sa.LargeBinary))
    plain = {i: zlib.decompress(d) for i, d in conn.execute(sa.select(packs.c.id, packs.c.data))}
    rows = conn.execute(
        sa.select(blobs.c.hash, blobs.c.codec, blobs.c.data).where(blobs.c.codec.like("p-%"))
    ).all()
    spill = conn.dialect.name == "sqlite"
    for digest, codec, ref in rows:
        pack_id, offset, length = read_pack_ref(ref)
        codec, packed = pack(unpack_slice(codec, plain[pack_id], offset, length))
        if spill and len(packed) >= _SPILL_MIN_BYTES:
            conn.execute(blob_data.insert().values(hash=digest, data=packed))
            codec, packed = "x-" + codec, b""
        conn.execute(blobs.update().where(blobs.c.hash == digest).values(codec=codec, data=packed))
    op.drop_table("blob_packs")


_SPILL_MIN_BYTES = 161
"""Frozen copy of ``schema.SPILL_MIN_BYTES`` (0011's)."""
