"""Job state as rows of the store's ``jobs`` table: queued → running → succeeded | failed.

Every process that accepts or executes jobs (the API server, in-process worker threads, Celery
workers on other machines) reads and writes the same rows, so the state of a job never lives in
one process's memory. A job whose worker died mid-run is seen here as ``running`` with an owner
that is gone; the next delivery of the job (Celery's ``acks_late`` + ``reject_on_worker_lost``)
marks that run ``interrupted`` and retries under a new run id, up to :data:`MAX_ATTEMPTS`.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from rewind.jobs.spec import Job
from rewind.store import Store, schema
from rewind.store.jobs import (
    delete_job_row,
    fail_active_job_row,
    insert_job_row,
    update_job_row,
)
from rewind.store.store import current_owner

JOB_STATES = ("queued", "running", "succeeded", "failed")
_LOST_ELSEWHERE = "the worker executing it was lost (the task queue handed its job out again)"
MAX_ATTEMPTS = 3
"""Deliveries of one job before it is failed for good (each lost worker costs one)."""


@dataclass(frozen=True)
class JobRow:
    """A job as the store keeps it.

    Attributes:
        job: the job description (its ``run_id`` is the current attempt's run).
        state: one of :data:`JOB_STATES`.
        attempts: deliveries so far that started executing.
        error: why the job failed (one line), or None.
        worker: ``host:pid:start`` of the process that executed it last.
        earlier_runs: runs of earlier attempts (each left ``interrupted`` by a lost worker).
        created_at, started_at, finished_at: unix seconds.
    """

    job: Job
    state: str
    attempts: int
    error: str | None
    worker: str | None
    earlier_runs: tuple[str, ...]
    created_at: float
    started_at: float | None
    finished_at: float | None

    @property
    def done(self) -> bool:
        """True once the job changes no more."""
        return self.state in ("succeeded", "failed")

    def to_json(self) -> dict[str, Any]:
        """The row as the API shows it."""
        return {
            "job_id": self.job.job_id,
            "kind": self.job.kind,
            "run_id": self.job.run_id,
            "state": self.state,
            "attempts": self.attempts,
            "error": self.error,
            "worker": self.worker,
            "earlier_runs": list(self.earlier_runs),
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }


def _row(r: Any) -> JobRow:
    job = Job.from_json(json.loads(r.spec_json)).with_run_id(r.run_id)
    return JobRow(
        job=job,
        state=r.state,
        attempts=int(r.attempts),
        error=r.error,
        worker=r.worker,
        earlier_runs=tuple(json.loads(r.runs_json or "[]")),
        created_at=float(r.created_at),
        started_at=r.started_at,
        finished_at=r.finished_at,
    )


def add_job(store: Store, job: Job) -> None:
    """Insert the job as ``queued`` (before it is handed to a worker)."""
    insert_job_row(
        store,
        job_id=job.job_id,
        kind=job.kind,
        run_id=job.run_id,
        state="queued",
        attempts=0,
        spec_json=json.dumps(job.to_json(), sort_keys=True),
        runs_json="[]",
        created_at=time.time(),
    )


def forget_job(store: Store, job_id: str) -> None:
    """Delete a job row that was never handed to a worker (the queue refused it)."""
    delete_job_row(store, job_id)


def get_job(store: Store, job_id: str) -> JobRow | None:
    """The job with this id, or None."""
    with store.read() as conn:
        r = conn.execute(select(schema.jobs).where(schema.jobs.c.job_id == job_id)).first()
    return None if r is None else _row(r)


def job_of_run(store: Store, run_id: str) -> JobRow | None:
    """The job whose current attempt creates ``run_id``, or None."""
    with store.read() as conn:
        r = conn.execute(select(schema.jobs).where(schema.jobs.c.run_id == run_id)).first()
    return None if r is None else _row(r)


def active_jobs(store: Store) -> list[JobRow]:
    """Jobs queued or running, oldest first."""
    t = schema.jobs
    with store.read() as conn:
        rows = conn.execute(
            select(t).where(t.c.state.in_(("queued", "running"))).order_by(t.c.created_at)
        ).all()
    return [_row(r) for r in rows]


def begin_attempt(store: Store, job: Job, new_run_id: str) -> tuple[JobRow | None, str | None]:
    """Mark the job ``running`` for one more attempt; called by the executing process.

    A job whose row says ``running`` was being executed by a worker that was lost (its message
    came back): that attempt's run is marked ``interrupted`` when its process is gone, and this
    attempt gets ``new_run_id``. A job already ``succeeded``/``failed`` (a duplicate delivery) is
    not executed again.

    Returns:
        (the row now, None) to execute the row's job; (the row, reason) not to execute it: the
        job is done already, or it ran out of attempts (then it was failed with the reason).
    """
    row = get_job(store, job.job_id)
    if row is None:  # described by a client that wrote no row (or a store without it yet)
        add_job(store, job)
        row = get_job(store, job.job_id)
        assert row is not None
    if row.done:
        return row, f"job {job.job_id} is {row.state} already"
    run_id, earlier = row.job.run_id, list(row.earlier_runs)
    if row.state == "running":
        store.reap_orphans([run_id])
        found = _run_row(store, run_id)
        if found is not None and found.status == "running":
            if found.owner and found.owner.partition(":")[0] == socket.gethostname():
                # Its process on this host still lives: a duplicate delivery, not a lost one.
                return row, f"run {run_id} is still executing in process {found.owner}"
            # Executed on another host, whose processes cannot be seen from here: the broker
            # handed the job out again because that worker was lost.
            store.finish_run(run_id, "interrupted", error=_LOST_ELSEWHERE)
        if found is not None:
            earlier.append(run_id)
            run_id = new_run_id
    now = time.time()
    if row.attempts >= MAX_ATTEMPTS:
        reason = (
            f"the job's worker was lost {row.attempts} times (runs {', '.join(earlier) or '-'} "
            "interrupted); it is not retried again"
        )
        _update(
            store,
            job.job_id,
            state="failed",
            error=reason,
            finished_at=now,
            runs_json=json.dumps(earlier),
        )
        return get_job(store, job.job_id), reason
    _update(
        store,
        job.job_id,
        state="running",
        run_id=run_id,
        attempts=row.attempts + 1,
        worker=current_owner(),
        started_at=now,
        runs_json=json.dumps(earlier),
    )
    return get_job(store, job.job_id), None


def end_attempt(store: Store, job_id: str, *, error: str | None) -> None:
    """Mark the job ``succeeded`` (no error) or ``failed`` with one line saying why."""
    _update(
        store,
        job_id,
        state="failed" if error else "succeeded",
        error=error,
        finished_at=time.time(),
    )


def abandon_job(store: Store, job_id: str, reason: str) -> None:
    """Mark a job that will never finish (its server stopped) ``failed`` with ``reason``;
    a job already ``succeeded``/``failed`` is left as it is."""
    fail_active_job_row(store, job_id, reason, time.time())


def _update(store: Store, job_id: str, **values: Any) -> None:
    update_job_row(store, job_id, **values)


def _run_row(store: Store, run_id: str) -> Any:
    t = schema.runs
    with store.read() as conn:
        return conn.execute(select(t.c.status, t.c.owner).where(t.c.run_id == run_id)).first()
