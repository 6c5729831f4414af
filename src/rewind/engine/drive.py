"""Drive a Burr app step by step, the way ``Application.run``/``arun`` would.

Rewind drives the app itself rather than calling ``run``/``arun`` for three reasons:

- a fork's input override changes a runtime input for one node only, while Burr hands every step
  of a ``run`` the same inputs;
- an app with ``async`` actions must be driven with ``astep``, but ``astep`` on a *synchronous*
  action hands its post-step hooks the state from before the step (measured on apache-burr
  0.43.0, DESIGN "Fork semantics on Burr"), so synchronous actions are stepped with ``step``;
- a run must stop on the recorded ``halt_after``/``halt_before`` exactly as Burr would: the first
  step always runs, then the run halts after a ``halt_after`` node or before a ``halt_before`` one.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from burr.core import Application

from rewind.canonical import CanonicalError, canonical_bytes
from rewind.engine.attach import Pipeline
from rewind.errors import InvalidOverride

TAG_PREFIX = "@tag:"
"""Burr's halt conditions name a node, or every node with a tag as ``@tag:NAME``."""


@dataclass(frozen=True)
class Launch:
    """How a run was launched: Burr runtime inputs and halt conditions (stored on the run row).

    Args:
        inputs: the runtime inputs every step is offered (``app.run(inputs=...)``), JSON values;
            Burr passes each action the ones it declares.
        halt_after: node names (or ``@tag:NAME``) after which the run stops.
        halt_before: node names (or ``@tag:NAME``) before which the run stops.
    """

    inputs: Mapping[str, Any] = field(default_factory=dict)
    halt_after: tuple[str, ...] = ()
    halt_before: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The launch as stored on the run row."""
        return {
            "inputs": dict(self.inputs),
            "halt_after": list(self.halt_after),
            "halt_before": list(self.halt_before),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Launch:
        """The launch of a stored run ({} for runs recorded before launches were stored)."""
        return cls(
            inputs=dict(doc.get("inputs") or {}),
            halt_after=tuple(doc.get("halt_after") or ()),
            halt_before=tuple(doc.get("halt_before") or ()),
        )


def plan_launch(
    pipeline: Pipeline,
    *,
    inputs: Mapping[str, Any] | None,
    halt_after: Sequence[str] | None,
    halt_before: Sequence[str] | None,
) -> Launch:
    """Check a run's inputs and halt conditions before anything is written.

    Without ``halt_after``/``halt_before`` the run halts after the pipeline's ``halt_after`` or,
    failing that, its terminal nodes.

    Raises:
        InvalidOverride: an input is not a JSON value or starts with ``__`` (Burr reserves those),
            the entrypoint lacks a runtime input it requires (Burr would fail at the first step),
            a halt node is not in the graph, or the graph loops with no halt condition given.
    """
    inputs = dict(inputs or {})
    _check_inputs(pipeline, inputs)
    _check_halt_nodes(pipeline, halt_after, halt_before)
    after = tuple(halt_after or ())
    before = tuple(halt_before or ())
    if not after and not before:
        after = tuple(pipeline.halt_after) or tuple(pipeline.terminal_nodes())
        if not after:
            raise InvalidOverride(
                f"pipeline {pipeline.name!r} loops (no node ends it), so the run would not stop",
                "pass halt_after (CLI: --halt-after NODE), as you would to app.run",
            )
    return Launch(inputs=inputs, halt_after=after, halt_before=before)


def _check_inputs(pipeline: Pipeline, inputs: Mapping[str, Any]) -> None:
    """Refuse a runtime input that Burr reserves or that is not JSON, and a missing input the
    entrypoint requires."""
    for name, value in inputs.items():
        if not isinstance(name, str) or name.startswith("__"):
            raise InvalidOverride(
                f"runtime input {name!r} starts with '__', which Burr reserves",
                "rename the input",
            )
        try:
            canonical_bytes(value)
        except (CanonicalError, ValueError, TypeError) as exc:
            raise InvalidOverride(
                f"runtime input {name!r} is not a JSON value ({exc})",
                "pass JSON values (strings, numbers, lists, objects); forks replay them",
            ) from exc
    entry = next((a for a in pipeline.graph.actions if a.name == pipeline.entrypoint), None)
    required, _ = entry.optional_and_required_inputs if entry is not None else (set(), set())
    missing = sorted(k for k in required if not k.startswith("__") and k not in inputs)
    if missing:
        example = ", ".join(f'"{k}": ...' for k in missing)
        raise InvalidOverride(
            f"node {pipeline.entrypoint!r} needs the runtime input(s) {', '.join(missing)}",
            f"pass them as inputs={{{example}}} (CLI: --inputs '{{{example}}}')",
        )


def _check_halt_nodes(
    pipeline: Pipeline, halt_after: Sequence[str] | None, halt_before: Sequence[str] | None
) -> None:
    """Refuse a halt node (or ``tag:`` name) the graph does not have."""
    names = set(pipeline.node_names())
    tags = {t for a in pipeline.graph.actions for t in a.tags}
    for flag, given in (("halt_after", halt_after), ("halt_before", halt_before)):
        unknown = [
            n
            for n in given or ()
            if (n[len(TAG_PREFIX) :] not in tags if n.startswith(TAG_PREFIX) else n not in names)
        ]
        if unknown:
            raise InvalidOverride(
                f"{flag} names {', '.join(map(repr, unknown))}, which the graph does not have",
                f"its nodes: {', '.join(pipeline.node_names())}"
                + (f"; its tags: {', '.join(sorted(tags))}" if tags else ""),
            )


def drive(
    app: Application,
    launch: Launch,
    input_overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Step ``app`` until it halts as ``launch`` says, or has no next node.

    Args:
        app: a built Burr app (Rewind's recorder attached).
        launch: runtime inputs and halt conditions.
        input_overrides: ``{node: {input: value}}`` replacing runtime inputs of those nodes only
            (a fork's ``--set-input``).
    Raises:
        whatever a node raises.
    """
    if any(a.is_async() for a in app.graph.actions):
        _run_coroutine_blocking(lambda: _adrive(app, launch, input_overrides or {}))
        return
    after, before = _halts(app, launch)
    while (action := app.get_next_action()) is not None:
        app.step(inputs=_inputs_for(action.name, launch, input_overrides or {}))
        if _should_halt(app, action.name, after, before):
            return


async def _adrive(
    app: Application, launch: Launch, input_overrides: Mapping[str, Mapping[str, Any]]
) -> None:
    after, before = _halts(app, launch)
    while (action := app.get_next_action()) is not None:
        inputs = _inputs_for(action.name, launch, input_overrides)
        if action.is_async():
            await app.astep(inputs=inputs)
        else:
            app.step(inputs=inputs)  # astep would hand the hooks the pre-step state
        if _should_halt(app, action.name, after, before):
            return


def _run_coroutine_blocking(make: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a coroutine to completion from synchronous code, carrying the caller's contextvars
    (the run context) into it; in a thread of its own when this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(make())
        return
    ctx = contextvars.copy_context()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rewind-drive") as pool:
        pool.submit(ctx.run, lambda: asyncio.run(make())).result()


def _inputs_for(
    node: str, launch: Launch, overrides: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    return {**launch.inputs, **overrides.get(node, {})}


def _halts(app: Application, launch: Launch) -> tuple[set[str], set[str]]:
    def expand(names: Sequence[str]) -> set[str]:
        out: set[str] = set()
        for n in names:
            if n.startswith(TAG_PREFIX):
                out.update(a.name for a in app.graph.get_actions_by_tag(n[len(TAG_PREFIX) :]))
            else:
                out.add(n)
        return out

    return expand(launch.halt_after), expand(launch.halt_before)


def _should_halt(app: Application, done: str, after: set[str], before: set[str]) -> bool:
    if done in after:
        return True
    if not before:
        return False  # nothing to halt before: the next action is not worked out twice
    nxt = app.get_next_action()
    return nxt is not None and nxt.name in before
