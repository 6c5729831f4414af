"""The UI and API attacked with hostile recorded values (issue 14, as a new user and an
attacker): a bidi override or a zero-width space in a recorded value is shown as a visible
escape and cannot reorder the text after it; an output override of another JSON type than the
recorded field is refused before a run is created, in the API and in the node editor.

Debian's headless Chromium driven by Playwright against the real app under uvicorn on loopback,
over a real SQLite store; the ``branching`` pipeline of ``tests/pipelines.py`` (long node names,
two branches, a join and a loop back). Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import playwright.sync_api as playwright_api
import pytest

from rewind.api import create_app
from rewind.api.pipelines import PipelineEntry
from rewind.store import open_store
from tests import pipelines, test_ui_runs
from tests.test_ui import STATIC_INDEX, ThreadServer, screenshot
from tests.test_ui_debugger import BIG, prose
from tests.test_ui_runs import wait_run

expect = playwright_api.expect
page = test_ui_runs.page  # the fixture: a 1500x1000 page that records dialogs and page errors
RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: reverses the text after it until the paragraph ends
ZWSP = "\u200b"  # ZERO WIDTH SPACE
STATIONS = ["<img src=x onerror=alert(1)>", f"{RLO}evil{ZWSP}", "<script>alert(2)</script>"]
DECIDE = pipelines.DECIDE_GROUPING


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not STATIC_INDEX.exists():
        pytest.fail("the UI is not built: cd web && npm ci && npm run build (make does it)")
    store = open_store(tmp_path_factory.mktemp("ui-attack-store"))
    registry = {
        "branching": PipelineEntry.of(pipelines.branching, {"stations": STATIONS}),
        "prose": PipelineEntry.of(prose, {"topic": "rain"}),
    }
    app = create_app(store, chat_client=None, pipelines=registry)
    with ThreadServer(app) as srv:
        run = wait_run(
            srv.url, _post(srv.url, "/api/runs", {"pipeline": "branching"}).json()["run_id"]
        )
        assert run["status"] == "completed", run
        accepted = _post(srv.url, "/api/runs", {"pipeline": "prose"}).json()
        big = wait_run(srv.url, accepted["run_id"])
        assert big["status"] == "completed", big
        yield {"url": srv.url, "run_id": run["run_id"], "big_run_id": big["run_id"]}
    store.close()


def _post(url: str, path: str, body: Any) -> httpx.Response:
    return httpx.post(url + path, json=body, trust_env=False, timeout=30)


def _run_count(url: str) -> int:
    return len(httpx.get(f"{url}/api/runs", trust_env=False).json()["runs"])


def shot(page: Any, name: str) -> None:
    screenshot(page, f"ui-attack-{name}", full_page=True)


def test_a_bidi_override_in_a_recorded_value_is_shown_as_an_escape(
    server: dict[str, Any], page: Any
) -> None:
    url, rid = server["url"], server["run_id"]
    page.goto(f"{url}/#/runs/{rid}?tab=graph&node=1")
    editor = page.get_by_test_id("node-editor")
    expect(editor).to_contain_text("current:")
    output = page.get_by_test_id("node-output")
    expect(output).to_contain_text("evil")
    shot(page, "01-bidi-escaped")
    for where in (editor, output):
        text = where.inner_text()
        assert RLO not in text and ZWSP not in text, text[:400]
        assert "\\u202eevil\\u200b" in text, text[:400]
    # the markup in the same values stays text
    expect(output).to_contain_text("<script>alert(2)</script>")
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_an_output_override_of_another_type_is_refused_before_a_run(
    server: dict[str, Any],
) -> None:
    url, rid = server["url"], server["run_id"]
    before = _run_count(url)
    bad = {"kind": "output", "node": DECIDE, "field": "grouping", "value": {"a": 1}}
    r = _post(url, f"/api/runs/{rid}/fork", {"at": 2, "override": bad})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["error"] == "InvalidOverride"
    assert body["field"] == "override.value"
    assert "recorded as a string" in body["message"] and "pass a string" in body["hint"]
    assert _run_count(url) == before
    good = {**bad, "value": "month"}
    assert _post(url, f"/api/runs/{rid}/fork", {"at": 2, "override": good}).status_code == 202
    null = {**bad, "value": None}  # null fits any recorded type
    assert _post(url, f"/api/runs/{rid}/fork", {"at": 2, "override": null}).status_code == 202


def test_the_node_editor_refuses_an_output_of_another_type(
    server: dict[str, Any], page: Any
) -> None:
    url, rid = server["url"], server["run_id"]
    before = _run_count(url)
    page.goto(f"{url}/#/runs/{rid}?tab=graph&node=2")
    editor = page.get_by_test_id("node-editor")
    expect(editor).to_contain_text("output field")
    editor.get_by_test_id("editor-value").fill('{"a": 1}')
    editor.get_by_test_id("fork-button").click()
    expect(editor.get_by_test_id("editor-error")).to_contain_text("recorded as a string")
    shot(page, "02-output-type-refused")
    assert _run_count(url) == before
    expect(page.get_by_test_id("run-view")).to_have_attribute("data-run-id", rid)
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_a_big_integer_output_is_edited_and_forked_exactly(
    server: dict[str, Any], page: Any
) -> None:
    """An integer beyond 2^53 (a float64 would print 18446744073709552000) is prefilled, sent
    and shown with every digit: a fork of another field must not round it silently."""
    url, rid = server["url"], server["big_run_id"]
    recorded = BIG + len("steady")
    page.goto(f"{url}/#/runs/{rid}?tab=graph&node=1")
    editor = page.get_by_test_id("node-editor")
    editor.get_by_role("button", name="replace output").click()
    editor.get_by_test_id("editor-name").select_option("big")
    value = editor.get_by_test_id("editor-value")
    expect(value).to_have_value(str(recorded))
    expect(page.get_by_test_id("node-info")).to_contain_text(str(recorded))
    wanted = BIG + 7
    value.fill(str(wanted))
    editor.get_by_test_id("fork-button").click()
    expect(page.get_by_test_id("run-view")).not_to_have_attribute("data-run-id", rid)
    fork_id = page.get_by_test_id("run-view").get_attribute("data-run-id")
    fork = wait_run(url, fork_id)
    assert fork["status"] == "completed", fork
    assert fork["override"]["value"] == wanted  # exact: Python reads the JSON integer as is
    expect(page.get_by_test_id("run-view")).to_contain_text(f"= {wanted}")
    shot(page, "03-big-integer-fork")
    assert page.dialogs == [] and page.errors == []  # type: ignore[attr-defined]


def test_a_rejected_token_is_told_from_a_missing_one(tmp_path: Any, page: Any) -> None:
    """The 401 says whether a token was sent and refused or none was sent; Settings shows it."""
    store = open_store(tmp_path / "store")
    with ThreadServer(create_app(store, chat_client=None, token="right")) as srv:
        none = httpx.get(f"{srv.url}/api/runs", trust_env=False)
        wrong = httpx.get(
            f"{srv.url}/api/runs", headers={"Authorization": "Bearer wrong"}, trust_env=False
        )
        assert none.status_code == wrong.status_code == 401
        assert none.json()["message"] == "this server needs a bearer token"
        assert "was not accepted" in wrong.json()["message"], wrong.text
        page.goto(f"{srv.url}/#token=wrong")
        page.goto(f"{srv.url}/#/settings")
        expect(page.get_by_text("was not accepted")).to_be_visible()
        shot(page, "04-token-rejected")
        # the right token typed into the same tab (a hash change, no reload by the user) is used
        with page.expect_event("load"):  # the app keeps the token and reloads the page
            page.evaluate("window.location.hash = '#token=right'")
        assert page.evaluate("sessionStorage.getItem('rewind-token')") == "right"
        page.goto(f"{srv.url}/#/settings")
        expect(page.get_by_test_id("effective-config")).to_be_visible()
        expect(page.get_by_text("was not accepted")).to_have_count(0)
    store.close()
