"""A job described by data: what long-running work to do, never a closure.

A :class:`Job` is frozen and round-trips through JSON (:meth:`Job.to_json` /
:meth:`Job.from_json`), so the same description can execute on an in-process worker thread or
travel through a Redis queue to a Celery worker on another machine.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rewind.errors import RewindError
from rewind.replay import InputOverride, OutputOverride, Override, ParamOverride

JOB_KINDS = ("record", "fork")
"""What a job can do: record a new run of a pipeline, or fork a finished run at a node."""


class JobError(RewindError):
    """A job description that cannot be executed (unknown kind, missing or malformed field)."""


def _frozen(value: Any) -> Any:
    # JSON arguments, deep-copied through JSON so nothing outside can change the job after it
    # was described; the top level is a read-only mapping.
    return MappingProxyType(json.loads(json.dumps(value)))


@dataclass(frozen=True)
class Job:
    """One unit of long-running work.

    Attributes:
        kind: ``record`` or ``fork`` (:data:`JOB_KINDS`).
        job_id: the job's id (32 hex characters), chosen when it is accepted.
        run_id: the id of the run the job creates (a retry after a lost worker creates another:
            the job's row in the store names the current one).
        store: where the store is (a folder, a ``.db`` path or a database URL without its
            password); a worker started with ``--store`` uses its own location instead.
        pipeline: the pipeline's name (found among the executor's registered pipelines first).
        pipeline_ref: ``module:attribute`` that imports the pipeline in another process ("" for
            a pipeline only registered in this process).
        args: the kind's arguments, JSON values. ``record``: ``state`` (the initial state),
            ``config``. ``fork``: ``parent_run_id``, ``at`` (1-based node number), ``override``
            (``Override.to_json()`` or None), ``effects``, ``allow_code_change``, ``restore``,
            optional ``config`` and ``cache_mode`` (``replay``; ``stability`` for a sample).
    """

    kind: str
    job_id: str
    run_id: str
    store: str
    pipeline: str
    pipeline_ref: str = ""
    args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in JOB_KINDS:
            raise JobError(f"unknown job kind {self.kind!r}", f"use one of {', '.join(JOB_KINDS)}")
        try:
            object.__setattr__(self, "args", _frozen(dict(self.args)))
        except (TypeError, ValueError) as exc:
            raise JobError(f"job arguments are not JSON: {exc}", "pass JSON values") from exc

    def to_json(self) -> dict[str, Any]:
        """The job as a JSON object (what the queue carries and the jobs table keeps)."""
        return {
            "kind": self.kind,
            "job_id": self.job_id,
            "run_id": self.run_id,
            "store": self.store,
            "pipeline": self.pipeline,
            "pipeline_ref": self.pipeline_ref,
            "args": json.loads(json.dumps(dict(self.args))),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Job:
        """The job :meth:`to_json` wrote.

        Raises:
            JobError: a field is missing or of the wrong type, or the kind is unknown.
        """
        try:
            strings = {k: doc[k] for k in ("kind", "job_id", "run_id", "store", "pipeline")}
        except (KeyError, TypeError) as exc:
            raise JobError(f"a job description lacks {exc}", "describe jobs with Job") from exc
        if not all(isinstance(v, str) for v in strings.values()):
            raise JobError("a job description has a non-string id or name", "")
        args = doc.get("args") or {}
        if not isinstance(args, Mapping):
            raise JobError("a job's args must be a JSON object", "")
        return cls(**strings, pipeline_ref=str(doc.get("pipeline_ref") or ""), args=args)

    def with_run_id(self, run_id: str) -> Job:
        """The same job creating another run (a retry after a lost worker)."""
        return Job(
            self.kind, self.job_id, run_id, self.store, self.pipeline, self.pipeline_ref, self.args
        )


def override_from_json(doc: Mapping[str, Any] | None) -> Override | None:
    """The override ``Override.to_json()`` wrote (None stays None).

    Raises:
        JobError: an unknown override kind or a missing field.
    """
    if doc is None:
        return None
    kind = doc.get("kind")
    try:
        if kind == "param":
            return ParamOverride(str(doc["node"]), str(doc["param"]), doc["value"])
        if kind == "output":
            return OutputOverride(str(doc["node"]), str(doc["field"]), doc["value"])
        if kind == "input":
            return InputOverride(str(doc["node"]), str(doc["name"]), doc["value"])
    except KeyError as exc:
        raise JobError(f"a {kind} override lacks {exc}", "") from exc
    raise JobError(f"unknown override kind {kind!r}", "use param, output or input")


def new_job_id() -> str:
    """A new job id (uuid4 hex, 32 characters)."""
    return uuid.uuid4().hex


def store_location(store: Any) -> str:
    """Where a worker finds ``store`` (a :class:`rewind.store.Store`): the SQLite file's path,
    or the database URL with its password hidden (a worker of a password-protected database is
    started with ``--store URL``)."""
    url = store.engine.url
    if url.get_backend_name() == "sqlite":
        return str(url.database)
    return str(url.render_as_string(hide_password=True))
