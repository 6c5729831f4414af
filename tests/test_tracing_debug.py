"""The debug session: stepping, breakpoints, JMESPath watches, state, fork — scripted."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from rewind.calls import chat
from rewind.cli.trace_views import debug_command
from rewind.llm import ChatClient
from rewind.replay import Rewind
from rewind.store import Store
from rewind.tracing import Tracer, step
from rewind.tracing.debug import DebugError, DebugQuit, DebugSession, run_script
from rewind.tracing.store import load_trace, search_runs, state_at
from tests import pipelines

DEBUG = Tracer()


@DEBUG.chain("answer")
def answer(question: str) -> str:
    with step("retrieve", "retrieval", input=question) as s:
        s.set_output([{"text": "doc", "score": 0.4}])
    with step("generate", "llm_call", input={"question": question}) as s:
        s.set_output(chat([{"role": "user", "content": question}], temperature=0).content)
    with step("parse", "parse", input=s.output) as p:
        p.set_output({"answer": s.output})
    return s.output


@pytest.fixture
def rw(tmp_path: Path, chat_client: ChatClient) -> Iterator[Rewind]:
    r = Rewind(tmp_path / "store", chat_client=chat_client)
    DEBUG.configure(store=r.store, chat_client=chat_client)
    yield r
    r.store.close()


def trace_id(store: Store) -> str:
    answer("what now?")
    return search_runs(store, kind="trace", limit=1)[0][0].run_id


def run(rw: Rewind, target: str, *lines: str) -> tuple[int, list[str]]:
    buf = io.StringIO()
    code = debug_command(rw, target, lines=list(lines), console=Console(file=buf, width=300))
    return code, buf.getvalue().splitlines()


def test_stepping_and_jumping(rw: Rewind) -> None:
    tid = trace_id(rw.store)
    code, out = run(
        rw, tid, "list", "next", "next", "next", "back 2", "jump parse", "jump 1", "last"
    )
    assert code == 0
    assert out[0].startswith("→ step 1/3 retrieve [retrieval] success")
    assert any(line.startswith("→") and " 1 retrieve [retrieval]" in line for line in out)
    steps = [line for line in out if line.startswith("→ step")]
    assert [s.split()[2] for s in steps] == ["1/3", "2/3", "3/3", "3/3", "1/3", "3/3", "1/3", "3/3"]
    assert "(end of trace)" in out


def test_breakpoints_watches_and_print(rw: Rewind) -> None:
    tid = trace_id(rw.store)
    code, out = run(
        rw,
        tid,
        "watch out=output",
        "watch type",
        "break parse",
        "break gen* if type == 'llm_call'",
        "breaks",
        "continue",
        "continue",
        "continue",
        "rcontinue",
        "print input.question",
        "print tokens.prompt",
        "print length(state.retrieve)",
        "unwatch out",
        "delete parse",
        "watches",
    )
    assert code == 0
    text = "\n".join(out)
    assert 'watch out: output = [{"score": 0.4, "text": "doc"}]' in text
    assert "breakpoint at gen* if type == 'llm_call' (steps 2)" in text
    hits = [
        line
        for line in out
        if line.startswith("breakpoint hit") or line.startswith("no breakpoint")
    ]
    assert hits == [
        "breakpoint hit at step 2 generate",
        "breakpoint hit at step 3 parse",
        "no breakpoint hit; at the last step",
        "breakpoint hit at step 2 generate",
    ]
    assert '  w1 = "llm_call"' in out
    assert '"what now?"' in out and "11" in out and "1" in out
    assert out[-1] == "w1: type"


def test_state_input_output_and_errors(rw: Rewind) -> None:
    tid = trace_id(rw.store)
    code, out = run(
        rw,
        tid,
        "jump generate",
        "state",
        "state question",
        "output",
        "bogus",
        "jump 9",
        "print output.[",
        "next x",
        "unwatch nope",
        "state nope",
        "quit",
        "next",
    )
    assert code == 1  # commands failed
    text = "\n".join(out)
    assert '"question": "what now?"' in text and '"retrieve": [' in text
    errors = [line for line in out if line.startswith("error:")]
    assert len(errors) == 6
    assert "unknown command 'bogus'" in errors[0]
    assert "no step '9'" in errors[1]
    assert "invalid expression" in errors[2]
    assert out[-1].startswith("error: the state has no field 'nope'")  # nothing ran after quit


def test_fork_from_the_current_step_of_a_burr_run(rw: Rewind) -> None:
    parent = rw.record(pipelines.pipeline, {"x": 5})
    code, out = run(
        rw,
        parent.run_id,
        "list",
        "jump expand",
        "print params",
        "state total",
        "fork --set expand.factor=3",
        "fork --set nope",
    )
    assert code == 1
    text = "\n".join(out)
    assert "→ step 2/3 expand [tool_call] success" in text
    assert '{"factor": 2}' in text
    fork_line = next(line for line in out if line.startswith("forked at step 2 (expand)"))
    assert "completed" in fork_line and "first divergence at step 2 expand" in fork_line
    child = rw.store.get_run(fork_line.split("new run ")[1].split()[0])
    assert child.parent_run_id == parent.run_id and child.fork_node == "expand"
    assert any(line.startswith("error: malformed override") for line in out)


def test_fork_chooses_an_effects_mode(rw: Rewind, tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("start\n", encoding="utf-8")
    parent = rw.record(pipelines.effects_pipeline, {"text": "hi", "path": str(path)})
    code, out = run(
        rw,
        parent.run_id,
        "jump prep",
        "fork --set prep.suffix=! --effects dry-run",
        "fork --effects sometimes",
        "fork --set prep.suffix=? --effects live",
    )
    assert code == 1
    dry = next(line for line in out if "effects dry-run:" in line)
    live = next(line for line in out if "effects live:" in line)
    assert "completed" in dry and "completed" in live
    assert any(line.startswith("error: --effects takes one of") for line in out)
    runs = [rw.store.get_run(line.split("new run ")[1].split()[0]) for line in (dry, live)]
    assert [r.effects_mode for r in runs] == ["dry-run", "live"]
    assert path.read_text(encoding="utf-8") == "start\nhi?\n"  # restored, then the live write


def test_fork_restore_replace_is_there_when_the_hint_names_it(rw: Rewind, tmp_path: Path) -> None:
    # Issue 12: a live fork refusing to delete a user's file says "--restore=replace"; the debug
    # session's fork must accept it (and refuse it without --effects live, as the CLI does).
    folder = tmp_path / "notes"
    folder.mkdir()
    parent = rw.record(pipelines.folder_pipeline, {"folder": str(folder), "text": "v1"})
    (folder / "mine.txt").write_text("a user's file\n", encoding="utf-8")
    code, out = run(
        rw,
        parent.run_id,
        "fork --effects live",
        "fork --restore replace",
        "fork --effects live --restore sometimes",
        "fork --effects live --restore=replace",
    )
    assert code == 1
    errors = [line for line in out if line.startswith("error:")]
    assert "mine.txt" in errors[0] and "--restore=replace" in errors[0]
    assert "--effects live" in errors[1]
    assert errors[2].startswith("error: --restore takes one of")
    live = next(line for line in out if "effects live:" in line and "completed" in line)
    assert rw.store.get_run(live.split("new run ")[1].split()[0]).effects_mode == "live"
    assert sorted(p.name for p in folder.iterdir()) == ["note.txt"]


def test_fork_of_a_trace_is_a_replay(rw: Rewind) -> None:
    tid = trace_id(rw.store)
    code, out = run(
        rw, tid, "fork", "fork --set input.question=different", "fork --set-output x.y=1"
    )
    replays = [line for line in out if line.startswith("replayed trace")]
    assert "no divergence" in replays[0] and ", 0 tokens" in replays[0]
    assert "first divergence at step 2 generate" in replays[1]
    assert code == 1 and out[-1].startswith("error: a trace replays with --set")


def test_session_api_directly(rw: Rewind) -> None:
    view = load_trace(rw.store, trace_id(rw.store))
    session = DebugSession(view, state_loader=lambda s: state_at(rw.store, s))
    assert session.evaluate("name") == "retrieve"
    assert session.evaluate("state.question") == "what now?"
    assert session.evaluate("duration_ms >= `0`") is True
    with pytest.raises(DebugError):
        session.execute("fork")  # no forker given
    with pytest.raises(DebugQuit):
        session.execute("quit")
    lines: list[str] = []
    assert run_script(session, ["help", "", "# comment"], lines.append) == 0
    assert any("break PATTERN" in line for line in lines)
    empty = DebugSession(view.__class__(**{**view.__dict__, "steps": ()}))
    assert empty.execute("next") == ["the trace has no steps"]
