"""Attacks on Rewind's replay and store as a hostile user (session 32, issue #13): hostile text
in errors and names, on every store backend (SQLite, and PostgreSQL through the throwaway server
of ``tests/services.py``).

Each test names what it found (a regression test that failed before its fix) or what held.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import enum
import json
import logging
import os
import re
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
from burr.core import State, action, default
from burr.core.graph import GraphBuilder

from rewind.replay import Pipeline, Rewind
from rewind.tracing import Tracer, step
from rewind.tracing.store import load_trace
from tests.conftest import StoreTarget

UNDECODABLE = os.fsdecode(b"report-\xff.csv")
"""A file name read from a directory listing that is not UTF-8: Python decodes it with
``surrogateescape``, so it holds a lone surrogate (``\\udcff``) and so does any error naming it."""

HOSTILE_ERRORS = {
    "nul": ("bad byte \x00 here", "bad byte \\u0000 here"),
    "surrogate": (f"cannot open {UNDECODABLE}", "cannot open report-\\udcff.csv"),
}
"""Exception messages (as raised, as stored): PostgreSQL text holds no NUL, and no backend can
encode a lone surrogate."""


# --- an exception's text is written down, never the reason a run is lost ----------------------
@pytest.mark.parametrize("kind", sorted(HOSTILE_ERRORS))
def test_a_step_failing_with_an_error_no_backend_keeps_raw_is_stored_failed(
    store_target: StoreTarget, kind: str
) -> None:
    """A traced step whose exception message held a lone surrogate (an error naming a file whose
    name is not UTF-8) made the trace's write fail with UnicodeEncodeError on every backend, and
    one holding NUL failed PostgreSQL's write ('text fields cannot contain NUL'): the trace, with
    every model call it paid for, was lost (record None). The text is now stored with those
    characters escaped, and the trace is kept, failed, with its steps."""
    raised, stored = HOSTILE_ERRORS[kind]
    st = store_target.open()
    try:
        tracer = Tracer(st, raise_on_write_error=True)
        with pytest.raises(ValueError), tracer.trace("hostile-error") as t:
            with step("fine", "transform", input={"i": 1}) as s:
                s.set_output(1)
            with step("read", "tool_call", input={"i": 2}):
                raise ValueError(raised)
        assert t.write_error is None and t.record is not None
        assert t.record.status == "failed"
        view = load_trace(st, t.trace_id)
        assert [s.status for s in view.steps] == ["success", "failed"]
        assert view.steps[1].error_message == stored
        assert st.get_run(t.trace_id).error == f"ValueError: {stored}"
    finally:
        st.close()


_MESSAGE = [""]


@action(reads=["x"], writes=["note"])
def _first(state: State) -> State:
    return state.update(note=state["x"] + 1)


@action(reads=["note"], writes=["never"])
def _raise(state: State) -> State:
    raise RuntimeError(_MESSAGE[0])


raising_pipeline = Pipeline(
    name="raising",
    graph=GraphBuilder()
    .with_actions(first=_first, boom=_raise)
    .with_transitions(("first", "boom", default))
    .build(),
    entrypoint="first",
    ref="tests.test_attack32:raising_pipeline",
)
"""Two Burr nodes; the second raises ``RuntimeError(_MESSAGE[0])``."""


@pytest.mark.parametrize("kind", sorted(HOSTILE_ERRORS))
def test_a_burr_node_failing_with_an_error_no_backend_keeps_raw_is_stored_failed(
    store_target: StoreTarget, kind: str
) -> None:
    """The same on the Burr path: ``Rewind.record`` of a pipeline whose node raised such an
    error raised UnicodeEncodeError or PostgreSQL's DataError instead of recording the failure,
    and left the run ``running`` for good. The run is now stored failed, with the node's error
    escaped."""
    raised, stored = HOSTILE_ERRORS[kind]
    _MESSAGE[0] = raised
    st = store_target.open()
    logging.disable(logging.ERROR)  # Burr logs the error: a lone surrogate no xdist report carries
    try:
        run = Rewind(st).record(raising_pipeline, {"x": 1})
        assert run.status == "failed"
        assert run.error == f"RuntimeError: {stored}"
        assert [(n.name, n.error) for n in st.nodes_of(run.run_id)] == [
            ("first", None),
            ("boom", f"RuntimeError: {stored}"),
        ]
    finally:
        logging.disable(logging.NOTSET)
        st.close()


def test_storable_text_escapes_only_what_no_backend_keeps() -> None:
    """Printable text, non-ASCII letters and emoji are unchanged; NUL and lone surrogates are
    written as escapes."""
    from rewind.store.records import storable_text

    for text in ("", "plain", "héllo wörld ✓ 🦀", "tab\tand\nnewline", "\\u0000 already"):
        assert storable_text(text) == text
    assert storable_text("a\x00b\x00") == "a\\u0000b\\u0000"
    assert storable_text("\ud800é\udfff") == "\\ud800é\\udfff"


# --- a name no backend keeps is refused where it is given --------------------------------------
BAD_NAMES = {"nul": "a\x00b", "long": "n" * 201, "surrogate": f"file {UNDECODABLE}"}
"""Names SQLite kept and PostgreSQL refused at the write (NUL, over varchar(200)), and one no
backend can encode (a lone surrogate)."""


NAME_REFUSED = "needs a name of 1 to 200 characters without NUL|holds a lone surrogate"
"""What the refusal says (a model name's lone surrogate was already refused by the request's
canonical bytes, before the call, as a CanonicalError)."""


def _named_chain(where: str, bad: str) -> None:
    """A paid model call, then a step, tool call or model call named ``bad`` (``where``)."""
    from rewind import tool
    from rewind.tracing import chat_step

    chat_step("llm", [{"role": "user", "content": "first"}], temperature=0)
    if where == "step":
        with step(bad, "transform", input={"i": 1}) as s:
            s.set_output(1)
    elif where == "tool":
        tool(bad)(len)("abc")
    else:
        chat_step("llm", [{"role": "user", "content": "second"}], model=bad, temperature=0)


@pytest.mark.parametrize("kind", sorted(BAD_NAMES))
@pytest.mark.parametrize("where", ["step", "tool", "model"])
def test_a_name_no_backend_keeps_is_refused_before_it_costs_the_trace(
    store_target: StoreTarget, where: str, kind: str
) -> None:
    """A step, tool or model name holding NUL or over 200 characters was stored by SQLite and
    refused by PostgreSQL when the trace was written ('text fields cannot contain NUL',
    'value too long for type character varying(200)'); one holding a lone surrogate failed
    every backend's write: the trace, and the model calls it had made, were lost. Such a name
    is now refused where it is given (ValueError saying what a name may be), before its step
    or call runs; the trace is stored failed with the steps before it, on every backend."""
    from tests.model_stub import stub_and_client

    bad = BAD_NAMES[kind]
    st = store_target.open()
    try:
        with stub_and_client() as (stub, client):
            tracer = Tracer(st, chat_client=client, raise_on_write_error=True)
            with (
                pytest.raises(ValueError, match=NAME_REFUSED),
                tracer.trace("named") as t,
            ):
                _named_chain(where, bad)
            assert stub.count == 1
        assert t.write_error is None and t.record is not None
        assert t.record.status == "failed"
        steps = [(s.name, s.status) for s in load_trace(st, t.trace_id).steps]
        assert steps == [("llm", "success")] + ([("llm", "failed")] if where == "model" else [])
    finally:
        st.close()


@pytest.mark.parametrize("kind", sorted(BAD_NAMES))
def test_a_trace_name_no_backend_keeps_is_refused_before_the_chain_runs(
    tmp_path: Path, kind: str
) -> None:
    """The same for a trace's name (the run's ``pipeline`` column): refused when the trace is
    made, as e1bae04 refuses such trace ids."""
    tracer = Tracer(tmp_path / "store")
    try:
        with pytest.raises(ValueError, match="a trace needs a name of 1 to 200 characters"):
            tracer.trace(BAD_NAMES[kind])
    finally:
        tracer.close()


# --- a value JSON cannot show is hashed by its content, not its type ---------------------------
CHANGED_OUTPUTS = {
    "bytes": (b"\x89PNG image v1", b"\x89PNG image v2"),
    "decimal": (Decimal("10.00"), Decimal("99.99")),
    "tuple keys": (
        {("rain", 2012): 1.5, ("sun", 2012): 0.0},
        {("rain", 2012): 1.5, ("sun", 2013): 0.0},
    ),
    "int and str keys": ({"1": "b"}, {1: "a", "1": "b"}),
    "numpy": (np.array([1.0, 2.0]), np.array([1.0, 2.5])),
}
"""(recorded, replayed) step outputs that differ only where the trace's JSON view could not show
the value: bytes (an image a step made), a Decimal amount, a dict keyed by tuples (a pandas
group-by's ``to_dict()``), a dict whose keys 1 and "1" both become "1", a numpy array."""


def _output_step(value: object) -> None:
    with step("make", "transform", input={"p": 1}) as s:
        s.set_output(value)


def _replayed_hashes(folder: Path, recorded: object, replayed: object) -> tuple[str, str, Any]:
    """(the recording's output hash, an in-place replay's, the replay's stored output)."""
    from rewind.store import open_store

    st = open_store(folder)
    try:
        with Tracer(st).trace("outputs") as t:
            _output_step(recorded)
        with Tracer(st).replay(t.trace_id) as r:
            _output_step(replayed)
        source, replay = load_trace(st, t.trace_id), load_trace(st, r.trace_id, payloads=True)
        assert replay.parent_run_id == t.trace_id
        return source.steps[0].output_hash, replay.steps[0].output_hash, replay.steps[0].output
    finally:
        st.close()


@pytest.mark.parametrize("kind", sorted(CHANGED_OUTPUTS))
def test_a_replay_whose_step_output_changed_inside_a_value_json_cannot_show_is_not_unchanged(
    tmp_path: Path, kind: str
) -> None:
    """A trace stores a step's values as JSON (``tracing.model.jsonable``); a value JSON cannot
    hold became ``{"$unhashable": "<type>"}`` and a non-string key ``$key:<type>``, with 1 and
    "1" merged into one key. So a replay whose step made other image bytes, another amount or
    another group was stored with the recorded step's output hash: 'unchanged', 0 differences,
    a change the debugger exists to show hidden (and one of two keys silently dropped). Such a
    value now carries the sha256 of its exact document (rewind.serde, as Burr runs store it),
    and keys are kept apart by their content; equal values still hash equal."""
    recorded, replayed = CHANGED_OUTPUTS[kind]
    source_hash, replay_hash, stored = _replayed_hashes(tmp_path / "changed", recorded, replayed)
    assert replay_hash != source_hash
    if isinstance(replayed, dict):
        assert len(stored) == len(replayed)
    same = _replayed_hashes(tmp_path / "same", recorded, copy.deepcopy(recorded))
    assert same[0] == same[1]


def _nested(depth: int, leaf: str) -> Any:
    value: Any = leaf
    for _ in range(depth):
        value = {"k": [value]}
    return value


def test_a_replay_whose_deeply_nested_output_changed_below_the_cut_is_not_unchanged(
    tmp_path: Path,
) -> None:
    """Hostile nesting (300 levels of ``{"k": [...]}``, 600 containers) in a step's output.
    Was a strict xfail: tracing.model.jsonable cut a value nested deeper than the hasher's
    MAX_DEPTH (400) at 64 levels to ``{"$unhashable": "<type>"}`` with no digest (serde refuses
    it too), so two outputs that differ only below the cut were stored with one hash: a replay
    whose deeply nested output changed was stored as unchanged. The cut now carries the digest
    of what it hides; equal values still hash equal."""
    source_hash, replay_hash, _ = _replayed_hashes(
        tmp_path / "deep", _nested(300, "recorded"), _nested(300, "replayed")
    )
    assert replay_hash != source_hash
    same = _replayed_hashes(tmp_path / "same", _nested(300, "recorded"), _nested(300, "recorded"))
    assert same[0] == same[1]


def test_a_step_output_100000_levels_deep_is_stored_with_a_digest_of_all_of_it(
    tmp_path: Path,
) -> None:
    """The digest of a cut value is taken without recursion: a hostile output 100,000 levels
    deep is stored (no RecursionError out of the tracer, the trace kept) and a change at its
    bottom still changes the step's hash."""
    source_hash, replay_hash, stored = _replayed_hashes(
        tmp_path / "deep", _nested(100_000, "recorded"), _nested(100_000, "replayed")
    )
    assert replay_hash != source_hash
    assert "sha256" in json.dumps(stored)


def test_the_digest_of_a_value_holding_itself_below_the_cut_does_not_depend_on_the_stack() -> None:
    """A value holding itself (a tree with back links) is cut after 64 levels; its digest
    names the back link by its distance up the path, so it is one at any caller's stack depth
    and a change elsewhere in the value still changes it."""
    from rewind.tracing.model import jsonable

    def deeper(levels: int, value: Any) -> Any:
        return jsonable(value) if levels == 0 else deeper(levels - 1, value)

    def ring(changed: int) -> dict[str, Any]:
        """100 nodes linked in a ring, node ``changed`` named otherwise."""
        nodes = [{"name": "x" if i == changed else i} for i in range(100)]
        for node, after in zip(nodes, nodes[1:] + nodes[:1], strict=True):
            node["next"] = after
        return nodes[0]

    assert jsonable(ring(-1)) == deeper(200, ring(-1))
    assert jsonable(ring(80)) != jsonable(ring(-1))


# --- held: the lane stores what the full path stores for inputs equal as JSON ------------------
class _One(enum.IntEnum):
    ONE = 1


class _Letter(enum.StrEnum):
    A = "a"


class _Text(str):
    pass


@dataclasses.dataclass
class _Point:
    a: int


class _Model(pydantic.BaseModel):
    a: int


TYPED_VARIANTS: dict[str, tuple[Any, Any]] = {
    "IntEnum": (1, _One.ONE),
    "StrEnum": ("a", _Letter.A),
    "str subclass": ("a", _Text("a")),
    "Decimal": (1, Decimal("1")),
    "datetime": ("2020-01-01T00:00:00", datetime.datetime(2020, 1, 1)),
    "dataclass": ({"a": 1}, _Point(1)),
    "pydantic": ({"a": 1}, _Model(a=1)),
    "bytes": ("ab", b"ab"),
    "float": (1, 1.0),
    "bool": (1, True),
    "-0.0": (0.0, -0.0),
    "2**64 as float": (2**64, float(2**64)),
    "tuple": ([1, 2], (1, 2)),
    "key order": ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
    "numpy int64": (1, np.int64(1)),
    "numpy array": ([1, 2], np.array([1, 2])),
    "set": ([1, 2], {1, 2}),
    "NaN": (None, float("nan")),
    "int key": ({"1": 1}, {1: 1}),
}
"""(recorded, third trace) values equal as JSON (or nearly) but not in Python type."""
_VARIANT = [""]


def _typed_block() -> str:
    from rewind.tracing import chat_step
    from tests import test_attack28

    recorded, variant = TYPED_VARIANTS[_VARIANT[0]]
    out = []
    for i in range(4):
        v = variant if test_attack28.THIRD[0] and i >= 1 else recorded
        try:
            out.append(test_attack28.KW(v, b=[i]))
        except Exception as exc:  # what the full path raises, recorded
            out.append(type(exc).__name__)
        try:
            messages = [{"role": "user", "content": f"q{i}"}]
            out.append(chat_step("llm", messages, temperature=0, extra=v).content)
        except Exception as exc:
            out.append(type(exc).__name__)
    return repr(out)


@pytest.mark.parametrize("kind", sorted(TYPED_VARIANTS))
def test_the_lane_stores_what_the_full_path_stores_for_inputs_that_differ_only_in_type(
    tmp_path: Path, kind: str
) -> None:
    """Held: a recording and a proving replay pass a tool and a chat step one value; the third
    trace passes, from its second step on, a value equal to it as JSON but of another Python
    type. With the lane on and off the third trace returns the same, sends the same requests,
    runs the same tools and stores the same rows."""
    from rewind.tracing import lane
    from tests import test_attack28
    from tests.model_stub import stub_and_client
    from tests.test_tracing_lane import _diff, reply

    _VARIANT[0] = kind
    for memo in (lane._CHAT_CALLS, lane._REQUESTS, lane._TOOL_CALLS, lane._RESPONSES):
        memo.clear()
    sides = {}
    for side in ("lane", "full"):
        with stub_and_client(reply) as (stub, client):
            sides[side] = test_attack28._side(
                tmp_path / side, stub, client, _typed_block, side == "full"
            )
    ids = re.compile(r"'[0-9a-f]{32}' != '[0-9a-f]{32}'$")  # the stores' own run ids
    assert [d for d in _diff(sides["lane"][3], sides["full"][3]) if not ids.search(d)] == []
    assert sides["lane"][:3] == sides["full"][:3]
    assert sides["full"][4] == 0
    if kind != "2**64 as float":  # a request holding an int past 63 bits is never plain
        assert sides["lane"][4] >= 1


# --- held: lane replays, recordings, deletes and gc at once on PostgreSQL ----------------------
def _pg_child(url: str, root: str, base_url: str, role: str, count: int) -> None:
    """In a child process: ``count`` traces on the PostgreSQL store ``url``, cached (``role``
    "replay", one input) or recorded (inputs and a first question of their own); one JSON line
    per trace (as tests.test_attack31._child_traces)."""
    from rewind.llm import ChatClient, Endpoint, RetryPolicy
    from rewind.store import open_store
    from tests.test_tracing_lane import agent

    client = ChatClient(
        Endpoint(base_url=base_url, api_key="none", model="stub-model"),
        retry=RetryPolicy(attempts=1),
    )
    st = open_store(url, root=Path(root))
    try:
        for i in range(count):
            replaying = role == "replay"
            tracer = Tracer(st, chat_client=client, read_cache=replaying)
            name = "lane-agent" if replaying else "lane-agent-other"
            with tracer.trace(name, {"n": 0 if replaying else i + 1}) as t:
                digest = agent(3, change_at=-1 if replaying else 0)
            served = sum(1 for s in t.steps if s._proven is not None)
            line = {"id": t.trace_id, "digest": digest, "error": t.write_error, "served": served}
            print(json.dumps(line), flush=True)
    finally:
        st.close()
        client.close()


def _deleted_of(st: Any, run_ids: list[str]) -> set[str]:
    """Delete each of ``run_ids`` that can be (not one a replay of it now stands on)."""
    from rewind.errors import RewindError
    from rewind.store.retention import delete_run

    gone = set()
    for run_id in run_ids:
        try:
            delete_run(st, run_id)
        except RewindError:
            continue
        gone.add(run_id)
    return gone


@pytest.mark.postgres
def test_lane_replays_beside_recorders_deletes_and_gc_on_postgresql(
    postgres_server: Any, tmp_path: Path
) -> None:
    """Held: two processes replay one trace through the lane and two record other traces on
    one PostgreSQL store while this process deletes recorded runs and some of the replays as
    they appear and runs gc after each pass. Every trace is written; every replay not deleted
    is linked to the recording and holds its outputs."""
    import subprocess
    import sys

    from rewind.store import open_store
    from rewind.store.retention import collect_garbage
    from tests.model_stub import stub_and_client
    from tests.test_tracing_lane import agent, reply

    url, root = postgres_server.new_store_database(), tmp_path / "root"
    with stub_and_client(reply) as (stub, client):
        st = open_store(url, root=root)
        try:
            with Tracer(st, chat_client=client).trace("lane-agent", {"n": 0}) as recording:
                recorded = agent(3)
        finally:
            st.close()
        code = "import sys; from tests.test_attack32 import _pg_child as c; c(*sys.argv[1:5], 20)"
        children = [
            subprocess.Popen(
                [sys.executable, "-c", code, url, str(root), stub.base_url, role],
                stdout=subprocess.PIPE,
                text=True,
                env=dict(os.environ),
                cwd=Path(__file__).resolve().parents[1],
            )
            for role in ("replay", "replay", "record", "record")
        ]
        deleted: set[str] = set()
        while any(c.poll() is None for c in children):
            st = open_store(url, root=root)
            try:
                with st.read() as conn:
                    rows = conn.exec_driver_sql(
                        "SELECT run_id, parent_run_id FROM runs WHERE run_id != %s",
                        (recording.trace_id,),
                    ).all()
                others = [r for r, parent in rows if parent is None][:2]
                replays = [r for r, parent in rows if parent == recording.trace_id][:1]
                deleted |= _deleted_of(st, others + replays)
                collect_garbage(st, 3600.0)
            finally:
                st.close()
        outs = [c.communicate()[0] for c in children]
    assert [c.returncode for c in children] == [0, 0, 0, 0]
    lines = [json.loads(line) for out in outs for line in out.splitlines()]
    assert len(lines) == 80 and all(line["error"] is None for line in lines)
    replays = [json.loads(line) for out in outs[:2] for line in out.splitlines()]
    assert all(line["digest"] == recorded for line in replays)
    assert deleted
    st = open_store(url, root=root)
    try:
        expected = [s.output for s in load_trace(st, recording.trace_id, payloads=True).steps]
        for line in replays:
            if line["id"] not in deleted:
                assert st.get_run(line["id"]).parent_run_id == recording.trace_id
                steps = load_trace(st, line["id"], payloads=True).steps
                assert [s.output for s in steps] == expected
    finally:
        st.close()


# --- an imported trace's foreign names and errors are written down, not the end of the import --
def _otlp_span(
    trace_id: str, span_id: str, parent: str | None, name: str, code: int = 2, **attrs: str
) -> Any:
    """One OTLP/JSON span (failed with a message holding NUL when ``code`` is 2)."""
    start = 1_700_000_000_000_000_000 + (100_000_000 if parent else 0)
    span: dict[str, Any] = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + 50_000_000),
        "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()],
        "status": {"code": code, "message": f"failed \x00 {name}" if code == 2 else ""},
    }
    if parent:
        span["parentSpanId"] = parent
    return span


def _part(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def test_an_imported_trace_with_nul_in_names_and_errors_is_stored_on_every_backend(
    store_target: StoreTarget,
) -> None:
    """OTLP text is the exporter's: a span name, a model name or a status message holding NUL
    was stored by SQLite, and on PostgreSQL the import raised DataError ('text fields cannot
    contain NUL') out of ``import_otlp``, so no trace of the request was imported, where the
    importer promises to reject a trace that cannot be stored, whole, with its reason. Imported
    names and errors are now written with NUL escaped (names cut at 200 characters, as before),
    on every backend."""
    from rewind.tracing.otel.importer import import_otlp

    first, second = "5b8aa5a2d2c872e8321cf37308d69df2", "6b8aa5a2d2c872e8321cf37308d69df3"
    model = "m\x00" + "x" * 300
    chat = {
        "gen_ai.request.model": model,
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps([_part("user", "hi")]),
        "gen_ai.output.messages": json.dumps([_part("assistant", "yo")]),
    }
    spans = [
        _otlp_span(first, "051581bf3cb55c13", None, "root\x00chain"),
        _otlp_span(first, "151581bf3cb55c14", "051581bf3cb55c13", "chat\x00step"),
        _otlp_span(second, "251581bf3cb55c15", None, "chat", 1, **chat),
    ]
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    st = store_target.open()
    try:
        result = import_otlp(st, [doc])
        assert sorted(result.imported) == [first, second], result.errors
        view = load_trace(st, first)
        assert view.name == "root\\u0000chain"
        assert [s.name for s in view.steps] == ["chat\\u0000step"]
        assert view.steps[0].error_message == "failed \\u0000 chat\\u0000step"
        (call,) = st.nodes_of(second)[0].calls
        assert call.name == model.replace("\x00", "\\u0000")[:200]
    finally:
        st.close()


# --- text no store can write (a lone surrogate) inside a step's values -------------------------
OTHER_UNDECODABLE = os.fsdecode(b"report-\xfe.csv")


@pytest.mark.parametrize(
    ("recorded", "replayed"),
    [
        ({UNDECODABLE: 1, "total": 2}, {OTHER_UNDECODABLE: 1, "total": 2}),
        ([UNDECODABLE, "total"], [OTHER_UNDECODABLE, "total"]),
    ],
    ids=["as a key", "as a value"],
)
def test_file_names_that_are_not_utf8_in_a_steps_output_are_stored_and_told_apart(
    tmp_path: Path, recorded: Any, replayed: Any
) -> None:
    """A step listing a folder returns file names decoded with ``surrogateescape``. As a dict
    key such a name reached the state write as it was, which refused it (UnstorableValue: 'string
    holds a lone surrogate'): the trace, with every call it made, was lost. As a value it became
    ``{"$unhashable": "str"}``, so a replay that listed other files was stored unchanged. Both
    are now written escaped (``report-\\udcff.csv``)."""
    source_hash, replay_hash, stored = _replayed_hashes(tmp_path / "names", recorded, replayed)
    assert replay_hash != source_hash
    texts = [*stored, *stored.values()] if isinstance(stored, dict) else [*stored[0].values()]
    assert any(isinstance(t, str) and t.endswith("report-\\udcfe.csv") for t in texts)
    same = _replayed_hashes(tmp_path / "same", recorded, copy.deepcopy(recorded))
    assert same[0] == same[1]


# --- a Burr pipeline or node name no backend keeps -----------------------------------------------
@pytest.mark.parametrize("kind", sorted(BAD_NAMES))
@pytest.mark.parametrize("where", ["pipeline", "node"])
def test_a_pipeline_or_node_name_no_backend_keeps_is_refused_before_the_run(
    store_target: StoreTarget, where: str, kind: str
) -> None:
    """On PostgreSQL a node name holding NUL or over 200 characters let the run execute every
    node (spending its calls), then failed the node rows' write: the run was stored failed,
    'writing recorded nodes failed: DataError', with none of its nodes; a pipeline name so
    made raised PostgreSQL's DataError (one with a lone surrogate, UnicodeEncodeError, on every
    backend) out of ``Rewind.record``. Such a name is now refused when the Pipeline is made
    (InvalidRequest, with the fix), so SQLite, which kept them, refuses them too."""
    from rewind.errors import InvalidRequest

    bad = BAD_NAMES[kind]
    st = store_target.open()
    try:
        with pytest.raises(InvalidRequest, match=f"a {where} needs a name of 1 to 200 characters"):
            Pipeline(
                name=bad if where == "pipeline" else "named",
                graph=GraphBuilder()
                .with_actions(**{bad if where == "node" else "first": _first})
                .build(),
                entrypoint=bad if where == "node" else "first",
            )
        assert st.list_runs() == []
    finally:
        st.close()


# --- two gc processes at once -------------------------------------------------------------------
def test_a_gc_whose_runs_another_gc_archived_meanwhile_leaves_their_archives_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``rewind gc`` at once (two cron jobs, two servers): the second planned its runs,
    then the first archived them. The second read each such run's rows (none left), wrote an
    archive of nothing over the first's archive at the same key, and failed (IndexError): the
    run was gone from the store and its archive no longer matched its recorded hash ('does not
    match its hash'): lost (seen with two real processes, 3 of 3 tries). A run whose rows are
    gone when its turn comes is now skipped, before anything is written."""
    from rewind.store import open_store, retention
    from rewind.store.retention import collect_garbage
    from tests.test_attack31 import restore_whole, trace_under_ids

    location = tmp_path / "store"
    outputs = trace_under_ids(location, [f"gc-{i}" for i in range(3)])
    plan = retention._runs_to_archive
    later = time.time() + 10**6

    def planned_then_archived_elsewhere(conn: Any, cutoff: float) -> Any:
        planned = plan(conn, cutoff)
        monkeypatch.setattr(retention, "_runs_to_archive", plan)
        other = open_store(location)  # the other gc, in full, after this one planned
        try:
            assert len(collect_garbage(other, 0.0, now=later).archived) == 3
        finally:
            other.close()
        return planned

    monkeypatch.setattr(retention, "_runs_to_archive", planned_then_archived_elsewhere)
    st = open_store(location)
    try:
        report = collect_garbage(st, 0.0, now=later)
        assert report.archived == [] and len(report.skipped) == 3
        restore_whole(st, outputs)
    finally:
        st.close()


def test_a_restore_another_process_finished_first_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``rewind archive restore`` of one run at once: the later one failed with the
    database's 'UNIQUE constraint failed: runs.run_id' (IntegrityError, a traceback at the
    CLI), or 'cannot be read ... No such file' once the first had deleted the archive: errors
    that read like damage where the run is whole in the store (seen with two real processes
    restoring 40 runs: 16 to 24 such errors each). It now says the run was restored by another
    process and where it is (UnknownRun); nothing is written twice."""
    from rewind.errors import UnknownRun
    from rewind.store import open_store, retention
    from rewind.store.retention import collect_garbage, restore_run
    from tests.test_attack31 import trace_under_ids

    location = tmp_path / "store"
    outputs = trace_under_ids(location, ["restored-twice"])
    st = open_store(location)
    try:
        assert len(collect_garbage(st, 0.0, now=time.time() + 10**6).archived) == 1
        restore_one = retention._restore_one

        def restored_elsewhere_first(*args: Any) -> Any:
            monkeypatch.setattr(retention, "_restore_one", restore_one)
            other = open_store(location)
            try:
                restore_run(other, "restored-twice")
            finally:
                other.close()
            return restore_one(*args)

        monkeypatch.setattr(retention, "_restore_one", restored_elsewhere_first)
        with pytest.raises(UnknownRun, match="was restored by another process meanwhile"):
            restore_run(st, "restored-twice")
        view = load_trace(st, "restored-twice", payloads=True)
        assert view.output == outputs["restored-twice"] and len(view.steps) == 4
    finally:
        st.close()
