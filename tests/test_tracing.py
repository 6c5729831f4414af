"""The tracer: traces are runs and steps are node rows, in the same store as Burr runs.

Covers the context manager and decorator APIs, step types and statuses, nesting, exceptions
(recorded, re-raised), canonical hashes (the same Merkle encoding as the Burr recorder, so
``Rewind.node_input/node_output/node_state`` and ``Rewind.diff`` work unchanged), durations,
tokens of LLM steps through the LLM cache, threads and asyncio, and ``replay_trace``: an unchanged
replay is all cache hits with 0 tokens and identical hashes; a changed input shows in the diff.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import rewind
from rewind.calls import chat
from rewind.canonical import canonical_bytes, content_hash, sha256_hex
from rewind.errors import EndpointUnavailable, InvalidOverride, RewindError
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.persister import encode_value, map_hash
from rewind.replay import Rewind
from rewind.serde import encode
from rewind.store import Store, open_store, schema
from rewind.tools import tool
from rewind.tracing import StepStatus, StepType, Tracer, chat_step, propagate, step
from rewind.tracing.model import jsonable
from rewind.tracing.replay import ReplaySwitches, chain_client, parse_change, replay_trace
from rewind.tracing.store import is_trace, load_trace, search_runs, state_at
from tests.conftest import FAKE_BASE_URL, FakeModel

# -- chains at module level, so a replay can import them ---------------------------------------

TRACER = Tracer()
SEEN: list[str] = []


@tool("kb_search")
def kb_search(query: str, k: int) -> list[dict[str, Any]]:
    SEEN.append(query)
    return [{"text": f"{query} doc {i}", "score": round(0.9 - i * 0.1, 2)} for i in range(k)]


@TRACER.step("retrieve", "retrieval")
def retrieve(query: str) -> list[dict[str, Any]]:
    return kb_search(query, rewind.param("top_k", 2))


@TRACER.chain("qa")
def qa(question: str, style: str = "short") -> dict[str, Any]:
    docs = retrieve(question)
    with step("generate", StepType.LLM_CALL, input={"question": question, "docs": docs}) as s:
        reply = chat(
            [
                {"role": "system", "content": f"Answer in a {style} way."},
                {"role": "user", "content": question},
            ],
            temperature=0,
        )
        s.set_output(reply.content)
    with step("format", "transform", input=reply.content) as s:
        with step("count_words", "transform", input=reply.content) as inner:
            inner.set_output(len(reply.content.split()))
        s.set_output({"answer": reply.content, "words": len(reply.content.split())})
    return {"answer": reply.content, "docs": len(docs)}


@TRACER.chain("broken")
def broken(text: str) -> Any:
    with step("parse", "parse", input=text):
        return json.loads(text)


@TRACER.chain("async_fanout")
async def async_fanout(items: list[str]) -> list[str]:
    @TRACER.step("upper", "transform")
    async def upper(item: str) -> str:
        await asyncio.sleep(0.001)
        return item.upper()

    return list(await asyncio.gather(*(upper(i) for i in items)))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    st = open_store(tmp_path / "store")
    yield st
    st.close()


@pytest.fixture
def tracer(store: Store, chat_client: ChatClient) -> Tracer:
    SEEN.clear()
    return TRACER.configure(store=store, chat_client=chat_client, read_cache=False)


def last_trace(store: Store) -> str:
    runs, _ = search_runs(store, kind="trace", limit=1)
    return runs[0].run_id


# -- recording ---------------------------------------------------------------------------------


def test_decorated_chain_is_a_run_with_node_rows(tracer: Tracer, store: Store) -> None:
    out = qa("why is the sky blue?")
    assert out["docs"] == 2
    tid = last_trace(store)
    assert len(tid) == 32 and int(tid, 16) >= 0
    run = store.get_run(tid)
    assert run.pipeline == "qa" and run.status == "completed"
    assert run.config["chain_ref"] == "tests.test_tracing:qa"
    nodes = store.nodes_of(tid)
    assert [n.name for n in nodes] == ["retrieve", "generate", "format", "count_words"]
    assert [n.position for n in nodes] == [0, 1, 2, 3]
    assert all(len(n.input_hash) == 64 and len(n.output_hash or "") == 64 for n in nodes)
    view = load_trace(store, tid)
    assert view.kind == "trace" and view.status == "success"
    assert [s.step_type for s in view.steps] == ["retrieval", "llm_call", "transform", "transform"]
    assert [s.status for s in view.steps] == ["success"] * 4
    # nesting: count_words is inside format
    assert [s.parent_position for s in view.steps] == [-1, -1, -1, 2]
    assert view.depth(view.steps[3]) == 1
    assert view.input == {"question": "why is the sky blue?", "style": "short"}
    assert view.output == {"answer": out["answer"], "docs": 2}
    assert all(len(s.span_id or "") == 16 for s in view.steps)


def test_hashes_follow_the_recorder_encoding(tracer: Tracer, store: Store) -> None:
    qa("what is rewind?")
    tid = last_trace(store)
    rw = Rewind(store)
    nodes = store.nodes_of(tid)
    gen = nodes[1]
    # input: {"node", "reads", "inputs", "params"} canonical, sha256
    view = load_trace(store, tid)
    doc = {
        "node": "generate",
        "reads": {},
        "inputs": {"question": "what is rewind?", "docs": view.steps[0].output},
        "params": {},
    }
    assert gen.input_hash == sha256_hex(canonical_bytes(doc))
    # output: Merkle map {step name: field hash}
    answer = view.steps[1].output
    assert gen.output_hash == map_hash({"generate": encode_value("generate", answer).digest})[1]
    # state after the step: input fields + every step's output so far
    state = rw.node_state(gen)
    assert state == {
        "question": "what is rewind?",
        "style": "short",
        "retrieve": view.steps[0].output,
        "generate": answer,
    }
    fields = {k: encode_value(k, v).digest for k, v in state.items()}
    assert gen.state_hash == map_hash(fields)[1]
    # the engine's own readers work on trace nodes unchanged
    assert rw.node_output(gen) == {"generate": answer}
    assert rw.node_input(gen)["inputs"]["question"] == "what is rewind?"
    assert content_hash(answer) == encode_value("generate", answer).digest


def test_params_and_tool_calls_are_recorded_on_the_step(tracer: Tracer, store: Store) -> None:
    qa("tools?")
    view = load_trace(store, last_trace(store))
    retrieve_step = view.steps[0]
    assert retrieve_step.params == {"top_k": 2}
    assert [c.kind for c in retrieve_step.calls] == ["tool"]
    assert retrieve_step.calls[0].name == "kb_search"
    assert retrieve_step.cache_outcome == "miss" and retrieve_step.cache_reason == "bypass"


def test_llm_step_records_tokens_model_and_finish_reason(
    tracer: Tracer, store: Store, fake_model: FakeModel
) -> None:
    qa("tokens?")
    view = load_trace(store, last_trace(store))
    gen = view.steps[1]
    assert fake_model.count == 1
    assert gen.prompt_tokens == 11 and gen.completion_tokens > 0
    assert gen.attributes["model"] == "fake-model"
    assert gen.attributes["finish_reason"] == "stop"
    assert gen.attributes["usage"]["prompt_tokens"] == 11
    assert [c.kind for c in gen.calls] == ["llm"]
    assert view.prompt_tokens == 11
    run = store.get_run(view.trace_id)
    assert run.tokens == gen.tokens
    # the call went through the LLM cache: the entry exists now
    assert store.llm_cache_get(gen.calls[0].key) is not None


def test_context_manager_api_statuses_and_durations(store: Store) -> None:
    clock = iter([1_700_000_000.0, 1_700_000_001.0] + [1_700_000_002.0] * 20)
    t = Tracer(store, clock=lambda: next(clock))
    with t.trace("manual", input="raw text", tenant="acme") as tr:
        with tr.step("clean", "transform", input="raw text") as s:
            time.sleep(0.02)
            s.set_output("clean text")
        tr.skip("cache_lookup", "tool_call", reason="cache disabled")
        planned = tr.step("never_started", "validate")
        with tr.step("check", "validate", input={"text": "clean text"}) as s:
            s.fail("too short", "ValidationFailed")
        with step("tokens", "llm_call", input={"prompt": "hi"}) as s:
            s.set_tokens(prompt=5, completion=7)
            s.set(model="outside-model", finish_reason="length")
            s.set_output("partial")
        tr.set_output("done")
    assert planned.status == StepStatus.PENDING
    view = load_trace(store, tr.trace_id)
    assert view.input == {"input": "raw text"}
    assert view.attributes == {"tenant": "acme"}
    assert view.started_at == 1_700_000_000.0
    assert [s.status for s in view.steps] == ["success", "skipped", "pending", "failed", "success"]
    assert view.steps[0].duration_ms >= 15
    assert view.steps[0].input == "raw text"
    assert view.steps[1].attributes == {"skip_reason": "cache disabled"}
    assert view.steps[3].error_type == "ValidationFailed"
    assert view.steps[3].error == "ValidationFailed: too short"
    assert (view.steps[4].prompt_tokens, view.steps[4].completion_tokens) == (5, 7)
    assert view.steps[4].model == "outside-model"
    assert view.output == "done" and view.status == "success"
    nodes = store.nodes_of(tr.trace_id)
    assert nodes[1].cache_reason == "skipped" and nodes[1].output_hash is None
    assert nodes[3].cache_outcome == "failed" and nodes[3].error == "ValidationFailed: too short"
    assert store.get_run(tr.trace_id).tokens == 12


def test_exceptions_are_recorded_and_reraised(tracer: Tracer, store: Store) -> None:
    with pytest.raises(json.JSONDecodeError):
        broken("{not json")
    view = load_trace(store, last_trace(store))
    assert view.status == "failed" and view.run_status == "failed"
    assert view.error_type == "JSONDecodeError"
    step0 = view.steps[0]
    assert step0.status == "failed" and step0.error_type == "JSONDecodeError"
    assert "Expecting property name" in (step0.error_message or "")
    run = store.get_run(view.trace_id)
    assert run.error is not None and run.error.startswith("JSONDecodeError: ")
    assert store.nodes_of(view.trace_id)[0].output_hash is None


def test_a_trace_ended_by_ctrl_c_is_interrupted_not_failed(tracer: Tracer, store: Store) -> None:
    # As a Burr run is (README: "Ctrl-C or SIGTERM marks the run interrupted"); the CLI raises
    # SIGTERM as KeyboardInterrupt too.
    with pytest.raises(KeyboardInterrupt), tracer.trace("stopped", {"q": 1}):
        with step("first", "transform") as s:
            s.set_output(1)
        raise KeyboardInterrupt
    run = store.get_run(last_trace(store))
    assert run.status == "interrupted" and "KeyboardInterrupt" in (run.error or "")
    assert [n.name for n in store.nodes_of(run.run_id)] == ["first"]
    assert load_trace(store, run.run_id).status == "failed"
    with pytest.raises(ValueError), tracer.trace("broken", {"q": 1}):
        raise ValueError("a chain's own failure")
    assert store.get_run(last_trace(store)).status == "failed"


def test_untraced_code_runs_normally(store: Store) -> None:
    with step("alone", "transform", input=1) as s:
        s.set_output(2)
    assert s.status == StepStatus.SUCCESS and s.output == 2
    assert len(retrieve("outside")) == 2  # outside a trace a decorated step is a plain call
    assert search_runs(store)[1] == 0


def test_nested_chain_becomes_a_step(tracer: Tracer, store: Store) -> None:
    with tracer.trace("outer", input={"q": "hi"}) as tr:
        qa("inner question")
    view = load_trace(store, tr.trace_id)
    assert [s.name for s in view.steps][:2] == ["qa", "retrieve"]
    assert view.steps[1].parent_position == 0
    assert search_runs(store, kind="trace")[1] == 1


def test_threads_with_propagate_attach_to_the_trace(tracer: Tracer, store: Store) -> None:
    def work(i: int) -> int:
        with step(f"worker_{i}", "tool_call", input=i) as s:
            time.sleep(0.005)
            s.set_output(i * i)
        return i * i

    with tracer.trace("fanout", input={"n": 6}) as tr, step("pool", "transform") as pool:
        with ThreadPoolExecutor(max_workers=3) as ex:
            results = list(ex.map(propagate(work), range(6)))
        pool.set_output(results)
    view = load_trace(store, tr.trace_id)
    assert len(view.steps) == 7
    workers = [s for s in view.steps if s.name.startswith("worker_")]
    assert sorted(s.output for s in workers) == [0, 1, 4, 9, 16, 25]
    assert all(s.parent_position == 0 for s in workers)  # under "pool", across threads
    assert sorted(s.position for s in view.steps) == list(range(7))


def test_concurrent_traces_in_threads_do_not_mix(tracer: Tracer, store: Store) -> None:
    def one(i: int) -> str:
        with tracer.trace(f"t{i}", input=i) as tr:
            for k in range(3):
                with step(f"s{k}", input=k) as s:
                    time.sleep(0.001)
                    s.set_output(i)
        return tr.trace_id

    with ThreadPoolExecutor(max_workers=4) as ex:
        ids = list(ex.map(one, range(8)))
    for i, tid in enumerate(ids):
        view = load_trace(store, tid)
        assert view.name == f"t{i}"
        assert [s.output for s in view.steps] == [i, i, i]


def test_asyncio_tasks_nest_under_their_step(tracer: Tracer, store: Store) -> None:
    out = asyncio.run(async_fanout(["a", "b", "c"]))
    assert out == ["A", "B", "C"]
    view = load_trace(store, last_trace(store))
    assert view.name == "async_fanout"
    assert sorted(s.output for s in view.steps) == ["A", "B", "C"]
    assert all(s.parent_position == -1 for s in view.steps)


def test_chat_step_helper(tracer: Tracer, store: Store) -> None:
    with tracer.trace("helper") as tr:
        r = chat_step("ask", [{"role": "user", "content": "ping"}], temperature=0)
    view = load_trace(store, tr.trace_id)
    s = view.steps[0]
    assert s.step_type == "llm_call" and s.output == r.content
    assert s.input["messages"][0]["content"] == "ping"
    assert s.attributes["finish_reason"] == "stop"


def test_a_trace_write_failure_never_breaks_the_chain(tracer: Tracer, store: Store) -> None:
    with tracer.trace("dup", trace_id="ab" * 16):
        pass
    with tracer.trace("dup", trace_id="ab" * 16) as again:
        pass
    assert again.record is None and again.write_error is not None
    strict = Tracer(store, raise_on_write_error=True)
    with pytest.raises(RewindError), strict.trace("dup", trace_id="ab" * 16):
        pass


def test_unhashable_values_are_kept_by_type(tracer: Tracer, store: Store) -> None:
    class Client:
        pass

    assert jsonable({"c": Client(), "n": float("nan"), "ok": (1, 2)}) == {
        "c": {"$unhashable": "Client"},
        "n": {"$unhashable": "float", "value": "nan"},
        "ok": [1, 2],
    }
    with (
        tracer.trace("odd", input={"client": Client(), "q": "x"}) as tr,
        step("s", input={"client": Client()}) as s,
    ):
        s.set_output(b"bytes")
    view = load_trace(store, tr.trace_id)
    assert view.input == {"client": {"$unhashable": "Client"}, "q": "x"}
    # bytes have an exact document (rewind.serde): its digest tells two outputs apart
    digest = sha256_hex(canonical_bytes(encode(b"bytes")))
    assert view.steps[0].output == {"$unhashable": "bytes", "sha256": digest}


def test_a_trace_looks_like_a_run_to_show_and_diff(tracer: Tracer, store: Store) -> None:
    qa("first")
    a = last_trace(store)
    time.sleep(0.01)
    qa("second")
    b = last_trace(store)
    assert is_trace(store, a) and a != b
    rw = Rewind(store)
    d = rw.diff(a, b)
    assert d.first_divergence is not None and d.first_divergence.name == "retrieve"
    assert any(c.path.startswith("retrieve[0].text") for c in d.first_divergence.changes)
    assert store.edges_of("qa")  # the UI's graph has the step sequence


# -- replay ------------------------------------------------------------------------------------


def test_unchanged_replay_hits_every_call_with_identical_hashes(
    tracer: Tracer, store: Store, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    qa("replay me")
    original = last_trace(store)
    calls_before, tools_before = fake_model.count, len(SEEN)
    replay = replay_trace(store, original, chat_client=chat_client)
    assert replay.status == "completed" and replay.parent_run_id == original
    assert replay.tokens == 0
    assert fake_model.count == calls_before and len(SEEN) == tools_before
    a, b = store.nodes_of(original), store.nodes_of(replay.run_id)
    assert [n.name for n in a] == [n.name for n in b]
    for x, y in zip(a, b, strict=True):
        assert (x.input_hash, x.output_hash, x.state_hash) == (
            y.input_hash,
            y.output_hash,
            y.state_hash,
        )
    assert [n.cache_outcome for n in b] == ["hit", "hit", "none", "none"]
    assert Rewind(store).diff(original, replay.run_id).first_divergence is None
    assert replay.override is None


def test_chain_replay_uses_the_chains_own_model_client(
    tracer: Tracer, store: Store, fake_model: FakeModel
) -> None:
    # `rewind replay-trace` hands the replay the CLI's client (the embedded model, or
    # REWIND_MODEL): its model is keyed into every request that names none, so it missed every
    # recorded call of a chain whose tracer had its own client, and sent them all live.
    qa("whose client?")
    original = last_trace(store)
    other = FakeModel()
    cli_client = ChatClient(
        Endpoint(base_url=FAKE_BASE_URL, model="another-model"),
        transport=httpx.MockTransport(other.handler),
        retry=RetryPolicy(attempts=1),
    )
    with cli_client:
        calls_before = fake_model.count
        replay = replay_trace(store, original, chat_client=cli_client)
        assert replay.status == "completed" and replay.tokens == 0
        assert other.count == 0 and fake_model.count == calls_before
        changed = replay_trace(store, original, change="input.style=long", chat_client=cli_client)
    assert changed.status == "completed" and changed.tokens > 0
    assert other.count == 0 and fake_model.count == calls_before + 1
    assert chain_client("tests.test_tracing:qa") is tracer.chat_client
    assert chain_client("tests.test_tracing:kb_search") is None


def test_recorded_calls_replay_serves_a_request_an_sdk_sent(
    tracer: Tracer, store: Store, fake_model: FakeModel
) -> None:
    # A block traced without chain code whose model call went through an httpx-based SDK: its
    # stored request is the captured HTTP request, which the recorded-calls replay sent to
    # rewind.chat as if it were a chat body ("the request names no model", a ValueError that
    # ended the replay at that step).
    from rewind.capture import Transport

    http = httpx.Client(transport=Transport(httpx.MockTransport(fake_model.handler)))
    body = {"model": "sdk-model", "messages": [{"role": "user", "content": "via an SDK"}]}
    with tracer.trace("sdk_block", {"q": "via an SDK"}) as t:
        with step("ask", "llm_call") as s:
            s.set_output(http.post(f"{FAKE_BASE_URL}/chat/completions", json=body).json())
        http.post(f"{FAKE_BASE_URL}/chat/completions", json={**body, "temperature": 0})
    http.close()
    sent = fake_model.count
    assert sent == 2 and t.record is not None and t.record.tokens > 0
    replay = replay_trace(store, t.trace_id)
    assert replay.config["replay_mode"] == "recorded-calls"
    assert replay.status == "completed" and replay.tokens == 0 and fake_model.count == sent
    a, b = store.nodes_of(t.trace_id), store.nodes_of(replay.run_id)
    assert [n.output_hash for n in a] == [n.output_hash for n in b]
    assert [n.cache_outcome for n in b] == ["hit", "hit"]
    # Without the cache it cannot be sent again (no credentials, no code): said on the step.
    uncached = replay_trace(store, t.trace_id, switches=ReplaySwitches(cached_llm=False))
    failed = store.nodes_of(uncached.run_id)[0]
    assert uncached.status == "failed" and "NotReplayable" in (failed.error or "")
    assert fake_model.count == sent
    with pytest.raises(InvalidOverride):  # its fields are not params a change may set
        replay_trace(store, t.trace_id, change="ask.temperature=0.5")


def test_a_replay_whose_endpoint_is_down_is_written_and_named_by_the_error(
    tracer: Tracer, store: Store
) -> None:
    # The CLI exits 2 ("bad input, nothing written") for an error that names no run; this
    # replay was written, failed at the step whose call missed.
    qa("endpoint down")
    original = last_trace(store)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    down = ChatClient(
        Endpoint(base_url=FAKE_BASE_URL, model="fake-model"),
        transport=httpx.MockTransport(refuse),
        retry=RetryPolicy(attempts=1),
    )
    tracer.configure(chat_client=down)  # the chain's own client is the one a miss goes to
    with down, pytest.raises(EndpointUnavailable) as info:
        replay_trace(store, original, change="input.style=long")
    assert info.value.run_id is not None
    assert store.get_run(info.value.run_id).status == "failed"


def test_runs_lists_a_trace_replay_as_a_replay_not_a_fork_at_its_first_step(
    tracer: Tracer, store: Store, chat_client: ChatClient
) -> None:
    from rewind.cli.runs import fork_cell

    qa("list me")
    original = last_trace(store)
    unchanged = replay_trace(store, original, chat_client=chat_client)
    changed = replay_trace(store, original, change="input.style=long", chat_client=chat_client)
    # It used to say "retrieve (replay)" and "retrieve: param input.style=..." (a fork there).
    assert fork_cell(store.get_run(unchanged.run_id)) == "replay"
    assert fork_cell(store.get_run(changed.run_id)) == 'replay: input.style="long"'
    assert fork_cell(store.get_run(original)) == ""


def _loop_block(question: str) -> list[Any]:
    """A block of plain code (no importable chain function) that a trace wraps."""
    out = []
    for i in range(3):
        with step("generate", StepType.LLM_CALL, input={"i": i}) as s:
            reply = chat([{"role": "user", "content": f"{question} {i}"}], temperature=0)
            s.set_output(reply.content)
        out.append(retrieve(reply.content))
    return out


def test_in_place_replay_serves_the_source_calls_and_links_to_it(
    tracer: Tracer, store: Store, fake_model: FakeModel
) -> None:
    with tracer.trace("block") as t:
        recorded = _loop_block("in place")
    calls_before, tools_before = fake_model.count, len(SEEN)
    # A newer cache entry for one of the recorded requests must not be served: the source's
    # own recorded answer comes first (its lineage).
    first_key = store.nodes_of(t.trace_id)[0].calls[0].key
    with store.write() as conn:
        conn.execute(
            schema.llm_cache.update()
            .where(schema.llm_cache.c.key == first_key)
            .values(response_hash=store.put_blob(conn, b'{"not": "the recorded answer"}'))
        )
    with tracer.replay(t.trace_id) as r:
        replayed = _loop_block("in place")
    assert replayed == recorded
    assert fake_model.count == calls_before and len(SEEN) == tools_before
    run = store.get_run(r.trace_id)
    assert run.parent_run_id == t.trace_id and run.config["replay_mode"] == "in-place"
    assert run.tokens == 0
    a, b = store.nodes_of(t.trace_id), store.nodes_of(r.trace_id)
    assert [(n.name, n.input_hash, n.output_hash, n.state_hash) for n in a] == [
        (n.name, n.input_hash, n.output_hash, n.state_hash) for n in b
    ]
    assert {c.outcome for n in b for c in n.calls} == {"hit"}
    assert Rewind(store).diff(t.trace_id, r.trace_id).first_divergence is None
    # Its states are the source's: its steps refer to the source's state rows, no copies.
    assert _state_rows(store, r.trace_id) == 0 < _state_rows(store, t.trace_id)
    source_view, replay_view = load_trace(store, t.trace_id), load_trace(store, r.trace_id)
    for x, y in zip(source_view.steps, replay_view.steps, strict=True):
        assert state_at(store, y) == state_at(store, x) is not None


def test_in_place_replay_takes_the_source_input_unless_given_one(
    tracer: Tracer, store: Store, fake_model: FakeModel
) -> None:
    """``tracer.replay(id)`` without ``input=`` replays with the input the source recorded (its
    fields, nested values and a wrapped non-dict input alike), so an unchanged block is stored
    by reference; ``input=None`` is no input, and its steps are stored again."""
    for given in ({"question": "in place", "opts": {"k": [1, 2.5, None]}}, "a bare string"):
        with tracer.trace("block", given) as t:
            recorded = _loop_block("in place")
        calls = fake_model.count
        with tracer.replay(t.trace_id) as r:
            assert _loop_block("in place") == recorded
        assert fake_model.count == calls
        assert load_trace(store, r.trace_id).input == load_trace(store, t.trace_id).input
        assert store.get_run(r.trace_id).initial_state_hash == (
            store.get_run(t.trace_id).initial_state_hash
        )
        assert [n.state_hash for n in store.nodes_of(r.trace_id)] == [
            n.state_hash for n in store.nodes_of(t.trace_id)
        ]
        assert _state_rows(store, r.trace_id) == 0
        with tracer.replay(t.trace_id, input=None) as bare:
            _loop_block("in place")
        assert load_trace(store, bare.trace_id).input == {}
        assert _state_rows(store, bare.trace_id) == len(store.nodes_of(bare.trace_id))
        assert fake_model.count == calls  # still served: only the states differ


def test_an_empty_trace_id_is_refused_not_replaced(tracer: Tracer, store: Store) -> None:
    """``trace_id=""`` was silently replaced by a new random id (the caller then looked for
    a trace that was never stored under the id it gave); refused now, on a trace and on an
    in-place replay, before anything runs or is written."""
    with tracer.trace("ids", {"q": 1}) as t:
        pass
    runs = len(store.list_runs())
    with pytest.raises(ValueError, match="a trace id is a string of 1 to 64"):
        tracer.trace("ids", {"q": 1}, trace_id="")
    with pytest.raises(ValueError, match="a trace id is a string of 1 to 64"):
        tracer.replay(t.trace_id, trace_id="")
    assert len(store.list_runs()) == runs


def _state_rows(store: Store, app_id: str) -> int:
    """How many of the run's steps hold their state themselves (a state row, stored or derived
    from the step's state document since migration 0012), not by reference to another run."""
    return sum(
        1
        for n in store.nodes_of(app_id)
        if n.src_app_id == app_id
        and store.load_state_row("", app_id, n.src_sequence_id, values=False) is not None
    )


def test_in_place_replay_of_a_changed_block_goes_live_for_the_change(
    tracer: Tracer, store: Store, fake_model: FakeModel
) -> None:
    with tracer.trace("block") as t:
        _loop_block("first")
    before = fake_model.count
    with tracer.replay(t.trace_id) as r:
        _loop_block("second")
    assert fake_model.count == before + 3
    outcomes = [c.outcome for n in store.nodes_of(r.trace_id) for c in n.calls if c.kind == "llm"]
    assert outcomes == ["miss", "miss", "miss"]
    assert _state_rows(store, r.trace_id) == len(store.nodes_of(r.trace_id))  # all changed
    with pytest.raises(RewindError):
        tracer.replay("0000ffff")


def test_calls_outside_any_step_become_steps_and_are_served_on_replay(
    tracer: Tracer, store: Store, fake_model: FakeModel
) -> None:
    with tracer.trace("bare") as t:
        docs = kb_search("bare call", 2)  # a tool called in the chain's body, no step around it
        reply = chat([{"role": "user", "content": "bare"}], temperature=0)
    nodes = store.nodes_of(t.trace_id)
    assert [(n.name, [c.kind for c in n.calls]) for n in nodes] == [
        ("kb_search", ["tool"]),
        (fake_model.requests[-1]["model"], ["llm"]),
    ]
    view = load_trace(store, t.trace_id)
    assert [s.step_type for s in view.steps] == ["tool_call", "llm_call"]
    assert view.steps[0].output == docs and view.steps[1].output == reply.content
    assert view.steps[0].input == {"query": "bare call", "k": 2}
    calls, tools = fake_model.count, len(SEEN)
    with tracer.replay(t.trace_id) as r:
        assert kb_search("bare call", 2) == docs
        assert chat([{"role": "user", "content": "bare"}], temperature=0).content == reply.content
    assert fake_model.count == calls and len(SEEN) == tools
    outcomes = [c.outcome for n in store.nodes_of(r.trace_id) for c in n.calls]
    assert outcomes == ["hit", "hit"]


def test_replay_with_a_changed_input_field(
    tracer: Tracer, store: Store, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    qa("original question")
    original = last_trace(store)
    before = fake_model.count
    replay = replay_trace(
        store, original, change="input.question=a new question", chat_client=chat_client
    )
    assert replay.status == "completed"
    assert fake_model.count == before + 1  # the prompt changed: one miss
    assert replay.override == {
        "kind": "param",
        "node": "input",
        "param": "question",
        "value": "a new question",
        "target": "trace-input",
    }
    view = load_trace(store, replay.run_id)
    assert view.input["question"] == "a new question"
    d = Rewind(store).diff(original, replay.run_id)
    assert d.first_divergence is not None and d.first_divergence.name == "retrieve"
    gen = next(n for n in d.nodes if n.name == "generate")
    assert gen.status == "changed"


def test_replay_with_a_step_param_override(
    tracer: Tracer, store: Store, chat_client: ChatClient
) -> None:
    qa("param question")
    original = last_trace(store)
    replay = replay_trace(store, original, change="retrieve.top_k=3", chat_client=chat_client)
    view = load_trace(store, replay.run_id)
    assert len(view.steps[0].output) == 3 and view.steps[0].params == {"top_k": 3}
    assert view.output["docs"] == 3


def test_replay_of_a_failing_chain_records_the_failure(
    tracer: Tracer, store: Store, chat_client: ChatClient
) -> None:
    with pytest.raises(json.JSONDecodeError):
        broken("{bad")
    original = last_trace(store)
    spec = "input.text=" + json.dumps('{"ok": true}')  # a JSON string, not an object
    fixed = replay_trace(store, original, change=spec, chat_client=chat_client)
    assert fixed.status == "completed"
    assert load_trace(store, fixed.run_id).output == {"ok": True}
    again = replay_trace(store, original, chat_client=chat_client)
    assert again.status == "failed"


def test_replay_refuses_bad_changes_and_writes_nothing(tracer: Tracer, store: Store) -> None:
    qa("refusals")
    original = last_trace(store)
    view = load_trace(store, original)
    count = search_runs(store)[1]
    for spec, words in (
        ("input.nope=1", "no field 'nope'"),
        ("retrieve.nope=1", "no param 'nope'"),
        ("ghost.x=1", "no step 'ghost'"),
        ("question=1", "malformed"),
        ("input.question=1e999", "cannot be hashed"),
        ("input.question.deep=1", "not an object"),
    ):
        with pytest.raises(InvalidOverride, match=words):
            parse_change(spec, view)
    with pytest.raises(RewindError, match="Burr run"):
        rw = Rewind(store)
        from tests import pipelines

        burr = rw.record(pipelines.pipeline, {"x": 5})
        replay_trace(store, burr.run_id)
    # The in-place replay refuses it too (it used to write a "replay" of a Burr run).
    with pytest.raises(RewindError, match="Burr run"):
        tracer.replay(burr.run_id)
    with tracer.trace("manual") as tr:
        pass
    assert search_runs(store)[1] == count + 2  # the Burr run and the manual trace only
    # Without chain code, a trace replays as its recorded calls (issue 16), and says so.
    assert replay_trace(store, tr.trace_id).config["replay_mode"] == "recorded-calls"


def test_model_is_the_cache_key_not_the_trace(
    tracer: Tracer, store: Store, fake_model: FakeModel
) -> None:
    qa("same")
    qa("same")
    # recording never reads the cache: both traces called the model
    assert fake_model.count == 2
    read = Tracer(store, chat_client=TRACER.chat_client, read_cache=True)
    with read.trace("cached") as tr, step("generate", "llm_call") as s:
        s.set_output(
            chat(
                [
                    {"role": "system", "content": "Answer in a short way."},
                    {"role": "user", "content": "same"},
                ],
                temperature=0,
            ).content
        )
    assert fake_model.count == 2
    assert store.nodes_of(tr.trace_id)[0].cache_outcome == "hit"
