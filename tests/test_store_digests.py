"""Binary digests (migration 0011): on SQLite the busiest sha256 columns keep 32 raw bytes, and
every reader still sees 64 lowercase hex; stores written before upgrade in place keeping every
row, downgrade back, and a Rewind that predates the revision refuses the store."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import inspect, select

import rewind
from rewind.errors import StoreError
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.replay import Rewind
from rewind.store import Store, migrate, open_store, schema
from rewind.store.codec import pack, unpack
from rewind.store.retention import collect_garbage
from rewind.store.schema import DIGEST_COLUMNS, Digest, digest_bytes
from rewind.store.store import DB_FILENAME
from rewind.tracing import Tracer, chat_step, load_trace, step
from tests import pipelines
from tests.conftest import StoreTarget
from tests.model_stub import STUB_MODEL, ModelStub
from tests.older_rewind import pretend_older_rewind
from tests.revisions import load_revision

HEX64 = re.compile(r"[0-9a-f]{64}")
BLOB_SAMPLES = (
    b"7",
    b'{"messages": [{"content": "hi", "role": "user"}], "model": "m"}',
    b"".join(hashlib.sha256(b"%d" % i).digest() for i in range(13)),  # 416 random bytes: raw
    b'{"rows": [' + b", ".join(b'{"x": %d}' % i for i in range(400)) + b"]}",  # zlib, spilled
    # zd1 (a Burr run's own small documents are packed: no longer a zd1 row of their own)
    b'{"inputs":{"max_tokens":16,"messages":[{"content":"say hi","role":"system"},'
    b'{"content":"hello there","role":"user"}],"model":"m","temperature":0},"node":"draft",'
    b'"params":{}}',
)
_TOOL = step("digest_sum", "tool_call")(rewind.tool("digest_sum_numbers")(lambda n: sum(n)))


# --- the column type ------------------------------------------------------------------------
@given(st.binary(min_size=32, max_size=32))
def test_a_digest_is_stored_as_its_bytes_and_read_back_as_the_same_hex(raw: bytes) -> None:
    hex_digest = raw.hex()
    stored = digest_bytes(hex_digest)
    assert stored == raw
    assert Digest().process_result_value(stored, _dialect("sqlite")) == hex_digest


@given(st.one_of(st.text(max_size=80), st.none(), st.integers()))
def test_any_other_value_is_stored_unchanged(value: Any) -> None:
    if isinstance(value, str) and HEX64.fullmatch(value):
        return
    assert digest_bytes(value) is value


@pytest.mark.parametrize(
    "value",
    [
        "A" * 64,  # upper-case hex would come back lower-case: kept as text
        "ab " * 21 + "a",  # bytes.fromhex skips spaces
        "0" * 63,
        "0" * 66,
        "g" * 64,
        "",
    ],
)
def test_values_that_would_not_round_trip_stay_text(value: str) -> None:
    assert digest_bytes(value) == value


_HEX_DOC = st.recursive(
    st.one_of(
        st.binary(min_size=32, max_size=32).map(bytes.hex),  # a digest
        st.text(alphabet="0123456789abcdef", max_size=70),  # hex runs of any length
        st.text(max_size=20),
    ),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=6), c)),
    max_leaves=12,
)


@given(_HEX_DOC)
def test_hex1_round_trips_documents_full_of_digests(value: object) -> None:
    data = json.dumps(value, sort_keys=True).encode()
    codec, stored = pack(data)
    assert unpack(codec, stored) == data
    if codec == "hex1":
        assert len(stored) < len(data)


@given(st.binary(max_size=40), st.binary(min_size=32, max_size=32), st.binary(max_size=40))
def test_bytes_with_a_nul_are_never_hex1(head: bytes, digest: bytes, tail: bytes) -> None:
    data = head + b"\0" + digest.hex().encode() * 3 + tail
    codec, stored = pack(data)
    assert codec != "hex1"
    assert unpack(codec, stored) == data


def test_hex1_halves_a_field_map_and_refuses_cut_bytes() -> None:
    doc = json.dumps({"answer": hashlib.sha256(b"a").hexdigest()}).encode()
    codec, stored = pack(doc)
    assert codec == "hex1" and len(stored) == len(doc) - 31  # 64 hex -> NUL + 32 bytes
    with pytest.raises(ValueError, match="inside a digest"):
        unpack("hex1", stored[:-5])


def test_postgresql_binds_hex_unchanged() -> None:
    assert Digest().process_bind_param("ab" * 32, _dialect("postgresql")) == "ab" * 32


def test_the_migration_converts_the_columns_the_schema_declares() -> None:
    declared = {
        t.name: tuple(c.name for c in t.columns if isinstance(c.type, Digest))
        for t in schema.metadata.sorted_tables
    }
    assert {k: v for k, v in declared.items() if v} == DIGEST_COLUMNS
    assert _revision_0011().COLUMNS == DIGEST_COLUMNS
    declared_key_ordered = {
        t.name
        for t in schema.metadata.sorted_tables
        if t.dialect_options["sqlite"]["with_rowid"] is False
    }
    assert set(_revision_0011()._KEY_ORDERED) == KEY_ORDERED
    assert declared_key_ordered == KEY_ORDERED | _later_key_ordered()
    assert _revision_0011().SPILL_MIN_BYTES == schema.SPILL_MIN_BYTES


# --- stores: written, downgraded to 0010, upgraded again ------------------------------------
def _record(store: Store, stub: ModelStub) -> dict[str, str]:
    """A Burr run, its fork, a traced chain (LLM + tool per step) and its in-place replay."""
    rw = Rewind(store)
    run = rw.record(pipelines.pipeline, {"x": 7})
    fork = rw.fork(run.run_id, at="expand")
    with store.write() as conn:  # blobs of every storage form: raw, zd1, zlib; inline, spilled
        for data in BLOB_SAMPLES:
            store.put_blob(conn, data)
    client = ChatClient(
        Endpoint(base_url=stub.base_url, api_key="none", model=STUB_MODEL),
        retry=RetryPolicy(attempts=1),
    )
    tracer = Tracer(store, chat_client=client, raise_on_write_error=True)
    try:
        with tracer.trace("digest-agent") as trace:
            _chain()
        with tracer.replay(trace.trace_id) as replay:
            _chain()
    finally:
        client.close()
    return {
        "run": run.run_id,
        "fork": fork.run_id,
        "trace": trace.trace_id,
        "replay": replay.trace_id,
    }


def _chain() -> None:
    reply = "start"
    for i in range(4):
        messages = [{"role": "user", "content": f"step {i}: {reply}"}]
        reply = chat_step("llm", messages, model=STUB_MODEL, max_tokens=16).content
        _TOOL([len(reply), i])


BLOB_STORAGE = {"blob_data", "blob_packs", "blob_slices"}
"""Where a blob's bytes are kept, in whatever form the revision writes (a traced chain's packed
documents are stored one by one after a downgrade): compared through ``get_blobs`` instead."""


def _everything(store: Store, ids: dict[str, str]) -> dict[str, Any]:
    """What a reader sees: every row of every table (through the schema's types), each run's
    record and nodes with their calls, each trace's view, every blob's bytes."""
    out: dict[str, Any] = {}
    with store.read() as conn:
        for table in schema.metadata.sorted_tables:
            if table.name in BLOB_STORAGE:
                continue
            out[table.name] = sorted(map(repr, conn.execute(select(table)).all()))
    out["blobs"] = store.get_blobs(store.blob_digests())
    for name, run_id in ids.items():
        out[f"run {name}"] = store.get_run(run_id)
        out[f"nodes {name}"] = store.nodes_of(run_id)
    for name in ("trace", "replay"):
        view = load_trace(store, ids[name], payloads=True)
        out[f"view {name}"] = repr(view)
    return out


def _without_rowid(store: Store) -> set[str]:
    """The SQLite tables stored WITHOUT ROWID."""
    with store.read() as conn:
        rows = conn.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
        return {name for name, sql in rows if sql.rstrip().upper().endswith("WITHOUT ROWID")}


KEY_ORDERED = {"calls", "llm_cache", "tool_cache", "blobs"}


def _codecs(store: Store) -> set[str]:
    with store.read() as conn:
        return {r[0] for r in conn.execute(select(schema.blobs.c.codec))}


def _stored_types(store: Store) -> set[str]:
    """The SQLite storage classes of the digest columns' non-null values."""
    found: set[str] = set()
    with store.read() as conn:
        tables = set(inspect(conn).get_table_names())
        for table, columns in DIGEST_COLUMNS.items():
            if table not in tables:  # blob_data, below 0011
                continue
            for col in columns:
                rows = conn.exec_driver_sql(
                    f"SELECT DISTINCT typeof({col}), length({col}) FROM {table} "
                    f"WHERE {col} IS NOT NULL AND {col} != ''"
                )
                found.update(f"{kind}{size}" for kind, size in rows)
    return found


def test_a_store_written_at_0010_upgrades_keeping_every_run(store_target: StoreTarget) -> None:
    from alembic import command

    store = store_target.open()
    with ModelStub() as stub:
        ids = _record(store, stub)
        requests = stub.count
    try:
        written = _everything(store, ids)
        sqlite = store.engine.dialect.name == "sqlite"
        if sqlite:
            assert _stored_types(store) == {"blob32"}
            assert _without_rowid(store) == KEY_ORDERED | _later_key_ordered()
            assert _codecs(store) >= {"raw", "zd1", "x-raw", "x-zlib", "hex1"}
        assert "hex1" in _codecs(store)
        with store.write() as conn:
            command.downgrade(migrate._config(conn), "0010")  # type: ignore[arg-type]
            assert migrate.current_revision(conn) == "0010"
        if sqlite:  # what Rewind wrote at 0010: hex text
            assert _stored_types(store) == {"text64"}
            assert _without_rowid(store) == set()
            assert _codecs(store) >= {"raw", "zd1", "zlib"}
            assert not any(c.startswith("x-") for c in _codecs(store))
        assert "hex1" not in _codecs(store)  # a codec 0010 does not know: stored raw
        with store.read() as conn:
            assert "blob_data" not in inspect(conn).get_table_names()
    finally:
        store.close()
    store = store_target.open()  # a newer Rewind opening a 0010 store upgrades it
    try:
        with store.read() as conn:
            assert migrate.current_revision(conn) == migrate.HEAD
        if sqlite:
            assert _stored_types(store) == {"blob32"}
            assert _without_rowid(store) == KEY_ORDERED | _later_key_ordered()
            assert _codecs(store) >= {"raw", "zd1", "x-raw", "x-zlib"}
        assert _everything(store, ids) == written
        # And the upgraded store keeps working: an unchanged fork and a trace replay are served
        # from what it holds (no request reaches the model).
        with ModelStub() as stub:
            rw = Rewind(store)
            again = rw.fork(ids["run"], at="expand")
            replayed = [n for n in rw.store.nodes_of(again.run_id) if not n.inherited]
            assert replayed and all(n.cache_outcome == "hit" for n in replayed)
            client = ChatClient(
                Endpoint(base_url=stub.base_url, api_key="none", model=STUB_MODEL),
                retry=RetryPolicy(attempts=1),
            )
            tracer = Tracer(store, chat_client=client, raise_on_write_error=True)
            with tracer.replay(ids["trace"]):
                _chain()
            client.close()
            assert stub.count == 0
    finally:
        store.close()
    assert requests == 4  # the recording; its replay was served in place


def test_immutability_triggers_are_back_after_the_upgrade(tmp_path: Path) -> None:
    from alembic import command

    store = open_store(tmp_path)
    rw = Rewind(store)
    run = rw.record(pipelines.pipeline, {"x": 7})
    with store.write() as conn:
        command.downgrade(migrate._config(conn), "0010")  # type: ignore[arg-type]
    store.close()
    open_store(tmp_path).close()
    with contextlib.closing(sqlite3.connect(tmp_path / DB_FILENAME)) as conn:
        triggers = {
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")
        }
        assert {"nodes_immutable_update", "calls_immutable_update"} <= triggers
        with pytest.raises(sqlite3.DatabaseError, match="immutable"):
            conn.execute("UPDATE nodes SET output_hash = NULL WHERE run_id = ?", (run.run_id,))
        # calls was rebuilt WITHOUT ROWID: its trigger came along
        with pytest.raises(sqlite3.DatabaseError, match="immutable"):
            conn.execute("UPDATE calls SET outcome = 'hit' WHERE run_id = ?", (run.run_id,))


def test_long_packed_bytes_live_in_blob_data_and_go_with_their_blob(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        with store.write() as conn:
            digests = [store.put_blob(conn, data) for data in BLOB_SAMPLES]
        assert store.get_blobs(digests) == dict(zip(digests, BLOB_SAMPLES, strict=True))
        b, d = schema.blobs, schema.blob_data
        with store.read() as conn:
            rows = {r.hash: r for r in conn.execute(select(b.c.hash, b.c.codec, b.c.data))}
            spilled = {r.hash: r.data for r in conn.execute(select(d.c.hash, d.c.data))}
        assert set(spilled) == {digests[2], digests[3]}
        assert {rows[h].codec for h in spilled} == {"x-raw", "x-zlib"}
        assert all(rows[h].data == b"" for h in spilled)
        assert all(len(rows[h].data) < schema.SPILL_MIN_BYTES for h in digests)
        # Nothing names these blobs: a gc deletes them, spilled bytes included.
        report = collect_garbage(store, 0)
        assert report.blobs_deleted == len(BLOB_SAMPLES)
        with store.read() as conn:
            assert conn.execute(select(d.c.hash)).all() == []
        # A spilled blob whose bytes are gone is reported missing, not read as empty.
        with store.write() as conn:
            digest = store.put_blob(conn, BLOB_SAMPLES[2])
            conn.execute(d.delete())
        with pytest.raises(StoreError, match="missing"):
            store.get_blob(digest)
    finally:
        store.close()


def test_a_rewind_that_predates_0011_refuses_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(tmp_path / "store")
    Rewind(store).record(pipelines.pipeline, {"x": 7})
    store.close()
    head = migrate.HEAD  # the store's revision
    pretend_older_rewind(monkeypatch, tmp_path, last="0010")
    with pytest.raises(StoreError, match=f"revision {head}, unknown to this Rewind") as info:
        open_store(tmp_path / "store")
    assert "upgrade Rewind" in info.value.hint


# --- helpers ----------------------------------------------------------------------------------
def _dialect(name: str) -> Any:
    from sqlalchemy.dialects import postgresql, sqlite

    return {"sqlite": sqlite.dialect(), "postgresql": postgresql.dialect()}[name]


def _revision_0011() -> Any:
    return load_revision("0011")


def _later_key_ordered() -> set[str]:
    """Tables revisions 0012 and 0015 rebuild WITHOUT ROWID (tests/test_store_lean_traces.py,
    tests/test_store_key_ordered_nodes.py) and 0016 creates so (tests/test_blob_slices.py)."""
    return {t for n in ("0012", "0015", "0016") for t in load_revision(n).KEY_ORDERED}
