"""The task queue for real: a Redis server (Debian's redis-server, started by the test session on
a free loopback port), ``rewind worker`` processes (Celery, prefork) and SQLite file stores.

Runs, forks and grid variants started through the API with a queue execute on the workers and
give the hashes the in-process threads give; a worker process killed mid-job leaves its run
``interrupted`` and the job retried (or, out of attempts, failed with the reason) — never lost;
an unreachable queue is one clear error (API 503, CLI exit 2) and writes nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from rewind.api import create_app
from rewind.api.pipelines import PipelineEntry
from rewind.jobs import state as job_state
from rewind.jobs.queue import VISIBILITY_ENV, celery_app
from rewind.store import Store, open_store
from tests import queue_pipelines
from tests.conftest import StoreTarget, row_counts
from tests.queue_pipelines import entered_pid, set_gate
from tests.services import RedisServer, free_port, reap

REPO = Path(__file__).resolve().parent.parent
REGISTRY = {"scaling": PipelineEntry.of(queue_pipelines.scaling, {"x": 3})}
HANG_S = 180.0  # bounds on waiting: a hang fails the test, a slow machine does not


class Workers:
    """``count`` ``rewind worker`` processes (one pool process each) on ``queue`` and ``store``;
    ``gate``: the folder the workers' ``scale`` nodes wait on (tests/queue_pipelines.py)."""

    def __init__(
        self,
        queue: str,
        store: StoreTarget,
        logs: Path,
        count: int = 1,
        gate: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.queue, self.store, self.logs, self.count, self.gate = queue, store, logs, count, gate
        self.env = env or {}
        self.release_on_exit = True
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Workers:
        env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{REPO}", **self.env)
        env.pop(queue_pipelines.GATE_ENV, None)
        if self.gate is not None:
            env[queue_pipelines.GATE_ENV] = str(self.gate)
        self.logs.mkdir(parents=True, exist_ok=True)
        for i in range(self.count):
            log = (self.logs / f"worker-{i}.log").open("wb")
            command = [sys.executable, "-m", "rewind", "worker", "--queue", self.queue]
            command += ["--store", str(self.store.location), "--concurrency", "1"]
            # cwd: a database URL's artifact folder (.rewind) is made below it
            proc = subprocess.Popen(command, cwd=self.logs, env=env, stdout=log, stderr=log)
            self.procs.append(proc)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        control = celery_app(self.queue).control
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    pytest.fail(f"a worker exited at start ({p.returncode}):\n{self.log_text()}")
            # ``limit``: the ping returns once ``count`` workers answered, not after its timeout.
            # A ping sent before a worker listens is lost: short probes notice it sooner.
            if len(control.ping(timeout=0.2, limit=self.count) or []) >= self.count:
                return
        pytest.fail(f"the workers did not answer a ping:\n{self.log_text()}")

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.logs.glob("*.log")))

    def __exit__(self, *exc: object) -> None:
        if self.gate is not None and self.release_on_exit:  # a test failed mid-hold: end the job
            set_gate(self.gate, "release", "exit")
        for p in self.procs:
            p.terminate()
        # A worker's warm shutdown lasts ~2 s (its pool process sleeps 1 s before exiting, then a
        # 0.5 s timer loop is joined): nothing of this test waits for it. The workers stop
        # consuming at once, and the next test uses another Redis database and store;
        # ``stopped_workers`` reaps them when the module ends.
        STOPPING.extend(self.procs)


STOPPING: list[subprocess.Popen[bytes]] = []
"""Workers told to stop (SIGTERM), reaped by :func:`stopped_workers`."""


@pytest.fixture(scope="module", autouse=True)
def stopped_workers() -> Iterator[None]:
    """Wait for every worker this module stopped to exit (killed after 60 s)."""
    yield
    for p in STOPPING:
        reap(p)
    STOPPING.clear()


@pytest.fixture
def queue(redis_server: RedisServer) -> str:
    return redis_server.new_url()


@pytest.fixture
def local_store(tmp_path: Path) -> Iterator[Store]:
    st = open_store(tmp_path / "local")
    yield st
    st.close()


@pytest.fixture
def queued_target(store_target: StoreTarget) -> StoreTarget:
    """The store the queued API and its workers share: a SQLite file, then PostgreSQL (the
    realistic one for several processes and machines)."""
    return store_target


@pytest.fixture
def queued_store(queued_target: StoreTarget) -> Iterator[Store]:
    st = queued_target.open()
    yield st
    st.close()


def wait_run(c: TestClient, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        run: dict[str, Any] = c.get(f"/api/runs/{run_id}").json()
        if run.get("status") not in ("queued", "running"):
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} did not finish")


def wait_until(check: Any, what: str) -> Any:
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def wait_job(c: TestClient, job_id: str) -> dict[str, Any]:
    """The job's row once it is ``succeeded`` or ``failed``."""

    def done() -> dict[str, Any] | None:
        job: dict[str, Any] = c.get(f"/api/jobs/{job_id}").json()
        return job if job["state"] in ("succeeded", "failed") else None

    found: dict[str, Any] = wait_until(done, f"job {job_id}")
    return found


def start(c: TestClient) -> dict[str, Any]:
    r = c.post("/api/runs", json={"pipeline": "scaling"})
    assert r.status_code == 202, r.text
    body: dict[str, Any] = r.json()
    return body


def fork(c: TestClient, run_id: str, factor: int) -> dict[str, Any]:
    body = {"at": "scale", "override": {"kind": "param", "node": "scale", "param": "factor",
                                        "value": factor}}  # fmt: skip
    r = c.post(f"/api/runs/{run_id}/fork", json=body)
    assert r.status_code == 202, r.text
    accepted: dict[str, Any] = r.json()
    return accepted


def trajectory(c: TestClient, run_id: str) -> list[tuple[Any, ...]]:
    """What must not depend on where a run executed: per node, name, outcome and hashes."""
    nodes = c.get(f"/api/runs/{run_id}/nodes").json()["nodes"]
    return [
        (n["name"], n["cache_outcome"], n["cache_reason"], n["input_hash"], n["output_hash"],
         n["state_hash"], n["inherited"])
        for n in nodes
    ]  # fmt: skip


def events(
    c: TestClient, run_id: str, progress: threading.Event | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """Every event of the run's stream; ``progress`` is set at the first ``refresh``."""
    found: list[tuple[str, dict[str, Any]]] = []
    with c.stream("GET", f"/api/runs/{run_id}/events") as response:
        assert response.status_code == 200
        name = ""
        for line in response.iter_lines():
            if line.startswith("event:"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                found.append((name, json.loads(line.split(":", 1)[1])))
                if name == "refresh" and progress is not None:
                    progress.set()
    return found


def pid_of(owner: str | None) -> int:
    assert owner, "the job row names no worker"
    return int(owner.split(":")[1])


@pytest.mark.slow
def test_record_and_fork_execute_on_a_worker_and_equal_in_process(
    tmp_path: Path,
    queue: str,
    local_store: Store,
    queued_target: StoreTarget,
    queued_store: Store,
) -> None:
    local = create_app(local_store, chat_client=None, pipelines=REGISTRY)
    queued = create_app(queued_store, chat_client=None, pipelines=REGISTRY, queue=queue)
    results: dict[str, Any] = {}
    gate = tmp_path / "gate"
    gate.mkdir()
    with (
        Workers(queue, queued_target, tmp_path / "logs", gate=gate),
        TestClient(local, base_url="http://127.0.0.1") as lc,
        TestClient(queued, base_url="http://127.0.0.1") as qc,
    ):
        assert lc.get("/api/health").json()["execution"] == {"mode": "threads", "workers": 2}
        assert qc.get("/api/health").json()["execution"]["reachable"] is True
        for name, c in (("local", lc), ("queued", qc)):
            accepted = start(c)
            parent = wait_run(c, accepted["run_id"])
            assert parent["status"] == "completed", parent
            forked = fork(c, parent["run_id"], 5)
            child = wait_run(c, forked["run_id"])
            assert child["status"] == "completed", child
            results[name] = {
                "parent": trajectory(c, parent["run_id"]),
                "fork": trajectory(c, child["run_id"]),
                # The run ends first, then its job's row (written by the same process).
                "job": wait_job(c, forked["job_id"]),
                "record_job": wait_job(c, accepted["job_id"]),
            }
            if name == "queued":
                # A run a worker executes streams its progress from the store to the UI: held
                # mid-run at `scale`, the stream shows the nodes so far, then the end.
                set_gate(gate, "mode", "hold")
                third = fork(qc, parent["run_id"], 7)
                wait_until(lambda: list(gate.glob("entered-*")), "the fork to reach scale")
                with ThreadPoolExecutor(1) as pool:
                    progress = threading.Event()
                    stream = pool.submit(events, qc, third["run_id"], progress)
                    assert progress.wait(HANG_S), "no progress event while the fork was held"
                    set_gate(gate, "release", "go")
                    streamed = stream.result()
                assert streamed[0] == ("hello", streamed[0][1])
                assert streamed[0][1]["status"] == "running", streamed
                refreshes = [d["nodes"] for e, d in streamed if e == "refresh"]
                assert refreshes[0] < 3 and refreshes[-1] == 3, streamed
                assert streamed[-1][0] == "run_finished"
                assert streamed[-1][1]["status"] == "completed", streamed
    assert results["queued"]["parent"] == results["local"]["parent"]
    assert results["queued"]["fork"] == results["local"]["fork"]
    assert [o for _, o, *_ in results["queued"]["fork"]] == ["inherited", "miss", "none"]
    for name in ("local", "queued"):
        job = results[name]["job"]
        assert (job["state"], job["attempts"], job["error"]) == ("succeeded", 1, None), job
        assert results[name]["record_job"]["state"] == "succeeded"
    # The queued jobs executed in a worker process; the local ones in this process's threads.
    assert pid_of(results["local"]["job"]["worker"]) == os.getpid()
    assert pid_of(results["queued"]["job"]["worker"]) != os.getpid()
    assert pid_of(results["queued"]["record_job"]["worker"]) != os.getpid()


def report_of(c: TestClient, run_id: str, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """Start a grid (``kind="grid"``) or stability job and return its report once completed."""
    r = c.post(f"/api/runs/{run_id}/{kind}", json=body)
    assert r.status_code == 202, r.text
    url = f"/api/{'grids' if kind == 'grid' else kind}/{r.json()['id']}"

    def done() -> dict[str, Any] | None:
        found: dict[str, Any] = c.get(url).json()
        return found if found["status"] not in ("queued", "running") else None

    found = wait_until(done, url)
    assert found["status"] == "completed", found
    report: dict[str, Any] = found["report"]
    return report


def grid_report(c: TestClient, run_id: str, factors: list[int]) -> dict[str, Any]:
    overrides = [{"kind": "param", "node": "scale", "param": "factor", "value": f}
                 for f in factors]  # fmt: skip
    return report_of(c, run_id, "grid", {"at": "scale", "overrides": overrides})


def stability_report(c: TestClient, run_id: str) -> dict[str, Any]:
    return report_of(c, run_id, "stability", {"k": 3, "from_node": "scale"})


def matrix(report: dict[str, Any]) -> list[Any]:
    """The grid's results without run ids and timings: per row, each variant's cell."""
    return [
        [row["label"], row["parent_hash"],
         [None if cell is None else (cell["output_hash"], cell["status"], cell["changed_fields"],
                                     cell["outcome"]) for cell in row["cells"]]]
        for row in report["rows"]
    ]  # fmt: skip


@pytest.mark.slow
def test_grid_of_8_over_2_workers_equals_in_process(
    tmp_path: Path,
    queue: str,
    local_store: Store,
    queued_target: StoreTarget,
    queued_store: Store,
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    factors = list(range(1, 9))
    local = create_app(local_store, chat_client=None, pipelines=REGISTRY)
    queued = create_app(queued_store, chat_client=None, pipelines=REGISTRY, queue=queue)
    reports, trajectories, stabilities, samples = {}, {}, {}, {}
    with (
        Workers(queue, queued_target, tmp_path / "logs", count=2, gate=gate),
        TestClient(local, base_url="http://127.0.0.1") as lc,
        TestClient(queued, base_url="http://127.0.0.1") as qc,
    ):
        for name, c in (("local", lc), ("queued", qc)):
            parent = wait_run(c, start(c)["run_id"])
            if name == "queued":  # variants wait until two workers took one (not the parent)
                set_gate(gate, "mode", "rendezvous")
            reports[name] = grid_report(c, parent["run_id"], factors)
            variants = reports[name]["variants"]
            assert [v["status"] for v in variants] == ["completed"] * 8, variants
            trajectories[name] = [trajectory(c, v["run_id"]) for v in variants]
            # Stability samples (caches bypassed) execute on the workers too, one at a time.
            set_gate(gate, "mode", "")
            stabilities[name] = stability_report(c, parent["run_id"])
            samples[name] = [trajectory(c, x["run_id"]) for x in stabilities[name]["samples"]]
    assert matrix(reports["queued"]) == matrix(reports["local"])
    assert samples["queued"] == samples["local"]
    assert [o for _, o, *_ in samples["queued"][0]] == ["inherited", "bypass", "none"]
    assert [n["distinct"] for n in stabilities["queued"]["nodes"]] == [1, 1]
    for x in stabilities["queued"]["samples"]:
        row = job_state.job_of_run(queued_store, x["run_id"])
        assert row is not None and pid_of(row.worker) != os.getpid(), row
    assert trajectories["queued"] == trajectories["local"]
    variants = reports["queued"]["variants"]
    assert len({row for t in trajectories["queued"] for row in t}) > 3  # factors differ
    owners = set()
    for v in variants:
        row = job_state.job_of_run(queued_store, v["run_id"])
        assert row is not None and row.state == "succeeded", row
        owners.add(pid_of(row.worker))
    assert len(owners) == 2 and os.getpid() not in owners, owners


@pytest.mark.slow
def test_a_worker_killed_mid_job_leaves_the_run_interrupted_and_the_job_retried(
    tmp_path: Path,
    queue: str,
    local_store: Store,
    queued_target: StoreTarget,
    queued_store: Store,
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    set_gate(gate, "mode", "hold")
    local = create_app(local_store, chat_client=None, pipelines=REGISTRY)
    queued = create_app(queued_store, chat_client=None, pipelines=REGISTRY, queue=queue)
    with (
        Workers(queue, queued_target, tmp_path / "logs", gate=gate) as workers,
        TestClient(local, base_url="http://127.0.0.1") as lc,
        TestClient(queued, base_url="http://127.0.0.1") as qc,
    ):
        accepted = start(qc)
        first_run, job_id = accepted["run_id"], accepted["job_id"]
        entered = wait_until(lambda: sorted(gate.glob("entered-*")), "the job to reach scale")
        victim = entered_pid(entered[0])
        assert qc.get(f"/api/runs/{first_run}").json()["status"] == "running"
        os.kill(victim, signal.SIGKILL)  # the pool process executing the job, mid-node

        def second_attempt() -> list[Path]:
            return [p for p in gate.glob("entered-*") if entered_pid(p) != victim]

        wait_until(second_attempt, f"the job to be retried:\n{workers.log_text()}")
        job = qc.get(f"/api/jobs/{job_id}").json()
        assert (job["state"], job["attempts"], job["earlier_runs"]) == (
            "running", 2, [first_run]
        ), job  # fmt: skip
        lost = qc.get(f"/api/runs/{first_run}").json()
        assert lost["status"] == "interrupted", lost
        assert lost["error"], lost
        set_gate(gate, "release", "go")
        retried = wait_run(qc, job["run_id"])
        assert retried["status"] == "completed", retried
        job = wait_job(qc, job_id)
        assert (job["state"], job["attempts"], job["error"]) == ("succeeded", 2, None), job
        assert pid_of(job["worker"]) != victim
        # The retry recorded what an uninterrupted run records.
        reference = wait_run(lc, start(lc)["run_id"])
        assert trajectory(qc, retried["run_id"]) == trajectory(lc, reference["run_id"])
        # The lost attempt stays interrupted (recorded runs are immutable): its stream ends so.
        assert events(qc, first_run)[-1][1]["status"] == "interrupted"


@pytest.mark.slow
def test_a_whole_worker_killed_mid_job_has_its_job_handed_out_again(
    tmp_path: Path, queue: str, queued_target: StoreTarget, queued_store: Store
) -> None:
    """The worker's parent process and its pool process both killed (a machine lost): the
    unacknowledged job comes back after the broker's visibility timeout (3 s here)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    set_gate(gate, "mode", "hold")
    env = {VISIBILITY_ENV: "3"}
    queued = create_app(queued_store, chat_client=None, pipelines=REGISTRY, queue=queue)
    with TestClient(queued, base_url="http://127.0.0.1") as qc:
        with Workers(queue, queued_target, tmp_path / "logs1", gate=gate, env=env) as first:
            first.release_on_exit = False
            accepted = start(qc)
            entered = wait_until(lambda: sorted(gate.glob("entered-*")), "the job to reach scale")
            child = entered_pid(entered[0])
            os.kill(first.procs[0].pid, signal.SIGKILL)
            os.kill(child, signal.SIGKILL)
            first.procs[0].wait()
        run_id, job_id = accepted["run_id"], accepted["job_id"]
        assert qc.get(f"/api/jobs/{job_id}").json()["state"] == "running"  # nobody knows yet
        with Workers(queue, queued_target, tmp_path / "logs2", gate=gate, env=env) as second:
            # The new worker marked the run of its host's dead process interrupted at start.
            assert qc.get(f"/api/runs/{run_id}").json()["status"] == "interrupted"

            def retried() -> list[Path]:
                return [p for p in gate.glob("entered-*") if entered_pid(p) != child]

            wait_until(retried, f"the job to come back:\n{second.log_text()}")
            set_gate(gate, "release", "go")
            job = wait_job(qc, job_id)
    assert (job["state"], job["attempts"], job["earlier_runs"]) == ("succeeded", 2, [run_id])
    assert queued_store.get_run(job["run_id"]).status == "completed"


@pytest.mark.slow
def test_a_job_whose_workers_keep_dying_fails_visibly(
    tmp_path: Path, queue: str, queued_target: StoreTarget, queued_store: Store
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    set_gate(gate, "mode", "hold")  # never released: every attempt is killed mid-node
    queued = create_app(queued_store, chat_client=None, pipelines=REGISTRY, queue=queue)
    killed: set[int] = set()
    with (
        Workers(queue, queued_target, tmp_path / "logs", gate=gate) as workers,
        TestClient(queued, base_url="http://127.0.0.1") as qc,
    ):
        job_id = start(qc)["job_id"]

        def failed_or_kill() -> dict[str, Any] | None:
            job: dict[str, Any] = qc.get(f"/api/jobs/{job_id}").json()
            if job["state"] == "failed":
                return job
            for p in gate.glob("entered-*"):
                pid = entered_pid(p)
                if pid not in killed:
                    killed.add(pid)
                    os.kill(pid, signal.SIGKILL)
            return None

        job = wait_until(failed_or_kill, f"the job to fail:\n{workers.log_text()}")
    assert len(killed) == job_state.MAX_ATTEMPTS
    assert job["attempts"] == job_state.MAX_ATTEMPTS
    assert "lost 3 times" in job["error"], job
    runs = [*job["earlier_runs"], job["run_id"]]
    assert len(set(runs)) == job_state.MAX_ATTEMPTS
    for run_id in runs:
        assert queued_store.get_run(run_id).status == "interrupted"


def test_an_unreachable_queue_is_one_clear_error_and_writes_nothing(
    tmp_path: Path, local_store: Store
) -> None:
    queued_store = local_store
    dead = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    app = create_app(queued_store, chat_client=None, pipelines=REGISTRY, queue=dead)
    before = row_counts(queued_store)
    with TestClient(app, base_url="http://127.0.0.1") as c:
        r = c.post("/api/runs", json={"pipeline": "scaling"})
        health = c.get("/api/health").json()
    assert health["execution"] == {
        "mode": "queue", "queue": dead.replace(":s3cret@", "***@"), "reachable": False
    }  # fmt: skip
    assert "s3cret" not in r.text
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["error"] == "QueueUnavailable"
    assert "cannot hand the job to the task queue" in body["message"], body
    assert "redis-server" in body["hint"]
    assert row_counts(queued_store) == before
    assert job_state.active_jobs(queued_store) == []

    env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{REPO}")
    command = [sys.executable, "-m", "rewind", "worker", "--queue", dead]
    command += ["--store", str(tmp_path / "w")]
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S
    )
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the task queue"), lines
    assert not (tmp_path / "w").exists()  # checked before the store is opened
