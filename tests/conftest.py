"""Shared fixtures: a Rewind on a temporary store, a fake OpenAI-compatible model, row counters."""

from __future__ import annotations

import compileall
import gc
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from _pytest.nodeid import NodeId
from hypothesis import HealthCheck, settings
from sqlalchemy import text

from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.replay import Rewind
from rewind.store import Store, open_store
from tests import pipelines, schedule
from tests.model_stub import ModelStub
from tests.services import PostgresServer, postgres_server, redis_server, s3_server

__all__ = [
    "postgres_server",
    "redis_server",
    "s3_server",
]  # session fixtures: started only when a test asks

SRC_PACKAGE = Path(__file__).resolve().parent.parent / "src" / "rewind"
TESTS = Path(__file__).resolve().parent

# Every embedded model server the tests start (in this process, in `rewind` subprocesses, in
# workers) generates on one thread. ``make test`` runs two pytest workers on two cores, and the
# files with model tests are handed out first, so two servers often run at once: with two
# threads each, llama.cpp's threads (which spin-wait for each other at every layer of every
# token) took 15-26 s per call of the demo pipeline on the loaded CI machine, with one 4-7 s.
os.environ.setdefault("REWIND_MODEL_THREADS", "1")


FULL_GC_EVERY = 100
"""Generation-1 collections between two full ones (CPython's default: 10). A pytest worker's
heap holds ~0.4-0.7 M objects, and a full pass over them took 0.3-0.6 s of CPU, 18-21 times
in test_api.py's 105 in-process tests: with the default, the garbage collector was 25-30 % of
that file's CPU. Less often, with the frozen collection-time objects (pytest_collection_finish),
it was 1.9 s of 18.6 s CPU instead of 7.9 s of 29.5 s (A/B, 2 runs each). The cost: up to a
few hundred MB of cyclic garbage waits longer for its pass. Set here, before collection."""
_young, _middle, _ = gc.get_threshold()
gc.set_threshold(_young, _middle, FULL_GC_EVERY)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile this checkout's sources to ``__pycache__`` once per session.

    Tests run ``rewind`` in subprocesses (``tests/cli_process.py``); with
    ``PYTHONDONTWRITEBYTECODE=1`` in the environment none of them writes bytecode, so each one
    compiled every module it imports from source again (``rewind --help``: 1.07 s without, 0.46 s
    with cached bytecode, measured on the 2-core CI machine). Bytecode is only *read* from
    ``__pycache__`` when its recorded source mtime and size still match, so a stale file is
    never used; ``py_compile`` writes each one atomically, so parallel sessions are safe.
    Ignored by git (``__pycache__/`` in .gitignore). Under pytest-xdist (``make test`` runs
    ``-n 3``) only the controller compiles: it runs before the workers start.
    """
    if hasattr(session.config, "workerinput"):
        return
    compileall.compile_dir(SRC_PACKAGE, quiet=1, workers=1)
    # The helper modules subprocesses import (``--pipeline tests.pipelines:...``, tests/apps).
    compileall.compile_dir(TESTS, quiet=1, workers=1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, hand out the longest files first.

    ``make test`` runs ``-n 3 --dist loadfile --no-loadscope-reorder``: each worker takes the
    next whole file as it becomes free, in collection order. Collected in name order, a long
    file (the embedded model, workers, servers: up to minutes each) could still run alone on one
    worker after the other workers have finished everything else. The files are sorted by their
    measured cost (:data:`tests.schedule.FILE_SECONDS`, longest first: the
    longest-processing-time rule), then the other files that hold ``slow`` tests, then the rest
    in collection order. The order within a file is kept; every worker sorts the same collection
    the same way (xdist requires that). A run without xdist keeps the plain collection order.

    Without ``--no-loadscope-reorder``, xdist (3.x) hands out the files with the most tests
    first, which undoes this order: in one run of the whole suite test_queue, test_team_backends
    and test_team_verify were the last files handed out (test_team_verify started 1,390 s into a
    1,538 s run, the other worker ending 25 s before it).
    """
    _give_schemathesis_cases_their_own_ids(items)
    if not hasattr(config, "workerinput"):
        return
    twice = sorted(nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1)
    if twice:
        # xdist hands out tests by id: of several tests with one id only the first would run.
        raise pytest.UsageError(f"test ids that are not unique: {twice[:5]}")
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(
        key=lambda item: (
            -schedule.FILE_SECONDS.get(item.path.name, 0),
            item.path not in slow_files,
        )
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Take every object alive after collection out of the garbage collector's full passes.

    Collection imports the test modules and every library they use (FastAPI, pydantic,
    SQLAlchemy, pandas, Burr, hypothesis...): ~0.2 M long-lived objects that each full
    (generation 2) collection walked again. :func:`gc.freeze` moves them to the permanent
    generation: they are still freed by reference counting, only never scanned for cycles (a
    cycle among them would be kept until the worker exits). See :data:`FULL_GC_EVERY`.
    """
    gc.collect()
    gc.freeze()


def _give_schemathesis_cases_their_own_ids(items: list[pytest.Item]) -> None:
    """Put each schemathesis case's API operation into its test id.

    On pytest 9.2, schemathesis' items are named ``test_x[GET /api/runs]`` but all get the id
    ``file::test_x`` (pytest builds the id from ``originalname`` and a parametrize callspec,
    which schemathesis does not pass). Under xdist, which schedules by id, only the first
    operation of each such test ran; with ``file::test_x[GET /api/runs]`` each one runs (and a
    failure report names its operation).
    """
    for item in items:
        if not isinstance(item, pytest.Function) or not item.name.endswith("]"):
            continue
        if item.nodeid.endswith("]") or item.parent is None:
            continue
        item._id = NodeId.parse(f"{item.parent.nodeid}::{item.name}")


FAKE_MODEL = "fake-model"
FAKE_BASE_URL = "http://fake.test/v1"

CHROMIUM = "/usr/bin/chromium"
"""Debian's ``chromium`` package (no browser is downloaded); Playwright for Python drives it."""
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]

COUNTED_TABLES = (
    "runs",
    "nodes",
    "calls",
    "blobs",
    "burr_state",
    "llm_cache",
    "tool_cache",
    "artifacts",
)


# The machine is shared and CI may be loaded: no per-example deadlines, and no health check that
# fails a property test for being slow to generate examples (it checks nothing about the code).
settings.register_profile(
    "rewind",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.load_profile("rewind")


class FakeModel:
    """A deterministic OpenAI-compatible chat endpoint behind ``httpx.MockTransport``.

    The answer depends only on the request (messages, temperature, max_tokens), so a repeated
    request gets the same bytes. The body carries fields a provider SDK would not expect (an
    unknown top-level object, logprobs) and is deliberately not in canonical key order, so a test
    can tell a byte-identical replay from a re-serialized one.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    @property
    def count(self) -> int:
        return len(self.requests)

    def handler(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        body = json.loads(request.content)
        self.requests.append(body)
        question = body["messages"][-1]["content"]
        temperature = body.get("temperature")
        content = f"answer to {question} at t={temperature}"
        completion_tokens = len(content.split())
        payload = {
            "model": body.get("model"),
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "choices": [
                {
                    "message": {"role": "assistant", "content": content},
                    "index": 0,
                    "finish_reason": "stop",
                    "logprobs": {
                        "content": [{"token": "answer", "logprob": -0.25, "top_logprobs": []}]
                    },
                }
            ],
            "usage": {
                "prompt_tokens": 11,
                "completion_tokens": completion_tokens,
                "total_tokens": 11 + completion_tokens,
            },
            "x_server_extra": {"slot": 3, "timings": {"predicted_ms": 12.5}},
        }
        raw = json.dumps(payload, indent=1).encode()
        return httpx.Response(200, content=raw, headers={"Content-Type": "application/json"})


@pytest.fixture(autouse=True)
def _clear_probes() -> Iterator[None]:
    """Empty the tool-execution logs the test pipelines append to."""
    for log in (pipelines.CALLS, pipelines.TOOL_CALLS, pipelines.RAW_RESPONSES):
        log.clear()
    yield
    for log in (pipelines.CALLS, pipelines.TOOL_CALLS, pipelines.RAW_RESPONSES):
        log.clear()


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    """An OpenAI/Anthropic-compatible model stub of its own on 127.0.0.1 (requests counted)."""
    with ModelStub() as server:
        yield server


@pytest.fixture
def rw(tmp_path: Path) -> Iterator[Rewind]:
    """A Rewind on a fresh store folder, without a model endpoint."""
    rewind = Rewind(tmp_path / "store")
    yield rewind
    rewind.store.close()


@dataclass(frozen=True)
class StoreTarget:
    """Where a conformance test's store lives: a SQLite folder or a fresh PostgreSQL database.

    ``location`` is what :func:`open_store` takes; ``root`` is the folder artifacts go below.
    """

    backend: str
    location: str | Path
    root: Path

    def open(self) -> Store:
        """Open (the first time: create) this target's store."""
        return open_store(self.location, root=self.root)


STORE_BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def new_store_target(
    request: pytest.FixtureRequest, tmp_path: Path, *, migrated: bool = True
) -> StoreTarget:
    """A :class:`StoreTarget` on backend ``request.param``: a SQLite folder not yet made, or a
    PostgreSQL database of its own — holding an empty store at the newest schema revision
    (copied from a template the session migrated once) when ``migrated``, else empty."""
    root = tmp_path / "store"
    if request.param == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        url = server.new_store_database() if migrated else server.new_database()
        return StoreTarget("postgresql", url, root)
    return StoreTarget("sqlite", root, root)


@pytest.fixture(params=STORE_BACKENDS)
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> StoreTarget:
    """Each store conformance test runs once per backend (like LangGraph's checkpoint suites).

    The PostgreSQL database already holds an empty store (tests/test_migrations.py, which is
    about migrating a new database, overrides this fixture with empty ones)."""
    return new_store_target(request, tmp_path)


@pytest.fixture
def rw_any(store_target: StoreTarget) -> Iterator[Rewind]:
    """A Rewind without a model endpoint, on each store backend in turn."""
    rewind = Rewind(store_target.open())
    yield rewind
    rewind.store.close()


@pytest.fixture
def fake_model() -> FakeModel:
    return FakeModel()


@pytest.fixture
def chat_client(fake_model: FakeModel) -> Iterator[ChatClient]:
    client = ChatClient(
        Endpoint(base_url=FAKE_BASE_URL, model=FAKE_MODEL),
        transport=httpx.MockTransport(fake_model.handler),
        retry=RetryPolicy(attempts=1),
    )
    yield client
    client.close()


@pytest.fixture
def rw_llm(tmp_path: Path, chat_client: ChatClient) -> Iterator[Rewind]:
    """A Rewind whose LLM calls go to :class:`FakeModel`."""
    rewind = Rewind(tmp_path / "store", chat_client=chat_client)
    yield rewind
    rewind.store.close()


def row_counts(store: Store) -> dict[str, int]:
    """Row count of every table a fork could write to."""
    with store.read() as conn:
        return {
            t: conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar_one() for t in COUNTED_TABLES
        }


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium for a module's browser tests (fails when Debian's chromium is missing)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (make installs it)")
    import playwright.sync_api as playwright_api

    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


def orphan_run(root: Path, run_id: str) -> None:
    """Leave a run ``running`` in the store at ``root``, owned by a process that has ended."""
    code = (
        "import sys\nfrom rewind.store import open_store\ns = open_store(sys.argv[1])\n"
        "with s.write() as c:\n"
        "    s.create_run(c, run_id=sys.argv[2], pipeline='p', pipeline_ref='')\n"
    )
    subprocess.run([sys.executable, "-c", code, str(root), run_id], check=True)
