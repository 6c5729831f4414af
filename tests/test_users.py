"""API users and run isolation, over real HTTP (uvicorn on loopback) on SQLite and PostgreSQL.

Four users share one server: alice and carol (team ``red``), bob (no team) and root (admin).
Each sees, reads, forks, diffs, audits and streams only their own runs and their team's; root
sees all; another user's run answers exactly like a run that does not exist (404). Tokens are
stored as SHA-256 only; a revoked token gets 401; ``bearer`` is accepted in any case.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from rewind.api import create_app
from rewind.api.pipelines import PipelineEntry
from rewind.api.security import bearer_token
from rewind.store import Store, schema
from rewind.store.users import add_user, list_users, revoke_user, rotate_token
from tests import pipelines
from tests.cli_process import run_rewind
from tests.conftest import StoreTarget
from tests.live_server import LiveServer
from tests.test_api import publisher

REGISTRY = {
    "tiny": PipelineEntry.of(pipelines.pipeline, {"x": 15}),
    "publisher": PipelineEntry.of(publisher, {"text": "hello"}),
}
SECURITY_HEADERS = ("content-security-policy", "x-content-type-options", "x-frame-options")


@dataclass
class Team:
    """A live server with four users; ``client(name)`` speaks as one of them."""

    server: LiveServer
    store: Store
    tokens: dict[str, str]

    def client(self, name: str | None, scheme: str = "Bearer") -> httpx.Client:
        headers = {"Authorization": f"{scheme} {self.tokens[name]}"} if name else {}
        return httpx.Client(base_url=self.server.url, headers=headers, trust_env=False)

    def record(self, name: str, pipeline: str = "tiny") -> str:
        with self.client(name) as c:
            r = c.post("/api/runs", json={"pipeline": pipeline})
            assert r.status_code == 202, r.text
            return self.wait(name, r.json()["run_id"])

    def fork(self, name: str, run_id: str, body: dict[str, Any] | None = None) -> str:
        with self.client(name) as c:
            r = c.post(f"/api/runs/{run_id}/fork", json=body or {"at": 2})
            assert r.status_code == 202, r.text
            return self.wait(name, r.json()["run_id"])

    def wait(self, name: str, run_id: str, hang_s: float = 120.0) -> str:
        deadline = time.monotonic() + hang_s
        with self.client(name) as c:
            while time.monotonic() < deadline:
                run = c.get(f"/api/runs/{run_id}").json()
                if run["status"] not in ("queued", "running"):
                    assert run["status"] == "completed", run
                    return run_id
                time.sleep(0.02)
        raise AssertionError(f"run {run_id} did not finish")

    def wait_job(self, name: str, path: str, hang_s: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + hang_s
        with self.client(name) as c:
            while time.monotonic() < deadline:
                job: dict[str, Any] = c.get(path).json()
                if job["status"] not in ("queued", "running"):
                    return job
                time.sleep(0.05)
        raise AssertionError(f"job {path} did not finish")


@pytest.fixture
def team(store_target: StoreTarget) -> Iterator[Team]:
    store = store_target.open()
    tokens = {
        "alice": add_user(store, "alice", team="red")[1],
        "carol": add_user(store, "carol", team="red")[1],
        "bob": add_user(store, "bob")[1],
        "root": add_user(store, "root", admin=True)[1],
    }
    app = create_app(store, chat_client=None, pipelines=REGISTRY, workers=2)
    with LiveServer(app) as server:
        yield Team(server, store, tokens)
    store.close()


def _is_404_unknown_run(r: httpx.Response) -> None:
    assert r.status_code == 404, r.text
    body = r.json()
    assert body["error"] == "UnknownRun" and body["message"].startswith("unknown run")
    assert set(body) >= {"error", "message", "hint"}


def test_requests_without_a_valid_token_get_401_with_the_error_envelope(team: Team) -> None:
    with team.client(None) as c:
        for r in (
            c.get("/api/runs"),
            c.get("/api/health"),
            c.post("/api/runs", json={"pipeline": "tiny"}),
            c.get("/api/runs", headers={"Authorization": "Bearer rwd_not-a-token"}),
            c.get("/api/runs", headers={"Authorization": f"Basic {team.tokens['alice']}"}),
            c.get("/api/runs", headers={"Authorization": "Bearer"}),
        ):
            assert r.status_code == 401, r.text
            assert r.json()["error"] == "Unauthorized" and r.json()["hint"]
            assert r.headers["www-authenticate"] == "Bearer"
            assert all(h in r.headers for h in SECURITY_HEADERS)
        assert c.get("/").status_code == 200  # the UI shell holds no data
    assert team.store.list_runs() == []  # the refused POST started nothing


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer", "bEaReR"])
def test_the_bearer_scheme_is_case_insensitive(team: Team, scheme: str) -> None:
    with team.client("alice", scheme) as c:
        r = c.get("/api/runs")
    assert r.status_code == 200, r.text


def test_each_user_lists_and_reads_only_their_own_and_their_teams_runs(team: Team) -> None:
    a, b = team.record("alice"), team.record("bob")
    assert team.store.get_run(a).created_by == "alice"
    assert team.store.get_run(b).created_by == "bob"

    def listed(name: str) -> set[str]:
        with team.client(name) as c:
            return {r["run_id"] for r in c.get("/api/runs").json()["runs"]}

    assert listed("alice") == {a}
    assert listed("carol") == {a}  # same team
    assert listed("bob") == {b}
    assert listed("root") == {a, b}

    with team.client("bob") as c:
        for path in (
            f"/api/runs/{a}",
            f"/api/runs/{a[:12]}",  # a prefix resolves only among visible runs' answers
            f"/api/runs/{a}/graph",
            f"/api/runs/{a}/nodes",
            f"/api/runs/{a}/nodes/1",
            f"/api/runs/{a}/nodes/1/output",
            f"/api/runs/{a}/cost?against={b}",
            f"/api/runs/{b}/cost?against={a}",
            f"/api/runs/{a}/artifacts",
            f"/api/runs/{a}/audit",
            f"/api/runs/{b}/audit?against={a}",
            f"/api/runs/{a}/live-fork-resources?at=2",
            f"/api/runs/{a}/events",
            f"/api/diff?a={a}&b={b}",
            f"/api/diff?a={b}&b={a}",
            f"/api/grids?run_id={a}",
        ):
            _is_404_unknown_run(c.get(path))
        # The same answer as an id that exists nowhere: nothing tells the two apart.
        missing = c.get("/api/runs/0123456789abcdef").json()
        hidden = c.get(f"/api/runs/{a}").json()
        assert {k: v for k, v in missing.items() if k != "message"} == {
            k: v for k, v in hidden.items() if k != "message"
        }
        assert c.get(f"/api/runs/{b}").status_code == 200
    with team.client("carol") as c:
        assert c.get(f"/api/runs/{a}").json()["created_by"] == "alice"
        assert c.get(f"/api/diff?a={a}&b={a}").status_code == 200
    with team.client("root") as c:
        assert c.get(f"/api/diff?a={a}&b={b}").status_code == 200


def test_a_run_id_prefix_resolves_among_the_runs_a_user_sees(team: Team) -> None:
    ids = {"alice": "5eed" + "a" * 28, "bob": "5eed" + "b" * 28}
    for name, run_id in ids.items():
        with team.store.write() as conn:
            team.store.create_run(
                conn, run_id=run_id, pipeline="tiny", pipeline_ref="", created_by=name
            )
        team.store.finish_run(run_id, "completed")
    for name, run_id in ids.items():
        with team.client(name) as c:
            r = c.get("/api/runs/5eed")
            assert r.status_code == 200, r.text  # not "matches several runs": one is not theirs
            assert r.json()["run_id"] == run_id
    with team.client("root") as c:
        r = c.get("/api/runs/5eed")
        assert r.status_code == 404 and "matches several runs" in r.json()["message"]
    with team.client("carol") as c:  # alice's team
        assert c.get("/api/runs/5eed").json()["run_id"] == ids["alice"]
        _is_404_unknown_run(c.get(f"/api/runs/{ids['bob'][:10]}"))


def test_forks_belong_to_the_requester_and_others_cannot_fork(team: Team) -> None:
    a = team.record("alice")
    with team.client("bob") as c:
        for path, body in (
            (f"/api/runs/{a}/fork", {"at": 2}),
            (f"/api/runs/{a}/replay", {"at": 1}),
            (f"/api/runs/{a}/grid", {"at": 2, "overrides": [_factor(3)]}),
            (f"/api/runs/{a}/stability", {"k": 2, "from_node": 2}),
        ):
            _is_404_unknown_run(c.post(path, json=body))
    own = team.fork("alice", a)
    mate = team.fork("carol", a, {"at": 2, "override": _factor(5)})
    admins = team.fork("root", a)
    assert team.store.get_run(own).created_by == "alice"
    assert team.store.get_run(mate).created_by == "carol"
    assert team.store.get_run(admins).created_by == "root"
    with team.client("alice") as c:
        run = c.get(f"/api/runs/{a}").json()
        assert {x["run_id"] for x in run["children"]} == {own, mate}  # not root's fork
        _is_404_unknown_run(c.get(f"/api/runs/{admins}"))
        assert c.get(f"/api/runs/{mate}").json()["ancestors"][0]["run_id"] == a
    with team.client("root") as c:
        assert {x["run_id"] for x in c.get(f"/api/runs/{a}").json()["children"]} == {
            own,
            mate,
            admins,
        }


def test_grid_variants_and_stability_samples_belong_to_the_requester(team: Team) -> None:
    a = team.record("alice")
    with team.client("carol") as c:
        r = c.post(f"/api/runs/{a}/grid", json={"at": 2, "overrides": [_factor(3), _factor(4)]})
        assert r.status_code == 202, r.text
        grid_id = r.json()["id"]
        r = c.post(f"/api/runs/{a}/stability", json={"k": 2, "from_node": 2})
        assert r.status_code == 202, r.text
        stability_id = r.json()["id"]
    grid = team.wait_job("carol", f"/api/grids/{grid_id}")
    stab = team.wait_job("carol", f"/api/stability/{stability_id}")
    assert grid["status"] == "completed" and stab["status"] == "completed", (grid, stab)
    made = [f["run_id"] for f in grid["progress"]["forks"] + stab["progress"]["forks"]]
    assert len(made) == 4
    assert {team.store.get_run(x).created_by for x in made} == {"carol"}
    with team.client("bob") as c:
        assert c.get(f"/api/grids/{grid_id}").status_code == 404
        assert c.get(f"/api/stability/{stability_id}").status_code == 404
        assert c.get("/api/grids").json()["jobs"] == []
        assert c.get("/api/stability").json()["jobs"] == []
        for x in made:
            _is_404_unknown_run(c.get(f"/api/runs/{x}"))
    with team.client("alice") as c:  # same team
        assert c.get(f"/api/grids/{grid_id}").status_code == 200
        assert [j["id"] for j in c.get("/api/stability").json()["jobs"]] == [stability_id]


def test_artifacts_and_events_of_another_users_run_are_404(team: Team) -> None:
    a = team.record("alice", "publisher")
    with team.client("alice") as c:
        (artifact,) = c.get(f"/api/runs/{a}/artifacts").json()["artifacts"]
        assert c.get(artifact["url"]).status_code == 200
        with c.stream("GET", f"/api/runs/{a}/events") as events:
            assert events.status_code == 200
            text = "".join(events.iter_text())
        assert "run_finished" in text
    with team.client("bob") as c:
        _is_404_unknown_run(c.get(artifact["url"]))
        with c.stream("GET", f"/api/runs/{a}/events") as events:
            assert events.status_code == 404
            assert events.headers["content-type"].startswith("application/json")


def test_the_trace_service_is_an_admins_and_settings_name_the_user(team: Team) -> None:
    with team.client("alice") as c:
        r = c.get("/api/traces")
        assert r.status_code == 403 and r.json()["error"] == "Forbidden"
        assert c.get("/api/settings").json()["auth"] == {
            "token_required": True,
            "user": "alice",
            "admin": False,
        }
    with team.client("root") as c:
        assert c.get("/api/traces").status_code == 200


def test_a_revoked_or_rotated_token_gets_401(team: Team) -> None:
    with team.client("bob") as c:
        assert c.get("/api/runs").status_code == 200
        revoke_user(team.store, "bob")
        r = c.get("/api/runs")
        assert r.status_code == 401 and r.json()["error"] == "Unauthorized"
    _, new = rotate_token(team.store, "alice")
    with team.client("alice") as c:
        assert c.get("/api/runs").status_code == 401
    with httpx.Client(
        base_url=team.server.url, headers={"Authorization": f"bearer {new}"}, trust_env=False
    ) as c:
        assert c.get("/api/runs").status_code == 200


def test_tokens_are_stored_only_as_sha256(store_target: StoreTarget) -> None:
    store = store_target.open()
    try:
        user, token = add_user(store, "dana", team="ops")
        assert token.startswith("rwd_") and len(token) > 40
        with store.read() as conn:
            rows = [tuple(r) for r in conn.execute(select(schema.users)).all()]
        assert len(rows) == 1
        assert not any(token in str(v) for v in rows[0])
        assert hashlib.sha256(token.encode()).hexdigest() in rows[0]
        assert list_users(store)[0].to_json() == user.to_json()
        if store_target.backend == "sqlite":
            store.close()
            files = [p for p in Path(store_target.root).iterdir() if p.name.startswith("rewind")]
            assert files and not any(token.encode() in p.read_bytes() for p in files)
    finally:
        store.close()


def test_a_store_without_users_stays_open_until_the_first_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rewind.store import open_store

    # That the server looks again, not how often (1 s): it looks every 0.05 s here.
    monkeypatch.setattr("rewind.api.middleware._USERS_RECHECK_S", 0.05)
    store = open_store(tmp_path / "store")
    app = create_app(store, chat_client=None, pipelines=REGISTRY)
    with LiveServer(app) as server, httpx.Client(base_url=server.url, trust_env=False) as c:
        assert c.get("/api/runs").status_code == 200
        r = c.post("/api/runs", json={"pipeline": "tiny"})
        assert r.status_code == 202
        unowned = r.json()["run_id"]
        server.wait_finished(unowned)
        assert store.get_run(unowned).created_by is None
        _, token = add_user(store, "erin")
        deadline = time.monotonic() + 30
        while c.get("/api/runs").status_code != 401:  # the server looks again soon
            assert time.monotonic() < deadline, "the server never noticed the first user"
            time.sleep(0.1)
        auth = {"Authorization": f"Bearer {token}"}
        assert c.get("/api/runs", headers=auth).json()["runs"] == []  # unowned: admins only
        _is_404_unknown_run(c.get(f"/api/runs/{unowned}", headers=auth))
    store.close()


def test_require_auth_refuses_everyone_while_the_store_has_no_users(tmp_path: Path) -> None:
    from rewind.store import open_store

    store = open_store(tmp_path / "store")
    app = create_app(store, chat_client=None, pipelines=REGISTRY, require_auth=True)
    with LiveServer(app) as server, httpx.Client(base_url=server.url, trust_env=False) as c:
        assert c.get("/api/runs").status_code == 401
    store.close()


def test_bearer_token_parsing() -> None:
    assert bearer_token("bearer abc") == "abc"
    assert bearer_token("  BEARER   abc  ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token("") is None
    assert bearer_token(None) is None
    assert bearer_token("Bearerabc") is None


def test_the_browser_ui_takes_a_token_and_shows_only_that_users_runs(
    tmp_path: Path, browser: Any
) -> None:
    import playwright.sync_api as playwright_api

    from rewind.api.app import STATIC_DIR
    from rewind.store import open_store

    if not (STATIC_DIR / "index.html").exists():
        pytest.fail("the UI is not built: cd web && npm ci && npm run build (make does it)")
    expect = playwright_api.expect
    store = open_store(tmp_path / "store")
    tokens = {"alice": add_user(store, "alice")[1], "bob": add_user(store, "bob")[1]}
    app = create_app(store, chat_client=None, pipelines=REGISTRY)
    with LiveServer(app) as server:
        team = Team(server, store, tokens)
        a, b = team.record("alice"), team.record("bob")
        context = browser.new_context()
        page = context.new_page()
        page.goto(f"{server.url}/")
        expect(page.get_by_text("This server needs an access token")).to_be_visible()
        page.goto(f"{server.url}/#/settings")
        page.get_by_test_id("token-input").fill(tokens["alice"])
        page.get_by_test_id("token-save").click()
        expect(page.get_by_test_id(f"run-item-{a}")).to_be_visible()
        expect(page.get_by_test_id(f"run-item-{b}")).to_have_count(0)
        signed_in = page.get_by_test_id("effective-signed-in-as")
        expect(signed_in.get_by_test_id("effective-value")).to_have_text("alice")
        page.goto(f"{server.url}/#/runs/{b}")  # another user's run: not found, never shown
        expect(page.get_by_test_id("run-error")).to_contain_text(f"unknown run '{b}'")
        expect(page.get_by_test_id(f"run-item-{b}")).to_have_count(0)
        context.close()
    store.close()


# -- the CLI ------------------------------------------------------------------------------------


def _rewind(store: Path, *args: str, **env: str) -> Any:
    return run_rewind("--store", str(store), *args, env=env or None)


def test_cli_user_commands_end_to_end(tmp_path: Path) -> None:
    import json

    store = tmp_path / "store"
    added = _rewind(store, "user", "add", "alice", "--team", "red")
    assert added.returncode == 0, added.stderr
    token = next(line for line in added.stdout.split() if line.startswith("rwd_"))
    admin = json.loads(_rewind(store, "user", "add", "root", "--admin", "--json").stdout)
    assert admin["admin"] is True and admin["token"].startswith("rwd_")

    listed = json.loads(_rewind(store, "user", "list", "--json").stdout)
    assert [(u["name"], u["team"], u["admin"], u["active"]) for u in listed] == [
        ("alice", "red", False, True),
        ("root", None, True, True),
    ]
    assert token not in _rewind(store, "user", "list").stdout

    rotated = json.loads(_rewind(store, "user", "rotate", "alice", "--json").stdout)
    assert rotated["token"] != token
    revoked = _rewind(store, "user", "revoke", "alice")
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    listed = json.loads(_rewind(store, "user", "list", "--json").stdout)
    assert listed[0]["active"] is False

    con = sqlite3.connect(store / "rewind.db")
    try:
        hashes = {r[0] for r in con.execute("SELECT token_hash FROM users")}
    finally:
        con.close()
    assert hashlib.sha256(rotated["token"].encode()).hexdigest() in hashes
    assert token not in (store / "rewind.db").read_text(errors="replace")


def test_cli_runs_belong_to_rewind_user(tmp_path: Path) -> None:
    import json

    store = tmp_path / "store"
    proc = _rewind(
        store,
        "run",
        "--pipeline",
        "tests.pipelines:pipeline",
        "--state",
        '{"x": 5}',
        "--json",
        REWIND_USER="alice",
    )
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout)["run"]["run_id"]
    con = sqlite3.connect(store / "rewind.db")
    try:
        (owner,) = con.execute("SELECT created_by FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    finally:
        con.close()
    assert owner == "alice"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("user", "add", "bad name!"), "user name 'bad name!' is not valid"),
        (("user", "add", "ok", "--team", "-red"), "team name '-red' is not valid"),
        (("user", "revoke", "nobody"), "unknown user 'nobody'"),
        (("user", "rotate", "nobody"), "unknown user 'nobody'"),
        (("serve", "--auth"), "--auth needs a user, and the store has none"),
    ],
)
def test_cli_user_bad_input_is_one_clear_error(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    store = tmp_path / "store"
    proc = _rewind(store, *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert says in lines[0], proc.stderr
    if args[1] == "add":
        assert not store.exists()  # refused before the store was created


def test_cli_refuses_an_invalid_rewind_user_before_recording(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = ("run", "--pipeline", "tests.pipelines:pipeline", "--state", '{"x": 5}')
    proc = _rewind(store, *args, REWIND_USER="no spaces please")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "$REWIND_USER 'no spaces please' is not valid" in proc.stderr.splitlines()[0]
    assert not store.exists()  # refused before the store was created


def test_cli_adding_a_user_twice_fails_and_keeps_the_first_token(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert _rewind(store, "user", "add", "alice").returncode == 0
    again = _rewind(store, "user", "add", "alice", "--admin")
    assert again.returncode == 2
    assert "user 'alice' already exists" in again.stderr
    assert "rewind user rotate alice" in again.stderr


def _factor(value: int) -> dict[str, Any]:
    return {"kind": "param", "node": "expand", "param": "factor", "value": value}
