"""Jobs as data and their rows in the store (no queue needed): the description round-trips
through JSON, bad descriptions are refused, and a redelivered job's lost attempt is settled —
the run interrupted and a new run id — or, when its process still runs, the duplicate skipped."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from rewind.jobs import Job, JobError, run_job
from rewind.jobs import state as job_state
from rewind.jobs.spec import new_job_id, override_from_json, store_location
from rewind.replay import OutputOverride, ParamOverride
from rewind.store import Store, open_store, schema
from rewind.store.store import current_owner
from tests import queue_pipelines


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    st = open_store(tmp_path / "store")
    yield st
    st.close()


def record_job(store: Store, run_id: str = "r" * 32) -> Job:
    return Job(
        "record",
        new_job_id(),
        run_id,
        store_location(store),
        "scaling",
        "tests.queue_pipelines:scaling",
        {"state": {"x": 3}, "config": {}},
    )


def test_a_job_round_trips_through_json_and_cannot_change(store: Store) -> None:
    job = record_job(store)
    again = Job.from_json(json.loads(json.dumps(job.to_json())))
    assert again == job
    with pytest.raises(TypeError):
        job.args["state"] = {}  # type: ignore[index]
    for o in (ParamOverride("scale", "factor", [1, 2]), OutputOverride("seed", "series", None)):
        assert override_from_json(o.to_json()) == o


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"kind": "delete", "job_id": "j", "run_id": "r", "store": "s", "pipeline": "p"}, "kind"),
        ({"kind": "fork", "job_id": "j", "run_id": "r", "store": "s"}, "lacks"),
        ({"kind": "fork", "job_id": 1, "run_id": "r", "store": "s", "pipeline": "p"}, "string"),
    ],
)
def test_malformed_job_descriptions_are_refused(doc: dict[str, object], message: str) -> None:
    with pytest.raises(JobError, match=message):
        Job.from_json(doc)


def test_run_job_records_the_job_succeeded_in_this_process(store: Store) -> None:
    job = record_job(store)
    job_state.add_job(store, job)
    run = run_job(job, store=store, chat_client=None)
    assert run is not None and run.status == "completed"
    row = job_state.get_job(store, job.job_id)
    assert row is not None
    assert (row.state, row.attempts, row.error, row.worker) == (
        "succeeded", 1, None, current_owner()
    )  # fmt: skip
    assert run_job(job, store=store, chat_client=None) is None  # a duplicate delivery: skipped


def _running_row(store: Store, job: Job, owner: str) -> None:
    job_state.add_job(store, job)
    with store.write() as conn:
        store.create_run(conn, run_id=job.run_id, pipeline="scaling", owner=owner)
    job_state.begin_attempt(store, job, "unused")  # the attempt a worker started
    with store.write() as conn:  # ...in the process named by owner
        conn.execute(update(schema.jobs).values(worker=owner))


def test_a_redelivered_job_of_a_lost_worker_on_another_host_retries_under_a_new_run(
    store: Store,
) -> None:
    job = record_job(store)
    _running_row(store, job, "another-host:4242:1.00")
    row, skipped = job_state.begin_attempt(store, job, "n" * 32)
    assert skipped is None and row is not None
    assert (row.state, row.attempts, row.job.run_id, row.earlier_runs) == (
        "running", 2, "n" * 32, (job.run_id,)
    )  # fmt: skip
    lost = store.get_run(job.run_id)
    assert lost.status == "interrupted" and "lost" in (lost.error or "")


def test_a_duplicate_delivery_while_the_run_still_executes_here_is_skipped(store: Store) -> None:
    job = record_job(store)
    alive = f"{socket.gethostname()}:{os.getpid()}"
    _running_row(store, job, alive)
    row, skipped = job_state.begin_attempt(store, job, "n" * 32)
    assert skipped is not None and "still executing" in skipped
    assert row is not None and row.attempts == 1 and row.job.run_id == job.run_id
    assert store.get_run(job.run_id).status == "running"


def test_a_record_job_of_an_unimportable_pipeline_fails_visibly(store: Store) -> None:
    job = Job("record", new_job_id(), "q" * 32, store_location(store), "nowhere", "", {})
    job_state.add_job(store, job)
    with pytest.raises(JobError, match="no reference"):
        run_job(job, store=store, chat_client=None)
    row = job_state.get_job(store, job.job_id)
    assert row is not None and row.state == "failed" and "no reference" in (row.error or "")
    assert queue_pipelines.scaling.ref  # the pipeline the other tests use has one
