"""Attacks on Rewind's replay and store as a hostile user (session 32, issue #13): hostile text
in errors and names, on every store backend (SQLite, and PostgreSQL through the throwaway server
of ``tests/services.py``).

Each test names what it found (a regression test that failed before its fix) or what held.
"""

from __future__ import annotations

import copy
import logging
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from burr.core import State, action, default
from burr.core.graph import GraphBuilder

from rewind.replay import Pipeline, Rewind
from rewind.tracing import Tracer, step
from rewind.tracing.store import load_trace
from tests.conftest import StoreTarget

UNDECODABLE = os.fsdecode(b"report-\xff.csv")
"""A file name read from a directory listing that is not UTF-8: Python decodes it with
``surrogateescape``, so it holds a lone surrogate (``\\udcff``) and so does any error naming it."""

HOSTILE_ERRORS = {
    "nul": ("bad byte \x00 here", "bad byte \\u0000 here"),
    "surrogate": (f"cannot open {UNDECODABLE}", "cannot open report-\\udcff.csv"),
}
"""Exception messages (as raised, as stored): PostgreSQL text holds no NUL, and no backend can
encode a lone surrogate."""


# --- an exception's text is written down, never the reason a run is lost ----------------------
@pytest.mark.parametrize("kind", sorted(HOSTILE_ERRORS))
def test_a_step_failing_with_an_error_no_backend_keeps_raw_is_stored_failed(
    store_target: StoreTarget, kind: str
) -> None:
    """A traced step whose exception message held a lone surrogate (an error naming a file whose
    name is not UTF-8) made the trace's write fail with UnicodeEncodeError on every backend, and
    one holding NUL failed PostgreSQL's write ('text fields cannot contain NUL'): the trace, with
    every model call it paid for, was lost (record None). The text is now stored with those
    characters escaped, and the trace is kept, failed, with its steps."""
    raised, stored = HOSTILE_ERRORS[kind]
    st = store_target.open()
    try:
        tracer = Tracer(st, raise_on_write_error=True)
        with pytest.raises(ValueError), tracer.trace("hostile-error") as t:
            with step("fine", "transform", input={"i": 1}) as s:
                s.set_output(1)
            with step("read", "tool_call", input={"i": 2}):
                raise ValueError(raised)
        assert t.write_error is None and t.record is not None
        assert t.record.status == "failed"
        view = load_trace(st, t.trace_id)
        assert [s.status for s in view.steps] == ["success", "failed"]
        assert view.steps[1].error_message == stored
        assert st.get_run(t.trace_id).error == f"ValueError: {stored}"
    finally:
        st.close()


_MESSAGE = [""]


@action(reads=["x"], writes=["note"])
def _first(state: State) -> State:
    return state.update(note=state["x"] + 1)


@action(reads=["note"], writes=["never"])
def _raise(state: State) -> State:
    raise RuntimeError(_MESSAGE[0])


raising_pipeline = Pipeline(
    name="raising",
    graph=GraphBuilder()
    .with_actions(first=_first, boom=_raise)
    .with_transitions(("first", "boom", default))
    .build(),
    entrypoint="first",
    ref="tests.test_attack32:raising_pipeline",
)
"""Two Burr nodes; the second raises ``RuntimeError(_MESSAGE[0])``."""


@pytest.mark.parametrize("kind", sorted(HOSTILE_ERRORS))
def test_a_burr_node_failing_with_an_error_no_backend_keeps_raw_is_stored_failed(
    store_target: StoreTarget, kind: str
) -> None:
    """The same on the Burr path: ``Rewind.record`` of a pipeline whose node raised such an
    error raised UnicodeEncodeError or PostgreSQL's DataError instead of recording the failure,
    and left the run ``running`` for good. The run is now stored failed, with the node's error
    escaped."""
    raised, stored = HOSTILE_ERRORS[kind]
    _MESSAGE[0] = raised
    st = store_target.open()
    logging.disable(logging.ERROR)  # Burr logs the error: a lone surrogate no xdist report carries
    try:
        run = Rewind(st).record(raising_pipeline, {"x": 1})
        assert run.status == "failed"
        assert run.error == f"RuntimeError: {stored}"
        assert [(n.name, n.error) for n in st.nodes_of(run.run_id)] == [
            ("first", None),
            ("boom", f"RuntimeError: {stored}"),
        ]
    finally:
        logging.disable(logging.NOTSET)
        st.close()


def test_storable_text_escapes_only_what_no_backend_keeps() -> None:
    """Printable text, non-ASCII letters and emoji are unchanged; NUL and lone surrogates are
    written as escapes."""
    from rewind.store.records import storable_text

    for text in ("", "plain", "héllo wörld ✓ 🦀", "tab\tand\nnewline", "\\u0000 already"):
        assert storable_text(text) == text
    assert storable_text("a\x00b\x00") == "a\\u0000b\\u0000"
    assert storable_text("\ud800é\udfff") == "\\ud800é\\udfff"


# --- a name no backend keeps is refused where it is given --------------------------------------
BAD_NAMES = {"nul": "a\x00b", "long": "n" * 201, "surrogate": f"file {UNDECODABLE}"}
"""Names SQLite kept and PostgreSQL refused at the write (NUL, over varchar(200)), and one no
backend can encode (a lone surrogate)."""


NAME_REFUSED = "needs a name of 1 to 200 characters without NUL|holds a lone surrogate"
"""What the refusal says (a model name's lone surrogate was already refused by the request's
canonical bytes, before the call, as a CanonicalError)."""


def _named_chain(where: str, bad: str) -> None:
    """A paid model call, then a step, tool call or model call named ``bad`` (``where``)."""
    from rewind import tool
    from rewind.tracing import chat_step

    chat_step("llm", [{"role": "user", "content": "first"}], temperature=0)
    if where == "step":
        with step(bad, "transform", input={"i": 1}) as s:
            s.set_output(1)
    elif where == "tool":
        tool(bad)(len)("abc")
    else:
        chat_step("llm", [{"role": "user", "content": "second"}], model=bad, temperature=0)


@pytest.mark.parametrize("kind", sorted(BAD_NAMES))
@pytest.mark.parametrize("where", ["step", "tool", "model"])
def test_a_name_no_backend_keeps_is_refused_before_it_costs_the_trace(
    store_target: StoreTarget, where: str, kind: str
) -> None:
    """A step, tool or model name holding NUL or over 200 characters was stored by SQLite and
    refused by PostgreSQL when the trace was written ('text fields cannot contain NUL',
    'value too long for type character varying(200)'); one holding a lone surrogate failed
    every backend's write: the trace, and the model calls it had made, were lost. Such a name
    is now refused where it is given (ValueError saying what a name may be), before its step
    or call runs; the trace is stored failed with the steps before it, on every backend."""
    from tests.model_stub import stub_and_client

    bad = BAD_NAMES[kind]
    st = store_target.open()
    try:
        with stub_and_client() as (stub, client):
            tracer = Tracer(st, chat_client=client, raise_on_write_error=True)
            with (
                pytest.raises(ValueError, match=NAME_REFUSED),
                tracer.trace("named") as t,
            ):
                _named_chain(where, bad)
            assert stub.count == 1
        assert t.write_error is None and t.record is not None
        assert t.record.status == "failed"
        steps = [(s.name, s.status) for s in load_trace(st, t.trace_id).steps]
        assert steps == [("llm", "success")] + ([("llm", "failed")] if where == "model" else [])
    finally:
        st.close()


@pytest.mark.parametrize("kind", sorted(BAD_NAMES))
def test_a_trace_name_no_backend_keeps_is_refused_before_the_chain_runs(
    tmp_path: Path, kind: str
) -> None:
    """The same for a trace's name (the run's ``pipeline`` column): refused when the trace is
    made, as e1bae04 refuses such trace ids."""
    tracer = Tracer(tmp_path / "store")
    try:
        with pytest.raises(ValueError, match="a trace needs a name of 1 to 200 characters"):
            tracer.trace(BAD_NAMES[kind])
    finally:
        tracer.close()


# --- a value JSON cannot show is hashed by its content, not its type ---------------------------
CHANGED_OUTPUTS = {
    "bytes": (b"\x89PNG image v1", b"\x89PNG image v2"),
    "decimal": (Decimal("10.00"), Decimal("99.99")),
    "tuple keys": (
        {("rain", 2012): 1.5, ("sun", 2012): 0.0},
        {("rain", 2012): 1.5, ("sun", 2013): 0.0},
    ),
    "int and str keys": ({"1": "b"}, {1: "a", "1": "b"}),
    "numpy": (np.array([1.0, 2.0]), np.array([1.0, 2.5])),
}
"""(recorded, replayed) step outputs that differ only where the trace's JSON view could not show
the value: bytes (an image a step made), a Decimal amount, a dict keyed by tuples (a pandas
group-by's ``to_dict()``), a dict whose keys 1 and "1" both become "1", a numpy array."""


def _output_step(value: object) -> None:
    with step("make", "transform", input={"p": 1}) as s:
        s.set_output(value)


def _replayed_hashes(folder: Path, recorded: object, replayed: object) -> tuple[str, str, Any]:
    """(the recording's output hash, an in-place replay's, the replay's stored output)."""
    from rewind.store import open_store

    st = open_store(folder)
    try:
        with Tracer(st).trace("outputs") as t:
            _output_step(recorded)
        with Tracer(st).replay(t.trace_id) as r:
            _output_step(replayed)
        source, replay = load_trace(st, t.trace_id), load_trace(st, r.trace_id, payloads=True)
        assert replay.parent_run_id == t.trace_id
        return source.steps[0].output_hash, replay.steps[0].output_hash, replay.steps[0].output
    finally:
        st.close()


@pytest.mark.parametrize("kind", sorted(CHANGED_OUTPUTS))
def test_a_replay_whose_step_output_changed_inside_a_value_json_cannot_show_is_not_unchanged(
    tmp_path: Path, kind: str
) -> None:
    """A trace stores a step's values as JSON (``tracing.model.jsonable``); a value JSON cannot
    hold became ``{"$unhashable": "<type>"}`` and a non-string key ``$key:<type>``, with 1 and
    "1" merged into one key. So a replay whose step made other image bytes, another amount or
    another group was stored with the recorded step's output hash: 'unchanged', 0 differences,
    a change the debugger exists to show hidden (and one of two keys silently dropped). Such a
    value now carries the sha256 of its exact document (rewind.serde, as Burr runs store it),
    and keys are kept apart by their content; equal values still hash equal."""
    recorded, replayed = CHANGED_OUTPUTS[kind]
    source_hash, replay_hash, stored = _replayed_hashes(tmp_path / "changed", recorded, replayed)
    assert replay_hash != source_hash
    if isinstance(replayed, dict):
        assert len(stored) == len(replayed)
    same = _replayed_hashes(tmp_path / "same", recorded, copy.deepcopy(recorded))
    assert same[0] == same[1]
