"""Attack 16: the changes merged for issue #13 since main (usual values stored as '' on SQLite,
prebuilt store statements, packs under a savepoint, resumed state hashes, plain writers).

Each test is a finding (xfail strict, with the reason) or a regression test of what held.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import threading
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import CompileError, DBAPIError

from rewind.canonical import canonical_bytes, sha256_hex
from rewind.errors import InvalidOverride, StoreError
from rewind.persister import FieldEncoder, encode_value, map_hash, plain_map_bytes
from rewind.recorder import _input_doc_bytes
from rewind.store import Store, open_store, schema
from rewind.store.store import WriteBatch
from tests.conftest import StoreTarget

# -- 3. the recorder's direct writers ---------------------------------------------------------

# Names that are hostile to a hand-written JSON writer or to a sort that is not JCS's.
_HOSTILE = st.sampled_from(
    [
        "a",
        "ab",
        "a b",
        "A",
        "__SEQUENCE_ID_x",
        "__x",
        'q"uote',
        "back\\slash",
        "ctl\x01",
        "tab\t",
        "nl\n",
        "del\x7f",
        "ls\u2028",
        "ps\u2029",
        "é",
        "\uffff",
        "\ue000",
        "\U0001f600",
        "\U0001f600a",
        "x" * 300,
        "",
        "/",
        "<",
    ]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["set", "del", "hash"]),
            st.one_of(_HOSTILE, st.text(max_size=6), st.from_regex(r"f[0-9]{2}", fullmatch=True)),
            st.integers(0, 3),
        ),
        max_size=80,
    )
)
def test_the_resumed_state_hash_equals_the_whole_map_hash_for_hostile_names(
    ops: list[tuple[str, str, int]],
) -> None:
    """FieldEncoder.state_hash/state_map against the whole {field: hash} map after any
    sequence of adds, changes and deletes of names JCS sorts oddly (astral, U+FFFF, prefixes,
    quotes, control characters), hashed at arbitrary steps."""
    enc = FieldEncoder()
    state: dict[str, Any] = {}
    step = 0
    for op, name, value in ops:
        if name.startswith("__") or any(0xD800 <= ord(c) <= 0xDFFF for c in name):
            continue  # Burr internals are not semantic; lone surrogates cannot be encoded
        if op == "set":
            state[name] = [value, step]
        elif op == "del":
            state.pop(name, None)
        step += 1
        enc.step({"__SEQUENCE_ID": step, **state}, recheck=list(state))
        if op != "hash":
            continue
        want = {k: encode_value(k, v).digest for k, v in state.items()}
        txt = json.dumps(want, sort_keys=True)
        assert enc.state_hash() == (sha256_hex(canonical_bytes(want)), txt)
        assert enc.state_map() == (canonical_bytes(want), txt)
    want = {k: encode_value(k, v).digest for k, v in state.items()}
    assert enc.state_hash()[0] == sha256_hex(canonical_bytes(want))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.one_of(_HOSTILE, st.text(max_size=8)), st.one_of(_HOSTILE, st.text())))
def test_plain_map_bytes_is_canonical_or_declines(values: dict[str, str]) -> None:
    data = plain_map_bytes(values)
    try:
        want = canonical_bytes(values)
    except Exception:  # a lone surrogate: the writer must decline, not invent bytes
        assert data is None
        return
    assert data is None or data == want
    assert map_hash(values) == (want, sha256_hex(want))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(_HOSTILE, st.text(max_size=10)),
    st.dictionaries(
        st.one_of(_HOSTILE, st.text(max_size=5)),
        st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
        max_size=4,
    ),
    st.sampled_from([{}, {"k": 1}, {"'": "\u2028"}]),
    st.sampled_from([{}, {"p": 0.5}]),
)
def test_a_nodes_input_doc_bytes_equal_canonical_bytes_for_hostile_names(
    name: str, reads: dict[str, str], inputs: dict[str, Any], params: dict[str, Any]
) -> None:
    action = types.SimpleNamespace(name=name, _bound_params=None)
    doc = {"node": name, "reads": reads, "inputs": inputs, "params": params}
    try:
        want = canonical_bytes(doc)
    except Exception:
        return  # a lone surrogate: refused either way
    assert _input_doc_bytes(action, reads, inputs, params) == want  # type: ignore[arg-type]


# -- 2. store hot paths -----------------------------------------------------------------------


def test_create_run_refuses_a_value_for_a_column_the_runs_table_lacks(
    store_target: StoreTarget,
) -> None:
    """main's insert(...).values(**values) refused an unknown key (a misspelt column); the
    prebuilt statement drops it silently, so a caller's value would be lost without a word."""
    store = store_target.open()
    try:
        with pytest.raises(CompileError, match="parnet_run_id"), store.write() as conn:
            store.create_run(conn, run_id="r1", pipeline="p", parnet_run_id="x")
        assert not store.run_exists("r1")
    finally:
        store.close()


def _blob_rows(store: Store, hashes: list[str]) -> dict[str, str]:
    """The codec of each of ``hashes`` that has a ``blobs`` row (a packed blob has none unless
    another blob holds its ``blob_slices`` key, migration 0016)."""
    with store.read() as conn:
        found = {
            h: conn.execute(
                text("SELECT codec FROM blobs WHERE hash = :h"), {"h": schema.digest_bytes(h)}
            ).scalar()
            for h in hashes
        }
    return {h: c for h, c in found.items() if c is not None}


def test_a_pack_naming_a_blob_stored_unpacked_before_keeps_every_blob_readable(
    tmp_path: Path,
) -> None:
    """Some of a pack's blobs are stored already (unpacked, by an earlier write this Store
    object does not know about): they keep their rows, every blob reads back, none points into
    a pack that is not there. (Since migration 0016 the pack's rows are ``blob_slices`` rows,
    which a ``blobs`` row does not collide with: the stored blobs get a slice too, read from
    their rows; Store._write_packs.)"""
    root = tmp_path / "store"
    first = open_store(root)
    blobs = {sha256_hex(b): b for b in (f"blob {i} ".encode() * 5 for i in range(12))}
    early = dict(list(blobs.items())[:5])
    try:
        batch = WriteBatch()
        batch.blobs.update(early)
        first.write_batch(batch)  # no group: unpacked rows
    finally:
        first.close()
    second = open_store(root)
    try:
        batch = WriteBatch()
        batch.blobs.update(blobs)
        batch.packs.append(set(blobs))
        second.write_batch(batch)
        codecs = _blob_rows(second, list(blobs))
        assert all(not codecs[h].startswith("p") for h in early), codecs
        assert set(second.pack_refs(blobs)) >= blobs.keys() - early.keys()
        assert second.get_blobs(list(blobs)) == blobs
        with second.read() as conn:
            packs = conn.execute(text("SELECT COUNT(*) FROM blob_packs")).scalar_one()
        assert packs == 1
    finally:
        second.close()


def test_threads_writing_the_same_packed_blobs_through_their_own_stores_lose_none(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    open_store(root).close()
    blobs = {sha256_hex(b): b for b in (f"shared {i} ".encode() * 7 for i in range(40))}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def writer(k: int) -> None:
        store = open_store(root)
        try:
            start.wait()
            for j in range(5):
                mine = {sha256_hex(b): b for b in (f"own {k} {j} {i}".encode() for i in range(6))}
                batch = WriteBatch()
                batch.blobs.update(blobs)
                batch.blobs.update(mine)
                batch.packs.append(set(blobs) | set(mine))
                store.write_batch(batch)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    store = open_store(root)
    try:
        assert store.get_blobs(list(blobs)) == blobs
        with store.read() as conn:
            n = conn.execute(text("SELECT COUNT(*) FROM blobs")).scalar_one()
            n += conn.execute(text("SELECT COUNT(*) FROM blob_slices")).scalar_one()
        assert n == len(blobs) + 4 * 5 * 6  # each blob once: a blobs or a blob_slices row
    finally:
        store.close()


def test_a_half_created_store_with_a_revision_but_no_meta_is_refused_not_crashed(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "store"
    folder.mkdir()
    db = sqlite3.connect(folder / "rewind.db")
    db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
    from rewind.store import migrate

    db.execute("INSERT INTO alembic_version VALUES (?)", (migrate.HEAD,))
    db.commit()
    db.close()
    with pytest.raises(StoreError):
        open_store(folder).close()


def test_a_store_at_a_newer_revision_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    open_store(root).close()
    db = sqlite3.connect(root / "rewind.db")
    db.execute("UPDATE alembic_version SET version_num = '9999'")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="9999"):
        open_store(root).close()


# -- 1. usual values on every backend ---------------------------------------------------------


def test_a_fork_of_a_fork_reads_the_same_on_every_backend_and_replays_unchanged(
    store_target: StoreTarget,
) -> None:
    """show/diff/fork-of-fork/replay of stored '' values (SQLite) and of values as they are
    (PostgreSQL): the same records, an unchanged replay identical with zero tokens."""
    from rewind.replay import ParamOverride, Rewind
    from tests import pipelines

    store = store_target.open()
    try:
        rw = Rewind(store)
        parent = rw.record(pipelines.pipeline, {"x": 5})
        fork = rw.fork(parent.run_id, at=1, override=ParamOverride("expand", "factor", 3))
        again = rw.fork(fork.run_id, at=2)
        for run_id in (parent.run_id, fork.run_id, again.run_id):
            for n in store.nodes_of(run_id):
                assert n.src_app_id, (run_id, n)
                assert n.determinism
                row = store.load_state_row("", n.src_app_id, n.src_sequence_id)
                assert row is not None, (run_id, n.position)
        assert [n.output_hash for n in store.nodes_of(again.run_id)] == [
            n.output_hash for n in store.nodes_of(fork.run_id)
        ]
        assert rw.diff(fork.run_id, again.run_id).first_divergence is None
        replayed = rw.replay(again.run_id, at=1)
        nodes = store.nodes_of(replayed.run_id)
        assert [n.output_hash for n in nodes] == [
            n.output_hash for n in store.nodes_of(again.run_id)
        ]
        assert sum(n.prompt_tokens + n.completion_tokens for n in nodes) == 0
        assert rw.diff(again.run_id, replayed.run_id).first_divergence is None
        assert {n.src_app_id for n in store.nodes_of(replayed.run_id) if not n.inherited} == {
            replayed.run_id
        }
    finally:
        store.close()


# -- plain writers of state rows --------------------------------------------------------------

_JSONISH = st.one_of(
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.one_of(_HOSTILE, st.text(max_size=6)),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.one_of(_HOSTILE, st.text(max_size=6)), _JSONISH, max_size=5))
def test_a_state_rows_internal_json_is_json_dumps(internal: dict[str, Any]) -> None:
    from rewind.store.store import _internal_json

    try:
        want = json.dumps(internal, sort_keys=True)
    except (TypeError, ValueError):
        return
    assert _internal_json(internal) == want


@settings(max_examples=300, deadline=None)
@given(
    st.integers(-1, 2**40),
    st.dictionaries(st.one_of(_HOSTILE, st.text(max_size=6)), st.one_of(_HOSTILE, st.text())),
    st.lists(st.one_of(_HOSTILE, st.text(max_size=6)), max_size=4),
)
def test_a_state_rows_delta_is_json_dumps(
    base: int, changed: dict[str, str], removed: list[str]
) -> None:
    from rewind.store.store import _delta_json

    assert _delta_json(base, changed, removed) == json.dumps(
        [base, changed, removed], sort_keys=True
    )


# -- opening stores ---------------------------------------------------------------------------


def test_threads_creating_the_same_new_store_at_once_all_open_it(tmp_path: Path) -> None:
    """The one-statement revision read fails on a store being created (no tables yet, or
    alembic_version without meta): every opener must fall back to the migration path."""
    root = tmp_path / "store"
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def opener() -> None:
        try:
            start.wait()
            open_store(root).close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    store = open_store(root, read_only=True)
    try:
        assert store.run_exists("nothing") is False
    finally:
        store.close()


def test_a_0012_store_holding_a_fork_of_a_fork_upgrades_with_its_triggers_and_app_ids(
    tmp_path: Path,
) -> None:
    """A store main (0012) wrote, with forks' inherited rows and a time-bound call: after the
    upgrade every reader sees the same, the inherited rows keep the run they name, and the
    immutability triggers refuse an update again."""
    from alembic import command

    from rewind.replay import ParamOverride, Rewind
    from rewind.store import migrate
    from tests import pipelines

    root = tmp_path / "store"
    store = open_store(root)
    rw = Rewind(store)
    parent = rw.record(pipelines.pipeline, {"x": 5})
    fork = rw.fork(parent.run_id, at=1, override=ParamOverride("expand", "factor", 3))
    again = rw.fork(fork.run_id, at=2)
    ids = (parent.run_id, fork.run_id, again.run_id)
    before = {r: store.nodes_of(r) for r in ids}
    with store.write() as conn:
        command.downgrade(migrate._config(conn), "0012")  # type: ignore[arg-type]
    with store.read() as conn:
        assert (
            conn.exec_driver_sql("SELECT COUNT(*) FROM nodes WHERE src_app_id = ''").scalar() == 0
        )
    store.close()
    store = open_store(root)
    try:
        assert {r: store.nodes_of(r) for r in ids} == before
        with store.read() as conn:
            inherited = conn.exec_driver_sql(
                "SELECT src_app_id FROM nodes WHERE run_id = ? AND inherited = 1",
                (again.run_id,),
            ).all()
        assert inherited and all(r[0] and r[0] != again.run_id for r in inherited)
        for update in (
            "UPDATE nodes SET src_app_id = 'x' WHERE run_id = ?",
            "UPDATE calls SET determinism = 'x' WHERE run_id = ?",
        ):
            with pytest.raises(DBAPIError, match=r"(?i)immutable"), store.write() as conn:
                conn.exec_driver_sql(update, (parent.run_id,))
        again2 = Rewind(store).replay(again.run_id, at=1)
        assert [n.output_hash for n in store.nodes_of(again2.run_id)] == [
            n.output_hash for n in before[again.run_id]
        ]
    finally:
        store.close()


def test_a_run_archived_by_gc_and_restored_reads_the_same(tmp_path: Path) -> None:
    """gc archives node rows as stored ('' values) and a restore puts them back: the records
    and a replay of the restored fork are the same."""
    from rewind.replay import ParamOverride, Rewind
    from rewind.store.retention import collect_garbage, restore_run
    from tests import pipelines

    store = open_store(tmp_path / "store")
    try:
        rw = Rewind(store)
        parent = rw.record(pipelines.pipeline, {"x": 5})
        fork = rw.fork(parent.run_id, at=1, override=ParamOverride("expand", "factor", 3))
        ids = (parent.run_id, fork.run_id)
        before = {r: store.nodes_of(r) for r in ids}
        report = collect_garbage(store, 0.0, now=10**12)
        assert set(ids) <= set(report.to_json().get("archived_runs", ids))
        assert not store.run_exists(fork.run_id)
        restore_run(store, fork.run_id)
        assert {r: store.nodes_of(r) for r in ids} == before
        again = rw.replay(fork.run_id, at=1)
        assert [n.output_hash for n in store.nodes_of(again.run_id)] == [
            n.output_hash for n in before[fork.run_id]
        ]
    finally:
        store.close()


def test_the_api_and_cli_show_a_fork_of_a_fork_the_same_before_and_after_0013(
    tmp_path: Path,
) -> None:
    """Node lists (API), show/diff (CLI) of a fork of a fork read the same from the rows as
    0012 stored them and as 0013 stores them ('' for the usual values)."""
    from alembic import command
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from rewind.api import create_app
    from rewind.cli import app as cli_app
    from rewind.replay import ParamOverride, Rewind
    from rewind.store import migrate
    from tests import pipelines

    root = tmp_path / "store"
    store = open_store(root)
    rw = Rewind(store)
    parent = rw.record(pipelines.pipeline, {"x": 5})
    fork = rw.fork(parent.run_id, at=1, override=ParamOverride("expand", "factor", 3))
    again = rw.fork(fork.run_id, at=2)
    ids = (parent.run_id, fork.run_id, again.run_id)
    store.close()

    def seen() -> dict[str, Any]:
        out: dict[str, Any] = {}
        st = open_store(root)
        try:
            with TestClient(create_app(st, chat_client=None)) as client:
                for r in ids:
                    got = client.get(f"/api/runs/{r}/nodes")
                    assert got.status_code == 200, got.text
                    out[r] = [
                        {k: v for k, v in n.items() if k in ("src_app_id", "determinism")}
                        for n in got.json()["nodes"]
                    ]
                    assert all(n["src_app_id"] for n in out[r]), out[r]
        finally:
            st.close()
        runner = CliRunner()
        for args in (["show", again.run_id], ["diff", fork.run_id, again.run_id]):
            res = runner.invoke(cli_app, ["--store", str(root), *args])
            assert res.exit_code == 0, res.output
            out[" ".join(args)] = res.output
        return out

    now = seen()
    st = open_store(root)
    with st.write() as conn:
        command.downgrade(migrate._config(conn), "0012")  # type: ignore[arg-type]
    st.close()
    # read through a store object that does not upgrade: the rows as main stored them
    st = open_store(root)  # upgrades again, from rows holding the values themselves
    st.close()
    assert seen() == now


# -- 3 again: the recorder end to end with hostile node and field names ------------------------

_ODD_FIELDS = [
    'q"uote',
    "back\\slash",
    "ls\u2028",
    "é",
    "\uffff",
    "\ue000",
    "\U0001f600",
    "ctl\x01",
    "a",
    "ab",
    "a b",
    *[f"f{i:02d}" for i in range(20)],
]


def _odd_pipeline(astral: bool) -> Any:
    from burr.core import State, action, default
    from burr.core.graph import GraphBuilder

    from rewind.replay import Pipeline

    fields = [f for f in _ODD_FIELDS if astral or f != "\U0001f600"]
    nodes: dict[str, Any] = {}
    for i, name in enumerate(['n"0', "n\\1", "n\u20282", "n3", "n4"]):
        target = fields[(7 * i + 3) % len(fields)]
        late = fields[-1 - i]

        def run(state: State, _t: str = target, _l: str = late, _i: int = i) -> State:
            return state.update(**{_t: [_i, state["seed"]], _l: {"i": _i}})

        nodes[name] = action(reads=["seed"], writes=[target, late])(run)
    names = list(nodes)
    graph = (
        GraphBuilder()
        .with_actions(**nodes)
        .with_transitions(*[(a, b, default) for a, b in itertools.pairwise(names)])
        .build()
    )
    return Pipeline(name="odd", graph=graph, entrypoint=names[0], ref="")


@pytest.mark.parametrize("astral", [False, True])
def test_recorded_documents_of_hostile_names_are_canonical_and_replay_unchanged(
    tmp_path: Path, astral: bool
) -> None:
    """Every node's input and state documents as recorded are the canonical bytes of what they
    parse to, hash to the row's hashes, and the state map is exactly the fields' hashes; an
    unchanged replay is identical and costs no tokens."""
    from rewind.replay import Rewind

    store = open_store(tmp_path / "store")
    try:
        rw = Rewind(store)
        seed = {f: f"v{j}" for j, f in enumerate(_ODD_FIELDS[:12]) if astral or f != "\U0001f600"}
        run = rw.record(_odd_pipeline(astral), {"seed": 1, **seed})
        nodes = store.nodes_of(run.run_id)
        assert len(nodes) == 5
        for n in nodes:
            data = store.get_blobs([n.input_hash])[n.input_hash]
            assert sha256_hex(data) == n.input_hash
            assert canonical_bytes(json.loads(data)) == data, data[:200]
            row = store.load_state_row("", n.src_app_id, n.src_sequence_id)
            assert row is not None
            # the state hash is the hash of the state row's {field: hash} map, canonical
            assert sha256_hex(canonical_bytes(row["fields"])) == n.state_hash
            assert set(row["fields"]) >= {"seed", *seed}
        replayed = rw.replay(run.run_id, at=1)
        again = store.nodes_of(replayed.run_id)
        assert [(n.input_hash, n.output_hash, n.state_hash) for n in again] == [
            (n.input_hash, n.output_hash, n.state_hash) for n in nodes
        ]
        assert sum(n.prompt_tokens + n.completion_tokens for n in again) == 0
    finally:
        store.close()


# -- 4. progress ------------------------------------------------------------------------------


def test_a_record_that_fails_before_it_executes_is_not_left_watched_by_the_progress_thread(
    tmp_path: Path,
) -> None:
    """The run row now counts as the first progress write (progress.run_created). A record
    that fails before it executes (state names that are not strings: refused before the row is
    written, once Burr's builder raised after it) must not leave the run in the progress
    writer's runs: its thread would read that run's cancel flag every 100 ms until the store
    closes."""
    from rewind import progress
    from rewind.replay import Rewind
    from tests import pipelines

    store = open_store(tmp_path / "store")
    try:
        with pytest.raises(InvalidOverride):
            Rewind(store).record(pipelines.pipeline, {1: 2, "x": 1})  # type: ignore[dict-item]
        watched = {r for r, m in progress._WRITER.runs.items() if m.store is store}
        assert watched == set()
    finally:
        store.close()


def test_a_record_refused_for_its_state_leaves_no_running_run(tmp_path: Path) -> None:
    from rewind.replay import Rewind
    from tests import pipelines

    store = open_store(tmp_path / "store")
    try:
        with pytest.raises(InvalidOverride, match="state field names must be strings; got 1"):
            Rewind(store).record(pipelines.pipeline, {1: 2, "x": 1})  # type: ignore[dict-item]
        with store.read() as conn:
            statuses = [r[0] for r in conn.exec_driver_sql("SELECT status FROM runs")]
        assert "running" not in statuses
    finally:
        store.close()
