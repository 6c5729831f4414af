"""Rewind's store: one interface (``Store``), SQLite by default, any SQLAlchemy URL otherwise."""

from rewind.store.records import CallRecord, EffectRecord, NodeRecord, RunRecord
from rewind.store.store import CacheEntry, Store, open_store

__all__ = [
    "CacheEntry",
    "CallRecord",
    "EffectRecord",
    "NodeRecord",
    "RunRecord",
    "Store",
    "open_store",
]
