"""Tests for the record / fork / replay / diff engine on real Burr applications.

Uses the small pipelines of ``tests.pipelines``: ``pipeline`` (start → expand → big|small, with
``expr("total >= 20")`` choosing big), a pipeline failing at its 2nd node, one blocking in its 2nd
node, a tool-cache probe and an LLM pipeline served by the fake model of ``conftest``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from rewind.context import RunContext, activate
from rewind.errors import (
    ForkError,
    InvalidOverride,
    RewindError,
    RunBusy,
    StoreError,
    UnknownNode,
    UnknownRun,
)
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.recorder import semantic_state
from rewind.replay import (
    OutputOverride,
    ParamOverride,
    Rewind,
    parse_override,
)
from rewind.store import NodeRecord, RunRecord
from rewind.tools import Tool
from tests import pipelines
from tests.conftest import FAKE_BASE_URL, FAKE_MODEL, FakeModel, row_counts

HEX64 = re.compile(r"^[0-9a-f]{64}$")


def nodes(rw: Rewind, run: RunRecord | str) -> list[NodeRecord]:
    return rw.store.nodes_of(run if isinstance(run, str) else run.run_id)


def names(rw: Rewind, run: RunRecord | str) -> list[str]:
    return [n.name for n in nodes(rw, run)]


def outcomes(rw: Rewind, run: RunRecord | str) -> list[tuple[str, str, str]]:
    return [(n.name, n.cache_outcome, n.cache_reason) for n in nodes(rw, run)]


def outputs(rw: Rewind, run: RunRecord | str) -> list[dict]:
    return [rw.node_output(n) for n in nodes(rw, run)]


def assert_same_trajectory(rw: Rewind, parent: RunRecord, child: RunRecord) -> None:
    """Every node of ``child`` has the parent's name, input, output and state hashes."""
    a, b = nodes(rw, parent), nodes(rw, child)
    assert [n.name for n in b] == [n.name for n in a]
    for pa, pb in zip(a, b, strict=True):
        assert (pb.input_hash, pb.output_hash, pb.state_hash) == (
            pa.input_hash,
            pa.output_hash,
            pa.state_hash,
        ), pa.name


# -- record --------------------------------------------------------------------------------------


def test_record_x5_takes_the_small_branch_and_records_three_nodes(rw: Rewind) -> None:
    run = rw.record(pipelines.pipeline, {"x": 5})

    assert run.status == "completed"
    assert run.error is None
    assert run.parent_run_id is None
    recorded = nodes(rw, run)
    assert [n.name for n in recorded] == ["start", "expand", "small"]
    assert [n.position for n in recorded] == [0, 1, 2]
    for n in recorded:
        assert HEX64.match(n.input_hash), n.name
        assert n.output_hash is not None and HEX64.match(n.output_hash), n.name
        assert n.state_hash is not None and HEX64.match(n.state_hash), n.name
        assert (n.cache_outcome, n.cache_reason) == ("miss", "bypass")
        assert not n.inherited
        assert n.src_app_id == run.run_id
        assert [c.outcome for c in n.calls] == ["miss"]
    assert len({n.state_hash for n in recorded}) == 3
    assert [n.params for n in recorded] == [{"offset": 10}, {"factor": 2}, {}]
    assert outputs(rw, run) == [
        {"total": 15},
        {"series": [30, 2, 4]},
        {"verdict": {"size": "small", "sum": 36}},
    ]
    assert pipelines.CALLS == ["t_add", "t_scale", "t_add"]


def test_record_x15_takes_the_big_branch(rw: Rewind) -> None:
    run = rw.record(pipelines.pipeline, {"x": 15})

    assert run.status == "completed"
    recorded = nodes(rw, run)
    assert [n.name for n in recorded] == ["start", "expand", "big"]
    for n in recorded:
        assert HEX64.match(n.input_hash)
        assert n.output_hash is not None and HEX64.match(n.output_hash)
        assert n.state_hash is not None and HEX64.match(n.state_hash)
        assert (n.cache_outcome, n.cache_reason) == ("miss", "bypass")
    assert [n.params for n in recorded] == [{"offset": 10}, {"factor": 2}, {}]
    assert rw.node_output(recorded[2]) == {"verdict": {"size": "big", "sum": 56}}


def test_record_stores_semantic_state_and_node_input(rw: Rewind) -> None:
    run = rw.record(pipelines.pipeline, {"x": 5})
    start, expand, small = nodes(rw, run)

    assert rw.node_state(small) == {
        "x": 5,
        "total": 15,
        "series": [30, 2, 4],
        "verdict": {"size": "small", "sum": 36},
    }
    assert rw.node_input(expand) == {
        "inputs": {},
        "node": "expand",
        "params": {"factor": 2},
        "reads": {"total": 15},
    }
    assert rw.node_input(start)["params"] == {"offset": 10}


def test_record_same_run_id_twice_is_refused(rw: Rewind) -> None:
    rw.record(pipelines.pipeline, {"x": 5}, run_id="run-a")
    with pytest.raises(StoreError, match="already exists"):
        rw.record(pipelines.pipeline, {"x": 5}, run_id="run-a")
    assert len(nodes(rw, "run-a")) == 3


# -- unchanged replay ----------------------------------------------------------------------------


@pytest.mark.parametrize("x", [5, 15])
@pytest.mark.parametrize("at", [1, 2, 3])
def test_unchanged_replay_is_all_hits_zero_tokens_identical_hashes(
    rw: Rewind, at: int, x: int
) -> None:
    parent = rw.record(pipelines.pipeline, {"x": x})
    pipelines.CALLS.clear()

    fork = rw.replay(parent.run_id, at=at)

    assert fork.status == "completed"
    assert pipelines.CALLS == []  # no tool executed again
    assert fork.tokens == 0
    assert fork.parent_run_id == parent.run_id
    assert fork.fork_position == at - 1
    assert fork.override is None
    assert_same_trajectory(rw, parent, fork)
    before, after = nodes(rw, parent), nodes(rw, fork)
    for i, (p, c) in enumerate(zip(before, after, strict=True)):
        assert c.tokens == 0
        if i < at - 1:
            assert c.inherited
            assert (c.cache_outcome, c.cache_reason) == ("inherited", "fork")
            assert (c.src_app_id, c.src_sequence_id) == (p.src_app_id, p.src_sequence_id)
            assert c.calls == ()
        else:
            assert not c.inherited
            assert (c.cache_outcome, c.cache_reason) == ("hit", "hit")
            assert c.src_app_id == fork.run_id
            assert [call.outcome for call in c.calls] == ["hit"]
            assert [call.key for call in c.calls] == [call.key for call in p.calls]
    diff = rw.diff(parent.run_id, fork.run_id)
    assert diff.first_divergence is None
    assert diff.token_delta == 0
    assert all(row.hash_equal for row in diff.nodes)


def test_fork_state_has_no_override_or_telemetry_keys(rw: Rewind) -> None:
    parent = rw.record(pipelines.pipeline, {"x": 5})
    replay = rw.replay(parent.run_id, at=1)
    changed = rw.fork(parent.run_id, at=1, override=ParamOverride("start", "offset", 1))

    for p, c in zip(nodes(rw, parent), nodes(rw, replay), strict=True):
        assert rw.node_state(c) == rw.node_state(p)
    for p, c in zip(nodes(rw, parent), nodes(rw, changed), strict=True):
        assert set(rw.node_state(c)) == set(rw.node_state(p))
    for n in nodes(rw, replay) + nodes(rw, changed):
        raw = rw.store.load_state_row("", n.src_app_id, n.src_sequence_id)
        assert raw is not None
        assert set(semantic_state(raw["values"])) <= {"x", "total", "series", "verdict"}
        assert {k for k in raw["values"] if k.startswith("__")} <= {
            "__PRIOR_STEP",
            "__SEQUENCE_ID",
        }


# -- param forks ---------------------------------------------------------------------------------


def test_param_fork_on_first_node_misses_with_override_then_new_input(rw: Rewind) -> None:
    parent = rw.record(pipelines.pipeline, {"x": 5})
    pipelines.CALLS.clear()

    fork = rw.fork(parent.run_id, at=1, override=ParamOverride("start", "offset", 1))

    assert fork.status == "completed"
    assert fork.override == {"kind": "param", "node": "start", "param": "offset", "value": 1}
    assert outcomes(rw, fork) == [
        ("start", "miss", "override"),
        ("expand", "miss", "new-input"),
        ("small", "miss", "new-input"),
    ]
    assert nodes(rw, fork)[0].params == {"offset": 1}
    assert outputs(rw, fork)[0] == {"total": 6}
    assert pipelines.CALLS == ["t_add", "t_scale", "t_add"]

    diff = rw.diff(parent.run_id, fork.run_id)
    first = diff.first_divergence
    assert first is not None
    assert (first.index, first.name) == (0, "start")
    assert [(c.path, c.old, c.new) for c in first.changes] == [("total", 15, 6)]


def test_param_fork_can_switch_the_conditional_branch(rw: Rewind) -> None:
    parent = rw.record(pipelines.pipeline, {"x": 5})

    fork = rw.fork(parent.run_id, at="start", override=ParamOverride("start", "offset", 20))

    assert names(rw, fork) == ["start", "expand", "big"]
    assert outputs(rw, fork)[2] == {"verdict": {"size": "big", "sum": 56}}
    statuses = [row.status for row in rw.diff(parent.run_id, fork.run_id).nodes]
    assert statuses.count("only_a") == 1 and statuses.count("only_b") == 1


def test_param_override_on_a_later_node_keeps_earlier_nodes_hits(rw: Rewind) -> None:
    parent = rw.record(pipelines.pipeline, {"x": 5})
    pipelines.CALLS.clear()

    fork = rw.fork(parent.run_id, at=1, override=ParamOverride("expand", "factor", 3))

    assert outcomes(rw, fork) == [
        ("start", "hit", "hit"),
        ("expand", "miss", "override"),
        ("small", "miss", "new-input"),
    ]
    start, expand, _ = nodes(rw, fork)
    assert start.output_hash == nodes(rw, parent)[0].output_hash
    assert expand.params == {"factor": 3}
    assert outputs(rw, fork)[1:] == [
        {"series": [45, 3, 6]},
        {"verdict": {"size": "small", "sum": 54}},
    ]
    assert pipelines.CALLS == ["t_scale", "t_add"]
    first = rw.diff(parent.run_id, fork.run_id).first_divergence
    assert first is not None and first.name == "expand"


# -- output override -----------------------------------------------------------------------------


def test_output_override_replaces_the_field_without_running_the_node(rw: Rewind) -> None:
    parent = rw.record(pipelines.pipeline, {"x": 5})
    assert outputs(rw, parent)[1] == {"series": [30, 2, 4]}
    pipelines.CALLS.clear()

    fork = rw.fork(
        parent.run_id, at="expand", override=OutputOverride("expand", "series", [100, 2, 4])
    )

    assert fork.status == "completed"
    assert [(n, o) for n, o, _ in outcomes(rw, fork)] == [
        ("start", "inherited"),
        ("expand", "override"),
        ("small", "miss"),
    ]
    assert outputs(rw, fork)[1:] == [
        {"series": [100, 2, 4]},
        {"verdict": {"size": "small", "sum": 106}},
    ]
    assert rw.node_state(nodes(rw, fork)[1])["series"] == [100, 2, 4]
    assert pipelines.CALLS == ["t_add"]  # expand's t_scale was not executed

    diff = rw.diff(parent.run_id, fork.run_id)
    first = diff.first_divergence
    assert first is not None and (first.index, first.name) == (1, "expand")
    assert [(c.path, c.kind, c.old, c.new) for c in first.changes] == [
        ("series[0]", "changed", 30, 100)
    ]


def test_output_override_of_the_last_node(rw: Rewind) -> None:
    parent = rw.record(pipelines.pipeline, {"x": 5})

    fork = rw.fork(parent.run_id, at=3, override=OutputOverride("small", "verdict", {"size": "?"}))

    assert fork.status == "completed"
    assert [o for _, o, _ in outcomes(rw, fork)] == ["inherited", "inherited", "override"]
    assert outputs(rw, fork)[2] == {"verdict": {"size": "?"}}


@pytest.mark.parametrize("field", ["total", "x", "__PRIOR_STEP"])
def test_output_override_of_a_field_the_node_did_not_write_is_refused(
    rw: Rewind, field: str
) -> None:
    parent = rw.record(pipelines.pipeline, {"x": 5})
    before = row_counts(rw.store)

    with pytest.raises(InvalidOverride, match=field):
        rw.fork(parent.run_id, at="expand", override=OutputOverride("expand", field, 99))
    assert row_counts(rw.store) == before


# -- nested forks and the first node -------------------------------------------------------------


def test_nested_fork_resolves_the_source_through_the_grandparent(rw: Rewind) -> None:
    grandparent = rw.record(pipelines.pipeline, {"x": 5})
    parent = rw.replay(grandparent.run_id, at=3)  # start and expand inherited from grandparent
    pipelines.CALLS.clear()

    child = rw.fork(parent.run_id, at=2)  # predecessor `start` lives in the grandparent's app

    assert child.status == "completed"
    assert child.burr_fork_app_id == grandparent.run_id
    assert child.burr_fork_sequence_id == nodes(rw, grandparent)[0].src_sequence_id
    assert outcomes(rw, child) == [
        ("start", "inherited", "fork"),
        ("expand", "hit", "hit"),
        ("small", "hit", "hit"),
    ]
    assert nodes(rw, child)[0].src_app_id == grandparent.run_id
    assert_same_trajectory(rw, grandparent, child)

    again = rw.replay(child.run_id, at=1)
    assert [o for _, o, _ in outcomes(rw, again)] == ["hit", "hit", "hit"]
    assert again.tokens == 0
    assert_same_trajectory(rw, grandparent, again)
    assert pipelines.CALLS == []


def test_nested_fork_at_the_last_node_with_two_inherited_levels(rw: Rewind) -> None:
    grandparent = rw.record(pipelines.pipeline, {"x": 15})
    parent = rw.replay(grandparent.run_id, at=2)
    child = rw.replay(parent.run_id, at=3)

    # the child's `expand` predecessor row lives in the parent's app (the parent re-ran it)
    assert child.burr_fork_app_id == parent.run_id
    assert_same_trajectory(rw, grandparent, child)
    assert [n.src_app_id for n in nodes(rw, child)] == [
        grandparent.run_id,
        parent.run_id,
        child.run_id,
    ]


def test_fork_of_the_first_node_records_the_parent(rw: Rewind) -> None:
    parent = rw.record(pipelines.pipeline, {"x": 5}, config={"model": "none"})

    fork = rw.replay(parent.run_id, at="start")

    assert fork.parent_run_id == parent.run_id
    assert fork.fork_node == "start"
    assert fork.fork_position == 0
    assert fork.burr_fork_app_id is None
    assert fork.initial_state_hash == parent.initial_state_hash
    assert fork.config == {"model": "none"}
    assert [r.run_id for r in rw.store.children(parent.run_id)] == [fork.run_id]
    assert [n.src_sequence_id for n in nodes(rw, fork)] == [0, 1, 2]
    assert all(n.src_app_id == fork.run_id for n in nodes(rw, fork))


def test_fork_by_run_id_prefix(rw: Rewind) -> None:
    parent = rw.record(pipelines.pipeline, {"x": 5}, run_id="abcdef0123456789")
    fork = rw.replay("abcdef01", at=2)
    assert fork.parent_run_id == parent.run_id


# -- parent immutability -------------------------------------------------------------------------


def test_forks_never_change_the_parent(rw: Rewind) -> None:
    parent = rw.record(pipelines.pipeline, {"x": 5})
    nodes_before = nodes(rw, parent)
    run_before = rw.store.get_run(parent.run_id)
    state_before = [rw.node_state(n) for n in nodes_before]

    forks = [
        rw.replay(parent.run_id, at=1),
        rw.replay(parent.run_id, at=3),
        rw.fork(parent.run_id, at=1, override=ParamOverride("start", "offset", 20)),
        rw.fork(parent.run_id, at=2, override=ParamOverride("expand", "factor", 5)),
        rw.fork(parent.run_id, at=2, override=OutputOverride("expand", "series", [1, 1, 1])),
    ]
    assert [f.status for f in forks] == ["completed"] * 5
    rw.replay(forks[2].run_id, at=2)  # and a fork of a fork

    assert nodes(rw, parent) == nodes_before
    assert rw.store.get_run(parent.run_id) == run_before
    assert [rw.node_state(n) for n in nodes(rw, parent)] == state_before
    assert len(rw.store.children(parent.run_id)) == 5


# -- errors write nothing ------------------------------------------------------------------------


@pytest.fixture
def recorded(rw: Rewind) -> RunRecord:
    return rw.record(pipelines.pipeline, {"x": 5})


def test_fork_of_an_unknown_run_raises_and_writes_nothing(rw: Rewind, recorded: RunRecord) -> None:
    before = row_counts(rw.store)
    with pytest.raises(UnknownRun, match="no-such-run"):
        rw.fork("no-such-run", at=1)
    assert row_counts(rw.store) == before


def test_fork_at_an_unknown_node_name_raises_and_writes_nothing(
    rw: Rewind, recorded: RunRecord
) -> None:
    before = row_counts(rw.store)
    with pytest.raises(UnknownNode, match="'big'") as info:
        rw.fork(recorded.run_id, at="big")
    assert "1:start, 2:expand, 3:small" in info.value.hint
    with pytest.raises(UnknownNode):
        rw.fork(recorded.run_id, at="expand#2")
    assert row_counts(rw.store) == before


@pytest.mark.parametrize("at", [0, 4, "4", -1])
def test_fork_at_an_out_of_range_number_raises_and_writes_nothing(
    rw: Rewind, recorded: RunRecord, at: int | str
) -> None:
    before = row_counts(rw.store)
    with pytest.raises(UnknownNode):
        rw.fork(recorded.run_id, at=at)
    assert row_counts(rw.store) == before


def test_param_the_node_does_not_have_is_refused_naming_it(rw: Rewind, recorded: RunRecord) -> None:
    before = row_counts(rw.store)
    with pytest.raises(InvalidOverride, match="'temperature'") as info:
        rw.fork(recorded.run_id, at=1, override=ParamOverride("start", "temperature", 0.5))
    assert "offset" in info.value.hint
    assert row_counts(rw.store) == before


def test_param_of_a_node_the_run_never_reached_is_refused(rw: Rewind, recorded: RunRecord) -> None:
    before = row_counts(rw.store)
    with pytest.raises(InvalidOverride, match="'big'"):
        rw.fork(recorded.run_id, at=1, override=ParamOverride("big", "offset", 1))
    assert row_counts(rw.store) == before


def test_output_field_the_node_does_not_have_is_refused(rw: Rewind, recorded: RunRecord) -> None:
    before = row_counts(rw.store)
    with pytest.raises(InvalidOverride, match="'nonexistent'") as info:
        rw.fork(recorded.run_id, at=2, override=OutputOverride("expand", "nonexistent", 1))
    assert "series" in info.value.hint
    assert row_counts(rw.store) == before


def test_output_override_of_a_node_other_than_the_fork_node_is_refused(
    rw: Rewind, recorded: RunRecord
) -> None:
    before = row_counts(rw.store)
    with pytest.raises(InvalidOverride, match="fork is at 'start'"):
        rw.fork(recorded.run_id, at=1, override=OutputOverride("expand", "series", [1]))
    assert row_counts(rw.store) == before


def test_param_override_before_the_fork_point_is_refused(rw: Rewind, recorded: RunRecord) -> None:
    before = row_counts(rw.store)
    with pytest.raises(InvalidOverride, match="runs before the fork node"):
        rw.fork(recorded.run_id, at=2, override=ParamOverride("start", "offset", 1))
    assert row_counts(rw.store) == before


@pytest.mark.parametrize("spec", ["nodot=1", "a.b", ".b=1", "a.=1", "=1", ""])
def test_parse_override_refuses_malformed_specs(spec: str) -> None:
    with pytest.raises(InvalidOverride, match="malformed override"):
        parse_override(spec)
    with pytest.raises(InvalidOverride, match="malformed override"):
        parse_override(spec, output=True)


def test_parse_override_refuses_an_output_value_that_is_not_json() -> None:
    with pytest.raises(InvalidOverride, match="not valid JSON"):
        parse_override("compose.prose=hello world", output=True)
    with pytest.raises(InvalidOverride, match="not valid JSON"):
        parse_override("expand.series=[1, 2", output=True)


def test_parse_override_reads_json_values_and_plain_strings() -> None:
    assert parse_override("start.offset=3") == ParamOverride("start", "offset", 3)
    assert parse_override("plan.temperature=0.5") == ParamOverride("plan", "temperature", 0.5)
    assert parse_override("research.query=rain in May") == ParamOverride(
        "research", "query", "rain in May"
    )
    assert parse_override("a.b=x=y") == ParamOverride("a", "b", "x=y")
    assert parse_override('expand.series=[100, 2, {"k": null}]', output=True) == OutputOverride(
        "expand", "series", [100, 2, {"k": None}]
    )


def test_fork_of_a_run_row_still_running_raises_run_busy(rw: Rewind) -> None:
    with rw.store.write() as conn:
        rw.store.create_run(conn, run_id="hand-made", pipeline="tiny", pipeline_ref="")
    before = row_counts(rw.store)
    with pytest.raises(RunBusy, match="still running"):
        rw.fork("hand-made", at=1)
    assert row_counts(rw.store) == before


def test_fork_while_the_run_executes_in_another_thread_raises_run_busy(rw: Rewind) -> None:
    pipelines.BLOCK_ENTERED.clear()
    pipelines.BLOCK_RELEASE.clear()
    finished: list[RunRecord] = []
    worker = threading.Thread(
        target=lambda: finished.append(rw.record(pipelines.blocking, {"x": 1}, run_id="busy-run")),
        daemon=True,
    )
    worker.start()
    try:
        while not pipelines.BLOCK_ENTERED.wait(0.05):
            assert worker.is_alive(), "the blocking run ended before reaching its 2nd node"
        assert rw.store.get_run("busy-run").status == "running"
        # the recorder commits the finished first node within its flush interval, from its
        # flusher thread: wait for that commit, so the counts below see only the fork's writes
        while not rw.store.nodes_of("busy-run"):
            assert worker.is_alive()
            time.sleep(0.01)
        before = row_counts(rw.store)
        with pytest.raises(RunBusy):
            rw.fork("busy-run", at=1)
        assert row_counts(rw.store) == before
    finally:
        pipelines.BLOCK_RELEASE.set()
        worker.join()

    assert [r.status for r in finished] == ["completed"]
    assert rw.replay("busy-run", at=2).status == "completed"


def test_run_failing_at_node_2_records_the_error_on_its_row(rw: Rewind) -> None:
    run = rw.record(pipelines.failing, {"x": 1})

    assert run.status == "failed"
    assert run.error is not None and "boom went off" in run.error
    prepare, boom = nodes(rw, run)
    assert (prepare.cache_outcome, prepare.error) == ("miss", None)
    assert (boom.cache_outcome, boom.cache_reason) == ("failed", "RuntimeError")
    assert boom.error == "RuntimeError: boom went off"
    assert boom.output_hash is None and boom.state_hash is None
    assert boom.params == {"fail": True}


def test_fork_of_a_failed_run_after_the_failure_raises_fork_error(rw: Rewind) -> None:
    run = rw.record(pipelines.failing, {"x": 1})
    before = row_counts(rw.store)
    with pytest.raises(ForkError, match="failed at node 'boom'"):
        rw.fork(run.run_id, at="finish")
    assert row_counts(rw.store) == before


def test_fork_of_a_failed_run_at_node_number_3_raises_fork_error(rw: Rewind) -> None:
    run = rw.record(pipelines.failing, {"x": 1})
    with pytest.raises(ForkError):
        rw.fork(run.run_id, at=3)


def test_fork_of_a_failed_run_at_the_failed_node_reruns_it(rw: Rewind) -> None:
    run = rw.record(pipelines.failing, {"x": 1})

    fixed = rw.fork(run.run_id, at=2, override=ParamOverride("boom", "fail", False))
    assert fixed.status == "completed"
    assert fixed.error is None
    assert outcomes(rw, fixed) == [
        ("prepare", "inherited", "fork"),
        ("boom", "miss", "override"),
        ("finish", "none", "no-calls"),
    ]
    assert outputs(rw, fixed)[1:] == [{"checked": 102}, {"done": 204}]

    again = rw.fork(run.run_id, at="boom")
    assert again.status == "failed"
    assert [o for _, o, _ in outcomes(rw, again)] == ["inherited", "failed"]


def test_missing_fork_source_row_raises_fork_error_and_writes_nothing(
    rw: Rewind, recorded: RunRecord
) -> None:
    start = nodes(rw, recorded)[0]
    with rw.store.write() as conn:
        deleted = conn.execute(
            text("DELETE FROM burr_state WHERE app_id = :a AND sequence_id = :s"),
            {"a": start.src_app_id, "s": start.src_sequence_id},
        ).rowcount
    assert deleted == 1
    before = row_counts(rw.store)

    with pytest.raises(ForkError, match="missing"):
        rw.fork(recorded.run_id, at=2)
    with pytest.raises(ForkError, match="missing"):
        rw.fork(recorded.run_id, at=1, override=OutputOverride("start", "total", 1))
    assert row_counts(rw.store) == before


def test_rolled_back_record_does_not_poison_later_records(rw: Rewind) -> None:
    """A rolled-back write must not leave blobs the store believes it holds."""
    rw.record(pipelines.pipeline, {"x": 5}, run_id="taken")
    with pytest.raises(StoreError):
        rw.record(pipelines.pipeline, {"x": 7}, run_id="taken")  # rolled back

    run = rw.record(pipelines.pipeline, {"x": 7})
    assert run.initial_state_hash is not None
    assert rw.store.resolve_fields(rw.store.get_json(run.initial_state_hash)) == {"x": 7}
    assert rw.replay(run.run_id, at=1).status == "completed"


# -- tool cache ----------------------------------------------------------------------------------


def test_tool_cache_keys_by_name_and_canonical_arguments(rw: Rewind) -> None:
    run = rw.record(pipelines.probes, {})

    assert run.status == "completed"
    assert pipelines.TOOL_CALLS == [
        ("t_sub", (5, 3)),  # t_sub(b=3, a=5) did not execute again
        ("t_first", [7, 9]),
        ("t_first", [9, 7]),
        ("t_double_a", 4),
        ("t_double_b", 4),
    ]
    assert outputs(rw, run) == [{"kw": [2, 2], "pair": [7, 9], "twins": [8, 8]}]
    calls = nodes(rw, run)[0].calls
    assert [c.name for c in calls] == [
        "t_sub",
        "t_sub",
        "t_first",
        "t_first",
        "t_double_a",
        "t_double_b",
    ]
    assert [c.outcome for c in calls] == ["miss", "hit", "miss", "miss", "miss", "miss"]
    assert calls[0].key == calls[1].key
    assert calls[2].key != calls[3].key
    assert calls[4].key != calls[5].key
    assert calls[4].request_hash == calls[5].request_hash  # same arguments, different tool
    assert rw.store.cache_sizes()["tool_cache"] == 5  # 6 calls, 5 distinct keys


def test_tool_replay_executes_nothing(rw: Rewind) -> None:
    run = rw.record(pipelines.probes, {})
    pipelines.TOOL_CALLS.clear()

    fork = rw.replay(run.run_id)

    assert pipelines.TOOL_CALLS == []
    assert [c.outcome for c in nodes(rw, fork)[0].calls] == ["hit"] * 6
    assert_same_trajectory(rw, run, fork)


def test_renamed_tool_is_a_miss_never_a_positional_match(rw: Rewind) -> None:
    rw.record(pipelines.probes, {})
    renamed = Tool(pipelines.t_double_a.fn, "t_double_renamed", "deterministic")
    pipelines.TOOL_CALLS.clear()

    ctx = RunContext(store=rw.store, run_id="probe-ctx", read_cache=True)
    with activate(ctx):
        ctx.begin_node("probe", 0)
        assert pipelines.t_double_a(4) == 8
        assert renamed(4) == 8
        scope = ctx.node
    assert scope is not None
    assert [(c.name, c.outcome, c.reason) for c in scope.calls] == [
        ("t_double_a", "hit", "hit"),
        ("t_double_renamed", "miss", "no-entry"),
    ]
    assert pipelines.TOOL_CALLS == [("t_double_a", 4)]  # only the renamed tool's body ran


# -- LLM cache -----------------------------------------------------------------------------------


def test_record_llm_pipeline_calls_the_model_once_and_counts_tokens(
    rw_llm: Rewind, fake_model: FakeModel
) -> None:
    run = rw_llm.record(pipelines.llm_pipeline, {"question": "why?"})

    assert run.status == "completed", run.error
    assert fake_model.count == 1
    sent = fake_model.requests[0]
    assert (sent["model"], sent["temperature"], sent["max_tokens"]) == (FAKE_MODEL, 0.0, 32)
    ask, shout = nodes(rw_llm, run)
    assert (ask.cache_outcome, ask.cache_reason) == ("miss", "bypass")
    assert [c.kind for c in ask.calls] == ["llm"]
    assert ask.params == {"max_tokens": 32, "temperature": 0.0}
    assert (ask.prompt_tokens, ask.completion_tokens) == (11, 5)
    assert run.tokens == 16
    assert rw_llm.node_output(shout) == {"loud": "ANSWER TO WHY? AT T=0.0"}
    [raw] = pipelines.RAW_RESPONSES
    body = json.loads(raw)
    assert body["x_server_extra"] == {"slot": 3, "timings": {"predicted_ms": 12.5}}
    assert body["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.25
    assert rw_llm.store.get_blob(ask.calls[0].result_hash or "") == raw


def test_llm_replay_makes_no_request_and_returns_identical_bytes(
    rw_llm: Rewind, fake_model: FakeModel
) -> None:
    run = rw_llm.record(pipelines.llm_pipeline, {"question": "why?"})
    [recorded_raw] = pipelines.RAW_RESPONSES

    replay = rw_llm.replay(run.run_id)

    assert fake_model.count == 1  # no new HTTP request
    assert replay.tokens == 0
    assert [o for _, o, _ in outcomes(rw_llm, replay)] == ["hit", "none"]
    assert len(pipelines.RAW_RESPONSES) == 2
    assert pipelines.RAW_RESPONSES[1] == recorded_raw  # byte-identical, extra fields included
    assert b'"x_server_extra"' in pipelines.RAW_RESPONSES[1]
    assert b'"logprobs"' in pipelines.RAW_RESPONSES[1]
    assert_same_trajectory(rw_llm, run, replay)


def test_llm_fork_with_a_changed_temperature_makes_exactly_one_request(
    rw_llm: Rewind, fake_model: FakeModel
) -> None:
    run = rw_llm.record(pipelines.llm_pipeline, {"question": "why?"})

    fork = rw_llm.fork(run.run_id, at="ask", override=ParamOverride("ask", "temperature", 0.7))

    assert fake_model.count == 2
    assert fake_model.requests[1]["temperature"] == 0.7
    assert outcomes(rw_llm, fork)[0] == ("ask", "miss", "override")
    assert fork.tokens == 16
    assert outputs(rw_llm, fork)[1] == {"loud": "ANSWER TO WHY? AT T=0.7"}

    rw_llm.replay(fork.run_id)
    assert fake_model.count == 2  # the fork's own answer is now cached


# -- a fresh process -----------------------------------------------------------------------------


def test_second_rewind_instance_on_the_same_store_replays_all_hits(tmp_path: Path) -> None:
    first = Rewind(tmp_path / "store")
    run = first.record(pipelines.pipeline, {"x": 15})
    first.store.close()
    pipelines.CALLS.clear()

    fresh = Rewind(tmp_path / "store")  # nothing registered: the pipeline is re-imported by ref
    fork = fresh.replay(run.run_id, at=1)

    assert fork.status == "completed"
    assert [o for _, o, _ in outcomes(fresh, fork)] == ["hit", "hit", "hit"]
    assert pipelines.CALLS == []
    assert_same_trajectory(fresh, run, fork)
    fresh.store.close()


def test_second_rewind_instance_replays_llm_calls_without_requests(
    tmp_path: Path, rw_llm: Rewind, fake_model: FakeModel
) -> None:
    run = rw_llm.record(pipelines.llm_pipeline, {"question": "how?"})
    other_model = FakeModel()
    client = ChatClient(
        Endpoint(base_url=FAKE_BASE_URL, model=FAKE_MODEL),
        transport=httpx.MockTransport(other_model.handler),
        retry=RetryPolicy(attempts=1),
    )
    fresh = Rewind(rw_llm.store.root, chat_client=client)

    fork = fresh.replay(run.run_id)

    assert fork.status == "completed"
    assert other_model.count == 0
    assert fake_model.count == 1
    assert pipelines.RAW_RESPONSES[0] == pipelines.RAW_RESPONSES[1]
    assert_same_trajectory(fresh, run, fork)
    client.close()
    fresh.store.close()


def test_pipeline_that_cannot_be_imported_is_a_rewind_error(rw: Rewind) -> None:
    with rw.store.write() as conn:
        rw.store.create_run(
            conn,
            run_id="orphan",
            pipeline="gone",
            pipeline_ref="tests.no_such_module:pipeline",
            status="completed",
        )
        rw.store.insert_node(
            conn,
            {
                "run_id": "orphan",
                "position": 0,
                "name": "start",
                "src_app_id": "orphan",
                "input_hash": "0" * 64,
                "cache_outcome": "none",
                "started_at": 0.0,
            },
        )
    before = row_counts(rw.store)
    with pytest.raises(RewindError, match="cannot import pipeline"):
        rw.fork("orphan", at=1)
    assert row_counts(rw.store) == before
