"""Managing runs (issue 14, points 7 and 6): filter the runs list, group job children and
sub-runs, cancel, delete with gc's rules, and live progress of a run another process executes —
over real HTTP (uvicorn on loopback) with API users, on SQLite and PostgreSQL, and the
``rewind delete`` / ``rewind run`` commands as subprocesses.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from burr.core import State, action
from sqlalchemy import func, select, text

from rewind.api import create_app
from rewind.api.pipelines import PipelineEntry
from rewind.replay import Pipeline
from rewind.store import Store, open_store, schema
from rewind.store.users import add_user
from tests import pipelines
from tests.cli_process import run_rewind
from tests.conftest import StoreTarget
from tests.live_server import LiveServer
from tests.model_stub import ModelStub


@action(reads=["total"], writes=["done"])
def conclude(state: State) -> State:
    return state.update(done=state["total"] + 1)


# prepare → hold (blocks until the test releases it) → conclude: a cancel asked while ``hold``
# runs stops the run before ``conclude``.
held = pipelines._linear(
    "held",
    "tests.test_run_management:held",
    prepare=pipelines.prepare,
    hold=pipelines.hold,
    conclude=conclude,
)


@action(reads=["answer", "gate"], writes=["opened"])
def gate(state: State) -> State:
    """Waits (in another process) until the file named by ``gate`` exists."""
    path = Path(state["gate"])
    while not path.exists():
        time.sleep(0.05)
    return state.update(opened=path.read_text())


# ask (one model call: tokens) → gate (waits for a file) → shout
gated = pipelines._linear(
    "gated", "tests.test_run_management:gated", ask=pipelines.ask, gate=gate, shout=pipelines.shout
)


def _factor_hint(node: str, name: str, node_input: dict[str, Any]) -> dict[str, Any] | None:
    if node == "expand" and name == "factor":
        return {"choices": [2, 3, 5], "description": "how much the series is scaled"}
    if node == "start" and name == "offset":
        return {"type": "integer", "min": 0, "max": 100}
    return None


# ``tiny`` whose params declare the values a fork may give them
hinted = Pipeline(
    name="hinted",
    graph=pipelines.graph,
    entrypoint="start",
    ref="tests.test_run_management:hinted",
    param_hints=_factor_hint,
)

REGISTRY = {
    "hinted": PipelineEntry.of(hinted, {"x": 15}),
    "tiny": PipelineEntry.of(pipelines.pipeline, {"x": 15}),
    "failing": PipelineEntry.of(pipelines.failing, {"x": 1}),
    "held": PipelineEntry.of(held, {"x": 1}),
}


class Team:
    """A live server with users alice, carol (team red), bob and root (admin)."""

    def __init__(self, server: LiveServer, store: Store, tokens: dict[str, str]) -> None:
        self.server, self.store, self.tokens = server, store, tokens

    def client(self, name: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.server.url,
            headers={"Authorization": f"Bearer {self.tokens[name]}"},
            trust_env=False,
            timeout=60,
        )

    def start(self, name: str, pipeline: str = "tiny", **body: Any) -> str:
        with self.client(name) as c:
            r = c.post("/api/runs", json={"pipeline": pipeline, **body})
            assert r.status_code == 202, r.text
            return str(r.json()["run_id"])

    def wait(self, name: str, run_id: str, hang_s: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + hang_s
        with self.client(name) as c:
            while time.monotonic() < deadline:
                run: dict[str, Any] = c.get(f"/api/runs/{run_id}").json()
                if run["status"] not in ("queued", "running"):
                    return run
                time.sleep(0.02)
        raise AssertionError(f"run {run_id} did not finish")

    def record(self, name: str, pipeline: str = "tiny", **body: Any) -> dict[str, Any]:
        return self.wait(name, self.start(name, pipeline, **body))

    def fork(self, name: str, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.client(name) as c:
            r = c.post(f"/api/runs/{run_id}/fork", json=body)
            assert r.status_code == 202, r.text
        return self.wait(name, r.json()["run_id"])


@pytest.fixture(autouse=True)
def _reset_blocking() -> Iterator[None]:
    pipelines.BLOCK_ENTERED.clear()
    pipelines.BLOCK_RELEASE.clear()
    yield
    pipelines.BLOCK_RELEASE.set()


def _team(store: Store, workers: int = 2) -> tuple[LiveServer, dict[str, str]]:
    tokens = {
        "alice": add_user(store, "alice", team="red")[1],
        "carol": add_user(store, "carol", team="red")[1],
        "bob": add_user(store, "bob")[1],
        "root": add_user(store, "root", admin=True)[1],
    }
    app = create_app(store, chat_client=None, pipelines=REGISTRY, workers=workers)
    return LiveServer(app), tokens


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    store = open_store(tmp_path / "store")
    server, tokens = _team(store)
    with server:
        yield Team(server, store, tokens)
    store.close()


@pytest.fixture
def team_any(store_target: StoreTarget) -> Iterator[Team]:
    store = store_target.open()
    server, tokens = _team(store)
    with server:
        yield Team(server, store, tokens)
    store.close()


def _error(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert body["error"] == kind and body["message"] and "hint" in body, body
    return body


def _counts(store: Store) -> dict[str, int]:
    with store.read() as conn:
        return {
            t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
            for t in (schema.runs, schema.nodes, schema.burr_state, schema.blobs)
        }


# -- list: filters and grouping ---------------------------------------------------------------


def test_the_runs_list_filters_by_pipeline_status_date_and_text(team: Team) -> None:
    a = team.record("alice", "tiny")
    b = team.record("alice", "failing")
    assert (a["status"], b["status"]) == ("completed", "failed")
    c = team.record("bob", "tiny")  # another user's: never listed for alice
    with team.client("alice") as cl:

        def ids(**params: Any) -> list[str]:
            r = cl.get("/api/runs", params=params)
            assert r.status_code == 200, r.text
            return [x["run_id"] for x in r.json()["runs"]]

        assert ids() == [b["run_id"], a["run_id"]]  # a failed run is listed like any other
        assert ids(status="failed") == [b["run_id"]]
        assert ids(status=["failed", "completed"]) == [b["run_id"], a["run_id"]]
        assert ids(pipeline="tiny") == [a["run_id"]]
        assert ids(q=a["run_id"][:10]) == [a["run_id"]]
        assert ids(q="FAIL") == [b["run_id"]]  # case-insensitive text in the pipeline name
        assert ids(since=b["created_at"]) == [b["run_id"]]
        assert ids(until=b["created_at"]) == [a["run_id"]]
        assert ids(since=time.time() + 60) == []
        assert c["run_id"] not in ids(q=c["run_id"][:10]) + ids(pipeline="tiny")
        _error(cl.get("/api/runs", params={"status": "exploded"}), 422, "InvalidRequest")
    with team.client("root") as cl:  # the admin sees every user's
        assert c["run_id"] in [x["run_id"] for x in cl.get("/api/runs").json()["runs"]]


def test_grid_variants_and_stability_samples_are_grouped_under_their_job(team: Team) -> None:
    parent = team.record("alice", "tiny")
    pid = parent["run_id"]
    factor = {"kind": "param", "node": "expand", "param": "factor"}
    with team.client("alice") as c:
        r = c.post(
            f"/api/runs/{pid}/grid",
            json={"at": 2, "overrides": [factor | {"value": v} for v in (2, 3, 4)]},
        )
        assert r.status_code == 202, r.text
        grid_id = r.json()["id"]
        r = c.post(f"/api/runs/{pid}/stability", json={"from_node": 2, "k": 2})
        assert r.status_code == 202, r.text
        stab_id = r.json()["id"]
        for path in (f"/api/grids/{grid_id}", f"/api/stability/{stab_id}"):
            deadline = time.monotonic() + 120
            while c.get(path).json()["status"] in ("queued", "running"):
                assert time.monotonic() < deadline, path
                time.sleep(0.05)
        plain = team.fork("alice", pid, {"at": 3})  # an ordinary fork stays a child
        body = c.get("/api/runs").json()
    assert len(body["runs"]) == 1 + 3 + 2 + 1
    roots = body["tree"]
    assert [t["run_id"] for t in roots] == [pid]  # no variant or sample is a top-level run
    (item,) = roots
    assert [ch["run_id"] for ch in item["children"]] == [plain["run_id"]]
    jobs = {j["job"]["kind"]: j for j in item["jobs"]}
    assert set(jobs) == {"grid", "stability"}
    assert jobs["grid"]["job"]["count"] == 3 and jobs["stability"]["job"]["count"] == 2
    assert jobs["grid"]["job"]["statuses"] == {"completed": 3}
    assert jobs["grid"]["job"]["parent_run_id"] == pid
    grid_runs = {ch["run_id"] for ch in jobs["grid"]["children"]}
    by_id = {r["run_id"]: r for r in body["runs"]}
    assert all(by_id[x]["config"]["purpose"] == "grid" for x in grid_runs)
    # filtered to the variants only, the job is a root of its own
    with team.client("alice") as c:
        body = c.get("/api/runs", params={"q": "grid variant"}).json()
        body = c.get("/api/runs", params={"since": by_id[min(grid_runs)]["created_at"] - 0.001})
        roots = body.json()["tree"]
    assert all(t["run_id"] is None or t["run_id"] != pid for t in roots)


def test_sub_runs_are_grouped_under_the_run_that_spawned_them(tmp_path: Path) -> None:
    from rewind import Rewind
    from rewind.engine import attach
    from tests import burr_apps

    with ModelStub() as stub:
        env = {"OPENAI_BASE_URL": stub.base_url, "OPENAI_API_KEY": "sk-test-not-a-real-key"}
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            rw = Rewind(tmp_path / "store")
            app = attach(
                burr_apps.sdk_recursive_application(),
                ref="tests.burr_apps:sdk_recursive_application",
            )
            parent = rw.record(app, inputs={"question": "why?"})
    with LiveServer(create_app(rw.store, chat_client=None)) as server:
        body = httpx.get(f"{server.url}/api/runs", trust_env=False).json()
        deleted = httpx.delete(f"{server.url}/api/runs/{parent.run_id}", trust_env=False)
        sub_id = body["sub_runs"][0]["run_id"]
        refused = httpx.delete(f"{server.url}/api/runs/{sub_id}", trust_env=False)
    assert [r["run_id"] for r in body["runs"]] == [parent.run_id]
    (item,) = body["tree"]
    assert len(item["sub_runs"]) == 2 and len(body["sub_runs"]) == 2
    assert {s["run_id"] for s in item["sub_runs"]} == {r["run_id"] for r in body["sub_runs"]}
    assert all(r["spawning_run_id"] == parent.run_id for r in body["sub_runs"])
    # the parent goes with its sub-runs; a sub-run alone is never deleted
    assert deleted.status_code == 200, deleted.text
    assert sorted(deleted.json()["sub_runs"]) == sorted(r["run_id"] for r in body["sub_runs"])
    _error(refused, 404, "UnknownRun")  # gone with its spawning run
    assert rw.store.list_runs(include_sub_runs=True) == []
    rw.store.close()


def test_a_sub_run_alone_cannot_be_deleted(tmp_path: Path) -> None:
    from rewind import Rewind
    from rewind.engine import attach
    from tests import burr_apps

    with ModelStub() as stub, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_BASE_URL", stub.base_url)
        mp.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
        rw = Rewind(tmp_path / "store")
        app = attach(
            burr_apps.sdk_recursive_application(), ref="tests.burr_apps:sdk_recursive_application"
        )
        parent = rw.record(app, inputs={"question": "why?"})
    sub = rw.store.sub_runs(parent.run_id)[0]
    before = _counts(rw.store)
    with LiveServer(create_app(rw.store, chat_client=None)) as server:
        r = httpx.delete(f"{server.url}/api/runs/{sub.run_id}", trust_env=False)
        cancel = httpx.post(f"{server.url}/api/runs/{sub.run_id}/cancel", trust_env=False)
    body = _error(r, 409, "RunInUse")
    assert "sub-run" in body["message"] and parent.run_id[:12] in body["hint"]
    body = _error(cancel, 409, "RunBusy")  # a sub-run stops with its spawning run
    assert parent.run_id[:12] in body["hint"]
    assert _counts(rw.store) == before
    rw.store.close()


# -- fork hints -------------------------------------------------------------------------------


def test_fork_hints_show_the_declared_values_and_forks_outside_them_are_refused(
    team: Team,
) -> None:
    run = team.record("alice", "hinted")
    rid = run["run_id"]
    with team.client("alice") as c:
        node = c.get(f"/api/runs/{rid}/nodes/expand").json()
        assert node["param_hints"] == {
            "factor": {"choices": [2, 3, 5], "description": "how much the series is scaled"}
        }
        first = c.get(f"/api/runs/{rid}/nodes/1").json()
        assert first["param_hints"] == {"offset": {"type": "integer", "min": 0, "max": 100}}
        before = _counts(team.store)
        change = {"kind": "param", "node": "expand", "param": "factor"}
        body = _error(
            c.post(f"/api/runs/{rid}/fork", json={"at": 2, "override": change | {"value": 4}}),
            422,
            "InvalidOverride",
        )
        assert "allowed values: 2, 3, 5" in body["message"] and body["field"] == "override.value"
        offset = {"kind": "param", "node": "start", "param": "offset", "value": 101}
        body = _error(
            c.post(f"/api/runs/{rid}/fork", json={"at": 1, "override": offset}),
            422,
            "InvalidOverride",
        )
        assert "must be from 0 to 100" in body["message"]
        # a grid checks every variant the same way, before any runs
        grid = {"at": 2, "overrides": [change | {"value": 3}, change | {"value": 7}]}
        body = _error(c.post(f"/api/runs/{rid}/grid", json=grid), 422, "InvalidOverride")
        assert body["field"] == "overrides.1.value"
        assert _counts(team.store) == before  # nothing written
        r = c.post(f"/api/runs/{rid}/fork", json={"at": 2, "override": change | {"value": 5}})
        assert r.status_code == 202, r.text
    assert team.wait("alice", r.json()["run_id"])["status"] == "completed"
    with team.client("alice") as c:  # a pipeline without hints: none
        plain = team.record("alice", "tiny")
        assert c.get(f"/api/runs/{plain['run_id']}/nodes/2").json()["param_hints"] == {}


def test_the_demo_pipeline_declares_its_analyse_choices() -> None:
    from rewind.engine.plan import hint_problem
    from rewind.examples import research, weather

    selection = {"values": [1.0], "dates": ["2012-01-01"], "categories": {"weather": ["rain"]}}
    node_input = {"reads": {"selection": selection}}
    group_by = research.param_hints("analyse", "group_by", node_input)
    assert group_by is not None
    assert group_by["choices"] == [*weather.DATE_GROUP_BYS, "weather"]
    aggregate = research.param_hints("analyse", "aggregate", node_input)
    assert aggregate is not None and aggregate["choices"] == list(weather.AGGREGATES)
    assert research.param_hints("plan", "temperature", {})["max"] == 2  # type: ignore[index]
    assert hint_problem(aggregate, "mode") is not None and hint_problem(aggregate, "sum") is None
    assert hint_problem({"type": "integer", "min": 1, "max": 9}, 2.5) == "must be an integer"
    assert hint_problem({"type": "number", "min": 0, "max": 2}, True) == "must be a number"


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_stops_a_running_run_at_its_next_node(team: Team) -> None:
    rid = team.start("alice", "held")
    assert pipelines.BLOCK_ENTERED.wait(60)
    with team.client("carol") as c:  # a teammate sees it but may not cancel it
        _error(c.post(f"/api/runs/{rid}/cancel"), 403, "NotOwner")
    with team.client("bob") as c:  # another user does not even see it
        _error(c.post(f"/api/runs/{rid}/cancel"), 404, "UnknownRun")
    with team.client("alice") as c:
        r = c.post(f"/api/runs/{rid}/cancel")
        assert r.status_code == 202, r.text
        assert r.json()["status"] == "cancelling"
        assert c.get(f"/api/runs/{rid}/progress").json()["cancel_requested"]["by"] == "alice"
    pipelines.BLOCK_RELEASE.set()
    run = team.wait("alice", rid)
    assert run["status"] == "cancelled", run
    assert "cancelled by alice before node 3 (conclude)" in run["error"]
    assert [n.name for n in team.store.nodes_of(rid)] == ["prepare", "hold"]
    with team.client("alice") as c:
        _error(c.post(f"/api/runs/{rid}/cancel"), 409, "NotRunning")
        # a cancelled run is finished: it can be forked to continue
        r = c.post(f"/api/runs/{rid}/fork", json={"at": 2})
        assert r.status_code == 202, r.text
    assert team.wait("alice", r.json()["run_id"])["status"] == "completed"


def test_cancel_of_a_queued_run_ends_it_before_any_node(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    server, tokens = _team(store, workers=1)
    with server:
        team = Team(server, store, tokens)
        first = team.start("root", "held")
        assert pipelines.BLOCK_ENTERED.wait(60)
        queued = team.start("root", "tiny")  # waits for the one worker
        with team.client("root") as c:
            assert c.get(f"/api/runs/{queued}").json()["status"] == "queued"
            r = c.post(f"/api/runs/{queued}/cancel")
            assert r.status_code == 202, r.text
        pipelines.BLOCK_RELEASE.set()
        assert team.wait("root", first)["status"] == "completed"
        run = team.wait("root", queued)
    assert run["status"] == "cancelled", run
    assert store.nodes_of(queued) == []
    store.close()


# -- delete -----------------------------------------------------------------------------------


def test_delete_keeps_ancestors_of_kept_runs_and_unreferenced_blobs_only(team_any: Team) -> None:
    team = team_any
    shared = team.record("alice", "tiny")  # same input as `parent`: shares its blobs
    parent = team.record("alice", "tiny", state={"x": 7})
    fork = team.fork(
        "alice",
        parent["run_id"],
        {"at": 2, "override": {"kind": "param", "node": "expand", "param": "factor", "value": 9}},
    )
    pid, fid = parent["run_id"], fork["run_id"]
    before = _counts(team.store)
    with team.client("carol") as c:
        _error(c.delete(f"/api/runs/{fid}"), 403, "NotOwner")
    with team.client("bob") as c:
        _error(c.delete(f"/api/runs/{fid}"), 404, "UnknownRun")
    with team.client("alice") as c:
        body = _error(c.delete(f"/api/runs/{pid}"), 409, "RunInUse")
        assert fid[:12] in body["message"] and "forks first" in body["hint"]
        assert _counts(team.store) == before  # nothing written
        dry = c.delete(f"/api/runs/{fid}", params={"dry_run": True})
        assert dry.status_code == 200 and dry.json()["dry_run"] is True and dry.json()["rows"] > 0
        assert _counts(team.store) == before
        r = c.delete(f"/api/runs/{fid}")
        assert r.status_code == 200, r.text
        assert r.json()["run_id"] == fid and r.json()["blobs_deleted"] > 0
        _error(c.get(f"/api/runs/{fid}"), 404, "UnknownRun")
    with team.client("root") as c:  # an admin deletes anyone's run
        r = c.delete(f"/api/runs/{pid}")
        assert r.status_code == 200, r.text
    with team.client("alice") as c:
        listed = [x["run_id"] for x in c.get("/api/runs").json()["runs"]]
        assert listed == [shared["run_id"]]
        # the kept run reads in full: every blob it names is still there
        for n in range(1, 4):
            assert c.get(f"/api/runs/{shared['run_id']}/nodes/{n}").status_code == 200
        r = c.post(f"/api/runs/{shared['run_id']}/replay", json={"at": 1})
        assert r.status_code == 202, r.text
    replay = team.wait("alice", r.json()["run_id"])
    assert replay["status"] == "completed" and replay["tokens"] == 0
    with team.store.read() as conn:
        assert conn.execute(select(func.count()).select_from(schema.archive_permits)).scalar() == 0
        left = conn.execute(
            select(func.count()).select_from(schema.nodes).where(schema.nodes.c.run_id == pid)
        ).scalar()
    assert left == 0
    # node rows stay immutable outside a permit: a plain delete is still refused
    with pytest.raises(Exception, match=r"(?i)immutable"), team.store.write() as conn:
        conn.execute(text("DELETE FROM nodes WHERE run_id = :r"), {"r": shared["run_id"]})


def test_a_running_run_cannot_be_deleted(team: Team) -> None:
    rid = team.start("alice", "held")
    assert pipelines.BLOCK_ENTERED.wait(60)
    with team.client("alice") as c:
        body = _error(c.delete(f"/api/runs/{rid}"), 409, "RunBusy")
        assert "cancel it" in body["hint"]
    pipelines.BLOCK_RELEASE.set()
    team.wait("alice", rid)


def test_cli_delete(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    rec = run_rewind(
        "run", "--pipeline", "tests.pipelines:pipeline", "--state", '{"x": 15}',
        "--store", str(store_dir),
    )  # fmt: skip
    assert rec.returncode == 0, rec.stderr
    store = open_store(store_dir)
    (run,) = store.list_runs()
    store.close()
    fork = run_rewind("fork", run.run_id[:10], "--at", "2", "--store", str(store_dir), "--json")
    assert fork.returncode == 0, fork.stderr
    fork_id = json.loads(fork.stdout)["run"]["run_id"]
    refused = run_rewind("delete", run.run_id[:10], "--yes", "--store", str(store_dir))
    assert refused.returncode == 2
    assert "fork(s) that descend from it" in refused.stderr and fork_id[:12] in refused.stderr
    unconfirmed = run_rewind("delete", fork_id, "--store", str(store_dir))
    assert unconfirmed.returncode == 2 and "pass --yes" in unconfirmed.stderr
    dry = run_rewind("delete", fork_id, "--dry-run", "--json", "--store", str(store_dir))
    assert dry.returncode == 0 and json.loads(dry.stdout)["dry_run"] is True, dry.stderr
    done = run_rewind("delete", fork_id, "--yes", "--json", "--store", str(store_dir))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["run_id"] == fork_id
    done = run_rewind("delete", run.run_id[:10], "-y", "--store", str(store_dir))
    assert done.returncode == 0 and "deleted run" in done.stdout, done.stderr
    store = open_store(store_dir)
    assert store.list_runs() == []
    store.close()


# -- live progress of a run another process executes ------------------------------------------


@pytest.mark.slow
def test_a_run_in_another_process_shows_its_running_node_and_tokens(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = open_store(store_dir)
    opener = tmp_path / "gate"
    with ModelStub() as stub, LiveServer(create_app(store, chat_client=None)) as server:
        env = {"REWIND_BASE_URL": stub.base_url, "REWIND_API_KEY": "x", "REWIND_MODEL": "stub"}
        state = json.dumps({"question": "why?", "gate": str(opener)})
        pool = ThreadPoolExecutor(1)
        proc = pool.submit(_rewind_run_gated, state, store_dir, env)
        try:
            graph = _wait_for_running(server.url, "gate")
            rid = graph["run"]["run_id"]
            assert graph["run"]["status"] == "running"
            assert graph["running"]["name"] == "gate" and graph["running"]["number"] == 2
            statuses = {n["name"]: n["status"] for n in graph["nodes"]}
            assert statuses == {"ask": "executed", "gate": "running", "shout": "pending"}
            ask_tokens = store.nodes_of(rid)[0].tokens
            assert ask_tokens > 0 and graph["run"]["tokens"] == ask_tokens
            detail = httpx.get(f"{server.url}/api/runs/{rid}", trust_env=False).json()
            assert detail["tokens"] == ask_tokens and detail["live"] is False
            prog = httpx.get(f"{server.url}/api/runs/{rid}/progress", trust_env=False).json()
            assert prog["node"]["name"] == "gate" and prog["executing_here"] is False
            # the event stream of this server follows the store: a refresh names the node
            with httpx.stream(
                "GET", f"{server.url}/api/runs/{rid}/events", trust_env=False, timeout=60
            ) as events:
                seen = []
                for line in events.iter_lines():
                    if line.startswith("data:"):
                        item = json.loads(line[5:])
                        seen.append(item)
                        if item["event"] == "refresh":
                            opener.write_text("open")
                        if item["event"] == "run_finished":
                            break
            refresh = next(e for e in seen if e["event"] == "refresh")
            assert refresh["running"]["name"] == "gate" and refresh["tokens"] == ask_tokens
            assert seen[-1]["status"] == "completed"
            done = proc.result(120)
            assert done.returncode == 0, done.stderr
        finally:
            opener.write_text("open")
            pool.shutdown()
        final = httpx.get(f"{server.url}/api/runs/{rid}/graph", trust_env=False).json()
    store.close()
    assert final["running"] is None and final["run"]["status"] == "completed"


def _rewind_run_gated(
    state: str, store_dir: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """``rewind run`` of the ``gated`` pipeline in another process (the CLI fork server's)."""
    pipeline = "tests.test_run_management:gated"
    return run_rewind("run", "--pipeline", pipeline, "--state", state, "--store", str(store_dir),
                      env=env, timeout=120)  # fmt: skip


def _wait_for_running(url: str, node: str, hang_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + hang_s
    while time.monotonic() < deadline:
        runs = httpx.get(f"{url}/api/runs", trust_env=False).json()["runs"]
        if runs:
            graph: dict[str, Any] = httpx.get(
                f"{url}/api/runs/{runs[0]['run_id']}/graph", trust_env=False
            ).json()
            if (graph.get("running") or {}).get("name") == node:
                return graph
        time.sleep(0.05)
    raise AssertionError(f"no run reached {node}")


@pytest.mark.slow
def test_rewind_cancel_stops_a_run_another_process_executes(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = open_store(store_dir)
    opener = tmp_path / "gate"
    with ModelStub() as stub, LiveServer(create_app(store, chat_client=None)) as server:
        env = {"REWIND_BASE_URL": stub.base_url, "REWIND_API_KEY": "x", "REWIND_MODEL": "stub"}
        state = json.dumps({"question": "why?", "gate": str(opener)})
        pool = ThreadPoolExecutor(1)
        proc = pool.submit(_rewind_run_gated, state, store_dir, env)
        try:
            rid = _wait_for_running(server.url, "gate")["run"]["run_id"]
            cancel = run_rewind("cancel", rid[:10], "--store", str(store_dir))
            assert cancel.returncode == 0, cancel.stderr
            assert "stops before its next node" in cancel.stdout
            opener.write_text("open")
            proc.result(120)
        finally:
            opener.write_text("open")
            pool.shutdown()
        run = httpx.get(f"{server.url}/api/runs/{rid}", trust_env=False).json()
    assert run["status"] == "cancelled", run
    assert "before node 3 (shout)" in run["error"]
    assert [n.name for n in store.nodes_of(rid)] == ["ask", "gate"]
    again = run_rewind("cancel", rid, "--store", str(store_dir))
    assert again.returncode == 2 and "already finished (cancelled)" in again.stderr
    store.close()


def test_a_job_that_failed_before_its_run_row_is_listed_as_failed(tmp_path: Path) -> None:
    from rewind.api.manage import unrecorded_runs
    from rewind.api.runner import RunJob

    store = open_store(tmp_path / "store")
    with store.write() as conn:
        store.create_run(conn, run_id="r" * 32, pipeline="tiny")

    def never(_rw: Any) -> Any:
        raise AssertionError("not executed here")

    failed = RunJob("f" * 32, "fork", "tiny", never, parent_run_id="p" * 32, state="done")
    failed.error = "the parent run was deleted"
    queued = RunJob("q" * 32, "record", "failing", never)
    recorded = RunJob("r" * 32, "record", "tiny", never, state="done")
    jobs = [failed, queued, recorded]
    listed = unrecorded_runs(store, jobs, set())
    assert [(r.run_id[0], r.status) for r in listed] == [("q", "queued"), ("f", "failed")]
    assert listed[1].error == "the parent run was deleted"
    only_failed = unrecorded_runs(store, jobs, set(), statuses=["failed"])
    assert [r.run_id[0] for r in only_failed] == ["f"]
    assert unrecorded_runs(store, jobs, set(), pipeline="failing")[0].run_id[0] == "q"
    assert unrecorded_runs(store, jobs, set(), q="deleted")[0].run_id[0] == "f"
    store.close()


def test_a_run_with_a_queued_fork_is_not_deleted(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    server, tokens = _team(store, workers=1)
    with server:
        team = Team(server, store, tokens)
        parent = team.record("root", "tiny")
        blocker = team.start("root", "held")
        assert pipelines.BLOCK_ENTERED.wait(60)
        with team.client("root") as c:
            r = c.post(f"/api/runs/{parent['run_id']}/fork", json={"at": 2})
            assert r.status_code == 202, r.text
            body = _error(c.delete(f"/api/runs/{parent['run_id']}"), 409, "RunBusy")
            assert "queued fork" in body["message"]
        pipelines.BLOCK_RELEASE.set()
        team.wait("root", blocker)
        assert team.wait("root", r.json()["run_id"])["status"] == "completed"
    store.close()
