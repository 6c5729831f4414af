"""Tracer callbacks (seed 003): on step end, on chain end; a raising callback never breaks the
traced chain."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from rewind.store import open_store
from rewind.tracing import Tracer, step
from rewind.tracing.model import StepData, TraceData
from rewind.tracing.store import load_trace


def test_callbacks_see_every_step_and_the_written_chain(tmp_path: Path) -> None:
    seen: list[tuple[str, str, Any]] = []
    ends: list[tuple[TraceData, Any]] = []
    with closing(open_store(tmp_path / "s")) as store:
        tracer = Tracer(
            store, on_chain_end=lambda *, trace, record, **_: ends.append((trace, record))
        )

        @tracer.on_step_end
        def remember(*, step: StepData, trace_id: str, **_: Any) -> None:
            seen.append((trace_id, step.name, step.fields))

        with tracer.trace("chain", {"q": "x"}) as t:
            with step("outer", "transform") as s:
                with step("inner", "parse") as i:
                    i.set_output(1)
                s.set_output(2)
            with pytest.raises(ValueError), step("boom", "validate"):
                raise ValueError("bad")
        assert [(n, f) for _, n, f in seen] == [
            ("inner", {"inner": 1}),
            ("outer", {"outer": 2}),
            ("boom", None),
        ]
        assert {tid for tid, _, _ in seen} == {t.trace_id}
        ((data, record),) = ends
        assert record is not None and record.run_id == t.trace_id == data.trace_id
        assert [s.name for s in data.steps] == ["outer", "inner", "boom"]


def test_a_raising_callback_never_breaks_the_chain(tmp_path: Path) -> None:
    def broken(**_: Any) -> None:
        raise RuntimeError("callback bug")

    with closing(open_store(tmp_path / "s")) as store:
        tracer = Tracer(store, on_step_end=broken, on_chain_end=broken)

        @tracer.chain("answer")
        def answer(q: str) -> str:
            with step("gen", "transform") as s:
                s.set_output(q.upper())
            return q.upper()

        assert answer("hi") == "HI"
        (run,) = store.list_runs()
        view = load_trace(store, run.run_id)
        assert run.status == "completed" and view.steps[0].output == "HI"

        with tracer.trace("again") as t, step("one") as s:
            s.set_output(1)
        assert t.record is not None
        assert len(t.callback_errors) == 2
        assert all("RuntimeError: callback bug" in e for e in t.callback_errors)
