"""Packed blobs keyed by the first bytes of their hash (``blob_slices``, migration 0016).

Two blobs can share a key: by chance, or on purpose (~2^32 sha256 evaluations for 8 bytes). The
tests here make keys short (``codec.SLICE_KEY_BYTES`` patched to 1 or 2 bytes) so that sharing is
the usual case, and check that the second blob of a key keeps a ``blobs`` row of its own, that
every blob reads back, that a blob never stored is never taken for another's slice (reads say
missing, presence checks say absent, a write stores it), and that gc, the migration and its
downgrade keep every blob."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, inspect, select

from rewind.canonical import sha256_hex
from rewind.errors import StoreError
from rewind.replay import Rewind
from rewind.store import Store, codec, migrate, open_store, schema
from rewind.store.retention import collect_garbage
from rewind.store.store import PACK_ASK_FIRST_BLOBS, WriteBatch
from tests import pipelines
from tests.conftest import StoreTarget
from tests.revisions import load_revision


@pytest.fixture
def short_keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Slice keys of one byte: 256 keys, so a few dozen blobs share some."""
    monkeypatch.setattr(codec, "SLICE_KEY_BYTES", 1)
    yield


def _blobs(tag: str, n: int) -> dict[str, bytes]:
    return {sha256_hex(d): d for d in (f"{tag} blob {i} ".encode() * 3 for i in range(n))}


def _write(store: Store, blobs: dict[str, bytes]) -> None:
    store.write_batch(WriteBatch(blobs=dict(blobs), packs=[set(blobs)]))


def _counts(store: Store) -> tuple[int, int, int]:
    """(``blobs`` rows, ``blob_slices`` rows, packs)."""
    with store.read() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(select(func.count()).select_from(t)).scalar_one()
            for t in (schema.blobs, schema.blob_slices, schema.blob_packs)
        )


def _sharing(blobs: dict[str, bytes]) -> int:
    """How many of ``blobs`` share their slice key with an earlier one (in hash order)."""
    keys = [codec.slice_key(h) for h in sorted(blobs)]
    return len(keys) - len(set(keys))


def _unstored_sharing_a_key(stored: dict[str, bytes]) -> dict[str, bytes]:
    """Blobs not in ``stored`` whose slice key one of ``stored`` has."""
    keys = {codec.slice_key(h) for h in stored}
    out: dict[str, bytes] = {}
    for i in itertools.count():
        data = b"never stored %d" % i
        digest = sha256_hex(data)
        if codec.slice_key(digest) in keys and digest not in stored:
            out[digest] = data
            if len(out) == 3:
                return out
    raise AssertionError("unreachable")


def test_the_second_blob_of_a_key_keeps_a_row_of_its_own(tmp_path: Path, short_keys: None) -> None:
    blobs = _blobs("a", 60)
    assert _sharing(blobs) > 0
    store = open_store(tmp_path)
    try:
        _write(store, blobs)
        rows, slices, packs = _counts(store)
        assert (rows, slices, packs) == (_sharing(blobs), 60 - _sharing(blobs), 1)
        assert store.get_blobs(blobs) == blobs
        assert store.blob_digests() == set(blobs)
        assert store.pack_refs(blobs).keys() == blobs.keys()
    finally:
        store.close()


def test_a_blob_never_stored_is_not_taken_for_the_slice_under_its_key(
    tmp_path: Path, short_keys: None
) -> None:
    stored = _blobs("b", 40)
    other = _unstored_sharing_a_key(stored)
    store = open_store(tmp_path)
    try:
        _write(store, stored)
        for digest in other:
            with pytest.raises(StoreError, match="does not match its hash") as caught:
                store.get_blob(digest)
            assert caught.value.hint.startswith("the store is damaged")
        assert store._present_blobs(list(other) + list(stored)) == set(stored)
        assert not store.pack_refs(other)
    finally:
        store.close()
    # A new Store (it knows nothing stored) writes them: each keeps a row under its full hash,
    # in a pack of their own; nothing stored before moves.
    store = open_store(tmp_path)
    try:
        before = store.pack_refs(stored)
        rows, slices, packs = _counts(store)
        _write(store, other)
        assert _counts(store) == (rows + len(other), slices, packs + 1)
        assert store.get_blobs(other | stored) == other | stored
        assert store.pack_refs(stored) == before
    finally:
        store.close()


@pytest.mark.parametrize("n_new", [2, PACK_ASK_FIRST_BLOBS + 40])
def test_a_write_of_stored_and_new_blobs_sharing_keys_stores_each_once(
    tmp_path: Path, short_keys: None, n_new: int
) -> None:
    """Both ways a write finds the blobs stored already: asked first (a small write) and the
    savepoint rolled back when an insert was ignored (a large one)."""
    stored = _blobs("c", 50)
    store = open_store(tmp_path)
    _write(store, stored)
    store.close()
    new = _blobs("d", n_new) | _unstored_sharing_a_key(stored)
    both = stored | new
    store = open_store(tmp_path)
    try:
        _write(store, both)
        rows, slices, _packs = _counts(store)
        assert rows + slices == len(both)  # no blob twice, none lost
        assert len(store.blob_digests()) == len(both)
        assert store.get_blobs(both) == both
    finally:
        store.close()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writes=st.lists(
        st.lists(st.binary(min_size=0, max_size=40), min_size=0, max_size=30),
        min_size=1,
        max_size=4,
    ),
    new_store_each_time=st.booleans(),
)
def test_any_writes_with_shared_keys_read_back_every_blob_and_nothing_else(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    writes: list[list[bytes]],
    new_store_each_time: bool,
) -> None:
    monkeypatch.setattr(codec, "SLICE_KEY_BYTES", 1)
    root = tmp_path_factory.mktemp("slices")
    written: dict[str, bytes] = {}
    store = open_store(root)
    try:
        for items in writes:
            blobs = {sha256_hex(d): d for d in items}
            _write(store, blobs)
            written.update(blobs)
            if new_store_each_time:
                store.close()
                store = open_store(root)
        assert store.get_blobs(written) == written
        assert store.blob_digests() == set(written)
        rows, slices, _packs = _counts(store)
        # each blob once, but for one a write stored alone (not packed: a blobs row) that a
        # Store not knowing it had stored as a slice: then both (a few bytes twice)
        assert len(written) <= rows + slices <= len(written) + (rows if new_store_each_time else 0)
        assert slices <= len(written)
        absent = [sha256_hex(b"absent %d" % i) for i in range(64)]
        assert store._present_blobs(absent) == set()
    finally:
        store.close()


def test_a_crafted_pair_sharing_two_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two blobs whose hashes share their first two bytes, found by trying (as an attacker
    would for eight, with ~2^32 tries): both are stored, each reads back as itself."""
    monkeypatch.setattr(codec, "SLICE_KEY_BYTES", 2)
    seen: dict[bytes, bytes] = {}
    for i in itertools.count():
        data = b'{"value": %d}' % i
        key = codec.slice_key(sha256_hex(data))
        if key in seen:
            pair = {sha256_hex(seen[key]): seen[key], sha256_hex(data): data}
            break
        seen[key] = data
    store = open_store(tmp_path)
    try:
        first, second = pair
        _write(store, {first: pair[first], sha256_hex(b"x" * 9): b"x" * 9})
        _write(store, {second: pair[second], sha256_hex(b"y" * 9): b"y" * 9})
        assert store.get_blobs(pair) == pair
        refs = store.pack_refs(pair)
        assert refs[first][1] != refs[second][1]  # each in the pack of its own write
    finally:
        store.close()


def _written_then_altered(root: Path, blobs: dict[str, bytes], table: Any, **values: Any) -> Store:
    """A store (returned open) after a write of ``blobs`` as one pack, every row of ``table``
    then set to ``values``."""
    store = open_store(root)
    _write(store, blobs)
    with store.write() as conn:
        conn.execute(table.update().values(**values))
    return store


def test_a_damaged_pack_found_by_a_presence_check_is_written_again(
    tmp_path: Path,
) -> None:
    """A presence check that cannot read a slice says absent: the blob is written again under
    its full hash (in a pack of its own), and reads back from there."""
    blobs = _blobs("e", 10)
    store = _written_then_altered(tmp_path, blobs, schema.blob_packs, data=zlib.compress(b"\0"))
    try:
        with pytest.raises(StoreError, match="store is damaged"):
            store.get_blobs(blobs)
    finally:
        store.close()
    store = open_store(tmp_path)
    try:
        assert store._present_blobs(list(blobs)) == set()
        _write(store, blobs)
        assert store.get_blobs(blobs) == blobs
    finally:
        store.close()


def test_gc_keeps_a_slice_while_a_referenced_blob_shares_its_key(
    tmp_path: Path, short_keys: None
) -> None:
    """gc cannot tell which blob a slice is without reading it: a slice whose key a referenced
    hash has stays (a few bytes kept too long, never a blob lost); the others go, and a pack
    goes once nothing names it."""
    rw = Rewind(tmp_path / "store")
    store = rw.store
    try:
        run = rw.record(pipelines.pipeline, {"x": 5})
        loose = _blobs("f", 40)
        _write(store, loose)
        named = store.blob_digests() - loose.keys()
        report = collect_garbage(store, 10.0**9)  # nothing is that old: only blobs go
        left = store.blob_digests()
        assert named <= left
        kept = {codec.slice_key(h) for h in named}
        # a loose blob stays only while it holds the slice of a key a referenced hash has
        assert all(codec.slice_key(h) in kept for h in left & loose.keys())
        assert all(h not in left for h in loose if codec.slice_key(h) not in kept)
        assert report.blobs_deleted == len(loose) - len(left & loose.keys())
        assert rw.replay(run.run_id, at=1).tokens == 0
    finally:
        store.close()


def test_a_damaged_slice_reference_is_reported(tmp_path: Path) -> None:
    blobs = _blobs("g", 4)
    store = _written_then_altered(tmp_path, blobs, schema.blob_slices, ref=b"\x81")
    try:
        with pytest.raises(StoreError, match=r"blob slice .* ends inside a varint"):
            store.get_blobs(blobs)
    finally:
        store.close()


@given(
    st.sampled_from(["p-raw", "p-hex1"]),
    st.integers(0, 2**40),
    st.integers(0, 2**31),
    st.integers(0, 2**20),
    st.integers(0, 2**20),
)
def test_a_slice_reference_round_trips(
    kind: str, pack_id: int, offset: int, length: int, size: int
) -> None:
    ref = codec.slice_ref(kind, pack_id, offset, length, size)
    expected = size if kind == "p-hex1" else length
    assert codec.read_slice_ref(ref) == (kind, pack_id, offset, length, expected)


def _row_digests(store: Store) -> set[str]:
    with store.read() as conn:
        return {r[0] for r in conn.execute(select(schema.blobs.c.hash))}


# --- migration 0016 ----------------------------------------------------------------------------


def test_the_migration_keys_slices_as_the_store_does() -> None:
    assert load_revision("0016").KEY_BYTES == codec.SLICE_KEY_BYTES == 8


def test_0016_downgrades_to_blobs_rows_and_upgrades_back(store_target: StoreTarget) -> None:
    from alembic import command

    store = store_target.open()
    sqlite = store.engine.dialect.name == "sqlite"
    try:
        rw = Rewind(store)
        run = rw.record(pipelines.pipeline, {"x": 5})
        fork = rw.replay(run.run_id, at=1)
        digests = store.blob_digests()
        blobs = store.get_blobs(digests)
        nodes = {r: store.nodes_of(r) for r in (run.run_id, fork.run_id)}
        counts = _counts(store)
        # a blob written as a row of its own (a run's initial fields) and later in a pack has a
        # slice too (Store._write_packs); the downgrade keeps its row, the upgrade no slice
        with store.read() as conn:
            keys = {bytes(k) for (k,) in conn.execute(select(schema.blob_slices.c.key))}
        twice = len(keys & {codec.slice_key(h) for h in _row_digests(store)})
        if sqlite:
            assert counts[1] > 0 and counts[0] < counts[1]  # most blobs are slices
        else:
            assert counts[1:] == (0, 0)  # PostgreSQL packs nothing
        with store.write() as conn:
            command.downgrade(migrate._config(conn), "0015")  # type: ignore[arg-type]
            assert migrate.current_revision(conn) == "0015"
            assert "blob_slices" not in inspect(conn).get_table_names()
            found = {r[0] for r in conn.execute(select(schema.blobs.c.hash))}
            if sqlite:  # a blob 0015 stores rows for, sharing a key with a stored one
                b = schema.blobs
                same, ref = conn.execute(
                    select(b.c.hash, b.c.data).where(b.c.codec == "p-raw").order_by(b.c.hash)
                ).first()
                fake = same[:16] + "f" * 48  # after it in hash order: it keeps the key
                conn.execute(
                    schema.blobs.insert().values(hash=fake, size=1, codec="p-raw", data=ref)
                )
        assert found == digests  # every blob has its row back
    finally:
        store.close()
    store = store_target.open()  # a newer Rewind opening a 0015 store upgrades it
    try:
        with store.read() as conn:
            assert migrate.current_revision(conn) == migrate.HEAD
        if sqlite:
            rows, slices, packs = _counts(store)
            assert (slices, packs) == (counts[1] - twice, counts[2])
            assert rows == counts[0] + 1  # the fake row: its key was taken by a real blob
        assert store.get_blobs(digests) == blobs
        assert {r: store.nodes_of(r) for r in nodes} == nodes
        assert Rewind(store).replay(run.run_id, at=1).tokens == 0
    finally:
        store.close()
