"""The cached-hit path's shortcuts give exactly what the general code gives.

* :class:`KeyPrefix` (a key head hashed once) gives :func:`key_of`'s digest.
* :func:`rewind.canonical.loads` (orjson, json where orjson would differ) gives ``json.loads``'s
  value, with the same types (an integer beyond 64 bits stays an exact int).
* Records and scopes built without their dataclass ``__init__`` equal those built with it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.call import Call, CallPolicy, Executed
from rewind.canonical import KeyPrefix, canonical_bytes, key_of, loads
from rewind.context import NodeScope
from rewind.errors import ModelCallError
from rewind.llm import ChatResponse
from rewind.store.records import CallRecord

parts = st.one_of(st.text(max_size=12), st.binary(max_size=12))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**80), 2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=6), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=200)
@given(st.lists(parts, max_size=3), st.binary(max_size=64))
def test_key_prefix_equals_key_of(head: list[str | bytes], data: bytes) -> None:
    assert KeyPrefix(*head).key(data) == key_of(*head, data)


def test_key_prefix_refuses_what_key_of_refuses() -> None:
    with pytest.raises(TypeError, match="part 1"):
        KeyPrefix("a", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="part 0"):
        KeyPrefix("\ud800")


def _same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down (1 != 1.0 != True here; -0.0 != 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


@settings(max_examples=300)
@given(json_values)
def test_loads_equals_json_loads(value: Any) -> None:
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        data = text.encode()
        assert _same(loads(data), json.loads(data))
    data = canonical_bytes(value)
    assert _same(loads(data), json.loads(data))


@pytest.mark.parametrize(
    "data",
    [
        b"-9223372036854775809",  # orjson reads it as a float
        b"[18446744073709551616, 1]",
        b'{"id": 123456789012345678901234567890}',
        b"NaN",
        b"[1E400]",
        b'"\\ud800"',
        b"\xef\xbb\xbf[1]",  # a byte order mark
        '{"a": "é"}'.encode("utf-16"),
        b"-0",
        b"[-0.0, 5e-324, 1e22]",
    ],
)
def test_loads_reads_what_orjson_would_read_differently_as_json_does(data: bytes) -> None:
    assert _same(loads(data), json.loads(data)) or math.isnan(json.loads(data))


@pytest.mark.parametrize("data", [b"", b"{", b"\xff\xfe\xfa", b"[1,]"])
def test_loads_raises_value_error_as_json_does(data: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(data)
    with pytest.raises(ValueError):
        loads(data)


def test_chat_response_from_raw_equals_the_constructed_one() -> None:
    raw = (
        b'{"model":"m","choices":[{"message":{"role":"assistant","content":"hi"},'
        b'"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}'
    )
    got = ChatResponse.from_raw(raw, latency_ms=4.0)
    built = ChatResponse(raw, json.loads(raw), "hi", "stop", 3, 2, latency_ms=4.0)
    assert got == built and got.__dict__ == built.__dict__
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.content = "x"  # type: ignore[misc]
    with pytest.raises(ModelCallError):
        ChatResponse.from_raw(b"not json")


def test_call_record_equals_the_constructed_one() -> None:
    call = Call("llm", "m", "k" * 64, b"{}", lambda: Executed(b"1"), CallPolicy(), 3)
    done = Executed(b"1", 5, 6, 7.0)
    got = call.record("r" * 64, "miss", "no-entry", produced_at=12.5, done=done, latency_ms=8.0)
    built = CallRecord(
        3,
        "llm",
        "m",
        "k" * 64,
        call.request_hash,
        "r" * 64,
        "miss",
        "no-entry",
        5,
        6,
        8.0,
        determinism="deterministic",
        produced_at=12.5,
    )
    assert got == built and got.__dict__ == built.__dict__
    assert hash(got) == hash(built)


def test_fresh_node_scope_equals_the_constructed_one() -> None:
    got = NodeScope.fresh("n", 2, 1.5, 3.5, {"p": 1})
    built = NodeScope(
        name="n", position=2, started_at=1.5, started_perf=3.5, param_overrides={"p": 1}
    )
    assert got == built
    assert set(got.__dict__) == {f.name for f in dataclasses.fields(NodeScope)}
    assert got.reserve_index() == 0 and got.reserve_index() == 1
    assert got.occurrence((), "k") == 0 and got.occurrence((), "k") == 1


def test_in_child_process_follows_a_fork(tmp_path: Any) -> None:
    from rewind.context import RunContext

    ctx = RunContext(store=None, run_id="r")  # type: ignore[arg-type]
    assert not ctx.in_child_process()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports and leaves at once
        os.write(write, b"1" if ctx.in_child_process() else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    os.close(read)
    os.close(write)
