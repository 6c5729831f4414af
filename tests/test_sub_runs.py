"""Burr sub-applications (``MapStates`` children, recursive apps) recorded as sub-runs (issue 10).

Each child is a run of its own — nodes, calls, states, hashes — linked to the node that spawned
it; forks of the parent re-record and re-link them; a sub-run can be forked itself. The children
call the OpenAI SDK against a real loopback model server (:mod:`tests.model_stub`), which counts
the requests it receives and numbers its answers, so a re-sent request would change a hash too.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rewind import InputOverride, Rewind
from rewind.errors import InvalidOverride
from rewind.replay import OutputOverride
from rewind.store import RunRecord
from tests import burr_apps
from tests.conftest import StoreTarget
from tests.model_stub import ModelStub

TOPICS = ["rain", "sun", "fog"]
RECURSIVE_REF = "tests.burr_apps:sdk_recursive_application"


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelStub]:
    with ModelStub() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
        yield server


@pytest.fixture
def rw(tmp_path: Path) -> Iterator[Rewind]:
    session = Rewind(tmp_path / "store")
    yield session
    session.store.close()


def hashes(rw: Rewind, run_id: str) -> list[tuple[str, str | None]]:
    return [(n.name, n.output_hash) for n in rw.store.nodes_of(run_id)]


def sub_runs(rw: Rewind, run_id: str, position: int) -> list[RunRecord]:
    return rw.node_sub_runs(run_id).get(position, [])


def sub_run_shape(rw: Rewind, run_id: str, position: int) -> list[tuple[str | None, Any]]:
    """(spawn key, node output hashes) of the sub-runs a node spawned, in key order."""
    return [(r.spawn_key, hashes(rw, r.run_id)) for r in sub_runs(rw, run_id, position)]


def test_each_map_states_child_is_a_linked_sub_run(rw: Rewind, stub: ModelStub) -> None:
    parent = rw.record(burr_apps.sdk_map_application(), inputs={"topics": TOPICS})
    assert parent.status == "completed", parent.error
    assert stub.count == 3
    nodes = rw.store.nodes_of(parent.run_id)
    assert [n.name for n in nodes] == ["choose", "notes", "report"]
    notes = nodes[1]
    # the children's calls are on their sub-runs; the map node's outcome and tokens include them
    assert notes.calls == () and notes.tokens > 0
    assert (notes.cache_outcome, notes.cache_reason) == ("miss", "bypass")
    children = sub_runs(rw, parent.run_id, 1)
    assert [c.spawn_key for c in children] == ["0.0", "1.0", "2.0"]
    for child, topic in zip(children, TOPICS, strict=True):
        assert (child.spawning_run_id, child.spawning_position) == (parent.run_id, 1)
        assert child.status == "completed" and child.is_sub_run
        (node,) = rw.store.nodes_of(child.run_id)
        assert node.name == "sdk_take_note" and len(node.calls) == 1
        assert node.calls[0].outcome == "miss" and node.tokens > 0
        state = rw.node_state(node)
        assert state["topic"] == topic and f"one fact about {topic}" in state["note"]
    assert rw.store.get_run(parent.run_id).tokens == notes.tokens  # choose/report call nothing
    # sub-runs stay out of the run list unless asked for
    assert [r.run_id for r in rw.store.list_runs()] == [parent.run_id]
    listed = {r.run_id for r in rw.store.list_runs(include_sub_runs=True)}
    assert listed == {parent.run_id, *(c.run_id for c in children)}


def test_unchanged_forks_of_a_map_parent_send_nothing_and_relink_its_children(
    rw: Rewind, stub: ModelStub
) -> None:
    parent = rw.record(burr_apps.sdk_map_application(), inputs={"topics": TOPICS})
    recorded = sub_run_shape(rw, parent.run_id, 1)
    for at in (1, 2, 3):
        fork = rw.fork(parent.run_id, at=at)
        assert fork.status == "completed", fork.error
        assert hashes(rw, fork.run_id) == hashes(rw, parent.run_id)
        assert fork.tokens == 0
        # re-executed (at 1, 2) or inherited (at 3), the map node has the same children
        assert sub_run_shape(rw, fork.run_id, 1) == recorded
        if at <= 2:
            new = sub_runs(rw, fork.run_id, 1)
            assert {c.spawning_run_id for c in new} == {fork.run_id}
            assert all(
                n.calls[0].outcome == "hit" for c in new for n in rw.store.nodes_of(c.run_id)
            )
    assert stub.count == 3  # counted at the model server
    changed = rw.fork(
        parent.run_id, at=1, override=InputOverride("choose", "topics", ["rain", "sun", "snow"])
    )
    assert changed.status == "completed", changed.error
    assert stub.count == 4  # only the new topic's request is sent
    outcomes = [
        rw.store.nodes_of(c.run_id)[0].calls[0].outcome for c in sub_runs(rw, changed.run_id, 1)
    ]
    assert outcomes == ["hit", "hit", "miss"]


def test_a_map_child_forks_by_re_running_its_spawning_node(rw: Rewind, stub: ModelStub) -> None:
    parent = rw.record(burr_apps.sdk_map_application(), inputs={"topics": TOPICS})
    child = sub_runs(rw, parent.run_id, 1)[1]
    fork = rw.fork(child.run_id, at="sdk_take_note")
    assert fork.status == "completed", fork.error
    assert stub.count == 3  # the child's replay and the parent's downstream nodes: all hits
    assert fork.parent_run_id == parent.run_id and fork.fork_node == "notes"
    assert fork.launch["sub_run_fork"]["run_id"] == child.run_id
    replayed = rw.sub_run_at(fork.run_id, fork.launch["sub_run_fork"]["path"])
    assert replayed is not None and replayed.spawn_key == "1.0"
    assert hashes(rw, replayed.run_id) == hashes(rw, child.run_id)
    assert hashes(rw, fork.run_id) == hashes(rw, parent.run_id)
    with pytest.raises(InvalidOverride, match="output of a sub-run"):
        rw.fork(child.run_id, at=1, override=OutputOverride("sdk_take_note", "note", "x"))


def test_recursive_children_are_sub_runs_and_a_child_forks_with_a_changed_input(
    rw: Rewind, stub: ModelStub
) -> None:
    parent = rw.record(burr_apps.sdk_recursive_application(), inputs={"question": "why?"})
    assert parent.status == "completed", parent.error
    assert stub.count == 2
    children = sub_runs(rw, parent.run_id, 1)
    assert [c.spawn_key for c in children] == ["0", "1"]
    for child, style in zip(children, ("briefly", "in detail"), strict=True):
        (node,) = rw.store.nodes_of(child.run_id)
        doc = rw.node_input(node)
        assert doc["bound"] == {"style": style} and doc["inputs"] == {"audience": "a student"}
    recorded = sub_run_shape(rw, parent.run_id, 1)
    for at in (1, 2, 3):
        fork = rw.fork(parent.run_id, at=at)
        assert hashes(rw, fork.run_id) == hashes(rw, parent.run_id) and fork.tokens == 0
        assert sub_run_shape(rw, fork.run_id, 1) == recorded
    assert stub.count == 2

    # fork the second child with another audience: only its request is sent again
    changed = rw.fork(
        children[1].run_id,
        at="answer",
        override=InputOverride("answer", "audience", "an expert"),
    )
    assert changed.status == "completed", changed.error
    assert stub.count == 3
    assert "in detail, for an expert: why?" in stub.requests[-1]["messages"][-1]["content"]
    new_children = sub_runs(rw, changed.run_id, 1)
    assert [c.spawning_run_id for c in new_children] == [changed.run_id] * 2
    assert hashes(rw, new_children[0].run_id) == hashes(rw, children[0].run_id)
    assert hashes(rw, new_children[1].run_id) != hashes(rw, children[1].run_id)
    first = rw.store.nodes_of(new_children[0].run_id)[0]
    second = rw.store.nodes_of(new_children[1].run_id)[0]
    assert first.cache_outcome == "hit"
    assert (second.cache_outcome, second.cache_reason) == ("miss", "override")
    assert rw.node_input(second)["inputs"] == {"audience": "an expert"}
    # the parent's spawning node and its downstream node changed; the node before did not
    diff = rw.diff(parent.run_id, changed.run_id)
    assert diff.first_divergence is not None
    assert [n.name for n in rw.store.nodes_of(changed.run_id)] == ["ask", "both", "summarise"]
    # the recorded parent and child are untouched (rule 7)
    assert sub_run_shape(rw, parent.run_id, 1) == recorded
    # a fork of that fork, unchanged, keeps the changed child and sends nothing
    again = rw.fork(changed.run_id, at=2)
    assert hashes(rw, again.run_id) == hashes(rw, changed.run_id)
    assert stub.count == 3


def test_sub_runs_on_every_store_backend(store_target: StoreTarget, stub: ModelStub) -> None:
    rw = Rewind(store_target.open())
    try:
        parent = rw.record(burr_apps.sdk_map_application(), inputs={"topics": TOPICS})
        assert parent.status == "completed", parent.error
        children = rw.store.sub_runs(parent.run_id)
        assert [(c.spawning_position, c.spawn_key) for c in children] == [
            (1, "0.0"),
            (1, "1.0"),
            (1, "2.0"),
        ]
        assert rw.store.sub_runs(parent.run_id, 2) == []
        assert [r.run_id for r in rw.store.list_runs()] == [parent.run_id]
        assert len(rw.store.list_runs(include_sub_runs=True)) == 4
        fork = rw.fork(children[2].run_id, at=1)
        assert hashes(rw, fork.run_id) == hashes(rw, parent.run_id) and stub.count == 3
    finally:
        rw.store.close()


def test_cli_lists_shows_and_forks_sub_runs(tmp_path: Path, stub: ModelStub) -> None:
    from tests.test_cli import ok_json, rewind

    store = tmp_path / "store"
    app = ["--app", "tests.burr_apps:sdk_recursive_application"]
    parent = ok_json(store, "run", *app, "--inputs", '{"question": "why?"}')
    rid = parent["run"]["run_id"]
    both = parent["nodes"][1]
    assert both["name"] == "both" and len(both["sub_runs"]) == 2
    listed = ok_json(store, "runs")
    assert [r["run_id"] for r in listed] == [rid]
    everything = ok_json(store, "runs", "--sub-runs")
    assert {r["run_id"] for r in everything} == {rid, *both["sub_runs"]}
    child = ok_json(store, "show", both["sub_runs"][1])
    assert child["run"]["spawning_run_id"] == rid and child["run"]["spawn_key"] == "1"
    assert [n["name"] for n in child["nodes"]] == ["answer"]
    text = rewind(store, "show", rid)
    assert text.returncode == 0 and "node 2 spawned 2 sub-run(s)" in text.stdout
    assert stub.count == 2
    fork = ok_json(
        store,
        "fork",
        both["sub_runs"][1],
        "--at",
        "answer",
        "--set-input",
        'answer.audience="an expert"',
    )
    assert fork["run"]["parent_run_id"] == rid
    assert fork["run"]["launch"]["sub_run_fork"]["run_id"] == both["sub_runs"][1]
    assert stub.count == 3
    proc = rewind(
        store, "fork", both["sub_runs"][0], "--at", "1", "--set-output", 'answer.answer="x"'
    )
    assert proc.returncode == 2 and "output of a sub-run" in proc.stderr


def test_api_links_sub_runs_both_ways_and_forks_one(tmp_path: Path, stub: ModelStub) -> None:
    from fastapi.testclient import TestClient

    from rewind.api import create_app
    from rewind.engine import attach
    from tests.test_api import wait

    rw = Rewind(tmp_path / "store")
    app = attach(burr_apps.sdk_recursive_application(), ref=RECURSIVE_REF)
    parent = rw.record(app, inputs={"question": "why?"})
    with TestClient(create_app(rw.store), base_url="http://127.0.0.1") as c:
        runs = c.get("/api/runs").json()["runs"]
        assert [r["run_id"] for r in runs] == [parent.run_id]
        runs = c.get("/api/runs", params={"include_sub_runs": True}).json()["runs"]
        assert len(runs) == 3
        detail = c.get(f"/api/runs/{parent.run_id}").json()
        (spawned,) = detail["sub_runs"]
        assert spawned["number"] == 2 and [r["spawn_key"] for r in spawned["runs"]] == ["0", "1"]
        child_id = spawned["runs"][0]["run_id"]
        listed = c.get(f"/api/runs/{parent.run_id}/nodes").json()["nodes"]
        assert [len(n["sub_runs"]) for n in listed] == [0, 2, 0]
        node = c.get(f"/api/runs/{parent.run_id}/nodes/both").json()
        assert [r["run_id"] for r in node["sub_runs"]] == [r["run_id"] for r in spawned["runs"]]
        child = c.get(f"/api/runs/{child_id}").json()
        assert (child["spawning_run_id"], child["spawning_number"]) == (parent.run_id, 2)
        r = c.post(
            f"/api/runs/{child_id}/fork",
            json={
                "at": "answer",
                "override": {"kind": "input", "node": "answer", "name": "audience", "value": "me"},
            },
        )
        assert r.status_code == 202, r.text
        fork = wait(c, r.json()["run_id"])
        assert fork["status"] == "completed" and fork["parent_run_id"] == parent.run_id
        assert fork["change"].startswith(f"re-runs sub-run {child_id[:12]} from answer")
        assert stub.count == 3
        r = c.post(
            f"/api/runs/{child_id}/fork",
            json={
                "at": "answer",
                "override": {"kind": "output", "node": "answer", "field": "answer", "value": "x"},
            },
        )
        assert r.status_code == 422 and "output of a sub-run" in r.text
    rw.store.close()


@pytest.mark.parametrize(
    ("build", "inputs", "keys", "sent"),
    [
        (burr_apps.sdk_map_actions_application, {"question": "why?"}, ["0.0", "1.0"], 2),
        (burr_apps.sdk_async_map_application, {"topics": TOPICS}, ["0.0", "1.0", "2.0"], 3),
    ],
    ids=["map-actions", "async-map-states"],
)
def test_map_actions_and_async_map_states_children_are_sub_runs(
    rw: Rewind, stub: ModelStub, build: Any, inputs: dict[str, Any], keys: list[str], sent: int
) -> None:
    parent = rw.record(build(), inputs=inputs)
    assert parent.status == "completed", parent.error
    assert stub.count == sent
    children = sub_runs(rw, parent.run_id, 1)
    assert [c.spawn_key for c in children] == keys
    for child in children:
        (node,) = rw.store.nodes_of(child.run_id)
        assert len(node.calls) == 1 and node.error is None
        # the sub-run's state is the state after its node (its answer in it)
        assert "answer #" in json.dumps(rw.node_state(node))
    recorded = sub_run_shape(rw, parent.run_id, 1)
    fork = rw.fork(parent.run_id, at=2)
    assert hashes(rw, fork.run_id) == hashes(rw, parent.run_id) and fork.tokens == 0
    assert sub_run_shape(rw, fork.run_id, 1) == recorded
    assert stub.count == sent


def test_a_sub_run_of_a_sub_run_is_linked_and_forkable(rw: Rewind, stub: ModelStub) -> None:
    parent = rw.record(burr_apps.sdk_nested_application(), inputs={"topics": TOPICS})
    assert parent.status == "completed", parent.error
    (child,) = sub_runs(rw, parent.run_id, 1)
    grandchildren = sub_runs(rw, child.run_id, 0)
    assert [g.spawn_key for g in grandchildren] == ["0.0", "1.0", "2.0"]
    assert {g.spawning_run_id for g in grandchildren} == {child.run_id}
    assert child.tokens > 0 and stub.count == 3
    fork = rw.fork(parent.run_id, at=2)
    assert hashes(rw, fork.run_id) == hashes(rw, parent.run_id) and stub.count == 3
    (new_child,) = sub_runs(rw, fork.run_id, 1)
    assert sub_run_shape(rw, new_child.run_id, 0) == sub_run_shape(rw, child.run_id, 0)
    # forking a grandchild re-runs the top-level node that (indirectly) spawned it
    again = rw.fork(grandchildren[2].run_id, at=1)
    assert again.parent_run_id == parent.run_id and stub.count == 3
    assert rw.sub_run_at(again.run_id, [[1, "0"], [0, "2.0"]]) is not None


def test_a_looped_map_node_gets_new_sub_runs_each_time_and_each_replays_its_own(
    rw: Rewind, stub: ModelStub
) -> None:
    parent = rw.record(burr_apps.sdk_looping_map_application(), inputs={"topics": TOPICS})
    assert parent.status == "completed", parent.error
    names = [n.name for n in rw.store.nodes_of(parent.run_id)]
    assert names == ["choose", "notes", "report", "notes", "report", "finish"]
    spawned = rw.node_sub_runs(parent.run_id)
    assert sorted(spawned) == [1, 3] and stub.count == 6
    first, second = spawned[1], spawned[3]
    # Burr reuses the children's app ids in the second round: their sub-runs get fresh ids
    assert len({r.run_id for r in first + second}) == 6
    # the second round's identical requests got their own (later-numbered) answers
    assert sub_run_shape(rw, parent.run_id, 1) != sub_run_shape(rw, parent.run_id, 3)
    fork = rw.fork(parent.run_id, at=2)
    assert fork.status == "completed", fork.error
    assert hashes(rw, fork.run_id) == hashes(rw, parent.run_id) and stub.count == 6
    for position in (1, 3):
        assert sub_run_shape(rw, fork.run_id, position) == sub_run_shape(
            rw, parent.run_id, position
        )
