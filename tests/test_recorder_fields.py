"""The recorder re-encodes only the state fields that can have changed after a node, and never
reuses a stale hash for a value an action changed in place.

Each recorded hash is checked against a full encoding of the state the node left behind (every
field encoded afresh), on real Burr runs recorded into a real SQLite store.
"""

from __future__ import annotations

import json
import random
from itertools import pairwise
from typing import Any

import pytest
from burr.core import State, action, default
from burr.core.graph import GraphBuilder

from rewind.canonical import canonical_bytes, sha256_hex
from rewind.persister import FieldEncoder, _pickled, encode_value, field_map, map_hash
from rewind.replay import Pipeline, Rewind

# -- helpers -----------------------------------------------------------------------------------


def full_state_hash(values: dict[str, Any]) -> str:
    """The state hash of ``values`` with every field encoded afresh (no memo)."""
    return map_hash({k: encode_value(k, v).digest for k, v in values.items()})[1]


def recorded_fields(rw: Rewind, run_id: str, sequence_id: int) -> dict[str, str]:
    row = rw.store.load_state_row("", run_id, sequence_id, values=False)
    assert row is not None
    return row["fields"]


def chain(*steps: Any) -> Pipeline:
    """A linear pipeline of the given Burr actions, named s0, s1…"""
    actions = {f"s{i}": a for i, a in enumerate(steps)}
    names = list(actions)
    graph = (
        GraphBuilder()
        .with_actions(**actions)
        .with_transitions(*[(a, b, default) for a, b in pairwise(names)])
        .build()
    )
    return Pipeline(name="fields", graph=graph, entrypoint=names[0], halt_after=(names[-1],))


@action(reads=["items"], writes=["items"])
def append_declared(state: State) -> State:
    items = state["items"]
    items.append(len(items))  # in place: the same list object goes back into state
    return state.update(items=items)


@action(reads=["items"], writes=["count"])
def append_read_only(state: State) -> State:
    state["items"].append("x")  # in place, on a field the action only reads
    return state.update(count=len(state["items"]))


@action(reads=["items"], writes=["note"])
def nested_in_place(state: State) -> State:
    state["items"][0]["seen"] = True  # a dict inside the list, changed in place
    return state.update(note="done")


@action(reads=[], writes=["note"])
def untouched(state: State) -> State:
    return state.update(note="untouched")


# -- recorded runs -----------------------------------------------------------------------------


def test_in_place_append_to_a_written_list_changes_the_recorded_hash(rw: Rewind) -> None:
    run = rw.record(chain(append_declared, append_declared, untouched), {"items": [0]})
    assert run.status == "completed", run.error
    nodes = rw.store.nodes_of(run.run_id)
    assert [n.state_hash for n in nodes] == [
        full_state_hash({"items": [0, 1]}),
        full_state_hash({"items": [0, 1, 2]}),
        full_state_hash({"items": [0, 1, 2], "note": "untouched"}),
    ]
    assert len({n.output_hash for n in nodes[:2]}) == 2  # each append is a new output
    assert rw.store.get_blob(recorded_fields(rw, run.run_id, 1)["items"]) == (
        encode_value("items", [0, 1, 2]).data
    )


def test_in_place_change_of_a_field_the_node_only_reads_is_seen(rw: Rewind) -> None:
    run = rw.record(chain(untouched, append_read_only, untouched), {"items": ["a"]})
    assert run.status == "completed", run.error
    first, second, third = rw.store.nodes_of(run.run_id)
    assert first.state_hash == full_state_hash({"items": ["a"], "note": "untouched"})
    after = {"items": ["a", "x"], "note": "untouched", "count": 2}
    assert second.state_hash == full_state_hash(after)
    assert third.state_hash == second.state_hash
    assert recorded_fields(rw, run.run_id, 1)["items"] == encode_value("items", ["a", "x"]).digest
    # the stored blob holds the changed list, so the state loads back as it was
    assert rw.store.get_blob(encode_value("items", ["a", "x"]).digest)


def test_an_alias_of_a_list_changed_in_place_is_rehashed_too(rw: Rewind) -> None:
    shared = [{"seen": False}]
    run = rw.record(chain(untouched, nested_in_place), {"items": shared, "copy": shared})
    assert run.status == "completed", run.error
    _, second = rw.store.nodes_of(run.run_id)
    changed = [{"seen": True}]
    expected = {"items": changed, "copy": changed, "note": "done"}
    assert second.state_hash == full_state_hash(expected)
    fields = recorded_fields(rw, run.run_id, 1)
    assert fields["copy"] == fields["items"] == encode_value("items", changed).digest


# -- the encoder itself ------------------------------------------------------------------------


def test_step_reuses_unchanged_objects_and_skips_immutable_rechecks() -> None:
    enc = FieldEncoder()
    big = {"rows": list(range(50))}
    first = enc.step({"__SEQUENCE_ID": 0, "big": big, "name": "a"}, recheck=())
    assert set(first.fresh) == {"big", "name"}
    assert first.internal == {"__SEQUENCE_ID": 0}
    # same objects, "name" re-checked but immutable: nothing encoded afresh
    second = enc.step({"__SEQUENCE_ID": 1, "big": big, "name": "a"}, recheck=("name",))
    assert second.fresh == {}
    assert second.digests == {"big": first.digests["big"], "name": first.digests["name"]}
    # a re-checked mutable field that did not change: checked, not fresh (its blob is stored)
    assert enc.step({"big": big, "name": "a"}, recheck=("big",)).fresh == {}
    big["rows"].append(50)
    third = enc.step({"big": big, "name": "a"}, recheck=("big",))
    assert set(third.fresh) == {"big"}
    assert third.digests["big"] == encode_value("big", big).digest


def test_step_matches_a_full_encoding_over_random_changes() -> None:
    """Against a from-scratch encoding after every step: new objects, in-place changes of the
    re-checked fields, deleted and added fields, None values."""
    rng = random.Random(13)
    enc = FieldEncoder()
    state: dict[str, Any] = {f"f{i}": [i] for i in range(8)}
    for step in range(300):
        recheck: list[str] = []
        for _ in range(rng.randint(0, 3)):
            k = f"f{rng.randrange(12)}"
            what = rng.random()
            if what < 0.3:
                state[k] = [step]  # a new object
            elif what < 0.5 and isinstance(state.get(k), list):
                state[k].append(step)  # in place (declared)
                recheck.append(k)
            elif what < 0.6:
                state.pop(k, None)
            elif what < 0.7:
                state[k] = None
            else:
                state[k] = f"s{step % 3}"  # an immutable value, maybe equal to the last one
            recheck.append(k)
        values = {"__PRIOR_STEP": f"n{step}", **state}
        got = enc.step(values, recheck=recheck)
        want = {k: encode_value(k, v).digest for k, v in state.items()}
        assert got.digests == want, step
        canon, text = enc.state_map()
        assert canon == canonical_bytes(want), step
        assert text == json.dumps(want, sort_keys=True), step


@pytest.mark.parametrize(
    "names",
    [
        ["b", "a", "é", "Z", 'q"uote', "back\\slash", "tab\t", "\u2028"],
        ["\U0001f600", "\uffff", "a"],  # an astral name: JCS order differs from code points
    ],
)
def test_state_map_bytes_equal_the_whole_map_encodings(names: list[str]) -> None:
    enc = FieldEncoder()
    values: dict[str, Any] = {k: [i] for i, k in enumerate(names)}
    for i in range(3):
        enc.step(values, recheck=names[:1])
        want = {k: encode_value(k, v).digest for k, v in values.items()}
        assert enc.state_map() == (canonical_bytes(want), json.dumps(want, sort_keys=True))
        values = {**values, names[i]: {"round": i}}


def test_state_hash_equals_the_hash_of_the_whole_map_over_random_steps() -> None:
    """The state hash resumed from kept hash states (FieldEncoder.state_hash) against the
    sha256 of the whole map: fields added, changed and deleted anywhere in the sorted map
    (the tail cut back to a block boundary, the map emptied), some steps not hashed at all."""
    import rewind.persister as persister

    rng = random.Random(1313)
    enc = FieldEncoder()
    block = persister._HASH_BLOCK
    state: dict[str, Any] = {}
    for step in range(600):
        if step % 150 == 149:
            state = {}  # every field deleted
        elif step % 50 == 49:
            keep = sorted(state)[: block * rng.randint(0, 3)]
            state = {k: state[k] for k in keep}  # the tail cut back to a block boundary
        for _ in range(rng.randint(1, 4)):
            k = f"f{rng.randrange(5 * block):03d}"
            if rng.random() < 0.25:
                state.pop(k, None)
            else:
                state[k] = [step]
        enc.step({"__SEQUENCE_ID": step, **state}, recheck=list(state))
        if rng.random() < 0.3:
            continue  # several steps between two hashes
        want = {k: encode_value(k, v).digest for k, v in state.items()}
        text = json.dumps(want, sort_keys=True)
        assert enc.state_hash() == (sha256_hex(canonical_bytes(want)), text), step
        assert enc.state_map() == (canonical_bytes(want), text), step


def test_state_hash_of_names_jcs_sorts_differently() -> None:
    enc = FieldEncoder()
    values = {"\U0001f600": [1], "\uffff": [2], "a": [3]}
    enc.step(values)
    want = {k: encode_value(k, v).digest for k, v in values.items()}
    assert enc.state_hash() == (sha256_hex(canonical_bytes(want)), json.dumps(want, sort_keys=True))


def test_step_leaves_the_encoder_unchanged_when_a_field_cannot_be_stored() -> None:
    from rewind.errors import UnstorableValue

    enc = FieldEncoder()
    before = enc.step({"a": [1]}).digests.copy()
    with pytest.raises(UnstorableValue):
        enc.step({"a": [1], "bad": float("nan")})
    assert enc.step({"a": [1]}).digests == before
    assert field_map({"a": encode_value("a", [1])}) == before


# -- the sealed pickle of the mutable fields ---------------------------------------------------


def _full(state: dict[str, Any]) -> dict[str, str]:
    return {k: encode_value(k, v).digest for k, v in state.items()}


def test_an_undeclared_in_place_change_of_a_sealed_field_is_seen() -> None:
    enc = FieldEncoder()
    state: dict[str, Any] = {f"f{i:02d}": {"n": i, "items": [i]} for i in range(20)}
    for step in range(3):
        state[f"new{step}"] = {"step": step}  # a node writes a new field
        enc.step(state, recheck=(f"new{step}",))
    assert "f07" in enc._sealed  # the field is compared through the sealed pickle
    state["f07"]["items"].append("changed")  # in place, by a node that declares nothing
    got = enc.step(state, recheck=())
    assert set(got.fresh) == {"f07"}
    assert got.digests == _full(state)
    state["f07"]["items"][0] = -1  # again, now that it was sealed afresh
    assert set(enc.step(state, recheck=()).fresh) == {"f07"}
    assert enc.step(state, recheck=()).fresh == {}  # nothing changed: nothing re-encoded


def _reordered_in_place(values: set[int]) -> None:
    """Change a set's iteration order (so its pickle) without changing its elements (so its
    encoding, sorted): 1 and 9 share a hash slot, the one added first iterates first."""
    items = list(values)
    values.clear()
    values.update(reversed(items))


def test_a_value_whose_pickle_changes_in_place_turns_the_seal_off_not_the_hashes() -> None:
    """A set re-ordered in place at every node: its pickle changes, its encoding does not. The
    seal re-encodes the sealed fields a few times, then the encoder compares field by field."""
    from rewind.persister import SEAL_FALSE_ALARMS

    members: set[int] = set()
    members.add(9)
    members.add(1)
    state: dict[str, Any] = {"members": members, **{f"f{i}": [i] for i in range(10)}}
    enc = FieldEncoder()
    enc.step(state)
    enc.step(state)
    for step in range(SEAL_FALSE_ALARMS + 3):
        before = list(members)
        _reordered_in_place(members)
        assert list(members) != before and members == {1, 9}
        state[f"w{step}"] = [step]
        written = [f"w{step}"]
        if step == SEAL_FALSE_ALARMS - 1:  # the step that turns the seal off
            state["f1"], state["f2"] = "now a string", [2, "new object"]
            written += ["f1", "f2"]
        got = enc.step(state, recheck=written)
        assert set(got.fresh) == set(written), step  # the set's encoding never changed
        assert got.digests == _full(state), step
    assert not enc._seal_on and not enc._sealed
    # every field compared on its own holds the pickle of its current value (none immutable)
    assert "f1" not in enc._prints
    for k, printed in enc._prints.items():
        assert printed is None or printed == _pickled(state[k]), k
    state["f3"].append("x")  # an undeclared in-place change, now seen field by field
    assert set(enc.step(state).fresh) == {"f3"}


def test_sealed_steps_match_a_full_encoding_over_random_undeclared_changes() -> None:
    """Against a from-scratch encoding after every step: undeclared in-place changes (nested,
    through an alias held by two fields), new objects, deletions, immutable values."""
    rng = random.Random(1313)
    enc = FieldEncoder()
    state: dict[str, Any] = {f"f{i}": {"v": [i]} for i in range(16)}
    state["alias"] = state["f0"]
    for step in range(400):
        recheck: list[str] = []
        for _ in range(rng.randint(0, 3)):
            k = rng.choice([*state, f"f{rng.randrange(24)}"])
            what = rng.random()
            value = state.get(k)
            if what < 0.35 and isinstance(value, dict):
                value["v"].append(step)  # in place, declared nowhere
            elif what < 0.5 and isinstance(value, dict):
                value[f"k{step % 5}"] = {"deep": [step]}  # in place, declared nowhere
            elif what < 0.7:
                state[k] = {"v": [step]}  # a new object (declared, as Burr's update does)
                recheck.append(k)
            elif what < 0.8 and k != "alias":
                state.pop(k, None)
            else:
                state[k] = f"s{step % 4}"
                recheck.append(k)
        got = enc.step({"__SEQUENCE_ID": step, **state}, recheck=recheck)
        assert got.digests == _full(state), step
        assert enc.state_map()[0] == canonical_bytes(_full(state)), step


def test_a_declared_field_is_compared_by_pickle_not_re_encoded_unless_it_changed() -> None:
    """A field the node reads (declared) whose object and pickle did not change keeps its
    encoding (no re-encoding per node); one changed in place is re-encoded, sealed or loose."""
    import rewind.persister as persister

    encoded: list[str] = []
    real = persister.encode_value

    def counting(key: str, value: Any) -> Any:
        encoded.append(key)
        return real(key, value)

    enc = FieldEncoder()
    state: dict[str, Any] = {f"f{i}": {"rows": [i]} for i in range(6)}
    enc.step(state)
    enc.step({**state, "new": [0]})  # a fresh field: loose until the next seal
    state["new"] = enc._objs["new"]
    assert "f2" in enc._sealed and "new" in enc._prints
    persister.encode_value = counting
    try:
        assert enc.step(state, recheck=("f2", "new")).fresh == {}
        assert encoded == []  # neither the sealed nor the loose declared field re-encoded
        state["f2"]["rows"].append("x")  # in place, declared
        assert set(enc.step(state, recheck=("f2",)).fresh) == {"f2"}
        state["new"].append(1)  # in place, declared, loose (or sealed again meanwhile)
        got = enc.step(state, recheck=("new",))
    finally:
        persister.encode_value = real
    assert set(got.fresh) == {"new"}
    assert got.digests == _full(state)
