"""Attacks on issue #13's hot-path speed changes (session 15's branches rfix, lineage, stepc,
burrrec, burrrep). Each test is a regression guard; those named "was a bug" below failed on a
branch before it was fixed or left out.

Were bugs:
- rfix (not merged for these reasons): a store "closed" by a process kept its connections and up
  to 64 KB of WAL until exit. A reader that cannot see the WAL (no write access to the folder:
  ``immutable=1``) missed closed traces; a store file restored in place (``cp``) was read stale
  and corrupted; one restored by rename was read through the old WAL and destroyed.
- lineage: an imported trace's answers (``origin`` set: "never another run") served any cached
  chain that shares the trace's name, through ``lineage_at`` (fixed: only entries recorded here).
- burrrec (its progress change was reverted): a child forked while the progress thread wrote a
  mark hung in ``Store.close``; a cancel asked between a run's row and its first node was
  ignored.
- burrrep: the same for a fork (fixed: the fork's first node start reads the cancel flag).

Held: ``canonical.loads`` vs ``json.loads`` on generated number texts and documents;
``llm.plain_request_key`` vs ``llm_request_key``; a forked child writing through an inherited
Store object; a fork cancelled through another Store object.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from burr.core import State, action, default
from burr.core.graph import GraphBuilder
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from rewind import progress
from rewind.canonical import loads
from rewind.llm import ChatClient, Endpoint, RetryPolicy, llm_request_key, plain_request_key
from rewind.replay import Pipeline, Rewind
from rewind.store import open_store
from rewind.tracing import Tracer, step
from rewind.tracing.otel import import_otlp, read_otlp_file
from rewind.tracing.store import load_trace
from tests.model_stub import STUB_MODEL, ModelStub
from tests.test_tracing_import_replay import DATA, REPLAYABLE, fixture_chain

ROOT = Path(__file__).resolve().parent.parent


@step("att15_add", "tool_call")
def _add(a: int, b: int) -> int:
    return a + b


def _small_traces(folder: Path, n: int) -> list[str]:
    """``n`` small traces, each through its own Tracer closed at the end (a notebook's or a
    server's life: nothing of the store is open afterwards, as far as the user can tell)."""
    ids = []
    for i in range(n):
        tracer = Tracer(folder, raise_on_write_error=True)
        try:
            with tracer.trace(f"att15-agent-{i}") as t:
                _add(i, 1)
            ids.append(t.trace_id)
        finally:
            tracer.close()
    return ids


# -- 1. connections kept per process --------------------------------------------------------


def test_a_reader_without_write_access_sees_every_trace_a_live_process_closed(
    tmp_path: Path,
) -> None:
    """Was a bug (rfix 9c4beb7/5a714ce). A long-lived process (notebook, ``rewind serve``) records
    three small traces, closing each Tracer. Another user, who may read the folder but not write
    it, lists the runs: ``sqlite_read_only_engine`` opens the file ``immutable=1`` (it cannot
    create the ``-shm``), which ignores the WAL. On main every close folded the WAL into the
    file, so the reader saw 3 runs; now a close folds only from 64 KB, so the reader sees only
    what was folded (the first trace, folded with the new schema) until the writer exits.
    Expected: 3 runs. Actual: 1."""
    folder = tmp_path / "store"
    ids = _small_traces(folder, 3)
    # The reader is another process without write permission on the folder (simulated: the
    # tests run as root, so os.access is patched in the reader to say what it would for them).
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT / "src")!r})
        from rewind.store import engine as engines, open_store
        real = os.access
        engines.os.access = lambda p, m, **k: False if m == os.W_OK else real(p, m, **k)
        store = open_store({str(folder)!r}, read_only=True)
        print(sorted(r.run_id for r in store.list_runs(limit=100)))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1].replace("'", '"'))
    assert sorted(ids) == seen


def test_a_store_file_restored_in_place_after_close_reads_as_restored(tmp_path: Path) -> None:
    """Was a bug (rfix 9c4beb7). A user restores a backup of a store over its file in place
    (``cp backup/rewind.db .rewind/rewind.db``: same inode) while a process that closed every
    store still runs. On main that was safe (close closed the connections: WAL folded and
    deleted). Now the process's kept connections still hold the old file's WAL and ``-shm``:
    the next store it opens reads the OLD rows (same (st_dev, st_ino), so the pool reuses them),
    and the old WAL frames are replayed over the restored pages — a fresh connection then finds
    the file malformed. Expected: the restored value, an intact file. Actual: the old value,
    "database disk image is malformed"."""
    backup = tmp_path / "backup"
    store = open_store(backup)
    with store.write() as conn:
        conn.execute(text("INSERT INTO meta(key, value) VALUES ('att15', 'backup')"))
    store.close()
    store.engine.dispose()
    with sqlite3.connect(backup / "rewind.db") as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    live = tmp_path / "live"
    open_store(live).close()  # a new store (its schema folded at close)
    store = open_store(live)
    with store.write() as conn:  # a small write: left in the WAL by close
        conn.execute(text("INSERT INTO meta(key, value) VALUES ('att15', 'old')"))
    store.close()

    shutil.copyfile(backup / "rewind.db", live / "rewind.db")  # in place: same inode

    store = open_store(live)
    try:
        with store.read() as conn:
            value = conn.execute(text("SELECT value FROM meta WHERE key = 'att15'")).scalar()
    finally:
        store.close()
    assert value == "backup"
    with sqlite3.connect(f"file:{live / 'rewind.db'}?mode=ro", uri=True) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_store_file_replaced_by_rename_after_close_opens_as_the_new_file(tmp_path: Path) -> None:
    """Was a bug (rfix 9c4beb7). The pool claims to notice a replaced file by ``(st_dev, st_ino)``
    and reopen. A user restores a backup atomically (``cp backup.db x.tmp && mv x.tmp
    .rewind/rewind.db``: a new inode) while a process that closed every store still runs: the
    new inode is noticed, but the old connections' WAL (a small write left unfolded by close)
    still lies at ``rewind.db-wal`` beside the new file, and its frames are read as the new
    file's pages. On main close had folded and deleted it: the restored store opened intact.
    Now ``open_store`` raises StoreError "database disk image is malformed", and once the
    process exits the restored file itself stays malformed (the stale frames were checkpointed
    into it): the backup is destroyed."""
    backup = tmp_path / "backup"
    store = open_store(backup)
    with store.write() as conn:
        conn.execute(text("INSERT INTO meta(key, value) VALUES ('att15', 'backup')"))
    store.close()
    store.engine.dispose()
    with sqlite3.connect(backup / "rewind.db") as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    live = tmp_path / "live"
    open_store(live).close()
    store = open_store(live)
    with store.write() as conn:  # a small write: left in the WAL by close
        conn.execute(text("INSERT INTO meta(key, value) VALUES ('att15', 'old')"))
    store.close()

    shutil.copyfile(backup / "rewind.db", tmp_path / "restore.tmp")
    os.replace(tmp_path / "restore.tmp", live / "rewind.db")  # a new inode at the path

    store = open_store(live)
    try:
        with store.read() as conn:
            value = conn.execute(text("SELECT value FROM meta WHERE key = 'att15'")).scalar()
            check = conn.exec_driver_sql("PRAGMA integrity_check").scalar()
    finally:
        store.close()
    assert (value, check) == ("backup", "ok")


# -- 2. lineage-first cached traces ----------------------------------------------------------


def test_an_imported_trace_never_serves_a_live_chain_that_shares_its_name(tmp_path: Path) -> None:
    """Was a bug (lineage 1f166a7). A trace file is data from elsewhere: the answers its import
    seeds
    carry the trace as their ``origin`` and serve that trace's replays only — "a crafted file
    must not plant answers for requests others will send" (cache._lookup). But a
    ``Tracer(read_cache=True)`` chain whose name is the imported trace's name (here "qa", a
    name anyone may use) picks the imported trace as its source (find_source: the newest
    completed trace of the name holding the key), and ``lineage_at`` now serves the source's
    calls before the origin check. On main the chain sent its 2 requests live; now both are
    served from the planted answers (0 requests, outcome hit)."""
    store = open_store(tmp_path / "store")
    try:
        result = import_otlp(store, read_otlp_file(DATA / REPLAYABLE[0]))
        (tid,) = result.imported
        name = store.get_run(tid).pipeline
        with (
            ModelStub() as stub,
            ChatClient(
                Endpoint(base_url=stub.base_url, model=STUB_MODEL), retry=RetryPolicy(attempts=1)
            ) as client,
        ):
            tracer = Tracer(read_cache=True)
            tracer.configure(store=store, chat_client=client)
            tracer.chain(name)(fixture_chain)("Which month is the wettest in Seattle?")
            (run,) = [r for r in store.list_runs() if r.run_id != tid]
            outcomes = [c.outcome for s in load_trace(store, run.run_id).steps for c in s.calls]
            assert (len(stub.requests), outcomes) == (2, ["miss", "miss"])
    finally:
        store.close()


# -- 3. cached-hit fast paths (held) -------------------------------------------------------

_NUMBER_TEXT = st.from_regex(
    r"\A-?(0|[1-9][0-9]{0,20})(\.[0-9]{1,20})?([eE][+-]?[0-9]{1,4})?\Z", fullmatch=True
)


@settings(max_examples=500, deadline=None)
@given(_NUMBER_TEXT)
def test_loads_reads_every_number_text_as_json_does(number: str) -> None:
    """orjson vs json on number literals: 18/19-digit ints, -0, subnormals, 1e-400, 1e400."""
    data = f'[{number}, {{"{number}": {number}}}]'.encode()
    got, want = loads(data), json.loads(data)
    assert repr(got) == repr(want) and type(got[0]) is type(want[0])


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=16,
)


@settings(max_examples=300, deadline=None)
@given(_JSON_VALUES)
def test_loads_agrees_with_json_on_escaped_and_raw_utf8_documents(value: object) -> None:
    """Documents with NaN/Infinity, lone surrogates (escaped: orjson refuses, json reads; raw:
    neither reads), non-ASCII text and duplicate-free nesting read as json reads them."""
    for data in (
        json.dumps(value).encode(),
        json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"),
    ):
        try:
            want: object = repr(json.loads(data))
        except ValueError as exc:
            want = type(exc)
        try:
            got: object = repr(loads(data))
        except ValueError as exc:
            got = type(exc)
        assert got == want


def test_loads_keeps_the_last_of_duplicate_keys_as_json_does() -> None:
    data = b'{"a": 1, "b": {"x": -0, "x": -0.0}, "a": [1e-400, 2]}'
    assert repr(loads(data)) == repr(json.loads(data))


@pytest.mark.parametrize(
    "value",
    [0, 1, -1, 2, 10**15, 10**15 + 1, 9007199254740993, 2**62, -(2**62), True, False],
)
@pytest.mark.parametrize("model", [None, "modèle", "a\u2028b", "x\ud800", "m\x00"])
def test_plain_request_key_equals_the_general_key_for_int_sampling_params(
    value: int, model: str | None
) -> None:
    """Ints (and bools) in the sampling parameters become floats (or stay bools) by
    normalizing; default model names with non-ASCII, separators, NUL or a lone surrogate."""
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": value,
        "top_p": value,
        "presence_penalty": value,
        "frequency_penalty": value,
        **({"model": model} if model is None else {}),
    }
    default = model if model is not None else "m"
    if model is None:
        body["model"] = "named"

    def key(fn: object) -> object:
        try:
            return fn(body, default_model=default)  # type: ignore[operator]
        except Exception as exc:  # the general path's error must be the fast path's
            return type(exc)

    assert key(plain_request_key) == key(llm_request_key)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_writing_through_an_inherited_store_object_leaves_the_parent_intact(
    tmp_path: Path,
) -> None:
    """A Store object opened in the parent (pooled connections) used by a forked child: the
    child opens its own connections (the at-fork hook); the parent's still work afterwards and
    the file stays intact."""
    folder = tmp_path / "store"
    _small_traces(folder, 1)
    store = open_store(folder)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                with store.write() as conn:
                    conn.execute(text("INSERT INTO meta(key, value) VALUES ('att15', 'child')"))
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with store.read() as conn:
            assert conn.execute(text("SELECT value FROM meta WHERE key='att15'")).scalar() == (
                "child"
            )
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        _small_traces(folder, 1)
    finally:
        store.close()


# -- 4. progress marks written by the progress thread ----------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_during_a_progress_write_can_close_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a bug (burrrec 6cbbfce), and is one on main too: a process forked while another
    thread is inside a progress write, or while the progress thread polls the cancel flags
    under its lock, copied that lock held; the child's ``store.close()`` (or its first node
    start) then waited forever. Here a write is held open in another thread (``progress._write``
    patched to wait) while the test forks; the child's ``store.close()`` must return within the
    alarm's 120 s (fixed: the child gets new locks, ``os.register_at_fork``)."""
    store = open_store(tmp_path / "store")
    entered, release = threading.Event(), threading.Event()

    def held_write(*_args: object) -> None:
        entered.set()
        release.wait(300)

    monkeypatch.setattr(progress, "_write", held_write)
    try:
        # The mark's write is held open in another thread (whichever thread writes it).
        writer = threading.Thread(
            target=progress.node_started, args=(store, "att15-run", 0, "first"), daemon=True
        )
        writer.start()
        assert entered.wait(120)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            signal.alarm(120)
            store.close()
            os._exit(0)
        release.set()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        writer.join(10)
    finally:
        release.set()
        progress.run_ended("att15-run")
        store.close()


# -- 5. fork progress without hooks ------------------------------------------------------------

_GATE_ENTERED = threading.Event()
_GATE_OPEN = threading.Event()
_GATE_ARMED = threading.Event()


@action(reads=["x"], writes=["x"])
def _att15_one(state: State) -> State:
    return state.update(x=state["x"] + 1)


@action(reads=["x"], writes=["x"])
def _att15_gate(state: State) -> State:
    if _GATE_ARMED.is_set():  # the fork's run of it (the recording passes straight through)
        _GATE_ENTERED.set()
        _GATE_OPEN.wait(60)
    return state.update(x=state["x"] + 1)


@action(reads=["x"], writes=["x"])
def _att15_last(state: State) -> State:
    return state.update(x=state["x"] * 10)


GATED = Pipeline(
    name="att15-gated",
    graph=GraphBuilder()
    .with_actions(one=_att15_one, gate=_att15_gate, last=_att15_last)
    .with_transitions(("one", "gate", default), ("gate", "last", default))
    .build(),
    entrypoint="one",
    ref="tests.test_attack15:GATED",
)


def test_a_fork_cancelled_through_another_store_object_stops_before_its_next_node(
    tmp_path: Path,
) -> None:
    """A fork runs (its run row counts as the first progress write, burrrep eff4c6f); a server
    holding its own Store object on the same file (not the fork's: the in-process shortcut of
    request_cancel does not apply) cancels it while its second node runs: the fork must end
    cancelled before its third node, its live node shown meanwhile."""
    folder = tmp_path / "store"
    rw = Rewind(folder)
    other = open_store(folder)
    try:
        parent = rw.record(GATED, {"x": 0})
        result: dict[str, Any] = {}
        worker = threading.Thread(
            target=lambda: result.update(run=rw.fork(parent.run_id, at=1, override=None))
        )
        _GATE_ENTERED.clear()
        _GATE_OPEN.clear()
        _GATE_ARMED.set()
        worker.start()
        try:
            assert _GATE_ENTERED.wait(60)
            fork_id = next(r.run_id for r in other.list_runs() if r.run_id != parent.run_id)
            assert progress.request_cancel(other, fork_id, "server")
            # Until the progress thread's poll has seen it (no fixed sleep: CI may be loaded).
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                with progress._WRITER.lock:
                    marks = progress._WRITER.runs.get(fork_id)
                    if marks is None or marks.cancel is not None:
                        break
                time.sleep(0.01)
        finally:
            _GATE_OPEN.set()
            _GATE_ARMED.clear()
            worker.join(60)
        run = result["run"]
        assert run.status == progress.CANCELLED
        assert [n.name for n in rw.store.nodes_of(run.run_id)] == ["one", "gate"]
    finally:
        other.close()
        rw.store.close()


def test_a_cancel_asked_before_a_runs_first_node_stops_it_before_that_node(
    tmp_path: Path,
) -> None:
    """Was a bug (burrrec 6cbbfce; forks likewise since burrrep eff4c6f). A server (its own Store
    object) cancels a run just after its row was written ``running`` — ``rewind cancel`` then
    says it "stops before its next node". On main the first node start wrote its mark in the
    run's thread and read the flag in the same transaction: the run ended ``cancelled`` before
    node 1, nothing executed. Now the first mark is handed to the progress thread and the
    start returns no cancel; a run shorter than the thread's write (here ~3 cheap nodes) runs
    to the end and ends ``completed``, the cancel ignored."""
    from tests import pipelines

    folder = tmp_path / "store"
    rw = Rewind(folder)
    other = open_store(folder)
    asked: list[bool] = []

    def on_event(event: str, payload: dict[str, Any]) -> None:
        if event == "run_started":
            asked.append(progress.request_cancel(other, payload["run_id"], "server"))

    try:
        rw.on_event = on_event
        run = rw.record(pipelines.pipeline, {"x": 5})
        assert asked == [True]
        assert (run.status, rw.store.nodes_of(run.run_id)) == (progress.CANCELLED, [])
    finally:
        other.close()
        rw.store.close()


def test_a_cancel_asked_before_a_forks_first_node_stops_it_before_that_node(
    tmp_path: Path,
) -> None:
    """Was a bug (burrrep eff4c6f: the fork's run row counts as its first progress write, so its
    first node starts without reading the flag). As above for a fork (an unchanged replay of a
    3-node run): main ended it ``cancelled`` before node 1; now it completes."""
    from tests import pipelines

    folder = tmp_path / "store"
    rw = Rewind(folder)
    other = open_store(folder)
    try:
        parent = rw.record(pipelines.pipeline, {"x": 5})
        asked: list[bool] = []

        def on_event(event: str, payload: dict[str, Any]) -> None:
            if event == "run_started":
                asked.append(progress.request_cancel(other, payload["run_id"], "server"))

        rw.on_event = on_event
        fork = rw.replay(parent.run_id, at=1)
        assert asked == [True]
        assert (fork.status, rw.store.nodes_of(fork.run_id)) == (progress.CANCELLED, [])
    finally:
        other.close()
        rw.store.close()
