"""How many bytes a recorded trace takes on disk, bounded by what it holds (never by time).

A traced chain like peerbench's (an LLM call to a loopback stub, then a tool call, per step) is
recorded into a new SQLite store; the bounds come from the content itself: the store's own empty
schema, the payload bytes SQLite reports per table (``dbstat``) and the uncompressed size of the
blobs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

import rewind
from rewind.errors import StoreError
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.store import migrate, open_store
from rewind.store.codec import (
    SLICE_KEY_BYTES,
    ZDICT_V1,
    pack,
    read_slice_ref,
    unpack,
    unpack_slice,
)
from rewind.store.engine import SQLITE_PAGE_SIZE
from rewind.store.store import STATE_DELTA_MAX_DEPTH, WriteBatch, state_row
from rewind.tracing import Tracer, chat_step, step
from tests.conftest import StoreTarget
from tests.model_stub import STUB_MODEL, ModelStub

STEPS = 40
SYSTEM = "You are a terse arithmetic agent. Reply with four numbers."


def _numbers_reply(question: str, n: int) -> str:
    return f"ack {n}: numbers {n * 7 % 997} {n * 13 % 991} {n * 31 % 983} {n * 3}"


def _sum(numbers: list[int]) -> int:
    return int(sum(numbers))


_TOOL = step("size_sum", "tool_call")(rewind.tool("size_sum_numbers")(_sum))


def _record_trace(folder: Path, stub: ModelStub) -> None:
    client = ChatClient(
        Endpoint(base_url=stub.base_url, api_key="none", model=STUB_MODEL),
        retry=RetryPolicy(attempts=1),
        send_sampling_defaults=False,
    )
    tracer = Tracer(folder, chat_client=client, raise_on_write_error=True)
    try:
        with tracer.trace("size-agent"):
            reply, total = "start", 0
            for i in range(STEPS):
                messages = [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"step {i}: tool result {total}; reply: {reply}"},
                ]
                reply = chat_step("llm", messages, model=STUB_MODEL, max_tokens=64).content
                total = _TOOL([int(x) for x in re.findall(r"\d+", reply.split(":", 1)[1])])
    finally:
        tracer.close()
        client.close()


def _files(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.iterdir() if p.is_file()}


def _dbstat(db: Path) -> tuple[int, int, dict[str, int]]:
    """(page size, page count, payload bytes per table or index) of a SQLite file."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        try:
            rows = conn.execute("SELECT name, SUM(payload) FROM dbstat GROUP BY name").fetchall()
        except sqlite3.OperationalError:
            pytest.skip("this SQLite has no dbstat virtual table")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
    return page_size, pages, {name: int(payload or 0) for name, payload in rows}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(folder of a store holding one STEPS-step trace, folder of an empty store)."""
    empty = tmp_path_factory.mktemp("empty")
    open_store(empty).close()
    folder = tmp_path_factory.mktemp("trace")
    with ModelStub(reply=_numbers_reply) as stub:
        _record_trace(folder, stub)
        assert stub.count == STEPS
    return folder, empty


def test_a_new_store_uses_small_pages_and_its_empty_schema_stays_small(
    recorded: tuple[Path, Path],
) -> None:
    _folder, empty = recorded
    page_size, pages, _payload = _dbstat(empty / "rewind.db")
    assert page_size == SQLITE_PAGE_SIZE == 1024
    # One page per table and index (~45 with the schema's own pages): at 4 KiB pages the empty
    # schema alone was ~180 KB, larger than the whole recording of the smallest peer.
    assert sum(_files(empty).values()) == pages * page_size <= 64 * 1024


def test_a_recorded_trace_leaves_no_wal_and_its_pages_are_mostly_payload(
    recorded: tuple[Path, Path],
) -> None:
    folder, empty = recorded
    files = _files(folder)
    assert set(files) <= {"rewind.db", "rewind.db-wal", "rewind.db-shm"}
    assert files.get("rewind.db-wal", 0) == 0, "the WAL was not folded into the database"
    page_size, pages, payload = _dbstat(folder / "rewind.db")
    empty_bytes = _files(empty)["rewind.db"]
    content = sum(payload.values())
    # Bytes beyond the empty schema are at most 1.5x the rows' payload: no half-empty pages
    # per step, no free pages left behind.
    assert pages * page_size - empty_bytes <= 1.5 * content
    # And the payload itself is bounded per step by what a step holds: two node rows, two call
    # rows, two state rows, two spans, two cache entries and ~11 blobs (hashes kept as 32 bytes
    # on SQLite, migration 0011; measured ~3.3 KB a step, 5.5 KB with 64-hex hashes).
    assert content <= STEPS * 4 * 1024


def test_chat_blobs_are_stored_compressed(recorded: tuple[Path, Path]) -> None:
    folder, _empty = recorded
    with contextlib.closing(sqlite3.connect(folder / "rewind.db")) as conn:
        stored = conn.execute(
            "SELECT b.hash, b.size, b.codec, coalesce(d.data, b.data) FROM blobs b"
            " LEFT JOIN blob_data d ON d.hash = b.hash"  # long packed bytes (codec x-...)
        ).fetchall()
        packs = [bytes(d) for (d,) in conn.execute("SELECT data FROM blob_packs")]
        pack_ids = [i for (i,) in conn.execute("SELECT id FROM blob_packs")]
        slices = [(bytes(k), bytes(r)) for k, r in conn.execute("SELECT key, ref FROM blob_slices")]
        payloads = {
            h
            for row in conn.execute("SELECT request_hash, result_hash FROM calls")
            for h in row
            if h is not None
        }
    # Hashes are kept as their 32 bytes (migration 0011), read back as hex by the store.
    assert all(type(h) is bytes and len(h) == 32 for h, _s, _c, _d in stored)
    rows = [(h.hex(), size, codec, data) for h, size, codec, data in stored]
    # A packed blob is a blob_slices row (migration 0016: the first bytes of its hash and a
    # reference to its slice); its bytes are in a pack.
    plain = [zlib.decompress(p) for p in packs]
    by_id = dict(zip(pack_ids, plain, strict=True))
    for key, ref in slices:
        codec, pack_id, offset, length, size = read_slice_ref(ref)
        data = unpack_slice(codec, by_id[pack_id], offset, length)
        assert hashlib.sha256(data).digest().startswith(key) and len(key) == SLICE_KEY_BYTES
        rows.append((hashlib.sha256(data).hexdigest(), size, codec, ref))
    raw_total = sum(size for _h, size, _c, _d in rows)
    stored_total = (
        sum(len(data) for _h, _s, _c, data in rows)
        + len(slices) * SLICE_KEY_BYTES
        + sum(len(p) for p in packs)
    )
    # A trace's documents and its calls' requests and answers are two zlib packs (migration
    # 0012): every chat payload is a slice of one, and every pack is zlib-compressed.
    codec_of = {h: codec for h, _s, codec, _d in rows}
    assert payloads and {codec_of[h.hex()] for h in payloads} <= {"p-raw", "p-hex1"}
    assert len(packs) == 2
    assert sum(map(len, packs)) <= 0.3 * sum(map(len, plain))  # measured ~13%
    # Requests, responses and node documents of a chat loop share most of their bytes: stored
    # (pack references and packs) at most 25% of their size (measured ~15%; zd1 one by one: ~51%).
    assert stored_total <= 0.25 * raw_total
    # Every blob reads back through the store as the bytes its hash names.
    store = open_store(folder, read_only=True)
    try:
        blobs = store.get_blobs([h for h, _s, _c, _d in rows])
    finally:
        store.close()
    assert all(hashlib.sha256(data).hexdigest() == h for h, data in blobs.items())
    assert all(len(blobs[h]) == size for h, size, _c, _d in rows)


def test_the_zd1_dictionary_is_frozen() -> None:
    # Stored zd1 blobs decode only with these exact bytes: a new dictionary needs a new codec.
    assert hashlib.sha256(ZDICT_V1).hexdigest() == (
        "f69487298d339e656c51870aab4efa098a2712b616edc2c30a0ce70a35c9ce53"
    )


@given(st.binary(max_size=3000))
def test_pack_round_trips_any_bytes(data: bytes) -> None:
    codec, stored = pack(data)
    assert codec in {"raw", "zlib", "zd1"}
    assert len(stored) <= len(data)
    assert unpack(codec, stored) == data


@given(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=40)),
        lambda c: st.one_of(st.lists(c, max_size=5), st.dictionaries(st.text(max_size=8), c)),
        max_leaves=30,
    )
)
def test_pack_round_trips_json_documents(value: object) -> None:
    data = json.dumps(value, sort_keys=True).encode()
    assert unpack(*pack(data)) == data


def test_unknown_codec_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown blob codec 'zd9'"):
        unpack("zd9", b"x")


def test_a_store_made_with_4k_pages_keeps_them_and_records(tmp_path: Path) -> None:
    db = tmp_path / "rewind.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA page_size=4096")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE placeholder (x)")
        conn.execute("DROP TABLE placeholder")
    store = open_store(tmp_path)
    try:
        with store.write() as conn:
            digest = store.put_json(conn, {"messages": [{"content": "hi", "role": "user"}] * 9})
        assert json.loads(store.get_blob(digest))["messages"][0]["content"] == "hi"
    finally:
        store.close()
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    assert os.path.getsize(db) % 4096 == 0


# --- Burr state rows: stored as deltas, loaded whole ------------------------------------------


def _state_rows(app_id: str, steps: int, fields: int = 20) -> list[dict[str, object]]:
    """State rows of an app that rewrites one of ``fields`` fields per step and, at step 5,
    removes a field (each field's "hash" is the sha256 of its name and version)."""
    current = {
        f"f{i:02d}": hashlib.sha256(f"f{i:02d}/0".encode()).hexdigest() for i in range(fields)
    }
    rows = []
    for seq in range(steps):
        name = f"f{seq % fields:02d}"
        current[name] = hashlib.sha256(f"{name}/{seq + 1}".encode()).hexdigest()
        if seq == 5:
            current.pop("f19", None)
        rows.append(
            state_row(
                partition_key="p",
                app_id=app_id,
                sequence_id=seq,
                position=f"n{seq}",
                status="completed",
                fields=dict(current),
                internal={"__SEQUENCE_ID": seq},
            )
        )
    return rows


def test_state_rows_are_stored_as_deltas_and_load_back_whole(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    rows = _state_rows("app-1", 40)
    try:
        # Two batches: the second one's first row is a delta of the first batch's last row.
        store.write_batch(WriteBatch(states=rows[:25]))
        store.write_batch(WriteBatch(states=rows[25:]))
        for row in rows:
            loaded = store.load_state_row("p", "app-1", row["sequence_id"], values=False)
            assert loaded is not None
            assert loaded["fields"] == json.loads(str(row["fields_json"]))
            assert loaded["internal"] == {"__SEQUENCE_ID": row["sequence_id"]}
        latest = store.load_state_row("p", "app-1", None, values=False)
        assert latest is not None and latest["fields"] == json.loads(str(rows[-1]["fields_json"]))
        with store.read() as conn:
            stored = {
                r.sequence_id: json.loads(r.fields_json)
                for r in conn.execute(text("SELECT sequence_id, fields_json FROM burr_state"))
            }
    finally:
        store.close()
    full = sorted(seq for seq, f in stored.items() if isinstance(f, dict))
    # Every STATE_DELTA_MAX_DEPTH + 1 rows one full map, the rest deltas of one changed field.
    assert full == list(range(0, 40, STATE_DELTA_MAX_DEPTH + 1))
    assert stored[1] == [0, {"f01": json.loads(str(rows[1]["fields_json"]))["f01"]}, []]
    assert stored[5][2] == ["f19"]
    stored_bytes = sum(len(json.dumps(f)) for f in stored.values())
    full_bytes = sum(len(str(r["fields_json"])) for r in rows)
    assert stored_bytes <= 0.25 * full_bytes


def test_a_state_row_whose_delta_base_is_gone_is_a_clear_error(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        store.write_batch(WriteBatch(states=_state_rows("app-2", 3)))
        with store.write() as conn:
            conn.execute(text("DELETE FROM burr_state WHERE sequence_id = 1"))
        with pytest.raises(StoreError, match=r"state row app-2#1 .* is missing"):
            store.load_state_row("p", "app-2", 2, values=False)
        assert store.load_state_row("p", "app-2", 0, values=False) is not None
    finally:
        store.close()


def test_downgrading_below_0010_stores_raw_blobs_and_full_state_maps(
    store_target: StoreTarget,
) -> None:
    from alembic import command

    store = store_target.open()
    rows = _state_rows("app-3", 20)
    doc = {"messages": [{"content": "You are terse.", "role": "system"}] * 3, "model": "m"}
    try:
        with store.write() as conn:
            digest = store.put_json(conn, doc)
        store.write_batch(WriteBatch(states=rows))
        with store.write() as conn:
            assert conn.execute(text("SELECT codec FROM blobs")).scalar() == "zd1"
            config = migrate._config(conn)
            command.downgrade(config, "0009")  # type: ignore[arg-type]
            codecs = {r[0] for r in conn.execute(text("SELECT codec FROM blobs"))}
            data = conn.execute(text("SELECT data FROM blobs")).scalar()
            stored = conn.execute(
                text("SELECT fields_json FROM burr_state ORDER BY sequence_id")
            ).all()
            assert migrate.current_revision(conn) == "0009"
            # State rows are immutable again after the rewrite.
            with pytest.raises(DBAPIError, match="immutable"), conn.begin_nested():
                conn.execute(text("UPDATE burr_state SET status = 'edited'"))
    finally:
        store.close()
    assert codecs == {"raw"}
    assert hashlib.sha256(bytes(data)).hexdigest() == digest
    assert [json.loads(r[0]) for r in stored] == [json.loads(str(r["fields_json"])) for r in rows]
