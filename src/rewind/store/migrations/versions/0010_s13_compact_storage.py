"""Compact storage: ``zd1`` blobs and Burr state rows stored as deltas.

No table changes; two stored formats older Rewinds cannot read (see :mod:`rewind.store.codec`
and :func:`rewind.store.store.state_deltas`):

- ``blobs.codec`` may be ``zd1`` (raw DEFLATE primed with a frozen preset dictionary);
- ``burr_state.fields_json`` may be a JSON array ``[base sequence id, {changed field: hash},
  [removed fields]]`` — a delta of the app's previous state row — instead of a full map.

The revision exists so a Rewind that knows neither refuses the store ("unknown revision")
instead of returning compressed bytes as if they were raw, or a delta as if it were the state.
A downgrade rewrites every ``zd1`` blob as ``raw`` and every delta row as its full map, and
writes the rows of every trace replay stored by reference (:mod:`rewind.store.references`,
written since this revision) in full: a Rewind at 0009 reads node rows, not references.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nothing to change: new rows may use the new formats from now on."""


def downgrade() -> None:
    """Store every ``zd1`` blob as ``raw``, every state delta as its full map and every replay
    stored by reference with rows of its own."""
    from rewind.store.codec import unpack

    conn = op.get_bind()
    _write_references_out(conn)
    blobs = sa.table(
        "blobs",
        sa.column("hash", sa.String),
        sa.column("codec", sa.String),
        sa.column("data", sa.LargeBinary),
    )
    rows = conn.execute(sa.select(blobs.c.hash, blobs.c.data).where(blobs.c.codec == "zd1"))
    for digest, data in rows.all():
        conn.execute(
            blobs.update()
            .where(blobs.c.hash == digest)
            .values(codec="raw", data=unpack("zd1", data))
        )
    states = sa.table(
        "burr_state",
        sa.column("partition_key", sa.String),
        sa.column("app_id", sa.String),
        sa.column("sequence_id", sa.Integer),
        sa.column("fields_json", sa.Text),
    )
    # State rows are immutable (trigger state_immutable_update, revision 0001): lifted for the
    # rewrite inside this transaction, then put back as it was.
    dialect = conn.dialect.name
    if dialect == "postgresql":
        op.execute("ALTER TABLE burr_state DISABLE TRIGGER state_immutable_update")
    else:
        trigger_sql = conn.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?",
            ("state_immutable_update",),
        ).scalar()
        op.execute("DROP TRIGGER IF EXISTS state_immutable_update")
    key = (states.c.partition_key, states.c.app_id, states.c.sequence_id)
    full: dict[tuple[str, str, int], dict[str, str]] = {}
    for pk, app, seq, stored in conn.execute(
        sa.select(*key, states.c.fields_json).order_by(*key)
    ).all():
        value = json.loads(stored)
        if not isinstance(value, list):
            full[(pk, app, seq)] = value
            continue
        base, changed, removed = value
        fields = dict(full[(pk, app, base)]) | changed
        for name in removed:
            fields.pop(name, None)
        full[(pk, app, seq)] = fields
        conn.execute(
            states.update()
            .where(*(c == v for c, v in zip(key, (pk, app, seq), strict=True)))
            .values(fields_json=json.dumps(fields, sort_keys=True))
        )
    if dialect == "postgresql":
        op.execute("ALTER TABLE burr_state ENABLE TRIGGER state_immutable_update")
    elif trigger_sql:
        op.execute(trigger_sql)


def _write_references_out(conn: sa.Connection) -> None:
    """Give every trace replay stored by reference the node, call and span rows it shares with
    its source (as the readers of this revision build them) and drop its ``reference`` key."""
    from rewind.store.references import REFERENCE_KEY, reference_of, resolve

    runs = sa.table(
        "runs",
        sa.column("run_id", sa.String),
        sa.column("config_json", sa.Text),
        sa.column("created_at", sa.Float),
    )
    tables = {name: sa.Table(name, sa.MetaData(), autoload_with=conn) for name in _ROWS}
    found = conn.execute(
        sa.select(runs.c.run_id, runs.c.config_json, runs.c.created_at).where(
            runs.c.config_json.like(f'%"{REFERENCE_KEY}"%')
        )
    ).all()
    for run_id, config_json, created_at in found:
        config = json.loads(config_json or "{}")
        ref = reference_of(config)
        if ref is None:
            continue
        rows = resolve(conn, run_id, config, float(created_at))
        assert rows is not None
        shared = ref[1]
        nodes = [n for n in rows.nodes if n["position"] < shared]
        calls = [c for p, cs in rows.calls.items() if p < shared for c in cs]
        spans = [sp for p, sp in rows.spans.items() if 0 <= p < shared]
        for name, batch in (("nodes", nodes), ("calls", calls), ("spans", spans)):
            if batch:
                conn.execute(tables[name].insert(), batch)
        config.pop(REFERENCE_KEY)
        conn.execute(
            runs.update()
            .where(runs.c.run_id == run_id)
            .values(config_json=json.dumps(config, sort_keys=True))
        )


_ROWS = ("nodes", "calls", "spans")
