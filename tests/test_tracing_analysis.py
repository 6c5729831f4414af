"""Failure patterns, step inspection, root cause and output comparison.

The failure analysis runs on a generated corpus of 240 traces of a real traced chain (retrieve →
generate → parse → enrich → check) whose fake model and tools inject every failure pattern in
known numbers: the analysis must report exactly those counts.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rewind.calls import chat
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.replay import ParamOverride, Rewind
from rewind.store import Store, open_store
from rewind.tracing import Tracer, step
from rewind.tracing.failures import (
    analyze_failures,
    classify_error,
    error_signature,
    failing_step,
)
from rewind.tracing.inspect import (
    InspectionSettings,
    compare_outputs,
    compare_traces,
    inspect_step,
    inspect_trace,
)
from rewind.tracing.rootcause import root_cause, summarize_value
from rewind.tracing.store import load_trace, load_traces, search_runs
from tests import pipelines

ANALYSIS = Tracer()
OTHER = Tracer()


@ANALYSIS.step("retrieve", "retrieval")
def retrieve_docs(question: str, mode: str) -> list[dict[str, Any]]:
    if mode == "timeout":
        raise TimeoutError("vector search timed out after 30 s")
    n = 1 if mode == "few" else 4
    return [{"id": f"d{i}", "score": round(0.8 - 0.1 * i, 2)} for i in range(n)]


@ANALYSIS.chain("support")
def support(question: str, mode: str, n: int) -> dict[str, Any]:
    docs = retrieve_docs(question, mode)
    with step("generate", "llm_call", input={"question": question, "docs": docs}) as s:
        reply = chat(
            [{"role": "user", "content": f"[{mode}] {question}"}], temperature=0, max_tokens=64
        )
        s.set_output(reply.content)
    with step("parse", "parse", input=reply.content) as s:
        data = json.loads(reply.content)
        s.set_output(data)
    with step("enrich", "transform", input=data) as s:
        if mode == "keyerror":
            raise KeyError(f"customer_{n}")
        if mode == "valueerror":
            raise ValueError(f"invalid quantity {n} for order {1000 + n}")
        s.set_output(data | {"n": n})
    with step("check", "validate", input=data) as s:
        s.set_output({"valid": True})
    return data


@OTHER.chain("other")
def other(question: str) -> str:
    with step("lookup", "tool_call", input=question):
        raise TimeoutError("lookup timed out")


def corpus_model(request: httpx.Request) -> httpx.Response:
    """The corpus's fake model: the mode marker in the prompt decides the answer."""
    body = json.loads(request.content)
    prompt = body["messages"][-1]["content"]
    mode = prompt[1 : prompt.index("]")]
    if mode == "rate":
        return httpx.Response(429, json={"error": {"message": "Rate limit reached for requests"}})
    if mode == "overflow":
        return httpx.Response(
            400,
            json={
                "error": {
                    "message": "This model's maximum context length is 8192 tokens. However, "
                    "your messages resulted in 9120 tokens."
                }
            },
        )
    content, finish = '{"answer": "ok"}', "stop"
    if mode == "empty":
        content = ""
    elif mode == "prose":
        content = 'Here is the JSON you asked for: {"answer": 42}'
    elif mode == "fence":
        content = '```json\n{"answer": 42}\n```'
    elif mode == "length":
        content, finish = '{"answer": "ok"}', "length"
    payload = {
        "model": body.get("model"),
        "choices": [
            {"message": {"role": "assistant", "content": content}, "finish_reason": finish}
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 5},
    }
    return httpx.Response(200, json=payload)


MODES = {
    "ok": 120,
    "few": 11,
    "prose": 16,
    "fence": 14,
    "timeout": 20,
    "rate": 15,
    "overflow": 12,
    "empty": 10,
    "keyerror": 13,
    "valueerror": 9,
}
EXPECTED = {
    "parse_failure": 30,
    "timeout": 20,
    "rate_limit": 15,
    "context_overflow": 12,
    "empty_response": 10,
    "cluster:KeyError: <str>": 13,
    "cluster:ValueError: invalid quantity <n> for order <n>": 9,
}
OLD_RATE_LIMITED = 8
OTHER_TIMEOUTS = 6


class Corpus:
    def __init__(self, store: Store, ids: dict[str, list[str]], client: ChatClient) -> None:
        self.store = store
        self.ids = ids
        self.client = client

    def mode_of(self, trace_id: str) -> str:
        return next(m for m, ids in self.ids.items() if trace_id in ids)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corpus]:
    store = open_store(tmp_path_factory.mktemp("corpus") / "store")
    client = ChatClient(
        Endpoint(base_url="http://fake.test/v1", model="fake-model"),
        transport=httpx.MockTransport(corpus_model),
        retry=RetryPolicy(attempts=1),
    )
    ANALYSIS.configure(store=store, chat_client=client)
    OTHER.configure(store=store, chat_client=client)
    modes = [m for m, n in MODES.items() for _ in range(n)]
    random.Random(7).shuffle(modes)
    ids: dict[str, list[str]] = {m: [] for m in MODES}

    def record(mode: str, i: int) -> None:
        with contextlib.suppress(Exception):
            support(f"question {i}", mode, i)
        runs, _ = search_runs(store, name="support", limit=1)
        ids[mode].append(runs[0].run_id)

    for i, mode in enumerate(modes):
        record(mode, i)
    # Older failures (10 days ago) and another chain's failures, for the filters.
    real_clock = ANALYSIS.clock
    ANALYSIS.clock = lambda: time.time() - 10 * 86400
    ids["old_rate"] = []
    for i in range(OLD_RATE_LIMITED):
        with contextlib.suppress(Exception):
            support(f"old {i}", "rate", i)
        ids["old_rate"].append(
            search_runs(store, name="support", until=time.time() - 86400, limit=1)[0][0].run_id
        )
    ANALYSIS.clock = real_clock
    for i in range(OTHER_TIMEOUTS):
        with pytest.raises(TimeoutError):
            other(f"q{i}")
    yield Corpus(store, ids, client)
    client.close()
    store.close()


def support_views(store: Store, **filters: Any) -> list[Any]:
    runs, _ = search_runs(store, limit=10_000, **filters)
    return load_traces(store, [r.run_id for r in runs])


def test_corpus_has_at_least_200_traces(corpus: Corpus) -> None:
    _runs, total = search_runs(corpus.store, kind="trace", limit=1)
    assert total == sum(MODES.values()) + OLD_RATE_LIMITED + OTHER_TIMEOUTS
    assert sum(MODES.values()) >= 200


def test_failure_counts_are_exactly_the_injected_ones(corpus: Corpus) -> None:
    report = analyze_failures(
        support_views(corpus.store, name="support", since=time.time() - 86400)
    )
    assert report.total_traces == sum(MODES.values())
    assert report.failed_traces == sum(EXPECTED.values())
    assert report.counts() == EXPECTED
    by_name = {
        p.pattern if p.signature is None else f"cluster:{p.signature}": p for p in report.patterns
    }
    injected = {
        "parse_failure": ("prose", "fence"),
        "timeout": ("timeout",),
        "rate_limit": ("rate",),
        "context_overflow": ("overflow",),
        "empty_response": ("empty",),
        "cluster:KeyError: <str>": ("keyerror",),
        "cluster:ValueError: invalid quantity <n> for order <n>": ("valueerror",),
    }
    for name, modes in injected.items():
        pattern = by_name[name]
        expected_ids = {i for m in modes for i in corpus.ids[m]}
        assert set(pattern.trace_ids) == expected_ids
        assert len(pattern.examples()) == 5
        assert set(pattern.examples()) <= expected_ids
        assert pattern.suggested_fix
    assert dict(by_name["timeout"].steps) == {"retrieve": 20}
    assert dict(by_name["empty_response"].steps) == {"generate": 10}  # the LLM step, not parse
    assert dict(by_name["parse_failure"].steps) == {"parse": 30}
    assert dict(by_name["rate_limit"].steps) == {"generate": 15}
    # most frequent first
    assert [p.count for p in report.patterns] == sorted(
        (p.count for p in report.patterns), reverse=True
    )
    as_json = report.to_json()
    assert as_json["failed_traces"] == sum(p["count"] for p in as_json["patterns"])


def test_filters_by_name_and_time(corpus: Corpus) -> None:
    every_support = analyze_failures(support_views(corpus.store, name="support"))
    assert every_support.counts()["rate_limit"] == EXPECTED["rate_limit"] + OLD_RATE_LIMITED
    recent_all = analyze_failures(support_views(corpus.store, since=time.time() - 7 * 86400))
    assert recent_all.counts()["timeout"] == EXPECTED["timeout"] + OTHER_TIMEOUTS
    old_only = analyze_failures(support_views(corpus.store, until=time.time() - 86400))
    assert old_only.counts() == {"rate_limit": OLD_RATE_LIMITED}


def test_error_signatures_and_rules() -> None:
    assert error_signature("KeyError", "'customer_17'") == "KeyError: <str>"
    assert error_signature("ValueError", "bad id 3f2a9b8c1d at /tmp/a/b.json") == (
        "ValueError: bad id <hex> at <path>"
    )
    assert error_signature("E", "see https://x.y/z for 12.5 units of user_42") == (
        "E: see <url> for <n> units of <id>"
    )
    assert classify_error("ReadTimeout", "") == "timeout"
    assert classify_error("ModelCallError", "HTTP 429: slow down") == "rate_limit"
    assert classify_error("BadRequest", "context_length_exceeded") == "context_overflow"
    assert classify_error("JSONDecodeError", "Expecting value") == "parse_failure"
    assert classify_error("ValueError", "model returned an empty response") == "empty_response"
    assert classify_error("KeyError", "'x'") is None


# -- root cause --------------------------------------------------------------------------------


def test_root_cause_of_an_empty_response(corpus: Corpus) -> None:
    tid = corpus.ids["empty"][0]
    view = load_trace(corpus.store, tid, payloads=True)
    assert failing_step(view).name == "parse"
    rc = root_cause(view)
    assert rc.failed and rc.pattern == "empty_response"
    assert rc.failing_step["name"] == "parse" and rc.failing_step["number"] == 3
    assert rc.error.startswith("JSONDecodeError: Expecting value")
    assert [(p["name"], p["status"]) for p in rc.previous_steps] == [
        ("retrieve", "success"),
        ("generate", "success"),
    ]
    assert all(p["duration_ms"] >= 0 for p in rc.previous_steps)
    assert any("generate" in u and "empty" in u for u in rc.upstream)
    assert rc.input_summary["type"] == "string" and rc.input_summary["chars"] == 0
    assert any("empty" in s for s in rc.suggestions)
    assert rc.replay_command == f"rewind replay-trace {tid} --set input.mode=VALUE"
    assert rc.fork_command is None


def test_root_cause_of_a_rate_limit_and_a_parse_failure(corpus: Corpus) -> None:
    rc = root_cause(load_trace(corpus.store, corpus.ids["rate"][0], payloads=True))
    assert rc.pattern == "rate_limit" and rc.failing_step["name"] == "generate"
    assert any("backoff" in s for s in rc.suggestions)
    rc = root_cause(load_trace(corpus.store, corpus.ids["prose"][0], payloads=True))
    assert rc.pattern == "parse_failure"
    assert any("preamble" in s for s in rc.suggestions)
    rc = root_cause(load_trace(corpus.store, corpus.ids["fence"][0], payloads=True))
    assert any("code fence" in s for s in rc.suggestions)


def test_root_cause_of_a_trace_that_did_not_fail(corpus: Corpus) -> None:
    rc = root_cause(load_trace(corpus.store, corpus.ids["ok"][0]))
    assert not rc.failed and rc.status == "success" and rc.failing_step is None


def test_root_cause_of_a_burr_run_gives_the_fork_command(rw: Rewind) -> None:
    run = rw.record(pipelines.failing, {"x": 1})
    assert run.status == "failed"
    rc = root_cause(load_trace(rw.store, run.run_id, payloads=True))
    assert rc.kind == "run" and rc.pattern == "cluster"
    assert rc.failing_step["name"] == "boom" and rc.failing_step["error_type"] == "RuntimeError"
    assert rc.fork_command == f"rewind fork {run.run_id} --at boom"
    assert any("--set boom.fail=VALUE" in s for s in rc.suggestions)
    assert [p["name"] for p in rc.previous_steps] == ["prepare"]
    # the command it prints does re-run from the failing node
    child = rw.fork(run.run_id, at="boom", override=ParamOverride("boom", "fail", False))
    assert child.status == "completed"


# -- inspection --------------------------------------------------------------------------------


def codes(inspection: Any) -> list[str]:
    return [f.code for f in inspection.findings]


def test_inspection_of_corpus_steps(corpus: Corpus) -> None:
    prose = load_trace(corpus.store, corpus.ids["prose"][0], payloads=True)
    parse = inspect_step(prose.find("parse"))
    assert codes(parse) == ["parse_failure"]
    assert parse.findings[0].severity == "error"
    assert "preamble" in parse.findings[0].suggestion
    few = load_trace(corpus.store, corpus.ids["few"][0], payloads=True)
    assert "few_results" in codes(inspect_step(few.find("retrieve")))
    empty = load_trace(corpus.store, corpus.ids["empty"][0], payloads=True)
    gen = inspect_step(empty.find("generate"))
    assert codes(gen) == ["empty_response"]
    assert gen.summary["model"] == "fake-model" and gen.summary["prompt_tokens"] == 20
    timeout = load_trace(corpus.store, corpus.ids["timeout"][0], payloads=True)
    report = inspect_trace(timeout)
    assert report.counts()["error"] == 1
    assert report.steps[0].findings[0].code == "step_failed"
    assert "timeout" in report.steps[0].findings[0].suggestion


def test_llm_checks_and_settings(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    t = Tracer(store)
    with t.trace("llm_checks") as tr:
        with step("empty_prompt", "llm_call", input={"prompt": "   "}) as s:
            s.set_output("something")
        with step("long", "llm_call", input={"prompt": "x" * 4000}) as s:
            s.set(model="tiny-model", finish_reason="length")
            s.set_output("I'm sorry, but I cannot help with that.")
        with step(
            "huge", "llm_call", input={"messages": [{"role": "user", "content": "y" * 40}]}
        ) as s:
            s.set(model="tiny-model")
            s.set_tokens(prompt=1200, completion=3)
            s.set_output("ok")
    view = load_trace(store, tr.trace_id)
    default = inspect_trace(view)
    assert codes(default.steps[0]) == ["empty_prompt"]
    long_codes = codes(default.steps[1])
    assert "truncated_output" in long_codes and "refusal" in long_codes
    assert "context_near_limit" not in long_codes  # ~1000 tokens of an 8192 default window
    tight = InspectionSettings().with_overrides(
        {"context_windows": "tiny-model:1100", "slow_llm_ms": "0", "refusal_markers": "nothing"}
    )
    report = inspect_trace(view, settings=tight)
    assert "context_near_limit" in codes(report.steps[1])  # 1000 of 1100 tokens
    assert "refusal" not in codes(report.steps[1])
    assert "context_overflow" in codes(report.steps[2])  # 1200 recorded tokens > 1100
    assert all("slow_response" in codes(s) for s in report.steps)
    one = inspect_trace(view, step="huge", settings=tight)
    assert [s.step.name for s in one.steps] == ["huge"]
    with pytest.raises(LookupError, match="no step 'nope'"):
        inspect_trace(view, step="nope")
    with pytest.raises(Exception, match="unknown setting"):
        InspectionSettings().with_overrides({"nope": 1})
    with pytest.raises(Exception, match="cannot be"):
        InspectionSettings().with_overrides({"slow_llm_ms": "fast"})
    store.close()


def test_retrieval_tool_parse_and_validate_checks(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    t = Tracer(store)
    with t.trace("checks") as tr:
        with step("none_found", "retrieval", input="q") as s:
            s.set_output([])
        with step("weak", "retrieval", input="q") as s:
            s.set_output(
                {
                    "documents": [
                        {"text": "a", "score": 0.2},
                        {"text": "b", "score": 0.3},
                        {"text": "c", "score": 0.1},
                    ]
                }
            )
        for name, exc in (
            ("slow_tool", TimeoutError("the call timed out")),
            ("ghost_tool", LookupError("unknown tool 'ghost'")),
            ("bad_args", TypeError("search() got an unexpected keyword argument 'q'")),
        ):
            try:
                with step(name, "tool_call", input={"q": 1}):
                    raise exc
            except Exception:
                pass
        try:
            with step("parse_cut", "parse", input='{"a": [1, 2'):
                json.loads('{"a": [1, 2')
        except json.JSONDecodeError:
            pass
        with step("validate", "validate", input={"x": 1}) as s:
            s.set_output({"valid": False})
        with step("rogue", "tool_call", input={"q": 1}, tool="web_fetch") as s:
            s.set_output("page")
    view = load_trace(store, tr.trace_id)
    found = {s.step.name: codes(s) for s in inspect_trace(view).steps}
    assert found["none_found"] == ["no_results"]
    assert set(found["weak"]) == {"low_scores"}
    assert found["slow_tool"] == ["tool_timeout"]
    assert found["ghost_tool"] == ["unknown_tool"]
    assert found["bad_args"] == ["invalid_arguments"]
    assert found["parse_cut"] == ["parse_failure"]
    cut = inspect_trace(view, step="parse_cut").steps[0].findings[0]
    assert "cut off" in cut.suggestion
    assert found["validate"] == ["validation_rejected"]
    assert found["rogue"] == []
    known = InspectionSettings(known_tools=("search",))
    rogue = inspect_trace(view, step="rogue", settings=known).steps[0]
    assert codes(rogue) == ["unknown_tool"] and rogue.findings[0].severity == "warning"
    store.close()


# -- output comparison -------------------------------------------------------------------------


def test_compare_outputs_reuses_the_diff() -> None:
    same = compare_outputs({"a": 1, "b": [1, 2]}, {"a": 1, "b": [1, 2]})
    assert same.equal and same.similarity == 1.0 and not same.differences
    # Key order is part of a stored dict (rewind.serde), so the hasher and the diff see it.
    reordered = compare_outputs({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1})
    assert not reordered.equal and 0.99 < reordered.similarity < 1.0
    assert [c.kind for c in reordered.differences] == ["reordered"]
    typed = compare_outputs({"a": 1}, {"a": 1.0})
    assert not typed.equal and typed.differences[0].kind == "type_changed"
    text = compare_outputs("the quick brown fox", "the quick brown cat")
    assert 0.7 < text.similarity < 1.0
    fields = compare_outputs({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4})
    assert [(c.path, c.kind) for c in fields.differences] == [("b", "changed"), ("c", "added")]
    assert fields.to_json()["similarity"] == pytest.approx(1 / 3)


def test_compare_traces_step_by_step(corpus: Corpus) -> None:
    a = load_trace(corpus.store, corpus.ids["ok"][0])
    b = load_trace(corpus.store, corpus.ids["ok"][1])
    out = compare_traces(a, b)
    assert out["first_divergence"] is not None
    rows = {r["name"]: r for r in out["nodes"]}
    assert rows["retrieve"]["status"] == "equal" and rows["retrieve"]["similarity"] == 1.0
    assert rows["enrich"]["status"] == "changed" and rows["enrich"]["similarity"] < 1.0
    assert out["output"]["equal"] is True


def test_summaries() -> None:
    s = summarize_value(
        {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]}
    )
    assert s["type"] == "object" and s["messages"] == 2 and s["roles"] == ["system", "user"]
    assert summarize_value("a\nb")["lines"] == 2
    assert summarize_value([1, 2, 3])["items"] == 3


def test_a_burr_llm_run_is_inspected_from_its_recorded_calls(rw_llm: Rewind) -> None:
    run = rw_llm.record(pipelines.llm_pipeline, {"question": "why?"})
    view = load_trace(rw_llm.store, run.run_id, payloads=True)
    assert view.kind == "run"
    assert [s.step_type for s in view.steps] == ["llm_call", "transform"]
    ask = view.find("ask")
    assert ask.model == "fake-model" and ask.attributes["finish_reason"] == "stop"
    assert ask.llm_calls[0].messages[1]["content"] == "why?"
    tight = InspectionSettings(context_windows={"fake-model": 10})
    found = {s.step.name: codes(s) for s in inspect_trace(view, settings=tight).steps}
    assert found == {"ask": ["context_overflow"], "shout": []}  # 11 prompt tokens > 10
    summary = inspect_trace(view).steps[0].summary
    assert summary["prompt_tokens"] == 11 and summary["finish_reason"] == "stop"
