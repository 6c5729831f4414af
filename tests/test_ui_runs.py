"""Browser tests of the runs list and run management (issue 14, points 7 and 6): job children
and sub-runs grouped, filters, cancel and delete from the UI, and the live progress of a run
another process executes. Debian's headless Chromium driven by Playwright, the real app under
uvicorn on loopback, a real SQLite store; with ``REWIND_SCREENSHOTS=1``, screenshots go to
``test-artifacts/``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import playwright.sync_api as playwright_api
import pytest

from rewind.api import create_app
from rewind.api.pipelines import PipelineEntry
from rewind.store import open_store
from tests import pipelines
from tests.model_stub import ModelStub
from tests.test_run_management import _rewind_run_gated, held, hinted
from tests.test_ui import STATIC_INDEX, TIMEOUT_MS, ThreadServer, screenshot

XSS = "<img src=x onerror=alert(1)><script>alert(2)</script>"
expect = playwright_api.expect


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not STATIC_INDEX.exists():
        pytest.fail("the UI is not built: cd web && npm ci && npm run build (make does it)")
    folder = tmp_path_factory.mktemp("ui-runs-store")
    store = open_store(folder)
    registry = {
        "tiny": PipelineEntry.of(pipelines.pipeline, {"x": 15}),
        "failing": PipelineEntry.of(pipelines.failing, {"x": 1}),
        "held": PipelineEntry.of(held, {"x": 1}),
        "hinted": PipelineEntry.of(hinted, {"x": 15}),
    }
    app = create_app(store, chat_client=None, pipelines=registry)
    with ThreadServer(app) as srv:
        yield {"url": srv.url, "store": store, "folder": folder}
    store.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    pg = context.new_page()
    dialogs: list[str] = []
    errors: list[str] = []
    pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.dialogs = dialogs  # type: ignore[attr-defined]
    pg.errors = errors  # type: ignore[attr-defined]
    pg.set_default_timeout(TIMEOUT_MS)
    yield pg
    context.close()


@pytest.fixture(autouse=True)
def _reset_blocking() -> Iterator[None]:
    pipelines.BLOCK_ENTERED.clear()
    pipelines.BLOCK_RELEASE.clear()
    yield
    pipelines.BLOCK_RELEASE.set()


def shot(page: Any, name: str) -> None:
    screenshot(page, f"ui-runs-{name}", full_page=True)


def post(url: str, path: str, body: Any = None) -> dict[str, Any]:
    r = httpx.post(url + path, json=body, trust_env=False, timeout=30)
    assert r.status_code == 202, r.text
    out: dict[str, Any] = r.json()
    return out


def wait_run(url: str, run_id: str, hang_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + hang_s
    while time.monotonic() < deadline:
        run: dict[str, Any] = httpx.get(f"{url}/api/runs/{run_id}", trust_env=False).json()
        if run["status"] not in ("queued", "running"):
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish")


def record(url: str, pipeline: str, **body: Any) -> dict[str, Any]:
    return wait_run(url, post(url, "/api/runs", {"pipeline": pipeline, **body})["run_id"])


def test_runs_list_groups_jobs_and_filters(server: dict[str, Any], page: Any) -> None:
    url = server["url"]
    parent = record(url, "tiny")
    failed = record(url, "failing")
    assert failed["status"] == "failed"
    factor = {"kind": "param", "node": "expand", "param": "factor"}
    grid = post(
        url,
        f"/api/runs/{parent['run_id']}/grid",
        {"at": 2, "overrides": [factor | {"value": v} for v in (2, 3, 4)]},
    )
    deadline = time.monotonic() + 120
    while httpx.get(f"{url}/api/grids/{grid['id']}", trust_env=False).json()["status"] in (
        "queued",
        "running",
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    variants = [
        r["run_id"]
        for r in httpx.get(f"{url}/api/runs", trust_env=False).json()["runs"]
        if (r["config"] or {}).get("purpose") == "grid"
    ]
    assert len(variants) == 3

    page.goto(f"{url}/#/")
    listing = page.get_by_test_id("runs-list")
    expect(listing.get_by_test_id(f"run-item-{parent['run_id']}")).to_be_visible()
    expect(listing.get_by_test_id(f"run-item-{failed['run_id']}")).to_be_visible()  # failed: listed
    job = listing.get_by_test_id("job-grid")
    expect(job).to_contain_text("what-if grid · 3 variants · 3 completed")
    for v in variants:  # collapsed under the job: not top-level rows
        expect(listing.get_by_test_id(f"run-item-{v}")).to_have_count(0)
    shot(page, "01-collapsed-job")
    job.get_by_test_id("job-toggle-grid").click()
    for v in variants:
        expect(job.get_by_test_id(f"run-item-{v}")).to_be_visible()
    shot(page, "02-expanded-job")

    # filters: status, pipeline, text, dates
    page.get_by_test_id("filter-status").select_option("failed")
    expect(listing.get_by_test_id(f"run-item-{failed['run_id']}")).to_be_visible()
    expect(listing.get_by_test_id(f"run-item-{parent['run_id']}")).to_have_count(0)
    shot(page, "03-filter-failed")
    page.get_by_test_id("filter-status").select_option("")
    page.get_by_test_id("filter-pipeline").select_option("tiny")
    expect(listing.get_by_test_id(f"run-item-{failed['run_id']}")).to_have_count(0)
    expect(listing.get_by_test_id(f"run-item-{parent['run_id']}")).to_be_visible()
    page.get_by_test_id("filter-clear").click()
    page.get_by_test_id("filter-q").fill(failed["run_id"][:10])
    expect(listing.get_by_test_id(f"run-item-{parent['run_id']}")).to_have_count(0)
    expect(listing.get_by_test_id(f"run-item-{failed['run_id']}")).to_be_visible()
    page.get_by_test_id("filter-q").fill(XSS)  # hostile search text: no match, shown as text
    expect(page.get_by_test_id("runs-empty")).to_have_text("No run matches these filters.")
    page.get_by_test_id("filter-clear").click()
    page.get_by_test_id("filter-since").fill("2001-01-01")
    page.get_by_test_id("filter-until").fill("2001-01-02")
    expect(page.get_by_test_id("runs-empty")).to_be_visible()
    page.get_by_test_id("filter-clear").click()
    expect(listing.get_by_test_id(f"run-item-{parent['run_id']}")).to_be_visible()
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_sub_runs_collapse_under_their_spawning_run(server: dict[str, Any], page: Any) -> None:
    from rewind import Rewind
    from rewind.engine import attach
    from tests import burr_apps

    url = server["url"]
    with ModelStub() as stub, pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_BASE_URL", stub.base_url)
        mp.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
        rw = Rewind(server["store"])
        app = attach(
            burr_apps.sdk_recursive_application(), ref="tests.burr_apps:sdk_recursive_application"
        )
        parent = rw.record(app, inputs={"question": "why?"})
    subs = [r.run_id for r in server["store"].sub_runs(parent.run_id)]
    assert len(subs) == 2
    page.goto(f"{url}/#/")
    listing = page.get_by_test_id("runs-list")
    expect(listing.get_by_test_id(f"run-item-{parent.run_id}")).to_be_visible()
    for sub in subs:
        expect(listing.get_by_test_id(f"run-item-{sub}")).to_have_count(0)
    toggle = listing.get_by_test_id(f"subruns-toggle-{parent.run_id}")
    expect(toggle).to_contain_text("2 sub-runs")
    toggle.click()
    for sub in subs:
        item = listing.get_by_test_id(f"subruns-{parent.run_id}").get_by_test_id(f"run-item-{sub}")
        expect(item).to_contain_text("sub-run of node 2")
    shot(page, "12-sub-runs")
    listing.get_by_test_id(f"run-item-{subs[0]}").click()
    expect(page.get_by_test_id("run-view")).to_have_attribute("data-run-id", subs[0])
    # the selected sub-run keeps its group open
    expect(listing.get_by_test_id(f"subruns-{parent.run_id}")).to_be_visible()
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_cancel_and_delete_from_the_ui(server: dict[str, Any], page: Any) -> None:
    url = server["url"]
    rid = post(url, "/api/runs", {"pipeline": "held"})["run_id"]
    assert pipelines.BLOCK_ENTERED.wait(60)
    page.goto(f"{url}/#/runs/{rid}")
    view = page.get_by_test_id("run-view")
    expect(view).to_have_attribute("data-run-status", "running")
    expect(page.get_by_test_id("delete-run")).to_have_count(0)  # a running run: no delete
    page.get_by_test_id("cancel-run").click()
    expect(page.get_by_test_id("run-action-message")).to_contain_text("stops before its next node")
    shot(page, "04-cancel-requested")
    pipelines.BLOCK_RELEASE.set()
    expect(view).to_have_attribute("data-run-status", "cancelled")
    expect(view).to_contain_text("cancelled before node 3 (conclude)")
    expect(page.get_by_test_id("graph-node-conclude")).to_have_attribute("data-status", "skipped")
    shot(page, "05-cancelled")

    # a run with a fork cannot be deleted: the server's reason is shown
    fork = post(url, f"/api/runs/{rid}/fork", {"at": 2})["run_id"]
    assert wait_run(url, fork)["status"] == "completed"
    page.goto(f"{url}/#/runs/{rid}")
    page.get_by_test_id("delete-run").click()
    page.get_by_test_id("delete-confirm-yes").click()
    expect(page.get_by_test_id("run-action-error")).to_contain_text("delete its forks first")
    assert httpx.get(f"{url}/api/runs/{rid}", trust_env=False).status_code == 200
    shot(page, "06-delete-refused")
    # delete the fork, then the run itself
    for target in (fork, rid):
        page.goto(f"{url}/#/runs/{target}")
        expect(page.get_by_test_id("run-view")).to_have_attribute("data-run-id", target)
        page.get_by_test_id("delete-run").click()
        expect(page.get_by_test_id("delete-confirm")).to_be_visible()
        page.get_by_test_id("delete-confirm-yes").click()
        expect(page.get_by_test_id(f"run-item-{target}")).to_have_count(0)
        assert httpx.get(f"{url}/api/runs/{target}", trust_env=False).status_code == 404
    shot(page, "07-deleted")
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_the_node_editor_offers_the_declared_values(server: dict[str, Any], page: Any) -> None:
    url = server["url"]
    rid = record(url, "hinted")["run_id"]
    page.goto(f"{url}/#/runs/{rid}?tab=graph&node=2")
    editor = page.get_by_test_id("node-editor")
    expect(editor).to_contain_text("Fork at node 2 · expand")
    hint = editor.get_by_test_id("param-hint")
    expect(hint).to_contain_text("how much the series is scaled")
    expect(hint.get_by_test_id("param-choice")).to_have_text(["2", "3", "5"])
    editor.get_by_test_id("editor-value").fill("4")
    editor.get_by_test_id("fork-button").click()
    error = editor.get_by_test_id("editor-error")
    expect(error).to_contain_text("allowed values: 2, 3, 5")
    shot(page, "10-hint-refused")
    before = len(httpx.get(f"{url}/api/runs", trust_env=False).json()["runs"])
    hint.get_by_test_id("param-choice").nth(2).click()
    expect(editor.get_by_test_id("editor-value")).to_have_value("5")
    editor.get_by_test_id("fork-button").click()
    expect(page.get_by_test_id("run-view")).not_to_have_attribute("data-run-id", rid)
    fork_id = page.get_by_test_id("run-view").get_attribute("data-run-id")
    assert wait_run(url, fork_id)["override"]["value"] == 5
    assert len(httpx.get(f"{url}/api/runs", trust_env=False).json()["runs"]) == before + 1
    page.goto(f"{url}/#/runs/{rid}?tab=graph&node=1")
    expect(page.get_by_test_id("param-range")).to_have_text("allowed: an integer from 0 to 100")
    shot(page, "11-hint-range")
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_terminal_run_shows_its_running_node_and_tokens(
    server: dict[str, Any], page: Any
) -> None:
    url, folder = server["url"], server["folder"]
    opener = folder.parent / f"gate-{time.time_ns()}"
    with ModelStub(reply=lambda _q, n: f"{XSS} answer {n}") as stub:
        env = {"REWIND_BASE_URL": stub.base_url, "REWIND_API_KEY": "x", "REWIND_MODEL": "stub"}
        state = json.dumps({"question": "why?", "gate": str(opener)})
        # `rewind run` in another process (forked from the tests' CLI fork server)
        pool = ThreadPoolExecutor(1)
        proc = pool.submit(_rewind_run_gated, state, folder, env)
        try:
            rid = _running_gated(url)
            page.goto(f"{url}/#/runs/{rid}")
            expect(page.get_by_test_id("graph-node-gate")).to_have_attribute(
                "data-status", "running"
            )
            expect(page.get_by_test_id("graph-node-ask")).to_have_attribute(
                "data-status", "executed"
            )
            tokens = server["store"].nodes_of(rid)[0].tokens
            assert tokens > 0
            expect(page.get_by_test_id("run-tokens")).to_contain_text(f"{tokens} tokens")
            expect(page.get_by_test_id(f"run-item-{rid}")).to_contain_text(f"{tokens} tok")
            shot(page, "08-terminal-run-live")
            opener.write_text("open")
            expect(page.get_by_test_id("run-view")).to_have_attribute(
                "data-run-status", "completed"
            )
            expect(page.get_by_test_id("graph-node-shout")).to_have_attribute(
                "data-status", "executed"
            )
            done = proc.result(120)
            assert done.returncode == 0, done.stderr
        finally:
            opener.write_text("open")
            pool.shutdown()
    shot(page, "09-terminal-run-done")
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def _running_gated(url: str, hang_s: float = 120.0) -> str:
    deadline = time.monotonic() + hang_s
    while time.monotonic() < deadline:
        for r in httpx.get(f"{url}/api/runs", trust_env=False).json()["runs"]:
            if r["pipeline"] == "gated" and r["status"] == "running":
                prog = httpx.get(f"{url}/api/runs/{r['run_id']}/progress", trust_env=False).json()
                if (prog["node"] or {}).get("name") == "gate":
                    return str(r["run_id"])
        time.sleep(0.05)
    raise AssertionError("the terminal run never reached its gate node")


def test_the_runs_list_is_loaded_once_then_polled(server: dict[str, Any], page: Any) -> None:
    """The runs list is loaded when the page opens, then every 5 s while no run is live: the
    page once asked for it again as each answer arrived (~60 times a second). The page's clock
    is Playwright's, so no interval fires until the test moves it."""
    url = server["url"]
    record(url, "tiny")
    for run in httpx.get(f"{url}/api/runs", trust_env=False).json()["runs"]:
        wait_run(url, run["run_id"])  # no run live (then the list is polled every 1.5 s)
    asked: list[str] = []

    def runs_list(request: Any) -> bool:
        return bool(request.url.split("?")[0].endswith("/api/runs"))

    page.on("request", lambda r: asked.append(r.url) if runs_list(r) else None)
    page.clock.install()
    page.goto(f"{url}/#/")
    items = page.get_by_test_id("runs-list").locator("[data-testid^=run-item-]")
    expect(items.first).to_be_visible()
    page.wait_for_load_state("networkidle")  # the old page never went quiet: this timed out
    assert len(asked) == 1, asked
    with page.expect_request(runs_list):
        page.clock.run_for(5_000)
    assert len(asked) == 2, asked
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]
