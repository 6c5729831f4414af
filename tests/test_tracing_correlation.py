"""Correlation analysis of failures (seed 003): a corpus with a planted correlation — calls
fail only above 4,000 input tokens, whatever the model — that the analysis must find, and a
dimension without one that it must not flag."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rewind.api import create_app
from rewind.errors import InvalidOverride
from rewind.store import Store, open_store
from rewind.tracing.correlation import correlate_failures
from rewind.tracing.model import StepData, TraceData
from rewind.tracing.store import load_traces, write_trace

N = 40


def planted(i: int) -> TraceData:
    tokens = i * 250 + 100  # 100 .. 9850 tokens, never exactly 4,000
    fails = tokens > 4000
    model = "model-a" if i % 2 else "model-b"  # uncorrelated with failure
    answer = StepData(
        1,
        "answer",
        "llm_call",
        "failed" if fails else "success",
        inputs={"question": f"q{i}"},
        fields=None if fails else {"answer": f"a{i}"},
        error_type="BadRequest" if fails else None,
        error_message="context length exceeded" if fails else None,
        prompt_tokens=tokens,
        attributes={"model": model},
    )
    return TraceData(
        trace_id=f"{i:032x}",
        name="qa",
        status="failed" if fails else "success",
        input={"question": f"q{i}"},
        started_at=1_700_000_000 + i,
        ended_at=1_700_000_001 + i,
        steps=[StepData(0, "retrieve", "retrieval", fields={"retrieve": ["doc"]}), answer],
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(tmp_path / "store")
    for i in range(N):
        write_trace(s, planted(i))
    yield s
    s.close()


def test_the_planted_input_length_correlation_is_found(store: Store) -> None:
    views = load_traces(store, [f"{i:032x}" for i in range(N)])
    length, model, step_type = correlate_failures(views, ["input_length", "model", "step_type"])
    groups = {g.key: (g.total, g.failed) for g in length.groups}
    assert groups == {
        "0-499 tokens": (2, 0),
        "500-999 tokens": (2, 0),
        "1000-1999 tokens": (4, 0),
        "2000-3999 tokens": (8, 0),
        "4000-7999 tokens": (16, 16),
        "8000-15999 tokens": (8, 8),
    }
    assert [g.key for g in length.findings()] == ["4000-7999 tokens", "8000-15999 tokens"]
    assert length.to_json()["findings"][0] == (
        "input_length 4000-7999 tokens: 16/16 traces failed (100% vs 60% overall)"
    )
    assert all(e in {f"{i:032x}" for i in range(16, 40)} for e in length.groups[4].examples)
    doc = length.to_json()
    assert doc["edges"] == [0, 500, 1000, 2000, 4000, 8000, 16000, 32000]
    assert doc["finding_rate"] == 0.8 and doc["min_failures"] == 2  # halfway from 60 % to 100 %
    assert [g["key"] for g in doc["groups"] if g["finding"]] == [
        "4000-7999 tokens",
        "8000-15999 tokens",
    ]
    assert "edges" not in model.to_json() and model.to_json()["finding_rate"] == 0.8
    assert model.unit == "steps" and model.findings() == []  # half of each model fails
    assert {g.key: g.failed for g in model.groups} == {"model-a": 12, "model-b": 12}
    assert {g.key: (g.total, g.failed) for g in step_type.groups} == {
        "llm_call": (40, 24),
        "retrieval": (40, 0),
    }


def test_unknown_dimension_is_refused(store: Store) -> None:
    with pytest.raises(InvalidOverride, match="use --by with one of"):
        correlate_failures([], ["colour"])


def test_failures_by_command_and_api(store: Store, tmp_path: Path) -> None:
    from rewind.cli import app

    folder = str(tmp_path / "store")
    out = CliRunner().invoke(app, ["--store", folder, "failures", "--by", "input_length"])
    assert out.exit_code == 0, out.output
    assert "failure rate by input_length" in out.output
    assert "failures concentrate: input_length 4000-7999 tokens: 16/16" in out.output
    out = CliRunner().invoke(app, ["--store", folder, "failures", "--by", "model", "--json"])
    (corr,) = json.loads(out.output)["correlations"]
    assert corr["dimension"] == "model" and corr["findings"] == []
    bad = CliRunner().invoke(app, ["--store", folder, "failures", "--by", "nope"])
    assert bad.exit_code == 2 and "cannot group failures by 'nope'" in bad.output
    with TestClient(
        create_app(store, chat_client=None, pipelines={}, token=None), base_url="http://127.0.0.1"
    ) as client:
        r = client.get("/api/traces/failures", params={"by": ["input_length", "params"]})
        assert r.status_code == 200, r.text
        dims = {c["dimension"]: c for c in r.json()["correlations"]}
        assert dims["input_length"]["findings"][1].startswith("input_length 8000-15999 tokens")
        assert client.get("/api/traces/failures", params={"by": "nope"}).status_code == 422


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50_000), st.booleans()), min_size=1, max_size=30))
def test_groups_partition_the_corpus(rows: list[tuple[int, bool]]) -> None:
    from rewind.tracing.model import StepView, TraceView

    views = []
    for i, (tokens, failed) in enumerate(rows):
        step = StepView.__new__(StepView)
        object.__setattr__(step, "step_type", "llm_call")
        object.__setattr__(step, "prompt_tokens", tokens)
        view = TraceView.__new__(TraceView)
        object.__setattr__(view, "steps", (step,))
        object.__setattr__(view, "trace_id", str(i))
        object.__setattr__(view, "status", "failed" if failed else "success")
        views.append(view)
    (c,) = correlate_failures(views, ["input_length"])
    assert c.total == len(rows) and c.failed == sum(f for _, f in rows)
    for g in c.findings():
        assert g.failed >= 2 and g.rate > c.rate
