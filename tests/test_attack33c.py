"""Attack on recorded model-call failures (issue #13, session 33): a model call that raised is
a ``failed:raised`` call row, and replays that read the cache raise it again. What a user meets
when the endpoint was down, refused or rate-limited at the recording, and every later run once
it answers.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from burr.core import State, action

from rewind import Rewind
from rewind.errors import EndpointUnavailable
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.store import open_store
from tests import pipelines
from tests import test_failed_calls as failed
from tests.model_stub import STUB_MODEL, stub_and_client
from tests.test_tracing_lane import reply


def test_a_cached_chain_whose_every_try_failed_sends_again_once_the_endpoint_answers(
    tmp_path: Path,
) -> None:
    """The chain catches the endpoint's failures and returns a fallback (``flaky``: 3 tries,
    then ``error: ...``). Recorded while the endpoint was down, every try failed and the trace
    completed with the fallback. Each later ``Tracer(read_cache=True)`` run, the endpoint
    answering now, raised the three recorded failures again, sent nothing and returned the
    fallback, forever: the user could not get past the outage without editing code. A cached
    trace replays a recorded failure only when the source got an answer after it (the failure
    was part of the recorded path, the chain recovered); failures after the source's last
    answer are sent again (the endpoint was down). Explicit replays still replay them."""
    failed._DROPS[0] = 3
    with stub_and_client(failed._reply) as (stub, client):
        source = failed._record(tmp_path, client)
        assert stub.count == 3
        failed._DROPS[0] = 0
        cached = failed._replay("cached", tmp_path, client, source)
        sent = stub.count - 3
        in_place = failed._replay("in-place", tmp_path, client, source)
        assert stub.count - 3 == sent
    st = open_store(tmp_path)
    try:
        assert sent == 2  # the first try answered, then the follow-up
        assert failed._labels(st, cached) == [["miss:source-failed"]] * 2  # its steps 1, 2 failed
        assert [s[1] for s in failed._steps(st, cached)] == ["success", "success"]
        assert st.get_run(cached).parent_run_id == source
        assert failed._labels(st, in_place) == [["failed:replayed"]] * 3
        assert failed._steps(st, in_place) == failed._steps(st, source)
    finally:
        st.close()


def _dead_client() -> ChatClient:
    """A client for an endpoint that is down (nothing listens on port 9, discard)."""
    return ChatClient(
        Endpoint(base_url="http://127.0.0.1:9/v1", api_key="none", model=STUB_MODEL),
        retry=RetryPolicy(attempts=1),
    )


@pytest.mark.parametrize("pipeline", ["llm_pipeline", "retrying_llm_pipeline"])
@pytest.mark.parametrize("how", ["fork", "replay"])
def test_a_burr_run_recorded_with_the_endpoint_down_forks_live_once_it_answers(
    pipeline: str, how: str, tmp_path: Path
) -> None:
    """The user's first Burr run met the endpoint down: the node raised (after asking twice,
    for ``retrying_llm_pipeline``), the run failed with its ``failed:raised`` calls. The
    endpoint answers now; the user forks (or replays) at that node with no change. The fork
    raised the recorded failure again, 0 requests, at every try, its note saying "fork at this
    step" to a user who had just done so (5091798 replays every failed row of the parent).
    Failures after the parent's last answer are sent again: the fork is answered and
    completes."""
    from tests import pipelines

    rw = Rewind(tmp_path / "store", chat_client=_dead_client())
    try:
        with pytest.raises(EndpointUnavailable):
            rw.record(getattr(pipelines, pipeline), {"question": "why?"})
        (run,) = rw.store.list_runs()
        (node,) = rw.store.nodes_of(run.run_id)
        assert {c.label for c in node.calls} == {"failed:raised"}
    finally:
        rw.store.close()
    with stub_and_client(reply) as (stub, client):
        rw = Rewind(tmp_path / "store", chat_client=client)
        try:
            child = getattr(rw, how)(run.run_id, at=node.name)
            assert stub.count == 1
            assert child.status == "completed"
            first = rw.store.nodes_of(child.run_id)[0]
            assert [c.outcome for c in first.calls] == ["miss"]
        finally:
            rw.store.close()


def _scripted_client(statuses: list[int]) -> tuple[ChatClient, list[int]]:
    """A client whose endpoint answers the given HTTP statuses in turn (then 200s), with 3
    tries and no waiting; returns it and the list of statuses it answered."""
    import httpx

    sent: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        status = statuses[len(sent)] if len(sent) < len(statuses) else 200
        sent.append(status)
        if status != 200:
            return httpx.Response(status, json={"error": {"message": f"status {status}"}})
        message = {"role": "assistant", "content": f"answer #{len(sent)}"}
        return httpx.Response(
            200,
            json={
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            },
        )

    retry = RetryPolicy(attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0)
    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", api_key="none", model=STUB_MODEL)
    return ChatClient(endpoint, retry=retry, transport=httpx.MockTransport(handle)), sent


@pytest.mark.parametrize("statuses", [[429], [500, 503], [429, 500]])
def test_a_rate_limit_or_server_error_the_client_retried_past_is_no_failure(
    statuses: list[int], tmp_path: Path
) -> None:
    """What held: a 429/500 that the client's retries got past is one answered call
    (``miss:bypass``), no ``failed`` row; its replay serves the answer, 0 requests."""
    client, sent = _scripted_client(statuses)
    with client:
        source = failed._record(tmp_path, client, "why?")
        assert sent == [*statuses, 200, 200]
        replay = failed._replay("in-place", tmp_path, client, source, "why?")
        assert len(sent) == len(statuses) + 2
    st = open_store(tmp_path)
    try:
        assert failed._labels(st, source) == [["miss:bypass"]] * 2
        assert failed._labels(st, replay) == [["hit"]] * 2
    finally:
        st.close()


@pytest.mark.parametrize("status", [404, 429])
def test_a_refusal_is_recorded_and_a_cached_trace_sends_again_once_it_answers(
    status: int, tmp_path: Path
) -> None:
    """A wrong model name (HTTP 404) or a rate limit past every retry (429 three times),
    caught by the chain at each of its 3 tries: 3 ``failed:raised`` rows with the
    endpoint's message; the next ``read_cache`` run, the endpoint answering, sends again (the
    source never got an answer after them, e843fd5) and completes answered."""
    statuses = [status] * 9
    client, sent = _scripted_client(statuses)
    with client:
        source = failed._record(tmp_path, client, "why?")
        assert len(sent) == (9 if status == 429 else 3)  # 429 is retried, 404 is not
        statuses[:] = sent[:] = []  # the endpoint answers now
        cached = failed._replay("cached", tmp_path, client, "", "why?")
    st = open_store(tmp_path)
    try:
        steps = failed._steps(st, source)
        assert [s[2] for s in steps] == ["ModelCallError"] * 3
        assert f"HTTP {status}" in steps[0][3]
        assert failed._labels(st, source) == [["failed:raised"]] * 3
        assert failed._labels(st, cached)[0] == ["miss:source-failed"]
        assert [s[1] for s in failed._steps(st, cached)] == ["success", "success"]
    finally:
        st.close()


def test_a_replayed_failure_says_how_to_send_it_from_an_in_place_replay(tmp_path: Path) -> None:
    """The chain raised out of the endpoint being down; the endpoint answers now, and the
    user replays in place with a ``Tracer`` whose ``read_cache`` is already False. The
    replayed error's note told them to use ``Tracer(read_cache=False)``, which does not touch
    an in-place replay: it names the switch that does (``ReplaySwitches(cached_llm=False)``),
    and following it sends the call and is answered."""
    from rewind.tracing import Tracer
    from rewind.tracing.switches import ReplaySwitches

    tracer = Tracer(tmp_path, chat_client=_dead_client())
    try:
        with pytest.raises(EndpointUnavailable), tracer.trace("one", {"q": "why?"}) as t:
            failed._ask("why?")
    finally:
        tracer.close()
    with stub_and_client(reply) as (stub, client):
        tracer = Tracer(tmp_path, chat_client=client, read_cache=False)
        try:
            with pytest.raises(EndpointUnavailable) as raised, tracer.replay(t.trace_id):
                failed._ask("why?")
            assert stub.count == 0
            (note,) = raised.value.__notes__
            assert "ReplaySwitches(cached_llm=False)" in note
            with tracer.replay(t.trace_id, switches=ReplaySwitches(cached_llm=False)) as again:
                again.set_output(failed._ask("why?"))
            assert stub.count == 1
        finally:
            tracer.close()


def test_an_embedded_model_that_did_not_start_is_no_recorded_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rewind run`` opens the embedded model at the first model call (``LazyChatClient``):
    when it cannot start (llama-cpp-python not installed, no model file), that call raised
    EndpointUnavailable before any request was sent, and it was recorded as the call's
    failure (``failed:raised``, "the embedded model server is not installed"): an explicit
    replay, the model installed, raised "install rewind-replay[local]" again. Like a run with
    no endpoint (83371ab), it is the run's set-up: the node fails with no call row, and a
    replay of the run sends the call."""
    import rewind.session as session
    from rewind.errors import EndpointUnavailable as Unavailable
    from tests import pipelines

    def not_installed() -> None:
        raise Unavailable("the embedded model server is not installed", "install it")

    monkeypatch.setattr(session, "model_endpoint", not_installed)
    lazy = session.LazyChatClient()
    rw = Rewind(tmp_path / "store", chat_client=lazy)
    try:
        with pytest.raises(EndpointUnavailable, match="not installed"):
            rw.record(pipelines.llm_pipeline, {"question": "why?"})
        (run,) = rw.store.list_runs()
        (node,) = rw.store.nodes_of(run.run_id)
        assert node.error and node.calls == ()
    finally:
        rw.store.close()
        lazy.close()


_RATE_LIMITED = [True]
_SDK_SENT: list[int] = []


def _rate_limited_provider(request: Any) -> Any:
    """An OpenAI-style provider answering HTTP 429 while :data:`_RATE_LIMITED` holds."""
    import httpx

    _SDK_SENT.append(1)
    if _RATE_LIMITED[0]:
        return httpx.Response(429, json={"error": {"message": "rate limited", "type": "rate"}})
    message = {"role": "assistant", "content": f"ok {len(_SDK_SENT)}"}
    return httpx.Response(
        200,
        json={
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        },
    )


@action(reads=["question"], writes=["answer"])
def sdk_ask(state: State) -> State:
    """Asks through the OpenAI SDK (captured at its httpx transport), 1 retry."""
    import httpx
    import openai

    from rewind.capture import Transport

    transport = Transport(httpx.MockTransport(_rate_limited_provider))
    with openai.OpenAI(
        base_url="http://127.0.0.1:9/v1",
        api_key="none",
        max_retries=1,
        http_client=openai.DefaultHttpxClient(transport=transport),
    ) as client:
        content = [{"role": "user", "content": state["question"]}]
        r = client.chat.completions.create(model="m", messages=content, temperature=0)
    return state.update(answer=r.choices[0].message.content)


sdk_pipeline = pipelines._linear(
    "sdk", "tests.test_attack33c:sdk_pipeline", sdk_ask=sdk_ask, shout=pipelines.shout
)


def test_a_burr_run_rate_limited_through_an_sdk_forks_live_once_the_provider_answers(
    tmp_path: Path,
) -> None:
    """The node calls the OpenAI SDK (captured at the transport); the provider answered 429
    to the request and its retry, and the SDK raised RateLimitError: the run failed. The
    provider answers now; a fork at that node with no change should send and complete, as a
    ``rewind.chat`` call that raised does (13697dd). It served the recorded 429s (labelled
    ``hit``), the SDK raised again, 0 requests: a 429 or 5xx answer is now a ``failed:raised``
    call, sent again where nothing answered after it."""
    _RATE_LIMITED[0] = True
    rw = Rewind(tmp_path / "store")
    try:
        with contextlib.suppress(Exception):  # the SDK's RateLimitError, or a failed run
            rw.record(sdk_pipeline, {"question": "why?"})
        (run,) = rw.store.list_runs()
        assert run.status == "failed" and len(_SDK_SENT) == 2
        _RATE_LIMITED[0] = False
        del _SDK_SENT[:]
        child = rw.fork(run.run_id, at="sdk_ask")
        assert child.status == "completed" and len(_SDK_SENT) == 1
    finally:
        rw.store.close()
