"""Attacks on issue #13's changes (helper a13b): the recorder's in-place check by pickle, binary
digests on SQLite (migration 0011) and traced replays stored by reference.

Each test is a way a user could read a wrong value back; it failed before the fix it names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
import pytest
from burr.core import State, action, default
from burr.core.graph import GraphBuilder

from rewind.persister import FieldEncoder, encode_value
from rewind.replay import Pipeline, Rewind


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
