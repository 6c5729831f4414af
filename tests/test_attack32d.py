"""Attack pass 32d on the fixes merged in session 32 (issue #13): jsonable's table digests,
the diff's ``$error`` field, the tracer's clock and replay-body flags, gc concurrency.

Each finding is a regression test that failed on the branch base (integ32 at f33a212), or a
strict xfail naming the bug left."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rewind.store import open_store
from rewind.tracing import Tracer, step
from rewind.tracing.model import jsonable
from rewind.tracing.store import load_trace
from tests.model_stub import stub_and_client
from tests.test_attack32b import _ask, _shape, _stored
from tests.test_tracing_lane import reply


class _SelfView:
    """A user object whose ``to_dict()`` returns itself (a lazy proxy, a builder)."""

    def to_dict(self) -> _SelfView:
        return self


class _Holder:
    """A user object whose ``to_dict()`` holds the object itself (a tree with back links)."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": "node", "me": self}


def _deeper(levels: int, call: Callable[[], Any]) -> Any:
    """``call()`` made ``levels`` frames further down the stack."""
    return call() if levels == 0 else _deeper(levels - 1, call)


@pytest.mark.parametrize("cls", [_SelfView, _Holder], ids=["returns itself", "holds itself"])
def test_the_form_of_an_object_whose_to_dict_returns_itself_does_not_depend_on_the_stack(
    cls: type,
) -> None:
    """4f7d99d digests a value's ``to_dict()`` form with ``jsonable(view())`` from depth 0:
    an object whose to_dict returns (or holds) itself recursed until RecursionError, which the
    innermost call caught, and every level above hashed the one below: the digest counted the
    frames left on the stack, so one value had another hash when jsonable was called deeper."""
    value = {"v": cls()}
    assert jsonable(value) == _deeper(60, lambda: jsonable(value))


def test_an_unchanged_replay_called_deeper_keeps_a_self_viewing_steps_hash(tmp_path: Path) -> None:
    """The same, end to end: the in-place replay of a trace whose step returned such an object,
    unchanged but run from a deeper call stack (inside a framework, a test runner), was stored
    with another output hash: changed."""
    obj = _SelfView()

    def run(tracer: Tracer, source: str | None) -> str:
        scope = tracer.trace("selfview", {"q": 1}) if source is None else tracer.replay(source)
        with scope as t, step("s", "transform", input={"q": 1}) as s:
            s.set_output({"result": obj})
        return t.trace_id

    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        recorded = run(tracer, None)
        replayed = _deeper(60, lambda: run(tracer, recorded))
    finally:
        tracer.close()
    with contextlib.closing(open_store(tmp_path)) as st:
        a, b = (load_trace(st, x).steps[0] for x in (recorded, replayed))
    assert b.output_hash == a.output_hash


def test_a_replay_of_a_replay_given_another_name_runs_the_chain_as_its_body(
    tmp_path: Path,
) -> None:
    """3581e6b made a chain the body of an in-place replay named otherwise
    (``tracer.replay(id, name="pipe-try")``) by comparing the chain with the source's name. A
    replay of that replay compared it with "pipe-try": ``pipe("hello")`` became a ``pipe``
    step holding the model steps one level down, the replay had no output and was stored in
    full, unlinked by reference (3 node rows). The replayed chain's name is now kept with a
    replay named otherwise, so every generation runs it as its body."""
    with stub_and_client(reply) as (stub, client):
        tracer = Tracer(tmp_path, chat_client=client, raise_on_write_error=True)
        pipe = tracer.chain("pipe")(lambda question: _ask(_ask(question)))
        try:
            recorded = pipe("hello")
            (source,) = [r.run_id for r in tracer.store.list_runs()]
            with tracer.replay(source, name="pipe-try") as first:
                pipe("hello")
            sent = stub.count
            with tracer.replay(first.trace_id) as second:
                out = pipe("hello")
        finally:
            tracer.close()
    assert (stub.count, out, second.output) == (sent, recorded, recorded)
    a, b, run = _stored(tmp_path, source, second.trace_id)
    assert _shape(b) == _shape(a)
    assert run.pipeline == "pipe-try"
    assert run.parent_run_id == first.trace_id
    assert run.config["reference"] == {"run": source, "steps": 2, "all": True}


def test_a_step_that_failed_does_not_diff_equal_to_one_returning_the_error_text(
    tmp_path: Path,
) -> None:
    """cbdf393 compares a failed step's error as the output field ``$error``
    (``rewind.diff.ERROR_FIELD``): a step that succeeded with a field of that name holding the
    same text as another's error (``ValueError: boom``) diffed equal to it, first divergence
    none (rewind diff, the API's comparison; ``Rewind.node_sides`` for a Burr state key
    ``$error``). A side says it failed (``NodeSide.failed``), and the diff compares that too."""
    from rewind.tracing.inspect import compare_traces

    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with tracer.trace("t", {"q": 1}) as ok, step("$error", "transform", input={"q": 1}) as s:
            s.set_output("ValueError: boom")
        with (
            tracer.replay(ok.trace_id) as failed,
            contextlib.suppress(ValueError),
            step("$error", "transform", input={"q": 1}),
        ):
            raise ValueError("boom")
    finally:
        tracer.close()
    with contextlib.closing(open_store(tmp_path)) as st:
        a, b = load_trace(st, ok.trace_id), load_trace(st, failed.trace_id)
    assert (a.steps[0].status, b.steps[0].status) == ("success", "failed")
    assert compare_traces(a, b)["nodes"][0]["status"] == "changed"


class _Session:
    """A user object whose ``to_dict()`` holds when it was made (an agent's session, memory)."""

    made = 0

    def __init__(self) -> None:
        _Session.made += 1
        self.created = _Session.made

    def to_dict(self) -> dict[str, Any]:
        return {"user": "ana", "created": self.created}


def test_an_unchanged_replay_given_a_fresh_user_object_with_a_to_dict_is_unchanged(
    tmp_path: Path,
) -> None:
    """4f7d99d digests any object with a ``to_dict()`` (meant for pandas): a user's session
    object, made afresh for the replay, whose to_dict holds its creation time, gave the step
    input another digest: the unchanged replay was stored as changed at that step, where the
    object was ``{"$unhashable": "_Session"}`` before, one form whatever its to_dict says."""
    tracer = Tracer(tmp_path, raise_on_write_error=True)

    def run(source: str | None) -> str:
        scope = tracer.trace("session", {"q": 1}) if source is None else tracer.replay(source)
        with scope as t, step("s", "transform", input={"session": _Session()}) as s:
            s.set_output("ok")
        return t.trace_id

    try:
        recorded = run(None)
        replayed = run(recorded)
    finally:
        tracer.close()
    with contextlib.closing(open_store(tmp_path)) as st:
        a, b = (load_trace(st, x).steps[0] for x in (recorded, replayed))
    assert (b.input_hash, b.output_hash) == (a.input_hash, a.output_hash)


def test_jsonable_calls_no_method_of_a_mock() -> None:
    """The same: a test's MagicMock handed to a traced step saw 128 calls it never made
    (``to_dict.__bool__()``, ``to_dict()``, ``to_dict().to_dict()``...)."""
    from unittest.mock import MagicMock

    client = MagicMock()
    jsonable({"client": client})
    assert client.mock_calls == []


def test_the_form_of_a_dataframe_holding_itself_does_not_depend_on_the_stack() -> None:
    """The depth half of the fix for the tables 4f7d99d digests: a DataFrame with an object
    cell holding the frame itself (to_dict holds it) ends at jsonable's depth limit, one form
    at any stack depth."""
    import pandas as pd

    frame = pd.DataFrame({"a": [None]}, dtype=object)
    frame.iat[0, 0] = frame
    assert jsonable({"v": frame}) == _deeper(60, lambda: jsonable({"v": frame}))


def test_the_diff_tells_a_failed_node_from_a_field_named_error() -> None:
    """The same on the diff's own sides (a Burr node writing a state key ``$error``)."""
    from rewind.diff import ERROR_FIELD, NodeSide, diff_trajectories

    wrote = NodeSide(0, "parse", {ERROR_FIELD: "ValueError: boom"}, "h", 0)
    failed = NodeSide(0, "parse", {ERROR_FIELD: "ValueError: boom"}, "", 0, failed=True)
    (row,) = diff_trajectories("a", [wrote], "b", [failed]).nodes
    assert row.status == "changed" and [c.kind for c in row.changes] == ["added"]
    (row,) = diff_trajectories("a", [failed], "b", [failed]).nodes
    assert row.status == "equal"
