"""Migration 0013: a node or call row's usual ``determinism`` (``deterministic``) and a node
row's own run id as its ``src_app_id`` are stored as ``''`` on SQLite; every reader sees the
same values as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import insert, select, text

import rewind
from rewind.errors import StoreError
from rewind.store import Store, migrate, open_store, schema
from rewind.store.references import load_rows
from rewind.tracing import Tracer, load_trace, step
from tests.conftest import StoreTarget
from tests.older_rewind import pretend_older_rewind
from tests.revisions import load_revision

_add = step("add", "tool_call")(rewind.tool("usual_add")(lambda a, b: a + b))
_clock = step("clock", "tool_call")(
    rewind.tool("usual_clock", determinism="time-bound", ttl_s=60.0)(lambda n: n * 2)
)


def _record(store: Store) -> str:
    """A trace of two steps: a deterministic tool call, then a time-bound one."""
    tracer = Tracer(store, raise_on_write_error=True)
    with tracer.trace("usual") as trace:
        _clock(_add(1, 2))
    return trace.trace_id


def _stored(store: Store, table: str, run_id: str) -> list[Any]:
    """The ``determinism`` values of the run's rows of ``table`` as stored (raw SQL)."""
    with store.read() as conn:
        rows = conn.execute(
            text(f"SELECT determinism FROM {table} WHERE run_id = :r ORDER BY position"),
            {"r": run_id},
        ).all()
    return [r[0] for r in rows]


def _src_apps(store: Store, run_id: str) -> list[Any]:
    """The ``src_app_id`` values of the run's node rows as stored (raw SQL)."""
    with store.read() as conn:
        rows = conn.execute(
            text("SELECT src_app_id FROM nodes WHERE run_id = :r ORDER BY position"),
            {"r": run_id},
        ).all()
    return [r[0] for r in rows]


def _seen(store: Store, run_id: str) -> dict[str, Any]:
    """What readers see: the trace view, the run's records and its raw rows (references)."""
    with store.read() as conn:
        rows = load_rows(conn, run_id)
    return {
        "view": repr(load_trace(store, run_id, payloads=True)),
        "nodes": [(n.position, n.determinism) for n in store.nodes_of(run_id)],
        "calls": [(n.position, c.determinism) for n in store.nodes_of(run_id) for c in n.calls],
        "src": [(n.src_app_id, n.src_sequence_id) for n in store.nodes_of(run_id)],
        "state": [store.load_state_row("", run_id, seq) for seq in (0, 1, None)],
        "src rows": [n["src_app_id"] for n in rows.nodes],
        "rows": [n["determinism"] for n in rows.nodes]
        + [c["determinism"] for p in sorted(rows.calls) for c in rows.calls[p]],
    }


def test_the_usual_determinism_is_stored_empty_on_sqlite_and_read_back(
    store_target: StoreTarget,
) -> None:
    store = store_target.open()
    try:
        trace_id = _record(store)
        seen = _seen(store, trace_id)
        assert seen["calls"] == [(0, "deterministic"), (1, "time-bound")]
        assert seen["rows"] == ["deterministic", "time-bound"] * 2
        usual = "" if store_target.backend == "sqlite" else "deterministic"
        assert _stored(store, "calls", trace_id) == [usual, "time-bound"]
        assert _stored(store, "nodes", trace_id)[0] == usual
        own = "" if store_target.backend == "sqlite" else trace_id
        assert _src_apps(store, trace_id) == [own, own]
        assert seen["src"] == [(trace_id, 0), (trace_id, 1)]
        assert seen["src rows"] == [trace_id, trace_id]
        assert seen["state"][2] is not None and seen["state"][2]["sequence_id"] == 1
        with store.read() as conn:  # a Core filter binds the usual value as it is stored
            t = schema.calls
            found = conn.execute(
                select(t.c.position).where(
                    t.c.run_id == trace_id, t.c.determinism == "deterministic"
                )
            ).all()
        assert [r[0] for r in found] == [0]
    finally:
        store.close()


def test_a_core_insert_stores_what_the_bulk_insert_stores(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store")
    try:
        trace_id = _record(store)
        calls = [(n.position, c) for n in store.nodes_of(trace_id) for c in n.calls]
        with store.write() as conn:
            rows = [
                {
                    **{k: getattr(c, k) for k in ("call_index", "kind", "name")},
                    "run_id": "copy",
                    "position": position,
                    "key": c.key,
                    "request_hash": c.request_hash,
                    "result_hash": c.result_hash,
                    "outcome": c.outcome,
                    "determinism": c.determinism,
                }
                for position, c in calls
            ]
            conn.execute(insert(schema.calls), rows)
        assert _stored(store, "calls", "copy") == _stored(store, "calls", trace_id)
    finally:
        store.close()


def test_a_0012_store_upgrades_to_empty_usual_values_and_downgrades_back(
    store_target: StoreTarget,
) -> None:
    from alembic import command

    store = store_target.open()
    try:
        trace_id = _record(store)
        seen = _seen(store, trace_id)
        with store.write() as conn:
            command.downgrade(migrate._config(conn), "0012")  # type: ignore[arg-type]
            assert migrate.current_revision(conn) == "0012"
        assert _stored(store, "calls", trace_id) == ["deterministic", "time-bound"]
        assert _stored(store, "nodes", trace_id)[0] == "deterministic"
        assert _src_apps(store, trace_id) == [trace_id, trace_id]
        assert _seen(store, trace_id) == seen  # the way 0012 stores it reads the same
    finally:
        store.close()
    store = store_target.open()  # a newer Rewind opening a 0012 store upgrades it
    try:
        with store.read() as conn:
            assert migrate.current_revision(conn) == migrate.HEAD
        usual = "" if store_target.backend == "sqlite" else "deterministic"
        assert _stored(store, "calls", trace_id) == [usual, "time-bound"]
        own = "" if store_target.backend == "sqlite" else trace_id
        assert _src_apps(store, trace_id) == [own, own]
        assert _seen(store, trace_id) == seen
        if store_target.backend == "sqlite":  # the immutability triggers are back
            with store.read() as conn:
                triggers = {
                    r[0]
                    for r in conn.exec_driver_sql(
                        "SELECT name FROM sqlite_master WHERE type = 'trigger'"
                    )
                }
            assert {"nodes_immutable_update", "calls_immutable_update"} <= triggers
    finally:
        store.close()


def test_a_rewind_that_predates_0013_refuses_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "store")
    _record(store)
    store.close()
    head = migrate.HEAD
    pretend_older_rewind(monkeypatch, tmp_path, last="0012")
    with pytest.raises(StoreError, match=f"revision {head}, unknown to this Rewind"):
        open_store(tmp_path / "store")


def test_the_migration_rewrites_the_columns_the_schema_types_usual() -> None:
    assert load_revision("0013").COLUMNS == schema.USUAL_COLUMNS
    typed = {
        t.name: {c.name: c.type.usual for c in t.columns if isinstance(c.type, schema.Usual)}
        for t in schema.metadata.sorted_tables
    }
    assert {k: v for k, v in typed.items() if v} == schema.USUAL_COLUMNS


def test_a_fork_of_a_fork_keeps_the_app_ids_its_inherited_rows_name(tmp_path: Path) -> None:
    from rewind.replay import ParamOverride, Rewind
    from tests import pipelines

    store = open_store(tmp_path / "store")
    try:
        rw = Rewind(store)
        parent = rw.record(pipelines.pipeline, {"x": 5})
        fork = rw.fork(parent.run_id, at=1, override=ParamOverride("expand", "factor", 3))
        again = rw.fork(fork.run_id, at=2)
        for run_id in (parent.run_id, fork.run_id, again.run_id):
            nodes = store.nodes_of(run_id)
            # stored "" exactly where the row's source app is its own run
            assert _src_apps(store, run_id) == [
                "" if n.src_app_id == run_id else n.src_app_id for n in nodes
            ]
        first = store.nodes_of(again.run_id)[0]  # inherited: names the run it came from
        assert first.inherited and first.src_app_id == fork.run_id
        assert _src_apps(store, again.run_id)[0] == fork.run_id
        assert [n.output_hash for n in store.nodes_of(again.run_id)] == [
            n.output_hash for n in store.nodes_of(fork.run_id)
        ]
    finally:
        store.close()
