"""Attack 32b on the replay semantics merged in session 32 (issue #13): the source's recorded
input as the default of ``Tracer.replay``, a chain as the body of its own in-place replay,
failed source steps executed again, failed steps stored by reference, the cached replay's
source chosen by input, and recorded-calls replays of raising chains.

Each test is a finding (fixed, or xfail strict naming the bug) or a regression test of what
held. Real stores (SQLite, a throwaway PostgreSQL server) and a fake or loopback model server.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

import rewind
from rewind.errors import EndpointUnavailable
from rewind.llm import ChatClient
from rewind.store import Store, open_store
from rewind.tracing import Tracer, chat_step, step
from rewind.tracing.store import initial_state_hash, load_trace
from tests.conftest import STORE_BACKENDS, FakeModel, StoreTarget
from tests.model_stub import stub_and_client
from tests.test_attack31 import _third
from tests.test_tracing_lane import EXECUTED, _diff, reply
from tests.test_tracing_reference import _counted_loads, agent, own_rows


def _traced(
    st: Store, client: ChatClient, steps: int, *, read_cache: bool, clock: Any = time.time
) -> tuple[str, Any]:
    """One trace named ``agent`` of ``steps`` steps, its input ``{"steps": steps}``."""
    tracer = Tracer(
        st, chat_client=client, read_cache=read_cache, raise_on_write_error=True, clock=clock
    )
    with tracer.trace("agent", {"steps": steps}) as t:
        out = agent(steps)
    assert t.write_error is None
    return t.trace_id, out


def test_a_cached_replay_behind_traces_of_another_input_sharing_its_first_call_finds_its_own(
    store_target: StoreTarget,
    chat_client: ChatClient,
    fake_model: FakeModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The four newest traces of the name (tracer_source.CANDIDATES) have another input whose
    first request is the same and which stop earlier. The cached replay of the older recording,
    with its input, took the newest of them as its source (the same-input preference looked at
    the candidates only, the cache entry's recorders only when no candidate held the call): it
    was linked to a trace of another input and stored in full (6 node and call rows). A
    recorder of the same input found through the call's cache entry is now taken first; a
    trace of a new input still reads the candidates' rows only."""
    from rewind.tracing import tracer_source

    st = store_target.open()
    try:
        source, out = _traced(st, chat_client, 3, read_cache=False)
        for _ in range(tracer_source.CANDIDATES):
            _traced(st, chat_client, 2, read_cache=False)
        sent = fake_model.count
        replay, again = _traced(st, chat_client, 3, read_cache=True)
        assert again == out and fake_model.count == sent
        run = st.get_run(replay)
        assert run.parent_run_id == source
        assert run.config["reference"] == {"run": source, "steps": 6, "all": True}
        assert own_rows(st, replay)["nodes"] == 0
        first = st.nodes_of(source)[0].calls[0]
        reads = _counted_loads(monkeypatch)
        new = tracer_source.find_source(
            st, "agent", first.kind, first.key, initial_state_hash({"steps": 9})
        )
        assert new is not None and len(reads) == tracer_source.CANDIDATES
    finally:
        st.close()


def _stored(folder: Path, source: str, replay: str) -> tuple[Any, Any, Any]:
    """(the source's stored view, the replay's, the replay's run row)."""
    st = open_store(folder)
    try:
        return load_trace(st, source), load_trace(st, replay), st.get_run(replay)
    finally:
        st.close()


def _shape(view: Any) -> list[tuple[Any, ...]]:
    """Each step's name, position, parent and output hash."""
    return [(s.name, s.position, s.parent_position, s.output_hash) for s in view.steps]


def _ask(question: str) -> str:
    return chat_step("llm", [{"role": "user", "content": question}], temperature=0).content


def test_an_in_place_replay_of_a_chain_calling_itself_before_its_first_step_keeps_its_steps(
    tmp_path: Path,
) -> None:
    """``fact(n)`` calls ``fact(n - 1)`` before its own model call: recorded, the inner calls
    are steps of the trace. In ``with tracer.replay(id): fact(3)`` every inner call was taken
    as the body of the replay too (no step was open and none made yet): the unchanged replay
    lost both ``fact`` steps and nested its model steps at the top, and was stored in full
    (3 node and call rows), not by reference. Only the first call is the body now."""
    with stub_and_client(reply) as (stub, client):
        tracer = Tracer(tmp_path, chat_client=client, raise_on_write_error=True)

        @tracer.chain("fact")
        def fact(n: int) -> str:
            if n <= 1:
                return _ask("base")
            return fact(n - 1) + _ask(f"n={n}")

        try:
            recorded = fact(3)
            (source,) = [r.run_id for r in tracer.store.list_runs()]
            sent = stub.count
            with tracer.replay(source) as replay:
                out = fact(3)
        finally:
            tracer.close()
    assert stub.count == sent and out == recorded
    a, b, run = _stored(tmp_path, source, replay.trace_id)
    assert _shape(b) == _shape(a)
    assert [s.name for s in a.steps] == ["fact", "fact", "llm", "llm", "llm"]
    assert run.config["reference"] == {"run": source, "steps": 5, "all": True}


_HICCUPS = [0]


def _hiccup_reply(question: str, n: int) -> str:
    """The stub's answers; the first ``flaky`` request of each recording gets no answer (the
    server drops the connection: the client raises EndpointUnavailable)."""
    if question == "flaky" and _HICCUPS[0] > 0:
        _HICCUPS[0] -= 1
        raise RuntimeError("server hiccup")
    return reply(question, n)


def _retrying() -> str:
    """Asks until a model call answers (each try its own chat step)."""
    for _ in range(2):
        try:
            return _ask("flaky")
        except EndpointUnavailable:
            pass
    return "gave up"


def test_an_unchanged_replay_of_a_model_call_that_failed_in_the_source_sends_no_request(
    tmp_path: Path,
) -> None:
    """The recording's first model call got no answer (the chain caught it and asked again in
    a new step). miss:source-failed executed such a call again so that a failing tool fails
    again; for a model call that meant sending it: the cached replay sent one request, was
    answered, and ended after one step (the source had two), stored unlinked from step 0.
    The raising call is now recorded (``failed:raised``, its error's document) and the replay
    raises that failure again: 0 requests, the source's two steps, stored by reference.
    Was a strict xfail: a model call that raised in the source is sent again on replay."""
    _HICCUPS[0] = 1
    with stub_and_client(_hiccup_reply) as (stub, client):
        made = []
        for read_cache in (False, True):
            tracer = Tracer(
                tmp_path, chat_client=client, read_cache=read_cache, raise_on_write_error=True
            )
            try:
                with tracer.trace("flaky") as t:
                    t.set_output(_retrying())
            finally:
                tracer.close()
            made.append((t, stub.count))
    (source, recorded), (replay, total) = made
    assert [s.status for s in source.steps] == ["failed", "success"] and recorded == 2
    assert total == recorded
    assert [(s.name, s.status, s.error_message) for s in replay.steps] == [
        (s.name, s.status, s.error_message) for s in source.steps
    ]
    a, b, run = _stored(tmp_path, source.trace_id, replay.trace_id)
    assert [c.label for c in a.steps[0].calls] == ["failed:raised"]
    assert [c.label for c in b.steps[0].calls] == ["failed:replayed"]
    assert run.parent_run_id == source.trace_id
    assert run.config["reference"] == {"run": source.trace_id, "steps": 2, "all": True}


def test_an_in_place_replay_given_another_name_still_runs_the_chain_as_its_body(
    tmp_path: Path,
) -> None:
    """``with tracer.replay(id, name="pipe-try"): pipe("hello")``, unchanged: the chain was
    the body only when the replay kept the source's name, so here it became a ``pipe`` step
    holding both model steps one level down: nothing matched the source, which was stored
    again in full (3 node rows, 2 call rows). A call of the source's chain is the body
    whatever the replay is named."""
    with stub_and_client(reply) as (stub, client):
        tracer = Tracer(tmp_path, chat_client=client, raise_on_write_error=True)

        @tracer.chain("pipe")
        def pipe(question: str) -> str:
            return _ask(_ask(question))

        try:
            recorded = pipe("hello")
            (source,) = [r.run_id for r in tracer.store.list_runs()]
            sent = stub.count
            with tracer.replay(source, name="pipe-try") as replay:
                out = pipe("hello")
        finally:
            tracer.close()
    assert stub.count == sent and out == recorded and replay.output == recorded
    a, b, run = _stored(tmp_path, source, replay.trace_id)
    assert (run.pipeline, b.input) == ("pipe-try", {"question": "hello"})
    assert _shape(b) == _shape(a)
    assert run.config["reference"] == {"run": source, "steps": 2, "all": True}


def _bad(i: int) -> None:
    """A step that fails and that the chain catches."""
    with contextlib.suppress(ValueError), step("parse", "parse", input=i):
        raise ValueError("bad answer")


def _boom(x: int) -> int:
    EXECUTED.append([x])
    raise ValueError(f"tool failed on {x}")


_BOOM = step("boom", "tool_call")(rewind.tool("boom")(_boom))


def _first_fails() -> str:
    _bad(0)
    return _ask("a") + _ask("b")


def _last_fails() -> str:
    out = _ask("a") + _ask("b")
    _bad(1)
    return out


def _two_in_a_row() -> str:
    out = _ask("a")
    _bad(1)
    _bad(2)
    return out + _ask("b")


def _nested_fails() -> str:
    out = _ask("a")
    with contextlib.suppress(ValueError), step("outer", "agent"):
        _ask("inside")
        with step("inner", "parse"):
            raise ValueError("x")
    return out + _ask("b")


def _tool_fails_twice() -> str:
    out = _ask("a")
    for _ in range(2):
        with contextlib.suppress(ValueError):
            _BOOM(3)
    return out + _ask("b")


@pytest.mark.parametrize("backend", STORE_BACKENDS)
@pytest.mark.parametrize(
    "block", [_first_fails, _last_fails, _two_in_a_row, _nested_fails, _tool_fails_twice]
)
def test_the_lane_and_the_full_path_store_caught_failures_anywhere_alike(
    backend: str, block: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Held: the third trace of a chain whose caught failure is its first step, its last, two
    in a row, a step nested in a step that fails with it, or a tool that raises twice (run
    again each time: miss:source-failed), with the lane and with the lane off: the same
    answers, requests and stored view, stored wholly by reference to the recording, 0
    requests (the failing tool runs as often as recorded)."""

    def location(side: str) -> Any:
        if backend == "sqlite":
            return tmp_path / side
        return request.getfixturevalue("postgres_server").new_store_database()

    lane_side, full_side = [_third(location(str(full)), block, full=full) for full in (0, 1)]
    assert _diff(lane_side[3], full_side[3]) == []
    assert lane_side[:3] == full_side[:3] and lane_side[1] == 0
    assert lane_side[2] == (2 if block is _tool_fails_twice else 0)
    assert lane_side[0] == lane_side[6] and lane_side[5] and full_side[5]
    assert lane_side[3]["config"]["reference"]["all"] is True


def _first_call_fails() -> str:
    with contextlib.suppress(ValueError):
        _BOOM(1)
    return _ask("a") + _ask("b")


@pytest.mark.parametrize("backend", STORE_BACKENDS)
def test_a_cached_replay_of_a_trace_whose_first_call_raised_is_linked_to_it(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The recording's first call (a tool) raised and the chain went on. A cached trace looks
    for its source once, with its first call's key: the source never recorded that call (a
    raising call leaves no call row), so no source was found and none was looked for again:
    every unchanged replay was stored unlinked and in full (3 node, 2 call rows and a state
    row). A step that raises after a lookup that found nothing now lets the next lookup look
    again: linked, stored wholly by reference, 0 requests, the tool run again as recorded;
    the lane and the full path alike."""

    def location(side: str) -> Any:
        if backend == "sqlite":
            return tmp_path / side
        return request.getfixturevalue("postgres_server").new_store_database()

    lane_side, full_side = [
        _third(location(str(full)), _first_call_fails, full=full) for full in (0, 1)
    ]
    assert _diff(lane_side[3], full_side[3]) == []
    assert lane_side[:3] == full_side[:3] and lane_side[1:3] == (0, 1)
    assert lane_side[5] and full_side[5]
    assert lane_side[3]["config"]["reference"] == {"run": "PARENT", "steps": 3, "all": True}


def _asks_then_fails() -> str:
    out = _ask("a")
    _bad(1)
    return out + _ask("b")


def _edited_fails_last() -> str:
    """The chain edited: the second question moved before the failing step."""
    out = _ask("a") + _ask("b")
    _bad(2)
    return out


@pytest.mark.parametrize("mode", ["in-place", "cached"])
def test_a_cached_call_moved_to_where_the_source_failed_is_served_not_sent(
    mode: str, tmp_path: Path
) -> None:
    """The recording's step 1 (``parse``) failed; the chain, edited, now asks its second
    question (answered in the recording, at step 2) at step 1. Every call at the position of
    a failed source step that the source did not record there was executed again
    (``miss:source-failed``), whatever the step: the replay sent a request the cache holds.
    Only a step of the failed step's name is now taken for the failed one."""
    with stub_and_client(reply) as (stub, client):
        tracer = Tracer(tmp_path, chat_client=client, raise_on_write_error=True)
        cached = Tracer(tmp_path, chat_client=client, read_cache=True, raise_on_write_error=True)
        try:
            with tracer.trace("edited", {"q": 1}) as source:
                source.set_output(_asks_then_fails())
            sent = stub.count
            block = (
                tracer.replay(source.trace_id)
                if mode == "in-place"
                else cached.trace("edited", {"q": 1})
            )
            with block as replay:
                replay.set_output(_edited_fails_last())
        finally:
            tracer.close()
            cached.close()
    assert stub.count == sent and replay.output == source.output
    assert replay.parent_run_id == source.trace_id
    reasons = [(c.outcome, c.reason) for s in replay.steps for c in s.data().calls]
    assert reasons == [("hit", "hit"), ("hit", "hit")]


def _ahead() -> float:
    """A clock a day ahead of this machine's (another machine's, a simulation's)."""
    return time.time() + 86_400.0


def test_a_cached_replay_with_its_own_clock_finds_its_source_behind_newer_traces(
    store_target: StoreTarget, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    """``Tracer(clock=...)`` dated its traces by that clock but their calls' answers (the
    cache entries' times) by this machine's: behind the four newest traces of the name (of
    another input, the same first request) the cache entry's time came before every trace's
    start, so the recording was not found among the traces started by then; the replays were
    linked to a trace of another input and stored in full. A trace's calls now take its clock
    too."""
    from rewind.tracing import tracer_source

    st = store_target.open()
    try:
        source, out = _traced(st, chat_client, 3, read_cache=False, clock=_ahead)
        for _ in range(tracer_source.CANDIDATES):
            _traced(st, chat_client, 2, read_cache=False, clock=_ahead)
        sent = fake_model.count
        replays = [_traced(st, chat_client, 3, read_cache=True, clock=_ahead) for _ in range(2)]
        assert fake_model.count == sent and all(again == out for _, again in replays)
        for replay, _ in replays:
            run = st.get_run(replay)
            assert run.parent_run_id == source
            assert run.config["reference"] == {"run": source, "steps": 6, "all": True}
    finally:
        st.close()


def _gives_up() -> str:
    _ask("a")
    _bad(1)
    _ask("b")
    raise RuntimeError("gave up")


def test_a_cached_replay_of_a_chain_that_raised_is_linked_to_its_recording(
    tmp_path: Path,
) -> None:
    """The chain raised after its steps. Its in-place and recorded-calls replays are stored by
    reference, failed with the recorded error; its cached replay (``Tracer(read_cache=True)``,
    the same code) is too: linked to the recording, stored wholly by reference, failed.

    Was a strict xfail: find_source tried completed traces only, so the cached replay found no
    source: 0 requests (answers served by key), but unlinked, every step stored again."""
    digest, requests, executed, stored, _, linked, _ = _third(tmp_path, _gives_up, full=False)
    assert (digest, requests, executed, stored["status"]) == (None, 0, 0, "failed")
    assert linked, "the replay is linked to its recording"
    assert stored["config"]["reference"]["all"] is True


_MESSAGE = ["bad answer"]


def _fails_with_message() -> str:
    out = _ask("a")
    with contextlib.suppress(ValueError), step("parse", "parse", input=1):
        raise ValueError(_MESSAGE[0])
    return out + _ask("b")


def test_a_step_that_fails_otherwise_on_replay_is_a_divergence_in_diff_and_replay_trace(
    tmp_path: Path,
) -> None:
    """A failed step has no output, and the trajectory diff compared outputs only: a replay
    whose ``parse`` step failed with another error (from the same state) was reported equal
    by ``rewind diff`` (Rewind.diff) and by replay-trace's comparison (compare_traces), while
    it was stored as changed from that step (not by reference). A failed step's error is now
    compared too; the same error is still equal."""
    from rewind import Rewind
    from rewind.tracing.inspect import compare_traces

    _MESSAGE[0] = "bad answer"
    with stub_and_client(reply) as (_stub, client):
        tracer = Tracer(tmp_path, chat_client=client, raise_on_write_error=True)
        try:
            with tracer.trace("fails", {"q": 1}) as source:
                source.set_output(_fails_with_message())
            with tracer.replay(source.trace_id) as same:
                same.set_output(_fails_with_message())
            _MESSAGE[0] = "another error"
            with tracer.replay(source.trace_id) as other:
                other.set_output(_fails_with_message())
        finally:
            tracer.close()
    st = open_store(tmp_path)
    try:
        views = {t: load_trace(st, t.trace_id) for t in (source, same, other)}
        rw = Rewind(st)
        assert rw.diff(source.trace_id, same.trace_id).first_divergence is None
        assert compare_traces(views[source], views[same])["first_divergence"] is None
        divergence = rw.diff(source.trace_id, other.trace_id).first_divergence
        assert divergence is not None and divergence.index == 1
        assert compare_traces(views[source], views[other])["first_divergence"] == 1
        assert st.get_run(other.trace_id).config["reference"]["all"] is False
    finally:
        st.close()
