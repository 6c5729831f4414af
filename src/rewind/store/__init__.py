"""Rewind's store: one interface (``Store``), SQLite by default, any SQLAlchemy URL otherwise.

The records (plain dataclasses) import at once; ``Store`` and ``open_store`` (SQLAlchemy) on
first use, so code that only needs a record type does not load the database layer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rewind._lazy import submodule
from rewind.store.records import CallRecord, EffectRecord, NodeRecord, RunGraph, RunRecord

if TYPE_CHECKING:
    from rewind.store.store import CacheEntry, Store, open_store

_LAZY = {"CacheEntry", "Store", "open_store"}

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


def __getattr__(name: str) -> Any:
    """Import ``Store``, ``open_store`` or ``CacheEntry`` on first use (PEP 562).

    Raises:
        AttributeError: any other name that is not a submodule.
    """
    if name not in _LAZY:
        return submodule("rewind.store", name)
    value = getattr(importlib.import_module("rewind.store.store"), name)
    globals()[name] = value
    return value
