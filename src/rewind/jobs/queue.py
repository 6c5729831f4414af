"""Jobs over a real task queue: Celery workers with a Redis broker (``REWIND_QUEUE=redis://…``).

Without ``REWIND_QUEUE`` the API executes jobs on its own worker threads
(:class:`rewind.api.runner.RunManager`); with it, the API writes the job's row (``queued``) and
publishes the job's JSON to the broker, and any ``rewind worker`` process executes it with
:func:`rewind.jobs.execute.run_job` — the same function the threads call.

Delivery: ``acks_late`` + ``reject_on_worker_lost``: a message is acknowledged only once its job
ended, and a worker process that dies mid-job (SIGKILL, out of memory) hands the message back to
the broker, so another worker (or the same one's next child) takes it. That delivery finds the
job ``running`` with a dead owner: the lost attempt's run is marked ``interrupted`` and the job
retried under a new run id, at most :data:`rewind.jobs.state.MAX_ATTEMPTS` times, then failed
with the reason. ``worker_prefetch_multiplier=1``: a worker reserves one job per free process,
so a grid's variants spread over every worker.

A whole worker (the parent process) killed leaves its reserved message unacknowledged in Redis;
it is handed out again after the broker's visibility timeout (:data:`VISIBILITY_TIMEOUT_S`;
every running worker looks for such messages at least every 10 s), and ``rewind worker`` marks
runs of dead processes of its host ``interrupted`` when it starts.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

from rewind.errors import RewindError
from rewind.jobs.spec import Job

QUEUE_ENV = "REWIND_QUEUE"
"""Environment variable naming the broker (``redis://host:port/db``); unset: in-process."""
TASK_NAME = "rewind.run_job"
VISIBILITY_TIMEOUT_S = 3600
"""Seconds after which Redis hands out again a job a worker reserved but never acknowledged (its
whole worker died); ``REWIND_QUEUE_VISIBILITY_S`` changes it. Keep it above the longest job: a
job still executing past it is handed out a second time (a second worker on the same host sees
the first one alive and skips it; on another host the first attempt's run is marked
``interrupted`` and the job retried)."""
VISIBILITY_ENV = "REWIND_QUEUE_VISIBILITY_S"
CONNECT_TIMEOUT_S = 3.0


class QueueUnavailable(RewindError):
    """The task queue's broker cannot be reached (or Celery is not installed)."""


def queue_url(url: str | None = None) -> str | None:
    """``url``, else ``REWIND_QUEUE`` from the environment; None when neither is set."""
    found = (url or os.environ.get(QUEUE_ENV, "")).strip()
    return found or None


_apps: dict[str, Any] = {}
_apps_lock = threading.Lock()


def celery_app(url: str) -> Any:
    """The Celery application for the broker at ``url`` (one per URL and process), with the
    ``rewind.run_job`` task registered.

    Raises:
        QueueUnavailable: Celery is not installed, or the URL is not a redis:// URL.
    """
    if not url.startswith(("redis://", "rediss://")):
        raise QueueUnavailable(
            f"the queue URL {url!r} is not a Redis URL",
            "pass --queue redis://HOST:PORT/0 (or set REWIND_QUEUE)",
        )
    with _apps_lock:
        app = _apps.get(url)
        if app is not None:
            return app
        try:
            from celery import Celery
        except ModuleNotFoundError as exc:
            raise QueueUnavailable(
                "the task queue needs Celery, which is not installed",
                "pip install 'rewind-replay[queue]'",
            ) from exc
        visibility = _visibility_s()
        app = Celery("rewind", broker=url, set_as_current=False)
        app.conf.update(
            task_acks_late=True,
            task_reject_on_worker_lost=True,
            worker_prefetch_multiplier=1,
            task_serializer="json",
            accept_content=["json"],
            task_ignore_result=True,
            broker_connection_retry_on_startup=False,
            broker_connection_timeout=CONNECT_TIMEOUT_S,
            broker_transport_options={
                "visibility_timeout": visibility,
                # Every running worker looks for jobs whose worker vanished (kombu's default
                # scans once every 10 × 10 s); a scan is one sorted-set range query.
                "unacked_restore_interval": max(1.0, min(10.0, visibility / 3)),
                "unacked_restore_throttle": 1,
                "socket_connect_timeout": CONNECT_TIMEOUT_S,
                "socket_timeout": 30,
            },
            worker_hijack_root_logger=False,
            worker_send_task_events=False,
            # Celery's prefork pool, noticing a killed pool process at once (not up to 5 s on).
            worker_pool="rewind.jobs.pool:TaskPool",
        )
        app.task(name=TASK_NAME, bind=False)(_run_job_task)
        _apps[url] = app
        return app


def _visibility_s() -> float:
    raw = os.environ.get(VISIBILITY_ENV, "").strip()
    try:
        value = float(raw) if raw else float(VISIBILITY_TIMEOUT_S)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise QueueUnavailable(
            f"{VISIBILITY_ENV}={raw!r} is not a positive number of seconds",
            f"unset it (default {VISIBILITY_TIMEOUT_S}) or set it above your longest job",
        )
    return value


def _run_job_task(doc: dict[str, Any]) -> None:
    """The Celery task: execute one job described by ``doc`` (:meth:`Job.to_json`)."""
    import logging

    from rewind.jobs.execute import run_job

    job = Job.from_json(doc)
    store_override = os.environ.get(WORKER_STORE_ENV, "").strip()
    if store_override:
        job = Job(
            job.kind,
            job.job_id,
            job.run_id,
            store_override,
            job.pipeline,
            job.pipeline_ref,
            job.args,
        )
    try:
        run_job(job)
    except RewindError as exc:  # recorded on the job's row; the message is done with
        logging.getLogger(__name__).warning("job %s failed: %s", job.job_id, exc.message)


WORKER_STORE_ENV = "REWIND_WORKER_STORE"
"""Set by ``rewind worker --store``: the store every job executes against."""


def check_queue(url: str) -> None:
    """Connect to the broker once (at most :data:`CONNECT_TIMEOUT_S` seconds).

    Raises:
        QueueUnavailable: the broker does not answer, with how to fix it.
    """
    app = celery_app(url)
    _probe(
        url,
        "cannot reach the task queue at",
        "start Redis (redis-server) or fix --queue / REWIND_QUEUE",
    )
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=CONNECT_TIMEOUT_S)
    except Exception as exc:  # kombu's OperationalError, socket errors, bad credentials
        raise QueueUnavailable(
            f"cannot reach the task queue at {safe_url(url)}: {_first_line(exc)}",
            "start Redis (redis-server) or fix --queue / REWIND_QUEUE",
        ) from exc


def publish(url: str, job: Job) -> None:
    """Hand one job to the queue's workers.

    Raises:
        QueueUnavailable: the broker refused the message or cannot be reached.
    """
    app = celery_app(url)
    hint = "start Redis (redis-server) or fix REWIND_QUEUE, then retry"
    _probe(url, "cannot hand the job to the task queue at", hint)
    try:
        app.send_task(
            TASK_NAME,
            args=[job.to_json()],
            task_id=job.job_id,
            retry=False,
        )
    except Exception as exc:
        raise QueueUnavailable(
            f"cannot hand the job to the task queue at {safe_url(url)}: {_first_line(exc)}",
            hint,
        ) from exc


def start_worker(url: str, *, concurrency: int, loglevel: str = "INFO", name: str = "") -> None:
    """Run a Celery worker (prefork pool of ``concurrency`` processes) until it is stopped.

    Raises:
        QueueUnavailable: the broker cannot be reached.
    """
    check_queue(url)
    app = celery_app(url)
    argv = [
        "worker",
        f"--concurrency={concurrency}",
        f"--loglevel={loglevel}",
        "--pool=prefork",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    if name:
        argv.append(f"--hostname={name}")
    app.worker_main(argv)


def _probe(url: str, what: str, hint: str) -> None:
    """Fail fast when nothing listens at the broker's address (the Redis client would retry a
    refused connection with back-off for seconds before giving up)."""
    parts = urlsplit(url)
    if not parts.hostname:
        return
    try:
        with socket.create_connection(
            (parts.hostname, parts.port or 6379), timeout=CONNECT_TIMEOUT_S
        ):
            pass
    except OSError as exc:
        raise QueueUnavailable(f"{what} {safe_url(url)}: {exc.strerror or exc}", hint) from exc


def safe_url(url: str) -> str:
    """``url`` with its credentials hidden (for messages and ``/api/health``)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
