"""Attacks on the traced-replay fast paths (issue #13): the lane's chat-key memo, the plain
tool request, and the unchanged replay's write that leaves out the blobs its source names.

Each lane scenario runs in two stores with the same history (a recording and a proving replay,
:func:`_side`): in one the lane serves what it can, in the other it is off; both must return and
store the same thing. The store scenarios archive, restore and delete the runs an unchanged
replay's write relies on, and read every blob the rows left name. Real SQLite stores and a real
loopback model server; none of those found a bug (they guard what was tried, issue #13).

One did, beside the fast paths: a recorded tool's function was called ``fn(**bound)``, so a
``**kwargs`` parameter got its dict as one keyword named after it, and a ``*args`` or a
positional-only parameter raised TypeError (a keyword named ``self`` too, at ``Tool.__call__``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import rewind
from rewind.store import open_store
from rewind.tracing import chat_step, lane, step
from tests.model_stub import stub_and_client
from tests.test_tracing_lane import _diff, reply, run, view

CALLS: list[Any] = []
THIRD = [False]
"""True while _side runs its third trace (the one compared)."""


class Holder:
    """An object whose method is a tool (``self`` bound)."""

    def __init__(self, base: int) -> None:
        self.base = base

    def add(self, x: int) -> int:
        CALLS.append(("add", x))
        return self.base + x


def _kw(a: Any, b: Any = (1, 2), **extra: Any) -> str:
    CALLS.append(("kw", a))
    return json.dumps([repr(a), repr(b), sorted(extra)], sort_keys=True)


def _var(*items: Any, tag: str = "t") -> int:
    CALLS.append(("var", items))
    return len(items)


KW = step("kw_tool", "tool_call")(rewind.tool("kw_tool")(_kw))
VAR = step("var_tool", "tool_call")(rewind.tool("var_tool")(_var))

ARGS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((1,), {}),
    ((True,), {}),
    (("1",), {}),
    ((None,), {}),
    (([1, [2, [3, [4]]]],), {"b": None}),
    (({"z": 1, "a": 2},), {"q": 3, "p": [True, None]}),
    (("héllo",), {}),
    ((2**63 - 1,), {"big": -(2**63) + 1}),
    ((2**63,), {}),
    (("x",), {"cls": {"k": 1}}),
    (((1, 2),), {"b": [1, 2]}),  # these three have one key (canonical JSON) and three answers
    (([1, 2],), {"b": (1, 2)}),
    ((frozenset({1, 2}),), {"b": [1, 2]}),
]


def tool_agent() -> str:
    out = []
    for args, kwargs in ARGS:
        try:
            out.append(KW(*args, **kwargs))
        except Exception as exc:  # what the full path raises, recorded
            out.append(type(exc).__name__)
    return json.dumps(out, default=str)


CHAT_PARAMS: list[dict[str, Any]] = [
    {"temperature": 0},
    {"temperature": False},
    {"temperature": 0, "seed": 1},
    {"temperature": 0, "seed": True},
    {"temperature": 0, "seed": "1"},
    {"temperature": 0, "max_tokens": None},
    {"temperature": 0, "stop": "x"},
    {"temperature": 0, "stop": ["x"]},
    {"temperature": 0, "model": None},
    {"temperature": 0, "model": "stub-model"},
    {"temperature": 0, "user": "a"},
    {"temperature": 0, "extra": {"b": 1, "a": [None, {"c": True}]}},
    {"temperature": 0, "extra": {"a": [None, {"c": 1}], "b": 1}},
    {"temperature": 0, "seed": 2**63 - 1},
    {"temperature": 0, "seed": 2**63},
    {"temperature": 0, "seed": 1.0},
]
"""Requests that differ only in types, None-valued fields, key order, big ints: each is asked
twice, as content "q" (one key per normalized request: the first asked is served by
position) and as a content of its own (so every step has a key no other step has)."""


def chat_agent() -> str:
    out = []
    for i, params in enumerate(CHAT_PARAMS):
        m = [{"role": "user", "content": f"q{i}"}]
        out.append(chat_step("llm", m, **params).content)
    for content in ("é", "q\u0000", "q" * 300):
        m = [{"role": "user", "content": content}]
        out.append(chat_step("llm", m, temperature=0).content)
    for params in CHAT_PARAMS:
        out.append(chat_step("llm", [{"role": "user", "content": "q"}], **params).content)
    return json.dumps(out)


def mixed_agent() -> str:
    """Tool and chat alternate, so both kinds are served in one lane."""
    out = []
    for i in range(4):
        out.append(chat_step("llm", [{"role": "user", "content": f"{i}"}], temperature=0).content)
        out.append(KW(i, b=[i], c=None))
    return json.dumps(out)


def _side(
    folder: Path, stub: Any, client: Any, block: Callable[[], str], full: bool
) -> tuple[Any, ...]:
    """(digest, requests, tool executions, stored view, steps served) of a third trace of
    ``block`` after a recording and a proving replay of it."""
    _, recorded = run(folder, client, block, read_cache=False)
    _, replayed = run(folder, client, block)
    assert replayed == recorded
    requests, executed = stub.count, len(CALLS)
    THIRD[0] = True
    try:
        with pytest.MonkeyPatch.context() as patch:
            if full:  # the lane serves nothing
                patch.setattr(lane, "serve_chat", lambda *a, **k: None)
                patch.setattr(lane, "serve_tool", lambda *a, **k: lane.NOT_SERVED)
            t, digest = run(folder, client, block)
    finally:
        THIRD[0] = False
    served = sum(1 for s in t.steps if s._proven is not None)
    return (digest, stub.count - requests, len(CALLS) - executed, view(folder, t.trace_id), served)


MIN_SERVED = {
    "tool_agent": len(ARGS) - 3,  # up to the three calls of one key with three answers
    "chat_agent": len(CHAT_PARAMS) - 2,  # up to the first request that is not plain
    "mixed_agent": 8,
}
"""How many steps the lane serves at least (then the full path takes over: the source's
answers to repeated keys are not all read ahead, and only plain requests are served)."""


@pytest.mark.parametrize("kept", [None, 1])
@pytest.mark.parametrize("block", [tool_agent, chat_agent, mixed_agent])
def test_attack_lane_matches_the_full_path(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    block: Callable[[], str],
    kept: int | None,
) -> None:
    """``kept``: the chat-key memo's size (1: emptied at nearly every request)."""
    for memo in (lane._CHAT_CALLS, lane._REQUESTS, lane._TOOL_CALLS, lane._RESPONSES):
        memo.clear()  # what an earlier test made is not read back
    if kept is not None:
        monkeypatch.setattr(lane, "CHAT_CALLS_KEPT", kept)
    results = {}
    for side in ("lane", "full"):
        with stub_and_client(reply) as (stub, client):
            results[side] = _side(tmp_path / side, stub, client, block, side == "full")
    lane_side, full_side = results["lane"], results["full"]
    ids = re.compile(r"'[0-9a-f]{32}' != '[0-9a-f]{32}'$")  # the stores' own run ids
    assert [d for d in _diff(lane_side[3], full_side[3]) if not ids.search(d)] == []
    assert lane_side[:3] == full_side[:3]
    assert full_side[4] == 0
    assert lane_side[4] >= MIN_SERVED[block.__name__]


# -- the unchanged replay's write, then gc / archive / restore / delete ------------------------
_HEX = re.compile(r"[0-9a-f]{64}")


def _all_named_readable(folder: Path, run_id: str) -> int:
    """Read every blob any row of ``run_id`` (and the map documents they name) names; returns
    how many. Raises StoreError when one is missing."""
    from rewind.store.retention import RUN_TABLES
    from tests.test_gc import rows_of

    st = open_store(folder)
    try:
        rows = rows_of(st, run_id)
        assert rows["runs"], f"run {run_id} has no run row"
        named: set[str] = set()
        for table_rows in rows.values():
            for row in table_rows:
                for k, v in row.items():
                    if isinstance(v, str) and k != "key":  # a call key names no blob
                        named.update(_HEX.findall(v))
        init = rows["runs"][0]["initial_state_hash"]
        doc = st.get_blob(init)
        named.update(_HEX.findall(doc.decode()))
        got = st.get_blobs(sorted(named))
        assert set(got) == named
        assert RUN_TABLES
        return len(named)
    finally:
        st.close()


def _readers(folder: Path, run_id: str) -> Any:
    """What the readers show of a trace (its stored view with payloads)."""
    return view(folder, run_id)


def _three(folder: Path, client: Any) -> tuple[Any, Any, Any]:
    """A recording, a proving replay and an unchanged lane replay (its blobs left out)."""
    from tests.test_tracing_lane import _traced

    source = _traced(folder, client, "done", read_cache=False)
    proving = _traced(folder, client, "done")
    same = _traced(folder, client, "done")
    assert same.parent_run_id == source.trace_id
    assert all(s._proven is not None for s in same.steps)
    return source, proving, same


def test_attack_gc_archives_and_restores_an_unchanged_lane_replay_whole(tmp_path: Path) -> None:
    from rewind.store.retention import collect_garbage, restore_run

    with stub_and_client(reply) as (_, client):
        source, proving, same = _three(tmp_path, client)
    before = {t.trace_id: _readers(tmp_path, t.trace_id) for t in (source, proving, same)}
    for t in (source, proving, same):
        _all_named_readable(tmp_path, t.trace_id)
    st = open_store(tmp_path)
    try:
        report = collect_garbage(st, 30 * 86400, now=time.time() + 40 * 86400)
        assert {a.run_id for a in report.archived} == set(before)
        assert report.blobs_deleted
        for run_id in (source.trace_id, same.trace_id, proving.trace_id):
            restore_run(st, run_id)
    finally:
        st.close()
    for run_id, v in before.items():
        _all_named_readable(tmp_path, run_id)
        assert _readers(tmp_path, run_id) == v


def test_attack_an_unchanged_lane_replay_archived_alone_then_restored(tmp_path: Path) -> None:
    from rewind.store.retention import collect_garbage, delete_run, restore_run
    from tests.test_gc import age

    with stub_and_client(reply) as (_, client):
        source, proving, same = _three(tmp_path, client)
    v = _readers(tmp_path, same.trace_id)
    st = open_store(tmp_path)
    try:
        age(st, same.trace_id, 40)
        report = collect_garbage(st, 30 * 86400)
        assert [a.run_id for a in report.archived] == [same.trace_id]
        delete_run(st, proving.trace_id)
        restore_run(st, same.trace_id)
    finally:
        st.close()
    _all_named_readable(tmp_path, same.trace_id)
    assert _readers(tmp_path, same.trace_id) == v
    st = open_store(tmp_path)
    try:
        delete_run(st, same.trace_id)
        delete_run(st, source.trace_id)
        with st.read() as conn:
            from sqlalchemy import func, select

            from rewind.store import schema

            assert conn.execute(select(func.count()).select_from(schema.runs)).scalar() == 0
    finally:
        st.close()


def test_attack_source_and_prover_deleted_while_a_lane_replay_runs(tmp_path: Path) -> None:
    """Both runs the lane stands on are deleted (blobs swept) before the replay is written:
    the replay is stored unlinked, every blob its rows name readable."""
    from rewind.store.retention import delete_run
    from rewind.tracing import Tracer
    from tests.test_tracing_lane import N, agent

    with stub_and_client(reply) as (_, client):
        source, proving, _same = _three(tmp_path, client)
        tracer = Tracer(tmp_path, chat_client=client, read_cache=True, raise_on_write_error=True)
        try:
            with tracer.trace("lane-agent", {"question": "sum", "n": N}) as t:
                agent()
                t.set_output("done")
                st = open_store(tmp_path)
                try:
                    delete_run(st, _same.trace_id)
                    delete_run(st, proving.trace_id)
                    gone = delete_run(st, source.trace_id)
                    assert gone.blobs_deleted
                finally:
                    st.close()
        finally:
            tracer.close()
    assert all(s._proven is not None for s in t.steps)
    st = open_store(tmp_path)
    try:
        row = st.get_run(t.trace_id)
        assert row.parent_run_id is None
    finally:
        st.close()
    _all_named_readable(tmp_path, t.trace_id)
    v = _readers(tmp_path, t.trace_id)
    assert v["input"] == {"n": N, "question": "sum"} and v["output"] == "done"


def _mutating(change: Callable[[Any], None]) -> Callable[[], str]:
    """A trace whose input, in the compared (third) trace only, is changed between steps the
    lane served: the recording and the proving replay end with the input they started with."""
    from rewind.tracing import current_trace

    def block() -> str:
        trace = current_trace()
        assert trace is not None
        trace.input = {"question": "sum"}
        out = []
        for i in range(6):
            if i == 3 and THIRD[0]:
                change(trace)
            messages = [{"role": "user", "content": f"part {i}"}]
            out.append(chat_step("llm", messages, temperature=0).content)
            out.append(KW(i, b=[i]))
        return json.dumps(out)

    return block


def _replace(trace: Any) -> None:
    trace.input = {"question": "changed"}


def _mutate(trace: Any) -> None:
    trace.input["question"] = "mutated"
    trace.input["extra"] = [1, 2]


@pytest.mark.parametrize("change", [_replace, _mutate, lambda t: None])
def test_attack_a_trace_input_changed_mid_trace_is_stored_as_the_full_path_stores_it(
    tmp_path: Path, change: Callable[[Any], None]
) -> None:
    block = _mutating(change)
    results = {}
    for side in ("lane", "full"):
        with stub_and_client(reply) as (stub, client):
            results[side] = _side(tmp_path / side, stub, client, block, side == "full")
    lane_side, full_side = results["lane"], results["full"]
    ids = re.compile(r"'[0-9a-f]{32}' != '[0-9a-f]{32}'$")
    assert [d for d in _diff(lane_side[3], full_side[3]) if not ids.search(d)] == []
    assert lane_side[:3] == full_side[:3]
    assert full_side[4] == 0
    assert lane_side[4] == 12  # every step, before and after the change
    assert lane_side[3]["input"] == full_side[3]["input"]


# -- a tool's function is called with the arguments it was given -------------------------------
def _kwargs_tool(a: int, b: int = 2, *, c: int = 3, **extra: Any) -> list[Any]:
    return [a, b, c, extra]


def _args_tool(first: int, *items: int, tag: str = "t") -> list[Any]:
    return [first, list(items), tag]


def _positional_tool(x: int, /, y: int = 1) -> list[int]:
    return [x, y]


@pytest.mark.parametrize(
    ("fn", "args", "kwargs"),
    [
        (_kwargs_tool, (1,), {}),
        (_kwargs_tool, (1,), {"z": 9, "extra": 8}),
        (_kwargs_tool, (1, 5), {"c": 6, "z": [1]}),
        (_kwargs_tool, (1,), {"self": 7}),
        (_args_tool, (1, 2, 3), {"tag": "x"}),
        (_args_tool, (1,), {}),
        (_positional_tool, (4,), {}),
        (_positional_tool, (4, 5), {}),
    ],
)
def test_attack_a_recorded_tool_runs_its_function_with_the_call_arguments(
    tmp_path: Path, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """In a run, a tool executes its function as the call gave the arguments: keywords a
    ``**kwargs`` parameter took, values a ``*args`` parameter took, positional-only ones (and a
    keyword named ``self``) reach it as outside any run; the replay serves that answer."""
    from rewind.tracing import Tracer

    expected = json.loads(json.dumps(fn(*args, **kwargs)))
    tool = rewind.tool(f"attack28.{fn.__name__}")(fn)
    got = []
    for read_cache in (False, True):
        tracer = Tracer(tmp_path, read_cache=read_cache, raise_on_write_error=True)
        try:
            with tracer.trace("attack28-tool"):
                got.append(tool(*args, **kwargs))
        finally:
            tracer.close()
    assert got == [expected, expected]
