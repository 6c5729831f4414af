"""Attack 34: failed SDK model requests (69d502c, c5fea12) and jsonable on a fresh stack (826a855).

Each bug found was a strict xfail stating the correct behaviour, fixed since (the tests pass);
the attacks that held are plain tests.
Providers are a real loopback server (:class:`tests.model_stub.ModelStub`) or an
``httpx.MockTransport`` wrapped in :class:`rewind.capture.Transport` for exotic answers.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from burr.core import State

import rewind.tracing.model as tracing_model
from rewind import Rewind
from rewind.capture import Transport
from rewind.store import open_store
from rewind.tracing import Tracer
from rewind.tracing.model import jsonable
from rewind.tracing.store import load_trace
from tests.model_stub import STUB_MODEL, ModelStub
from tests.test_capture import node_row, one_node, output
from tests.test_capture_failures import _labels


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


# -- a node or chain that raised the SDK's own error after a finally that asked ---------------


def _asks_in_finally(client: openai.OpenAI) -> Callable[[str], str]:
    """Asks ``question``; whatever happens, asks a closing question in a ``finally`` (answered),
    so an SDK error of the first request propagates out after a model answer."""

    def chain(question: str) -> str:
        try:
            r = client.chat.completions.create(model=STUB_MODEL, messages=_messages(question))
            return str(r.choices[0].message.content)
        finally:
            client.chat.completions.create(model=STUB_MODEL, messages=_messages("bye"))

    return chain


def test_a_node_that_raised_the_sdks_429_after_a_finally_forks_live(
    rw: Rewind, stub: ModelStub
) -> None:
    """386ae23's rule (a node that raised out of a model-call failure sends it again) must
    hold for a captured SDK failure too: the node failed because the provider rate-limited."""
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0)
    chain = _asks_in_finally(client)
    stub.errors[:] = [429]
    run = rw.record(one_node("ask", lambda s: chain(s["question"])), {"question": "q"})
    assert run.status == "failed" and "RateLimitError" in (run.error or "")
    assert _labels(rw, run.run_id) == ["failed:raised", "miss:bypass"]
    assert stub.count == 2
    child = rw.fork(run.run_id, at="ask")
    assert child.status == "completed", child.error  # it replayed the 429, 0 sent
    assert stub.count > 2


def test_a_cached_trace_that_raised_the_sdks_429_after_a_finally_asks_again(
    tmp_path: Path, stub: ModelStub
) -> None:
    """A traced chain that raised the SDK's RateLimitError after a finally that asked the model
    raised the recorded 429 again at every cached replay, 0 requests: the rule for traces that
    raised out of a model-call failure looked for rewind's error names only."""
    http = openai.DefaultHttpxClient(transport=Transport())
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=0, http_client=http)
    chain = _asks_in_finally(client)
    stub.errors[:] = [429]
    errors: list[str] = []
    for read_cache in (False, True):
        tracer = Tracer(tmp_path, read_cache=read_cache, raise_on_write_error=True)
        try:
            with tracer.trace("ask", {"question": "q"}) as t:
                t.set_output(chain("q"))
            errors.append("")
        except openai.APIError as exc:
            errors.append(type(exc).__name__)
        finally:
            tracer.close()
    assert errors[0] == "RateLimitError"
    assert errors[1] == ""  # it raised the recorded 429 again, 0 requests
    assert stub.count == 3  # the first request sent again; the finally's answered one a hit


# -- a 429 whose body rewind cannot read ------------------------------------------------------


def _chat_answer(n: int) -> dict[str, Any]:
    return {
        "id": f"c{n}",
        "object": "chat.completion",
        "created": 1,
        "model": STUB_MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"answer #{n}"},
                "finish_reason": "stop",
            }
        ],
    }


class _Provider:
    """An ``httpx.MockTransport`` handler: the first ``len(first)`` requests get those
    (status, body) answers, the rest a chat answer with the request number."""

    def __init__(self, first: list[tuple[int, bytes]]) -> None:
        self.first = first
        self.count = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.count += 1
        if self.count <= len(self.first):
            status, body = self.first[self.count - 1]
            headers = {"content-type": "application/json", "retry-after-ms": "0"}
            return httpx.Response(status, content=body, headers=headers)
        return httpx.Response(200, json=_chat_answer(self.count))


def _mock_client(provider: _Provider, retries: int) -> openai.OpenAI:
    http = httpx.Client(transport=Transport(httpx.MockTransport(provider)))
    return openai.OpenAI(
        base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=retries, http_client=http
    )


def _asks(client: openai.OpenAI) -> Callable[[State], str]:
    def ask(state: State) -> str:
        try:
            r = client.chat.completions.create(model=STUB_MODEL, messages=_messages("q"))
        except openai.APIError as exc:
            return type(exc).__name__
        return str(r.choices[0].message.content)

    return ask


_UNREADABLE = {
    # json.loads gives a lone surrogate: the failure document's canonical_bytes refuses it
    "lone-surrogate-message": b'{"error": {"message": "bad \\ud800 byte"}}',
    # json.loads raises RecursionError, which _error_message does not catch
    "deeply-nested-json": b"[" * 100_000 + b"]" * 100_000,
}


@pytest.mark.parametrize("body", list(_UNREADABLE.values()), ids=list(_UNREADABLE))
def test_a_429_with_an_unreadable_error_body_is_recorded_as_a_failure(
    rw: Rewind, body: bytes
) -> None:
    """A 429 whose error message held an escaped lone surrogate (or whose body nested past
    what json reads) made the capture raise instead of recording the failure: the SDK's retry
    took the next occurrence key and the unchanged replay's first request was sent live."""
    provider = _Provider([(429, body)])
    parent = rw.record(one_node("ask", _asks(_mock_client(provider, retries=1))), {"q": 1})
    assert parent.status == "completed" and provider.count == 2
    assert output(rw, parent.run_id) == "answer #2"
    assert _labels(rw, parent.run_id) == ["failed:raised", "miss:bypass"]  # the 429 was lost
    child = rw.replay(parent.run_id).run_id
    assert provider.count == 2
    assert node_row(rw, child).output_hash == node_row(rw, parent.run_id).output_hash


def test_the_sdk_sees_a_429_with_an_unreadable_body_as_a_429(rw: Rewind) -> None:
    """What the SDK raises in a recorded run is what it raises without rewind."""
    body = _UNREADABLE["lone-surrogate-message"]
    plain = openai.OpenAI(
        base_url="http://127.0.0.1:9/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(_Provider([(429, body)]))),
    )
    assert _asks(plain)(State({})) == "RateLimitError"
    provider = _Provider([(429, body)])
    run = rw.record(one_node("ask", _asks(_mock_client(provider, retries=0))), {"q": 1})
    assert run.status == "completed"
    assert output(rw, run.run_id) == "RateLimitError"  # was APIConnectionError


# -- attacks on the capture that held -------------------------------------------------------


@pytest.mark.parametrize(
    "first",
    [
        [(429, b"\x89PNG\r\n\x1a\n\x00\xff binary")],  # not UTF-8: kept as base64
        [(503, b"<html>" + b"x" * 2_000_000 + b"</html>")],  # huge, not JSON
        [(500, b""), (502, b"null"), (429, b'{"error": "plain string"}'), (408, b"[]")],
    ],
    ids=["binary-429", "huge-html-503", "four-odd-failures"],
)
def test_odd_failure_bodies_replay_unchanged_with_no_request(
    rw: Rewind, first: list[tuple[int, bytes]]
) -> None:
    provider = _Provider(first)
    client = _mock_client(provider, retries=len(first))
    seen: list[bytes] = []

    def ask(state: State) -> str:
        try:
            client.with_options(max_retries=0).chat.completions.create(
                model=STUB_MODEL, messages=_messages("first")
            )
        except openai.APIStatusError as exc:
            seen.append(exc.response.content)
        r = client.chat.completions.create(model=STUB_MODEL, messages=_messages("q"))
        return str(r.choices[0].message.content)

    parent = rw.record(one_node("ask", ask), {"q": 1})
    assert parent.status == "completed", parent.error
    sent = provider.count
    assert sent == len(first) + 1
    child = rw.replay(parent.run_id).run_id
    assert provider.count == sent
    assert seen[0] == seen[1] == first[0][1]  # the SDK got the same bytes back
    assert node_row(rw, child).output_hash == node_row(rw, parent.run_id).output_hash
    assert _labels(rw, child).count("failed:replayed") == len(first)


def test_a_streamed_request_answered_500_then_retried_replays_unchanged(
    rw: Rewind, stub: ModelStub
) -> None:
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=3)

    def ask(state: State) -> str:
        stream = client.chat.completions.create(
            model=STUB_MODEL, messages=_messages(state["question"]), stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    stub.errors[:] = [500, 429]
    parent = rw.record(one_node("ask", ask), {"question": "q"})
    assert parent.status == "completed" and stub.count == 3
    assert _labels(rw, parent.run_id) == ["failed:raised", "failed:raised", "miss:bypass"]
    child = rw.replay(parent.run_id).run_id
    assert stub.count == 3
    assert output(rw, child) == output(rw, parent.run_id) == "answer #3 to q "


def test_an_async_node_that_caught_a_429_and_asked_otherwise_replays_unchanged(
    rw: Rewind, stub: ModelStub
) -> None:
    def ask(state: State) -> str:
        async def main() -> str:
            client = openai.AsyncOpenAI(base_url=stub.base_url, api_key="k", max_retries=0)
            try:
                r = await client.chat.completions.create(model=STUB_MODEL, messages=_messages("a"))
            except openai.RateLimitError:
                r = await client.chat.completions.create(model=STUB_MODEL, messages=_messages("b"))
            return str(r.choices[0].message.content)

        return asyncio.run(main())

    stub.errors[:] = [429]
    parent = rw.record(one_node("ask", ask), {"question": "q"})
    assert parent.status == "completed" and output(rw, parent.run_id) == "answer #2 to b"
    child = rw.replay(parent.run_id).run_id
    assert stub.count == 2
    assert _labels(rw, child) == ["failed:replayed", "hit"]
    assert output(rw, child) == "answer #2 to b"
    fork = rw.fork(parent.run_id, at="ask")  # a fork is a replay from that node: same path
    assert fork.status == "completed" and stub.count == 2


def test_threads_of_one_node_each_retrying_a_429_replay_unchanged(
    rw: Rewind, stub: ModelStub
) -> None:
    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=2)

    def ask(state: State) -> list[str]:
        out: list[str] = [""] * 4

        def one(i: int) -> None:
            r = client.chat.completions.create(model=STUB_MODEL, messages=_messages(f"q{i}"))
            out[i] = str(r.choices[0].message.content)

        with ThreadPoolExecutor(4) as pool:  # propagates the run context (a raw Thread does not)
            list(pool.map(one, range(4)))
        return [o.split(" to ")[1] for o in out]

    stub.errors[:] = [429, 429, 503, 429]
    parent = rw.record(one_node("ask", ask), {"question": "q"})
    assert parent.status == "completed", parent.error
    assert stub.count == 8
    child = rw.replay(parent.run_id).run_id
    assert stub.count == 8
    assert node_row(rw, child).output_hash == node_row(rw, parent.run_id).output_hash


def test_the_calls_api_and_failures_show_a_captured_429(rw: Rewind, stub: ModelStub) -> None:
    from fastapi.testclient import TestClient

    from rewind.api import create_app

    client = openai.OpenAI(base_url=stub.base_url, api_key="k", max_retries=1)

    def ask(state: State) -> str:
        r = client.chat.completions.create(model=STUB_MODEL, messages=_messages("q"))
        return str(r.choices[0].message.content)

    stub.errors[:] = [429]
    run = rw.record(one_node("ask", ask), {"question": "q"}).run_id
    with TestClient(create_app(rw.store, chat_client=None), base_url="http://127.0.0.1") as api:
        listed = api.get(f"/api/runs/{run}/nodes/1/calls")
        assert listed.status_code == 200, listed.text
        failed, answered = listed.json()["calls"]
        whole = api.get(f"/api/runs/{run}/nodes/1/calls/{failed['index']}/response")
    assert (failed["label"], answered["label"]) == ("failed:raised", "miss:bypass")
    assert "HTTP 429: status 429 #1" in json.dumps(failed["response"])
    assert whole.status_code == 200, whole.text
    assert json.loads(whole.content)["error"] == "ModelErrorStatus"


# -- jsonable on a fresh stack (826a855) -----------------------------------------------------


def _at_depth(frames_left: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` called with about ``frames_left`` frames left below the recursion limit."""

    def down(n: int) -> Any:
        return fn() if n <= 0 else down(n - 1)

    here = len(_frames())
    return down(sys.getrecursionlimit() - here - frames_left)


def _frames() -> list[Any]:
    frame, out = sys._getframe(), []
    while frame is not None:
        out.append(frame)
        frame = frame.f_back
    return out


_USER: contextvars.ContextVar[str] = contextvars.ContextVar("attack34_user", default="nobody")


class _ScopedMapping(Mapping[str, str]):
    """A read-only mapping whose value is the context's (a request-scoped settings object)."""

    def __getitem__(self, key: str) -> str:
        return _USER.get()

    def __iter__(self) -> Iterator[str]:
        return iter(["user"])

    def __len__(self) -> int:
        return 1


def test_jsonable_on_a_fresh_stack_keeps_the_callers_context() -> None:
    """A deep caller's value was read on another thread, without the caller's context
    variables: its form differed from a shallow caller's."""
    token = _USER.set("alice")
    try:
        shallow = jsonable(_ScopedMapping())
        deep = _at_depth(300, lambda: jsonable(_ScopedMapping()))
    finally:
        _USER.reset(token)
    assert shallow == {"user": "alice"}
    assert deep == shallow


_LOCK = threading.RLock()


class _LockedMapping(Mapping[str, int]):
    """A thread-safe mapping guarded by a re-entrant lock."""

    def __getitem__(self, key: str) -> int:
        with _LOCK:
            return 1

    def __iter__(self) -> Iterator[str]:
        with _LOCK:
            return iter(["a"])

    def __len__(self) -> int:
        return 1


def test_jsonable_of_a_locked_value_deep_in_the_stack_returns() -> None:
    """A deep caller holding a lock the value's methods take waited for ever on the thread
    that read the value; it is read on the caller's own thread now."""
    out: list[Any] = []

    def work() -> None:
        with _LOCK:
            out.append(_at_depth(300, lambda: jsonable(_LockedMapping())))

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(300)  # a hang detector, not a speed figure
    assert out == [{"a": 1}]  # was blocked for ever


def test_jsonable_under_a_low_recursion_limit_gives_the_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a recursion limit of 600 or less every call started a thread that started
    another, until none could start: every refused value then had one form per type."""
    started: list[int] = []

    class CountedThread(threading.Thread):
        def start(self) -> None:
            started.append(1)
            if len(started) > 20:  # what the real run does, thousands of threads later
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(tracing_model.threading, "Thread", CountedThread)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(550)
    try:
        forms = [jsonable((1, 2)), jsonable((3, 4))]
    finally:
        sys.setrecursionlimit(limit)
    assert forms == [[1, 2], [3, 4]]


def test_jsonable_deep_in_many_threads_at_once_gives_one_form() -> None:
    value = {"k": (1, {2, 3}), 4: [b"x", {"deep": tuple(range(5))}]}
    shallow = jsonable(value)
    forms: list[Any] = []
    lock = threading.Lock()

    def work(left: int) -> None:
        form = _at_depth(left, lambda: jsonable(value))
        with lock:
            forms.append(form)

    threads = [threading.Thread(target=work, args=(20 + 40 * i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(forms) == 16
    assert all(f == shallow for f in forms)


def test_a_deep_step_output_hashes_like_a_shallow_one(tmp_path: Path) -> None:
    """A traced step returning a refused value from deep in a recursion: the same output."""
    value = {"set": {1, 2}, "n": [(i, str(i)) for i in range(50)]}
    forms = []
    for left in (None, 250, 40):
        tracer = Tracer(tmp_path, raise_on_write_error=True)
        try:
            with tracer.trace("deep", {"x": 1}) as t:
                t.set_output(value if left is None else _at_depth(left, lambda: value))
        finally:
            tracer.close()
        st = open_store(tmp_path)
        try:
            forms.append(load_trace(st, t.trace_id, payloads=True).output)
        finally:
            st.close()
    assert forms[0] == forms[1] == forms[2]
