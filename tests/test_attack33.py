"""Attacks on the last fixes of session 32 (issue #13) and a new user's walk through a Burr
app written by others: table digests (pandas and numpy values with odd labels and dtypes),
names, the replay chain, the diff of failed nodes.

Each test names what it found (a regression test that failed before its fix) or what held.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from rewind.store import open_store
from rewind.tracing import Tracer, step
from rewind.tracing.model import jsonable
from rewind.tracing.store import load_trace


def _hostile_tables() -> dict[str, Callable[[int], Any]]:
    """Values of pandas whose ``to_dict()`` form (4f7d99d) dropped what a replay changed, each
    built with its content depending on ``v``."""
    import pandas as pd

    return {
        "repeated columns": lambda v: pd.DataFrame([[1, 2 + v]], columns=["a", "a"]),
        "repeated row labels": lambda v: pd.DataFrame({"x": [1 + v, 2]}, index=[0, 0]),
        "series, repeated labels": lambda v: pd.Series([1 + v, 2], index=["a", "a"]),
        "columns labelled by dicts": lambda v: pd.DataFrame(
            [[1, 2 + v]], columns=pd.Index([{"a": 1}, {"b": 2}], dtype=object)
        ),
        "series labelled by lists": lambda v: pd.Series(
            [1, 2 + v], index=pd.Index([[1], [2]], dtype=object)
        ),
        "series renamed": lambda v: pd.Series([1.5, 2.0], name=("cost", "revenue")[v]),
        "Timedelta": lambda v: pd.Timedelta(seconds=1 + v),
        "Period": lambda v: pd.Period(f"2020-0{1 + v}", freq="M"),
        "Interval": lambda v: pd.Interval(0, 1 + v),
        "date offset": lambda v: pd.offsets.MonthEnd(1 + v),
    }


@pytest.mark.parametrize("kind", sorted(_hostile_tables()))
def test_a_replay_whose_step_returned_another_odd_table_is_not_unchanged(
    tmp_path: Path, kind: str
) -> None:
    """4f7d99d digests a pandas table by its ``to_dict()``, which keeps one entry per label: a
    DataFrame whose columns or rows repeat a label (a merge's suffix-less result, a concat) or
    a Series with repeated labels had the same digest whatever the other entries held, so a
    replay whose step returned other numbers there was stored with the recorded step's hash,
    unchanged; and pandas warned "columns are not unique" in the user's process at each trace.
    pandas scalars with no ``to_dict`` (``Timedelta``, ``Period``, ``Interval``, offsets) had
    no digest at all: one hash for every duration. Both now carry the digest of a form that
    holds every entry (labels and columns in lists; the scalar's ``repr``). Later: labels
    that cannot key a dict (to_dict raised: no digest) and a Series' name (not in to_dict)."""
    make = _hostile_tables()[kind]
    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with tracer.trace("tables", {"q": 1}) as t, step("s", "transform", input={}) as s:
                s.set_output(make(0))
            with tracer.replay(t.trace_id) as r, step("s", "transform", input={}) as s:
                s.set_output(make(1))
            with tracer.replay(t.trace_id) as same, step("s", "transform", input={}) as s:
                s.set_output(make(0))
    finally:
        tracer.close()
    with contextlib.closing(open_store(tmp_path)) as st:
        hashes = [load_trace(st, x.trace_id).steps[0].output_hash for x in (t, r, same)]
    assert hashes[1] != hashes[0] == hashes[2]  # changed differs, unchanged equal


def test_a_table_with_unique_labels_keeps_the_digest_it_had() -> None:
    """The form of a table whose labels are unique (a Series without a name) is still its
    ``to_dict()``: traces recorded before keep their hashes."""
    import hashlib

    import pandas as pd

    from rewind.canonical import canonical_bytes

    for table in (pd.DataFrame({"city": ["a", "b"], "mean": [1.5, 2.0]}), pd.Series([1, 2])):
        expected = hashlib.sha256(canonical_bytes(jsonable(table.to_dict(), 1))).hexdigest()
        assert jsonable(table) == {"$unhashable": type(table).__name__, "sha256": expected}


def test_the_progress_lines_of_long_node_names_stay_aligned(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Found recording Burr's email-assistant example (``rewind run --app``): the progress
    line padded node names to 10 characters, so under ``determine_clarifications`` the
    outcome, token and time columns of each line started somewhere else. Names are padded
    to the longest printed so far (by their width on screen, after escaping)."""
    from rewind.cli.app import Progress

    progress = Progress()
    for position, name in enumerate(["process_input", "determine_clarifications", "final", "[x]"]):
        payload = {"position": position, "name": name, "outcome": "hit", "reason": None}
        progress.on_event("node_finished", payload | {"tokens": 1, "latency_ms": 1.0})
    lines = capsys.readouterr().err.splitlines()
    assert len({line.index(" tok") for line in lines[1:]}) == 1, lines


def test_the_nodes_table_keeps_numbers_and_tokens_on_an_80_column_terminal() -> None:
    """Found recording Burr's email-assistant example: on an 80-column terminal (or output to
    a pipe, which Rich takes as 80 columns) the table of ``rewind run``/``fork``/``show``
    shortened its number, tokens, ms and flag columns to nothing (empty headers, ``…``) to
    keep the names ``determine_clarifications`` and ``clarify_instructions`` whole: no node
    number to fork at and no tokens (the 0 of an unchanged replay). The numbers keep their
    width; names, outcomes and hashes are cut with an ellipsis."""
    from types import SimpleNamespace

    from rich.console import Console

    from rewind.cli.render import nodes_table

    names = ["process_input", "determine_clarifications", "clarify_instructions", "final_result"]
    nodes = [
        SimpleNamespace(
            position=i, name=name, cache_outcome="miss:bypass", cache_reason="a new run",
            tokens=1234 * i, latency_ms=352.1, output_hash="6fb2ea476e636513" * 4,
            determinism="non-deterministic", error=None,
        )
        for i, name in enumerate(names)
    ]  # fmt: skip
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(nodes_table(nodes, "run x"))  # type: ignore[arg-type]
    text = console.export_text()
    for header in ("#", "tokens", "ms"):
        assert f" {header} ┃" in text, text
    for i in range(len(names)):
        assert f"│ {i + 1} │" in text and f" {1234 * i} │ 352.1 │" in text, text


def test_the_run_line_says_when_it_cut_the_inputs() -> None:
    """Found recording Burr's email-assistant example: the line under the table showed the
    run's inputs cut at 80 characters with nothing to say so (``"email_to_respond": "Can we
    meet Tuesday?", "fe``), which reads as a malformed input. A cut now ends with ``…``; short
    inputs are shown whole."""
    from rewind.cli.render import run_summary
    from rewind.store.records import RunRecord

    def line(inputs: dict[str, Any]) -> str:
        run = RunRecord(
            "r1", "app:application", "app:application", "completed", None, None, None, None,
            None, None, None, {}, 0.0, 1.0, 0, 0, 1.0, None, launch={"inputs": inputs},
        )  # fmt: skip
        return run_summary(run)

    long = {"email_to_respond": "Can we meet Tuesday?", "response_instructions": "x" * 80}
    assert "…" in line(long).rsplit("inputs ", 1)[1]
    assert 'inputs {"q": "short"}' in line({"q": "short"})


@pytest.mark.parametrize("name", ["😀" * 200, "é" * 200, "a" * 199 + "😀"])
def test_a_name_of_200_characters_of_several_bytes_each_is_kept_on_every_backend(
    store_target: Any, name: str
) -> None:
    """What held: a trace and a step named with exactly 200 characters of 2 or 4 UTF-8 bytes
    (800 bytes; PostgreSQL's varchar(200) counts characters) are kept, read back and replayed
    unchanged with equal hashes on SQLite and PostgreSQL, the step's keys holding astral
    characters (UTF-16 order differs from code point order) in any order; one character more
    is refused before anything is written."""
    tracer = Tracer(store_target.open(), raise_on_write_error=True)
    try:
        with tracer.trace(name, {"q": "😀"}) as t, step(name, "transform", input={}) as s:
            s.set_output({"\uffff": b"y", "😀": 2, "a": 1})
        with tracer.replay(t.trace_id) as r, step(name, "transform", input={}) as s:
            s.set_output({"a": 1, "😀": 2, "\uffff": b"y"})
        a, b = (load_trace(tracer.store, x.trace_id) for x in (t, r))
        with pytest.raises(ValueError, match="1 to 200 characters"), tracer.trace(name + "x", {}):
            pass
    finally:
        tracer.close()
    assert (a.name, a.steps[0].name, b.steps[0].name) == (name, name, name)
    assert b.steps[0].output_hash == a.steps[0].output_hash


def test_a_step_output_holding_an_object_of_a_type_without_a_module_is_kept() -> None:
    """A type whose ``__module__`` is None (``numpy.ctypeslib.as_ctypes`` makes them; so can
    ``type(...)``) made ``jsonable``, which never raises, raise AttributeError: the canonical
    hasher's refusal text called ``module.startswith`` and dae05ac's pandas/numpy test
    ``module.partition``. The step holding it was stored with no output at all (the tracer
    logged "collecting step failed"), its other fields lost. Such a value is
    ``{"$unhashable": "<type>"}`` like any other object without a JSON form."""
    import numpy as np

    nameless = type("Nameless", (), {"__module__": None})
    value = {"a": nameless(), "b": 1, "c": np.ctypeslib.as_ctypes(np.zeros(3))}
    assert jsonable(value) == {
        "a": {"$unhashable": "Nameless"},
        "b": 1,
        "c": {"$unhashable": "c_double_Array_3"},
    }


def test_a_trace_whose_step_holds_such_an_object_keeps_the_step(tmp_path: Path) -> None:
    """The trace half of the test above: the step is stored with its output (was: None)."""
    nameless = type("Nameless", (), {"__module__": None})
    tracer = Tracer(tmp_path)
    try:
        with tracer.trace("c", {"q": 1}) as t, step("s", "transform", input={}) as s:
            s.set_output({"a": nameless(), "b": 1})
        view = load_trace(tracer.store, t.trace_id)
    finally:
        tracer.close()
    assert [s.output for s in view.steps] == [{"a": {"$unhashable": "Nameless"}, "b": 1}]


class _MapOfAClosedCursor(Mapping[str, int]):
    """A lazy mapping whose rows are gone (a cursor closed after the step)."""

    def __getitem__(self, key: str) -> int:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("cursor closed")

    def __len__(self) -> int:
        return 1


class _DateOfABrokenZone(datetime.datetime):
    def isoformat(self, *args: Any) -> str:
        raise RuntimeError("no zone data")


@pytest.mark.parametrize(
    "broken", [_MapOfAClosedCursor(), _DateOfABrokenZone(2026, 1, 2)], ids=["mapping", "date"]
)
def test_a_user_object_raising_from_its_own_methods_costs_only_its_own_field(
    tmp_path: Path, broken: Any
) -> None:
    """``jsonable`` never raises, says its docstring, but a value whose own methods raise (a
    mapping whose iteration fails, a date whose ``isoformat`` raises) raised out of it: the
    step holding it was stored with no output at all, its other fields lost. Such a value
    now has no form (``{"$unhashable": "<type>"}``) and the rest of the output is kept."""
    name = type(broken).__name__
    assert jsonable({"bad": broken, "b": 1}) == {"b": 1, "bad": {"$unhashable": name}}
    tracer = Tracer(tmp_path)
    try:
        with tracer.trace("c", {"q": 1}) as t, step("s", "transform", input={}) as s:
            s.set_output({"bad": broken, "b": 1})
        view = load_trace(tracer.store, t.trace_id)
    finally:
        tracer.close()
    assert [s.output for s in view.steps] == [{"b": 1, "bad": {"$unhashable": name}}]


def test_an_app_built_with_initialize_from_starts_from_its_default_state(tmp_path: Path) -> None:
    """What held, recording Burr's email-assistant example: an app built with
    ``initialize_from(persister, default_state=..., default_entrypoint=...)`` is recorded from
    that state at that entrypoint (nothing is loaded through the persister, which holds an
    older state of the same app id), and its unchanged fork is equal. The README said only
    that ``initialize_from`` is not used."""
    from burr.core import ApplicationBuilder, State, action
    from burr.core.persistence import InMemoryPersister

    from rewind import Rewind

    @action(reads=[], writes=["incoming"])
    def take(state: State, email: str) -> State:
        return state.update(incoming=email)

    @action(reads=["incoming", "draft_history"], writes=["draft_history"])
    def draft(state: State) -> State:
        return state.append(draft_history=f"re: {state['incoming']}")

    persister = InMemoryPersister()
    old = State({"draft_history": ["stale"], "incoming": "old"})
    persister.save(None, "app-1", 9, "draft", old, "completed")
    builder = (
        ApplicationBuilder()
        .with_actions(take, draft)
        .with_transitions(("take", "draft"))
        .with_identifiers(app_id="app-1")
        .initialize_from(
            persister,
            resume_at_next_action=True,
            default_state={"draft_history": []},
            default_entrypoint="take",
        )
    )
    rw = Rewind(tmp_path)
    try:
        run = rw.record(builder, inputs={"email": "Tuesday?"}, halt_after=["draft"])
        fork = rw.fork(run.run_id, at="take")
        nodes = rw.store.nodes_of(run.run_id)
        state = rw.node_output(nodes[-1])
        first = rw.diff(run.run_id, fork.run_id).first_divergence
    finally:
        rw.store.close()
    assert [n.name for n in nodes] == ["take", "draft"]
    assert state["draft_history"] == ["re: Tuesday?"]
    assert first is None
