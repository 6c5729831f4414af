"""Tests for rewind.llm: the LLM cache key and the chat client, against mock transports."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import tenacity
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.canonical import CanonicalError
from rewind.errors import EndpointUnavailable, ModelCallError, RewindError
from rewind.llm import (
    DEFAULT_TEMPERATURE,
    PROVIDER_DEFAULTS,
    VOLATILE_FIELDS,
    ChatClient,
    ChatResponse,
    Endpoint,
    RetryPolicy,
    json_schema_format,
    llm_cache_key,
    normalize_request,
)

MONTH_SCHEMA = {
    "type": "object",
    "properties": {"month": {"type": "string", "enum": ["Jan", "Feb"]}},
    "required": ["month"],
}

BASE_BODY: dict[str, Any] = {
    "model": "smollm2-135m-instruct",
    "messages": [
        {"role": "system", "content": "You plan data analyses."},
        {"role": "user", "content": "Which month was wettest in Seattle?"},
    ],
    "temperature": 0.2,
    "top_p": 0.9,
    "max_tokens": 128,
    "stop": ["\n\n"],
    "seed": 7,
    "response_format": json_schema_format("plan", MONTH_SCHEMA),
}

FAST = RetryPolicy(attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002)
ENDPOINT = Endpoint(base_url="http://127.0.0.1:9999/v1", api_key="sk-test", model="m-default")


def key(body: dict[str, Any]) -> str:
    return llm_cache_key(body)


def body_with(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(BASE_BODY)
    body.update(changes)
    return body


def completion(content: str | None = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "m-default",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
        **extra,
    }


class Recorder:
    """An httpx.MockTransport handler that answers from a script and records every request."""

    def __init__(self, *answers: httpx.Response | Callable[[httpx.Request], httpx.Response]):
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        return answer(request) if callable(answer) else answer

    @property
    def calls(self) -> int:
        return len(self.requests)

    def sent_json(self, index: int = -1) -> dict[str, Any]:
        return json.loads(self.requests[index].content)


def client_for(
    recorder: Recorder, endpoint: Endpoint = ENDPOINT, retry: RetryPolicy = FAST
) -> ChatClient:
    return ChatClient(endpoint, retry=retry, transport=httpx.MockTransport(recorder))


def ok(payload: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.Response(200, json=payload or completion())


# --- cache key --------------------------------------------------------------------------------


def test_key_is_sha256_hex() -> None:
    k = key(BASE_BODY)
    assert len(k) == 64
    assert all(c in "0123456789abcdef" for c in k)


def test_key_ignores_key_order_at_every_level() -> None:
    reordered = dict(reversed(list(BASE_BODY.items())))
    reordered["messages"] = [dict(reversed(list(m.items()))) for m in BASE_BODY["messages"]]
    assert key(reordered) == key(BASE_BODY)


@pytest.mark.parametrize(
    "changes",
    [
        {"temperature": 0.3},
        {"top_p": 0.8},
        {"max_tokens": 129},
        {"stop": ["\n"]},
        {"seed": 8},
        {"model": "smollm2-360m-instruct"},
        {"response_format": json_schema_format("plan", {**MONTH_SCHEMA, "required": []})},
        {"response_format": None},
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {"top_k": 20},  # unknown to OpenAI, kept in the key because it may change the answer
    ],
    ids=lambda c: next(iter(c)),
)
def test_key_changes_with_any_output_affecting_parameter(changes: dict[str, Any]) -> None:
    assert key(body_with(**changes)) != key(BASE_BODY)


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m[1].update(content=m[1]["content"] + " "),
        lambda m: m[1].update(role="assistant"),
        lambda m: m.reverse(),
        lambda m: m.pop(0),
        lambda m: m[0].update(content="You plan data analyses.".upper()),
    ],
    ids=["trailing-space", "role", "order", "dropped", "case"],
)
def test_key_changes_with_one_message(edit: Callable[[list[dict[str, Any]]], None]) -> None:
    body = copy.deepcopy(BASE_BODY)
    edit(body["messages"])
    assert key(body) != key(BASE_BODY)


def test_omitted_temperature_keys_as_one_never_zero() -> None:
    omitted = {k: v for k, v in BASE_BODY.items() if k != "temperature"}
    assert DEFAULT_TEMPERATURE == 1.0
    assert key(omitted) == key(body_with(temperature=1.0))
    assert key(omitted) == key(body_with(temperature=1))
    assert key(omitted) == key(body_with(temperature=None))
    assert key(omitted) != key(body_with(temperature=0))
    assert key(omitted) != key(body_with(temperature=0.0))


def test_greedy_temperatures_key_the_same() -> None:
    assert key(body_with(temperature=0)) == key(body_with(temperature=0.0))
    assert key(body_with(temperature=-0.0)) == key(body_with(temperature=0.0))


def test_all_defaults_filled() -> None:
    minimal = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    explicit = {**minimal, **PROVIDER_DEFAULTS}
    assert key(minimal) == key(explicit)
    normalized = normalize_request(minimal)
    assert normalized["temperature"] == 1.0 and normalized["top_p"] == 1.0
    assert set(PROVIDER_DEFAULTS) <= set(normalized)


def test_stop_string_keys_like_a_one_element_list() -> None:
    assert key(body_with(stop="\n\n")) == key(BASE_BODY)


@pytest.mark.parametrize("name", sorted(VOLATILE_FIELDS | {"stream"}))
def test_volatile_fields_never_change_the_key(name: str) -> None:
    for value in ("run-1", 12345, {"trace": "abc"}, True, None):
        assert key(body_with(**{name: value})) == key(BASE_BODY)


def test_volatile_fields_include_the_issue_list() -> None:
    expected = {"user", "metadata", "run_id", "trace_id", "span_id", "request_id", "timestamp"}
    assert expected <= VOLATILE_FIELDS


def test_base_url_never_enters_the_key() -> None:
    a = ChatClient(Endpoint(base_url="http://127.0.0.1:41001/v1", model="m"))
    b = ChatClient(Endpoint(base_url="https://api.example.com/v1/", api_key="k", model="m"))
    body = {k: v for k, v in BASE_BODY.items() if k != "model"}
    assert a.cache_key(body) == b.cache_key(body) == llm_cache_key(body, default_model="m")
    a.close()
    b.close()


def test_default_model_fills_only_a_missing_model() -> None:
    without = {k: v for k, v in BASE_BODY.items() if k != "model"}
    assert llm_cache_key(without, default_model=BASE_BODY["model"]) == key(BASE_BODY)
    assert llm_cache_key(BASE_BODY, default_model="other") == key(BASE_BODY)


def test_a_request_without_model_cannot_be_keyed() -> None:
    with pytest.raises(ValueError, match="no model"):
        llm_cache_key({"messages": []})


def test_normalize_does_not_mutate_the_body() -> None:
    body = body_with(run_id="r1", stop="x", temperature=0)
    before = copy.deepcopy(body)
    normalize_request(body)
    assert body == before


def test_nan_temperature_is_refused() -> None:
    with pytest.raises(CanonicalError):
        key(body_with(temperature=float("nan")))


_json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)


@settings(max_examples=75, deadline=None)
@given(
    extra=st.dictionaries(st.sampled_from(sorted(VOLATILE_FIELDS)), _json, max_size=4),
    seed=st.randoms(use_true_random=False),
)
def test_key_is_stable_under_volatile_noise_and_shuffling(extra: dict[str, Any], seed: Any) -> None:
    items = list({**BASE_BODY, **extra}.items())
    seed.shuffle(items)
    assert key(dict(items)) == key(BASE_BODY)


# --- response format ----------------------------------------------------------------------------


def test_json_schema_format_is_the_openai_shape() -> None:
    assert json_schema_format("month", MONTH_SCHEMA) == {
        "type": "json_schema",
        "json_schema": {"name": "month", "schema": MONTH_SCHEMA, "strict": True},
    }
    with pytest.raises(ValueError):
        json_schema_format("has space", MONTH_SCHEMA)


def test_json_object_style_rewrites_response_format_on_the_wire_only() -> None:
    recorder = Recorder(ok())
    endpoint = Endpoint(
        base_url="http://127.0.0.1:1/v1", model="m", json_schema_style="json_object"
    )
    with client_for(recorder, endpoint) as client:
        client.complete(BASE_BODY)
        assert client.cache_key(BASE_BODY) == key(BASE_BODY)
    assert recorder.sent_json()["response_format"] == {
        "type": "json_object",
        "schema": MONTH_SCHEMA,
    }


def test_openai_style_sends_response_format_unchanged() -> None:
    recorder = Recorder(ok())
    with client_for(recorder) as client:
        client.complete(BASE_BODY)
    assert recorder.sent_json()["response_format"] == BASE_BODY["response_format"]


# --- what goes on the wire ----------------------------------------------------------------------


def test_request_shape_headers_and_filled_fields() -> None:
    recorder = Recorder(ok())
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "run_id": "run-1",
        "trace_id": "t-1",
        "user": "alice",
    }
    with client_for(recorder) as client:
        client.complete(body)
    request = recorder.requests[0]
    assert request.method == "POST"
    assert str(request.url) == "http://127.0.0.1:9999/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["content-type"] == "application/json"
    sent = recorder.sent_json()
    assert sent["model"] == "m-default"
    # Temperature is sent so the server samples the way the key says (llama.cpp would use 0.8);
    # top_p only when asked: the body has the fields an OpenAI SDK would send.
    assert sent["temperature"] == 1.0 and "top_p" not in sent
    assert "stream" not in sent and "stream_options" not in sent
    assert "run_id" not in sent and "trace_id" not in sent
    assert sent["user"] == "alice"
    assert body.get("model") is None  # the caller's body is untouched


def test_no_authorization_without_api_key() -> None:
    recorder = Recorder(ok())
    with client_for(recorder, Endpoint(base_url="http://127.0.0.1:1/v1", model="m")) as client:
        client.complete({"messages": []})
    assert "authorization" not in recorder.requests[0].headers


def test_sampling_defaults_can_be_left_to_the_provider() -> None:
    recorder = Recorder(ok())
    client = ChatClient(
        ENDPOINT, transport=httpx.MockTransport(recorder), send_sampling_defaults=False
    )
    client.complete({"messages": []})
    client.close()
    assert "temperature" not in recorder.sent_json()


def test_every_keyed_sampling_default_is_sent_when_asked_and_the_key_never_changes() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "model": "m"}
    sent = []
    for flag in (True, ("top_p",), ("temperature",), False):
        recorder = Recorder(ok())
        client = ChatClient(
            ENDPOINT, transport=httpx.MockTransport(recorder), send_sampling_defaults=flag
        )
        client.complete(body)
        client.close()
        sent.append({k: recorder.sent_json().get(k) for k in ("temperature", "top_p")})
    assert sent == [
        {"temperature": 1.0, "top_p": 1.0},
        {"temperature": None, "top_p": 1.0},
        {"temperature": 1.0, "top_p": None},
        {"temperature": None, "top_p": None},
    ]
    # The cache key fills the provider defaults whatever is sent: keys of recorded runs stay.
    assert llm_cache_key(body) == llm_cache_key(body | {"top_p": 1.0, "temperature": 1.0})
    with pytest.raises(ValueError, match="top_k"):
        ChatClient(ENDPOINT, send_sampling_defaults=("top_k",))


# --- responses ------------------------------------------------------------------------------------


def test_usage_and_fields_are_extracted() -> None:
    recorder = Recorder(ok())
    with client_for(recorder) as client:
        response = client.complete({"messages": []})
    assert response.content == "hello"
    assert response.finish_reason == "stop"
    assert (response.prompt_tokens, response.completion_tokens) == (12, 3)
    assert response.latency_ms >= 0


def test_missing_usage_counts_zero_and_null_content_is_empty() -> None:
    payload = completion(None)
    del payload["usage"]
    response = ChatResponse.from_raw(json.dumps(payload).encode())
    assert (response.prompt_tokens, response.completion_tokens) == (0, 0)
    assert response.content == ""


def test_content_parts_are_joined() -> None:
    payload = completion()
    payload["choices"][0]["message"]["content"] = [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
    ]
    assert ChatResponse.from_raw(json.dumps(payload).encode()).content == "ab"


def test_raw_bytes_are_preserved_exactly() -> None:
    logprobs = {"content": [{"token": "hi", "logprob": -0.1234567890123, "top_logprobs": []}]}
    payload = completion("héllo \u2603", system_fingerprint="fp_x", x_vendor={"n": [1, 2.50]})
    payload["choices"][0]["logprobs"] = logprobs
    # Odd spacing, key order, escapes and a float spelled 2.50: a re-serialisation would lose them.
    raw = json.dumps(payload, indent=3, ensure_ascii=True).replace("2.5", "2.50").encode() + b"\n\n"
    recorder = Recorder(httpx.Response(200, content=raw, headers={"content-type": "x/json"}))
    with client_for(recorder) as client:
        response = client.complete({"messages": []})
    assert response.raw == raw
    assert response.data["x_vendor"] == {"n": [1, 2.5]}
    assert response.data["choices"][0]["logprobs"] == logprobs
    rebuilt = ChatResponse.from_raw(response.raw)
    assert rebuilt == response
    assert rebuilt.raw == raw


@pytest.mark.parametrize(
    "raw",
    [b"<html>oops</html>", b"", b"[1, 2]", b'{"choices": []}', b'{"object": "x"}', b"\xff\xfe"],
)
def test_malformed_success_body_is_a_model_call_error(raw: bytes) -> None:
    recorder = Recorder(httpx.Response(200, content=raw))
    with client_for(recorder) as client, pytest.raises(ModelCallError):
        client.complete({"messages": []})
    assert recorder.calls == 1


# --- errors and retries -------------------------------------------------------------------------


def test_429_with_retry_after_then_success() -> None:
    recorder = Recorder(
        httpx.Response(429, headers={"Retry-After": "0"}, json={"error": {"message": "slow"}}),
        ok(),
    )
    with client_for(recorder) as client:
        assert client.complete({"messages": []}).content == "hello"
    assert recorder.calls == 2


@pytest.mark.parametrize("header", [{"Retry-After": "0.05"}, {"retry-after-ms": "50"}])
def test_retry_after_wins_over_backoff(
    header: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The waits tenacity asks for are recorded, not timed: elapsed time depends on the machine.
    waits: list[float] = []
    monkeypatch.setattr(tenacity.nap.time, "sleep", waits.append)
    recorder = Recorder(httpx.Response(429, headers=header), ok())
    slow_backoff = RetryPolicy(attempts=2, initial_backoff_s=30.0, max_backoff_s=30.0)
    with client_for(recorder, retry=slow_backoff) as client:
        client.complete({"messages": []})
    assert waits == [pytest.approx(0.05)]
    assert recorder.calls == 2


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_server_errors_are_retried_then_raised(status: int) -> None:
    recorder = Recorder(httpx.Response(status, json={"error": {"message": "overloaded"}}))
    with client_for(recorder) as client, pytest.raises(ModelCallError) as info:
        client.complete({"messages": []})
    assert recorder.calls == FAST.attempts
    assert f"HTTP {status}" in info.value.message and "overloaded" in info.value.message
    assert info.value.hint


def test_503_then_success_recovers() -> None:
    recorder = Recorder(httpx.Response(503), httpx.Response(503), ok())
    with client_for(recorder) as client:
        assert client.complete({"messages": []}).content == "hello"
    assert recorder.calls == 3


def test_connect_error_is_endpoint_unavailable_with_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REWIND_BASE_URL", raising=False)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    recorder = Recorder(refuse)
    with client_for(recorder) as client, pytest.raises(EndpointUnavailable) as info:
        client.complete({"messages": []})
    assert recorder.calls == FAST.attempts
    assert info.value.message == "cannot reach the model endpoint at http://127.0.0.1:9999/v1"
    assert "REWIND_BASE_URL" in info.value.hint and "rewind-replay[local]" in info.value.hint
    assert str(info.value) == f"{info.value.message}\n{info.value.hint}"


def test_unreachable_client_of_its_own_is_not_told_to_set_rewind_base_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chain's own ``ChatClient`` (another endpoint than ``REWIND_BASE_URL``) that cannot
    connect was told to set REWIND_BASE_URL, which does not change that client: the hint now
    names its endpoint and how to change it; the endpoint REWIND_BASE_URL names keeps the
    variables' hint."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    monkeypatch.setenv("REWIND_BASE_URL", "http://127.0.0.1:8080/v1/")
    with client_for(Recorder(refuse)) as client, pytest.raises(EndpointUnavailable) as info:
        client.complete({"messages": []})
    assert "start the server at http://127.0.0.1:9999/v1" in info.value.hint
    assert "Endpoint(base_url=...)" in info.value.hint and "http://127.0.0.1:8080/v1" in (
        info.value.hint
    )
    monkeypatch.setenv("REWIND_BASE_URL", "http://127.0.0.1:9999/v1")
    with client_for(Recorder(refuse)) as client, pytest.raises(EndpointUnavailable) as info:
        client.complete({"messages": []})
    assert "REWIND_BASE_URL/REWIND_API_KEY/REWIND_MODEL" in info.value.hint


def test_read_timeout_is_retried_then_endpoint_unavailable() -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    recorder = Recorder(hang, ok())
    with client_for(recorder) as client:
        assert client.complete({"messages": []}).content == "hello"
    recorder = Recorder(hang)
    with client_for(recorder) as client, pytest.raises(EndpointUnavailable, match="within"):
        client.complete({"messages": []})
    assert recorder.calls == FAST.attempts


def test_400_is_raised_at_once_with_the_server_message() -> None:
    error = {"error": {"message": "max_tokens is too large", "type": "invalid_request_error"}}
    recorder = Recorder(httpx.Response(400, json=error))
    with client_for(recorder) as client, pytest.raises(ModelCallError) as info:
        client.complete({"messages": []})
    assert recorder.calls == 1
    assert "HTTP 400" in info.value.message and "max_tokens is too large" in info.value.message


def test_401_hint_names_the_api_key() -> None:
    recorder = Recorder(httpx.Response(401, json={"error": {"message": "bad key"}}))
    with client_for(recorder) as client, pytest.raises(ModelCallError) as info:
        client.complete({"messages": []})
    assert "REWIND_API_KEY" in info.value.hint


def test_llama_cpp_validation_500_is_not_retried() -> None:
    # What llama-cpp-python 0.3.36 answers to an OpenAI json_schema response_format.
    message = (
        "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', "
        "'type'), 'msg': \"Input should be 'text' or 'json_object'\"}\n\n  File \"app.py\""
    )
    recorder = Recorder(httpx.Response(500, json={"error": {"message": message}}))
    with client_for(recorder) as client, pytest.raises(ModelCallError) as info:
        client.complete({"messages": []})
    assert recorder.calls == 1
    assert "\n" not in info.value.message


def test_retry_policy_validates() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(initial_backoff_s=-1)


# --- health ---------------------------------------------------------------------------------------


def test_health_and_reachable() -> None:
    with client_for(Recorder(httpx.Response(200, json={"data": []}))) as client:
        assert client.health() and client.reachable()
    with client_for(Recorder(httpx.Response(404))) as client:
        assert not client.health()
        assert client.reachable()

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    recorder = Recorder(refuse)
    with client_for(recorder) as client:
        assert not client.health() and not client.reachable()
    assert str(recorder.requests[0].url) == "http://127.0.0.1:9999/v1/models"


# --- endpoint ---------------------------------------------------------------------------------


def test_endpoint_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REWIND_BASE_URL", "REWIND_API_KEY", "REWIND_MODEL", "REWIND_JSON_SCHEMA_STYLE"):
        monkeypatch.delenv(name, raising=False)
    assert Endpoint.from_env() is None
    monkeypatch.setenv("REWIND_BASE_URL", "http://localhost:8080/v1/")
    with pytest.raises(EndpointUnavailable, match="REWIND_MODEL"):
        Endpoint.from_env()
    monkeypatch.setenv("REWIND_MODEL", "qwen")
    monkeypatch.setenv("REWIND_API_KEY", "sk-secret")
    endpoint = Endpoint.from_env()
    assert endpoint == Endpoint("http://localhost:8080/v1", "sk-secret", "qwen", "openai")
    assert "sk-secret" not in repr(endpoint)
    monkeypatch.setenv("REWIND_BASE_URL", "localhost:8080/v1")
    with pytest.raises(EndpointUnavailable) as info:
        Endpoint.from_env()
    assert info.value.hint


def test_endpoint_validates() -> None:
    with pytest.raises(ValueError):
        Endpoint(base_url="ftp://x/v1", model="m")
    with pytest.raises(ValueError):
        Endpoint(base_url="http://x/v1", model="")
    with pytest.raises(ValueError):
        Endpoint(base_url="http://x/v1", model="m", json_schema_style="yaml")  # type: ignore[arg-type]


def test_rewind_error_renders_message_then_hint() -> None:
    assert str(RewindError("what is wrong", "how to fix")) == "what is wrong\nhow to fix"
    assert str(RewindError("what is wrong")) == "what is wrong"
    assert issubclass(EndpointUnavailable, RewindError) and issubclass(ModelCallError, RewindError)
