"""Rewind's store: one interface (``Store``), SQLite by default, any SQLAlchemy URL otherwise."""

from rewind.store.records import CallRecord, EffectRecord, NodeRecord, RunGraph, RunRecord
from rewind.store.store import CacheEntry, Store, open_store

__all__ = [
    "CacheEntry",
    "CallRecord",
    "EffectRecord",
    "NodeRecord",
    "RunGraph",
    "RunRecord",
    "Store",
    "open_store",
]
