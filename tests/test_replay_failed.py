"""Replays of traces that failed, or whose chain caught a failed step, end and are stored as
their source did.

* A trace without chain code is replayed as its recorded calls (``rewind.tracing.recorded``).
  When the recorded chain raised, its steps replay and then the replay ends failed with the
  recorded error (it was stored ``completed``), and ``rewind replay-trace`` says so.
* A cached replay (``Tracer(read_cache=True)``) whose steps match its source's step for step,
  a step that failed and was caught by the chain included, is stored by reference like any
  unchanged replay (it was stored in full from the failed step on: the failed step's state row
  was copied).
* A cached replay of a chain that raised finds the failed recording as its source, and is
  stored by reference to it, failed (only completed traces were sources: it was stored unlinked
  and in full); a completed recording of the same input is still taken first.
* The API's trace replay answers ``ended_as_recorded`` as ``replay-trace --json`` does.

Real SQLite (and PostgreSQL) stores, a real server for the API and a real loopback model server
(tests.model_stub).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rewind.store import open_store
from rewind.tracing import Trace, Tracer, chat_step, step
from rewind.tracing.replay import replay_trace
from rewind.tracing.store import load_trace, state_at
from tests.model_stub import stub_and_client
from tests.test_tracing_lane import reply
from tests.test_tracing_reference import own_rows, store_bytes


def ask(question: str) -> str:
    return chat_step("llm", [{"role": "user", "content": question}], temperature=0).content


def gives_up() -> None:
    """Two answers, a step the chain catches failing, then the chain raises."""
    ask("one")
    with contextlib.suppress(ValueError), step("parse", "parse", input="x"):
        raise ValueError("bad answer")
    ask("two")
    raise RuntimeError("gave up after two answers")


def _record_failing(folder: Path, client: Any) -> Trace:
    tracer = Tracer(folder, chat_client=client, raise_on_write_error=True)
    try:
        with pytest.raises(RuntimeError), tracer.trace("gives-up", {"q": 1}) as t:
            gives_up()
    finally:
        tracer.close()
    assert t.write_error is None
    return t


def _shown(view: Any) -> list[tuple[Any, ...]]:
    return [
        (s.name, s.status, s.error_type, s.error_message, s.output_hash, s.state_hash)
        for s in view.steps
    ]


def test_a_recorded_calls_replay_of_a_trace_whose_chain_raised_ends_failed_with_its_error(
    tmp_path: Path,
) -> None:
    """The chain raised after its steps: its unchanged recorded-calls replay was stored
    ``completed``, with no error. It now ends as the source did (failed, the recorded error on
    the run row and the root span), every step as recorded, 0 requests, stored by reference
    (its caught failed step too)."""
    with stub_and_client(reply) as (stub, client):
        source = _record_failing(tmp_path, client)
        requests = stub.count
        st = open_store(tmp_path)
        try:
            replay = replay_trace(st, source.trace_id, chat_client=client)
            a = load_trace(st, source.trace_id)
            b = load_trace(st, replay.run_id)
            source_run = st.get_run(source.trace_id)
        finally:
            st.close()
    assert stub.count == requests and replay.config["replay_mode"] == "recorded-calls"
    assert source_run.status == "failed"
    assert source_run.error == "RuntimeError: gave up after two answers"
    assert (replay.status, replay.error) == (source_run.status, source_run.error)
    assert (b.status, b.error_type, b.error_message) == (a.status, a.error_type, a.error_message)
    assert _shown(b) == _shown(a)
    assert replay.config["reference"] == {"run": source.trace_id, "steps": 3, "all": True}


def test_replay_trace_says_the_replay_ended_as_its_recorded_chain_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rewind replay-trace`` of that trace says that the replay failed because the recorded
    chain raised (not because the replay went wrong), names the error, and exits 1 as a failed
    replay does; ``--json`` says it too."""
    import json

    from rewind.cli import app

    with stub_and_client(reply) as (stub, client):
        source = _record_failing(tmp_path, client)
        monkeypatch.setattr("rewind.session.LazyChatClient", lambda: client)
        requests = stub.count
        runner = CliRunner()
        out = runner.invoke(app, ["--store", str(tmp_path), "replay-trace", source.trace_id])
        as_json = runner.invoke(
            app, ["--store", str(tmp_path), "replay-trace", source.trace_id, "--json"]
        )
    assert stub.count == requests
    assert out.exit_code == 1, out.output
    text = " ".join(out.output.split())
    assert "the recorded chain raised RuntimeError: gave up after two answers" in text, text
    assert "the replay ends as the recording did" in text, text
    assert as_json.exit_code == 1, as_json.output
    doc = json.loads(as_json.output)
    assert doc["ended_as_recorded"] is True and doc["trace"]["status"] == "failed"


def caught() -> str:
    """Two answers around a step that fails and that the chain catches."""
    first = ask("one")
    with contextlib.suppress(ValueError), step("parse", "parse", input=first):
        raise ValueError("bad answer")
    return first + ask("two")


def _trace_caught(location: Any, client: Any, read_cache: bool) -> Trace:
    tracer = Tracer(location, chat_client=client, read_cache=read_cache, raise_on_write_error=True)
    try:
        with tracer.trace("catches", {"q": 1}) as t:
            t.set_output(caught())
    finally:
        tracer.close()
    assert t.write_error is None
    return t


def test_a_cached_replay_after_a_caught_failed_step_adds_no_rows(tmp_path: Path) -> None:
    """A cached replay that matches its source step for step, a failed step the chain caught
    included, was stored in full from that step on (its node, call and span rows and a copy of
    the failed step's state row: the state before it). It now refers to the source's row, so
    it is stored wholly by reference like any unchanged replay: no node, call or state row of
    its own, and six replays add at most 2 KB each (whole pages). Readers see the same steps,
    the failed step's state included."""
    with stub_and_client(reply) as (stub, client):
        source = _trace_caught(tmp_path, client, read_cache=False)
        before, requests = store_bytes(tmp_path), stub.count
        replays = [_trace_caught(tmp_path, client, read_cache=True) for _ in range(6)]
    assert stub.count == requests and {r.output for r in replays} == {source.output}
    assert store_bytes(tmp_path) - before <= 6 * 2048
    st = open_store(tmp_path)
    try:
        a = load_trace(st, source.trace_id)
        for replay in replays:
            run = st.get_run(replay.trace_id)
            assert run.parent_run_id == source.trace_id
            assert run.config["reference"] == {"run": source.trace_id, "steps": 3, "all": True}
            assert own_rows(st, replay.trace_id) == {
                "nodes": 0,
                "calls": 0,
                "spans": 1,
                "burr_state": 0,
            }
            b = load_trace(st, replay.trace_id)
            assert _shown(b) == _shown(a)
            assert [state_at(st, s) for s in b.steps] == [state_at(st, s) for s in a.steps]
        assert a.steps[1].status == "failed" and state_at(st, a.steps[1]) is not None
    finally:
        st.close()


def test_a_replay_failing_from_another_state_stores_its_own_state_row(tmp_path: Path) -> None:
    """A replay whose step fails where the source's did but from another state (an earlier
    answer changed) stores its own state row, as before: the source's row holds another
    state."""
    with stub_and_client(reply) as (_stub, client):
        source = _trace_caught(tmp_path, client, read_cache=False)
        tracer = Tracer(tmp_path, chat_client=client, read_cache=True, raise_on_write_error=True)
        try:
            with tracer.trace("catches", {"q": 2}) as t:  # another input: another state
                t.set_output(caught())
        finally:
            tracer.close()
    st = open_store(tmp_path)
    try:
        assert st.get_run(t.trace_id).parent_run_id == source.trace_id
        assert own_rows(st, t.trace_id)["burr_state"] == 1
        a, b = load_trace(st, source.trace_id), load_trace(st, t.trace_id)
        assert b.steps[1].status == "failed"
        mine, theirs = state_at(st, b.steps[1]), state_at(st, a.steps[1])
        assert mine is not None and theirs is not None
        assert (mine["q"], theirs["q"]) == (2, 1) and mine.keys() == theirs.keys()
    finally:
        st.close()


def test_the_lane_and_the_full_path_store_a_replay_with_a_caught_failure_alike(
    tmp_path: Path,
) -> None:
    """The third trace of the chain (after a recording and a proving replay), with the lane
    and with the lane off, in two stores: the same answers, requests and stored view, by
    reference to the recording."""
    from tests.test_attack31 import _third
    from tests.test_tracing_lane import _diff

    lane_side, full_side = [
        _third(tmp_path / ("full" if full else "lane"), caught, full=full) for full in (False, True)
    ]
    assert _diff(lane_side[3], full_side[3]) == []
    assert lane_side[:3] == full_side[:3] and lane_side[1:3] == (0, 0)
    assert lane_side[5] and lane_side[3]["config"]["reference"]["all"] is True


def _raising() -> str:
    """``gives_up`` as the lane tests' block (the third trace of it, see ``_third``)."""
    gives_up()
    return ""


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_cached_replay_of_a_chain_that_raised_is_stored_alike_by_the_lane_and_the_full_path(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """The cached replay of a chain that raised finds the failed recording as its source (only
    completed traces were looked at: it was stored unlinked and in full); with the lane and
    with the lane off it is stored alike, by reference to the recording, failed, 0 requests,
    on SQLite and PostgreSQL."""
    from tests.test_attack31 import _third
    from tests.test_tracing_lane import _diff

    def location(side: str) -> Any:
        if backend == "sqlite":
            return tmp_path / side
        return request.getfixturevalue("postgres_server").new_store_database()

    lane_side, full_side = [_third(location(str(f)), _raising, full=f) for f in (False, True)]
    assert _diff(lane_side[3], full_side[3]) == []
    assert lane_side[:3] == full_side[:3] and lane_side[1:3] == (0, 0)
    assert lane_side[5] and full_side[5]
    assert lane_side[3]["status"] == "failed"
    assert lane_side[3]["config"]["reference"] == {"run": "PARENT", "steps": 3, "all": True}


_FLAKY = [False]


def _flaky() -> str:
    """Two answers; raises between them while ``_FLAKY[0]`` is set."""
    out = ask("one")
    if _FLAKY[0]:
        raise RuntimeError("flaky")
    return out + ask("two")


def _traced(folder: Path, client: Any, q: int, *, flaky: bool, read_cache: bool) -> Trace:
    """One trace of ``_flaky`` named ``flaky`` with input ``{"q": q}`` (raising or not)."""
    _FLAKY[0] = flaky
    tracer = Tracer(folder, chat_client=client, read_cache=read_cache, raise_on_write_error=True)
    try:
        with contextlib.suppress(RuntimeError), tracer.trace("flaky", {"q": q}) as t:
            _flaky()
    finally:
        tracer.close()
        _FLAKY[0] = False
    assert t.write_error is None
    return t


def _cached_replay(folder: Path, stub: Any, client: Any, *, flaky: bool) -> tuple[Any, int]:
    """(the run row, its own node rows) of a cached trace of ``_flaky`` with input ``{"q": 1}``,
    which must send no request."""
    requests = stub.count
    replay = _traced(folder, client, 1, flaky=flaky, read_cache=True)
    assert stub.count == requests
    st = open_store(folder)
    try:
        return st.get_run(replay.trace_id), own_rows(st, replay.trace_id)["nodes"]
    finally:
        st.close()


@pytest.mark.parametrize(
    ("recordings", "flaky", "source", "status"),
    [
        ([(1, True), (1, False)], False, 1, "completed"),
        ([(1, False), (1, True)], False, 0, "completed"),
        ([(1, True), (2, False)], True, 0, "failed"),
    ],
    ids=["failed-then-succeeded", "succeeded-then-failed", "failed-and-another-input-completed"],
)
def test_a_cached_replay_links_to_the_recording_whose_calls_and_end_it_matches(
    tmp_path: Path, recordings: list[tuple[int, bool]], flaky: bool, source: int, status: str
) -> None:
    """Recordings of ``_flaky`` (input, whether it raised between its two calls), then its
    unchanged cached replay with input 1 (0 requests), which links to the recording numbered
    ``source``, stored wholly by reference, ended ``status``:

    * the chain failed once and succeeded once with the same input, in either order: the
      replay (which succeeds: every answer is cached) matches the success's calls, not the
      failure's (which stopped after the first), and links to the success. A failed trace is
      a source only when no completed trace of the input made the call;
    * a completed trace of another input made the same first call, the input's own recording
      failed after it: the replay, failing the same way, links to the failed recording (it was
      linked to the other input's trace, and stored in full from the failure on)."""
    with stub_and_client(reply) as (stub, client):
        made = [_traced(tmp_path, client, q, flaky=f, read_cache=False) for q, f in recordings]
        run, nodes = _cached_replay(tmp_path, stub, client, flaky=flaky)
    assert (run.parent_run_id, run.status) == (made[source].trace_id, status)
    assert run.config["reference"]["all"] is True and nodes == 0


def test_the_apis_trace_replay_says_the_replay_ended_as_its_recorded_chain_did(
    tmp_path: Path,
) -> None:
    """``POST /api/traces/{id}/replay`` (a real server) answers ``ended_as_recorded`` as
    ``rewind replay-trace --json`` does: true for the recorded-calls replay of a trace whose
    chain raised (failed with the recorded error, 0 requests), false for one that completed.
    The field was missing from the API's answer."""
    import httpx

    from rewind.api import create_app
    from tests.live_server import LiveServer

    with stub_and_client(reply) as (stub, client):
        source = _record_failing(tmp_path, client)
        tracer = Tracer(tmp_path, chat_client=client, raise_on_write_error=True)
        try:
            with tracer.trace("answers", {"q": 1}) as done:
                ask("one")
        finally:
            tracer.close()
        requests = stub.count
        st = open_store(tmp_path)
        try:
            with LiveServer(create_app(st, chat_client=client, pipelines={})) as server:
                answers = [
                    httpx.post(f"{server.url}/api/traces/{t}/replay", json={}, trust_env=False)
                    for t in (source.trace_id, done.trace_id)
                ]
        finally:
            st.close()
    assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
    failed, completed = (r.json() for r in answers)
    assert failed["mode"] == "recorded-calls" and failed["trace"]["status"] == "failed"
    assert failed["ended_as_recorded"] is True
    assert completed["ended_as_recorded"] is False and completed["trace"]["status"] == "success"
    assert stub.count == requests


def test_a_cached_replay_of_a_chain_that_raised_finds_it_behind_many_replays_of_it(
    tmp_path: Path,
) -> None:
    """More replays of the raising chain than the failed traces looked at
    (tracer_source.RECORDER_CANDIDATES), each stored wholly by reference (no call rows of its
    own): the next cached replay still links to the recording (a replay's parent holds the
    calls), stored by reference, failed, 0 requests."""
    from rewind.tracing import tracer_source

    with stub_and_client(reply) as (stub, client):
        source = _traced(tmp_path, client, 1, flaky=True, read_cache=False)
        for _ in range(tracer_source.RECORDER_CANDIDATES + 1):
            _traced(tmp_path, client, 1, flaky=True, read_cache=True)
        run, nodes = _cached_replay(tmp_path, stub, client, flaky=True)
    assert (run.parent_run_id, run.status) == (source.trace_id, "failed")
    assert run.config["reference"]["all"] is True and nodes == 0
