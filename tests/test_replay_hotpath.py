"""The Burr fork/replay hot path: what a fork skips must never change what it records or when
it stops. Progress marks (:mod:`rewind.progress`): a fork's first node start is written by the
progress thread and a cancel still stops the fork at its next node; Rewind's own tracker is
called at no step. Real Burr runs recorded into a real SQLite store."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewind import progress
from rewind.canonical import canonical_bytes
from rewind.persister import map_hash, plain_map_bytes
from rewind.recorder import _input_doc_bytes
from rewind.replay import Rewind
from rewind.store.store import _delta_json, _internal_json
from tests import pipelines


def test_a_fork_writes_no_progress_mark_from_its_own_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork's run row, just written ``running``, counts as its first progress write: its
    node starts within the interval are left to the progress thread (no write transaction in
    the run's thread), and the replay is unchanged (same hashes, every call a hit)."""
    rw = Rewind(tmp_path / "store")
    parent = rw.record(pipelines.pipeline, {"x": 5})
    writers: list[str] = []
    mark = progress.mark_live_node

    def counted(*args: Any) -> str | None:
        writers.append(threading.current_thread().name)
        return mark(*args)

    monkeypatch.setattr(progress, "mark_live_node", counted)
    monkeypatch.setattr(progress, "WRITE_INTERVAL_S", 3600.0)  # the thread never gets to it
    # a process up for longer than the interval (a run's first write is then due at once)
    clock = SimpleNamespace(monotonic=lambda: time.monotonic() + 1e6, time=time.time)
    monkeypatch.setattr(progress, "time", clock)
    child = rw.replay(parent.run_id, at=1)
    assert threading.current_thread().name not in writers
    assert child.status == "completed"
    mine, theirs = rw.store.nodes_of(child.run_id), rw.store.nodes_of(parent.run_id)
    assert [n.state_hash for n in mine] == [n.state_hash for n in theirs]
    assert [n.output_hash for n in mine] == [n.output_hash for n in theirs]
    assert all(n.cache_outcome == "hit" for n in mine) and child.tokens == 0
    assert child.run_id not in progress._WRITER.runs  # forgotten when it finished


def test_a_cancel_asked_in_this_process_stops_a_fork_at_its_next_node(tmp_path: Path) -> None:
    rw = Rewind(tmp_path / "store")
    parent = rw.record(pipelines.pipeline, {"x": 5})
    asked: list[str] = []

    def on_event(event: str, payload: dict[str, Any]) -> None:
        if event == "node_finished" and payload["name"] == "start":
            run_id = next(r for r in progress._WRITER.runs if r != parent.run_id)
            asked.append(run_id)
            assert progress.request_cancel(rw.store, run_id, "me")

    rw.on_event = on_event
    child = rw.replay(parent.run_id, at=1)
    assert asked == [child.run_id]
    assert child.status == progress.CANCELLED
    assert "cancelled by me before node 2 (expand)" in str(child.error)
    assert [n.name for n in rw.store.nodes_of(child.run_id)] == ["start"]


def test_the_runs_own_tracker_is_called_at_no_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rewind's tracker on the run's own app implements no Burr hook (its copies, the trackers
    sub-applications get, do: tests/test_sub_runs.py), so Burr calls nothing of it per step."""
    import rewind.replay as replay_module
    from rewind.engine.subapps import RunTracker, SubAppTracker

    seen: list[str] = []
    built: list[RunTracker] = []

    class Spy(RunTracker):
        def __init__(self, inner: Any, recorder: Any) -> None:
            super().__init__(inner, recorder)
            built.append(self)

        def pre_run_step(self, **kwargs: Any) -> None:
            seen.append("pre")

        def post_run_step(self, **kwargs: Any) -> None:
            seen.append("post")

    monkeypatch.setattr(replay_module, "RunTracker", Spy)
    rw = Rewind(tmp_path / "store")
    parent = rw.record(pipelines.pipeline, {"x": 5})
    child = rw.replay(parent.run_id, at=2)
    assert (parent.status, child.status) == ("completed", "completed")
    assert len(built) == 2 and seen == []
    assert isinstance(built[0].copy(), SubAppTracker)


_NAMES = st.text(
    st.characters(min_codepoint=0, max_codepoint=0x1F600, blacklist_categories=("Cs",)), max_size=12
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_NAMES, st.one_of(_NAMES, st.sampled_from(["a" * 64, "0f" * 32]))))
def test_plain_map_bytes_are_the_canonical_bytes(values: dict[str, str]) -> None:
    """The {name: string} maps a node hashes (written directly when plain) have exactly the
    canonical bytes."""
    fast = plain_map_bytes(values)
    if fast is not None:
        assert fast == canonical_bytes(values)
    assert map_hash(values)[0] == canonical_bytes(values)


@settings(max_examples=300, deadline=None)
@given(
    _NAMES,
    st.dictionaries(_NAMES, st.sampled_from(["a" * 64, "0f" * 32, 'x"y'])),
    st.sampled_from([{}, {"q": 1}]),
    st.sampled_from([{}, {"temperature": 0.5}]),
)
def test_a_nodes_input_document_has_the_canonical_bytes(
    name: str, reads: dict[str, str], inputs: dict[str, Any], params: dict[str, Any]
) -> None:
    """A node's input document (its name, the hashes it reads, inputs, params) is hashed over
    its canonical bytes, whichever way they are written."""
    action = SimpleNamespace(name=name)
    doc = {"node": name, "reads": reads, "inputs": inputs, "params": params}
    assert _input_doc_bytes(action, reads, inputs, params) == canonical_bytes(doc)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_NAMES, st.one_of(_NAMES, st.integers(), st.booleans(), st.none())))
def test_a_state_rows_internal_fields_are_json_dumps_text(internal: dict[str, Any]) -> None:
    """Burr's ``__`` fields of a state row: the text ``json.dumps(..., sort_keys=True)`` wrote."""
    assert _internal_json(internal) == json.dumps(internal, sort_keys=True)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0),
    st.dictionaries(_NAMES, st.one_of(_NAMES, st.sampled_from(["a" * 64]))),
    st.lists(_NAMES),
)
def test_a_state_rows_delta_is_json_dumps_text(
    base: int, changed: dict[str, str], removed: list[str]
) -> None:
    """A state row stored as a delta: the text ``json.dumps(..., sort_keys=True)`` wrote."""
    assert _delta_json(base, changed, removed) == json.dumps(
        [base, changed, removed], sort_keys=True
    )
