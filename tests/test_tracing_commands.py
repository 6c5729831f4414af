"""End-to-end tests of the tracing commands: the functions in ``rewind.cli.trace_views`` called
directly, and the Typer commands of ``rewind.cli.traces`` driven through Typer's CliRunner."""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from rewind.calls import chat
from rewind.cli import trace_views as tc
from rewind.errors import InvalidOverride, RewindError, UnknownNode, UnknownRun
from rewind.llm import ChatClient, Endpoint, RetryPolicy
from rewind.replay import Rewind
from rewind.store import open_store
from rewind.tracing import Tracer, step
from rewind.tracing.store import load_trace, search_runs
from tests import pipelines
from tests.conftest import FAKE_BASE_URL, FAKE_MODEL, FakeModel

CMD = Tracer()


@CMD.chain("cmd_chain")
def cmd_chain(question: str, strict: bool = True) -> dict[str, Any]:
    with step("retrieve", "retrieval", input=question) as s:
        s.set_output([{"text": "only one", "score": 0.3}])
    with step("generate", "llm_call", input={"question": question}) as s:
        reply = chat([{"role": "user", "content": question}], temperature=0)
        s.set_output(reply.content)
    with step("parse", "parse", input=reply.content) as s:
        if strict and not reply.content.startswith("{"):
            s.set_output(json.loads(reply.content))
        s.set_output({"text": reply.content})
    return {"text": reply.content}


@pytest.fixture
def rw(tmp_path: Path, chat_client: ChatClient) -> Iterator[Rewind]:
    r = Rewind(tmp_path / "store", chat_client=chat_client)
    CMD.configure(store=r.store, chat_client=chat_client)
    yield r
    r.store.close()


def captured() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=250, highlight=False), buf


def record(rw: Rewind, question: str, strict: bool = True) -> str:
    with contextlib.suppress(json.JSONDecodeError):
        cmd_chain(question, strict)
    return search_runs(rw.store, kind="trace", limit=1)[0][0].run_id


# -- the functions -----------------------------------------------------------------------------


def test_replay_trace_command(rw: Rewind, capsys: pytest.CaptureFixture[str]) -> None:
    tid = record(rw, "hello", strict=False)
    con, buf = captured()
    assert tc.replay_trace_command(rw, tid[:8], console=con) == 0
    text = buf.getvalue()
    assert "no divergence: every step output is equal" in text and "tokens: 16 → 0" in text
    assert tc.replay_trace_command(rw, tid, ["input.question=bye"], as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trace"]["input"]["question"] == "bye"
    assert out["diff"]["nodes"][1]["status"] == "changed"
    with pytest.raises(InvalidOverride, match="exactly one change"):
        tc.replay_trace_command(rw, tid, ["input.question=a", "input.question=b"])
    with pytest.raises(InvalidOverride, match="no field"):
        tc.replay_trace_command(rw, tid, ["input.nope=1"])
    failing = record(rw, "boom", strict=True)
    assert tc.replay_trace_command(rw, failing, console=captured()[0]) == 1
    with pytest.raises(UnknownRun):
        tc.replay_trace_command(rw, "ffffffffff")


def test_inspect_command(rw: Rewind, capsys: pytest.CaptureFixture[str]) -> None:
    tid = record(rw, "inspect me", strict=True)
    con, buf = captured()
    assert tc.inspect_command(rw, tid, console=con) == 0
    text = buf.getvalue()
    assert "few_results" in text and "low_scores" in text and "parse_failure" in text
    assert "error(s)" in text
    assert tc.inspect_command(rw, tid, "generate", settings=["slow_llm_ms=0"], as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in out["steps"]] == ["generate"]
    assert [f["code"] for f in out["steps"][0]["findings"]] == ["slow_response"]
    with pytest.raises(UnknownNode):
        tc.inspect_command(rw, tid, "nope")
    with pytest.raises(InvalidOverride, match="unknown setting"):
        tc.inspect_command(rw, tid, settings=["bogus=1"])
    with pytest.raises(InvalidOverride, match="malformed"):
        tc.inspect_command(rw, tid, settings=["novalue"])


def test_failures_command(rw: Rewind, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(3):
        record(rw, f"fail {i}", strict=True)
    record(rw, "fine", strict=False)
    rw.record(pipelines.failing, {"x": 1})
    assert tc.failures_command(rw, as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total_traces"] == 5 and out["failed_traces"] == 4
    counts = {
        p["pattern"] + (f":{p['signature']}" if p["signature"] else ""): p["count"]
        for p in out["patterns"]
    }
    assert counts == {"parse_failure": 3, "cluster:RuntimeError: boom went off": 1}
    assert tc.failures_command(rw, name="cmd_chain", kind="trace", as_json=True) == 0
    only = json.loads(capsys.readouterr().out)
    assert only["total_traces"] == 4 and only["failed_traces"] == 3
    assert tc.failures_command(rw, since="1h", until=str(time.time() + 60), as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["total_traces"] == 5
    assert tc.failures_command(rw, since="2000-01-01", until="2000-01-02", as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["total_traces"] == 0
    con, buf = captured()
    assert tc.failures_command(rw, console=con) == 0
    assert "parse_failure" in buf.getvalue() and "5 traces, 4 failed" in buf.getvalue()
    with pytest.raises(RewindError, match="cannot read the time"):
        tc.failures_command(rw, since="yesterday-ish")
    with pytest.raises(RewindError, match="unknown kind"):
        tc.failures_command(rw, kind="both")


def test_root_cause_command(rw: Rewind, capsys: pytest.CaptureFixture[str]) -> None:
    run = rw.record(pipelines.failing, {"x": 1})
    con, buf = captured()
    assert tc.root_cause_command(rw, run.run_id, console=con) == 0
    text = buf.getvalue()
    assert f"rewind fork {run.run_id} --at boom" in text
    assert "failing step: 2 boom" in text and "RuntimeError: boom went off" in text
    tid = record(rw, "why", strict=True)
    assert tc.root_cause_command(rw, tid, as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pattern"] == "parse_failure" and out["failing_step"]["name"] == "parse"
    assert out["replay_command"].startswith(f"rewind replay-trace {tid} --set input.")
    ok = record(rw, "fine", strict=False)
    con, buf = captured()
    assert tc.root_cause_command(rw, ok, console=con) == 0
    assert "did not fail" in buf.getvalue()


def test_debug_command_reads_stdin(rw: Rewind, monkeypatch: pytest.MonkeyPatch) -> None:
    tid = record(rw, "debug", strict=False)
    monkeypatch.setattr("sys.stdin", io.StringIO("next\nprint name\nquit\n"))
    con, buf = captured()
    assert tc.debug_command(rw, tid, console=con) == 0
    assert '"generate"' in buf.getvalue()


def test_otel_commands(rw: Rewind, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tid = record(rw, "export", strict=True)
    run = rw.record(pipelines.pipeline, {"x": 5})
    out_file = tmp_path / "otel.json"
    con, buf = captured()
    assert tc.otel_export_command(rw, [tid, run.run_id[:8]], out=out_file, console=con) == 0
    assert "exported 2 trace(s)" in buf.getvalue()
    other = Rewind(tmp_path / "other")
    assert tc.otel_import_command(other, out_file, as_json=True) == 0
    result = json.loads(capsys.readouterr().out)
    assert sorted(result["imported"]) == sorted([tid, run.run_id])
    con, buf = captured()
    assert tc.otel_import_command(other, out_file, console=con) == 0
    assert "imported 0 trace(s)" in buf.getvalue() and "2 already stored" in buf.getvalue()
    assert [n.output_hash for n in other.store.nodes_of(tid)] == [
        n.output_hash for n in rw.store.nodes_of(tid)
    ]
    with pytest.raises(InvalidOverride, match="where to export"):
        tc.otel_export_command(rw, [tid])
    with pytest.raises(InvalidOverride, match="at least one"):
        tc.otel_export_command(rw, [], out=out_file)
    with pytest.raises(InvalidOverride, match="not an http"):
        tc.otel_export_command(rw, [tid], endpoint="ftp://x")
    with pytest.raises(RewindError, match="cannot read"):
        tc.otel_import_command(other, tmp_path / "missing.json")
    other.store.close()


# -- the Typer commands (rewind.cli.traces) ---------------------------------------------------

from rewind.cli import app  # noqa: E402


@pytest.fixture
def cli_store(
    tmp_path: Path, chat_client: ChatClient, fake_model: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """A store with a failed trace, an ok trace and a failed Burr run; the CLI's lazy model client
    is replaced by the fake model."""
    folder = tmp_path / "cli"
    r = Rewind(folder, chat_client=chat_client)
    CMD.configure(store=r.store, chat_client=chat_client)
    record(r, "cli fail", strict=True)
    record(r, "cli ok", strict=False)
    r.record(pipelines.failing, {"x": 1})
    r.store.close()
    monkeypatch.setattr(
        "rewind.session.LazyChatClient",
        lambda: ChatClient(  # the CLI closes its client after each command: a new one each time
            Endpoint(base_url=FAKE_BASE_URL, model=FAKE_MODEL),
            transport=httpx.MockTransport(fake_model.handler),
            retry=RetryPolicy(attempts=1),
        ),
    )
    monkeypatch.delenv("REWIND_MODEL", raising=False)
    yield folder


def invoke(folder: Path, *args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(app, ["--store", str(folder), *args], input=input)


def ids(folder: Path) -> dict[str, str]:
    st = open_store(folder)
    try:
        out = {}
        for r in st.list_runs():
            kind = load_trace(st, r.run_id)
            label = r.pipeline if kind.kind == "run" else f"{r.pipeline}:{kind.status}"
            out[label] = r.run_id
        return out
    finally:
        st.close()


def test_wrappers_end_to_end(cli_store: Path, tmp_path: Path) -> None:
    known = ids(cli_store)
    failed, ok, burr = known["cmd_chain:failed"], known["cmd_chain:success"], known["failing"]
    r = invoke(cli_store, "inspect", failed, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["counts"]["error"] >= 1
    r = invoke(cli_store, "inspect", failed, "--step", "nope")
    assert r.exit_code == 2 and "has no step 'nope'" in r.output
    r = invoke(cli_store, "failures", "--json", "--since", "1h")
    assert r.exit_code == 0 and json.loads(r.stdout)["failed_traces"] == 2
    r = invoke(cli_store, "failures", "--since", "someday")
    assert r.exit_code == 2 and "cannot read the time" in r.output
    r = invoke(cli_store, "root-cause", burr)
    assert r.exit_code == 0 and f"rewind fork {burr} --at boom" in r.stdout
    r = invoke(cli_store, "root-cause", "zzzzzz")
    assert r.exit_code == 2 and "unknown run" in r.output
    r = invoke(cli_store, "replay-trace", ok[:10])
    assert r.exit_code == 0 and "no divergence" in r.stdout
    r = invoke(cli_store, "replay-trace", ok, "--set", "input.question=changed", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["trace"]["input"]["question"] == "changed"
    r = invoke(cli_store, "replay-trace", failed)
    assert r.exit_code == 1
    r = invoke(cli_store, "replay-trace", ok, "--set", "input.nope=1")
    assert r.exit_code == 2 and "has no field 'nope'" in r.output
    r = invoke(
        cli_store, "debug", burr, input="jump boom\nprint error.type\nfork --set boom.fail=false\n"
    )
    assert r.exit_code == 0, r.output
    assert '"RuntimeError"' in r.stdout and "completed" in r.stdout
    out = tmp_path / "x.json"
    r = invoke(cli_store, "otel", "export", ok, burr, "--out", str(out))
    assert r.exit_code == 0 and out.exists()
    fresh = tmp_path / "fresh"
    r = invoke(fresh, "otel", "import", str(out), "--json")
    assert r.exit_code == 0 and sorted(json.loads(r.stdout)["imported"]) == sorted([ok, burr])
    r = invoke(fresh, "otel", "import", str(tmp_path / "nope.json"))
    assert r.exit_code == 2 and "cannot read" in r.output


def test_ctrl_c_inside_a_command_says_interrupted_and_exits_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Typer turns a KeyboardInterrupt inside a command into Exit(130), which
    # app(standalone_mode=False) returns: Ctrl-C during `rewind replay-trace` (or any command)
    # ended with exit 130 and not a word.
    import signal
    import sys

    import rewind.cli  # noqa: F401  (registers the commands)

    cli = sys.modules["rewind.cli.app"]

    def interrupt(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_log_inertly", lambda: None)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # keep pytest's SIGTERM handler
    monkeypatch.setattr(cli, "store_location", interrupt)
    monkeypatch.setattr(sys, "argv", ["rewind", "runs"])
    with pytest.raises(SystemExit) as exit_:
        cli._main()
    assert exit_.value.code == 130
    assert "interrupted" in capsys.readouterr().err
