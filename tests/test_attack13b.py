"""Attacks on issue #13's changes (helper a13b): the recorder's in-place check by pickle, binary
digests on SQLite (migration 0011) and traced replays stored by reference.

Each test is a way a user could read a wrong value back; it failed before the fix it names.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
import pytest
from burr.core import State, action, default
from burr.core.graph import GraphBuilder

from rewind.llm import ChatClient
from rewind.persister import FieldEncoder, encode_value
from rewind.replay import Pipeline, Rewind
from rewind.store.retention import collect_garbage
from rewind.tracing import Tracer
from rewind.tracing.store import load_trace
from tests.conftest import FakeModel
from tests.test_attack13 import DAY, _replay_while_gc_archives_its_source, agent, record
from tests.test_tracing_reference import opened


# -- the recorder's in-place check: a class whose pickle leaves out part of what is stored ------
@dataclass
class Notebook:
    """A dataclass whose pickle drops its memo of answers (a common pattern for a derived
    cache), while Rewind stores every field of a dataclass."""

    notes: list[str]
    memo: dict[str, int] = field(default_factory=dict)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("memo")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.memo = {}


def _look_up(state: State, word: str) -> int:
    """A helper an action calls: it memoizes in the notebook, which no action declares."""
    book = state["notebook"]
    if word not in book.memo:
        book.memo[word] = len(word)
    return book.memo[word]


@action(reads=["question"], writes=["answer"])
def _answer(state: State) -> State:
    return state.update(answer=_look_up(state, state["question"]))


@action(reads=["answer"], writes=["question"])
def _next(state: State) -> State:
    return state.update(question=state["question"] + "!")


def test_an_in_place_change_a_custom_pickle_leaves_out_is_recorded(tmp_path: Path) -> None:
    """The stored state after each node is the run's state then: the memo a helper filled in
    place is in it (the pickle comparison saw no change: the class's pickle omits the memo)."""
    graph = (
        GraphBuilder()
        .with_actions(answer=_answer, next=_next, answer2=_answer)
        .with_transitions(("answer", "next", default), ("next", "answer2", default))
        .build()
    )
    pipe = Pipeline(name="memo", graph=graph, entrypoint="answer", halt_after=("answer2",))
    rw = Rewind(tmp_path / "store")
    try:
        run = rw.record(pipe, {"question": "hi", "notebook": Notebook(["start"])})
        assert run.status == "completed", run.error
        nodes = rw.store.nodes_of(run.run_id)
        memos = []
        for node in nodes:
            row = rw.store.load_state_row("", node.src_app_id, node.src_sequence_id)
            assert row is not None
            memos.append(row["values"]["notebook"].memo)
        assert memos == [{"hi": 2}, {"hi": 2}, {"hi": 2, "hi!": 3}]
    finally:
        rw.store.close()


class Profile(pydantic.BaseModel):
    """A pydantic model whose pickle drops a field Rewind stores."""

    name: str
    seen: list[str] = []

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        state["__dict__"] = {k: v for k, v in state["__dict__"].items() if k != "seen"}
        return state


def _fill_notebook(book: Notebook) -> None:
    book.memo["a"] = 1


def _fill_profile(profile: Profile) -> None:
    profile.seen.append("x")


@pytest.mark.parametrize(
    ("make", "change"),
    [
        (lambda: Notebook(["a"]), _fill_notebook),
        (lambda: [Notebook(["a"])], lambda v: _fill_notebook(v[0])),  # nested in a list
        (lambda: Profile(name="p"), _fill_profile),
        (lambda: {"p": Profile(name="p")}, lambda v: _fill_profile(v["p"])),
    ],
    ids=["dataclass", "nested-dataclass", "pydantic", "nested-pydantic"],
)
def test_the_encoder_sees_a_change_only_the_stored_form_shows(make: Any, change: Any) -> None:
    """FieldEncoder directly: the digest it keeps for an undeclared field is the digest of the
    field's value, for classes whose own pickle leaves out a part Rewind stores."""
    value = make()
    enc = FieldEncoder()
    enc.step({"v": value, "n": 0})
    before = enc.step({"v": value, "n": 1}, recheck=["n"]).digests["v"]
    change(value)  # only the part the pickle leaves out changes
    out = enc.step({"v": value, "n": 2}, recheck=["n"])
    assert out.digests["v"] == encode_value("v", value).digest != before
    assert "v" in out.fresh


# -- an in-place trace replay whose source gc archives while it runs ----------------------------
def test_an_in_place_replay_whose_source_was_archived_meanwhile_is_still_stored(
    tmp_path: Path, chat_client: ChatClient, fake_model: FakeModel
) -> None:
    """``tracer.replay(SOURCE)`` serves every call from SOURCE's recorded calls; ``rewind gc``
    archives SOURCE (and sweeps its blobs) before the replay is written. The replay is stored
    unlinked, every row and result its own (was lost: its write named result blobs the sweep
    had deleted, refused as 'deleted by a concurrent rewind gc' before the missing parent was
    seen)."""
    folder = tmp_path / "store"
    source, recorded = record(folder, chat_client, read_cache=False)
    asked = fake_model.count
    tracer = Tracer(folder, chat_client=chat_client)
    try:
        with tracer.replay(source) as t:
            out = agent(3)
            t.set_output(out)
            with opened(folder) as st:
                report = collect_garbage(st, 30 * DAY, now=time.time() + 40 * DAY)
            assert [a.run_id for a in report.archived] == [source] and report.blobs_deleted
    finally:
        tracer.close()
    assert t.write_error is None
    assert fake_model.count == asked  # every call was served from the source's records
    assert out == recorded
    with opened(folder) as st:
        run = st.get_run(t.trace_id)
        assert run.parent_run_id is None and run.config["source_missing"] == source
        view = load_trace(st, t.trace_id, payloads=True)
        assert len(view.steps) == 6 and all(s.output is not None for s in view.steps)
        for node in st.nodes_of(t.trace_id):
            for call in node.calls:
                assert call.result_hash and st.get_blob(call.result_hash)
                assert st.get_blob(call.request_hash)


def test_a_cached_replay_stored_unlinked_keeps_its_requests(
    tmp_path: Path, chat_client: ChatClient
) -> None:
    """The same with ``Tracer(read_cache=True)``: the unlinked replay's call requests are its
    own too (were named but not stored: the calls view and ``load_trace(payloads=True)``
    answered 'the store is damaged')."""
    folder = tmp_path / "store"
    t = _replay_while_gc_archives_its_source(folder, chat_client)
    assert t.write_error is None
    with opened(folder) as st:
        assert st.get_run(t.trace_id).config["source_missing"]
        view = load_trace(st, t.trace_id, payloads=True)
        assert len(view.steps) == 6
        for node in st.nodes_of(t.trace_id):
            for call in node.calls:
                assert st.get_blob(call.request_hash) and st.get_blob(call.result_hash)
