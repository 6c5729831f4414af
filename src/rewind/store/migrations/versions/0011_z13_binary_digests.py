"""Binary digests: on SQLite, the sha256 columns of the busiest tables hold 32 raw bytes.

The columns named in :data:`rewind.store.schema.DIGEST_COLUMNS` (``blobs.hash``; the input,
output and state hashes of ``nodes``; key, request and result of ``calls`` and of both caches)
held 64 hex characters; on SQLite they now hold the 32 bytes those characters spell, which the
``Digest`` column type turns back into hex for every query (measured on peerbench's 100-step
trace: 665 → 505 KB, the ``blobs`` index 87 → 47 KB). No table changes shape: SQLite keeps a
BLOB in a ``VARCHAR`` column as it is, so the upgrade rewrites values in place (the rows'
old space is reused by new rows; ``VACUUM`` returns it to the file system).

An older Rewind would read those bytes as if they were hex, so the revision exists for it to
refuse the store ("unknown revision"). PostgreSQL stores are unchanged (hex ``VARCHAR(64)``).
A downgrade writes every 32-byte value back as its 64 lowercase hex.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

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


def _rewrite(to_sql: str) -> None:
    """Apply ``to_sql`` (an SQL expression of ``{col}``) to every digest column, with the
    immutability triggers lifted inside this transaction and put back as they were."""
    conn = op.get_bind()
    if conn.dialect.name != "sqlite":
        return
    dbapi = conn.connection.dbapi_connection
    dbapi.create_function("rewind_digest_bytes", 1, _digest_bytes, deterministic=True)
    for table, columns in COLUMNS.items():
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


def upgrade() -> None:
    """SQLite: every 64-lowercase-hex value of the digest columns → its 32 bytes."""
    _rewrite("rewind_digest_bytes({col})")


def downgrade() -> None:
    """SQLite: every 32-byte value of the digest columns → its 64 lowercase hex."""
    _rewrite(
        "CASE WHEN typeof({col}) = 'blob' AND length({col}) = 32 THEN lower(hex({col})) "
        "ELSE {col} END"
    )
