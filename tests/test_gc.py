"""Retention (``rewind gc``) on every backend: SQLite and PostgreSQL, archives and offloaded blobs
on ``file://`` and on a real S3-compatible server (moto on loopback).

Runs are aged by moving their ``created_at``/``finished_at`` back (the ``runs`` table is not
immutable; recorded node rows are, and stay untouched): the gc's clock is the real one.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.exc import SQLAlchemyError

from rewind.errors import StoreError, UnknownRun
from rewind.replay import Rewind
from rewind.store import Store, open_store, schema
from rewind.store.objects import ObjectStore
from rewind.store.retention import (
    RUN_TABLES,
    InvalidAge,
    archived_runs,
    bump_blob_epoch,
    collect_garbage,
    parse_age,
    restore_run,
)
from rewind.store.store import WriteBatch, state_row, state_row_hashes
from tests import pipelines
from tests.cli_process import run_rewind
from tests.services import PostgresServer, S3Server

DAY = 86400.0
MONTH = 30 * DAY
BIG = 2048  # bytes: blobs this large leave the database for the object store in these tests


@dataclass
class GcTarget:
    """A store on one backend with its object store (offloaded blobs and archives)."""

    name: str
    store: Store
    objects: ObjectStore

    def rewind(self) -> Rewind:
        return Rewind(self.store)


def _objects(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if kind == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        return ObjectStore(f"s3://{server.new_bucket()}/team", **server.storage_options)
    return ObjectStore((tmp_path / "objects").resolve().as_uri())


def _open(backend: str, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> GcTarget:
    objects = _objects(kind, request, tmp_path)
    root = tmp_path / "store"
    location: str | Path = root
    if backend == "postgresql":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        location = server.new_store_database()
    store = open_store(location, root=root, objects=objects)
    store.offload_min_bytes = BIG
    return GcTarget(f"{backend}/{kind}", store, objects)


PAIRS = [
    pytest.param(("sqlite", "file"), id="sqlite-file"),
    pytest.param(
        ("postgresql", "s3"), id="postgresql-s3", marks=[pytest.mark.postgres, pytest.mark.s3]
    ),
]
ALL = [
    *PAIRS,
    pytest.param(("sqlite", "s3"), id="sqlite-s3", marks=pytest.mark.s3),
    pytest.param(("postgresql", "file"), id="postgresql-file", marks=pytest.mark.postgres),
]


@pytest.fixture(params=PAIRS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GcTarget]:
    backend, kind = request.param
    t = _open(backend, kind, request, tmp_path)
    yield t
    t.store.close()


@pytest.fixture(params=ALL)
def any_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GcTarget]:
    backend, kind = request.param
    t = _open(backend, kind, request, tmp_path)
    yield t
    t.store.close()


def age(store: Store, run_id: str, days: float) -> None:
    """Make a run look created and finished ``days`` ago."""
    when = time.time() - days * DAY
    with store.write() as conn:
        conn.execute(
            update(schema.runs)
            .where(schema.runs.c.run_id == run_id)
            .values(created_at=when, finished_at=when)
        )


def run_ids(store: Store) -> set[str]:
    with store.read() as conn:
        return {r[0] for r in conn.execute(select(schema.runs.c.run_id))}


def rows_of(store: Store, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """Every row of a run in every run-scoped table, in key order."""
    out: dict[str, list[dict[str, Any]]] = {}
    with store.read() as conn:
        for table, column in RUN_TABLES:
            rows = conn.execute(
                select(table).where(table.c[column] == run_id).order_by(*table.primary_key.columns)
            ).all()
            out[table.name] = [dict(r._mapping) for r in rows]
    return out


def blob_hashes(store: Store) -> set[str]:
    with store.read() as conn:
        return {r[0] for r in conn.execute(select(schema.blobs.c.hash))}


def snapshot(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (what a dry run must leave exactly as it was)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with store.read() as conn:
        for table in schema.metadata.sorted_tables:
            rows = conn.execute(select(table).order_by(*table.primary_key.columns)).all()
            out[table.name] = [tuple(r) for r in rows]
        version = conn.execute(text("SELECT * FROM alembic_version"))
        out["alembic_version"] = [tuple(r) for r in version]
    return out


def objects_listing(objects: ObjectStore) -> list[str]:
    try:
        return sorted(objects.fs.find(objects._base))
    except FileNotFoundError:
        return []


def referenced_blobs_exist(store: Store, run_id: str) -> None:
    """Every blob a kept run's rows name can be read (none was deleted under it)."""
    rows = rows_of(store, run_id)
    wanted = {n["output_hash"] for n in rows["nodes"] if n["output_hash"]}
    wanted |= {n["input_hash"] for n in rows["nodes"]}
    for state in rows["burr_state"]:
        wanted |= state_row_hashes(state["fields_json"])
    wanted |= {c["result_hash"] for c in rows["calls"] if c["result_hash"]}
    assert store.get_blobs(wanted)  # raises StoreError when one is missing


# -- forks of forks ----------------------------------------------------------------------------
def test_old_root_and_middle_with_a_new_leaf_archive_nothing_of_the_chain(
    target: GcTarget,
) -> None:
    rw = target.rewind()
    root = rw.record(pipelines.pipeline, {"x": 5})
    middle = rw.fork(root.run_id, at="expand", override=None)
    leaf = rw.fork(middle.run_id, at="small")
    lone = rw.record(pipelines.pipeline, {"x": 50})  # old, no kept descendant: archived
    for run_id in (root.run_id, middle.run_id, lone.run_id):
        age(target.store, run_id, 40)

    report = collect_garbage(target.store, MONTH, archive=target.objects)

    assert [a.run_id for a in report.archived] == [lone.run_id]
    assert sorted(report.kept_ancestors) == sorted([root.run_id, middle.run_id])
    assert run_ids(target.store) == {root.run_id, middle.run_id, leaf.run_id}
    for run_id in (root.run_id, middle.run_id, leaf.run_id):
        referenced_blobs_exist(target.store, run_id)
    # the kept chain still forks: an unchanged replay of the leaf hits every call
    again = rw.fork(leaf.run_id, at="expand")
    assert again.tokens == 0
    assert [n.output_hash for n in target.store.nodes_of(again.run_id)] == [
        n.output_hash for n in target.store.nodes_of(leaf.run_id)
    ]


def test_old_leaf_with_old_ancestors_archives_the_whole_chain_and_restores_it(
    target: GcTarget,
) -> None:
    rw = target.rewind()
    root = rw.record(pipelines.pipeline, {"x": 5})
    middle = rw.fork(root.run_id, at="expand")
    leaf = rw.fork(middle.run_id, at="small")
    chain = (root.run_id, middle.run_id, leaf.run_id)
    for run_id in chain:
        age(target.store, run_id, 40)
    before = {run_id: rows_of(target.store, run_id) for run_id in chain}

    report = collect_garbage(target.store, MONTH, archive=target.objects)

    # children before parents: a fork's row must go before the run it names as parent
    assert [a.run_id for a in report.archived] == [leaf.run_id, middle.run_id, root.run_id]
    assert run_ids(target.store) == set()
    with pytest.raises(UnknownRun):
        target.store.get_run(leaf.run_id)
    assert {r["run_id"] for r in archived_runs(target.store)} == set(chain)

    restored = restore_run(target.store, leaf.run_id[:8], archive=target.objects)

    assert restored.run_id == leaf.run_id
    assert restored.ancestors == (root.run_id, middle.run_id)
    for run_id in chain:
        assert rows_of(target.store, run_id) == before[run_id]  # bit-identical, same hashes
        referenced_blobs_exist(target.store, run_id)
    assert archived_runs(target.store) == []
    again = rw.fork(leaf.run_id, at="expand")
    assert again.tokens == 0


# -- blob refcounting --------------------------------------------------------------------------
def test_a_blob_shared_with_a_kept_run_survives_and_an_unshared_one_goes(
    any_target: GcTarget,
) -> None:
    store, objects = any_target.store, any_target.objects
    rw = any_target.rewind()
    shared = "s" * (BIG + 10)  # offloaded: lives in the object store
    own = "o" * (BIG + 20)
    old = rw.record(pipelines.pipeline, {"x": 5, "doc": shared, "mine": own})
    kept = rw.record(pipelines.pipeline, {"x": 5, "doc": shared})
    store.put_artifact(old.run_id, "report.md", b"# the old run's report\n")
    age(store, old.run_id, 40)
    old_fields = json.loads(rows_of(store, old.run_id)["burr_state"][0]["fields_json"])
    shared_hash, own_hash = old_fields["doc"], old_fields["mine"]
    before = rows_of(store, old.run_id)
    assert objects.has_blob(shared_hash) and objects.has_blob(own_hash)

    report = collect_garbage(store, MONTH, archive=objects)

    assert [a.run_id for a in report.archived] == [old.run_id]
    assert not (store.root / "artifacts" / old.run_id).exists()
    hashes = blob_hashes(store)
    assert shared_hash in hashes and objects.has_blob(shared_hash)
    assert own_hash not in hashes and not objects.has_blob(own_hash)
    assert report.objects_deleted >= 1
    assert report.blob_bytes >= len(own)
    referenced_blobs_exist(store, kept.run_id)
    state = store.load_state_row("", kept.run_id, None)
    assert state is not None and state["values"]["doc"] == shared

    restore_run(store, old.run_id, archive=objects)

    assert rows_of(store, old.run_id) == before
    assert own_hash in blob_hashes(store) and objects.has_blob(own_hash)
    restored = store.load_state_row("", old.run_id, None)
    assert restored is not None and restored["values"]["mine"] == own
    [artifact] = store.artifacts_of(old.run_id)
    assert artifact["path"].read_bytes() == b"# the old run's report\n"


def test_a_concurrent_writer_that_remembers_a_deleted_blob_writes_it_again(
    target: GcTarget,
) -> None:
    """A second Store on the same database plays the long-lived API process: it recorded a value,
    so it believes the blob is stored; the gc deletes it; the same value recorded again must not
    leave a row naming a missing blob."""
    writer = target.rewind()
    value = "remembered " * 20
    first = writer.record(pipelines.pipeline, {"x": 5, "note": value})
    digest = json.loads(rows_of(target.store, first.run_id)["burr_state"][0]["fields_json"])["note"]
    assert target.store.knows_blob(digest)
    age(target.store, first.run_id, 40)
    location = target.store.engine.url.render_as_string(hide_password=False)
    other = open_store(
        target.store.root if location.startswith("sqlite") else location,
        root=target.store.root,
        objects=target.objects,
    )
    try:
        report = collect_garbage(other, MONTH, archive=target.objects)
    finally:
        other.close()
    assert [a.run_id for a in report.archived] == [first.run_id]
    assert digest not in blob_hashes(target.store)

    second = writer.record(pipelines.pipeline, {"x": 5, "note": value})

    assert digest in blob_hashes(target.store)
    referenced_blobs_exist(target.store, second.run_id)


@pytest.mark.slow
def test_gc_beside_a_live_writer_never_leaves_a_row_naming_a_missing_blob(
    target: GcTarget,
) -> None:
    """A writer records runs that share values while gc (age 0: every finished run goes)
    archives them and deletes their blobs, over and over; bounded in count, no timing."""
    location = target.store.engine.url.render_as_string(hide_password=False)
    where = target.store.root if location.startswith("sqlite") else location
    errors: list[BaseException] = []
    done = threading.Event()
    recorded: list[str] = []

    def write() -> None:
        try:
            for i in range(12):
                value = f"shared value {i % 3}" * 30  # repeats: blobs the writer remembers
                recorded.append(rw.record(pipelines.pipeline, {"x": i % 4, "v": value}).run_id)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            done.set()

    rw = target.rewind()
    gc_store = open_store(where, root=target.store.root, objects=target.objects)
    thread = threading.Thread(target=write)
    thread.start()
    sweeps = 0
    try:
        while not done.is_set() or sweeps == 0:
            collect_garbage(gc_store, 0.0, archive=target.objects)
            sweeps += 1
    finally:
        thread.join()
        gc_store.close()
    assert errors == []
    assert len(recorded) == 12
    for run_id in run_ids(target.store):
        referenced_blobs_exist(target.store, run_id)
    archived = [r["run_id"] for r in archived_runs(target.store)]
    for run_id in archived[:3]:  # archives of runs taken while written beside are whole
        restore_run(target.store, run_id, archive=target.objects)
        referenced_blobs_exist(target.store, run_id)


def _refused_naming_a_deleted_blob(store: Store) -> None:
    """A batch whose state row names a blob no one stored is refused as one a gc deleted."""
    batch = WriteBatch()
    batch.states.append(
        state_row(
            partition_key="", app_id="app-1", sequence_id=0, position="start",
            status="completed", fields={"x": "a" * 64}, internal={},
        )
    )  # fmt: skip
    with pytest.raises(StoreError, match="deleted by a concurrent rewind gc"):
        store.write_batch(batch)


def test_a_write_naming_a_blob_a_gc_deleted_is_refused_whole(target: GcTarget) -> None:
    """The bytes of a cache hit are not in the writer's batch: when a gc ran since the writer
    last wrote and the blob is gone, the batch fails loudly and writes nothing."""
    store = target.store
    with store.write():
        pass  # the store has seen the current blob epoch
    with store.write() as conn:
        bump_blob_epoch(conn)  # what a gc that deleted blobs does
    _refused_naming_a_deleted_blob(store)
    assert store.load_state_row("", "app-1", None, values=False) is None


def test_a_spans_only_write_after_a_gc_does_not_hide_it_from_the_next_write(
    target: GcTarget,
) -> None:
    """A batch of spans alone (an unchanged trace replay's root span) does not read the blob
    epoch on SQLite; the next write naming a blob still sees the gc and refuses the batch.
    (On PostgreSQL every write reads it, under gc's lock: the spans-only write sees the gc.)"""
    store = target.store
    if store.engine.dialect.name != "sqlite":
        pytest.skip("SQLite only")
    with store.write():
        pass  # the store has seen the current blob epoch
    with store.write() as conn:
        bump_blob_epoch(conn)
    root = {
        "run_id": "spans-only", "position": -1, "span_id": "1" * 16, "parent_position": None,
        "step_type": "chain", "status": "success", "error_type": None, "error_message": None,
        "attributes_json": "{}", "started_at": 1.0, "ended_at": 2.0, "duration_ms": 1000.0,
        "output_hash": None,
    }  # fmt: skip
    store.write_batch(
        WriteBatch(spans=[root]),
        before=lambda conn: store.create_run(
            conn, run_id="spans-only", pipeline="p", status="completed", created_at=1.0
        ),
    )
    _refused_naming_a_deleted_blob(store)
    assert store.get_run("spans-only").status == "completed"


# -- cache expiry ------------------------------------------------------------------------------
def test_cache_entries_expire_by_last_use_not_by_creation(target: GcTarget) -> None:
    store = target.store
    rw = target.rewind()
    run = rw.record(pipelines.pipeline, {"x": 5})  # recent: its calls use the tool cache
    now = time.time()
    with store.write() as conn:
        # every entry was written long ago; the recent run's calls still used them
        conn.execute(update(schema.tool_cache).values(created_at=now - 60 * DAY))
        store.tool_cache_put(
            conn, key="f" * 64, tool="t_gone", args_hash="a" * 64, result_hash="b" * 64,
            created_at=now - 60 * DAY,
        )  # fmt: skip
        store.llm_cache_put(
            conn, key="e" * 64, model="m", request_hash="c" * 64, response_hash="d" * 64,
            prompt_tokens=1, completion_tokens=1, created_at=now - 60 * DAY,
        )  # fmt: skip
    used = {c.key for n in store.nodes_of(run.run_id) for c in n.calls}
    assert used

    report = collect_garbage(store, MONTH, archive=target.objects)

    assert (report.tool_cache_expired, report.llm_cache_expired) == (1, 1)
    with store.read() as conn:
        left = {r[0] for r in conn.execute(select(schema.tool_cache.c.key))}
        assert conn.execute(select(schema.llm_cache.c.key)).all() == []
    assert left == used


# -- dry run, running runs, immutability -------------------------------------------------------
def test_dry_run_writes_nothing_and_reports_what_the_gc_then_does(target: GcTarget) -> None:
    store, objects = target.store, target.objects
    rw = target.rewind()
    old = rw.record(pipelines.pipeline, {"x": 5, "big": "b" * (BIG + 5)})
    fork = rw.fork(old.run_id, at="expand")  # an old fork: archived with its parent
    rw.record(pipelines.pipeline, {"x": 7})
    age(store, old.run_id, 40)
    age(store, fork.run_id, 40)
    db_file = store.root / "rewind.db"
    before_rows = snapshot(store)
    before_objects = objects_listing(objects)
    before_bytes = db_file.read_bytes() if target.name.startswith("sqlite") else b""

    planned = collect_garbage(store, MONTH, dry_run=True, archive=objects)

    assert snapshot(store) == before_rows
    assert objects_listing(objects) == before_objects
    if target.name.startswith("sqlite"):
        assert db_file.read_bytes() == before_bytes
    assert len(planned.archived) == 2 and all(a.archive_ref == "" for a in planned.archived)
    assert planned.blobs_deleted > 0 and planned.blob_bytes > BIG

    done = collect_garbage(store, MONTH, archive=objects)

    assert [a.run_id for a in done.archived] == [a.run_id for a in planned.archived]
    assert [a.archive_bytes for a in done.archived] == [a.archive_bytes for a in planned.archived]
    assert (done.blobs_deleted, done.blob_bytes, done.objects_deleted) == (
        planned.blobs_deleted,
        planned.blob_bytes,
        planned.objects_deleted,
    )
    assert (done.tool_cache_expired, done.llm_cache_expired) == (
        planned.tool_cache_expired,
        planned.llm_cache_expired,
    )


def test_running_runs_and_their_ancestors_are_left_alone(target: GcTarget) -> None:
    store = target.store
    rw = target.rewind()
    root = rw.record(pipelines.pipeline, {"x": 5})
    with store.write() as conn:
        store.create_run(
            conn, run_id="still-running-fork", pipeline="tiny", pipeline_ref="",
            parent_run_id=root.run_id,
        )  # fmt: skip
    age(store, root.run_id, 40)
    age(store, "still-running-fork", 40)

    report = collect_garbage(store, MONTH, archive=target.objects)

    assert report.archived == []
    assert report.left_unfinished == ["still-running-fork"]
    assert report.kept_ancestors == [root.run_id]
    assert run_ids(store) == {root.run_id, "still-running-fork"}
    assert store.get_run("still-running-fork").status == "running"
    referenced_blobs_exist(store, root.run_id)


def test_node_rows_stay_immutable_outside_the_gc_permit(target: GcTarget) -> None:
    store = target.store
    rw = target.rewind()
    a = rw.record(pipelines.pipeline, {"x": 5})
    b = rw.record(pipelines.pipeline, {"x": 6})
    with pytest.raises(SQLAlchemyError, match="immutable"), store.write() as conn:
        # a permit for another run does not open this one
        conn.execute(schema.archive_permits.insert().values(run_id=b.run_id))
        conn.execute(schema.nodes.delete().where(schema.nodes.c.run_id == a.run_id))
    assert len(store.nodes_of(a.run_id)) == 3
    with store.read() as conn:
        assert conn.execute(select(schema.archive_permits)).all() == []


def test_every_deletion_of_a_run_bumps_the_runs_epoch(target: GcTarget) -> None:
    """``meta.runs_epoch`` (no row before the first deletion) goes up by one with each run
    ``rewind delete`` or gc's archiving deletes, in the deleting transaction; a restore leaves
    it: rows a process keeps for a run id (tracer_source.source_rows) are keyed by it, so they
    are never read for a run stored again under that id."""
    from rewind.store.retention import delete_run
    from rewind.store.store import RUNS_EPOCH_KEY

    store = target.store

    def epoch() -> Any:
        with store.read() as conn:
            m = schema.meta
            return conn.execute(select(m.c.value).where(m.c.key == RUNS_EPOCH_KEY)).scalar()

    rw = target.rewind()
    a = rw.record(pipelines.pipeline, {"x": 5})
    b = rw.record(pipelines.pipeline, {"x": 6})
    assert epoch() is None
    delete_run(store, a.run_id)
    assert epoch() == "1"
    age(store, b.run_id, 40)
    assert [r.run_id for r in collect_garbage(store, MONTH, archive=target.objects).archived] == [
        b.run_id
    ]
    assert epoch() == "2"
    restore_run(store, b.run_id, archive=target.objects)
    assert epoch() == "2" and run_ids(store) == {b.run_id}


def test_an_altered_archive_is_refused_and_nothing_is_restored(target: GcTarget) -> None:
    store, objects = target.store, target.objects
    run = target.rewind().record(pipelines.pipeline, {"x": 5})
    age(store, run.run_id, 40)
    [archived] = collect_garbage(store, MONTH, archive=objects).archived
    path = objects._path(archived.archive_ref)
    data = objects.fs.cat_file(path)
    objects.fs.pipe_file(path, data[:-1] + bytes([data[-1] ^ 1]))

    with pytest.raises(StoreError, match="does not match its hash"):
        restore_run(store, run.run_id, archive=objects)

    assert run_ids(store) == set()
    assert [r["run_id"] for r in archived_runs(store)] == [run.run_id]


def test_every_table_with_run_rows_is_archived() -> None:
    covered = {t.name for t, _c in RUN_TABLES}
    with_run_id = {t.name for t in schema.metadata.sorted_tables if "run_id" in t.c}
    # jobs rows are the API's operational log of work it accepted (a job names the run of its
    # current attempt), not the run's data: they stay, and a job of an archived run says so
    # through its run's 404.
    assert with_run_id - {"archived_runs", "archive_permits", "jobs"} <= covered


# -- ages and the command line -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("text_", "seconds"), [("30d", 30 * DAY), ("12h", 43200.0), ("90m", 5400.0), ("0s", 0.0)]
)
def test_ages_parse(text_: str, seconds: float) -> None:
    assert parse_age(text_) == seconds


@pytest.mark.parametrize("bad", ["banana", "-5d", "30", "d", "", "5y"])
def test_bad_ages_are_refused(bad: str) -> None:
    with pytest.raises(InvalidAge):
        parse_age(bad)


def _cli(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_rewind(*args, "--store", str(store))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--older-than", "banana"], "is not an age"),
        (["--older-than=-3d"], "is negative"),
        (["--older-than", "-3d"], "is negative"),
    ],
)
def test_cli_bad_age_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str], says: str
) -> None:
    store = tmp_path / "store"
    proc = _cli(store, "gc", *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert says in lines[0] and len(lines) <= 2
    assert not store.exists()


def test_cli_gc_on_a_folder_without_a_store_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    store = tmp_path / "nothing-here"
    proc = _cli(store, "gc", "--older-than", "30d")
    assert proc.returncode == 2 and "no store at" in proc.stderr
    assert not store.exists()


def test_cli_gc_dry_run_then_gc_then_restore(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    rw = Rewind(store_dir)
    run = rw.record(pipelines.pipeline, {"x": 5})
    keep = rw.record(pipelines.pipeline, {"x": 9})
    age(rw.store, run.run_id, 40)
    before = rows_of(rw.store, run.run_id)
    rw.store.close()

    dry = _cli(store_dir, "gc", "--older-than", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "dry run" in dry.stdout and run.run_id in dry.stdout
    planned = json.loads(_cli(store_dir, "gc", "--older-than", "30d", "--dry-run", "--json").stdout)
    done = _cli(store_dir, "gc", "--older-than", "30d", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [a["run_id"] for a in report["runs"]["archived"]] == [run.run_id]
    assert report["blobs"]["deleted"] == planned["blobs"]["deleted"]
    assert report["runs"]["archived"][0]["archive_ref"].startswith(store_dir.resolve().as_uri())

    listed = json.loads(_cli(store_dir, "archive", "list", "--json").stdout)
    assert [r["run_id"] for r in listed] == [run.run_id]
    shown = _cli(store_dir, "show", run.run_id)
    assert shown.returncode == 2 and "unknown run" in shown.stderr

    back = _cli(store_dir, "archive", "restore", run.run_id[:10])
    assert back.returncode == 0, back.stderr
    assert "restored run" in back.stdout
    store = open_store(store_dir)
    try:
        assert rows_of(store, run.run_id) == before
        assert run_ids(store) == {run.run_id, keep.run_id}
    finally:
        store.close()
    missing = _cli(store_dir, "archive", "restore", "nope-nope")
    assert missing.returncode == 2 and "no archived run" in missing.stderr


@pytest.mark.postgres
@pytest.mark.s3
def test_cli_gc_and_restore_on_postgres_with_archives_in_s3(
    postgres_server: PostgresServer, s3_server: S3Server, tmp_path: Path
) -> None:
    """As a team deployment runs it: configured only by environment (REWIND_STORE, REWIND_OBJECTS,
    fsspec's S3 endpoint), archives land in the bucket and are read back from it."""
    url = postgres_server.new_database()
    objects = ObjectStore(f"s3://{s3_server.new_bucket()}/team", **s3_server.storage_options)
    store = open_store(url, root=tmp_path / ".rewind", objects=objects)
    rw = Rewind(store)
    old = rw.record(pipelines.pipeline, {"x": 5, "doc": "d" * (70 * 1024)})  # offloaded blob
    age(store, old.run_id, 40)
    before = rows_of(store, old.run_id)
    env = dict(
        REWIND_STORE=url,
        REWIND_OBJECTS=objects.url,
        AWS_ACCESS_KEY_ID="rewind-test",
        AWS_SECRET_ACCESS_KEY="rewind-test",
        AWS_DEFAULT_REGION="us-east-1",
        FSSPEC_S3_ENDPOINT_URL=s3_server.endpoint_url,
    )

    def cli(*args: str) -> Any:
        proc = run_rewind(*args, "--json", env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    report = cli("gc", "--older-than", "30d")
    [archived] = report["runs"]["archived"]
    assert archived["archive_ref"] == f"{objects.url}/archive/runs/{old.run_id}.json.gz"
    assert report["blobs"]["objects_deleted"] == 1
    assert objects.fs.exists(objects._path(archived["archive_ref"]))
    assert run_ids(store) == set()

    back = cli("archive", "restore", old.run_id)

    assert back["run_id"] == old.run_id
    assert rows_of(store, old.run_id) == before
    referenced_blobs_exist(store, old.run_id)
    assert not objects.fs.exists(objects._path(archived["archive_ref"]))
    store.close()


# -- sub-runs (Burr sub-applications) go and come back with the run that spawned them ----------
def test_sub_runs_go_and_come_back_with_their_spawning_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests import burr_apps
    from tests.model_stub import ModelStub

    objects = ObjectStore((tmp_path / "objects").resolve().as_uri())
    store = open_store(tmp_path / "store")
    try:
        with ModelStub() as server:
            monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
            monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
            rw = Rewind(store)
            parent = rw.record(burr_apps.sdk_map_application(), inputs={"topics": ["a", "b"]})
            subs = [r.run_id for r in rw.node_sub_runs(parent.run_id)[1]]
            assert len(subs) == 2
            family = (parent.run_id, *subs)

            # Old sub-runs of a kept (new) run stay: its node lists them.
            for r in subs:
                age(store, r, 40)
            report = collect_garbage(store, MONTH, archive=objects)
            assert report.archived == [] and run_ids(store) >= set(family)

            # An old spawning run goes with its sub-runs, and comes back with them.
            age(store, parent.run_id, 40)
            before = {r: rows_of(store, r) for r in family}
            report = collect_garbage(store, MONTH, archive=objects)
            assert {a.run_id for a in report.archived} == set(family)
            assert report.archived[-1].run_id == parent.run_id  # sub-runs first
            assert run_ids(store).isdisjoint(family)
            restored = restore_run(store, parent.run_id, archive=objects)
            assert restored.run_id == parent.run_id
            for r in family:
                assert rows_of(store, r) == before[r]
            assert archived_runs(store) == []
            again = rw.fork(parent.run_id, at=1)
            assert again.status == "completed" and again.tokens == 0
    finally:
        store.close()


def _archive_objects(objects: ObjectStore) -> list[str]:
    """The archive objects under ``archive/runs/`` of an object store (their paths)."""
    return sorted(objects.fs.glob(objects._path(f"{objects.url}/archive/runs/*")))


def test_a_run_gc_skips_because_a_replay_of_it_appeared_leaves_no_archive_object(
    target: GcTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc writes a run's archive before its deleting transaction; when that transaction finds a
    run recorded during the gc refers to it (an in-place replay, stored by reference), the run
    is skipped, and its archive object stayed, named by no row: never read, never deleted
    (``rewind delete`` of the run later left it too). It is now deleted when the run is
    skipped, on every backend and object store."""
    from rewind.store import retention
    from rewind.store.retention import delete_run
    from rewind.tracing import Tracer, step

    store = target.store
    tracer = Tracer(store, raise_on_write_error=True)
    with tracer.trace("src", {"q": 1}) as t, step("s", "transform", input={"q": 1}):
        pass
    plan = retention._runs_to_archive
    replays = []

    def planned_then_replayed(conn: Any, cutoff: float) -> Any:
        planned = plan(conn, cutoff)
        monkeypatch.setattr(retention, "_runs_to_archive", plan)
        with tracer.replay(t.trace_id) as r, step("s", "transform", input={"q": 1}):
            pass
        replays.append(r.trace_id)
        return planned

    monkeypatch.setattr(retention, "_runs_to_archive", planned_then_replayed)
    report = collect_garbage(store, 0.0, archive=target.objects, now=time.time() + 10**6)
    assert [s["run_id"] for s in report.skipped] == [t.trace_id]
    assert _archive_objects(target.objects) == []
    assert run_ids(store) == {t.trace_id, *replays}
    delete_run(store, replays[0])
    delete_run(store, t.trace_id)
    assert _archive_objects(target.objects) == [] and run_ids(store) == set()


def test_rewind_delete_leaves_an_archive_object_no_row_of_its_store_names(
    target: GcTarget,
) -> None:
    """A gc before the fix above (or one that stopped between writing an archive and its
    commit) left the run's archive object at its key, named by no row. ``rewind delete`` of
    the run leaves it (a leak, never a loss): a copy of the store sharing the object store
    holds the same run ids, and the object may be the archive the other store's row names
    (test_attack33b). An object another archived run's row names is never touched."""
    from rewind.store.retention import _archive_key, delete_run

    rw = target.rewind()
    kept, gone = (rw.record(pipelines.pipeline, {"x": x}) for x in (5, 6))
    age(target.store, kept.run_id, 40)
    archived = collect_garbage(target.store, MONTH, archive=target.objects).archived
    assert [a.run_id for a in archived] == [kept.run_id]
    target.objects.put_object(_archive_key(gone.run_id), b"an archive no row names")
    assert len(_archive_objects(target.objects)) == 2
    delete_run(target.store, gone.run_id)
    assert len(_archive_objects(target.objects)) == 2
    restore_run(target.store, kept.run_id, archive=target.objects)
    assert run_ids(target.store) == {kept.run_id}
