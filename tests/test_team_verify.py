"""``rewind verify --server`` against a team setup, every service real and on loopback: the store
on a throwaway PostgreSQL, jobs through Redis to a ``rewind worker`` process, large blobs and
artifact copies in a moto S3 bucket. The CLI runs in a subprocess configured only by environment,
as a team member would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from rewind.api.verify_http import TeamSetup, queue_workers, verification_worker
from rewind.store import open_store
from rewind.store.objects import ObjectStore
from tests.services import PostgresServer, RedisServer, S3Server, reap

ROOT = Path(__file__).resolve().parent.parent

OFFLOAD_BYTES = 256  # small enough that the demo's node states and outputs leave the database


def _team_env(url: str, queue: str, objects_url: str, s3: S3Server) -> dict[str, str]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        REWIND_STORE=url,
        REWIND_QUEUE=queue,
        REWIND_OBJECTS=objects_url,
        REWIND_OBJECTS_MIN_BYTES=str(OFFLOAD_BYTES),
        AWS_ACCESS_KEY_ID="rewind-test",
        AWS_SECRET_ACCESS_KEY="rewind-test",
        AWS_DEFAULT_REGION="us-east-1",
        FSSPEC_S3_ENDPOINT_URL=s3.endpoint_url,
    )
    env.pop("REWIND_TOKEN", None)
    return env


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.s3
def test_verify_server_passes_on_postgres_redis_workers_and_s3(
    postgres_server: PostgresServer,
    redis_server: RedisServer,
    s3_server: S3Server,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    url = postgres_server.new_database()
    queue = redis_server.new_url()
    bucket = s3_server.new_bucket()
    objects_url = f"s3://{bucket}/team"
    env = _team_env(url, queue, objects_url, s3_server)
    worker_dir = tmp_path / "worker"  # the worker's own folder: artifacts reach the server by S3
    worker_dir.mkdir()
    worker_log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "rewind", "worker", "--concurrency", "1"],
        cwd=worker_dir,
        env=env,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
    )
    request.addfinalizer(worker_log.close)
    request.addfinalizer(lambda: reap(worker))  # terminated below
    try:
        while not queue_workers(queue, timeout=0.25, settle=0):  # returns at its first answer
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        verify = subprocess.run(
            [sys.executable, "-m", "rewind", "verify", "--server"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert worker.poll() is None, "the team's worker must outlive the verification"
    finally:
        # Its warm shutdown (~2 s) overlaps the checks below; the finalizer waits for it.
        worker.terminate()
    report = verify.stdout + verify.stderr
    print(report)  # shown with -s, and on failure
    assert verify.returncode == 0, report + (tmp_path / "worker.log").read_text()
    assert "14/14 checks passed over HTTP" in verify.stdout, report
    assert "1 rewind worker(s) consume the queue" in verify.stdout, report  # not one of its own
    assert "postgresql+psycopg://" in verify.stdout and "queue redis://" in verify.stdout, report
    assert not list(tmp_path.glob("rewind-verify-server-*")), "verify left its folder behind"

    objects = ObjectStore(objects_url, **s3_server.storage_options)
    store = open_store(url, root=tmp_path / ".rewind", objects=objects)
    try:
        assert store.engine.dialect.name == "postgresql"
        with store.read() as conn:
            runs = conn.execute(text("SELECT run_id, status FROM runs")).all()
            jobs = conn.execute(text("SELECT run_id, worker FROM jobs")).all()
            offloaded = conn.execute(
                text("SELECT hash, ref FROM blobs WHERE codec = 'object'")
            ).all()
            artifacts = conn.execute(text("SELECT run_id, name, sha256 FROM artifacts")).all()
        # record, fork, replay, check 14's replay: all completed, each executed by the worker
        assert len(runs) == 4 and {status for _, status in runs} == {"completed"}, runs
        assert {run_id for run_id, _ in jobs} == {run_id for run_id, _ in runs}, jobs
        assert all(w for _, w in jobs), jobs  # host:pid of the worker's pool process
        assert len({w for _, w in jobs}) == 1, jobs  # the one worker of this test
        # Large blobs live in the bucket (hash-verified on read), not in the database.
        assert offloaded, "no blob reached the object store"
        for digest, ref in offloaded:
            assert ref == objects.blob_ref(digest)
            assert len(objects.get_blob(ref, digest)) >= OFFLOAD_BYTES
        # The worker published the artifacts in its own folder; their copies are in the bucket.
        assert artifacts
        for run_id, name, digest in artifacts:
            assert (worker_dir / ".rewind" / "artifacts" / run_id / name).is_file()
            ref = f"{objects_url}/artifacts/{run_id}/{name}"
            assert objects.get_object(ref, digest)
    finally:
        store.close()


def test_verify_server_with_a_queue_but_no_database_store_is_bad_input(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), REWIND_QUEUE=redis_server.new_url())
    env.pop("REWIND_STORE", None)
    proc = subprocess.run(
        [sys.executable, "-m", "rewind", "verify", "--server"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "needs the team's database --store" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


@pytest.mark.postgres
def test_verify_starts_a_worker_when_none_consumes_the_queue_and_stops_it(
    postgres_server: PostgresServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    queue = redis_server.new_url()
    setup = TeamSetup(postgres_server.new_database(), queue, None, workdir=str(tmp_path))
    said: list[str] = []
    assert queue_workers(queue, timeout=0.5) == []
    with verification_worker(setup, said.append):
        assert len(queue_workers(queue)) == 1  # it answers before verify goes on
        assert "started one for this verification" in said[0]
    assert queue_workers(queue, timeout=0.5) == []  # its process has exited
    assert "stopped the rewind worker verify started" in said[-1]


def test_a_broker_that_goes_away_during_the_ping_is_a_clear_queue_error(tmp_path: Path) -> None:
    """Redis stops while verify's ping waits for workers' answers: QueueUnavailable (what
    verify shows with its hint), not the Redis client's ConnectionError."""
    import shutil
    import threading

    from rewind.jobs.queue import QueueUnavailable
    from tests.services import free_port, missing_service

    binary = shutil.which("redis-server")
    if binary is None:
        missing_service("no redis-server binary (make redis installs Debian's redis-server)")
    port = free_port()
    command = [str(binary), "--bind", "127.0.0.1", "--port", str(port), "--save", ""]
    command += ["--appendonly", "no", "--dir", str(tmp_path)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    queue = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(100):
            try:
                queue_workers(queue, timeout=0.05)
                break
            except QueueUnavailable:  # not listening yet
                if proc.poll() is not None:
                    pytest.fail(f"redis-server exited at start with status {proc.returncode}")
                threading.Event().wait(0.1)
        threading.Timer(0.3, proc.kill).start()  # mid-ping: no worker answers for 30 s
        with pytest.raises(QueueUnavailable, match="cannot reach the task queue"):
            queue_workers(queue, timeout=30.0)  # ends at the error, ~0.3 s in
    finally:
        proc.kill()
        reap(proc)
