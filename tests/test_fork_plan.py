"""The one fork planner (:func:`rewind.engine.plan.plan_fork`), the error vocabulary it raises,
and the one ancestor walk (:meth:`Store.ancestors`).

The parity test sends the same bad fork requests to every surface that starts forks — ``rewind
fork`` and ``rewind grid`` (subprocesses), ``POST /api/runs/{id}/fork`` and ``/grid`` (the real
app through FastAPI's TestClient), and :func:`rewind.grid.grid` — and checks that each refuses it
the same way (exit 2, or the same HTTP status) with the same message and field, writing nothing.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from rewind.api import create_app
from rewind.errors import (
    CodeDrift,
    ForkError,
    InvalidOverride,
    InvalidRequest,
    RewindError,
    UnknownNode,
    UnknownRun,
)
from rewind.grid import grid
from rewind.persister import encode_value
from rewind.replay import (
    ForkPlan,
    OutputOverride,
    Override,
    ParamOverride,
    Rewind,
    parse_override,
    plan_fork,
)
from rewind.store import RunRecord, Store, open_store
from tests import pipelines
from tests.cli_process import run_rewind
from tests.conftest import row_counts

# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    st = open_store(tmp_path / "store")
    yield st
    st.close()


@pytest.fixture
def rw(store: Store) -> Rewind:
    return Rewind(store)


@pytest.fixture
def parent(rw: Rewind) -> RunRecord:
    """``checked`` (start → expand → big), whose param_check refuses ``expand.factor < 1``."""
    run = rw.record(pipelines.checked, {"x": 15})
    assert [n.name for n in rw.store.nodes_of(run.run_id)] == ["start", "expand", "big"]
    return run


# -- plan_fork -----------------------------------------------------------------------------------


def test_a_plan_holds_what_the_fork_executes_and_writes_nothing(
    rw: Rewind, parent: RunRecord
) -> None:
    before = row_counts(rw.store)
    override = ParamOverride("expand", "factor", 3)
    plan = plan_fork(rw, parent.run_id[:10], at="expand", override=override)
    assert row_counts(rw.store) == before
    assert isinstance(plan, ForkPlan)
    assert plan.parent.run_id == parent.run_id
    assert (plan.index, plan.at_number, plan.fork_node.name) == (1, 2, "expand")
    assert [n.name for n in plan.nodes] == ["start", "expand", "big"]
    assert plan.override == override
    assert (plan.effects, plan.restore, plan.cache_mode) == ("recorded", "refuse", "replay")
    assert plan.pipeline.name == "checked"
    start = plan.nodes[0]
    assert plan.source == (start.src_app_id, start.src_sequence_id)
    assert plan.output is None
    assert plan.drift is not None and not plan.drift.structural
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.index = 0  # type: ignore[misc]
    # The fork executes what was planned.
    child = rw.fork(parent.run_id, at="expand", override=override)
    assert child.status == "completed" and child.fork_node == "expand"


def test_plans_at_the_first_node_and_with_an_output_override(rw: Rewind, parent: RunRecord) -> None:
    first = plan_fork(rw, parent.run_id, at=1)
    assert first.source is None and first.override is None  # starts from the initial state
    typed = OutputOverride("expand", "series", (1, 2, 3))  # a tuple: stored exactly by serde
    plan = plan_fork(rw, parent.run_id, at="expand", override=typed)
    assert plan.source is None
    assert plan.output == encode_value("series", (1, 2, 3))
    assert plan.output != encode_value("series", [1, 2, 3])


@pytest.mark.parametrize(
    ("kwargs", "error", "field", "text"),
    [
        ({"at": "nope"}, UnknownNode, "from_node", "no node 'nope'"),
        ({"at": 9}, UnknownNode, "from_node", "no node number 9"),
        (
            {"at": 2, "override": ParamOverride("expand", "nope", 1)},
            InvalidOverride,
            "overrides.3.param",
            "has no param 'nope'",
        ),
        (
            {"at": 2, "override": ParamOverride("ghost", "factor", 1)},
            InvalidOverride,
            "overrides.3.node",
            "no node 'ghost'",
        ),
        (
            {"at": 2, "override": ParamOverride("expand", "factor", 0)},
            InvalidOverride,
            "overrides.3.value",
            "factor must be an integer of at least 1",
        ),
        (
            {"at": 2, "override": ParamOverride("expand", "factor", float("nan"))},
            InvalidOverride,
            "overrides.3.value",
            "cannot be hashed",
        ),
        (
            {"at": 2, "override": OutputOverride("expand", "series", [object()])},
            InvalidOverride,
            "overrides.3.value",
            "cannot be hashed",
        ),
        (
            {"at": 2, "override": OutputOverride("expand", "nope", 1)},
            InvalidOverride,
            "overrides.3.field",
            "no output field 'nope'",
        ),
        ({"at": 2, "effects": "yolo"}, InvalidOverride, "effects", "unknown effects mode"),
        ({"at": 2, "restore": "replace"}, InvalidOverride, "restore", "needs effects=live"),
        ({"at": 2, "cache_mode": "warm"}, InvalidOverride, "cache_mode", "unknown cache mode"),
    ],
)
def test_refusals_name_the_request_field_and_write_nothing(
    rw: Rewind,
    parent: RunRecord,
    kwargs: dict[str, Any],
    error: type[RewindError],
    field: str,
    text: str,
) -> None:
    before = row_counts(rw.store)
    with pytest.raises(error) as caught:
        plan_fork(rw, parent.run_id, at_field="from_node", override_field="overrides.3", **kwargs)
    assert isinstance(caught.value, InvalidRequest)
    assert caught.value.field == field and text in caught.value.message
    assert caught.value.run_id is None
    assert row_counts(rw.store) == before


def test_unknown_runs_and_missing_fork_sources_are_refused(rw: Rewind, parent: RunRecord) -> None:
    with pytest.raises(UnknownRun):
        plan_fork(rw, "0123456789abcdef", at=1)
    # The state row the fork would resume from is gone: Burr would silently start from its
    # default state, so the planner refuses.
    start = rw.store.nodes_of(parent.run_id)[0]
    con = sqlite3.connect(rw.store.root / "rewind.db")
    with con:
        con.execute(
            "DELETE FROM burr_state WHERE app_id = ? AND sequence_id = ?",
            (start.src_app_id, start.src_sequence_id),
        )
    con.close()
    with pytest.raises(ForkError, match="missing from the store"):
        plan_fork(rw, parent.run_id, at="expand")
    assert plan_fork(rw, parent.run_id, at=1).index == 0  # the first node needs no row


def test_runtime_input_overrides_are_planned_against_the_recorded_inputs(rw: Rewind) -> None:
    from rewind.engine.attach import load_pipeline
    from rewind.replay import InputOverride

    app = load_pipeline("tests.burr_apps:pure_application")
    run = rw.record(app, inputs={"question": "why?"}, halt_after=["summarise"])
    change = InputOverride("ask", "question", "how?")
    plan = plan_fork(rw, run.run_id, at="ask", override=change)
    assert plan.override == change and plan.launch.inputs == {"question": "why?"}
    with pytest.raises(InvalidOverride, match="has no input 'questoin'") as caught:
        plan_fork(rw, run.run_id, at="ask", override=InputOverride("ask", "questoin", "how?"))
    assert caught.value.field == "override.name"
    with pytest.raises(InvalidOverride, match="recorded as a string") as caught:
        plan_fork(rw, run.run_id, at="ask", override=InputOverride("ask", "question", 7))
    assert caught.value.field == "override.name"


# -- the error vocabulary ------------------------------------------------------------------------


def test_bad_input_errors_share_one_parent_and_declare_field_and_run() -> None:
    for cls in (InvalidOverride, UnknownNode, UnknownRun):
        assert issubclass(cls, InvalidRequest)
    assert not issubclass(ForkError, InvalidRequest)
    err = InvalidOverride("bad", "fix it", field="override.param")
    assert (err.field, err.run_id, str(err)) == ("override.param", None, "bad\nfix it")
    drift = CodeDrift("graph changed", "restore it", ("node 'x' removed",))
    recorded = drift.for_run("run123")
    assert type(recorded) is CodeDrift and recorded is not drift
    assert (recorded.run_id, recorded.differences, recorded.message) == (
        "run123",
        ("node 'x' removed",),
        "graph changed",
    )
    assert drift.run_id is None  # the original is left as it was


# -- one refusal, every surface ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BadFork:
    """One bad fork request in each surface's own syntax."""

    at: str
    cli: tuple[str, ...]  # `rewind fork` flags after RUN
    body: dict[str, Any]  # the API fork request body
    status: int  # HTTP status; the CLI exits 2 either way
    field: str  # the API fork field (a grid names overrides.0.* for override.*)
    override: Override | None = None  # the engine override (for the grid)

    def grid_field(self) -> str:
        return self.field.replace("override.", "overrides.0.", 1)


def _param(node: str, name: str, value: Any) -> dict[str, Any]:
    return {"kind": "param", "node": node, "param": name, "value": value}


def _output(node: str, name: str, value: Any) -> dict[str, Any]:
    return {"kind": "output", "node": node, "field": name, "value": value}


BAD_FORKS = {
    "unknown param": BadFork(
        "expand",
        ("--set", "expand.nope=1"),
        {"override": _param("expand", "nope", 1)},
        422,
        "override.param",
        ParamOverride("expand", "nope", 1),
    ),
    "unknown node": BadFork(
        "expand",
        ("--set", "ghost.factor=1"),
        {"override": _param("ghost", "factor", 1)},
        422,
        "override.node",
        ParamOverride("ghost", "factor", 1),
    ),
    "node before the fork": BadFork(
        "expand",
        ("--set", "start.offset=1"),
        {"override": _param("start", "offset", 1)},
        422,
        "override.node",
        ParamOverride("start", "offset", 1),
    ),
    "value of another type": BadFork(
        "expand",
        ("--set", "expand.factor=hot"),
        {"override": _param("expand", "factor", "hot")},
        422,
        "override.param",
        ParamOverride("expand", "factor", "hot"),
    ),
    # The API used to accept (202) what the pipeline's param_check refuses; the run then failed.
    "refused by param_check": BadFork(
        "expand",
        ("--set", "expand.factor=0"),
        {"override": _param("expand", "factor", 0)},
        422,
        "override.value",
        ParamOverride("expand", "factor", 0),
    ),
    "unknown fork node": BadFork(
        "nope",
        ("--set", "expand.factor=3"),
        {"override": _param("expand", "factor", 3)},
        404,
        "at",
        ParamOverride("expand", "factor", 3),
    ),
    "unknown output field": BadFork(
        "expand",
        ("--set-output", "expand.nope=1"),
        {"override": _output("expand", "nope", 1)},
        422,
        "override.field",
        OutputOverride("expand", "nope", 1),
    ),
    "output of another node": BadFork(
        "expand",
        ("--set-output", "big.verdict=1"),
        {"override": _output("big", "verdict", 1)},
        422,
        "override.node",
        OutputOverride("big", "verdict", 1),
    ),
    "restore without live effects": BadFork(
        "expand", ("--restore", "replace"), {"restore": "replace"}, 422, "restore"
    ),
}


@pytest.mark.parametrize("case", list(BAD_FORKS.values()), ids=list(BAD_FORKS))
def test_every_surface_refuses_a_bad_fork_identically(
    store: Store, rw: Rewind, parent: RunRecord, case: BadFork
) -> None:
    pid = parent.run_id
    before = row_counts(store)
    app = create_app(store, chat_client=None, pipelines={})
    with TestClient(app, base_url="http://127.0.0.1") as client:
        r = client.post(f"/api/runs/{pid}/fork", json={"at": case.at, **case.body})
        assert r.status_code == case.status, r.text
        body = r.json()
        kind = "UnknownNode" if case.status == 404 else "InvalidOverride"
        assert (body["error"], body["field"]) == (kind, case.field), body
        message, hint = body["message"], body["hint"]
        if case.override is not None:
            g = client.post(
                f"/api/runs/{pid}/grid", json={"at": case.at, "overrides": [case.body["override"]]}
            )
            assert g.status_code == case.status, g.text
            assert (g.json()["field"], g.json()["message"]) == (case.grid_field(), message)
    assert row_counts(store) == before

    proc = run_rewind("--store", str(store.root), "fork", pid, "--at", case.at, *case.cli)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {message}" + (f" — {hint}" if hint else "")], proc.stderr

    if case.override is not None:
        with pytest.raises(InvalidRequest) as caught:
            grid(rw, pid, at=case.at, overrides=[case.override])
        assert (caught.value.field, caught.value.message) == (case.grid_field(), message)
        if case.cli[0] == "--set":  # `rewind grid` takes param variants only
            spec = case.cli[1]
            assert parse_override(spec) == case.override
            proc = run_rewind(
                "--store", str(store.root), "grid", pid, "--at", case.at, "--set", spec
            )
            assert proc.returncode == 2, proc.stdout + proc.stderr
            assert f"error: {message}" in proc.stderr, proc.stderr
    assert row_counts(store) == before


# -- ancestry ------------------------------------------------------------------------------------


def test_ancestors_walk_stops_at_a_cycle_planted_in_the_database(
    store: Store, rw: Rewind, parent: RunRecord
) -> None:
    a = parent
    b = rw.fork(a.run_id, at="expand", override=ParamOverride("expand", "factor", 3))
    c = rw.fork(b.run_id, at="big")
    assert [r.run_id for r in store.ancestors(c.run_id)] == [b.run_id, a.run_id]
    assert [r.run_id for r in store.ancestors(c)] == [b.run_id, a.run_id]
    assert store.ancestors(a.run_id) == []

    # Hand-edit the file: the recorded run now claims the newest fork as its parent.
    con = sqlite3.connect(store.root / "rewind.db")
    with con:
        con.execute("UPDATE runs SET parent_run_id = ? WHERE run_id = ?", (c.run_id, a.run_id))
    con.close()
    assert [r.run_id for r in store.ancestors(c.run_id)] == [b.run_id, a.run_id]
    assert [r.run_id for r in store.ancestors(a.run_id)] == [c.run_id, b.run_id]

    # Everything that walks lineage terminates: a fork of the cycle (its overrides and cache
    # lineage), the API's run detail and cost views.
    again = rw.fork(c.run_id, at="big")
    assert again.status == "completed"
    assert [r.run_id for r in store.ancestors(again)] == [c.run_id, b.run_id, a.run_id]
    app = create_app(store, chat_client=None, pipelines={})
    with TestClient(app, base_url="http://127.0.0.1") as client:
        detail = client.get(f"/api/runs/{a.run_id}").json()
        assert [x["run_id"] for x in detail["ancestors"]] == [c.run_id, b.run_id]
        assert client.get(f"/api/runs/{c.run_id}/cost").status_code == 200

    # A parent no longer in the store (removed by retention) ends the walk.
    with sqlite3.connect(store.root / "rewind.db") as con:
        con.execute("UPDATE runs SET parent_run_id = 'gone' WHERE run_id = ?", (b.run_id,))
    con.close()
    assert [r.run_id for r in store.ancestors(c.run_id)] == [b.run_id]
