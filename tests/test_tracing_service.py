"""The trace service routes inside the real FastAPI app (TestClient), plus a real OTLP/HTTP
exporter sending to the service over a loopback socket."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rewind.api import create_app
from rewind.cli.trace_views import otel_export_command
from rewind.replay import Rewind
from rewind.store import Store, open_store
from rewind.tracing import Tracer, step
from rewind.tracing.otel import export_runs
from rewind.tracing.store import load_trace, search_runs
from tests import pipelines

T1 = "0123456789abcdef0123456789abcdef"


def make_app(store: Store, token: str | None = None) -> FastAPI:
    # create_app includes the trace service router itself.
    return create_app(store, chat_client=None, pipelines={}, token=token)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    st = open_store(tmp_path / "store")
    yield st
    st.close()


@pytest.fixture
def client(store: Store) -> Iterator[TestClient]:
    with TestClient(make_app(store), base_url="http://127.0.0.1") as c:
        yield c


def doc(trace_id: str = T1, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "trace_id": trace_id,
        "name": "checkout",
        "input": {"cart": [1, 2]},
        "output": None,
        "error": {"type": "JSONDecodeError", "message": "Expecting value: line 1 column 1"},
        "start_time": "2024-05-01T12:00:00Z",
        "duration_ms": 900,
        "steps": [
            {
                "name": "lookup",
                "type": "retrieval",
                "span_id": "a" * 16,
                "input": "cart",
                "output": [{"id": 1, "score": 0.2}],
                "duration_ms": 120,
            },
            {
                "name": "generate",
                "type": "llm_call",
                "span_id": "b" * 16,
                "input": {"prompt": "Return JSON"},
                "output": "",
                "model": "gpt-4o-mini",
                "finish_reason": "stop",
                "prompt_tokens": 50,
                "completion_tokens": 0,
                "duration_ms": 400,
            },
            {
                "name": "wrapper",
                "type": "transform",
                "span_id": "c" * 16,
                "status": "failed",
                "error": {"type": "JSONDecodeError", "message": "Expecting value: line 1 column 1"},
            },
            {
                "name": "parse",
                "type": "parse",
                "parent_span_id": "c" * 16,
                "status": "failed",
                "input": "",
                "error": {"type": "JSONDecodeError", "message": "Expecting value: line 1 column 1"},
            },
        ],
    }
    return body | extra


def test_store_get_and_conflict(client: TestClient, store: Store) -> None:
    r = client.post("/api/traces", json=doc())
    assert r.status_code == 201, r.text
    assert r.json() == {
        "trace_id": T1,
        "stored": True,
        "steps": 4,
        "links": {"trace": f"/api/traces/{T1}"},
    }
    got = client.get(f"/api/traces/{T1[:10]}").json()
    assert got["trace_id"] == T1 and got["status"] == "failed" and got["kind"] == "trace"
    assert got["started_at"] == 1714564800.0 and got["duration_ms"] == 900
    assert [s["name"] for s in got["steps"]] == ["lookup", "generate", "wrapper", "parse"]
    assert got["steps"][3]["parent"] == 3 and got["steps"][1]["model"] == "gpt-4o-mini"
    assert got["steps"][1]["prompt_tokens"] == 50
    assert store.get_run(T1).pipeline == "checkout"  # a run like any other
    assert client.get("/api/runs/" + T1).status_code == 200
    again = client.post("/api/traces", json=doc())
    assert again.status_code == 409 and "already stored" in again.json()["message"]
    assert again.json()["error"] == "Conflict"
    unreadable = client.post(
        "/api/traces", content=b"\xff\xfe{", headers={"Content-Type": "application/json"}
    )
    assert unreadable.status_code == 400, unreadable.text
    assert unreadable.json()["error"] == "BadRequest"
    assert unreadable.json()["message"] and unreadable.json()["hint"]
    missing = client.get("/api/traces/ffffffffffff")
    assert missing.status_code == 404
    # said as a trace, with where to find the stored ones (was "unknown run … `rewind runs`")
    assert missing.json()["message"] == "unknown trace 'ffffffffffff'"
    assert "/api/traces" in missing.json()["hint"]
    for route in ("inspect", "root-cause", "compare/ffffffffffff"):
        assert "unknown trace" in client.get(f"/api/traces/ffffffffffff/{route}").json()["message"]
    short = client.get("/api/traces/ff").json()  # a too-short prefix keeps its own advice
    assert "characters" in short["hint"], short


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"name": ""}, "name"),
        ({"trace_id": "xyz"}, "trace_id"),
        ({"steps": "many"}, "steps"),
        ({"steps": [{"name": "a", "type": "dance"}]}, "steps.0.type"),
        ({"steps": [{"name": "a", "status": "done"}]}, "steps.0.status"),
        ({"steps": [{"name": "a", "parent_span_id": "f" * 16}]}, None),
        ({"steps": [{"name": "a", "span_id": "e" * 16}, {"name": "b", "span_id": "e" * 16}]}, None),
        ({"surprise": 1}, "surprise"),
        ({"steps": [{"name": "a", "prompt_tokens": -1}]}, "steps.0.prompt_tokens"),
    ],
)
def test_bad_shapes_are_422(client: TestClient, patch: dict[str, Any], field: str | None) -> None:
    r = client.post("/api/traces", json=doc() | patch)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "InvalidRequest"
    if field is not None:
        assert body["field"] == field
    assert client.get("/api/traces").json()["total"] == 0


def test_nan_is_refused(client: TestClient) -> None:
    r = client.post(
        "/api/traces",
        content=b'{"name": "x", "input": {"v": NaN}}',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 422 and "cannot be hashed" in r.json()["message"]


def test_search_filters_and_paging(client: TestClient, store: Store) -> None:
    base = 1_714_564_800.0
    for i in range(7):
        body = {
            "name": "alpha" if i % 2 == 0 else "beta",
            "start_time": base + i * 86400,
            "steps": [{"name": "s", "status": "failed" if i < 3 else "success"}],
        }
        if i < 3:
            body["error"] = {"type": "TimeoutError", "message": "timed out"}
        assert client.post("/api/traces", json=body).status_code == 201
    Rewind(store).record(pipelines.pipeline, {"x": 5})
    everything = client.get("/api/traces").json()
    assert everything["total"] == 8
    traces = client.get("/api/traces", params={"kind": "trace"}).json()
    assert traces["total"] == 7
    runs = client.get("/api/traces", params={"kind": "run"}).json()
    assert [t["name"] for t in runs["traces"]] == ["tiny"] and runs["traces"][0]["kind"] == "run"
    alpha = client.get("/api/traces", params={"name": "alpha"}).json()
    assert alpha["total"] == 4
    failed = client.get("/api/traces", params={"status": "failed"}).json()
    assert failed["total"] == 3 and {t["status"] for t in failed["traces"]} == {"failed"}
    window = client.get(
        "/api/traces", params={"since": "2024-05-02", "until": base + 4 * 86400, "kind": "trace"}
    ).json()
    assert window["total"] == 4
    page1 = client.get("/api/traces", params={"kind": "trace", "limit": 3}).json()
    page2 = client.get("/api/traces", params={"kind": "trace", "limit": 3, "offset": 3}).json()
    page3 = client.get("/api/traces", params={"kind": "trace", "limit": 3, "offset": 6}).json()
    ids = [t["trace_id"] for p in (page1, page2, page3) for t in p["traces"]]
    assert len(ids) == len(set(ids)) == 7
    assert page1["next_offset"] == 3 and page3["next_offset"] is None
    # past the last trace, and past the database's integers (schemathesis found a 500 there)
    for offset in (7, 2**63, 2**65 + 3):
        beyond = client.get("/api/traces", params={"kind": "trace", "offset": offset})
        assert beyond.status_code == 200, beyond.text
        assert beyond.json()["traces"] == [] and beyond.json()["total"] == 7
        assert beyond.json()["next_offset"] is None
    starts = [t["started_at"] for p in (page1, page2, page3) for t in p["traces"]]
    assert starts == sorted(starts, reverse=True)
    bad = client.get("/api/traces", params={"since": "last tuesday"})
    assert bad.status_code == 422 and bad.json()["field"] == "since"
    assert client.get("/api/traces", params={"limit": 0}).status_code == 422


def test_inspect_failures_root_cause_compare(client: TestClient) -> None:
    client.post("/api/traces", json=doc())
    t2 = "f" * 32
    ok = doc(t2, error=None)
    ok["steps"] = [s | {"status": "success"} for s in ok["steps"][:2]] + [
        {"name": "parse", "type": "parse", "input": '{"a": 1}', "output": {"a": 1}}
    ]
    ok["steps"][1]["output"] = '{"a": 1}'
    client.post("/api/traces", json=ok)
    insp = client.get(f"/api/traces/{T1}/inspect").json()
    codes = {s["name"]: [f["code"] for f in s["findings"]] for s in insp["steps"]}
    assert codes["lookup"] == ["few_results", "low_scores"]
    assert codes["generate"] == ["empty_response"]
    assert codes["parse"] == ["parse_failure"]
    assert insp["counts"]["error"] >= 3
    one = client.get(f"/api/traces/{T1}/inspect", params={"step": "generate"}).json()
    assert [s["name"] for s in one["steps"]] == ["generate"]
    missing = client.get(f"/api/traces/{T1}/inspect", params={"step": "nope"})
    assert missing.status_code == 404 and missing.json()["field"] == "step"
    rc = client.get(f"/api/traces/{T1}/root-cause").json()
    assert rc["pattern"] == "empty_response" and rc["failing_step"]["name"] == "parse"
    assert [p["name"] for p in rc["previous_steps"]] == ["lookup", "generate", "wrapper"]
    fails = client.get("/api/traces/failures").json()
    assert fails["total_traces"] == 2 and fails["failed_traces"] == 1
    assert fails["patterns"][0]["pattern"] == "empty_response"
    assert fails["patterns"][0]["example_trace_ids"] == [T1]
    only_ok = client.post("/api/traces/failures", json={"trace_ids": [t2]}).json()
    assert only_ok == {"total_traces": 1, "failed_traces": 0, "patterns": []}
    unknown = client.post("/api/traces/failures", json={"trace_ids": ["nope1234"]})
    assert unknown.status_code == 404
    cmp = client.get(f"/api/traces/{T1}/compare/{t2}").json()
    assert cmp["first_divergence"] is not None
    assert {r["name"]: r["status"] for r in cmp["nodes"]}["lookup"] == "equal"


def test_health_and_openapi(client: TestClient) -> None:
    client.post("/api/traces", json=doc())
    health = client.get("/api/tracing/health").json()
    assert health == {
        "status": "ok",
        "traces": 1,
        "step_spans": 4,
        "runs": 1,
        "otlp_waiting_spans": 0,
    }
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for path in (
        "/api/traces",
        "/api/traces/{trace_id}",
        "/api/traces/{trace_id}/inspect",
        "/api/traces/{trace_id}/root-cause",
        "/api/traces/failures",
        "/api/tracing/health",
        "/api/otlp/v1/traces",
    ):
        assert path in paths, path
    assert paths["/api/traces"]["post"]["tags"] == ["traces"]
    assert "TraceIn" in spec["components"]["schemas"]
    assert (
        "application/x-protobuf" in paths["/api/otlp/v1/traces"]["post"]["requestBody"]["content"]
    )


def test_token_protects_the_trace_routes(store: Store) -> None:
    with TestClient(make_app(store, token="s3cret"), base_url="http://127.0.0.1") as c:
        assert c.get("/api/traces").status_code == 401
        ok = c.get("/api/traces", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        refused = c.post("/api/otlp/v1/traces", json={})
        assert refused.status_code == 401 and refused.json()["error"] == "Unauthorized"
        for r in (refused, ok):
            assert "default-src 'self'" in r.headers["content-security-policy"]
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["cache-control"] == "no-store"


def test_cross_site_posts_to_the_trace_service_store_nothing(
    client: TestClient, store: Store, tmp_path: Path
) -> None:
    source = open_store(tmp_path / "source")
    tid = traced(source)
    mem = InMemorySpanExporter()
    export_runs(source, [tid], mem)
    source.close()
    otlp = encode_spans(mem.get_finished_spans()).SerializeToString()
    for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        stored = client.post("/api/traces", json=doc(), headers=headers)
        received = client.post(
            "/api/otlp/v1/traces",
            content=otlp,
            headers={**headers, "Content-Type": "application/x-protobuf"},
        )
        analysed = client.post("/api/traces/failures", json={"trace_ids": []}, headers=headers)
        for r in (stored, received, analysed):
            assert r.status_code == 403, r.text
            assert r.json()["error"] == "CrossSiteRequest"
            assert r.headers["x-frame-options"] == "DENY"
    assert search_runs(store, kind="any")[1] == 0
    # The same requests from the server's own origin (or from no browser) are served.
    own = {"Origin": "http://127.0.0.1"}
    assert client.post("/api/traces", json=doc(), headers=own).status_code == 201
    r = client.post(
        "/api/otlp/v1/traces", content=otlp, headers={"Content-Type": "application/x-protobuf"}
    )
    assert r.status_code == 200
    assert search_runs(store, kind="any")[1] == 2


# -- OTLP receiver -----------------------------------------------------------------------------


def traced(store: Store) -> str:
    t = Tracer(store)
    with t.trace("sent", input={"q": 1}) as tr:
        with step("a", "retrieval", input=1) as s:
            s.set_output([1])
        with step("b", "llm_call", input={"prompt": "x"}) as s:
            s.set(model="m")
            s.set_tokens(3, 4)
            s.set_output("y")
    return tr.trace_id


def test_otlp_endpoint_json_and_protobuf(client: TestClient, store: Store, tmp_path: Path) -> None:
    source = open_store(tmp_path / "source")
    tid = traced(source)
    mem = InMemorySpanExporter()
    export_runs(source, [tid], mem)
    body = encode_spans(mem.get_finished_spans()).SerializeToString()
    r = client.post(
        "/api/otlp/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}
    )
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
    assert [n.output_hash for n in store.nodes_of(tid)] == [
        n.output_hash for n in source.nodes_of(tid)
    ]
    again = client.post(
        "/api/otlp/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}
    )
    assert again.status_code == 200 and len(again.content) > 0  # partial success: rejected
    from rewind.tracing.otel import spans_to_otlp_json

    tid2 = traced(source)
    mem.clear()
    export_runs(source, [tid2], mem)
    r = client.post("/api/otlp/v1/traces", json=spans_to_otlp_json(mem.get_finished_spans()))
    assert r.status_code == 200 and r.json() == {}
    assert load_trace(store, tid2).find("b").model == "m"
    assert (
        client.post(
            "/api/otlp/v1/traces", content=b"x", headers={"Content-Type": "text/plain"}
        ).json()["error"]
        == "UnsupportedMediaType"
    )
    bad = client.post(
        "/api/otlp/v1/traces",
        content=b"\xff\x00",
        headers={"Content-Type": "application/x-protobuf"},
    )
    assert bad.status_code == 400
    source.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_real_otlp_http_exporter_to_the_service(store: Store, tmp_path: Path) -> None:
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(make_app(store), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120  # uvicorn starts slowly on a loaded machine
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.started
        source = Rewind(tmp_path / "source")
        tid = traced(source.store)
        burr = source.record(pipelines.pipeline, {"x": 5})
        code = otel_export_command(
            source, [tid, burr.run_id], endpoint=f"http://127.0.0.1:{port}/api/otlp"
        )
        assert code == 0
        assert {r.run_id for r in search_runs(store)[0]} == {tid, burr.run_id}
        assert [n.input_hash for n in store.nodes_of(burr.run_id)] == [
            n.input_hash for n in source.store.nodes_of(burr.run_id)
        ]
        source.store.close()
    finally:
        server.should_exit = True
        thread.join(timeout=120)
