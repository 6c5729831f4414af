"""Cross-site request refusal in a real browser (Debian's headless Chromium via Playwright).

The API server runs token-less on 127.0.0.1 (as ``rewind serve`` does by default). A page of the
server's own origin — what the browser UI does — starts a replay with ``fetch``; a page on another
origin (another host, or another port of the same host) tries the same with a no-CORS ``fetch``
and a plain HTML form, which need no CORS permission to be sent. The browser's own Origin,
Referer and Sec-Fetch-Site headers decide: the first is accepted, the others are refused with 403
and start nothing. Needs no built UI (the server's fallback page is a page of its origin); the
``browser`` fixture is in ``conftest.py``.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewind.api import create_app
from rewind.api.pipelines import PipelineEntry
from rewind.cli.serve import LOOPBACK_NAMES
from rewind.store import open_store
from tests import pipelines
from tests.live_server import LiveServer
from tests.model_stub import SHUTDOWN_POLL_S

TIMEOUT_MS = 60_000  # a loaded CI machine is slow; this bounds a hang, it measures nothing

FETCH = """async (path) => {
  const r = await fetch(path, {
    method: "POST", headers: {"Content-Type": "application/json"}, body: "{}"
  });
  return [r.status, await r.json()];
}"""
NO_CORS_FETCH = """async (url) => {
  await fetch(url, {method: "POST", mode: "no-cors"});
  return true;
}"""
FORM_POST = """(url) => {
  const frame = document.createElement("iframe");
  frame.name = "sink";
  document.body.appendChild(frame);
  const form = document.createElement("form");
  form.method = "post";
  form.action = url;
  form.target = "sink";
  document.body.appendChild(form);
  form.submit();
}"""


class _Page(http.server.BaseHTTPRequestHandler):
    """Any GET: an empty HTML page (the other site's page)."""

    def do_GET(self) -> None:
        body = b"<!doctype html><title>elsewhere</title><body></body>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def other_site() -> Iterator[int]:
    """A plain web server on another 127.0.0.1 port; its port."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S})
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    thread.join()
    httpd.server_close()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveServer]:
    store = open_store(tmp_path / "store")
    registry = {"tiny": PipelineEntry.of(pipelines.pipeline, {"x": 15})}
    app = create_app(store, chat_client=None, pipelines=registry, allowed_hosts=LOOPBACK_NAMES)
    with LiveServer(app) as server:
        yield server
    store.close()


def test_the_servers_own_page_may_start_a_replay(browser: Any, live: LiveServer) -> None:
    parent = live.record("tiny")["run_id"]
    page = browser.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{live.url}/")
    status, body = page.evaluate(FETCH, f"/api/runs/{parent}/replay")
    assert status == 202, body
    assert live.wait_finished(body["run_id"])["status"] == "completed"
    page.close()


@pytest.mark.parametrize("other_host", ["localhost", "127.0.0.1"])  # cross-site, same-site
def test_another_sites_page_cannot_start_anything(
    browser: Any, live: LiveServer, other_site: int, other_host: str
) -> None:
    parent = live.record("tiny")["run_id"]
    before = live.runs()
    page = browser.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"http://{other_host}:{other_site}/")
    replay = f"{live.url}/api/runs/{parent}/replay"

    def is_replay(r: Any) -> bool:
        return bool(r.url == replay)

    with page.expect_response(is_replay) as fetched:
        page.evaluate(NO_CORS_FETCH, replay)
    assert fetched.value.status == 403
    with page.expect_response(is_replay) as posted:
        page.evaluate(FORM_POST, replay)
    assert posted.value.status == 403
    assert live.runs() == before
    page.close()
