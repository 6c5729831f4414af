"""Engine behaviour for non-determinism and side effects (issue 3).

Determinism flags and TTLs (with an injectable clock), the LLM temperature flag, the three replay
modes of side-effecting calls, idempotency salts, and the three fingerprinters.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import rewind
from rewind.cache import CallPolicy
from rewind.canonical import canonical_bytes, key_of, sha256_hex
from rewind.context import RunContext
from rewind.effects import (
    ABSENT,
    EffectPreconditionFailed,
    FileTree,
    FingerprintUnavailable,
    HttpResource,
    SideEffectBlocked,
    SQLiteTable,
    idempotency_key,
)
from rewind.errors import RewindError
from rewind.replay import ParamOverride, Rewind
from rewind.store import open_store
from rewind.tools import tool
from rewind.tracing import Tracer, step
from rewind.tracing.store import load_trace
from tests import pipelines
from tests.pipelines import LIMITS_EPOCH_SQL, LOOKUP_TTL_S, create_limits_db

# -- helpers -----------------------------------------------------------------------------------


class FakeClock:
    """Unix seconds that move only when a test says so."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def use_clock(rw: Rewind, monkeypatch: pytest.MonkeyPatch, clock: Callable[[], float]) -> None:
    """Give every run context ``rw`` creates this clock.

    # needs engine fix: Rewind has no public way to pass a clock (Rewind._context builds the
    # RunContext with the default time.time); proposed: Rewind(..., clock=time.time) stored as
    # self.clock and passed as RunContext(clock=self.clock) in _context. Until then, wrap it.
    """
    original = rw._context

    def _context(run_id: str, *, read_cache: bool) -> RunContext:
        ctx = original(run_id, read_cache=read_cache)
        ctx.clock = clock
        return ctx

    monkeypatch.setattr(rw, "_context", _context)


@pytest.fixture(autouse=True)
def _clear_effect_logs() -> Iterator[None]:
    for log in (pipelines.EFFECT_CALLS, pipelines.KEYS_SEEN):
        log.clear()
    pipelines.IDEMPOTENCY_CACHE.clear()
    yield
    for log in (pipelines.EFFECT_CALLS, pipelines.KEYS_SEEN):
        log.clear()
    pipelines.IDEMPOTENCY_CACHE.clear()


def executed(tool_name: str) -> list[Any]:
    """Arguments of the real executions of a test tool so far."""
    return [args for name, args in pipelines.EFFECT_CALLS if name == tool_name]


def node(rw: Rewind, run_id: str, name: str) -> Any:
    return next(n for n in rw.store.nodes_of(run_id) if n.name == name)


def only_effect(rw: Rewind, run_id: str) -> Any:
    (effect,) = rw.store.effects_of(run_id)
    return effect


def side_call(rw: Rewind, run_id: str, name: str) -> Any:
    (call,) = [c for c in node(rw, run_id, name).calls if c.determinism == "side-effect"]
    return call


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "out.txt"
    path.write_text("start\n", encoding="utf-8")
    return path


def record_effects(rw: Rewind, path: Path) -> Any:
    run = rw.record(pipelines.effects_pipeline, {"text": "hello", "path": str(path)})
    assert run.status == "completed", run.error
    return run


# -- determinism flags and TTLs ----------------------------------------------------------------

SHAPES = [7, "seattle", [1, 2, 3], {"city": "Seattle", "days": [1, 2]}, {}, None, 2.5]


@pytest.mark.parametrize("query", SHAPES, ids=lambda q: type(q).__name__)
def test_ttl_entry_younger_than_ttl_hits_older_misses_for_any_input(
    rw: Rewind, monkeypatch: pytest.MonkeyPatch, query: Any
) -> None:
    clock = FakeClock()
    use_clock(rw, monkeypatch, clock)
    parent = rw.record(pipelines.ttl_pipeline, {"query": query})
    call = node(rw, parent.run_id, "look").calls[0]
    assert (call.determinism, call.produced_at) == ("time-bound", clock.now)
    assert len(executed("fx_lookup")) == 1

    clock.now += LOOKUP_TTL_S - 1  # younger than the TTL: served
    young = rw.replay(parent.run_id)
    look = node(rw, young.run_id, "look")
    assert (look.calls[0].outcome, look.calls[0].reason) == ("hit", "hit")
    assert (look.cache_outcome, look.determinism) == ("hit", "time-bound")
    assert len(executed("fx_lookup")) == 1

    clock.now += 2  # now older than the TTL: a miss that says why, and a fresh execution
    old = rw.replay(parent.run_id)
    look = node(rw, old.run_id, "look")
    assert (look.calls[0].outcome, look.calls[0].reason) == ("miss", "ttl-expired")
    assert look.calls[0].label == "miss:ttl-expired"
    assert (look.cache_outcome, look.cache_reason) == ("miss", "ttl-expired")
    assert look.calls[0].produced_at == clock.now
    assert len(executed("fx_lookup")) == 2


def test_ttl_boundary_age_equal_to_ttl_is_not_older(
    rw: Rewind, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    use_clock(rw, monkeypatch, clock)
    parent = rw.record(pipelines.ttl_pipeline, {"query": "q"})
    clock.now += LOOKUP_TTL_S
    assert node(rw, rw.replay(parent.run_id).run_id, "look").calls[0].outcome == "hit"
    clock.now += 0.001
    assert node(rw, rw.replay(parent.run_id).run_id, "look").calls[0].reason == "ttl-expired"


def test_a_ttl_entry_dated_after_the_runs_clock_is_expired(
    rw: Rewind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries written by a clock running 1 s ahead of the run's (another machine's, a test
    clock): their age is unknown, so a time-bound one is a miss (``ttl-expired``) and executes
    again, from the parent's lineage (replay) and from the cache table (a fork to another
    input) alike. A negative age counted as fresh: such entries were served for as long as the
    clock that wrote them was ahead, plus the TTL."""
    clock = FakeClock()
    use_clock(rw, monkeypatch, clock)
    rw.record(pipelines.ttl_pipeline, {"query": "ab"})  # leaves a cache entry for "ab"
    parent = rw.record(pipelines.ttl_pipeline, {"query": "a"})
    clock.now -= 1
    replayed = node(rw, rw.replay(parent.run_id).run_id, "look").calls[0]
    assert (replayed.outcome, replayed.reason) == ("miss", "ttl-expired")
    to_ab = ParamOverride("look", "suffix", "b")
    forked = node(rw, rw.fork(parent.run_id, at="look", override=to_ab).run_id, "look")
    assert (forked.calls[0].outcome, forked.calls[0].reason) == ("miss", "ttl-expired")
    assert executed("fx_lookup") == ["ab", "a", "a", "ab"]


_RAN: list[str] = []


@rewind.tool("ahead_timed", determinism="time-bound", ttl_s=LOOKUP_TTL_S)
def _ahead_timed(n: int) -> int:
    _RAN.append("timed")
    return n + 1


@rewind.tool("ahead_fixed")
def _ahead_fixed(n: int) -> int:
    _RAN.append("fixed")
    return n * 2


def _ahead_chain(folder: Path, clock: Callable[[], float], *, read_cache: bool) -> Any:
    """A trace of a deterministic then a time-bound tool step through ``Tracer(clock=clock)``."""
    tracer = Tracer(folder, read_cache=read_cache, raise_on_write_error=True, clock=clock)
    try:
        with tracer.trace("ahead", {"n": 1}) as t:
            with step("fixed", "tool_call"):
                n = _ahead_fixed(1)
            with step("timed", "tool_call"):
                t.set_output(_ahead_timed(n))
    finally:
        tracer.close()
    assert t.write_error is None
    return t


def test_a_traced_ttl_entry_written_by_a_tracer_clock_ahead_is_expired(tmp_path: Path) -> None:
    """``Tracer(clock=...)`` running an hour ahead records a deterministic and a time-bound
    tool call; a real-clock cached replay of the chain serves the deterministic one (no TTL)
    and runs the time-bound one again (``miss:ttl-expired``: dated after its clock, its age is
    unknown). It served both: a negative age counted as fresh."""
    _RAN.clear()
    _ahead_chain(tmp_path, lambda: time.time() + 3600, read_cache=False)
    replay = _ahead_chain(tmp_path, time.time, read_cache=True)
    assert _RAN == ["fixed", "timed", "timed"]
    st = open_store(tmp_path)
    try:
        calls = [c for s in load_trace(st, replay.trace_id).steps for c in s.calls]
    finally:
        st.close()
    assert [(c.outcome, c.reason) for c in calls] == [("hit", "hit"), ("miss", "ttl-expired")]


def test_ttl_applies_to_the_shared_cache_table_too(
    rw: Rewind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule is the same whether the entry comes from the lineage or from the cache table."""
    clock = FakeClock()
    use_clock(rw, monkeypatch, clock)
    rw.record(pipelines.ttl_pipeline, {"query": "ab"})  # leaves a cache entry for "ab"
    other = rw.record(pipelines.ttl_pipeline, {"query": "a"})
    assert len(executed("fx_lookup")) == 2
    to_ab = ParamOverride("look", "suffix", "b")

    clock.now += LOOKUP_TTL_S - 1
    fresh = rw.fork(other.run_id, at="look", override=to_ab)
    assert node(rw, fresh.run_id, "look").calls[0].outcome == "hit"
    assert len(executed("fx_lookup")) == 2

    clock.now += 2
    stale = rw.fork(other.run_id, at="look", override=to_ab)
    assert node(rw, stale.run_id, "look").calls[0].reason == "ttl-expired"
    assert executed("fx_lookup")[-1] == "ab"


def test_the_refreshed_entry_restarts_its_ttl(rw: Rewind, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    use_clock(rw, monkeypatch, clock)
    parent = rw.record(pipelines.ttl_pipeline, {"query": "q"})
    clock.now += LOOKUP_TTL_S + 5
    refreshed = rw.replay(parent.run_id)
    assert node(rw, refreshed.run_id, "look").calls[0].reason == "ttl-expired"
    clock.now += 10  # the refresh is 10 s old; the original 75 s
    again = rw.replay(refreshed.run_id)
    assert node(rw, again.run_id, "look").calls[0].outcome == "hit"


def test_time_bound_without_ttl_is_refused_never_defaulted() -> None:
    with pytest.raises(ValueError, match="ttl_s"):

        @tool("fx_no_ttl", determinism="time-bound")
        def no_ttl(q: str) -> str:
            return q

    with pytest.raises(ValueError, match="ttl_s"):

        @tool("fx_none_ttl", determinism="time-bound", ttl_s=None)
        def none_ttl(q: str) -> str:
            return q

    with pytest.raises(ValueError, match="ttl_s"):
        CallPolicy("time-bound")
    with pytest.raises(ValueError, match="ttl_s"):
        CallPolicy("time-bound", -1.0)
    with pytest.raises(ValueError, match="ttl_s applies only"):
        CallPolicy("deterministic", 30.0)
    assert CallPolicy("time-bound", 0.0).ttl_s == 0.0


def test_flag_validation_for_tools() -> None:
    with pytest.raises(ValueError, match="determinism must be one of"):
        tool("fx_bad_flag", determinism="sometimes")(lambda q: q)
    with pytest.raises(ValueError, match="only side-effect tools declare resources"):
        tool("fx_bad_res", resources=[FileTree("/tmp/x")])(lambda q: q)
    with pytest.raises(ValueError, match="no argument named"):
        tool("fx_bad_idem", determinism="side-effect", idempotency_arg="key")(lambda q: q)


def test_llm_temperature_above_zero_is_non_deterministic_on_call_and_node(
    rw_llm: Rewind,
) -> None:
    parent = rw_llm.record(pipelines.llm_pipeline, {"question": "why?"})
    ask = node(rw_llm, parent.run_id, "ask")
    assert (ask.calls[0].determinism, ask.determinism) == ("deterministic", "deterministic")

    hot = rw_llm.fork(parent.run_id, at="ask", override=ParamOverride("ask", "temperature", 0.8))
    ask = node(rw_llm, hot.run_id, "ask")
    assert (ask.calls[0].determinism, ask.determinism) == ("non-deterministic", "non-deterministic")
    assert node(rw_llm, hot.run_id, "shout").determinism == "deterministic"

    # An omitted temperature is the provider default 1.0: sampled, so non-deterministic.
    omitted = rw_llm.fork(
        parent.run_id, at="ask", override=ParamOverride("ask", "temperature", None)
    )
    ask = node(rw_llm, omitted.run_id, "ask")
    assert ask.calls[0].determinism == "non-deterministic"
    assert ask.determinism == "non-deterministic"


def test_non_deterministic_llm_calls_are_still_cached(rw_llm: Rewind, fake_model: Any) -> None:
    parent = rw_llm.record(pipelines.llm_pipeline, {"question": "why?"})
    hot = ParamOverride("ask", "temperature", 0.8)
    rw_llm.fork(parent.run_id, at="ask", override=hot)
    count = fake_model.count
    again = rw_llm.fork(parent.run_id, at="ask", override=hot)
    ask = node(rw_llm, again.run_id, "ask")
    assert (ask.calls[0].outcome, ask.calls[0].determinism) == ("hit", "non-deterministic")
    assert ask.determinism == "non-deterministic"
    assert fake_model.count == count


def test_an_unchanged_replay_of_a_param_fork_keeps_the_forks_param(rw_llm: Rewind) -> None:
    parent = rw_llm.record(pipelines.llm_pipeline, {"question": "why?"})
    hot = rw_llm.fork(parent.run_id, at="ask", override=ParamOverride("ask", "temperature", 0.8))
    again = rw_llm.replay(hot.run_id, at="ask")
    assert node(rw_llm, again.run_id, "ask").params["temperature"] == 0.8
    assert rw_llm.diff(hot.run_id, again.run_id).first_divergence is None


def test_inherited_nodes_keep_their_determinism_flag(rw: Rewind, text_file: Path) -> None:
    parent = record_effects(rw, text_file)
    fork = rw.fork(parent.run_id, at="after")
    inherited = node(rw, fork.run_id, "write")
    assert inherited.inherited
    assert inherited.determinism == "side-effect"


# -- side effects on replay --------------------------------------------------------------------


def test_recording_fingerprints_pre_and_post_state_with_a_pinned_snapshot(
    rw: Rewind, text_file: Path
) -> None:
    before = FileTree(text_file).fingerprint()
    parent = record_effects(rw, text_file)
    (effect,) = rw.store.effects_of(parent.run_id)
    call = side_call(rw, parent.run_id, "write")
    assert (call.outcome, call.reason, call.determinism) == ("miss", "bypass", "side-effect")
    assert (effect.mode, effect.kind, effect.resource) == (
        "record",
        "file-tree",
        f"file:{text_file}",
    )
    assert effect.pre_digest == before.digest
    assert effect.post_digest == FileTree(text_file).fingerprint().digest != before.digest
    snapshot = rw.store.get_blob(effect.snapshot_hash or "")
    assert json.loads(snapshot)["files"]  # the pinned pre-state
    assert node(rw, parent.run_id, "write").determinism == "side-effect"


def test_recorded_mode_serves_the_record_and_executes_nothing(rw: Rewind, text_file: Path) -> None:
    parent = record_effects(rw, text_file)
    content = text_file.read_bytes()
    replay = rw.replay(parent.run_id, at="write")
    assert replay.status == "completed"
    call = side_call(rw, replay.run_id, "write")
    assert call.label == "served:side-effect-recorded"
    assert call.result_hash == side_call(rw, parent.run_id, "write").result_hash
    write = node(rw, replay.run_id, "write")
    assert (write.cache_outcome, write.cache_reason) == ("hit", "side-effect-recorded")
    assert write.output_hash == node(rw, parent.run_id, "write").output_hash
    assert executed("fx_append_line") == ["hello"]  # the recording only
    assert text_file.read_bytes() == content
    (effect,) = rw.store.effects_of(replay.run_id)
    assert (effect.mode, effect.pre_digest, effect.post_digest) == ("recorded", None, None)


def test_dry_run_logs_the_call_and_executes_nothing(rw: Rewind, text_file: Path) -> None:
    parent = record_effects(rw, text_file)
    content = text_file.read_bytes()
    dry = rw.replay(parent.run_id, at="write", effects="dry-run")
    call = side_call(rw, dry.run_id, "write")
    assert (call.outcome, call.reason) == ("dry-run", "side-effect-dry-run")
    assert node(rw, dry.run_id, "write").cache_outcome == "dry-run"
    # The recorded result is returned, so downstream nodes see what the original saw.
    assert node(rw, dry.run_id, "after").output_hash == node(rw, parent.run_id, "after").output_hash
    assert executed("fx_append_line") == ["hello"]
    assert text_file.read_bytes() == content


def test_dry_run_of_a_call_with_new_arguments_logs_the_intended_call(
    rw: Rewind, text_file: Path
) -> None:
    parent = record_effects(rw, text_file)
    content = text_file.read_bytes()
    dry = rw.fork(
        parent.run_id, at="prep", override=ParamOverride("prep", "suffix", "!"), effects="dry-run"
    )
    assert dry.status == "completed", dry.error
    call = side_call(rw, dry.run_id, "write")
    assert call.outcome == "dry-run"
    logged = json.loads(rw.store.get_blob(call.request_hash))
    assert logged == {"line": "hello!", "path": str(text_file)}
    result = json.loads(rw.store.get_blob(call.result_hash or ""))
    assert result == {
        "dry_run": True,
        "tool": "fx_append_line",
        "request_sha256": call.request_hash,
    }
    assert executed("fx_append_line") == ["hello"]
    assert text_file.read_bytes() == content


def test_live_re_executes_when_the_pre_state_matches(rw: Rewind, text_file: Path) -> None:
    parent = record_effects(rw, text_file)
    (recorded,) = rw.store.effects_of(parent.run_id)
    text_file.write_text("start\n", encoding="utf-8")  # the world is back in the pre-state
    live = rw.replay(parent.run_id, at="write", effects="live")
    assert live.status == "completed", live.error
    call = side_call(rw, live.run_id, "write")
    assert (call.outcome, call.reason) == ("miss", "side-effect-live")
    assert executed("fx_append_line") == ["hello", "hello"]
    (effect,) = rw.store.effects_of(live.run_id)
    assert effect.mode == "live"
    assert effect.pre_digest == recorded.pre_digest
    assert effect.post_digest == recorded.post_digest
    assert text_file.read_text(encoding="utf-8") == "start\nhello\n"


@pytest.mark.parametrize("drift", ["already-applied", "mutated"])
def test_live_restores_the_pinned_snapshot_when_the_pre_state_changed(
    rw: Rewind, text_file: Path, drift: str
) -> None:
    parent = record_effects(rw, text_file)
    (recorded,) = rw.store.effects_of(parent.run_id)
    if drift == "mutated":
        text_file.write_text("someone else wrote this\n", encoding="utf-8")
    # "already-applied": the file still holds the original's write (the recorded post-state).
    live = rw.replay(parent.run_id, at="write", effects="live")
    assert live.status == "completed", live.error
    assert text_file.read_text(encoding="utf-8") == "start\nhello\n"  # restored, then executed
    (effect,) = rw.store.effects_of(live.run_id)
    assert effect.pre_digest == recorded.pre_digest
    assert effect.post_digest == recorded.post_digest
    assert executed("fx_append_line") == ["hello", "hello"]


def test_live_without_a_snapshot_refuses_a_changed_pre_state(rw: Rewind, tmp_path: Path) -> None:
    db = tmp_path / "limits.db"
    create_limits_db(db)
    parent = rw.record(pipelines.limits_pipeline, {"db": str(db)})
    assert parent.status == "completed", parent.error
    (effect,) = rw.store.effects_of(parent.run_id)
    assert effect.snapshot_hash is None  # SQLite tables cannot be snapshotted
    con = sqlite3.connect(db)
    with con:
        con.execute("INSERT INTO limits VALUES ('other', 1)")  # another actor
    con.close()
    with pytest.raises(EffectPreconditionFailed) as err:
        rw.replay(parent.run_id, at="store_limit", effects="live")
    assert f"sqlite:{db}#limits" in err.value.message
    assert "--effects recorded" in err.value.hint
    assert executed("fx_upsert_limit") == [("rate", 5)]
    failed = rw.store.children(parent.run_id)[-1]
    assert failed.status == "failed"


def test_changed_arguments_in_recorded_mode_stop_with_the_fix(rw: Rewind, text_file: Path) -> None:
    parent = record_effects(rw, text_file)
    content = text_file.read_bytes()
    with pytest.raises(SideEffectBlocked) as err:
        rw.fork(parent.run_id, at="prep", override=ParamOverride("prep", "suffix", "!"))
    assert "fx_append_line" in err.value.message and "'write'" in err.value.message
    assert "--effects live" in err.value.hint and "--effects dry-run" in err.value.hint
    assert executed("fx_append_line") == ["hello"]  # the original call's result was not reused
    assert text_file.read_bytes() == content
    fork = rw.store.children(parent.run_id)[-1]
    assert fork.status == "failed"
    assert [n.name for n in rw.store.nodes_of(fork.run_id)][-1] == "write"


def test_changed_arguments_run_live_against_the_slots_recorded_pre_state(
    rw: Rewind, text_file: Path
) -> None:
    # Issue 12, point 1: the slot (node position, call index) is verified, not the arguments.
    parent = record_effects(rw, text_file)
    (recorded,) = rw.store.effects_of(parent.run_id)
    fork = rw.fork(
        parent.run_id, at="prep", override=ParamOverride("prep", "suffix", "!"), effects="live"
    )
    assert fork.status == "completed", fork.error
    call = side_call(rw, fork.run_id, "write")
    assert call.key != side_call(rw, parent.run_id, "write").key
    # The file held the parent's write (drift from the recorded pre-state): restored, reported.
    assert call.reason == "side-effect-live-restored"
    assert only_effect(rw, fork.run_id).pre_digest == recorded.pre_digest
    assert text_file.read_text(encoding="utf-8") == "start\nhello!\n"


def test_side_effect_results_never_become_shared_cache_entries(rw: Rewind, text_file: Path) -> None:
    parent = record_effects(rw, text_file)
    call = side_call(rw, parent.run_id, "write")
    assert rw.store.tool_cache_get(call.key) is None
    assert rw.store.get_blob(call.result_hash or "")  # but the result is kept on the run


def test_two_identical_side_effecting_calls_are_two_effects(rw: Rewind, text_file: Path) -> None:
    text_file.unlink()
    run = rw.record(pipelines.twice_pipeline, {"path": str(text_file)})
    assert run.status == "completed", run.error
    effects = rw.store.effects_of(run.run_id)
    assert [e.call_index for e in effects] == [0, 1]
    assert effects[0].post_digest == effects[1].pre_digest
    assert text_file.read_text(encoding="utf-8") == "first\nsecond\n"


def test_a_live_replay_of_a_live_replay_restores_the_right_pre_state(
    rw: Rewind, text_file: Path
) -> None:
    parent = record_effects(rw, text_file)
    text_file.write_text("drift\n", encoding="utf-8")
    first = rw.replay(parent.run_id, at="write", effects="live")
    assert first.status == "completed"
    (effect,) = rw.store.effects_of(first.run_id)
    (recorded,) = rw.store.effects_of(parent.run_id)
    # The live call's pinned snapshot is the pre-state it really ran against (after the restore),
    # not the drift it found: a live replay of this live replay can restore it.
    assert effect.pre_digest == recorded.pre_digest
    assert rw.store.get_blob(effect.snapshot_hash or "") == rw.store.get_blob(
        recorded.snapshot_hash or ""
    )
    text_file.write_text("drift again\n", encoding="utf-8")
    second = rw.replay(first.run_id, at="write", effects="live")
    assert second.status == "completed", second.error
    assert text_file.read_text(encoding="utf-8") == "start\nhello\n"
    assert only_effect(rw, second.run_id).post_digest == recorded.post_digest


# -- idempotency keys --------------------------------------------------------------------------


def test_idempotency_keys_are_salted_per_replay_and_kept_out_of_the_cache_key(
    rw: Rewind, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    ledger.write_text("", encoding="utf-8")
    state = {"ledger": str(ledger), "account": "acct-1"}
    parent = rw.record(pipelines.ledger_salted, state)
    first = rw.replay(parent.run_id, effects="live")
    second = rw.replay(parent.run_id, effects="live")
    runs = [parent, first, second]
    keys = [rw.store.effects_of(r.run_id)[0].idempotency_key for r in runs]
    assert len(set(keys)) == 3  # every attempt has its own key; the original's is never reused
    assert keys[0] == key_of("idempotency/v1", "acct-1:turn-1", parent.run_id)
    assert keys == pipelines.KEYS_SEEN  # the tool received exactly the salted keys
    cache_keys = {side_call(rw, r.run_id, "charge").key for r in runs}
    assert len(cache_keys) == 1  # the key argument is not part of the cache key
    request = json.loads(rw.store.get_blob(side_call(rw, parent.run_id, "charge").request_hash))
    assert "key" not in request
    assert len(executed("fx_charge")) == 3  # each attempt really executed
    assert ledger.read_text(encoding="utf-8") == "acct-1 10\n"  # restored, then charged once


def test_idempotency_key_outside_a_run_is_the_base() -> None:
    assert idempotency_key("session-1:turn-3") == "session-1:turn-3"


def test_a_recorded_replay_hands_the_tool_nothing(rw: Rewind, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    ledger.write_text("", encoding="utf-8")
    parent = rw.record(pipelines.ledger_salted, {"ledger": str(ledger), "account": "a"})
    replay = rw.replay(parent.run_id)
    assert side_call(rw, replay.run_id, "charge").outcome == "served"
    assert len(pipelines.KEYS_SEEN) == 1


# -- fingerprints: file trees ------------------------------------------------------------------


def write_tree(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def test_file_tree_same_content_same_digest_wherever_it_lives(tmp_path: Path) -> None:
    files = {"a.txt": "alpha\n", "sub/b.txt": "beta\n"}
    a = FileTree(write_tree(tmp_path / "one", files))
    b = FileTree(write_tree(tmp_path / "two", files))
    for p in (tmp_path / "two").rglob("*.txt"):
        os.utime(p, ns=(1, 1_000_000_000))
    fa, fb = a.fingerprint(), b.fingerprint()
    assert fa.digest == fb.digest
    assert fb.epoch == "1000000000"  # the epoch is the newest mtime (ns): not part of the digest
    assert fa.epoch != fb.epoch
    newest = max(p.stat().st_mtime_ns for p in (tmp_path / "one").rglob("*") if p.is_file())
    assert fa.epoch == str(newest)


@pytest.mark.parametrize(
    "change",
    [
        {"a.txt": "alpha!\n"},  # content
        {"c.txt": ""},  # an extra, empty file
        {"sub/c.txt": "beta\n"},  # same bytes under another path
    ],
)
def test_file_tree_changed_content_changes_the_digest(
    tmp_path: Path, change: dict[str, str]
) -> None:
    base = {"a.txt": "alpha\n", "sub/b.txt": "beta\n"}
    before = FileTree(write_tree(tmp_path / "t", base)).fingerprint()
    if "sub/c.txt" in change:
        (tmp_path / "t" / "sub" / "b.txt").unlink()
    write_tree(tmp_path / "t", change)
    assert FileTree(tmp_path / "t").fingerprint().digest != before.digest


def test_file_tree_absent_and_single_file(tmp_path: Path) -> None:
    assert FileTree(tmp_path / "missing").fingerprint().digest == ABSENT
    assert FileTree(tmp_path / "missing").fingerprint().epoch is None
    one = tmp_path / "x" / "report.md"
    two = tmp_path / "y" / "report.md"
    for p in (one, two):
        p.parent.mkdir()
        p.write_text("same\n", encoding="utf-8")
    assert FileTree(one).fingerprint().digest == FileTree(two).fingerprint().digest
    expected = sha256_hex(canonical_bytes({"report.md": sha256_hex(b"same\n")}))
    assert FileTree(one).fingerprint().digest == expected
    assert FileTree(tmp_path / "empty-dir").fingerprint().digest == ABSENT
    (tmp_path / "empty-dir").mkdir()
    assert FileTree(tmp_path / "empty-dir").fingerprint().digest != ABSENT


def test_restore_refuses_to_delete_files_outside_the_snapshot(tmp_path: Path) -> None:
    # Issue 12, point 4: restore never destroys data silently.
    root = write_tree(tmp_path / "tree", {"a.txt": "A"})
    tree = FileTree(root)
    snap = tree.snapshot()
    (root / "a.txt").write_text("changed", encoding="utf-8")
    (root / "theirs.txt").write_text("not ours", encoding="utf-8")
    with pytest.raises(EffectPreconditionFailed) as err:
        tree.restore(snap)
    assert "theirs.txt" in err.value.message and "--restore=replace" in err.value.hint
    assert (root / "a.txt").read_text(encoding="utf-8") == "changed"  # nothing touched
    assert (root / "theirs.txt").exists()
    tree.restore(snap, replace=True)
    assert sorted(p.name for p in root.iterdir()) == ["a.txt"]
    assert (root / "a.txt").read_text(encoding="utf-8") == "A"


def test_a_failing_restore_leaves_the_state_it_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = write_tree(tmp_path / "tree", {"a.txt": "A", "sub/b.txt": "B"})
    tree = FileTree(root)
    snap = tree.snapshot()
    (root / "a.txt").write_text("now", encoding="utf-8")
    before = tree.fingerprint()
    calls = {"n": 0}
    real = Path.write_bytes

    def fail_second(self: Path, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", fail_second)
    with pytest.raises(OSError):
        tree.restore(snap)
    monkeypatch.undo()
    assert tree.fingerprint().digest == before.digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree"]  # no staging left behind


def test_live_restore_with_files_the_tool_never_wrote_refuses_unless_replace(
    rw: Rewind, tmp_path: Path
) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    parent = rw.record(pipelines.folder_pipeline, {"folder": str(folder), "text": "hello"})
    assert parent.status == "completed", parent.error
    (folder / "mine.txt").write_text("a user's file\n", encoding="utf-8")
    with pytest.raises(EffectPreconditionFailed) as err:
        rw.replay(parent.run_id, at="note", effects="live")
    assert "mine.txt" in err.value.message
    assert (folder / "mine.txt").exists()
    assert executed("fx_write_note") == [("note.txt", "hello")]
    with pytest.raises(RewindError) as bad:
        rw.replay(parent.run_id, at="note", effects="recorded", restore="replace")
    assert "--effects live" in bad.value.hint
    live = rw.replay(parent.run_id, at="note", effects="live", restore="replace")
    assert live.status == "completed", live.error
    assert sorted(p.name for p in folder.iterdir()) == ["note.txt"]


def test_file_tree_snapshot_restores_the_exact_state(tmp_path: Path) -> None:
    tree = FileTree(write_tree(tmp_path / "t", {"a.txt": "alpha\n", "sub/b.bin": "beta"}))
    before = tree.fingerprint().digest
    snapshot = tree.snapshot()
    write_tree(tmp_path / "t", {"a.txt": "changed\n", "new.txt": "x"})
    (tmp_path / "t" / "sub" / "b.bin").unlink()
    assert tree.fingerprint().digest != before
    tree.restore(snapshot, replace=True)  # new.txt is not in the snapshot
    assert tree.fingerprint().digest == before
    absent = FileTree(tmp_path / "later")
    empty = absent.snapshot()
    write_tree(tmp_path / "later", {"z.txt": "z"})
    absent.restore(empty, replace=True)
    assert absent.fingerprint().digest == ABSENT


# -- file trees: what a folder holds besides regular files (issue 12, attack pass) -------------


def test_file_tree_never_follows_a_symlink_out_of_the_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("not in the folder\n", encoding="utf-8")
    root = write_tree(tmp_path / "t", {"a.txt": "A"})
    (root / "link.txt").symlink_to(outside)
    tree = FileTree(root)
    before = tree.fingerprint().digest
    outside.write_text("changed elsewhere\n", encoding="utf-8")
    assert tree.fingerprint().digest == before  # the folder holds a link, not that file
    (root / "link.txt").unlink()
    (root / "link.txt").symlink_to(tmp_path / "elsewhere.txt")
    assert tree.fingerprint().digest != before  # the link's target is the folder's state
    snap = json.loads(tree.snapshot() or b"{}")
    assert "changed elsewhere" not in json.dumps(snap)  # the outside file is not copied in


def test_restore_keeps_links_empty_folders_and_file_modes(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("keep\n", encoding="utf-8")
    root = write_tree(tmp_path / "t", {"note.txt": "v0\n", "run.sh": "#!/bin/sh\n"})
    os.chmod(root / "run.sh", 0o755)
    (root / "link.txt").symlink_to(outside)
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    (root / "empty").mkdir()
    tree = FileTree(root)
    before = tree.fingerprint().digest
    snap = tree.snapshot()
    assert snap is not None
    (root / "note.txt").write_text("drift\n", encoding="utf-8")
    assert tree.fingerprint().digest != before
    tree.restore(snap)
    assert tree.fingerprint().digest == before
    assert os.readlink(root / "link.txt") == str(outside)
    assert os.readlink(root / "dangling") == str(tmp_path / "nowhere")
    assert (root / "empty").is_dir()
    assert (root / "run.sh").stat().st_mode & 0o777 == 0o755
    assert outside.read_text(encoding="utf-8") == "keep\n"


def test_restore_refuses_to_drop_links_and_folders_the_snapshot_does_not_hold(
    tmp_path: Path,
) -> None:
    root = write_tree(tmp_path / "t", {"a.txt": "A"})
    tree = FileTree(root)
    snap = tree.snapshot()
    assert snap is not None
    (root / "mine").mkdir()
    (root / "shortcut").symlink_to(tmp_path)
    with pytest.raises(EffectPreconditionFailed) as err:
        tree.restore(snap)
    assert "mine" in err.value.message and "shortcut" in err.value.message
    assert (root / "mine").is_dir() and (root / "shortcut").is_symlink()


def test_restore_through_a_linked_folder_restores_the_folder_and_keeps_the_link(
    tmp_path: Path,
) -> None:
    real = write_tree(tmp_path / "data" / "notes", {"a.txt": "A"})
    link = tmp_path / "notes"
    link.symlink_to(real)
    tree = FileTree(link)  # the path the tool declares is a link to the folder
    before = tree.fingerprint().digest
    snap = tree.snapshot()
    assert snap is not None
    (real / "a.txt").write_text("drift", encoding="utf-8")
    tree.restore(snap)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert (real / "a.txt").read_text(encoding="utf-8") == "A"
    assert tree.fingerprint().digest == before


def test_a_restore_swaps_the_folder_in_one_step(tmp_path: Path) -> None:
    # A process killed at any rename of a restore must leave the folder before or after, never
    # missing: the swap is one atomic exchange (renameat2), not "move away, move in".
    import subprocess
    import sys

    root = write_tree(tmp_path / "t", {"a.txt": "A"})
    tree = FileTree(root)
    snap_file = tmp_path / "snap.json"
    snap_file.write_bytes(tree.snapshot() or b"")
    (root / "a.txt").write_text("drift", encoding="utf-8")
    script = f"""
import os, sys
from pathlib import Path
from rewind.effects import FileTree
for name in ("replace", "rename"):
    real = getattr(os, name)
    def crash(*a, _real=real, **k):
        _real(*a, **k)
        os._exit(9)  # killed right after the first rename
    setattr(os, name, crash)
FileTree({str(root)!r}).restore(Path({str(snap_file)!r}).read_bytes())
"""
    subprocess.run([sys.executable, "-c", script], check=False, timeout=120)
    assert root.is_dir()
    assert (root / "a.txt").read_text(encoding="utf-8") in ("A", "drift")


def test_a_tree_over_the_snapshot_limit_is_fingerprinted_but_not_snapshotted(
    rw: Rewind, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FileTree, "max_snapshot_bytes", 1024)
    folder = write_tree(tmp_path / "notes", {"big.bin": "x" * 4096})
    tree = FileTree(folder)
    assert tree.snapshot() is None
    listing = {"big.bin": sha256_hex(b"x" * 4096)}
    assert tree.fingerprint().digest == sha256_hex(canonical_bytes(listing))
    parent = rw.record(pipelines.folder_pipeline, {"folder": str(folder), "text": "v1"})
    assert parent.status == "completed", parent.error
    (effect,) = rw.store.effects_of(parent.run_id)
    assert effect.pre_digest is not None and effect.snapshot_hash is None
    (folder / "note.txt").write_text("drift\n", encoding="utf-8")
    with pytest.raises(EffectPreconditionFailed) as err:
        rw.replay(parent.run_id, effects="live")
    assert "no pinned snapshot" in err.value.message
    assert (folder / "note.txt").read_text(encoding="utf-8") == "drift\n"


# -- fingerprints: SQLite tables ---------------------------------------------------------------


def make_db(path: Path, rows: list[tuple[str, int]], version: int | None = 1) -> Path:
    con = sqlite3.connect(path)
    with con:
        con.execute("CREATE TABLE limits (key TEXT PRIMARY KEY, value INTEGER)")
        con.executemany("INSERT INTO limits VALUES (?, ?)", rows)
        if version is not None:
            con.execute("CREATE TABLE meta (version INTEGER)")
            con.execute("INSERT INTO meta VALUES (?)", (version,))
    con.close()
    return path


def table(path: Path, epoch: bool = True) -> SQLiteTable:
    return SQLiteTable(
        path, "limits", order_by="key", epoch_sql=LIMITS_EPOCH_SQL if epoch else None
    )


def test_sqlite_same_rows_same_digest_in_any_insertion_order(tmp_path: Path) -> None:
    a = make_db(tmp_path / "a.db", [("x", 1), ("y", 2)])
    b = make_db(tmp_path / "b.db", [("y", 2), ("x", 1)])
    assert table(a).fingerprint() == table(b).fingerprint()
    assert table(a).fingerprint().epoch == "1"


def test_sqlite_changed_rows_change_the_digest(tmp_path: Path) -> None:
    base = table(make_db(tmp_path / "a.db", [("x", 1), ("y", 2)])).fingerprint().digest
    changed = table(make_db(tmp_path / "b.db", [("x", 1), ("y", 3)])).fingerprint().digest
    extra = table(make_db(tmp_path / "c.db", [("x", 1), ("y", 2), ("z", 0)])).fingerprint()
    assert len({base, changed, extra.digest}) == 3


def test_sqlite_same_rows_from_another_epoch_is_another_state(tmp_path: Path) -> None:
    one = table(make_db(tmp_path / "a.db", [("x", 1)], version=1)).fingerprint()
    two = table(make_db(tmp_path / "b.db", [("x", 1)], version=2)).fingerprint()
    assert (one.epoch, two.epoch) == ("1", "2")
    assert one.digest != two.digest
    # Without an epoch query the epoch is unknown and the digest covers the rows only.
    plain_a = table(tmp_path / "a.db", epoch=False).fingerprint()
    plain_b = table(tmp_path / "b.db", epoch=False).fingerprint()
    assert plain_a == plain_b
    assert plain_a.epoch is None
    body = canonical_bytes({"count": 1, "rows": [["x", 1]]})
    assert plain_a.digest == sha256_hex(body)


def test_sqlite_absent_database_or_table(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    assert table(missing).fingerprint().digest == ABSENT
    assert not missing.exists()  # fingerprinting never creates the database
    db = make_db(tmp_path / "a.db", [])
    assert SQLiteTable(db, "nope").fingerprint().digest == ABSENT
    assert table(db).fingerprint().digest != ABSENT  # an empty table exists


def test_sqlite_an_epoch_query_that_fails_cannot_fingerprint(rw: Rewind, tmp_path: Path) -> None:
    # The epoch table dropped (or locked, or renamed) is not a state: audit-incomplete, and a
    # live replay refuses with EffectPreconditionFailed, never a raw sqlite3 error.
    from rewind.audit import audit_run

    db = tmp_path / "limits.db"
    create_limits_db(db)
    run = rw.record(pipelines.limits_pipeline, {"db": str(db)})
    assert run.status == "completed", run.error
    con = sqlite3.connect(db)
    with con:
        con.execute("DROP TABLE meta")
    con.close()
    with pytest.raises(FingerprintUnavailable, match="epoch"):
        table(db).fingerprint()
    (v,) = audit_run(rw, run.run_id, record=False).verdicts
    assert v.verdict == "audit-incomplete" and "no such table: meta" in v.reason
    with pytest.raises(EffectPreconditionFailed, match="no such table: meta"):
        rw.replay(run.run_id, effects="live")
    assert executed("fx_upsert_limit") == [("rate", 5)]
    # Recording against it runs the call (the user's run is not broken) with no fingerprint:
    again = rw.record(pipelines.limits_pipeline, {"db": str(db)})
    assert again.status == "completed", again.error
    (effect,) = rw.store.effects_of(again.run_id)
    assert (effect.pre_digest, effect.post_digest) == (None, None)
    (v,) = audit_run(rw, again.run_id, record=False).verdicts
    assert v.verdict == "audit-incomplete"


def test_sqlite_blob_values_and_identifier_check(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    con = sqlite3.connect(db)
    with con:
        con.execute("CREATE TABLE files (id INTEGER PRIMARY KEY, data BLOB)")
        con.execute("INSERT INTO files VALUES (1, ?)", (b"\x00\xff",))
    con.close()
    fp = SQLiteTable(db, "files", order_by="id").fingerprint()
    assert fp.digest == sha256_hex(canonical_bytes({"count": 1, "rows": [[1, "00ff"]]}))
    with pytest.raises(ValueError, match="plain identifier"):
        SQLiteTable(db, "files; DROP TABLE files")
    assert SQLiteTable(db, "files").snapshot() is None
    with pytest.raises(RewindError, match="cannot be restored"):
        SQLiteTable(db, "files").restore(b"{}")


# -- fingerprints: HTTP resources --------------------------------------------------------------


def http(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def responder(body: bytes, headers: dict[str, str] | None = None, status: int = 200) -> Any:
    return lambda request: httpx.Response(status, content=body, headers=headers or {})


URL = "http://kv.test/items/1"


def test_http_etag_is_preferred_over_the_body() -> None:
    same_tag_a = HttpResource(URL, http(responder(b"a", {"ETag": '"v1"'}))).fingerprint()
    same_tag_b = HttpResource(URL, http(responder(b"b", {"ETag": '"v1"'}))).fingerprint()
    other_tag = HttpResource(URL, http(responder(b"a", {"ETag": '"v2"'}))).fingerprint()
    assert same_tag_a.digest == same_tag_b.digest
    assert other_tag.digest != same_tag_a.digest
    assert same_tag_a.digest == key_of("etag", '"v1"')
    assert same_tag_a.epoch == '"v1"'


def test_http_without_etag_hashes_the_body_and_reports_last_modified() -> None:
    stamp = "Wed, 21 Oct 2026 07:28:00 GMT"
    a = HttpResource(URL, http(responder(b"body", {"Last-Modified": stamp}))).fingerprint()
    b = HttpResource(URL, http(responder(b"body"))).fingerprint()
    c = HttpResource(URL, http(responder(b"other"))).fingerprint()
    assert a.digest == b.digest == sha256_hex(b"body")
    assert c.digest != a.digest
    assert (a.epoch, b.epoch) == (stamp, None)


def test_http_absent_resource_or_unreachable_server() -> None:
    assert HttpResource(URL, http(responder(b"", status=404))).fingerprint().digest == ABSENT

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    # Issue 12, point 5: an unreachable server is not an absent resource.
    with pytest.raises(FingerprintUnavailable):
        HttpResource(URL, http(refuse)).fingerprint()
    assert HttpResource(URL).name == URL


@pytest.mark.parametrize("status", [401, 403, 500, 503, 302])
def test_http_non_2xx_answers_are_never_a_state(status: int) -> None:
    with pytest.raises(FingerprintUnavailable) as err:
        HttpResource(URL, http(responder(b"<h1>error page</h1>", status=status))).fingerprint()
    assert f"HTTP {status}" in err.value.message


def test_http_sends_the_headers_and_auth_the_get_needs() -> None:
    seen: list[httpx.Request] = []

    def guarded(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.headers.get("x-api-key") != "k1" or "authorization" not in request.headers:
            return httpx.Response(401, content=b"who are you")
        return httpx.Response(200, content=b"the state")

    fp = HttpResource(
        URL, http(guarded), headers={"X-Api-Key": "k1"}, auth=("user", "pw")
    ).fingerprint()
    assert fp.digest == sha256_hex(b"the state")
    assert HttpResource(URL, headers={"X-Api-Key": "k1"}).spec() == {"url": URL}  # no secrets
