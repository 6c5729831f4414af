"""The traced hot path's shortcuts give exactly what the general code gives.

* ``jsonable`` copies plain values directly instead of the canonical JSON round trip: same
  values, same types, same key order as ``json.loads(canonical_bytes(value))``.
* Tool and step arguments bound by zipping give what ``signature.bind`` + ``apply_defaults``
  give, and every other call shape still goes through ``bind`` (same errors).
* A step switches the run context without ``activate``: the context is the step's inside it and
  the trace's again after it, also when steps nest or a step raises.
* ``Step.data`` builds its :class:`StepData` (and a cached trace its read-ahead cache entries)
  without the generated ``__init__``: every field is set, and equal to what the constructor
  gives.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any

import pytest

import rewind
from rewind.canonical import canonical_bytes
from rewind.context import current
from rewind.errors import RewindError
from rewind.tools import positional_names
from rewind.tracing import Tracer, step
from rewind.tracing.model import StepData, jsonable
from rewind.tracing.tracer import bound_input


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


PLAIN_AND_NOT = [
    {"model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 4}, "finish_reason": "stop"},
    {"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 64},
    {"numbers": [1, 2, 3, 4]},
    {"b": 1, "a": [True, None, {"z": "x", "y": 2**62}], "c": [[], {}]},
    {"z": 1, "B": 2, "a": 3, "_": 4, "0": 5},  # ASCII order: digits, upper, _, lower
    [1, "two", None, False, [3]],
    {"big": 2**63, "neg": -(2**63), "edge": 2**63 - 1},
    {"f": 1.5, "tiny": 1e-7, "huge": 1e20, "neg0": -0.0, "whole": 2.0},
    {"é": 1, "a": "é", "astral": "\U0001f600"},
    {1: "int key", "s": "x"},
    {"t": (1, 2), "nested": {"t": (3,)}},
    {"deep": _nested(20)},  # deeper than the direct copy goes
]


@pytest.mark.parametrize("value", PLAIN_AND_NOT, ids=range(len(PLAIN_AND_NOT)))
def test_jsonable_equals_the_canonical_round_trip(value: Any) -> None:
    expected = json.loads(canonical_bytes(value))
    got = jsonable(value)
    assert got == expected
    # Same types and key order all the way down (json.dumps without sort_keys shows both).
    assert json.dumps(got) == json.dumps(expected)
    assert canonical_bytes(got) == canonical_bytes(value)


def test_jsonable_copies_so_later_mutation_is_not_seen() -> None:
    messages = [{"role": "user", "content": "first"}]
    snapshot = jsonable({"messages": messages})
    messages[0]["content"] = "changed"
    messages.append({"role": "user", "content": "more"})
    assert snapshot == {"messages": [{"role": "user", "content": "first"}]}


def _plain(a: int, b: list[int], c: str = "d") -> None:
    """Every parameter positional-or-keyword."""


def _mixed(a: int, *rest: int, key: str = "k", **extra: Any) -> None:
    """Varargs, keyword-only and varkw parameters."""


class _Holder:
    def method(self, x: int, y: int = 2) -> int:
        return x + y


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"),
    [
        (_plain, (1, [2], "e"), {}),  # all positional: the zip shortcut
        (_plain, (1, [2]), {}),  # a default applied: bind
        (_plain, (1,), {"b": [2]}),  # a keyword: bind
        (_mixed, (1, 2, 3), {"key": "v", "z": 0}),
        (_Holder().method, (5, 6), {}),
        (_Holder.method, (_Holder(), 5, 6), {}),  # "self" dropped either way
    ],
)
def test_bound_input_equals_signature_bind(fn: Any, args: tuple, kwargs: dict) -> None:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    expected = jsonable({k: v for k, v in bound.arguments.items() if k not in ("self", "cls")})
    assert bound_input(fn, args, kwargs) == expected
    assert list(bound_input(fn, args, kwargs)) == list(expected)


def test_positional_names_only_for_positional_or_keyword_signatures() -> None:
    assert positional_names(inspect.signature(_plain)) == ("a", "b", "c")
    assert positional_names(inspect.signature(_mixed)) is None
    assert positional_names(inspect.signature(lambda: None)) == ()


def test_tool_bind_shortcut_and_errors() -> None:
    t = rewind.tool("hotpath_plain")(_plain)
    assert t.bind(1, [2], "e") == {"a": 1, "b": [2], "c": "e"}
    assert t.bind(1, [2]) == {"a": 1, "b": [2], "c": "d"}
    with pytest.raises(RewindError, match="hotpath_plain"):
        t.bind(1, [2], "e", "too many")
    with pytest.raises(RewindError, match="hotpath_plain"):
        t.bind()
    assert t.policy({}) is t.policy({"a": 1})  # built once: nothing in it depends on the call
    assert t.policy({}).determinism == "deterministic"
    t.determinism, t.ttl_s = "time-bound", 5.0  # changed settings: built again
    assert (t.policy({}).determinism, t.policy({}).ttl_s) == ("time-bound", 5.0)


def test_step_switches_the_run_context_and_restores_it(tmp_path: Any) -> None:
    tracer = Tracer(tmp_path, raise_on_write_error=True)
    seen: list[tuple[str, Any]] = []
    try:
        with tracer.trace("ctx") as t:
            trace_ctx = current()
            assert trace_ctx is t.run_context
            with step("outer", "transform"):
                outer = current()
                seen.append(("outer", outer.node.name if outer and outer.node else None))
                with step("inner", "transform"):
                    inner = current()
                    seen.append(("inner", inner.node.name if inner and inner.node else None))
                assert current() is outer
            assert current() is trace_ctx
            with pytest.raises(ValueError), step("fails", "transform"):
                raise ValueError("boom")
            assert current() is trace_ctx
        assert current() is None
    finally:
        tracer.close()
    assert seen == [("outer", "outer"), ("inner", "inner")]
    steps = {s.name: s.status for s in t.steps}
    assert steps == {"outer": "success", "inner": "success", "fails": "failed"}


def test_step_data_sets_every_field_as_the_constructor_does(tmp_path: Any) -> None:
    tracer = Tracer(tmp_path / "store")
    with tracer.trace("chain") as t:
        with step("parse", "parse", input={"text": "a"}) as s:
            s.set(model="m", usage={"prompt_tokens": 1})
            s.set_output({"x": [1, 2]})
        with step("fails", "validate") as f:
            f.fail("no")
    tracer.close()
    for s in t.steps:
        data = s.data()
        names = {f.name for f in dataclasses.fields(StepData)}
        assert set(vars(data)) == names
        rebuilt = StepData(**{n: getattr(data, n) for n in names})
        assert rebuilt == data
        assert data.reads == {} and data.determinism is None and data.cache_outcome is None


@pytest.mark.parametrize("origin", [None, "a" * 32])
def test_a_cache_entry_read_ahead_equals_the_constructed_one(origin: str | None) -> None:
    """The cache entries a cached trace reads ahead are built without the frozen dataclass's
    ``__init__``: every field is set, and the entry equals (and hashes as) the constructed one."""
    from rewind.store.store import CacheEntry

    built = CacheEntry.read("k" * 64, "r" * 64, 1.5, origin)
    made = CacheEntry("k" * 64, "r" * 64, 1.5, 0, 0, origin)
    assert CacheEntry.read("k", "r", 2.0, origin, 3, 4) == CacheEntry("k", "r", 2.0, 3, 4, origin)
    assert built == made and hash(built) == hash(made)
    assert set(vars(built)) == {f.name for f in dataclasses.fields(CacheEntry)}
