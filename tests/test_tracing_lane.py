"""The lane of a cached trace (rewind.tracing.lane): steps served as a proven replay served them.

Each scenario runs in two stores with the same history (a recording, then one cached replay that
proves its steps): in one the lane serves what it can, in the other it is switched off. The
scenario's trace must return the same values, reach the model and the tool as often, and be
stored exactly alike (every reader's view, ids and times aside) — and, unchanged, return what
the recording returned. Real SQLite stores and a real loopback model server (tests.model_stub).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rewind
from rewind.canonical import canonical_bytes, sha256_hex
from rewind.llm import ChatClient
from rewind.serde import encode
from rewind.store import open_store
from rewind.tracing import Tracer, chat_step, lane, step
from rewind.tracing.model import StepData
from rewind.tracing.store import load_trace
from tests.model_stub import ModelStub, stub_and_client

N = 6
EXECUTED: list[list[int]] = []
_NUMBERS = re.compile(r"\d+")


def lane_sum(numbers: list[int]) -> int:
    """The tool body (counts its executions)."""
    EXECUTED.append(numbers)
    return int(sum(numbers))


TOOL = step("lane_sum", "tool_call")(rewind.tool("lane_sum")(lane_sum))


def reply(question: str, n: int) -> str:
    h = hashlib.sha256(question.encode()).digest()
    return "numbers " + " ".join(str(b) for b in h[:4])


@pytest.fixture
def stub_client() -> Iterator[tuple[ModelStub, ChatClient]]:
    with stub_and_client(reply) as pair:
        yield pair


def agent(n: int = N, *, change_at: int = -1, tool_at: int = -1, raise_at: int = -1) -> str:
    """The traced loop: an LLM step then a tool step, per step; optional changes."""
    digest = hashlib.sha256()
    answer, total = "start", 0
    for i in range(n):
        if i == raise_at:
            raise RuntimeError(f"stopped at {i}")
        extra = " (changed)" if i == change_at else ""
        messages = [
            {"role": "system", "content": "Reply with four numbers."},
            {"role": "user", "content": f"step {i}: {total}; {answer}{extra}"},
        ]
        answer = chat_step("llm", messages, temperature=0, max_tokens=32).content
        numbers = [int(x) for x in _NUMBERS.findall(answer)][:4]
        total = TOOL([*numbers, 1] if i == tool_at else numbers)
        digest.update(json.dumps([answer, total]).encode())
    return digest.hexdigest()


def run(
    folder: Path, client: ChatClient, block: Callable[[], str], *, read_cache: bool = True
) -> tuple[Any, str | None]:
    """One trace of ``block`` through a new Tracer: (the trace, the block's digest or None when
    it raised)."""
    tracer = Tracer(folder, chat_client=client, read_cache=read_cache, raise_on_write_error=True)
    digest = None
    try:
        with tracer.trace("lane-agent") as t:
            digest = block()
    except RuntimeError:
        pass
    finally:
        tracer.close()
    assert t.write_error is None
    return t, digest


def view(folder: Path, run_id: str) -> Any:
    """What readers see of a stored trace, without what differs between two stores (run ids,
    span ids, times)."""
    st = open_store(folder)
    try:
        v = load_trace(st, run_id, payloads=True)
        parent = st.get_run(v.parent_run_id) if v.parent_run_id else None
    finally:
        st.close()
    text = json.dumps(dataclasses.asdict(v), sort_keys=True, default=str)
    text = text.replace(run_id, "SELF")
    if parent is not None:
        text = text.replace(parent.run_id, "PARENT")
    out = json.loads(text)
    volatile = {"span_id", "started_at", "ended_at", "duration_ms", "produced_at", "trace_id"}
    volatile |= {"latency_ms"}  # of the calls that ran live

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(x) for k, x in value.items() if k not in volatile}
        if isinstance(value, list):
            return [strip(x) for x in value]
        return value

    return strip(out)


def history(folder: Path, client: ChatClient) -> str:
    """A recording, then one cached replay (which proves its steps); the recording's digest."""
    _, recorded = run(folder, client, agent, read_cache=False)
    _, replayed = run(folder, client, agent)
    assert replayed == recorded
    return recorded or ""


@pytest.fixture
def no_lane(monkeypatch: pytest.MonkeyPatch) -> Callable[[], Any]:
    """A context in which the lane serves nothing."""

    def off() -> Any:
        patch = pytest.MonkeyPatch()
        patch.setattr(lane, "serve_chat", lambda *a, **k: None)
        patch.setattr(lane, "serve_tool", lambda *a, **k: lane.NOT_SERVED)
        return patch

    return off


SCENARIOS: dict[str, Callable[[], str]] = {
    "unchanged": agent,
    "changed_request_at_3": lambda: agent(change_at=3),
    "tool_miss_at_2": lambda: agent(tool_at=2),
    "exception_at_4": lambda: agent(raise_at=4),
    "extra_step": lambda: agent(N + 1),
    "missing_step": lambda: agent(N - 1),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_lane_stores_and_returns_what_the_full_path_does(
    tmp_path: Path, no_lane: Callable[[], Any], scenario: str
) -> None:
    block = SCENARIOS[scenario]
    results = {}
    for side in ("lane", "full"):
        with stub_and_client(reply) as (stub, client):
            results[side] = _side(tmp_path / side, stub, client, block, no_lane, side == "full")
    lane_side, full_side = results["lane"], results["full"]
    assert _diff(lane_side[3], full_side[3]) == []
    assert lane_side[:4] == full_side[:4]
    assert full_side[4] == 0
    assert lane_side[4] >= 1  # the lane served the steps before any change
    if scenario == "unchanged":
        assert lane_side[0] == lane_side[5]  # the recording's answers
        assert lane_side[1:3] == (0, 0)
        assert lane_side[4] == 2 * N
        assert lane_side[3]["config"]["reference"]["all"] is True


def _side(
    folder: Path,
    stub: ModelStub,
    client: ChatClient,
    block: Callable[[], str],
    no_lane: Callable[[], Any],
    full: bool,
) -> tuple[Any, ...]:
    """One side of a comparison: (digest, requests, tool executions, stored view, steps the
    lane served, the recording's digest)."""
    recorded = history(folder, client)
    requests, executed = stub.count, len(EXECUTED)
    patch = no_lane() if full else None
    try:
        t, digest = run(folder, client, block)
    finally:
        if patch is not None:
            patch.undo()
    served = sum(1 for s in t.steps if s._proven is not None)
    return (
        digest,
        stub.count - requests,
        len(EXECUTED) - executed,
        view(folder, t.trace_id),
        served,
        recorded,
    )


def test_the_lane_serves_every_step_of_an_unchanged_replay_from_the_source(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    stub, client = stub_client
    recorded = history(tmp_path, client)
    source = run(tmp_path, client, agent, read_cache=False)  # a newer recording: the source
    requests, executed = stub.count, len(EXECUTED)
    proving, digest = run(tmp_path, client, agent)
    assert digest == recorded and all(s._proven is None for s in proving.steps)
    t, digest = run(tmp_path, client, agent)
    assert digest == recorded
    assert (stub.count - requests, len(EXECUTED) - executed) == (0, 0)
    assert [s._proven is not None for s in t.steps] == [True] * (2 * N)
    assert t.parent_run_id == source[0].trace_id
    st = open_store(tmp_path)
    try:
        stored = st.get_run(t.trace_id)
    finally:
        st.close()
    assert stored.parent_run_id == source[0].trace_id
    assert stored.config["reference"] == {"run": source[0].trace_id, "steps": 2 * N, "all": True}
    assert view(tmp_path, t.trace_id) == view(tmp_path, proving.trace_id)


def test_a_step_changed_after_the_lane_served_it_is_written_as_changed(
    tmp_path: Path, no_lane: Callable[[], Any]
) -> None:
    def block() -> str:
        digest = agent()
        from rewind.tracing import current_trace

        trace = current_trace()
        assert trace is not None
        trace.steps[2].set(reviewed=True)  # a served step's attributes, changed by the caller
        return digest

    views = []
    for side in ("lane", "full"):
        with stub_and_client(reply) as (stub, client):
            got = _side(tmp_path / side, stub, client, block, no_lane, side == "full")
        views.append(got[3])
    assert _diff(views[0], views[1]) == []
    assert views[0]["steps"][2]["attributes"]["reviewed"] is True
    assert views[0]["config"]["reference"]["steps"] == 2


def test_a_wrong_remembered_answer_is_never_served(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane serves the source's recorded bytes only when its lineage entry is the remembered
    call's: a remembered step whose call names another result is not served."""
    stub, client = stub_client
    recorded = history(tmp_path, client)
    original = lane._remembered

    def tampered(ln: Any, p: int, c: Any) -> Any:
        if p == 4 and ln.proven[4] is not None:
            proven = ln.proven[4]
            call = dataclasses.replace(proven.calls[0], result_hash="0" * 64)
            ln.proven[4] = dataclasses.replace(proven, calls=(call,))
        return original(ln, p, c)

    monkeypatch.setattr(lane, "_remembered", tampered)
    requests = stub.count
    t, digest = run(tmp_path, client, agent)
    assert digest == recorded
    assert stub.count == requests
    assert [s._proven is not None for s in t.steps][:5] == [True] * 4 + [False]


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _diff(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_a_callback_registered_during_a_trace_sees_every_later_step(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    _, client = stub_client
    history(tmp_path, client)
    seen: list[int] = []
    tracer = Tracer(tmp_path, chat_client=client, read_cache=True, raise_on_write_error=True)
    try:
        with tracer.trace("lane-agent") as t:
            digest = hashlib.sha256()
            answer, total = "start", 0
            for i in range(N):
                if i == 2:
                    tracer.on_step_end(lambda *, step, trace_id, **_: seen.append(step.position))
                messages = [
                    {"role": "system", "content": "Reply with four numbers."},
                    {"role": "user", "content": f"step {i}: {total}; {answer}"},
                ]
                answer = chat_step("llm", messages, temperature=0, max_tokens=32).content
                total = TOOL([int(x) for x in _NUMBERS.findall(answer)][:4])
                digest.update(json.dumps([answer, total]).encode())
    finally:
        tracer.close()
    assert [s._proven is not None for s in t.steps] == [True] * 4 + [False] * (2 * N - 4)
    assert seen == list(range(4, 2 * N))


def test_a_lane_replay_whose_source_gc_archived_meanwhile_is_stored_unlinked(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    """Every step served in the lane, then ``rewind gc`` archives the source (and sweeps its
    blobs) before the replay is written: stored without a parent, every call's request and
    result its own (what the full path does, rewind.tracing.tracer.Trace._unlinked)."""
    from rewind.store.retention import collect_garbage

    stub, client = stub_client
    recorded = history(tmp_path, client)
    requests = stub.count
    tracer = Tracer(tmp_path, chat_client=client, read_cache=True, raise_on_write_error=True)
    try:
        with tracer.trace("lane-agent") as t:
            digest = agent()
            st = open_store(tmp_path)
            try:
                report = collect_garbage(st, 30 * 86400, now=time.time() + 40 * 86400)
            finally:
                st.close()
            assert report.archived and report.blobs_deleted
    finally:
        tracer.close()
    assert digest == recorded and stub.count == requests
    assert [s._proven is not None for s in t.steps] == [True] * (2 * N)
    st = open_store(tmp_path)
    try:
        run_row = st.get_run(t.trace_id)
        assert run_row.parent_run_id is None and run_row.config["source_missing"]
        v = load_trace(st, t.trace_id, payloads=True)
        assert len(v.steps) == 2 * N and all(s.output is not None for s in v.steps)
        for node in st.nodes_of(t.trace_id):
            for call in node.calls:
                assert call.result_hash and st.get_blob(call.result_hash)
                assert st.get_blob(call.request_hash)
    finally:
        st.close()


def test_a_trace_input_rewind_cannot_store_fails_the_write_not_the_chain(
    tmp_path: Path, no_lane: Callable[[], Any]
) -> None:
    """A trace whose input is set, after it started, to a value Rewind has no encoding for: the
    full path runs the chain and fails only the write (``write_error``); the lane, which keys
    its remembered steps by the input's hash, must not raise into the chain either."""
    outcomes = []
    for side in ("lane", "full"):
        with stub_and_client(reply) as (stub, client):
            recorded = history(tmp_path / side, client)
            requests = stub.count
            patch = no_lane() if side == "full" else None
            tracer = Tracer(tmp_path / side, chat_client=client, read_cache=True)
            try:
                with tracer.trace("lane-agent") as t:
                    t.input = {"request": object()}
                    digest = agent()
            finally:
                tracer.close()
                if patch is not None:
                    patch.undo()
            assert digest == recorded and stub.count == requests
            outcomes.append((t.record is None, (t.write_error or "").split(":")[0]))
    assert outcomes[0] == outcomes[1] == (True, "UnstorableValue")


def _blob_rows(folder: Path) -> tuple[int, int, int]:
    """Rows of the three tables blobs live in (blobs, blob_slices, blob_packs)."""
    from sqlalchemy import func, select

    from rewind.store import schema

    st = open_store(folder)
    try:
        with st.read() as conn:
            return tuple(  # type: ignore[return-value]
                conn.execute(select(func.count()).select_from(t)).scalar()
                for t in (schema.blobs, schema.blob_slices, schema.blob_packs)
            )
    finally:
        st.close()


def _traced(folder: Path, client: ChatClient, output: str, *, read_cache: bool = True) -> Any:
    """A trace of the agent with an input, whose output is ``output``."""
    tracer = Tracer(folder, chat_client=client, read_cache=read_cache, raise_on_write_error=True)
    try:
        with tracer.trace("lane-agent", {"question": "sum", "n": N}) as t:
            agent()
            t.set_output(output)
    finally:
        tracer.close()
    return t


def test_an_unchanged_replay_writes_no_blob_its_source_names(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The initial state (document and field values) and the output of an unchanged replay are
    the ones its source's run row and root span name: they are not sent to the store again (no
    blob in its write, no blob, slice or pack row added), and both read back through the
    replay. An output of its own is written."""
    from rewind.store import Store

    _, client = stub_client
    source = _traced(tmp_path, client, "done", read_cache=False)
    _traced(tmp_path, client, "done")  # proves the steps
    sent: list[set[str]] = []
    write_batch = Store.write_batch

    def spy(self: Store, batch: Any, **kwargs: Any) -> None:
        sent.append(set(batch.blobs))
        write_batch(self, batch, **kwargs)

    monkeypatch.setattr(Store, "write_batch", spy)
    before = _blob_rows(tmp_path)
    same = _traced(tmp_path, client, "done")
    assert same.parent_run_id == source.trace_id
    assert [s._proven is not None for s in same.steps] == [True] * (2 * N)
    assert sent == [set()]
    assert _blob_rows(tmp_path) == before
    other = _traced(tmp_path, client, "another output")
    assert sent[1] == {hashlib.sha256(b'"another output"').hexdigest()}
    assert _blob_rows(tmp_path) != before
    st = open_store(tmp_path)
    try:
        for t, output in ((same, "done"), (other, "another output")):
            v = load_trace(st, t.trace_id, payloads=True)
            assert (v.input, v.output) == ({"n": N, "question": "sum"}, output)
            run_row = st.get_run(t.trace_id)
            assert run_row.initial_state_hash == st.get_run(source.trace_id).initial_state_hash
            assert st.get_blob(run_row.initial_state_hash)
    finally:
        st.close()


def test_a_chat_steps_key_is_made_once_per_request_and_default_model() -> None:
    """lane._chat_call keeps what it made per (request text, default model): each request,
    model and default gets the key plain_request_key gives it, whichever was asked first."""
    from rewind.llm import plain_request_key
    from rewind.tracing import step_memo
    from rewind.tracing.model import plain_fields

    messages = [{"role": "user", "content": "hi"}]
    bodies = [
        {"messages": messages, "temperature": 0},
        {"messages": messages, "temperature": False},
        {"messages": messages, "temperature": 1, "model": "m"},
        {"messages": messages, "temperature": 0, "max_tokens": None},
        {"messages": [{"content": "hi", "role": "user"}], "temperature": 0, "seed": 1},
    ]
    for _ in range(2):  # made, then read back
        for body in bodies:
            plain = plain_fields(body)
            assert plain is not None
            text = step_memo.text_of(plain)
            for default in ("model-a", "model-b"):
                fields = {k: v for k, v in plain.items() if v is not None}
                expected = plain_request_key(fields, default_model=default)
                key, request, model, determinism = lane._chat_call(plain, default, text)
                assert (key, request) == expected
                assert model == body.get("model", default)
                sampled = body["temperature"] == 1
                assert determinism == ("non-deterministic" if sampled else "deterministic")
    no_model = plain_fields(bodies[0])
    assert no_model is not None
    text = step_memo.text_of(no_model)
    assert lane._chat_call(no_model, "model-a", text) != lane._chat_call(no_model, "b", text)


def test_a_step_served_in_the_lane_has_every_attribute_a_step_has(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    """A step served in the lane carries every attribute a Step has (and no other), so it
    behaves as any other."""
    from rewind.tracing.tracer import Step

    _, client = stub_client
    history(tmp_path, client)
    t, _ = run(tmp_path, client, agent)
    made = Step(None, "x", "llm_call", {}, {}, 0, -1)
    assert t.steps and all(s._proven is not None for s in t.steps)
    for s in t.steps:
        assert set(vars(s)) == set(vars(made))
        assert s.status == "success" and s.trace is t and s.span_id != made.span_id


def _lane_probe(numbers: list[Any], label: str = "x", extra: Any = None) -> int:
    return len(numbers)


_PROBE = rewind.tool("lane_request_probe")(_lane_probe)

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
"""JSON-like values, and some that are not plain (floats, tuples, non-ASCII text, big ints)."""


@settings(max_examples=300, deadline=None)
@given(_VALUES, _VALUES, st.booleans())
def test_a_tool_steps_request_is_what_the_full_path_makes(
    numbers: Any, extra: Any, keyword: bool
) -> None:
    """lane._tool_request copies plain arguments once and takes their text as the request:
    for any arguments, the inputs, their text and the request bytes are what bound_input,
    step_memo.text_of and canonical_bytes(key_args(bind(...))) give."""
    from rewind.canonical import CanonicalError, canonical_bytes
    from rewind.tracing import step_memo
    from rewind.tracing.tracer import bound_input

    args: tuple[Any, ...] = ([numbers, 1],) if keyword else ([numbers, 1], "x", extra)
    kwargs: dict[str, Any] = {"extra": extra} if keyword else {}
    try:
        request = canonical_bytes(_PROBE.key_args(_PROBE.bind(*args, **kwargs)))
    except CanonicalError:
        with pytest.raises(CanonicalError):
            lane._tool_request(_PROBE, args, kwargs)
        return
    inputs = bound_input(_PROBE, args, kwargs)
    got = lane._tool_request(_PROBE, args, kwargs)
    assert got == (inputs, step_memo.text_of(inputs), request)
    assert json.dumps(got[0]) == json.dumps(inputs)  # exact types and key order too


class _Str(str):
    pass


class _Int(int):
    pass


_ODD = st.sampled_from([_Str("a"), _Int(1), 1, 1.0, True, -0.0, 0.0, "é", 2**63, (1,), [1]])
"""Values that are told apart only by their exact type (or not plain at all)."""


@settings(max_examples=300, deadline=None)
@given(_VALUES | _ODD, _VALUES | _ODD, st.booleans())
def test_a_chat_request_is_what_the_full_path_makes_of_it_every_time(
    content: Any, extra: Any, model: bool
) -> None:
    """lane._chat_request (kept per request as marshal writes it) gives, for any request, what
    plain_fields, step_memo.text_of and lane._chat_call give; its text read back is the plain
    copy (same values, types and key order); a request that is not plain is never served."""
    from rewind.tracing import step_memo
    from rewind.tracing.model import plain_fields

    request = {"messages": [{"role": "user", "content": content}], "seed": extra}
    if model:
        request["model"] = "m"
    for _ in range(2):  # made, then read back
        got = lane._chat_request(request, "default-model")
        plain = plain_fields(request)
        if plain is None:
            assert got is None
            continue
        text = step_memo.text_of(plain)
        call = lane._chat_call(plain, "default-model", text)
        assert got == (None if text is None or call is None else (text, *call))
        if got is not None:
            copy = json.loads(got[0])
            assert json.dumps(copy) == json.dumps(plain) and copy == plain
            assert json.dumps(lane.orjson.loads(got[0])) == json.dumps(plain)


@settings(max_examples=300, deadline=None)
@given(_VALUES | _ODD, _VALUES | _ODD, st.booleans())
def test_a_tool_call_is_what_the_full_path_makes_of_it_every_time(
    numbers: Any, extra: Any, keyword: bool
) -> None:
    """lane._tool_call (kept per tool and arguments as marshal writes them) gives the inputs,
    text, request and key lane._tool_request and the tool's key give: read back, the inputs
    are left out and are the request's text read back."""
    from rewind.canonical import CanonicalError

    args: tuple[Any, ...] = ([numbers, 1],) if keyword else ([numbers, 1], "x", extra)
    kwargs: dict[str, Any] = {"extra": extra} if keyword else {}
    for _ in range(2):
        try:
            inputs, text, request = lane._tool_request(_PROBE, args, kwargs)
        except CanonicalError:
            with pytest.raises(CanonicalError):
                lane._tool_call(_PROBE, args, kwargs)
            continue
        got = lane._tool_call(_PROBE, args, kwargs)
        assert got[1:] == (text, request, _PROBE._key_of(request))
        made = got[0] if got[0] is not None else lane.orjson.loads(got[2])
        assert json.dumps(made) == json.dumps(inputs) and made == inputs


def test_a_chat_answer_is_parsed_as_from_raw_parses_it_every_time() -> None:
    """lane._response keeps an answer's fields per bytes: each response it makes equals
    ChatResponse.from_raw's (long integers read exactly), with its own data; bytes from_raw
    refuses are not served."""
    from rewind.llm import ChatResponse

    def body(content: Any, extra: str = "") -> bytes:
        choice = {"message": {"content": content}, "finish_reason": "stop"}
        usage = {"prompt_tokens": 3, "completion_tokens": 2}
        return json.dumps({"choices": [choice], "usage": usage, "x": extra}).encode()[:-1] + (
            b', "big": 123456789012345678901234567890}'
        )

    raws = [body("hi"), body([{"type": "text", "text": "a"}]), body(None, "é"), b"[]", b"{"]
    for _ in range(2):
        for raw in raws:
            got = lane._response(raw)
            try:
                expected = ChatResponse.from_raw(raw)
            except Exception:
                assert got is None
                continue
            assert got == expected and got.data == expected.data and got.raw is raw
            assert got.data["big"] == 123456789012345678901234567890
            got.data["x"] = "changed"
            again = lane._response(raw)
            assert again is not None and again.data == expected.data


@settings(max_examples=300, deadline=None)
@given(_VALUES | _ODD, _VALUES | _ODD)
def test_an_output_taken_as_the_remembered_one_has_its_text(output: Any, remembered: Any) -> None:
    """lane._same_output takes an output as the remembered one only when the full check
    (jsonable, then step_memo.text_of of the fields) would: same text, same snapshot."""
    from rewind.tracing import step_memo
    from rewind.tracing.model import jsonable

    text = step_memo.text_of({"out": remembered}, sort_keys=False)
    if text is None:
        return
    read = lane.orjson.loads(text)["out"]  # the remembered output as the lane reads it
    for candidate in (output, read):
        got = lane._same_output(candidate, read)
        if got is not lane._NOT_SAME:
            snapshot = jsonable(candidate)
            assert step_memo.text_of({"out": snapshot}, sort_keys=False) == text
            assert json.dumps(got) == json.dumps(snapshot) and type(got) is type(snapshot)


@pytest.mark.parametrize(
    "raw", [b"1275", b'{"a": [1, 2.5, null]}', b"12345678901234567890123", b'"\\u00e9"', b"{"]
)
def test_a_tool_result_is_read_as_loads_reads_it_every_time(raw: bytes) -> None:
    """lane._value reads a tool's recorded result as rewind.canonical.loads does (long
    integers exactly), each time a fresh value; bytes loads refuses raise ValueError."""
    from rewind.canonical import loads

    for _ in range(2):
        try:
            expected = loads(raw)
        except ValueError:
            with pytest.raises(ValueError):
                lane._value(raw)
            continue
        got = lane._value(raw)
        assert json.dumps(got) == json.dumps(expected)
        if isinstance(got, dict):
            got["a"].append(0)
            assert lane._value(raw) == expected


def _typed_agent(kind: str) -> Callable[[], str]:
    """agent() whose step 3 sends an equal request with other exact types (``kind``)."""

    def block() -> str:
        out = []
        for i in range(4):
            content: Any = f"q{i}"
            messages: Any = [{"role": "user", "content": content}]
            params: dict[str, Any] = {"temperature": 0, "max_tokens": 32}
            if i == 3 and kind == "subclass":
                messages = [{"role": "user", "content": _Str(content)}]
            elif i == 3 and kind == "tuple":
                messages = ({"role": "user", "content": content},)
            elif i == 3 and kind == "float":
                params["max_tokens"] = 32.0
            elif i == 3 and kind == "bool":
                params["temperature"] = False
            out.append(chat_step("llm", messages, **params).content)
            out.append(TOOL((1, i) if i == 3 and kind == "tuple" else [1, i]))
        return json.dumps(out)

    return block


@pytest.mark.parametrize("kind", ["subclass", "tuple", "float", "bool"])
def test_a_request_equal_but_for_its_types_is_not_served_by_the_warm_lane(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient], kind: str
) -> None:
    """With the lane's memos filled by earlier replays of the same steps, a step whose request
    differs only in its values' exact types (a str subclass, a tuple for a list, 32.0 for 32,
    False for 0) is not served by the lane: it and every step after it take the full path."""
    _, client = stub_client
    plain = _typed_agent("")
    _, recorded = run(tmp_path, client, plain, read_cache=False)
    for _ in range(2):  # proves the steps, then is served by the lane (memos filled)
        t, digest = run(tmp_path, client, plain)
        assert digest == recorded
    assert all(s._proven is not None for s in t.steps)
    t, _ = run(tmp_path, client, _typed_agent(kind))
    assert [s._proven is not None for s in t.steps] == [True] * 6 + [False] * 2


def test_answers_of_other_bytes_types_are_read_as_from_raw_reads_them() -> None:
    """An answer or tool result held as a bytearray (another store driver) is read as the
    full path reads it, never looked up in the per-bytes memos (it is not hashable)."""
    from rewind.canonical import loads
    from rewind.llm import ChatResponse

    raw = b'{"choices": [{"message": {"content": "hi"}}]}'
    for _ in range(2):
        got = lane._response(bytearray(raw))
        assert got == ChatResponse.from_raw(bytearray(raw)) and type(got.raw) is bytes
        assert lane._value(bytearray(b"[1, 2]")) == loads(b"[1, 2]")


def test_served_step_data_fills_in_what_step_data_and_the_full_path_give(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    """steps_data's ServedData, once a field is read, holds every field step_data rebuilds;
    the fields it holds unread are the same; and a served step changed after the lane served
    it is compared on its own (its neighbours still served, it built the full way)."""
    _, client = stub_client
    history(tmp_path, client)
    t, _ = run(tmp_path, client, agent)
    steps = t.steps
    assert all(s._proven is not None for s in steps)
    served, signed = lane.steps_data(steps)
    for s, data in zip(steps, served, strict=True):
        assert isinstance(data, lane.ServedData)
        assert (data.position, data.name, data.prompt_tokens, data.completion_tokens) == (
            s.position,
            s.name,
            s.prompt_tokens,
            s.completion_tokens,
        )
        assert "inputs" not in vars(data)  # not filled in yet
        expected, expected_sig = lane.step_data(s)
        assert signed[id(data)] == expected_sig
        filled = dataclasses.asdict(data)  # reads every field: fills it in
        assert filled == dataclasses.asdict(expected) == dataclasses.asdict(s.data())
    steps[3].inputs["numbers"] = [*steps[3].inputs["numbers"], 0]
    again, signed = lane.steps_data(steps)
    assert [id(d) in signed for d in again] == [i != 3 for i in range(len(steps))]
    assert type(again[3]) is StepData and again[3].inputs == steps[3].inputs
    steps[3].inputs["numbers"] = steps[3].inputs["numbers"][:-1]
    steps[4].inputs["messages"] = list(steps[4].inputs["messages"])
    assert len(lane.steps_data(steps)[1]) == len(steps)  # equal again, as JSON


def test_a_served_step_is_held_as_a_record_until_the_traces_steps_are_read(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    """The lane keeps a served step as a Served record; reading the trace's steps makes each
    a Step once (the same object at every later read), whose data is the record's, and the
    trace's exit rebuilds an unread record's data as the Step's. A record's span id is drawn
    when first read (an unchanged replay's exit reads none), then kept."""
    _, client = stub_client
    history(tmp_path, client)
    held: list[Any] = []

    def block() -> str:
        from rewind.tracing import current_trace

        digest = agent()
        trace = current_trace()
        assert trace is not None
        held.extend(trace._steps)
        return digest

    t, _ = run(tmp_path, client, block)
    assert len(held) == 2 * N and all(type(r) is lane.Served for r in held)
    # stored by reference: its exit drew no span id for the steps
    assert t.record.config["reference"]["all"] is True
    assert all(r.span_id is None for r in held)
    records, signed = lane.steps_data(held)
    first = records[0].span_id  # drawn now, then the one the Step made later has
    steps = t.steps
    assert steps[0].span_id == first and len({s.span_id for s in steps}) == 2 * N
    assert [id(s) for s in steps] == [id(s) for s in t.steps]  # made once
    assert all(
        type(s) is not lane.Served and s._proven is r.proven
        for s, r in zip(steps, held, strict=True)
    )
    from_steps, signed_steps = lane.steps_data(steps)
    assert [signed[id(d)] for d in records] == [signed_steps[id(d)] for d in from_steps]
    for r, s, data in zip(held, steps, records, strict=True):
        assert (s.span_id, s.started_at, s.output) == (r.span_id, r.started_at, r.output)
        assert dataclasses.asdict(data) == dataclasses.asdict(s.data())


def _maybe_y(x: int, y: Any = None) -> int:
    return x


MAYBE_Y = step("maybe_y", "tool_call")(rewind.tool("lane_maybe_y")(_maybe_y))


def test_a_served_input_set_to_nan_where_it_was_none_is_refused_as_the_full_path_refuses_it(
    tmp_path: Path,
) -> None:
    """orjson writes NaN as ``null``: a served step's None input changed to NaN by the caller
    is not the text it was served with, and the write refuses it (CanonicalError) on both
    paths instead of storing None."""

    def once(*, mutate: bool, read_cache: bool = True, observed: bool = False) -> Any:
        tracer = Tracer(tmp_path, read_cache=read_cache)
        if observed:  # a step_end callback: every step takes the full path
            tracer.on_step_end(lambda **_: None)
        try:
            with tracer.trace("lane-nan") as t:
                MAYBE_Y(1)
                MAYBE_Y(2)
                if mutate:
                    t.steps[0].inputs["y"] = float("nan")
        finally:
            tracer.close()
        return t

    once(mutate=False, read_cache=False)
    once(mutate=False)
    once(mutate=False)
    for observed in (False, True):
        t = once(mutate=True, observed=observed)
        assert [s._proven is not None for s in t.steps] == [not observed] * 2
        assert t.write_error is not None and "CanonicalError" in t.write_error


def test_a_served_input_set_to_a_uuid_where_it_was_its_string_is_refused_as_on_the_full_path(
    tmp_path: Path,
) -> None:
    """orjson writes a ``uuid.UUID`` as its string: a served step's input changed from that
    string to the UUID by the caller is not what it was served with, and the write refuses it
    (CanonicalError) as a recording's does, on the lane and the full path alike. The same
    change in its attributes is stored as the full path stores it (as not hashable)."""
    u = uuid.UUID(int=0xABCDEF)

    def once(*, mutate: str = "", read_cache: bool = True, observed: bool = False) -> Any:
        tracer = Tracer(tmp_path, read_cache=read_cache)
        if observed:  # a step_end callback: every step takes the full path
            tracer.on_step_end(lambda **_: None)
        try:
            with tracer.trace("lane-uuid") as t:
                MAYBE_Y(1, str(u))
                MAYBE_Y(2, str(u))
                if mutate == "inputs":
                    t.steps[0].inputs["y"] = u
                elif mutate == "attributes":
                    t.steps[0].attributes["id"] = str(u)
                    t.steps[1].attributes["id"] = u
        finally:
            tracer.close()
        return t

    once(read_cache=False)
    once()
    once()
    recorded = once(mutate="inputs", read_cache=False)
    assert recorded.write_error is not None and "CanonicalError" in recorded.write_error
    for observed in (False, True):
        t = once(mutate="inputs", observed=observed)
        assert [s._proven is not None for s in t.steps] == [not observed] * 2
        assert t.write_error == recorded.write_error.replace(recorded.trace_id, t.trace_id)
    stored = []
    for observed in (False, True):
        t = once(mutate="attributes", observed=observed)
        assert t.write_error is None
        st = open_store(tmp_path)
        try:
            stored.append([s.attributes.get("id") for s in load_trace(st, t.trace_id).steps])
        finally:
            st.close()
    digest = sha256_hex(canonical_bytes(encode(u)))  # its exact document's
    assert stored[0] == stored[1] == [str(u), {"$unhashable": "UUID", "sha256": digest}]


def test_a_served_step_failed_and_finished_again_is_timed_from_its_start(
    tmp_path: Path, no_lane: Callable[[], Any]
) -> None:
    """A served step read, failed and finished again by the caller is stored with the duration
    the full path gives it (from the step's start), not the perf counter's reading since boot
    (its Step had no start on the perf counter)."""

    ids: list[str] = []

    def block() -> str:
        from rewind.tracing import current_trace

        digest = agent()
        trace = current_trace()
        assert trace is not None
        ids.append(trace.trace_id)
        s = trace.steps[1]
        s.fail("rejected after the fact")
        s.finish()
        return digest

    stored = {}
    for side in ("lane", "full"):
        with stub_and_client(reply) as (stub, client):
            got = _side(tmp_path / side, stub, client, block, no_lane, side == "full")
        assert got[4] == (2 * N if side == "lane" else 0)
        stored[side] = got[3]
    assert _diff(stored["lane"], stored["full"]) == []
    st = open_store(tmp_path / "lane")
    try:
        trace = load_trace(st, ids[0])
    finally:
        st.close()
    failed = trace.steps[1]
    assert failed.status == "failed"
    # Within its trace (no wall-clock bound: the bug stored the perf counter since boot).
    assert 0.0 <= failed.duration_ms <= trace.duration_ms
    assert trace.started_at <= failed.started_at <= failed.ended_at


def test_the_lane_reads_the_traces_clock_as_the_full_path_does(
    tmp_path: Path, no_lane: Callable[[], Any]
) -> None:
    """An injected clock is read once per step (and once per call executed), as on the full
    path: a step the lane looks at but does not serve (a first recording through
    ``Tracer(read_cache=True)``: no source yet) reads it no more often, and a served step reads
    it once. Every stored time is the one the same traces get with the lane off."""

    def times(folder: Path, client: ChatClient, full: bool) -> list[list[float]]:
        out = []
        for _ in range(3):  # the recording, the replay that proves it, a replay in the lane
            ticks = map(float, range(1000, 2000))
            tracer = Tracer(
                folder,
                chat_client=client,
                read_cache=True,
                clock=ticks.__next__,
                raise_on_write_error=True,
            )
            patch = no_lane() if full else None
            try:
                with tracer.trace("lane-agent") as t:
                    agent()
            finally:
                if patch is not None:
                    patch.undo()
                tracer.close()
            st = open_store(folder)
            try:
                v = load_trace(st, t.trace_id)
            finally:
                st.close()
            out.append([v.started_at, *(s.started_at for s in v.steps)])
            out.append([s.started_at for s in t.steps])  # as the trace holds them
        served = [s._proven is not None for s in t.steps]
        assert served == [not full] * (2 * N)
        return out

    got = {}
    for side in ("lane", "full"):
        with stub_and_client(reply) as (_, client):
            got[side] = times(tmp_path / side, client, side == "full")
    assert got["lane"] == got["full"]
    # The recording also reads it once per call it executes (the call's produced_at: its
    # cache entry's time, on the trace's clock as the trace's start is).
    assert got["lane"][0] == [1000.0, *(1001.0 + 2 * i for i in range(2 * N))]
    assert got["lane"][-1] == [1001.0 + i for i in range(2 * N)]


def test_served_steps_times_follow_each_other_within_their_trace(
    tmp_path: Path, stub_client: tuple[ModelStub, ChatClient]
) -> None:
    """A served step's start and end are read together when it is served: each step ends
    before the next one starts, and the last one before its trace ends (spans nested in
    time, as the full path's are)."""
    _, client = stub_client
    history(tmp_path, client)
    for _ in range(5):
        t, _ = run(tmp_path, client, agent)
        steps = t.steps
        assert all(s._proven is not None for s in steps)
        assert all(s.duration_ms >= 0.0 for s in steps)
        assert all(s.started_at <= s.ended_at for s in steps)
        assert all(a.ended_at <= b.started_at for a, b in itertools.pairwise(steps))
        assert t.started_at <= steps[0].started_at and steps[-1].ended_at <= t.ended_at


def _lane_record(q: str) -> dict[str, Any]:
    return {"q": q, "items": [1, {"x": q}]}


LANE_RECORD = step("lane_record", "tool_call")(rewind.tool("lane_record")(_lane_record))


def test_a_dict_output_changed_through_the_traces_data_is_stored_as_the_step_returned_it(
    tmp_path: Path, no_lane: Callable[[], Any]
) -> None:
    """The data ``Trace.data()`` and a ``step_end`` callback get hold their own copy of a
    step's output: changing it changes neither the step nor what is stored, whether the lane
    served the step or not (the full path handed out the step's own snapshot, so the full
    path stored the change and the lane did not)."""

    def once(folder: Path, *, read_cache: bool = True, callback: bool = False) -> Any:
        tracer = Tracer(folder, read_cache=read_cache, raise_on_write_error=True)
        if callback:

            def scribble(*, step: StepData, **_: Any) -> None:
                step.fields["lane_record"]["items"][1]["x"] = "callback"

            tracer.on_step_end(scribble)
        try:
            with tracer.trace("lane-record") as t:
                LANE_RECORD("a")
                LANE_RECORD("b")
                t.data().steps[0].fields["lane_record"]["q"] = "changed"
        finally:
            tracer.close()
        return t

    stored = _stored_on_three_sides(tmp_path, no_lane, once, lambda v: v.output)
    for t, _ in stored.values():
        assert t.steps[0].data().fields == {"lane_record": {"q": "a", "items": [1, {"x": "a"}]}}
    expected = [{"q": q, "items": [1, {"x": q}]} for q in ("a", "b")]
    assert {side: got for side, (_, got) in stored.items()} == {
        "lane": expected,
        "full": expected,
        "callback": expected,
    }


def _stored_on_three_sides(
    tmp_path: Path,
    no_lane: Callable[[], Any],
    once: Callable[..., Any],
    read: Callable[[Any], Any],
) -> dict[str, tuple[Any, list[Any]]]:
    """Per side ("lane": served in the lane, "full": the lane off, "callback": a step_end
    callback given, so the full path): a store folder where ``once(folder, read_cache=...,
    callback=...)`` (two steps) was recorded, replayed, then replayed on that side; the last
    trace and ``read`` of each of its stored steps."""
    out = {}
    for side in ("lane", "full", "callback"):
        folder = tmp_path / side
        once(folder, read_cache=False)
        once(folder)
        patch = no_lane() if side == "full" else None
        try:
            t = once(folder, callback=side == "callback")
        finally:
            if patch is not None:
                patch.undo()
        assert [s._proven is not None for s in t.steps] == [side == "lane"] * 2
        st = open_store(folder)
        try:
            out[side] = (t, [read(s) for s in load_trace(st, t.trace_id, payloads=True).steps])
        finally:
            st.close()
    return out


def test_inputs_changed_through_the_traces_data_are_stored_as_the_step_was_given_them(
    tmp_path: Path, no_lane: Callable[[], Any]
) -> None:
    """The data ``Trace.data()`` and a ``step_end`` callback get hold their own copy of a
    step's inputs (as of its output): changing them changes neither the step nor what is
    stored, whether the lane served the step or not (both paths handed out the step's own
    inputs, and stored the change)."""

    def once(folder: Path, *, read_cache: bool = True, callback: bool = False) -> Any:
        tracer = Tracer(folder, read_cache=read_cache, raise_on_write_error=True)
        if callback:

            def scribble(*, step: StepData, **_: Any) -> None:
                step.inputs["q"] = "callback"

            tracer.on_step_end(scribble)
        try:
            with tracer.trace("lane-record-inputs") as t:
                LANE_RECORD("a")
                LANE_RECORD("b")
                t.data().steps[0].inputs["q"] = "changed"
                t.data().steps[1].inputs.clear()
        finally:
            tracer.close()
        return t

    stored = _stored_on_three_sides(tmp_path, no_lane, once, lambda v: v.input)
    expected = [{"q": "a"}, {"q": "b"}]
    for side, (t, got) in stored.items():
        assert [s.inputs for s in t.steps] == expected, side
        assert t.record.config["reference"]["all"] is True  # as its source: by reference
        assert got == expected, side


def test_a_chain_end_callback_changes_nothing_the_trace_writes(tmp_path: Path) -> None:
    """A trace with a ``chain_end`` callback builds its steps' data the full way (no lane
    records): it writes the steps' own inputs, not the copies ``Trace.data()`` hands out
    (a copy is ``jsonable``, which turns a NaN into a marker: the write then stored it where
    the same trace without the callback fails, CanonicalError)."""

    def once(value: Any, *, chain_end: bool) -> Any:
        tracer = Tracer(tmp_path)
        if chain_end:
            tracer.on_chain_end(lambda **_: None)
        try:
            with tracer.trace("chain-end-inputs") as t, t.step("post", inputs={"v": value}) as s:
                s.set_output(1)
        finally:
            tracer.close()
        return t

    for value in (float("nan"), (1, 2.0)):
        plain, called = once(value, chain_end=False), once(value, chain_end=True)
        assert called.write_error == (
            None
            if plain.write_error is None
            else plain.write_error.replace(plain.trace_id, called.trace_id)
        )
        assert (called.record is None) == (plain.record is None)
    st = open_store(tmp_path)
    try:
        runs = [r for r in st.list_runs() if r.pipeline == "chain-end-inputs"]
        assert len(runs) == 2  # the tuple, twice: stored alike
        views = [load_trace(st, r.run_id) for r in runs]
        assert views[0].steps[0].input_hash == views[1].steps[0].input_hash
    finally:
        st.close()


def test_the_lanes_memos_are_bounded_by_bytes_as_well_as_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lane memo past MEMO_BYTES (or CHAT_CALLS_KEPT entries) is emptied before the next
    entry; an entry larger than the bound alone is not kept; what is kept is read back."""
    monkeypatch.setattr(lane, "MEMO_BYTES", 100)
    monkeypatch.setattr(lane, "CHAT_CALLS_KEPT", 3)
    memo = lane._Memo()
    memo.put("a", 1, 60)
    memo.put("b", 2, 30)
    assert (memo.get("a"), memo.get("b"), memo.size, len(memo)) == (1, 2, 90, 2)
    memo.put("c", 3, 20)  # 110 bytes: emptied first
    assert (memo.get("a"), memo.get("c"), memo.size) == (None, 3, 20)
    memo.put("d", 4, 101)  # larger than the bound alone: not kept
    assert (memo.get("d", "gone"), len(memo), memo.size) == ("gone", 0, 0)
    for i in range(4):
        memo.put(i, i, 1)
    assert len(memo) == 1 and memo.get(3) == 3  # emptied at 3 entries
    big = {"messages": [{"role": "user", "content": "x" * 200}]}
    lane._REQUESTS.clear()
    made = lane._chat_request(big, "default-model")
    assert made is not None and len(lane._REQUESTS) == 0  # too big to keep, still made
    assert lane._chat_request(big, "default-model") == made
