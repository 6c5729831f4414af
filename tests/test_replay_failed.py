"""Replays of traces that failed, or whose chain caught a failed step, end and are stored as
their source did.

* A trace without chain code is replayed as its recorded calls (``rewind.tracing.recorded``).
  When the recorded chain raised, its steps replay and then the replay ends failed with the
  recorded error (it was stored ``completed``), and ``rewind replay-trace`` says so.
* A cached replay (``Tracer(read_cache=True)``) whose steps match its source's step for step,
  a step that failed and was caught by the chain included, is stored by reference like any
  unchanged replay (it was stored in full from the failed step on: the failed step's state row
  was copied).

Real SQLite stores and a real loopback model server (tests.model_stub).
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
from rewind.tracing.store import load_trace
from tests.model_stub import stub_and_client
from tests.test_tracing_lane import reply


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
    the run row and the root span), every step as recorded, 0 requests."""
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
