"""Jobs as data (:class:`Job`), their state in the store, and where they execute: in-process
worker threads by default, Celery workers over Redis when ``REWIND_QUEUE`` is set
(:mod:`rewind.jobs.queue`). Both call :func:`run_job`."""

from rewind.jobs.execute import run_job
from rewind.jobs.spec import JOB_KINDS, Job, JobError, override_from_json

__all__ = ["JOB_KINDS", "Job", "JobError", "override_from_json", "run_job"]
