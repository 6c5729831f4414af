"""A new user's trial (session 32): a ReAct-style traced agent whose tool raises once and is
retried by the agent with the same arguments."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import rewind
from rewind.store import open_store
from rewind.tracing import Tracer, step
from rewind.tracing.replay import replay_trace
from rewind.tracing.store import load_trace

FLAKY = {"left": 0, "executed": 0}


@rewind.tool("user32_weather")
def user32_weather(city: str) -> dict[str, Any]:
    """Fails the first time after :data:`FLAKY` is armed (a service that timed out once)."""
    FLAKY["executed"] += 1
    if FLAKY["left"] > 0:
        FLAKY["left"] -= 1
        raise ConnectionError("weather service timed out")
    return {"city": city, "sky": "clear"}


def flaky_agent(city: str, sep: str = " / ") -> list[str]:
    """Calls the tool, reports its error and calls it again with the same arguments."""
    seen: list[str] = []
    for turn in range(2):
        try:
            with step("weather", "tool_call", input={"city": city, "turn": turn}) as s:
                out = user32_weather(city)
                s.set_output(out)
            seen.append(out["sky"])
            break
        except ConnectionError as exc:
            seen.append(f"error: {exc}")
    with step("report", "transform", input={"seen": seen}) as s:
        s.set_output(sep.join(seen))
    return seen


def flaky_agent_edited(city: str) -> list[str]:
    """:func:`flaky_agent` with its report's format edited since the recording."""
    return flaky_agent(city, sep=" | ")


def _record(store_dir: Path) -> tuple[Tracer, str]:
    tracer = Tracer(store_dir)
    FLAKY["left"] = 1
    with tracer.trace("flaky", input={"city": "Lyon"}) as t:
        assert flaky_agent("Lyon") == ["error: weather service timed out", "clear"]
    return tracer, t.trace_id


def _outcomes(store: Any, run_id: str) -> list[tuple[str, str, str | None]]:
    view = load_trace(store, run_id)
    return [(s.name, s.status, s.output_hash) for s in view.steps]


def test_a_step_whose_tool_raised_is_not_served_a_later_success_on_replay(
    tmp_path: Path,
) -> None:
    """Was a bug: the failed call left no call row, so an unchanged replay served the step the
    deterministic tool's entry of the retry's success (key-only lineage, then the cache): the
    step that failed succeeded, the agent took another path, every later hash differed and a
    model would have been asked live. A call in a step that failed in the source (and recorded
    no call with that key there) is executed again: a failure that repeats replays equal."""
    _, source = _record(tmp_path / "s")
    store = open_store(tmp_path / "s")
    try:
        want = _outcomes(store, source)
        assert [s[1] for s in want] == ["failed", "success", "success"]
        FLAKY.update(left=1, executed=0)  # the service fails once again
        record = replay_trace(store, source, chain=f"{__name__}:flaky_agent")
        assert record.parent_run_id == source
        assert _outcomes(store, record.run_id) == want
        assert FLAKY["executed"] == 1  # only the failed step's call ran again
        # equal to its source, failed step included: stored wholly by reference (0 step rows);
        # before, its rows were written from the failed step on
        assert record.config["reference"] == {"all": True, "run": source, "steps": 3}
        failed = store.nodes_of(record.run_id)[0]
        assert (failed.src_app_id, failed.src_sequence_id) == (source, 0)
    finally:
        store.close()


def test_in_place_replay_reproduces_the_failed_step(tmp_path: Path) -> None:
    """The same rule for ``Tracer.replay`` (in place) and ``Tracer(read_cache=True)``."""
    tracer, source = _record(tmp_path / "s")
    FLAKY.update(left=1)
    cached = Tracer(tmp_path / "s", read_cache=True)
    with cached.trace("flaky", input={"city": "Lyon"}) as c:
        assert flaky_agent("Lyon") == ["error: weather service timed out", "clear"]
    FLAKY.update(left=1)
    with tracer.replay(source, input={"city": "Lyon"}) as t:
        assert flaky_agent("Lyon") == ["error: weather service timed out", "clear"]
    store = open_store(tmp_path / "s")
    try:
        want = _outcomes(store, source)
        for run_id in (t.trace_id, c.trace_id):
            assert store.get_run(run_id).parent_run_id == source
            assert _outcomes(store, run_id) == want
    finally:
        store.close()


def test_a_chain_called_in_its_own_in_place_replay_is_the_replay_not_a_step(
    tmp_path: Path,
) -> None:
    """Was a trap: ``with tracer.replay(tid): chain(...)`` made the chain a ``transform`` step
    of the replay, so every step moved one position down, none was shared with the source
    (stored in full, ``first divergence: node 1``) and lineage was served by key alone. Called
    as the body of an in-place replay of its own name, it now runs as that trace: same steps,
    output and input (taken from the call when ``replay`` was given none)."""
    tracer = Tracer(tmp_path / "s")
    agent = tracer.chain("flaky")(flaky_agent)
    FLAKY.update(left=0, executed=0)
    agent("Lyon")
    store = open_store(tmp_path / "s")
    try:
        (source,) = [r.run_id for r in store.list_runs()]
        for given in ({"city": "Lyon", "sep": " / "}, None):
            with tracer.replay(source, input=given) as t:
                assert agent("Lyon") == ["clear"]
            replay = store.get_run(t.trace_id)
            assert replay.parent_run_id == source and replay.config["reference"]["all"]
            assert _outcomes(store, t.trace_id) == _outcomes(store, source)
            assert load_trace(store, t.trace_id).output == load_trace(store, source).output
        with tracer.replay(source) as t:  # the source's recorded input by default
            assert agent("Lyon") == ["clear"]
        assert store.get_run(t.trace_id).config["reference"]["all"]
        assert FLAKY["executed"] == 1  # the recording's call only
        with tracer.replay(source) as t:  # the chain's arguments replace the default input
            agent("Paris")
        assert load_trace(store, t.trace_id).input == {"city": "Paris", "sep": " / "}
        with tracer.replay(source, input={"city": "Lyon"}) as t, step("first"):
            agent("Lyon")  # inside a step: a step, as before
        assert [s.name for s in load_trace(store, t.trace_id).steps][:2] == ["first", "flaky"]
    finally:
        store.close()


def test_replay_trace_says_re_run_tools_caused_the_divergence(tmp_path: Path) -> None:
    """Was misleading: an unchanged ``replay-trace --no-cached-tools`` whose tool now returns
    another result (its code changed) warned that something is "not routed through
    rewind.calls.chat ... or the model differs". The switch that re-ran the calls is named."""
    from rich.console import Console

    from rewind.cli import trace_views as tc
    from rewind.replay import Rewind
    from rewind.tracing.switches import ReplaySwitches

    tracer = Tracer(tmp_path / "s")
    agent = tracer.chain("flaky")(flaky_agent)
    FLAKY.update(left=1)
    agent("Lyon")
    rw = Rewind(tmp_path / "s")
    try:
        (source,) = [r.run_id for r in rw.store.list_runs()]
        FLAKY.update(left=0)  # the service is up now: the re-run tool succeeds at once
        con = Console(file=io.StringIO(), width=400)
        off = ReplaySwitches(cached_tools=False)
        assert tc.replay_trace_command(rw, source, console=con, switches=off) == 0
        text = con.file.getvalue()
        assert "--no-cached-tools ran the calls again" in text
        assert "not routed through" not in text
        # the chain's code edited since (its report's format): the warning names that cause
        FLAKY.update(left=1)
        con = Console(file=io.StringIO(), width=400)
        ref = f"{__name__}:flaky_agent_edited"
        assert tc.replay_trace_command(rw, source, console=con, chain=ref) == 0
        assert "the chain's code changed since the recording" in con.file.getvalue()
    finally:
        rw.store.close()


def test_an_output_override_fork_of_an_app_with_a_burr_tracker_runs(
    rw_llm: Any, tmp_path: Path
) -> None:
    """Was a bug: Burr's ``tool-calling`` example (``.with_tracker(project=...)``), forked with
    ``--set-output select_tool.tool_parameters=...``, failed to start: ``ValidationError: 1
    validation error for PointerModel``. The fork resumed its own app id, for which Burr 0.43
    hands trackers a fork pointer with ``app_id=None``, and its ``LocalTrackingClient`` refuses
    it. The fork now names the fork node's source row as its Burr fork source."""
    from rewind import OutputOverride
    from tests import burr_apps

    app = burr_apps.application(tracker_dir=str(tmp_path / "burr"))
    parent = rw_llm.record(app, inputs={"question": "why?"}, halt_after=["summarise"])
    assert parent.status == "completed", parent.error
    child = rw_llm.fork(
        parent.run_id, at="answer", override=OutputOverride("answer", "answer", "X")
    )
    assert child.status == "completed", child.error
    nodes = rw_llm.store.nodes_of(child.run_id)
    assert [n.name for n in nodes] == ["ask", "answer", "summarise"]
    assert rw_llm.node_state(nodes[2])["summary"] == "X"
    # the tracker logged the fork too, with its source
    assert list((tmp_path / "burr" / "rewind-test").glob(f"{child.run_id}*"))


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def _openllmetry_tool_calling_trace(path: Path) -> Path:
    """An OTLP/JSON file as OpenLLMetry 0.40 writes an agent's two chat calls (the first
    answered with a tool call, no text) and a GenAI ``execute_tool`` span between them."""
    tid, root = "5b8aa5a2d2c872e8321cf37308d69df2", "a1b2c3d4e5f60718"
    sys_user = [
        ("gen_ai.prompt.0.role", "system"),
        ("gen_ai.prompt.0.content", "Use tools."),
        ("gen_ai.prompt.1.role", "user"),
        ("gen_ai.prompt.1.content", "Is it freezing in Oslo?"),
    ]
    common = [
        ("gen_ai.system", "openai"),
        ("gen_ai.request.model", "gpt-4o-mini"),
        ("gen_ai.request.temperature", 0.0),
    ]
    call = [
        ("gen_ai.completion.0.role", "assistant"),
        ("gen_ai.completion.0.finish_reason", "tool_calls"),
        ("gen_ai.completion.0.tool_calls.0.id", "call_abc"),
        ("gen_ai.completion.0.tool_calls.0.name", "weather"),
        ("gen_ai.completion.0.tool_calls.0.arguments", '{"city": "Oslo"}'),
    ]
    then = [
        ("gen_ai.prompt.2.role", "assistant"),
        ("gen_ai.prompt.2.tool_calls.0.id", "call_abc"),
        ("gen_ai.prompt.2.tool_calls.0.name", "weather"),
        ("gen_ai.prompt.2.tool_calls.0.arguments", '{"city": "Oslo"}'),
        ("gen_ai.prompt.3.role", "tool"),
        ("gen_ai.prompt.3.content", '{"temp_c": -3}'),
        ("gen_ai.prompt.3.tool_call_id", "call_abc"),
        ("gen_ai.completion.0.role", "assistant"),
        ("gen_ai.completion.0.finish_reason", "stop"),
        ("gen_ai.completion.0.content", "Yes: -3 C in Oslo."),
    ]
    tool = [
        ("gen_ai.operation.name", "execute_tool"),
        ("gen_ai.tool.name", "weather"),
        ("gen_ai.tool.call.arguments", '{"city": "Oslo"}'),
        ("gen_ai.tool.call.result", '{"temp_c": -3}'),
    ]

    def span(sid: str, name: str, start: int, attrs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = {
            "traceId": tid,
            "spanId": sid,
            "name": name,
            "startTimeUnixNano": str(1764700000_000000000 + start * 1000),
            "endTimeUnixNano": str(1764700000_000000000 + start * 1000 + 500),
            "attributes": [_attr(k, v) for k, v in attrs],
        }
        if sid != root:
            out["parentSpanId"] = root
        return out

    spans = [
        span(root, "agent.workflow", 0, [("traceloop.span.kind", "workflow")]),
        span("1111111111111111", "openai.chat", 1, common + sys_user + call),
        span("2222222222222222", "execute_tool weather", 2, tool),
        span("3333333333333333", "openai.chat", 3, common + sys_user + then),
    ]
    doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": spans}]}]}
    path.write_text(json.dumps(doc))
    return path


def test_an_imported_tool_call_answer_replays_equal(tmp_path: Path) -> None:
    """Was a bug: in a recorded-calls replay, a model call answered with a tool call (no text)
    set its step's output to the answer's empty content, where the import had kept the
    completion message: an unchanged replay of an imported OpenLLMetry agent trace diverged at
    its first step (list → ""), and a change to the second call showed the first changed too.
    A model call sent unchanged keeps the recorded output."""
    from rewind.llm import ChatClient, Endpoint, RetryPolicy
    from rewind.tracing.otel import import_otlp, read_otlp_file
    from tests.model_stub import ModelStub

    store = open_store(tmp_path / "s")
    try:
        doc = read_otlp_file(_openllmetry_tool_calling_trace(tmp_path / "t.json"))
        (tid,) = import_otlp(store, doc).imported
        want = _outcomes(store, tid)
        same = replay_trace(store, tid)
        assert same.config["replay_mode"] == "recorded-calls"
        assert _outcomes(store, same.run_id) == want
        with (
            ModelStub() as stub,
            ChatClient(
                Endpoint(base_url=stub.base_url, model="gpt-4o-mini"), retry=RetryPolicy(attempts=1)
            ) as client,
        ):
            changed = replay_trace(
                store, tid, change="openai.chat#2.temperature=0.7", chat_client=client
            )
            assert len(stub.requests) == 1
        got = _outcomes(store, changed.run_id)
        assert got[:2] == want[:2] and got[2] != want[2]
    finally:
        store.close()


def test_changing_a_not_replayable_imported_step_says_why(tmp_path: Path) -> None:
    """Was misleading: ``--set 'openai.chat#2.temperature=0.7'`` (the README's example) on an
    imported chat span recorded with its tool definitions (``llm.request.functions.*``, not
    replayed) answered "has no param 'temperature' — its params: none (read params with
    rewind.param)". It now says the step's model call is not replayable, and why."""
    import pytest

    from rewind.errors import InvalidOverride
    from rewind.tracing.otel import import_otlp, read_otlp_file

    path = _openllmetry_tool_calling_trace(tmp_path / "t.json")
    doc = json.loads(path.read_text())
    for span in doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1:]:
        span["attributes"].append(_attr("llm.request.functions.0.name", "weather"))
    path.write_text(json.dumps(doc))
    store = open_store(tmp_path / "s")
    try:
        (tid,) = import_otlp(store, read_otlp_file(path)).imported
        with pytest.raises(InvalidOverride) as err:
            replay_trace(store, tid, change="openai.chat#2.temperature=0.7")
        assert "cannot be changed" in str(err.value)
        assert "llm.request.functions" in str(err.value)
        assert "rewind.param" not in str(err.value) + str(err.value.hint)
    finally:
        store.close()


def test_inspect_notes_an_imported_step_that_is_not_replayable(tmp_path: Path) -> None:
    """Was silent: ``rewind inspect`` said ``ok`` for imported chat steps a replay cannot send
    again (and ``replay-trace`` showed them ``none:no-calls``); it now notes each, with the
    reason the import recorded."""
    from rewind.tracing.inspect import inspect_trace
    from rewind.tracing.otel import import_otlp, read_otlp_file

    path = _openllmetry_tool_calling_trace(tmp_path / "t.json")
    doc = json.loads(path.read_text())
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]["attributes"].append(
        _attr("llm.request.functions.0.name", "weather")
    )
    path.write_text(json.dumps(doc))
    store = open_store(tmp_path / "s")
    try:
        (tid,) = import_otlp(store, read_otlp_file(path)).imported
        result = inspect_trace(load_trace(store, tid))
        codes = [[f.code for f in s.findings] for s in result.steps]
        assert codes == [["not_replayable"], [], []]
        assert "llm.request.functions" in result.steps[0].findings[0].message
    finally:
        store.close()


def test_an_imported_execute_tool_span_shows_its_arguments_and_result(tmp_path: Path) -> None:
    """Was a gap: a GenAI ``execute_tool`` span's arguments and result seeded the tool cache,
    but its step showed no input and ``None`` as output (``show``, ``diff`` and ``inspect`` read
    the step). They are now the step's input and output."""
    from rewind.tracing.otel import import_otlp, read_otlp_file

    store = open_store(tmp_path / "s")
    try:
        doc = read_otlp_file(_openllmetry_tool_calling_trace(tmp_path / "t.json"))
        (tid,) = import_otlp(store, doc).imported
        tool = load_trace(store, tid).steps[1]
        assert (tool.name, tool.input, tool.output) == ("weather", {"city": "Oslo"}, {"temp_c": -3})
        assert _outcomes(store, replay_trace(store, tid).run_id) == _outcomes(store, tid)
    finally:
        store.close()


def test_a_cached_trace_replays_the_trace_of_its_own_input(tmp_path: Path) -> None:
    """Was a bug: ``Tracer(read_cache=True)`` took as its source the newest trace of the name
    that made its first call, here a replay with another input (``input.turns=1``, which sends
    the same first request but stops earlier). Past that replay's steps the cached trace had no
    lineage: the ReAct agent sent 3 requests (246 tokens), and a step that failed in the
    recording was served the deterministic tool's cached success. A candidate whose input is
    the trace's own is now preferred."""
    tracer = Tracer(tmp_path / "s")

    def agent(city: str, turns: int = 2) -> list[str]:
        return flaky_agent(city) if turns > 1 else [user32_weather(city)["sky"]]

    chain = tracer.chain("flaky")(agent)
    FLAKY.update(left=1)
    chain("Lyon")
    store = open_store(tmp_path / "s")
    try:
        (source,) = [r.run_id for r in store.list_runs()]
        with tracer.replay(source, input={"city": "Lyon", "turns": 1}):
            agent("Lyon", turns=1)  # another input, the same first call
        FLAKY.update(left=1, executed=0)
        cached = Tracer(tmp_path / "s", read_cache=True)
        with cached.trace("flaky", input={"city": "Lyon", "turns": 2}) as c:
            assert agent("Lyon") == ["error: weather service timed out", "clear"]
        run = store.get_run(c.trace_id)
        assert run.parent_run_id == source
        assert _outcomes(store, c.trace_id) == _outcomes(store, source)
    finally:
        store.close()
