"""Rewind's Burr persister: state stored content-addressed, one blob per top-level field.

Burr's ``SQLitePersister`` writes the whole state as one JSON document per step; here each
semantic field is a blob keyed by its sha256, so a field that did not change costs no new bytes
(the same idea as LangGraph's per-channel versions). The state row itself is a small
``{field: hash}`` map plus Burr's internal ``__`` keys inline.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from burr.core import State
from burr.core.persistence import BaseStateLoader, BaseStatePersister, PersistedStateData

from rewind.canonical import CanonicalError, canonical_bytes, sha256_hex
from rewind.errors import UnstorableValue
from rewind.serde import encode_field
from rewind.store import Store
from rewind.store.store import WriteBatch, state_row

PARTITION_KEY_DEFAULT = ""
BURR_INTERNAL_PREFIX = "__"
"""Burr keeps ``__PRIOR_STEP``/``__SEQUENCE_ID`` in state; semantic state drops them (rule 1)."""


@dataclass(frozen=True)
class EncodedField:
    """One state field as canonical JSON bytes and their sha256 hex."""

    data: bytes
    digest: str


def encode_value(key: str, value: Any) -> EncodedField:
    """Canonical bytes of one state field's exact document (:func:`rewind.serde.encode_field`).

    Plain JSON values (str keys in canonical order) are hashed as they are, so their bytes and
    hashes are the ones Rewind always wrote; any other value is hashed over its tagged document,
    so two values that load back differently never share a hash.

    Raises:
        UnstorableValue: the value cannot be stored exactly (the message names the path from
            ``key``, the type and how to register a serializer).
            NaN and ±Infinity are refused the same way (:mod:`rewind.canonical`'s rule).
    """
    try:
        data = canonical_bytes(encode_field(key, value))
    except CanonicalError as exc:
        where = key + exc.path[1:]
        raise UnstorableValue(
            f"state field {where} cannot be hashed: {exc.problem}",
            "replace the value before the node writes it to state",
            path=where,
            type_name="",
        ) from exc
    return EncodedField(data, sha256_hex(data))


def split_internal(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(semantic fields, Burr's internal ``__`` fields) of a state's values."""
    semantic, internal = {}, {}
    for k, v in values.items():
        (internal if k.startswith(BURR_INTERNAL_PREFIX) else semantic)[k] = v
    return semantic, internal


class FieldEncoder:
    """Encodes a run's successive states, re-encoding only fields that can have changed.

    Burr's contract is that an action changes only the fields it declares in ``writes``; every
    other field of the new state is the very same object as before. So a field is re-encoded when
    the action writes it or when its object is not the one encoded last time; otherwise the
    previous encoding is reused. (A node that mutates, in place, a field it does not declare in
    ``writes`` breaks Burr's contract and is not seen.)
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[Any, EncodedField]] = {}

    def field(self, key: str, value: Any) -> EncodedField:
        """Encoding of one field, reusing the last one when the object is unchanged."""
        prev = self._last.get(key)
        if prev is not None and prev[0] is value:
            return prev[1]
        return encode_value(key, value)

    def encode(
        self, semantic: dict[str, Any], *, written: Collection[str] = ()
    ) -> tuple[dict[str, EncodedField], list[str]]:
        """Encode every semantic field.

        Args:
            semantic: field → value (no ``__`` keys).
            written: fields the action declared in ``writes`` (always re-encoded).
        Returns:
            (field → encoding, names of the fields encoded afresh in this call)
        """
        out: dict[str, EncodedField] = {}
        fresh: list[str] = []
        for k, v in semantic.items():
            prev = self._last.get(k)
            if prev is not None and prev[0] is v and k not in written:
                out[k] = prev[1]
            else:
                out[k] = encode_value(k, v)
                fresh.append(k)
        self._last = {k: (semantic[k], out[k]) for k in out}
        return out, fresh


def field_map(fields: dict[str, EncodedField]) -> dict[str, str]:
    """{field: sha256} of encoded fields."""
    return {k: f.digest for k, f in fields.items()}


def map_hash(fields: dict[str, str]) -> tuple[bytes, str]:
    """Canonical bytes and sha256 of a {field: sha256} map: the Merkle hash of those fields."""
    data = canonical_bytes(fields)
    return data, sha256_hex(data)


class ForkStartLoader(BaseStateLoader):
    """The state initializer of a fork's Burr app: it loads the fork's starting state (the rows
    of ``app_id``) and nothing else.

    Burr hands an app's state initializer on to the sub-applications of its parallel actions
    (``MapStates``...), which then resume from the latest state stored under their own app id.
    A recorded run has no initializer, so its sub-applications always start fresh; a fork must
    do the same, or a looped map node would find the first round's sub-run states (Burr gives
    the children the same app ids each round) and run nothing.

    Args:
        persister: the store's persister.
        app_id: the app whose rows the fork starts from.
    """

    def __init__(self, persister: RewindPersister, app_id: str) -> None:
        self.persister = persister
        self.app_id = app_id

    def list_app_ids(self, partition_key: str, **kwargs: Any) -> list[str]:
        """Burr's loader interface: the one app this loader loads."""
        return [self.app_id]

    def load(
        self,
        partition_key: str,
        app_id: str | None,
        sequence_id: int | None = None,
        **kwargs: Any,
    ) -> PersistedStateData | None:
        """The state row :meth:`RewindPersister.load` finds for ``app_id`` when it is the fork's
        source; None (start fresh) for any other app."""
        if app_id != self.app_id:
            return None
        return self.persister.load(partition_key, app_id, sequence_id, **kwargs)


class RewindPersister(BaseStatePersister):
    """A Burr ``BaseStatePersister`` over Rewind's store.

    Args:
        store: the Rewind store holding ``burr_state`` rows and blobs.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def is_initialized(self) -> bool:
        """Always True: the store creates its tables when it opens."""
        return True

    def list_app_ids(self, partition_key: str, **kwargs: Any) -> list[str]:
        """App ids with state rows in a partition (Burr's persister interface)."""
        return self.store.state_app_ids(partition_key or PARTITION_KEY_DEFAULT)

    def load(
        self,
        partition_key: str,
        app_id: str | None,
        sequence_id: int | None = None,
        **kwargs: Any,
    ) -> PersistedStateData | None:
        """Load a state row (the latest of ``app_id`` when ``sequence_id`` is None), every field
        of its recorded type.

        Raises:
            StateLoadError: a field cannot be rebuilt in this process (the fork fails with it).
        """
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
            state=State(row["values"]),
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
        """Save a state row in its own transaction (the recorder batches its rows instead)."""
        batch = WriteBatch()
        self.add_state(batch, partition_key, app_id, sequence_id, position, state, status)
        self.store.write_batch(batch)

    def add_state(
        self,
        batch: WriteBatch,
        partition_key: str | None,
        app_id: str,
        sequence_id: int,
        position: str,
        state: State,
        status: str,
        encoder: FieldEncoder | None = None,
    ) -> dict[str, EncodedField]:
        """Add a state row and its new field blobs to ``batch``; returns the encoded fields."""
        semantic, internal = split_internal(state.get_all())
        fields, fresh = (encoder or FieldEncoder()).encode(semantic)
        for k in fresh:
            batch.blobs.setdefault(fields[k].digest, fields[k].data)
        batch.states.append(
            state_row(
                partition_key=partition_key or PARTITION_KEY_DEFAULT,
                app_id=app_id,
                sequence_id=sequence_id,
                position=position,
                status=status,
                fields=field_map(fields),
                internal=internal,
            )
        )
        return fields
