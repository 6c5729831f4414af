"""The browser UI as a debugger (issue 14): prompts and responses of each call, the same side by
side in the diff, artifact download with a bearer token, the cost bar's defined figures,
Settings' effective configuration and a rejected token, keyboard focus on graph nodes, and the
UI at 390 px wide.

Debian's headless Chromium driven by Playwright for Python against the real app under uvicorn
on loopback, over real SQLite stores; the model is the fake OpenAI-compatible endpoint of
``tests/test_ui.py`` whose every answer carries an HTML/script payload (so every view here is
also exercised with hostile text). Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import playwright.sync_api as playwright_api
import pytest
from burr.core import State, action, default
from burr.core.graph import GraphBuilder

import rewind
from rewind.api import create_app
from rewind.api.pipelines import PipelineEntry, research_entry
from rewind.examples import research
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.replay import Pipeline, Rewind
from rewind.store import open_store
from rewind.store.users import add_user
from tests import pipelines as test_pipelines
from tests.conftest import CHROMIUM
from tests.test_api import publisher
from tests.test_api_calls import chatty
from tests.test_ui import ARTIFACTS, STATIC_INDEX, TIMEOUT_MS, XSS, ThreadServer, fake_model, shot

expect = playwright_api.expect
BIG = 2**64  # beyond 2^53: a float64 would print 18446744073709552000


@action(reads=["topic"], writes=["report", "big", "rows"])
def draft(state: State) -> State:
    tone = rewind.param("tone", "steady")
    report = (
        f"The {state['topic']} report. Rainfall was {tone} across the winter months, "
        "and the summer stayed dry, as the daily records show."
    )
    rows = [{"day": i, "mm": i * len(tone)} for i in range(120)]
    return state.update(report=report, big=BIG + len(tone), rows=rows)


@action(reads=["rows"], writes=["total"])
def tally(state: State) -> State:
    return state.update(total=sum(r["mm"] for r in state["rows"]))


prose = Pipeline(
    name="prose",
    graph=GraphBuilder()
    .with_actions(draft=draft, tally=tally)
    .with_transitions(("draft", "tally", default))
    .build(),
    entrypoint="draft",
    ref="tests.test_ui_debugger:prose",
)


def _client() -> ChatClient:
    return ChatClient(
        Endpoint(base_url="http://fake.test/v1", model="fake-model"),
        transport=httpx.MockTransport(fake_model),
        retry=RetryPolicy(attempts=1),
    )


def _check_prerequisites() -> None:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (make installs it)")
    if not STATIC_INDEX.exists():
        pytest.fail("the UI is not built: cd web && npm ci && npm run build (make does it)")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A research run and a fork of it at node 3 (group_by changed), served without tokens."""
    _check_prerequisites()
    client = _client()
    store = open_store(tmp_path_factory.mktemp("ui-debugger-store"))
    rw = Rewind(store, chat_client=client)
    parent = rw.record(research.build(), research.initial_state(), config={"model": "fake-model"})
    assert parent.status == "completed", parent.error
    test_pipelines.BLOCK_RELEASE.set()
    blocked = rw.record(test_pipelines.blocking, {"x": 1})
    assert blocked.status == "completed", blocked.error
    written = rw.record(prose, {"topic": "Seattle <b>weather</b>"})
    assert written.status == "completed", written.error
    calls = rw.record(chatty, {"question": "why?"})
    assert calls.status == "completed", calls.error
    app = create_app(
        store,
        chat_client=client,
        pipelines={
            "research": research_entry(),
            "blocking": PipelineEntry.of(test_pipelines.blocking, {"x": 1}),
            "prose": PipelineEntry.of(prose, {"topic": "x"}),
        },
    )
    with ThreadServer(app) as srv:
        yield {
            "url": srv.url,
            "parent": parent.run_id,
            "blocked": blocked.run_id,
            "prose": written.run_id,
            "calls": calls.run_id,
            "store": store,
        }
    client.close()
    store.close()


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server with a user (so every request needs a bearer token) and a run that published
    an artifact."""
    _check_prerequisites()
    store = open_store(tmp_path_factory.mktemp("ui-token-store"))
    rw = Rewind(store)
    run = rw.record(publisher, {"text": f"hello {XSS}"})
    assert run.status == "completed", run.error
    _, token = add_user(store, "ada", admin=True)
    app = create_app(store, pipelines={"publisher": PipelineEntry.of(publisher, {"text": "x"})})
    with ThreadServer(app) as srv:
        yield {"url": srv.url, "run": run.run_id, "token": token, "store": store}
    store.close()


def _page(browser: Any, width: int = 1500, height: int = 1000) -> Any:
    viewport = {"width": width, "height": height}
    context = browser.new_context(viewport=viewport, accept_downloads=True)
    pg = context.new_page()
    pg.dialogs = []
    pg.errors = []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda exc: pg.errors.append(str(exc)))
    pg.set_default_timeout(TIMEOUT_MS)
    return pg


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    pg = _page(browser)
    yield pg
    pg.context.close()


def get(url: str, path: str, token: str | None = None, **params: Any) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    r = httpx.get(url + path, params=params or None, headers=headers, timeout=30, trust_env=False)
    r.raise_for_status()
    return r.json()


def wait_finished(url: str, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        run: dict[str, Any] = get(url, f"/api/runs/{run_id}")
        if run["status"] not in ("queued", "running"):
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish")


def fork_group_by(url: str, parent: str, effects: str = "dry-run") -> str:
    recorded = get(url, f"/api/runs/{parent}/nodes/3")["node"]["params"]["group_by"]
    value = "month" if recorded == "season" else "season"
    override = {"kind": "param", "node": "analyse", "param": "group_by", "value": value}
    body = {"at": 3, "override": override, "effects": effects}
    r = httpx.post(f"{url}/api/runs/{parent}/fork", json=body, timeout=30, trust_env=False)
    assert r.status_code == 202, r.text
    return str(wait_finished(url, r.json()["run_id"])["run_id"])


# -- 1. prompts and responses ----------------------------------------------------------------------


def test_calls_show_prompts_and_responses(server: dict[str, Any], page: Any) -> None:
    url, parent = server["url"], server["parent"]
    page.goto(f"{url}/#/runs/{parent}?tab=graph&node=1")
    info = page.get_by_test_id("node-info")
    expect(info).to_contain_text("Node 1 · plan")
    calls = info.get_by_test_id("calls-list")
    expect(calls).to_be_visible()
    api_call = get(url, f"/api/runs/{parent}/nodes/1/calls")["calls"][0]
    calls.get_by_test_id("call-toggle-0").click()
    detail = calls.get_by_test_id("call-detail-0")
    roles = [m["role"] for m in api_call["request"]["messages"]]
    shown = detail.get_by_test_id("call-message").evaluate_all(
        "els => els.map(e => e.dataset.role)"
    )
    assert shown == roles and "user" in roles
    expect(detail.get_by_test_id("call-outcome")).to_contain_text(api_call["label"])
    expect(detail.get_by_test_id("call-params")).to_contain_text('"temperature"')
    expect(detail.get_by_test_id("call-finish")).to_contain_text("stop")
    expect(detail.get_by_test_id("call-usage")).to_contain_text("prompt_tokens")
    # The model's answer carries markup: shown as text, never as elements.
    expect(detail.get_by_test_id("call-content")).to_contain_text(XSS)
    markup = "[data-testid=call-content] img, [data-testid=call-content] script"
    assert page.locator(markup).count() == 0
    shot(page, "calls-1-prompt-and-response")

    # A long message is collapsed to a preview with "show all".
    first = detail.get_by_test_id("call-message").first
    text = api_call["request"]["messages"][0]["content"]
    if len(text) > 400:
        expect(first.get_by_test_id("truncated-note")).to_be_visible()

    # A tool call: its args and result.
    page.goto(f"{url}/#/runs/{parent}?tab=graph&node=2")
    expect(page.get_by_test_id("node-info")).to_contain_text("Node 2 · research")
    page.get_by_test_id("call-toggle-0").click()
    expect(page.get_by_test_id("call-args")).to_be_visible()
    expect(page.get_by_test_id("call-result")).to_be_visible()

    # The whole recorded request, fetched and saved by the UI.
    page.goto(f"{url}/#/runs/{parent}?tab=graph&node=1")
    page.get_by_test_id("call-toggle-0").click()
    with page.expect_download() as info_dl:
        page.get_by_test_id("call-whole-request").click()
    saved = Path(info_dl.value.path()).read_bytes()
    assert hashlib.sha256(saved).hexdigest() == api_call["request_hash"]
    assert page.dialogs == [] and page.errors == []


def test_a_node_with_many_calls_is_a_virtual_list(server: dict[str, Any], page: Any) -> None:
    """60 calls: only a window of rows is in the DOM; scrolling loads the next page from the
    server and reaches the last call."""
    url, run_id = server["url"], server["calls"]
    page.goto(f"{url}/#/runs/{run_id}?tab=graph&node=3")
    calls = page.get_by_test_id("calls-list")
    expect(calls).to_contain_text("calls (60)")
    scroll = calls.get_by_test_id("calls-scroll")
    rows = scroll.locator("[data-testid^=call-toggle-]")
    expect(rows.first).to_be_visible()
    assert 5 <= rows.count() < 50, rows.count()  # a window, not the 50 of the first page
    expect(calls.get_by_test_id("calls-loaded")).to_contain_text("50 loaded")
    page.wait_for_function(
        "() => { const e = document.querySelector('[data-testid=calls-scroll]');"
        " e.scrollTop = e.scrollHeight;"
        " return !!document.querySelector('[data-testid=call-toggle-59]'); }"
    )
    expect(calls.get_by_test_id("calls-loaded")).to_have_count(0)  # all 60 loaded
    assert rows.count() < 50, rows.count()
    expect(calls.get_by_test_id("call-toggle-0")).to_have_count(0)  # scrolled out of the DOM
    calls.get_by_test_id("call-toggle-59").click()
    expect(calls.get_by_test_id("call-detail-59").get_by_test_id("call-args")).to_contain_text(
        "2009"
    )
    assert page.dialogs == [] and page.errors == []


def test_diff_shows_a_changed_call_side_by_side(server: dict[str, Any], page: Any) -> None:
    url, parent = server["url"], server["parent"]
    fork = fork_group_by(url, parent)
    assert get(url, f"/api/runs/{fork}")["status"] == "completed"
    diff = get(url, "/api/diff", a=parent, b=fork)
    # The first node after analyse with a changed LLM call (critique reads the analysis).
    row = next(
        r
        for r in diff["nodes"]
        if r["status"] == "changed" and r["name"] in ("critique", "revise", "compose")
    )
    number = row["index"] + 1
    page.goto(f"{url}/#/runs/{fork}?tab=diff")
    row_el = page.get_by_test_id(f"diff-row-{number}")
    expect(row_el).to_have_attribute("data-status", "changed")
    button = page.get_by_test_id(f"diff-calls-{number}")
    if not button.is_visible():
        row_el.click()
    button.click()
    pair = page.get_by_test_id("call-pair").first
    expect(pair).to_have_attribute("data-changed", "yes")
    expect(pair).to_contain_text("prompt differs")
    # The changed prompt message, word by word (the table went from months to seasons).
    words = pair.get_by_test_id("prompt-word-diff")
    expect(words).to_contain_text("(user) changed")
    removed = words.get_by_test_id("word-removed").all_inner_texts()
    added = words.get_by_test_id("word-added").all_inner_texts()
    assert removed and added and removed != added
    a = get(url, f"/api/runs/{parent}/nodes/{number}/calls")["calls"][0]
    b = get(url, f"/api/runs/{fork}/nodes/{number}/calls")["calls"][0]
    assert a["request_hash"] != b["request_hash"]
    original = pair.get_by_test_id("call-side-original")
    forked = pair.get_by_test_id("call-side-fork")
    expect(original.get_by_test_id("call-content")).to_contain_text(a["response"]["content"][:60])
    expect(forked.get_by_test_id("call-content")).to_contain_text(b["response"]["content"][:60])
    boxes = [original.bounding_box(), forked.bounding_box()]
    assert boxes[0]["x"] + boxes[0]["width"] <= boxes[1]["x"] + 1  # side by side, not stacked
    pair.scroll_into_view_if_needed()
    shot(page, "calls-2-diff-side-by-side")
    assert page.dialogs == [] and page.errors == []


# -- 2. cost bar -----------------------------------------------------------------------------------


def test_cost_bar_defines_each_figure(server: dict[str, Any], page: Any) -> None:
    url, parent = server["url"], server["parent"]
    fork = fork_group_by(url, parent)
    cost = get(url, f"/api/runs/{fork}/cost")
    page.goto(f"{url}/#/runs/{fork}?tab=graph")
    bar = page.get_by_test_id("cost-bar")
    expect(bar).to_have_attribute("data-run-status", "completed")
    expect(bar.get_by_test_id("cost-saved-tokens")).to_have_text(f"{cost['saved']['tokens']:,}")
    for name in ("original", "replay", "delta", "saved"):
        title = bar.get_by_test_id(f"cost-label-{name}").first.get_attribute("title")
        assert title and len(title) > 20, name
    bar.get_by_text("what these figures mean").click()
    expect(bar.get_by_test_id("cost-define-delta")).to_contain_text("replay − original")
    expect(bar.get_by_test_id("cost-define-saved")).to_contain_text("reused")
    # The identity on screen holds with the API's numbers.
    reused = ("inherited", "hit")
    spent = sum(n["replay_tokens"] for n in cost["nodes"] if n["status"] not in reused)
    before = sum(n["original_tokens"] or 0 for n in cost["nodes"] if n["status"] not in reused)
    assert cost["saved"]["tokens"] == sum(
        n["original_tokens"] for n in cost["nodes"] if n["status"] in reused
    )
    assert cost["delta"]["tokens"] == (spent - before) - cost["saved"]["tokens"]
    identity = bar.get_by_test_id("cost-identity")
    expect(identity).to_contain_text(f"saved {cost['saved']['tokens']:,}")
    expect(identity).to_contain_text(f"now {spent:,}, were {before:,}")
    shot(page, "cost-1-completed-with-legend")


def test_cost_bar_claims_no_saving_on_failed_or_running_runs(
    server: dict[str, Any], page: Any
) -> None:
    url, parent = server["url"], server["parent"]
    # recorded effects with new publish arguments: the fork fails at publish
    failed = fork_group_by(url, parent, effects="recorded")
    assert get(url, f"/api/runs/{failed}")["status"] == "failed"
    page.goto(f"{url}/#/runs/{failed}?tab=graph")
    bar = page.get_by_test_id("cost-bar")
    expect(bar).to_have_attribute("data-run-status", "failed")
    for unit in ("tokens", "latency"):
        expect(bar.get_by_test_id(f"cost-saved-{unit}")).to_have_attribute("data-shown", "no")
        expect(bar.get_by_test_id(f"cost-saved-{unit}")).to_have_text("—")
    bar.get_by_text("what these figures mean").click()
    expect(bar.get_by_test_id("cost-saved-why")).to_contain_text("failed")
    shot(page, "cost-2-failed")

    test_pipelines.BLOCK_ENTERED.clear()
    test_pipelines.BLOCK_RELEASE.clear()
    try:
        r = httpx.post(
            f"{url}/api/runs/{server['blocked']}/replay", json={"at": 2}, trust_env=False
        )
        assert r.status_code == 202, r.text
        running = r.json()["run_id"]
        assert test_pipelines.BLOCK_ENTERED.wait(20)
        page.goto(f"{url}/#/runs/{running}?tab=graph")
        bar = page.get_by_test_id("cost-bar")
        expect(bar).to_have_attribute("data-run-status", "running")
        expect(bar.get_by_test_id("cost-saved-tokens")).to_have_attribute("data-shown", "no")
        expect(bar).to_contain_text("figures so far")
        shot(page, "cost-3-running")
    finally:
        test_pipelines.BLOCK_RELEASE.set()
    expect(bar).to_have_attribute("data-run-status", "completed")
    expect(bar.get_by_test_id("cost-saved-tokens")).to_have_attribute("data-shown", "yes")
    assert page.dialogs == [] and page.errors == []


# -- 4. diff readability -----------------------------------------------------------------------


def test_diff_is_collapsed_worded_paged_and_exact(server: dict[str, Any], page: Any) -> None:
    url, parent = server["url"], server["prose"]
    override = {"kind": "param", "node": "draft", "param": "tone", "value": "erratic"}
    r = httpx.post(
        f"{url}/api/runs/{parent}/fork", json={"at": 1, "override": override}, trust_env=False
    )
    assert r.status_code == 202, r.text
    fork = wait_finished(url, r.json()["run_id"])["run_id"]
    diff = get(url, "/api/diff", a=parent, b=fork)
    changes = diff["nodes"][0]["changes"]
    assert len(changes) > 100  # report, big, and 119 rows

    page.goto(f"{url}/#/runs/{fork}?tab=diff")
    panel = page.get_by_test_id("diff-panel")
    # The first divergence is open; every other row is collapsed to a one-line summary.
    expect(panel.get_by_test_id("diff-row-1")).to_have_attribute("data-open", "yes")
    expect(panel.get_by_test_id("diff-row-2")).to_have_attribute("data-open", "no")
    expect(panel.get_by_test_id("diff-summary-2")).to_have_text("▸1 field: total")
    expect(panel.get_by_test_id("diff-summary-1")).to_contain_text(f"{len(changes)} fields:")
    # Prose: word by word.
    words = panel.get_by_test_id("word-diff").first
    expect(words.get_by_test_id("word-removed")).to_have_text("steady")
    expect(words.get_by_test_id("word-added")).to_have_text("erratic")
    # A big integer, exact on both sides (no float64 rounding).
    expect(panel).to_contain_text(str(BIG + len("steady")))
    expect(panel).to_contain_text(str(BIG + len("erratic")))
    # A long list of changes is virtual: a window of them in the DOM, the last reached by scrolling.
    expect(panel.get_by_test_id("diff-count-1")).to_contain_text(f"{len(changes)} changes")
    drawn = panel.get_by_test_id("diff-changes-1").get_by_test_id("diff-change")
    expect(drawn.first).to_be_visible()
    assert 3 <= drawn.count() < 40, drawn.count()
    last = changes[-1]["path"]
    page.wait_for_function(
        "last => { const e = document.querySelector('[data-testid=diff-changes-1]');"
        " e.scrollTop = e.scrollHeight;"
        " return [...e.querySelectorAll('[data-testid=diff-path]')]"
        ".some(p => p.textContent === last); }",
        arg=last,
    )
    assert drawn.count() < 40, drawn.count()
    # A collapsed row opens from the keyboard.
    panel.get_by_test_id("diff-row-2").focus()
    page.keyboard.press("Enter")
    expect(panel.get_by_test_id("diff-row-2")).to_have_attribute("data-open", "yes")
    panel.get_by_test_id("diff-row-1").scroll_into_view_if_needed()
    shot(page, "diff-collapsed-words-exact")

    # Raw JSON: the node picker on top, a collapsible tree, the big integer exact.
    page.goto(f"{url}/#/runs/{fork}?tab=raw&node=1")
    raw = page.get_by_test_id("raw-json")
    expect(raw).to_have_attribute("data-exact", "yes")
    tree = raw.get_by_test_id("raw-output-tree")
    expect(tree).to_contain_text(str(BIG + len("erratic")))
    assert "18446744073709552000" not in tree.inner_text()
    picker = page.get_by_test_id("raw-node-picker").bounding_box()
    assert picker["y"] < raw.bounding_box()["y"]
    buttons = tree.get_by_role("button")
    assert buttons.count() > 100  # the output, its rows list and each row: collapsible
    open_before = tree.locator("[role=button][aria-expanded=true]").count()
    buttons.nth(1).click()  # collapse the first field that has children
    expect(tree.locator("[role=button][aria-expanded=true]")).not_to_have_count(open_before)
    raw.get_by_test_id("raw-output-view").click()  # the same as text, exact too
    expect(raw.get_by_test_id("raw-output")).to_have_attribute("data-view", "text")
    expect(raw.get_by_test_id("raw-output")).to_contain_text(str(BIG + len("erratic")))
    shot(page, "raw-json-tree")
    assert page.dialogs == [] and page.errors == []


# -- 3. artifact download with a token -------------------------------------------------------------


def test_artifact_download_sends_the_token(token_server: dict[str, Any], page: Any) -> None:
    url, run_id, token = token_server["url"], token_server["run"], token_server["token"]
    (artifact,) = get(url, f"/api/runs/{run_id}/artifacts", token=token)["artifacts"]
    assert httpx.get(url + artifact["url"], trust_env=False).status_code == 401
    page.goto(f"{url}/#token={token}")
    page.evaluate(f"window.location.hash = '#/runs/{run_id}?tab=graph'")
    link = page.get_by_test_id(f"artifact-{artifact['name']}")
    expect(link).to_be_visible()
    with page.expect_download() as info:
        link.click()
    download = info.value
    assert download.suggested_filename == artifact["name"]
    data = Path(download.path()).read_bytes()
    assert hashlib.sha256(data).hexdigest() == artifact["sha256"]
    assert b"hello" in data
    expect(link).to_have_attribute("data-state", "saved")
    shot(page, "artifact-download-with-token")
    assert page.dialogs == [] and page.errors == []
    ARTIFACTS.mkdir(exist_ok=True)


# -- 5. settings, keyboard, 390 px -----------------------------------------------------------------


def test_settings_show_the_effective_configuration(server: dict[str, Any], page: Any) -> None:
    url = server["url"]
    page.goto(f"{url}/#/settings")
    settings = get(url, "/api/settings")
    table = page.get_by_test_id("effective-config")
    expect(table).to_be_visible()
    for row in settings["effective"]:
        shown = table.get_by_test_id(f"effective-{row['name'].replace(' ', '-')}")
        expect(shown).to_contain_text(str(row["value"]))
        expect(shown.get_by_test_id("effective-source")).to_have_text(row["source"])
    names = {row["name"] for row in settings["effective"]}
    assert {"model endpoint", "model", "database", "object storage", "authentication"} <= names
    auth = next(r for r in settings["effective"] if r["name"] == "authentication")
    assert auth["value"].startswith("none")  # no users, no server token
    # One table: what only the settings document says is merged into it (no second table).
    assert page.get_by_test_id("settings").locator("table").count() == 1
    for name, value in (
        ("temperature-default", f"{settings['temperature_default']:g}"),  # as JS prints it
        ("pipelines", ", ".join(settings["pipelines"])),
        ("version", settings["version"]),
    ):
        row = table.get_by_test_id(f"effective-{name}")
        expect(row.get_by_test_id("effective-value")).to_have_text(value)
    endpoint = table.get_by_test_id("effective-model-endpoint")
    expect(endpoint).to_contain_text(settings["model_endpoint"]["description"])
    expect(page.get_by_test_id("token-rejected")).to_have_count(0)
    shot(page, "settings-effective")


def test_settings_say_when_a_token_was_rejected(token_server: dict[str, Any], page: Any) -> None:
    url, token = token_server["url"], token_server["token"]
    page.goto(f"{url}/#token=rwd_not-a-real-token")
    page.evaluate("window.location.hash = '#/settings'")
    rejected = page.get_by_test_id("token-rejected")
    expect(rejected).to_be_visible()
    expect(rejected).to_contain_text("rejected")
    expect(page.get_by_role("banner").locator("..")).to_contain_text(
        "The server rejected this tab's access token"
    )
    shot(page, "settings-token-rejected")
    page.get_by_test_id("token-input").fill(token)
    page.get_by_test_id("token-save").click()
    page.evaluate("window.location.hash = '#/settings'")
    expect(page.get_by_test_id("token-accepted")).to_contain_text("user ada")
    expect(page.get_by_test_id("token-rejected")).to_have_count(0)
    auth = page.get_by_test_id("effective-authentication")
    expect(auth).to_contain_text("users:")
    expect(auth.get_by_test_id("effective-source")).to_have_text("users")
    shot(page, "settings-token-accepted")
    # Without any token: told that one is needed (not that one was rejected).
    page.evaluate("sessionStorage.clear()")
    page.reload()
    expect(page.get_by_test_id("token-missing")).to_be_visible()
    expect(page.get_by_test_id("token-rejected")).to_have_count(0)


def _tab_to(page: Any, test_id: str, presses: int = 80) -> None:
    for _ in range(presses):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement?.dataset?.testid") == test_id:
            return
    raise AssertionError(f"{test_id} is not reachable with Tab")


def test_fork_from_the_keyboard(server: dict[str, Any], page: Any) -> None:
    url, parent = server["url"], server["prose"]
    page.goto(f"{url}/#/runs/{parent}?tab=graph")
    expect(page.get_by_test_id("graph-node-tally")).to_have_attribute("data-number", "2")
    _tab_to(page, "graph-node-tally")
    node = page.get_by_test_id("graph-node-tally")
    expect(node).to_have_attribute("role", "button")
    assert "node 2 tally" in (node.get_attribute("aria-label") or "")
    stroke = page.evaluate("getComputedStyle(document.activeElement.querySelector('rect')).stroke")
    assert stroke == "rgb(37, 99, 235)", stroke  # the focus ring
    shot(page, "keyboard-1-node-focused")
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("node-editor")).to_contain_text("Fork at node 2 · tally")
    expect(page.get_by_test_id("node-panel")).to_be_focused()
    _tab_to(page, "editor-mode-replay", presses=20)
    page.keyboard.press("Enter")
    _tab_to(page, "fork-button", presses=20)
    shot(page, "keyboard-2-fork-button")
    page.keyboard.press("Enter")
    view = page.get_by_test_id("run-view")
    expect(view).not_to_have_attribute("data-run-id", parent)
    expect(view).to_have_attribute("data-run-status", "completed")
    fork = get(url, f"/api/runs/{view.get_attribute('data-run-id')}")
    assert fork["parent_run_id"] == parent and fork["fork_number"] == 2
    assert page.dialogs == [] and page.errors == []


def test_a_run_that_finishes_between_the_views_two_reads_ends_completed(
    server: dict[str, Any], page: Any
) -> None:
    """The run view reads a run and its graph at once: when the run finishes between the two
    answers (the run says ``running``, the graph says done), the view must keep following it
    and end ``completed`` — not stop with the stale ``running`` (a fast fork under load did).

    Deterministic: the run blocks in its 2nd node; the browser's first read of the run is
    answered while it blocks, its first read of the graph only after the run finished."""
    url = server["url"]
    test_pipelines.BLOCK_ENTERED.clear()
    test_pipelines.BLOCK_RELEASE.clear()
    held: dict[str, Any] = {}
    try:
        r = httpx.post(f"{url}/api/runs", json={"pipeline": "blocking"}, trust_env=False)
        assert r.status_code == 202, r.text
        rid = r.json()["run_id"]
        assert test_pipelines.BLOCK_ENTERED.wait(20)

        def first_reads(route: Any) -> None:
            kind = "graph" if route.request.url.endswith("/graph") else "run"
            if kind in held or held.get("done"):
                route.continue_()
                return
            held[kind] = route
            if "run" in held and "graph" in held:  # the first load's two reads, both held
                held["done"] = True
                held["run"].fulfill(response=held["run"].fetch())  # read while running
                test_pipelines.BLOCK_RELEASE.set()
                assert wait_finished(url, rid)["status"] == "completed"
                held["graph"].continue_()  # read after the run finished

        page.route(f"**/api/runs/{rid}", first_reads)
        page.route(f"**/api/runs/{rid}/graph", first_reads)
        page.goto(f"{url}/#/runs/{rid}?tab=graph")
        view = page.get_by_test_id("run-view")
        expect(view).to_have_attribute("data-run-id", rid)
        assert held.get("done"), "the first load did not read the run and its graph"
        expect(view).to_have_attribute("data-run-status", "completed")
    finally:
        test_pipelines.BLOCK_RELEASE.set()
    assert page.dialogs == [] and page.errors == []


def test_usable_at_390_px(server: dict[str, Any], browser: Any) -> None:
    url, parent = server["url"], server["parent"]
    page = _page(browser, width=390, height=844)
    try:
        fits = "document.documentElement.scrollWidth <= window.innerWidth"
        main_fits = "(m => m.scrollWidth <= m.clientWidth + 1)(document.querySelector('main'))"
        page.goto(f"{url}/#/runs/{parent}?tab=graph&node=4")
        expect(page.get_by_test_id("node-editor")).to_contain_text("Fork at node 4")
        expect(page.get_by_test_id("nav-settings")).to_be_visible()
        assert page.evaluate(fits) and page.evaluate(main_fits)
        editor = page.get_by_test_id("node-editor").bounding_box()
        assert editor["x"] >= 0 and editor["x"] + editor["width"] <= 390
        page.get_by_test_id("fork-button").scroll_into_view_if_needed()
        expect(page.get_by_test_id("fork-button")).to_be_in_viewport()
        page.get_by_test_id("call-toggle-0").click()
        assert page.evaluate(main_fits)
        shot(page, "390-1-run")
        page.get_by_test_id("tab-diff").scroll_into_view_if_needed()
        page.get_by_test_id("tab-diff").click()
        expect(page.get_by_test_id("diff-panel")).to_be_visible()
        assert page.evaluate(fits) and page.evaluate(main_fits)
        fork = fork_group_by(url, parent)  # a fork's diff: wide tables scroll in their own box
        page.goto(f"{url}/#/runs/{fork}?tab=diff")
        expect(page.get_by_test_id("diff-row-3")).to_have_attribute("data-open", "yes")
        assert page.evaluate(fits) and page.evaluate(main_fits)
        shot(page, "390-2-diff")
        page.get_by_test_id("nav-settings").click()
        expect(page.get_by_test_id("effective-config")).to_be_visible()
        assert page.evaluate(fits) and page.evaluate(main_fits)
        shot(page, "390-3-settings")
        assert page.dialogs == [] and page.errors == []
    finally:
        page.context.close()
