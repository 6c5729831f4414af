"""Import seeds the caches; an imported trace replays offline (issue 16, items 1-3).

The third-party traces are real exports of three instrumentation families (``tests/data/otel``,
see its README). Requests are counted at a real loopback model server (``ModelStub``), never only
in Rewind's bookkeeping.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from rewind.calls import chat
from rewind.canonical import canonical_bytes, key_of
from rewind.errors import InvalidOverride
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.store import Store, open_store
from rewind.tracing import Tracer, step
from rewind.tracing.otel import export_to_file, import_otlp, read_otlp_file
from rewind.tracing.replay import ReplaySwitches, replay_trace
from rewind.tracing.store import load_trace
from tests.model_stub import STUB_MODEL, ModelStub

DATA = Path(__file__).parent / "data" / "otel"
REPLAYABLE = [
    "openinference_openai.json",  # OpenInference
    "openllmetry_openai_0_40.json",  # OpenLLMetry gen_ai.prompt.N.*
    "genai_openllmetry_0_62.json",  # OTel GenAI current (gen_ai.input.messages)
]
NO_CONTENT = "genai_openai_v2_no_content.json"  # OTel GenAI previous, content in log events


@pytest.fixture
def stub() -> Iterator[ModelStub]:
    with ModelStub() as s:
        yield s


@pytest.fixture
def client(stub: ModelStub) -> Iterator[ChatClient]:
    with ChatClient(
        Endpoint(base_url=stub.base_url, model=STUB_MODEL), retry=RetryPolicy(attempts=1)
    ) as c:
        yield c


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(tmp_path / "store")
    yield s
    s.close()


def imported(store: Store, name: str) -> str:
    result = import_otlp(store, read_otlp_file(DATA / name))
    assert result.errors == [] and len(result.imported) == 1
    return result.imported[0]


# -- item 1: import seeds the caches -----------------------------------------------------------


@pytest.mark.parametrize("name", REPLAYABLE)
def test_import_seeds_one_llm_entry_per_model_call(store: Store, name: str) -> None:
    view = load_trace(store, imported(store, name), payloads=True)
    llm_steps = [s for s in view.steps if s.step_type == "llm_call"]
    assert len(llm_steps) == 2
    for s in llm_steps:
        assert "not_replayable" not in s.attributes
        (call,) = s.calls
        assert (call.kind, call.name, call.reason) == ("llm", STUB_MODEL, "imported")
        entry = store.llm_cache_get(call.key)
        assert entry is not None and entry.result_hash == call.result_hash
        (llm,) = s.llm_calls
        assert llm.params["temperature"] == 0 and llm.params["max_tokens"] == 64
    first, second = (s.llm_calls[0] for s in llm_steps)
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert first.content == "answer #1 to Which month is the wettest in Seattle?"
    assert second.messages[0]["content"] == f"Polish: {first.content}"
    assert view.input == {"question": "Which month is the wettest in Seattle?"}


def test_three_conventions_give_the_same_keys(tmp_path: Path) -> None:
    """The same chain recorded by three instrumentations seeds the same cache keys: the key is
    the request's meaning, not the convention that recorded it."""
    keys = []
    for i, name in enumerate(REPLAYABLE):
        with closing(open_store(tmp_path / str(i))) as st:
            view = load_trace(st, imported(st, name))
            keys.append([c.key for s in view.steps for c in s.calls])
    assert keys[0] == keys[1] == keys[2] and len(set(keys[0])) == 2


def test_a_span_without_content_is_not_replayable_and_says_why(store: Store) -> None:
    view = load_trace(store, imported(store, NO_CONTENT))
    llm_steps = [s for s in view.steps if s.step_type == "llm_call"]
    assert len(llm_steps) == 2
    for s in llm_steps:
        assert s.attributes["replayable"] is False
        assert "input messages are not recorded" in s.attributes["not_replayable"]
        assert "answer is not recorded" in s.attributes["not_replayable"]
        assert s.calls == ()


def test_openinference_without_parameters_is_not_replayable(store: Store) -> None:
    doc = json.loads((DATA / "openinference_openai.json").read_text())
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                sp["attributes"] = [
                    a for a in sp["attributes"] if a["key"] != "llm.invocation_parameters"
                ]
    result = import_otlp(store, [doc])
    view = load_trace(store, result.imported[0])
    for s in (s for s in view.steps if s.step_type == "llm_call"):
        assert "llm.invocation_parameters is not recorded" in s.attributes["not_replayable"]
        assert s.calls == ()


def _tool_span_doc(args: dict[str, Any], result: Any) -> dict[str, Any]:
    def attr(k: str, v: str) -> dict[str, Any]:
        return {"key": k, "value": {"stringValue": v}}

    return {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "ab" * 16,
                                "spanId": "cd" * 8,
                                "name": "execute_tool lookup",
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": "1700000000100000000",
                                "attributes": [
                                    attr("gen_ai.operation.name", "execute_tool"),
                                    attr("gen_ai.tool.name", "lookup"),
                                    attr("gen_ai.tool.call.arguments", json.dumps(args)),
                                    attr("gen_ai.tool.call.result", json.dumps(result)),
                                ],
                            }
                        ]
                    }
                ]
            }
        ]
    }


def test_a_tool_span_seeds_the_tool_cache_under_the_tool_key(store: Store) -> None:
    args, result = {"city": "Seattle"}, {"rain_mm": 120}
    import_otlp(store, [_tool_span_doc(args, result)])
    view = load_trace(store, "ab" * 16)
    (call,) = view.steps[0].calls
    assert call.key == key_of("tool/v1", "lookup", canonical_bytes(args))
    entry = store.tool_cache_get(call.key)
    assert entry is not None and store.get_blob(entry.result_hash) == canonical_bytes(result)
    replay = replay_trace(store, "ab" * 16)  # no endpoint: the tool result is served
    again = load_trace(store, replay.run_id)
    assert again.steps[0].output_hash == view.steps[0].output_hash
    assert again.steps[0].calls[0].outcome == "hit"


def _openinference_tool_doc(calls: list[dict[str, str]]) -> dict[str, Any]:
    """One trace of OpenInference TOOL spans, each with the given attributes."""
    spans = [
        {
            "traceId": "ef" * 16,
            "spanId": f"{i + 1:016x}",
            "name": "lookup",
            "startTimeUnixNano": str(1_700_000_000_000_000_000 + i * 1000),
            "endTimeUnixNano": str(1_700_000_000_000_000_500 + i * 1000),
            "attributes": [
                {"key": k, "value": {"stringValue": v}}
                for k, v in {"openinference.span.kind": "TOOL", "tool.name": "lookup"}.__or__(
                    attrs
                ).items()
            ],
        }
        for i, attrs in enumerate(calls)
    ]
    return {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}


def test_openinference_tool_spans_key_on_the_call_arguments_not_the_definition(
    store: Store,
) -> None:
    """OpenInference's ``tool.parameters`` is the tool's parameter definition (the spec), the same
    for every call: keying on it would serve one city's result for another's. The arguments come
    from ``input.value`` or ``tool_call.function.arguments`` (as ag2's instrumentation writes)."""
    schema = json.dumps({"city": "str"})
    calls = [
        {
            "tool.parameters": schema,
            "input.value": json.dumps({"city": city}),
            "output.value": json.dumps({"rain_mm": mm}),
        }
        for city, mm in (("Seattle", 120), ("Phoenix", 3))
    ]
    calls.append(
        {
            "tool.parameters": schema,
            "tool_call.function.arguments": json.dumps({"city": "Oslo"}),
            "input.value": json.dumps({"name": "lookup", "arguments": '{"city": "Oslo"}'}),
            "output.value": json.dumps({"rain_mm": 80}),
        }
    )
    import_otlp(store, [_openinference_tool_doc(calls)])
    view = load_trace(store, "ef" * 16)
    keys = [s.calls[0].key for s in view.steps]
    assert keys == [
        key_of("tool/v1", "lookup", canonical_bytes({"city": c}))
        for c in ("Seattle", "Phoenix", "Oslo")
    ]
    results = [store.get_blob(store.tool_cache_get(k).result_hash) for k in keys]  # type: ignore[union-attr]
    assert results == [canonical_bytes({"rain_mm": mm}) for mm in (120, 3, 80)]


# -- item 2: replay an imported trace ------------------------------------------------------------


@pytest.mark.parametrize("name", REPLAYABLE)
def test_imported_trace_replays_for_zero_requests(
    store: Store, stub: ModelStub, client: ChatClient, name: str
) -> None:
    tid = imported(store, name)
    before = load_trace(store, tid)
    record = replay_trace(store, tid, chat_client=client)
    after = load_trace(store, record.run_id)
    assert stub.requests == []
    assert record.status == "completed" and record.config["replay_mode"] == "recorded-calls"
    assert after.tokens == 0
    assert [s.output_hash for s in after.steps] == [s.output_hash for s in before.steps]
    assert [s.input_hash for s in after.steps] == [s.input_hash for s in before.steps]
    assert after.output == before.output


@pytest.mark.parametrize("name", REPLAYABLE)
def test_a_param_change_re_sends_only_the_affected_call(
    store: Store, stub: ModelStub, client: ChatClient, name: str
) -> None:
    tid = imported(store, name)
    before = load_trace(store, tid)
    second = [s for s in before.steps if s.step_type == "llm_call"][1]
    spec = f"{before.occurrence(second)}.temperature=0.5"
    record = replay_trace(store, tid, change=spec, chat_client=client)
    after = load_trace(store, record.run_id)
    assert len(stub.requests) == 1 and stub.requests[0]["temperature"] == 0.5
    assert stub.requests[0]["messages"] == [
        {"role": "user", "content": "Polish: answer #1 to Which month is the wettest in Seattle?"}
    ]
    llm = [s for s in after.steps if s.step_type == "llm_call"]
    assert [s.cache_outcome for s in llm] == ["hit", "miss"]
    assert llm[1].params == {"temperature": 0.5}


@pytest.mark.parametrize("name", REPLAYABLE)
def test_an_input_change_flows_into_every_call_that_shows_it(
    store: Store, stub: ModelStub, client: ChatClient, name: str
) -> None:
    tid = imported(store, name)
    record = replay_trace(
        store, tid, change="input.question=Which month is the driest?", chat_client=client
    )
    assert len(stub.requests) == 2
    first, second = stub.requests
    assert first["messages"][1]["content"] == "Which month is the driest?"
    # the second call is sent the new answer of the first (text carried from step to step)
    assert second["messages"][0]["content"] == "Polish: answer #1 to Which month is the driest?"
    expected = "answer #2 to " + second["messages"][0]["content"]
    assert load_trace(store, record.run_id).output == expected


def test_input_change_that_is_not_text_is_refused(store: Store, client: ChatClient) -> None:
    tid = imported(store, REPLAYABLE[0])
    with pytest.raises(InvalidOverride, match="not text"):
        replay_trace(store, tid, change="input.question=5", chat_client=client)
    assert len(store.list_runs()) == 1


def test_not_replayable_steps_fail_when_the_change_may_reach_them(
    store: Store, stub: ModelStub, client: ChatClient
) -> None:
    tid = imported(store, NO_CONTENT)
    unchanged = replay_trace(store, tid, chat_client=client)
    assert unchanged.status == "completed" and stub.requests == []
    changed = replay_trace(store, tid, change="input.question=Other?", chat_client=client)
    steps = load_trace(store, changed.run_id).steps
    failed = [s for s in steps if s.step_type == "llm_call"]
    assert all(s.status == "failed" for s in failed)
    assert "was not recorded whole" in (failed[0].error_message or "")
    assert stub.requests == []


# -- item 3: Rewind's own export carries the calls ---------------------------------------------

EXPORTED = Tracer()


@EXPORTED.chain("exported_chain")
def exported_chain(question: str) -> str:
    with step("draft", "llm_call", input={"question": question}) as s:
        draft = chat([{"role": "user", "content": question}], temperature=0).content
        s.set_output(draft)
    with step("polish", "llm_call", input={"draft": draft}) as s:
        final = chat([{"role": "user", "content": f"Polish: {draft}"}], temperature=0).content
        s.set_output(final)
    return final


def test_export_import_into_an_empty_store_replays_for_zero_tokens(
    tmp_path: Path, stub: ModelStub, client: ChatClient
) -> None:
    with closing(open_store(tmp_path / "a")) as source:
        EXPORTED.configure(store=source, chat_client=client)
        exported_chain("Is it raining?")
        (run,) = source.list_runs()
        export_to_file(source, [run.run_id], tmp_path / "trace.json")
    sent = len(stub.requests)
    assert sent == 2
    doc = json.loads((tmp_path / "trace.json").read_text())
    attrs = {
        a["key"]: a["value"]
        for rs in doc["resourceSpans"]
        for ss in rs["scopeSpans"]
        for sp in ss["spans"]
        for a in sp["attributes"]
        if sp["name"] == "draft"
    }
    (call,) = json.loads(attrs["rewind.calls"]["stringValue"])
    assert call["determinism"] == "deterministic" and '"Is it raining?"' in call["request"]
    with closing(open_store(tmp_path / "b")) as target:
        result = import_otlp(target, read_otlp_file(tmp_path / "trace.json"))
        assert result.imported == [run.run_id]
        ref = target.get_run(run.run_id).config["chain_ref"]
        before = load_trace(target, run.run_id)
        # The imported chain_ref is not run on the file's say-so: recorded calls replay...
        recorded = replay_trace(target, run.run_id, chat_client=client)
        # ...and the code runs when the person replaying names it.
        coded = replay_trace(target, run.run_id, chat_client=client, chain=ref)
        for record, mode in ((recorded, "recorded-calls"), (coded, "chain")):
            assert record.config["replay_mode"] == mode
            after = load_trace(target, record.run_id)
            assert after.tokens == 0 and len(stub.requests) == sent
            assert [s.output_hash for s in after.steps] == [s.output_hash for s in before.steps]


# -- the command ---------------------------------------------------------------------------------


def test_replay_trace_command_on_an_imported_file(
    tmp_path: Path, stub: ModelStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rewind.cli import app

    monkeypatch.setattr(
        "rewind.session.LazyChatClient",
        lambda: ChatClient(
            Endpoint(base_url=stub.base_url, model=STUB_MODEL),
            transport=httpx.HTTPTransport(),
            retry=RetryPolicy(attempts=1),
        ),
    )
    folder = str(tmp_path / "cli")
    runner = CliRunner()
    out = runner.invoke(app, ["--store", folder, "otel", "import", str(DATA / REPLAYABLE[1])])
    assert out.exit_code == 0, out.output
    with closing(open_store(folder)) as st:
        (run,) = st.list_runs()
    out = runner.invoke(app, ["--store", folder, "replay-trace", run.run_id[:10]])
    assert out.exit_code == 0, out.output
    assert "mode: recorded calls" in out.output and stub.requests == []
    out = runner.invoke(
        app, ["--store", folder, "replay-trace", run.run_id, "--set", "openai.chat#2.seed=7"]
    )
    assert out.exit_code == 0, out.output
    assert len(stub.requests) == 1 and stub.requests[0]["seed"] == 7
    out = runner.invoke(
        app, ["--store", folder, "replay-trace", run.run_id, "--set", "openai.chat.nope=1"]
    )
    assert out.exit_code == 2 and "no param 'nope'" in out.output


# -- replay switches (seed 003) ------------------------------------------------------------------


def test_switch_cached_llm_off_re_sends_every_model_call(
    store: Store, stub: ModelStub, client: ChatClient
) -> None:
    tid = imported(store, REPLAYABLE[1])
    record = replay_trace(store, tid, chat_client=client, switches=ReplaySwitches(cached_llm=False))
    assert len(stub.requests) == 2
    steps = load_trace(store, record.run_id).steps
    assert [(s.calls[0].outcome, s.calls[0].reason) for s in steps if s.calls] == [
        ("miss", "bypass"),
        ("miss", "bypass"),
    ]
    assert record.config["switches"]["cached_llm"] is False


def test_switch_cached_tools_off_refuses_a_tool_without_code(store: Store) -> None:
    import_otlp(store, [_tool_span_doc({"city": "Seattle"}, {"rain_mm": 120})])
    record = replay_trace(store, "ab" * 16, switches=ReplaySwitches(cached_tools=False))
    (s,) = load_trace(store, record.run_id).steps
    assert s.status == "failed" and "cannot run again" in (s.error_message or "")
    served = replay_trace(store, "ab" * 16, switches=ReplaySwitches(cached_llm=False))
    assert load_trace(store, served.run_id).steps[0].status == "success"


def test_switch_stop_at_divergence_recorded_calls(
    store: Store, stub: ModelStub, client: ChatClient
) -> None:
    tid = imported(store, REPLAYABLE[0])
    record = replay_trace(
        store,
        tid,
        change="input.question=Other?",
        chat_client=client,
        switches=ReplaySwitches(stop_at_divergence=True),
    )
    view = load_trace(store, record.run_id)
    assert len(stub.requests) == 1  # the second call was never sent
    assert view.status == "failed" and view.error_type == "StoppedAtDivergence"
    assert "step 'ChatCompletion' (#1) changed its output" in (view.error_message or "")
    assert len(view.steps) == 1
    unchanged = replay_trace(
        store, tid, chat_client=client, switches=ReplaySwitches(stop_at_divergence=True)
    )
    assert unchanged.status == "completed" and len(stub.requests) == 1


def test_switch_stop_at_divergence_chain_and_command(
    tmp_path: Path, stub: ModelStub, client: ChatClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rewind.cli import app

    folder = tmp_path / "s"
    with closing(open_store(folder)) as st:
        EXPORTED.configure(store=st, chat_client=client)
        exported_chain("Is it raining?")
        (run,) = st.list_runs()
    monkeypatch.setattr(
        "rewind.session.LazyChatClient",
        lambda: ChatClient(
            Endpoint(base_url=stub.base_url, model=STUB_MODEL), retry=RetryPolicy(attempts=1)
        ),
    )
    out = CliRunner().invoke(
        app,
        [
            "--store",
            str(folder),
            "replay-trace",
            run.run_id,
            "--set",
            "input.question=Snow?",
            "--stop-at-divergence",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["stopped"] is True and doc["mode"] == "chain"  # recorded here: its chain runs
    assert [s["name"] for s in doc["trace"]["steps"]] == ["draft"]
    assert len(stub.requests) == 3  # two recorded, one re-sent before the stop


def test_cache_switches_of_the_command(
    tmp_path: Path, stub: ModelStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--no-cached-llm`` re-sends every model call; ``--no-cached-tools`` runs every tool
    again (here: refused, its code is not here); both are kept on the replay."""
    from rewind.cli import app

    monkeypatch.setattr(
        "rewind.session.LazyChatClient",
        lambda: ChatClient(
            Endpoint(base_url=stub.base_url, model=STUB_MODEL), retry=RetryPolicy(attempts=1)
        ),
    )
    folder = tmp_path / "s"
    with closing(open_store(folder)) as st:
        tid = imported(st, REPLAYABLE[1])
        import_otlp(st, [_tool_span_doc({"city": "Seattle"}, {"rain_mm": 120})])

    def replay(*args: str, code: int = 0) -> dict[str, Any]:
        out = CliRunner().invoke(app, ["--store", str(folder), "replay-trace", *args, "--json"])
        assert out.exit_code == code, out.output
        return dict(json.loads(out.output))

    doc = replay(tid, "--no-cached-llm")
    assert len(stub.requests) == 2
    assert doc["switches"] == {
        "cached_llm": False,
        "cached_tools": True,
        "stop_at_divergence": False,
    }
    assert [s["cache_reason"] for s in doc["trace"]["steps"]] == ["bypass", "bypass"]
    doc = replay("ab" * 16, "--no-cached-tools", code=1)  # a step failed: the replay failed
    (s,) = doc["trace"]["steps"]
    assert s["status"] == "failed" and "cannot run again" in s["error"]
    assert doc["trace"]["status"] != "success", doc["trace"]
    assert doc["switches"]["cached_tools"] is False and len(stub.requests) == 2
    doc = replay("ab" * 16)  # the defaults serve it
    assert doc["trace"]["steps"][0]["status"] == "success"


def test_the_http_receiver_seeds_the_caches_too(
    store: Store, stub: ModelStub, client: ChatClient
) -> None:
    from fastapi.testclient import TestClient

    from rewind.api import create_app

    body = (DATA / REPLAYABLE[2]).read_bytes()
    app = create_app(store, chat_client=None, pipelines={}, token=None)
    with TestClient(app, base_url="http://127.0.0.1") as http:
        r = http.post(
            "/api/otlp/v1/traces", content=body, headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 200, r.text
    (run,) = store.list_runs()
    record = replay_trace(store, run.run_id, chat_client=client)
    assert record.status == "completed" and stub.requests == []
    assert load_trace(store, record.run_id).tokens == 0


def fixture_chain(question: str) -> str:
    """The chain the third-party fixtures recorded, written against rewind.chat (``--chain``)."""
    with step("draft", "llm_call") as s:
        messages = [
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": question},
        ]
        draft = chat(messages, temperature=0, max_tokens=64).content
        s.set_output(draft)
    with step("polish", "llm_call") as s:
        polish = [{"role": "user", "content": f"Polish: {draft}"}]
        final = chat(polish, temperature=0, max_tokens=64).content
        s.set_output(final)
    return final


@pytest.mark.parametrize("name", REPLAYABLE)
def test_chain_code_replays_an_imported_trace_from_the_seeded_cache(
    store: Store, stub: ModelStub, client: ChatClient, name: str
) -> None:
    tid = imported(store, name)
    ref = f"{__name__}:fixture_chain"
    record = replay_trace(store, tid, chat_client=client, chain=ref)
    assert record.config["replay_mode"] == "chain" and record.status == "completed"
    assert stub.requests == [] and load_trace(store, record.run_id).tokens == 0
    changed = replay_trace(
        store, tid, chat_client=client, chain=ref, change="input.question=Which is driest?"
    )
    assert changed.status == "completed" and len(stub.requests) == 2


def test_replay_api_with_switches_and_no_code_from_the_trace(
    store: Store, stub: ModelStub, client: ChatClient
) -> None:
    from fastapi.testclient import TestClient

    from rewind.api import create_app

    doc = json.loads((DATA / REPLAYABLE[0]).read_text())
    root = next(
        sp
        for rs in doc["resourceSpans"]
        for ss in rs["scopeSpans"]
        for sp in ss["spans"]
        if sp["name"] == "qa"
    )
    root["attributes"].append({"key": "rewind.chain_ref", "value": {"stringValue": "os:system"}})
    result = import_otlp(store, [doc])
    tid = result.imported[0]
    app = create_app(store, chat_client=client, pipelines={}, token=None)
    with TestClient(app, base_url="http://127.0.0.1") as http:
        r = http.post(f"/api/traces/{tid}/replay", json={})
        assert r.status_code == 200, r.text
        assert r.json()["mode"] == "recorded-calls" and stub.requests == []
        r = http.post(
            f"/api/traces/{tid}/replay",
            json={"change": "input.question=Why?", "stop_at_divergence": True},
        )
        body = r.json()
        assert body["stopped"] is True and len(stub.requests) == 1
        r = http.post(f"/api/traces/{tid}/replay", json={"cached_llm": False})
        assert r.json()["trace"]["status"] == "success" and len(stub.requests) == 3
        assert (
            http.post(f"/api/traces/{tid}/replay", json={"chain": "os:system"}).status_code == 422
        )
        r = http.post(f"/api/traces/{tid}/replay", json={"change": "input.nope=1"})
        assert r.status_code == 422 and "no field 'nope'" in r.text


def test_an_import_never_replaces_an_existing_cache_entry(store: Store, client: ChatClient) -> None:
    first = load_trace(store, imported(store, REPLAYABLE[0]))
    key = first.steps[0].calls[0].key
    before = store.llm_cache_get(key)
    doc = json.loads((DATA / REPLAYABLE[1]).read_text().replace("answer #1", "answer #9"))
    second = load_trace(store, import_otlp(store, [doc]).imported[0])
    assert second.steps[0].calls[0].key == key  # the same request, another recorded answer
    assert store.llm_cache_get(key) == before
    record = replay_trace(store, second.trace_id, chat_client=client)  # served from its lineage
    assert load_trace(store, record.run_id).steps[0].output_hash == second.steps[0].output_hash


def test_genai_message_span_events_seed_the_same_key(store: Store) -> None:
    """The earlier GenAI convention: messages as span events (``gen_ai.user.message``...,
    ``gen_ai.choice``) with the ``gen_ai.request.*`` attributes — hand-written from the
    semantic conventions, since the instrumentations in tests/data send them as log records."""

    def s(k: str, v: str) -> dict[str, Any]:
        return {"key": k, "value": {"stringValue": v}}

    def n(k: str, v: int) -> dict[str, Any]:
        return {"key": k, "value": {"intValue": str(v)}}

    event = {"timeUnixNano": "1700000000000000000"}
    span = {
        "traceId": "ef" * 16,
        "spanId": "12" * 8,
        "name": "chat stub-model",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000200000000",
        "attributes": [
            s("gen_ai.operation.name", "chat"),
            s("gen_ai.system", "openai"),
            s("gen_ai.request.model", STUB_MODEL),
            n("gen_ai.request.temperature", 0),
            n("gen_ai.request.max_tokens", 64),
        ],
        "events": [
            event
            | {
                "name": "gen_ai.system.message",
                "attributes": [s("content", "Answer in one sentence.")],
            },
            event
            | {
                "name": "gen_ai.user.message",
                "attributes": [s("content", "Which month is the wettest in Seattle?")],
            },
            event
            | {
                "name": "gen_ai.choice",
                "attributes": [
                    s(
                        "gen_ai.event.content",
                        json.dumps(
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"content": "answer #1 to Which month?"},
                            }
                        ),
                    )
                ],
            },
        ],
    }
    import_otlp(store, [{"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}])
    view = load_trace(store, "ef" * 16, payloads=True)
    (call,) = view.steps[0].calls
    reference = load_trace(store, imported(store, REPLAYABLE[0]))
    assert call.key == reference.steps[0].calls[0].key
    assert view.steps[0].llm_calls[0].content == "answer #1 to Which month?"
    assert view.steps[0].attributes["provider"] == "openai"


PLANTED = Tracer(read_cache=True)


@PLANTED.chain("planted_chain")
def planted_chain(question: str) -> str:
    return fixture_chain(question)


def test_an_imported_answer_never_serves_another_run(
    store: Store, stub: ModelStub, client: ChatClient
) -> None:
    """A trace file is data from elsewhere: the answers its import seeds serve that trace's own
    replays (0 requests) but never another run that happens to send the same request — a
    crafted file must not plant answers. The other run sends its requests live."""
    tid = imported(store, REPLAYABLE[0])
    view = load_trace(store, tid)
    keys = [c.key for s in view.steps for c in s.calls]
    assert all((store.llm_cache_get(k) or CacheEntryMissing).origin == tid for k in keys)

    PLANTED.configure(store=store, chat_client=client)
    planted_chain("Which month is the wettest in Seattle?")  # the imported trace's requests
    assert len(stub.requests) == 2  # sent live, not served from the imported answers
    (run,) = [r for r in store.list_runs() if r.run_id != tid]
    new = load_trace(store, run.run_id)
    assert [c.key for s in new.steps for c in s.calls] == keys  # the very same requests
    assert all(c.outcome != "hit" for s in new.steps for c in s.calls)
    # The live answers are the store's own now (origin cleared), and the trace's replays
    # still cost nothing.
    assert all(store.llm_cache_get(k).origin is None for k in keys)  # type: ignore[union-attr]
    record = replay_trace(store, tid, chat_client=client)
    assert record.status == "completed" and len(stub.requests) == 2


class CacheEntryMissing:
    origin = "missing"
