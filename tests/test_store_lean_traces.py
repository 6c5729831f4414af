"""Lean traces (migration 0012): a trace stores no state row for a completed step (the step's
state document says the same; Store.load_state_row derives the row), stores written before
upgrade in place losing only those rows, downgrade writes them back, and on SQLite the small
tables keep their rows in their key's b-tree (WITHOUT ROWID)."""

from __future__ import annotations

import contextlib
import json
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import inspect, select
from sqlalchemy.exc import DatabaseError

import rewind
from rewind.canonical import sha256_hex
from rewind.errors import StoreError
from rewind.replay import Rewind
from rewind.store import Store, codec, migrate, open_store, schema, spans
from rewind.store.retention import collect_garbage
from rewind.store.store import WriteBatch, state_row
from rewind.tracing import Tracer, load_trace, step
from rewind.tracing.store import count_traces, state_at, stored_span_ids
from tests import pipelines
from tests.conftest import StoreTarget
from tests.older_rewind import pretend_older_rewind
from tests.revisions import load_revision

LEAN_KEY_ORDERED = {"spans", "meta", "edges", "artifacts", "run_graphs", "audits", "users"}


def _sum(total: int, n: int) -> int:
    return total + n


_add = step("add", "tool_call")(rewind.tool("lean_add")(_sum))  # a step with a tool call


@step("refuse", "tool_call")
def _refuse(n: int) -> int:
    raise ValueError(f"refused {n}")


def _record(store: Store) -> str:
    """A trace of 6 steps: two completed, two failed in a row, two completed."""
    tracer = Tracer(store, raise_on_write_error=True)
    with tracer.trace("lean") as trace:
        total = _add(0, 1)
        total = _add(total, 2)
        for n in (3, 4):
            with contextlib.suppress(ValueError):
                _refuse(n)
        total = _add(total, 5)
        _add(total, 6)
    return trace.trace_id


def _state_rows(store: Store, app_id: str) -> dict[int, tuple[str, Any]]:
    """Sequence id → (status, stored fields_json parsed) of the app's stored state rows."""
    t = schema.burr_state
    with store.read() as conn:
        rows = conn.execute(
            select(t.c.sequence_id, t.c.status, t.c.fields_json).where(t.c.app_id == app_id)
        ).all()
    return {r.sequence_id: (r.status, json.loads(r.fields_json)) for r in rows}


def _seen(store: Store, trace_id: str) -> dict[str, Any]:
    """What readers see of the trace: its view, the state after every step and every step's
    state row as load_state_row gives it (fields, status, name), the latest included."""
    view = load_trace(store, trace_id, payloads=True)
    out: dict[str, Any] = {"view": repr(view)}
    for s in view.steps:
        out[f"state {s.position}"] = state_at(store, s)
        row = store.load_state_row("", s.src_app_id, s.src_sequence_id)
        out[f"row {s.position}"] = row and (row["fields"], row["status"], row["position"])
    latest = store.load_state_row("", trace_id, None)
    out["latest"] = latest and (latest["sequence_id"], latest["fields"], latest["status"])
    return out


def _span_rows(store: Store, run_id: str) -> int:
    t = schema.spans
    with store.read() as conn:
        return len(conn.execute(select(t.c.position).where(t.c.run_id == run_id)).all())


def _without_rowid(store: Store) -> set[str]:
    with store.read() as conn:
        rows = conn.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
        return {name for name, sql in rows if sql.rstrip().upper().endswith("WITHOUT ROWID")}


def test_a_trace_stores_state_rows_only_for_failed_steps(store_target: StoreTarget) -> None:
    store = store_target.open()
    try:
        trace_id = _record(store)
        view = load_trace(store, trace_id)
        assert [s.status for s in view.steps] == ["success"] * 2 + ["failed"] * 2 + ["success"] * 2
        # the failed steps' rows hold the state before them (both: 3, the sum after step 1)
        rows = _state_rows(store, trace_id)
        assert set(rows) == {2, 3}
        assert {status for status, _ in rows.values()} == {"failed"}
        # every completed step's row is derived from its state document, with its values
        states = [state_at(store, s) for s in view.steps]
        assert [s and s.get("add") for s in states] == [1, 3, 3, 3, 8, 14]
        for s in view.steps:
            row = store.load_state_row("", trace_id, s.position)
            assert row is not None and row["position"] == s.name
            assert row["status"] == ("failed" if s.status == "failed" else "completed")
            if s.state_hash:
                doc = store.get_blob(s.state_hash)
                assert row["fields"] == json.loads(doc)
        latest = store.load_state_row("", trace_id, None)
        assert latest is not None and latest["sequence_id"] == 5 and latest["values"]["add"] == 14
        # a step that does not exist, and a Burr run (whose rows are all stored), derive nothing
        assert store.load_state_row("", trace_id, 6) is None
        run = Rewind(store).record(pipelines.pipeline, {"x": 7})
        nodes = store.nodes_of(run.run_id)
        assert set(_state_rows(store, run.run_id)) == {n.sequence_id for n in nodes}
        assert store.load_state_row("", run.run_id, 99) is None
    finally:
        store.close()


def test_a_0011_store_upgrades_dropping_derivable_rows_and_downgrades_back(
    store_target: StoreTarget,
) -> None:
    from alembic import command

    store = store_target.open()
    try:
        trace_id = _record(store)
        seen = _seen(store, trace_id)
        names = {s.position: s.name for s in load_trace(store, trace_id).steps}
        with store.write() as conn:
            command.downgrade(migrate._config(conn), "0011")  # type: ignore[arg-type]
            assert migrate.current_revision(conn) == "0011"
        rows = _state_rows(store, trace_id)
        assert set(rows) == set(range(6))  # what 0011 readers need: a row per step
        assert _span_rows(store, trace_id) == 7  # and a span row per step, the root's too
        with store.read() as conn:  # and every blob in a row of its own
            assert "blob_packs" not in inspect(conn).get_table_names()
            codecs = {r[0] for r in conn.execute(select(schema.blobs.c.codec))}
        assert not any(c.startswith("p-") for c in codecs)
        if store.engine.dialect.name == "sqlite":
            assert not (LEAN_KEY_ORDERED & _without_rowid(store))
        # As Rewind wrote traces at 0011: every row, consecutive ones stored as deltas (the
        # failed step at 2 as a delta of the completed step 1's row, which the upgrade drops).
        full = {}
        for seq in rows:
            loaded = store.load_state_row("", trace_id, seq, values=False)
            assert loaded is not None
            full[seq] = loaded["fields"]
        with store.write() as conn:
            conn.execute(schema.burr_state.delete().where(schema.burr_state.c.app_id == trace_id))
        store.write_batch(
            WriteBatch(
                states=[
                    state_row(
                        partition_key="",
                        app_id=trace_id,
                        sequence_id=seq,
                        position=names[seq],
                        status=rows[seq][0],
                        fields=full[seq],
                        internal={},
                    )
                    for seq in sorted(full)
                ]
            )
        )
        stored = _state_rows(store, trace_id)
        assert isinstance(stored[2][1], list) and stored[2][1][0] == 1  # a delta of row 1
    finally:
        store.close()
    store = store_target.open()  # a newer Rewind opening a 0011 store upgrades it
    try:
        with store.read() as conn:
            assert migrate.current_revision(conn) == migrate.HEAD
        rows = _state_rows(store, trace_id)
        assert set(rows) == {2, 3}
        assert rows[2][1] == full[2]  # no longer a delta of a row that went: its full map
        assert isinstance(rows[3][1], list) and rows[3][1][0] == 2  # its base stayed
        assert _seen(store, trace_id) == seen
        assert _span_rows(store, trace_id) == 1  # step span rows packed again
        if store.engine.dialect.name == "sqlite":
            assert _without_rowid(store) >= LEAN_KEY_ORDERED
    finally:
        store.close()


def test_a_new_store_is_key_ordered_and_keeps_the_nodes_delete_trigger(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        assert _without_rowid(store) >= LEAN_KEY_ORDERED
        with store.read() as conn:
            names = {
                r[0]
                for r in conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type='index'")
            }
        assert not {f"sqlite_autoindex_{t}_1" for t in LEAN_KEY_ORDERED} & names
        run = Rewind(store).record(pipelines.pipeline, {"x": 7})
        with pytest.raises(DatabaseError, match="immutable"), store.write() as conn:
            conn.execute(schema.nodes.delete().where(schema.nodes.c.run_id == run.run_id))
    finally:
        store.close()


def test_a_rewind_that_predates_0012_refuses_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "store")
    _record(store)
    store.close()
    head = migrate.HEAD  # the store's revision
    pretend_older_rewind(monkeypatch, tmp_path, last="0011")
    with pytest.raises(StoreError, match=f"revision {head}, unknown to this Rewind"):
        open_store(tmp_path / "store")


def test_step_spans_are_packed_into_the_root_row_and_read_back_as_written(
    store_target: StoreTarget,
) -> None:
    store = store_target.open()
    try:
        trace_id = _record(store)
        assert _span_rows(store, trace_id) == 1  # the root, carrying the six step spans
        view = load_trace(store, trace_id)
        assert [s.position for s in view.steps] == list(range(6))
        assert [s.error_message for s in view.steps][2:4] == ["refused 3", "refused 4"]
        assert all(len(s.span_id or "") == 16 for s in view.steps)
        assert stored_span_ids(store, trace_id) == {view.span_id, *(s.span_id for s in view.steps)}
        assert count_traces(store)["step_spans"] == 6
    finally:
        store.close()


SPAN_VALUES = st.fixed_dictionaries(
    {
        "span_id": st.text(min_size=1, max_size=16),
        "parent_position": st.none() | st.integers(-1, 10**6),
        "step_type": st.sampled_from(["llm_call", "tool_call", "chain"]),
        "status": st.sampled_from(["success", "failed", "skipped"]),
        "error_type": st.none() | st.text(max_size=20),
        "error_message": st.none() | st.text(max_size=200),
        "attributes_json": st.text(max_size=100),
        "started_at": st.none() | st.floats(allow_nan=False),
        "ended_at": st.none() | st.floats(allow_nan=False),
        "duration_ms": st.floats(allow_nan=False),
    }
)


@given(st.lists(SPAN_VALUES, min_size=1, max_size=8))
def test_a_pack_gives_back_every_row_exactly(values: list[dict[str, Any]]) -> None:
    steps = [{"run_id": "r", "position": i, **v, "output_hash": None} for i, v in enumerate(values)]
    root = {"run_id": "r", "position": -1, "span_id": "root", "output_hash": "h"}
    (stored,) = spans.pack_rows([*reversed(steps), root])
    back = spans.expand(dict(stored))
    assert back[0] == root and back[1:] == steps
    for got, want in zip(back[1:], steps, strict=True):  # -0.0 stays -0.0, ints stay ints
        assert {k: (type(v), repr(v)) for k, v in got.items()} == {
            k: (type(v), repr(v)) for k, v in want.items()
        }


def test_rows_the_table_would_refuse_are_not_packed() -> None:
    root = {"run_id": "r", "position": -1, "span_id": "root"}
    good = {"run_id": "r", "position": 0, "span_id": "a", "step_type": "chain", "status": "ok"}
    good |= {"attributes_json": "{}", "duration_ms": 0.0}
    for bad in (good | {"span_id": None}, good | {"status": None}):
        rows = spans.pack_rows([root, good | {"position": 1}, bad])
        assert len(rows) == 3 and all(r["steps"] is None for r in rows)
    twice = spans.pack_rows([root, good, dict(good)])  # the same position twice
    assert len(twice) == 3
    with pytest.raises(ValueError, match="damaged"):
        spans.unpack_steps("r", b"not a pack")


def test_the_migration_packs_with_the_columns_of_pack_version_1() -> None:
    assert load_revision("0012")._STEP_COLUMNS == spans.STEP_COLUMNS and spans.PACK_VERSION == 1


# --- packs: a traced chain's documents in one compressed row -----------------------------------
def _pack_rows(store: Store) -> dict[str, Any]:
    """The blobs' codecs and pack ids (None: not packed) by hash, and how many packs exist:
    ``blobs`` rows and ``blob_slices`` rows (migration 0016; hashed from their packs' bytes)."""
    b, p, s = schema.blobs, schema.blob_packs, schema.blob_slices
    with store.read() as conn:
        rows = conn.execute(select(b.c.hash, b.c.codec, b.c.data)).all()
        packs = dict(conn.execute(select(p.c.id, p.c.data)).all())
        slices = conn.execute(select(s.c.key, s.c.ref)).all()
    codecs = {r.hash: r.codec for r in rows}
    pack_of = {
        r.hash: codec.read_pack_ref(r.data)[0] if r.codec.startswith("p-") else None for r in rows
    }
    for key, ref in slices:
        kind, pack_id, offset, length, _size = codec.read_slice_ref(ref)
        digest = sha256_hex(
            codec.unpack_slice(kind, zlib.decompress(packs[pack_id]), offset, length)
        )
        assert digest.startswith(key.hex())
        codecs[digest], pack_of[digest] = kind, pack_id
    return {"codecs": codecs, "pack_of": pack_of, "packs": len(packs)}


def test_a_traces_documents_and_its_call_payloads_are_two_packs(
    store_target: StoreTarget,
) -> None:
    store = store_target.open()
    try:
        trace_id = _record(store)
        found = _pack_rows(store)
        nodes = store.nodes_of(trace_id)
        documents = {h for n in nodes for h in (n.input_hash, n.output_hash, n.state_hash) if h}
        payloads = {h for n in nodes for c in n.calls for h in (c.request_hash, c.result_hash)}
        payloads.discard(None)
        assert documents and payloads
        if store.engine.dialect.name == "sqlite":
            assert found["packs"] == 2
            assert {found["codecs"][h] for h in documents | payloads} <= {"p-raw", "p-hex1"}
            (doc_pack,) = {found["pack_of"][h] for h in documents - payloads}
            (payload_pack,) = {found["pack_of"][h] for h in payloads - documents}
            assert doc_pack != payload_pack
        else:  # PostgreSQL keeps every blob in its own row
            assert found["packs"] == 0
            assert not any(c.startswith("p-") for c in found["codecs"].values())
        blobs = store.get_blobs(documents | payloads)
        assert all(sha256_hex(data) == h for h, data in blobs.items())
    finally:
        store.close()


def test_a_damaged_pack_is_reported_not_read_as_other_bytes(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        trace_id = _record(store)
        digest = store.nodes_of(trace_id)[0].input_hash
        p = schema.blob_packs
        pack_id = _pack_rows(store)["pack_of"][digest]
        this = p.c.id == pack_id
        with store.read() as conn:
            data = conn.execute(select(p.c.data).where(this)).scalar_one()
        _codec, _pack, offset, _length = store.pack_refs([digest])[digest]
        plain = bytearray(zlib.decompress(data))
        plain[offset + 1] ^= 1  # one bit of the blob's slice, the pack still decompresses
        with store.write() as conn:
            conn.execute(p.update().where(this).values(data=zlib.compress(bytes(plain))))
        with pytest.raises(StoreError, match="does not match its hash"):
            store.get_blobs([digest])
        with store.write() as conn:
            conn.execute(p.update().where(this).values(data=b"not zlib"))
        with pytest.raises(StoreError, match=f"pack {pack_id} cannot be unpacked"):
            store.get_blobs([digest])
        with store.write() as conn:  # as gc deletes packs (0016's trigger refuses others)
            conn.execute(schema.meta.insert().values(key="pack_sweep", value="1"))
            conn.execute(p.delete().where(this))
            conn.execute(schema.meta.delete().where(schema.meta.c.key == "pack_sweep"))
        with pytest.raises(StoreError, match="missing"):
            store.get_blobs([digest])
    finally:
        store.close()


def test_gc_deletes_a_pack_once_no_blob_row_names_it(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        kept = _record(store)
        orphans = {sha256_hex(b"orphan %d" % i): b"orphan %d" % i for i in range(3)}
        store.write_batch(WriteBatch(blobs=dict(orphans), packs=[set(orphans)]))
        assert _pack_rows(store)["packs"] == 3
        report = collect_garbage(store, 10.0**9)  # nothing is that old: only blobs go
        assert report.blobs_deleted == 3
        found = _pack_rows(store)
        assert found["packs"] == 2 and not orphans.keys() & found["codecs"].keys()
        assert load_trace(store, kept).steps[0].name == "add"
    finally:
        store.close()


@given(st.integers(0, 2**40), st.integers(0, 2**31), st.integers(0, 2**20))
def test_a_pack_reference_round_trips(pack_id: int, offset: int, length: int) -> None:
    assert codec.read_pack_ref(codec.pack_ref(pack_id, offset, length)) == (pack_id, offset, length)


def test_pack_slices_give_back_each_blob() -> None:
    items = [b"7", b'{"a":"' + b"ab" * 32 + b'"}', b"x" * 5000, b"\0" + b"f" * 64]
    stored, slices = codec.pack_together(items)
    plain = zlib.decompress(stored)
    assert [c for c, _o, _n in slices] == ["p-raw", "p-hex1", "p-raw", "p-raw"]
    assert [codec.unpack_slice(c, plain, o, n) for c, o, n in slices] == items
    with pytest.raises(ValueError, match="outside"):
        codec.unpack_slice("p-raw", plain, len(plain), 1)
    with pytest.raises(ValueError, match="three varints"):
        codec.read_pack_ref(b"\x01\x02")


def test_blobs_already_stored_are_not_packed_again(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    trace_id = _record(store)
    nodes = store.nodes_of(trace_id)
    docs = store.get_blobs({h for n in nodes for h in (n.input_hash, n.state_hash) if h})
    before = _pack_rows(store)
    store.close()
    store = open_store(tmp_path)  # a new instance: it does not know what the store holds
    try:
        store.write_batch(WriteBatch(blobs=dict(docs), packs=[set(docs)]))
        assert _pack_rows(store) == before  # every blob was there: no pack nobody names
        new = {sha256_hex(b"new %d" % i): b"new %d" % i for i in range(3)}
        both = docs | new
        store.write_batch(WriteBatch(blobs=both, packs=[set(both)]))
        after = _pack_rows(store)
        assert after["packs"] == before["packs"] + 1
        assert len({after["pack_of"][h] for h in new}) == 1  # the new blobs, packed alone
        assert all(after["pack_of"][h] == before["pack_of"][h] for h in docs)
        assert store.get_blobs(both) == both
    finally:
        store.close()
