"""Attacks on issue #13's storage and replay changes (helper a13).

Each test is a way a user can lose data or read a wrong answer through replays stored by
reference (``config["reference"]``), zd1-compressed blobs, Burr state rows stored as deltas, or
the incremental field encoder. Tests of bugs in files another helper owns are marked
``xfail(strict=True)`` with the bug named; they pass once the owner fixes it.
"""

from __future__ import annotations

import copy
import json
import sqlite3
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from burr.core import State, action, default, expr
from burr.core.graph import GraphBuilder
from sqlalchemy import text
from typer.testing import CliRunner

from rewind.calls import chat
from rewind.canonical import sha256_hex
from rewind.cli import app as cli_app
from rewind.errors import ParentMissing, StoreError
from rewind.llm import ChatClient
from rewind.persister import encode_value
from rewind.replay import Pipeline, Rewind
from rewind.store import Store, open_store
from rewind.store.codec import ZDICT_V1, pack_ref, read_pack_ref
from rewind.store.retention import collect_garbage
from rewind.store.store import WriteBatch
from rewind.tools import tool
from rewind.tracing import StepType, Tracer, step, tracer_source
from rewind.tracing.store import load_trace
from tests.conftest import FakeModel, StoreTarget
from tests.test_tracing_reference import opened

DAY = 86400.0


@tool("a13_add")
def add(a: int, b: int) -> int:
    return a + b


traced_add = step("a13_add", "tool_call")(add)


def agent(steps: int, *, change_at: int | None = None) -> list[Any]:
    """An LLM step then a tool step per round; each prompt depends on the answers before it;
    ``change_at`` changes the prompt of that round (a divergence from there on)."""
    reply, total, out = "start", 0, []
    for i in range(steps):
        extra = " (changed)" if i == change_at else ""
        messages = [{"role": "user", "content": f"step {i}: {total} {reply}{extra}"}]
        with step("llm", StepType.LLM_CALL, input={"messages": messages}) as s:
            reply = chat(messages, temperature=0).content
            s.set_output(reply)
        total = traced_add(len(reply), i)
        out.append((reply, total))
    return out


def record(
    folder: Path | Store,
    client: ChatClient,
    *,
    read_cache: bool,
    steps: int = 3,
    change_at: int | None = None,
    clock: Any = time.time,
) -> tuple[str, list[Any]]:
    """One trace through its own Tracer (as a separate process would make it)."""
    tracer = Tracer(
        folder, chat_client=client, read_cache=read_cache, raise_on_write_error=True, clock=clock
    )
    try:
        with tracer.trace("a13") as t:
            out = agent(steps, change_at=change_at)
            t.set_output(out)
    finally:
        tracer.close()
    return t.trace_id, out


# -- replays of replays -------------------------------------------------------------------------
def test_a_long_chain_of_in_place_replays_stays_written_and_readable(
    tmp_path: Path, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    folder = tmp_path / "store"
    source, recorded = record(folder, chat_client, read_cache=False, steps=2)
    calls = fake_model.count
    tracer = Tracer(folder, chat_client=chat_client, raise_on_write_error=True)
    chain = [source]
    try:
        for _ in range(70):  # a nightly job replaying the latest replay, for ten weeks
            with tracer.replay(chain[-1]) as t:
                assert agent(2) == recorded
            assert t.write_error is None
            chain.append(t.trace_id)
    finally:
        tracer.close()
    assert fake_model.count == calls
    with opened(folder) as st:
        for run_id in (chain[-1], chain[40]):
            assert [n.output_hash for n in st.nodes_of(run_id)] == [
                n.output_hash for n in st.nodes_of(source)
            ]
            assert Rewind(st).diff(source, run_id).first_divergence is None


def test_alternating_partial_replays_stay_readable(tmp_path: Path, chat_client: ChatClient) -> None:
    folder = tmp_path / "store"
    ids = [record(folder, chat_client, read_cache=False, steps=2)[0]]
    for i in range(1, 68):  # two prompt variants of the last step, replayed in turn
        ids.append(
            record(folder, chat_client, read_cache=True, steps=2, change_at=1 if i % 2 else None)[0]
        )
    with opened(folder) as st:
        unreadable = []
        for run_id in ids:
            try:
                st.nodes_of(run_id)
            except RuntimeError:
                unreadable.append(run_id)
        assert unreadable == []


# -- gc and replays stored by reference ---------------------------------------------------------
def test_gc_keeps_the_cache_entries_a_replay_by_reference_used_recently(
    store_target: StoreTarget, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    """A cache entry's last use is read from call rows; a replay stored by reference has none.
    A trace replayed every day must keep its cache entries through ``rewind gc``, or the next
    replay sends every call to the model again (a different answer from a sampled model)."""
    st = store_target.open()
    try:
        _source, recorded = record(st, chat_client, read_cache=False)
        later = time.time() + 40 * DAY  # the replay runs 40 days after the recording
        replay, replayed = record(st, chat_client, read_cache=True, clock=lambda: later)
        assert replayed == recorded
        assert st.get_run(replay).config["reference"]["all"] is True
        report = collect_garbage(st, 30 * DAY, now=later + 3600)
        assert (report.llm_cache_expired, report.tool_cache_expired) == (0, 0)
        calls = fake_model.count
        _, replayed = record(st, chat_client, read_cache=True, clock=lambda: later + 7200)
        assert replayed == recorded and fake_model.count == calls  # still served from the cache
    finally:
        st.close()


def test_gc_keeps_the_entries_of_a_partial_replays_shared_steps_only(
    tmp_path: Path, chat_client: ChatClient
) -> None:
    """A replay that diverges at round 2 used the source's entries of rounds 0-1 (by
    reference) and its own from round 2; the source's entries of round 2 on are unused."""
    folder = tmp_path / "store"
    record(folder, chat_client, read_cache=False)
    later = time.time() + 40 * DAY
    replay, _ = record(folder, chat_client, read_cache=True, change_at=2, clock=lambda: later)
    with opened(folder) as st:
        assert st.get_run(replay).config["reference"] == {
            "run": st.get_run(replay).parent_run_id,
            "steps": 4,
            "all": False,
        }
        dry = collect_garbage(st, 30 * DAY, now=later + 3600, dry_run=True)
        report = collect_garbage(st, 30 * DAY, now=later + 3600)
    # round 2 of the source: its LLM call and tool call are no longer used by anyone
    assert (report.llm_cache_expired, report.tool_cache_expired) == (1, 1)
    assert (dry.llm_cache_expired, dry.tool_cache_expired) == (1, 1)


def test_gc_still_expires_entries_whose_replays_are_old_too(
    tmp_path: Path, chat_client: ChatClient
) -> None:
    """The fix above must not keep everything: entries used only by old replays go."""
    folder = tmp_path / "store"
    record(folder, chat_client, read_cache=False)
    record(folder, chat_client, read_cache=True)
    with opened(folder) as st:
        report = collect_garbage(st, 30 * DAY, now=time.time() + 40 * DAY)
        assert (report.llm_cache_expired, report.tool_cache_expired) == (3, 3)


# -- hostile stored call payloads ----------------------------------------------------------------
# A trace's call requests and results are packed together (blob_packs, zlib; migration 0012); a
# blob written on its own (a Burr run's, one of a write's only packable blob) of 64 B up to 1 KiB
# is stored as zd1 (raw DEFLATE: no checksum of its own).


def _stored_call_payload(folder: Path, run_id: str, codecs: set[str]) -> tuple[str, str, bytes]:
    """(hash, codec, stored bytes) of a blob that a node of ``run_id`` names as the request or
    result of one of its calls, stored with one of ``codecs`` (on SQLite hashes are 32-byte keys;
    packed bytes of 161 B or more are spilled to blob_data as ``x-<codec>``)."""
    with opened(folder) as st:
        hashes = [
            h
            for n in st.nodes_of(run_id)
            for c in n.calls
            for h in (c.request_hash, c.result_hash)
            if h
        ]
    for h in hashes:
        found = _stored_blob(folder, h)
        if found[1].removeprefix("x-") in codecs:
            return found
    raise AssertionError(f"no call payload blob stored as {codecs}")


def _stored_blob(folder: Path, digest: str) -> tuple[str, str, bytes]:
    """(hash, codec, stored bytes) of one blob row (spilled bytes from blob_data); of a packed
    blob without one (a ``blob_slices`` row, migration 0016), its pack reference."""
    db = sqlite3.connect(folder / "rewind.db")
    try:
        found = db.execute(
            "SELECT b.codec, COALESCE(d.data, b.data) FROM blobs b"
            " LEFT JOIN blob_data d ON d.hash = b.hash WHERE b.hash = ?",
            (bytes.fromhex(digest),),
        ).fetchone()
    finally:
        db.close()
    if found is None:
        with opened(folder) as st:
            codec, pack_id, offset, length = st.pack_refs([digest])[digest]
        return digest, codec, pack_ref(pack_id, offset, length)
    return digest, found[0], bytes(found[1])


def _tamper(folder: Path, digest: str, codec: str, data: bytes) -> None:
    table = "blob_data" if codec.startswith("x-") else "blobs"
    db = sqlite3.connect(folder / "rewind.db")
    try:
        db.execute(f"UPDATE {table} SET data = ? WHERE hash = ?", (data, bytes.fromhex(digest)))
        assert db.total_changes == 1
        db.commit()
    finally:
        db.close()


def _tamper_pack(folder: Path, ref: bytes, damage: str) -> None:
    """Damage the pack a ``p-`` blob row (``ref``) names: cut its zlib bytes short, or flip one
    bit of the blob's slice and compress the pack again (it then inflates cleanly to other
    bytes: only the blob's hash can tell)."""
    pack_id, offset, _length = read_pack_ref(ref)
    db = sqlite3.connect(folder / "rewind.db")
    try:
        (data,) = db.execute("SELECT data FROM blob_packs WHERE id = ?", (pack_id,)).fetchone()
        if damage == "truncated":
            bad = bytes(data)[: len(data) // 2]
        else:
            plain = bytearray(zlib.decompress(data))
            plain[offset + 1] ^= 1
            bad = zlib.compress(bytes(plain))
        db.execute("UPDATE blob_packs SET data = ? WHERE id = ?", (bad, pack_id))
        assert db.total_changes == 1
        db.commit()
    finally:
        db.close()


def _damaged_zd1(data: bytes, good: bytes, damage: str) -> bytes:
    if damage == "truncated":
        return data[: len(data) // 2]
    # a flip that still inflates to other bytes (raw DEFLATE carries no checksum)
    for i in range(len(data) * 8):
        flipped = bytearray(data)
        flipped[i // 8] ^= 1 << (i % 8)
        d = zlib.decompressobj(-11, ZDICT_V1)
        try:
            out = d.decompress(bytes(flipped)) + d.flush()
        except zlib.error:
            continue
        if out != good and len(out) == len(good):
            return bytes(flipped)
    raise AssertionError("no bit flip inflates to other bytes of the same length")


@pytest.mark.parametrize("stored", ["pack", "zd1"])
@pytest.mark.parametrize("damage", ["truncated", "bit flip"])
def test_a_damaged_stored_call_payload_is_a_clear_error_not_a_wrong_value(
    tmp_path: Path, chat_client: ChatClient, damage: str, stored: str
) -> None:
    folder = tmp_path / "store"
    run_id, _ = record(folder, chat_client, read_cache=False)
    digest, codec, data = _stored_call_payload(folder, run_id, {"p-raw", "p-hex1"})
    with opened(folder) as st:
        good = st.get_blob(digest)
    if stored == "zd1":
        # The same kind of bytes (a chat request) written on its own, as a Burr run's are.
        good = good.replace(b"step", b"step ")
        digest = sha256_hex(good)
        with opened(folder) as st:
            st.write_batch(WriteBatch(blobs={digest: good}))
        digest, codec, data = _stored_blob(folder, digest)
        assert codec == "zd1"
        _tamper(folder, digest, codec, _damaged_zd1(data, good, damage))
    else:
        _tamper_pack(folder, data, damage)
    damaged = r"cannot be unpacked|does not match its hash"
    with opened(folder) as st, pytest.raises(StoreError, match=damaged) as raised:
        st.get_blob(digest)
    assert "store is damaged" in str(raised.value)
    if stored == "zd1":
        return  # no call of the run names it
    with opened(folder) as st:
        source = st.get_run(run_id).run_id
    # inspect reads every call's request and answer
    result = CliRunner().invoke(cli_app, ["inspect", source, "--store", str(folder)])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and "Traceback" not in result.output
    assert "store is damaged" in result.output


# -- downgrade below 0010 -----------------------------------------------------------------------
def test_downgrading_below_0010_leaves_no_replay_an_older_rewind_reads_empty(
    tmp_path: Path, chat_client: ChatClient
) -> None:
    from alembic import command

    from rewind.store import migrate

    folder = tmp_path / "store"
    source, _ = record(folder, chat_client, read_cache=False)
    replay, _ = record(folder, chat_client, read_cache=True)
    partial, _ = record(folder, chat_client, read_cache=True, change_at=2)

    def seen(st: Store) -> dict[str, list[Any]]:
        return {
            run: [
                (n.name, n.input_hash, n.output_hash, n.state_hash, [c.key for c in n.calls])
                for n in st.nodes_of(run)
            ]
            for run in (source, replay, partial)
        }

    with opened(folder) as st:
        before = seen(st)
    st = open_store(folder)
    try:
        with st.write() as conn:
            command.downgrade(migrate._config(conn), "0009")
        with st.read() as conn:
            rows = {
                run: conn.execute(
                    text("SELECT COUNT(*) FROM nodes WHERE run_id = :r"), {"r": run}
                ).scalar_one()
                for run in (source, replay, partial)
            }
    finally:
        st.close()
    # What a Rewind that does not know references reads: the node rows themselves.
    assert rows == {source: 6, replay: 6, partial: 6}
    with opened(folder) as st:  # upgraded again: the same runs, now stored in full
        assert seen(st) == before
        assert "reference" not in st.get_run(replay).config


# -- Burr: a field changed in place by a helper the action calls ---------------------------------
def _remember(state: State, line: str) -> int:
    """A helper an action calls: Burr's check of declared reads reads the action's own body
    only, so the ``history`` it appends to is in no declaration."""
    state["history"].append(line)
    return len(state["history"])


@action(reads=["question"], writes=["answer"])
def _respond(state: State) -> State:
    count = _remember(state, "user: " + state["question"])
    return state.update(answer=f"{count} messages")


@action(reads=["answer"], writes=["question"])
def _ask(state: State) -> State:
    return state.update(question="and then?")


@action(reads=["history"], writes=["summary"])
def _summarize(state: State) -> State:
    return state.update(summary=" | ".join(state["history"]))


def test_a_history_appended_by_a_helper_is_recorded_as_it_was(tmp_path: Path) -> None:
    graph = (
        GraphBuilder()
        .with_actions(respond=_respond, ask=_ask, respond2=_respond, summarize=_summarize)
        .with_transitions(
            ("respond", "ask", default),
            ("ask", "respond2", default),
            ("respond2", "summarize", default),
        )
        .build()
    )
    pipe = Pipeline(name="helper", graph=graph, entrypoint="respond", halt_after=("summarize",))
    rw = Rewind(tmp_path / "store")
    try:
        run = rw.record(pipe, {"question": "hi", "history": ["system: be brief"]})
        assert run.status == "completed", run.error
        nodes = rw.store.nodes_of(run.run_id)
        after = rw.store.load_state_row("", nodes[2].src_app_id, nodes[2].src_sequence_id)
        assert after is not None and after["values"]["answer"] == "3 messages"
        # what the run's state held after respond2: three lines
        assert after["values"]["history"] == ["system: be brief", "user: hi", "user: and then?"]
        # an unchanged replay from summarize reads that state and must not diverge
        fork = rw.fork(run.run_id, at="summarize")
        assert rw.diff(run.run_id, fork.run_id).first_divergence is None
    finally:
        rw.store.close()


# -- the HTTP API on replays stored by reference -----------------------------------------------
def test_the_api_serves_a_reference_replay_as_its_source_over_real_http(
    tmp_path: Path, chat_client: ChatClient
) -> None:
    """A partial replay P (diverges at round 1) and an unchanged replay R of P (stored wholly
    by reference to P, whose rounds 0 come from S): every node endpoint answers for R what it
    answers for P, timing and ids aside; progress counts R's nodes."""
    import httpx

    from rewind.api import create_app
    from tests.live_server import LiveServer

    folder = tmp_path / "store"
    record(folder, chat_client, read_cache=False)
    partial, _ = record(folder, chat_client, read_cache=True, change_at=1)
    replay, _ = record(folder, chat_client, read_cache=True, change_at=1)
    with opened(folder) as st:
        assert st.get_run(replay).config["reference"] == {"run": partial, "steps": 6, "all": True}
    with (
        LiveServer(create_app(folder)) as server,
        httpx.Client(base_url=server.url, trust_env=False, timeout=60) as http,
    ):
        progress = http.get(f"/api/runs/{replay}/progress").json()
        assert progress["nodes"] == 6 and progress["tokens"] == 0
        for node in range(1, 7):
            for part in ("", "/input", "/output", "/state"):
                a = http.get(f"/api/runs/{partial}/nodes/{node}{part}")
                b = http.get(f"/api/runs/{replay}/nodes/{node}{part}")
                assert (a.status_code, b.status_code) == (200, 200), (node, part, b.text)
                if part:
                    assert a.json() == b.json(), (node, part)
            for side in ("request", "response"):
                a = http.get(f"/api/runs/{partial}/nodes/{node}/calls/0/{side}")
                b = http.get(f"/api/runs/{replay}/nodes/{node}/calls/0/{side}")
                assert b.status_code == a.status_code == 200 and a.content == b.content
        nodes_a = http.get(f"/api/runs/{partial}/nodes").json()["nodes"]
        nodes_b = http.get(f"/api/runs/{replay}/nodes").json()["nodes"]
        assert [n["output_hash"] for n in nodes_a] == [n["output_hash"] for n in nodes_b]
        diff = http.get("/api/diff", params={"a": partial, "b": replay}).json()
        assert diff["first_divergence"] is None
        assert http.get(f"/api/traces/{replay}/inspect").status_code == 200


# -- the single flight of a traced call ends with the trace ----------------------------------------
def test_a_trace_after_gc_executes_the_calls_an_earlier_trace_executed_and_caches_them(
    tmp_path: Path, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    """A cached trace's misses are shared with concurrent replays (``hit:in-flight``) until the
    trace is written, not after: once ``rewind gc`` expired their entries, the next trace in the
    same process executes those calls again and stores their entries. (A flight left behind was
    followed instead: 0 tokens, no entry written, so the replay after it missed as well; a store
    opened later at the freed store's address followed it too, which made the reference test
    above fail under load, 5 steps stored by reference instead of 6.)"""
    st = open_store(tmp_path / "store")
    try:
        record(st, chat_client, read_cache=False)
        record(st, chat_client, read_cache=True, change_at=2)  # round 2 missed: executed
        report = collect_garbage(st, 30 * DAY, now=time.time() + 40 * DAY)
        assert len(report.archived) == 2 and report.tool_cache_expired == 4
        before = fake_model.count
        again, _ = record(st, chat_client, read_cache=True, change_at=2)
        assert fake_model.count - before == 3  # every LLM call executed, none shared
        calls = [c for n in st.nodes_of(again) for c in n.calls]
        assert [(c.outcome, c.reason) for c in calls] == [("miss", "no-entry")] * 6
        assert all(st.tool_cache_get(c.key) for c in calls if c.kind == "tool")
        assert all(st.llm_cache_get(c.key) for c in calls if c.kind == "llm")
    finally:
        st.close()


def test_a_flight_is_never_joined_by_a_store_made_where_a_freed_one_was() -> None:
    """Flights are keyed by a number per store object that is never given again: CPython gives
    a new object the id of a freed one, and keyed by ``id(store)`` a flight the old store left
    served the new store's miss as ``hit:in-flight``."""
    from rewind import cache
    from rewind.call import DEFAULT_POLICY, Call
    from rewind.context import RunContext

    class _Store:
        pass

    def nothing() -> Any:
        raise AssertionError("not executed")

    call = Call.of("tool", "t", "k" * 64, b"{}", nothing, DEFAULT_POLICY, 0)
    old = _Store()
    old_id = id(old)
    flight, future, leader = cache._join_flight(RunContext(store=old, run_id="a"), call)
    assert leader
    future.set_result((b"1", None, None))  # landed, never released (a writer that forgot it)
    del old  # freed here (no cycle): the next objects of its size are made where it was
    made: list[_Store] = []
    while len(made) < 100_000 and (not made or id(made[-1]) != old_id):
        made.append(_Store())
    new = made[-1] if id(made[-1]) == old_id else None
    if new is None:
        pytest.skip("this interpreter gave no new object the freed store's id")
    joined, _, leader = cache._join_flight(RunContext(store=new, run_id="b"), call)
    with cache._INFLIGHT_LOCK:  # neither flight outlives the test
        cache._INFLIGHT.pop(flight, None)
        cache._INFLIGHT.pop(joined, None)
    assert leader


# -- a replay whose source gc archives while it runs --------------------------------------------
def _replay_while_gc_archives_its_source(folder: Path | Store, client: ChatClient) -> Any:
    """Record a trace, then replay it with ``read_cache=True`` while ``rewind gc`` (40 days
    later, keeping 30) archives the source between the replay's first lookup and its write."""
    record(folder, client, read_cache=False)
    tracer = Tracer(folder, chat_client=client, read_cache=True)
    try:
        with tracer.trace("a13") as t:
            out = agent(3)
            t.set_output(out)
            if isinstance(folder, Store):
                report = collect_garbage(folder, 30 * DAY, now=time.time() + 40 * DAY)
            else:
                with opened(folder) as st:
                    report = collect_garbage(st, 30 * DAY, now=time.time() + 40 * DAY)
            assert len(report.archived) == 1
    finally:
        tracer.close()
    return t


def test_a_run_whose_parent_was_archived_meanwhile_says_so(
    store_target: StoreTarget, chat_client: ChatClient
) -> None:
    """A run row naming a parent the store no longer holds is refused with that reason, not
    'already exists' (a trace replay then stores itself unlinked: the test below)."""
    st = store_target.open()
    try:
        record(st, chat_client, read_cache=False)
        (source,) = st.list_runs()
        collect_garbage(st, 30 * DAY, now=time.time() + 40 * DAY)
        with (
            pytest.raises(ParentMissing, match="archived by `rewind gc`") as caught,
            st.write() as conn,
        ):
            st.create_run(
                conn,
                run_id="b" * 32,
                pipeline="a13",
                pipeline_ref="",
                status="completed",
                parent_run_id=source.run_id,
                initial_state_hash="0" * 64,
                config={},
            )
        assert "already exists" not in str(caught.value)
        assert [r.run_id for r in st.list_runs()] == []  # nothing written
    finally:
        st.close()


def test_a_replay_whose_source_was_archived_meanwhile_is_still_stored(
    tmp_path: Path, chat_client: ChatClient
) -> None:
    folder = tmp_path / "store"
    t = _replay_while_gc_archives_its_source(folder, chat_client)
    assert t.write_error is None
    with opened(folder) as st:
        run = st.get_run(t.trace_id)
        assert run.parent_run_id is None and "reference" not in run.config
        assert run.config["source_missing"]  # the archived source it replayed
        assert len(st.nodes_of(t.trace_id)) == 6
        # every row and result is its own: readable without the archived source
        view = load_trace(st, t.trace_id)
        assert len(view.steps) == 6 and all(s.output is not None for s in view.steps)
        for node in st.nodes_of(t.trace_id):
            for call in node.calls:
                assert st.get_blob(call.result_hash)


# -- Burr state rows as deltas: >17 nodes, in-place changes, deleted fields, forks ---------------
TICKS = 40
TICK_FIELDS = [f"f{j}" for j in range(20)]


@action(
    reads=["i", "items", "nested", "grid"], writes=["i", "items", "nested", "grid", *TICK_FIELDS]
)
def _tick(state: State) -> State:
    """Changes lists, a nested dict and a numpy array in place, one of 20 fields per node, and
    adds a field every 5th node that the 2nd node after deletes."""
    i = state["i"] + 1
    items, nested, grid = state["items"], state["nested"], state["grid"]
    items.append(i)
    nested["a"]["b"].append(i % 3)
    grid[i % 4] += 1
    new = state.update(i=i, items=items, nested=nested, grid=grid, **{f"f{i % 20}": i})
    if i % 5 == 0:
        new = new.update(tmp={"at": i})
    elif i % 5 == 2 and "tmp" in new:
        new = new.wipe(delete=["tmp"])
    return new


@action(reads=["i"], writes=["done"])
def _finish(state: State) -> State:
    return state.update(done=True)


def _ticks() -> Pipeline:
    graph = (
        GraphBuilder()
        .with_actions(tick=_tick, finish=_finish)
        .with_transitions(("tick", "tick", expr(f"i < {TICKS}")), ("tick", "finish", default))
        .build()
    )
    return Pipeline(name="ticks", graph=graph, entrypoint="tick", halt_after=("finish",))


def _tick_start() -> dict[str, Any]:
    import numpy as np

    return {
        "i": 0,
        "items": [],
        "nested": {"a": {"b": []}},
        "grid": np.zeros(4),
        **dict.fromkeys(TICK_FIELDS, 0),
    }


def _tick_states() -> list[dict[str, Any]]:
    """The state after every node, computed without Burr (deep copies)."""
    s, out = _tick_start(), []
    for _ in range(TICKS):
        i = s["i"] = s["i"] + 1
        s["items"].append(i)
        s["nested"]["a"]["b"].append(i % 3)
        s["grid"][i % 4] += 1
        s[f"f{i % 20}"] = i
        if i % 5 == 0:
            s["tmp"] = {"at": i}
        elif i % 5 == 2:
            s.pop("tmp", None)
        out.append(copy.deepcopy(s))
    out.append(copy.deepcopy(s) | {"done": True})
    return out


def _read_back(rw: Rewind, run_id: str) -> list[dict[str, str]]:
    """Each node's state as stored, every field as its hash (so numpy arrays compare)."""
    out = []
    for n in rw.store.nodes_of(run_id):
        row = rw.store.load_state_row("", n.src_app_id, n.src_sequence_id)
        assert row is not None
        values = {k: v for k, v in row["values"].items() if not k.startswith("__")}
        out.append({k: encode_value(k, v).digest for k, v in values.items()})
    return out


def _hashed(states: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [{k: encode_value(k, v).digest for k, v in s.items()} for s in states]


def test_burr_state_deltas_read_back_through_a_downgrade_to_0009_and_back(tmp_path: Path) -> None:
    """States written as deltas (full map every 17th row) read back as the run had them; a
    store taken down to 0009 (every row a full map, zd1 blobs raw) and opened again by this
    Rewind reads the same, and forks at nodes 18, 34 and 35 (each side of a full row) replay
    unchanged and store their own rows as deltas."""
    from alembic import command

    from rewind.store import migrate

    folder = tmp_path / "store"
    expected = _hashed(_tick_states())
    rw = Rewind(folder)
    try:
        run = rw.record(_ticks(), _tick_start())
        assert run.status == "completed", run.error
        assert _read_back(rw, run.run_id) == expected
        with rw.store.read() as conn:
            kinds = [
                r[0].startswith("[")
                for r in conn.execute(
                    text(
                        "SELECT fields_json FROM burr_state WHERE app_id = :a ORDER BY sequence_id"
                    ),
                    {"a": run.run_id},
                )
            ]
        assert kinds.count(False) == 3 and not kinds[0] and not kinds[17] and not kinds[34]
        with rw.store.write() as conn:
            command.downgrade(migrate._config(conn), "0009")
    finally:
        rw.store.close()
    rw = Rewind(folder)  # opens (and upgrades) the 0009 store
    rw.register(_ticks())
    try:
        assert _read_back(rw, run.run_id) == expected
        for at in (18, 34, 35):
            fork = rw.fork(run.run_id, at=at)
            assert fork.status == "completed", fork.error
            assert rw.diff(run.run_id, fork.run_id).first_divergence is None
            assert _read_back(rw, fork.run_id) == expected
            with rw.store.read() as conn:
                own = [
                    r[0]
                    for r in conn.execute(
                        text("SELECT fields_json FROM burr_state WHERE app_id = :a"),
                        {"a": fork.run_id},
                    )
                ]
            assert own and any(f.startswith("[") for f in own)  # its own rows: deltas again
            again = rw.fork(fork.run_id, at=at + 3)  # a fork of the fork
            assert rw.diff(run.run_id, again.run_id).first_divergence is None
            assert _read_back(rw, again.run_id) == expected
    finally:
        rw.store.close()


# -- what `rewind show` says of a cached trace replay --------------------------------------------
def test_show_does_not_call_a_diverging_trace_replay_unchanged(
    tmp_path: Path, chat_client: ChatClient
) -> None:
    """A cached trace replays whatever code the caller runs now: Q below runs the original
    code, finds as its source the newest trace that made its first call (P, which changed round
    2), and differs from P from step 5. It has no override, but it is no 'unchanged replay'."""
    folder = tmp_path / "store"
    record(folder, chat_client, read_cache=False)
    partial, _ = record(folder, chat_client, read_cache=True, change_at=2)
    again, _ = record(folder, chat_client, read_cache=True)
    with opened(folder) as st:
        assert st.get_run(again).parent_run_id == partial
        assert Rewind(st).diff(partial, again).first_divergence is not None
    result = CliRunner().invoke(cli_app, ["show", again, "--store", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    change = json.loads(result.output)["run"]["change"]
    expected = f"replay of trace {partial[:12]}: its first 4 step(s) equal, differs from step 5"
    assert change == expected
    result = CliRunner().invoke(cli_app, ["show", again, "--store", str(folder)])
    assert "unchanged" not in result.output and "differs from step 5" in result.output


@pytest.mark.parametrize("damage", ["truncated", "bit flip"])
def test_a_cached_replay_over_a_damaged_stored_response_says_the_store_is_damaged(
    tmp_path: Path, chat_client: ChatClient, damage: str
) -> None:
    """Cut short, a recorded model answer (then stored zd1) inflated to a prefix of itself: the
    replay blamed the model endpoint ('answered a body that is not JSON'); a flipped bit in the
    text would have been served as the recorded answer. Answers are packed now (blob_packs):
    the pack holding the first answer is cut short, or one bit of the answer's slice flipped."""
    folder = tmp_path / "store"
    source, _ = record(folder, chat_client, read_cache=False)
    db = sqlite3.connect(folder / "rewind.db")
    try:
        # 32-byte keys on SQLite (schema.Digest)
        (digest,) = db.execute(
            "SELECT c.result_hash FROM calls c WHERE c.kind = 'llm' ORDER BY c.position LIMIT 1"
        ).fetchone()
    finally:
        db.close()
    _digest, codec, ref = _stored_blob(folder, bytes(digest).hex())
    assert codec in {"p-raw", "p-hex1"}
    _tamper_pack(folder, bytes(ref), damage)
    expected = "cannot be unpacked" if damage == "truncated" else "does not match its hash"
    # Results this process read before are kept by hash (correct bytes, whatever the row holds
    # now): forget them so the replay reads the damaged row.
    tracer_source._BLOBS.clear()
    tracer_source._BLOBS_SIZE[0] = 0
    for replay_in_place in (False, True):
        tracer = Tracer(folder, chat_client=chat_client, read_cache=True)
        try:
            # (an in-place replay reads its source's answers when it is made: inside raises)
            with (
                pytest.raises(StoreError, match=expected) as raised,
                tracer.replay(source) if replay_in_place else tracer.trace("a13"),
            ):
                agent(3)
        finally:
            tracer.close()
        assert "store is damaged" in str(raised.value)
        assert "endpoint" not in str(raised.value) and "model" not in str(raised.value)


def test_burr_state_deltas_and_forks_past_full_rows_on_each_backend(
    store_target: StoreTarget,
) -> None:
    """The same run and forks on SQLite and PostgreSQL (different bulk insert paths): every
    state read back is the run's; forks at 17, 18 and 35 replay unchanged."""
    expected = _hashed(_tick_states())
    rw = Rewind(store_target.open())
    try:
        run = rw.record(_ticks(), _tick_start())
        assert run.status == "completed", run.error
        assert _read_back(rw, run.run_id) == expected
        for at in (17, 18, 35):
            fork = rw.fork(run.run_id, at=at)
            assert rw.diff(run.run_id, fork.run_id).first_divergence is None
            assert _read_back(rw, fork.run_id) == expected
    finally:
        rw.store.close()


# -- concurrent replays while the source is recorded again with other answers --------------------
def _traces_in_a_process(folder: str, base_url: str, replay: bool, count: int) -> None:
    """Entry of a worker process: ``count`` traces, cached (every third one changes round 2)
    or recorded live (the stub answers anew: cache entries overwritten with other answers)."""
    from rewind.llm import Endpoint

    client = ChatClient(Endpoint(base_url=base_url, model="stub-model"))
    for i in range(count):
        change = 2 if replay and i % 3 == 2 else None
        record(Path(folder), client, read_cache=replay, change_at=change)


@pytest.mark.slow
def test_concurrent_replays_while_the_source_is_recorded_again_show_what_their_code_got(
    tmp_path: Path,
) -> None:
    """Two processes replay the trace with ``read_cache=True`` while a third records it again
    (each answer new, overwriting the cache entries of the first round). Every stored trace,
    read back (references resolved), shows the answers its own code returned."""
    from rewind.tracing.store import load_trace
    from tests import forked
    from tests.model_stub import ModelStub

    folder = tmp_path / "store"
    with ModelStub() as stub:
        args = (str(folder), stub.base_url)
        assert forked.fork(_traces_in_a_process, *args, False, 5).wait()[0] == 0
        # three processes at once (forked: Python, Burr and Rewind imported already)
        workers = [
            forked.fork(_traces_in_a_process, *args, mode, 5) for mode in (True, True, False)
        ]
        assert [w.wait()[0] for w in workers] == [0, 0, 0]
    with opened(folder) as st:
        runs = st.list_runs(limit=100)
        assert len(runs) == 20
        referenced = 0
        for run in runs:
            view = load_trace(st, run.run_id)
            returned = [x for pair in view.output for x in pair]  # the code's (reply, total)s
            assert [s.output for s in view.steps] == returned, run.run_id
            referenced += "reference" in run.config
        assert referenced >= 2


# -- a user's own config key named "reference" ----------------------------------------------------
def _burr_run_in_flight_with_a_reference_key(tmp_path: Path, check: Any) -> None:
    """Record a Burr run whose config (the user's: any key) has ``reference = {run, steps}``
    naming another run, and call ``check(rw, run_id)`` while its first node still runs."""
    import threading

    go = threading.Event()

    @action(reads=[], writes=["y"])
    def quick(state: State) -> State:
        return state.update(y=1)

    @action(reads=[], writes=["y"])
    def slow(state: State) -> State:
        go.wait(60)
        return state.update(y=2)

    def pipe(name: str, first: Any) -> Pipeline:
        graph = (
            GraphBuilder()
            .with_actions(first=first, second=quick)
            .with_transitions(("first", "second", default))
            .build()
        )
        return Pipeline(name=name, graph=graph, entrypoint="first", halt_after=("second",))

    rw = Rewind(tmp_path / "store")
    try:
        other = rw.record(pipe("other", quick), {})
        config = {"reference": {"run": other.run_id, "steps": 2}}
        worker = threading.Thread(
            target=rw.record,
            args=(pipe("mine", slow), {}),
            kwargs={"run_id": "mine", "config": config},
        )
        worker.start()
        try:
            deadline = time.monotonic() + 600  # a loaded CI machine
            while True:
                try:
                    rw.store.get_run("mine")
                    break
                except Exception:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            check(rw, "mine")
        finally:
            go.set()
            worker.join()
    finally:
        rw.store.close()


def test_a_burr_runs_own_reference_config_key_does_not_borrow_another_runs_nodes(
    tmp_path: Path,
) -> None:
    def check(rw: Rewind, run_id: str) -> None:
        assert rw.store.nodes_of(run_id) == []  # its first node is still running

    _burr_run_in_flight_with_a_reference_key(tmp_path, check)


def test_load_trace_of_a_burr_run_with_a_reference_config_key_shows_its_own_nodes(
    tmp_path: Path,
) -> None:
    from rewind.tracing.store import load_trace

    def check(rw: Rewind, run_id: str) -> None:
        assert len(load_trace(rw.store, run_id).steps) == 0

    _burr_run_in_flight_with_a_reference_key(tmp_path, check)
