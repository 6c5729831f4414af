"""End-to-end UI tests: Debian's headless Chromium driven by Playwright for Python.

The server is the real app (``create_app`` + uvicorn) on a free loopback port, in a thread of
this process, over a temporary store holding a recorded run of the demo research pipeline. The
model is a fake OpenAI-compatible endpoint (``httpx.MockTransport``) so the test needs no model
server and runs in seconds; every model answer starts with an HTML/script payload, so the whole
UI is exercised with hostile model output. No browser is downloaded: ``/usr/bin/chromium`` comes
from Debian's ``chromium`` package. With ``REWIND_SCREENSHOTS=1``, screenshots of each view go
to ``test-artifacts/``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import playwright.sync_api as playwright_api
import pytest
from burr.core import State, action, default
from burr.core.graph import GraphBuilder

from rewind.api import create_app
from rewind.api.pipelines import PipelineEntry, research_entry
from rewind.cli.serve import bind_socket
from rewind.engine import load_pipeline
from rewind.examples import research
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.replay import Pipeline, Rewind
from rewind.store import open_store
from rewind.tools import tool
from tests import pipelines as test_pipelines
from tests.conftest import CHROMIUM

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
STATIC_INDEX = ROOT / "src" / "rewind" / "static" / "index.html"
XSS = "<img src=x onerror=alert(1)><script>alert(2)</script>"
BIG_CHARS = 1_000_000
TIMEOUT_MS = 60_000
playwright_api.expect.set_options(timeout=TIMEOUT_MS)  # a loaded CI machine is slow


# -- a fake model whose every answer carries an HTML/script payload ----------------------------


SAMPLES = itertools.count(1)


def fake_model(request: httpx.Request) -> httpx.Response:
    """OpenAI-compatible answers: at temperature 0 the same request gets the same bytes; above 0
    every answer differs (a sampling model), so a stability run at 0.8 spreads."""
    body = json.loads(request.content)
    prompt = json.dumps(body["messages"], sort_keys=True)
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:10]
    content = f"{XSS} The data answers it ({digest})."
    if (body.get("temperature") or 0) > 0:
        content += f" Sample {next(SAMPLES)}."
    usage = {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(content.split())}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    payload = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
    }
    return httpx.Response(200, json=payload)


# -- a hostile pipeline: tool output with markup, and a 1 MB string -----------------------------


@tool("hostile.emit")
def emit_payload(size: int) -> dict[str, Any]:
    return {"html": XSS, "padding": "A" * size + "<END-OF-BIG>"}


@action(reads=["size"], writes=["payload"])
def emit(state: State) -> State:
    return state.update(payload=emit_payload(state["size"]))


@action(reads=["payload"], writes=["echo"])
def echo(state: State) -> State:
    return state.update(echo=state["payload"]["html"])


hostile = Pipeline(
    name="hostile",
    graph=GraphBuilder()
    .with_actions(emit=emit, echo=echo)
    .with_transitions(("emit", "echo", default))
    .build(),
    entrypoint="emit",
    ref="tests.test_ui:hostile",
)


@action(reads=["payload"], writes=["echo"])
def echo_edited(state: State) -> State:
    html = state["payload"]["html"]
    return state.update(echo=html)


# The same pipeline after its 'echo' node's code was edited (same behaviour, other code).
hostile_edited = Pipeline(
    name="hostile",
    graph=GraphBuilder()
    .with_actions(emit=emit, echo=echo_edited)
    .with_transitions(("emit", "echo", default))
    .build(),
    entrypoint="emit",
)


# -- the server ----------------------------------------------------------------------------------


class ThreadServer:
    """The real app under uvicorn on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (make installs it)")
    if not STATIC_INDEX.exists():
        pytest.fail("the UI is not built: cd web && npm ci && npm run build (make does it)")
    folder = tmp_path_factory.mktemp("ui-store")
    client = ChatClient(
        Endpoint(base_url="http://fake.test/v1", model="fake-model"),
        transport=httpx.MockTransport(fake_model),
        retry=RetryPolicy(attempts=1),
    )
    store = open_store(folder)
    rw = Rewind(store, chat_client=client)
    parent = rw.record(research.build(), research.initial_state(), config={"model": "fake-model"})
    assert parent.status == "completed", parent.error
    big = rw.record(hostile, {"size": BIG_CHARS})
    assert big.status == "completed", big.error
    chat = rw.record(
        load_pipeline("tests.burr_apps:pure_application"),
        inputs={"question": "why?"},
        halt_after=["summarise"],
    )
    assert chat.status == "completed", chat.error
    app = create_app(
        store,
        chat_client=client,
        pipelines={
            "research": research_entry(),
            "hostile": PipelineEntry.of(hostile, {"size": 10}),
            "blocking": PipelineEntry.of(test_pipelines.blocking, {"x": 1}),
        },
    )
    with ThreadServer(app) as srv:
        yield {
            "url": srv.url,
            "parent": parent.run_id,
            "hostile": big.run_id,
            "chat": chat.run_id,
            "store": store,
        }
    client.close()
    store.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    pg = context.new_page()
    dialogs: list[str] = []
    errors: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    pg.on("dialog", on_dialog)
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.dialogs = dialogs  # type: ignore[attr-defined]
    pg.errors = errors  # type: ignore[attr-defined]
    pg.set_default_timeout(TIMEOUT_MS)
    yield pg
    context.close()


SCREENSHOTS = os.environ.get("REWIND_SCREENSHOTS") == "1"
"""Screenshots are for a person to look at (no test or tool reads them): opt-in."""


def screenshot(target: Any, name: str, *, full_page: bool = False) -> None:
    """Save ``target`` (a Playwright ``Page`` or ``Locator``) as ``test-artifacts/<name>.png``
    when ``REWIND_SCREENSHOTS=1``. A locator's screenshot waits for its element to be visible;
    without screenshots that wait stays, as an assertion (fails after ``TIMEOUT_MS``)."""
    is_page = isinstance(target, playwright_api.Page)
    if not SCREENSHOTS:
        if not is_page:
            playwright_api.expect(target).to_be_visible()
        return
    ARTIFACTS.mkdir(exist_ok=True)
    path = str(ARTIFACTS / f"{name}.png")
    if is_page:
        target.screenshot(path=path, full_page=full_page)
    else:
        target.screenshot(path=path)


def shot(page: Any, name: str) -> None:
    """A full-page screenshot ``ui-<name>.png`` (see :func:`screenshot`)."""
    screenshot(page, f"ui-{name}", full_page=True)


def api_get(url: str, path: str, **params: Any) -> Any:
    return httpx.get(url + path, params=params or None, timeout=30, trust_env=False).json()


# -- tests ---------------------------------------------------------------------------------------


def test_fork_at_node_3_from_the_ui(server: dict[str, Any], page: Any) -> None:
    expect = playwright_api.expect
    url, parent = server["url"], server["parent"]
    page.goto(f"{url}/#/runs/{parent}?tab=graph")
    expect(page.get_by_test_id(f"run-item-{parent}")).to_be_visible()
    expect(page.get_by_test_id("graph-node-publish")).to_have_attribute("data-status", "executed")
    shot(page, "1-runs-and-graph")

    # Select node 3 and change one param in the NodeEditor.
    node3 = page.get_by_test_id("graph-node-analyse")
    expect(node3).to_have_attribute("data-number", "3")
    node3.click()
    editor = page.get_by_test_id("node-editor")
    expect(editor).to_contain_text("Fork at node 3 · analyse")
    recorded = api_get(url, f"/api/runs/{parent}/nodes/3")["node"]["params"]["group_by"]
    new_value = "month" if recorded == "season" else "season"
    editor.get_by_test_id("editor-name").select_option("group_by")
    value = editor.get_by_test_id("editor-value")
    value.fill('"season')  # invalid JSON is caught before submit
    expect(editor.get_by_test_id("editor-json-error")).to_be_visible()
    expect(editor.get_by_test_id("fork-button")).to_be_disabled()
    value.fill(json.dumps(new_value))
    expect(editor.get_by_test_id("fork-button")).to_be_enabled()
    # Forks default to recorded; live names the resources it would touch and waits for a tick.
    expect(editor.get_by_test_id("editor-effects")).to_have_value("recorded")
    editor.get_by_test_id("editor-effects").select_option("live")
    expect(editor.get_by_test_id("live-resources")).to_contain_text("publish")
    expect(editor.get_by_test_id("fork-button")).to_be_disabled()
    editor.get_by_test_id("live-confirm-check").check()
    expect(editor.get_by_test_id("fork-button")).to_be_enabled()
    shot(page, "2-node-editor")
    editor.get_by_test_id("fork-button").click()

    # The fork opens and replays live: grey 1-2 (inherited), orange 3+ (re-executed).
    view = page.get_by_test_id("run-view")
    expect(view).not_to_have_attribute("data-run-id", parent)
    fork_id = view.get_attribute("data-run-id")
    assert fork_id and fork_id != parent
    expect(view).to_have_attribute("data-run-status", "completed")
    for name in ("plan", "research"):
        expect(page.get_by_test_id(f"graph-node-{name}")).to_have_attribute(
            "data-status", "inherited"
        )
    for name in research.NODES[2:]:
        expect(page.get_by_test_id(f"graph-node-{name}")).to_have_attribute(
            "data-status", "executed"
        )
    fills = page.eval_on_selector_all(
        "[data-testid^=graph-node-] rect", "els => els.map(e => e.getAttribute('fill'))"
    )
    assert fills[:2] == ["#d1d5db"] * 2 and set(fills[2:]) == {"#fb923c"}, fills
    fork = api_get(url, f"/api/runs/{fork_id}")
    assert fork["parent_run_id"] == parent and fork["fork_number"] == 3
    assert fork["override"] == {
        "kind": "param",
        "node": "analyse",
        "param": "group_by",
        "value": new_value,
    }
    shot(page, "3-fork-graph")

    # DiffPanel: the first divergence is node 3 and names the changed field paths.
    page.get_by_test_id("tab-diff").click()
    panel = page.get_by_test_id("diff-panel")
    row3 = panel.get_by_test_id("diff-row-3")
    expect(row3).to_have_attribute("data-status", "changed")
    expect(row3.get_by_test_id("first-divergence")).to_be_visible()
    expect(panel.get_by_test_id("hash-match-1")).to_contain_text("= hash")
    expect(panel.get_by_test_id("hash-match-3")).to_contain_text("≠ hash")
    diff = api_get(url, "/api/diff", a=parent, b=fork_id)
    assert diff["first_divergence"] == 2
    paths = [c["path"] for c in diff["nodes"][2]["changes"]]
    assert "analysis.group_by" in paths
    shown = panel.get_by_test_id("diff-path").all_inner_texts()
    assert "analysis.group_by" in shown
    assert set(paths[:50]) <= set(shown)
    shot(page, "4-diff")

    # CostBar: the numbers are the API's.
    cost = api_get(url, f"/api/runs/{fork_id}/cost")
    parent_run = api_get(url, f"/api/runs/{parent}")
    assert cost["original"]["tokens"] == parent_run["tokens"] > 0
    assert cost["replay"]["tokens"] == fork["tokens"]

    def text(tid: str) -> str:
        return page.get_by_test_id(tid).inner_text().strip()

    def fmt(n: int) -> str:
        return f"{abs(n):,}"

    assert text("cost-original-tokens") == fmt(cost["original"]["tokens"])
    assert text("cost-replay-tokens") == fmt(cost["replay"]["tokens"])
    delta = cost["delta"]["tokens"]
    assert text("cost-delta-tokens") == ("−" if delta < 0 else "+" if delta else "") + fmt(delta)
    assert text("cost-saved-tokens") == fmt(cost["saved"]["tokens"])
    assert cost["saved"]["tokens"] == sum(
        n["original_tokens"] for n in cost["nodes"] if n["status"] in ("inherited", "hit")
    )
    screenshot(page.get_by_test_id("cost-bar"), "ui-5-cost-bar")

    # RawJSON of node 3: hashes and outputs, copyable.
    page.get_by_test_id("tab-raw").click()
    page.get_by_role("button", name="3 analyse").click()
    raw = page.get_by_test_id("raw-json")
    node3_api = api_get(url, f"/api/runs/{fork_id}/nodes/3")["node"]
    expect(raw.get_by_test_id("raw-output")).to_contain_text(node3_api["output_hash"])
    expect(raw.get_by_test_id("raw-state")).to_contain_text(node3_api["state_hash"])
    expect(raw.get_by_test_id("raw-input")).to_contain_text(new_value)
    shot(page, "6-raw-json")

    # Settings come from the server.
    page.get_by_test_id("nav-settings").click()
    settings = api_get(url, "/api/settings")
    value = "effective-value"
    model = page.get_by_test_id("effective-model").get_by_test_id(value)
    expect(model).to_have_text(settings["model"])
    store_folder = page.get_by_test_id("effective-store-folder").get_by_test_id(value)
    expect(store_folder).to_have_text(settings["store"]["root"])
    shot(page, "7-settings")
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_a_press_on_a_node_selects_it_though_the_drawing_moves_before_the_release(
    server: dict[str, Any], page: Any
) -> None:
    """The release of a click can land off the node it pressed: the run view shifts under a
    still pointer (content loads above the graph, the graph re-fits or is laid out again). A
    press selects, so that click still selects (test_fork_at_node_3_from_the_ui once clicked node
    3 and selected nothing). Here the view scrolls between press and release."""
    expect = playwright_api.expect
    url, parent = server["url"], server["parent"]
    page.set_viewport_size({"width": 1500, "height": 600})  # the run view scrolls
    page.goto(f"{url}/#/runs/{parent}?tab=graph")
    expect(page.get_by_test_id("graph")).to_have_attribute("data-layout", "done")
    node3 = page.get_by_test_id("graph-node-analyse")
    expect(node3).to_have_attribute("data-number", "3")
    node3.scroll_into_view_if_needed()
    box = node3.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.locator("main").evaluate(
        "main => { const top = main.scrollTop; main.scrollBy(0, 300);"
        " if (main.scrollTop === top) main.scrollBy(0, -300); }"
    )
    moved = node3.bounding_box()
    assert abs(moved["y"] - box["y"]) > box["height"], (box, moved)  # off the node now
    page.mouse.up()
    expect(page).to_have_url(re.compile(r"[?&]node=3(&|$)"))
    expect(page.get_by_test_id("node-editor")).to_contain_text("Fork at node 3 · analyse")
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def _pointer_on_node(
    page: Any, server: dict[str, Any], name: str, number: int
) -> tuple[Any, dict[str, float]]:
    """Open the demo parent's graph, check that node ``name`` is node ``number``, and put the
    mouse on its centre. Returns the node's locator and its bounding box (CSS px)."""
    expect = playwright_api.expect
    page.goto(f"{server['url']}/#/runs/{server['parent']}?tab=graph")
    expect(page.get_by_test_id("graph")).to_have_attribute("data-layout", "done")
    node = page.get_by_test_id(f"graph-node-{name}")
    expect(node).to_have_attribute("data-number", str(number))
    box = node.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    return node, box


def test_a_click_without_a_press_selects_a_node_a_press_left_earlier(
    server: dict[str, Any], page: Any
) -> None:
    """A click with no pointer press (assistive technology, ``detail`` 0) selects the node even
    when a mouse press on that node was released elsewhere earlier (a pan started on it): that
    press must not swallow the later click as the release of its own."""
    expect = playwright_api.expect
    node2, box = _pointer_on_node(page, server, "research", 2)
    page.mouse.down()  # then drags away (a pan): no click on node 2
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] * 4, steps=5)
    page.mouse.up()
    page.get_by_test_id("graph-node-analyse").focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"[?&]node=3(&|$)"))
    node2.dispatch_event("click")
    expect(page).to_have_url(re.compile(r"[?&]node=2(&|$)"))
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_a_pan_started_on_a_node_selects_nothing(server: dict[str, Any], page: Any) -> None:
    """A press on a node that moves before its release is a pan: the view moves, the selection
    (URL, fork editor, history) does not. A press that comes up where it went down selects."""
    expect = playwright_api.expect
    node1, box = _pointer_on_node(page, server, "plan", 1)
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.down()
    page.mouse.move(x + 60, y + 40, steps=8)
    page.mouse.up()
    moved = node1.bounding_box()
    assert (moved["x"], moved["y"]) != (box["x"], box["y"]), "the drag did not pan the view"
    assert "node=" not in page.url
    expect(page.get_by_test_id("node-editor")).to_have_count(0)
    node2 = page.get_by_test_id("graph-node-research")  # a later press selects as before
    box2 = node2.bounding_box()
    page.mouse.click(box2["x"] + box2["width"] / 2, box2["y"] + box2["height"] / 2)
    expect(page).to_have_url(re.compile(r"[?&]node=2(&|$)"))
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_fork_a_burr_app_with_a_changed_runtime_input(server: dict[str, Any], page: Any) -> None:
    expect = playwright_api.expect
    url, parent = server["url"], server["chat"]
    page.goto(f"{url}/#/runs/{parent}?tab=graph")
    page.get_by_test_id("graph-node-ask").click()
    editor = page.get_by_test_id("node-editor")
    expect(editor).to_contain_text("Fork at node 1 · ask")
    editor.get_by_test_id("editor-mode-input").click()
    expect(editor.get_by_test_id("editor-name")).to_have_value("question")
    expect(editor.get_by_test_id("editor-value")).to_have_value('"why?"')
    editor.get_by_test_id("editor-value").fill('"how?"')
    shot(page, "input-override")
    editor.get_by_test_id("fork-button").click()
    view = page.get_by_test_id("run-view")
    expect(view).not_to_have_attribute("data-run-id", parent)
    expect(view).to_have_attribute("data-run-status", "completed")
    fork = api_get(url, f"/api/runs/{view.get_attribute('data-run-id')}")
    assert fork["override"] == {"kind": "input", "node": "ask", "name": "question", "value": "how?"}
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_unchanged_replay_from_the_ui_is_all_green(server: dict[str, Any], page: Any) -> None:
    expect = playwright_api.expect
    url, parent = server["url"], server["parent"]
    page.goto(f"{url}/#/runs/{parent}?tab=graph&node=3")
    editor = page.get_by_test_id("node-editor")
    editor.get_by_test_id("editor-mode-replay").click()
    editor.get_by_test_id("fork-button").click()
    view = page.get_by_test_id("run-view")
    expect(view).not_to_have_attribute("data-run-id", parent)
    expect(view).to_have_attribute("data-run-status", "completed")
    for name in research.NODES[2:]:
        expect(page.get_by_test_id(f"graph-node-{name}")).to_have_attribute("data-status", "hit")
    expect(page.get_by_test_id("cost-replay-tokens")).to_have_text("0")
    page.get_by_test_id("tab-diff").click()
    expect(page.get_by_test_id("diff-summary")).to_contain_text("none")
    shot(page, "8-unchanged-replay-diff")


def test_model_and_tool_output_render_as_text(server: dict[str, Any], page: Any) -> None:
    expect = playwright_api.expect
    url = server["url"]
    # Model output (critique, node 4 of the demo) and tool output (the hostile pipeline).
    page.goto(f"{url}/#/runs/{server['parent']}?tab=graph&node=4")
    output = page.get_by_test_id("node-output")
    expect(output).to_contain_text(XSS)
    page.goto(f"{url}/#/runs/{server['hostile']}?tab=raw&node=1")
    raw = page.get_by_test_id("raw-output")
    expect(raw).to_contain_text(XSS)
    page.goto(f"{url}/#/runs/{server['hostile']}?tab=graph&node=2")
    expect(page.get_by_test_id("node-output")).to_contain_text(XSS)
    time.sleep(0.3)  # give an injected handler the chance it must not have
    assert page.locator("main img").count() == 0
    assert page.locator("main script").count() == 0
    assert page.dialogs == []  # type: ignore[attr-defined]
    assert page.evaluate("document.querySelectorAll('img[src=x]').length") == 0
    shot(page, "9-xss-literal")


def test_one_megabyte_output_stays_responsive(server: dict[str, Any], page: Any) -> None:
    expect = playwright_api.expect
    url = server["url"]
    started = time.monotonic()
    page.goto(f"{url}/#/runs/{server['hostile']}?tab=raw&node=1")
    raw = page.get_by_test_id("raw-output")
    expect(raw.get_by_test_id("truncated-note")).to_be_visible()
    assert time.monotonic() - started < 15
    shown = len(raw.locator("pre").first.inner_text())
    assert shown < 10_000, shown
    clicked = time.monotonic()
    raw.get_by_role("button", name="show all").click()
    expect(raw).to_contain_text("<END-OF-BIG>")
    assert len(raw.locator("pre").first.inner_text()) > BIG_CHARS
    # Still responsive: the page answers script and switches tabs promptly.
    assert page.evaluate("1 + 1") == 2
    page.get_by_test_id("tab-graph").click()
    expect(page.get_by_test_id("graph-node-emit")).to_be_visible()
    assert time.monotonic() - clicked < 15
    shot(page, "10-big-output")
    assert page.errors == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("transport", ["sse", "polling"])
def test_graph_updates_live(server: dict[str, Any], page: Any, transport: str) -> None:
    """A running node pulses; when it finishes the graph recolours without a reload — over
    server-sent events, and by polling when the event stream is unavailable."""
    expect = playwright_api.expect
    url = server["url"]
    test_pipelines.BLOCK_ENTERED.clear()
    test_pipelines.BLOCK_RELEASE.clear()
    if transport == "polling":
        page.route("**/api/runs/*/events", lambda route: route.abort())
    try:
        r = httpx.post(f"{url}/api/runs", json={"pipeline": "blocking"}, trust_env=False)
        assert r.status_code == 202, r.text
        run_id = r.json()["run_id"]
        assert test_pipelines.BLOCK_ENTERED.wait(20)
        page.goto(f"{url}/#/runs/{run_id}?tab=graph")
        hold = page.get_by_test_id("graph-node-hold")
        expect(hold).to_have_attribute("data-status", "running")
        expect(hold).to_have_class(re.compile("node-running"))
        expect(page.get_by_test_id("graph-node-prepare")).to_have_attribute(
            "data-status", "executed"
        )
        expect(page.get_by_test_id("run-view")).to_contain_text(f"live ({transport})")
        shot(page, f"11-live-{transport}")
    finally:
        test_pipelines.BLOCK_RELEASE.set()
    expect(hold).to_have_attribute("data-status", "executed")
    expect(page.get_by_test_id("run-view")).to_have_attribute("data-run-status", "completed")
    expect(page.get_by_test_id(f"run-item-{run_id}")).to_contain_text("completed")


def wait_run(url: str, run_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run: dict[str, Any] = api_get(url, f"/api/runs/{run_id}")
        if run["status"] not in ("queued", "running"):
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish")


def test_audit_tab_shows_the_verdicts(server: dict[str, Any], page: Any) -> None:
    expect = playwright_api.expect
    url, parent = server["url"], server["parent"]
    publish = research.NODES.index("publish") + 1

    # The recorded demo run against the world as it is now: publish is faithful (green).
    page.goto(f"{url}/#/runs/{parent}?tab=audit")
    panel = page.get_by_test_id("audit-panel")
    row = panel.get_by_test_id(f"audit-row-{publish}")
    expect(row).to_have_attribute("data-verdict", "faithful")
    badge = row.get_by_test_id("verdict")
    expect(badge).to_have_text("faithful")
    expect(badge).to_have_class(re.compile("emerald"))
    expect(row).to_contain_text("publish")
    api_report = api_get(url, f"/api/runs/{parent}/audit")
    [verdict] = api_report["verdicts"]
    assert verdict["verdict"] == "faithful" and verdict["node"] == "publish"
    expect(row).to_contain_text(verdict["tool"])
    expect(row).to_contain_text(verdict["resources"][0]["recorded"]["digest"][:12])
    expect(panel.get_by_test_id("audit-summary")).to_have_attribute("data-passed", "true")
    shot(page, "12-audit-faithful")

    # An unchanged replay serves publish from the record: not re-executed (grey), fails closed.
    r = httpx.post(f"{url}/api/runs/{parent}/replay", json={"at": 1}, trust_env=False)
    assert r.status_code == 202, r.text
    replay = wait_run(url, r.json()["run_id"])
    assert replay["status"] == "completed", replay["error"]
    page.goto(f"{url}/#/runs/{replay['run_id']}?tab=audit")
    row = page.get_by_test_id(f"audit-row-{publish}")
    expect(row).to_have_attribute("data-verdict", "not-re-executed")
    expect(row.get_by_test_id("verdict")).to_have_class(re.compile("slate"))
    expect(page.get_by_test_id("audit-summary")).to_have_attribute("data-passed", "false")
    expect(page.get_by_test_id("audit-summary")).to_contain_text("fails closed")
    shot(page, "13-audit-not-re-executed")
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_what_if_grid_from_the_ui(server: dict[str, Any], page: Any) -> None:
    expect = playwright_api.expect
    url, parent = server["url"], server["parent"]
    page.goto(f"{url}/#/runs/{parent}?tab=grid")
    form = page.get_by_test_id("grid-form")
    form.get_by_test_id("grid-at").select_option("3")
    form.get_by_test_id("grid-param").select_option("analyse.group_by")
    recorded = api_get(url, f"/api/runs/{parent}/nodes/3")["node"]["params"]["group_by"]
    other = "month" if recorded == "season" else "season"
    form.get_by_test_id("grid-value-1").fill(json.dumps(recorded))
    form.get_by_test_id("grid-value-2").fill(json.dumps(other))
    expect(form.get_by_test_id("grid-run")).to_have_text("Run grid (2 variants)")
    # Variants default to dry-run; live names what each variant would touch and waits for a
    # confirmation before the grid can run.
    expect(form.get_by_test_id("grid-effects")).to_have_value("dry-run")
    form.get_by_test_id("grid-effects").select_option("live")
    expect(form.get_by_test_id("live-resources")).to_contain_text("publish")
    expect(form.get_by_test_id("grid-run")).to_be_disabled()
    form.get_by_test_id("live-confirm-check").check()
    expect(form.get_by_test_id("grid-run")).to_be_enabled()
    shot(page, "14-grid-form")
    form.get_by_test_id("grid-run").click()

    expect(page.get_by_test_id("job-status")).to_have_text("completed")
    matrix = page.get_by_test_id("grid-matrix")
    expect(matrix).to_be_visible()
    jobs = api_get(url, "/api/grids", run_id=parent)["jobs"]
    job = api_get(url, f"/api/grids/{jobs[0]['id']}")
    report = job["report"]
    assert job["status"] == "completed" and len(report["variants"]) == 2
    assert [v["override"]["value"] for v in report["variants"]] == [recorded, other]
    for v in report["variants"]:
        expect(matrix.get_by_test_id(f"grid-variant-{v['index'] + 1}")).to_contain_text(v["label"])
    # Rows are the nodes, columns the variants; a cell is a short hash and the changed fields.
    assert [r["label"] for r in report["rows"]] == list(research.NODES)
    for row in report["rows"]:
        for v, cell in zip(report["variants"], row["cells"], strict=True):
            td = matrix.get_by_test_id(f"grid-cell-{row['index'] + 1}-{v['index'] + 1}")
            expect(td).to_have_attribute("data-status", cell["status"])
            expect(td).to_contain_text(cell["short"])
    same, changed = report["variants"]
    assert same["first_divergence"] is None
    assert changed["first_divergence"]["node"] == "analyse"
    marked = matrix.get_by_test_id("grid-cell-3-2")
    expect(marked.get_by_test_id("first-divergence")).to_be_visible()
    expect(marked).to_contain_text(f"Δ{report['rows'][2]['cells'][1]['changed_fields']}")
    expect(matrix.get_by_test_id("first-divergence")).to_have_count(1)
    expect(matrix.get_by_test_id("grid-cell-1-1")).to_contain_text("=")
    # Which variants change the artifact.
    assert changed["changes_artifact"] is True and report["changes_artifact"] == [changed["label"]]
    expect(matrix.get_by_test_id("grid-artifact-2")).to_have_attribute("data-changes", "true")
    expect(matrix.get_by_test_id("grid-artifact-summary")).to_contain_text(changed["label"])
    shot(page, "15-grid-matrix")
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_stability_from_the_ui(server: dict[str, Any], page: Any) -> None:
    expect = playwright_api.expect
    url, parent = server["url"], server["parent"]
    critique = research.NODES.index("critique") + 1
    page.goto(f"{url}/#/runs/{parent}?tab=stability")
    form = page.get_by_test_id("stability-form")
    form.get_by_test_id("stability-k").fill("3")
    form.get_by_test_id("stability-from").select_option(str(critique))
    # Sampled at temperature 0.8 the fake model answers differently every time: hashes spread.
    form.get_by_test_id("stability-change").select_option("temperature")
    form.get_by_test_id("stability-temperature").fill("0.8")
    form.get_by_test_id("stability-run").click()
    expect(page.get_by_test_id("job-status")).to_have_text("completed")
    result = page.get_by_test_id("stability-result")
    jobs = api_get(url, "/api/stability", run_id=parent)["jobs"]
    report = api_get(url, f"/api/stability/{jobs[0]['id']}")["report"]
    assert report["k"] == 3 and report["from_node"] == "critique"
    assert report["override"]["param"] == "temperature" and report["override"]["value"] == 0.8
    assert report["stable_share"] < 1.0 and report["first_spread"] is not None
    share = f"{report['stable_nodes']}/{report['node_count']} nodes"
    expect(result.get_by_test_id("stable-share")).to_contain_text(share)
    for n in report["nodes"]:
        row = result.get_by_test_id(f"stability-row-{n['index'] + 1}")
        expect(row).to_have_attribute("data-stable", "true" if n["stable"] else "false")
        expect(row.get_by_test_id("distinct")).to_contain_text(str(n["distinct"]))
        expect(row.get_by_test_id("modal-share")).to_contain_text(f"{n['modal_count']}/3")
        hashes = {h for h in n["hashes"] if h is not None}
        segments = len(hashes) + (1 if None in n["hashes"] else 0)
        expect(row.get_by_test_id("hash-segment")).to_have_count(segments)
    first = report["first_spread"]
    row = result.get_by_test_id(f"stability-row-{first['index'] + 1}")
    expect(row.get_by_test_id("first-spread-marker")).to_be_visible()
    expect(result.get_by_test_id("first-spread-marker")).to_have_count(1)
    expect(result.get_by_test_id("first-spread")).to_contain_text(first["label"])
    shot(page, "16-stability")
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


@pytest.fixture(scope="module", autouse=True)
def _clean_old_screenshots() -> None:
    if ARTIFACTS.exists() and os.environ.get("REWIND_KEEP_SCREENSHOTS") != "1":
        for old in ARTIFACTS.glob("ui-*.png"):
            old.unlink()
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.disk_usage(ARTIFACTS)  # fails early if the folder is not writable


def test_diff_panel_labels_a_node_whose_code_changed(server: dict[str, Any], page: Any) -> None:
    expect = playwright_api.expect
    rw = Rewind(server["store"])
    rw.register(hostile_edited)
    child = rw.fork(server["hostile"], at="echo")
    assert child.status == "completed", child.error
    page.goto(f"{server['url']}/#/runs/{child.run_id}")
    page.get_by_test_id("tab-diff").click()
    expect(page.get_by_test_id("code-changed-2")).to_have_text("code changed")
    expect(page.get_by_test_id("code-changed-1")).to_have_count(0)


# -- traces: replay switches and the failure view (issue 16) -------------------------------------


OTEL_DATA = ROOT / "tests" / "data" / "otel"
REPLAY_SWITCHES = ("cached_llm", "cached_tools", "stop_at_divergence")


def _trace_with_a_tool_call() -> dict[str, Any]:
    """OpenInference's real export of a two-call chain (``tests/data/otel``) with one GenAI
    ``execute_tool`` span added after the model calls: a trace each replay switch acts on."""
    import base64

    doc = json.loads((OTEL_DATA / "openinference_openai.json").read_text())
    spans, root = next(
        (scope["spans"], span)
        for rs in doc["resourceSpans"]
        for scope in rs["scopeSpans"]
        for span in scope["spans"]
        if span["name"] == "qa"
    )

    def attr(key: str, value: str) -> dict[str, Any]:
        return {"key": key, "value": {"stringValue": value}}

    spans.append(
        {
            "traceId": root["traceId"],
            "spanId": base64.b64encode(bytes.fromhex("cd" * 8)).decode(),
            "parentSpanId": root["spanId"],
            "name": "execute_tool lookup",
            "startTimeUnixNano": "1796070689969790000",
            "endTimeUnixNano": "1796070689969830000",
            "attributes": [
                attr("gen_ai.operation.name", "execute_tool"),
                attr("gen_ai.tool.name", "lookup"),
                attr("gen_ai.tool.call.arguments", json.dumps({"city": "Seattle"})),
                attr("gen_ai.tool.call.result", json.dumps({"rain_mm": 120})),
            ],
        }
    )
    return doc


@pytest.fixture(scope="module")
def trace_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The app over a store holding one imported third-party trace; the model is a real loopback
    server (``ModelStub``) that counts every request it receives."""
    from rewind.tracing.otel import import_otlp
    from tests.model_stub import STUB_MODEL, ModelStub

    store = open_store(tmp_path_factory.mktemp("ui-traces"))
    result = import_otlp(store, [_trace_with_a_tool_call()])
    assert result.errors == [] and len(result.imported) == 1
    with (
        ModelStub() as stub,
        ChatClient(
            Endpoint(base_url=stub.base_url, model=STUB_MODEL), retry=RetryPolicy(attempts=1)
        ) as client,
        ThreadServer(create_app(store, chat_client=client, pipelines={})) as srv,
    ):
        yield {"url": srv.url, "trace": result.imported[0], "stub": stub}
    store.close()


@pytest.fixture(scope="module")
def failures_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The app over the planted corpus of ``test_tracing_correlation`` (calls fail only above
    4,000 input tokens, whatever the model) plus one failed trace whose error is markup."""
    from rewind.tracing.model import StepData, TraceData
    from rewind.tracing.store import write_trace
    from tests.test_tracing_correlation import N, planted

    store = open_store(tmp_path_factory.mktemp("ui-failures"))
    for i in range(N):
        write_trace(store, planted(i))
    hostile_trace = TraceData(
        trace_id="ee" * 16,
        name="hostile",
        status="failed",
        input={"q": XSS},
        started_at=1_700_000_100,
        ended_at=1_700_000_101,
        error_type="ValueError",
        error_message=XSS,
        steps=[StepData(0, "parse", "parse", "failed", error_type="ValueError", error_message=XSS)],
    )
    write_trace(store, hostile_trace)
    with ThreadServer(create_app(store, chat_client=None, pipelines={})) as srv:
        yield {"url": srv.url, "failing": {f"{i:032x}" for i in range(N) if i * 250 + 100 > 4000}}
    store.close()


def test_failure_view_shows_the_planted_input_length_bucket(
    failures_server: dict[str, Any], page: Any
) -> None:
    expect = playwright_api.expect
    url = failures_server["url"]
    page.goto(f"{url}/#/")
    page.get_by_test_id("nav-failures").click()
    view = page.get_by_test_id("failures-view")
    expect(view.get_by_test_id("failures-summary")).to_have_text("25 of 41 traces failed (61 %).")
    api = api_get(url, "/api/traces/failures", by=["input_length", "model"])
    by_dim = {c["dimension"]: c for c in api["correlations"]}

    length = view.get_by_test_id("correlation-input_length")
    # What the figures mean: the unit, the denominator, the bucket edges and the finding bar.
    expect(length.get_by_test_id("bucket-edges")).to_contain_text(
        "0–499 · 500–999 · 1,000–1,999 · 2,000–3,999 · 4,000–7,999 · 8,000–15,999"
    )
    expect(length.get_by_test_id("bucket-edges")).to_contain_text("32,000 and more")
    expect(length.get_by_test_id("overall-input_length")).to_contain_text(
        "Overall: 25 of 41 traces failed (61 %)"
    )
    expect(length.get_by_test_id("overall-input_length")).to_contain_text(
        "at least 2 failures and its rate is at least 80 %"
    )
    rows = length.get_by_test_id("corr-group")
    expect(rows).to_have_count(len(by_dim["input_length"]["groups"]))
    for group in by_dim["input_length"]["groups"]:
        row = length.locator(f'[data-key="{group["key"]}"]')
        expect(row).to_have_attribute("data-finding", "true" if group["finding"] else "false")
        expect(row.get_by_test_id("group-count")).to_have_text(
            f"{group['failed']} / {group['total']}"
        )
    hot = length.locator('[data-key="4000-7999 tokens"]')
    expect(hot).to_have_attribute("data-finding", "true")
    expect(hot.get_by_test_id("group-count")).to_have_text("16 / 16")
    expect(hot.get_by_test_id("group-rate")).to_have_text("100 %")
    expect(hot.get_by_test_id("finding-badge")).to_be_visible()
    for cold in ("0-499 tokens", "2000-3999 tokens"):
        expect(length.locator(f'[data-key="{cold}"]')).to_have_attribute("data-finding", "false")
    below = length.locator('[data-key="2000-3999 tokens"]')
    expect(below.get_by_test_id("group-count")).to_have_text("0 / 8")
    # One failure without a token count: its own bucket, too few failures to be flagged.
    unknown = length.locator('[data-key="unknown"]')
    expect(unknown.get_by_test_id("group-count")).to_have_text("1 / 1")
    expect(unknown).to_have_attribute("data-finding", "false")
    expect(length.get_by_test_id("findings-input_length")).to_contain_text(
        "input_length 4000-7999 tokens: 16/16 traces failed (100% vs 61% overall)"
    )
    # The model is not correlated with failure: no group flagged, and each row names its unit.
    model = view.get_by_test_id("correlation-model")
    expect(model).to_contain_text("failed / LLM steps")
    expect(model.locator('[data-finding="true"]')).to_have_count(0)
    expect(model.locator('[data-key="model-a"]').get_by_test_id("group-count")).to_have_text(
        "12 / 20"
    )
    expect(view.get_by_test_id("correlation-params")).to_be_visible()
    shot(page, "17-failures")

    # Example traces link to the trace view, where the failure is shown.
    examples = hot.get_by_test_id("group-example")
    expect(examples).to_have_count(len(by_dim["input_length"]["groups"][4]["examples"]))
    examples.first.click()
    trace_view = page.get_by_test_id("trace-view")
    expect(trace_view).to_have_attribute("data-kind", "trace")
    assert trace_view.get_attribute("data-trace-id") in failures_server["failing"]
    expect(trace_view.get_by_test_id("trace-status")).to_have_text("failed")
    expect(trace_view).to_contain_text("context length exceeded")

    # A dimension left out is not asked for; hostile error text is shown as text.
    page.go_back()
    view.get_by_test_id("by-params").uncheck()
    expect(view.get_by_test_id("correlation-params")).to_have_count(0)
    expect(view.get_by_test_id("correlation-input_length")).to_be_visible()
    view.get_by_test_id("failures-since").fill("last tuesday")
    view.get_by_test_id("failures-analyse").click()
    expect(view.get_by_test_id("failures-error")).to_contain_text("last tuesday")
    expect(view.get_by_test_id("correlation-input_length")).to_have_count(0)
    view.get_by_test_id("failures-since").fill("")
    view.get_by_test_id("failures-analyse").click()
    expect(view.get_by_test_id("failures-error")).to_have_count(0)
    patterns = view.get_by_test_id("failure-patterns")
    expect(patterns).to_contain_text("context_overflow")
    patterns.locator(f'a[href="#/traces/{"ee" * 16}"]').click()
    expect(page.get_by_test_id("trace-step-error")).to_have_text(f"ValueError: {XSS}")
    assert page.locator("img[src=x]").count() == 0
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_replay_switches_from_the_ui(trace_server: dict[str, Any], page: Any) -> None:
    expect = playwright_api.expect
    url, tid, stub = trace_server["url"], trace_server["trace"], trace_server["stub"]
    page.goto(f"{url}/#/")
    page.get_by_test_id("nav-traces").click()
    row = page.locator(f'[data-testid="trace-row"][data-trace-id="{tid}"]')
    row.get_by_role("link").first.click()
    view = page.get_by_test_id("trace-view")
    expect(view).to_have_attribute("data-trace-id", tid)
    expect(view.get_by_test_id("trace-step")).to_have_count(3)
    panel = view.get_by_test_id("replay-panel")

    # Labels and defaults are the API's (and the CLI's): both caches on, no stop.
    spec = api_get(url, "/openapi.json")["components"]["schemas"]
    body = next(
        s
        for s in spec.values()
        if set(REPLAY_SWITCHES) <= set(s.get("properties", {})) and "change" in s["properties"]
    )
    for key, label in zip(
        REPLAY_SWITCHES,
        ("use cached LLM answers", "use cached tool results", "stop at the first divergence"),
        strict=True,
    ):
        box = panel.get_by_test_id(f"switch-{key}")
        default = body["properties"][key]["default"]
        (expect(box).to_be_checked if default else expect(box).not_to_be_checked)()
        expect(panel.get_by_label(label)).to_have_count(1)

    def replay(change: str = "", **switches: bool) -> Any:
        panel.get_by_test_id("replay-change").fill(change)
        for key in REPLAY_SWITCHES:
            panel.get_by_test_id(f"switch-{key}").set_checked(
                switches.get(key, body["properties"][key]["default"])
            )
        before = len(stub.requests)
        old = panel.get_by_test_id("replay-link")
        previous = old.inner_text() if old.count() else None
        panel.get_by_test_id("replay-button").click()
        result = panel.get_by_test_id("replay-result")
        expect(result).to_be_visible()
        if previous is not None:
            expect(result.get_by_test_id("replay-link")).not_to_have_text(previous)
        return result, len(stub.requests) - before

    # Defaults: an unchanged replay answers everything from the seeded caches, 0 requests.
    result, sent = replay()
    assert sent == 0
    expect(result).to_have_attribute("data-mode", "recorded-calls")
    expect(result.get_by_test_id("replay-cache")).to_have_text("3 hits, 0 misses")
    expect(result.get_by_test_id("replay-tokens")).to_have_attribute("data-tokens", "0")
    expect(result.get_by_test_id("replay-compare")).to_contain_text("3 equal, 0 changed")
    shot(page, "18-trace-replay")

    # Cached LLM answers off: both model calls are sent again and spend tokens.
    result, sent = replay(cached_llm=False)
    assert sent == 2
    expect(result.get_by_test_id("replay-cache")).to_have_text("1 hit, 2 misses (2 bypass)")
    expect(result.get_by_test_id("replay-tokens")).not_to_have_attribute("data-tokens", "0")
    expect(result.get_by_test_id("replay-switches-used")).to_contain_text(
        "off: use cached LLM answers"
    )

    # Cached tool results off: the tool, whose code is not here, cannot run again.
    result, sent = replay(cached_tools=False)
    assert sent == 0
    failed = result.locator('[data-testid="replay-step"][data-outcome="failed"]')
    expect(failed).to_have_count(1)
    expect(failed).to_contain_text("lookup")
    expect(result.get_by_test_id("replay-failed-steps")).to_contain_text("cannot run again")

    # Stop at the first divergence: a changed question changes step 1, and the replay ends there.
    result, sent = replay("input.question=Why is it grey?", stop_at_divergence=True)
    assert sent == 1
    expect(result).to_have_attribute("data-stopped", "true")
    expect(result.get_by_test_id("replay-stopped")).to_contain_text(
        "step 'ChatCompletion' (#1) changed its output"
    )
    expect(result.get_by_test_id("replay-steps")).to_have_text("1 of 3 recorded")
    shot(page, "19-trace-replay-stopped")

    # The same change without the stop replays all three steps (step 1 now from the cache).
    result, sent = replay("input.question=Why is it grey?")
    assert sent == 1
    expect(result).to_have_attribute("data-stopped", "false")
    expect(result.get_by_test_id("replay-stopped")).to_have_count(0)
    expect(result.get_by_test_id("replay-steps")).to_have_text("3 of 3 recorded")
    expect(result.get_by_test_id("replay-compare")).to_contain_text(
        "first divergence at step 1 ChatCompletion"
    )

    # A bad change is one clear error, and nothing is replayed.
    panel.get_by_test_id("replay-change").fill("input.nope=1")
    panel.get_by_test_id("replay-button").click()
    expect(panel.get_by_test_id("replay-error")).to_contain_text("no field 'nope'")
    expect(panel.get_by_test_id("replay-result")).to_have_count(0)

    # The replay opens as a trace that says what it replayed and with which switches.
    replays = api_get(url, "/api/traces", kind="trace")["traces"]
    assert sum(t["parent_trace_id"] == tid for t in replays) == 5
    newest = next(t for t in replays if t["parent_trace_id"] == tid)
    page.goto(f"{url}/#/traces/{newest['trace_id']}")
    expect(page.get_by_test_id("trace-view")).to_contain_text(
        "cached LLM answers on, cached tool results on, stop at the first divergence off"
    )
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]
