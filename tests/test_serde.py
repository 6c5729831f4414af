"""Type fidelity: every state value keeps its exact type and value through record → store →
fork → replay, or is refused at record time; a state that cannot be loaded fails the fork.

The end-to-end tests run as a user would: ``rewind run`` records in one process, ``rewind fork``
replays in a second, and a third loads the fork's final state and compares every value exactly
(``tests.typed_values.same``). Each process gets its own ``PYTHONHASHSEED``, so set and hash
ordering cannot leak into what is stored.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter, OrderedDict, defaultdict, deque
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from burr.core.state import register_field_serde
from hypothesis import given
from hypothesis import strategies as st

from rewind.canonical import canonical_bytes, sha256_hex
from rewind.diff import diff_values
from rewind.errors import StateLoadError, UnstorableValue
from rewind.persister import encode_value
from rewind.replay import Rewind
from rewind.serde import decode, decode_field, display, encode
from tests import typed_values as tv
from tests.cli_process import run_rewind

ROOT = Path(__file__).resolve().parent.parent


def _env(seed: int) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return dict(os.environ, PYTHONPATH=path, PYTHONHASHSEED=str(seed), COLUMNS="160")


def python(*args: str, seed: int = 1, cwd: Path = ROOT) -> Any:
    """Run ``python ARGS`` in a fresh process with this worktree's sources first on the path."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=_env(seed),
        cwd=cwd,
        timeout=900,
        check=False,
    )


def rewind_cli(store: Path, *args: str, seed: int | None = None, cwd: Path = ROOT) -> Any:
    """``rewind --store STORE ARGS``: in a fresh interpreter with hash seed ``seed``, or when
    ``seed`` is None (a test that compares no processes' hash orders) forked from the tests'
    fork server (``tests/cli_process.py``, ~1 s of CPU less a command)."""
    if seed is None:
        return run_rewind("--store", str(store), *args, cwd=cwd)
    return python("-m", "rewind", "--store", str(store), *args, seed=seed, cwd=cwd)


def check_in_fresh_process(store: Path, run_id: str, field: str, seed: int) -> dict[str, Any]:
    code = (
        "import json, sys; from tests.typed_values import check_final_state; "
        "print(json.dumps(check_final_state(*sys.argv[1:])))"
    )
    proc = python("-c", code, str(store), run_id, field, seed=seed)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def roundtrip(value: Any) -> Any:
    return decode(json.loads(canonical_bytes(encode(value))))


def digest(value: Any) -> str:
    return sha256_hex(canonical_bytes(encode(value)))


# -- record → fork in a fresh process → load in another, one test per type ----------------------


@pytest.fixture(scope="module")
def forked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    store = tmp_path_factory.mktemp("typed") / "store"
    state = json.dumps({"cases": list(tv.CASES)})
    run = rewind_cli(
        store, "run", "--pipeline", tv.typed_pipeline.ref, "--state", state, "--json", seed=1
    )
    assert run.returncode == 0, run.stderr
    parent = json.loads(run.stdout)
    fork = rewind_cli(store, "fork", parent["run"]["run_id"], "--at", "keep", "--json", seed=2)
    assert fork.returncode == 0, fork.stderr
    child = json.loads(fork.stdout)
    child_id = child["run"]["run_id"]
    return {
        "parent": parent,
        "child": child,
        "values": check_in_fresh_process(store, child_id, "values", seed=3),
        "copies": check_in_fresh_process(store, child_id, "copies", seed=4),
    }


@pytest.mark.parametrize("case", list(tv.CASES))
def test_type_and_value_survive_record_fork_and_replay(forked: dict[str, Any], case: str) -> None:
    # `values` was loaded by the fork from the store; `copies` was written again by the node
    # the fork re-executed on those loaded values.
    assert forked["values"][case] is None, forked["values"][case]
    assert forked["copies"][case] is None, forked["copies"][case]


def test_the_typed_unchanged_replay_has_identical_hashes(forked: dict[str, Any]) -> None:
    def hashes(out: dict[str, Any]) -> list[tuple[str, str, str]]:
        return [(n["name"], n["output_hash"], n["state_hash"]) for n in out["nodes"]]

    assert forked["child"]["run"]["status"] == "completed"
    assert hashes(forked["child"]) == hashes(forked["parent"])


def test_typed_initial_state_survives_a_fork_of_the_first_node(tmp_path: Path) -> None:
    store = tmp_path / "store"
    rw = Rewind(store)
    try:
        given_values = {name: factory() for name, factory in tv.CASES.items()}
        parent = rw.record(tv.echo_pipeline, {"given": given_values})
        assert parent.status == "completed", parent.error
        # The first node saw the caller's typed values, not a JSON round trip of them.
        echoed = rw.node_state(rw.store.nodes_of(parent.run_id)[0])["echoed"]
        assert all(tv.same(given_values[k], echoed[k]) is None for k in tv.CASES)
    finally:
        rw.store.close()
    fork = rewind_cli(store, "fork", parent.run_id, "--at", "1", "--json", seed=5)
    assert fork.returncode == 0, fork.stderr
    child_id = json.loads(fork.stdout)["run"]["run_id"]
    for field in ("given", "echoed"):
        result = check_in_fresh_process(store, child_id, field, seed=6)
        assert result == dict.fromkeys(tv.CASES), result


# -- properties ----------------------------------------------------------------------------------


def _set_safe(s: frozenset[Any]) -> bool:
    # {1, True} or {1, 1.0} keep whichever came first: equal values of different types in one
    # set are a property of Python sets, not of the encoding.
    return len({(type(x), x) for x in s}) == len(s)


_tz = st.sampled_from(
    [None, dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(-dt.timedelta(0))]
)
_hashable_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.dates(),
    st.datetimes(timezones=_tz),
    st.times(),
    st.timedeltas(),
    st.decimals(allow_nan=False),
    st.uuids(),
    st.sampled_from([*tv.Color, *tv.Level, *tv.Mode, tv.Perm.R | tv.Perm.W]),
    st.builds(complex, st.floats(-1e9, 1e9), st.floats(-1e9, 1e9)),
    st.builds(np.float64, st.floats(allow_nan=False, allow_infinity=False)),
    st.builds(np.int32, st.integers(-(2**31), 2**31 - 1)),
)
_hashables = st.recursive(
    _hashable_leaves,
    lambda inner: st.one_of(
        st.tuples(inner, inner), st.frozensets(inner, max_size=3).filter(_set_safe)
    ),
    max_leaves=6,
)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.one_of(st.text(max_size=5), st.integers(-5, 5), st.tuples(st.integers(0, 3)))
    return st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(keys, inner, max_size=4),
        st.dictionaries(st.text(max_size=5), inner, max_size=4).map(OrderedDict),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=4).map(Counter),
        st.dictionaries(st.text(max_size=3), inner, max_size=3).map(lambda d: defaultdict(list, d)),
        st.builds(deque, st.lists(inner, max_size=3), st.sampled_from([None, 3, 10])),
        st.sets(_hashable_leaves, max_size=4).filter(_set_safe),
        st.builds(
            tv.Point,
            st.floats(allow_nan=False, allow_infinity=False),
            st.floats(allow_nan=False, allow_infinity=False),
            st.text(),
        ),
        st.builds(tv.Report, title=st.text(max_size=5), tags=st.tuples(st.text(max_size=3))),
        st.builds(
            lambda a: np.asarray(a, dtype=np.float64).reshape(-1, 1),
            st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=4),
        ),
    )


typed_values = st.recursive(
    st.one_of(_hashables, st.binary().map(bytearray)), _containers, max_leaves=12
)


@given(typed_values)
def test_load_of_store_is_the_same_type_and_value(value: Any) -> None:
    back = roundtrip(value)
    assert tv.same(value, back) is None, tv.same(value, back)
    assert digest(back) == digest(value)  # what a fork re-records hashes the same


@given(typed_values, typed_values)
def test_equal_hashes_only_for_values_that_load_back_the_same(a: Any, b: Any) -> None:
    if digest(a) == digest(b):
        assert tv.same(roundtrip(a), roundtrip(b)) is None


_TWINS = {
    "tuple vs list": lambda xs: (tuple(xs), list(xs)),
    "set vs sorted list": lambda xs: (set(xs), sorted(set(xs))),
    "frozenset vs set": lambda xs: (frozenset(xs), set(xs)),
    "IntEnum vs int": lambda xs: (tv.Level.HIGH, 2),
    "StrEnum vs str": lambda xs: (tv.Mode.FAST, "fast"),
    "OrderedDict vs dict": lambda xs: (
        OrderedDict.fromkeys(map(str, xs)),
        dict.fromkeys(map(str, xs)),
    ),
    "Counter vs dict": lambda xs: (Counter(map(str, xs)), dict(Counter(map(str, xs)))),
    "deque vs list": lambda xs: (deque(xs), list(xs)),
    "deque maxlen": lambda xs: (deque(xs, maxlen=50), deque(xs, maxlen=51)),
    "defaultdict vs dict": lambda xs: (defaultdict(int, {"a": 1}), {"a": 1}),
    "defaultdict factories": lambda xs: (defaultdict(int), defaultdict(list)),
    "bytes vs bytearray": lambda xs: (bytes(len(xs)), bytearray(len(xs))),
    "key order": lambda xs: ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
    "int keys vs str keys": lambda xs: ({1: "x"}, {"1": "x"}),
    "Decimal digits": lambda xs: (Decimal("1.0"), Decimal("1.00")),
    "numpy dtype": lambda xs: (np.float32(len(xs)), np.float64(len(xs))),
    "numpy scalar vs float": lambda xs: (np.float64(len(xs)), float(len(xs))),
    "naive vs UTC": lambda xs: (dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 1, tzinfo=dt.UTC)),
    "user dict that looks like a tag": lambda xs: ({"$rw": "tuple", "items": []}, ()),
}


@pytest.mark.parametrize("twin", list(_TWINS))
@given(st.lists(st.integers(0, 9), min_size=1, max_size=5))
def test_values_that_load_back_differently_never_share_a_hash(twin: str, xs: list[int]) -> None:
    a, b = _TWINS[twin](xs)
    assert digest(a) != digest(b)
    assert tv.same(roundtrip(a), a) is None and tv.same(roundtrip(b), b) is None


def test_same_is_strict_so_the_properties_can_fail() -> None:
    assert tv.same((1,), [1]) is not None
    assert tv.same({"a": 1, "b": 2}, {"b": 2, "a": 1}) is not None
    assert tv.same(deque([1], maxlen=2), deque([1])) is not None
    assert tv.same(defaultdict(int), defaultdict(list)) is not None
    assert tv.same(tv.Level.LOW, 1) is not None
    assert tv.same(Decimal("1.0"), Decimal("1.00")) is not None
    assert tv.same(tv._scored(), tv.Scored(values=[1.0, 2.5])) is not None  # private attr


def test_plain_json_keeps_the_bytes_and_hashes_it_always_had() -> None:
    value = {"a": [1, 2.0, "x", None, True], "b": {"c": {}}}
    assert encode(value) is value
    assert encode_value("f", value).data == canonical_bytes(value)


# -- refusals ------------------------------------------------------------------------------------


def _open_file() -> Any:
    return open(__file__)


def _local_instance() -> Any:
    @dataclasses.dataclass
    class Local:
        n: int

    return Local(1)


@pytest.mark.parametrize(
    ("kind", "make", "type_name", "advice"),
    [
        ("lambda", lambda: lambda: 1, "function", "functions cannot be stored"),
        ("file", _open_file, "_io.TextIOWrapper", "open files"),
        ("local class", _local_instance, "Local", "defined inside a function"),
        ("no serializer", lambda: tv.NoSerializer(1), "tests.typed_values.NoSerializer", ""),
    ],
)
def test_initial_state_that_cannot_be_stored_is_refused_and_nothing_is_written(
    tmp_path: Path, kind: str, make: Any, type_name: str, advice: str
) -> None:
    value = make()
    rw = Rewind(tmp_path / "store")
    try:
        with pytest.raises(UnstorableValue) as info:
            rw.record(tv.echo_pipeline, {"given": {"rows": [0, value]}})
        assert rw.store.list_runs() == []
    finally:
        rw.store.close()
        if hasattr(value, "close"):
            value.close()
    err = info.value
    assert err.path == "given.rows[1]"
    assert "state field given.rows[1] holds a" in err.message and type_name in err.message
    assert advice in err.message
    assert "burr.core.serde.serialize.register" in err.hint or "importable module" in err.message
    con = sqlite3.connect(tmp_path / "store" / "rewind.db")
    try:
        assert con.execute("SELECT COUNT(*) FROM blobs").fetchone()[0] == 0
    finally:
        con.close()


def test_refusal_hint_says_how_to_register_a_serializer() -> None:
    with pytest.raises(UnstorableValue) as info:
        encode({"x": tv.NoSerializer(1)}, path="cfg")
    assert info.value.path == "cfg.x"
    assert "@burr.core.serde.serialize.register(NoSerializer)" in info.value.hint
    assert "register_type_to_pickle(NoSerializer)" in info.value.hint


def test_a_main_module_class_is_refused() -> None:
    main_cls = type("Script", (), {"__module__": "__main__"})
    with pytest.raises(UnstorableValue, match="lives in __main__"):
        encode(tv.Color.RED, path="ok")  # importable: fine
        encode(defaultdict(main_cls), path="d")


@pytest.mark.parametrize(
    ("bad", "path", "type_name"),
    [
        ("lambda", "holder.items[1]", "function"),
        ("file", "holder.items[1]", "TextIOWrapper"),
        ("local_class", "holder.items[1]", "Local"),
        ("custom", "holder.items[1]", "tests.typed_values.NoSerializer"),
    ],
)
def test_a_node_that_writes_an_unstorable_value_fails_the_run_there(
    tmp_path: Path, bad: str, path: str, type_name: str
) -> None:
    store = tmp_path / "store"
    state = json.dumps({"bad": bad})
    proc = rewind_cli(store, "run", "--pipeline", tv.refusing_pipeline.ref, "--state", state)
    assert proc.returncode == 1, proc.stderr
    line = " ".join(proc.stderr.split())
    assert f"state field {path} holds a" in line and type_name in line, line
    con = sqlite3.connect(store / "rewind.db")
    try:
        runs = con.execute("SELECT status, error FROM runs").fetchall()
        nodes = con.execute("SELECT name, cache_outcome, cache_reason FROM nodes").fetchall()
        states = con.execute("SELECT COUNT(*) FROM burr_state").fetchone()[0]
    finally:
        con.close()
    assert [r[0] for r in runs] == ["failed"] and path in runs[0][1]
    # The refused node is recorded as failed, its state is not written, the next never ran.
    assert nodes == [("refuse", "failed", "UnstorableValue")]
    assert states == 0


def test_nan_is_refused_with_its_field_path() -> None:
    with pytest.raises(UnstorableValue, match=r"state field m\.xs\[1\] holds a float.*nan"):
        encode_value("m", {"xs": (1.0, float("nan"))})


def _unstorable_shape(kind: str) -> Any:
    if kind == "list-cycle":
        looped: list[Any] = [1]
        looped.append(looped)
        return looped
    if kind == "dict-cycle":
        me: dict[str, Any] = {"t": (1,)}
        me["me"] = me
        return me
    deep: Any = (1,)
    for _ in range(500):  # deeper than MAX_DEPTH, with a typed value at the bottom
        deep = [deep]
    return deep


@pytest.mark.parametrize("kind", ["list-cycle", "dict-cycle", "deep"])
def test_a_cycle_or_too_deep_value_is_refused_not_a_recursion_error(kind: str) -> None:
    # Was: RecursionError out of the recorder's hook, ~11,000 lines of traceback on stderr.
    with pytest.raises(UnstorableValue, match=r"state field v holds a .*a cycle"):
        encode_value("v", _unstorable_shape(kind))


@pytest.mark.parametrize("kind", ["top", "in-list", "dict-key", "below-limit"])
def test_an_int_longer_than_json_can_read_back_loads_back_exactly(kind: str) -> None:
    # json.loads refuses ints of more than 4300 digits: such an int was recorded, then every
    # read of it (the next node, `rewind show`, a fork) failed with a raw ValueError.
    value = {
        "top": 10**5000,
        "in-list": [-(10**4301), 1],
        "dict-key": {10**4400: (10**4300,)},
        "below-limit": 10**4300 - 1,
    }[kind]
    assert decode_field("v", encode_value("v", value).data) == value


# -- a state that cannot be loaded fails the fork, never leaves it running ------------------------


def _write_value_module(folder: Path, *, with_class: bool) -> None:
    body = "from dataclasses import dataclass\n"
    if with_class:
        body += "@dataclass\nclass Thing:\n    n: int\n"
    (folder / "fleeting_values.py").write_text(body)


PIPELINE_MODULE = textwrap.dedent(
    """
    from burr.core import State, action
    from burr.core.graph import GraphBuilder
    from rewind.replay import Pipeline

    @action(reads=[], writes=["thing"])
    def make(state: State) -> State:
        from fleeting_values import Thing
        return state.update(thing=Thing(3))

    @action(reads=["thing"], writes=["seen"])
    def use(state: State) -> State:
        return state.update(seen=state["thing"].n)

    pipeline = Pipeline(
        "fleeting",
        GraphBuilder().with_actions(make=make, use=use).with_transitions(("make", "use")).build(),
        entrypoint="make",
        ref="fleeting_pipeline:pipeline",
    )
    """
)


def test_a_class_that_cannot_be_loaded_fails_the_fork_run(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "fleeting_pipeline.py").write_text(PIPELINE_MODULE)
    _write_value_module(work, with_class=True)
    store = tmp_path / "store"
    run = rewind_cli(store, "run", "--pipeline", "fleeting_pipeline:pipeline", "--json", cwd=work)
    assert run.returncode == 0, run.stderr
    parent_id = json.loads(run.stdout)["run"]["run_id"]

    _write_value_module(work, with_class=False)  # the class is gone in the fork's process
    fork = rewind_cli(store, "fork", parent_id, "--at", "use", cwd=work)
    assert fork.returncode == 1, fork.stderr
    line = " ".join(fork.stderr.split())
    assert "cannot load state field thing: fleeting_values:Thing cannot be imported" in line
    runs = json.loads(rewind_cli(store, "runs", "--json", cwd=work).stdout)
    (child,) = [r for r in runs if r["run_id"] != parent_id]
    assert child["status"] == "failed"
    assert "fleeting_values:Thing cannot be imported" in child["error"]


PICKLED_APP_MODULE = textwrap.dedent(
    """
    from burr.core import ApplicationBuilder, State, action
    from burr.integrations.serde.pickle import register_type_to_pickle

    from pickled_values import Money

    register_type_to_pickle(Money)  # at import time of the app's module, as the README says

    @action(reads=[], writes=["m"])
    def make(state: State) -> State:
        return state.update(m=Money(5))

    @action(reads=["m"], writes=["cents"])
    def use(state: State) -> State:
        return state.update(cents=state["m"].cents)

    def application():
        return (
            ApplicationBuilder().with_actions(make=make, use=use)
            .with_transitions(("make", "use")).with_entrypoint("make").build()
        )
    """
)


def test_read_commands_load_values_of_serializers_registered_in_the_app_module(
    tmp_path: Path,
) -> None:
    # Was: `rewind diff` and `rewind show --node` exited 2 ("No deserializer registered for
    # key: 'pickle'") on any run holding such a value: they never imported the app's module.
    work = tmp_path / "work"
    work.mkdir()
    (work / "pickled_values.py").write_text(
        "class Money:\n    def __init__(self, cents):\n        self.cents = cents\n"
    )
    (work / "pickled_app.py").write_text(PICKLED_APP_MODULE)
    store = tmp_path / "store"
    run = rewind_cli(
        store, "run", "--app", "pickled_app:application", "--halt-after", "use", "--json", cwd=work
    )
    assert run.returncode == 0, run.stderr
    parent_id = json.loads(run.stdout)["run"]["run_id"]
    fork = rewind_cli(store, "fork", parent_id, "--at", "use", "--json", cwd=work)
    assert fork.returncode == 0, fork.stderr
    child_id = json.loads(fork.stdout)["run"]["run_id"]

    diff = rewind_cli(store, "diff", parent_id, child_id, "--json", cwd=work)
    assert diff.returncode == 0, diff.stderr
    assert json.loads(diff.stdout)["first_divergence"] is None
    show = rewind_cli(store, "show", parent_id, "--node", "make", "--json", cwd=work)
    assert show.returncode == 0, show.stderr
    assert "pickle" in json.dumps(json.loads(show.stdout)["output"]["m"])


def test_a_first_node_fork_whose_initial_state_cannot_load_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rw = Rewind(tmp_path / "store")
    try:
        parent = rw.record(tv.echo_pipeline, {"given": tv.Color.RED})
        # The enum class no longer imports where the fork runs.
        monkeypatch.delattr(tv, "Color")
        with pytest.raises(StateLoadError, match=r"tests\.typed_values:Color cannot be imported"):
            rw.fork(parent.run_id, at=1)
        (child,) = [r for r in rw.store.list_runs() if r.run_id != parent.run_id]
        assert child.status == "failed"
        assert "cannot load state field given" in (child.error or "")
    finally:
        rw.store.close()


# -- Burr's serde: field serdes, user serializers, blobs written before tags ---------------------


def test_a_burr_field_serde_is_honoured() -> None:
    register_field_serde(
        "rewind_test_field",
        lambda value, **kw: {"csv": ",".join(value)},
        lambda doc, **kw: tuple(doc["csv"].split(",")),
    )
    f = encode_value("rewind_test_field", ("a", "b"))
    assert json.loads(f.data) == {"$rw": "field", "v": {"csv": "a,b"}}
    assert decode_field("rewind_test_field", f.data) == ("a", "b")


def test_a_user_registered_burr_serializer_is_honoured() -> None:
    doc = encode(tv.Money(5, "USD"))
    assert doc["$rw"] == "burr" and '"tests.money"' in canonical_bytes(doc).decode()
    assert roundtrip(tv.Money(5, "USD")) == tv.Money(5, "USD")


class _ObjectArray(np.ndarray):
    """An ndarray type of its own, so the serializer registered below touches nothing else."""


def test_a_burr_serializer_registered_for_an_object_array_is_honoured() -> None:
    # The refusal of an object-dtype array says to register a Burr serializer; one registered
    # was ignored and the array refused again.
    from burr.core import serde as burr_serde

    @burr_serde.serialize.register(_ObjectArray)
    def _out(value: Any, **kwargs: Any) -> dict[str, Any]:
        return {burr_serde.KEY: "rewind-test-object-array", "items": value.tolist()}

    @burr_serde.deserializer.register("rewind-test-object-array")
    def _in(value: dict[str, Any], **kwargs: Any) -> Any:
        return np.array(value["items"], dtype=object).view(_ObjectArray)

    value = np.array([1, "a", None], dtype=object).view(_ObjectArray)
    back = decode_field("v", encode_value("v", value).data)
    assert type(back) is _ObjectArray and back.dtype == object and back.tolist() == [1, "a", None]


def test_blobs_written_before_tags_load_as_before() -> None:
    plain = json.dumps({"b": 1, "a": [1, 2]}).encode()
    assert decode_field("x", plain) == {"b": 1, "a": [1, 2]}
    # Burr's own pydantic document, as Rewind stored models before tags existed.
    legacy = json.dumps(
        {
            "__burr_serde__": "pydantic",
            "__pydantic_class": "tests.typed_values.Report",
            "title": "t",
            "tags": ["a"],
            "level": 2,
            "when": None,
        }
    ).encode()
    loaded = decode_field("report", legacy)
    assert type(loaded) is tv.Report and loaded.tags == ("a",)


def test_an_unknown_tag_is_a_load_error_naming_the_field() -> None:
    with pytest.raises(StateLoadError, match="cannot load state field x: unknown tag 'nope'"):
        decode_field("x", b'{"$rw":"nope"}')


# -- diff and display show types -----------------------------------------------------------------


def test_diff_reports_type_changes_of_typed_values() -> None:
    assert [c.kind for c in diff_values({"t": (1, 2)}, {"t": [1, 2]})] == ["type_changed"]
    assert [c.kind for c in diff_values(tv.Level.HIGH, 2)] == ["type_changed"]
    assert [c.path for c in diff_values(tv._point(), tv.Point(1.5, -2.0, "origin"))] == ["moves"]
    assert diff_values(deque([1], maxlen=2), deque([1], maxlen=3))[0].path == ".maxlen"
    assert diff_values(np.arange(3), np.arange(3)) == []
    assert diff_values(np.arange(3), np.arange(1, 4))[0].kind == "changed"


def test_display_is_json_and_names_types() -> None:
    shown = display({"z": (1, tv.Mode.FAST), "a": dt.date(2024, 1, 1)})
    assert list(shown) == ["z", "a"]
    assert shown["z"]["$rw"] == "tuple"
    assert shown["z"]["items"][1] == {
        "$rw": "enum",
        "cls": "tests.typed_values:Mode",
        "value": "fast",
    }
    json.dumps(shown, allow_nan=False)


def test_a_pandas_frame_is_refused_with_a_hint_that_works() -> None:
    """The refusal's hint names the full type and a registration that stores it exactly."""
    pd = pytest.importorskip("pandas")
    with pytest.raises(UnstorableValue) as info:
        encode(pd.DataFrame({"a": [1, 2]}), path="df")
    assert "register_type_to_pickle(pandas.DataFrame)" in info.value.hint
    script = textwrap.dedent(
        """
        import pandas as pd
        from burr.integrations.serde.pickle import register_type_to_pickle
        from rewind.serde import decode, encode

        register_type_to_pickle(pd.DataFrame)  # what the hint says to do
        frame = pd.DataFrame({"a": [1, 2]}, index=["x", "y"])
        back = decode(encode(frame, path="df"))
        print(back.equals(frame), list(back.index))
        """
    )
    # In a child process: Burr's serializer registry cannot be undone in this one.
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "['x',", "'y']"], out.stdout
