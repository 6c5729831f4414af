"""Issue 12: the effect audit fails closed (seed 004), one test per point of the contract, against
a real folder, a real SQLite file and a real local HTTP server (loopback, started by the test).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from burr.core import State, action

from rewind.audit import audit_run
from rewind.cli.audit import audit_command
from rewind.effects import (
    ABSENT,
    EffectPreconditionFailed,
    FingerprintUnavailable,
    HttpResource,
    SideEffectBlocked,
)
from rewind.replay import ParamOverride, Rewind
from rewind.tools import tool
from tests import pipelines
from tests.pipelines import create_limits_db

API_KEY = "s3cret"


@pytest.fixture(autouse=True)
def _clear_effect_logs() -> Iterator[None]:
    pipelines.EFFECT_CALLS.clear()
    yield
    pipelines.EFFECT_CALLS.clear()


def executed(tool_name: str) -> list[Any]:
    return [args for name, args in pipelines.EFFECT_CALLS if name == tool_name]


# -- a real HTTP resource on loopback ----------------------------------------------------------


class KeyValueServer:
    """``/items/<id>``: GET (needs ``X-Api-Key``), PUT stores the body; ``status`` forces an
    answer (401, 500…) for GETs."""

    def __init__(self) -> None:
        self.items: dict[str, bytes] = {}
        self.status: int | None = None
        self.etag: str | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, code: int, body: bytes = b"", etag: str | None = None) -> None:
                self.send_response(code)
                if etag:
                    self.send_header("ETag", etag)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.headers.get("X-Api-Key") != API_KEY:
                    self._send(401, b"<h1>401 Unauthorized</h1>")
                elif outer.status is not None:
                    self._send(outer.status, b"<h1>error page</h1>")
                elif self.path not in outer.items:
                    self._send(404, b"not found")
                else:
                    self._send(200, outer.items[self.path], outer.etag)

            def do_PUT(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                outer.items[self.path] = self.rfile.read(length)
                self._send(204)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # shutdown() waits for the serving loop's next look at its flag: every poll_interval
        # (0.5 s by default, paid by every test's teardown)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def kv() -> Iterator[KeyValueServer]:
    server = KeyValueServer()
    server.thread.start()
    yield server
    server.stop()


def _item(url: str, value: str) -> list[HttpResource]:
    return [HttpResource(url, headers={"X-Api-Key": API_KEY})]


@tool("fx_contract_put", determinism="side-effect", resources=_item)
def put_item(url: str, value: str) -> dict[str, Any]:
    pipelines.EFFECT_CALLS.append(("fx_contract_put", value))
    httpx.put(url, content=value.encode(), timeout=10.0)
    return {"stored": True}


@action(reads=["url", "value"], writes=["stored"])
def put(state: State) -> State:
    return state.update(stored=put_item(state["url"], state["value"]))


http_pipeline = pipelines._linear("kv", "tests.test_effect_contract:http_pipeline", put=put)


# -- 1. live re-execution verifies the slot, whatever the arguments ----------------------------


def test_1_live_fork_with_changed_arguments_verifies_the_slots_pre_state(
    rw: Rewind, tmp_path: Path
) -> None:
    db = tmp_path / "limits.db"
    create_limits_db(db)
    parent = rw.record(pipelines.limits_pipeline, {"db": str(db)})
    assert parent.status == "completed", parent.error
    con = sqlite3.connect(db)
    with con:
        con.execute("INSERT INTO limits VALUES ('drift', 9)")  # the world moved on
    con.close()
    with pytest.raises(EffectPreconditionFailed):
        rw.fork(
            parent.run_id,
            at="store_limit",
            override=ParamOverride("store_limit", "value", 7),
            effects="live",
        )
    assert executed("fx_upsert_limit") == [("rate", 5)]
    con = sqlite3.connect(db)
    assert ("rate", 7) not in con.execute("SELECT * FROM limits").fetchall()
    con.close()

    # A folder with a pinned snapshot: restored to the recorded pre-state first, then written.
    path = tmp_path / "out.txt"
    path.write_text("start\n", encoding="utf-8")
    rec = rw.record(pipelines.effects_pipeline, {"text": "hi", "path": str(path)})
    path.write_text("someone else\n", encoding="utf-8")
    fork = rw.fork(
        rec.run_id, at="prep", override=ParamOverride("prep", "suffix", "?"), effects="live"
    )
    assert fork.status == "completed", fork.error
    assert path.read_text(encoding="utf-8") == "start\nhi?\n"


def test_1_a_live_call_at_a_slot_the_source_never_executed_is_refused(
    rw: Rewind, tmp_path: Path
) -> None:
    path = tmp_path / "out.txt"
    path.write_text("", encoding="utf-8")
    parent = rw.record(pipelines.repeat_pipeline, {"path": str(path)})
    assert parent.status == "completed", parent.error
    with pytest.raises(EffectPreconditionFailed) as err:
        rw.fork(
            parent.run_id, at="many", override=ParamOverride("many", "times", 4), effects="live"
        )
    assert "call 3" in err.value.message
    assert "--effects dry-run" in err.value.hint


# -- 2. the audit fails closed -----------------------------------------------------------------


def test_2_a_fork_that_failed_before_its_side_effects_fails_the_audit(
    rw: Rewind, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "out.txt"
    path.write_text("", encoding="utf-8")
    parent = rw.record(pipelines.effects_pipeline, {"text": "x", "path": str(path)})
    with pytest.raises(SideEffectBlocked):
        rw.fork(parent.run_id, at="prep", override=ParamOverride("prep", "suffix", "!"))
    failed = rw.store.children(parent.run_id)[-1]
    assert failed.status == "failed"
    report = audit_run(rw, failed.run_id)
    assert not report.passed and not report.vacuous
    assert "did not complete" in report.note and "vacuous" not in report.note
    (v,) = report.verdicts
    assert (v.node, v.verdict) == ("write", "not-re-executed")
    assert audit_command(str(rw.store.root), failed.run_id, None, True) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["passed"], doc["run_status"]) == (False, "failed")


def test_2_a_fork_that_re_executed_one_of_three_calls_fails(rw: Rewind, tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("", encoding="utf-8")
    parent = rw.record(pipelines.repeat_pipeline, {"path": str(path)})
    fork = rw.fork(
        parent.run_id, at="many", override=ParamOverride("many", "times", 1), effects="live"
    )
    assert fork.status == "completed", fork.error
    report = audit_run(rw, fork.run_id)
    assert [(v.call_index, v.verdict) for v in report.verdicts] == [
        (0, "faithful"),
        (1, "not-re-executed"),
        (2, "not-re-executed"),
    ]
    assert not report.passed


def test_2_an_unreachable_or_failing_resource_is_audit_incomplete(
    rw: Rewind, kv: KeyValueServer
) -> None:
    url = f"{kv.url}/items/1"
    run = rw.record(http_pipeline, {"url": url, "value": "abc"})
    assert run.status == "completed", run.error
    assert audit_run(rw, run.run_id).passed
    kv.status = 503
    report = audit_run(rw, run.run_id)
    assert not report.passed
    (v,) = report.verdicts
    assert v.verdict == "audit-incomplete" and "HTTP 503" in v.reason
    kv.status = None
    kv.stop()
    (v,) = audit_run(rw, run.run_id).verdicts
    assert v.verdict == "audit-incomplete" and "cannot reach" in v.reason


def test_2_a_vacuous_pass_is_only_for_a_completed_run_without_side_effects(rw: Rewind) -> None:
    run = rw.record(pipelines.pipeline, {"x": 5})
    report = audit_run(rw, run.run_id)
    assert report.passed and report.vacuous and "passes vacuously" in report.note
    assert report.to_json()["vacuous"] is True


# -- 3. (output, post-state) pairs -------------------------------------------------------------


def test_3_divergent_says_which_half_differs(rw: Rewind, tmp_path: Path) -> None:
    path = tmp_path / "stamp.txt"
    parent = rw.record(pipelines.stamp_pipeline, {"path": str(path)})
    replay = rw.replay(parent.run_id, effects="live")  # same file content, a new ticket
    assert replay.status == "completed", replay.error
    (v,) = audit_run(rw, replay.run_id).verdicts
    assert (v.verdict, v.output, v.differs) == ("divergent", "mismatch", ("output",))
    assert v.reason.startswith("output differs")
    assert v.resources[0].status == "match"

    config = tmp_path / "c.txt"
    config.write_text("start\n", encoding="utf-8")
    rec = rw.record(pipelines.effects_pipeline, {"text": "a", "path": str(config)})
    live = rw.replay(rec.run_id, at="write", effects="live")
    (same,) = audit_run(rw, live.run_id).verdicts
    assert (same.verdict, same.output, same.differs) == ("faithful", "match", ())


# -- 4. restore never destroys data silently ---------------------------------------------------


def test_4_live_restore_reports_drift_and_keeps_foreign_files(rw: Rewind, tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "note.txt").write_text("v0\n", encoding="utf-8")
    parent = rw.record(pipelines.folder_pipeline, {"folder": str(folder), "text": "v1"})
    (folder / "note.txt").write_text("edited by hand\n", encoding="utf-8")  # drift
    live = rw.replay(parent.run_id, effects="live")
    assert live.status == "completed", live.error
    (call,) = next(n for n in rw.store.nodes_of(live.run_id) if n.name == "note").calls
    assert call.reason == "side-effect-live-restored"  # the drift is reported, not hidden
    (folder / "theirs.txt").write_text("keep me\n", encoding="utf-8")
    with pytest.raises(EffectPreconditionFailed) as err:
        rw.replay(parent.run_id, effects="live")
    assert "theirs.txt" in err.value.message
    assert (folder / "theirs.txt").read_text(encoding="utf-8") == "keep me\n"


# -- 5. HTTP fingerprints: 2xx only, with the headers a GET needs ------------------------------


def test_5_http_resource_on_a_real_server(kv: KeyValueServer) -> None:
    url = f"{kv.url}/items/7"
    authed = HttpResource(url, headers={"X-Api-Key": API_KEY})
    assert authed.fingerprint().digest == ABSENT  # 404
    kv.items["/items/7"] = b"seven"
    assert authed.fingerprint().digest != ABSENT
    with pytest.raises(FingerprintUnavailable, match="HTTP 401"):
        HttpResource(url).fingerprint()  # the error page is not the resource
    kv.status = 500
    with pytest.raises(FingerprintUnavailable, match="HTTP 500"):
        authed.fingerprint()


def test_5_credentials_in_the_url_are_never_stored(rw: Rewind, kv: KeyValueServer) -> None:
    host = kv.url.removeprefix("http://")
    res = HttpResource(f"http://alice:hunter2@{host}/items/1", headers={"X-Api-Key": API_KEY})
    assert "hunter2" not in res.name and "hunter2" not in json.dumps(res.spec())
    assert res.name == f"http://{host}/items/1"
    run = rw.record(http_pipeline, {"url": f"http://alice:hunter2@{host}/items/1", "value": "v"})
    assert run.status == "completed", run.error
    (effect,) = rw.store.effects_of(run.run_id)
    assert "hunter2" not in effect.resource and "hunter2" not in json.dumps(effect.spec)
    assert effect.post_digest is not None


def test_5_a_weak_etag_is_not_the_state_the_body_is(kv: KeyValueServer) -> None:
    # W/"…" only promises "semantically equivalent": two different bodies may share it, so the
    # body is hashed; a strong ETag names the exact representation and stands for it.
    url = f"{kv.url}/items/9"
    res = HttpResource(url, headers={"X-Api-Key": API_KEY})
    kv.items["/items/9"] = b"one"
    kv.etag = 'W/"v1"'
    weak_one = res.fingerprint()
    kv.items["/items/9"] = b"two"
    weak_two = res.fingerprint()
    assert weak_one.digest != weak_two.digest and weak_two.epoch == 'W/"v1"'
    kv.etag = '"v1"'
    strong_two = res.fingerprint()
    kv.items["/items/9"] = b"three"
    assert res.fingerprint().digest == strong_two.digest


def test_5_a_live_replay_refuses_when_the_resource_cannot_be_fingerprinted(
    rw: Rewind, kv: KeyValueServer
) -> None:
    url = f"{kv.url}/items/1"
    run = rw.record(http_pipeline, {"url": url, "value": "abc"})
    kv.status = 500
    with pytest.raises(EffectPreconditionFailed, match="HTTP 500"):
        rw.replay(run.run_id, effects="live")
    assert executed("fx_contract_put") == ["abc"]


def _folder_with_a_users_file(tmp_path: Path) -> tuple[Path, Path, str]:
    """A store with one folder_pipeline run (recorded through the CLI) whose folder then got a
    file the tool never wrote: (store, folder, run id)."""
    from tests.test_cli import ok_json

    store, folder = tmp_path / "store", tmp_path / "notes"
    folder.mkdir()
    state = json.dumps({"folder": str(folder), "text": "v1"})
    run = ok_json(store, "run", "--pipeline", "tests.pipelines:folder_pipeline", "--state", state)
    run_id = run["run"]["run_id"]
    (folder / "mine.txt").write_text("a user's file\n", encoding="utf-8")
    return store, folder, run_id


def test_4_cli_fork_restore_replace_only_when_asked(tmp_path: Path) -> None:
    from tests.test_cli import ok_json, rewind

    store, folder, run_id = _folder_with_a_users_file(tmp_path)
    refused = rewind(store, "fork", run_id, "--at", "1", "--effects", "live")
    assert refused.returncode != 0
    assert "mine.txt" in refused.stderr and "--restore=replace" in refused.stderr
    assert (folder / "mine.txt").exists()
    bad = rewind(store, "fork", run_id, "--at", "1", "--restore", "replace")
    assert bad.returncode == 2 and "--effects live" in bad.stderr
    done = ok_json(store, "fork", run_id, "--at", "1", "--effects", "live", "--restore", "replace")
    assert done["run"]["status"] == "completed"
    assert sorted(p.name for p in folder.iterdir()) == ["note.txt"]
    # Point 8: the run record shows its effects mode and its last audit's label.
    fork_id = done["run"]["run_id"]
    assert done["run"]["effects_mode"] == "live" and done["run"]["admissible"] is None
    assert rewind(store, "audit", fork_id, "--json").returncode == 0
    shown = " ".join(rewind(store, "show", fork_id).stdout.split())
    assert "effects live" in shown and "audit admissible" in shown


def test_1_live_grid_variants_on_one_folder_never_interleave(rw: Rewind, tmp_path: Path) -> None:
    from rewind.effects import FileTree
    from rewind.grid import grid

    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "note.txt").write_text("v0\n", encoding="utf-8")
    parent = rw.record(pipelines.folder_pipeline, {"folder": str(folder), "text": "v1"})
    (recorded,) = rw.store.effects_of(parent.run_id)
    pipelines.NOTE_WRITERS.update(now=0, max=0)
    overrides = [ParamOverride("note", "suffix", s) for s in ("!", "?", "~")]
    report = grid(rw, parent.run_id, at="note", overrides=overrides, max_workers=3, effects="live")
    assert pipelines.NOTE_WRITERS["max"] == 1  # one writer at a time on the folder
    for variant, suffix in zip(report.variants, ("!", "?", "~"), strict=True):
        assert variant.error is None and variant.run is not None, variant.error
        (effect,) = rw.store.effects_of(variant.run.run_id)
        # Every variant ran against the recorded pre-state, whatever ran before it.
        assert effect.pre_digest == recorded.pre_digest
        expected = tmp_path / f"expected{suffix}"
        expected.mkdir()
        (expected / "note.txt").write_text(f"v1{suffix}\n", encoding="utf-8")
        assert effect.post_digest == FileTree(expected).fingerprint().digest


# -- side effects from worker threads inside a node --------------------------------------------

_LEDGER_LOCK = threading.Lock()


def _ledger(ledger: str, account: str) -> list[Any]:
    from rewind.effects import FileTree

    return [FileTree(ledger)]


@tool("fx_contract_charge", determinism="side-effect", resources=_ledger)
def charge(ledger: str, account: str) -> dict[str, Any]:
    pipelines.EFFECT_CALLS.append(("fx_contract_charge", account))
    with _LEDGER_LOCK, open(ledger, "a", encoding="utf-8") as fh:
        fh.write(f"charge {account}\n")
    return {"charged": account}


@action(reads=["ledger"], writes=["receipts"])
def charge_all(state: State) -> State:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        receipts = list(pool.map(lambda a: charge(state["ledger"], a), ["acct-1", "acct-2"]))
    return state.update(receipts=receipts)


threads_pipeline = pipelines._linear(
    "threads", "tests.test_effect_contract:threads_pipeline", charge_all=charge_all
)


def test_side_effects_from_worker_threads_are_recorded_and_never_repeated(
    rw: Rewind, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    ledger.write_text("", encoding="utf-8")
    run = rw.record(threads_pipeline, {"ledger": str(ledger)})
    assert run.status == "completed", run.error
    assert sorted(executed("fx_contract_charge")) == ["acct-1", "acct-2"]
    effects = rw.store.effects_of(run.run_id)
    assert sorted(e.call_index for e in effects) == [0, 1]
    assert all(e.post_digest is not None for e in effects)
    charged = ledger.read_bytes()

    replay = rw.replay(run.run_id)  # unchanged, effects recorded
    assert replay.status == "completed", replay.error
    assert ledger.read_bytes() == charged  # the ledger was not charged again
    assert len(executed("fx_contract_charge")) == 2
    report = audit_run(rw, replay.run_id)
    assert [v.verdict for v in report.verdicts] == ["not-re-executed", "not-re-executed"]
    assert not report.passed


# -- 6. one write path: a traced chain records its effects like a Burr run ---------------------


def test_6_a_traced_chain_records_effect_rows_and_audits_like_a_burr_run(
    rw: Rewind, tmp_path: Path
) -> None:
    from rewind.tracing import Tracer, step
    from rewind.tracing.store import search_runs

    tracer = Tracer()
    tracer.configure(store=rw.store)
    folder = tmp_path / "notes"
    folder.mkdir()

    @tracer.chain("notes")
    def write_notes(text: str) -> str:
        with step("write", "tool_call", input=text) as s:
            s.set_output(pipelines.fx_write_note(str(folder), "note.txt", text))
        return text

    write_notes("traced")
    trace = search_runs(rw.store, kind="trace", limit=1)[0][0]
    (effect,) = rw.store.effects_of(trace.run_id)
    assert (effect.resource, effect.mode) == (f"file:{folder}", "record")
    assert effect.pre_digest and effect.post_digest and effect.snapshot_hash
    assert rw.store.get_blob(effect.snapshot_hash)  # the pinned snapshot went in too
    report = audit_run(rw, trace.run_id)
    (v,) = report.verdicts
    assert (v.node, v.verdict) == ("write", "faithful") and report.passed
    (folder / "note.txt").write_text("changed\n", encoding="utf-8")
    assert audit_run(rw, trace.run_id).verdicts[0].verdict == "divergent"


def test_6_a_side_effect_outside_any_step_of_a_traced_chain_gets_a_step_of_its_own(
    rw: Rewind, tmp_path: Path
) -> None:
    # Never executed unrecorded: a call in the chain's own body becomes a tool_call step of its
    # own, with its effect rows and pinned snapshot, and audits like a call inside a step.
    from rewind.tracing import Tracer, step
    from rewind.tracing.store import load_trace, search_runs

    tracer = Tracer()
    tracer.configure(store=rw.store)
    folder = tmp_path / "notes"
    folder.mkdir()

    @tracer.chain("notes")
    def write_notes(text: str) -> str:
        with step("prep", "tool_call", input=text) as s:
            s.set_output(text)
        pipelines.fx_write_note(str(folder), "note.txt", text)  # not inside a step
        return text

    assert write_notes("traced") == "traced"
    trace = search_runs(rw.store, kind="trace", limit=1)[0][0]
    steps = load_trace(rw.store, trace.run_id).steps
    assert [(s.name, s.step_type) for s in steps] == [
        ("prep", "tool_call"),
        ("fx_write_note", "tool_call"),
    ]
    (effect,) = rw.store.effects_of(trace.run_id)
    assert (effect.resource, effect.mode) == (f"file:{folder}", "record")
    assert effect.pre_digest and effect.post_digest and effect.snapshot_hash
    report = audit_run(rw, trace.run_id)
    (v,) = report.verdicts
    assert (v.node, v.verdict) == ("fx_write_note", "faithful") and report.passed


# -- 7. OpenTelemetry export → import keeps calls, flags and effect fingerprints ---------------


def _shape(report: Any) -> list[tuple[Any, ...]]:
    return [
        (
            v.node,
            v.call_index,
            v.tool,
            v.verdict,
            v.output,
            v.differs,
            tuple((r.resource, r.recorded_digest, r.reference_digest) for r in v.resources),
        )
        for v in report.verdicts
    ]


def test_7_the_audit_of_an_imported_run_equals_the_originals(rw: Rewind, tmp_path: Path) -> None:
    from rewind.tracing.otel import export_to_file, import_otlp, read_otlp_file

    path = tmp_path / "out.txt"
    path.write_text("start\n", encoding="utf-8")
    parent = rw.record(pipelines.effects_pipeline, {"text": "hi", "path": str(path)})
    served = rw.replay(parent.run_id, at="write")  # not re-executed: must not pass after import
    stamp = tmp_path / "stamp.txt"
    stamped = rw.record(pipelines.stamp_pipeline, {"path": str(stamp)})
    live = rw.replay(stamped.run_id, effects="live")  # output differs, post-state equal
    runs = [parent, served, stamped, live]
    originals = [audit_run(rw, r.run_id, record=False) for r in runs]
    assert [o.passed for o in originals] == [True, False, True, False]

    exported = tmp_path / "runs.otlp.json"
    export_to_file(rw.store, [r.run_id for r in runs], exported)
    attrs = json.dumps(read_otlp_file(exported))
    assert "rewind.effects" in attrs and "rewind.determinism" in attrs
    other = Rewind(tmp_path / "other-store")
    try:
        result = import_otlp(other.store, read_otlp_file(exported))
        assert sorted(result.imported) == sorted(r.run_id for r in runs), result.errors
        write = next(n for n in other.store.nodes_of(parent.run_id) if n.name == "write")
        assert write.determinism == "side-effect"
        assert [c.determinism for c in write.calls if c.kind == "tool"] == ["side-effect"]
        for run, original in zip(runs, originals, strict=True):
            imported = audit_run(other, run.run_id, record=False)
            assert imported.against == original.against
            assert _shape(imported) == _shape(original)
            assert imported.passed == original.passed
    finally:
        other.store.close()


def test_7_a_fork_imported_without_its_parent_never_passes_vacuously(
    rw: Rewind, tmp_path: Path
) -> None:
    # The fork inherited the parent's side-effecting node; exported alone, that node's calls
    # stay behind. The imported fork keeps the node's side-effect flag, and a node flagged
    # side-effect with no call to audit fails closed.
    from rewind.tracing.otel import export_to_file, import_otlp, read_otlp_file

    path = tmp_path / "out.txt"
    path.write_text("", encoding="utf-8")
    parent = rw.record(pipelines.effects_pipeline, {"text": "x", "path": str(path)})
    fork = rw.fork(parent.run_id, at="after")
    assert not audit_run(rw, fork.run_id, record=False).passed
    exported = tmp_path / "fork.otlp.json"
    export_to_file(rw.store, [fork.run_id], exported)
    other = Rewind(tmp_path / "other-store")
    try:
        result = import_otlp(other.store, read_otlp_file(exported))
        assert result.imported == [fork.run_id], result.errors
        write = next(n for n in other.store.nodes_of(fork.run_id) if n.name == "write")
        assert write.determinism == "side-effect"
        for against in (None, "current"):
            report = audit_run(other, fork.run_id, against, record=False)
            assert not report.passed and not report.vacuous, report.note
            (v,) = report.verdicts
            assert (v.node, v.verdict) == ("write", "audit-incomplete")
    finally:
        other.store.close()


def test_8_rewind_runs_lists_effects_mode_and_audit_label(tmp_path: Path) -> None:
    from tests.test_cli import ok_json, rewind

    store = tmp_path / "store"
    run = ok_json(store, "run", "--pipeline", "tests.pipelines:pipeline", "--state", '{"x": 5}')
    run_id = run["run"]["run_id"]
    assert rewind(store, "audit", run_id).returncode == 0
    listed = {r["run_id"]: r for r in ok_json(store, "runs")}
    assert (listed[run_id]["effects_mode"], listed[run_id]["admissible"]) == ("record", "vacuous")
    table = rewind(store, "runs").stdout
    assert "vacuous" in table and "record" in table


def test_4_cli_live_fork_reports_the_drift_it_restored(tmp_path: Path) -> None:
    # Restoring a drifted folder replaces what someone changed by hand: the fork must say so,
    # with both fingerprints and the entries that differ, not only label the node.
    from tests.test_cli import ok_json, rewind

    store, folder = tmp_path / "store", tmp_path / "notes"
    folder.mkdir()
    (folder / "note.txt").write_text("v0\n", encoding="utf-8")
    state = json.dumps({"folder": str(folder), "text": "v1"})
    run = ok_json(store, "run", "--pipeline", "tests.pipelines:folder_pipeline", "--state", state)
    (folder / "note.txt").write_text("edited by hand\n", encoding="utf-8")
    proc = rewind(store, "fork", run["run"]["run_id"], "--at", "1", "--effects", "live")
    assert proc.returncode == 0, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "warning:" in err and "restored" in err and f"file:{folder}" in err
    assert "note.txt" in err  # which entry it replaced
    assert (folder / "note.txt").read_text(encoding="utf-8") == "v1\n"


# -- one writer per resource across processes (grid variants on Celery workers, two CLIs) -----


def _slow_folder(folder: str, text: str, log: str) -> list[Any]:
    from rewind.effects import FileTree

    return [FileTree(folder)]


@tool("fx_contract_slow_note", determinism="side-effect", resources=_slow_folder)
def slow_note(folder: str, text: str, log: str) -> dict[str, Any]:
    import os
    import time

    marker = Path(log).with_suffix(".writing")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        with Path(log).open("a", encoding="utf-8") as fh:
            fh.write("overlap\n")
        fd = None
    try:
        time.sleep(0.3)  # a slow write: another process writing now would overlap
        (Path(folder) / "note.txt").write_text(text + "\n", encoding="utf-8")
    finally:
        if fd is not None:
            os.close(fd)
            marker.unlink()
    with Path(log).open("a", encoding="utf-8") as fh:
        fh.write("wrote\n")
    return {"status": "ok"}


@action(reads=["folder", "text", "log"], writes=["receipt"])
def slow_note_node(state: State) -> State:
    return state.update(receipt=slow_note(state["folder"], state["text"], state["log"]))


slow_pipeline = pipelines._linear(
    "slow", "tests.test_effect_contract:slow_pipeline", note=slow_note_node
)


def _live_replay(root: Path, run_id: str) -> str:
    """In a child process: a live replay of ``run_id`` through its own Rewind on ``root``."""
    r = Rewind(root).replay(run_id, effects="live")
    return f"{r.status} {r.error}"


def test_1_live_forks_in_two_processes_never_interleave_on_one_folder(
    rw: Rewind, tmp_path: Path
) -> None:
    from tests import forked

    folder, log = tmp_path / "notes", tmp_path / "writes.log"
    folder.mkdir()
    run = rw.record(slow_pipeline, {"folder": str(folder), "text": "v1", "log": str(log)})
    assert run.status == "completed", run.error
    # three processes at once (forked: Python, Burr and Rewind imported already)
    children = [forked.fork(_live_replay, rw.store.root, run.run_id) for _ in range(3)]
    outs = [child.wait() for child in children]
    assert all(code == 0 and out.startswith("completed") for code, out in outs), outs
    assert log.read_text(encoding="utf-8").split() == ["wrote"] * 4  # never "overlap"


# -- a side-effecting call that raises half-way keeps its fingerprints and pinned pre-state -----


def _crash_folder(folder: str) -> list[Any]:
    from rewind.effects import FileTree

    return [FileTree(folder)]


@tool("fx_contract_half_write", determinism="side-effect", resources=_crash_folder)
def half_write(folder: str) -> dict[str, Any]:
    (Path(folder) / "a.txt").write_text("half\n", encoding="utf-8")
    raise RuntimeError("the disk went away mid-write")


@action(reads=["folder"], writes=["receipt"])
def half_write_node(state: State) -> State:
    return state.update(receipt=half_write(state["folder"]))


crash_pipeline = pipelines._linear(
    "crash", "tests.test_effect_contract:crash_pipeline", write=half_write_node
)


def test_a_call_that_raised_after_writing_keeps_its_pre_state_and_fails_the_audit(
    rw: Rewind, tmp_path: Path
) -> None:
    from rewind.effects import FileTree

    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.txt").write_text("original\n", encoding="utf-8")
    before = FileTree(folder).fingerprint().digest
    run = rw.record(crash_pipeline, {"folder": str(folder)})
    assert run.status == "failed" and "mid-write" in (run.error or "")
    (effect,) = rw.store.effects_of(run.run_id)
    assert effect.pre_digest == before and effect.post_digest not in (None, before)
    assert effect.snapshot_hash is not None
    FileTree(folder).restore(rw.store.get_blob(effect.snapshot_hash))  # the before-state is kept
    assert (folder / "a.txt").read_text(encoding="utf-8") == "original\n"
    report = audit_run(rw, run.run_id, record=False)
    assert not report.passed and "did not complete" in report.note


def test_1_live_grid_variants_each_run_when_the_tool_creates_its_file(
    rw: Rewind, tmp_path: Path
) -> None:
    # The folder starts empty, so the recorded call created note.txt. Variant 2 then finds the
    # note.txt variant 1 wrote: data a Rewind call left, not a user's, so restoring the
    # recorded (empty) pre-state may delete it; every variant runs against that pre-state.
    from rewind.grid import grid

    folder = tmp_path / "notes"
    folder.mkdir()
    parent = rw.record(pipelines.folder_pipeline, {"folder": str(folder), "text": "v1"})
    (recorded,) = rw.store.effects_of(parent.run_id)
    overrides = [ParamOverride("note", "suffix", s) for s in ("!", "?", "~")]
    report = grid(rw, parent.run_id, at="note", overrides=overrides, max_workers=3, effects="live")
    for variant in report.variants:
        assert variant.error is None and variant.run is not None, variant.error
        (effect,) = rw.store.effects_of(variant.run.run_id)
        assert effect.pre_digest == recorded.pre_digest
    # A user's file is still never deleted without --restore=replace.
    (folder / "mine.txt").write_text("keep\n", encoding="utf-8")
    with pytest.raises(EffectPreconditionFailed, match=r"mine\.txt"):
        rw.fork(
            parent.run_id,
            at="note",
            override=ParamOverride("note", "suffix", "#"),
            effects="live",
        )
    assert (folder / "mine.txt").exists()


# -- a side effect in a child process of the node would escape the record ----------------------


def _charge_in_child(ledger: str) -> Any:
    return charge(ledger, "child")


@action(reads=["ledger"], writes=["receipts"])
def charge_in_process(state: State) -> State:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # A forked worker inherits the node's run context, but nothing it records comes back.
    fork_ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=1, mp_context=fork_ctx) as pool:
        receipts = list(pool.map(_charge_in_child, [state["ledger"]]))
    return state.update(receipts=receipts)


process_pipeline = pipelines._linear(
    "process", "tests.test_effect_contract:process_pipeline", charge=charge_in_process
)


def test_a_side_effect_in_a_child_process_is_refused_not_lost(rw: Rewind, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    ledger.write_text("", encoding="utf-8")
    run = rw.record(process_pipeline, {"ledger": str(ledger)})
    assert run.status == "failed" and "called in a child process" in (run.error or "")
    assert ledger.read_text(encoding="utf-8") == ""  # executed nowhere, so nothing unrecorded
    report = audit_run(rw, run.run_id, record=False)
    assert not report.passed


def test_4_cli_grid_restore_replace_only_when_asked(tmp_path: Path) -> None:
    # A live grid refusing to delete a user's file names --restore=replace: the grid takes it.
    from tests.test_cli import rewind

    store, folder, run_id = _folder_with_a_users_file(tmp_path)
    variants = ("--set", 'note.suffix="!"', "--set", 'note.suffix="?"')
    refused = rewind(store, "grid", run_id, "--at", "note", *variants)
    assert refused.returncode == 1 and "--restore=replace" in " ".join(refused.stdout.split())
    assert (folder / "mine.txt").exists()
    bad = rewind(store, "grid", run_id, "--at", "note", *variants, "--effects", "dry-run",
                 "--restore", "replace")  # fmt: skip
    assert bad.returncode == 2 and "--effects live" in bad.stderr
    unknown = rewind(store, "grid", run_id, "--at", "note", *variants, "--restore", "bogus")
    assert unknown.returncode == 2 and "bogus" in unknown.stderr
    assert len(rewind(store, "runs", "--json").stdout.split('"run_id"')) - 1 == 3  # none added
    done = rewind(store, "grid", run_id, "--at", "note", *variants, "--restore", "replace")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["note.txt"]


def test_4_api_grid_restore_replace_only_with_live(rw: Rewind, tmp_path: Path) -> None:
    import time

    from fastapi.testclient import TestClient

    from rewind.api import create_app

    folder = tmp_path / "notes"
    folder.mkdir()
    parent = rw.record(pipelines.folder_pipeline, {"folder": str(folder), "text": "v1"})
    (folder / "mine.txt").write_text("a user's file\n", encoding="utf-8")
    override = {"kind": "param", "node": "note", "param": "suffix", "value": "!"}
    body = {"at": 1, "overrides": [override]}
    with TestClient(create_app(rw.store), base_url="http://127.0.0.1") as c:
        bad = c.post(f"/api/runs/{parent.run_id}/grid", json=body | {"effects": "dry-run",
                     "restore": "replace"})  # fmt: skip
        assert bad.status_code == 422 and "effects" in bad.json()["message"], bad.text
        accepted = c.post(f"/api/runs/{parent.run_id}/grid", json=body | {"restore": "replace"})
        assert accepted.status_code == 202, accepted.text
        job = accepted.json()
        for _ in range(6000):
            job = c.get(accepted.headers["location"]).json()
            if job["status"] not in ("queued", "running"):
                break
            time.sleep(0.02)
        assert job["status"] == "completed", job
        assert job["request"]["restore"] == "replace"
    assert sorted(p.name for p in folder.iterdir()) == ["note.txt"]


# -- a call that moved to another resource is a new effect, not a replay of the recorded one ---


@action(reads=["base"], writes=["folder"])
def choose_folder(state: State) -> State:
    import rewind

    return state.update(folder=f"{state['base']}/{rewind.param('sub', 'a')}")


@action(reads=["folder"], writes=["receipt"])
def note_in_folder(state: State) -> State:
    return state.update(receipt=pipelines.fx_write_note(state["folder"], "note.txt", "same"))


where_pipeline = pipelines._linear(
    "where", "tests.test_effect_contract:where_pipeline", where=choose_folder, note=note_in_folder
)


def test_1_a_live_call_on_another_folder_never_gets_the_recorded_folders_snapshot(
    rw: Rewind, tmp_path: Path
) -> None:
    for sub, text in (("a", "old a\n"), ("b", "precious b\n")):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "note.txt").write_text(text, encoding="utf-8")
    parent = rw.record(where_pipeline, {"base": str(tmp_path)})
    assert parent.status == "completed", parent.error
    with pytest.raises(EffectPreconditionFailed, match="recorded no pre-state"):
        rw.fork(
            parent.run_id, at="where", override=ParamOverride("where", "sub", "b"), effects="live"
        )
    assert (tmp_path / "b" / "note.txt").read_text(encoding="utf-8") == "precious b\n"
    # Dry-run logs it; its audit does not compare folder b with folder a.
    dry = rw.fork(
        parent.run_id, at="where", override=ParamOverride("where", "sub", "b"), effects="dry-run"
    )
    assert dry.status == "completed", dry.error
    assert not audit_run(rw, dry.run_id, record=False).passed


def test_3_a_call_on_another_folder_is_not_paired_with_the_recorded_folder(
    rw: Rewind, tmp_path: Path
) -> None:
    for base in ("one", "two"):
        (tmp_path / base / "a").mkdir(parents=True)
    parent = rw.record(where_pipeline, {"base": str(tmp_path / "one")})
    other = rw.record(where_pipeline, {"base": str(tmp_path / "two")})
    assert other.status == "completed", other.error
    (v,) = audit_run(rw, other.run_id, parent.run_id, record=False).verdicts
    assert v.verdict == "audit-incomplete", v.reason  # both folders hold the same note
    assert {r.resource for r in v.resources} == {
        f"file:{tmp_path}/one/a",
        f"file:{tmp_path}/two/a",
    }


def test_3_a_call_that_ran_against_another_pre_state_is_not_faithful(
    rw: Rewind, tmp_path: Path
) -> None:
    # Seed 004, condition 2: a replay is a reconstruction only against the recorded pre-state.
    # A fresh run that overwrote a different note with the same text ends in the same state,
    # but it is not evidence that the first run's effect was reproduced.
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "note.txt").write_text("y\n", encoding="utf-8")
    first = rw.record(pipelines.folder_pipeline, {"folder": str(folder), "text": "v1"})
    (folder / "note.txt").write_text("z\n", encoding="utf-8")
    second = rw.record(pipelines.folder_pipeline, {"folder": str(folder), "text": "v1"})
    (v,) = audit_run(rw, second.run_id, first.run_id, record=False).verdicts
    assert v.verdict == "audit-incomplete" and "pre-state" in v.reason, v.reason
    # The same fresh run against an identical pre-state is faithful.
    (folder / "note.txt").write_text("z\n", encoding="utf-8")
    third = rw.record(pipelines.folder_pipeline, {"folder": str(folder), "text": "v1"})
    (w,) = audit_run(rw, third.run_id, second.run_id, record=False).verdicts
    assert w.verdict == "faithful", w.reason


def test_4_the_drift_warning_prints_hostile_file_names_as_typed(tmp_path: Path) -> None:
    # Entry names in a user's folder are untrusted text: Rich markup in them is shown, never
    # applied, and control characters are escaped.
    from tests.test_cli import ok_json, rewind

    store, folder = tmp_path / "store", tmp_path / "notes"
    folder.mkdir()
    hostile = "[bold red]x\x1b[2J"
    (folder / hostile).write_text("v0\n", encoding="utf-8")
    (folder / "note.txt").write_text("v0\n", encoding="utf-8")
    state = json.dumps({"folder": str(folder), "text": "v1"})
    run = ok_json(store, "run", "--pipeline", "tests.pipelines:folder_pipeline", "--state", state)
    (folder / hostile).write_text("edited\n", encoding="utf-8")
    proc = rewind(store, "fork", run["run"]["run_id"], "--at", "1", "--effects", "live")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stderr
    assert "changed [bold red]x\\u001b[2J" in " ".join(proc.stderr.split())


# -- nothing declared, nothing verified: live refuses ------------------------------------------


def test_1_live_refuses_a_call_that_declares_no_resource(rw: Rewind) -> None:
    run = rw.record(pipelines.notify_pipeline, {"message": "hi"})
    assert run.status == "completed", run.error
    with pytest.raises(EffectPreconditionFailed, match="declares no resource"):
        rw.replay(run.run_id, effects="live")
    assert executed("fx_notify") == ["hi"]  # not sent a second time


@tool("fx_contract_bad_resources", determinism="side-effect", resources=lambda path: [path])
def bad_resources(path: str) -> dict[str, Any]:
    pipelines.EFFECT_CALLS.append(("fx_contract_bad_resources", path))
    return {"ok": True}


@action(reads=["path"], writes=["receipt"])
def bad_resources_node(state: State) -> State:
    return state.update(receipt=bad_resources(state["path"]))


bad_resources_pipeline = pipelines._linear(
    "bad_resources", "tests.test_effect_contract:bad_resources_pipeline", call=bad_resources_node
)


def test_a_declared_resource_that_is_not_a_fingerprinter_is_refused(
    rw: Rewind, tmp_path: Path
) -> None:
    # A path string instead of FileTree(path) would silently declare nothing.
    run = rw.record(bad_resources_pipeline, {"path": str(tmp_path)})
    assert run.status == "failed" and "cannot be fingerprinted" in (run.error or ""), run.error
    assert executed("fx_contract_bad_resources") == []
