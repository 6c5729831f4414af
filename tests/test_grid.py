"""What-if grid: N variants forked at one node, run concurrently on one store, shared work once.

Uses ``tests.pipelines.grid_pipeline``: ``frame (tool) → draft (llm) → gist (tool) → review (llm)
→ publish_note (side-effect)``. The fake model echoes the temperature into its answer and
``gist`` buckets it (``cool`` < 0.5 ≤ ``warm``), so variants at ``draft`` with temperatures 0.7
and 0.9 write different drafts but hand ``review`` the same input: it must run once.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from rewind.cli.grid import grid_command, render_grid
from rewind.errors import InvalidOverride, RunBusy, UnknownNode, UnknownRun
from rewind.grid import GridReport, SharedChatClient, grid
from rewind.llm import ChatClient, ChatResponse, Endpoint, RetryPolicy
from rewind.replay import OutputOverride, ParamOverride, Rewind
from rewind.store import RunRecord
from tests import pipelines
from tests.conftest import FAKE_BASE_URL, FAKE_MODEL, FakeModel, row_counts

QUESTION = "why is the sky blue"
NODES = ["frame", "draft", "gist", "review", "publish_note"]


class SlowModel(FakeModel):
    """The conftest fake model, answering after a fixed delay so concurrent variants overlap."""

    def __init__(self, delay_s: float = 0.05) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.gate: threading.Event | None = None  # when set up: no answer until it opens
        self._lock = threading.Lock()

    def handler(self, request: httpx.Request) -> httpx.Response:
        if self.gate is not None:
            assert self.gate.wait(300), "the gate never opened"
        time.sleep(self.delay_s)
        with self._lock:
            return super().handler(request)

    def tokens(self) -> int:
        """Tokens the fake answered with, over every request it received."""
        total = 0
        for body in self.requests:
            content = f"answer to {body['messages'][-1]['content']} at t={body['temperature']}"
            total += 11 + len(content.split())
        return total


@pytest.fixture
def model() -> SlowModel:
    return SlowModel()


def _client(model: FakeModel) -> ChatClient:
    return ChatClient(
        Endpoint(base_url=FAKE_BASE_URL, model=FAKE_MODEL),
        transport=httpx.MockTransport(model.handler),
        retry=RetryPolicy(attempts=1),
    )


@pytest.fixture
def rw(tmp_path: Path, model: SlowModel) -> Iterator[Rewind]:
    client = _client(model)
    session = Rewind(tmp_path / "store", chat_client=client)
    yield session
    session.store.close()
    client.close()


@pytest.fixture
def parent(rw: Rewind, model: SlowModel) -> RunRecord:
    # The delay makes concurrent variants overlap; the serial recording needs none (0.1 s of
    # sleep in each of ~27 tests' setup).
    delay, model.delay_s = model.delay_s, 0.0
    run = rw.record(pipelines.grid_pipeline, {"question": QUESTION})
    assert run.status == "completed", run.error
    model.requests.clear()
    model.delay_s = delay
    return run


FIVE = [
    ParamOverride("draft", "temperature", 0.7),
    ParamOverride("draft", "temperature", 0.9),  # same review input as 0.7
    ParamOverride("draft", "temperature", 0.7),  # the very same variant twice
    ParamOverride("draft", "max_tokens", 64),  # new request, same answer: no divergence
    ParamOverride("draft", "temperature", 0.2),  # new draft, parent's review input
]


def _row(report: GridReport, name: str) -> Any:
    return next(r for r in report.rows if r.name == name)


# -- shared work -------------------------------------------------------------------------------


def test_variants_send_one_request_per_distinct_new_input(
    rw: Rewind, parent: RunRecord, model: SlowModel
) -> None:
    report = grid(rw, parent.run_id, at="draft", overrides=FIVE, max_workers=4)

    # draft at 0.7, 0.9, 0.2 and max_tokens 64, plus one review of a "warm" draft.
    assert report.new_llm_inputs == 5
    assert model.count == 5
    assert report.llm_requests == 5
    bodies = {json.dumps(b, sort_keys=True) for b in model.requests}
    assert len(bodies) == 5, "no request was sent twice"
    assert sum(v.llm_requests for v in report.variants) == 5
    assert all(v.status == "completed" for v in report.variants)


def test_shared_calls_spend_tokens_once(rw: Rewind, parent: RunRecord, model: SlowModel) -> None:
    report = grid(rw, parent.run_id, at="draft", overrides=FIVE, max_workers=4)

    assert report.tokens == model.tokens()
    assert report.tokens == sum(rw.store.get_run(v.run.run_id).tokens for v in report.variants)
    # the cool variant's review input is the parent's: served from the parent's lineage
    cool = report.variants[4]
    review = next(n for n in rw.store.nodes_of(cool.run.run_id) if n.name == "review")
    assert (review.cache_outcome, review.tokens) == ("hit", 0)


def test_a_second_grid_of_the_same_variants_is_all_cache_hits(
    rw: Rewind, parent: RunRecord, model: SlowModel
) -> None:
    grid(rw, parent.run_id, at="draft", overrides=FIVE)
    model.requests.clear()

    again = grid(rw, parent.run_id, at=2, overrides=FIVE)

    assert model.count == 0
    assert again.tokens == 0
    for v in again.variants:
        executed = [n for n in rw.store.nodes_of(v.run.run_id) if not n.inherited]
        outcomes = {(n.name, n.cache_outcome, n.cache_reason) for n in executed}
        assert ("publish_note", "miss", "side-effect-live") in outcomes  # effects live: re-run
        assert {o[1] for o in outcomes if o[0] != "publish_note"} == {"hit"}, v.label


# -- the matrix --------------------------------------------------------------------------------


def test_matrix_rows_are_nodes_and_columns_are_variants(rw: Rewind, parent: RunRecord) -> None:
    report = grid(rw, parent.run_id, at="draft", overrides=FIVE)

    assert [r.name for r in report.rows] == NODES
    assert [v.label for v in report.variants] == [
        "draft.temperature=0.7",
        "draft.temperature=0.9",
        "draft.temperature=0.7",
        "draft.max_tokens=64",
        "draft.temperature=0.2",
    ]
    parent_nodes = rw.store.nodes_of(parent.run_id)
    for row, node in zip(report.rows, parent_nodes, strict=True):
        assert row.parent_hash == node.output_hash
        assert len(row.cells) == 5

    frame = _row(report, "frame")
    assert all(c.status == "equal" and c.outcome == "inherited" for c in frame.cells)
    assert all(c.changed_fields == 0 and c.short == frame.parent_hash[:8] for c in frame.cells)

    draft = _row(report, "draft")
    assert [c.status for c in draft.cells] == ["changed", "changed", "changed", "equal", "changed"]
    assert [c.changed_fields for c in draft.cells] == [1, 1, 1, 0, 1]
    assert draft.cells[0].output_hash == draft.cells[2].output_hash  # same variant twice
    assert draft.cells[3].output_hash == draft.parent_hash
    assert draft.cells[3].outcome == "miss:override"

    gist = _row(report, "gist")
    warm = {c.output_hash for c in gist.cells[:3]}
    assert len(warm) == 1 and gist.parent_hash not in warm
    assert gist.cells[4].output_hash == gist.parent_hash  # 0.2 is still "cool"

    review = _row(report, "review")
    assert len({c.output_hash for c in review.cells[:3]}) == 1
    assert review.cells[3].output_hash == review.cells[4].output_hash == review.parent_hash
    assert all(c.changed_fields == (1 if i < 3 else 0) for i, c in enumerate(review.cells))


def test_first_divergence_per_variant(rw: Rewind, parent: RunRecord) -> None:
    report = grid(rw, parent.run_id, at="draft", overrides=FIVE)

    firsts = [(v.first_divergence, v.first_divergence_node) for v in report.variants]
    assert firsts == [(1, "draft"), (1, "draft"), (1, "draft"), (None, None), (1, "draft")]


def test_first_divergence_further_down_than_the_fork_node(rw: Rewind, parent: RunRecord) -> None:
    # Forked at frame, but the change is on gist's downstream reader: review's max_tokens.
    report = grid(
        rw,
        parent.run_id,
        at="frame",
        overrides=[ParamOverride("review", "max_tokens", 7), ParamOverride("frame", "style", "x")],
    )
    assert report.variants[0].first_divergence_node is None  # fake answers ignore max_tokens
    assert report.variants[1].first_divergence_node == "frame"
    assert [c.outcome for c in _row(report, "frame").cells] == ["hit", "miss:override"]


def test_which_variants_change_the_final_artifact(rw: Rewind, parent: RunRecord) -> None:
    report = grid(rw, parent.run_id, at="draft", overrides=FIVE)

    assert list(report.parent_artifacts) == ["note.md"]
    assert [v.changes_artifact for v in report.variants] == [True, True, True, False, True]
    same = report.variants[3]
    assert same.artifacts == report.parent_artifacts
    assert report.variants[0].artifacts == report.variants[2].artifacts
    assert report.variants[0].artifacts != report.variants[1].artifacts
    for v in report.variants:  # every variant published its own file
        (art,) = rw.store.artifacts_of(v.run.run_id)
        assert Path(art["path"]).read_bytes()
        assert v.run.run_id in str(art["path"])


def test_output_override_variant(rw: Rewind, parent: RunRecord) -> None:
    report = grid(
        rw,
        parent.run_id,
        at="draft",
        overrides=[OutputOverride("draft", "draft", "hand written at t=0.9")],
    )
    (v,) = report.variants
    assert v.status == "completed"
    assert v.label == 'draft.draft:="hand written at t=0.9"'
    assert _row(report, "draft").cells[0].outcome == "override:output-override"
    assert _row(report, "gist").cells[0].status == "changed"


def test_report_json_shape(rw: Rewind, parent: RunRecord) -> None:
    report = grid(rw, parent.run_id, at="draft", overrides=FIVE[:2])
    data = json.loads(json.dumps(report.to_json(), allow_nan=False))

    assert data["kind"] == "grid"
    assert (data["at"], data["at_number"], data["effects"]) == ("draft", 2, "live")
    assert data["changes_artifact"] == ["draft.temperature=0.7", "draft.temperature=0.9"]
    assert [len(r["cells"]) for r in data["rows"]] == [2] * 5
    v0 = data["variants"][0]
    assert set(v0) >= {"run_id", "status", "tokens", "first_divergence", "changes_artifact"}
    assert v0["first_divergence"] == {"index": 1, "node": "draft"}
    assert data["rows"][1]["cells"][0]["changed_fields"] == 1
    run = rw.store.get_run(v0["run_id"])
    assert run.config["purpose"] == "grid" and run.config["grid_batch"] == data["batch"]
    assert run.parent_run_id == parent.run_id and run.fork_node == "draft"


def test_render_grid_prints_the_matrix(rw: Rewind, parent: RunRecord) -> None:
    from rich.console import Console

    report = grid(rw, parent.run_id, at="draft", overrides=FIVE)
    console = Console(record=True, width=220)
    render_grid(report, console)
    out = console.export_text()
    assert "1: draft.temperature=0.7" in out and "publish_note" in out
    assert "Δ1" in out and "changes the artifact" in out and "no divergence" in out


def test_render_grid_shows_markup_in_values_literally(rw: Rewind, parent: RunRecord) -> None:
    from rich.console import Console

    report = grid(rw, parent.run_id, at="frame", overrides=[ParamOverride("frame", "style", "[b]")])
    console = Console(record=True, width=220)
    render_grid(report, console)
    assert 'frame.style="[b]"' in console.export_text()


# -- concurrency on one store --------------------------------------------------------------------


def test_eight_variants_four_workers_match_serial_forks(
    rw: Rewind, parent: RunRecord, tmp_path: Path
) -> None:
    overrides = [ParamOverride("draft", "temperature", t / 10) for t in range(1, 9)]
    report = grid(rw, parent.run_id, at="draft", overrides=overrides, max_workers=4)

    assert report.workers == 4
    assert [v.status for v in report.variants] == ["completed"] * 8
    # The same forks one by one on a fresh store give the very same hashes.
    serial_model = FakeModel()
    client = _client(serial_model)
    serial = Rewind(tmp_path / "serial", chat_client=client)
    try:
        p = serial.record(pipelines.grid_pipeline, {"question": QUESTION})
        for v, o in zip(report.variants, overrides, strict=True):
            child = serial.fork(p.run_id, at="draft", override=o, effects="live")
            grid_nodes = rw.store.nodes_of(v.run.run_id)
            serial_nodes = serial.store.nodes_of(child.run_id)
            assert [n.output_hash for n in grid_nodes] == [n.output_hash for n in serial_nodes]
            assert [n.state_hash for n in grid_nodes] == [n.state_hash for n in serial_nodes]
            assert [n.position for n in grid_nodes] == list(range(5))
            assert [n.inherited for n in grid_nodes] == [True, False, False, False, False]
    finally:
        serial.store.close()
        client.close()
    with rw.store.read() as conn:
        assert conn.execute(text("PRAGMA integrity_check")).scalar_one() == "ok"
        assert conn.execute(text("SELECT COUNT(*) FROM runs WHERE status='running'")).scalar() == 0


def test_concurrent_unchanged_replays_on_one_rewind_are_all_hits(
    rw: Rewind, parent: RunRecord, model: SlowModel
) -> None:
    results: list[RunRecord] = []
    errors: list[BaseException] = []

    def replay() -> None:
        try:
            results.append(rw.replay(parent.run_id, at="draft"))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=replay) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert model.count == 0
    expected = [n.output_hash for n in rw.store.nodes_of(parent.run_id)]
    for run in results:
        assert run.status == "completed" and run.tokens == 0
        assert [n.output_hash for n in rw.store.nodes_of(run.run_id)] == expected


def test_many_copies_of_one_variant_send_each_request_once(
    rw: Rewind, parent: RunRecord, model: SlowModel
) -> None:
    same = [ParamOverride("draft", "temperature", 0.8)] * 8
    report = grid(rw, parent.run_id, at="draft", overrides=same, max_workers=8)

    assert model.count == report.new_llm_inputs == 2  # draft at 0.8 + review of a warm draft
    assert len({v.artifacts["note.md"] for v in report.variants}) == 1
    assert report.tokens == model.tokens()


def test_engine_alone_shares_concurrent_identical_calls(
    rw: Rewind, parent: RunRecord, model: SlowModel
) -> None:
    # The twin 0.7 variants must overlap on any machine, not only when the delay suffices: no
    # answer until every variant of the first wave (one per worker) has started its draft.
    workers = 4
    drafts_started = itertools.count(1)
    gate = model.gate = threading.Event()

    def open_gate(event: str, payload: dict[str, Any]) -> None:
        draft = event == "node_started" and payload["name"] == "draft"
        if draft and next(drafts_started) == workers:
            gate.set()

    rw.on_event = open_gate
    report = grid(
        rw, parent.run_id, at="draft", overrides=FIVE, share_llm=False, max_workers=workers
    )
    assert model.count == report.new_llm_inputs == 5
    labels = {
        c.label for v in report.variants for n in rw.store.nodes_of(v.run.run_id) for c in n.calls
    }
    assert "hit:in-flight" in labels


# needs engine fix: rewind.cache._single_flight drops the in-flight entry as soon as the call
# returns, before the recorder commits its cache row; a variant reaching the same key in between
# finds neither and executes it again. The grid's SharedChatClient covers LLM calls (see the
# test above it); the engine patch keeps the entry until the commit. Remove the mark with it.
def test_engine_alone_never_repeats_a_call_between_answer_and_commit(
    rw: Rewind, parent: RunRecord, model: SlowModel
) -> None:
    model.delay_s = 0.02
    overrides = [
        ParamOverride("draft", "temperature", round(0.05 * (i % 20), 2)) for i in range(40)
    ]
    report = grid(
        rw, parent.run_id, at="draft", overrides=overrides, max_workers=24, share_llm=False
    )
    assert [v.status for v in report.variants] == ["completed"] * 40
    assert model.count == report.new_llm_inputs == 20


def test_shared_chat_client_covers_the_window_between_answer_and_commit(
    rw: Rewind, parent: RunRecord, model: SlowModel
) -> None:
    model.delay_s = 0.02
    overrides = [
        ParamOverride("draft", "temperature", round(0.05 * (i % 20), 2)) for i in range(40)
    ]
    report = grid(rw, parent.run_id, at="draft", overrides=overrides, max_workers=24)
    assert [v.status for v in report.variants] == ["completed"] * 40
    assert model.count == report.new_llm_inputs == report.llm_requests == 20
    assert report.tokens == model.tokens()


# -- failures and bad input ----------------------------------------------------------------------


def test_a_dry_run_variant_is_never_labelled_as_changing_the_artifact(
    rw: Rewind, parent: RunRecord
) -> None:
    report = grid(rw, parent.run_id, at="draft", overrides=FIVE, effects="dry-run")
    assert [v.status for v in report.variants] == ["completed"] * 5
    assert [v.changes_artifact for v in report.variants] == [None] * 5
    assert report.to_json()["changes_artifact"] == []
    from rich.console import Console

    console = Console(record=True, width=300)
    render_grid(report, console)
    out = console.export_text()
    assert "changes the artifact" not in out and "artifact not published (dry-run)" in out


def test_recorded_effects_stop_variants_whose_publish_arguments_changed(
    rw: Rewind, parent: RunRecord
) -> None:
    report = grid(rw, parent.run_id, at="draft", overrides=FIVE, effects="recorded")

    statuses = [v.status for v in report.variants]
    assert statuses == ["failed", "failed", "failed", "completed", "failed"]
    failed = report.variants[0]
    assert "side-effecting tool" in (failed.error or "")
    cell = _row(report, "publish_note").cells[0]
    assert cell.status == "failed" and cell.output_hash is None
    assert failed.first_divergence_node == "draft"
    assert report.variants[3].changes_artifact is False


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([ParamOverride("draft", "nope", 1)], "has no param 'nope'"),
        ([ParamOverride("frame", "style", "x")], "runs before the fork node"),
        ([ParamOverride("ghost", "temperature", 1)], "has no node 'ghost'"),
        ([OutputOverride("draft", "nope", 1)], "has no output field 'nope'"),
        ([OutputOverride("review", "review", "x")], "names node 'review'"),
        ([], "at least one variant"),
    ],
)
def test_bad_override_raises_before_anything_runs(
    rw: Rewind, parent: RunRecord, model: SlowModel, overrides: list[Any], message: str
) -> None:
    before = row_counts(rw.store)
    good = ParamOverride("draft", "temperature", 0.3)
    with pytest.raises(InvalidOverride, match=message):
        grid(rw, parent.run_id, at="draft", overrides=[good, *overrides] if overrides else [])
    assert row_counts(rw.store) == before
    assert model.count == 0


def test_bad_run_node_workers_or_effects_raise_before_anything_runs(
    rw: Rewind, parent: RunRecord, model: SlowModel
) -> None:
    before = row_counts(rw.store)
    one = [ParamOverride("draft", "temperature", 0.3)]
    with pytest.raises(UnknownRun):
        grid(rw, "nope-nope", at="draft", overrides=one)
    with pytest.raises(UnknownNode):
        grid(rw, parent.run_id, at="nowhere", overrides=one)
    with pytest.raises(InvalidOverride, match="workers"):
        grid(rw, parent.run_id, at="draft", overrides=one, max_workers=0)
    with pytest.raises(InvalidOverride, match="effects"):
        grid(rw, parent.run_id, at="draft", overrides=one, effects="sometimes")
    assert row_counts(rw.store) == before
    assert model.count == 0


def test_grid_of_a_running_run_raises_run_busy(rw: Rewind, parent: RunRecord) -> None:
    with rw.store.write() as conn:
        conn.execute(text("UPDATE runs SET status='running' WHERE run_id=:r"), {"r": parent.run_id})
    with pytest.raises(RunBusy):
        grid(rw, parent.run_id, at="draft", overrides=FIVE)


# -- SharedChatClient ----------------------------------------------------------------------------


def test_shared_chat_client_sends_concurrent_identical_requests_once() -> None:
    model = SlowModel(delay_s=0.1)
    client = _client(model)
    shared = SharedChatClient(client)
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.0}
    answers: list[ChatResponse] = []
    threads = [
        threading.Thread(target=lambda: answers.append(shared.complete(body))) for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()

    assert model.count == 1
    assert (shared.requests, shared.shared) == (1, 5)
    assert len({a.raw for a in answers}) == 1
    # "answer to hi at t=0.0": 5 completion tokens, spent once
    assert sorted(a.completion_tokens for a in answers) == [0, 0, 0, 0, 0, 5]
    assert shared.cache_key(body) == client.cache_key(body)
    assert shared.endpoint.model == FAKE_MODEL


def test_shared_chat_client_does_not_keep_a_failed_request() -> None:
    calls = {"n": 0}

    def flaky(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 1:
            return httpx.Response(400, json={"error": {"message": "bad"}})
        return FakeModel().handler(request)

    client = ChatClient(
        Endpoint(base_url=FAKE_BASE_URL, model=FAKE_MODEL),
        transport=httpx.MockTransport(flaky),
        retry=RetryPolicy(attempts=1),
    )
    shared = SharedChatClient(client)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(Exception, match="HTTP 400"):
        shared.complete(body)
    assert shared.complete(body).content.startswith("answer to hi")
    assert calls["n"] == 2
    client.close()


# -- the CLI entry -------------------------------------------------------------------------------


@pytest.fixture
def cli_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, Any]]:
    """A store holding one recorded grid run; ``LazyChatClient`` answers from the fake model."""
    model = SlowModel(delay_s=0.0)
    client = _client(model)
    store = str(tmp_path / "cli-store")
    session = Rewind(store, chat_client=client)
    run = session.record(pipelines.grid_pipeline, {"question": QUESTION})
    session.store.close()
    monkeypatch.setattr("rewind.session.LazyChatClient", lambda: _client(model))
    yield store, run.run_id, model
    client.close()


def test_grid_command_json(cli_store: tuple[str, str, Any], capsys: pytest.CaptureFixture) -> None:
    store, run_id, _ = cli_store
    sets = ["draft.temperature=0.7", "draft.temperature=0.9", "draft.max_tokens=64"]
    code = grid_command(store, run_id[:10], "draft", sets, 2, True)
    out = capsys.readouterr()
    assert code == 0, out.err
    data = json.loads(out.out)
    assert data["run_id"] == run_id and data["workers"] == 2
    assert [v["label"] for v in data["variants"]] == [
        "draft.temperature=0.7",
        "draft.temperature=0.9",
        "draft.max_tokens=64",
    ]
    assert "variant 1" in out.err or "variant 2" in out.err


def test_grid_command_table_and_exit_codes(
    cli_store: tuple[str, str, Any], capsys: pytest.CaptureFixture
) -> None:
    store, run_id, _ = cli_store
    assert grid_command(store, run_id, "2", ["draft.temperature=0.7"], 4, False) == 0
    assert "grid of" in capsys.readouterr().out

    assert grid_command(store, run_id, "draft", ["draft.nope=1"], 4, False) == 2
    assert "has no param 'nope'" in capsys.readouterr().err
    assert grid_command(store, run_id, "draft", ["malformed"], 4, False) == 2
    assert "malformed override" in capsys.readouterr().err
    assert grid_command(store, run_id, "draft", [], 4, False) == 2
    code = grid_command(store, run_id, "draft", ["draft.temperature=0.7"], 4, False, "recorded")
    assert code == 1
