"""Attacks on this session's changes (atk26): packed blobs keyed by the first bytes of their
hash (``blob_slices``, migration 0016) on real stores."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from rewind.errors import StoreError
from rewind.replay import Rewind
from rewind.store import codec, schema
from rewind.store.retention import collect_garbage
from tests import pipelines


def _swap_slice(store, digest: str) -> None:
    """Point ``digest``'s ``blob_slices`` row at another slice of the same pack (a damaged
    index row: its bytes no longer match the hash)."""
    s = schema.blob_slices
    key = codec.slice_key(digest)
    with store.write() as conn:
        rows = {bytes(k): bytes(r) for k, r in conn.execute(select(s.c.key, s.c.ref))}
        mine = codec.read_slice_ref(rows[key])
        other = next(
            r
            for k, r in rows.items()
            if k != key
            and codec.read_slice_ref(r)[1] == mine[1]
            and codec.read_slice_ref(r)[0] == mine[0]
        )
        conn.execute(s.update().where(s.c.key == key).values(ref=other))


def test_gc_refuses_to_archive_a_run_whose_map_document_is_damaged(tmp_path: Path) -> None:
    """A run whose node output map sits in a damaged slice is not archived (and deleted) with
    an archive lacking the blobs that map names: gc reports the store damaged, as it did when
    the map had a ``blobs`` row."""
    rw = Rewind(tmp_path / "store")
    store = rw.store
    try:
        run = rw.record(pipelines.pipeline, {"x": 5})
        output = store.nodes_of(run.run_id)[0].output_hash
        with store.read() as conn:
            assert not conn.execute(
                select(schema.blobs.c.hash).where(schema.blobs.c.hash == output)
            ).all()
        _swap_slice(store, output)
        with pytest.raises(StoreError, match="damaged"):
            store.get_blob(output)
        with pytest.raises(StoreError, match="damaged"):
            collect_garbage(store, 0.0, now=10.0**10)
        assert store.get_run(run.run_id) is not None
    finally:
        store.close()


def test_gc_takes_a_slice_of_another_blob_sharing_the_key_for_absent_not_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The strict presence check gc uses still says absent (no error) for a hash whose key a
    stored blob holds: a row may name a hash never stored (one byte keys make this usual)."""
    from rewind.canonical import sha256_hex
    from rewind.store.retention import _existing_blobs

    monkeypatch.setattr(codec, "SLICE_KEY_BYTES", 1)
    rw = Rewind(tmp_path / "store")
    store = rw.store
    try:
        rw.record(pipelines.pipeline, {"x": 5})
        with store.read() as conn:
            keys = {bytes(k) for (k,) in conn.execute(select(schema.blob_slices.c.key))}
        others = [sha256_hex(b"never %d" % i) for i in range(2000)]
        others = [d for d in others if codec.slice_key(d) in keys][:20]
        assert others
        with store.read() as conn:
            assert _existing_blobs(store, conn, others) == set()
        collect_garbage(store, 10.0**9)
    finally:
        store.close()
