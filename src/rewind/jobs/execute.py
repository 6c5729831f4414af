"""One function executes every job, wherever it runs: :func:`run_job`.

The API's in-process worker threads call it with the server's store and model client; a Celery
worker (:mod:`rewind.jobs.queue`) calls it with the store and model client of its own process.
Either way the job's state moves through the store's ``jobs`` table and the run's progress is
what the run's rows say, so any process can follow it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from rewind.engine.attach import load_pipeline
from rewind.errors import RewindError, UnknownRun
from rewind.jobs import state
from rewind.jobs.spec import Job, JobError, override_from_json
from rewind.replay import Pipeline, Rewind, new_run_id
from rewind.store import RunRecord, Store, open_store

logger = logging.getLogger(__name__)

EventListener = Callable[[str, dict[str, Any]], None]
PROCESS_CLIENT: Any = object()
"""``run_job(chat_client=PROCESS_CLIENT)`` (default): this process's model client."""

_stores: dict[str, Store] = {}
_clients: dict[str, Any] = {}
_open_lock = threading.Lock()


def process_store(location: str) -> Store:
    """This process's store at ``location``, opened once (a worker executes many jobs)."""
    with _open_lock:
        store = _stores.get(location)
        if store is None:
            store = _stores[location] = open_store(location)
        return store


def process_chat_client() -> Any:
    """This process's model client: the configured endpoint (``REWIND_BASE_URL``…) or the
    embedded model, opened on the first cache miss."""
    with _open_lock:
        client = _clients.get("lazy")
        if client is None:
            from rewind.session import LazyChatClient

            client = _clients["lazy"] = LazyChatClient()
        return client


def run_job(
    job: Job,
    *,
    store: Store | None = None,
    chat_client: Any = PROCESS_CLIENT,
    pipelines: Iterable[Pipeline] = (),
    on_event: EventListener | None = None,
) -> RunRecord | None:
    """Execute one job and record its state (``running``, then ``succeeded`` or ``failed``).

    Args:
        job: what to do.
        store: the store to use (default: this process's store at ``job.store``).
        chat_client: the model client (default: this process's, see :func:`process_chat_client`;
            None: LLM nodes fail).
        pipelines: pipelines to find by name before importing ``job.pipeline_ref``.
        on_event: the engine's progress listener (``node_started``, ``node_finished``,
            ``run_finished``), called on the executing thread.
    Returns:
        the job's run as it ended, or None when the job was not executed (already done — a
        duplicate delivery — or out of attempts: its row says why).
    Raises:
        RewindError: the job failed before or while its run executed (the job row is
            ``failed`` with this error; the run row, if any, is finished ``failed``).
    """
    st = store if store is not None else process_store(job.store)
    row, skipped = state.begin_attempt(st, job, new_run_id())
    if skipped is not None or row is None:
        logger.info("job %s not executed: %s", job.job_id, skipped)
        return None
    current = row.job
    client = process_chat_client() if chat_client is PROCESS_CLIENT else chat_client
    rw = Rewind(st, chat_client=client, on_event=on_event)
    if "created_by" in current.args:  # the run belongs to the user who asked (None: unowned)
        rw.created_by = current.args["created_by"]
    for p in pipelines:
        rw.register(p)
    error: str | None = None
    try:
        _execute(rw, current)
    except RewindError as exc:
        error = exc.message + (f" — {exc.hint}" if exc.hint else "")
        raise
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        run = _settle_run(st, current.run_id, error)
        if error is None and run is not None and run.status != "completed":
            error = run.error or f"the run ended {run.status}"
        state.end_attempt(st, job.job_id, error=error)
    return run


def _execute(rw: Rewind, job: Job) -> RunRecord:
    a = job.args
    if job.kind == "record":
        return rw.record(
            _pipeline(rw, job),
            dict(a.get("state") or {}),
            run_id=job.run_id,
            config=dict(a.get("config") or {}),
        )
    if job.kind == "fork":
        config = a.get("config")
        return rw.fork(
            str(a["parent_run_id"]),
            at=int(a["at"]),
            override=override_from_json(a.get("override")),
            new_run_id=job.run_id,
            effects=str(a.get("effects") or "recorded"),
            config=None if config is None else dict(config),
            allow_code_change=bool(a.get("allow_code_change", False)),
            restore=str(a.get("restore") or "refuse"),
            cache_mode=str(a.get("cache_mode") or "replay"),
        )
    raise JobError(f"unknown job kind {job.kind!r}", "")


def _pipeline(rw: Rewind, job: Job) -> Pipeline:
    registered = rw._pipelines.get(job.pipeline)
    if registered is not None:
        return registered
    if not job.pipeline_ref:
        raise JobError(
            f"pipeline {job.pipeline!r} is not registered here and has no reference",
            "give the pipeline a ref='module:attr' so workers can import it",
        )
    return load_pipeline(job.pipeline_ref)


def _settle_run(st: Store, run_id: str, error: str | None) -> RunRecord | None:
    """The run as it ended; a run the engine left ``running`` (it raised) is finished failed."""
    try:
        run = st.get_run(run_id)
    except UnknownRun:
        return None
    if run.status == "running":
        st.finish_run(run_id, "failed", error=error or "the run stopped")
        run = st.get_run(run_id)
    return run
