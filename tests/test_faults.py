"""Fault windows: processes killed while recording (forked workers, kill -9 at random moments).

None of these tests asserts on elapsed time. The kill -9 trials compare ages computed from the
timestamps the killed child reported with the documented flush bound; a loaded machine makes them
slower, not different.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from burr.core import State, action, default
from burr.core.graph import GraphBuilder

from rewind.canonical import sha256_hex
from rewind.errors import ForkError, RunBusy, StoreError
from rewind.recorder import FLUSH_INTERVAL_MS
from rewind.replay import Pipeline, Rewind
from rewind.store import open_store
from rewind.store.store import WriteBatch, current_owner, owner_is_gone
from tests import forked, kill_child, pipelines
from tests.conftest import orphan_run, row_counts

REPO = Path(__file__).resolve().parents[1]

# -- owners: which process is executing a run ----------------------------------------------------


@pytest.fixture
def exited_child() -> Iterator[subprocess.Popen[bytes]]:
    """A child process that has exited but is not yet waited for (a zombie)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, left un-reaped
    yield proc
    proc.wait()


def test_the_owner_is_this_process_taken_when_asked() -> None:
    host, pid, started = current_owner().split(":")
    assert (host, int(pid)) == (socket.gethostname(), os.getpid())
    assert abs(float(started) - psutil.Process().create_time()) < 0.01
    assert owner_is_gone(current_owner()) is False


def test_an_owner_is_gone_when_its_pid_is_a_zombie_dead_or_reused(
    exited_child: subprocess.Popen[bytes],
) -> None:
    host = socket.gethostname()
    assert psutil.Process(exited_child.pid).status() == psutil.STATUS_ZOMBIE
    # kill(pid, 0) still succeeds for a zombie: the old liveness check called it alive.
    os.kill(exited_child.pid, 0)
    assert owner_is_gone(f"{host}:{exited_child.pid}") is True
    me = psutil.Process()
    assert owner_is_gone(f"{host}:{me.pid}:{me.create_time() - 3600:.2f}") is True  # reused pid
    assert owner_is_gone(f"{host}:{me.pid}") is False  # an owner written before start times


def test_an_owner_of_another_host_or_unreadable_is_never_gone() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert owner_is_gone(f"{socket.gethostname()}:{dead.pid}") is True
    assert owner_is_gone(f"another-host.example:{dead.pid}") is False
    for garbage in ("", "host-only", f"{socket.gethostname()}:pid", ":::"):
        assert owner_is_gone(garbage) is False


# -- a forked worker killed mid-run --------------------------------------------------------------


@action(reads=["total"], writes=["held"])
def stuck(state: State, store: str) -> State:
    """In a forked worker: waits until the previous node is committed (the flusher does that
    while this node runs), says so, then never finishes (the test kills the worker here). In the
    test's own process (a fork of the killed run) it finishes at once."""
    if os.getpid() == _TEST_PID:
        return state.update(held=state["total"])
    db = sqlite3.connect(Path(store) / "rewind.db")
    while db.execute("SELECT COUNT(*) FROM nodes WHERE name = 'prepare'").fetchone()[0] == 0:
        time.sleep(0.01)
    db.close()
    _ENTERED.set()
    time.sleep(3600)
    return state.update(held=state["total"])


_ENTERED = multiprocessing.get_context("fork").Event()
_TEST_PID = os.getpid()


def wait_for_worker(pid: int, child_error: Path) -> None:
    """Until the forked worker reaches its 2nd node; fails at once, with the worker's traceback,
    when it exits first (not reaped: the caller still waits for it)."""
    for _ in range(300):
        if _ENTERED.wait(1):
            return
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            error = child_error.read_text() if child_error.exists() else "(no exception)"
            pytest.fail(f"the worker exited before its 2nd node:\n{error}")
    pytest.fail("the worker never reached its 2nd node (300 s)")


def killed_worker_pipeline(store: Path) -> Pipeline:
    graph = (
        GraphBuilder()
        .with_actions(prepare=pipelines.prepare, stuck=stuck.bind(store=str(store)))
        .with_transitions(("prepare", "stuck", default))
        .build()
    )
    return Pipeline(name="killed-worker", graph=graph, entrypoint="prepare")


@pytest.mark.parametrize("reaped_by", ["opening the store", "the next fork"])
def test_a_forked_worker_killed_mid_run_is_reaped_and_its_fork_says_where_it_stopped(
    tmp_path: Path, reaped_by: str
) -> None:
    root = tmp_path / "store"
    rw = Rewind(root)  # opened before the fork, like a prefork server's parent
    rw.record(pipelines.pipeline, {"x": 1})  # its pool now holds a connection the child inherits
    pipeline = killed_worker_pipeline(root)
    rw.register(pipeline)
    _ENTERED.clear()
    # A bare os.fork (Rewind's os.register_at_fork hooks run, as in any prefork server), not
    # multiprocessing's: its after-fork hooks also run other libraries' cleanups, and kombu's
    # (left registered by the Celery tests that ran earlier in this pytest worker) closes an
    # inherited Redis channel by reading a reply that never comes — the child hung there.
    child_error = tmp_path / "worker-error.txt"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the worker
        try:
            rw.record(pipeline, {"x": 2}, run_id="worker-run")
        except BaseException:  # told to the parent, which would otherwise wait for _ENTERED
            child_error.write_text(traceback.format_exc())
        finally:
            os._exit(0)
    try:
        wait_for_worker(pid, child_error)
        assert rw.store.get_run("worker-run").status == "running"
        with pytest.raises(RunBusy, match="still running"):
            rw.fork("worker-run", at=1)  # the worker is alive: nothing to reap
        os.kill(pid, signal.SIGKILL)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        # Dead but not yet waited for, while this (its parent) process lives on.
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE

        session = Rewind(root) if reaped_by == "opening the store" else rw
        session.register(pipeline)
        with pytest.raises(ForkError) as err:
            session.fork("worker-run", at="stuck")
        run = session.store.get_run("worker-run")
        assert run.status == "interrupted" and "process ended" in (run.error or "")
        assert err.value.message == (
            "run worker-run interrupted at node 'prepare' (#1) before reaching 'stuck'"
        )
        assert "fork at a node it reached: 1:prepare" in err.value.hint
        assert session.fork("worker-run", at="prepare").status == "completed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert [r.status for r in rw.store.list_runs()].count("running") == 0
    with sqlite3.connect(root / "rewind.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_fork_of_a_run_killed_before_its_first_node_says_so(tmp_path: Path) -> None:
    orphan_run(tmp_path, "orphan01")
    rw = Rewind(tmp_path)
    before = row_counts(rw.store)
    for at in (1, "prepare"):
        with pytest.raises(ForkError, match="interrupted before its first node"):
            rw.fork("orphan01", at=at)
    assert row_counts(rw.store) == before


# -- the flusher thread ----------------------------------------------------------------------------


def flusher_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rewind-flusher"]


def test_a_failing_commit_fails_the_run(rw: Rewind, monkeypatch: pytest.MonkeyPatch) -> None:
    def disk_full(batch: WriteBatch, **_: object) -> None:
        raise StoreError("disk full", "free some space")

    monkeypatch.setattr(rw.store, "write_batch", disk_full)
    run = rw.record(pipelines.pipeline, {"x": 1})
    assert run.status == "failed"
    assert run.error == "writing recorded nodes failed: StoreError: disk full"
    monkeypatch.undo()
    run = rw.record(pipelines.pipeline, {"x": 1})
    assert run.status == "completed" and len(rw.store.nodes_of(run.run_id)) == 3


def test_one_flusher_thread_serves_every_run(rw: Rewind) -> None:
    assert rw.record(pipelines.pipeline, {"x": 0}).status == "completed"
    threads = flusher_threads()  # its quick nodes waited for a deadline flush
    assert len(threads) == 1
    for x in range(1, 6):
        assert rw.record(pipelines.pipeline, {"x": x}).status == "completed"
    assert flusher_threads() == threads  # no thread per run (its start-up would cost every run)


# -- kill -9 at random moments: committed within the flush bound ---------------------------------

TRIALS = 10
"""Kill moments, stratified: trial ``i`` kills at a random moment of the ``i``-th tenth of the
run's span, so every stretch of the run (start, the quick nodes and their commits, each part of
the slow node, the end) is hit in every session, which 20 independent uniform draws did not
promise (they cost ~0.7 s of sleeping each); about half the trials land past the flush bound
inside the slow node, where they check the nodes before it."""
SCHEDULING_ALLOWANCE_MS = 450.0
"""Allowance for the flusher thread to get the CPU and for the SQLite commit to run on a loaded
machine; the bound checked is ``FLUSH_INTERVAL_MS`` plus this (README: "How it works" → Record)."""
BOUND_MS = FLUSH_INTERVAL_MS + SCHEDULING_ALLOWANCE_MS


@dataclass
class ChildReport:
    """What a killed child reported through its pipe (unix seconds)."""

    run_id: str | None = None
    started: float | None = None
    nodes: dict[int, float] = field(default_factory=dict)
    commit_started: dict[tuple[int, ...], float] = field(default_factory=dict)
    committed: set[int] = field(default_factory=set)
    status: str | None = None

    def read(self, text: str) -> None:
        for line in text.splitlines():
            kind, *rest = line.split()
            if kind == "run":
                self.run_id, self.started = rest[0], float(rest[1])
            elif kind == "node":
                self.nodes[int(rest[0])] = float(rest[1])
            elif kind in ("commit-start", "commit-end") and rest[1] != "-":
                positions = tuple(int(p) for p in rest[1].split(","))
                if kind == "commit-start":
                    self.commit_started[positions] = float(rest[0])
                else:
                    self.committed.update(positions)
            elif kind == "done":
                self.status = rest[0]

    def in_commit_under_way(self, position: int) -> bool:
        """The node was in a commit that had started but not ended when the child died."""
        return any(position in ps and position not in self.committed for ps in self.commit_started)


def read_until_started(fd: int, report: ChildReport) -> str:
    """Read the child's pipe until it reports the run started (or closes the pipe)."""
    text = ""
    while report.run_id is None:
        chunk = os.read(fd, 65536).decode()
        if not chunk:
            break
        text += chunk
        if "\n" in chunk:
            report.read(text[: text.rindex("\n") + 1])
    return text


def read_to_end(fd: int) -> str:
    parts = []
    while chunk := os.read(fd, 65536):
        parts.append(chunk.decode())
    return "".join(parts)


def run_killed_child(store: Path, seed: int, kill_after_s: float) -> tuple[ChildReport, float]:
    """Fork a child that runs :func:`tests.kill_child.main`; SIGKILL it ``kill_after_s`` after
    its run started.

    A fork of this process (:func:`tests.forked.start`), not a fresh interpreter: Python, Burr
    and Rewind are already imported, so a trial does not spend ~1.3 s of CPU starting one, and
    the child is a process of its own that the kill ends just the same. Its stdin and stdout
    (pytest-xdist's channel to a worker) are /dev/null; it reports through the pipe only and
    leaves by ``os._exit``.

    Returns the report and the kill time (unix s, taken just before the signal is sent, so ages
    computed from it are never larger than the true ones).
    """
    pid, read_fd = forked.start(lambda write_fd: kill_child.main(str(store), write_fd, seed))
    report = ChildReport()
    try:
        head = read_until_started(read_fd, report)
        time.sleep(kill_after_s)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pid = 0
        report = ChildReport()
        report.read(head + read_to_end(read_fd))
    finally:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(read_fd)
    return report, killed_at


def test_kill_9_at_random_moments_loses_no_node_older_than_the_flush_bound(
    tmp_path: Path,
) -> None:
    rng = random.Random(8)
    old_nodes_checked = 0
    lost_old: list[str] = []
    for trial in range(TRIALS):
        store = tmp_path / f"trial-{trial}"
        span_s = kill_child.SLOW_NODE_S + kill_child.NODES * kill_child.SHORT_NODE_MAX_S
        kill_after_s = span_s * (trial + rng.random()) / TRIALS
        report, killed_at = run_killed_child(store, trial, kill_after_s)
        assert report.run_id is not None, f"trial {trial}: the child never started its run"

        st = open_store(store)
        try:
            with st.read() as conn:
                assert conn.exec_driver_sql("PRAGMA integrity_check").scalar_one() == "ok"
            Rewind(st)  # reaps the killed child's run
            for run in st.list_runs():
                st.nodes_of(run.run_id)  # every run stays readable
            run = st.get_run(report.run_id)
            nodes = st.nodes_of(run.run_id)
            stored = {n.position for n in nodes}
            # every committed node's documents read back (packed with it, SQLite)
            named = {h for n in nodes for h in (n.input_hash, n.output_hash) if h}
            assert all(sha256_hex(d) == h for h, d in st.get_blobs(named).items())
        finally:
            st.close()
        if report.status is None:
            # Killed before its ``done`` line: interrupted, unless the kill landed after the
            # run's last commit (every node stored, status completed) and before that line.
            finished = run.status == "completed" and len(stored) == kill_child.NODES
            assert run.status == "interrupted" or finished, f"trial {trial}: {run.status}"
        else:
            assert run.status == report.status == "completed"
        assert report.committed <= stored, f"trial {trial}: a committed node is missing"
        for position, finished_at in report.nodes.items():
            age_ms = (killed_at - finished_at) * 1000
            if age_ms <= BOUND_MS or report.in_commit_under_way(position):
                continue
            old_nodes_checked += 1
            if position not in stored:
                lost_old.append(f"trial {trial}: node {position} finished {age_ms:.0f} ms before")
    assert lost_old == [], f"nodes older than {BOUND_MS:.0f} ms lost: {lost_old}"
    assert old_nodes_checked > 0  # the trials did kill runs with nodes older than the bound


# -- a running node's mark never runs ahead of the rows before it -----------------------------


def test_a_node_shown_running_has_every_earlier_node_stored(
    rw: Rewind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flusher thread never comes (as on a loaded machine): the progress thread's mark of
    node 2 must still not be seen before node 1's rows (the API would show node 1 pending while
    node 2 runs). The mark's writer commits the run's earlier rows first."""
    from rewind.recorder import Recorder

    monkeypatch.setattr("rewind.recorder._FLUSHER.schedule", lambda due, recorder: None)
    defaults = dict(Recorder.__init__.__kwdefaults__ or {}, flush_interval_ms=1e9)
    monkeypatch.setattr(Recorder.__init__, "__kwdefaults__", defaults)  # no commit in the hook
    pipelines.BLOCK_ENTERED.clear()
    pipelines.BLOCK_RELEASE.clear()
    result: list[object] = []
    worker = threading.Thread(
        target=lambda: result.append(rw.record(pipelines.blocking, {"x": 1}, run_id="held")),
    )
    worker.start()
    try:
        assert pipelines.BLOCK_ENTERED.wait(120)
        db = root_db(rw)
        for _ in range(6000):  # the mark comes WRITE_INTERVAL_S after the run row
            with contextlib.closing(sqlite3.connect(db)) as conn:
                live = conn.execute("SELECT live_node FROM runs WHERE run_id='held'").fetchone()
                names = [r[0] for r in conn.execute("SELECT name FROM nodes WHERE run_id='held'")]
            if live and live[0] == "hold":
                break
            threading.Event().wait(0.02)
        assert live and live[0] == "hold", "node 2's start was never marked"
        assert names == ["prepare"]
    finally:
        pipelines.BLOCK_RELEASE.set()
        worker.join(120)
    assert result and getattr(result[0], "status", None) == "completed"


def root_db(rw: Rewind) -> Path:
    """The SQLite file of ``rw``'s store."""
    return Path(rw.store.engine.url.database or "")
