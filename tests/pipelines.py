"""A second, small pipeline used by the tests: 4 nodes, one conditional transition.

It proves Rewind instruments any Burr application, not only the demo.
"""

from __future__ import annotations

from burr.core import State, action, default, expr
from burr.core.graph import GraphBuilder

import rewind
from rewind.replay import Pipeline
from rewind.tools import tool

CALLS: list[str] = []


@tool("t_add")
def t_add(a: int, b: int) -> int:
    CALLS.append("t_add")
    return a + b


@tool("t_scale")
def t_scale(values: list[int], factor: int) -> list[int]:
    CALLS.append("t_scale")
    return [v * factor for v in values]


@action(reads=["x"], writes=["total"])
def start(state: State) -> State:
    return state.update(total=t_add(state["x"], rewind.param("offset", 10)))


@action(reads=["total"], writes=["series"])
def expand(state: State) -> State:
    return state.update(series=t_scale([state["total"], 1, 2], rewind.param("factor", 2)))


@action(reads=["series"], writes=["verdict"])
def big(state: State) -> State:
    return state.update(verdict={"size": "big", "sum": t_add(sum(state["series"]), 0)})


@action(reads=["series"], writes=["verdict"])
def small(state: State) -> State:
    return state.update(verdict={"size": "small", "sum": t_add(sum(state["series"]), 0)})


graph = (
    GraphBuilder()
    .with_actions(start=start, expand=expand, big=big, small=small)
    .with_transitions(
        ("start", "expand", default),
        ("expand", "big", expr("total >= 20")),
        ("expand", "small", default),
    )
    .build()
)

pipeline = Pipeline(name="tiny", graph=graph, entrypoint="start", ref="tests.pipelines:pipeline")


@action(reads=[], writes=["seed"])
def boom_before(state: State) -> State:
    return state.update(seed=t_add(1, 1))


@action(reads=["seed"], writes=["never"])
def boom(state: State) -> State:
    raise RuntimeError("node exploded on purpose")


@action(reads=["never"], writes=["after"])
def boom_after(state: State) -> State:
    return state.update(after=1)


failing = Pipeline(
    name="failing",
    graph=GraphBuilder()
    .with_actions(boom_before=boom_before, boom=boom, boom_after=boom_after)
    .with_transitions(("boom_before", "boom", default), ("boom", "boom_after", default))
    .build(),
    entrypoint="boom_before",
    ref="tests.pipelines:failing",
)
