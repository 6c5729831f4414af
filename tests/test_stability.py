"""Hash-stability mode: the same branch K times live, per-node spread of output hashes.

The fake model here answers like the conftest one, except that a request sampled at temperature
> 0 gets a fresh answer every time (a counter), as a real sampler would; at temperature 0 the
answer is fixed. Pipeline: ``tests.pipelines.grid_pipeline`` (``frame → draft (llm) → gist →
review (llm) → publish_note``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rewind.cli.stability import render_stability, stability_command
from rewind.errors import InvalidOverride, RewindError, UnknownNode
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.replay import ParamOverride, Rewind
from rewind.stability import (
    StabilityReport,
    merge_key_orders,
    occurrence_keys,
    saved_reports,
    stability,
    temperature_override,
)
from rewind.store import RunRecord
from tests import pipelines
from tests.conftest import FAKE_BASE_URL, FAKE_MODEL, FakeModel, row_counts

QUESTION = "why is the sky blue"
BRANCH = ["draft", "gist", "review", "publish_note"]


class SamplingModel(FakeModel):
    """Fixed answers at temperature 0; a different answer on every call above 0."""

    def __init__(self) -> None:
        super().__init__()
        self.samples = 0
        self._lock = threading.Lock()

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body.get("temperature", 1.0) > 0:
            with self._lock:
                self.samples += 1
                n = self.samples
            body["messages"][-1]["content"] += f" (sample {n})"
            request = httpx.Request(request.method, request.url, json=body)
        return super().handler(request)


@pytest.fixture
def model() -> SamplingModel:
    return SamplingModel()


def _client(model: FakeModel) -> ChatClient:
    return ChatClient(
        Endpoint(base_url=FAKE_BASE_URL, model=FAKE_MODEL),
        transport=httpx.MockTransport(model.handler),
        retry=RetryPolicy(attempts=1),
    )


@pytest.fixture
def rw(tmp_path: Path, model: SamplingModel) -> Iterator[Rewind]:
    client = _client(model)
    session = Rewind(tmp_path / "store", chat_client=client)
    yield session
    session.store.close()
    client.close()


@pytest.fixture
def parent(rw: Rewind, model: SamplingModel) -> RunRecord:
    run = rw.record(pipelines.grid_pipeline, {"question": QUESTION})
    assert run.status == "completed", run.error
    model.requests.clear()
    return run


def _caches(rw: Rewind) -> dict[str, int]:
    counts = row_counts(rw.store)
    return {k: counts[k] for k in ("llm_cache", "tool_cache")}


# -- temperature 0: fully stable ---------------------------------------------------------------


def test_temperature_zero_is_fully_stable(
    rw: Rewind, parent: RunRecord, model: SamplingModel
) -> None:
    report = stability(rw, parent.run_id, k=4, from_node="draft")

    assert report.k == 4 and len(report.samples) == 4
    assert [n.label for n in report.nodes] == BRANCH
    assert report.stable_share == 1.0
    assert report.stable_nodes == 4
    assert report.first_spread is None
    for n in report.nodes:
        assert n.stable and n.distinct == 1 and n.completed == 4
        assert n.modal_count == 4 and n.modal_share == 1.0
        assert n.matches_parent
    assert all(s.status == "completed" for s in report.samples)
    # every LLM call ran live: 2 per sample, each spending tokens
    assert model.count == 8
    assert report.tokens == sum(s.tokens for s in report.samples) > 0


def test_samples_run_live_with_reason_bypass_stability(rw: Rewind, parent: RunRecord) -> None:
    report = stability(rw, parent.run_id, k=2, from_node=2)

    for sample in report.samples:
        nodes = rw.store.nodes_of(sample.run_id)
        assert [n.inherited for n in nodes] == [True, False, False, False, False]
        labels = {n.name: [c.label for c in n.calls] for n in nodes if not n.inherited}
        assert labels["draft"] == ["bypass:stability"]
        assert labels["gist"] == ["bypass:stability"]
        assert labels["review"] == ["bypass:stability"]
        assert labels["publish_note"] == ["served:side-effect-recorded"]
        assert sample.parent_run_id == parent.run_id and sample.override is None


def test_stability_runs_never_touch_the_caches_or_the_parent(rw: Rewind, parent: RunRecord) -> None:
    before = _caches(rw)
    parent_rows = rw.store.nodes_of(parent.run_id)

    stability(rw, parent.run_id, k=3, from_node="draft")
    stability(rw, parent.run_id, k=3, from_node="draft", temperature=0.8)

    assert _caches(rw) == before
    assert rw.store.nodes_of(parent.run_id) == parent_rows
    # and a later unchanged replay is still served entirely from the parent's record
    replay = rw.replay(parent.run_id, at="draft")
    assert replay.tokens == 0


# -- temperature 0.8: spreads ----------------------------------------------------------------


def test_temperature_point_eight_is_not_stable(
    rw: Rewind, parent: RunRecord, model: SamplingModel
) -> None:
    report = stability(rw, parent.run_id, k=4, from_node="draft", temperature=0.8)

    assert report.override is not None and report.override["value"] == 0.8
    assert report.override["param"] == "temperature"
    assert report.stable_share < 1.0
    spread = report.first_spread
    assert spread is not None and spread.name == "draft" and spread.index == 0
    draft, gist = report.nodes[0], report.nodes[1]
    assert draft.distinct == 4 and draft.modal_count == 1 and draft.modal_share == 0.25
    assert draft.determinism == "non-deterministic"
    assert not draft.matches_parent
    # every sampled draft is "warm": gist is stable, but not the recorded run's value
    assert gist.stable and not gist.matches_parent
    assert model.samples >= 4


def test_spread_upstream_of_a_side_effect_is_reported_not_raised(
    rw: Rewind, parent: RunRecord
) -> None:
    report = stability(rw, parent.run_id, k=3, from_node="draft", temperature=0.8)

    publish = next(n for n in report.nodes if n.name == "publish_note")
    assert not publish.stable
    # The engine serves side effects from record in stability mode: new arguments have no
    # record, so the sample stops there (or, with the dry-run patch, logs a distinct call).
    assert publish.completed == 0 or publish.distinct == 3
    if publish.completed == 0:
        assert all(s.status == "failed" for s in report.samples)
        assert all("side-effecting tool" in (s.error or "") for s in report.samples)


def test_set_override_on_a_later_node(rw: Rewind, parent: RunRecord) -> None:
    report = stability(
        rw, parent.run_id, k=3, from_node=1, override=ParamOverride("review", "temperature", 0.5)
    )
    assert [n.label for n in report.nodes] == ["frame", *BRANCH]
    assert report.first_spread is not None and report.first_spread.name == "review"
    assert [n.stable for n in report.nodes][:3] == [True, True, True]


def test_temperature_goes_to_the_first_llm_node_from_the_fork_point(
    rw: Rewind, parent: RunRecord
) -> None:
    nodes = rw.store.nodes_of(parent.run_id)
    # "*" (every node reading temperature) once the engine takes wildcard overrides
    assert temperature_override(nodes, 0, 0.8) in (
        ParamOverride("draft", "temperature", 0.8),
        ParamOverride("*", "temperature", 0.8),
    )
    assert temperature_override(nodes, 2, 0.3) in (
        ParamOverride("review", "temperature", 0.3),
        ParamOverride("*", "temperature", 0.3),
    )
    with pytest.raises(InvalidOverride, match="no LLM node"):
        temperature_override(nodes, 4, 0.8)


# -- the report --------------------------------------------------------------------------------


def test_report_is_saved_as_json_under_the_store(rw: Rewind, parent: RunRecord) -> None:
    report = stability(rw, parent.run_id, k=2, from_node="draft")

    assert report.path is not None and report.path.is_file()
    assert report.path.parent == rw.store.root / "reports"
    assert report.path.name.startswith(f"stability-{parent.run_id[:12]}-{report.batch}")
    saved = json.loads(report.path.read_text())
    assert saved == json.loads(json.dumps(report.to_json()))
    assert saved_reports(rw.store.root, "stability", parent.run_id) == [report.path]
    for i, sample in enumerate(report.samples, start=1):
        config = rw.store.get_run(sample.run_id).config
        assert config["purpose"] == "stability"
        assert config["stability_batch"] == report.batch
        assert (config["sample"], config["k"], config["stability_of"]) == (i, 2, parent.run_id)


def test_report_json_fields(rw: Rewind, parent: RunRecord) -> None:
    report = stability(rw, parent.run_id, k=3, from_node="draft", temperature=0.8, save=False)
    assert report.path is None
    data = json.loads(json.dumps(report.to_json(), allow_nan=False))

    assert data["kind"] == "stability"
    assert (data["run_id"], data["from_node"], data["from_number"], data["k"]) == (
        parent.run_id,
        "draft",
        2,
        3,
    )
    assert data["first_spread"] == {"index": 0, "label": "draft"}
    assert data["node_count"] == 4 and 0 <= data["stable_share"] < 1
    assert data["stable_nodes"] == round(data["stable_share"] * 4)
    row = data["nodes"][0]
    assert set(row) == {
        "index",
        "name",
        "occurrence",
        "label",
        "stable",
        "distinct",
        "modal_hash",
        "modal_count",
        "modal_share",
        "completed",
        "parent_hash",
        "matches_parent",
        "determinism",
        "hashes",
    }
    assert len(row["hashes"]) == 3 and len(set(row["hashes"])) == 3
    assert [s["run_id"] for s in data["samples"]] == [s.run_id for s in report.samples]


def test_render_stability_table(rw: Rewind, parent: RunRecord) -> None:
    from rich.console import Console

    report = stability(rw, parent.run_id, k=2, from_node="draft", temperature=0.8)
    console = Console(record=True, width=160)
    render_stability(report, console)
    out = console.export_text()
    assert "stability of" in out and "K=2" in out and "first spread" in out
    label = "*.temperature=0.8" if report.override["node"] == "*" else "draft.temperature=0.8"
    assert label in out and "◀ first spread" in out


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"k": 1}, RewindError, "k must be at least 2"),
        ({"k": 2, "from_node": "ghost"}, UnknownNode, "has no node 'ghost'"),
        (
            {"k": 2, "override": ParamOverride("draft", "nope", 1)},
            InvalidOverride,
            "has no param 'nope'",
        ),
        (
            {"k": 2, "from_node": "review", "override": ParamOverride("draft", "temperature", 1)},
            InvalidOverride,
            "runs before the fork node",
        ),
        (
            {"k": 2, "temperature": 0.8, "override": ParamOverride("draft", "temperature", 1)},
            InvalidOverride,
            "one change",
        ),
        ({"k": 2, "from_node": "publish_note", "temperature": 0.8}, InvalidOverride, "no LLM"),
    ],
)
def test_bad_input_raises_before_anything_runs(
    rw: Rewind,
    parent: RunRecord,
    model: SamplingModel,
    kwargs: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    before = row_counts(rw.store)
    with pytest.raises(error, match=message):
        stability(rw, parent.run_id, **kwargs)
    assert row_counts(rw.store) == before
    assert model.count == 0
    assert saved_reports(rw.store.root) == []


# -- alignment helpers -------------------------------------------------------------------------


def test_occurrence_keys_and_merged_orders() -> None:
    assert occurrence_keys(["a", "b", "a"]) == [("a", 1), ("b", 1), ("a", 2)]
    a = [("s", 1), ("x", 1), ("e", 1)]
    b = [("s", 1), ("y", 1), ("e", 1)]
    c = [("n", 1), ("s", 1)]
    assert merge_key_orders([a, b, c]) == [("n", 1), ("s", 1), ("y", 1), ("x", 1), ("e", 1)]
    assert merge_key_orders([]) == []


def test_a_pipeline_of_deterministic_tools_is_stable(tmp_path: Path) -> None:
    # tiny pipeline: start → expand → big | small; tools only, no model needed.
    session = Rewind(tmp_path / "tiny")
    try:
        run = session.record(pipelines.pipeline, {"x": 5})
        report = stability(session, run.run_id, k=2, from_node="start")
        assert report.stable_share == 1.0
        assert [n.label for n in report.nodes] == [
            n.name for n in session.store.nodes_of(run.run_id)
        ]
    finally:
        session.store.close()


# -- the CLI entry ---------------------------------------------------------------------------


@pytest.fixture
def cli_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A store with one recorded run; ``LazyChatClient`` answers from the sampling fake."""
    model = SamplingModel()
    client = _client(model)
    store = str(tmp_path / "cli-store")
    session = Rewind(store, chat_client=client)
    run = session.record(pipelines.grid_pipeline, {"question": QUESTION})
    session.store.close()
    monkeypatch.setattr("rewind.session.LazyChatClient", lambda: _client(model))
    yield store, run.run_id
    client.close()


def test_stability_command_json_exit_0_when_stable(
    cli_store: tuple[str, str], capsys: pytest.CaptureFixture
) -> None:
    store, run_id = cli_store
    code = stability_command(store, run_id[:10], 3, "draft", [], True)
    out = capsys.readouterr()
    assert code == 0, out.err
    data = json.loads(out.out)
    assert data["stable_share"] == 1.0 and data["k"] == 3
    assert out.err.count("sample ") == 3


def test_stability_command_exit_1_when_spread(
    cli_store: tuple[str, str], capsys: pytest.CaptureFixture
) -> None:
    store, run_id = cli_store
    assert stability_command(store, run_id, 2, "2", [], False, temperature=0.8) == 1
    out = capsys.readouterr().out
    assert "stable share" in out and "first spread" in out
    assert stability_command(store, run_id, 2, "1", ["draft.temperature=0.8"], True) == 1
    assert json.loads(capsys.readouterr().out)["first_spread"]["label"] == "draft"


def test_stability_command_bad_input_exit_2(
    cli_store: tuple[str, str], capsys: pytest.CaptureFixture
) -> None:
    store, run_id = cli_store
    sets = ["draft.temperature=0.8", "review.temperature=0.8"]
    assert stability_command(store, run_id, 3, "draft", sets, False) == 2
    assert "one change" in capsys.readouterr().err
    assert stability_command(store, run_id, 3, "draft", ["bad"], False) == 2
    assert "malformed override" in capsys.readouterr().err
    assert stability_command(store, "no-such-run", 3, "1", [], False) == 2
    assert "unknown run" in capsys.readouterr().err
    assert stability_command(store, run_id, 1, "1", [], False) == 2


def test_report_type_is_frozen(rw: Rewind, parent: RunRecord) -> None:
    report = stability(rw, parent.run_id, k=2, from_node="draft", save=False)
    assert isinstance(report, StabilityReport)
    with pytest.raises(AttributeError):
        report.k = 3  # type: ignore[misc]
