"""Attacks on the storage and compatibility changes of session 32 (issue #13): values the
canonical hasher refuses, odd names, ``meta.runs_epoch``, concurrent gc and restore, read
through stores written by the code before the session and by the new code.

Each test names what it found (a regression test that failed before its fix) or what held.
"""

from __future__ import annotations

import datetime
import os
from decimal import Decimal
from pathlib import Path

import pytest

from rewind.store import open_store
from rewind.tracing import Tracer, step
from rewind.tracing.replay import replay_trace
from rewind.tracing.store import load_trace

UNSORTED_ODD_OUTPUTS = {
    "datetime": {"title": "report", "at": datetime.datetime(2026, 1, 2, 3, 4, 5)},
    "bytes": {"name": "a.png", "data": b"\x89PNG"},
    "decimal": {"total": Decimal("1.10"), "currency": "EUR"},
    "surrogate": {"path": os.fsdecode(b"report-\xff.csv"), "exists": True},
    "nan": {"score": float("nan"), "label": "x"},
}
"""Step outputs: a dict whose keys are not in sorted order holding a value the canonical hasher
refuses (a date, bytes, a Decimal, NaN, a file name that is not UTF-8), as chains return them."""


@pytest.mark.parametrize("kind", sorted(UNSORTED_ODD_OUTPUTS))
def test_a_step_output_with_an_odd_value_reads_back_as_it_was_written_and_replays_unchanged(
    tmp_path: Path, kind: str
) -> None:
    """jsonable kept a dict's own key order when one of its values was refused by the
    canonical hasher (the canonical round trip, which every other dict goes through, sorts
    them). Such a dict is not a plain JSON object to the store, which wrote it as a tagged
    document ``{"$rw": "dict", "keys": [...], "values": [...]}``; the trace reader gave that
    document back as the step's output (rewind show, diff, inspect showed it), and an unchanged
    recorded-calls replay (rewind replay-trace) set it as the step's output: the step was
    'changed, first divergence' (similarity 0.33) in a replay that changed nothing, and the
    replay was stored in full from there. Seen with the old code and the new one alike. The
    dict is now in canonical key order, so it is stored as the plain object it is."""
    value = UNSORTED_ODD_OUTPUTS[kind]
    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with tracer.trace("odd-output", {"q": 1}) as t:
            with step("make", "transform", input={"q": 1}) as s:
                s.set_output(value)
            with step("after", "transform", input={"q": 2}) as s:
                s.set_output("done")
    finally:
        tracer.close()
    st = open_store(tmp_path)
    try:
        source = load_trace(st, t.trace_id).steps
        assert "$rw" not in str(source[0].output)
        assert sorted(source[0].output) == sorted(value)
        replay = replay_trace(st, t.trace_id)
        steps = load_trace(st, replay.run_id).steps
    finally:
        st.close()
    assert [s.output_hash for s in steps] == [s.output_hash for s in source]
    assert [s.state_hash for s in steps] == [s.state_hash for s in source]
    assert replay.config["reference"]["all"] is True


def _old_name_rule(name: object) -> bool:
    """The name check of the code before session 32: 1 to 200 characters (NUL allowed)."""
    return isinstance(name, str) and 0 < len(name) <= 200


@pytest.mark.parametrize("how", ["replay-trace", "in-place"])
def test_a_trace_an_older_rewind_stored_with_a_nul_in_its_names_can_be_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The code before session 32 stored a trace or step name holding NUL on SQLite (its
    check was 1 to 200 characters). The new check (storable_name) refused the name the replay
    took from that trace: ``rewind replay-trace`` of it ended in a traceback (ValueError: 'a
    trace needs a name ... not 'n\\x00...''), and so did ``Tracer.replay(id)`` without
    ``name=``, which the user never passed: the old trace could not be replayed at all. A
    replay now takes the stored names as a store keeps them (rewind.store.records.stored_name:
    NUL escaped), so it runs and is written."""
    import rewind.tracing.tracer as tracer_module

    monkeypatch.setattr(tracer_module, "storable_name", _old_name_rule)
    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with (
            tracer.trace("old\x00name", {"q": 1}) as t,
            step("make\x00it", "transform", input={"q": 1}) as s,
        ):
            s.set_output({"n": 1})
    finally:
        tracer.close()
    monkeypatch.undo()
    st = open_store(tmp_path)
    try:
        assert load_trace(st, t.trace_id).name == "old\x00name"
        if how == "replay-trace":
            replay_id = replay_trace(st, t.trace_id).run_id
        else:
            replayer = Tracer(st, raise_on_write_error=True)
            with (
                replayer.replay(t.trace_id) as r,
                step("make", "transform", input={"q": 1}) as s,
            ):
                s.set_output({"n": 1})
            replay_id = r.trace_id
        view = load_trace(st, replay_id)
    finally:
        st.close()
    assert view.status == "success" and view.name == "old\\u0000name"
    if how == "replay-trace":
        assert [s.name for s in view.steps] == ["make\\u0000it"]
