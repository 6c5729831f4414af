"""HTTP-layer capture of model SDKs, threads/asyncio in a node, repeated identical samples.

Every test counts requests at a real loopback HTTP server (:mod:`tests.model_stub`), whose answers
carry its request number: a replayed answer is told from a fresh one by its content.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from burr.core import State, action, default, expr
from burr.core.graph import GraphBuilder
from hypothesis import given
from hypothesis import strategies as st

import rewind
from rewind.capture import AsyncTransport, Transport, register_endpoint, unregister_endpoint
from rewind.capture.exchange import (
    decode_envelope,
    describe_request,
    encode_envelope,
    recorded_from,
    split_events,
)
from rewind.context import propagate
from rewind.errors import ContextLost
from rewind.llm import ChatClient, Endpoint
from rewind.replay import Pipeline, Rewind
from tests.model_stub import STUB_MODEL, ModelStub


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    with ModelStub() as server:
        yield server


@pytest.fixture
def rw(tmp_path: Path) -> Iterator[Rewind]:
    session = Rewind(tmp_path / "store")
    yield session
    session.store.close()


def one_node(name: str, body: Callable[[State], dict[str, Any]]) -> Pipeline:
    """A one-node pipeline whose node writes what ``body`` returns under ``out``."""

    @action(reads=["question"], writes=["out"])
    def node(state: State) -> State:
        return state.update(out=body(state))

    graph = GraphBuilder().with_actions(**{name: node}).build()
    return Pipeline(f"capture-{name}", graph, entrypoint=name)


def node_row(rw: Rewind, run_id: str, position: int = 0) -> Any:
    return rw.store.nodes_of(run_id)[position]


def output(rw: Rewind, run_id: str, position: int = 0) -> Any:
    return rw.node_output(node_row(rw, run_id, position))["out"]


def record_sent(rw: Rewind, pipeline: Pipeline, stub: ModelStub, sent: int) -> tuple[str, Any]:
    """Record ``pipeline`` on ``{"question": "q"}``; check it completed, made ``sent`` calls
    and the server received ``sent`` requests. Returns (run id, the first node's ``out``)."""
    run = rw.record(pipeline, {"question": "q"})
    assert run.status == "completed", run.error
    assert stub.count == sent
    assert len(node_row(rw, run.run_id).calls) == sent
    return run.run_id, output(rw, run.run_id)


def replay_unchanged(rw: Rewind, parent: str, stub: ModelStub, sent: int) -> str:
    """Replay ``parent`` unchanged from its first node and check the promise: every node with
    calls hit, 0 tokens, every output hash and field kept, and the server (which had received
    ``sent`` requests) received nothing new. Returns the fork's run id."""
    child = rw.replay(parent).run_id
    assert stub.count == sent
    assert rw.store.get_run(child).status == "completed"
    a, b = rw.store.nodes_of(parent), rw.store.nodes_of(child)
    assert [n.output_hash for n in a] == [n.output_hash for n in b]
    for node in b:
        expected = ("hit", "hit") if node.calls else ("none", "no-calls")
        assert (node.cache_outcome, node.cache_reason) == expected, node
        assert node.prompt_tokens == node.completion_tokens == 0
    assert rw.diff(parent, child).first_divergence is None
    return child


# -- OpenAI SDK, sync ----------------------------------------------------------------------------


def test_openai_call_is_recorded_and_an_unchanged_replay_sends_nothing(
    rw: Rewind, stub: ModelStub
) -> None:
    client = openai.OpenAI(base_url=stub.base_url, api_key="sk-secret-1", max_retries=0)

    def ask(state: State) -> dict[str, Any]:
        r = client.chat.completions.create(
            model=STUB_MODEL,
            messages=[{"role": "user", "content": state["question"]}],
            temperature=0.7,
        )
        return {"text": r.choices[0].message.content, "tokens": r.usage.completion_tokens}

    parent = rw.record(one_node("ask", ask), {"question": "why?"})
    assert parent.status == "completed", parent.error
    assert stub.count == 1
    node = node_row(rw, parent.run_id)
    assert (node.cache_outcome, node.cache_reason) == ("miss", "bypass")
    assert (node.prompt_tokens, node.completion_tokens) == (7, 4)
    assert [(c.kind, c.name, c.determinism) for c in node.calls] == [
        ("llm", STUB_MODEL, "non-deterministic")
    ]
    assert output(rw, parent.run_id) == {"text": "answer #1 to why?", "tokens": 4}

    # A new API key (and SDK request ids/retry headers) must not change the key.
    client = openai.OpenAI(base_url=stub.base_url, api_key="sk-other-2", max_retries=0)
    child = replay_unchanged(rw, parent.run_id, stub, sent=1)
    assert output(rw, child) == {"text": "answer #1 to why?", "tokens": 4}


def test_the_module_level_openai_client_is_captured(
    rw: Rewind, stub: ModelStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openai, "base_url", stub.base_url + "/")
    monkeypatch.setattr(openai, "api_key", "module-key")
    monkeypatch.setattr(openai, "max_retries", 0)
    monkeypatch.setattr(openai, "_client", None)  # built on first use, from the settings above

    def ask(state: State) -> str:
        messages = [{"role": "user", "content": state["question"]}]
        reply = openai.chat.completions.create(model=STUB_MODEL, messages=messages)
        return reply.choices[0].message.content or ""

    parent, answer = record_sent(rw, one_node("module", ask), stub, sent=1)
    assert answer == "answer #1 to q"
    assert output(rw, replay_unchanged(rw, parent, stub, sent=1)) == answer


def test_a_node_that_samples_one_request_three_times_gets_three_answers_back_in_order(
    rw: Rewind, stub: ModelStub
) -> None:
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0)

    def vote(state: State) -> list[str]:
        request = {
            "model": STUB_MODEL,
            "messages": [{"role": "user", "content": state["question"]}],
            "temperature": 1.0,
        }
        return [client.chat.completions.create(**request).choices[0].message.content for _ in "abc"]

    parent, recorded = record_sent(rw, one_node("vote", vote), stub, sent=3)
    assert recorded == ["answer #1 to q", "answer #2 to q", "answer #3 to q"]
    assert node_row(rw, parent).completion_tokens == 12
    assert len({c.key for c in node_row(rw, parent).calls}) == 3
    assert output(rw, replay_unchanged(rw, parent, stub, sent=3)) == recorded


def test_a_looped_node_gets_each_execution_its_own_recorded_answer(
    rw: Rewind, stub: ModelStub
) -> None:
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0)

    @action(reads=["question", "answers"], writes=["answers"])
    def retry(state: State) -> State:
        reply = client.chat.completions.create(
            model=STUB_MODEL, messages=[{"role": "user", "content": state["question"]}]
        )
        return state.update(answers=[*state["answers"], reply.choices[0].message.content])

    @action(reads=["answers"], writes=["final"])
    def done(state: State) -> State:
        return state.update(final=state["answers"][-1])

    graph = (
        GraphBuilder()
        .with_actions(retry=retry, done=done)
        .with_transitions(("retry", "retry", expr("len(answers) < 3")), ("retry", "done", default))
        .build()
    )
    pipeline = Pipeline("capture-loop", graph, entrypoint="retry")
    parent = rw.record(pipeline, {"question": "q", "answers": []})
    assert stub.count == 3
    child = replay_unchanged(rw, parent.run_id, stub, sent=3)
    final = rw.node_output(rw.store.nodes_of(child)[-1])["final"]
    assert final == "answer #3 to q"


def test_a_streamed_answer_replays_the_same_events_in_the_same_order(
    rw: Rewind, stub: ModelStub
) -> None:
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0)

    def stream(state: State) -> list[str]:
        chunks = client.chat.completions.create(
            model=STUB_MODEL,
            messages=[{"role": "user", "content": state["question"]}],
            stream=True,
            stream_options={"include_usage": True},
        )
        return [chunk.model_dump_json() for chunk in chunks]

    parent = rw.record(one_node("stream", stream), {"question": "tell me"})
    events = output(rw, parent.run_id)
    assert len(events) == 6 and '"answer ' in events[0]
    node = node_row(rw, parent.run_id)
    assert (node.prompt_tokens, node.completion_tokens) == (7, 5)
    child = replay_unchanged(rw, parent.run_id, stub, sent=1)
    assert output(rw, child) == events


def test_stream_and_non_stream_requests_are_different_calls(rw: Rewind, stub: ModelStub) -> None:
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0)

    def both(state: State) -> list[str]:
        messages = [{"role": "user", "content": "same"}]
        plain = client.chat.completions.create(model=STUB_MODEL, messages=messages)
        streamed = client.chat.completions.create(model=STUB_MODEL, messages=messages, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        return [plain.choices[0].message.content, text.strip()]

    parent = rw.record(one_node("both", both), {"question": ""})
    assert output(rw, parent.run_id) == ["answer #1 to same", "answer #2 to same"]
    replay_unchanged(rw, parent.run_id, stub, sent=2)


def test_an_error_answer_replays_on_its_run_but_never_becomes_a_shared_cache_entry(
    rw: Rewind, stub: ModelStub
) -> None:
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0)

    def refused(state: State) -> str:
        try:
            client.chat.completions.create(
                model=STUB_MODEL, messages=[{"role": "user", "content": "refuse"}]
            )
        except openai.BadRequestError as exc:
            return f"{exc.status_code}: {exc.body}"
        return "accepted"

    parent, error = record_sent(rw, one_node("refused", refused), stub, sent=1)
    assert error == "400: {'message': 'refused #1'}"
    (call,) = node_row(rw, parent).calls
    assert rw.store.llm_cache_get(call.key) is None
    assert output(rw, replay_unchanged(rw, parent, stub, sent=1)) == error


def test_a_fork_against_another_endpoint_misses_and_asks_that_endpoint(
    rw: Rewind, stub: ModelStub
) -> None:
    where = {"url": stub.base_url}

    def ask(state: State) -> str:
        client = openai.OpenAI(base_url=where["url"], api_key="k", max_retries=0)
        messages = [{"role": "user", "content": state["question"]}]
        reply = client.chat.completions.create(model=STUB_MODEL, messages=messages)
        return f"{where['url']}: {reply.choices[0].message.content}"

    parent, _ = record_sent(rw, one_node("where", ask), stub, sent=1)
    with ModelStub() as other:
        where["url"] = other.base_url
        child = rw.replay(parent)
        assert other.count == 1 and stub.count == 1
    node = node_row(rw, child.run_id)
    assert (node.cache_outcome, node.cache_reason) == ("miss", "new-input")
    assert output(rw, child.run_id) == f"{other.base_url}: answer #1 to q"


# -- async clients, asyncio tasks, threads -------------------------------------------------------


def test_async_client_calls_from_asyncio_gather_tasks_belong_to_the_node(
    rw: Rewind, stub: ModelStub
) -> None:
    def gather(state: State) -> list[str]:
        async def main() -> list[str]:
            client = openai.AsyncOpenAI(base_url=stub.base_url, api_key="k", max_retries=0)
            request = {
                "model": STUB_MODEL,
                "messages": [{"role": "user", "content": state["question"]}],
                "temperature": 0.9,
            }
            replies = await asyncio.gather(
                *(client.chat.completions.create(**request) for _ in range(3)),
                client.chat.completions.create(**request | {"temperature": 0}),
            )
            await client.close()
            return [r.choices[0].message.content for r in replies]

        return asyncio.run(main())

    parent, answers = record_sent(rw, one_node("gather", gather), stub, sent=4)
    assert len(set(answers)) == 4
    assert node_row(rw, parent).completion_tokens == 16
    assert output(rw, replay_unchanged(rw, parent, stub, sent=4)) == answers


def test_thread_pool_calls_are_recorded_and_each_thread_gets_its_own_answers_back(
    rw: Rewind, stub: ModelStub
) -> None:
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0)

    def ask_twice(question: str) -> list[str]:
        request = {"model": STUB_MODEL, "messages": [{"role": "user", "content": question}]}
        return [client.chat.completions.create(**request).choices[0].message.content for _ in "ab"]

    def fan_out(state: State) -> list[list[str]]:
        # Four tasks, two of them with identical requests: scheduling must not swap answers.
        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(ask_twice, ["x", "same", "same", "y"]))

    parent, answers = record_sent(rw, one_node("fan_out", fan_out), stub, sent=8)
    assert len({a for pair in answers for a in pair}) == 8
    for _ in range(2):
        assert output(rw, replay_unchanged(rw, parent, stub, sent=8)) == answers


def test_a_side_effecting_tool_in_a_thread_without_the_run_context_refuses_to_run(
    rw: Rewind,
) -> None:
    executed: list[str] = []

    @rewind.tool("capture_fx_write", determinism="side-effect")
    def write(line: str) -> str:
        executed.append(line)
        return line

    def spawn(state: State) -> dict[str, Any]:
        errors: list[BaseException] = []

        def work(line: str) -> None:
            try:
                write(line)
            except ContextLost as exc:
                errors.append(exc)

        plain = threading.Thread(target=work, args=("lost",))
        plain.start()
        plain.join()
        carried = threading.Thread(target=propagate(work), args=("carried",))
        carried.start()
        carried.join()
        return {"errors": [str(e) for e in errors]}

    run = rw.record(one_node("spawn", spawn), {"question": ""})
    assert run.status == "completed", run.error
    errors = output(rw, run.run_id)["errors"]
    assert len(errors) == 1
    assert "outside the run context" in errors[0] and "propagate" in errors[0]
    assert executed == ["carried"]
    calls = node_row(rw, run.run_id).calls
    assert [(c.name, c.determinism) for c in calls] == [("capture_fx_write", "side-effect")]
    # With no run active anywhere, the tool is an ordinary function again.
    assert write("free") == "free"


def test_a_model_request_from_a_thread_without_the_run_context_is_reported_not_silent(
    rw: Rewind, stub: ModelStub, caplog: pytest.LogCaptureFixture
) -> None:
    # A plain threading.Thread loses the run context: its request cannot be recorded (and every
    # replay sends it again), so Rewind must say so on stderr instead of passing it silently.
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0)

    def ask(question: str) -> None:
        client.chat.completions.create(
            model=STUB_MODEL, messages=[{"role": "user", "content": question}], temperature=0
        )

    def spawn(state: State) -> str:
        for target in (propagate(ask), ask, ask):  # carried (recorded), then lost twice
            worker = threading.Thread(target=target, args=("q",))
            worker.start()
            worker.join()
        return "done"

    with caplog.at_level(logging.WARNING, logger="rewind.capture.http"):
        run = rw.record(one_node("spawn_model", spawn), {"question": ""})
    assert run.status == "completed", run.error
    assert stub.count == 3
    assert len(node_row(rw, run.run_id).calls) == 1  # only the carried request was recorded
    lost = [r.getMessage() for r in caplog.records if "outside the run context" in r.getMessage()]
    assert len(lost) == 1  # once per run, not once per request
    assert run.run_id[:12] in lost[0] and "propagate" in lost[0]
    assert f"127.0.0.1:{stub.server.server_address[1]}/v1/chat/completions" in lost[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rewind.capture.http"):
        ask("no run is active")  # outside any run: an ordinary request, nothing to report
    assert not caplog.records


# -- other SDKs and clients ----------------------------------------------------------------------


def test_anthropic_messages_plain_and_streamed_replay_unchanged(
    rw: Rewind, stub: ModelStub
) -> None:
    import anthropic  # here, not at the top: ~0.9 s to import, in every xdist worker's collection

    client = anthropic.Anthropic(
        base_url=stub.base_url.removesuffix("/v1"), api_key="a-key", max_retries=0
    )

    def claude(state: State) -> list[str]:
        messages = [{"role": "user", "content": state["question"]}]
        plain = client.messages.create(model="claude-x", max_tokens=20, messages=messages)
        with client.messages.stream(model="claude-x", max_tokens=20, messages=messages) as s:
            streamed = [event.type for event in s] + [s.get_final_text()]
        return [plain.content[0].text, *streamed]

    parent = rw.record(one_node("claude", claude), {"question": "hi"})
    assert parent.status == "completed", parent.error
    assert stub.count == 2
    assert stub.paths == ["/v1/messages", "/v1/messages"]
    answers = output(rw, parent.run_id)
    assert answers[0] == "answer #1 to hi" and answers[-1] == "answer #2 to hi"
    node = node_row(rw, parent.run_id)
    assert (node.prompt_tokens, node.completion_tokens) == (10, 8)
    child = replay_unchanged(rw, parent.run_id, stub, sent=2)
    assert output(rw, child) == answers


def test_an_explicit_transport_captures_a_plain_httpx_client(rw: Rewind, stub: ModelStub) -> None:
    http = httpx.Client(transport=Transport())

    def post(state: State) -> list[Any]:
        body = {"model": STUB_MODEL, "input": "text"}
        first = http.post(f"{stub.base_url}/embeddings", json=body).json()["data"][0]
        health = http.get(f"{stub.base_url}/models").status_code  # not a model request
        return [first["embedding"], health]

    parent = rw.record(one_node("embed", post), {"question": ""})
    assert stub.count == 1  # the GET went to the server too, but is no POST
    node = node_row(rw, parent.run_id)
    assert [c.determinism for c in node.calls] == ["deterministic"]
    child = replay_unchanged(rw, parent.run_id, stub, sent=1)
    assert output(rw, child) == output(rw, parent.run_id)
    http.close()


def test_an_explicit_async_transport_captures_a_streamed_answer_without_install(
    rw: Rewind, stub: ModelStub
) -> None:
    rewind.capture.ensure_installed()  # what the first run does; then take it away again
    rewind.capture.uninstall()

    def stream(state: State) -> list[str]:
        async def main() -> list[str]:
            http = openai.DefaultAsyncHttpxClient(transport=AsyncTransport())
            client = openai.AsyncOpenAI(
                base_url=stub.base_url, api_key="k", max_retries=0, http_client=http
            )
            chunks = await client.chat.completions.create(
                model=STUB_MODEL,
                messages=[{"role": "user", "content": "s"}],
                stream=True,
                stream_options={"include_usage": True},  # the stub, like OpenAI, sends usage then
            )
            events = [chunk.model_dump_json() async for chunk in chunks]
            await client.close()
            return events

        return asyncio.run(main())

    try:
        assert not rewind.capture.installed()
        parent, events = record_sent(rw, one_node("astream", stream), stub, sent=1)
        assert len(events) == 5  # "answer #1 to s" word by word, then the usage chunk
        assert output(rw, replay_unchanged(rw, parent, stub, sent=1)) == events
    finally:
        rewind.capture.install()


def test_rewind_chat_is_cached_once_not_captured_twice(tmp_path: Path, stub: ModelStub) -> None:
    with ChatClient(Endpoint(base_url=stub.base_url, model=STUB_MODEL)) as client:
        session = Rewind(tmp_path / "store", chat_client=client)

        def chat(state: State) -> str:
            return rewind.chat([{"role": "user", "content": "hi"}], temperature=0).content

        run = session.record(one_node("chat", chat), {"question": ""})
        assert stub.count == 1
        calls = node_row(session, run.run_id).calls
        assert [(c.kind, c.name) for c in calls] == [("llm", STUB_MODEL)]
        session.store.close()


def test_requests_outside_a_run_pass_through_untouched(stub: ModelStub) -> None:
    rewind.capture.ensure_installed()
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0)
    request = {"model": STUB_MODEL, "messages": [{"role": "user", "content": "q"}]}
    texts = [client.chat.completions.create(**request).choices[0].message.content for _ in "ab"]
    assert texts == ["answer #1 to q", "answer #2 to q"]
    assert stub.count == 2


@pytest.mark.parametrize(("setting", "captured"), [("off", False), ("", True)])
def test_rewind_http_capture_off_leaves_httpx_alone(setting: str, captured: bool) -> None:
    # A fresh interpreter: the setting is read when the first run of a process starts.
    code = (
        "import rewind.capture as c, concurrent.futures as f; c.ensure_installed(); "
        "print(c.installed(), hasattr(f.ThreadPoolExecutor.submit, '__rewind_original__'))"
    )
    env = dict(os.environ, REWIND_HTTP_CAPTURE=setting)
    env["PYTHONPATH"] = str(Path(rewind.__file__).parent.parent)  # this checkout's sources
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.split() == [str(captured), "True"]


# -- keys and envelopes --------------------------------------------------------------------------


BODY = b'{"model": "m", "messages": [{"role": "user", "content": "q"}], "user": "u-1"}'


def test_the_key_names_the_endpoint_and_ignores_credentials_and_volatile_fields() -> None:
    a = describe_request("POST", "http://127.0.0.1:1111/v1/chat/completions", [], BODY)
    b = describe_request(
        "POST",
        "http://127.0.0.1:1111/v1/chat/completions?key=secret",
        [("Authorization", "Bearer x"), ("X-Request-Id", "r-9"), ("User-Agent", "sdk/9")],
        b'{"messages": [{"content": "q", "role": "user"}], "model": "m", "user": "u-2"}',
    )
    other_port = describe_request("POST", "http://127.0.0.1:2222/v1/chat/completions", [], BODY)
    other_version = describe_request(
        "POST", "http://127.0.0.1:1111/v1/chat/completions", [("anthropic-version", "2")], BODY
    )
    assert a is not None and b is not None and other_port is not None
    assert other_version is not None
    assert a.key == b.key
    assert b"secret" not in b.request and b"Bearer" not in b.request
    assert other_port.key != a.key  # a cached answer is never served for another endpoint
    assert other_version.key != a.key
    assert describe_request("POST", "http://h/v1/embeddings", [], b"not json") is None


def test_a_registered_endpoint_is_keyed_by_its_identity_not_its_port() -> None:
    register_endpoint("http://127.0.0.1:1111/v1", "local-model:sha256:abc")
    try:
        a = describe_request("POST", "http://127.0.0.1:1111/v1/chat/completions", [], BODY)
    finally:
        unregister_endpoint("http://127.0.0.1:1111/v1")
    register_endpoint("http://127.0.0.1:2222/v1", "local-model:sha256:abc")
    try:
        b = describe_request("POST", "http://127.0.0.1:2222/v1/chat/completions", [], BODY)
    finally:
        unregister_endpoint("http://127.0.0.1:2222/v1")
    assert a is not None and b is not None
    assert a.key == b.key and b"local-model:sha256:abc/chat/completions" in a.request


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": 1}',
        "caf\u00e9 \u2603".encode(),
        b"\xff\xfe binary",
        b"",
    ],
)
def test_a_recorded_body_comes_back_byte_for_byte(body: bytes) -> None:
    recorded = recorded_from(
        201, [("Content-Type", "application/json"), ("X-Request-Id", "r"), ("Date", "now")], body
    )
    back = decode_envelope(encode_envelope(recorded))
    assert back.body == body and back.status == 201
    assert back.headers == (("content-type", "application/json"),)


def test_an_event_stream_is_split_into_events_that_join_back_exactly() -> None:
    data = b"event: a\ndata: 1\n\ndata: 2\r\n\r\ndata: [DONE]\n\ntrailing"
    events = split_events(data)
    assert events == (
        b"event: a\ndata: 1\n\n",
        b"data: 2\r\n\r\n",
        b"data: [DONE]\n\n",
        b"trailing",
    )
    assert b"".join(events) == data
    recorded = recorded_from(200, [("content-type", "text/event-stream")], data)
    assert decode_envelope(encode_envelope(recorded)).events == events


# -- the real embedded model (slow) --------------------------------------------------------------


def _posts(log: Path) -> int:
    """Model requests the embedded server logged (uvicorn's access log: one line a request)."""
    return sum("POST /v1/chat/completions" in line for line in log.read_text().splitlines())


@pytest.mark.slow
def test_embedded_model_calls_replay_from_the_cache_after_a_restart_on_another_port(
    rw: Rewind, tmp_path: Path
) -> None:
    from rewind.localmodel import DEFAULT_MODEL_ALIAS, LocalModelServer

    where: dict[str, str] = {}

    def ask(state: State) -> str:
        client = openai.OpenAI(base_url=where["url"], api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model=DEFAULT_MODEL_ALIAS,
            messages=[{"role": "user", "content": state["question"]}],
            temperature=0,
            max_tokens=8,
        )
        return reply.choices[0].message.content or ""

    pipeline = one_node("local", ask)
    with LocalModelServer(log_path=tmp_path / "first.log") as server:
        assert server.endpoint is not None
        where["url"] = server.endpoint.base_url
        parent = rw.record(pipeline, {"question": "Say hello."})
    assert parent.status == "completed", parent.error
    assert _posts(tmp_path / "first.log") == 1
    recorded = node_row(rw, parent.run_id)
    assert recorded.prompt_tokens > 0 and recorded.completion_tokens > 0

    # A new server process on a new free port: the key names the model file, not the port.
    with LocalModelServer(log_path=tmp_path / "second.log") as server:
        assert server.endpoint is not None
        where["url"] = server.endpoint.base_url
        child = rw.replay(parent.run_id)
    assert child.status == "completed", child.error
    assert _posts(tmp_path / "second.log") == 0
    node = node_row(rw, child.run_id)
    assert (node.cache_outcome, node.prompt_tokens, node.completion_tokens) == ("hit", 0, 0)
    assert node.output_hash == recorded.output_hash


# -- properties ----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(st.binary(max_size=300))
def test_any_stream_splits_into_events_that_join_back_exactly(data: bytes) -> None:
    assert b"".join(split_events(data)) == data


@given(st.binary(max_size=300), st.sampled_from(["application/json", "text/event-stream"]))
def test_any_recorded_body_round_trips_through_its_envelope(data: bytes, kind: str) -> None:
    recorded = recorded_from(200, [("Content-Type", kind)], data)
    back = decode_envelope(encode_envelope(recorded))
    assert back == recorded
    assert (back.body if back.events is None else b"".join(back.events)) == data


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6), st.text(max_size=10))
def test_the_key_ignores_body_key_order_and_volatile_fields(body: dict[str, Any], user: str):
    url = "https://api.example.com/v1/chat/completions"
    forward = json.dumps(body).encode()
    backward = json.dumps(dict(reversed(list(body.items()))) | {"user": user}).encode()
    a, b = describe_request("POST", url, [], forward), describe_request("POST", url, [], backward)
    assert a is not None and b is not None and a.key == b.key
