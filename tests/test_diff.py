"""Tests for rewind.diff: value diff rules, node alignment, trajectory diff, JSON output."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import rewind.diff as diff_module
from rewind.diff import (
    FieldChange,
    NodeSide,
    TrajectoryDiff,
    align_nodes,
    diff_trajectories,
    diff_values,
    similarity,
)

# ---------------------------------------------------------------------------------------------
# Strategies and independent helpers (deliberately not reusing the module's private functions)

KEYS = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["_x", "__private", "__PRIOR_STEP", "$ref", "a b", "it's", "back\\slash", ""]),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
JSON = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(KEYS, children, max_size=4)
    ),
    max_leaves=25,
)
JSON_DICTS = st.dictionaries(KEYS, JSON, max_size=5)


def rebuild(value: Any) -> Any:
    """Structurally equal copy with fresh leaf objects (so `is` shortcuts cannot hide bugs)."""
    if isinstance(value, dict):
        return {k: rebuild(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rebuild(v) for v in value]
    if isinstance(value, float):
        return float(repr(value))
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(str(value))
    if isinstance(value, str):
        return "".join(list(value))
    raise AssertionError(f"unexpected {type(value)}")


def json_type(value: Any) -> str:
    for name, cls in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if isinstance(value, cls):
            return name
    if value is None:
        return "null"
    return "object" if isinstance(value, dict) else "array"


def same_scalar(x: Any, y: Any) -> bool:
    if json_type(x) != json_type(y):
        return False
    if isinstance(x, float):
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return x == y and math.copysign(1, x) == math.copysign(1, y)
    return x == y


def render(steps: list[Any]) -> str:
    """Render a path as the spec describes: a.b[3]['weird key']."""
    out = ""
    for step in steps:
        if isinstance(step, int):
            out += f"[{step}]"
        elif step.isidentifier():
            out += f".{step}" if out else step
        else:
            out += "['" + step.replace("\\", "\\\\").replace("'", "\\'") + "']"
    return out


def leaves(value: Any, steps: list[Any] | None = None) -> list[list[Any]]:
    """Paths (as step lists) of every scalar or empty container in `value`."""
    steps = steps or []
    if isinstance(value, dict) and value:
        return [p for k, v in value.items() for p in leaves(v, [*steps, k])]
    if isinstance(value, list) and value:
        return [p for i, v in enumerate(value) for p in leaves(v, [*steps, i])]
    return [steps]


def get_at(value: Any, steps: list[Any]) -> Any:
    for step in steps:
        value = value[step]
    return value


def set_at(value: Any, steps: list[Any], new: Any) -> Any:
    if not steps:
        return new
    copy = rebuild(value)
    parent = get_at(copy, steps[:-1])
    parent[steps[-1]] = new
    return copy


def where(change: FieldChange) -> tuple[str, str]:
    """(path in A, path in B) of a change; an added value has no A path, a removed none in B."""
    if change.kind == "added":
        return ("", change.path)
    if change.kind == "removed":
        return (change.path, "")
    return (change.old_path or change.path, change.path)


def node(position: int, name: str, output: dict[str, Any] | None = None, **kw: Any) -> NodeSide:
    output = {"v": name} if output is None else output
    kw.setdefault("output_hash", f"h-{name}-{json.dumps(output, sort_keys=True)}")
    kw.setdefault("tokens", 10)
    return NodeSide(position=position, name=name, output=output, **kw)


def run(*names: str) -> list[NodeSide]:
    return [node(i, n) for i, n in enumerate(names)]


def pair_names(rows: list[tuple[NodeSide | None, NodeSide | None]]) -> list[tuple[Any, Any]]:
    return [(a.name if a else None, b.name if b else None) for a, b in rows]


# ---------------------------------------------------------------------------------------------
# Properties


@settings(max_examples=300)
@given(JSON)
def test_property_value_equals_itself(x: Any) -> None:
    assert diff_values(x, x) == []
    assert diff_values(x, rebuild(x)) == []
    assert similarity(x, rebuild(x)) == 1.0


@settings(max_examples=400)
@given(JSON_DICTS, st.data())
def test_property_single_leaf_mutation_is_one_change_at_that_path(
    x: dict[str, Any], data: st.DataObject
) -> None:
    steps = data.draw(st.sampled_from(leaves(x)))
    old_leaf = get_at(x, steps)
    new_leaf = data.draw(SCALARS)
    assume(not same_scalar(old_leaf, new_leaf))
    mutated = set_at(x, steps, new_leaf)

    changes = diff_values(x, mutated)

    assert len(changes) == 1
    (change,) = changes
    assert change.path == render(steps)
    expected_kind = "changed" if json_type(old_leaf) == json_type(new_leaf) else "type_changed"
    assert change.kind == expected_kind
    assert change.new is new_leaf
    assert similarity(x, mutated) < 1.0


@settings(max_examples=300)
@given(JSON, JSON)
def test_property_diff_is_symmetric(a: Any, b: Any) -> None:
    forward = diff_values(a, b)
    backward = diff_values(b, a)
    assert len(forward) == len(backward)
    mirror = {"added": "removed", "removed": "added", "changed": "changed"}
    mirror["type_changed"] = "type_changed"
    mirror["reordered"] = "reordered"
    # An item compared in place after an insertion sits at another index in A than in B: a
    # change names B's in `path` and A's in `old_path`, which swap when the arguments do.
    assert sorted((where(c), mirror[c.kind]) for c in forward) == sorted(
        (where(c)[::-1], c.kind) for c in backward
    )


@settings(max_examples=300)
@given(JSON, JSON)
def test_property_similarity_bounds_and_agreement_with_diff(a: Any, b: Any) -> None:
    score = similarity(a, b)
    assert 0.0 <= score <= 1.0
    assert score == similarity(b, a)
    assert (score == 1.0) == (diff_values(a, b) == [])


@settings(max_examples=100)
@given(st.lists(st.tuples(st.sampled_from("pqrst"), JSON_DICTS), max_size=6), st.data())
def test_property_alignment_covers_every_node_once(
    spec: list[tuple[str, dict[str, Any]]], data: st.DataObject
) -> None:
    a = [node(i, name, out) for i, (name, out) in enumerate(spec)]
    names_b = data.draw(st.lists(st.sampled_from("pqrstu"), max_size=6))
    b = [node(i, name) for i, name in enumerate(names_b)]

    rows = align_nodes(a, b)

    assert [id(x) for x, _ in rows if x is not None] == [id(x) for x in a]  # A order kept
    assert sorted(id(y) for _, y in rows if y is not None) == sorted(id(y) for y in b)
    assert all(x is not None or y is not None for x, y in rows)
    assert all(x.name == y.name for x, y in rows if x is not None and y is not None)
    result = diff_trajectories("A", a, "B", b)
    assert result.token_delta == sum(n.token_delta for n in result.nodes)
    json.dumps(result.to_json(), allow_nan=False)


# ---------------------------------------------------------------------------------------------
# Value diff rules


def test_one_field_in_one_list_element_is_one_change() -> None:
    table = [{"month": m, "mean": float(m)} for m in range(6)]
    old = {"analysis": {"table": table}}
    new = {"analysis": {"table": [dict(row) for row in table]}}
    new["analysis"]["table"][3]["mean"] = 99.5

    assert diff_values(old, new) == [FieldChange("analysis.table[3].mean", "changed", 3.0, 99.5)]


def test_list_tail_elements_are_added_or_removed_at_their_index() -> None:
    assert diff_values([1, 2], [1, 2, 3, 4]) == [
        FieldChange("[2]", "added", None, 3),
        FieldChange("[3]", "added", None, 4),
    ]
    assert diff_values({"xs": [1, 2, 3]}, {"xs": [1]}) == [
        FieldChange("xs[1]", "removed", 2, None),
        FieldChange("xs[2]", "removed", 3, None),
    ]


def test_swapped_items_are_one_reordering() -> None:
    # The same items in another order: one change saying where each item came from, not
    # every index "changed" (nor a removal and an insertion).
    changes = diff_values({"xs": ["a", "b"]}, {"xs": ["b", "a"]})
    assert changes == [FieldChange("xs", "reordered", [0, 1], [1, 0])]
    ranked = [{"doc": d, "score": s} for d, s in (("x", 0.9), ("y", 0.5), ("z", 0.1))]
    reranked = [ranked[2], ranked[0], ranked[1]]
    assert diff_values(ranked, reranked) == [FieldChange("", "reordered", [0, 1, 2], [2, 0, 1])]
    assert diff_values(reranked, ranked) == [FieldChange("", "reordered", [0, 1, 2], [1, 2, 0])]
    # Duplicates keep their relative order; a changed item is not a reordering.
    assert diff_values([1, 1, 2], [2, 1, 1])[0].new == [2, 0, 1]
    assert [c.kind for c in diff_values(["a", "b"], ["b", "c"])] != ["reordered"]
    assert diff_values((1, 2), [2, 1])[0].kind == "type_changed"


@settings(max_examples=200)
@given(st.lists(JSON, min_size=2, max_size=8), st.randoms(use_true_random=False))
def test_property_a_permutation_is_one_reordering_that_restores_the_order(
    items: list[Any], rnd: Any
) -> None:
    shuffled = list(items)
    rnd.shuffle(shuffled)
    changes = diff_values(items, shuffled)
    if not changes:
        return  # the shuffle kept an equal order (equal items swapped)
    (change,) = changes
    assert change.kind == "reordered"
    assert diff_values([items[i] for i in change.new], shuffled) == []


def test_dict_keys_on_one_side_and_key_order_is_one_reordered_change() -> None:
    # Key order is part of a stored dict (rewind.serde keeps it): the diff agrees with the hash.
    assert diff_values({"a": 1, "b": 2}, {"b": 2, "a": 1}) == [
        FieldChange("", "reordered", ["a", "b"], ["b", "a"])
    ]
    assert diff_values({"a": 1, "b": 2}, {"a": 1, "b": 2}) == []


def test_item_inserted_at_the_front_is_one_insertion() -> None:
    table = [{"month": m, "mean": float(m)} for m in range(1, 13)]
    grown = [{"month": 0, "mean": -1.0}, *[dict(row) for row in table]]

    assert diff_values({"table": table}, {"table": grown}) == [
        FieldChange("table[0]", "added", None, {"month": 0, "mean": -1.0})
    ]
    assert diff_values({"table": grown}, {"table": table}) == [
        FieldChange("table[0]", "removed", {"month": 0, "mean": -1.0}, None)
    ]


def test_insertion_and_an_in_place_edit_keep_the_edit_at_its_index() -> None:
    old = ["intro", {"month": 1, "mean": 1.5}, {"month": 2, "mean": 2.5}, "outro"]
    new = ["new", "intro", {"month": 1, "mean": 1.5}, {"month": 2, "mean": 9.0}, "outro"]

    assert diff_values(old, new) == [
        FieldChange("[0]", "added", None, "new"),
        FieldChange("[3].mean", "changed", 2.5, 9.0, old_path="[2].mean"),
    ]


def test_item_removed_from_the_middle_is_one_removal() -> None:
    assert diff_values(list(range(10)), [0, 1, 2, 4, 5, 6, 7, 8, 9]) == [
        FieldChange("[3]", "removed", 3, None)
    ]


def test_content_alignment_keeps_float_and_nan_rules() -> None:
    # -0.0 and 0.0 are different items; NaN equals NaN (as everywhere in the diff).
    nan = float("nan")
    assert diff_values([nan, 0.0, 1], [7, nan, -0.0, 1]) == [
        FieldChange("[0]", "added", None, 7),
        FieldChange("[2]", "changed", 0.0, -0.0, old_path="[1]"),
    ]


def test_lists_of_unhashable_objects_compare_by_index() -> None:
    class Box:
        __hash__ = None  # type: ignore[assignment]

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Box)

    changes = diff_values([1, Box()], [0, 1, Box()])
    assert [(c.path, c.kind) for c in changes] == [
        ("[0]", "changed"),
        ("[1]", "type_changed"),
        ("[2]", "added"),
    ]


LISTS = st.lists(JSON, max_size=8)


@settings(max_examples=400)
@given(LISTS, JSON, st.data())
def test_property_one_inserted_item_is_one_insertion(
    items: list[Any], extra: Any, data: st.DataObject
) -> None:
    at = data.draw(st.integers(min_value=0, max_value=len(items)))
    grown = [*items[:at], extra, *items[at:]]

    changes = diff_values({"xs": items}, {"xs": grown})

    assert len(changes) == 1
    (change,) = changes
    assert change.kind == "added"
    index = int(change.path.removeprefix("xs[").removesuffix("]"))
    assert diff_values(grown[index], extra) == []  # an item equal to the one inserted
    assert diff_values([*grown[:index], *grown[index + 1 :]], items) == []
    backward = diff_values({"xs": grown}, {"xs": items})
    assert [(c.path, c.kind) for c in backward] == [(change.path, "removed")]


@settings(max_examples=300)
@given(st.lists(st.integers(), min_size=1, max_size=12, unique=True), st.data())
def test_property_insert_then_edit_is_two_changes(items: list[int], data: st.DataObject) -> None:
    rows = [{"id": i, "v": i} for i in items]
    at = data.draw(st.integers(min_value=0, max_value=len(rows)))
    edit = data.draw(st.integers(min_value=0, max_value=len(rows) - 1))
    new_rows = [dict(r) for r in rows]
    new_rows[edit]["v"] = "edited"
    new_rows.insert(at, {"id": "new"})

    changes = diff_values(rows, new_rows)

    edited_at = edit + (1 if at <= edit else 0)
    assert sorted((c.path, c.kind) for c in changes) == sorted(
        [(f"[{at}]", "added"), (f"[{edited_at}].v", "type_changed")]
    )
    (edited,) = [c for c in changes if c.kind == "type_changed"]
    assert (edited.old_path or edited.path) == f"[{edit}].v"  # where it was in A


def test_dict_keys_on_one_side_are_added_or_removed() -> None:
    assert diff_values({"a": 1, "gone": [1]}, {"a": 1, "new": {"x": None}}) == [
        FieldChange("gone", "removed", [1], None),
        FieldChange("new", "added", None, {"x": None}),
    ]


def test_added_null_is_distinguished_by_kind() -> None:
    (change,) = diff_values({}, {"x": None})
    assert change == FieldChange("x", "added", None, None)


def test_changes_come_in_sorted_key_order() -> None:
    changes = diff_values({"z": 1, "a": 1, "m": 1}, {"m": 2, "z": 2, "a": 2})
    assert [c.path for c in changes] == ["a", "m", "z"]


@pytest.mark.parametrize("key", ["_x", "__private", "__PRIOR_STEP", "$ref", "__"])
def test_private_and_dollar_keys_are_compared(key: str) -> None:
    changes = diff_values({key: 1, "other": 0}, {key: 2, "other": 0})
    assert len(changes) == 1
    assert changes[0].path == render([key])
    assert diff_values({key: 1}, {}) == [FieldChange(render([key]), "removed", 1, None)]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        (["analysis", "table", 3, "mean"], "analysis.table[3].mean"),
        (["weird key"], "['weird key']"),
        (["a", "weird key", 0], "a['weird key'][0]"),
        (["$ref"], "['$ref']"),
        (["it's"], "['it\\'s']"),
        (["back\\slash"], "['back\\\\slash']"),
        ([""], "['']"),
        (["1st"], "['1st']"),
    ],
)
def test_path_rendering(steps: list[Any], expected: str) -> None:
    old: Any = "leaf-old"
    for step in reversed(steps):
        old = [None] * step + [old] if isinstance(step, int) else {step: old}
    new = set_at(old, steps, "leaf-new")
    (change,) = diff_values(old, new)
    assert change.path == expected


def test_path_prefix_argument() -> None:
    assert diff_values({"a": 1}, {"a": 2}, path="out")[0].path == "out.a"
    assert diff_values([1], [2], path="out")[0].path == "out[0]"


def test_whole_value_path_is_empty() -> None:
    assert diff_values(1, 2) == [FieldChange("", "changed", 1, 2)]
    assert diff_values({"a": 1}, [1]) == [FieldChange("", "type_changed", {"a": 1}, [1])]


def test_nan_vs_nan_is_unchanged() -> None:
    nan_a, nan_b = float("nan"), float("nan")
    assert nan_a is not nan_b
    assert diff_values({"x": nan_a, "y": [nan_a]}, {"x": nan_b, "y": [nan_b]}) == []
    (change,) = diff_values({"x": nan_a}, {"x": 1.0})
    assert change.kind == "changed"
    assert change.path == "x"


def test_int_to_float_is_type_changed() -> None:
    assert diff_values({"n": 1}, {"n": 1.0}) == [FieldChange("n", "type_changed", 1, 1.0)]


def test_bool_vs_int_is_type_changed() -> None:
    assert diff_values(True, 1) == [FieldChange("", "type_changed", True, 1)]
    assert diff_values({"f": 0}, {"f": False})[0].kind == "type_changed"


def test_negative_zero_is_reported() -> None:
    (change,) = diff_values({"x": 0.0}, {"x": -0.0})
    assert change.kind == "changed"
    assert math.copysign(1, change.new) == -1


def test_equal_values_are_unchanged() -> None:
    big = 2**80 + 1
    old = {"n": big, "s": "hello", "f": 1.5}
    assert diff_values(old, {"n": int(str(big)), "s": "".join("hello"), "f": 1.5}) == []


def test_big_ints_are_compared_exactly() -> None:
    assert diff_values(2**53 + 1, 2**53) == [FieldChange("", "changed", 2**53 + 1, 2**53)]


def test_none_vs_value_and_containers_vs_scalars_are_type_changed() -> None:
    assert diff_values({"x": None}, {"x": 0})[0].kind == "type_changed"
    assert diff_values({"x": []}, {"x": {}})[0].kind == "type_changed"
    assert diff_values({"x": "1"}, {"x": 1})[0].kind == "type_changed"


def test_a_tuple_and_a_list_differ_in_type_and_tuples_compare_by_index() -> None:
    # Outputs load with their recorded types (rewind.serde): a tuple is not a list.
    assert [c.kind for c in diff_values((1, 2), [1, 2])] == ["type_changed"]
    assert diff_values((1, 2), (1, 2)) == []
    assert diff_values({"t": (1, 2)}, {"t": (1, 3)}) == [FieldChange("t[1]", "changed", 2, 3)]


def test_short_string_change_has_no_text_diff() -> None:
    assert diff_values({"s": "abc"}, {"s": "abd"}) == [FieldChange("s", "changed", "abc", "abd")]


def test_long_string_change_has_unified_text_diff() -> None:
    old = "The quick brown fox jumps over the lazy dog. " * 4
    new = old.replace("lazy", "sleepy", 1)
    assert len(old) > 120

    (change,) = diff_values({"report": {"body": old}}, {"report": {"body": new}})

    assert change.kind == "changed"
    assert change.text_diff is not None
    lines = change.text_diff.split("\n")
    assert lines[0] == "--- a/report.body"
    assert lines[1] == "+++ b/report.body"
    assert lines[2].startswith("@@")
    assert f"-{old}" in lines
    assert f"+{new}" in lines


def test_multiline_string_change_has_text_diff_even_if_short() -> None:
    (change,) = diff_values("one\ntwo\nthree", "one\n2\nthree")
    assert change.text_diff == "\n".join(
        ["--- a/", "+++ b/", "@@ -1,3 +1,3 @@", " one", "-two", "+2", " three"]
    )


def test_text_diff_shows_a_changed_trailing_newline() -> None:
    (change,) = diff_values({"s": "line\n"}, {"s": "line"})
    assert change.text_diff is not None
    assert "-" in change.text_diff.split("\n", 3)[3]


def test_records_are_frozen() -> None:
    change = FieldChange("x", "changed", 1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        change.path = "y"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        node(0, "plan").tokens = 3  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# similarity


def test_similarity_values() -> None:
    assert similarity("abcd", "abcd") == 1.0
    assert similarity("abcd", "wxyz") == 0.0
    assert similarity("abcd", "abce") == pytest.approx(0.75)
    assert similarity({"a": 1, "b": 2}, {"a": 1, "b": 3}) == pytest.approx(0.5)
    assert similarity({"a": 1}, {"b": 1}) == 0.0
    assert similarity([1, 2, 3, 4], [1, 2]) == pytest.approx(0.5)
    assert similarity({"t": ["abcd", 1]}, {"t": ["abce", 1]}) == pytest.approx(0.875)
    assert similarity(1, 1.0) == 0.0
    assert similarity(float("nan"), float("nan")) == 1.0
    assert similarity({}, {}) == 1.0
    assert similarity([], {}) == 0.0


# ---------------------------------------------------------------------------------------------
# Alignment


def test_align_same_path_pairs_by_position() -> None:
    a, b = run("plan", "research", "plan"), run("plan", "research", "plan")
    rows = align_nodes(a, b)
    assert rows == list(zip(a, b, strict=True))


def test_align_sorts_by_position() -> None:
    a = [node(1, "research"), node(0, "plan")]
    b = run("plan", "research")
    assert pair_names(align_nodes(a, b)) == [("plan", "plan"), ("research", "research")]


def test_align_extra_node_in_the_middle_of_b() -> None:
    a = run("plan", "research", "analyse", "compose")
    b = run("plan", "research", "fact_check", "analyse", "compose")
    rows = align_nodes(a, b)
    assert pair_names(rows) == [
        ("plan", "plan"),
        ("research", "research"),
        (None, "fact_check"),
        ("analyse", "analyse"),
        ("compose", "compose"),
    ]
    assert rows[2][1] is b[2]


def test_align_extra_node_at_start_and_end_of_b() -> None:
    a = run("plan", "compose")
    b = run("warmup", "plan", "compose", "publish")
    assert pair_names(align_nodes(a, b)) == [
        (None, "warmup"),
        ("plan", "plan"),
        ("compose", "compose"),
        (None, "publish"),
    ]


def test_align_repeated_node_pairs_kth_with_kth() -> None:
    a = run("plan", "critique", "revise", "critique", "revise", "compose")
    b = run("plan", "critique", "revise", "compose")
    rows = align_nodes(a, b)
    assert pair_names(rows) == [
        ("plan", "plan"),
        ("critique", "critique"),
        ("revise", "revise"),
        ("critique", None),
        ("revise", None),
        ("compose", "compose"),
    ]
    assert rows[1] == (a[1], b[1])
    assert rows[3][0] is a[3]


def test_align_repeated_node_extra_loop_in_b() -> None:
    a = run("plan", "critique", "revise", "compose")
    b = run("plan", "critique", "revise", "critique", "revise", "compose")
    rows = align_nodes(a, b)
    assert pair_names(rows) == [
        ("plan", "plan"),
        ("critique", "critique"),
        ("revise", "revise"),
        (None, "critique"),
        (None, "revise"),
        ("compose", "compose"),
    ]
    assert rows[3][1] is b[3]


def test_align_replaced_node_puts_a_side_before_b_side() -> None:
    a = run("plan", "research", "analyse")
    b = run("plan", "search", "analyse")
    assert pair_names(align_nodes(a, b)) == [
        ("plan", "plan"),
        ("research", None),
        (None, "search"),
        ("analyse", "analyse"),
    ]


def test_align_empty_runs() -> None:
    assert align_nodes([], []) == []
    a = run("plan")
    assert align_nodes(a, []) == [(a[0], None)]
    assert align_nodes([], a) == [(None, a[0])]


# ---------------------------------------------------------------------------------------------
# Trajectory diff


def test_trajectory_equal_runs() -> None:
    a = [node(0, "plan", {"q": 1}, tokens=30), node(1, "compose", {"t": "x"}, tokens=50)]
    b = [
        node(0, "plan", {"q": 1}, tokens=0, outcome="hit"),
        node(1, "compose", {"t": "x"}, tokens=0),
    ]

    result = diff_trajectories("run-a", a, "run-b", b)

    assert isinstance(result, TrajectoryDiff)
    assert [n.status for n in result.nodes] == ["equal", "equal"]
    assert result.first_divergence is None
    assert all(n.hash_equal and n.changes == () for n in result.nodes)
    assert (result.tokens_a, result.tokens_b, result.token_delta) == (80, 0, -80)
    assert [n.token_delta for n in result.nodes] == [-30, -50]
    assert result.nodes[0].b is not None and result.nodes[0].b.outcome == "hit"


def test_trajectory_first_divergence_and_changes() -> None:
    a = [
        node(0, "plan", {"q": "weather"}, tokens=20),
        node(1, "analyse", {"table": [{"mean": 1.0}, {"mean": 2.0}]}, tokens=0),
        node(2, "compose", {"text": "hello"}, tokens=40),
    ]
    b = [
        node(0, "plan", {"q": "weather"}, tokens=0),
        node(1, "analyse", {"table": [{"mean": 1.0}, {"mean": 2.5}]}, tokens=0),
        node(2, "compose", {"text": "hi"}, tokens=35),
    ]

    result = diff_trajectories("A", a, "B", b)

    assert [n.status for n in result.nodes] == ["equal", "changed", "changed"]
    assert result.first_divergence is result.nodes[1]
    assert result.first_divergence.name == "analyse"
    assert result.nodes[1].changes == (FieldChange("table[1].mean", "changed", 2.0, 2.5),)
    assert result.nodes[1].hash_equal is False
    assert [n.token_delta for n in result.nodes] == [-20, 0, -5]
    assert result.token_delta == -25


def test_trajectory_status_trusts_fields_not_hashes() -> None:
    a = [node(0, "plan", {"x": 1}, output_hash="same"), node(1, "go", {"y": 1}, output_hash="h1")]
    b = [node(0, "plan", {"x": 2}, output_hash="same"), node(1, "go", {"y": 1}, output_hash="h2")]

    result = diff_trajectories("A", a, "B", b)

    assert result.nodes[0].status == "changed" and result.nodes[0].hash_equal is True
    assert result.nodes[1].status == "equal" and result.nodes[1].hash_equal is False
    assert result.first_divergence is result.nodes[0]


def test_trajectory_one_sided_nodes() -> None:
    a = run("plan", "research", "compose")
    b = [node(0, "plan"), node(1, "research"), node(2, "extra", tokens=7), node(3, "compose")]

    result = diff_trajectories("A", a, "B", b)

    assert [(n.index, n.name, n.status) for n in result.nodes] == [
        (0, "plan", "equal"),
        (1, "research", "equal"),
        (2, "extra", "only_b"),
        (3, "compose", "equal"),
    ]
    extra = result.nodes[2]
    assert extra.a is None and extra.b is b[2]
    assert extra.changes == () and extra.hash_equal is False
    assert extra.token_delta == 7
    assert result.first_divergence is extra
    assert result.token_delta == 7

    reverse = diff_trajectories("B", b, "A", a)
    assert reverse.nodes[2].status == "only_a"
    assert reverse.nodes[2].token_delta == -7


# ---------------------------------------------------------------------------------------------
# JSON output


def test_to_json_with_nan_and_infinities() -> None:
    nan = float("nan")
    a = [node(0, "analyse", {"mean": nan, "max": math.inf, "t": (1, 2)}, tokens=3)]
    b = [node(0, "analyse", {"mean": 1.0, "max": -math.inf, "t": (1, 2)}, tokens=5)]

    payload = diff_trajectories("A", a, "B", b).to_json()
    text = json.dumps(payload, allow_nan=False, sort_keys=True)

    assert json.loads(text) == payload
    row = payload["nodes"][0]
    assert row["a"]["output"] == {"max": "Infinity", "mean": "NaN", "t": [1, 2]}
    assert row["changes"] == [
        {
            "path": "max",
            "kind": "changed",
            "old": "Infinity",
            "new": "-Infinity",
            "text_diff": None,
            "old_path": None,
        },
        {
            "path": "mean",
            "kind": "changed",
            "old": "NaN",
            "new": 1.0,
            "text_diff": None,
            "old_path": None,
        },
    ]
    assert payload["first_divergence"] == 0
    assert payload["counts"] == {"equal": 0, "changed": 1, "only_a": 0, "only_b": 0}
    assert (payload["tokens_a"], payload["tokens_b"], payload["token_delta"]) == (3, 5, 2)


def test_to_json_with_ints_longer_than_json_can_write() -> None:
    # Was: `rewind diff --json` died with a ValueError traceback (json.dumps cannot write an int
    # of more than 4300 digits), while the table view of the same diff worked.
    huge = 10**5000
    a = [
        NodeSide(
            position=0, name="make", output={"v": huge, "k": {huge: 1}}, output_hash="a", tokens=0
        )
    ]
    b = [
        NodeSide(
            position=0, name="make", output={"v": 5, "k": {huge: 2}}, output_hash="b", tokens=0
        )
    ]

    payload = diff_trajectories("A", a, "B", b).to_json()
    text = json.dumps(payload, allow_nan=False, sort_keys=True)

    assert json.loads(text) == payload
    change = next(c for c in payload["nodes"][0]["changes"] if c["path"] == "v")
    assert change["old"] == {"$rw": "int", "v": hex(huge)} and change["new"] == 5
    assert list(payload["nodes"][0]["a"]["output"]["k"]) == ["<int of 16610 bits>"]


def test_to_json_shape_and_determinism() -> None:
    a = [node(0, "plan", {"b": 1, "a": {"y": 2, "x": 1}}), node(1, "go")]
    a_reordered = [node(0, "plan", {"a": {"x": 1, "y": 2}, "b": 1}), node(1, "go")]
    b = [node(0, "plan", {"a": {"x": 1, "y": 3}, "b": 1})]

    first = diff_trajectories("A", a, "B", b).to_json()
    second = diff_trajectories("A", a_reordered, "B", b).to_json()

    for payload in (first, second):
        # Output hashes differ by construction in the helper; compare everything else.
        payload["nodes"][0]["a"].pop("output_hash")
    assert json.dumps(first) == json.dumps(second)
    assert list(first) == [
        "run_a",
        "run_b",
        "tokens_a",
        "tokens_b",
        "token_delta",
        "first_divergence",
        "counts",
        "code_changed",
        "nodes",
    ]
    row = first["nodes"][0]
    assert list(row) == [
        "index",
        "name",
        "status",
        "token_delta",
        "hash_equal",
        "code_changed",
        "helpers_changed",
        "a",
        "b",
        "changes",
    ]
    assert list(row["a"]) == ["position", "name", "tokens", "outcome", "code", "output"]
    assert first["nodes"][1]["b"] is None
    assert first["nodes"][1]["status"] == "only_a"
    assert row["changes"] == [
        {"path": "a.y", "kind": "changed", "old": 2, "new": 3, "text_diff": None, "old_path": None}
    ]


# ---------------------------------------------------------------------------------------------
# Purity


def test_module_imports_only_the_standard_library_and_the_pure_encoders() -> None:
    # The diff compares values as they are stored, so it may use Rewind's two pure encoding
    # modules (no I/O); never the store, the engine or the recorder.
    tree = ast.parse(Path(diff_module.__file__).read_text(encoding="utf-8"))
    imported = set()
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.Import):
            imported.update(alias.name for alias in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            assert stmt.level == 0, "no relative imports"
            imported.add(stmt.module or "")
    assert imported <= {
        "__future__",
        "collections",
        "collections.abc",
        "dataclasses",
        "difflib",
        "math",
        "typing",
        "rewind.canonical",
        "rewind.serde",
    }
