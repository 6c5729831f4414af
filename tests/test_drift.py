"""Code and graph drift: fingerprints, graph comparison, and forks of a pipeline edited since
its recording, driven through the ``rewind`` command line in fresh processes.

Each CLI test writes a small pipeline module to a temporary folder, records it, rewrites the file
(a node renamed, inserted, removed, or its code changed) and forks in a new process, which
re-imports the edited module, exactly as a user editing their code would.
"""

from __future__ import annotations

import importlib
import itertools
import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from burr.core import Action, State, action, default
from burr.core.graph import GraphBuilder

from rewind.drift import (
    action_fingerprint,
    callable_fingerprint,
    compare_graphs,
    graph_document,
    helper_fingerprints,
)
from rewind.replay import Pipeline
from rewind.store import open_store
from tests.cli_process import run_rewind

ROOT = Path(__file__).resolve().parent.parent

# -- fingerprints ------------------------------------------------------------------------------


def _compile(source: str, name: str, tmp_path: Path) -> Any:
    """Define a function from source in a real file, so inspect.getsource can read it."""
    path = tmp_path / f"mod_{len(list(tmp_path.glob('mod_*.py')))}.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    namespace: dict[str, Any] = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace[name]


def test_fingerprint_ignores_comments_and_layout_but_not_code(tmp_path: Path) -> None:
    base = _compile("def f(x):\n    return x + 1\n", "f", tmp_path)
    commented = _compile(
        "def f(x):\n    # why: one more\n\n    return x + 1  # ok\n", "f", tmp_path
    )
    changed = _compile("def f(x):\n    return x + 2\n", "f", tmp_path)

    assert callable_fingerprint(base) == callable_fingerprint(commented)
    assert callable_fingerprint(base) != callable_fingerprint(changed)
    assert len(callable_fingerprint(base)) == 64


def test_fingerprint_covers_bound_params_and_falls_back_to_bytecode() -> None:
    @action(reads=["x"], writes=["y"])
    def scale(state: State, factor: int) -> State:
        return state.update(y=state["x"] * factor)

    two, three = scale.bind(factor=2), scale.bind(factor=3)
    assert action_fingerprint(two) != action_fingerprint(three)
    assert action_fingerprint(two) == action_fingerprint(scale.bind(factor=2))
    assert action_fingerprint(scale.bind(factor=object())) == action_fingerprint(
        scale.bind(factor=object())
    )  # a live object counts by its type, never by its address

    no_source = eval("lambda state: state")  # no file to read: bytecode, constants, names
    other = eval("lambda state: None")
    assert callable_fingerprint(no_source) == callable_fingerprint(eval("lambda state: state"))
    assert callable_fingerprint(no_source) != callable_fingerprint(other)


class Counter(Action):
    """A class-based action."""

    @property
    def reads(self) -> list[str]:
        return ["n"]

    @property
    def writes(self) -> list[str]:
        return ["n"]

    def run(self, state: State, **run_kwargs: Any) -> dict[str, Any]:
        return {"n": state["n"] + 1}

    def update(self, result: dict[str, Any], state: State) -> State:
        return state.update(**result)


def test_class_based_action_hashes_its_class_source() -> None:
    fp = action_fingerprint(Counter())
    assert fp == action_fingerprint(Counter()) and len(fp) == 64
    assert fp != action_fingerprint(Counter.__new__(type("Other", (Counter,), {})))


# -- graph comparison --------------------------------------------------------------------------


def _doc(order: list[str], code: dict[str, str] | None = None, entry: str | None = None) -> Any:
    code = code or {}
    return {
        "format": 1,
        "entrypoint": entry or order[0],
        "nodes": {n: code.get(n, f"code-of-{n}") for n in order},
        "transitions": [[a, b, "default", []] for a, b in itertools.pairwise(order)],
        "param_check": None,
    }


ABC = ["a", "b", "c", "d"]


def test_identical_graph_has_no_drift() -> None:
    drift = compare_graphs(_doc(ABC), _doc(ABC), inherited=["a"], resume_from="a")
    assert not drift and drift.to_json()["structural"] == []


def test_rename_insert_remove_on_the_fork_path_are_structural() -> None:
    renamed = _doc(["a", "bb", "c", "d"], {"bb": "code-of-b"})
    assert compare_graphs(_doc(ABC), renamed, inherited=["a"], resume_from="a").structural == (
        "node 'b' renamed to 'bb'",
    )
    inserted = _doc(["a", "b", "x", "c", "d"])
    assert compare_graphs(_doc(ABC), inserted, inherited=["a"], resume_from="a").structural == (
        "node 'x' inserted after 'b'",
    )
    removed = _doc(["a", "b", "c"])
    assert compare_graphs(_doc(ABC), removed, inherited=["a"], resume_from="a").structural == (
        "node 'd' removed",
    )


def test_removed_middle_node_explains_its_bypass_and_reorders_are_reported() -> None:
    # a → b → c → d becomes a → b → d: one removal; the new b → d transition follows from it.
    drift = compare_graphs(_doc(ABC), _doc(["a", "b", "d"]), inherited=["a"], resume_from="a")
    assert drift.structural == ("node 'c' removed",)

    branching = _doc(ABC)
    branching["transitions"] = [["a", "b", "x", []], ["a", "c", "default", []]]
    swapped = _doc(ABC)
    swapped["transitions"] = [["a", "c", "default", []], ["a", "b", "x", []]]
    drift = compare_graphs(branching, swapped, inherited=[], resume_from=None)
    assert drift.structural == ("transitions out of 'a' reordered",)


def test_drift_only_before_the_fork_point_matters_when_it_touches_inherited_nodes() -> None:
    # Renaming an inherited node is drift (its rows would belong to no node) ...
    renamed = _doc(["aa", "b", "c", "d"], {"aa": "code-of-a"})
    drift = compare_graphs(_doc(ABC), renamed, inherited=["a", "b"], resume_from="b")
    assert drift.structural == ("node 'a' (inherited) renamed to 'aa'",)
    # ... changing its code is not (it is not executed again).
    recoded = _doc(ABC, {"a": "new code"})
    assert not compare_graphs(_doc(ABC), recoded, inherited=["a", "b"], resume_from="b")


def test_insert_before_the_fork_node_changes_what_burr_resumes_into() -> None:
    inserted = _doc(["a", "x", "b", "c", "d"])
    drift = compare_graphs(_doc(ABC), inserted, inherited=["a"], resume_from="a")
    assert drift.structural == ("node 'x' inserted after 'a'",)


def test_changed_code_after_the_fork_point_is_labelled_not_refused() -> None:
    recoded = _doc(ABC, {"c": "new code", "a": "new too"})
    drift = compare_graphs(_doc(ABC), recoded, inherited=["a"], resume_from="a")
    assert drift.structural == () and drift.code_changed == ("c",)
    # the code compared is the code that produced each row, when the caller knows it
    same = compare_graphs(
        _doc(ABC), recoded, inherited=["a"], resume_from="a", produced_code={"c": "new code"}
    )
    assert same.code_changed == ()


def test_fork_at_the_first_node_compares_the_entrypoint() -> None:
    drift = compare_graphs(_doc(ABC), _doc(ABC, entry="b"), inherited=[], resume_from=None)
    assert "entrypoint changed from 'a' to 'b'" in drift.structural


def test_changed_condition_and_param_check_are_reported() -> None:
    recorded = _doc(ABC)
    current = _doc(ABC)
    current["transitions"][1][2] = "x > 1"
    current["param_check"] = "check-code"
    drift = compare_graphs(recorded, current, inherited=["a"], resume_from="a")
    assert drift.structural == (
        "transition 'b' → 'c' (default) removed",
        "transition 'b' → 'c' (x > 1) added",
    )
    assert drift.param_check_changed


def test_graph_document_of_a_burr_graph() -> None:
    @action(reads=["x"], writes=["y"])
    def one(state: State) -> State:
        return state.update(y=1)

    @action(reads=["y"], writes=["z"])
    def two(state: State) -> State:
        return state.update(z=2)

    graph = (
        GraphBuilder()
        .with_actions(one=one, two=two)
        .with_transitions(("one", "two", default))
        .build()
    )
    doc = graph_document(graph, "one")
    assert doc["entrypoint"] == "one" and set(doc["nodes"]) == {"one", "two"}
    assert doc["transitions"] == [["one", "two", "default", []]]
    assert doc["nodes"]["one"] != doc["nodes"]["two"]
    json.dumps(doc)


# -- forks of an edited pipeline, through the CLI ----------------------------------------------

FUNCTIONS = {
    "start": """
@action(reads=["x"], writes=["a"])
def start(state: State) -> State:
    return state.update(a=state["x"] + 1)
""",
    "expand": """
@action(reads=["a"], writes=["b"])
def expand(state: State) -> State:
    return state.update(b=[state["a"], state["a"] * 2])
""",
    "check": """
@action(reads=["b"], writes=["ok"])
def check(state: State) -> State:
    return state.update(ok=len(state["b"]) == 2)
""",
    "prep": """
@action(reads=["a"], writes=["a"])
def prep(state: State) -> State:
    return state.update(a=state["a"] * 10)
""",
    "finish": """
@action(reads=["b"], writes=["c"])
def finish(state: State) -> State:
    return state.update(c=sum(state["b"]))
""",
}


def write_pipeline(folder: Path, nodes: list[tuple[str, str]], **code: str) -> None:
    """Write ``drifty.py``: a linear pipeline of (node name, function name) pairs; ``code``
    replaces a function's source."""
    funcs = {f: code.get(f, FUNCTIONS[f]) for _, f in nodes}
    body = "\n".join(funcs.values())
    actions = ", ".join(f"{name}={func}" for name, func in nodes)
    names = [name for name, _ in nodes]
    transitions = ", ".join(f"({a!r}, {b!r}, default)" for a, b in itertools.pairwise(names))
    source = f"""
from burr.core import State, action, default
from burr.core.graph import GraphBuilder

from rewind.replay import Pipeline
{body}

graph = GraphBuilder().with_actions({actions}).with_transitions({transitions}).build()
pipeline = Pipeline("drifty", graph, entrypoint={names[0]!r}, ref="drifty:pipeline")
"""
    (folder / "drifty.py").write_text(source, encoding="utf-8")
    for cached in (folder / "__pycache__").glob("drifty*"):
        cached.unlink()  # the edit must be what the next process imports


V1 = [("start", "start"), ("expand", "expand"), ("finish", "finish")]


def rewind(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``rewind`` in a process of its own from ``folder`` (where drifty.py lives)."""
    return run_rewind("--store", str(folder / "store"), *args, cwd=folder, columns=200, timeout=600)


def ok_json(folder: Path, *args: str) -> Any:
    proc = rewind(folder, *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def record(folder: Path) -> str:
    write_pipeline(folder, V1)
    out = ok_json(folder, "run", "--pipeline", "drifty:pipeline", "--state", '{"x": 1}')
    assert out["run"]["status"] == "completed"
    assert len(out["run"]["graph_hash"]) == 64 and out["run"]["drift"] is None
    return str(out["run"]["run_id"])


def run_count(folder: Path) -> int:
    con = sqlite3.connect(folder / "store" / "rewind.db")
    try:
        return int(con.execute("SELECT COUNT(*) FROM runs").fetchone()[0])
    finally:
        con.close()


def refused(folder: Path, *args: str) -> str:
    """Run a fork that must be refused as bad input: exit 2, one error line, nothing written."""
    before = run_count(folder)
    proc = rewind(folder, "fork", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    assert run_count(folder) == before
    return lines[0]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path


def test_cli_renamed_node_refuses_the_fork(folder: Path) -> None:
    run_id = record(folder)
    write_pipeline(folder, [("start", "start"), ("widen", "expand"), ("finish", "finish")])

    line = refused(folder, run_id, "--at", "expand")
    assert "node 'expand' renamed to 'widen'" in line and "--allow-code-change" in line
    # Forking after it: the renamed node is inherited, still drift.
    line = refused(folder, run_id, "--at", "finish")
    assert "node 'expand' (inherited) renamed to 'widen'" in line
    # Accepting the drift cannot fork a node that no longer exists: Burr would resume at
    # 'widen', and the next-action check says so instead of running it.
    line = refused(folder, run_id, "--at", "expand", "--allow-code-change")
    assert "would run node 'widen' next, not the fork node 'expand'" in line


def test_cli_inserted_node_refuses_the_fork_unless_allowed(folder: Path) -> None:
    run_id = record(folder)
    write_pipeline(
        folder, [("start", "start"), ("expand", "expand"), ("check", "check"), ("finish", "finish")]
    )

    line = refused(folder, run_id, "--at", "expand")
    assert "node 'check' inserted after 'expand'" in line

    out = ok_json(folder, "fork", run_id, "--at", "expand", "--allow-code-change")
    assert out["run"]["status"] == "completed"
    assert [n["name"] for n in out["nodes"]] == ["start", "expand", "check", "finish"]
    assert out["run"]["drift"]["structural"] == ["node 'check' inserted after 'expand'"]
    assert out["run"]["drift"]["allowed"] is True
    shown = rewind(folder, "show", out["run"]["run_id"])
    assert "graph changed" in shown.stdout and "check" in shown.stdout
    d = ok_json(folder, "diff", run_id, out["run"]["run_id"])
    assert [(n["name"], n["status"]) for n in d["nodes"]] == [
        ("start", "equal"),
        ("expand", "equal"),
        ("check", "only_b"),
        ("finish", "equal"),
    ]


def test_cli_insert_before_the_fork_node_trips_the_next_action_check(folder: Path) -> None:
    run_id = record(folder)
    write_pipeline(
        folder, [("start", "start"), ("prep", "prep"), ("expand", "expand"), ("finish", "finish")]
    )

    assert "node 'prep' inserted after 'start'" in refused(folder, run_id, "--at", "expand")
    # Accepted, the fork would resume into 'prep' (a node nobody asked for): refused all the same.
    line = refused(folder, run_id, "--at", "expand", "--allow-code-change")
    assert "resuming after 'start', the pipeline would run node 'prep' next" in line


def test_cli_removed_node_refuses_the_fork(folder: Path) -> None:
    run_id = record(folder)
    write_pipeline(folder, [("start", "start"), ("expand", "expand")])

    assert "node 'finish' removed" in refused(folder, run_id, "--at", "expand")
    assert "node 'finish' removed" in refused(folder, run_id, "--at", "finish")


def test_cli_code_change_is_allowed_and_labelled(folder: Path) -> None:
    run_id = record(folder)
    tripled = FUNCTIONS["expand"].replace('state["a"] * 2', 'state["a"] * 3')
    write_pipeline(folder, V1, expand=tripled)

    proc = rewind(folder, "fork", run_id, "--at", "expand")
    assert proc.returncode == 0, proc.stderr
    assert "code changed" in proc.stdout  # the fork's own summary and its diff
    assert "the code of expand changed since the recording" in " ".join(proc.stderr.split())

    child = ok_json(folder, "runs")[0]["run_id"]
    shown = ok_json(folder, "show", child)
    assert shown["run"]["drift"]["code_changed"] == ["expand"]
    assert shown["run"]["drift"]["structural"] == [] and shown["run"]["drift"]["checked"]
    assert (
        "code changed since the parent's recording: expand" in rewind(folder, "show", child).stdout
    )

    d = ok_json(folder, "diff", run_id, child)
    rows = {n["name"]: n for n in d["nodes"]}
    assert rows["expand"]["code_changed"] is True and rows["expand"]["status"] == "changed"
    assert rows["expand"]["changes"][0]["path"] == "b[1]"
    assert rows["finish"]["code_changed"] is False and rows["start"]["code_changed"] is False
    assert d["code_changed"] == ["expand"]
    text = rewind(folder, "diff", run_id, child).stdout
    assert "code changed between the runs in: expand" in " ".join(text.split())

    # A comment is not a code change: an unchanged replay of the fork is clean.
    commented = tripled.replace("def expand", "# a comment\ndef expand")
    write_pipeline(folder, V1, expand=commented)
    again = ok_json(folder, "fork", child, "--at", "expand")
    assert again["run"]["drift"]["code_changed"] == []


SCALE_HELPER = """
def scale(v):
    return v * 2
"""


def test_cli_changed_helper_is_named_as_the_cause(folder: Path) -> None:
    """A node whose own body is unchanged but whose helper (in a sibling module of the user's
    code) changed: the fork is labelled code-changed, naming the helper, not blamed on the
    override; library helpers (Burr, the stdlib) are never followed."""
    helpers = folder / "drifty_helpers.py"
    helpers.write_text(SCALE_HELPER, encoding="utf-8")
    uses_helper = """
import drifty_helpers

@action(reads=["a"], writes=["b"])
def expand(state: State) -> State:
    return state.update(b=[state["a"], drifty_helpers.scale(state["a"])])
"""
    write_pipeline(folder, V1, expand=uses_helper)
    out = ok_json(folder, "run", "--pipeline", "drifty:pipeline", "--state", '{"x": 1}')
    run_id = out["run"]["run_id"]
    unchanged = ok_json(folder, "fork", run_id, "--at", "expand")
    assert unchanged["run"]["drift"]["code_changed"] == []

    helpers.write_text(SCALE_HELPER.replace("v * 2", "v * 3"), encoding="utf-8")
    for cached in (folder / "__pycache__").glob("drifty_helpers*"):
        cached.unlink()
    proc = rewind(folder, "fork", run_id, "--at", "expand")
    assert proc.returncode == 0, proc.stderr
    warning = " ".join(proc.stderr.split())
    assert "the code of expand (helper drifty_helpers.scale) changed" in warning, warning
    child = ok_json(folder, "runs")[0]["run_id"]
    drift = ok_json(folder, "show", child)["run"]["drift"]
    assert drift["code_changed"] == ["expand"]
    assert drift["helpers_changed"] == ["expand: drifty_helpers.scale"]
    d = ok_json(folder, "diff", run_id, child)
    rows = {n["name"]: n for n in d["nodes"]}
    assert rows["expand"]["helpers_changed"] == ["drifty_helpers.scale"]
    assert rows["expand"]["code_changed"] is True and rows["start"]["code_changed"] is False


def test_helper_fingerprints_follow_user_code_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "helpers_mod.py").write_text(
        textwrap.dedent(
            """
import json
from burr.core import State, action

def inner(v):
    return v + 1

def outer(v):
    return inner(v) * 2

class Scaler:
    def apply(self, v):
        return outer(v)

@action(reads=["a"], writes=["b"])
def node(state: State) -> State:
    return state.update(b=json.dumps(Scaler().apply(state["a"])))
"""
        ),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "helpers_mod", None)  # removed again after the test
    del sys.modules["helpers_mod"]
    module = importlib.import_module("helpers_mod")
    found = helper_fingerprints(module.node)
    assert set(found) == {"helpers_mod.Scaler", "helpers_mod.outer", "helpers_mod.inner"}
    assert all(len(v) == 64 for v in found.values())
    assert helper_fingerprints(module.node) == found  # deterministic


def test_cli_run_recorded_without_a_graph_forks_with_a_warning(folder: Path) -> None:
    run_id = record(folder)
    con = sqlite3.connect(folder / "store" / "rewind.db")
    with con:
        con.execute("DELETE FROM run_graphs")  # as a store written before graphs were
    con.close()

    proc = rewind(folder, "fork", run_id, "--at", "expand")
    assert proc.returncode == 0, proc.stderr
    assert "drift cannot be checked" in " ".join(proc.stderr.split())
    child = ok_json(folder, "runs")[0]["run_id"]
    assert ok_json(folder, "show", child)["run"]["drift"]["checked"] is False
    assert "drift not checked" in rewind(folder, "show", child).stdout

    # Unchecked, a renamed fork node is still caught by the next-action check.
    write_pipeline(folder, [("start", "start"), ("widen", "expand"), ("finish", "finish")])
    assert "not the fork node 'expand'" in refused(folder, run_id, "--at", "expand")


# -- the API -----------------------------------------------------------------------------------


@action(reads=["x"], writes=["y"])
def api_one(state: State) -> State:
    return state.update(y=state["x"] + 1)


@action(reads=["y"], writes=["z"])
def api_two(state: State) -> State:
    return state.update(z=[state["y"], 0])


@action(reads=["z"], writes=["z"])
def api_extra(state: State) -> State:
    return state.update(z=[-1, *state["z"]])


@action(reads=["z"], writes=["total"])
def api_three(state: State) -> State:
    return state.update(total=len(state["z"]))


def _api_pipeline(**nodes: Any) -> Pipeline:
    names = list(nodes)
    graph = (
        GraphBuilder()
        .with_actions(**nodes)
        .with_transitions(*[(a, b, default) for a, b in itertools.pairwise(names)])
        .build()
    )
    return Pipeline("api-drift", graph, entrypoint=names[0])


def test_api_fork_refuses_drift_with_409_unless_allowed(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from rewind.api import create_app
    from rewind.api.pipelines import PipelineEntry

    def server(pipeline: Pipeline) -> TestClient:
        entry = PipelineEntry.of(pipeline, {"x": 1})
        app = create_app(store, chat_client=None, pipelines={"api-drift": entry})
        return TestClient(app, base_url="http://127.0.0.1")

    store = open_store(tmp_path / "store")
    with server(_api_pipeline(one=api_one, two=api_two, three=api_three)) as client:
        started = client.post("/api/runs", json={"pipeline": "api-drift"})
        assert started.status_code == 202, started.text
        pid = _wait(client, started.json()["run_id"])["run_id"]

    # The server restarts with edited code: a node inserted after 'two'.
    edited = _api_pipeline(one=api_one, two=api_two, extra=api_extra, three=api_three)
    with server(edited) as client:
        before = len(store.list_runs())
        r = client.post(f"/api/runs/{pid}/fork", json={"at": "two"})
        assert r.status_code == 409, r.text
        assert r.json()["error"] == "CodeDrift"
        assert "node 'extra' inserted after 'two'" in r.json()["message"]
        assert len(store.list_runs()) == before

        r = client.post(f"/api/runs/{pid}/fork", json={"at": "two", "allow_code_change": True})
        assert r.status_code == 202, r.text
        child = _wait(client, r.json()["run_id"])
        assert child["status"] == "completed"
        assert child["drift"]["structural"] == ["node 'extra' inserted after 'two'"]
        d = client.get("/api/diff", params={"a": pid, "b": child["run_id"]}).json()
        assert [n["status"] for n in d["nodes"]] == ["equal", "equal", "only_b", "changed"]
    store.close()


def _wait(client: Any, run_id: str) -> dict[str, Any]:
    for _ in range(3000):
        run: dict[str, Any] = client.get(f"/api/runs/{run_id}").json()
        if run["status"] not in ("queued", "running"):
            return run
        time.sleep(0.02)
    raise AssertionError(f"run {run_id} did not finish")


# -- stores written before graphs were recorded ------------------------------------------------


def test_a_run_recorded_before_graphs_were_recorded_forks_with_a_warning(
    tmp_path: Path,
) -> None:
    from sqlalchemy import text

    from rewind.replay import Rewind
    from tests import pipelines

    rw = Rewind(tmp_path / "store")
    parent = rw.record(pipelines.pipeline, {"x": 5})
    assert rw.store.run_graph(parent.run_id) is not None
    with rw.store.write() as conn:
        # As a run recorded before this feature looks once migration 0003 added the table.
        conn.execute(text("DELETE FROM run_graphs"))
    rw.store.close()

    events: list[tuple[str, dict[str, Any]]] = []
    again = Rewind(tmp_path / "store", on_event=lambda e, p: events.append((e, p)))
    assert again.store.run_graph(parent.run_id) is None
    child = again.fork(parent.run_id, at="expand")
    assert child.status == "completed"
    warnings = [p["message"] for e, p in events if e == "warning"]
    assert len(warnings) == 1 and "drift cannot be checked" in warnings[0]
    graph = again.store.run_graph(child.run_id)
    assert graph is not None and graph.drift is not None and graph.drift["checked"] is False
    d = again.diff(parent.run_id, child.run_id)
    assert d.first_divergence is None and not any(n.code_changed for n in d.nodes)
    again.store.close()


def test_recorded_run_graphs_are_immutable(tmp_path: Path) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from rewind.replay import Rewind
    from tests import pipelines

    rw = Rewind(tmp_path / "store")
    run = rw.record(pipelines.pipeline, {"x": 5})
    with pytest.raises(DBAPIError, match="immutable"), rw.store.write() as conn:
        conn.execute(text("UPDATE run_graphs SET graph_hash = 'x'"))
    graph = rw.store.run_graph(run.run_id)
    assert graph is not None and graph.document == pipelines.pipeline.graph_document()
    rw.store.close()


INPROC_PIPELINE = """
from burr.core import State, action, default
from burr.core.graph import GraphBuilder

import inproc_helpers
from rewind.replay import Pipeline


@action(reads=["x"], writes=["a"])
def start(state: State) -> State:
    return state.update(a=state["x"] + 1)


@action(reads=["a"], writes=["b"])
def expand(state: State) -> State:
    return state.update(b=inproc_helpers.scale(state["a"]))


graph = (
    GraphBuilder()
    .with_actions(start=start, expand=expand)
    .with_transitions(("start", "expand", default))
    .build()
)
pipeline = Pipeline("inproc", graph, entrypoint="start", ref="inproc_pipeline:pipeline")
"""


def test_graph_document_and_drift_see_code_edited_and_reloaded_in_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fingerprints are kept per code object within a process (every record and fork builds
    the graph document): editing a node and a helper and reloading their modules between two
    runs of one process must still change the document, and a fork in that process must label
    both changes; an edit that is not reloaded (the code that runs is unchanged) changes
    nothing."""
    from rewind.replay import Rewind

    (tmp_path / "inproc_helpers.py").write_text("def scale(v):\n    return v * 2\n", "utf-8")
    (tmp_path / "inproc_pipeline.py").write_text(INPROC_PIPELINE, "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("inproc_helpers", "inproc_pipeline"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module("inproc_pipeline")
    helpers = importlib.import_module("inproc_helpers")
    rw = Rewind(tmp_path / "store")
    try:
        run = rw.record(module.pipeline, {"x": 1})
        recorded = rw.store.run_graph(run.run_id)
        assert recorded is not None
        assert rw.store.run_graph_hashes([run.run_id, "no-such-run"]) == {
            run.run_id: recorded.graph_hash
        }
        before = module.pipeline.graph_document()
        assert before == module.pipeline.graph_document()  # the cached path: same document

        # Edited on disk but not reloaded: the code that runs is what was recorded.
        (tmp_path / "inproc_pipeline.py").write_text(
            INPROC_PIPELINE.replace('state["x"] + 1', 'state["x"] + 5'), "utf-8"
        )
        (tmp_path / "inproc_helpers.py").write_text("def scale(v):\n    return v * 3\n", "utf-8")
        assert module.pipeline.graph_document() == before
        assert not rw.store.run_graph(rw.replay(run.run_id).run_id).drift["code_changed"]

        for path in tmp_path.glob("__pycache__/inproc_*"):
            path.unlink()
        importlib.reload(helpers)  # the node's module keeps the helper module: seen at once
        helper_edit = module.pipeline.graph_document()
        assert helper_edit["nodes"] == before["nodes"]
        assert helper_edit["helpers"]["expand"] != before["helpers"]["expand"]

        module = importlib.reload(module)
        rw.register(module.pipeline)
        after = module.pipeline.graph_document()
        assert after["nodes"]["start"] != before["nodes"]["start"]
        assert after["nodes"]["expand"] == before["nodes"]["expand"]
        fork = rw.replay(run.run_id)
        assert fork.status == "completed", fork.error
        drift = rw.store.run_graph(fork.run_id).drift
        assert drift["code_changed"] == ["expand", "start"]
        assert drift["helpers_changed"] == ["expand: inproc_helpers.scale"]
        assert [n.output_hash for n in rw.store.nodes_of(fork.run_id)] != [
            n.output_hash for n in rw.store.nodes_of(run.run_id)
        ]
    finally:
        rw.store.close()
