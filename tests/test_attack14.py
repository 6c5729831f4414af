"""Attacks on issue #13's speed and size changes that held (kept as regression tests).

- The recorder's in-place check: fields the node declares are now compared by pickle (sealed
  or loose) instead of always re-encoded. Values changed in place whose own pickle would hide
  the change (a dataclass whose ``__getstate__`` leaves state out, a pydantic model's private
  attributes and extras, numpy arrays reshaped or re-typed in place, a defaultdict's factory,
  dict keys and set members swapped for ``==`` ones of another type, ``-0.0``) must still get
  the digest a full encoding gives, declared or not.
- Blob packs through retention: a trace (packed documents) and an in-place replay of it, both
  archived by ``rewind gc`` and restored, read back exactly as before; gc keeps no pack nobody
  names and deletes none still named.
- A damaged pack read through the CLI: exit 2 and one line saying the store is damaged.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
from sqlalchemy import select

import rewind
from rewind.persister import FieldEncoder, encode_value
from rewind.store import Store, open_store, schema
from rewind.store.codec import read_pack_ref, read_slice_ref
from rewind.store.objects import ObjectStore
from rewind.store.retention import collect_garbage, restore_run
from rewind.tracing import Tracer, step
from rewind.tracing.store import load_trace, state_at
from tests.cli_process import run_rewind

# -- values whose own pickle hides state that Rewind stores -----------------------------------


@dataclasses.dataclass
class HidesState:
    """A dataclass whose pickle leaves out its field (serde stores it)."""

    items: list[Any]

    def __getstate__(self) -> dict[str, Any]:
        return {}


@dataclasses.dataclass(slots=True)
class Slotted:
    items: list[Any]


class WithPrivate(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    x: int = 0
    _seen: list[Any] = pydantic.PrivateAttr(default_factory=list)


def _swap_key(d: dict[Any, Any]) -> None:
    del d[1]
    d[True] = "v"  # == 1, another type: another stored key


def _swap_member(s: set[Any]) -> None:
    s.discard(1)
    s.add(1.0)


def _retype(a: Any) -> None:
    a.dtype = np.int64  # same bytes, another dtype, in place


def _extra(m: WithPrivate) -> None:
    m.y = [1]  # type: ignore[attr-defined]  # a new extra attribute


CHANGES: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "dataclass hiding its state": (lambda: HidesState([1]), lambda v: v.items.append(2)),
    "slotted dataclass": (lambda: Slotted([1]), lambda v: v.items.append(2)),
    "pydantic private attribute": (WithPrivate, lambda v: v._seen.append(1)),
    "pydantic extra attribute": (WithPrivate, _extra),
    "numpy reshaped": (lambda: np.zeros(4), lambda v: setattr(v, "shape", (2, 2))),
    "numpy retyped": (lambda: np.zeros(4), _retype),
    "numpy element": (lambda: np.zeros(3), lambda v: v.__setitem__(0, 5)),
    "defaultdict factory": (
        lambda: collections.defaultdict(list),
        lambda v: setattr(v, "default_factory", dict),
    ),
    "dict key 1 -> True": (lambda: {1: "v"}, _swap_key),
    "set member 1 -> 1.0": (lambda: {1}, _swap_member),
    "0.0 -> -0.0": (lambda: [0.0], lambda v: v.__setitem__(0, -0.0)),
    "1 -> True": (lambda: [1], lambda v: v.__setitem__(0, True)),
    "bytearray": (lambda: bytearray(b"ab"), lambda v: v.extend(b"c")),
}


def _full(state: dict[str, Any]) -> dict[str, str]:
    return {k: encode_value(k, v).digest for k, v in state.items()}


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
@pytest.mark.parametrize("name", sorted(CHANGES))
def test_an_in_place_change_is_seen_whatever_its_pickle_hides(name: str, declared: bool) -> None:
    make, change = CHANGES[name]
    value = make()
    # other mutable fields, so the changed one is sealed with them (one pickle for all)
    state: dict[str, Any] = {"v": value, "alias": [value], **{f"f{i}": [i] for i in range(6)}}
    enc = FieldEncoder()
    for _ in range(3):
        enc.step(state, recheck=["v"] if declared else [])
    before = _full(state)
    change(value)
    got = enc.step(state, recheck=["v"] if declared else [])
    assert got.digests == _full(state)
    assert got.digests["v"] != before["v"] and got.digests["alias"] != before["alias"]
    # and nothing is stale one node later either
    assert enc.step(state, recheck=[]).digests == _full(state)


# -- packs through gc, archives and restores --------------------------------------------------


def _sum(total: int, n: int) -> int:
    return total + n


_add = step("add", "tool_call")(rewind.tool("attack14_add")(_sum))


@step("refuse", "tool_call")
def _refuse(n: int) -> int:
    raise ValueError(f"refused {n}")


def _chain(last: int) -> None:
    total = _add(0, 1)
    total = _add(total, 2)
    with contextlib.suppress(ValueError):
        _refuse(3)
    _add(total, last)


def _trace(folder: Path, last: int, source: str | None = None) -> str:
    tracer = Tracer(folder, raise_on_write_error=True)
    try:
        with tracer.trace("packs") if source is None else tracer.replay(source) as t:
            _chain(last)
    finally:
        tracer.close()
    assert t.write_error is None
    return t.trace_id


def _seen(store: Store, run_id: str) -> list[Any]:
    view = load_trace(store, run_id, payloads=True)
    out: list[Any] = []
    for s in view.steps:
        row = store.load_state_row("", s.src_app_id, s.src_sequence_id, values=False)
        out.append(
            (s.name, s.status, s.output, s.state_hash, state_at(store, s), row and row["fields"])
        )
    return out


def _packs(store: Store) -> tuple[set[int], set[int]]:
    """(ids of the stored packs, ids the blob rows and blob_slices rows name)."""
    with store.read() as conn:
        ids = {r[0] for r in conn.execute(select(schema.blob_packs.c.id))}
        refs = conn.execute(
            select(schema.blobs.c.data).where(schema.blobs.c.codec.like("p-%"))
        ).all()
        slices = conn.execute(select(schema.blob_slices.c.ref)).all()
    named = {read_pack_ref(r[0])[0] for r in refs}
    return ids, named | {read_slice_ref(r[0])[1] for r in slices}


def test_packed_traces_archived_by_gc_and_restored_read_the_same(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    source = _trace(folder, 5)
    unchanged = _trace(folder, 5, source)  # stored by reference to the source
    changed = _trace(folder, 6, source)  # diverges at its last step
    store = open_store(folder)
    try:
        ids, named = _packs(store)
        assert ids and ids == named
        before = {r: _seen(store, r) for r in (source, unchanged, changed)}
        report = collect_garbage(store, 0.0, archive=ObjectStore((tmp_path / "archive").as_uri()))
        assert {a.run_id for a in report.archived} == {source, unchanged, changed}
        assert _packs(store) == (set(), set())  # no pack left that no blob row names
        for run_id in (source, unchanged, changed):
            restore_run(store, run_id, archive=ObjectStore((tmp_path / "archive").as_uri()))
        assert {r: _seen(store, r) for r in before} == before
        collect_garbage(store, 10**9)  # nothing old enough: only unnamed blobs would go
        ids, named = _packs(store)
        assert ids == named  # (restored blobs are stored one by one)
        assert {r: _seen(store, r) for r in before} == before
    finally:
        store.close()


def test_gc_keeps_a_pack_while_a_blob_row_names_it(tmp_path: Path) -> None:
    folder = tmp_path / "store"
    kept = _trace(folder, 5)
    store = open_store(folder)
    try:
        seen = _seen(store, kept)
        ids, named = _packs(store)
        assert ids and ids == named
        collect_garbage(store, 10**9)
        assert _packs(store) == (ids, named)
        assert _seen(store, kept) == seen
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_pack_fails_the_cli_with_one_clear_line(tmp_path: Path, damage: str) -> None:
    folder = tmp_path / "store"
    trace_id = _trace(folder, 5)
    store = open_store(folder)
    try:
        with store.write() as conn:
            t = schema.blob_packs
            pack_id, data = conn.execute(select(t.c.id, t.c.data).order_by(t.c.id)).first()
            if damage == "flip":
                data = bytearray(data)
                data[len(data) // 2] ^= 0x10
            else:
                data = data[: len(data) // 2]
            conn.execute(t.update().where(t.c.id == pack_id).values(data=bytes(data)))
    finally:
        store.close()
    done = run_rewind("inspect", trace_id, "--json", "--store", str(folder))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "the store is damaged" in lines[0], done.stderr
    assert f"blob pack {pack_id}" in lines[0]
    assert "Traceback" not in done.stderr and not done.stdout.strip()


# -- a session's kept parent reads under concurrent forks -------------------------------------


def test_concurrent_forks_of_one_parent_and_forks_of_forks_replay_it_exactly(
    tmp_path: Path,
) -> None:
    """Forks in threads share the session's kept reads of their parent (engine/parent_reads):
    every one replays the parent's hashes, and so do forks of a fork before and after a gc."""
    from concurrent.futures import ThreadPoolExecutor

    from rewind.replay import Rewind
    from tests import pipelines

    rw = Rewind(open_store(tmp_path / "store"))
    try:
        run = rw.record(pipelines.pipeline, {"x": 7})
        nodes = rw.store.nodes_of(run.run_id)
        want = [(n.name, n.output_hash, n.state_hash) for n in nodes]

        def hashes(run_id: str) -> list[tuple[str, str | None, str | None]]:
            return [(n.name, n.output_hash, n.state_hash) for n in rw.store.nodes_of(run_id)]

        def fork(i: int) -> str:
            return rw.fork(run.run_id, at=nodes[i % len(nodes)].name).run_id

        with ThreadPoolExecutor(4) as pool:
            forks = list(pool.map(fork, range(12)))
        assert all(hashes(f) == want for f in forks)
        first = rw.fork(forks[0], at=nodes[1].name)
        collect_garbage(rw.store, 10**9)
        again = rw.fork(forks[0], at=nodes[1].name)
        assert first.status == again.status == "completed"
        assert hashes(first.run_id) == hashes(again.run_id) == want
    finally:
        rw.store.close()
