"""The demo's script: record the research pipeline, fork it at ``analyse`` with one param changed,
replay an unchanged branch from the same node, and diff. ``rewind demo`` prints it;
``rewind verify`` checks it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewind.diff import TrajectoryDiff
from rewind.examples import research
from rewind.replay import ParamOverride, Rewind
from rewind.store import NodeRecord, RunRecord

FORK_NODE = "analyse"
FORK_NUMBER = 3  # 1-based: plan, research, analyse


@dataclass(frozen=True)
class DemoResult:
    """Everything the demo produced.

    ``parent_rows_before`` is the parent's node rows read right after recording, before any fork,
    so ``verify`` can prove forks left them untouched (rule 7).
    """

    parent: RunRecord
    fork: RunRecord
    replay: RunRecord
    override: ParamOverride
    parent_rows_before: tuple[NodeRecord, ...]
    diff: TrajectoryDiff
    replay_diff: TrajectoryDiff


def demo_override(rw: Rewind, parent: RunRecord) -> ParamOverride:
    """The one change: regroup ``analyse`` another way — by season when the data allows it (else
    the first other valid grouping), or, with a single possible grouping, change the aggregate."""
    from rewind.examples import weather

    node = next(n for n in rw.store.nodes_of(parent.run_id) if n.name == FORK_NODE)
    used = node.params.get("group_by")
    dataset = rw.node_state(node)["dataset"]
    options = [g for g in weather.valid_group_bys(dataset) if g != used]
    if options:
        choice = "season" if "season" in options else options[0]
        return ParamOverride(FORK_NODE, "group_by", choice)
    aggregate = node.params.get("aggregate")
    other = next(a for a in weather.AGGREGATES if a != aggregate)
    return ParamOverride(FORK_NODE, "aggregate", other)


def run_demo(
    rw: Rewind,
    *,
    csv_path: str | Path | None = None,
    question: str | None = None,
    on_stage: Callable[[str], Any] | None = None,
) -> DemoResult:
    """Record → fork at node 3 with one param changed → unchanged replay from node 3 → diff.

    Raises:
        RewindError: the recording failed (the message says at which node and why).
        weather.DataError: the CSV cannot be read.
    """
    stage = on_stage or (lambda _s: None)
    pipeline = research.build()
    stage("record")
    parent = rw.record(
        pipeline,
        research.initial_state(csv_path, question),
        config={"model": rw.chat_client.endpoint.model if rw.chat_client else None},
    )
    if parent.status != "completed":
        from rewind.errors import RewindError

        raise RewindError(
            f"recording the demo failed: {parent.error}",
            f"inspect it with rewind show {parent.run_id}",
        )
    rows_before = tuple(rw.store.nodes_of(parent.run_id))
    override = demo_override(rw, parent)
    stage("fork")
    # The changed branch publishes a report of its own: its publish call has new arguments, so it
    # must run live (recorded mode would refuse to serve a call it has no record of).
    fork = rw.fork(parent.run_id, at=FORK_NUMBER, override=override, effects="live")
    stage("replay")
    replay = rw.replay(parent.run_id, at=FORK_NUMBER)
    stage("diff")
    return DemoResult(
        parent=parent,
        fork=fork,
        replay=replay,
        override=override,
        parent_rows_before=rows_before,
        diff=rw.diff(parent.run_id, fork.run_id),
        replay_diff=rw.diff(parent.run_id, replay.run_id),
    )
