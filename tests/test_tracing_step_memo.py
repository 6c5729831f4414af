"""Replays of a source whose steps were proven equal before (rewind.tracing.step_memo): an
unchanged replay is still stored by reference, and any change — even one Python's ``==`` does
not see (``1`` / ``1.0`` / ``True``) — is still found and stored.

Real SQLite stores, a real loopback model server (tests.model_stub), one Tracer per trace as a
separate process would make it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from rewind.llm import ChatClient
from rewind.replay import Rewind
from rewind.store import open_store
from rewind.tracing import StepType, Tracer, chat_step, step, step_memo
from rewind.tracing.store import load_trace
from tests.model_stub import ModelStub, stub_and_client


@pytest.fixture
def stub_client() -> Iterator[tuple[ModelStub, ChatClient]]:
    with stub_and_client(lambda question, n: f"answer to {question}") as pair:
        yield pair


def block(value: Any) -> None:
    """The traced code: three times an LLM step, then a step whose input and output are
    ``value``."""
    for i in range(3):
        chat_step("llm", [{"role": "user", "content": f"question {i}"}], temperature=0)
        with step("post", StepType.TRANSFORM, input={"v": value}) as s:
            s.set_output(value)


def trace_once(folder: Path, client: ChatClient, value: Any, *, read_cache: bool) -> str:
    """One trace of :func:`block` through a new Tracer."""
    tracer = Tracer(folder, chat_client=client, read_cache=read_cache, raise_on_write_error=True)
    try:
        with tracer.trace("memo") as t:
            block(value)
    finally:
        tracer.close()
    assert t.write_error is None
    return t.trace_id


def reference(folder: Path, run_id: str) -> tuple[str | None, dict[str, Any] | None]:
    st = open_store(folder)
    try:
        run = st.get_run(run_id)
        return run.parent_run_id, run.config.get("reference")
    finally:
        st.close()


@pytest.mark.parametrize("changed", [1.0, True, "1", [1], None, 2])
def test_a_change_after_proven_replays_is_still_found(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient], changed: Any
) -> None:
    stub, client = stub_client
    folder = tmp_path / "store"
    source = trace_once(folder, client, 1, read_cache=False)
    asked = len(stub.requests)
    # Two unchanged replays: the first proves the steps equal, the second is checked against
    # what the first proved (the steps held for this source).
    for _ in range(2):
        replay = trace_once(folder, client, 1, read_cache=True)
        assert reference(folder, replay) == (source, {"run": source, "steps": 6, "all": True})
    assert step_memo.held() >= 6
    assert len(stub.requests) == asked

    # The same steps with a value that is == 1 in Python (1.0, True) or not: the post step of
    # position 1 diverges, and the replay stores it.
    replay = trace_once(folder, client, changed, read_cache=True)
    parent, ref = reference(folder, replay)
    assert parent == source
    assert ref == {"run": source, "steps": 1, "all": False}
    st = open_store(folder)
    try:
        view = load_trace(st, replay)
        outputs = [s.output for s in view.steps if s.name == "post"]
        assert all(type(o) is type(changed) and o == changed for o in outputs)
        d = Rewind(st).diff(source, replay)
        assert d.first_divergence is not None and d.first_divergence.index == 1
    finally:
        st.close()
    assert len(stub.requests) == asked

    # The value of the recording again: its source is now the newest trace that made the
    # first call (the changed replay), which it differs from at the same step.
    changed_replay = replay
    replay = trace_once(folder, client, 1, read_cache=True)
    parent, ref = reference(folder, replay)
    assert parent == changed_replay and ref is not None
    assert (ref["steps"], ref["all"]) == (1, False)


def test_key_order_is_no_change_and_a_new_input_is_one(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    _, client = stub_client
    folder = tmp_path / "store"
    source = trace_once(folder, client, {"a": 1, "b": [1, 2]}, read_cache=False)
    for value in ({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}):
        replay = trace_once(folder, client, value, read_cache=True)
        assert reference(folder, replay) == (source, {"run": source, "steps": 6, "all": True})
    replay = trace_once(folder, client, {"a": 1, "b": [2, 1]}, read_cache=True)
    assert reference(folder, replay) == (source, {"run": source, "steps": 1, "all": False})


def test_a_value_without_a_signature_is_compared_the_full_way(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    """An integer beyond 64 bits has no signature (orjson refuses it): such steps are never
    held, and the replay is still stored by reference by the full comparison."""
    _, client = stub_client
    folder = tmp_path / "store"
    big = 2**70
    source = trace_once(folder, client, big, read_cache=False)
    for _ in range(2):
        replay = trace_once(folder, client, big, read_cache=True)
        assert reference(folder, replay) == (source, {"run": source, "steps": 6, "all": True})
    replay = trace_once(folder, client, big + 1, read_cache=True)
    assert reference(folder, replay) == (source, {"run": source, "steps": 1, "all": False})


def test_in_place_replays_use_and_respect_the_proven_steps(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    """``Tracer.replay(source)`` compares with the source's rows kept in-process: unchanged
    replays are stored by reference (the second one checked against what the first proved),
    and a value that is only ``==`` to the recorded one is still a change."""
    stub, client = stub_client
    folder = tmp_path / "store"
    source = trace_once(folder, client, 1, read_cache=False)
    asked = len(stub.requests)

    def in_place(value: Any) -> str:
        tracer = Tracer(folder, chat_client=client, raise_on_write_error=True)
        try:
            with tracer.replay(source) as t:
                block(value)
        finally:
            tracer.close()
        assert t.write_error is None
        return t.trace_id

    for _ in range(3):
        replay = in_place(1)
        assert reference(folder, replay) == (source, {"run": source, "steps": 6, "all": True})
    replay = in_place(True)
    assert reference(folder, replay) == (source, {"run": source, "steps": 1, "all": False})
    st = open_store(folder)
    try:
        outputs = [s.output for s in load_trace(st, replay).steps if s.name == "post"]
        assert outputs == [True] * 3 and all(o is True for o in outputs)
    finally:
        st.close()
    assert len(stub.requests) == asked


def test_steps_of_many_names_fold_the_state_they_change(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    """Each step writes a state field of its own name: a replay that diverges after proven
    steps is built on the state those steps left (the remembered fields they changed), so its
    state hashes are the source's up to the divergence and its own after."""
    _, client = stub_client
    folder = tmp_path / "store"

    def named(change_at: int | None, read_cache: bool = True) -> str:
        tracer = Tracer(
            folder, chat_client=client, read_cache=read_cache, raise_on_write_error=True
        )
        try:
            with tracer.trace("names") as t:
                chat_step("llm", [{"role": "user", "content": "start"}], temperature=0)
                for i in range(6):
                    with step(f"step-{i}", StepType.TRANSFORM, input={"i": i}) as s:
                        s.set_output(i * 10 + (1 if i == change_at else 0))
        finally:
            tracer.close()
        assert t.write_error is None
        return t.trace_id

    source = named(None, read_cache=False)
    for _ in range(2):
        assert reference(folder, named(None)) == (
            source,
            {"run": source, "steps": 7, "all": True},
        )
    changed = named(4)
    assert reference(folder, changed) == (source, {"run": source, "steps": 5, "all": False})
    truth = named(4, read_cache=False)  # the same values, hashed the full way (no source)
    st = open_store(folder)
    try:
        a, b, c = st.nodes_of(source), st.nodes_of(changed), st.nodes_of(truth)
        assert [n.state_hash for n in a[:5]] == [n.state_hash for n in b[:5]]
        assert [n.state_hash for n in b] == [n.state_hash for n in c]
        assert all(x.state_hash != y.state_hash for x, y in zip(a[5:], b[5:], strict=True))
        assert [s.output for s in load_trace(st, changed).steps[1:]] == [0, 10, 20, 30, 41, 50]
    finally:
        st.close()


def _refused_where_the_source_had(folder: Path, client: ChatClient, had: Any, bad: Any) -> None:
    """Record a trace whose step ``post`` has the input ``{"v": had}``, prove it twice, then
    replay it with ``{"v": bad}``: the replay's write must fail as a recording's of ``bad``
    does (a CanonicalError), and neither is stored."""

    def once(value: Any, *, read_cache: bool = True) -> Any:
        tracer = Tracer(folder, chat_client=client, read_cache=read_cache)
        try:
            with tracer.trace("memo-refused") as t:
                chat_step("llm", [{"role": "user", "content": "question"}], temperature=0)
                with t.step("post", inputs={"v": value}) as s:
                    s.set_output(1)
        finally:
            tracer.close()
        return t

    source = once(had, read_cache=False)
    for _ in range(2):  # the second is checked against what the first proved
        replay = once(had)
        assert replay.write_error is None
        assert reference(folder, replay.trace_id)[1] == {
            "run": source.trace_id,
            "steps": 2,
            "all": True,
        }
    assert step_memo.held() >= 2
    replay = once(bad)
    assert replay.write_error is not None and "CanonicalError" in replay.write_error
    recording = once(bad, read_cache=False)
    assert recording.write_error == replay.write_error.replace(replay.trace_id, recording.trace_id)
    st = open_store(folder)
    try:
        runs = {r.run_id for r in st.list_runs()}
        assert replay.trace_id not in runs and recording.trace_id not in runs  # nothing written
    finally:
        st.close()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_nan_or_infinity_where_the_source_had_none_is_refused_as_a_recording_refuses_it(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient], bad: float
) -> None:
    """orjson writes NaN and infinities as ``null``: a step given one as input (``inputs=``
    is kept as given) where the proven steps had None must not share their signature. The
    write refuses it (CanonicalError) as a recording's does, instead of storing None."""
    _refused_where_the_source_had(tmp_path / "store", stub_client[1], None, bad)


def test_text_of_refuses_what_orjson_writes_as_null_but_is_not_none() -> None:
    for bad in (float("nan"), float("inf"), -float("inf")):
        assert step_memo.text_of({"v": bad}) is None
        assert step_memo.text_of([None, {"a": [bad]}], sort_keys=False) is None
    assert (
        step_memo.text_of({"v": None, "w": [None, 1.5, -0.0]}) == b'{"v":null,"w":[null,1.5,-0.0]}'
    )


def test_text_of_refuses_a_uuid_which_the_hashes_refuse() -> None:
    """orjson writes a ``uuid.UUID`` as its string natively (``default`` is not called), while
    canonical hashing refuses it: its text must not pass for the string's."""
    u = uuid.UUID(int=0xABCDEF)
    assert step_memo.text_of({"v": u}) is None
    assert step_memo.text_of([None, {"a": [u]}], sort_keys=False) is None
    assert step_memo.text_of({"k": [1, {"u": uuid.uuid4()}]}) is None
    # the string itself is plain JSON, and so are strings that only look alike
    assert step_memo.text_of({"v": str(u)}) == b'{"v":"' + str(u).encode() + b'"}'
    for plain in (str(u).upper(), "a-b-c", "-" * 40, "x" + str(u), [str(u), 1, None]):
        assert step_memo.text_of({"v": plain}) == orjson.dumps({"v": plain})


def test_doubtful_flags_null_and_uuid_shaped_strings_only() -> None:
    u = str(uuid.UUID(int=0xABCDEF))
    assert step_memo.doubtful(orjson.dumps({"v": None}))
    assert step_memo.doubtful(orjson.dumps({"v": u}))
    assert step_memo.doubtful(orjson.dumps([1, {"x": "id " + u}]))
    for clean in ({"v": 1}, {"v": "gpt-4o-mini"}, {"v": "2026-12-03"}, {"v": u.upper()}, {}):
        assert not step_memo.doubtful(orjson.dumps(clean))
    assert step_memo.reads_back(orjson.dumps({"v": u}), {"v": u})
    assert not step_memo.reads_back(orjson.dumps({"v": uuid.UUID(u)}), {"v": uuid.UUID(u)})


def test_a_uuid_where_the_source_had_its_string_is_refused_as_a_recording_refuses_it(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    """A step given a ``uuid.UUID`` as input (``inputs=`` is kept as given) where the proven
    steps had its string must not share their signature (orjson writes both alike). The write
    refuses it (CanonicalError) as a recording's does, instead of storing the string."""
    u = uuid.UUID(int=0xABCDEF)
    _refused_where_the_source_had(tmp_path / "store", stub_client[1], str(u), u)
