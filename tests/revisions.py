"""Load one migration revision's module (``src/rewind/store/migrations/versions/NNNN_*.py``) by
its number, for tests that check a revision's frozen copies of constants against the code's."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from rewind.store import migrate


def load_revision(number: str) -> ModuleType:
    """The module of revision ``number`` (e.g. ``"0016"``), loaded from its file under a name of
    its own (revision files are not importable by package name).

    Raises:
        StopIteration: no revision file starts with ``number``.
    """
    path = next((migrate.MIGRATIONS / "versions").glob(f"{number}_*.py"))
    spec = importlib.util.spec_from_file_location(f"rewind_revision_{number}_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
