"""Long lists in the UI are virtual (issue 14, point 9): only a window of rows is in the DOM.

120 real recorded runs in a real SQLite store, served by the real app under uvicorn on loopback
and opened in Debian's headless Chromium (Playwright for Python): the runs list draws a window
of them, scrolling the sidebar reaches the oldest; a run's nodes list (the executions table of a
looping run) and a long imported trace's spans do the same. Calls and diff changes are covered
in tests/test_ui_debugger.py.
Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from typing import Any

import playwright.sync_api as playwright_api
import pytest

from rewind.api import create_app
from rewind.api.pipelines import PipelineEntry
from rewind.engine.plan import OutputOverride
from rewind.replay import Rewind
from rewind.store import open_store
from rewind.tracing.otel import import_otlp
from tests import pipelines as test_pipelines
from tests import test_ui_debugger
from tests.test_ui import ThreadServer, _trace_with_a_tool_call, screenshot
from tests.test_ui_debugger import _check_prerequisites
from tests.test_ui_graph import _assert_drawn_apart, _node_boxes

expect = playwright_api.expect
page = test_ui_debugger.page  # the fixture: a 1500×1000 page collecting dialogs and errors
RUNS = 120
LAPS = 150
TOOL_SPANS = 150


def _long_trace() -> dict[str, Any]:
    """OpenInference's real export of a chain (tests/data/otel, with one tool span) plus
    TOOL_SPANS more GenAI ``execute_tool`` spans under its root, one after the other."""
    doc = _trace_with_a_tool_call()
    by_name = {
        span["name"]: (scope["spans"], span)
        for resource in doc["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    }
    spans, tool = by_name["execute_tool lookup"]
    start = int(tool["endTimeUnixNano"])
    for i in range(TOOL_SPANS):
        span = copy.deepcopy(tool)
        span["spanId"] = base64.b64encode((0xE0 << 56 | i).to_bytes(8, "big")).decode()
        span["name"] = f"execute_tool lookup_{i}"
        for a in span["attributes"]:
            if a["key"] == "gen_ai.tool.name":
                a["value"] = {"stringValue": f"lookup_{i}"}
        span["startTimeUnixNano"] = str(start + 1_000 * (2 * i + 1))
        span["endTimeUnixNano"] = str(start + 1_000 * (2 * i + 2))
        spans.append(span)
    return doc


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A store with RUNS recorded runs of the tiny pipeline (newest last), a run whose node
    loops LAPS times and a fork of it, and an imported OpenTelemetry trace with TOOL_SPANS more
    spans."""
    _check_prerequisites()
    store = open_store(tmp_path_factory.mktemp("ui-lists"))
    rw = Rewind(store)
    ids: list[str] = []
    for x in range(RUNS):
        run = rw.record(test_pipelines.pipeline, {"x": x})
        assert run.status == "completed", run.error
        ids.append(run.run_id)
    looping = rw.record(test_pipelines.laps, {"lap": 0, "laps": LAPS})
    assert looping.status == "completed", looping.error
    # a fork whose first lap writes 10: every later node differs, ten laps fewer
    shorter = rw.fork(looping.run_id, at=1, override=OutputOverride("lap", "lap", 10))
    assert shorter.status == "completed", shorter.error
    imported = import_otlp(store, [_long_trace()])
    assert imported.errors == [] and len(imported.imported) == 1
    app = create_app(store, pipelines={"tiny": PipelineEntry.of(test_pipelines.pipeline, {"x": 1})})
    with ThreadServer(app) as srv:
        yield {
            "url": srv.url,
            "runs": ids,
            "laps": looping.run_id,
            "shorter": shorter.run_id,
            "trace": imported.imported[0],
        }
    store.close()


def _scroll_until(page: Any, box: str, row: str, text: str = "") -> None:
    """Scroll the element matching CSS ``box`` to its end until a row matching CSS ``row``
    (with ``text`` in it) is drawn — a virtual list draws its rows as they scroll in."""
    page.wait_for_function(
        "([box, row, text]) => { const e = document.querySelector(box);"
        " e.scrollTop = e.scrollHeight;"
        " return [...e.querySelectorAll(row)].some(r => r.textContent.includes(text)); }",
        arg=[box, row, text],
    )


def test_runs_list_draws_a_window_and_scrolls_to_the_oldest(
    server: dict[str, Any], page: Any
) -> None:
    url, ids = server["url"], server["runs"]
    page.goto(f"{url}/#/")
    listing = page.get_by_test_id("runs-list")
    tree = listing.get_by_test_id("runs-tree")
    # and the looping run (its fork nests under it) and the imported trace
    expect(tree).to_have_attribute("data-count", str(RUNS + 2))
    items = tree.locator("[data-testid^=run-item-]")
    expect(listing.get_by_test_id(f"run-item-{ids[-1]}")).to_be_visible()  # newest first
    drawn = items.count()
    assert 5 <= drawn < RUNS // 2, drawn
    expect(listing.get_by_test_id(f"run-item-{ids[0]}")).to_have_count(0)
    _scroll_until(page, "aside", f"[data-testid=run-item-{ids[0]}]")
    oldest = listing.get_by_test_id(f"run-item-{ids[0]}")
    expect(oldest).to_be_in_viewport()
    assert items.count() < RUNS // 2, items.count()
    expect(listing.get_by_test_id(f"run-item-{ids[-1]}")).to_have_count(0)  # scrolled away
    screenshot(page.get_by_role("complementary"), "ui-lists-1-runs")
    oldest.click()
    expect(page.get_by_test_id("run-view")).to_have_attribute("data-run-id", ids[0])
    assert page.dialogs == [] and page.errors == []


def test_a_looping_runs_executions_draw_a_window(server: dict[str, Any], page: Any) -> None:
    url, run_id = server["url"], server["laps"]
    page.goto(f"{url}/#/runs/{run_id}?tab=graph")
    table = page.get_by_test_id("executions-scroll")
    expect(table).to_have_attribute("data-count", str(LAPS + 1))
    rows = table.locator("[data-testid^=execution-]")
    expect(page.get_by_test_id("execution-1")).to_be_visible()
    assert 5 <= rows.count() < 60, rows.count()
    last = LAPS + 1
    _scroll_until(page, "[data-testid=executions-scroll]", f"[data-testid=execution-{last}]")
    expect(page.get_by_test_id(f"execution-{last}")).to_be_in_viewport()
    expect(page.get_by_test_id("execution-1")).to_have_count(0)
    assert rows.count() < 60, rows.count()
    # The graph's looping node: one box, its count, and a short list of its executions.
    node = page.get_by_test_id("graph-node-lap")
    expect(page.get_by_test_id("graph-count-lap")).to_have_text(f"×{LAPS}")
    chips = page.get_by_test_id("graph-execs-lap").inner_text().split()
    assert chips == ["#1", "#2", "…", f"#{LAPS - 2}", f"#{LAPS - 1}", f"#{LAPS}"], chips
    assert f"executed {LAPS} times" in (node.get_attribute("title") or "")
    expect(page.get_by_test_id("graph-edge-label-lap-lap")).to_contain_text(f"×{LAPS - 1}")
    boxes = _node_boxes(page, ["lap", "finish_laps"])
    label = page.get_by_test_id("graph-edge-label-lap-lap").bounding_box()
    _assert_drawn_apart(boxes, {"lap-lap": label})  # the self-loop's label is off the node
    # Choosing a node scrolls its row into view.
    page.get_by_test_id("graph-execs-lap").get_by_text("#1", exact=True).click()
    expect(page.get_by_test_id("execution-1")).to_be_in_viewport()
    screenshot(page, "ui-lists-2-executions")
    assert page.dialogs == [] and page.errors == []


def test_a_long_traces_spans_draw_a_window(server: dict[str, Any], page: Any) -> None:
    url, trace_id = server["url"], server["trace"]
    page.goto(f"{url}/#/traces/{trace_id}")
    table = page.get_by_test_id("trace-steps-scroll")
    count = int(table.get_attribute("data-count") or 0)
    assert count >= TOOL_SPANS, count
    rows = table.get_by_test_id("trace-step")
    expect(rows.first).to_be_visible()
    assert 5 <= rows.count() < 60, rows.count()
    last = f"lookup_{TOOL_SPANS - 1}"
    _scroll_until(page, "[data-testid=trace-steps-scroll]", "[data-testid=trace-step]", last)
    step = rows.filter(has_text=last)
    expect(step).to_be_in_viewport()
    assert rows.count() < 60, rows.count()
    step.click()  # a step opens in place, inside the virtual table
    detail = table.locator("td[colspan='8']").filter(has_text="input")
    expect(detail).to_have_count(1)
    detail.scroll_into_view_if_needed()  # below the last row, inside the scroll box
    expect(detail).to_be_in_viewport()
    screenshot(page, "ui-lists-3-trace-spans")
    assert page.dialogs == [] and page.errors == []


def test_a_long_diff_draws_a_window_of_node_rows(server: dict[str, Any], page: Any) -> None:
    url, fork = server["url"], server["shorter"]
    page.goto(f"{url}/#/runs/{fork}?tab=diff")
    table = page.get_by_test_id("diff-rows")
    expect(table).to_have_attribute("data-count", str(LAPS + 1))
    expect(table.get_by_test_id("diff-row-1")).to_have_attribute("data-open", "yes")
    rows = table.locator("[data-testid^=diff-row-]")
    assert 5 <= rows.count() < 60, rows.count()
    last = LAPS + 1
    _scroll_until(page, "[data-testid=diff-rows]", f"[data-testid=diff-row-{last}]")
    expect(table.get_by_test_id(f"diff-row-{last}")).to_contain_text("finish_laps")
    expect(table.get_by_test_id("diff-row-1")).to_have_count(0)
    assert rows.count() < 60, rows.count()
    # A row opened, scrolled away and back keeps its state.
    row = table.get_by_test_id(f"diff-row-{last - 1}")
    row.click()
    expect(row).to_have_attribute("data-open", "yes")
    table.evaluate("e => { e.scrollTop = 0; }")
    expect(table.get_by_test_id("diff-row-1")).to_have_attribute("data-open", "yes")
    expect(table.get_by_test_id(f"diff-row-{last - 1}")).to_have_count(0)
    table.evaluate("e => { e.scrollTop = e.scrollHeight; }")
    expect(table.get_by_test_id(f"diff-row-{last - 1}")).to_have_attribute("data-open", "yes")
    screenshot(page, "ui-lists-4-diff-rows")
    assert page.dialogs == [] and page.errors == []
