"""The API's response models (``rewind.api.models``) against what the routes serve, and the UI's
TypeScript types generated from the OpenAPI document.

A real SQLite store holding a research run and a param fork of it (the fake OpenAI-compatible
model of conftest), a run whose node makes many calls with long prompts (cut bodies), a failed
run, an imported third-party trace and failed traces; the real app (TestClient). Each typed
route's body must validate into its model with every key declared (a key a view adds that its
model lacks would be served, but untyped for the UI), and must equal the domain's own JSON where
the route only passes it on (the model drops and adds nothing).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, TypeAdapter

from rewind.api import create_app
from rewind.api import models as m
from rewind.api.openapi import openapi_text
from rewind.api.pipelines import PipelineEntry, research_entry
from rewind.api.reports import (
    AuditReportModel,
    GridJob,
    JobList,
    LiveForkResource,
    StabilityJob,
)
from rewind.api.schemas import RunAccepted
from rewind.examples import research
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.replay import ParamOverride, Rewind
from rewind.store import open_store
from rewind.tracing.store import load_trace
from tests import pipelines
from tests.conftest import FAKE_BASE_URL, FAKE_MODEL, FakeModel
from tests.test_api_calls import chatty

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "web"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    client = ChatClient(
        Endpoint(base_url=FAKE_BASE_URL, model=FAKE_MODEL),
        transport=httpx.MockTransport(FakeModel().handler),
        retry=RetryPolicy(attempts=1),
    )
    store = open_store(tmp_path_factory.mktemp("api-models") / "store")
    rw = Rewind(store, chat_client=client)
    parent = rw.record(research.build(), research.initial_state(), config={"model": FAKE_MODEL})
    assert parent.status == "completed", parent.error
    analyse = store.nodes_of(parent.run_id)[2].name
    fork = rw.fork(parent.run_id, at=3, override=ParamOverride(analyse, "group_by", "month"))
    assert fork.status == "completed", fork.error
    calls = rw.record(chatty, {"question": "why?"})
    assert calls.status == "completed", calls.error
    failed = rw.record(pipelines.failing, {"x": 1})
    assert failed.status == "failed"
    from rewind.tracing.otel import import_otlp
    from rewind.tracing.store import write_trace
    from tests.test_tracing_correlation import planted

    otel = json.loads((ROOT / "tests/data/otel/openinference_openai.json").read_text())
    imported = import_otlp(store, [otel])
    assert imported.errors == [] and len(imported.imported) == 1
    for i in range(12, 24):
        write_trace(store, planted(i))
    app = create_app(
        store,
        chat_client=client,
        pipelines={
            "research": research_entry(),
            "failing": PipelineEntry.of(pipelines.failing, {"x": 1}),
        },
    )
    with TestClient(app) as c:
        yield {
            "client": c,
            "store": store,
            "rw": rw,
            "parent": parent.run_id,
            "fork": fork.run_id,
            "calls": calls.run_id,
            "failed": failed.run_id,
            "trace": imported.imported[0],
        }
    store.close()
    client.close()


def undeclared(value: Any, where: str = "") -> list[str]:
    """Paths of keys a validated model kept without declaring them (its ``model_extra``)."""
    out: list[str] = []
    if isinstance(value, BaseModel):
        out += [f"{where}.{key} ({type(value).__name__})" for key in value.model_extra or {}]
        for name in type(value).model_fields:
            out += undeclared(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            out += undeclared(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            out += undeclared(item, f"{where}.{key}")
    return out


def typed_get(c: TestClient, model: Any, path: str, **params: Any) -> Any:
    """GET ``path``; assert 200, a body every key of which ``model`` (a model, or a type such
    as ``list[Model]``) declares, served unchanged by it (validated and dumped as the route
    does)."""
    r = c.get(path, params=params)
    assert r.status_code == 200, (path, r.text)
    body = r.json()
    adapter = TypeAdapter(model)
    parsed = adapter.validate_python(body)
    missing = undeclared(parsed)
    assert not missing, f"{path}: keys served that {model} does not declare: {missing}"
    assert adapter.dump_python(parsed, mode="json", exclude_unset=True) == body
    return body


def test_every_typed_route_serves_only_declared_keys(served: dict[str, Any]) -> None:
    c, store = served["client"], served["store"]
    runs = typed_get(c, m.RunsResponse, "/api/runs")
    assert len(runs["runs"]) >= 4 and runs["tree"]
    typed_get(c, m.RunsResponse, "/api/runs", include_sub_runs=True, status=["failed"])
    typed_get(c, m.Settings, "/api/settings")
    typed_get(c, m.PipelineList, "/api/pipelines")
    typed_get(c, m.Health, "/api/health")
    for key in ("parent", "fork", "calls", "failed"):
        rid = served[key]
        detail = typed_get(c, m.RunDetail, f"/api/runs/{rid}")
        assert detail["run_id"] == rid
        typed_get(c, m.Graph, f"/api/runs/{rid}/graph")
        typed_get(c, m.NodeList, f"/api/runs/{rid}/nodes")
        typed_get(c, m.ArtifactList, f"/api/runs/{rid}/artifacts")
        typed_get(c, m.Progress, f"/api/runs/{rid}/progress")
        for n in store.nodes_of(rid):
            number = n.position + 1
            typed_get(c, m.NodeDetail, f"/api/runs/{rid}/nodes/{number}")
            typed_get(c, m.NodeCalls, f"/api/runs/{rid}/nodes/{number}/calls", limit=500)
            typed_get(c, m.NodeInput, f"/api/runs/{rid}/nodes/{number}/input")
            typed_get(c, m.NodeOutput, f"/api/runs/{rid}/nodes/{number}/output")
            typed_get(c, m.NodeState, f"/api/runs/{rid}/nodes/{number}/state")
    parent, fork = served["parent"], served["fork"]
    assert typed_get(c, m.RunDetail, f"/api/runs/{fork}")["ancestors"][0]["run_id"] == parent
    typed_get(c, m.Cost, f"/api/runs/{fork}/cost")
    typed_get(c, m.Cost, f"/api/runs/{fork}/cost", against=served["calls"])
    typed_get(c, m.Diff, "/api/diff", a=parent, b=fork)
    typed_get(c, m.TracesResponse, "/api/traces", limit=100)
    typed_get(c, m.TraceDetail, f"/api/traces/{served['trace']}")
    typed_get(c, m.TraceDetail, f"/api/traces/{parent}")
    typed_get(c, m.TraceCompare, f"/api/traces/{parent}/compare/{fork}")
    typed_get(c, m.FailuresResponse, "/api/traces/failures")
    failures = typed_get(
        c, m.FailuresResponse, "/api/traces/failures", by=["input_length", "model"]
    )
    assert failures["failed_traces"] > 0 and failures["correlations"]
    audit = typed_get(c, AuditReportModel, f"/api/runs/{parent}/audit")
    assert audit["run_id"] == parent
    typed_get(c, list[LiveForkResource], f"/api/runs/{parent}/live-fork-resources", at=1)
    r = c.delete(f"/api/runs/{served['failed']}", params={"dry_run": True})
    assert r.status_code == 200, r.text
    deleted = m.RunDeleted.model_validate(r.json())
    assert not undeclared(deleted) and deleted.dry_run and deleted.rows > 0
    assert store.run_exists(served["failed"])


def _job(c: TestClient, path: str, body: dict[str, Any]) -> str:
    """Submit a grid or stability job and wait for it; its GET path."""
    r = c.post(path, json=body)
    assert r.status_code == 202, r.text
    location = r.headers["location"]
    deadline = time.monotonic() + 300
    while c.get(location).json()["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, f"{location} did not finish"
        time.sleep(0.05)
    return location


def test_grid_and_stability_jobs_serve_only_declared_keys(served: dict[str, Any]) -> None:
    """The jobs the UI's grid and stability panels read (``Job<GridReport>``,
    ``Job<StabilityReport>``): every key of the job and of its report is declared."""
    c, parent = served["client"], served["parent"]
    analyse = served["store"].nodes_of(parent)[2].name
    overrides = [
        {"node": analyse, "param": "group_by", "value": value} for value in ("month", "year")
    ]
    grid = _job(
        c,
        f"/api/runs/{parent}/grid",
        {"at": 3, "overrides": overrides, "workers": 1, "effects": "recorded"},
    )
    job = typed_get(c, GridJob, grid)
    assert job["status"] == "completed", job["error"]
    assert len(job["report"]["variants"]) == 2 and job["report"]["rows"]
    stability = _job(c, f"/api/runs/{parent}/stability", {"k": 2, "from_node": 3})
    job = typed_get(c, StabilityJob, stability)
    assert job["status"] == "completed", job["error"]
    assert len(job["report"]["samples"]) == 2
    for path in ("/api/grids", "/api/stability"):
        assert typed_get(c, JobList, path, run_id=parent)["jobs"]


def test_a_started_run_and_its_job_serve_only_declared_keys(served: dict[str, Any]) -> None:
    c = served["client"]
    r = c.post("/api/runs", json={"pipeline": "failing"})
    assert r.status_code == 202, r.text
    accepted = r.json()
    assert RunAccepted.model_validate(accepted).run_id == accepted["run_id"]
    deadline = time.monotonic() + 600
    # the job's row is written before the 202, as on a queue: never a 404 while it waits
    first = c.get(f"/api/jobs/{accepted['job_id']}")
    assert first.status_code == 200, first.text
    assert first.json()["state"] in ("queued", "running", "succeeded", "failed")
    while (run := typed_get(c, m.RunDetail, f"/api/runs/{accepted['run_id']}"))["status"] in (
        "queued",
        "running",
    ):
        assert time.monotonic() < deadline, run
        time.sleep(0.05)
    assert run["status"] == "failed"
    while (job := typed_get(c, m.JobView, f"/api/jobs/{accepted['job_id']}"))["state"] in (
        "queued",
        "running",
    ):
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["run_id"] == accepted["run_id"] and job["kind"] == "record"
    assert job["state"] == "failed" and job["error"]


def test_cut_calls_and_failed_nodes_fit_their_models(served: dict[str, Any]) -> None:
    """The shapes the UI special-cases: a call whose prompt was cut, a tool call, a failed node
    (no state), and the run list's failed run."""
    c, rid = served["client"], served["calls"]
    ask = typed_get(c, m.NodeDetail, f"/api/runs/{rid}/nodes/1")
    first = ask["calls"][0]
    assert first["kind"] == "llm" and first["request_truncated"] is True
    assert first["request"]["messages"][0]["role"] == "system"
    kinds = {
        call["kind"]
        for n in (1, 2, 3)
        for call in typed_get(c, m.NodeCalls, f"/api/runs/{rid}/nodes/{n}/calls")["calls"]
    }
    assert kinds == {"llm", "tool"}
    failed = served["failed"]
    nodes = served["store"].nodes_of(failed)
    broken = typed_get(c, m.NodeDetail, f"/api/runs/{failed}/nodes/{len(nodes)}")
    assert broken["node"]["status"] == "failed" and broken["state"] is None


def test_routes_pass_domain_json_through_unchanged(served: dict[str, Any]) -> None:
    """Where a route only passes a domain record's JSON on, the served body is that JSON
    exactly: the response model drops no key and adds no default."""
    c, rw, store = served["client"], served["rw"], served["store"]
    parent, fork = served["parent"], served["fork"]
    assert c.get("/api/diff", params={"a": parent, "b": fork}).json() == json.loads(
        json.dumps(rw.diff(parent, fork).to_json())
    )
    for trace_id in (served["trace"], parent):
        expected = json.loads(json.dumps(load_trace(store, trace_id).to_json()))
        assert c.get(f"/api/traces/{trace_id}").json() == expected
    from rewind.api import views

    cost = views.cost_json(store, store.get_run(parent), store.get_run(fork))
    assert c.get(f"/api/runs/{fork}/cost").json() == json.loads(json.dumps(cost))


def test_a_key_a_model_lacks_is_served_and_reported() -> None:
    """A view that grows a key before its model does keeps it (nothing dropped), and the check
    above names it."""
    edge = m.Edge.model_validate({"src": "a", "dst": "b", "condition": "", "label_at": [1, 2]})
    assert edge.model_dump(mode="json", exclude_unset=True)["label_at"] == [1, 2]
    assert undeclared(edge) == [".label_at (Edge)"]
    assert "additionalProperties" not in m.Edge.model_json_schema()


def _openapi_typescript() -> Path:
    tool = WEB / "node_modules" / ".bin" / "openapi-typescript"
    if not tool.exists() or shutil.which("node") is None:
        pytest.fail("openapi-typescript is missing: cd web && npm ci (make installs it)")
    return tool


REGENERATE = "regenerate them: run `npm run types` in web/ (and commit both files)"


@pytest.mark.slow
def test_committed_openapi_document_is_current() -> None:
    """``web/openapi.json`` is the app's OpenAPI document now (in this process; the next test
    regenerates it and ``web/src/api-schema.d.ts`` with ``npm run types``)."""
    assert openapi_text() == (WEB / "openapi.json").read_text(encoding="utf-8"), (
        f"web/openapi.json differs from the app's OpenAPI document: {REGENERATE}"
    )


@pytest.mark.slow
def test_npm_run_types_writes_both_files_without_a_server(tmp_path: Path) -> None:
    """``npm run types`` (the script the hint names) regenerates both files in a copy of
    ``web/`` from the code alone: no server runs."""
    _openapi_typescript()
    copy = tmp_path / "web"
    (copy / "src").mkdir(parents=True)
    shutil.copy(WEB / "package.json", copy / "package.json")
    (copy / "node_modules").symlink_to(WEB / "node_modules")
    env = os.environ | {
        "REWIND_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    subprocess.run(
        ["npm", "run", "types"], cwd=copy, env=env, check=True, capture_output=True, timeout=300
    )
    assert (copy / "openapi.json").read_text() == (WEB / "openapi.json").read_text(), (
        f"web/openapi.json differs from what `python -m rewind.api.openapi` writes: {REGENERATE}"
    )
    generated = (copy / "src" / "api-schema.d.ts").read_text()
    assert generated == (WEB / "src" / "api-schema.d.ts").read_text(), (
        f"web/src/api-schema.d.ts differs from what openapi-typescript generates: {REGENERATE}"
    )
    assert "RunDetail: {" in generated and "NodeDetail: {" in generated
