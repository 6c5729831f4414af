"""Recording, forking and replaying Burr apps as users write them (issue 10, part B).

The apps (tests/burr_apps.py) are built with Burr's ApplicationBuilder, take runtime inputs,
bind values with ``.bind``, carry the user's own hook and tracker, loop, and come in synchronous,
async, streaming and parallel-map variants.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rewind import InputOverride, Rewind
from rewind.engine import attach, load_pipeline
from rewind.errors import InvalidOverride, RewindError
from rewind.replay import parse_override
from tests import burr_apps
from tests.conftest import FakeModel, row_counts

HALT = ["summarise"]


@pytest.fixture(autouse=True)
def _clear_steps() -> None:
    burr_apps.STEPS.clear()


def record_chat(rw: Rewind, app: Any, question: str = "why is the sky blue?") -> Any:
    run = rw.record(app, inputs={"question": question}, halt_after=HALT)
    assert run.status == "completed", run.error
    return run


def output_hashes(rw: Rewind, run_id: str) -> list[tuple[str, str | None]]:
    return [(n.name, n.output_hash) for n in rw.store.nodes_of(run_id)]


def test_record_a_built_burr_application_with_runtime_inputs_hooks_and_tracker(
    rw_llm: Rewind, fake_model: FakeModel, tmp_path: Path
) -> None:
    app = burr_apps.application(tracker_dir=str(tmp_path / "burr"))
    run = record_chat(rw_llm, app)
    nodes = rw_llm.store.nodes_of(run.run_id)
    assert [n.name for n in nodes] == ["ask", "answer", "summarise"]
    assert fake_model.count == 1
    ask_input = rw_llm.node_input(nodes[0])
    assert ask_input["inputs"] == {"question": "why is the sky blue?"}
    answer_input = rw_llm.node_input(nodes[1])
    assert answer_input["bound"] == {"style": "briefly"} and answer_input["inputs"] == {}
    assert rw_llm.node_state(nodes[2])["summary"].startswith("ANSWER TO BRIEFLY: WHY")
    # the user's hook saw every step of the recorded run, and its tracker logged the run
    assert [n for a, n in burr_apps.STEPS if a == run.run_id] == ["ask", "answer", "summarise"]
    assert list((tmp_path / "burr" / "rewind-test").glob(f"{run.run_id}*"))
    assert run.launch == {
        "inputs": {"question": "why is the sky blue?"},
        "halt_after": HALT,
        "halt_before": [],
    }


def test_runtime_inputs_enter_the_input_hash(rw_llm: Rewind) -> None:
    a = record_chat(rw_llm, burr_apps.application(), "first")
    b = record_chat(rw_llm, burr_apps.application(), "second")
    first = [n.input_hash for n in rw_llm.store.nodes_of(a.run_id)]
    second = [n.input_hash for n in rw_llm.store.nodes_of(b.run_id)]
    assert first[0] != second[0]


def test_unchanged_fork_from_every_node_sends_nothing_and_keeps_every_hash(
    rw_llm: Rewind, fake_model: FakeModel
) -> None:
    parent = record_chat(rw_llm, burr_apps.application())
    sent = fake_model.count
    for at in (1, 2, 3):
        child = rw_llm.fork(parent.run_id, at=at)
        assert child.status == "completed", child.error
        assert output_hashes(rw_llm, child.run_id) == output_hashes(rw_llm, parent.run_id)
        assert child.tokens == 0
        assert [n for a, n in burr_apps.STEPS if a == child.run_id] == (
            ["ask", "answer", "summarise"][at - 1 :]
        )
    assert fake_model.count == sent


def test_fork_changing_a_runtime_input_diverges_at_that_node(
    rw_llm: Rewind, fake_model: FakeModel
) -> None:
    parent = record_chat(rw_llm, burr_apps.application(), "why is the sky blue?")
    before = fake_model.count
    child = rw_llm.fork(
        parent.run_id, at="ask", override=InputOverride("ask", "question", "why is grass green?")
    )
    assert child.status == "completed", child.error
    assert fake_model.count == before + 1
    assert "why is grass green?" in fake_model.requests[-1]["messages"][-1]["content"]
    d = rw_llm.diff(parent.run_id, child.run_id)
    assert d.first_divergence is not None and d.first_divergence.name == "ask"
    nodes = rw_llm.store.nodes_of(child.run_id)
    assert rw_llm.node_input(nodes[0])["inputs"] == {"question": "why is grass green?"}
    assert (nodes[1].cache_outcome, nodes[1].cache_reason) == ("miss", "new-input")
    assert child.override == {
        "kind": "input",
        "node": "ask",
        "name": "question",
        "value": "why is grass green?",
    }
    # a fork of that fork keeps the changed input: unchanged, it sends nothing
    grandchild = rw_llm.fork(child.run_id, at="ask")
    assert output_hashes(rw_llm, grandchild.run_id) == output_hashes(rw_llm, child.run_id)
    assert fake_model.count == before + 1


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (InputOverride("ask", "questoin", "x"), "has no input 'questoin'"),
        (InputOverride("answer", "question", "x"), "has no input 'question'"),
        (InputOverride("nope", "question", "x"), "has no node 'nope'"),
        (InputOverride("ask", "question", 3), "was recorded as a string"),
    ],
)
def test_bad_input_override_is_refused_and_writes_nothing(
    rw_llm: Rewind, override: InputOverride, message: str
) -> None:
    parent = record_chat(rw_llm, burr_apps.application())
    before = row_counts(rw_llm.store)
    with pytest.raises(InvalidOverride, match=message):
        rw_llm.fork(parent.run_id, at="ask", override=override)
    assert row_counts(rw_llm.store) == before


def test_input_override_of_a_node_before_the_fork_point_is_refused(rw_llm: Rewind) -> None:
    parent = record_chat(rw_llm, burr_apps.application())
    with pytest.raises(InvalidOverride, match="runs before the fork node"):
        rw_llm.fork(parent.run_id, at="answer", override=InputOverride("ask", "question", "x"))


def test_record_refuses_what_burr_would_fail_on_and_writes_nothing(rw_llm: Rewind) -> None:
    before = row_counts(rw_llm.store)
    app = burr_apps.application()
    with pytest.raises(InvalidOverride, match="needs the runtime input"):
        rw_llm.record(app, halt_after=HALT)
    with pytest.raises(InvalidOverride, match="loops"):
        rw_llm.record(app, inputs={"question": "q"})
    with pytest.raises(InvalidOverride, match="does not have"):
        rw_llm.record(app, inputs={"question": "q"}, halt_after=["sumarise"])
    with pytest.raises(InvalidOverride, match="not a JSON value"):
        rw_llm.record(app, inputs={"question": object()}, halt_after=HALT)
    with pytest.raises(RewindError, match="cannot record a dict"):
        rw_llm.record({"not": "an app"})
    assert row_counts(rw_llm.store) == before


def test_an_unbuilt_application_builder_is_recorded_too(rw_llm: Rewind) -> None:
    run = record_chat(rw_llm, burr_apps.builder())
    assert [n for n, _ in output_hashes(rw_llm, run.run_id)] == ["ask", "answer", "summarise"]


def test_halt_after_a_tag_stops_like_burr(rw_llm: Rewind) -> None:
    run = rw_llm.record(
        burr_apps.application(), inputs={"question": "q"}, halt_after=["@tag:final"]
    )
    assert [n.name for n in rw_llm.store.nodes_of(run.run_id)] == ["ask", "answer", "summarise"]
    with pytest.raises(InvalidOverride, match="its tags: final"):
        rw_llm.record(burr_apps.application(), inputs={"question": "q"}, halt_after=["@tag:x"])


def test_halt_before_stops_like_burr(rw_llm: Rewind) -> None:
    run = rw_llm.record(
        burr_apps.application(), inputs={"question": "q"}, halt_before=["summarise"]
    )
    assert [n.name for n in rw_llm.store.nodes_of(run.run_id)] == ["ask", "answer"]
    child = rw_llm.fork(run.run_id, at="answer")
    assert [n.name for n in rw_llm.store.nodes_of(child.run_id)] == ["ask", "answer"]


def test_async_app_records_true_states_and_replays_from_cache(
    rw_llm: Rewind, fake_model: FakeModel
) -> None:
    parent = record_chat(rw_llm, burr_apps.async_application())
    nodes = rw_llm.store.nodes_of(parent.run_id)
    # the state after each synchronous node includes what it wrote (Burr's astep would record
    # the state from before the step)
    assert rw_llm.node_state(nodes[0])["question"] == "why is the sky blue?"
    assert rw_llm.node_state(nodes[2])["summary"] == rw_llm.node_state(nodes[1])["answer"].upper()
    sent = fake_model.count
    for at in (1, 2, 3):
        child = rw_llm.fork(parent.run_id, at=at)
        assert output_hashes(rw_llm, child.run_id) == output_hashes(rw_llm, parent.run_id)
    assert fake_model.count == sent
    changed = rw_llm.fork(parent.run_id, at=1, override=InputOverride("ask", "question", "hm"))
    assert rw_llm.diff(parent.run_id, changed.run_id).first_divergence.name == "ask"
    assert fake_model.count == sent + 1


def test_async_app_records_from_inside_a_running_event_loop(rw_llm: Rewind) -> None:
    import asyncio

    async def main() -> Any:
        return record_chat(rw_llm, burr_apps.async_application())

    run = asyncio.run(main())
    assert [n.name for n in rw_llm.store.nodes_of(run.run_id)] == ["ask", "answer", "summarise"]


def test_streaming_action_is_recorded_with_its_final_state(
    rw_llm: Rewind, fake_model: FakeModel
) -> None:
    parent = record_chat(rw_llm, burr_apps.streaming_application())
    nodes = rw_llm.store.nodes_of(parent.run_id)
    assert rw_llm.node_output(nodes[1])["answer"].startswith("answer to briefly")
    sent = fake_model.count
    child = rw_llm.fork(parent.run_id, at="answer")
    assert output_hashes(rw_llm, child.run_id) == output_hashes(rw_llm, parent.run_id)
    assert fake_model.count == sent


def test_load_pipeline_accepts_factories_of_apps() -> None:
    p = load_pipeline("tests.burr_apps:pure_application")
    assert p.ref == "tests.burr_apps:pure_application"
    assert p.entrypoint == "ask" and p.initial_state == {"history": []}
    assert [type(h).__name__ for h in p.hooks] == ["StepLog"]
    assert load_pipeline("tests.burr_apps:builder").node_names() == ["ask", "answer", "summarise"]
    with pytest.raises(RewindError, match="not an app Rewind can record"):
        load_pipeline("tests.burr_apps:STEPS")


def test_attached_name_is_stable_for_the_same_graph() -> None:
    assert attach(burr_apps.application()).name == attach(burr_apps.builder()).name


@given(st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True), st.text(max_size=20))
def test_set_input_parses_any_json_string(name: str, value: str) -> None:
    o = parse_override(f"ask.{name}={json.dumps(value)}", input_=True)
    assert o == InputOverride("ask", name, value)


def test_cli_records_an_app_and_forks_it_with_a_changed_input(tmp_path: Path) -> None:
    from tests.test_cli import ok_json, rewind

    store = tmp_path / "store"
    app = ["--app", "tests.burr_apps:pure_application", "--halt-after", "summarise"]
    parent = ok_json(store, "run", *app, "--inputs", '{"question": "why?"}')
    assert [n["name"] for n in parent["nodes"]] == ["ask", "answer", "summarise"]
    assert parent["run"]["launch"]["inputs"] == {"question": "why?"}
    rid = parent["run"]["run_id"]
    child = ok_json(store, "fork", rid, "--at", "ask", "--set-input", 'ask.question="how?"')
    assert child["nodes"][0]["output_hash"] != parent["nodes"][0]["output_hash"]
    same = ok_json(store, "fork", rid, "--at", "2")
    assert [n["output_hash"] for n in same["nodes"]] == [n["output_hash"] for n in parent["nodes"]]

    before = row_counts_of(store)
    for args, message in [
        (["run", *app], "needs the runtime input(s) question"),
        (["run", *app, "--inputs", "{bad"], "--inputs is not valid JSON"),
        (["run", "--app", "tests.burr_apps:nope", "--inputs", "{}"], "cannot import pipeline"),
        (["fork", rid, "--at", "ask", "--set-input", "ask.question=how"], "not valid JSON"),
        (["fork", rid, "--at", "ask", "--set-input", 'ask.q="x"'], "has no input 'q'"),
    ]:
        proc = rewind(store, *args)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) <= 2
    assert row_counts_of(store) == before


def row_counts_of(store: Path) -> dict[str, int]:
    from rewind.store import open_store

    s = open_store(store)
    try:
        return row_counts(s)
    finally:
        s.close()


@pytest.mark.filterwarnings("ignore::Warning:burr.core.serde")
def test_typed_state_app_records_and_forks_with_pydantic_fields(
    rw_llm: Rewind, fake_model: FakeModel
) -> None:
    parent = rw_llm.record(burr_apps.typed_application(), inputs={"question": "entropy"})
    assert parent.status == "completed", parent.error
    concept = rw_llm.node_output(rw_llm.store.nodes_of(parent.run_id)[1])["concept"]
    # The model comes back as its own class (rewind.serde), not as a dict.
    assert type(concept).__name__ == "Concept" and concept.term == "entropy"
    sent = fake_model.count
    for at in (1, 2, 3):
        child = rw_llm.fork(parent.run_id, at=at)
        assert child.status == "completed", child.error
        assert output_hashes(rw_llm, child.run_id) == output_hashes(rw_llm, parent.run_id)
    assert fake_model.count == sent
    changed = rw_llm.fork(parent.run_id, at=1, override=InputOverride("ask", "question", "gravity"))
    assert rw_llm.node_state(rw_llm.store.nodes_of(changed.run_id)[-1])["summary"].startswith(
        "gravity: "
    )


def test_parallel_map_sub_applications_replay_from_the_cache(
    rw_llm: Rewind, fake_model: FakeModel
) -> None:
    parent = rw_llm.record(burr_apps.map_application(), inputs={"topics": ["rain", "sun", "fog"]})
    assert parent.status == "completed", parent.error
    nodes = rw_llm.store.nodes_of(parent.run_id)
    # each sub-application is a sub-run of the map node, with its own node and call
    assert [n.name for n in nodes] == ["choose", "notes", "report"]
    children = rw_llm.node_sub_runs(parent.run_id)[1]
    assert [len(rw_llm.store.nodes_of(c.run_id)[0].calls) for c in children] == [1, 1, 1]
    assert nodes[1].calls == () and fake_model.count == 3
    assert "one fact about fog" in rw_llm.node_state(nodes[2])["report"]
    for at in (1, 2, 3):
        child = rw_llm.fork(parent.run_id, at=at)
        assert output_hashes(rw_llm, child.run_id) == output_hashes(rw_llm, parent.run_id)
        assert child.tokens == 0
    assert fake_model.count == 3
    changed = rw_llm.fork(
        parent.run_id, at=1, override=InputOverride("choose", "topics", ["rain", "sun", "snow"])
    )
    assert changed.status == "completed", changed.error
    assert fake_model.count == 4  # only the new topic's call is sent
    notes = rw_llm.store.nodes_of(changed.run_id)[1]
    assert (notes.cache_outcome, notes.cache_reason) == ("miss", "new-input")
    outcomes = [
        rw_llm.store.nodes_of(c.run_id)[0].calls[0].outcome
        for c in rw_llm.node_sub_runs(changed.run_id)[1]
    ]
    assert outcomes == ["hit", "hit", "miss"]


def test_recursive_sub_applications_replay_from_the_cache(
    rw_llm: Rewind, fake_model: FakeModel
) -> None:
    parent = rw_llm.record(burr_apps.recursive_application(), inputs={"question": "why?"})
    assert parent.status == "completed", parent.error
    nodes = rw_llm.store.nodes_of(parent.run_id)
    assert [n.name for n in nodes] == ["ask", "both"] and nodes[1].calls == ()
    assert [c.spawn_key for c in rw_llm.node_sub_runs(parent.run_id)[1]] == ["0", "1"]
    assert fake_model.count == 2
    for at in (1, 2):
        child = rw_llm.fork(parent.run_id, at=at)
        assert output_hashes(rw_llm, child.run_id) == output_hashes(rw_llm, parent.run_id)
    assert fake_model.count == 2
    rw_llm.fork(parent.run_id, at=1, override=InputOverride("ask", "question", "how?"))
    assert fake_model.count == 4


def test_a_sub_application_built_without_the_parents_tracker_belongs_to_its_node(
    rw_llm: Rewind, fake_model: FakeModel
) -> None:
    parent = rw_llm.record(burr_apps.untracked_recursive_application(), inputs={"question": "q"})
    assert parent.status == "completed", parent.error
    nodes = rw_llm.store.nodes_of(parent.run_id)
    # Rewind cannot see the child app's steps: its calls are the spawning node's, and replay
    assert len(nodes[1].calls) == 2 and rw_llm.node_sub_runs(parent.run_id) == {}
    fork = rw_llm.fork(parent.run_id, at=2)
    assert output_hashes(rw_llm, fork.run_id) == output_hashes(rw_llm, parent.run_id)
    assert fake_model.count == 2
