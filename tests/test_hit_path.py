"""The cached-hit path's shortcuts give exactly what the general code gives.

* :class:`KeyPrefix` (a key head hashed once) gives :func:`key_of`'s digest.
* :func:`rewind.canonical.loads` (orjson, json where orjson would differ) gives ``json.loads``'s
  value, with the same types (an integer beyond 64 bits stays an exact int).
* Records and scopes built without their dataclass ``__init__`` equal those built with it.
* A plain chat request (``chat_step``'s common case) is keyed from its one plain copy by
  :func:`plain_request_key`: the same key and request bytes as :func:`llm_request_key` of the
  body ``chat`` sends, and a traced step records the same call either way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind.call import Call, CallPolicy, Executed
from rewind.canonical import KeyPrefix, canonical_bytes, key_of, loads
from rewind.context import NodeScope
from rewind.errors import ModelCallError
from rewind.llm import ChatClient, ChatResponse, llm_cache_key, llm_request_key, plain_request_key
from rewind.store import open_store
from rewind.store.records import CallRecord
from rewind.tracing import Tracer, chat_step, step_memo
from rewind.tracing.model import as_fields, plain_fields

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
    assert set(got.__dict__) == {f.name for f in dataclasses.fields(CallRecord)}


def test_call_of_equals_the_constructed_call() -> None:
    def execute() -> Executed:
        return Executed(b"1")

    args = ("tool", "t", "k" * 64, b"{}", execute, CallPolicy("time-bound", 5.0), 2)
    got, built = Call.of(*args), Call(*args)
    assert got == built and got.__dict__ == built.__dict__
    assert set(got.__dict__) == {f.name for f in dataclasses.fields(Call)}


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


# -- chat requests keyed from their plain copy ---------------------------------------------------

ascii_text = st.text(st.characters(max_codepoint=127), max_size=8)
plain_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**62), 2**62),
    st.sampled_from([0, 1, 2, 10**5, 10**16, 10**17, -(10**17)]),  # 1e16 and up: exponent floats
    ascii_text,
)
plain_values = st.recursive(
    plain_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(ascii_text, children, max_size=3)
    ),
    max_leaves=10,
)
messages_strategy = st.lists(
    st.dictionaries(
        st.sampled_from(["role", "content", "name", "tool_call_id"]),
        st.one_of(ascii_text, st.text(max_size=8), st.none(), plain_values),
        min_size=1,
    ),
    max_size=3,
)
params_strategy = st.dictionaries(
    st.sampled_from(
        [
            "model",
            "temperature",
            "top_p",
            "presence_penalty",
            "max_tokens",
            "stop",
            "seed",
            "user",
            "stream",
            "response_format",
            "top_k",
        ]
    ),
    st.one_of(
        plain_values,
        st.floats(allow_nan=False, allow_infinity=False),  # not plain: the general way
        st.text(max_size=4),  # non-ASCII: not plain either
    ),
    max_size=5,
)
models = st.one_of(st.sampled_from(["m", "gpt-4o", "模型"]), st.text(min_size=1, max_size=6))


@settings(max_examples=400)
@given(messages_strategy, params_strategy, models)
def test_plain_request_key_equals_llm_request_key(
    messages: list[dict[str, Any]], params: dict[str, Any], model: str
) -> None:
    """What chat_step keys (plain copy of its input) == what chat keys (the body it sends)."""
    plain = plain_fields({"messages": messages, **params})
    body = {"messages": [dict(m) for m in messages]}
    body.update({k: v for k, v in params.items() if v is not None})
    try:
        expected: Any = llm_request_key(body, default_model=model)
    except ValueError as exc:  # CanonicalError (a lone surrogate), or no model at all
        expected = type(exc)
    if plain is None:
        return
    keyed = {k: v for k, v in plain.items() if v is not None}
    try:
        got: Any = plain_request_key(keyed, default_model=model)
    except ValueError as exc:
        got = type(exc)
    assert got == expected
    if isinstance(got, tuple):
        assert got[0] == llm_cache_key(body, default_model=model)


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 10**16},  # 1e16: exponent notation from repr, canonical writes digits
        {"top_p": 10**17, "temperature": 0},
        {"presence_penalty": -(10**18)},
        {"frequency_penalty": 9_999_999_999_999_999},
        {"temperature": True, "stop": "x"},
    ],
)
@pytest.mark.parametrize("model", ["m", "模型"])
def test_plain_request_key_writes_sampling_floats_canonically(
    params: dict[str, Any], model: str
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **params}
    plain = plain_fields(body)
    assert plain is not None
    assert plain_request_key(plain, default_model=model) == llm_request_key(
        body, default_model=model
    )


def test_plain_fields_refuses_what_it_cannot_copy_directly() -> None:
    assert plain_fields({"a": [1, {"b": "c"}], "n": None}) == {"a": [1, {"b": "c"}], "n": None}
    for value in ({"t": 0.0}, {"s": "é"}, {"t": (1,)}, {1: "x"}, {"big": 2**63}, [1]):
        assert plain_fields(value) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "messages, params",
    [
        ([{"role": "user", "content": "ping"}], {"temperature": 0, "max_tokens": 8}),
        ([{"role": "user", "content": "ping"}], {"temperature": 0.0, "top_p": None}),
        ([{"role": "user", "content": "café"}], {"temperature": 0}),
        (({"role": "user", "content": "tuple"},), {"temperature": 0, "stop": "x"}),
    ],
)
def test_chat_step_records_the_call_chat_would(
    tmp_path: Any, chat_client: ChatClient, messages: Any, params: dict[str, Any]
) -> None:
    store = open_store(tmp_path / "store")
    try:
        tracer = Tracer(store, chat_client=chat_client)
        with tracer.trace("t") as t:
            reply = chat_step("ask", messages, **params)
        s = t.steps[0].data()
        body = {"messages": [dict(m) for m in messages]}
        body.update({k: v for k, v in params.items() if v is not None})
        key, request = llm_request_key(body, default_model=chat_client.endpoint.model)
        assert [c.key for c in s.calls] == [key]
        assert s.calls[0].request_hash == hashlib.sha256(request).hexdigest()
        assert s.inputs == as_fields({"messages": messages, **params})
        assert s.fields == {"ask": reply.content}
        replay = Tracer(store, chat_client=chat_client, read_cache=True)
        with replay.trace("t") as again:
            served = chat_step("ask", messages, **params)
        assert served.raw == reply.raw
        hit = again.steps[0].data()
        assert [c.label for c in hit.calls] == ["hit"]
        signed = step_memo.signature(hit)
        assert signed is not None and signed == _signature_by_lists(hit)
    finally:
        store.close()


def _signature_by_lists(s: Any) -> bytes:
    """The step signature as it was first written: lists of the fields, field by field."""
    values: list[Any] = [getattr(s, name) for name in step_memo._SIGNED]
    values.append([[getattr(c, name) for name in step_memo._CALL_FIELDS] for c in s.calls])
    return hashlib.sha256(orjson.dumps(values, option=step_memo._OPTIONS)).digest()
