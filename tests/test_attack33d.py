"""Attack on the last fixes of session 33 (issue #13): which recorded model-call failures a
replay raises again, migration 0017, the cut digest, failed-source lookup, restore and delete.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from pathlib import Path
from typing import Any

import pytest
from burr.core import State, action
from burr.core.graph import GraphBuilder

from rewind import Rewind
from rewind.calls import chat
from rewind.errors import EndpointUnavailable, ModelCallError
from rewind.replay import Pipeline
from rewind.store import open_store
from rewind.tracing import step
from rewind.tracing.store import load_trace
from tests import test_failed_calls as failed
from tests.model_stub import stub_and_client


def _record_then_cached(tmp_path: Path, chain: Any) -> tuple[str, str, int]:
    """(source, cached replay, requests the replay sent): ``chain`` recorded with its first
    'flaky' request dropped, then run with ``Tracer(read_cache=True)``, the endpoint answering.
    The recording sends 2 requests."""
    failed._DROPS[0] = 1
    with stub_and_client(failed._reply) as (stub, client):
        source = failed._record(tmp_path, client, chain=chain)
        assert stub.count == 2
        cached = failed._replay("cached", tmp_path, client, source, chain=chain)
        return source, cached, stub.count - 2


def _asks_in_its_own_step_after_a_child(question: str) -> str:
    """A step whose child step asks first (answered), then asks itself; when its own call
    raises it returns a fallback. Its own call (position 0) comes after its child's answer
    (position 1) in time, though not by position."""
    with step("agent", "llm_call", input={"question": question}) as s:
        warm = failed._ask("hello")
        try:
            answer = chat([{"role": "user", "content": question}], temperature=0).content
        except (EndpointUnavailable, ModelCallError) as exc:
            answer = f"error: {type(exc).__name__}"
        s.set_output(warm + " / " + answer)
    return warm + " / " + answer


def test_a_cached_chain_sends_again_a_step_s_own_failure_after_its_child_s_answer(
    tmp_path: Path,
) -> None:
    """e843fd5 orders a source's calls by (step position, call index): a step's own model
    call that raised after its child step's answer was taken as followed by an answer (the
    child's position is higher), so the chain counted as recovered and every later
    ``Tracer(read_cache=True)`` run, the endpoint answering, raised the recorded failure again
    and returned the fallback, forever. A child's answer is not after its parent's call."""
    source, cached, sent = _record_then_cached(tmp_path, _asks_in_its_own_step_after_a_child)
    st = open_store(tmp_path)
    try:
        assert failed._labels(st, source)[0] == ["failed:raised"]
        assert sent == 1
        assert failed._labels(st, cached)[0] == ["miss:no-entry"]  # sent: it has no answer
        out = load_trace(st, cached).steps[0].output
        assert out is not None and "error" not in str(out), out
    finally:
        st.close()


def _answers_then_fails(question: str) -> str:
    """Two steps: the first answered, the second raised (caught: a fallback)."""
    first = failed._ask("hello")
    try:
        second = failed._ask(question)
    except (EndpointUnavailable, ModelCallError) as exc:
        second = f"error: {type(exc).__name__}"
    return first + " / " + second


def test_a_cached_chain_sends_again_a_failure_after_an_earlier_step_s_answer(
    tmp_path: Path,
) -> None:
    """The endpoint went down mid-run: the first step was answered, the second step's call
    raised and the chain returned a fallback. An answer of a step created before the failed
    one is no recovery from it: a cached run, the endpoint answering, sends the call again."""
    source, cached, sent = _record_then_cached(tmp_path, _answers_then_fails)
    st = open_store(tmp_path)
    try:
        assert failed._labels(st, source)[1] == ["failed:raised"]
        assert sent == 1
        assert [label.split(":")[0] for label in failed._labels(st, cached)[1]] == ["miss"]
    finally:
        st.close()


def _nested(levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


def test_a_step_output_nested_just_past_the_hasher_s_depth_is_stored(tmp_path: Path) -> None:
    """A step output nested 402 to ~465 levels (past the canonical hasher's 400, above the
    cut's 64 + 400) made the whole trace fail to write ('nests deeper than 400 levels'): a
    recorded run lost for one deep value. jsonable copied the refused value element by
    element and took each element's own canonical round trip, up to 400 levels more, below
    the levels it had copied: its form nested 465 levels, which the store refuses. An
    element's round trip is kept only when the whole form stays within the store's depth;
    deeper, it is copied on and cut (with its digest). 401 levels keeps its form."""
    from rewind.tracing import Tracer
    from rewind.tracing.model import jsonable

    assert jsonable(_nested(401, "a")) == _nested(401, "a")
    for levels in (402, 430, 465):
        tracer = Tracer(tmp_path / str(levels), raise_on_write_error=True)
        try:
            with tracer.trace("deep", {"levels": levels}) as t:
                with step("s", "transform", input={"levels": levels}) as s:
                    s.set_output(_nested(levels, "a"))
                t.set_output("ok")
        finally:
            tracer.close()
        assert t.write_error is None
        st = open_store(tmp_path / str(levels))
        try:
            assert load_trace(st, t.trace_id).steps[0].status == "success"
        finally:
            st.close()
    cut = jsonable(_nested(430, "a"))
    assert cut != jsonable(_nested(430, "b"))  # the cut keeps a digest of the content


def _at_stack_depth(frames: int, fn: Any) -> Any:
    return fn() if frames <= 0 else _at_stack_depth(frames - 1, fn)


def test_a_refused_value_has_one_form_at_any_stack_depth() -> None:
    """A step output nested 50 levels with a NaN at the bottom (refused by the canonical
    hasher, so copied element by element) has one form whatever the depth of the caller's
    stack, and two such outputs differing at the bottom differ there too. It was copied
    recursively in place (~4 frames a level, 64 levels): with less than ~300 frames left, a
    RecursionError it caught gave the sub-value as ``{"$unhashable": "<type>"}`` with no
    digest. A caller short of stack has it computed on a fresh one."""
    from rewind.tracing.model import jsonable

    one, two = _nested(50, float("nan")), _nested(50, float("inf"))
    shallow = jsonable(one)
    frames = sys.getrecursionlimit() - len(inspect.stack(0)) - 200
    deep_one = _at_stack_depth(frames, lambda: jsonable(one))
    deep_two = _at_stack_depth(frames, lambda: jsonable(two))
    assert deep_one != deep_two
    assert deep_one == shallow
    # 30 frames left: the plain copy of a list raised RecursionError out of jsonable
    frames = sys.getrecursionlimit() - len(inspect.stack(0)) - 30
    assert _at_stack_depth(frames, lambda: jsonable(one)) == shallow
    assert _at_stack_depth(frames, lambda: jsonable([[1, 2], {"a": "b"}])) == [[1, 2], {"a": "b"}]


def _asks_itself_after_its_child_failed(question: str) -> str:
    """A step whose child step asks first; when the child's call raises, the step asks again
    itself (answered): its own answer (position 0) comes after its child's failure (position
    1) in time, though not by position."""
    with step("agent", "llm_call", input={"question": question}) as s:
        try:
            answer = failed._ask(question)
        except (EndpointUnavailable, ModelCallError):
            answer = chat([{"role": "user", "content": question}], temperature=0).content
        s.set_output(answer)
    return answer


def test_a_cached_chain_replays_a_child_s_failure_its_parent_step_recovered_from(
    tmp_path: Path,
) -> None:
    """The source recovered from its child step's failure (the parent step asked again and was
    answered): the failure is its recorded path, and an unchanged cached replay raises it again
    and sends nothing, as when the retry is a step of its own. e843fd5 ordered the calls by
    (position, call index), so the parent's answer (position 0) was not after the child's
    failure (position 1): the failure was sent again, the child answered now, and the replay
    left the recorded path (1 request, its steps not the source's). An answer produced after
    the failure was recorded is after it."""
    source, cached, sent = _record_then_cached(tmp_path, _asks_itself_after_its_child_failed)
    st = open_store(tmp_path)
    try:
        assert sent == 0
        assert failed._labels(st, source) == [["miss:bypass"], ["failed:raised"]]
        assert failed._labels(st, cached) == [["hit"], ["failed:replayed"]]
        assert failed._steps(st, cached) == failed._steps(st, source)
        assert st.get_run(cached).parent_run_id == source
    finally:
        st.close()


def _failed_then_cached(
    tmp_path: Path, chain: Any, raised: type[Exception], again: type[Exception] | None
) -> tuple[int, int]:
    """(requests the recording sent, requests its cached replay sent): ``chain`` recorded with
    its first 'flaky' request dropped, raising ``raised``, then run with
    ``Tracer(read_cache=True)``, the endpoint answering, raising ``again`` (None: nothing)."""
    failed._DROPS[0] = 1
    with stub_and_client(failed._reply) as (stub, client):
        with pytest.raises(raised):
            failed._record(tmp_path, client, chain=chain)
        recorded = stub.count
        with pytest.raises(again) if again else contextlib.nullcontext():
            failed._replay("cached", tmp_path, client, "", chain=chain)
        return recorded, stub.count - recorded


def _recovers_then_raises(question: str) -> str:
    """:func:`tests.test_failed_calls.flaky` (asks again after a dropped request), then raises
    an error of its own (a parse of the answer that fails): its trace fails."""
    answer = failed.flaky(question)
    raise ValueError(f"cannot parse {answer[:20]!r}")


def test_a_cached_chain_that_raised_after_recovering_replays_its_recorded_path(
    tmp_path: Path,
) -> None:
    """The chain recovered from a dropped request (asked again, answered), then raised an
    error of its own: its trace failed, not because of its endpoint. An unchanged cached
    replay follows the recorded path: the dropped request raised again, 0 requests, the same
    steps, ending with the same error, linked to it. 1fc38fe sent every recorded failure of a
    failed source again: the first try was answered now, the chain took another path (1
    request). Which failures a cached trace sends again is e843fd5's rule (no answer after
    them), whatever the source's status."""
    sent = _failed_then_cached(tmp_path, _recovers_then_raises, ValueError, ValueError)
    st = open_store(tmp_path)
    try:
        source, cached = [r.run_id for r in sorted(st.list_runs(), key=lambda r: r.created_at)]
        assert sent == (3, 0)
        assert failed._labels(st, cached) == [["failed:replayed"], ["hit"], ["hit"]]
        assert failed._steps(st, cached) == failed._steps(st, source)
        assert st.get_run(cached).parent_run_id == source
    finally:
        st.close()


def _raises_out_after_a_last_answer(question: str) -> str:
    """Asks; whatever happens, asks a closing question (answered); a failure raises out."""
    try:
        return failed._ask(question)
    finally:
        failed._ask("hello")


def test_a_cached_chain_that_raised_out_of_a_model_call_sends_it_again_after_any_answer(
    tmp_path: Path,
) -> None:
    """The chain raised out of the dropped request (its trace failed with EndpointUnavailable),
    though a closing question was answered after it: the failure is no recorded path to
    follow, and a cached run, the endpoint answering, sends the call again (1fc38fe), whatever
    answer came after it."""
    chain = _raises_out_after_a_last_answer
    sent = _failed_then_cached(tmp_path, chain, EndpointUnavailable, None)
    st = open_store(tmp_path)
    try:
        source, cached = [r.run_id for r in sorted(st.list_runs(), key=lambda r: r.created_at)]
        assert sent == (2, 1)
        assert failed._labels(st, cached)[0] == ["miss:source-failed"]
        assert st.get_run(cached).parent_run_id == source
    finally:
        st.close()


@action(reads=["question"], writes=["answer"])
def ask_then_close(state: State) -> State:
    """Asks; whatever happens, asks a closing question; a failure raises out of the node."""
    try:
        answer = chat([{"role": "user", "content": state["question"]}], temperature=0).content
    finally:
        chat([{"role": "user", "content": "hello"}], temperature=0)
    return state.update(answer=answer)


closing_pipeline = Pipeline(
    name="closing",
    graph=GraphBuilder().with_actions(ask_then_close=ask_then_close).build(),
    entrypoint="ask_then_close",
    ref="tests.test_attack33d:closing_pipeline",
)


@pytest.mark.parametrize("how", ["fork", "replay"])
def test_a_burr_node_that_raised_out_of_a_model_call_forks_live_after_any_answer(
    how: str, tmp_path: Path
) -> None:
    """The node's request was dropped and it raised out of it (the run failed with
    EndpointUnavailable), though its closing question was answered after it (a ``finally``).
    The endpoint answers now; a fork (or replay) at the node must send the call again, not
    replay the failure at every try: 13697dd replays a parent's failure whenever its run got
    an answer after it."""
    failed._DROPS[0] = 1
    with stub_and_client(failed._reply) as (stub, client):
        rw = Rewind(tmp_path / "store", chat_client=client)
        try:
            with pytest.raises(EndpointUnavailable):
                rw.record(closing_pipeline, {"question": "flaky"})
            (run,) = rw.store.list_runs()
            (node,) = rw.store.nodes_of(run.run_id)
            assert [c.label for c in node.calls] == ["failed:raised", "miss:bypass"]
            sent = stub.count
            child = getattr(rw, how)(run.run_id, at=node.name)
            assert stub.count == sent + 1
            assert child.status == "completed"
        finally:
            rw.store.close()


def test_a_deep_chain_of_pydantic_models_keeps_their_extra_fields() -> None:
    """4458f37 gives a pydantic model too deep for model_dump as its ``model_fields``: a model
    that allows extra fields (``extra="allow"``, what model_dump holds beside its fields) lost
    them, so two chains of 1,000 models differing only in an extra field had one form and one
    hash (a changed replay stored as unchanged), and a shallow model's form held them."""
    pydantic = pytest.importorskip("pydantic")
    from rewind.tracing.model import jsonable

    class Node(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="allow")
        v: int
        nxt: Any = None

    def chain(length: int, tag: str) -> Any:
        node = None
        for i in range(length):
            node = Node(v=i, nxt=node, tag=tag if i == 0 else "same")
        return node

    assert jsonable(chain(1000, "a")) != jsonable(chain(1000, "b"))
    deep = jsonable(chain(1000, "a"))
    assert deep["tag"] == "same" and deep["v"] == 999
