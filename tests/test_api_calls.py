"""Prompts and responses through the HTTP API: each call of a node with its request (messages
with roles, params, tools, response schema; a tool's args) and response (content, finish reason,
usage; a tool's result), cache outcome and key, latency; long bodies cut with a byte count and a
route serving the whole recorded blob. Real app (TestClient), real SQLite store, the fake
OpenAI-compatible model of conftest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from burr.core import State, action, default
from burr.core.graph import GraphBuilder
from fastapi.testclient import TestClient

import rewind
from rewind.api import create_app
from rewind.api.calls_view import STRING_LIMIT, llm_request, llm_response
from rewind.api.pipelines import PipelineEntry
from rewind.canonical import sha256_hex
from rewind.capture.exchange import encode_envelope, recorded_from
from rewind.llm import ChatClient
from rewind.replay import Pipeline
from rewind.store import Store, open_store
from rewind.store.users import add_user, rotate_token
from tests.test_api import wait

LOCAL = "http://127.0.0.1"
LONG = "Context line with <b>markup</b>. " * 400  # ~13,000 characters, over the string limit
SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "answer", "schema": {"type": "object"}},
}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


@rewind.tool("calls.lookup")
def lookup(city: str, year: int) -> dict[str, Any]:
    return {"city": city, "year": year, "rows": list(range(300))}


@action(reads=["question"], writes=["answer"])
def ask(state: State, temperature: float = 0.0) -> State:
    response = rewind.chat(
        [
            {"role": "system", "content": LONG},
            {"role": "user", "content": state["question"]},
        ],
        temperature=temperature,
        max_tokens=64,
        response_format=SCHEMA,
        tools=TOOLS,
    )
    return state.update(answer=response.content)


@action(reads=["answer"], writes=["facts"])
def look(state: State) -> State:
    return state.update(facts=lookup("Seattle", 2_015))


@action(reads=["facts"], writes=["years"])
def many(state: State) -> State:
    return state.update(years=[lookup("Tacoma", y)["year"] for y in range(1950, 2010)])


chatty = Pipeline(
    name="chatty",
    graph=GraphBuilder()
    .with_actions(ask=ask, look=look, many=many)
    .with_transitions(("ask", "look", default), ("look", "many", default))
    .build(),
    entrypoint="ask",
    ref="tests.test_api_calls:chatty",
)


@pytest.fixture
def client(tmp_path: Path, chat_client: ChatClient) -> Iterator[TestClient]:
    store: Store = open_store(tmp_path / "store")
    app = create_app(
        store,
        chat_client=chat_client,
        pipelines={"chatty": PipelineEntry.of(chatty, {"question": "why <i>rain</i>?"})},
    )
    with TestClient(app, base_url="http://127.0.0.1") as c:
        yield c
    store.close()


def test_node_api_shows_the_prompt_and_the_response(client: TestClient) -> None:
    r = client.post("/api/runs", json={"pipeline": "chatty"})
    assert r.status_code == 202, r.text
    run = wait(client, r.json()["run_id"])
    assert run["status"] == "completed", run["error"]
    run_id = run["run_id"]

    node = client.get(f"/api/runs/{run_id}/nodes/ask").json()
    (call,) = node["calls"]
    assert call["kind"] == "llm" and call["name"] == "fake-model"
    assert call["outcome"] == "miss" and call["reason"] == node["node"]["calls"][0]["reason"]
    assert len(call["key"]) == 64 and call["key"] == node["node"]["calls"][0]["key"]
    assert call["latency_ms"] >= 0 and call["tokens"] == node["node"]["tokens"] > 0

    request = call["request"]
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert request["messages"][1]["content"] == "why <i>rain</i>?"
    system = request["messages"][0]["content"]
    assert system.startswith(LONG[:STRING_LIMIT]) and len(system) < len(LONG)
    assert f"{len(LONG) - STRING_LIMIT:,} more characters" in system
    assert request["params"]["temperature"] == 0.0 and request["params"]["max_tokens"] == 64
    assert request["params"]["model"] == "fake-model"
    assert request["tools"] == TOOLS and request["response_schema"] == SCHEMA
    assert call["request_truncated"] is True

    response = call["response"]
    assert response["content"] == run_answer(client, run_id)
    assert response["finish_reason"] == "stop"
    assert response["usage"]["prompt_tokens"] == call["prompt_tokens"]
    assert call["response_truncated"] is False

    # The whole request: exactly the recorded blob, its hash the call's request_hash.
    full = client.get(call["request_url"])
    assert full.status_code == 200 and full.headers["content-type"] == "application/json"
    assert sha256_hex(full.content) == call["request_hash"] == full.headers["x-content-sha256"]
    assert len(full.content) == call["request_bytes"]
    assert json.loads(full.content)["messages"][0]["content"] == LONG

    # A tool call: args and result; a list over the bound is cut with a count.
    calls = client.get(f"/api/runs/{run_id}/nodes/2/calls").json()
    (tool_call,) = calls["calls"]
    assert tool_call["kind"] == "tool" and tool_call["name"] == "calls.lookup"
    assert tool_call["request"]["args"] == {"city": "Seattle", "year": 2015}
    rows = tool_call["response"]["result"]["rows"]
    assert rows[:200] == list(range(200)) and rows[200] == "… [100 more items]"
    assert tool_call["response_truncated"] is True
    whole = client.get(tool_call["response_url"]).json()
    assert whole["rows"] == list(range(300))

    # A node with 60 calls: its page holds 50, the calls route pages the rest.
    node3 = client.get(f"/api/runs/{run_id}/nodes/many").json()
    assert node3["calls_total"] == 60 and len(node3["calls"]) == 50
    rest = client.get(f"/api/runs/{run_id}/nodes/3/calls", params={"offset": 50}).json()
    assert rest["total"] == 60 and rest["offset"] == 50
    assert [c["index"] for c in rest["calls"]] == list(range(50, 60))
    assert rest["calls"][-1]["request"]["args"] == {"city": "Tacoma", "year": 2009}
    bad = client.get(f"/api/runs/{run_id}/nodes/3/calls", params={"limit": 0})
    assert bad.status_code == 422 and bad.json()["field"] == "limit"

    # An unchanged replay: the same call served from the cache under the same key.
    r = client.post(f"/api/runs/{run_id}/replay", json={})
    assert r.status_code == 202, r.text
    replay = wait(client, r.json()["run_id"])
    (hit,) = client.get(f"/api/runs/{replay['run_id']}/nodes/1/calls").json()["calls"]
    assert (hit["outcome"], hit["tokens"], hit["key"]) == ("hit", 0, call["key"])
    assert hit["response"]["content"] == response["content"]


def run_answer(c: TestClient, run_id: str) -> str:
    return str(c.get(f"/api/runs/{run_id}/nodes/ask/output").json()["output"]["answer"])


def test_call_blob_route_refuses_unknown_calls(client: TestClient) -> None:
    r = client.post("/api/runs", json={"pipeline": "chatty"})
    run_id = wait(client, r.json()["run_id"])["run_id"]
    missing = client.get(f"/api/runs/{run_id}/nodes/1/calls/7/request")
    assert missing.status_code == 404, missing.text
    body = missing.json()
    assert body["field"] == "index" and "has no call 7" in body["message"]
    bad = client.get(f"/api/runs/{run_id}/nodes/1/calls/0/headers")
    assert bad.status_code == 422, bad.text
    assert bad.json()["error"] == "InvalidRequest" and bad.json()["field"] == "part"


def test_settings_list_the_effective_configuration(
    tmp_path: Path, chat_client: ChatClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REWIND_API_KEY", "sk-secret-never-shown")
    monkeypatch.setenv("REWIND_JSON_SCHEMA_STYLE", "json_object")
    monkeypatch.delenv("REWIND_HTTP_CAPTURE", raising=False)
    store = open_store(tmp_path / "store")
    try:
        with TestClient(create_app(store, chat_client=chat_client), base_url=LOCAL) as c:
            r = c.get("/api/settings")
            assert "sk-secret-never-shown" not in r.text
            rows = {row["name"]: row for row in r.json()["effective"]}
        assert rows["model API key"]["value"] == "set (not shown)"
        assert rows["model API key"]["source"] == "REWIND_API_KEY"
        assert rows["JSON schema style"] == {
            "name": "JSON schema style",
            "value": "json_object",
            "source": "REWIND_JSON_SCHEMA_STYLE",
            "note": "how response_format schemas are sent to the endpoint",
        }
        assert (rows["SDK HTTP capture"]["value"], rows["SDK HTTP capture"]["source"]) == (
            "on",
            "default",
        )
        assert rows["model endpoint"]["source"] == "server"  # the client it was created with
        assert rows["database"]["value"].startswith("sqlite")
        assert rows["authentication"]["value"].startswith("none")
        add_user(store, "ada")
        with TestClient(create_app(store, chat_client=chat_client), base_url=LOCAL) as c:
            assert c.get("/api/settings").status_code == 401
            _, token = rotate_token(store, "ada")
            body = c.get("/api/settings", headers={"Authorization": f"Bearer {token}"}).json()
        auth = next(row for row in body["effective"] if row["name"] == "authentication")
        assert auth["source"] == "users" and auth["value"].startswith("users:")
    finally:
        store.close()


def test_captured_anthropic_and_streamed_calls_are_laid_out() -> None:
    """Captured SDK calls store ``{method, url, headers, body}`` requests and HTTP envelopes:
    the layout reads through them (Anthropic's system prompt and content blocks; streamed
    chat-completion chunks folded into one answer)."""
    request = {
        "method": "POST",
        "url": "anthropic/v1/messages",
        "headers": [],
        "body": {
            "model": "claude-x",
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "hi <script>"}],
            "max_tokens": 10,
        },
    }
    laid = llm_request(request)
    assert laid["endpoint"] == "POST anthropic/v1/messages"
    assert [(m["role"], m["content"]) for m in laid["messages"]] == [
        ("system", "Be brief."),
        ("user", "hi <script>"),
    ]
    assert laid["params"] == {"model": "claude-x", "max_tokens": 10}

    answer = {
        "content": [
            {"type": "text", "text": "Hello"},
            {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": 1}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 5, "output_tokens": 2},
    }
    headers = [("content-type", "application/json")]
    envelope = encode_envelope(recorded_from(200, headers, json.dumps(answer).encode()))
    out = llm_response(envelope)
    assert (out["status"], out["content"], out["finish_reason"]) == (200, "Hello", "tool_use")
    assert out["tool_calls"][0]["name"] == "lookup"
    assert out["usage"] == {"input_tokens": 5, "output_tokens": 2}

    chunks = [
        {"choices": [{"delta": {"content": "Hel"}, "finish_reason": None}]},
        {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    ]
    stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    sse = [("content-type", "text/event-stream")]
    out = llm_response(encode_envelope(recorded_from(200, sse, stream.encode())))
    assert (out["content"], out["finish_reason"], out["streamed_events"]) == ("Hello", "stop", 4)
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 2}
