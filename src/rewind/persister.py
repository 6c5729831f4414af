"""Rewind's Burr persister: state stored content-addressed, one blob per top-level field.

Burr's ``SQLitePersister`` writes the whole state as one JSON document per step; here each field
is a blob keyed by its sha256, so a field that did not change costs no new bytes (the same idea as
LangGraph's per-channel versions). The state row itself is a small ``{field: hash}`` map.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from burr.core import State
from burr.core.persistence import BaseStatePersister, PersistedStateData
from sqlalchemy import Connection

from rewind.canonical import canonical_bytes, sha256_hex
from rewind.store import Store

PARTITION_KEY_DEFAULT = ""


def state_fields(state: State) -> dict[str, bytes]:
    """Each top-level field of a Burr state as canonical JSON bytes (Burr serde applied first).

    Raises:
        CanonicalError: a value cannot be hashed canonically (NaN, bytes, an unknown type).
    """
    return {k: canonical_bytes(v) for k, v in state.serialize().items()}


class RewindPersister(BaseStatePersister):
    """A Burr ``BaseStatePersister`` over Rewind's store.

    Args:
        store: the Rewind store holding ``burr_state`` rows and blobs.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def is_initialized(self) -> bool:
        return True

    def list_app_ids(self, partition_key: str, **kwargs: Any) -> list[str]:
        return self.store.state_app_ids(partition_key or PARTITION_KEY_DEFAULT)

    def load(
        self,
        partition_key: str,
        app_id: str | None,
        sequence_id: int | None = None,
        **kwargs: Any,
    ) -> PersistedStateData | None:
        """Load a state row (the latest of ``app_id`` when ``sequence_id`` is None)."""
        if app_id is None:
            return None
        row = self.store.load_state_row(partition_key or PARTITION_KEY_DEFAULT, app_id, sequence_id)
        if row is None:
            return None
        return PersistedStateData(
            partition_key=row["partition_key"],
            app_id=row["app_id"],
            sequence_id=row["sequence_id"],
            position=row["position"],
            state=State.deserialize(row["values"]),
            created_at=datetime.fromtimestamp(row["created_at"], UTC).isoformat(),
            status=row["status"],
        )

    def save(
        self,
        partition_key: str | None,
        app_id: str,
        sequence_id: int,
        position: str,
        state: State,
        status: Literal["completed", "failed"],
        **kwargs: Any,
    ) -> None:
        """Save a state row in its own transaction (the recorder batches it with the node row)."""
        with self.store.write() as conn:
            self.save_in(
                conn, partition_key, app_id, sequence_id, position, state_fields(state), status
            )

    def save_in(
        self,
        conn: Connection,
        partition_key: str | None,
        app_id: str,
        sequence_id: int,
        position: str,
        fields: dict[str, bytes],
        status: str,
    ) -> dict[str, str]:
        """Write field blobs and the state row inside ``conn``'s transaction; returns hashes."""
        hashes = {}
        for k, data in fields.items():
            digest = sha256_hex(data)
            self.store.put_blob_hashed(conn, digest, data)
            hashes[k] = digest
        self.store.save_state(
            conn,
            partition_key=partition_key or PARTITION_KEY_DEFAULT,
            app_id=app_id,
            sequence_id=sequence_id,
            position=position,
            status=status,
            fields=hashes,
        )
        return hashes
