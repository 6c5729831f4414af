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


# --- traced replays ----------------------------------------------------------------------------
def _typed_chain(values: list[object]) -> list[object]:
    """Steps whose output is each value (no call: a replay in place serves them by output)."""
    from rewind.tracing import step

    out = []
    for i, v in enumerate(values):
        with step(f"v{i}", "transform", input={"i": i}) as s:
            s.set_output(v)
        out.append(v)
    return out


@pytest.mark.parametrize(
    ("recorded", "replayed"),
    [(1, 1.0), (1, True), (0, False), (0.0, -0.0), (1.0, 1), ("1", 1), ([1], (1,)), (None, 0)],
)
def test_an_in_place_replay_differing_only_in_type_keeps_its_own_values(
    tmp_path: Path, recorded: object, replayed: object
) -> None:
    """A step of an in-place replay whose output equals the recorded one in Python (1 == 1.0 ==
    True, 0.0 == -0.0) but not in type is not served as the recorded step: the replay stores its
    own value, and reads back the type it returned."""
    import json

    from rewind.store import open_store
    from rewind.tracing import Tracer
    from rewind.tracing.store import load_trace

    st = open_store(tmp_path / "store")
    try:
        with Tracer(st).trace("typed") as t:
            _typed_chain([recorded, "same", recorded])
        with Tracer(st).replay(t.trace_id) as r:
            _typed_chain([replayed, "same", replayed])
        source, replay = load_trace(st, t.trace_id), load_trace(st, r.trace_id)
        got = [s.output for s in replay.steps]
        want = json.loads(json.dumps([replayed, "same", replayed]))
        assert json.dumps(got) == json.dumps(want)
        assert source.steps[0].output_hash != replay.steps[0].output_hash or json.dumps(
            recorded
        ) == json.dumps(replayed)
    finally:
        st.close()


CONVERT: list[object] = [int]


def _atk26_value(n: int) -> int:
    return n


def _converted_chain(n: int) -> list[object]:
    from rewind.tools import tool
    from rewind.tracing import step

    fetch = tool("atk26_value")(_atk26_value)

    @step("convert", "tool_call")
    def convert(i: int) -> object:
        return CONVERT[0](fetch(i))

    return [convert(i) for i in range(n)]


@pytest.mark.parametrize("convert", [float, bool, lambda v: -0.0 if v == 0 else float(v)])
def test_a_served_tool_step_differing_only_in_type_is_not_the_recorded_step(
    tmp_path: Path, convert: object
) -> None:
    """In the lane (a replay in place, a step with a call served from the recording), a step
    whose output differs from the recorded one only in type (int 1 vs 1.0 vs True, 0 vs -0.0) is
    stored with its own value."""
    import json

    from rewind.store import open_store
    from rewind.tracing import Tracer
    from rewind.tracing.store import load_trace

    st = open_store(tmp_path / "store")
    try:
        CONVERT[0] = int
        with Tracer(st).trace("conv") as t:
            recorded = _converted_chain(4)
        for _ in range(2):  # the second replay runs with the source's rows remembered
            CONVERT[0] = convert  # type: ignore[assignment]
            with Tracer(st).replay(t.trace_id) as r:
                replayed = _converted_chain(4)
            view = load_trace(st, r.trace_id)
            assert json.dumps([s.output for s in view.steps]) == json.dumps(replayed)
            assert json.dumps(replayed) != json.dumps(recorded)
        CONVERT[0] = int
        with Tracer(st).replay(t.trace_id) as r:
            again = _converted_chain(4)
        assert json.dumps([s.output for s in load_trace(st, r.trace_id).steps]) == json.dumps(again)
    finally:
        CONVERT[0] = int
        st.close()


# --- migration 0016 over damaged rows ----------------------------------------------------------
def test_0016_upgrades_and_downgrades_a_store_with_a_damaged_pack_reference(
    tmp_path: Path,
) -> None:
    """One damaged packed-blob row (its pack reference cut inside a varint) does not make the
    whole store unopenable by the Rewind that adds 0016 (0015 opened it; only that blob failed
    to read), nor a damaged slice row its downgrade: the row stays, reads of that blob report the
    damage, every other blob reads back."""
    from alembic import command

    from rewind.store import migrate, open_store

    rw = Rewind(tmp_path / "store")
    store = rw.store
    run = rw.record(pipelines.pipeline, {"x": 5})
    digests = store.blob_digests()
    blobs = store.get_blobs(digests)
    b = schema.blobs
    with store.write() as conn:
        command.downgrade(migrate._config(conn), "0015")  # type: ignore[arg-type]
        first = select(b.c.hash).where(b.c.codec.like("p-%")).order_by(b.c.hash).limit(1)
        damaged = conn.execute(first).scalar_one()
        conn.execute(b.update().where(b.c.hash == damaged).values(data=b"\x81"))
    store.close()
    store = open_store(tmp_path / "store")  # upgrades to 0016
    try:
        with pytest.raises(StoreError, match="damaged"):
            store.get_blob(damaged)
        rest = digests - {damaged}
        assert store.get_blobs(rest) == {h: blobs[h] for h in rest}
        s = schema.blob_slices
        with store.write() as conn:
            key = conn.execute(select(s.c.key).order_by(s.c.key).limit(1)).scalar()
            conn.execute(s.update().where(s.c.key == key).values(ref=b"\x81"))
            command.downgrade(migrate._config(conn), "0015")  # type: ignore[arg-type]
            assert migrate.current_revision(conn) == "0015"
    finally:
        store.close()
    store = open_store(tmp_path / "store")
    try:
        readable = {h for h in rest if codec.slice_key(h) != bytes(key)}
        assert store.get_blobs(readable) == {h: blobs[h] for h in readable}
        assert store.get_run(run.run_id) is not None
    finally:
        store.close()


class _Boom(Exception):
    pass


def _atk26_step_tool(n: int) -> int:
    if n == 3:
        raise _Boom("tool failed at 3")
    return n * 10


def _failing_chain() -> list[int]:
    """Four steps, each a tool call; the tool raises at the fourth, the trace fails there."""
    from rewind.tools import tool
    from rewind.tracing import step

    call = tool("atk26_step_tool")(_atk26_step_tool)
    out = []
    for i in range(5):
        with step(f"s{i}", "tool_call", input={"i": i}) as s:
            v = call(i)
            s.set_output({"v": v, "half": v / 2, "neg": -0.0 * i, "ok": bool(v)})
        out.append(v)
    return out


def test_threads_replaying_a_trace_that_failed_mid_way_agree(tmp_path: Path) -> None:
    """A trace whose tool raised at its fourth step, replayed from the cache and in place by
    four threads at once, several times each: every replay fails at the same step with the same
    error and stores the same step values as the source (the entries read ahead are shared
    between replays of the same source)."""
    import threading

    from rewind.store import open_store
    from rewind.tracing import Tracer
    from rewind.tracing.store import load_trace

    st = open_store(tmp_path / "store")
    try:
        with pytest.raises(_Boom), Tracer(st).trace("fails") as t:
            _failing_chain()
        source = load_trace(st, t.trace_id)
        assert source.status == "failed"
        want = [(s.name, s.status, s.output_hash, s.error_message) for s in source.steps]
        made: list[str] = []
        errors: list[BaseException] = []

        def replay(k: int) -> None:
            try:
                for j in range(4):
                    if (j + k) % 2:
                        cm = Tracer(st, read_cache=True).trace("fails")
                    else:
                        cm = Tracer(st).replay(t.trace_id)
                    with pytest.raises(_Boom), cm as r:
                        _failing_chain()
                    made.append(r.trace_id)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=replay, args=(k,)) for k in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        assert len(made) == 16
        for trace_id in made:
            view = load_trace(st, trace_id)
            assert view.status == "failed"
            got = [(s.name, s.status, s.output_hash, s.error_message) for s in view.steps]
            assert got == want
    finally:
        st.close()


def _readable(store, run_ids: list[str]) -> None:
    """Every node document of ``run_ids`` reads back (input and output maps and the blobs
    they name)."""
    import json

    for rid in run_ids:
        for n in store.nodes_of(rid):
            for h in (n.input_hash, n.output_hash):
                if h:
                    doc = store.get_blob(h)
                    named = [v for v in json.loads(doc).values() if isinstance(v, str)]
                    store.get_blobs([v for v in named if len(v) == 64])


def test_runs_sharing_blobs_with_one_byte_keys_survive_delete_gc_archive_and_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One-byte slice keys (most blobs share a key with another): runs and forks sharing blobs,
    one deleted, one archived by gc and restored, the others read back whole and replay with
    every call a hit after each step."""
    from rewind.store.retention import archived_runs, delete_run, restore_run

    monkeypatch.setattr(codec, "SLICE_KEY_BYTES", 1)
    rw = Rewind(tmp_path / "store")
    store = rw.store
    try:
        runs = [rw.record(pipelines.pipeline, {"x": x}).run_id for x in range(5, 17)]
        forks = [rw.replay(r, at=2).run_id for r in runs[:2]]
        with store.read() as conn:
            keys = [bytes(k) for (k,) in conn.execute(select(schema.blob_slices.c.key))]
            shared = conn.execute(
                select(schema.blobs.c.hash).where(schema.blobs.c.codec.like("p-%"))
            )
            assert len(keys) > 20 and len(shared.all()) > 5  # many blobs share a key
        delete_run(store, forks[0])
        delete_run(store, runs[2])
        kept = [runs[0], runs[1], forks[1]]
        _readable(store, kept)
        collect_garbage(store, 10.0**9)
        _readable(store, kept)
        # archive everything old (all of it), then bring one lineage back
        collect_garbage(store, 0.0, now=10.0**10)
        assert {r["run_id"] for r in archived_runs(store)} >= set(kept)
        restore_run(store, forks[1])  # its parent comes back with it
        collect_garbage(store, 10.0**9)
        _readable(store, [runs[1], forks[1]])
        assert rw.replay(forks[1], at=1).tokens == 0
        assert rw.replay(runs[1], at=2).tokens == 0
        restore_run(store, runs[0])
        _readable(store, [runs[0]])
        assert rw.replay(runs[0], at=1).tokens == 0
    finally:
        store.close()


def test_a_read_only_open_of_a_store_a_newer_rewind_wrote_says_to_upgrade_rewind(
    tmp_path: Path,
) -> None:
    """``rewind runs`` (a read-only open) of a store at a revision this Rewind does not know
    said to open it with a command that writes to upgrade it, which cannot work (the writable
    open then says the store is newer): it says what the writable open says."""
    from sqlalchemy import text

    from rewind.store import open_store

    store = open_store(tmp_path / "store")
    with store.write() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    store.close()
    for read_only in (True, False):
        with pytest.raises(StoreError, match="unknown to this Rewind") as caught:
            open_store(tmp_path / "store", read_only=read_only)
        assert caught.value.hint.startswith("upgrade Rewind")


def _old_pack_sweep(store) -> None:
    """What ``_delete_unused_packs`` of a Rewind at revision 0015 does: delete every pack no
    ``blobs`` row names (it does not know ``blob_slices``)."""
    from sqlalchemy import delete

    b, p = schema.blobs, schema.blob_packs
    with store.write() as conn:
        used = {
            codec.read_pack_ref(r[0])[0]
            for r in conn.execute(select(b.c.data).where(b.c.codec.like("p-%")))
        }
        unused = [r[0] for r in conn.execute(select(p.c.id)) if r[0] not in used]
        assert unused
        conn.execute(delete(p).where(p.c.id.in_(unused)))


def test_an_older_rewind_still_running_cannot_delete_the_packs_of_slices(tmp_path: Path) -> None:
    """A Rewind of revision 0015 that opened the store before a newer one upgraded it (a
    ``rewind serve`` left running) deleted, at its next gc or run deletion, every pack no
    ``blobs`` row names: every blob stored as a slice was lost. Its delete now fails (and rolls
    back); this Rewind's gc still deletes the packs nothing names."""
    from sqlalchemy.exc import DBAPIError

    rw = Rewind(tmp_path / "store")
    store = rw.store
    try:
        run = rw.record(pipelines.pipeline, {"x": 5})
        digests = store.blob_digests()
        blobs = store.get_blobs(digests)
        with pytest.raises(DBAPIError, match="older than the store"):
            _old_pack_sweep(store)
        assert store.get_blobs(digests) == blobs
        from rewind.store.retention import delete_run

        with store.read() as conn:
            before = len(conn.execute(select(schema.blob_packs.c.id)).all())
        delete_run(store, run.run_id)  # this Rewind's sweep deletes the packs it freed
        with store.read() as conn:
            assert len(conn.execute(select(schema.blob_packs.c.id)).all()) < before
            assert (
                conn.execute(select(schema.meta).where(schema.meta.c.key == "pack_sweep")).all()
                == []
            )
    finally:
        store.close()
