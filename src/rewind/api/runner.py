"""Background execution of runs and forks, and the progress events the API streams.

The HTTP handlers validate a request, choose the run id, and hand a job to :class:`RunManager`;
the job executes on one of the manager's worker threads (never on the event loop) with its own
:class:`~rewind.replay.Rewind` sharing the server's store and model client. Each worker's
``on_event`` listener tags the engine's progress events with the run id, keeps them (so a late
subscriber can catch up, and so the graph can show a node that finished before the recorder
committed its row) and fans them out to the server-sent-event subscribers' asyncio queues with
``call_soon_threadsafe``.

Worker threads are daemons: stopping the server does not wait for a long model call. Runs this
process still had in flight are marked ``interrupted`` on shutdown, and any run left ``running``
in the store (a crash) is marked so on the next start.

This is the "run execution" seam of DESIGN: an in-process pool by default; a distributed queue
would replace this class and keep its interface (``submit``, ``job``, ``subscribe``).

:class:`ReportManager` does the same for jobs that fork a run several times and end in a report
(a what-if grid, a hash-stability run): the handler validates and answers with a job id, a
worker thread runs the engine, and the job keeps its progress (one item per finished fork) and
the report's JSON for the API to return.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from rewind.errors import RewindError, UnknownRun
from rewind.jobs import Job, run_job
from rewind.jobs import state as job_state
from rewind.replay import Pipeline, Rewind
from rewind.stability import RemoteFork
from rewind.store import RunRecord, Store
from rewind.store.retention import archived_run_ids

logger = logging.getLogger(__name__)

JobFn = Callable[[Rewind], RunRecord]
KEEP_FINISHED_JOBS = 500
JOB_POLL_S = 0.1
"""How often (seconds) a server waiting for a queued job reads its row."""


@dataclass
class RunJob:
    """A run the server accepted: queued, running, or done.

    Attributes:
        run_id: chosen before the job is queued (returned to the client at once).
        kind: ``record`` or ``fork``.
        pipeline: pipeline name (for the graph of a run whose row does not exist yet).
        parent_run_id: the parent of a fork.
        fork_node: the fork node's name.
        override: the fork's override as JSON.
        effects: the fork's side-effect mode (``recorded``, ``dry-run``, ``live``).
        created_by: the user who asked for it; the run belongs to them (None: unowned).
        state: ``queued``, ``running`` or ``done``.
        error: why the job failed before or while running (also on the run row when it exists).
        events: every progress event so far, in order.
        running: the node_started event of the node executing now.
        finished: node_finished events by position.
    """

    run_id: str
    kind: str
    pipeline: str
    fn: JobFn | None
    parent_run_id: str | None = None
    fork_node: str | None = None
    fork_position: int | None = None
    override: dict[str, Any] | None = None
    effects: str | None = None
    created_by: str | None = None
    submitted_at: float = field(default_factory=time.time)
    state: str = "queued"
    error: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    running: dict[str, Any] | None = None
    finished: dict[int, dict[str, Any]] = field(default_factory=dict)
    spec: Job | None = None
    """The job as data; executed with :func:`rewind.jobs.run_job` (``fn`` is then None)."""

    @property
    def job_id(self) -> str | None:
        """The id of the job row in the store (None for a job given as a function)."""
        return self.spec.job_id if self.spec is not None else None

    def placeholder(self, state: str | None = None) -> RunRecord:
        """A run record for a job whose row the worker has not created yet: failed when the
        job is done (``state``: the job's state as the caller saw it before it read the store
        and found no row; the job's state now by default), else queued."""
        status = "failed" if (state or self.state) == "done" else "queued"
        return RunRecord(
            run_id=self.run_id,
            pipeline=self.pipeline,
            pipeline_ref="",
            status=status,
            parent_run_id=self.parent_run_id,
            fork_node=self.fork_node,
            fork_position=self.fork_position,
            override=self.override,
            initial_state_hash=None,
            burr_fork_app_id=None,
            burr_fork_sequence_id=None,
            config={},
            created_at=self.submitted_at,
            finished_at=None,
            prompt_tokens=0,
            completion_tokens=0,
            latency_ms=0.0,
            error=self.error,
            created_by=self.created_by,
        )


@dataclass
class _Subscriber:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[dict[str, Any]]


class _WorkerPool:
    """Worker threads that take jobs from a queue: what both job managers share.

    Subclasses implement ``_execute(job)``; ``_enqueue`` refuses new jobs once
    ``_stop_workers`` has been called.
    """

    def __init__(self, name: str, workers: int) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(max(1, workers))
        ]
        self._started = False
        self._stopping = False

    def start(self) -> None:
        """Start the worker threads (idempotent)."""
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()

    def _stop_workers(self) -> None:
        self._stopping = True
        for _ in self._threads:
            self._queue.put(None)

    def _enqueue(self, job: Any, register: Any) -> None:
        if self._stopping:
            raise RewindError("the server is shutting down", "retry on the restarted server")
        self.start()
        register()
        self._queue.put(job)

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None or self._stopping:
                return
            self._execute(job)

    def _execute(self, job: Any) -> None:
        raise NotImplementedError


class RunManager(_WorkerPool):
    """A pool of worker threads executing recorded runs and forks.

    Args:
        store: the server's store (shared by every worker; SQLAlchemy pools connections).
        chat_client: the model client every run uses (a ``LazyChatClient`` opens the endpoint on
            the first cache miss).
        workers: how many runs may execute at once.
        pipelines: pipelines to register on every worker's session (so forks of their runs need
            not import ``pipeline.ref``).
    """

    def __init__(
        self,
        store: Store,
        chat_client: Any = None,
        *,
        workers: int = 2,
        pipelines: list[Pipeline] | None = None,
    ) -> None:
        self.store = store
        self.chat_client = chat_client
        self.pipelines = list(pipelines or [])
        self._jobs: dict[str, RunJob] = {}
        self._subs: dict[str, list[_Subscriber]] = {}
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        super().__init__("rewind-worker", workers)

    # -- lifecycle ----------------------------------------------------------------------------
    def shutdown(self) -> list[str]:
        """Stop taking jobs; mark this process's queued and running runs ``interrupted``.

        Returns:
            the ids of the runs marked.
        """
        self._stop_workers()
        marked = []
        with self._lock:
            pending = [j for j in self._jobs.values() if j.state != "done"]
        for job in pending:
            with contextlib.suppress(Exception):
                self.store.finish_run(job.run_id, "interrupted", error="the server stopped")
                marked.append(job.run_id)
            if job.spec is not None:
                with contextlib.suppress(Exception):
                    job_state.abandon_job(self.store, job.spec.job_id, "the server stopped")
            self._emit(job, "run_finished", {"status": "interrupted", "error": "server stopped"})
        return marked

    # -- jobs ---------------------------------------------------------------------------------
    def submit(self, job: RunJob) -> RunJob:
        """Queue a job; it executes on a worker thread. Returns it.

        A job described as data gets its row (``queued``) before this returns, as on a queue,
        so ``GET /api/jobs/{id}`` finds it while it waits for a free worker thread.
        """

        def register() -> None:
            if job.spec is not None:
                from rewind.jobs import state as job_state

                job_state.add_job(self.store, job.spec)
            with self._lock:
                self._jobs[job.run_id] = job
                self._prune()

        self._enqueue(job, register)
        return job

    def job(self, run_id: str) -> RunJob | None:
        """The job of a run this server accepted (None if it never did, or forgot it)."""
        with self._lock:
            return self._jobs.get(run_id)

    def jobs(self) -> list[RunJob]:
        """Every job this server still remembers (queued, running, done), oldest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.submitted_at)

    def forget(self, run_id: str) -> None:
        """Drop a finished job (its run was deleted: the id must read as unknown again)."""
        with self._lock:
            job = self._jobs.get(run_id)
            if job is not None and job.state == "done":
                del self._jobs[run_id]

    def active(self) -> list[RunJob]:
        """Jobs queued or running."""
        with self._lock:
            return [j for j in self._jobs.values() if j.state != "done"]

    def remote_fork(
        self,
        cache_mode: str = "replay",
        *,
        restore: str = "refuse",
        created_by: str | None = None,
    ) -> RemoteFork | None:
        """How a grid or stability job executes its forks elsewhere; None: on this process's
        threads (the in-process default)."""
        return None

    def execution(self) -> dict[str, Any]:
        """Where jobs execute, for ``/api/health``: ``{"mode": "threads", "workers": N}``."""
        return {"mode": "threads", "workers": len(self._threads)}

    def is_active(self, run_id: str) -> bool:
        """True when this server is executing (or about to execute) the run."""
        job = self.job(run_id)
        return job is not None and job.state != "done"

    def resolve(self, run_id: str) -> RunRecord:
        """The run's record from the store, or a placeholder while its job is queued.

        Raises:
            UnknownRun: neither the store nor this server knows the id.
        """
        try:
            return self.store.get_run(run_id)
        except UnknownRun:
            job = self.job(run_id)
            if job is None:
                raise
        # The job's state is read before the store is read again: a job that ended between
        # the first read and now has its run row (if it ever had one) committed, and a job
        # still going is reported queued even if it ends during the second read.
        state = job.state
        try:
            return self.store.get_run(run_id)
        except UnknownRun:
            if state == "done" and archived_run_ids(self.store, [run_id]):
                raise UnknownRun(
                    f"run {run_id} was archived by rewind gc",
                    f"bring it back with `rewind archive restore {run_id}`",
                ) from None
            # Queued, or the job ended before its run row existed (reported as failed).
            return job.placeholder(state)

    def _prune(self) -> None:
        done = [j for j in self._jobs.values() if j.state == "done"]
        for j in sorted(done, key=lambda j: j.submitted_at)[
            : max(0, len(done) - KEEP_FINISHED_JOBS)
        ]:
            del self._jobs[j.run_id]

    def _execute(self, job: RunJob) -> None:
        job.state = "running"
        rw = Rewind(
            self.store,
            chat_client=self.chat_client,
            on_event=lambda event, payload: self._emit(job, event, payload),
        )
        rw.created_by = job.created_by
        for p in self.pipelines:
            rw.register(p)
        error: str | None = None
        try:
            if job.spec is not None:
                run_job(
                    job.spec,
                    store=self.store,
                    chat_client=self.chat_client,
                    pipelines=self.pipelines,
                    on_event=rw.on_event,
                )
            elif job.fn is not None:
                job.fn(rw)
        except RewindError as exc:
            error = exc.message + (f" — {exc.hint}" if exc.hint else "")
        except Exception as exc:  # a worker must survive any run
            logger.exception("run %s failed", job.run_id)
            error = f"{type(exc).__name__}: {exc}"
        status = "failed" if error else "completed"
        try:
            run = self.store.get_run(job.run_id)
            if run.status == "running":  # the engine raised before it could finish the run
                self.store.finish_run(job.run_id, "failed", error=error or "the run stopped")
                run = self.store.get_run(job.run_id)
            status = run.status
            error = run.error or error
            finished_by_engine = any(e["event"] == "run_finished" for e in job.events)
        except UnknownRun:
            status, finished_by_engine = "failed", False
        if not finished_by_engine:
            self._emit(job, "run_finished", {"status": status, "error": error})
        with self._lock:
            job.error = error
            job.running = None
            job.state = "done"

    # -- events -------------------------------------------------------------------------------
    def _emit(self, job: RunJob, event: str, payload: dict[str, Any]) -> None:
        item = {**payload, "event": event, "run_id": job.run_id, "seq": next(self._seq)}
        item["time"] = time.time()
        with self._lock:
            if event == "node_started":
                job.running = item
            elif event == "node_finished":
                job.finished[int(item["position"])] = item
                if job.running is not None and job.running.get("position") == item["position"]:
                    job.running = None
            elif event == "run_finished":
                # The engine emits this after the run row is final: from now on the run can be
                # forked, so the job stops counting as active.
                job.running = None
                job.state = "done"
                job.error = item.get("error")
            job.events.append(item)
            subs = list(self._subs.get(job.run_id, ()))
        for sub in subs:
            try:
                sub.loop.call_soon_threadsafe(sub.queue.put_nowait, item)
            except RuntimeError:  # the subscriber's loop is closed
                self._drop(job.run_id, sub)

    def subscribe(
        self, run_id: str, loop: asyncio.AbstractEventLoop
    ) -> tuple[asyncio.Queue[dict[str, Any]], list[dict[str, Any]], bool]:
        """Follow a run's events.

        Returns:
            (queue receiving every later event, the events so far, whether the job is done);
            taken atomically, so no event is lost or seen twice.
        """
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        with self._lock:
            job = self._jobs.get(run_id)
            history = list(job.events) if job else []
            done = job is None or job.state == "done"
            if not done:
                self._subs.setdefault(run_id, []).append(_Subscriber(loop, q))
        return q, history, done

    def unsubscribe(self, run_id: str, q: asyncio.Queue[dict[str, Any]]) -> None:
        """Stop following a run."""
        with self._lock:
            subs = self._subs.get(run_id, [])
            self._subs[run_id] = [s for s in subs if s.queue is not q]
            if not self._subs[run_id]:
                del self._subs[run_id]

    def _drop(self, run_id: str, sub: _Subscriber) -> None:
        self.unsubscribe(run_id, sub.queue)


# -- report jobs: what-if grids and stability runs ----------------------------------------------

ReportFn = Callable[["ReportJob", Rewind], dict[str, Any]]
KEEP_FINISHED_REPORTS = 200
REPORT_STATES = ("queued", "running", "completed", "failed", "interrupted")


@dataclass
class ReportJob:
    """A grid or stability job the server accepted: it forks a run several times and ends in a
    report (the engine's ``to_json()``).

    Attributes:
        job_id: chosen when the job is accepted (returned to the client at once).
        kind: ``grid`` or ``stability``.
        run_id: the run the job forks.
        request: the validated request as JSON (what the job will do).
        total: how many forks the job makes (variants or samples).
        fn: does the work on a worker thread; returns the report's JSON. It reports each fork
            as it finishes with :meth:`add_progress`.
        created_by: the user who asked for it: its forks belong to them (None: unowned).
        state: ``queued``, ``running``, ``completed`` (the report is ready; single variants or
            samples may still have failed — the report says), ``failed`` (the engine raised:
            ``error`` says why) or ``interrupted`` (the server stopped first).
        progress: one item per finished fork: ``{"index", "run_id", "status", "label"}``.
        report: the report's JSON once completed.
        error: ``{"error", "message", "hint"}`` when failed or interrupted.
    """

    job_id: str
    kind: str
    run_id: str
    request: dict[str, Any]
    total: int
    fn: ReportFn
    created_by: str | None = None
    submitted_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    state: str = "queued"
    progress: list[dict[str, Any]] = field(default_factory=list)
    report: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_progress(self, item: dict[str, Any]) -> None:
        """Record one finished fork (thread-safe)."""
        with self._lock:
            self.progress.append(dict(item))

    @property
    def done(self) -> bool:
        """True once the job will change no more."""
        return self.state in ("completed", "failed", "interrupted")

    def to_json(self, *, with_report: bool = True) -> dict[str, Any]:
        """The job as the API shows it (a consistent snapshot)."""
        with self._lock:
            progress = sorted((dict(p) for p in self.progress), key=lambda p: p.get("index", 0))
            body: dict[str, Any] = {
                "id": self.job_id,
                "kind": self.kind,
                "run_id": self.run_id,
                "status": self.state,
                "request": self.request,
                "progress": {"done": len(progress), "total": self.total, "forks": progress},
                "error": self.error,
                "submitted_at": self.submitted_at,
                "started_at": self.started_at,
                "finished_at": self.finished_at,
            }
            if with_report:
                body["report"] = self.report
            return body


class ReportManager(_WorkerPool):
    """Worker threads executing grid and stability jobs in the background.

    Each job runs on its own :class:`~rewind.replay.Rewind` sharing the server's store and model
    client (a grid then runs its variants on a pool of its own). Jobs are kept in memory (the
    newest :data:`KEEP_FINISHED_REPORTS` finished ones); the forks they make are ordinary runs in
    the store, and a stability report is also saved under the store's ``reports/`` folder.

    Args:
        store: the server's store.
        chat_client: the model client the forks use.
        workers: jobs that may execute at once (a grid's variants run concurrently inside one).
        pipelines: pipelines to register on every job's session.
    """

    def __init__(
        self,
        store: Store,
        chat_client: Any = None,
        *,
        workers: int = 1,
        pipelines: list[Pipeline] | None = None,
    ) -> None:
        self.store = store
        self.chat_client = chat_client
        self.pipelines = list(pipelines or [])
        self._jobs: dict[str, ReportJob] = {}
        self._lock = threading.Lock()
        super().__init__("rewind-report", workers)

    def shutdown(self) -> list[str]:
        """Stop taking jobs; mark unfinished ones ``interrupted``. Returns their ids.

        Forks a job has in flight are left to the store's orphan handling (the next server
        start marks runs of a dead process ``interrupted``).
        """
        self._stop_workers()
        marked = []
        with self._lock:
            pending = [j for j in self._jobs.values() if not j.done]
        for job in pending:
            with job._lock:
                job.state = "interrupted"
                job.finished_at = time.time()
                job.error = {
                    "error": "Interrupted",
                    "message": "the server stopped before the job finished",
                    "hint": "start it again",
                }
            marked.append(job.job_id)
        return marked

    def submit(self, job: ReportJob) -> ReportJob:
        """Queue a job; it executes on a worker thread. Returns it."""

        def register() -> None:
            with self._lock:
                self._jobs[job.job_id] = job
                done = sorted(
                    (j for j in self._jobs.values() if j.done), key=lambda j: j.submitted_at
                )
                for old in done[: max(0, len(done) - KEEP_FINISHED_REPORTS)]:
                    del self._jobs[old.job_id]

        self._enqueue(job, register)
        return job

    def get(self, job_id: str, kind: str | None = None) -> ReportJob | None:
        """The job with this id (and kind, when given), or None."""
        with self._lock:
            job = self._jobs.get(job_id)
        return job if job is not None and (kind is None or job.kind == kind) else None

    def jobs(self, kind: str | None = None, run_id: str | None = None) -> list[ReportJob]:
        """Jobs (newest first), optionally of one kind and one run."""
        with self._lock:
            jobs = list(self._jobs.values())
        return sorted(
            (
                j
                for j in jobs
                if (kind is None or j.kind == kind) and (run_id is None or j.run_id == run_id)
            ),
            key=lambda j: j.submitted_at,
            reverse=True,
        )

    def active(self) -> list[ReportJob]:
        """Jobs queued or running."""
        with self._lock:
            return [j for j in self._jobs.values() if not j.done]

    def _execute(self, job: ReportJob) -> None:
        with job._lock:
            if job.state != "queued":
                return
            job.state = "running"
            job.started_at = time.time()
        rw = Rewind(self.store, chat_client=self.chat_client)
        rw.created_by = job.created_by
        for p in self.pipelines:
            rw.register(p)
        report: dict[str, Any] | None = None
        error: dict[str, Any] | None = None
        try:
            report = job.fn(job, rw)
        except RewindError as exc:
            error = {"error": type(exc).__name__, "message": exc.message, "hint": exc.hint}
        except Exception as exc:  # a worker must survive any job
            logger.exception("%s job %s failed", job.kind, job.job_id)
            error = {"error": type(exc).__name__, "message": str(exc), "hint": ""}
        with job._lock:
            if job.state != "running":  # interrupted meanwhile: keep that verdict
                return
            job.report = report
            job.error = error
            job.state = "failed" if error else "completed"
            job.finished_at = time.time()


# -- the distributed seam: jobs on Celery workers over Redis --------------------------------------


class QueueRunManager(RunManager):
    """:class:`RunManager`'s interface over a task queue (``REWIND_QUEUE=redis://…``).

    ``submit`` writes the job's row (``queued``) and publishes the job to the broker; ``rewind
    worker`` processes execute it with :func:`rewind.jobs.run_job`. Nothing about a job lives in
    this process: queued placeholders, whether a run is active and its progress are read from
    the store (the event stream polls it), so any number of API servers can share the workers.

    Args:
        store: the store the API and the workers share.
        queue: the broker URL.
        chat_client: the API's model client (unused for execution: workers have their own).
        pipelines: pipelines the API knows (a record job of one needs a ``ref`` workers import).
    """

    def __init__(
        self,
        store: Store,
        queue: str,
        chat_client: Any = None,
        *,
        pipelines: list[Pipeline] | None = None,
    ) -> None:
        super().__init__(store, chat_client, workers=1, pipelines=pipelines)
        self.queue = queue

    def start(self) -> None:
        """Nothing to start: the workers are other processes."""

    def shutdown(self) -> list[str]:
        """Nothing to interrupt: the workers own the runs they execute."""
        self._stopping = True
        return []

    def submit(self, job: RunJob) -> RunJob:
        """Write the job's row and hand the job to the queue.

        Raises:
            JobError: the job is not described as data, or its pipeline cannot be imported by a
                worker (no ``ref``).
            QueueUnavailable: the broker cannot be reached (the job's row is removed again).
        """
        from rewind.jobs import JobError
        from rewind.jobs import state as job_state
        from rewind.jobs.queue import QueueUnavailable, publish

        spec = job.spec
        if spec is None:
            raise JobError("this job is not described as data", "submit a rewind.jobs.Job")
        if spec.kind == "record" and not spec.pipeline_ref:
            raise JobError(
                f"pipeline {spec.pipeline!r} has no reference a worker can import",
                "give the Pipeline a ref='module:attr', or run the server without REWIND_QUEUE",
            )
        if self._stopping:
            raise RewindError("the server is shutting down", "retry on the restarted server")
        job_state.add_job(self.store, spec)
        try:
            publish(self.queue, spec)
        except QueueUnavailable:
            job_state.forget_job(self.store, spec.job_id)
            raise
        return job

    def fork_and_wait(
        self,
        parent_run_id: str,
        at: int,
        override: Any,
        new_run_id: str,
        effects: str,
        config: dict[str, Any],
        *,
        cache_mode: str = "replay",
        restore: str = "refuse",
        created_by: str | None = None,
    ) -> RunRecord:
        """Queue one fork and wait for its job to end (a grid variant or a stability sample
        on the workers).

        Args:
            parent_run_id: the parent run's full id.
            at: the fork node's 1-based number.
            override: a :data:`rewind.replay.Override` or None.
            new_run_id: the fork's run id (a retry after a lost worker gets another).
            effects: the side-effect mode.
            config: settings stored on the fork's run row.
            cache_mode: ``replay`` or ``stability`` (see :meth:`rewind.replay.Rewind.fork`).
            restore: ``refuse`` or ``replace`` (see :meth:`rewind.replay.Rewind.fork`).
            created_by: the user the fork belongs to (None: unowned).
        Returns:
            the run of the job's last attempt, as it ended.
        Raises:
            QueueUnavailable: the broker cannot be reached.
            RewindError: the job ended without a run (its row's error), or this server is
                stopping.
        """
        from rewind.jobs import state as job_state
        from rewind.jobs.spec import new_job_id, store_location

        parent = self.store.get_run(parent_run_id)
        spec = Job(
            "fork",
            new_job_id(),
            new_run_id,
            store_location(self.store),
            parent.pipeline,
            parent.pipeline_ref,
            {
                "parent_run_id": parent.run_id,
                "at": at,
                "override": override.to_json() if override is not None else None,
                "effects": effects,
                "config": config,
                "cache_mode": cache_mode,
                "restore": restore,
                "created_by": created_by,
            },
        )
        self.submit(RunJob(new_run_id, "fork", parent.pipeline, None, spec=spec))
        while True:
            row = job_state.get_job(self.store, spec.job_id)
            if row is not None and row.done:
                try:
                    return self.store.get_run(row.job.run_id)
                except UnknownRun:
                    raise RewindError(
                        f"job {spec.job_id} failed before its run started: {row.error}", ""
                    ) from None
            if self._stopping:
                raise RewindError(
                    "the server stopped while a grid variant was queued",
                    f"its job {spec.job_id} still executes on a worker",
                )
            time.sleep(JOB_POLL_S)

    def remote_fork(
        self,
        cache_mode: str = "replay",
        *,
        restore: str = "refuse",
        created_by: str | None = None,
    ) -> RemoteFork | None:
        """Forks of grid and stability jobs are queued for the workers
        (:meth:`fork_and_wait`), with the job's restore mode and on behalf of its requester."""
        return partial(
            self.fork_and_wait, cache_mode=cache_mode, restore=restore, created_by=created_by
        )

    def execution(self) -> dict[str, Any]:
        """``{"mode": "queue", "queue": URL without password, "reachable": bool}``."""
        from rewind.jobs.queue import QueueUnavailable, check_queue, safe_url

        try:
            check_queue(self.queue)
            reachable = True
        except QueueUnavailable:
            reachable = False
        return {"mode": "queue", "queue": safe_url(self.queue), "reachable": reachable}

    def job(self, run_id: str) -> RunJob | None:
        """None: no job's progress is held in this process."""
        return None

    def active(self) -> list[RunJob]:
        """Jobs the store lists as queued or running."""
        return [self._placeholder_job(row) for row in job_state.active_jobs(self.store)]

    def is_active(self, run_id: str) -> bool:
        """True while the store lists the run's job as queued or running."""
        row = job_state.job_of_run(self.store, run_id)
        return row is not None and not row.done

    def resolve(self, run_id: str) -> RunRecord:
        """The run from the store, or a placeholder from its job's row while it is queued (or
        ``failed`` with the job's error when the job ended before the run existed).

        Raises:
            UnknownRun: neither a run nor a job has this id.
        """
        try:
            return self.store.get_run(run_id)
        except UnknownRun:
            row = job_state.job_of_run(self.store, run_id)
            if row is None:
                raise
            try:
                return self.store.get_run(run_id)
            except UnknownRun:
                return self._placeholder_job(row).placeholder()

    def subscribe(
        self, run_id: str, loop: asyncio.AbstractEventLoop
    ) -> tuple[asyncio.Queue[dict[str, Any]], list[dict[str, Any]], bool]:
        """No events in this process: the stream follows the run through the store."""
        return asyncio.Queue(), [], True

    def _placeholder_job(self, row: Any) -> RunJob:
        spec = row.job
        a = spec.args
        at = a.get("at")
        job = RunJob(
            spec.run_id,
            spec.kind,
            spec.pipeline,
            None,
            parent_run_id=a.get("parent_run_id"),
            fork_position=int(at) - 1 if at is not None else None,
            override=a.get("override"),
            effects=a.get("effects"),
            submitted_at=row.created_at,
            state="done" if row.done else "queued",
            error=row.error,
            spec=spec,
        )
        return job
