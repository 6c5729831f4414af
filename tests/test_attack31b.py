"""Attacks on the changes of session 31 (issue #13): read-only opens through ``mode=rw``,
replay-trace fixes, trace id validation and percent-quoted archive keys.

Each test names what it found (a regression test that failed before its fix) or what held.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from rewind.store import open_store
from tests.test_attack31 import restore_whole, trace_under_ids


def test_gc_archives_runs_whose_valid_ids_quote_to_more_than_a_file_name_holds(
    tmp_path: Path,
) -> None:
    """A trace id of 64 non-ASCII characters is valid (the store keeps it on every backend),
    but percent-quoted (e16eded) it is 384 to 768 characters, and a file name holds 255 bytes:
    ``rewind gc`` failed on it with 'cannot write archive/runs/%C3%A9...' (File name too long),
    stopping the whole gc there (no later run archived, no blob swept), on every gc to come.
    Such an id's key is now a hash of it (one segment, unique); restore reads the recorded ref."""
    from rewind.store.retention import collect_garbage

    location = tmp_path / "store"
    ids = ["é" * 64, "\U0001f600" * 64, "/" * 64, "plain"]
    outputs = trace_under_ids(location, ids)
    st = open_store(location)
    try:
        report = collect_garbage(st, 0, now=4e9)
        assert sorted(a.run_id for a in report.archived) == sorted(ids)
        archives = list(location.rglob("*.json.gz"))
        assert len(archives) == 4
        assert all(p.parent == location / "archive" / "runs" for p in archives), archives
        restore_whole(st, outputs)
        assert not list(location.rglob("*.json.gz"))
    finally:
        st.close()


@pytest.mark.parametrize("trace_id", ["\ud800", "ab\udfffcd"])
def test_a_trace_id_that_is_not_utf8_is_refused_before_the_trace_runs(
    tmp_path: Path, trace_id: str
) -> None:
    """A trace id holding a lone surrogate passed the id check of e1bae04 (a str, ≤64
    characters, no NUL), the chain ran (its model calls spent), then the write failed with
    UnicodeEncodeError and the trace was lost (record None), on SQLite and PostgreSQL alike.
    It is now refused when the trace is made, as the other ids no store keeps are."""
    from rewind.tracing import Tracer

    ran = []
    tracer = Tracer(tmp_path, raise_on_write_error=False)
    try:
        with (
            pytest.raises(ValueError, match="a trace id is a string of 1 to 64"),
            tracer.trace("ids", {"q": 1}, trace_id=trace_id),
        ):
            ran.append(1)
    finally:
        tracer.close()
    assert ran == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_a_trace_is_written_does_not_lose_the_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int
) -> None:
    """Ctrl-C (or SIGTERM, which the CLI raises as KeyboardInterrupt) landing after the chain
    ended, while its trace was built and written, raised inside the write: the transaction
    rolled back and the trace was lost, although the CLI said 'the run in progress is marked
    interrupted' (seen: 2 of 30 'rewind replay-trace' runs signalled at random, exit 130, no
    run stored). The trace's exit now holds SIGINT/SIGTERM until its write is done (a second
    one is not held), then raises: the trace is stored as it ended, then KeyboardInterrupt."""
    import rewind.tracing.tracer as tracer_mod
    from rewind.cli.app import _raise_interrupt
    from rewind.tracing import Tracer
    from rewind.tracing.store import load_trace

    real = tracer_mod.write_trace

    def signalled(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(tracer_mod, "write_trace", signalled)
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with pytest.raises(KeyboardInterrupt), tracer.trace("held", {"q": 1}) as t:
            t.set_output(1)
        assert t.record is not None
        st = open_store(tmp_path)
        try:
            assert load_trace(st, t.trace_id).status == "success"
        finally:
            st.close()
    finally:
        tracer.close()
        signal.signal(signal.SIGTERM, old)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_gc_never_writes_over_an_archive_made_before_keys_were_quoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before e16eded an archive's key was the bare run id: a run ``a%2Fb`` archived then is
    at ``archive/runs/a%2Fb.json.gz``, the key the quoted id ``a/b`` has now. Archiving ``a/b``
    wrote over it, and restoring ``a%2Fb`` failed ('does not match its hash'): that run was
    lost. A key another archived run holds is now left alone (the run's archive is named by
    its hash); both runs are restored whole."""
    import rewind.store.retention as retention

    location = tmp_path / "store"
    old = trace_under_ids(location, ["a%2Fb"])
    st = open_store(location)
    try:
        with monkeypatch.context() as m:  # the key as gc wrote it before e16eded
            m.setattr(retention, "_archive_key", lambda run_id: f"archive/runs/{run_id}.json.gz")
            retention.collect_garbage(st, 0, now=4e9)
        assert [r["run_id"] for r in retention.archived_runs(st)] == ["a%2Fb"]
        new = trace_under_ids(location, ["a/b"])
        report = retention.collect_garbage(st, 0, now=4e9)
        assert [a.run_id for a in report.archived] == ["a/b"]
        assert len(list(location.rglob("*.json.gz"))) == 2
        restore_whole(st, {**old, **new})
    finally:
        st.close()
