"""Packed blobs found by the first bytes of their hash (``blob_slices``).

A packed blob (a slice of a ``blob_packs`` row, codec ``p-raw``/``p-hex1``, 0012) took a
``blobs`` row of ~55 bytes: its 32-byte hash, size, codec and a 3-byte pack reference, plus the
b-tree's overhead; a traced chain stores ~11 of them a step. Its bytes are checked against the
whole hash on every read anyway, so the row needs only enough of the hash to find it: a
``blob_slices`` row (``WITHOUT ROWID``) is the first :data:`KEY_BYTES` bytes of the hash and the
slice's reference (pack id, offset, length, and a ``p-hex1`` blob's size: ~20 bytes a row).

Two blobs may share those bytes (by chance, once in ~2^32 pairs of a store's blobs, or made to
with ~2^32 sha256 evaluations): the first keeps the ``blob_slices`` row, any other keeps its
``blobs`` row under the full hash. Readers look in ``blobs`` first, then ``blob_slices``, and a
slice whose bytes do not match the hash asked for is not that blob (a presence check says
absent, and the writer stores it under its full hash; a read reports it missing or damaged).

The upgrade moves every ``p-`` row out of ``blobs`` whose key no other moved row took (in hash
order: of the rows sharing a key, the first moves, the others stay); a row whose pack reference
is damaged stays (reading that blob reports it, as before; the store still opens). A downgrade
hashes every readable slice again to write its ``blobs`` row back, then drops the table.
PostgreSQL stores no packs: the table is created empty there.

Measured with ``benchmarks/storage.py``: peerbench's 100-step trace 246,784 → 206,848 bytes
(``blobs`` 65,536 → 1,024, ``blob_slices`` 24,576).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEY_ORDERED = ("blob_slices",)
"""The table this revision creates ``WITHOUT ROWID`` on SQLite."""
KEY_BYTES = 8
"""Frozen copy of ``rewind.store.codec.SLICE_KEY_BYTES`` (a test checks they are equal)."""
PACKS_KEPT_TRIGGER = "blob_packs_kept"
SWEEP_KEY = "pack_sweep"
"""The ``meta`` key a gc of this revision or newer holds while it deletes packs. A Rewind of
revision 0015 or older still running (it opened the store before this upgrade) deletes every
pack no ``blobs`` row names, which is now most of them: the trigger aborts such a delete
(its gc or ``delete_run`` fails and rolls back) instead of losing those blobs."""
_TRIGGER_SQL = (
    f"CREATE TRIGGER {PACKS_KEPT_TRIGGER} BEFORE DELETE ON blob_packs FOR EACH ROW"
    f" WHEN NOT EXISTS (SELECT 1 FROM meta WHERE key = '{SWEEP_KEY}') BEGIN"
    " SELECT RAISE(ABORT, 'this Rewind is older than the store (schema revision 0016 or"
    " newer): it would delete blob packs it cannot see are used; upgrade it and restart it');"
    " END"
)


def upgrade() -> None:
    op.create_table(
        KEY_ORDERED[0],
        sa.Column("key", sa.LargeBinary, primary_key=True),
        sa.Column("ref", sa.LargeBinary, nullable=False),
        sqlite_with_rowid=False,
    )
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    conn.exec_driver_sql(_TRIGGER_SQL)
    from rewind.store.codec import read_pack_ref, slice_ref

    rows = conn.exec_driver_sql(
        "SELECT hash, codec, data, size FROM blobs WHERE codec LIKE 'p-%' ORDER BY hash"
    ).all()
    slices: dict[bytes, bytes] = {}
    moved: list[tuple[bytes]] = []
    for digest, codec, data, size in rows:
        key = bytes(digest[:KEY_BYTES])
        if len(digest) != 32 or key in slices:
            continue  # a hash 0011 could not store as bytes, or a key another blob holds
        try:
            ref = slice_ref(codec, *read_pack_ref(data), size)
        except ValueError:
            continue  # a damaged row stays as it is: reading that blob reports the damage
        slices[key] = ref
        moved.append((digest,))
    if moved:
        conn.exec_driver_sql(
            "INSERT INTO blob_slices (key, ref) VALUES (?, ?)", list(slices.items())
        )
        conn.exec_driver_sql("DELETE FROM blobs WHERE hash = ?", moved)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {PACKS_KEPT_TRIGGER}")
        _slices_back_to_blobs(conn)
    op.drop_table("blob_slices")


def _slices_back_to_blobs(conn: sa.Connection) -> None:
    """A ``blobs`` row (codec ``p-...``, 0012's pack reference) for every slice whose pack is
    there and whose bytes hash to its key (any other was unreadable already)."""
    from rewind.store.codec import pack_ref, read_slice_ref, unpack_slice

    by_pack: dict[int, list[tuple[str, int, int, int, int]]] = {}
    for (ref,) in conn.exec_driver_sql("SELECT ref FROM blob_slices"):
        try:
            found = read_slice_ref(ref)
        except ValueError:
            continue  # a damaged slice row: its blob was unreadable already
        by_pack.setdefault(found[1], []).append(found)
    rows: list[tuple[bytes, int, str, bytes]] = []
    for pack_id, refs in sorted(by_pack.items()):
        data = conn.exec_driver_sql("SELECT data FROM blob_packs WHERE id = ?", (pack_id,)).scalar()
        try:
            plain = zlib.decompress(data) if data is not None else None
        except zlib.error:
            plain = None
        for codec, _p, offset, length, size in refs:
            try:
                blob = unpack_slice(codec, plain, offset, length) if plain is not None else None
            except ValueError:
                blob = None
            if blob is not None:
                digest = hashlib.sha256(blob).digest()
                rows.append((digest, size, codec, pack_ref(pack_id, offset, length)))
    if rows:
        conn.exec_driver_sql(
            "INSERT INTO blobs (hash, size, codec, data, ref) VALUES (?, ?, ?, ?, NULL) "
            "ON CONFLICT (hash) DO NOTHING",
            rows,
        )
