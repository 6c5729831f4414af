"""A session reads a finished parent's nodes and lineage once for all its forks
(:mod:`rewind.engine.parent_reads`), and never serves a stale read: a run recorded again under
a reused id, a running run, a gc that deleted blobs, or a changed set of ancestors read afresh.
Real Burr runs recorded into a real SQLite store."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import event

from rewind.engine.parent_reads import ParentReads
from rewind.replay import ParamOverride, Rewind
from tests import pipelines


def _count_reads(rw: Rewind) -> Counter[str]:
    """Reads of whole node / call rows (``Store.nodes_of``; not the token sums a run's finish
    reads of its own nodes), of recorded graph hashes and of blobs, through the store's engine.
    """
    seen: Counter[str] = Counter()

    def count(conn: object, cursor: object, statement: str, *args: Any) -> None:
        s = " ".join(statement.split()).upper()
        for table in ("NODES", "CALLS"):
            if s.startswith(f"SELECT {table}.RUN_ID, {table}.POSITION,"):
                seen[table.lower()] += 1
        if s.startswith("SELECT RUN_GRAPHS.RUN_ID, RUN_GRAPHS.GRAPH_HASH FROM"):
            seen["graph hashes"] += 1
        if s.startswith("SELECT BLOBS.HASH, BLOBS.CODEC"):
            seen["blobs"] += 1

    event.listen(rw.store.engine, "before_cursor_execute", count)
    return seen


def test_forks_of_one_parent_read_its_nodes_once_and_replay_identically(tmp_path: Path) -> None:
    rw = Rewind(tmp_path / "store")
    parent = rw.record(pipelines.pipeline, {"x": 5})
    seen = _count_reads(rw)
    first = rw.replay(parent.run_id, at=1)
    reads = dict(seen)
    assert reads["nodes"] >= 1 and reads["calls"] >= 1 and reads["graph hashes"] == 1
    assert reads["blobs"] >= 2  # the lineage's results, the initial state's fields
    second = rw.replay(parent.run_id, at=1)
    assert dict(seen) == reads  # the second replay read nothing of its parent again
    forked = rw.fork(parent.run_id, at="expand", override=ParamOverride("expand", "factor", 3))
    for what in ("nodes", "calls", "graph hashes"):  # (it loads the state it resumes from)
        assert seen[what] == reads[what]
    parent_nodes = rw.store.nodes_of(parent.run_id)
    for child in (first, second):
        nodes = rw.store.nodes_of(child.run_id)
        assert [n.state_hash for n in nodes] == [n.state_hash for n in parent_nodes]
        assert all(n.cache_outcome in ("hit", "none") for n in nodes)
    assert forked.status == "completed"
    assert rw.store.nodes_of(forked.run_id)[0].state_hash == parent_nodes[0].state_hash


def test_a_run_recorded_again_under_its_id_or_still_running_is_read_afresh(
    tmp_path: Path,
) -> None:
    rw = Rewind(tmp_path / "store")
    parent = rw.record(pipelines.pipeline, {"x": 5})
    reads = ParentReads(rw.store)
    seen = _count_reads(rw)
    nodes = reads.nodes(parent)
    assert reads.nodes(parent) is nodes and seen["nodes"] == 1
    # the same id with another created_at: another run (deleted, then recorded again)
    again = dataclasses.replace(parent, created_at=parent.created_at + 1)
    assert reads.nodes(again) == nodes and seen["nodes"] == 2
    running = dataclasses.replace(parent, status="running", finished_at=None)
    reads.nodes(running)
    reads.nodes(running)
    assert seen["nodes"] == 4  # never kept while it grows


def test_lineage_is_rebuilt_after_a_gc_and_handed_out_as_copies(tmp_path: Path) -> None:
    rw = Rewind(tmp_path / "store")
    parent = rw.record(pipelines.pipeline, {"x": 5})
    reads = ParentReads(rw.store)
    reads.nodes(parent)
    built: list[int] = []

    def build(ancestors: Any) -> Any:
        built.append(len(ancestors))
        return rw._lineages(parent, reads.nodes(parent), ancestors)

    (lineage, at, _slots, _failed), blobs = reads.lineage(parent, build)
    assert lineage and set(blobs) == {e.result_hash for e in lineage.values()}
    lineage.clear()  # a replay changes its own copies only
    blobs.clear()
    (again, _, _, _), blobs_again = reads.lineage(parent, build)
    assert built == [0] and again and blobs_again
    rw.store._blob_epoch = "bumped by a gc"  # what a write sees after `rewind gc` deleted blobs
    (after_gc, at_after, _, _), _ = reads.lineage(parent, build)
    assert built == [0, 0]
    assert after_gc == again and at_after == at


def test_a_fork_of_a_fork_keeps_the_lineage_of_its_ancestors(tmp_path: Path) -> None:
    rw = Rewind(tmp_path / "store")
    parent = rw.record(pipelines.pipeline, {"x": 5})
    child = rw.replay(parent.run_id, at=2)
    seen = _count_reads(rw)
    first = rw.replay(child.run_id, at=1)
    reads = dict(seen)
    second = rw.replay(child.run_id, at=1)
    # the second: the child's rows and the lineage over it and its parent from memory
    assert dict(seen) == reads
    parent_nodes = rw.store.nodes_of(parent.run_id)
    for run in (first, second):
        nodes = rw.store.nodes_of(run.run_id)
        assert [n.state_hash for n in nodes] == [n.state_hash for n in parent_nodes]
        assert all(n.cache_outcome in ("hit", "none") for n in nodes)


def test_a_fork_reads_no_audit_of_its_parent_and_get_run_still_does(tmp_path: Path) -> None:
    rw = Rewind(tmp_path / "store")
    parent = rw.record(pipelines.pipeline, {"x": 5})
    rw.store.record_audit(parent.run_id, against=None, label="vacuous", note="n", counts={})
    assert rw.store.get_run(parent.run_id).admissible == "vacuous"
    assert rw.store.get_run(parent.run_id, audit=False).last_audit is None
    assert rw.finished_run(parent.run_id).last_audit is None
    child = rw.replay(parent.run_id, at=1)  # forks an audited run as any other
    assert child.status == "completed" and child.last_audit is None
    assert rw.store.get_run(parent.run_id).admissible == "vacuous"
