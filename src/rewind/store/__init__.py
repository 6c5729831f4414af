"""Rewind's store: one interface (``Store``), SQLite by default, any SQLAlchemy URL otherwise."""

from rewind.store.records import CallRecord, NodeRecord, RunRecord
from rewind.store.store import CacheEntry, Store, open_store

__all__ = ["CacheEntry", "CallRecord", "NodeRecord", "RunRecord", "Store", "open_store"]
