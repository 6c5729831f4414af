"""End to end, as a team deployment runs it: the ``rewind`` CLI in a subprocess configured only by
environment (``REWIND_STORE`` = a PostgreSQL URL, ``REWIND_OBJECTS`` = an S3 bucket, fsspec's
``FSSPEC_S3_ENDPOINT_URL`` = the S3-compatible server), both servers real and on loopback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from rewind.store import open_store
from rewind.store.objects import OFFLOAD_MIN_BYTES, ObjectStore
from tests.cli_process import run_rewind
from tests.services import PostgresServer, S3Server

pytestmark = [pytest.mark.postgres, pytest.mark.s3]


def test_cli_records_and_forks_on_postgres_with_large_blobs_in_s3(
    postgres_server: PostgresServer, s3_server: S3Server, tmp_path: Path
) -> None:
    url = postgres_server.new_database()
    objects_url = f"s3://{s3_server.new_bucket()}/team"
    env = dict(
        REWIND_STORE=url,
        REWIND_OBJECTS=objects_url,
        AWS_ACCESS_KEY_ID="rewind-test",
        AWS_SECRET_ACCESS_KEY="rewind-test",
        AWS_DEFAULT_REGION="us-east-1",
        FSSPEC_S3_ENDPOINT_URL=s3_server.endpoint_url,
    )

    def cli(*args: str) -> Any:
        proc = run_rewind(*args, "--json", env=env, cwd=tmp_path)  # artifacts: ./.rewind
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    doc = "w" * (OFFLOAD_MIN_BYTES + 1)  # one state field large enough to leave the database
    state = json.dumps({"x": 5, "doc": doc})
    run_id = cli("run", "--pipeline", "tests.pipelines:pipeline", "--state", state)["run"]["run_id"]
    fork = cli("fork", run_id, "--at", "expand")
    assert fork["run"]["parent_run_id"] == run_id and fork["run"]["tokens"] == 0
    fork_id = fork["run"]["run_id"]

    objects = ObjectStore(objects_url, **s3_server.storage_options)
    store = open_store(url, root=tmp_path / ".rewind", objects=objects)
    parent = [n.output_hash for n in store.nodes_of(run_id)]
    child = [n.output_hash for n in store.nodes_of(fork_id)]
    assert child == parent  # an unchanged replay: every output hash identical
    with store.read() as conn:
        offloaded = conn.execute(text("SELECT hash, ref FROM blobs WHERE codec = 'object'")).all()
    assert len(offloaded) == 1
    [(digest, ref)] = offloaded
    assert ref == objects.blob_ref(digest)
    assert json.loads(objects.get_blob(ref, digest)) == doc  # in the bucket, hash-verified
    store.close()
