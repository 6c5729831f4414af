"""Attacks on the fixes merged in session 33 (issue #13): the digest of a value cut below the
hasher's depth (714d9e3), the source a cached replay of a failed chain links to (64af813,
ca8e936), the TTL of entries dated after the run's clock (989c9ce), and the rest.

Each test names what it found (a regression test that failed before its fix) or what held.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from rewind.tracing import model
from rewind.tracing.model import jsonable


def _below_the_cut(value: Any) -> Any:
    """``value`` 70 levels down a list the canonical hasher refuses at once (an object first at
    every level), so :func:`jsonable` copies 64 levels and digests the rest (``_cut_digest``)."""
    for _ in range(70):
        value = [object(), value]
    return value


def _digest_of(value: Any) -> str:
    """The ``sha256`` of the cut in ``jsonable(_below_the_cut(value))``."""
    form = jsonable(_below_the_cut(value))
    while isinstance(form, list):
        form = form[1]
    return form["sha256"]


def test_a_shared_value_below_the_cut_is_digested_once_not_once_per_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """714d9e3's walk digested a shared sub-object once per path to it: a step output of a few
    dozen lists (each level a list holding the level below twice) below the cut took 2^k
    visits (k=18: ~1 s, k=30: hours; the cut before it was instant). A container walked
    before, holding no back reference above itself, is now digested once; the digest is the
    same as the tree walk gave, so stored hashes do not change."""
    shared: Any = [1]
    for _ in range(12):
        shared = [shared, shared]
    visits = 0
    real = model._cut_parts

    def counting(value: Any) -> Any:
        nonlocal visits
        visits += 1
        return real(value)

    monkeypatch.setattr(model, "_cut_parts", counting)
    digest = _digest_of(shared)
    assert visits < 200  # 4,096 paths to the leaf before
    unshared: Any = [1]
    for _ in range(12):
        unshared = [unshared, copy_of(unshared)]
    assert _digest_of(unshared) == digest


def copy_of(value: Any) -> Any:
    """A deep copy of nested lists, sharing nothing."""
    return [copy_of(v) for v in value] if isinstance(value, list) else value


def test_a_numpy_array_of_objects_inside_another_below_the_cut_keeps_its_content() -> None:
    """714d9e3's walk named a container on its path by ``id``; the form of a numpy array of
    objects (``tolist()``) is a new list no one held once walked into, so the form of an
    array inside it could be given the same address and was taken for a back reference
    ("cycle"): two outputs differing inside the inner array had one digest, a replay whose
    deeply nested output changed was stored as unchanged. Every container walked is now kept
    alive until the walk ends."""
    np = pytest.importorskip("numpy")

    def outer(v: int) -> Any:
        inner = np.empty(2, dtype=object)
        inner[0], inner[1] = v, "x"
        value = np.empty(2, dtype=object)
        value[0], value[1] = inner, "y"
        return value

    assert _digest_of(outer(1)) != _digest_of(outer(2))
    assert _digest_of(outer(1)) == _digest_of(outer(1))


def _ask(question: str) -> str:
    from rewind.tracing import chat_step

    return chat_step("llm", [{"role": "user", "content": question}], temperature=0).content


def _busy_trace(location: Any, client: Any, q: int, *, fail: bool, read_cache: bool) -> Any:
    """A trace named ``busy`` with input ``{"q": q}``: two answers of its own, then raising
    when ``fail``."""
    import contextlib

    from rewind.tracing import Tracer

    tracer = Tracer(location, chat_client=client, read_cache=read_cache, raise_on_write_error=True)
    try:
        with contextlib.suppress(RuntimeError), tracer.trace("busy", {"q": q}) as t:
            _ask(f"one {q}")
            _ask(f"two {q}")
            if fail:
                raise RuntimeError("gave up")
    finally:
        tracer.close()
    assert t.write_error is None
    return t


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_cached_replay_of_a_failed_chain_finds_it_behind_16_traces_of_other_inputs(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """64af813 looked for a failed source among the 16 newest traces of the name only: after
    16 traces of other inputs (a pipeline serving many inputs), the unchanged cached replay of
    the failed recording was stored unlinked and in full (3 spans, 2 nodes, 2 calls), although
    every answer was served from the cache. A completed recording is found there through its
    call's cache entry (the traces started by the time it was produced); a failed one now is
    too."""
    from rewind.store import open_store
    from tests.model_stub import stub_and_client
    from tests.test_tracing_lane import reply
    from tests.test_tracing_reference import own_rows

    location: Any = tmp_path / "store"
    if backend == "postgres":
        location = request.getfixturevalue("postgres_server").new_store_database()
    with stub_and_client(reply) as (stub, client):
        source = _busy_trace(location, client, 1, fail=True, read_cache=False)
        for q in range(2, 18):
            _busy_trace(location, client, q, fail=False, read_cache=False)
        requests = stub.count
        replay = _busy_trace(location, client, 1, fail=True, read_cache=True)
        assert stub.count == requests
    st = open_store(location)
    try:
        run = st.get_run(replay.trace_id)
        assert (run.parent_run_id, run.status) == (source.trace_id, "failed")
        assert run.config["reference"]["all"] is True
        assert own_rows(st, replay.trace_id)["nodes"] == 0
    finally:
        st.close()


def test_a_gc_archiving_a_run_again_while_its_restore_ends_keeps_its_archive(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore deletes the run's archive object after its transaction put the rows back. A
    gc in between (a scheduled ``rewind gc``: the restored run is old, so at once a candidate
    again) archived the run again at the same key and committed its row; the restore then
    deleted that object: the archived row named nothing, the run's rows were gone and a
    second restore failed ('archive missing'): a recorded run lost. The restore now deletes
    the object only when no archived row names it, looks again after, and writes back an
    archive of the same bytes (the same rows make the same archive) a gc committed between."""
    from rewind.store import retention
    from tests import pipelines
    from tests.test_gc import MONTH, _open, age, rows_of

    gc = _open("sqlite", "file", request, tmp_path)
    try:
        run = gc.rewind().record(pipelines.pipeline, {"x": 5})
        age(gc.store, run.run_id, 40)
        before = rows_of(gc.store, run.run_id)
        assert [a.run_id for a in retention.collect_garbage(gc.store, MONTH).archived] == [
            run.run_id
        ]
        real = retention._objects_of
        again: list[str] = []
        ran: list[bool] = []

        def gc_first(ref: str, archive: Any) -> Any:
            if not ran and retention._run_exists(gc.store, run.run_id):
                # the restore's rows are in: a gc runs before it deletes the object
                ran.append(True)
                again.extend(a.run_id for a in retention.collect_garbage(gc.store, MONTH).archived)
            return real(ref, archive)

        monkeypatch.setattr(retention, "_objects_of", gc_first)
        retention.restore_run(gc.store, run.run_id)
        assert again == [run.run_id]
        monkeypatch.setattr(retention, "_objects_of", real)
        retention.restore_run(gc.store, run.run_id)
        assert rows_of(gc.store, run.run_id) == before
    finally:
        gc.store.close()


@dataclasses.dataclass
class _Link:
    """A node of a linked list (a conversation's turns, a parsed tree) as a user's dataclass."""

    value: Any
    next: Any = None


def _links(count: int, last: str) -> _Link:
    node = _Link(last)
    for i in range(count):
        node = _Link(i, node)
    return node


@pytest.mark.parametrize("count", [300, 100_000])
def test_a_deeply_linked_dataclass_output_keeps_its_content(count: int) -> None:
    """A step output that is a chain of dataclasses (a linked list of 300 nodes) nests past the
    hasher's depth, and serde refuses it too: ``jsonable`` gave the whole value as
    ``{"$unhashable": "_Link"}`` with no digest, so two such outputs differing anywhere had one
    hash (a replay whose output changed stored as unchanged) and nothing of it showed. A
    dataclass with no document is now its fields, as the hasher takes a dataclass, cut with
    the rest below 64 levels (714d9e3's digest walks its fields); 100,000 nodes without
    RecursionError."""
    recorded, changed = jsonable(_links(count, "a")), jsonable(_links(count, "b"))
    assert recorded != changed
    assert recorded == jsonable(_links(count, "a"))
    assert recorded["value"] == count - 1 and recorded["next"]["value"] == count - 2


def test_a_deeply_linked_pydantic_output_keeps_its_content() -> None:
    """As a chain of dataclasses: a chain of 1,000 pydantic models was one
    ``{"$unhashable": "<type>"}`` with no digest (model_dump, the hasher and serde all refuse
    it); it is now its fields, cut below 64 levels with a digest of the rest."""
    pydantic = pytest.importorskip("pydantic")

    class Turn(pydantic.BaseModel):
        value: Any
        next: Any = None

    def turns(last: str) -> Any:
        node = Turn(value=last)
        for i in range(1000):
            node = Turn(value=i, next=node)
        return node

    recorded = jsonable(turns("a"))
    assert recorded != jsonable(turns("b")) and recorded == jsonable(turns("a"))
    assert recorded["value"] == 999 and recorded["next"]["value"] == 998


def test_a_value_holding_itself_twice_is_copied_once_not_once_per_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A value the hasher refuses is copied element by element for 64 levels; a container
    holding itself (a tree whose nodes name their parent, a graph) was copied again at each
    back reference until the cut: one holding itself twice took 2^64 copies, the trace hung
    at the step's end (a plain ``d["a"] = d["b"] = d`` output never returned). Here the
    back references start 55 levels down (2^9 copies before). A back reference to a container
    being copied is now ``{"$unhashable": "<type>", "cycle": <levels up>}``, and two values
    differing inside the cycle still differ."""
    calls = 0
    real = model._unhashable_parts

    def counting(value: Any, depth: int) -> Any:
        nonlocal calls
        calls += 1
        return real(value, depth)

    def looped(leaf: str) -> Any:
        node: dict[str, Any] = {"leaf": leaf}
        node["a"] = node["b"] = node
        value: Any = node
        for _ in range(55):
            value = [object(), value]
        return value

    monkeypatch.setattr(model, "_unhashable_parts", counting)
    form = jsonable(looped("x"))
    assert calls < 200  # 1,000s before
    monkeypatch.undo()
    for _ in range(55):
        form = form[1]
    assert form["a"] == {"$unhashable": "dict", "cycle": 1} and form["leaf"] == "x"
    assert jsonable(looped("y")) != jsonable(looped("x"))


def test_rewind_delete_in_a_copied_store_keeps_the_originals_archive(tmp_path: Path) -> None:
    """Two stores sharing one object store, the second a copy of the first (same run ids). The
    first archives a run; deleting that run in the copy must not delete the first's archive
    (its restore then reads 'archive missing'). Was a strict xfail: 9899b1f's rewind delete
    removed the object at a deleted run's archive key when no row of its own store named it.
    Related to closing32's 'archive references are absolute file URLs' (a restore in a copy
    deletes the original's object)."""
    import shutil

    from rewind.replay import Rewind
    from rewind.store import open_store
    from rewind.store.objects import ObjectStore
    from rewind.store.retention import collect_garbage, delete_run, restore_run
    from tests import pipelines
    from tests.test_gc import BIG, MONTH, age

    objects = ObjectStore((tmp_path / "objects").resolve().as_uri())

    def opened(name: str) -> Any:
        store = open_store(tmp_path / name, root=tmp_path / name, objects=objects)
        store.offload_min_bytes = BIG
        return store

    first = opened("first")
    try:
        run = Rewind(first).record(pipelines.pipeline, {"x": 5})
        age(first, run.run_id, 40)
    finally:
        first.close()
    shutil.copytree(tmp_path / "first", tmp_path / "copy")
    first, copy = opened("first"), opened("copy")
    try:
        assert [a.run_id for a in collect_garbage(first, MONTH).archived] == [run.run_id]
        delete_run(copy, run.run_id)
        assert restore_run(first, run.run_id).run_id == run.run_id
    finally:
        first.close()
        copy.close()


@dataclasses.dataclass(eq=False)
class _Peer:
    """A graph node hashed by identity (``eq=False``), so it can be a set member."""

    name: str
    peer: Any = None


def _peers(first_is: str) -> frozenset[_Peer]:
    """Two nodes naming each other, in a set that iterates ``first_is`` first."""
    for _ in range(1000):
        a, b = _Peer("a"), _Peer("b")
        a.peer, b.peer = b, a
        pair = frozenset({a, b})
        if next(iter(pair)).name == first_is:
            return pair
    raise AssertionError("no set iterating in that order")


def test_the_cut_digest_of_a_set_of_nodes_naming_each_other_does_not_depend_on_its_order() -> None:
    """883bcaf remembered the digest of a container whose walk referred to nothing above it;
    one met again from inside its own cycle (its peer now on the path) then digested otherwise
    than the tree walk, so the digest of a set of two nodes naming each other depended on which
    the set gave first: on their addresses, another at each run (an unchanged replay stored as
    changed). Only a container holding no back reference at all is remembered."""
    assert model._cut_digest(_peers("a")) == model._cut_digest(_peers("b"))
