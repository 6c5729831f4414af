"""The Burr record and replay hot path: shortcuts that must give exactly what the general path
gives (tool argument binding, the {field: hash} map fragments, state rows carrying their parsed
map), and the blob presence probe of a write batch, including a gc racing it."""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, event

import rewind
from rewind.canonical import canonical_bytes
from rewind.persister import _map_fragments
from rewind.store import open_store, schema
from rewind.store.retention import bump_blob_epoch
from rewind.store.store import (
    PRESENCE_CHECK_MIN_BLOBS,
    PRESENCE_PROBE_BLOBS,
    WriteBatch,
    _probe,
    state_deltas,
    state_row,
)


def _tool_fn(node: str, value: int, label: str = "x") -> dict[str, Any]:
    return {"node": node, "value": value, "label": label}


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {"node": "a", "value": 1, "label": "y"}),  # every parameter by keyword: shortcut
        ((), {"value": 1, "label": "y", "node": "a"}),  # in another order: parameter order
        ((), {"node": "a", "value": 1}),  # a default applied: bind
        (("a",), {"value": 1, "label": "y"}),  # mixed: bind
        (("a", 1, "y"), {}),  # every parameter positionally: shortcut
    ],
)
def test_tool_binding_shortcuts_equal_signature_bind(args: tuple, kwargs: dict) -> None:
    t = rewind.tool("hotpath_record_bind")(_tool_fn)
    bound = inspect.signature(_tool_fn).bind(*args, **kwargs)
    bound.apply_defaults()
    got = t.bind(*args, **kwargs)
    assert got == dict(bound.arguments)
    assert list(got) == list(bound.arguments)  # the canonical request is order-free, still


def test_tool_binding_with_an_unknown_keyword_is_refused() -> None:
    t = rewind.tool("hotpath_record_unknown")(_tool_fn)
    with pytest.raises(rewind.RewindError, match="hotpath_record_unknown"):
        t.bind(node="a", value=1, other=2)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=12), st.text(alphabet="0123456789abcdef", min_size=64, max_size=64))
def test_map_fragments_equal_the_encoders(key: str, digest: str) -> None:
    one = {key: digest}
    try:
        canonical = canonical_bytes(one)[1:-1]
    except Exception:  # a lone surrogate: the encoder refuses it, so must the fragment
        with pytest.raises(Exception):  # noqa: B017 - whatever canonical_bytes raises
            _map_fragments(key, digest)
        return
    assert _map_fragments(key, digest) == (canonical, json.dumps(one)[1:-1])


def _rows(n: int) -> list[dict[str, Any]]:
    """``n`` state rows of one app, each adding a field and changing the previous one."""
    rows, fields = [], {}
    for seq in range(n):
        fields = dict(fields)
        fields[f"f{seq:03d}"] = hashlib.sha256(b"%d" % seq).hexdigest()
        if seq:
            fields[f"f{seq - 1:03d}"] = hashlib.sha256(b"changed %d" % seq).hexdigest()
        rows.append(
            state_row(
                partition_key="",
                app_id="app",
                sequence_id=seq,
                position=f"n{seq}",
                status="completed",
                fields=fields,
                internal={"__SEQUENCE_ID": seq},
            )
        )
    return rows


def test_state_rows_with_their_parsed_map_give_the_rows_parsed_from_json() -> None:
    rows = _rows(30)
    with_map, tails_a = state_deltas(rows, {})
    plain = [{k: v for k, v in r.items() if k != "_fields"} for r in rows]
    from_json, tails_b = state_deltas(plain, {})
    assert with_map == from_json
    assert tails_a == tails_b
    assert all(set(r) == set(plain[0]) for r in with_map)  # columns only
    assert any(json.loads(r["fields_json"])[0] == 4 for r in with_map[5:6])  # deltas were made
    assert all("_fields" in r for r in rows)  # the input rows are not modified


def test_state_rows_round_trip_through_a_store(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    try:
        rows = _rows(20)
        store.write_batch(WriteBatch(states=rows))
        for row in rows:
            loaded = store.load_state_row("", "app", row["sequence_id"], values=False)
            assert loaded is not None
            assert loaded["fields"] == row["_fields"]
    finally:
        store.close()


def _blobs(prefix: bytes, n: int) -> dict[str, bytes]:
    return {hashlib.sha256(prefix + b"%d" % i).hexdigest(): prefix + b"%d" % i for i in range(n)}


def _count_blob_statements(store: Any) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {"select": [], "insert": []}

    def count(conn: object, cursor: object, statement: str, params: Any, *a: object) -> None:
        s = statement.lstrip().upper()
        if "BLOBS" not in s:
            return
        if s.startswith("SELECT") and "BLOBS.HASH" in s and " IN " in s:
            seen["select"].append(len(params))
        elif s.startswith("INSERT"):
            seen["insert"].append(len(params) if isinstance(params, list) else 1)

    event.listen(store.engine, "before_cursor_execute", count)
    return seen


def test_a_batch_of_new_blobs_asks_only_the_probe_and_stores_every_blob(tmp_path: Path) -> None:
    stored = _blobs(b"old ", 3)
    fresh = _blobs(b"new ", 80)
    first = open_store(tmp_path / "s")
    first.write_batch(WriteBatch(blobs=dict(stored)))
    first.close()
    second = open_store(tmp_path / "s")  # knows none of them
    try:
        seen = _count_blob_statements(second)
        second.write_batch(WriteBatch(blobs=stored | fresh))
        assert seen["select"] == [PRESENCE_PROBE_BLOBS]  # the rest were not asked about
        probed = set(_probe(stored | fresh)) & stored.keys()  # found stored: not sent
        assert sum(seen["insert"]) == len(stored) + len(fresh) - len(probed)
        assert second.get_blobs([*stored, *fresh]) == stored | fresh
    finally:
        second.close()


def test_a_batch_of_mostly_stored_blobs_is_asked_about_whole(tmp_path: Path) -> None:
    stored = _blobs(b"old ", 60)
    fresh = _blobs(b"new ", 6)
    assert len(stored) + len(fresh) >= PRESENCE_CHECK_MIN_BLOBS
    first = open_store(tmp_path / "s")
    first.write_batch(WriteBatch(blobs=dict(stored)))
    first.close()
    second = open_store(tmp_path / "s")
    try:
        seen = _count_blob_statements(second)
        second.write_batch(WriteBatch(blobs=stored | fresh))
        assert len(seen["select"]) == 2
        assert sum(seen["insert"]) == len(fresh)
        assert second.get_blobs([*stored, *fresh]) == stored | fresh
    finally:
        second.close()


def test_blobs_a_gc_deletes_after_the_presence_check_are_written_again(tmp_path: Path) -> None:
    """The presence check reads outside the write transaction: a gc (here another store
    instance deleting the blobs and bumping the blob epoch, as ``rewind gc`` does) may delete
    what it found before the batch commits. The batch must then store every blob it carries."""
    stored = _blobs(b"old ", 60)
    fresh = _blobs(b"new ", 6)
    first = open_store(tmp_path / "s")
    first.write_batch(WriteBatch(blobs=dict(stored)))
    first.close()
    writer = open_store(tmp_path / "s")
    collector = open_store(tmp_path / "s")
    try:
        answer = writer._present_blobs

        def present_then_collected(digests: Any) -> set[str]:
            found = answer(digests)
            with collector.write() as conn:
                conn.execute(delete(schema.blobs).where(schema.blobs.c.hash.in_(sorted(found))))
                bump_blob_epoch(conn)
            return found

        writer._present_blobs = present_then_collected  # type: ignore[method-assign]
        writer.write_batch(WriteBatch(blobs=stored | fresh))
        assert collector.get_blobs([*stored, *fresh]) == stored | fresh
    finally:
        writer.close()
        collector.close()


def _churn_pipeline(steps: int) -> Any:
    """A loop that adds a field, rewrites one and deletes one at every step (every kind of
    change a state row's delta records)."""
    from burr.core import State, action, default, expr
    from burr.core.graph import GraphBuilder

    from rewind.replay import Pipeline

    @action(reads=["i", "keep"], writes=["i", "keep"])
    def churn(state: State) -> State:
        i = state["i"]
        new = state.update(i=i + 1, keep=[*state["keep"], i], **{f"f{i:02d}": {"at": i}})
        gone = f"f{i - 3:02d}"
        return new.wipe(delete=[gone]) if gone in new else new

    @action(reads=["i"], writes=["done"])
    def finish(state: State) -> State:
        return state.update(done=True)

    graph = (
        GraphBuilder()
        .with_actions(churn=churn, finish=finish)
        .with_transitions(("churn", "churn", expr(f"i < {steps}")), ("churn", "finish", default))
        .build()
    )
    return Pipeline("churn", graph, entrypoint="churn", halt_after=("finish",))


def test_recorded_state_rows_equal_deltas_computed_from_full_maps(tmp_path: Path) -> None:
    """The recorder hands write_batch what changed since its last row; the stored rows must be
    exactly the ones computed by comparing full maps, and load back to the same maps."""
    from sqlalchemy import select

    from rewind.replay import Rewind

    rw = Rewind(tmp_path / "store")
    try:
        run = rw.record(_churn_pipeline(40), {"i": 0, "keep": []})
        assert run.status == "completed", run.error
        t = schema.burr_state
        with rw.store.read() as conn:
            stored = conn.execute(
                select(t).where(t.c.app_id == run.run_id).order_by(t.c.sequence_id)
            ).all()
        assert len(stored) == 41
        full = []
        for r in stored:
            loaded = rw.store.load_state_row("", run.run_id, r.sequence_id, values=False)
            assert loaded is not None
            full.append(
                {
                    "partition_key": "",
                    "app_id": run.run_id,
                    "sequence_id": r.sequence_id,
                    "position": r.position,
                    "status": r.status,
                    "fields_json": json.dumps(loaded["fields"], sort_keys=True),
                    "internal_json": r.internal_json,
                    "created_at": r.created_at,
                }
            )
        expected, _ = state_deltas(full, {})
        assert [r.fields_json for r in stored] == [r["fields_json"] for r in expected]
        kinds = [json.loads(r.fields_json) for r in stored]
        assert any(isinstance(k, list) and k[2] for k in kinds)  # deltas with removed fields
        states = [n.state_hash for n in rw.store.nodes_of(run.run_id)]
        assert len(set(states)) == len(states)
    finally:
        rw.store.close()


def test_a_run_is_finished_in_the_commit_of_its_last_rows_and_failed_if_that_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last rows and the finished run row share one transaction: when it fails, neither
    is written, and the run is then finished ``failed`` with the reason on its own."""
    from rewind.errors import StoreError
    from rewind.recorder import Recorder
    from rewind.replay import Rewind
    from tests import pipelines

    # Only the finishing commit may write node rows: under load the deadline flusher, the
    # in-hook commit and a node-start mark's flush committed the earlier nodes first (all
    # three rows were stored once), which is correct but not what this test proves.
    monkeypatch.setattr("rewind.recorder._FLUSHER.schedule", lambda due, recorder: None)
    defaults = dict(Recorder.__init__.__kwdefaults__ or {}, flush_interval_ms=1e9)
    monkeypatch.setattr(Recorder.__init__, "__kwdefaults__", defaults)
    monkeypatch.setattr("rewind.progress.node_started", lambda *args, **kwargs: None)
    rw = Rewind(tmp_path / "store")
    try:
        finishing: list[str] = []
        finish, finish_in = rw.store.finish_run, rw.store.finish_run_in

        def finish_run_in(conn: Any, run_id: str, status: str, error: str | None = None) -> None:
            if not finishing:
                finishing.append("with the last rows")
                raise StoreError("disk full", "free some space")
            finish_in(conn, run_id, status, error)

        def finish_run(run_id: str, status: str, **kwargs: Any) -> None:
            finishing.append("on its own")
            finish(run_id, status, **kwargs)

        monkeypatch.setattr(rw.store, "finish_run_in", finish_run_in)
        monkeypatch.setattr(rw.store, "finish_run", finish_run)
        run = rw.record(pipelines.pipeline, {"x": 1})
        assert finishing == ["with the last rows", "on its own"]
        assert run.status == "failed"
        assert run.error == "writing recorded nodes failed: StoreError: disk full"
        assert rw.store.nodes_of(run.run_id) == []  # the rows of that commit rolled back
        monkeypatch.undo()
        run = rw.record(pipelines.pipeline, {"x": 1})
        assert run.status == "completed" and len(rw.store.nodes_of(run.run_id)) == 3
        assert run.finished_at is not None
    finally:
        rw.store.close()


def test_progress_stops_watching_a_run_only_after_its_last_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``progress.run_ended`` waits for the progress thread, which may wait for a pooled
    connection held by writers queued on the database lock: called inside the run's last write
    transaction it deadlocks them until the busy timeout ("database is locked"). It must run
    once that transaction committed: the write lock is free then."""
    import sqlite3

    from rewind import progress
    from rewind.replay import Rewind
    from tests import pipelines

    rw = Rewind(tmp_path / "store")
    db = next((tmp_path / "store").glob("*.db"))
    lock_free: list[bool] = []
    ended = progress.run_ended

    def run_ended(run_id: str) -> None:
        # a brief writer (the progress thread) may hold the lock: wait for it, not for the
        # 30 s busy timeout a deadlock holds it
        probe = sqlite3.connect(db, timeout=10, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            lock_free.append(True)
        except sqlite3.OperationalError:
            lock_free.append(False)
        finally:
            probe.close()
        ended(run_id)

    monkeypatch.setattr(progress, "run_ended", run_ended)
    try:
        run = rw.record(pipelines.pipeline, {"x": 1})
        fork = rw.replay(run.run_id)
        assert run.status == fork.status == "completed"
        assert lock_free and all(lock_free), lock_free
    finally:
        rw.store.close()


def test_node_and_call_records_read_back_equal_records_built_through_init(
    tmp_path: Path,
) -> None:
    """``from_row`` fills the records' ``__dict__`` directly: every dataclass field is set,
    with the values ``__init__`` would store (params parsed, ``inherited`` a bool)."""
    import dataclasses

    from rewind.store.records import CallRecord, NodeRecord

    store = open_store(tmp_path / "s")
    try:
        call = CallRecord(0, "tool", "t", "k" * 64, "a" * 64, "b" * 64, "hit", "hit", 1, 2, 0.5)
        node = {
            "run_id": "r1",
            "position": 0,
            "name": "n",
            "sequence_id": 3,
            "src_app_id": "r1",
            "src_sequence_id": 3,
            "inherited": 1,
            "input_hash": "c" * 64,
            "output_hash": None,
            "state_hash": "d" * 64,
            "params_json": '{"temperature":0.5}',
            "latency_ms": 1.5,
            "prompt_tokens": 1,
            "completion_tokens": 2,
            "cache_outcome": "hit",
            "cache_reason": "hit",
            "determinism": "time-bound",
            "error": None,
            "started_at": 12.0,
        }
        with store.write() as conn:
            store.create_run(conn, run_id="r1", pipeline="p", pipeline_ref="m:p")
            store.insert_node(conn, node, [call])
            store.insert_node(conn, node | {"position": 1, "params_json": "{}"})
        got = store.nodes_of("r1")
        fields = {f.name for f in dataclasses.fields(NodeRecord)}
        for record in got:
            assert set(vars(record)) == fields
        assert set(vars(got[0].calls[0])) == {f.name for f in dataclasses.fields(CallRecord)}
        want = {k: v for k, v in node.items() if k != "params_json"} | {"inherited": True}
        assert got[0] == NodeRecord(**want, params={"temperature": 0.5}, calls=(call,))
        assert got[1] == NodeRecord(**want | {"position": 1}, params={})
        assert got[0].inherited is True and got[0].calls[0] == call
    finally:
        store.close()


def test_a_large_blob_already_stored_is_not_inserted_again(tmp_path: Path) -> None:
    """Every fork stores its graph document (~10 KB) through put_blob; a store instance that
    did not write it asks first instead of compressing and inserting it again."""
    from rewind.store.store import PUT_PROBE_MIN_BYTES

    big = b"x" * PUT_PROBE_MIN_BYTES + b"graph"
    small = b"y" * 10
    first = open_store(tmp_path / "s")
    with first.write() as conn:
        digest = first.put_blob(conn, big)
        first.put_blob(conn, small)
    first.close()
    second = open_store(tmp_path / "s")  # knows neither
    try:
        seen = _count_blob_statements(second)
        with second.write() as conn:
            assert second.put_blob(conn, big) == digest
        assert seen["insert"] == []
        with second.write() as conn:
            second.put_blob(conn, small)  # small: inserted (or ignored) without asking
            new = second.put_blob(conn, big + b"!")  # large and new: asked, then inserted
        assert seen["insert"] == [1, 1]
        assert second.get_blobs([digest, new]) == {digest: big, new: big + b"!"}
    finally:
        second.close()


def test_a_pipeline_s_edges_are_written_once_per_store_instance(tmp_path: Path) -> None:
    from rewind.replay import Rewind
    from tests import pipelines

    rw = Rewind(tmp_path / "store")
    inserts: list[str] = []

    def count(conn: object, cursor: object, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO EDGES"):
            inserts.append(statement)

    event.listen(rw.store.engine, "before_cursor_execute", count)
    rw.record(pipelines.pipeline, {"x": 5})
    rw.record(pipelines.pipeline, {"x": 7})
    assert len(inserts) == 1
    assert rw.store.edges_of(pipelines.pipeline.name) == sorted(pipelines.pipeline.edges())
    rw.store.close()
    again = Rewind(tmp_path / "store")  # another instance: writes them (idempotently) once
    if not event.contains(again.store.engine, "before_cursor_execute", count):
        event.listen(again.store.engine, "before_cursor_execute", count)
    again.record(pipelines.pipeline, {"x": 9})
    assert len(inserts) == 2
    assert again.store.edges_of(pipelines.pipeline.name) == sorted(pipelines.pipeline.edges())
