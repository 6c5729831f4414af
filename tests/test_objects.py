"""Object storage conformance: the same tests on a local folder (``file://``) and on a real
S3-compatible HTTP server (moto on loopback, through s3fs) — large blobs leave the database,
the row keeps hash + reference, reads are verified against the hash."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from sqlalchemy import select, text

from rewind.errors import StoreError
from rewind.replay import Rewind
from rewind.store import open_store, schema
from rewind.store.objects import ObjectStore
from tests import pipelines
from tests.conftest import StoreTarget
from tests.services import S3Server


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def objects(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        bucket = server.new_bucket()
        return ObjectStore(f"s3://{bucket}/team/rewind", **server.storage_options)
    return ObjectStore((tmp_path / "objects").resolve().as_uri())


def test_blob_round_trips_and_is_keyed_by_its_hash(objects: ObjectStore) -> None:
    data = b"\x00" + b"payload " * 1000
    digest = hashlib.sha256(data).hexdigest()
    ref = objects.put_blob(digest, data)
    assert ref == f"{objects.url}/blobs/{digest[:2]}/{digest}"
    assert objects.get_blob(ref, digest) == data


def test_changed_object_fails_its_hash_check(objects: ObjectStore) -> None:
    digest = hashlib.sha256(b"original").hexdigest()
    ref = objects.put_blob(digest, b"original")
    objects.fs.pipe_file(objects._path(ref), b"tampered")
    with pytest.raises(StoreError, match="does not match its hash"):
        objects.get_blob(ref, digest)


def test_deleted_object_is_a_clear_error(objects: ObjectStore) -> None:
    digest = hashlib.sha256(b"gone").hexdigest()
    ref = objects.put_blob(digest, b"gone")
    objects.delete(ref)
    objects.delete(ref)  # deleting twice is fine
    with pytest.raises(StoreError, match="cannot be read"):
        objects.get_blob(ref, digest)


def test_store_keeps_large_blobs_in_the_object_store(
    store_target: StoreTarget, objects: ObjectStore
) -> None:
    store = open_store(store_target.location, root=store_target.root, objects=objects)
    store.offload_min_bytes = 100
    small, large = b"small", b"L" * 5000
    with store.write() as conn:
        digests = [store.put_blob(conn, small), store.put_blob(conn, large)]
    b = schema.blobs  # through the schema's types: hashes read back as hex on every backend
    with store.read() as conn:
        rows = {
            r.hash: r
            for r in conn.execute(select(b.c.hash, b.c.codec, b.c.size, b.c.data, b.c.ref)).all()
        }
    assert rows[digests[0]].codec != "object" and rows[digests[0]].ref is None
    assert rows[digests[1]].codec == "object"
    assert bytes(rows[digests[1]].data) == b""  # the database keeps hash + reference only
    assert rows[digests[1]].size == len(large)
    assert rows[digests[1]].ref == objects.blob_ref(digests[1])
    assert store.get_blobs(digests) == {digests[0]: small, digests[1]: large}
    store.close()


def test_recorded_run_with_offloaded_state_forks_from_the_object_store(
    tmp_path: Path, objects: ObjectStore
) -> None:
    store = open_store(tmp_path / "store", objects=objects)
    store.offload_min_bytes = 1  # every blob leaves the database
    rw = Rewind(store)
    run = rw.record(pipelines.pipeline, {"x": 5})
    child = rw.fork(run.run_id, at="expand")
    assert rw.store.get_run(child.run_id).status == "completed"
    parent_out = [n.output_hash for n in rw.store.nodes_of(run.run_id)]
    child_out = [n.output_hash for n in rw.store.nodes_of(child.run_id)]
    assert child_out == parent_out  # an unchanged replay, read back through object storage
    with store.read() as conn:
        inline = conn.execute(text("SELECT COUNT(*) FROM blobs WHERE codec != 'object'"))
        assert inline.scalar_one() == 0
    store.close()


def test_unknown_object_store_protocol_is_a_clear_error() -> None:
    with pytest.raises(StoreError, match="cannot use the object store URL"):
        ObjectStore("nosuchproto://bucket/x")


def test_bad_object_store_url_creates_no_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="nosuchproto"):
        open_store(tmp_path / "store", objects="nosuchproto://bucket/x")
    assert not (tmp_path / "store").exists()


def test_offload_threshold_comes_from_the_environment(
    tmp_path: Path, objects: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REWIND_OBJECTS_MIN_BYTES", "100")
    store = open_store(tmp_path / "store", objects=objects)
    assert store.offload_min_bytes == 100
    with store.write() as conn:
        digest = store.put_blob(conn, b"L" * 100)
    with store.read() as conn:
        b = schema.blobs
        codec = conn.execute(select(b.c.codec).where(b.c.hash == digest))
        assert codec.scalar_one() == "object"
    store.close()


@pytest.mark.parametrize("value", ["0", "-5", "64k", "1.5"])
def test_bad_offload_threshold_is_a_clear_error_and_creates_no_store(
    tmp_path: Path, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REWIND_OBJECTS_MIN_BYTES", value)
    with pytest.raises(StoreError, match=r"REWIND_OBJECTS_MIN_BYTES=.* is not a whole number"):
        open_store(tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_artifacts_are_copied_to_the_object_store(tmp_path: Path, objects: ObjectStore) -> None:
    store = open_store(tmp_path / "store", objects=objects)
    digest, path = store.put_artifact("run1", "report.md", b"# report\n")
    assert path.read_bytes() == b"# report\n"
    ref = f"{objects.url}/artifacts/run1/report.md"
    assert objects.get_object(ref, digest) == b"# report\n"  # hash-verified
    store.close()
