"""Attacks on the storage and compatibility changes of session 32 (issue #13): values the
canonical hasher refuses, odd names, ``meta.runs_epoch``, concurrent gc and restore, read
through stores written by the code before the session and by the new code.

Each test names what it found (a regression test that failed before its fix) or what held.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from rewind.store import open_store
from rewind.tracing import Tracer, step
from rewind.tracing.replay import replay_trace
from rewind.tracing.store import load_trace

UNSORTED_ODD_OUTPUTS = {
    "datetime": {"title": "report", "at": datetime.datetime(2026, 1, 2, 3, 4, 5)},
    "bytes": {"name": "a.png", "data": b"\x89PNG"},
    "decimal": {"total": Decimal("1.10"), "currency": "EUR"},
    "surrogate": {"path": os.fsdecode(b"report-\xff.csv"), "exists": True},
    "nan": {"score": float("nan"), "label": "x"},
}
"""Step outputs: a dict whose keys are not in sorted order holding a value the canonical hasher
refuses (a date, bytes, a Decimal, NaN, a file name that is not UTF-8), as chains return them."""


@pytest.mark.parametrize("kind", sorted(UNSORTED_ODD_OUTPUTS))
def test_a_step_output_with_an_odd_value_reads_back_as_it_was_written_and_replays_unchanged(
    tmp_path: Path, kind: str
) -> None:
    """jsonable kept a dict's own key order when one of its values was refused by the
    canonical hasher (the canonical round trip, which every other dict goes through, sorts
    them). Such a dict is not a plain JSON object to the store, which wrote it as a tagged
    document ``{"$rw": "dict", "keys": [...], "values": [...]}``; the trace reader gave that
    document back as the step's output (rewind show, diff, inspect showed it), and an unchanged
    recorded-calls replay (rewind replay-trace) set it as the step's output: the step was
    'changed, first divergence' (similarity 0.33) in a replay that changed nothing, and the
    replay was stored in full from there. Seen with the old code and the new one alike. The
    dict is now in canonical key order, so it is stored as the plain object it is."""
    value = UNSORTED_ODD_OUTPUTS[kind]
    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with tracer.trace("odd-output", {"q": 1}) as t:
            with step("make", "transform", input={"q": 1}) as s:
                s.set_output(value)
            with step("after", "transform", input={"q": 2}) as s:
                s.set_output("done")
    finally:
        tracer.close()
    st = open_store(tmp_path)
    try:
        source = load_trace(st, t.trace_id).steps
        assert "$rw" not in str(source[0].output)
        assert sorted(source[0].output) == sorted(value)
        replay = replay_trace(st, t.trace_id)
        steps = load_trace(st, replay.run_id).steps
    finally:
        st.close()
    assert [s.output_hash for s in steps] == [s.output_hash for s in source]
    assert [s.state_hash for s in steps] == [s.state_hash for s in source]
    assert replay.config["reference"]["all"] is True


def _old_name_rule(name: object) -> bool:
    """The name check of the code before session 32: 1 to 200 characters (NUL allowed)."""
    return isinstance(name, str) and 0 < len(name) <= 200


@pytest.mark.parametrize("how", ["replay-trace", "in-place"])
def test_a_trace_an_older_rewind_stored_with_a_nul_in_its_names_can_be_replayed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The code before session 32 stored a trace or step name holding NUL on SQLite (its
    check was 1 to 200 characters). The new check (storable_name) refused the name the replay
    took from that trace: ``rewind replay-trace`` of it ended in a traceback (ValueError: 'a
    trace needs a name ... not 'n\\x00...''), and so did ``Tracer.replay(id)`` without
    ``name=``, which the user never passed: the old trace could not be replayed at all. A
    replay now takes the stored names as a store keeps them (rewind.store.records.stored_name:
    NUL escaped), so it runs and is written."""
    import rewind.tracing.tracer as tracer_module

    monkeypatch.setattr(tracer_module, "storable_name", _old_name_rule)
    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with (
            tracer.trace("old\x00name", {"q": 1}) as t,
            step("make\x00it", "transform", input={"q": 1}) as s,
        ):
            s.set_output({"n": 1})
    finally:
        tracer.close()
    monkeypatch.undo()
    st = open_store(tmp_path)
    try:
        assert load_trace(st, t.trace_id).name == "old\x00name"
        if how == "replay-trace":
            replay_id = replay_trace(st, t.trace_id).run_id
        else:
            replayer = Tracer(st, raise_on_write_error=True)
            with (
                replayer.replay(t.trace_id) as r,
                step("make", "transform", input={"q": 1}) as s,
            ):
                s.set_output({"n": 1})
            replay_id = r.trace_id
        view = load_trace(st, replay_id)
    finally:
        st.close()
    assert view.status == "success" and view.name == "old\\u0000name"
    if how == "replay-trace":
        assert [s.name for s in view.steps] == ["make\\u0000it"]


# --- meta.runs_epoch under two deleting processes ----------------------------------------------
@pytest.mark.postgres
@pytest.mark.parametrize("first", ["fresh", "bumped"])
def test_two_deletions_at_once_each_bump_the_runs_epoch(
    postgres_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """Two processes deleting runs at once on PostgreSQL (``rewind delete`` beside a ``rewind
    gc``, two servers): a deletion's write transaction holds the gc lock shared, so both bump
    ``meta.runs_epoch`` side by side. The bump read the counter and wrote it plus one: on a
    store whose counter did not exist yet both inserted it and the second failed on the key
    (delete_run said 'got a fork while it was being deleted', RunInUse, where no fork exists);
    once it existed both wrote the same next value, so the second deletion did not move the
    epoch a process keys the rows it keeps by. Each deletion now adds one in the database."""
    from rewind.store import retention
    from rewind.store.retention import delete_run
    from rewind.store.store import RUNS_EPOCH_KEY

    url = postgres_server.new_store_database()
    tracer = Tracer(open_store(url), raise_on_write_error=True)
    ids = []
    try:
        for i in range(3):
            with tracer.trace("doomed", {"i": i}) as t, step("s", "transform", input={"i": i}):
                pass
            ids.append(t.trace_id)
    finally:
        tracer.store.close()
    stores = [open_store(url) for _ in range(3)]
    try:
        if first == "bumped":
            delete_run(stores[2], ids[2])
        before = _epoch(stores[2], RUNS_EPOCH_KEY)
        both_inside = threading.Barrier(2)
        bump = retention._bump

        def side_by_side(conn: Any, key: str) -> None:
            if key == RUNS_EPOCH_KEY:
                both_inside.wait()  # both deletions have deleted their rows, neither committed
            bump(conn, key)

        monkeypatch.setattr(retention, "_bump", side_by_side)
        errors: list[BaseException] = []

        def delete(i: int) -> None:
            try:
                delete_run(stores[i], ids[i])
            except BaseException as exc:
                errors.append(exc)
                both_inside.abort()

        with ThreadPoolExecutor(2) as pool:
            list(pool.map(delete, range(2)))
        assert errors == []
        assert _epoch(stores[2], RUNS_EPOCH_KEY) == before + 2
        assert {r.run_id for r in stores[2].list_runs()} & {ids[0], ids[1]} == set()
    finally:
        for st in stores:
            st.close()


def _epoch(st: Any, key: str) -> int:
    """The counter ``meta.<key>`` (0 before it exists)."""
    from sqlalchemy import select

    from rewind.store import schema

    with st.read() as conn:
        value = conn.execute(select(schema.meta.c.value).where(schema.meta.c.key == key)).scalar()
    return int(value or 0)


class SearchTool:
    """A tool class, as registries key their results by it."""


class CalcTool:
    """Another tool class."""


def _search() -> None:
    """A function used as a key."""


def _calc() -> None:
    """Another function used as a key."""


KEYS_WITHOUT_JSON = {
    "classes": (SearchTool, CalcTool),
    "functions": (_search, _calc),
    "tuples of classes": ((SearchTool,), (CalcTool,)),
}
"""Two keys of one dict that jsonable wrote as one JSON key even when typed: objects without a
JSON form (classes, functions) are all ``{"$unhashable": "<type>"}``."""


@pytest.mark.parametrize("kind", sorted(KEYS_WITHOUT_JSON))
def test_a_dict_keyed_by_objects_without_json_keeps_every_entry(tmp_path: Path, kind: str) -> None:
    """41ffab1 kept tuple keys and 1/"1" apart, but keys whose JSON form is one text even when
    typed (two classes, two functions: ``$key:type:{"$unhashable":"type"}``) were still one
    key: the step's output kept only the last entry, so a replay whose first entry changed
    ({SearchTool: "ok", CalcTool: "ok"} then {SearchTool: "failed", ...}) was stored with the
    recorded step's hash, unchanged. Keys that are still one are now numbered in the dict's
    order, and every entry is kept."""
    first, second = KEYS_WITHOUT_JSON[kind]
    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with tracer.trace("keyed", {"q": 1}) as t, step("run", "transform", input={"q": 1}) as s:
            s.set_output({first: "ok", second: "ok"})
        with tracer.replay(t.trace_id) as r, step("run", "transform", input={"q": 1}) as s:
            s.set_output({first: "failed", second: "ok"})
        with tracer.replay(t.trace_id) as same, step("run", "transform", input={"q": 1}) as s:
            s.set_output({first: "ok", second: "ok"})
    finally:
        tracer.close()
    st = open_store(tmp_path)
    try:
        recorded, changed, unchanged = (load_trace(st, x.trace_id).steps[0] for x in (t, r, same))
    finally:
        st.close()
    assert len(recorded.output) == 2
    assert changed.output_hash != recorded.output_hash
    assert unchanged.output_hash == recorded.output_hash


@pytest.mark.parametrize(
    "output",
    [{"$rw": "tuple", "v": [1]}, {"meta": {"$rw": "set", "items": []}, "n": 1}],
    ids=["tag-like key", "nested"],
)
def test_a_step_output_holding_a_tag_key_reads_back_as_written_in_every_replay_generation(
    tmp_path: Path, output: dict[str, Any]
) -> None:
    """A step output that is a dict holding a ``"$rw"`` key (JSON from another Rewind store, a
    serialized object) is stored escaped as a tagged dict document, so user data never passes
    for a tag; but the trace reader gave the escaped document back as the output (show, diff,
    inspect, the API), and rewind replay-trace set it as the output of an unchanged replay,
    which escaped it once more: every generation of replays was 'changed' and nested one
    level deeper. (The same for an old trace's dict stored in its own key order.) The reader
    now rebuilds the dict from its document (rewind.serde.decode, shown as serde.display), so
    it reads back as written and an unchanged replay is unchanged."""
    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with tracer.trace("tagged", {"q": 1}) as t, step("s", "transform", input={"q": 1}) as s:
            s.set_output(output)
    finally:
        tracer.close()
    st = open_store(tmp_path)
    try:
        source = load_trace(st, t.trace_id).steps[0]
        assert source.output == output
        run_id = t.trace_id
        for _generation in range(3):
            run_id = replay_trace(st, run_id).run_id
            replayed = load_trace(st, run_id).steps[0]
            assert replayed.output == output
            assert replayed.output_hash == source.output_hash
    finally:
        st.close()


# --- two gc processes at once: an archive written over another's ------------------------------
def test_a_gc_that_read_a_run_while_another_gc_archived_it_leaves_that_archive_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b763abf skips a run whose rows are gone when this gc's turn comes. Its rows can still be
    read while another gc archives it: this gc's read transaction began before the other's
    commit (a SQLite snapshot; PostgreSQL reads each statement afresh), and the run's artifact
    files are read after it, when the other gc has removed them. This gc's archive then
    differed from the other's (no artifact data) and was written over it at the same key
    before this gc saw the rows gone and skipped the run: the run was out of the store and its
    archive no longer matched its recorded hash ('does not match its hash'), lost. A gc now
    never writes over an archive at a key another archived run's row names."""
    from rewind.store import retention
    from rewind.store.retention import collect_garbage, restore_run

    location = tmp_path / "store"
    t = _one_step_trace(location, "published", "s")
    st = open_store(location)
    try:
        st.put_artifact(t.trace_id, "report.md", b"# the report\n")
    finally:
        st.close()
    later = time.time() + 10**6
    run_rows = retention._run_rows

    def read_then_archived_elsewhere(conn: Any, run_id: str) -> Any:
        rows = run_rows(conn, run_id)
        monkeypatch.setattr(retention, "_run_rows", run_rows)
        assert _gc_in_another_store(location, later) == [t.trace_id]  # inside this one's read
        return rows

    monkeypatch.setattr(retention, "_run_rows", read_then_archived_elsewhere)
    with contextlib.closing(open_store(location)) as st:
        skipped = collect_garbage(st, 0.0, now=later).skipped
        assert [s["run_id"] for s in skipped] == [t.trace_id]
        restore_run(st, t.trace_id)  # the other gc's archive, whole
        assert [a["name"] for a in st.artifacts_of(t.trace_id)] == ["report.md"]
        assert load_trace(st, t.trace_id).status == "success"


def _gc_in_another_store(location: Path, now: float) -> list[str]:
    """A whole ``rewind gc`` (everything older than ``now``) through a store of its own, as
    another process runs it; the ids it archived."""
    from rewind.store.retention import collect_garbage

    other = open_store(location)
    try:
        return [a.run_id for a in collect_garbage(other, 0.0, now=now).archived]
    finally:
        other.close()


def _tables(v: int) -> dict[str, Any]:
    """Values serde has no exact document for, their content depending on ``v``."""
    import numpy as np
    import pandas as pd

    return {
        "dataframe": pd.DataFrame({"city": ["a", "b"], "mean": [1.5, 2.0 + v]}),
        "series": pd.Series([1, 2 + v], index=["x", "y"]),
        "object array": np.array(["x", None, v], dtype=object),
    }


@pytest.mark.parametrize("kind", sorted(_tables(0)))
def test_a_replay_whose_step_returned_another_table_is_not_unchanged(
    tmp_path: Path, kind: str
) -> None:
    """41ffab1 gave values the canonical hasher refuses a digest of their serde document, but
    serde has none for a pandas DataFrame or Series or a numpy array of objects: each stayed
    ``{"$unhashable": "DataFrame"}``, one form and one hash for every table, so a replay whose
    analysis step returned other numbers was stored with the recorded step's hash, unchanged.
    Such a value now carries the digest of its JSON form (to_dict / tolist)."""
    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with tracer.trace("tables", {"q": 1}) as t, step("s", "transform", input={"q": 1}) as s:
            s.set_output(_tables(0)[kind])
        with tracer.replay(t.trace_id) as r, step("s", "transform", input={"q": 1}) as s:
            s.set_output(_tables(1)[kind])
        with tracer.replay(t.trace_id) as same, step("s", "transform", input={"q": 1}) as s:
            s.set_output(_tables(0)[kind])
    finally:
        tracer.close()
    with contextlib.closing(open_store(tmp_path)) as st:
        recorded, changed, unchanged = (load_trace(st, x.trace_id).steps[0] for x in (t, r, same))
    assert changed.output_hash != recorded.output_hash
    assert unchanged.output_hash == recorded.output_hash


def test_an_unchanged_replay_of_an_old_trace_with_a_nul_step_name_diffs_equal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a strict xfail: the old trace could be replayed (see above), but the diff paired
    steps by name, and the replay runs with the names escaped (stored_name): rewind diff
    showed each step only_a/only_b and the unchanged replay warned that it diverged. The diff
    now names a trace's steps (and the output field named after each) as a store keeps them."""
    import rewind.tracing.tracer as tracer_module
    from rewind.tracing.inspect import compare_traces

    monkeypatch.setattr(tracer_module, "storable_name", _old_name_rule)
    t = _one_step_trace(tmp_path, "old", "a\x00b")
    monkeypatch.undo()
    with contextlib.closing(open_store(tmp_path)) as st:
        replay_id = replay_trace(st, t.trace_id).run_id
        diff = compare_traces(load_trace(st, t.trace_id), load_trace(st, replay_id))
    assert [n["status"] for n in diff["nodes"]] == ["equal"]


@pytest.mark.parametrize(("output", "status"), [({"n": 1}, "equal"), ({"n": 2}, "changed")])
def test_a_replay_of_an_old_nul_named_step_diffs_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, output: dict[str, int], status: str
) -> None:
    """The steps pair by their stored name and their outputs are still compared: an in-place
    replay whose step (named as the store keeps the old name) returned another value shows
    it changed, the same value equal."""
    import rewind.tracing.tracer as tracer_module
    from rewind.tracing.inspect import compare_traces

    monkeypatch.setattr(tracer_module, "storable_name", _old_name_rule)
    tracer = Tracer(tmp_path, raise_on_write_error=True)
    try:
        with tracer.trace("old", {"q": 1}) as t, step("a\x00b", "transform") as s:
            s.set_output({"n": 1})
        monkeypatch.undo()
        with tracer.replay(t.trace_id) as r, step("a\\u0000b", "transform") as s:
            s.set_output(output)
    finally:
        tracer.close()
    with contextlib.closing(open_store(tmp_path)) as st:
        diff = compare_traces(load_trace(st, t.trace_id), load_trace(st, r.trace_id))
    assert [n["status"] for n in diff["nodes"]] == [status]
    changes = [(c["kind"], c["old"], c["new"]) for c in diff["nodes"][0]["changes"]]
    assert changes == ([] if status == "equal" else [("changed", 1, 2)])


def test_a_run_gc_skipped_because_a_replay_of_it_appeared_leaves_no_archive_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a strict xfail: gc writes a run's archive before its deleting transaction; when that
    transaction found a run recorded meanwhile refers to it (skipped), the archive object
    stayed in the object store, named by no row (never read, never deleted). It is now deleted
    when the run is skipped (tests/test_gc.py: every backend and object store, and rewind
    delete of the run later)."""
    from rewind.store import retention
    from rewind.store.retention import collect_garbage

    location = tmp_path / "store"
    tracer = Tracer(location, raise_on_write_error=True)
    try:
        with tracer.trace("src", {"q": 1}) as t, step("s", "transform", input={"q": 1}):
            pass
        plan = retention._runs_to_archive

        def planned_then_replayed(conn: Any, cutoff: float) -> Any:
            planned = plan(conn, cutoff)
            monkeypatch.setattr(retention, "_runs_to_archive", plan)
            with tracer.replay(t.trace_id), step("s", "transform", input={"q": 1}):
                pass
            return planned

        monkeypatch.setattr(retention, "_runs_to_archive", planned_then_replayed)
        with contextlib.closing(open_store(location)) as st:
            report = collect_garbage(st, 0.0, now=time.time() + 10**6)
    finally:
        tracer.close()
    assert [s["run_id"] for s in report.skipped] == [t.trace_id]
    assert list((location / "archive").rglob("*.json.gz")) == []


def test_a_gc_that_skips_a_run_another_gc_archived_at_the_same_key_keeps_that_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held: the archive object a skipped run's gc deletes is one no archived-run row names.
    Here this gc looked for an archived-run row before the other gc committed (none), so it
    wrote its archive at the key the other's row names, then found the rows gone and skipped
    the run: the object is the other gc's archive now, and stays; the run restores whole."""
    from rewind.store import retention
    from rewind.store.retention import collect_garbage, restore_run

    location = tmp_path / "store"
    t = _one_step_trace(location, "published", "s")
    later = time.time() + 10**6
    run_rows = retention._run_rows

    def read_then_archived_elsewhere(conn: Any, run_id: str) -> Any:
        rows = run_rows(conn, run_id)
        monkeypatch.setattr(retention, "_run_rows", run_rows)
        assert _gc_in_another_store(location, later) == [t.trace_id]
        monkeypatch.setattr(retention, "_archived_now", lambda store, run_id: False)
        return rows

    monkeypatch.setattr(retention, "_run_rows", read_then_archived_elsewhere)
    with contextlib.closing(open_store(location)) as st:
        skipped = collect_garbage(st, 0.0, now=later).skipped
        assert [s["run_id"] for s in skipped] == [t.trace_id]
        assert len(list((location / "archive").rglob("*.json.gz"))) == 1
        restore_run(st, t.trace_id)
        assert load_trace(st, t.trace_id).status == "success"


def test_an_archive_a_gc_committed_while_a_skipping_gc_deleted_it_is_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held: a skipping gc looks for a row naming its object, deletes the object, and looks
    again; when another gc committed an archive of the same bytes there in between, the
    object is written back, so that archive restores whole."""
    from rewind.store import retention
    from rewind.store.retention import archive_store, collect_garbage, restore_run

    location = tmp_path / "store"
    t = _one_step_trace(location, "published", "s")
    with contextlib.closing(open_store(location)) as st:
        (done,) = collect_garbage(st, 0.0, now=time.time() + 10**6).archived
        target = archive_store(st)
        data = target.fs.cat_file(target._path(done.archive_ref))
        naming_row = retention._naming_row
        looks: list[str] = []

        def committed_after_the_first_look(store: Any, ref: str) -> Any:
            looks.append(ref)  # the first look comes before the other gc's commit
            return None if len(looks) == 1 else naming_row(store, ref)

        monkeypatch.setattr(retention, "_naming_row", committed_after_the_first_look)
        retention._drop_unnamed(st, target, done.archive_ref, data)
        monkeypatch.undo()
        assert len(looks) == 2
        restore_run(st, t.trace_id)
        assert load_trace(st, t.trace_id).status == "success"


def _one_step_trace(location: Path, name: str, step_name: str) -> Any:
    """Record a trace ``name`` of one empty step ``step_name`` at ``location``; the trace."""
    tracer = Tracer(location, raise_on_write_error=True)
    try:
        with tracer.trace(name, {"q": 1}) as t, step(step_name, "transform", input={"q": 1}):
            pass
    finally:
        tracer.close()
    return t
