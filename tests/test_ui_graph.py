"""The run graph on real graphs (issue 14, point 2): React Flow draws, ELK lays out.

A pipeline with two branches, a join, a loop back and long node names (``tests.pipelines:
branching``) is recorded, then opened in Debian's headless Chromium (Playwright for Python)
against the real app under uvicorn on loopback, over a real SQLite store. Bounding boxes prove
that no two node boxes overlap, no edge label sits on a node, each name fits its box and is
there in full on hover; zoom, pan and fit-to-view work; repeated executions carry a count. The
same holds for one of Apache Burr's published examples (the multi-modal chatbot, vendored in
``tests/apps/``), run against a loopback model server. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import playwright.sync_api as playwright_api
import pytest

from rewind.api import create_app
from rewind.api.pipelines import PipelineEntry
from rewind.replay import Rewind
from rewind.store import open_store
from tests import pipelines as test_pipelines
from tests import test_ui_debugger
from tests.apps import multi_modal_chatbot
from tests.model_stub import ModelStub
from tests.test_ui import TIMEOUT_MS, ThreadServer, screenshot
from tests.test_ui_debugger import _check_prerequisites, _page

expect = playwright_api.expect
page = test_ui_debugger.page  # the fixture: a 1500×1000 page collecting dialogs and errors
LONG_NAMES = [
    test_pipelines.LOAD_RECORDS,
    test_pipelines.DECIDE_GROUPING,
    test_pipelines.BY_SEASON,
    test_pipelines.BY_MONTH,
    test_pipelines.MERGE_DRAFT,
    test_pipelines.REVIEW_STYLE,
]
CHATBOT_NODES = [
    "prompt",
    "check_openai_key",
    "check_safety",
    "decide_mode",
    "generate_image",
    "generate_code",
    "answer_question",
    "prompt_for_more",
    "response",
]


def _mode_reply(question: str, n: int) -> str:
    # the chatbot first asks the model for a mode, then for the answer
    return "answer_question" if "single word representing the mode" in question else f"#{n}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A run of the branching pipeline and one of Burr's multi-modal chatbot example."""
    _check_prerequisites()
    folder = tmp_path_factory.mktemp("ui-graph")
    store = open_store(folder / "store")
    rw = Rewind(store)
    branching = rw.record(test_pipelines.branching, {"stations": ["north", "south", "east"]})
    assert branching.status == "completed", branching.error
    with ModelStub(reply=_mode_reply) as stub, pytest.MonkeyPatch.context() as env:
        env.setenv("OPENAI_BASE_URL", stub.base_url)
        env.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
        env.setenv("HOME", str(folder / "home"))  # the app's tracker writes ~/.burr
        app = multi_modal_chatbot.application(storage_dir=str(folder / "burr"))
        chatbot = rw.record(app, inputs={"prompt": "Who was Burr?"}, halt_after=["response"])
    assert chatbot.status == "completed", chatbot.error
    api = create_app(
        store,
        pipelines={"branching": PipelineEntry.of(test_pipelines.branching, {"stations": ["a"]})},
    )
    with ThreadServer(api) as srv:
        yield {"url": srv.url, "branching": branching.run_id, "chatbot": chatbot.run_id}
    store.close()


Box = dict[str, float]


def _overlap(a: Box, b: Box, slack: float = 0.5) -> bool:
    """True when the boxes share more than a hair (``slack`` px) in both directions."""
    dx = min(a["x"] + a["width"], b["x"] + b["width"]) - max(a["x"], b["x"])
    dy = min(a["y"] + a["height"], b["y"] + b["height"]) - max(a["y"], b["y"])
    return dx > slack and dy > slack


def _inside(inner: Box, outer: Box, slack: float = 1.0) -> bool:
    return (
        inner["x"] >= outer["x"] - slack
        and inner["y"] >= outer["y"] - slack
        and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + slack
        and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + slack
    )


def _open_graph(page: Any, url: str, run_id: str) -> Any:
    page.goto(f"{url}/#/runs/{run_id}?tab=graph")
    graph = page.get_by_test_id("graph")
    expect(graph).to_have_attribute("data-layout", "done", timeout=TIMEOUT_MS)
    return graph


def _node_boxes(page: Any, names: list[str]) -> dict[str, Box]:
    boxes = {}
    for name in names:
        box = page.get_by_test_id(f"graph-node-{name}").bounding_box()
        assert box is not None, name
        boxes[name] = box
    return boxes


def _label_boxes(page: Any) -> dict[str, Box]:
    labels = page.locator("[data-testid^=graph-edge-label-]")
    return {
        labels.nth(i).get_attribute("data-testid"): labels.nth(i).bounding_box()
        for i in range(labels.count())
    }


def _assert_drawn_apart(nodes: dict[str, Box], labels: dict[str, Box]) -> None:
    for (a, box_a), (b, box_b) in itertools.combinations(nodes.items(), 2):
        assert not _overlap(box_a, box_b), f"nodes {a} and {b} overlap: {box_a} {box_b}"
    for label, lbox in labels.items():
        for name, nbox in nodes.items():
            assert not _overlap(lbox, nbox), f"{label} is drawn over node {name}"
    for (a, box_a), (b, box_b) in itertools.combinations(labels.items(), 2):
        assert not _overlap(box_a, box_b), f"labels {a} and {b} overlap"


SCALE_JS = (
    "(() => { const m = /scale\\(([\\d.]+)\\)/.exec("
    "document.querySelector('.react-flow__viewport').style.transform); return m ? +m[1] : 0; })()"
)


def _scale(page: Any) -> float:
    transform = page.locator(".react-flow__viewport").evaluate("e => e.style.transform")
    match = re.search(r"scale\(([\d.]+)\)", transform)
    assert match, transform
    return float(match.group(1))


def _translate(page: Any) -> tuple[float, float]:
    transform = page.locator(".react-flow__viewport").evaluate("e => e.style.transform")
    match = re.search(r"translate\(([-\d.]+)px, ([-\d.]+)px\)", transform)
    assert match, transform
    return float(match.group(1)), float(match.group(2))


def test_branches_join_loop_and_long_names_draw_apart(server: dict[str, Any], page: Any) -> None:
    url, run_id = server["url"], server["branching"]
    graph = _open_graph(page, url, run_id)
    screenshot(graph, "ui-graph-1-branches-join-loop")
    names = [*LONG_NAMES, test_pipelines.PUBLISH_REPORT]
    nodes = _node_boxes(page, names)
    labels = _label_boxes(page)
    # the two branch conditions and the loop back are labelled
    assert set(labels) >= {
        f"graph-edge-label-{test_pipelines.DECIDE_GROUPING}-{test_pipelines.BY_SEASON}",
        f"graph-edge-label-{test_pipelines.REVIEW_STYLE}-{test_pipelines.DECIDE_GROUPING}",
    }, labels
    _assert_drawn_apart(nodes, labels)
    frame = page.get_by_test_id("graph-canvas").bounding_box()
    for name, box in nodes.items():
        assert _inside(box, frame), f"{name} is outside the fitted view"

    # Each name fits its box (wrapped, not spilling) and is there in full on hover.
    for name in names:
        node = page.get_by_test_id(f"graph-node-{name}")
        assert name in (node.get_attribute("title") or "")
        assert name in (node.get_attribute("aria-label") or "")
        heading = node.get_by_test_id("graph-name")
        assert heading.inner_text().replace("\n", "").endswith(name)
        assert heading.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), name
        assert _inside(heading.bounding_box(), nodes[name]), name
    # The sub-label is whole (not cut at 34 characters).
    executions = {
        e["number"]: e
        for e in page.request.get(f"{url}/api/runs/{run_id}/graph").json()["executions"]
    }
    last = executions[10]
    sub = page.get_by_test_id("graph-node-publish").get_by_test_id("graph-sub").inner_text()
    assert sub.startswith(f"{last['cache_outcome']}:") and sub.endswith(" ms"), sub

    # The loop: its back edge is marked and labelled, and the nodes it re-ran carry ×2 and the
    # numbers of their executions (clicking one opens it).
    loop_edge = page.get_by_test_id(
        f"graph-edge-{test_pipelines.REVIEW_STYLE}-{test_pipelines.DECIDE_GROUPING}"
    )
    expect(loop_edge).to_have_attribute("data-back", "yes")
    expect(loop_edge).to_have_attribute("data-taken", "1")
    loop_label = f"graph-edge-label-{test_pipelines.REVIEW_STYLE}-{test_pipelines.DECIDE_GROUPING}"
    expect(page.get_by_test_id(loop_label)).to_contain_text("↺ rounds < 2")
    for name, numbers in (
        (test_pipelines.DECIDE_GROUPING, "#2#6"),
        (test_pipelines.MERGE_DRAFT, "#4#8"),
        (test_pipelines.REVIEW_STYLE, "#5#9"),
    ):
        expect(page.get_by_test_id(f"graph-count-{name}")).to_have_text("×2")
        execs = page.get_by_test_id(f"graph-execs-{name}")
        assert execs.inner_text().replace("\n", "").replace(" ", "") == numbers
    for name in (test_pipelines.BY_SEASON, test_pipelines.BY_MONTH):
        expect(page.get_by_test_id(f"graph-count-{name}")).to_have_count(0)
    page.get_by_test_id(f"graph-execs-{test_pipelines.MERGE_DRAFT}").get_by_text("#4").click()
    info = page.get_by_test_id("node-info")
    expect(info).to_contain_text(f"Node 4 · {test_pipelines.MERGE_DRAFT}")

    # Zoom, pan, and fit to view.
    fitted = _scale(page)
    assert 0.05 <= fitted <= 1
    page.get_by_test_id("graph-zoom-in").click()
    page.get_by_test_id("graph-zoom-in").click()
    page.wait_for_function(f"{SCALE_JS} > {fitted * 1.3}")
    before = _translate(page)
    pane = page.locator(".react-flow__pane").bounding_box()
    start = (pane["x"] + 20, pane["y"] + pane["height"] - 20)
    page.mouse.move(*start)
    page.mouse.down()
    page.mouse.move(start[0] + 60, start[1] - 40, steps=6)
    page.mouse.up()
    after = _translate(page)
    moved = (after[0] - before[0], after[1] - before[1])
    assert abs(moved[0] - 60) < 2 and abs(moved[1] + 40) < 2, moved
    zoomed = _node_boxes(page, names)
    assert any(not _inside(box, frame) for box in zoomed.values())  # zoomed in: some off view
    page.get_by_test_id("graph-fit").click()
    page.wait_for_function(f"Math.abs({SCALE_JS} - {fitted}) < 0.01")
    for name, box in _node_boxes(page, names).items():
        assert _inside(box, frame), f"{name} is outside the view after fit"
    assert page.dialogs == [] and page.errors == []


def test_graph_at_390_px(server: dict[str, Any], browser: Any) -> None:
    url, run_id = server["url"], server["branching"]
    page = _page(browser, width=390, height=844)
    try:
        graph = _open_graph(page, url, run_id)
        names = [*LONG_NAMES, test_pipelines.PUBLISH_REPORT]
        nodes = _node_boxes(page, names)
        _assert_drawn_apart(nodes, _label_boxes(page))
        frame = page.get_by_test_id("graph-canvas").bounding_box()
        assert frame["x"] >= 0 and frame["x"] + frame["width"] <= 390
        for name, box in nodes.items():
            assert _inside(box, frame), f"{name} is outside the fitted view at 390 px"
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        screenshot(graph, "ui-graph-2-390px")
        # a node is still chosen by touch/click and from the keyboard
        node = page.get_by_test_id(f"graph-node-{test_pipelines.PUBLISH_REPORT}")
        node.focus()
        page.keyboard.press("Enter")
        expect(page.get_by_test_id("node-editor")).to_contain_text("Fork at node 10")
        assert page.dialogs == [] and page.errors == []
    finally:
        page.context.close()


def test_a_burr_example_graph_draws_apart(server: dict[str, Any], page: Any) -> None:
    """Burr's multi-modal chatbot: a four-way branch, a five-way join into ``response`` and the
    loop from ``response`` back to ``prompt``."""
    url, run_id = server["url"], server["chatbot"]
    graph_json = page.request.get(f"{url}/api/runs/{run_id}/graph").json()
    assert sorted(n["name"] for n in graph_json["nodes"]) == sorted(CHATBOT_NODES)
    graph = _open_graph(page, url, run_id)
    nodes = _node_boxes(page, CHATBOT_NODES)
    labels = _label_boxes(page)
    assert len(labels) >= 6  # when(...) conditions and the loop back
    _assert_drawn_apart(nodes, labels)
    frame = page.get_by_test_id("graph-canvas").bounding_box()
    for name, box in nodes.items():
        assert _inside(box, frame), name
    expect(page.get_by_test_id("graph-edge-response-prompt")).to_have_attribute("data-back", "yes")
    expect(page.get_by_test_id("graph-node-answer_question")).to_have_attribute(
        "data-status", "executed"
    )
    expect(page.get_by_test_id("graph-node-generate_image")).to_have_attribute(
        "data-status", "skipped"
    )
    screenshot(graph, "ui-graph-3-burr-multi-modal-chatbot")
    assert page.dialogs == [] and page.errors == []
