"""The demo research pipeline: eight nodes on a real dataset, four model calls, four computations.

``plan (llm) → research (tool) → analyse (tool) → critique (llm) → revise (llm) → compose (llm)
→ verify (tool) → publish (tool)``

The model never writes numbers into the data table: ``compose`` writes prose around the table that
``analyse`` computed, and ``verify`` recomputes that table straight from the CSV and lists every
number in the prose the data does not support (small models invent numbers; catching that is the
point). State holds only semantic values (DESIGN rule 1); params (``rewind.param``) and the run id
travel in the run context, never in state.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from burr.core import State, action, default
from burr.core.graph import GraphBuilder

from rewind.artifacts import publish as publish_artifact
from rewind.calls import chat
from rewind.context import param
from rewind.examples import weather
from rewind.llm import json_schema_format
from rewind.replay import Pipeline
from rewind.tools import tool

NODES = ("plan", "research", "analyse", "critique", "revise", "compose", "verify", "publish")
ARTIFACT_NAME = "report.md"
DEFAULT_TEMPERATURE = 0.0

# -- tools (deterministic computations; their calls go through the tool cache) -----------------


@tool("research.select")
def select_rows(csv_path: str, csv_sha256: str, plan: dict[str, Any]) -> dict[str, Any]:
    """Rows/columns the plan needs. ``csv_sha256`` keys the cache on the file's content."""
    return weather.research(csv_path, plan)


@tool("analyse.group")
def group_stats(selection: dict[str, Any], group_by: str, aggregate: str) -> dict[str, Any]:
    """Grouped statistics of the selection."""
    return weather.analyse(selection, group_by=group_by, aggregate=aggregate)


@tool("verify.check")
def check_numbers(
    csv_path: str, csv_sha256: str, plan: dict[str, Any], analysis: dict[str, Any], prose: str
) -> dict[str, Any]:
    """Independent recomputation from the CSV + every unsupported number in the prose."""
    return weather.verify(csv_path, plan, analysis, prose)


@tool("publish.render")
def render_report(
    question: str, plan: dict[str, Any], analysis: dict[str, Any], prose: str, check: dict[str, Any]
) -> str:
    """The markdown report (no timestamps, ids or paths: its bytes are compared across runs)."""
    return weather.render_report(question, plan, analysis, prose, check)


# -- nodes -------------------------------------------------------------------------------------


def _ask(system: str, user: str, *, max_tokens: int, **extra: Any) -> tuple[str, str | None]:
    response = chat(
        [{"role": "system", "content": system}, {"role": "user", "content": user}],
        temperature=param("temperature", DEFAULT_TEMPERATURE),
        max_tokens=param("max_tokens", max_tokens),
        # No pinned seed: at temperature 0 decoding is greedy anyway, and at > 0 a fixed seed
        # would make the model look deterministic (llama.cpp re-seeds on every request).
        seed=param("seed", None),
        **extra,
    )
    return response.content.strip(), response.finish_reason


def _table(analysis: dict[str, Any]) -> str:
    return weather.render_table(analysis)


@action(reads=["question", "dataset"], writes=["plan"])
def plan(state: State) -> State:
    """LLM: choose metric, grouping and aggregate, constrained by a JSON schema."""
    dataset = state["dataset"]
    columns = ", ".join(f"{c['name']} ({c['dtype']})" for c in dataset["columns"])
    text, _ = _ask(
        "You plan a data analysis. Answer with JSON only.",
        f"Question: {state['question']}\nColumns: {columns}\n"
        "Pick the metric column, how to group rows, and the aggregate.",
        max_tokens=96,
        response_format=json_schema_format("plan", weather.plan_schema(dataset)),
    )
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        raw = {}
    plan_value = weather.normalize_plan(
        raw if isinstance(raw, dict) else {}, dataset, state["question"]
    )
    return state.update(plan=plan_value)


@action(reads=["csv_path", "dataset", "plan"], writes=["selection"])
def research(state: State) -> State:
    """Tool: select the rows and columns the plan needs from the CSV."""
    selection = select_rows(state["csv_path"], state["dataset"]["sha256"], state["plan"])
    return state.update(selection=selection)


@action(reads=["selection", "plan"], writes=["analysis"])
def analyse(state: State) -> State:
    """Tool: grouped statistics. Params ``group_by`` and ``aggregate`` default to the plan's."""
    p = state["plan"]
    analysis = group_stats(
        state["selection"],
        param("group_by", p["group_by"]),
        param("aggregate", p["aggregate"]),
    )
    return state.update(analysis=analysis)


@action(reads=["question", "analysis"], writes=["critique"])
def critique(state: State) -> State:
    """LLM: point out what the table does and does not show."""
    text, _ = _ask(
        "You review data analyses. Be brief and concrete.",
        f"Question: {state['question']}\nTable:\n{_table(state['analysis'])}\n"
        "Name one weakness or caveat of answering the question with this table.",
        max_tokens=80,
    )
    return state.update(critique=text)


@action(reads=["question", "analysis", "critique"], writes=["findings"])
def revise(state: State) -> State:
    """LLM: state the key finding, taking the critique into account."""
    a = state["analysis"]
    runner = a.get("runner_up")
    second = f"Runner-up: {runner['group']} ({runner['value']})\n" if runner else ""
    text, _ = _ask(
        "You write precise findings from data.",
        f"Question: {state['question']}\nTop group: {a['top']['group']} ({a['top']['value']})\n"
        f"{second}Caveat: {state['critique']}\nWrite the key finding in one or two sentences.",
        max_tokens=80,
    )
    return state.update(findings=text)


@action(reads=["question", "analysis", "findings"], writes=["prose"])
def compose(state: State) -> State:
    """LLM: a short answer in prose; the data table is added by ``publish``, not by the model."""
    text, _ = _ask(
        "You answer questions about data in a short paragraph.",
        f"Question: {state['question']}\nFinding: {state['findings']}\n"
        f"Table:\n{_table(state['analysis'])}\nAnswer the question in 2-3 sentences.",
        max_tokens=120,
    )
    return state.update(prose=text)


@action(reads=["csv_path", "dataset", "plan", "analysis", "prose"], writes=["check"])
def verify(state: State) -> State:
    """Tool: recompute the table from the CSV; list numbers in the prose the data lacks."""
    check = check_numbers(
        state["csv_path"],
        state["dataset"]["sha256"],
        state["plan"],
        state["analysis"],
        state["prose"],
    )
    return state.update(check=check)


@action(reads=["question", "plan", "analysis", "prose", "check"], writes=["report"])
def publish(state: State) -> State:
    """Tool: render the markdown report and publish it as the run's artifact."""
    text = render_report(
        state["question"], state["plan"], state["analysis"], state["prose"], state["check"]
    )
    return state.update(report=publish_artifact(ARTIFACT_NAME, text))


def check_param(node: str, name: str, value: Any, node_input: dict[str, Any]) -> str | None:
    """Refuse a fork's param value the node cannot use, before anything is recorded.

    ``analyse.group_by``/``aggregate`` are tried on the node's own recorded selection;
    ``temperature`` must be a number in [0, 2]; ``max_tokens`` an integer in [1, 4096].
    """
    if name == "temperature":
        ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 2
        return None if ok else "temperature must be a number from 0 to 2"
    if name == "max_tokens":
        ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 4096
        return None if ok else "max_tokens must be an integer from 1 to 4096"
    if node == "analyse" and name in ("group_by", "aggregate"):
        reads = node_input.get("reads", {})
        params = dict(node_input.get("params", {}))
        params[name] = value
        if not isinstance(value, str):
            return f"{name} must be a string"
        try:
            weather.analyse(
                reads["selection"], group_by=params["group_by"], aggregate=params["aggregate"]
            )
        except (weather.DataError, KeyError) as exc:
            return str(exc).rstrip(".")
    return None


def param_hints(node: str, name: str, node_input: dict[str, Any]) -> dict[str, Any] | None:
    """The values a fork may give a param (the node editor offers them; a fork refuses others):
    ``analyse.group_by`` — the groupings the node's recorded selection provides; ``aggregate``
    — :data:`weather.AGGREGATES`; ``temperature`` a number in [0, 2]; ``max_tokens`` an integer
    in [1, 4096]."""
    if name == "temperature":
        return {"type": "number", "min": 0, "max": 2, "description": "sampling temperature"}
    if name == "max_tokens":
        return {"type": "integer", "min": 1, "max": 4096, "description": "answer length cap"}
    if node == "analyse" and name == "aggregate":
        return {"choices": list(weather.AGGREGATES), "description": "applied within each group"}
    if node == "analyse" and name == "group_by":
        selection = node_input.get("reads", {}).get("selection")
        if isinstance(selection, dict):
            choices = weather.selection_group_bys(selection)
            if choices:
                return {"choices": choices, "description": "how the rows are grouped"}
    return None


def build() -> Pipeline:
    """The demo pipeline (a fresh graph each call)."""
    graph = (
        GraphBuilder()
        .with_actions(
            plan=plan,
            research=research,
            analyse=analyse,
            critique=critique,
            revise=revise,
            compose=compose,
            verify=verify,
            publish=publish,
        )
        .with_transitions(*[(a, b, default) for a, b in itertools.pairwise(NODES)])
        .build()
    )
    return Pipeline(
        name="research",
        graph=graph,
        entrypoint="plan",
        ref="rewind.examples.research:build",
        halt_after=("publish",),
        param_check=check_param,
        param_hints=param_hints,
    )


def initial_state(
    csv_path: str | Path | None = None, question: str | None = None
) -> dict[str, Any]:
    """The run's initial state: question, CSV path and the CSV's profile (incl. its sha256).

    Raises:
        weather.DataError: the CSV is missing, empty or unreadable.
    """
    path = Path(csv_path) if csv_path else weather.default_csv()
    dataset = weather.profile(path)
    weather.plan_schema(dataset)  # raises DataError now if there is nothing to plan on
    return {
        "question": question or weather.DEFAULT_QUESTION,
        "csv_path": str(path.resolve()),
        "dataset": dataset,
    }
