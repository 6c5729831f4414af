"""A model call that raised (the endpoint dropped the connection, or refused the request) is
recorded as a ``failed`` call row naming its error's document, and a replay that reads the
cache raises that failure again, at the same step and key, sending nothing (issue #13): an
unchanged replay of a chain that caught the failure and asked again follows the recording
step for step, 0 requests, stored by reference to it. SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rewind import Rewind
from rewind.calls import chat
from rewind.errors import EndpointUnavailable, ModelCallError
from rewind.llm import ChatClient
from rewind.store import Store, open_store
from rewind.tracing import Tracer, chat_step, step
from rewind.tracing.inspect import compare_traces
from rewind.tracing.replay import replay_trace
from rewind.tracing.store import load_trace
from tests.conftest import STORE_BACKENDS
from tests.model_stub import stub_and_client
from tests.test_tracing_lane import reply

_DROPS = [0]


def _reply(question: str, n: int) -> str:
    """The stub's answers; while :data:`_DROPS` is positive, a ``flaky`` request gets no
    answer (the server drops the connection: the client raises EndpointUnavailable)."""
    if question == "flaky" and _DROPS[0] > 0:
        _DROPS[0] -= 1
        raise RuntimeError("server hiccup")
    return reply(question, n)


def _ask(question: str) -> str:
    return chat_step("llm", [{"role": "user", "content": question}], temperature=0).content


def flaky(question: str) -> str:
    """Asks until a model call answers, each try a step of its own; then asks a follow-up."""
    for _ in range(3):
        try:
            answer = _ask(question)
        except (EndpointUnavailable, ModelCallError) as exc:
            answer = f"error: {type(exc).__name__}"
            continue
        return answer + " / " + _ask("and then?")
    return answer


def flaky_in_one_step(question: str) -> str:
    """Asks again inside one step when the first try raised: the step itself succeeds."""
    messages = [{"role": "user", "content": question}]
    with step("ask", "llm_call", input={"question": question}) as s:
        try:
            answer = chat(messages, temperature=0).content
        except EndpointUnavailable:
            answer = chat(messages, temperature=0).content
        s.set_output(answer)
    return answer


def _location(backend: str, tmp_path: Path, request: pytest.FixtureRequest, side: str) -> Any:
    if backend == "sqlite":
        return tmp_path / side
    return request.getfixturevalue("postgres_server").new_store_database()


def _record(location: Any, client: ChatClient, question: str = "flaky", chain: Any = flaky) -> str:
    tracer = Tracer(location, chat_client=client, raise_on_write_error=True)
    try:
        with tracer.trace("flaky", {"question": question}) as t:
            t.set_output(chain(question))
    finally:
        tracer.close()
    assert t.write_error is None
    return t.trace_id


def _steps(st: Store, run_id: str) -> list[tuple[Any, ...]]:
    view = load_trace(st, run_id)
    return [
        (s.name, s.status, s.error_type, s.error_message, s.output_hash, s.state_hash)
        for s in view.steps
    ]


def _labels(st: Store, run_id: str) -> list[list[str]]:
    return [[c.label for c in s.calls] for s in load_trace(st, run_id).steps]


def _replay(
    mode: str,
    location: Any,
    client: ChatClient,
    source: str,
    question: str = "flaky",
    chain: Any = flaky,
) -> str:
    """An unchanged replay of ``source`` (in place, through replay-trace, or a cached trace)
    running ``chain(question)``."""
    if mode == "replay-trace":
        st = open_store(location)
        ref = f"{__name__}:{chain.__name__}"
        try:
            return replay_trace(st, source, chain=ref, chat_client=client).run_id
        finally:
            st.close()
    tracer = Tracer(
        location, chat_client=client, read_cache=mode == "cached", raise_on_write_error=True
    )
    try:
        if mode == "in-place":
            with tracer.replay(source) as t:
                t.set_output(chain(question))
        else:
            with tracer.trace("flaky", {"question": question}) as t:
                t.set_output(chain(question))
    finally:
        tracer.close()
    return t.trace_id


@pytest.mark.parametrize("backend", STORE_BACKENDS)
def test_a_model_call_that_raised_is_recorded_with_its_error(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The raising call was not recorded at all (only its step's error): it is a call row now,
    ``failed:raised``, 0 tokens, whose result is its error's document (type, message, hint),
    kept with the run; the step it raised in failed, the chain went on."""
    location = _location(backend, tmp_path, request, "s")
    _DROPS[0] = 1
    with stub_and_client(_reply) as (stub, client):
        source = _record(location, client)
        assert stub.count == 3
    st = open_store(location)
    try:
        view = load_trace(st, source, payloads=True)
        assert [s.status for s in view.steps] == ["failed", "success", "success"]
        assert _labels(st, source) == [["failed:raised"], ["miss:bypass"], ["miss:bypass"]]
        (call,) = view.steps[0].calls
        assert (call.kind, call.prompt_tokens, call.completion_tokens) == ("llm", 0, 0)
        doc = json.loads(st.get_blob(call.result_hash))
        assert doc["error"] == "EndpointUnavailable" == view.steps[0].error_type
        assert doc["message"] in view.steps[0].error_message
        assert view.steps[0].tokens == 0 and view.steps[0].llm_calls[0].content is None
    finally:
        st.close()


@pytest.mark.parametrize("mode", ["in-place", "replay-trace", "cached"])
@pytest.mark.parametrize("backend", STORE_BACKENDS)
def test_an_unchanged_replay_raises_the_recorded_failure_and_sends_nothing(
    backend: str, mode: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The endpoint answers now; the source's first call got no answer. Every replay that
    reads the cache (in place, replay-trace, ``Tracer(read_cache=True)``) raises the recorded
    failure at that step again (``failed:replayed``): the chain retries as it did, the same
    steps and hashes, 0 requests, stored wholly by reference, linked to its source. Before,
    the call was sent again (miss:source-failed), answered, and the replay diverged."""
    location = _location(backend, tmp_path, request, "s")
    _DROPS[0] = 1
    with stub_and_client(_reply) as (stub, client):
        source = _record(location, client)
        sent = stub.count
        replay = _replay(mode, location, client, source)
        assert stub.count == sent
    st = open_store(location)
    try:
        assert _steps(st, replay) == _steps(st, source)
        assert _labels(st, replay) == [["failed:replayed"], ["hit"], ["hit"]]
        run = st.get_run(replay)
        assert run.parent_run_id == source
        assert run.config["reference"] == {"run": source, "steps": 3, "all": True}
        assert Rewind(st).diff(source, replay).first_divergence is None
        views = load_trace(st, source), load_trace(st, replay)
        assert compare_traces(*views)["first_divergence"] is None
    finally:
        st.close()


def test_a_refused_request_is_raised_again_with_its_type_and_message(tmp_path: Path) -> None:
    """HTTP 400 (``ModelCallError``, the message naming the request's number): the replay
    raises the recorded error, the same type and message, not a new refusal ("refused #3")."""
    with stub_and_client(reply) as (stub, client):
        source = _record(tmp_path, client, "refuse")
        sent = stub.count
        replay = _replay("in-place", tmp_path, client, source, "refuse")
        assert stub.count == sent == 3
    st = open_store(tmp_path)
    try:
        steps = _steps(st, source)
        assert [s[2] for s in steps] == ["ModelCallError"] * 3
        assert "refused #1" in steps[0][3]
        assert _steps(st, replay) == steps
        assert st.get_run(replay).config["reference"]["all"] is True
    finally:
        st.close()


def test_a_failure_caught_inside_its_step_is_replayed_and_the_step_is_not_failed(
    tmp_path: Path,
) -> None:
    """The step caught the dropped call and asked again itself: the step succeeded, with two
    calls (the first ``failed:raised``), and is not taken for a failed step (its outcome is
    the miss, not ``failed``). The cached replay raises the first call's failure again and
    serves the second: 0 requests, stored by reference."""
    _DROPS[0] = 1
    with stub_and_client(_reply) as (stub, client):
        source = _record(tmp_path, client, chain=flaky_in_one_step)
        sent = stub.count
        replay = _replay("cached", tmp_path, client, source, chain=flaky_in_one_step)
        assert stub.count == sent == 2
    st = open_store(tmp_path)
    try:
        (ask,) = [n for n in st.nodes_of(source) if n.name == "ask"]
        assert (ask.cache_outcome, ask.cache_reason) == ("miss", "raised")
        assert _steps(st, replay) == _steps(st, source)
        assert _labels(st, source) == [["failed:raised", "miss:bypass"]]
        assert _labels(st, replay) == [["failed:replayed", "hit"]]
        assert st.get_run(replay).config["reference"]["all"] is True
    finally:
        st.close()


def test_a_recording_without_failures_has_no_failed_call_rows(tmp_path: Path) -> None:
    """Nothing is added where nothing raised: the same call rows as before."""
    with stub_and_client(reply) as (_stub, client):
        source = _record(tmp_path, client)
    st = open_store(tmp_path)
    try:
        assert _labels(st, source) == [["miss:bypass"], ["miss:bypass"]]
    finally:
        st.close()


def _flaky_block() -> str:
    return flaky("flaky")


@pytest.mark.parametrize("backend", STORE_BACKENDS)
def test_the_lane_and_the_full_path_store_a_replayed_failure_alike(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third cached trace of a chain whose first model call was dropped when recorded,
    with the lane and with the lane off: the same answers, 0 requests, the same stored view,
    stored wholly by reference to the recording (the lane leaves the failed step to the full
    path, which raises the recorded failure)."""
    import tests.test_attack31 as attack31
    from tests.test_tracing_lane import _diff

    monkeypatch.setattr(attack31, "reply", _reply)
    sides = []
    for full in (False, True):
        _DROPS[0] = 1
        location = _location(backend, tmp_path, request, str(full))
        sides.append(attack31._third(location, _flaky_block, full=full))
    lane_side, full_side = sides
    # each side had its own stub: the error names its port (the failure's document too)
    differ = [d.split(":")[0] for d in _diff(lane_side[3], full_side[3])]
    assert differ == [".steps[0].calls[0].result_hash", ".steps[0].error_message"]
    assert lane_side[1:3] == full_side[1:3] and lane_side[1] == 0
    assert lane_side[0] == lane_side[6] and full_side[0] == full_side[6]
    assert lane_side[5] and full_side[5]
    assert lane_side[3]["config"]["reference"]["all"] is True


def test_an_exported_failed_call_imports_as_a_failure_never_as_an_answer(tmp_path: Path) -> None:
    """Exported (``rewind.calls``) and imported into an empty store, a refused call keeps its
    row (``failed:raised``, its error's document) and seeds no cache entry: its error's
    document was seeded as the model's answer to that request. The import's replay raises
    the failure again (the same message), sending nothing."""
    from rewind.tracing.otel import export_to_file, import_otlp, read_otlp_file

    with stub_and_client(reply) as (stub, client):
        source = _record(tmp_path / "a", client, "refuse")
        a = open_store(tmp_path / "a")
        b = open_store(tmp_path / "b")
        try:
            export_to_file(a, [source], tmp_path / "t.json")
            assert import_otlp(b, read_otlp_file(tmp_path / "t.json")).imported == [source]
            assert _labels(b, source) == _labels(a, source) == [["failed:raised"]] * 3
            (failed,) = load_trace(b, source).steps[0].calls
            assert b.llm_cache_get(failed.key) is None
            sent = stub.count
            replay = replay_trace(b, source, chain=f"{__name__}:flaky", chat_client=client)
            assert stub.count == sent
            assert _steps(b, replay.run_id) == _steps(b, source)
        finally:
            a.close()
            b.close()


def test_a_replayed_failure_naming_a_blob_a_gc_deleted_is_refused(tmp_path: Path) -> None:
    """A ``failed:replayed`` call row names the source's failure document, which its batch
    does not carry (as a hit's answer): when a gc deleted that blob meanwhile, the write is
    refused whole, not left naming a missing blob (only hits were checked)."""
    from rewind.errors import StoreError
    from rewind.store.retention import bump_blob_epoch, collect_garbage
    from rewind.store.store import WriteBatch

    st = open_store(tmp_path)
    try:
        collect_garbage(st, 0.0)  # the store's blob epoch is kept from the first gc on
        with st.write():
            pass  # the store has seen the current blob epoch
        with st.write() as conn:
            bump_blob_epoch(conn)
        row = {
            "run_id": "r", "position": 0, "call_index": 0, "kind": "llm", "name": "m",
            "key": "a" * 64, "request_hash": "b" * 64, "result_hash": "c" * 64,
            "outcome": "failed", "reason": "replayed", "prompt_tokens": 0,
            "completion_tokens": 0, "latency_ms": 0.0, "determinism": "deterministic",
            "produced_at": 1.0,
        }  # fmt: skip
        with pytest.raises(StoreError, match="deleted by a concurrent rewind gc"):
            st.write_batch(WriteBatch(calls=[row]), before=lambda conn: None)
    finally:
        st.close()


def test_the_api_shows_a_failed_call_as_its_error(tmp_path: Path) -> None:
    """The node's call list lays a failed call's document out as its error (type and
    message), not as the error's type name alone."""
    from rewind.api.calls_view import calls_detail

    _DROPS[0] = 1
    with stub_and_client(_reply) as (_stub, client):
        source = _record(tmp_path, client)
    st = open_store(tmp_path)
    try:
        step0 = load_trace(st, source).steps[0]
        (detail,) = calls_detail(st, source, 1, list(step0.calls))
        assert detail["label"] == "failed:raised" and detail["tokens"] == 0
        content = detail["response"]["content"]
        assert content.startswith("EndpointUnavailable: the connection to the model endpoint")
    finally:
        st.close()


def test_a_failed_call_survives_archive_and_restore(tmp_path: Path) -> None:
    """gc archives the recording (its failure document with its rows) and deletes what no
    row names; restored, the recording's failed call is whole and an unchanged replay of it
    raises the failure again, 0 requests."""
    from rewind.store.objects import ObjectStore
    from rewind.store.retention import collect_garbage, restore_run

    objects = ObjectStore((tmp_path / "objects").resolve().as_uri())
    _DROPS[0] = 1
    with stub_and_client(_reply) as (stub, client):
        source = _record(tmp_path / "s", client)
        st = open_store(tmp_path / "s")
        try:
            want = _steps(st, source)
            report = collect_garbage(st, 0.0, archive=objects)
            assert [a.run_id for a in report.archived] == [source] and st.list_runs() == []
            restore_run(st, source, archive=objects)
            assert _steps(st, source) == want
            (failed,) = load_trace(st, source).steps[0].calls
            assert json.loads(st.get_blob(failed.result_hash))["error"] == "EndpointUnavailable"
        finally:
            st.close()
        sent = stub.count
        replay = _replay("in-place", tmp_path / "s", client, source)
        assert stub.count == sent
    st = open_store(tmp_path / "s")
    try:
        assert _steps(st, replay) == want
    finally:
        st.close()


@pytest.mark.parametrize("chain", [flaky, flaky_in_one_step])
def test_a_recorded_calls_replay_replays_the_failed_call_as_recorded(
    chain: Any, tmp_path: Path
) -> None:
    """Without the chain's code (a replay of its recorded calls), the failed call is sent
    again unchanged: the cache raises its recorded failure, and the step ends as recorded
    (failed, or going on to its retry's answer). That failure was taken for the endpoint being
    down: the replay ended failed and replay_trace raised EndpointUnavailable, where before
    the failed call was recorded it replayed whole (0 requests, stored by reference)."""
    _DROPS[0] = 1
    with stub_and_client(_reply) as (stub, client):
        source = _record(tmp_path, client, chain=chain)
        sent = stub.count
        st = open_store(tmp_path)
        try:
            replay = replay_trace(st, source, chat_client=client)
            assert stub.count == sent
            assert replay.config["replay_mode"] == "recorded-calls"
            assert replay.status == "completed"
            assert _steps(st, replay.run_id) == _steps(st, source)
            assert replay.config["reference"]["all"] is True
        finally:
            st.close()


def test_a_burr_replay_raises_a_failure_its_node_caught_and_sends_nothing(tmp_path: Path) -> None:
    """A Burr node caught the dropped request and asked again: recorded, its calls are
    ``failed:raised`` and the answer; an unchanged replay (a fork at the node) raises the
    recorded failure, then serves the answer: 0 requests, identical hashes. Before, the first
    call left no row: the replay sent it again and got an answer (one call, another output)."""
    from tests import pipelines

    _DROPS[0] = 1
    with stub_and_client(_reply) as (stub, client):
        # the node's question is "flaky": the stub drops it while _DROPS is positive
        rw = Rewind(tmp_path / "store", chat_client=client)
        try:
            run = rw.record(pipelines.retrying_llm_pipeline, {"question": "flaky"})
            sent = stub.count
            replay = rw.replay(run.run_id, at="ask_again")
            assert stub.count == sent == 2
            a, b = rw.store.nodes_of(run.run_id), rw.store.nodes_of(replay.run_id)
            assert [c.label for c in a[0].calls] == ["failed:raised", "miss:bypass"]
            assert [c.label for c in b[0].calls] == ["failed:replayed", "hit"]
            assert (a[0].cache_outcome, a[0].cache_reason) == ("miss", "raised")
            assert (b[0].cache_outcome, b[0].cache_reason) == ("hit", "hit")
            assert [n.output_hash for n in b] == [n.output_hash for n in a]
            assert rw.diff(run.run_id, replay.run_id).first_divergence is None
        finally:
            rw.store.close()


def test_a_burr_fork_serves_its_parents_answer_over_an_ancestors_failure(tmp_path: Path) -> None:
    """The recording's first request was dropped; a live re-run of it (a stability fork) got
    an answer at once. A replay of that fork serves the fork's answer (the nearest run's row
    at that node and request wins), not the recording's failure."""
    from tests import pipelines

    _DROPS[0] = 1
    with stub_and_client(_reply) as (stub, client):
        rw = Rewind(tmp_path / "store", chat_client=client)
        try:
            run = rw.record(pipelines.retrying_llm_pipeline, {"question": "flaky"})
            live = rw.fork(run.run_id, at="ask_again", cache_mode="stability")
            sent = stub.count
            assert sent == 3
            assert [c.label for c in rw.store.nodes_of(live.run_id)[0].calls] == [
                "bypass:stability"
            ]
            replay = rw.replay(live.run_id, at="ask_again")
            assert stub.count == sent
            a, b = rw.store.nodes_of(live.run_id), rw.store.nodes_of(replay.run_id)
            assert [c.label for c in b[0].calls] == ["hit"]
            assert [n.output_hash for n in b] == [n.output_hash for n in a]
        finally:
            rw.store.close()


def flaky_outside_steps(question: str) -> str:
    """:func:`flaky` with ``rewind.chat`` called in the trace's body, outside any step (each
    call a step of its own)."""
    messages = [{"role": "user", "content": question}]
    try:
        return chat(messages, temperature=0).content
    except EndpointUnavailable:
        return chat(messages, temperature=0).content


@pytest.mark.parametrize("mode", ["in-place", "cached"])
def test_a_call_outside_any_step_that_raised_replays_as_its_own_failed_step(
    mode: str, tmp_path: Path
) -> None:
    """A model call in the chain's body is a step of its own: when it raised, that step failed
    with its failed call; a replay raises it again there, 0 requests, stored by reference."""
    _DROPS[0] = 1
    with stub_and_client(_reply) as (stub, client):
        source = _record(tmp_path, client, chain=flaky_outside_steps)
        sent = stub.count
        replay = _replay(mode, tmp_path, client, source, chain=flaky_outside_steps)
        assert stub.count == sent == 2
    st = open_store(tmp_path)
    try:
        assert [s[1] for s in _steps(st, source)] == ["failed", "success"]
        assert _steps(st, replay) == _steps(st, source)
        assert _labels(st, replay) == [["failed:replayed"], ["hit"]]
        assert st.get_run(replay).config["reference"]["all"] is True
    finally:
        st.close()


def test_a_call_that_misses_with_no_endpoint_configured_is_not_recorded_as_failed(
    tmp_path: Path,
) -> None:
    """A replay with no model endpoint configured (replay-trace of the recorded calls, the
    question changed) raises EndpointUnavailable at the call that misses, before anything is
    sent: that is the replay's set-up, not the endpoint's behaviour. It was kept as the call's
    recorded failure (failed:raised), which a later replay of that replay would raise again
    with an endpoint configured; the step fails with no call row, as before."""
    with stub_and_client(reply) as (_stub, client):
        source = _record(tmp_path, client, "why?")
    st = open_store(tmp_path)
    try:
        with pytest.raises(EndpointUnavailable, match="no model endpoint is configured"):
            replay_trace(st, source, change="input.question=how?")
        (replay,) = [r.run_id for r in st.list_runs() if r.run_id != source]
        steps = load_trace(st, replay).steps
        assert [s.error_type for s in steps] == ["EndpointUnavailable", None]
        assert _labels(st, replay) == [[], ["hit"]]
    finally:
        st.close()


def test_a_grid_counts_a_request_that_raised_as_sent() -> None:
    """A variant's LLM requests (without a shared client) are its calls sent: a call that
    raised (failed:raised) was sent too; a replayed failure (failed:replayed) was not."""
    from rewind.grid import _llm_requests
    from rewind.store.records import CallRecord, NodeRecord

    def call(i: int, outcome: str, reason: str) -> CallRecord:
        return CallRecord(i, "llm", "m", "k" * 64, "r" * 64, "h" * 64, outcome, reason)

    def node(*calls: CallRecord) -> NodeRecord:
        return NodeRecord(
            "run", 0, "ask", 0, "run", 0, False, "i" * 64, None, None, {}, 0.0, 0, 0,
            "miss", "raised", None, 0.0, calls=calls,
        )  # fmt: skip

    sent = node(call(0, "failed", "raised"), call(1, "miss", "no-entry"))
    assert _llm_requests(None, "run", [sent]) == (2, 0)
    replayed = node(call(0, "failed", "replayed"), call(1, "hit", "hit"))
    assert _llm_requests(None, "run", [replayed]) == (0, 0)


def test_a_replay_without_cached_model_answers_sends_the_failed_call_again(
    tmp_path: Path,
) -> None:
    """The way to try a recorded failure live: replay-trace with cached LLM answers off sends
    every model call, the one that raised included; the endpoint answers now, so the chain
    does not retry (one ``llm`` step fewer before the follow-up)."""
    from rewind.tracing.switches import ReplaySwitches

    _DROPS[0] = 1
    with stub_and_client(_reply) as (stub, client):
        source = _record(tmp_path, client)
        sent = stub.count
        st = open_store(tmp_path)
        try:
            replay = replay_trace(
                st,
                source,
                chain=f"{__name__}:flaky",
                chat_client=client,
                switches=ReplaySwitches(cached_llm=False),
            )
            assert stub.count == sent + 2
            assert [s[1] for s in _steps(st, replay.run_id)] == ["success", "success"]
        finally:
            st.close()


def _ask_once(question: str) -> str:
    """A chain that does not catch: its trace fails when the model call raises."""
    return _ask(question)


def _cached(location: Path, client: ChatClient) -> tuple[str, str]:
    """Run :func:`_ask_once` in a new trace of ``Tracer(read_cache=True)``: (trace id, output)."""
    tracer = Tracer(location, chat_client=client, read_cache=True, raise_on_write_error=True)
    try:
        with tracer.trace("flaky", {"question": "flaky"}) as t:
            t.set_output(_ask_once("flaky"))
    finally:
        tracer.close()
    return t.trace_id, t.output


def test_a_cached_chain_that_failed_because_its_endpoint_did_answers_once_it_answers(
    tmp_path: Path,
) -> None:
    """The endpoint dropped the first request and the chain raised out of it (the trace
    failed); the user's endpoint answers now and the same code runs again in a
    ``Tracer(read_cache=True)`` trace. That trace is linked to the failed one (its source),
    but the failure is not its recorded path: the call is sent and answered. Before, the
    recorded EndpointUnavailable was raised again ("cannot reach the model endpoint ... start
    it") at every run, sending nothing, while the endpoint answered."""
    _DROPS[0] = 1
    with stub_and_client(_reply) as (stub, client):
        with pytest.raises(EndpointUnavailable):
            _record(tmp_path, client, chain=_ask_once)
        sent = stub.count
        first, answer = _cached(tmp_path, client)
        assert stub.count == sent + 1 and answer
        second, again = _cached(tmp_path, client)
        assert stub.count == sent + 1 and again == answer
    st = open_store(tmp_path)
    try:
        (failed,) = [r.run_id for r in st.list_runs() if r.status == "failed"]
        assert _labels(st, first) == [["miss:source-failed"]]
        assert st.get_run(first).parent_run_id == failed
        assert st.get_run(second).parent_run_id == first
        assert _labels(st, second) == [["hit"]]
    finally:
        st.close()


def test_an_explicit_replay_of_a_failed_trace_says_the_failure_is_replayed(
    tmp_path: Path,
) -> None:
    """``with tracer.replay(trace)``, the trace having failed because its endpoint dropped the
    request: the replay fails as recorded (the same error text, nothing sent), and the error
    carries a note saying so and how to send the call again: its own message ("cannot reach
    the model endpoint ... start it") is the recording's, wrong advice for an endpoint that
    answers."""
    _DROPS[0] = 1
    with stub_and_client(_reply) as (stub, client):
        with pytest.raises(EndpointUnavailable) as recorded:
            _record(tmp_path, client, chain=_ask_once)
        sent = stub.count
        (source,) = [r.run_id for r in open_store(tmp_path).list_runs()]
        tracer = Tracer(tmp_path, chat_client=client, raise_on_write_error=True)
        try:
            with pytest.raises(EndpointUnavailable) as replayed, tracer.replay(source):
                _ask_once("flaky")
        finally:
            tracer.close()
        assert stub.count == sent
    assert str(replayed.value) == str(recorded.value)
    (note,) = replayed.value.__notes__
    assert "replayed from the record" in note and "--no-cached-llm" in note


@pytest.mark.parametrize("backend", STORE_BACKENDS)
def test_a_store_with_failed_calls_is_at_a_revision_older_rewinds_refuse(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Migration 0017 marks stores that may hold failed call rows: a Rewind from before it
    (newest revision 0016) refuses them ("unknown revision") instead of serving a failure's
    document as the model's answer. Downgrading to 0016 deletes those rows, which leaves the
    calls that raised unrecorded, as 0016 recorded them; opening upgrades to 0017 again."""
    from alembic import command

    from rewind.store import migrate
    from rewind.store.schema import calls

    location = _location(backend, tmp_path, request, "s")
    _DROPS[0] = 1
    with stub_and_client(_reply) as (_stub, client):
        source = _record(location, client)
    st = open_store(location)
    try:
        with st.read() as conn:
            assert migrate.current_revision(conn) == migrate.HEAD == "0017"
        assert _labels(st, source)[0] == ["failed:raised"]
        with st.write() as conn:
            command.downgrade(migrate._config(conn), "0016")  # type: ignore[arg-type]
            outcomes = [r.outcome for r in conn.execute(calls.select())]
        assert outcomes == ["miss", "miss"]
    finally:
        st.close()
    st = open_store(location)
    try:
        with st.read() as conn:
            assert migrate.current_revision(conn) == "0017"
        assert _labels(st, source) == [[], ["miss:bypass"], ["miss:bypass"]]
    finally:
        st.close()
