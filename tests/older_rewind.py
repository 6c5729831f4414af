"""Pretend to be an older Rewind: one that knows the store's migrations only up to a revision.

Tests that check an older Rewind refuses a newer store used to copy the migrations folder while
naming every later revision by hand, so each new migration had to edit them all.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rewind.store import migrate


def pretend_older_rewind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, last: str) -> None:
    """Make ``rewind.store.migrate`` know only the revisions up to ``last`` (e.g. ``"0011"``).

    Copies the migrations whose 4-digit prefix is ``<= last`` into ``tmp_path / "migrations"``
    and points ``migrate.MIGRATIONS`` and ``migrate.HEAD`` at them for the rest of the test.
    Raises ``ValueError`` if no migration carries revision ``last``.
    """
    versions = migrate.MIGRATIONS / "versions"
    if not any(path.name.startswith(f"{last}_") for path in versions.glob("*.py")):
        raise ValueError(f"no migration {last}_*.py in {versions}")

    def later(folder: str, names: list[str]) -> set[str]:
        skipped = {name for name in names if name == "__pycache__"}
        if Path(folder) == versions:
            skipped |= {name for name in names if name[:4].isdigit() and name[:4] > last}
        return skipped

    older = tmp_path / "migrations"
    shutil.copytree(migrate.MIGRATIONS, older, ignore=later)
    monkeypatch.setattr(migrate, "MIGRATIONS", older)
    monkeypatch.setattr(migrate, "HEAD", last)
