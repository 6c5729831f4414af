"""Lazy package attributes (PEP 562): what ``rewind`` and ``rewind.store`` import on first use."""

from __future__ import annotations

import importlib
from typing import Any


def submodule(package: str, name: str) -> Any:
    """``package.name`` imported on first attribute access (``import rewind`` no longer imports
    every submodule eagerly, but ``rewind.replay.Rewind`` keeps working).

    Raises:
        AttributeError: there is no such submodule.
    """
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.{name}":
            raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
