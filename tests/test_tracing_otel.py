"""OpenTelemetry export (opentelemetry-sdk spans, GenAI conventions) and OTLP/JSON import.

A trace exported and imported into another store comes back with the same ids and the same
input, output and state hashes; foreign traces (OpenInference and GenAI attributes, base64 ids)
import as traces that inspection, failure analysis, root cause and diff handle like native ones.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from rewind.calls import chat
from rewind.errors import RewindError
from rewind.llm import ChatClient
from rewind.replay import Rewind
from rewind.store import Store, open_store
from rewind.tracing import Tracer, step
from rewind.tracing.failures import analyze_failures
from rewind.tracing.inspect import compare_traces, inspect_trace
from rewind.tracing.otel import (
    OtlpJsonFileExporter,
    OtlpReceiver,
    export_runs,
    export_to_file,
    import_otlp,
    read_otlp_file,
)
from rewind.tracing.rootcause import root_cause
from rewind.tracing.store import load_trace, search_runs
from tests import pipelines

OT = Tracer()


@OT.chain("rag")
def rag(question: str) -> str:
    with step("retrieve", "retrieval", input=question) as s:
        s.set_output([{"text": "a", "score": 0.9}, {"text": "b", "score": 0.7}])
        s.set(scores=[0.9, 0.7])
    with step("answer", "transform", input={"q": question}) as outer:
        with step("generate", "llm_call", input={"question": question}) as s:
            reply = chat([{"role": "user", "content": question}], temperature=0)
            s.set_output(reply.content)
        outer.set_output({"text": reply.content})
    with step("cache_write", "tool_call") as s:
        s.skip("read-only mode")
    if "fail" in question:
        with step("parse", "parse", input=reply.content):
            json.loads(reply.content)
    return reply.content


@pytest.fixture
def store(tmp_path: Path, chat_client: ChatClient) -> Iterator[Store]:
    st = open_store(tmp_path / "a")
    OT.configure(store=st, chat_client=chat_client)
    yield st
    st.close()


@pytest.fixture
def other(tmp_path: Path) -> Iterator[Store]:
    st = open_store(tmp_path / "b")
    yield st
    st.close()


def record(store: Store, question: str) -> str:
    with contextlib.suppress(json.JSONDecodeError):
        rag(question)
    return search_runs(store, kind="trace", limit=1)[0][0].run_id


def rows(store: Store, run_id: str) -> list[tuple[Any, ...]]:
    return [
        (
            n.position,
            n.name,
            n.input_hash,
            n.output_hash,
            n.state_hash,
            n.prompt_tokens,
            n.completion_tokens,
            n.error,
            n.params,
            n.cache_outcome,
        )
        for n in store.nodes_of(run_id)
    ]


def test_round_trip_keeps_ids_and_hashes(store: Store, other: Store, tmp_path: Path) -> None:
    ok = record(store, "what is up?")
    bad = record(store, "this will fail")
    path = tmp_path / "traces.json"
    assert export_to_file(store, [ok, bad], path) == [ok, bad]
    doc = json.loads(path.read_text())
    spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert {s["traceId"] for s in spans} == {ok, bad}  # hex, the run ids
    assert all(len(s["spanId"]) == 16 for s in spans)
    result = import_otlp(other, read_otlp_file(path))
    assert sorted(result.imported) == sorted([ok, bad]) and result.spans == len(spans)
    for tid in (ok, bad):
        assert rows(other, tid) == rows(store, tid)
        a, b = load_trace(store, tid), load_trace(other, tid)
        assert store.get_run(tid).initial_state_hash == other.get_run(tid).initial_state_hash
        assert (a.name, a.status, a.input, a.output, a.span_id) == (
            b.name,
            b.status,
            b.input,
            b.output,
            b.span_id,
        )
        assert [
            (s.span_id, s.parent_position, s.step_type, s.status, s.attributes, s.error_type)
            for s in a.steps
        ] == [
            (s.span_id, s.parent_position, s.step_type, s.status, s.attributes, s.error_type)
            for s in b.steps
        ]
        assert abs(a.duration_ms - b.duration_ms) < 0.01
    assert (
        root_cause(load_trace(other, bad)).to_json() == root_cause(load_trace(store, bad)).to_json()
    )
    again = import_otlp(other, read_otlp_file(path))
    assert again.imported == [] and sorted(again.skipped) == sorted([ok, bad])


def test_burr_run_round_trip(rw: Rewind, other: Store, tmp_path: Path) -> None:
    run = rw.record(pipelines.pipeline, {"x": 5})
    path = tmp_path / "run.json"
    export_to_file(rw.store, [run.run_id], path)
    import_otlp(other, read_otlp_file(path))
    assert [(r[1], r[2], r[3], r[4]) for r in rows(other, run.run_id)] == [
        (r[1], r[2], r[3], r[4]) for r in rows(rw.store, run.run_id)
    ]
    imported = load_trace(other, run.run_id)
    assert imported.kind == "trace" and imported.input == {"x": 5}
    assert [s.step_type for s in imported.steps] == ["tool_call"] * 3
    assert Rewind(other).node_state(other.nodes_of(run.run_id)[-1]) == Rewind(rw.store).node_state(
        rw.store.nodes_of(run.run_id)[-1]
    )


def test_spans_follow_the_genai_conventions(store: Store) -> None:
    tid = record(store, "this will fail")
    mem = InMemorySpanExporter()
    assert export_runs(store, [tid[:8]], mem) == [tid]
    spans = {s.name: s for s in mem.get_finished_spans()}
    assert set(spans) == {"rag", "retrieve", "answer", "generate", "cache_write", "parse"}
    root = spans["rag"]
    assert f"{root.context.trace_id:032x}" == tid and root.parent is None
    gen = spans["generate"]
    a = gen.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "fake-model"
    assert a["gen_ai.usage.input_tokens"] == 11 and a["gen_ai.usage.output_tokens"] > 0
    assert a["gen_ai.response.finish_reasons"] == ("stop",)
    assert a["openinference.span.kind"] == "LLM" and a["llm.model_name"] == "fake-model"
    assert gen.parent.span_id == spans["answer"].context.span_id
    view = load_trace(store, tid)
    assert f"{gen.context.span_id:016x}" == view.find("generate").span_id
    assert spans["retrieve"].attributes["openinference.span.kind"] == "RETRIEVER"
    assert spans["cache_write"].attributes["gen_ai.operation.name"] == "execute_tool"
    parse = spans["parse"]
    assert parse.status.status_code == StatusCode.ERROR
    assert parse.events[0].name == "exception"
    assert parse.events[0].attributes["exception.type"] == "JSONDecodeError"
    assert root.status.status_code == StatusCode.ERROR
    assert gen.end_time - gen.start_time == pytest.approx(
        view.find("generate").duration_ms * 1e6, rel=1e-3, abs=2000
    )


def test_file_exporter_writes_json_lines(store: Store, other: Store, tmp_path: Path) -> None:
    a, b = record(store, "one"), record(store, "two")
    path = tmp_path / "lines.jsonl"
    exporter = OtlpJsonFileExporter(path)
    export_runs(store, [a], exporter)
    export_runs(store, [b], exporter)
    assert exporter.batches == 2 and len(path.read_text().splitlines()) == 2
    assert len(read_otlp_file(path)) == 2
    assert sorted(import_otlp(other, read_otlp_file(path)).imported) == sorted([a, b])


def test_bad_files_are_refused(tmp_path: Path, other: Store) -> None:
    bad = tmp_path / "bad.json"
    for content, words in (
        ("", "is empty"),
        ("{not json\n{", "not JSON"),
        ('{"hello": 1}', "no resourceSpans"),
    ):
        bad.write_text(content)
        with pytest.raises(RewindError, match=words):
            read_otlp_file(bad)
    with pytest.raises(RewindError, match="cannot read"):
        read_otlp_file(tmp_path / "missing.json")
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz", "spanId": "1"}]}]}]}
    result = import_otlp(other, [doc])  # a malformed span is rejected alone, with its field
    assert result.rejected == 1 and result.imported == []
    assert "traceId" in result.errors[0]


# -- foreign traces ----------------------------------------------------------------------------


def b64(hex_id: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_id)).decode()


def kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        v: dict[str, Any] = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    elif isinstance(value, list):
        v = {"arrayValue": {"values": [{"stringValue": x} for x in value]}}
    else:
        v = {"stringValue": value}
    return {"key": key, "value": v}


def span(
    tid: str,
    sid: str,
    parent: str | None,
    name: str,
    start: int,
    attrs: dict[str, Any],
    error: str | None = None,
    b64ids: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": b64(tid) if b64ids else tid,
        "spanId": b64(sid) if b64ids else sid,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(1_700_000_000_000_000_000 + start * 1_000_000),
        "endTimeUnixNano": str(1_700_000_000_000_000_000 + (start + 100) * 1_000_000),
        "attributes": [kv(k, v) for k, v in attrs.items()],
        "status": {"code": 2, "message": error} if error else {"code": 0},
    }
    if parent:
        out["parentSpanId"] = b64(parent) if b64ids else parent
    if error:
        etype, _, msg = error.partition(": ")
        out["events"] = [
            {
                "name": "exception",
                "timeUnixNano": out["endTimeUnixNano"],
                "attributes": [kv("exception.type", etype), kv("exception.message", msg)],
            }
        ]
    return out


def openinference_trace(
    tid: str, *, fail: bool, answer: str, b64ids: bool = False
) -> dict[str, Any]:
    root, ret, llm, parse = "a" * 15 + "1", "b" * 15 + "2", "c" * 15 + "3", "d" * 15 + "4"
    spans = [
        span(
            tid,
            parse,
            root,
            "parse_json",
            300,
            {"openinference.span.kind": "CHAIN", "input.value": answer},
            error="JSONDecodeError: Expecting value: line 1 column 1 (char 0)" if fail else None,
            b64ids=b64ids,
        ),
        span(
            tid,
            llm,
            root,
            "ChatOpenAI",
            200,
            {
                "openinference.span.kind": "LLM",
                "llm.model_name": "gpt-4o-mini",
                "llm.token_count.prompt": 812,
                "llm.token_count.completion": 9,
                "llm.input_messages.0.message.role": "system",
                "llm.input_messages.0.message.content": "Answer in JSON.",
                "llm.input_messages.1.message.role": "user",
                "llm.input_messages.1.message.content": "How many moons has Mars?",
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.content": answer,
            },
            b64ids=b64ids,
        ),
        span(
            tid,
            ret,
            root,
            "retriever",
            100,
            {
                "openinference.span.kind": "RETRIEVER",
                "input.value": "moons of mars",
                "retrieval.documents.0.document.content": "Mars has two moons.",
                "retrieval.documents.0.document.score": 0.42,
                "retrieval.documents.1.document.content": "Phobos and Deimos.",
                "retrieval.documents.1.document.score": 0.31,
            },
            b64ids=b64ids,
        ),
        span(
            tid,
            root,
            None,
            "moon_chain",
            0,
            {
                "openinference.span.kind": "CHAIN",
                "input.value": json.dumps({"question": "How many moons has Mars?"}),
                "input.mime_type": "application/json",
                "output.value": answer,
            },
            error="JSONDecodeError: Expecting value" if fail else None,
            b64ids=b64ids,
        ),
    ]
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [kv("service.name", "moon-service")]},
                "scopeSpans": [{"scope": {"name": "openinference"}, "spans": spans}],
            }
        ]
    }


def test_openinference_trace_imports_and_analyses(other: Store) -> None:
    t1, t2 = "1" * 32, "2" * 32
    docs = [
        openinference_trace(t1, fail=True, answer="", b64ids=True),
        openinference_trace(t2, fail=False, answer='{"moons": 2}'),
    ]
    result = import_otlp(other, docs)
    assert sorted(result.imported) == [t1, t2]
    view = load_trace(other, t1)
    assert view.name == "moon_chain" and view.status == "failed" and view.kind == "trace"
    assert view.input == {"question": "How many moons has Mars?"}
    assert view.config == {"kind": "trace", "source": "otlp", "service.name": "moon-service"}
    assert [s.name for s in view.steps] == ["retriever", "ChatOpenAI", "parse_json"]
    assert [s.step_type for s in view.steps] == ["retrieval", "llm_call", "transform"]
    llm = view.find("ChatOpenAI")
    assert llm.model == "gpt-4o-mini"
    assert (llm.prompt_tokens, llm.completion_tokens) == (812, 9)
    assert llm.input["messages"][1]["content"] == "How many moons has Mars?"
    assert llm.output == "" and llm.duration_ms == pytest.approx(100.0)
    ret = view.find("retriever")
    assert ret.attributes["scores"] == [0.42, 0.31] and len(ret.output) == 2
    assert view.find("parse_json").error_type == "JSONDecodeError"
    report = inspect_trace(view)
    found = {s.step.name: [f.code for f in s.findings] for s in report.steps}
    assert "low_scores" in found["retriever"] and "few_results" in found["retriever"]
    assert found["ChatOpenAI"] == ["empty_response", "not_replayable"]  # no invocation params
    rc = root_cause(view)
    assert rc.pattern == "empty_response" and rc.failing_step["name"] == "parse_json"
    failures = analyze_failures([view, load_trace(other, t2)])
    assert failures.counts() == {"empty_response": 1}
    diff = compare_traces(view, load_trace(other, t2))
    rows = {r["name"]: r["status"] for r in diff["nodes"]}
    assert rows == {"retriever": "equal", "ChatOpenAI": "changed", "parse_json": "changed"}
    assert Rewind(other).diff(t1, t2).first_divergence.name == "ChatOpenAI"


def test_genai_attributes_map_to_model_tokens_and_finish(other: Store) -> None:
    tid, sid = "3" * 32, "4" * 16
    doc = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            span(
                                tid,
                                sid,
                                None,
                                "chat gpt-4.1",
                                0,
                                {
                                    "gen_ai.operation.name": "chat",
                                    "gen_ai.request.model": "gpt-4.1",
                                    "gen_ai.usage.input_tokens": 120,
                                    "gen_ai.usage.output_tokens": 4000,
                                    "gen_ai.response.finish_reasons": ["length"],
                                    "gen_ai.input.messages": json.dumps(
                                        [
                                            {
                                                "role": "user",
                                                "parts": [{"type": "text", "content": "hi"}],
                                            }
                                        ]
                                    ),
                                    "gen_ai.output.messages": json.dumps(
                                        [
                                            {
                                                "role": "assistant",
                                                "parts": [{"type": "text", "content": "long…"}],
                                            }
                                        ]
                                    ),
                                },
                            )
                        ]
                    }
                ]
            }
        ]
    }
    import_otlp(other, [doc])
    view = load_trace(other, tid)
    assert len(view.steps) == 1  # a lone root span is the chain and its one step
    s = view.steps[0]
    assert s.step_type == "llm_call" and s.model == "gpt-4.1"
    assert (s.prompt_tokens, s.completion_tokens) == (120, 4000)
    assert s.attributes["finish_reason"] == "length" and s.output == "long…"
    assert "truncated_output" in [f.code for f in inspect_trace(view).steps[0].findings]


def test_receiver_waits_for_the_root_span(other: Store) -> None:
    tid = "5" * 32
    doc = openinference_trace(tid, fail=False, answer='{"moons": 2}')
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    first = {"resourceSpans": [{"scopeSpans": [{"spans": spans[:3]}]}]}
    last = {"resourceSpans": [{"scopeSpans": [{"spans": spans[3:]}]}]}
    receiver = OtlpReceiver(other)
    assert receiver.receive_json(json.dumps(first).encode()) == {}
    assert receiver.waiting == 3 and search_runs(other)[1] == 0
    assert receiver.receive_json(json.dumps(last).encode()) == {}
    assert receiver.waiting == 0 and receiver.last_imported == [tid]
    late = receiver.receive_json(json.dumps(last).encode())
    assert late["partialSuccess"]["rejectedSpans"] == 1
    with pytest.raises(RewindError, match="not JSON"):
        receiver.receive_json(b"{")
