"""Lean storage: binary digests, key-ordered tables and the ``hex1`` blob codec.

- The columns named in :data:`rewind.store.schema.DIGEST_COLUMNS` (``blobs.hash``; the input,
  output and state hashes of ``nodes``; key, request and result of ``calls`` and of both caches)
  held 64 hex characters; on SQLite they now hold the 32 bytes those characters spell, which the
  ``Digest`` column type turns back into hex for every query. SQLite keeps a BLOB in a
  ``VARCHAR`` column as it is, so values are rewritten in place.
- ``calls``, ``llm_cache``, ``tool_cache`` and ``blobs`` become ``WITHOUT ROWID`` tables on
  SQLite: their rows live in the primary key's own b-tree instead of a rowid table plus a copy
  of the key in a separate index. Such a row over ~230 bytes (a quarter of a 1 KiB page) spills
  to an overflow page of its own, so a blob's packed bytes of :data:`SPILL_MIN_BYTES` or more
  move to the new table ``blob_data`` (a rowid table keyed by hash; created empty, and left
  empty, on PostgreSQL) and its ``blobs.codec`` becomes ``x-`` + its codec. ``nodes`` keeps its
  rowids: its rows are wider than that.
- A new blob codec on every backend, ``hex1`` (:mod:`rewind.store.codec`): the sha256 hex runs
  of a blob's bytes kept as their 32 bytes (Rewind's ``{field: hash}`` maps are mostly hash).

Measured on peerbench's 100-step trace: 672,768 → 431,104 bytes; ``benchmarks/storage.py``:
916,480 → 754,688. Upgrading rewrites rows in place and leaves the old rows' pages free for new
rows (``VACUUM`` gives them back to the file system).

An older Rewind would read those bytes as if they were hex (and knows neither ``x-`` codecs
nor ``hex1``), so the revision exists for it to refuse the store ("unknown revision"). A
downgrade moves spilled bytes back into ``blobs``, rebuilds the four tables with rowids, writes
every 32-byte value back as its 64 lowercase hex, stores every ``hex1`` blob as ``raw`` and
drops ``blob_data``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS: dict[str, tuple[str, ...]] = {
    "blobs": ("hash",),
    "nodes": ("input_hash", "output_hash", "state_hash"),
    "calls": ("key", "request_hash", "result_hash"),
    "llm_cache": ("key", "request_hash", "response_hash"),
    "tool_cache": ("key", "args_hash", "result_hash"),
    "blob_data": ("hash",),
}
"""Frozen copy of ``schema.DIGEST_COLUMNS`` as of this revision (a test checks they agree)."""
_UPDATE_TRIGGERS = {"nodes": "nodes_immutable_update", "calls": "calls_immutable_update"}
"""Immutability triggers (rule 7) lifted while their table's values are rewritten."""


def _digest_bytes(value: object) -> object:
    if type(value) is str and len(value) == 64:
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            return value
        if raw.hex() == value:
            return raw
    return value


def _rewrite(to_sql: str, tables: Sequence[str]) -> None:
    """Apply ``to_sql`` (an SQL expression of ``{col}``) to every digest column, with the
    immutability triggers lifted inside this transaction and put back as they were."""
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    dbapi = conn.connection.dbapi_connection
    dbapi.create_function("rewind_digest_bytes", 1, _digest_bytes, deterministic=True)
    for table in tables:
        columns = COLUMNS[table]
        trigger = _UPDATE_TRIGGERS.get(table)
        trigger_sql = None
        if trigger is not None:
            trigger_sql = conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = ?", (trigger,)
            ).scalar()
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        sets = ", ".join(f"{c} = {to_sql.format(col=c)}" for c in columns)
        op.execute(f"UPDATE {table} SET {sets}")
        if trigger_sql:
            op.execute(trigger_sql)


_KEY_ORDERED = ("calls", "llm_cache", "tool_cache", "blobs")
"""Tables rebuilt ``WITHOUT ROWID``."""


def _rebuild(table: str, *, with_rowid: bool) -> None:
    """Rebuild ``table`` from its own ``CREATE TABLE`` statement with or without rowids (the
    SQLite way: new table, copy, drop, rename), keeping its rows, indexes and triggers."""
    conn = op.get_bind()
    (create,) = conn.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).one()
    extras = [
        sql
        for (sql,) in conn.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND type IN ('index', 'trigger') "
            "AND sql IS NOT NULL ORDER BY type, name",
            (table,),
        )
    ]
    body = create.strip()
    suffix = " WITHOUT ROWID"
    if body.upper().endswith(suffix):
        body = body[: -len(suffix)].rstrip()
    head = re.match(rf'CREATE TABLE\s+("?){table}\1\s*\(', body)
    if head is None:
        raise RuntimeError(f"unexpected definition of table {table}: {create[:60]!r}")
    new = f"_rebuild_{table}"
    columns = body[head.end() - 1 :]
    op.execute(f"CREATE TABLE {new} {columns}{'' if with_rowid else suffix}")
    op.execute(f"INSERT INTO {new} SELECT * FROM {table}")
    op.execute(f"DROP TABLE {table}")
    op.execute(f"ALTER TABLE {new} RENAME TO {table}")
    for sql in extras:
        op.execute(sql)


SPILL_MIN_BYTES = 161
"""Frozen copy of ``schema.SPILL_MIN_BYTES``: packed bytes this long or longer go to
``blob_data``."""
_INLINE_CODECS = "('raw', 'zlib', 'zd1')"


def upgrade() -> None:
    """``blob_data`` created; on SQLite: every 64-lowercase-hex value of the digest columns → its
    32 bytes, long packed bytes moved to ``blob_data``, the four tables rebuilt ``WITHOUT
    ROWID``."""
    op.create_table(
        "blob_data",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    if op.get_bind().dialect.name != "sqlite":
        return
    _rewrite("rewind_digest_bytes({col})", list(COLUMNS))
    spilled = f"codec IN {_INLINE_CODECS} AND length(data) >= {SPILL_MIN_BYTES}"
    op.execute(f"INSERT INTO blob_data (hash, data) SELECT hash, data FROM blobs WHERE {spilled}")
    op.execute(f"UPDATE blobs SET codec = 'x-' || codec, data = X'' WHERE {spilled}")
    for table in _KEY_ORDERED:
        _rebuild(table, with_rowid=False)


def downgrade() -> None:
    """On SQLite: spilled bytes back in ``blobs``, the four tables rebuilt with rowids, every
    32-byte value of the digest columns → its 64 lowercase hex; ``hex1`` blobs stored ``raw``;
    ``blob_data`` dropped."""
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "UPDATE blobs SET codec = substr(codec, 3), "
            "data = (SELECT d.data FROM blob_data d WHERE d.hash = blobs.hash) "
            "WHERE codec LIKE 'x-%'"
        )
        for table in _KEY_ORDERED:
            _rebuild(table, with_rowid=True)
        _rewrite(
            "CASE WHEN typeof({col}) = 'blob' AND length({col}) = 32 THEN lower(hex({col})) "
            "ELSE {col} END",
            [t for t in COLUMNS if t != "blob_data"],
        )
    _hex1_as_raw()
    op.drop_table("blob_data")


def _hex1_as_raw() -> None:
    """Store every ``hex1`` blob (a codec older Rewinds do not know) as ``raw``."""
    from rewind.store.codec import unpack

    conn = op.get_bind()
    hash_, codec, data = sa.column("hash", sa.String), sa.column("codec"), sa.column("data")
    blobs = sa.table("blobs", hash_, codec, data)
    found = conn.execute(sa.select(hash_, data).where(codec == "hex1")).all()
    if found:
        conn.execute(
            blobs.update()
            .where(hash_ == sa.bindparam("h"))
            .values(codec="raw", data=sa.bindparam("raw", type_=sa.LargeBinary)),
            [{"h": h, "raw": unpack("hex1", d)} for h, d in found],
        )
