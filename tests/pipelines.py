"""Small pipelines used by the tests.

``pipeline``: 4 nodes, one conditional transition; it proves Rewind instruments any Burr
application, not only the demo. The others probe failures, busy runs, the tool cache and the LLM
cache.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from burr.core import State, action, default, expr
from burr.core.graph import GraphBuilder

import rewind
from rewind.calls import chat
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


# -- more pipelines for the engine tests -------------------------------------------------------
# Each one is importable through its ``ref`` so a fresh ``Rewind`` (a new process) can fork it.


def _linear(name: str, ref: str, **nodes: Any) -> Pipeline:
    names = list(nodes)
    builder = GraphBuilder().with_actions(**nodes)
    if len(names) > 1:
        builder = builder.with_transitions(*[(a, b, default) for a, b in itertools.pairwise(names)])
    return Pipeline(name=name, graph=builder.build(), entrypoint=names[0], ref=ref)


# A run that fails at its 2nd node (unless the fork overrides ``boom.fail``).


@action(reads=["x"], writes=["total"])
def prepare(state: State) -> State:
    return state.update(total=t_add(state["x"], 1))


@action(reads=["total"], writes=["checked"])
def boom(state: State) -> State:
    if rewind.param("fail", True):
        raise RuntimeError("boom went off")
    return state.update(checked=t_add(state["total"], 100))


@action(reads=["checked"], writes=["done"])
def finish(state: State) -> State:
    return state.update(done=state["checked"] * 2)


failing = _linear("failing", "tests.pipelines:failing", prepare=prepare, boom=boom, finish=finish)


# A run whose 2nd node blocks until the test releases it (to fork a run that is still running).

BLOCK_ENTERED = threading.Event()
BLOCK_RELEASE = threading.Event()


@action(reads=["total"], writes=["held"])
def hold(state: State) -> State:
    BLOCK_ENTERED.set()
    BLOCK_RELEASE.wait()
    return state.update(held=state["total"])


blocking = _linear("blocking", "tests.pipelines:blocking", prepare=prepare, hold=hold)


# Tool-cache probes: argument spelling, argument order, and two tools with one body.

TOOL_CALLS: list[tuple[str, Any]] = []


@tool("t_sub")
def t_sub(a: int, b: int) -> int:
    TOOL_CALLS.append(("t_sub", (a, b)))
    return a - b


@tool("t_first")
def t_first(items: list[int]) -> int:
    TOOL_CALLS.append(("t_first", list(items)))
    return items[0]


@tool("t_double_a")
def t_double_a(n: int) -> int:
    TOOL_CALLS.append(("t_double_a", n))
    return n * 2


@tool("t_double_b")
def t_double_b(n: int) -> int:
    TOOL_CALLS.append(("t_double_b", n))
    return n * 2


@action(reads=[], writes=["kw", "pair", "twins"])
def probe(state: State) -> State:
    kw = [t_sub(a=5, b=3), t_sub(b=3, a=5)]
    pair = [t_first([7, 9]), t_first([9, 7])]
    twins = [t_double_a(4), t_double_b(4)]
    return state.update(kw=kw, pair=pair, twins=twins)


probes = _linear("probes", "tests.pipelines:probes", probe=probe)


# An LLM pipeline: ``ask`` calls the model through the LLM cache, ``shout`` only computes.

RAW_RESPONSES: list[bytes] = []


@action(reads=["question"], writes=["answer", "finish_reason"])
def ask(state: State) -> State:
    response = chat(
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": state["question"]},
        ],
        temperature=rewind.param("temperature", 0.0),
        max_tokens=rewind.param("max_tokens", 32),
    )
    RAW_RESPONSES.append(response.raw)
    return state.update(answer=response.content, finish_reason=response.finish_reason)


@action(reads=["answer"], writes=["loud"])
def shout(state: State) -> State:
    return state.update(loud=state["answer"].upper())


llm_pipeline = _linear("llm", "tests.pipelines:llm_pipeline", ask=ask, shout=shout)
