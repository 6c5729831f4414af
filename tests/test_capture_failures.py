"""A captured SDK request the endpoint answered with a status it may answer differently later
(401/403, 408/409/425/429, 5xx) is a failed model call (``failed:raised``), as a ``rewind.chat``
call that raised is (issue #13): a replay hands the SDK the recorded response again where the
recording got an answer after it (the SDK's own retry), and sends the request again where
nothing answered after it, so a run recorded while the provider rate-limited or was down goes on
once it answers. Other error statuses (400...) stay answers. Requests go to a real loopback
server (:class:`tests.model_stub.ModelStub`) through the OpenAI SDK.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from burr.core import State

from rewind import Rewind
from rewind.call import failure_bytes, failure_of
from rewind.capture import Transport
from rewind.capture.exchange import Recorded, decode_envelope, encode_envelope
from rewind.errors import ModelErrorStatus
from rewind.store import open_store
from rewind.tracing import Tracer
from rewind.tracing.store import load_trace
from tests.model_stub import STUB_MODEL, ModelStub
from tests.test_capture import node_row, one_node, output


def _labels(rw: Rewind, run_id: str) -> list[str]:
    return [c.label for c in node_row(rw, run_id).calls]


_ANSWERS = [200, 400, 404, 422]
_FAILURES = [401, 403, 408, 409, 425, 429, 500, 503]


@pytest.mark.parametrize("status", _ANSWERS + _FAILURES)
def test_which_error_statuses_are_failures(status: int) -> None:
    """Statuses SDKs retry, and credentials refused (not part of the cache key), may be
    answered otherwise later; a 400 or 404 is the endpoint's answer to this request."""
    assert Recorded(status, ()).failed is (status in _FAILURES)


def test_a_recorded_error_status_is_made_again_with_its_response() -> None:
    """The failed row's document keeps the response: a replay rebuilds the same one."""
    recorded = Recorded(429, (("retry-after", "1"),), body=b'{"error": {"message": "slow"}}')
    exc = ModelErrorStatus("the model endpoint answered HTTP 429", "h", response=b"")
    exc.response = encode_envelope(recorded)
    doc = failure_bytes(exc)
    assert json.loads(doc)["error"] == "ModelErrorStatus"
    again = failure_of(doc)
    assert isinstance(again, ModelErrorStatus)
    assert (again.message, again.hint) == (exc.message, exc.hint)
    assert decode_envelope(again.response) == recorded


def _ask(stub: ModelStub, retries: int) -> Any:
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=retries)

    def ask(state: State) -> str:
        messages = [{"role": "user", "content": state["question"]}]
        r = client.chat.completions.create(model=STUB_MODEL, messages=messages, temperature=0)
        return str(r.choices[0].message.content)

    return ask


def test_a_429_the_sdk_retried_past_replays_unchanged_and_sends_nothing(
    rw: Rewind, stub: ModelStub
) -> None:
    """The provider answered 429, the SDK retried and got its answer: the 429 is a failed call
    the node recovered from, part of the recorded path. The unchanged replay hands the SDK the
    429 and then the answer, 0 requests, same output hash."""
    stub.errors[:] = [429]
    parent = rw.record(one_node("ask", _ask(stub, retries=2)), {"question": "q"})
    assert parent.status == "completed" and stub.count == 2
    assert _labels(rw, parent.run_id) == ["failed:raised", "miss:bypass"]
    assert output(rw, parent.run_id) == "answer #2 to q"
    child = rw.replay(parent.run_id).run_id
    assert stub.count == 2
    assert _labels(rw, child) == ["failed:replayed", "hit"]
    assert node_row(rw, child).output_hash == node_row(rw, parent.run_id).output_hash
    assert node_row(rw, child).prompt_tokens == 0


def test_an_async_run_the_provider_was_down_for_forks_live_once_it_answers(
    rw: Rewind, stub: ModelStub
) -> None:
    """503 to the request and to the SDK's retry: the node raised the SDK's error, the run
    failed. The provider answers now: a fork at that node sends the request and completes."""

    def ask(state: State) -> str:
        async def main() -> str:
            # a client per event loop: its connections belong to the loop that opened them
            client = openai.AsyncOpenAI(base_url=stub.base_url, api_key="k", max_retries=1)
            messages = [{"role": "user", "content": state["question"]}]
            r = await client.chat.completions.create(model=STUB_MODEL, messages=messages)
            return str(r.choices[0].message.content)

        return asyncio.run(main())

    stub.errors[:] = [503, 503]
    run = rw.record(one_node("ask", ask), {"question": "q"})
    assert run.status == "failed" and stub.count == 2
    assert "InternalServerError" in (run.error or "")
    assert _labels(rw, run.run_id) == ["failed:raised", "failed:raised"]
    (call, _) = node_row(rw, run.run_id).calls
    doc = json.loads(rw.store.get_blob(call.result_hash))
    assert doc["message"] == "the model endpoint answered HTTP 503: status 503 #1"
    child = rw.fork(run.run_id, at="ask")
    assert [c.outcome for c in node_row(rw, child.run_id).calls] == ["miss"]
    assert child.status == "completed" and stub.count == 3
    assert output(rw, child.run_id) == "answer #3 to q"


def _fallback_chain(stub: ModelStub) -> Any:
    """A traced chain that asks through the SDK (captured by an explicit transport, no
    retries) and returns a fallback when the provider rate-limits it."""
    http = openai.DefaultHttpxClient(transport=Transport())
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0, http_client=http)

    def chain(question: str) -> str:
        messages = [{"role": "user", "content": question}]
        try:
            r = client.chat.completions.create(model=STUB_MODEL, messages=messages)
        except openai.RateLimitError:
            return "fallback"
        return str(r.choices[0].message.content)

    return chain


def _trace(location: Path, chain: Any, *, read_cache: bool, source: str | None = None) -> str:
    tracer = Tracer(location, read_cache=read_cache, raise_on_write_error=True)
    try:
        if source is not None:
            with tracer.replay(source) as t:
                t.set_output(chain("q"))
        else:
            with tracer.trace("ask", {"question": "q"}) as t:
                t.set_output(chain("q"))
    finally:
        tracer.close()
    return t.trace_id


def test_a_traced_chain_that_fell_back_on_a_429_asks_again_once_the_provider_answers(
    tmp_path: Path, stub: ModelStub
) -> None:
    """Recorded while rate-limited, the chain returned its fallback. A cached trace
    (``read_cache=True``) sends the request again and gets the answer; an in-place replay of
    the recording still follows it (the 429 handed back, the fallback, 0 requests)."""
    chain = _fallback_chain(stub)
    stub.errors[:] = [429]
    source = _trace(tmp_path, chain, read_cache=False)
    assert stub.count == 1
    cached = _trace(tmp_path, chain, read_cache=True)
    assert stub.count == 2
    in_place = _trace(tmp_path, chain, read_cache=False, source=source)
    assert stub.count == 2
    st = open_store(tmp_path)
    try:
        views = {tid: load_trace(st, tid, payloads=True) for tid in (source, cached, in_place)}
        assert views[source].output == views[in_place].output == "fallback"
        assert views[cached].output == "answer #2 to q"
        labels = {tid: [c.label for s in v.steps for c in s.calls] for tid, v in views.items()}
        assert labels[source] == ["failed:raised"]
        assert labels[cached] == ["miss:source-failed"]
        assert labels[in_place] == ["failed:replayed"]
    finally:
        st.close()


_DROPS = [0]


def _dropping(question: str, n: int) -> str:
    """The stub's answers; while :data:`_DROPS` is positive the server drops the connection
    instead (the SDK's httpx raises ``RemoteProtocolError``)."""
    if _DROPS[0] > 0:
        _DROPS[0] -= 1
        raise RuntimeError("server hiccup")
    return f"answer #{n} to {question}"


@pytest.fixture
def dropping() -> Iterator[ModelStub]:
    _DROPS[0] = 0
    with ModelStub(reply=_dropping) as server:
        yield server


def test_a_dropped_connection_the_sdk_retried_past_replays_unchanged_and_sends_nothing(
    rw: Rewind, dropping: ModelStub
) -> None:
    """The server dropped the first request, the SDK retried and got its answer. The dropped
    request was not recorded at all: the replay's first request looked for the retry's answer
    under the first request's key, missed, and was sent live (a new answer, a new output
    hash). It is a ``failed:raised`` call now: the replay raises the same httpx error to the
    SDK there, whose retry meets the recorded answer, 0 requests."""
    _DROPS[0] = 1
    parent = rw.record(one_node("ask", _ask(dropping, retries=2)), {"question": "q"})
    assert parent.status == "completed" and dropping.count == 2
    assert _labels(rw, parent.run_id) == ["failed:raised", "miss:bypass"]
    (failed, _) = node_row(rw, parent.run_id).calls
    doc = json.loads(rw.store.get_blob(failed.result_hash))
    assert (doc["error"], doc["transport_error"]) == ("ModelTransportError", "RemoteProtocolError")
    child = rw.replay(parent.run_id).run_id
    assert dropping.count == 2
    assert _labels(rw, child) == ["failed:replayed", "hit"]
    assert output(rw, child) == output(rw, parent.run_id) == "answer #2 to q"


def test_a_run_whose_every_try_was_dropped_forks_live_once_the_endpoint_answers(
    rw: Rewind, dropping: ModelStub
) -> None:
    """The request and the SDK's retry were dropped: the node raised the SDK's
    ``APIConnectionError``, the run failed. A fork at that node sends the request again."""
    _DROPS[0] = 2
    run = rw.record(one_node("ask", _ask(dropping, retries=1)), {"question": "q"})
    assert run.status == "failed" and dropping.count == 2
    assert _labels(rw, run.run_id) == ["failed:raised", "failed:raised"]
    child = rw.fork(run.run_id, at="ask")
    assert child.status == "completed" and dropping.count == 3
    assert output(rw, child.run_id) == "answer #3 to q"


def test_an_in_place_replay_raises_the_recorded_httpx_error_to_the_sdk(
    tmp_path: Path, dropping: ModelStub
) -> None:
    """A traced chain that caught the SDK's connection error: its in-place replay hands the SDK
    the httpx error class it met, carrying the note that it was replayed, nothing sent."""
    http = openai.DefaultHttpxClient(transport=Transport())
    client = openai.OpenAI(base_url=dropping.base_url, api_key="k", max_retries=0, http_client=http)

    def chain(question: str) -> str:
        messages = [{"role": "user", "content": question}]
        try:
            client.chat.completions.create(model=STUB_MODEL, messages=messages)
        except openai.APIConnectionError as exc:
            cause = exc.__cause__
            return f"{type(cause).__name__} {getattr(cause, '__notes__', [])}"
        return "answered"

    _DROPS[0] = 1
    source = _trace(tmp_path, chain, read_cache=False)
    in_place = _trace(tmp_path, chain, read_cache=False, source=source)
    assert dropping.count == 1
    st = open_store(tmp_path)
    try:
        recorded = load_trace(st, source, payloads=True).output
        replayed = load_trace(st, in_place, payloads=True).output
    finally:
        st.close()
    assert recorded == "RemoteProtocolError []"
    assert replayed.startswith("RemoteProtocolError [")
    assert "rewind: replayed from the record" in replayed


@pytest.mark.parametrize(
    ("error_type", "has_failed_call", "raised_out"),
    [
        ("EndpointUnavailable", False, True),  # rewind.chat's own failures: always
        ("RateLimitError", True, True),  # the SDK raised out of a captured 429
        ("APIConnectionError", True, True),
        ("RateLimitError", False, False),  # no failed call: some other cause of that name
        ("ValueError", True, False),  # the node's own error after it recovered
        (None, True, False),
    ],
)
def test_which_failed_nodes_raised_out_of_a_model_call(
    error_type: str | None, has_failed_call: bool, raised_out: bool
) -> None:
    """A node (or trace) that raised out of a model-call failure sends its failed calls again
    when forked; one that failed by its own error replays them as its recorded path."""
    from rewind.call import raised_out_of_a_call

    assert raised_out_of_a_call(error_type, has_failed_call) is raised_out


def _retried_past_a_failure_replays_unchanged(
    rw: Rewind, ask: Any, sent: list[int], answer: str
) -> None:
    """Record ``ask`` (whose first request fails, the SDK's retry answered ``answer``; ``sent``
    counts the provider's requests) and replay it unchanged: 0 requests, same output."""
    parent = rw.record(one_node("ask", ask), {"question": "q"})
    assert parent.status == "completed" and len(sent) == 2
    assert _labels(rw, parent.run_id) == ["failed:raised", "miss:bypass"]
    child = rw.replay(parent.run_id).run_id
    assert len(sent) == 2
    assert _labels(rw, child) == ["failed:replayed", "hit"]
    assert output(rw, child) == output(rw, parent.run_id) == answer


def _chunk(text: str) -> bytes:
    doc = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": STUB_MODEL}
    doc["choices"] = [{"index": 0, "delta": {"content": text}}]
    return f"data: {json.dumps(doc)}\n\n".encode()


def test_a_stream_dropped_mid_body_and_retried_replays_unchanged(rw: Rewind) -> None:
    """The provider's first stream broke after one event (``ReadError``); the SDK retried and
    got a whole stream. The broken one is a failed call (a truncated stream is never an
    answer), and the unchanged replay raises it again, then serves the retry: 0 requests."""
    import httpx

    sent: list[int] = []

    class Broken(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield _chunk("par")
            raise httpx.ReadError("connection reset mid-stream")

    def provider(request: httpx.Request) -> httpx.Response:
        sent.append(1)
        headers = {"content-type": "text/event-stream"}
        if len(sent) == 1:
            return httpx.Response(200, headers=headers, stream=Broken())
        body = _chunk(f"whole {len(sent)}") + b"data: [DONE]\n\n"
        return httpx.Response(200, headers=headers, content=body)

    http = httpx.Client(transport=Transport(httpx.MockTransport(provider)))
    client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", http_client=http)

    def ask(state: State) -> str:
        messages = [{"role": "user", "content": "q"}]
        chunks = client.chat.completions.create(
            model=STUB_MODEL, messages=messages, stream=True, temperature=0
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    _retried_past_a_failure_replays_unchanged(rw, ask, sent, "whole 2")


def test_an_anthropic_overloaded_answer_the_sdk_retried_past_replays_unchanged(
    rw: Rewind,
) -> None:
    """Anthropic's SDK (on httpx2) answered 529 overloaded, then the message: the 529 is a
    failed call, replayed to the SDK with the answer after it, 0 requests."""
    anthropic = pytest.importorskip("anthropic")
    httpx2 = pytest.importorskip("httpx2")
    sent: list[int] = []

    def provider(request: Any) -> Any:
        sent.append(1)
        if len(sent) == 1:
            error = {"type": "overloaded_error", "message": "Overloaded"}
            doc = {"type": "error", "error": error}
            return httpx2.Response(529, json=doc, headers={"retry-after-ms": "0"})
        return httpx2.Response(
            200,
            json={
                "id": "msg",
                "type": "message",
                "role": "assistant",
                "model": "claude",
                "content": [{"type": "text", "text": f"hi {len(sent)}"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 3, "output_tokens": 2},
            },
        )

    http = httpx2.Client(transport=Transport(httpx2.MockTransport(provider)))
    client = anthropic.Anthropic(base_url="http://127.0.0.1:9", api_key="k", http_client=http)

    def ask(state: State) -> str:
        messages = [{"role": "user", "content": "q"}]
        return str(
            client.messages.create(model="claude", max_tokens=10, messages=messages).content[0].text
        )

    _retried_past_a_failure_replays_unchanged(rw, ask, sent, "hi 2")
