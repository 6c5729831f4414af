"""A Burr run's small blobs are packed per commit (``blob_packs``, SQLite), and every reader of
blobs — forks, diffs, gc, archive and restore — gets them back."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import func, select, update

from rewind.canonical import sha256_hex
from rewind.replay import Rewind
from rewind.store import Store, open_store, schema
from rewind.store.retention import collect_garbage, restore_run
from rewind.store.store import (
    PACK_ASK_FIRST_BLOBS,
    PACK_GROUP_MAX_BYTES,
    WriteBatch,
    pack_groups,
    state_row_hashes,
)
from tests import pipelines

MONTH = 30 * 86400.0


def _named_blobs(store: Store, run_id: str) -> dict[str, set[str]]:
    """The blobs a run's rows name: its documents (node input/output maps, state fields) and
    its call payloads (requests and results)."""
    nodes = store.nodes_of(run_id)
    documents = {h for n in nodes for h in (n.input_hash, n.output_hash) if h}
    with store.read() as conn:
        b = schema.burr_state
        for (fields_json,) in conn.execute(select(b.c.fields_json).where(b.c.app_id == run_id)):
            documents |= state_row_hashes(fields_json)
    payloads = {h for n in nodes for c in n.calls for h in (c.request_hash, c.result_hash) if h}
    return {"documents": documents, "payloads": payloads}


def _packs_of(store: Store, digests: set[str]) -> dict[str, int | None]:
    """The pack id of each blob (None: a row of its own)."""
    refs = store.pack_refs(digests)
    return {h: refs[h][1] if h in refs else None for h in digests}


def _age(store: Store, run_id: str, days: float) -> None:
    when = time.time() - days * 86400.0
    with store.write() as conn:
        conn.execute(
            update(schema.runs)
            .where(schema.runs.c.run_id == run_id)
            .values(created_at=when, finished_at=when)
        )


def test_a_burr_runs_documents_and_payloads_are_packed_and_read_back(tmp_path: Path) -> None:
    rw = Rewind(tmp_path / "store")
    try:
        run = rw.record(pipelines.pipeline, {"x": 5})
        named = _named_blobs(rw.store, run.run_id)
        assert named["documents"] and named["payloads"]
        packs = _packs_of(rw.store, named["documents"] | named["payloads"])
        # the initial state's fields were written with the run row, before any node
        new_docs = named["documents"] - named["payloads"] - set(_initial_fields(rw, run.run_id))
        assert new_docs and all(packs[h] is not None for h in new_docs)
        assert all(packs[h] is not None for h in named["payloads"] - named["documents"])
        assert {packs[h] for h in new_docs}.isdisjoint(
            {packs[h] for h in named["payloads"] - named["documents"]}
        )
        blobs = rw.store.get_blobs(named["documents"] | named["payloads"])
        assert all(sha256_hex(data) == h for h, data in blobs.items())
        # an unchanged replay reads the packed call results: every call hits, same hashes
        again = rw.replay(run.run_id, at=1)
        assert again.tokens == 0
        assert [n.output_hash for n in rw.store.nodes_of(again.run_id)] == [
            n.output_hash for n in rw.store.nodes_of(run.run_id)
        ]
        assert all(n.cache_outcome in ("hit", "none") for n in rw.store.nodes_of(again.run_id))
        diff = rw.diff(run.run_id, again.run_id)
        assert diff.first_divergence is None
    finally:
        rw.store.close()


def _initial_fields(rw: Rewind, run_id: str) -> dict[str, str]:
    initial = rw.store.get_run(run_id).initial_state_hash
    assert initial is not None
    return {h: k for k, h in rw.store.get_json(initial).items()}


def test_gc_archive_and_restore_of_a_packed_run_keep_what_other_runs_read(tmp_path: Path) -> None:
    """An archived run's blobs go, the ones a kept run shares stay readable from their pack,
    and the restored run reads back equal (its blobs then in rows of their own)."""
    rw = Rewind(tmp_path / "store")
    store = rw.store
    try:
        old = rw.record(pipelines.pipeline, {"x": 5})
        kept = rw.record(pipelines.pipeline, {"x": 5})  # the same values: blobs shared
        other = rw.record(pipelines.pipeline, {"x": 7})  # its own blobs
        old_blobs = set().union(*_named_blobs(store, old.run_id).values())
        shared = old_blobs & set().union(*_named_blobs(store, kept.run_id).values())
        assert shared and any(p is not None for p in _packs_of(store, shared).values())
        before = store.nodes_of(old.run_id)
        _age(store, old.run_id, 40)
        _age(store, other.run_id, 40)

        report = collect_garbage(store, MONTH)

        assert {a.run_id for a in report.archived} == {old.run_id, other.run_id}
        assert report.blobs_deleted > 0
        for digest, data in store.get_blobs(shared).items():
            assert sha256_hex(data) == digest
        assert rw.replay(kept.run_id, at=1).tokens == 0

        restore_run(store, old.run_id)
        assert store.nodes_of(old.run_id) == before
        assert rw.diff(old.run_id, kept.run_id).first_divergence is None
        fork = rw.replay(old.run_id, at=2)
        assert fork.tokens == 0
    finally:
        store.close()


def test_pack_groups_split_documents_from_payloads() -> None:
    blobs = {sha256_hex(b"%d" % i): b"%d" % i for i in range(5)}
    h = list(blobs)
    batch = WriteBatch(
        blobs=dict(blobs),
        calls=[{"request_hash": h[0], "result_hash": h[1]}],
        tool_cache=[{"args_hash": h[0], "result_hash": h[1]}],
        llm_cache=[{"request_hash": h[2], "response_hash": None}],
    )
    assert pack_groups(batch) == [{h[3], h[4]}, {h[0], h[1], h[2]}]
    assert pack_groups(batch, exclude={h[4], h[1]}) == [{h[3]}, {h[0], h[2]}]


def test_a_group_larger_than_the_pack_limit_is_cut_into_several_packs(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    try:
        items = [i.to_bytes(2, "big") * 8 + b"x" * 4000 for i in range(150)]  # 4016 bytes each
        blobs = {sha256_hex(d): d for d in items}
        store.write_batch(WriteBatch(blobs=dict(blobs), packs=[set(blobs)]))
        packs = _packs_of(store, set(blobs))
        sizes: dict[int | None, int] = {}
        for digest, pack in packs.items():
            sizes[pack] = sizes.get(pack, 0) + len(blobs[digest])
        assert None not in sizes and len(sizes) == 3  # 65 + 65 + 20 blobs
        assert all(size <= PACK_GROUP_MAX_BYTES for size in sizes.values())
        assert store.get_blobs(set(blobs)) == blobs
    finally:
        store.close()


def _write_blobs(root: Path, blobs: dict[str, bytes], *, packed: bool) -> Store:
    """A new Store on ``root`` (returned open) after one write of ``blobs``, as one pack group
    or as rows of their own."""
    store = open_store(root)
    batch = WriteBatch()
    batch.blobs.update(blobs)
    if packed:
        batch.packs.append(set(blobs))
    store.write_batch(batch)
    return store


def test_a_small_pack_asks_first_and_leaves_out_the_blobs_stored_already(tmp_path: Path) -> None:
    """At most PACK_ASK_FIRST_BLOBS packed blobs (a traced chain's exit write): which are stored
    is asked before packing. Blobs stored unpacked by an earlier write (that this Store object
    does not know about) stay as they are, the rest go into one pack, every blob reads back;
    when all are stored already no pack is made at all."""
    root = tmp_path / "store"
    blobs = {sha256_hex(b): b for b in (f"small {i} ".encode() * 5 for i in range(6))}
    assert len(blobs) <= PACK_ASK_FIRST_BLOBS
    early = dict(list(blobs.items())[:2])
    _write_blobs(root, early, packed=False).close()
    for round_ in range(2):  # the second time every blob is stored already
        store = _write_blobs(root, blobs, packed=True)
        try:
            assert store.get_blobs(list(blobs)) == blobs
            packs = _packs_of(store, set(blobs))
            assert all(packs[h] is None for h in early), packs
            assert len({packs[h] for h in blobs if h not in early}) == 1, packs
            with store.read() as conn:
                n_packs = conn.execute(select(func.count()).select_from(schema.blob_packs))
                assert n_packs.scalar_one() == 1, round_
        finally:
            store.close()
