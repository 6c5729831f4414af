"""The table that orders the suite's files under xdist names files that exist."""

from __future__ import annotations

from pathlib import Path

from tests import schedule


def test_every_scheduled_file_exists_and_the_table_is_longest_first() -> None:
    here = Path(__file__).resolve().parent
    missing = [name for name in schedule.FILE_SECONDS if not (here / name).is_file()]
    assert not missing, f"tests/schedule.py names files that are gone: {missing}"
    seconds = list(schedule.FILE_SECONDS.values())
    assert seconds == sorted(seconds, reverse=True) and all(s > 0 for s in seconds)
