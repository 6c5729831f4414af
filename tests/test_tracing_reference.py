"""Cached traces replay their source from memory and are stored by reference.

A ``Tracer(read_cache=True)`` trace finds, at its first cache lookup, the recorded trace that
made that call, links itself to it (``parent``) and reads that trace's cache entries and
results ahead. When it ends, the steps it shares with its source (same hashes, every call a hit
on the source's call) get no rows of their own (``config["reference"]``); only the steps from
the first divergence on are written. Readers (nodes_of, load_trace, diff, show, cost, the API's
node list) resolve the reference and see what a full write would have stored, timing aside.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text
from typer.testing import CliRunner

from rewind.api import create_app
from rewind.calls import chat
from rewind.cli import app as cli_app
from rewind.llm import ChatClient
from rewind.replay import Rewind
from rewind.store import Store, open_store, schema, spans
from rewind.tools import tool
from rewind.tracing import StepType, Tracer, step
from rewind.tracing.store import load_trace
from tests.conftest import FakeModel, StoreTarget

EXECUTED: list[list[int]] = []


@tool("sum_numbers")
def sum_numbers(numbers: list[int]) -> int:
    EXECUTED.append(numbers)
    return sum(numbers)


traced_sum = step("sum_numbers", "tool_call")(sum_numbers)


def agent(steps: int, *, change_at: int | None = None) -> list[Any]:
    """The peerbench workload's shape: an LLM step then a tool step, each prompt depending on
    the previous answer; ``change_at`` changes the prompt of that step."""
    out: list[Any] = []
    reply, total = "start", 0
    for i in range(steps):
        extra = " (changed)" if i == change_at else ""
        messages = [{"role": "user", "content": f"step {i}: {total} {reply}{extra}"}]
        with step("llm", StepType.LLM_CALL, input={"messages": messages}) as s:
            reply = chat(messages, temperature=0).content
            s.set_output(reply)
        total = traced_sum([len(reply), i])
        out.append((reply, total))
    return out


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "store"


@contextmanager
def opened(folder: Path) -> Iterator[Store]:
    st = open_store(folder)
    try:
        yield st
    finally:
        st.close()


def trace_once(
    folder: Path,
    client: ChatClient,
    read_cache: bool,
    steps: int = 6,
    *,
    name: str = "agent",
    **kw: Any,
) -> tuple[str, list[Any]]:
    """One trace named ``name`` through a new Tracer (and Store) as a separate process would
    make it."""
    tracer = Tracer(folder, chat_client=client, read_cache=read_cache, raise_on_write_error=True)
    try:
        with tracer.trace(name) as t:
            out = agent(steps, **kw)
    finally:
        tracer.close()
    assert t.write_error is None
    return t.trace_id, out


def store_bytes(folder: Path) -> int:
    """The database's size in bytes (pages in use times the page size)."""
    with opened(folder) as st, st.read() as conn:
        count = conn.execute(text("PRAGMA page_count")).scalar_one()
        return int(count) * int(conn.execute(text("PRAGMA page_size")).scalar_one())


def own_rows(store: Store, run_id: str) -> dict[str, int]:
    """Rows the run stores itself per table; ``spans``: the span rows its stored rows stand
    for (a root row carries its trace's step spans packed, rewind.store.spans)."""
    out = {}
    with store.read() as conn:
        stored = conn.execute(select(schema.spans).where(schema.spans.c.run_id == run_id)).all()
    out["spans"] = sum(len(spans.expand(dict(r._mapping))) for r in stored)
    for name in ("nodes", "calls", "burr_state"):
        t = getattr(schema, name)
        col = t.c.app_id if name == "burr_state" else t.c.run_id
        with store.read() as conn:
            out[name] = conn.execute(
                select(func.count()).select_from(t).where(col == run_id)
            ).scalar_one()
    return out


def test_unchanged_replay_is_one_run_row_linked_to_its_source(
    folder: Path, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    EXECUTED.clear()
    source, recorded = trace_once(folder, chat_client, read_cache=False, steps=20)
    before, calls, tools = store_bytes(folder), fake_model.count, len(EXECUTED)
    replay, replayed = trace_once(folder, chat_client, read_cache=True, steps=20)
    assert replayed == recorded
    assert fake_model.count == calls and len(EXECUTED) == tools  # all served from the cache

    with opened(folder) as st:
        run = st.get_run(replay)
        assert run.parent_run_id == source  # linked to the trace it replays
        assert run.config["reference"] == {"run": source, "steps": 40, "all": True}
        assert own_rows(st, replay) == {"nodes": 0, "calls": 0, "spans": 1, "burr_state": 0}
        a, b = st.nodes_of(source), st.nodes_of(replay)
        assert len(b) == 40 and all(n.run_id == replay for n in b)
        assert [(n.name, n.input_hash, n.output_hash, n.state_hash) for n in a] == [
            (n.name, n.input_hash, n.output_hash, n.state_hash) for n in b
        ]
        assert {c.outcome for n in b for c in n.calls} == {"hit"}
        assert {n.cache_outcome for n in b} == {"hit"} and run.tokens == 0
        assert [c.key for n in a for c in n.calls] == [c.key for n in b for c in n.calls]
        assert Rewind(st).diff(source, replay).first_divergence is None
        view = load_trace(st, replay)
        assert [s.output for s in view.steps] == [s.output for s in load_trace(st, source).steps]
        assert len({s.span_id for s in view.steps}) == 40

    # A replay of the replay points at the trace that holds the rows, not at the replay; five
    # replays add at most 2 KB each (one run row and its root span; whole pages, so measured
    # over several).
    for _ in range(4):
        again, _ = trace_once(folder, chat_client, read_cache=True, steps=20)
    assert store_bytes(folder) - before <= 5 * 2048
    with opened(folder) as st:
        assert st.get_run(again).parent_run_id == source


def test_a_tool_called_twice_with_the_same_arguments_stays_stored_by_reference(
    folder: Path, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    """A deterministic tool run twice with the same arguments in one recording has one cache
    entry but two recorded times; the replay serves each call as its source recorded it
    (lineage first), so it matches its source and adds no rows."""

    def repeating() -> list[int]:
        return [traced_sum([1, 2]), traced_sum([3, 4]), traced_sum([1, 2])]

    def once(read_cache: bool) -> tuple[str, list[int]]:
        tracer = Tracer(folder, chat_client=chat_client, read_cache=read_cache)
        try:
            with tracer.trace("repeats") as t:
                out = repeating()
        finally:
            tracer.close()
        assert t.write_error is None
        return t.trace_id, out

    EXECUTED.clear()
    source, recorded = once(read_cache=False)
    assert len(EXECUTED) == 3  # recorded live each time: two times for one cache entry
    with opened(folder) as st:
        times = [c.produced_at for n in st.nodes_of(source) for c in n.calls]
    assert times[0] != times[2]
    replay, replayed = once(read_cache=True)
    assert replayed == recorded and len(EXECUTED) == 3
    with opened(folder) as st:
        run = st.get_run(replay)
        assert run.parent_run_id == source
        assert run.config["reference"] == {"run": source, "steps": 3, "all": True}
        assert own_rows(st, replay) == {"nodes": 0, "calls": 0, "spans": 1, "burr_state": 0}
        assert [c.produced_at for n in st.nodes_of(replay) for c in n.calls] == times
        assert {c.outcome for n in st.nodes_of(replay) for c in n.calls} == {"hit"}


def test_a_changed_call_stores_the_replay_fully_from_the_divergence(
    folder: Path, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    source, recorded = trace_once(folder, chat_client, read_cache=False, steps=5)
    calls = fake_model.count
    replay, replayed = trace_once(folder, chat_client, read_cache=True, steps=5, change_at=3)
    assert replayed[:3] == recorded[:3] and replayed[3] != recorded[3]
    assert fake_model.count == calls + 2  # steps 3 and 4 ask the model again
    with opened(folder) as st:
        run = st.get_run(replay)
        assert run.parent_run_id == source
        assert run.config["reference"] == {"run": source, "steps": 6, "all": False}
        rows = own_rows(st, replay)
        assert rows["nodes"] == 4 and rows["calls"] == 4 and rows["spans"] == 5
        b = st.nodes_of(replay)
        assert [n.position for n in b] == list(range(10))
        assert [n.cache_outcome for n in b[:6]] == ["hit"] * 6
        assert b[6].cache_outcome == "miss" and b[6].calls[0].outcome == "miss"
        d = Rewind(st).diff(source, replay)
        assert d.first_divergence is not None and d.first_divergence.index == 6
        assert [n.status for n in d.nodes[:6]] == ["equal"] * 6
        assert d.nodes[6].status == "changed" and d.nodes[6].b is not None
        view = load_trace(st, replay)
        assert view.steps[6].input["messages"][0]["content"].endswith("(changed)")
        assert [s.output for s in view.steps[:6]] == [
            s.output for s in load_trace(st, source).steps[:6]
        ]


def test_readers_work_on_a_replay_stored_by_reference(
    folder: Path, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    source, _ = trace_once(folder, chat_client, read_cache=False, steps=3)
    replay, _ = trace_once(folder, chat_client, read_cache=True, steps=3)
    runner = CliRunner()
    shown = runner.invoke(cli_app, ["--store", str(folder), "show", replay, "--json"])
    assert shown.exit_code == 0, shown.output
    assert "sum_numbers" in shown.output and source in shown.output
    diff = runner.invoke(cli_app, ["--store", str(folder), "diff", source, replay])
    assert diff.exit_code == 0, diff.output
    assert "no divergence: every node output is equal" in diff.output
    with opened(folder) as st, TestClient(create_app(st, chat_client=None)) as client:
        nodes = client.get(f"/api/runs/{replay}/nodes")
        assert nodes.status_code == 200
        listed = nodes.json()["nodes"]
        assert [n["name"] for n in listed] == ["llm", "sum_numbers"] * 3
        cost = client.get(f"/api/runs/{replay}/cost")
        assert cost.status_code == 200, cost.text
        spent = cost.json()
        assert spent["replay"]["tokens"] == 0 < spent["saved"]["tokens"]
        assert spent["saved"]["tokens"] == spent["original"]["tokens"]
        assert [n["status"] for n in spent["nodes"]] == ["hit"] * 6


def test_a_replay_that_shares_nothing_is_written_in_full(
    folder: Path, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    trace_once(folder, chat_client, read_cache=False, steps=3)
    replay, _ = trace_once(folder, chat_client, read_cache=True, steps=3, change_at=0)
    with opened(folder) as st:
        run = st.get_run(replay)
        # The first lookup misses: no recorded trace made that call, nothing to link to.
        assert run.parent_run_id is None and "reference" not in run.config
        assert own_rows(st, replay)["nodes"] == 6


def test_a_replay_is_stored_by_reference_on_each_backend(
    store_target: StoreTarget, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    st = store_target.open()
    try:
        made = []
        for read_cache in (False, True):
            tracer = Tracer(st, chat_client=chat_client, read_cache=read_cache)
            with tracer.trace("agent") as t:
                agent(3)
            assert t.write_error is None
            made.append(t.trace_id)
        source, replay = made
        run = st.get_run(replay)
        assert run.parent_run_id == source and run.config["reference"]["all"] is True
        assert own_rows(st, replay)["nodes"] == 0
        a, b = st.nodes_of(source), st.nodes_of(replay)
        assert [(n.input_hash, n.output_hash, n.state_hash) for n in a] == [
            (n.input_hash, n.output_hash, n.state_hash) for n in b
        ]
        assert Rewind(st).diff(source, replay).first_divergence is None
        # An in-place replay (Tracer.replay) of the source is stored by reference too.
        with Tracer(st, chat_client=chat_client).replay(source) as r:
            agent(3)
        assert st.get_run(r.trace_id).config["reference"]["steps"] == 6
        assert own_rows(st, r.trace_id)["nodes"] == 0
    finally:
        st.close()


def _counted_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The run ids tracer_source reads rows of from now on (kept rows forgotten first)."""
    from rewind.tracing import tracer_source

    reads: list[str] = []
    real = tracer_source.load_rows

    def counting(conn: Any, run_id: str, **kw: Any) -> Any:
        reads.append(run_id)
        return real(conn, run_id, **kw)

    monkeypatch.setattr(tracer_source, "load_rows", counting)
    tracer_source._ROWS.clear()
    return reads


def test_a_source_read_once_is_reused_and_never_outlives_its_run(
    folder: Path, chat_client: ChatClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replays of the same source in one process read its node, call and span rows and its
    results once; a run
    deleted and stored again under the same id is read again (its start time is part of the
    key), so a replay never compares itself with rows that are gone."""
    from rewind.store.retention import delete_run

    reads = _counted_loads(monkeypatch)

    def trace_as(trace_id: str | None, read_cache: bool, steps: int) -> str:
        tracer = Tracer(folder, chat_client=chat_client, read_cache=read_cache)
        try:
            with tracer.trace("agent", trace_id=trace_id) as t:
                agent(steps)
        finally:
            tracer.close()
        assert t.write_error is None
        return t.trace_id

    blob_reads: list[str] = []
    real_blobs = Store.get_blobs

    def counting_blobs(self: Store, digests: Any, conn: Any = None) -> dict[str, bytes]:
        digests = list(digests)
        blob_reads.extend(digests)
        return real_blobs(self, digests, conn)

    monkeypatch.setattr(Store, "get_blobs", counting_blobs)
    source = trace_as("a" * 32, read_cache=False, steps=5)
    first = trace_as(None, read_cache=True, steps=5)
    blob_reads.clear()
    second = trace_as(None, read_cache=True, steps=5)
    assert reads.count(source) == 1  # the second replay used the rows the first one read
    assert blob_reads == []  # and the results it read (kept by hash)
    with opened(folder) as st:
        for run in (second, first, source):
            delete_run(st, run)

    # Same id, fewer steps: rows kept from before would make the replay a partial reference.
    again = trace_as("a" * 32, read_cache=False, steps=3)
    replay = trace_as(None, read_cache=True, steps=3)
    assert reads.count(source) == 2
    with opened(folder) as st:
        run = st.get_run(replay)
        assert run.parent_run_id == again
        assert run.config["reference"] == {"run": again, "steps": 6, "all": True}


def _a_call(st: Store, kind: str) -> tuple[str, str]:
    """``(kind, cache key)`` of a recorded call of that kind."""
    with st.read() as conn:
        found = conn.execute(
            text("SELECT kind, lower(hex(key)) FROM calls WHERE kind = :k LIMIT 1"), {"k": kind}
        ).one()
    return found[0], found[1]


def test_cache_entries_read_ahead_are_read_each_time_and_rebuilt_only_when_changed(
    folder: Path, chat_client: ChatClient
) -> None:
    """The cache entries of a source's calls are read by every cached trace: the entries of a
    trace that read the same rows as the one before are that trace's (one dict, shared), and a
    cache row changed since (a recording replaced the answer) is read as it is now."""
    from rewind.tracing import tracer_source

    trace_once(folder, chat_client, read_cache=False, steps=3)
    with opened(folder) as st:
        kind, key = _a_call(st, "llm")
        first = tracer_source.find_source(st, "agent", kind, key)
        again = tracer_source.find_source(st, "agent", kind, key)
        assert first is not None and again is not None
        assert again.entries is first.entries  # the same rows read: the same entries
        with st.write() as conn:
            conn.execute(
                text("UPDATE llm_cache SET created_at = 12345.0 WHERE key = :k"),
                {"k": bytes.fromhex(key)},
            )
        changed = tracer_source.find_source(st, "agent", kind, key)
    assert changed is not None and changed.entries is not first.entries
    assert changed.entries[(kind, key)].created_at == 12345.0
    assert first.entries[(kind, key)].created_at != 12345.0
    assert changed.entries.keys() == first.entries.keys()


def test_the_source_found_through_the_sqlite_driver_equals_the_core_one(
    folder: Path, chat_client: ChatClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite find_source reads the candidates, the source's run times and the cache entries
    through the driver (tuples, no compiled statements); the Core statements other databases
    run find the same source, with the same key for the rows kept, entries and results."""
    from rewind.tracing import tracer_source

    trace_once(folder, chat_client, read_cache=False, steps=3)
    trace_once(folder, chat_client, read_cache=True, steps=3)  # a replay by reference: newest
    with opened(folder) as st:
        kind, key = _a_call(st, "tool")
        tracer_source._ROWS.clear()
        by_driver = tracer_source.find_source(st, "agent", kind, key)
        monkeypatch.setattr(tracer_source, "_sqlite_driver", lambda conn: None)
        kept = tracer_source.find_source(st, "agent", kind, key)
        tracer_source._ROWS.clear()
        by_core = tracer_source.find_source(st, "agent", kind, key)
    assert by_driver is not None and kept is not None and by_core is not None
    assert kept.rows is by_driver.rows  # the run row read both ways makes the same key
    assert by_core.rows is not by_driver.rows
    assert by_driver.rows.run_id == by_core.rows.run_id
    assert by_driver.rows.calls == by_core.rows.calls
    assert by_driver.entries == by_core.entries and len(by_driver.entries) == 6
    assert by_driver.blobs == by_core.blobs


def test_results_and_lineage_of_the_same_entries_are_reused_until_a_result_is_dropped(
    folder: Path, chat_client: ChatClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace that gets the same entries as the one before (same rows, no cache row changed)
    gets the same results and lineage index without looking each result up again; once the
    memory dropped a result (or was cleared), the results are looked up, and read from the
    store when gone. Each caller gets its own dicts."""
    from rewind.tracing import tracer_source

    trace_once(folder, chat_client, read_cache=False, steps=3)
    blob_reads: list[set[str]] = []
    real_blobs = Store.get_blobs

    def counting_blobs(self: Store, digests: Any, conn: Any = None) -> dict[str, bytes]:
        blob_reads.append(set(digests))
        return real_blobs(self, digests, conn)

    monkeypatch.setattr(Store, "get_blobs", counting_blobs)
    with opened(folder) as st:
        kind, key = _a_call(st, "llm")
        first = tracer_source.find_source(st, "agent", kind, key)
        again = tracer_source.find_source(st, "agent", kind, key)
        assert first is not None and again is not None and again.entries is first.entries
        assert again.blobs == first.blobs and again.blobs is not first.blobs
        index = tracer_source.lineage_at(first)
        assert tracer_source.lineage_at(again) == index and len(index) == 6
        assert tracer_source.lineage_at(again) is not index
        reads = len(blob_reads)

        dropped = next(iter(first.blobs))  # the memory drops one result
        with tracer_source._ROWS_LOCK:
            tracer_source._BLOBS_SIZE[0] -= len(tracer_source._BLOBS.pop(dropped))
            tracer_source._BLOBS_DROPPED[0] += 1
        third = tracer_source.find_source(st, "agent", kind, key)
        assert third is not None and third.blobs == first.blobs
        assert blob_reads[reads:] == [{dropped}]  # read again from the store

        tracer_source._BLOBS.clear()  # cleared (as a test forgets what it read)
        tracer_source._BLOBS_SIZE[0] = 0
        fourth = tracer_source.find_source(st, "agent", kind, key)
        assert fourth is not None and fourth.blobs == first.blobs
        assert blob_reads[reads + 1 :] == [set(first.blobs)]


def _first_call(st: Store, run_id: str) -> tuple[str, str]:
    """``(kind, cache key)`` of the run's first call."""
    with st.read() as conn:
        found = conn.execute(
            text(
                "SELECT kind, lower(hex(key)) FROM calls WHERE run_id = :r"
                " ORDER BY position, call_index LIMIT 1"
            ),
            {"r": run_id},
        ).one()
    return found[0], found[1]


def test_a_source_behind_newer_traces_of_its_name_is_found_through_its_calls_cache_entry(
    folder: Path, chat_client: ChatClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newest completed traces of the name are tried first (tracer_source.CANDIDATES);
    behind more traces with other first requests the recording was not found (its replay was
    stored unlinked and in full). The call's cache entry says when its answer was produced:
    of the traces of the name started by then, the newest whose own calls hold the key is the
    source, found alike through the driver and the Core statements; only its rows are read
    beyond the candidates'."""
    from rewind.tracing import tracer_source

    source, out = trace_once(folder, chat_client, read_cache=False, steps=3)
    newer = [
        trace_once(folder, chat_client, read_cache=False, steps=3, change_at=0)[0]
        for _ in range(tracer_source.CANDIDATES + 2)
    ]
    with opened(folder) as st:
        kind, key = _first_call(st, source)
        reads = _counted_loads(monkeypatch)
        by_driver = tracer_source.find_source(st, "agent", kind, key)
        assert reads == [*newer[::-1][: tracer_source.CANDIDATES], source]
        monkeypatch.setattr(tracer_source, "_sqlite_driver", lambda conn: None)
        tracer_source._ROWS.clear()
        by_core = tracer_source.find_source(st, "agent", kind, key)
    assert by_driver is not None and by_core is not None
    assert by_driver.rows.run_id == by_core.rows.run_id == source
    assert by_driver.entries == by_core.entries and len(by_driver.entries) == 6
    monkeypatch.undo()
    replay, again = trace_once(folder, chat_client, read_cache=True, steps=3)
    assert again == out
    with opened(folder) as st:
        run = st.get_run(replay)
    assert run.parent_run_id == source
    assert run.config["reference"] == {"run": source, "steps": 6, "all": True}


def test_a_new_trace_behind_many_of_its_name_reads_no_more_rows_than_before(
    folder: Path, chat_client: ChatClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first call never cached (a trace that is genuinely new) costs one cache lookup more
    and reads the rows of the candidates only, however many traces the name has; a call
    cached by a trace of another name reads none more either (the traces of the name that may
    have recorded it are told by their call rows, not read)."""
    from rewind.tracing import tracer_source

    for _ in range(tracer_source.CANDIDATES + 3):
        trace_once(folder, chat_client, read_cache=False, steps=2, change_at=0)
    other, _ = trace_once(folder, chat_client, read_cache=False, steps=2, name="other")
    with opened(folder) as st:
        kind, key = _first_call(st, other)
        reads = _counted_loads(monkeypatch)
        assert tracer_source.find_source(st, "agent", kind, "0" * 64) is None
        assert len(reads) == tracer_source.CANDIDATES
        reads.clear()
        tracer_source._ROWS.clear()
        assert tracer_source.find_source(st, "agent", kind, key) is None
        assert len(reads) == tracer_source.CANDIDATES


def test_the_recorder_lookup_searches_indexes_not_every_run_or_call(folder: Path) -> None:
    """find_source's fallback (tracer_source._recorders) reads the cache entry by key, the
    runs of the name through ix_runs_pipeline_created and each run's calls by run id: no
    statement scans a table."""
    from rewind.tracing import tracer_source as ts

    queries = [
        (ts._ENTRY_SQL["llm_cache"], (b"k" * 32,)),
        (ts._ENTRY_SQL["tool_cache"], (b"k" * 32,)),
        (ts._RECORDERS_SQL, ("agent", 1.0, ts.RECORDER_CANDIDATES, b"k" * 32)),
        (ts._ORIGIN_SQL, ("r", "agent", b"k" * 32)),
    ]
    with opened(folder) as st, st.read() as conn:
        plans = [
            " | ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + q, p))
            for q, p in queries
        ]
    for plan in plans:
        assert "SCAN runs" not in plan and "SCAN c" not in plan and "SCAN llm" not in plan, plan
        assert "SCAN tool" not in plan, plan
    assert "USING INDEX ix_runs_pipeline_created" in plans[2], plans[2]
    assert all("PRIMARY KEY" in plan for plan in plans), plans


def test_an_unchanged_replay_returns_the_run_row_as_stored_and_its_edges_stay_the_sources(
    folder: Path, chat_client: ChatClient
) -> None:
    """A trace's record (built from the values inserted, not read back) is the stored row; an
    unchanged replay inserts no edge rows (its source's are the same pairs, stored with it),
    a changed one inserts its new pairs."""
    trace_once(folder, chat_client, read_cache=False, steps=4)
    with opened(folder) as st:
        edges = st.edges_of("agent")
    assert sorted(edges) == [("llm", "sum_numbers", "default"), ("sum_numbers", "llm", "default")]
    for _ in range(3):  # the second and third are served from the lane
        tracer = Tracer(folder, chat_client=chat_client, read_cache=True, raise_on_write_error=True)
        try:
            with tracer.trace("agent") as t:
                agent(4)
        finally:
            tracer.close()
        with opened(folder) as st:
            assert t.record == st.get_run(t.trace_id)
            assert t.record.config["reference"]["all"] is True
            assert st.edges_of("agent") == edges
    tracer = Tracer(folder, chat_client=chat_client, read_cache=True, raise_on_write_error=True)
    try:
        with tracer.trace("agent") as t:
            agent(2)
            with step("extra"):
                pass
    finally:
        tracer.close()
    with opened(folder) as st:
        assert t.record == st.get_run(t.trace_id)
        assert t.record.config["reference"]["steps"] == 4
        assert sorted(st.edges_of("agent")) == sorted([*edges, ("sum_numbers", "extra", "default")])


@pytest.mark.parametrize(
    ("column", "value", "kept"),
    [
        ("created_at", 1700000000.25, True),
        ("created_at", float("inf"), True),
        ("created_at", 1700000000, False),  # an int in a real column is read back a float
        ("finished_at", -0.0, False),  # stored as 0.0
        ("finished_at", float("nan"), False),  # stored as NULL
        ("prompt_tokens", True, False),  # a bool is read back an int
        ("fork_position", 2.0, False),
        ("error", None, True),
    ],
)
def test_run_as_inserted_is_the_row_read_back_or_none(
    folder: Path, column: str, value: Any, kept: bool
) -> None:
    values = {
        "run_id": "r1",
        "pipeline": "p",
        "status": "completed",
        "config": {"kind": "trace", "b": [1, 2]},
        "created_at": 1700000000.5,
        "finished_at": 1700000001.5,
        "prompt_tokens": 3,
        "owner": None,
    }
    values[column] = value
    with opened(folder) as st:
        with st.write() as conn:
            inserted = st.create_run(conn, **values)
            built = st.run_as_inserted(dict(inserted))
            read = st.run_in(conn, "r1")
        assert (built is not None) == kept
        if built is not None:
            assert built == read == st.get_run("r1")


def test_write_trace_takes_steps_in_any_order_and_refuses_gaps(folder: Path) -> None:
    from rewind.errors import StoreError
    from rewind.tracing.model import StepData, TraceData
    from rewind.tracing.store import write_trace

    def data(trace_id: str, positions: list[int]) -> TraceData:
        steps = [StepData(position=p, name=f"s{p}", fields={f"s{p}": p}) for p in positions]
        return TraceData(trace_id=trace_id, name="order", started_at=1.0, steps=steps)

    with opened(folder) as st:
        write_trace(st, data("a" * 32, [2, 0, 1]))
        write_trace(st, data("b" * 32, [0, 1, 2]))
        a, b = (load_trace(st, t * 32) for t in "ab")
        assert [s.name for s in a.steps] == [s.name for s in b.steps] == ["s0", "s1", "s2"]
        assert [(n.name, n.state_hash) for n in st.nodes_of("a" * 32)] == [
            (n.name, n.state_hash) for n in st.nodes_of("b" * 32)
        ]
        with pytest.raises(StoreError, match="step positions"):
            write_trace(st, data("c" * 32, [0, 2, 3]))
