"""Attack 31 on the traced-replay fast paths (issue #13): the lane (``Tracer(read_cache=True)``)
against the full path on the PostgreSQL store, on stores made by older revisions, with sources
that failed, skipped or nested steps, and with hostile values.

Each test is a finding (fixed, or xfail strict naming the bug) or a regression test of what held.
Real stores (SQLite, a throwaway PostgreSQL server) and a real loopback model server.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rewind.errors import RewindError
from rewind.store import open_store
from rewind.tracing import lane
from tests.model_stub import stub_and_client
from tests.test_tracing_lane import EXECUTED, N, _diff, agent, reply, run, view


def _labelled(location: Any, value: Any) -> Any:
    """``value`` with every run id of the store named by its place in creation order (two
    stores with the same history then read alike)."""
    st = open_store(location)
    try:
        with st.read() as conn:
            rows = conn.exec_driver_sql("SELECT run_id FROM runs ORDER BY created_at")
            ids = [r[0] for r in rows]
    finally:
        st.close()
    text = json.dumps(value, sort_keys=True)
    for i, run_id in enumerate(ids):
        text = text.replace(run_id, f"RUN{i}")
    return json.loads(text)


def _third(
    location: Any,
    block: Callable[[], str],
    *,
    full: bool,
    between: Callable[[Any], None] | None = None,
) -> tuple[Any, ...]:
    """(digest, requests, tool executions, stored view, steps served, parent, the recording's
    digest) of the third trace of ``block`` in the store at ``location``, after a recording
    and a proving replay (then ``between(location)``); the lane off for the third when
    ``full``."""
    with stub_and_client(reply) as (stub, client):
        _, recorded = run(location, client, block, read_cache=False)
        _, replayed = run(location, client, block)
        assert replayed == recorded
        if between is not None:
            between(location)
        requests, executed = stub.count, len(EXECUTED)
        with pytest.MonkeyPatch.context() as patch:
            if full:
                patch.setattr(lane, "serve_chat", lambda *a, **k: None)
                patch.setattr(lane, "serve_tool", lambda *a, **k: lane.NOT_SERVED)
            t, digest = run(location, client, block)
        served = sum(1 for s in t.steps if s._proven is not None)
        return (
            digest,
            stub.count - requests,
            len(EXECUTED) - executed,
            _labelled(location, view(location, t.trace_id)),
            served,
            t.parent_run_id is not None,
            recorded,
        )


@pytest.mark.postgres
def test_the_lane_on_postgresql_stores_what_the_full_path_stores(postgres_server: Any) -> None:
    """The lane serves an unchanged replay on a PostgreSQL store too, and stores it as the
    full path does: by reference to its source, 0 requests, 0 tool runs."""
    sides = [_third(postgres_server.new_store_database(), agent, full=f) for f in (False, True)]
    lane_side, full_side = sides
    assert _diff(lane_side[3], full_side[3]) == []
    assert lane_side[:3] == full_side[:3]
    assert lane_side[0] == lane_side[6]
    assert lane_side[1:3] == (0, 0)
    assert lane_side[4] == 2 * N and full_side[4] == 0
    assert lane_side[5] and full_side[5]
    assert lane_side[3]["config"]["reference"]["all"] is True


def _downgraded(revision: str) -> Callable[[Any], None]:
    """A store downgraded to ``revision`` (Alembic), closed, then opened again (upgraded)."""

    def between(location: Any) -> None:
        from alembic import command

        from rewind.store import migrate

        st = open_store(location)
        try:
            with st.write() as conn:
                command.downgrade(migrate._config(conn), revision)  # type: ignore[arg-type]
        finally:
            st.close()
        open_store(location).close()

    return between


@pytest.mark.parametrize("revision", ["0009", "0011", "0012", "0015"])
def test_a_lane_replay_of_a_store_downgraded_and_upgraded_is_the_full_paths(
    tmp_path: Path, revision: str
) -> None:
    """A recording and its proving replay written, the store taken down to an older revision
    and back up (the process keeps the source's rows and proven steps from before): the lane's
    replay is stored as the full path's, unchanged and by reference."""
    sides = [
        _third(tmp_path / str(f), agent, full=f, between=_downgraded(revision))
        for f in (False, True)
    ]
    lane_side, full_side = sides
    assert _diff(lane_side[3], full_side[3]) == []
    assert lane_side[:3] == full_side[:3]
    assert lane_side[1:3] == (0, 0) and lane_side[0] == lane_side[6]
    # Below 0010 a replay stored by reference is stored whole: the proving replay is then a
    # new source (the newest), whose steps this process has not proven yet.
    assert lane_side[4] == (0 if revision == "0009" else 2 * N)
    assert lane_side[3]["config"]["reference"]["all"] is True


def repeated_chain(question: str = "same") -> list[str]:
    """A chain sending one request at three steps (a sampled model answers each differently)."""
    from rewind.tracing import chat_step

    messages = [{"role": "user", "content": question}]
    return [chat_step("llm", messages, temperature=0).content for _ in range(3)]


@pytest.mark.parametrize("mode", ["chain", "recorded-calls"])
def test_an_unchanged_replay_trace_returns_each_steps_own_answer_to_a_repeated_request(
    tmp_path: Path, mode: str
) -> None:
    """A trace sent one request at three steps and got three answers (the stub numbers them,
    as a sampling model differs). ``rewind replay-trace`` served every step the last answer
    (its lineage by key alone), so the unchanged replay's outputs and hashes were not the
    recording's and it was stored in full; it now serves each step the answer its own
    position recorded, as ``Tracer(read_cache=True)`` and the in-place replay do."""
    from rewind.tracing import Tracer
    from rewind.tracing.replay import replay_trace
    from rewind.tracing.store import load_trace

    ref = "tests.test_attack31:repeated_chain" if mode == "chain" else None
    with stub_and_client() as (stub, client):
        tracer = Tracer(tmp_path, chat_client=client, raise_on_write_error=True)
        try:
            with tracer.trace("repeated", {"question": "same"}, chain_ref=ref) as t:
                t.set_output(repeated_chain("same"))
        finally:
            tracer.close()
        recorded = t.output
        assert len(set(recorded)) == 3
        requests = stub.count
        st = open_store(tmp_path)
        try:
            replay = replay_trace(st, t.trace_id, chat_client=client)
            assert replay.config["replay_mode"] == mode
            steps = load_trace(st, replay.run_id, payloads=True).steps
            source = load_trace(st, t.trace_id, payloads=True).steps
        finally:
            st.close()
    assert stub.count == requests
    assert [s.output for s in steps] == recorded
    assert [s.output_hash for s in steps] == [s.output_hash for s in source]
    assert replay.parent_run_id == t.trace_id
    assert replay.config["reference"] == {"run": t.trace_id, "steps": 3, "all": True}


def _otlp_of(folder: Path, client: Any, words: list[str], trace_id: str) -> list[Any]:
    """The OTLP/JSON documents of a trace named ``imported`` of one chat step per word,
    recorded with ``trace_id`` in a store of its own at ``folder``."""
    from rewind.tracing import Tracer, chat_step
    from rewind.tracing.otel.export import export_to_file
    from rewind.tracing.otel.otlp_json import read_otlp_file

    tracer = Tracer(folder, chat_client=client, raise_on_write_error=True)
    try:
        with tracer.trace("imported", {"q": 1}, trace_id=trace_id):
            for w in words:
                chat_step("llm", [{"role": "user", "content": w}], temperature=0)
    finally:
        tracer.close()
    st = open_store(folder)
    try:
        export_to_file(st, [trace_id], folder / "trace.json")
    finally:
        st.close()
    return read_otlp_file(folder / "trace.json")


def _spans(docs: list[Any]) -> list[dict[str, Any]]:
    return [
        s for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
    ]


def _replayed_after_a_reimport(
    tmp_path: Path, reimport: Callable[[Path, str, str, list[Any]], None]
) -> Any:
    """The second of two cached replays of a trace imported with the steps first, alpha-1,
    alpha-2: before it, ``reimport(location, replay id, trace id, docs)`` deletes both and
    imports ``docs`` (steps first, beta-1, beta-2; the same id and root start and end)."""
    from rewind.tracing import Tracer, chat_step
    from rewind.tracing.otel.importer import import_otlp

    trace_id = "b" * 32
    first = ["first", "alpha-1", "alpha-2"]
    with stub_and_client(reply) as (_stub, client):
        one = _otlp_of(tmp_path / "one", client, first, trace_id)
        two = _otlp_of(tmp_path / "two", client, ["first", "beta-1", "beta-2"], trace_id)
        root = next(s for s in _spans(one) if not s.get("parentSpanId"))
        for s in _spans(two):
            if not s.get("parentSpanId"):  # the same start and end as the first import
                s["startTimeUnixNano"] = root["startTimeUnixNano"]
                s["endTimeUnixNano"] = root["endTimeUnixNano"]
        location = tmp_path / "store"

        def replay() -> Any:
            tracer = Tracer(
                location, chat_client=client, read_cache=True, raise_on_write_error=True
            )
            try:
                with tracer.trace("imported", {"q": 1}) as t:
                    for w in first:
                        chat_step("llm", [{"role": "user", "content": w}], temperature=0)
            finally:
                tracer.close()
            return t

        st = open_store(location)
        try:
            assert import_otlp(st, one).imported == [trace_id]
        finally:
            st.close()
        replayed = replay()
        assert replayed.parent_run_id == trace_id
        reimport(location, replayed.trace_id, trace_id, two)
        again = replay()
    assert again.parent_run_id == trace_id and again.write_error is None
    st = open_store(location)
    try:
        config = st.get_run(again.trace_id).config
    finally:
        st.close()
    assert config["reference"] == {"run": trace_id, "steps": 1, "all": False}  # "first" only
    return again


def test_a_trace_deleted_and_imported_again_with_other_steps_is_not_read_from_kept_rows(
    tmp_path: Path,
) -> None:
    """Was a strict xfail: tracer_source.source_rows kept a source's rows under (store, run id,
    created_at, finished_at), so a trace deleted and imported again under the same id with the
    same root times but other steps was read, in the same process, through the rows kept for
    the first import ('blob ... is missing from the store'). Every deletion of a run's rows
    now bumps ``meta.runs_epoch``, read with the run's times and part of the key."""
    from rewind.store.retention import delete_run
    from rewind.tracing.otel.importer import import_otlp

    def reimport(location: Path, replay_id: str, trace_id: str, docs: list[Any]) -> None:
        st = open_store(location)
        try:
            delete_run(st, replay_id)
            delete_run(st, trace_id)
            assert import_otlp(st, docs).imported == [trace_id]
        finally:
            st.close()

    _replayed_after_a_reimport(tmp_path, reimport)


def test_a_trace_another_process_deleted_and_imported_again_is_not_read_from_kept_rows(
    tmp_path: Path,
) -> None:
    """The same, the deletions and the import made by another process: the epoch is the
    store's, read with the run's times."""
    import os
    import subprocess
    import sys

    def reimport(location: Path, replay_id: str, trace_id: str, docs: list[Any]) -> None:
        (tmp_path / "two.json").write_text(json.dumps(docs))
        code = (
            "import json, sys; from rewind.store import open_store;"
            " from rewind.store.retention import delete_run;"
            " from rewind.tracing.otel.importer import import_otlp;"
            " st = open_store(sys.argv[1]); delete_run(st, sys.argv[2]);"
            " delete_run(st, sys.argv[3]);"
            " print(import_otlp(st, json.load(open(sys.argv[4]))).imported); st.close()"
        )
        args = [str(location), replay_id, trace_id, str(tmp_path / "two.json")]
        done = subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            env=dict(os.environ),
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == repr([trace_id])

    _replayed_after_a_reimport(tmp_path, reimport)


def test_an_unchanged_recorded_calls_replay_keeps_skipped_and_failed_steps_as_recorded(
    tmp_path: Path,
) -> None:
    """A trace without chain code is replayed as its recorded calls. A step the recording
    skipped, or that failed and was caught by the chain, was replayed as a success, so the
    unchanged replay's statuses, and the state hashes of every step after, were not the
    recording's (and it was stored in full from the skipped step on). They now keep their
    recorded status and error when the replay does not change them, and the replay is stored
    wholly by reference (a failed step refers to its source's state row, see
    test_replay_failed)."""
    from rewind.tracing import Tracer, chat_step, step
    from rewind.tracing.replay import replay_trace
    from rewind.tracing.store import load_trace

    def ask(q: str) -> str:
        return chat_step("llm", [{"role": "user", "content": q}], temperature=0).content

    with stub_and_client(reply) as (stub, client):
        tracer = Tracer(tmp_path, chat_client=client, raise_on_write_error=True)
        try:
            with tracer.trace("statuses", {"q": 1}) as t:
                ask("one")
                with step("maybe", "transform") as s:
                    s.skip("not needed")
                try:
                    with step("parse", "parse", input="x"):
                        raise ValueError("bad answer")
                except ValueError:
                    pass
                with step("check", "validate") as s:
                    s.fail("rejected", "Rejected")
                with step("noop", "transform"):
                    pass
                ask("two")
                t.set_output("done")
        finally:
            tracer.close()
        requests = stub.count
        st = open_store(tmp_path)
        try:
            replay = replay_trace(st, t.trace_id, chat_client=client)
            source = load_trace(st, t.trace_id).steps
            steps = load_trace(st, replay.run_id).steps
        finally:
            st.close()
    assert replay.config["replay_mode"] == "recorded-calls" and stub.count == requests

    def shown(s: Any) -> tuple[Any, ...]:
        return (s.name, s.status, s.error_type, s.error_message, s.output_hash, s.state_hash)

    assert [shown(s) for s in steps] == [shown(s) for s in source]
    statuses = ["success", "skipped", "failed", "failed", "success", "success"]
    assert [s.status for s in source] == statuses
    assert replay.config["reference"] == {"run": t.trace_id, "steps": 6, "all": True}


def test_gc_archives_a_run_whose_id_holds_path_separators_inside_its_archive_folder(
    tmp_path: Path,
) -> None:
    """A trace id is the caller's (``Tracer.trace(trace_id=...)``) and nothing checks its
    characters: ``rewind gc`` wrote the archive of a run named ``../../../escaped`` at
    ``archive/runs/../../../escaped.json.gz``, outside the archive folder (and outside the
    store's). The run id is now one path segment of the key (percent-quoted); restoring it
    reads it back whole."""
    from rewind.store.retention import collect_garbage

    location = tmp_path / "a" / "b" / "store"
    ids = ["../../../escaped", "x/y", "plain"]
    outputs = trace_under_ids(location, ids)
    before = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    st = open_store(location)
    try:
        report = collect_garbage(st, 0, now=4e9)
        assert sorted(a.run_id for a in report.archived) == sorted(ids)
        written = sorted(set(p for p in tmp_path.rglob("*") if p.is_file()) - set(before))
        archives = [p for p in written if p.name.endswith(".json.gz")]
        assert len(archives) == 3
        assert all(p.parent == location / "archive" / "runs" for p in archives), archives
        restore_whole(st, outputs)
    finally:
        st.close()


def trace_under_ids(location: Path, ids: list[str]) -> dict[str, Any]:
    """Record one traced agent run per id in ``ids`` at ``location``; returns id -> output."""
    from rewind.tracing import Tracer

    outputs: dict[str, Any] = {}
    with stub_and_client(reply) as (_stub, client):
        for trace_id in ids:
            tracer = Tracer(location, chat_client=client, raise_on_write_error=True)
            try:
                with tracer.trace("odd-ids", {"q": 1}, trace_id=trace_id) as t:
                    t.set_output(agent(2))
            finally:
                tracer.close()
            outputs[trace_id] = t.output
    return outputs


def restore_whole(st: Any, outputs: dict[str, Any]) -> None:
    """Restore each archived run of :func:`trace_under_ids` and check it is back whole."""
    from rewind.store.retention import restore_run
    from rewind.tracing.store import load_trace

    for trace_id, output in outputs.items():
        restore_run(st, trace_id)
        assert load_trace(st, trace_id, payloads=True).output == output
        assert len(load_trace(st, trace_id).steps) == 4


@pytest.mark.parametrize("trace_id", ["x" * 65, "ab" * 15 + "\x00", 12345, ""])
def test_a_trace_id_no_store_backend_keeps_is_refused_before_the_trace_runs(
    tmp_path: Path, trace_id: Any
) -> None:
    """SQLite stored a trace id of 100 characters or holding NUL, PostgreSQL refused it at the
    write (varchar(64); no NUL in text): the same trace was kept on one backend and lost, with
    a database error, on the other. It is now refused when the trace is made, before its
    chain runs, with a message that says what a trace id may be."""
    from rewind.tracing import Tracer

    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with pytest.raises(ValueError, match="a trace id is a string of 1 to 64"):
            tracer.trace("ids", {"q": 1}, trace_id=trace_id)
        with tracer.trace("ids", {"q": 1}, trace_id="x" * 64) as t:
            pass
    finally:
        tracer.close()
    assert t.record is not None and t.record.run_id == "x" * 64


def _child_traces(location: str, base_url: str, role: str, count: int) -> None:
    """In a child process: ``count`` traces of :func:`agent` through a Tracer of their own,
    cached (``role`` "replay", input ``{"n": 0}``) or recorded (``role`` "record", a name,
    inputs and a first question of their own); one JSON line per trace: its id, the chain's
    digest, its write error and how many steps the lane served."""
    from rewind.llm import ChatClient, Endpoint, RetryPolicy
    from rewind.tracing import Tracer

    client = ChatClient(
        Endpoint(base_url=base_url, api_key="none", model="stub-model"),
        retry=RetryPolicy(attempts=1),
    )
    try:
        for i in range(count):
            replaying = role == "replay"
            tracer = Tracer(location, chat_client=client, read_cache=replaying)
            try:
                # The recorder's traces have a name of their own: four newer traces of the
                # replays' name would hide their source (the xfail test below).
                name = "lane-agent" if replaying else "lane-agent-other"
                with tracer.trace(name, {"n": 0 if replaying else i + 1}) as t:
                    digest = agent(3, change_at=-1 if replaying else 0)
            finally:
                tracer.close()
            served = sum(1 for s in t.steps if s._proven is not None)
            line = {"id": t.trace_id, "digest": digest, "error": t.write_error, "served": served}
            print(json.dumps(line))
    finally:
        client.close()


def test_lane_replays_beside_a_recorder_process_and_deletes_store_what_they_return(
    tmp_path: Path,
) -> None:
    """Two processes replay one trace through the lane while a third records other traces
    and this one deletes the recorder's runs and runs gc: every replay is written,
    linked to the recording, with the recording's answers, and the store stays whole."""
    import os
    import sqlite3
    import subprocess
    import sys

    from rewind.store.retention import collect_garbage, delete_run
    from rewind.tracing import Tracer
    from rewind.tracing.store import load_trace

    with stub_and_client(reply) as (stub, client):
        tracer = Tracer(tmp_path, chat_client=client, raise_on_write_error=True)
        try:
            with tracer.trace("lane-agent", {"n": 0}) as recording:
                recorded = agent(3)
        finally:
            tracer.close()
        code = (
            "import sys; from tests.test_attack31 import _child_traces as c; "
            "c(*sys.argv[1:3], sys.argv[3], int(sys.argv[4]))"
        )
        children = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(tmp_path), stub.base_url, role, "12"],
                stdout=subprocess.PIPE,
                text=True,
                env=dict(os.environ),
                cwd=Path(__file__).resolve().parents[1],  # where `tests` imports from
            )
            for role in ("replay", "replay", "record")
        ]
        deleted: set[str] = set()
        while any(c.poll() is None for c in children):
            st = open_store(tmp_path)
            try:
                with st.read() as conn:
                    rows = conn.exec_driver_sql(
                        "SELECT run_id FROM runs WHERE run_id != ? AND parent_run_id IS NULL",
                        (recording.trace_id,),
                    ).all()
                for (run_id,) in rows[:2]:
                    with contextlib.suppress(RewindError):  # a replay of it exists meanwhile
                        delete_run(st, run_id)
                        deleted.add(run_id)
                collect_garbage(st, 3600.0)
            finally:
                st.close()
        outs = [c.communicate()[0] for c in children]
        assert all(c.returncode == 0 for c in children)
    lines = [json.loads(line) for out in outs[:2] for line in out.splitlines()]
    assert len(lines) == 24 and all(line["error"] is None for line in lines)
    assert all(line["digest"] == recorded for line in lines)
    assert max(line["served"] for line in lines) == 6  # the lane served whole replays
    st = open_store(tmp_path)
    try:
        expected = [s.output for s in load_trace(st, recording.trace_id, payloads=True).steps]
        for line in lines:
            row = st.get_run(line["id"])
            assert row.parent_run_id == recording.trace_id
            steps = load_trace(st, line["id"], payloads=True).steps
            assert [s.output for s in steps] == expected
    finally:
        st.close()
    assert deleted
    with contextlib.closing(sqlite3.connect(tmp_path / "rewind.db")) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_a_cached_replay_finds_its_source_behind_newer_traces_of_the_same_name(
    store_target: Any,
) -> None:
    """Was a strict xfail: find_source tried only the 4 newest completed traces of the name
    (tracer_source.CANDIDATES), so behind four newer traces with other first requests (other
    inputs of a busy chain) an unchanged cached replay found no source and was stored unlinked
    and in full. The first call's cache entry now leads to the recording (tracer_source
    ._recorders): linked, stored wholly by reference, 0 requests (SQLite, PostgreSQL)."""
    location = store_target.location
    with stub_and_client(reply) as (stub, client):
        recording, recorded = run(location, client, lambda: agent(3), read_cache=False)
        for i in range(4):  # the same chain asked other first questions
            run(location, client, lambda i=i: agent(3, change_at=0) + str(i), read_cache=False)
        requests = stub.count
        replay, digest = run(location, client, lambda: agent(3))
    assert digest == recorded and stub.count == requests
    assert replay.parent_run_id == recording.trace_id
    st = open_store(location)
    try:
        config = st.get_run(replay.trace_id).config
    finally:
        st.close()
    assert config["reference"] == {"run": recording.trace_id, "steps": 6, "all": True}


def test_a_trace_of_an_imported_name_finds_the_import_behind_newer_traces(
    tmp_path: Path,
) -> None:
    """An imported trace's answers carry it as their ``origin``: behind four newer traces of
    its name, find_source reaches it through the entry of its call (as it does when it is
    among the newest); no other run's rows are read for it."""
    from rewind.tracing import Tracer, chat_step, tracer_source
    from rewind.tracing.otel.importer import import_otlp

    trace_id = "c" * 32
    location = tmp_path / "store"
    with stub_and_client(reply) as (_stub, client):
        docs = _otlp_of(tmp_path / "one", client, ["first", "second"], trace_id)
        st = open_store(location)
        try:
            assert import_otlp(st, docs).imported == [trace_id]
        finally:
            st.close()
        tracer = Tracer(location, chat_client=client, raise_on_write_error=True)
        try:
            for i in range(4):
                with tracer.trace("imported", {"q": i}):
                    chat_step("llm", [{"role": "user", "content": f"other {i}"}], temperature=0)
        finally:
            tracer.close()
    st = open_store(location)
    try:
        with st.read() as conn:
            key = conn.exec_driver_sql(
                "SELECT lower(hex(key)) FROM calls WHERE run_id = ? AND position = 0", (trace_id,)
            ).scalar_one()
        found = tracer_source.find_source(st, "imported", "llm", key)
    finally:
        st.close()
    assert found is not None and found.rows.run_id == trace_id
