"""Attach Rewind to the Burr app a user already has.

A :class:`Pipeline` is what Rewind records, forks and replays: a Burr graph, its entrypoint and
what it needs to be rebuilt for a new run id. :func:`attach` makes one from what users write — a
``rewind.Pipeline``, a ``burr.core.ApplicationBuilder`` or a built ``burr.core.Application``
(what the ``application()`` factories of Burr's examples return) — taking the graph, entrypoint,
initial state, typing system, parallel executor, lifecycle hooks and tracker from it. Rewind then
builds a fresh Burr app per run with its own recorder as the state persister; the app's trackers
and hooks are kept, so they keep seeing every step. An app's own state persister is replaced (Burr
takes one) and its ``initialize_from`` is not used: a fork resumes from Rewind's store.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from burr.core import Application, ApplicationBuilder
from burr.core.graph import Graph
from burr.core.persistence import PersisterHook

from rewind.canonical import sha256_hex
from rewind.drift import graph_document
from rewind.errors import InvalidRequest, RewindError
from rewind.store.records import NAME_RULE, storable_name


@dataclass(frozen=True)
class Pipeline:
    """A Burr application graph Rewind can record, fork and replay.

    Args:
        name: pipeline name stored on every run.
        graph: the Burr graph (``GraphBuilder().with_actions(…).with_transitions(…).build()``).
        entrypoint: name of the first node.
        ref: ``"package.module:attribute"`` that re-imports this pipeline (a Pipeline, a Burr
            Application or ApplicationBuilder, or a zero-argument factory of one); lets
            ``rewind fork`` rebuild the graph of a stored run.
        halt_after: nodes after which a run stops; defaults to the graph's terminal nodes.
        param_check: optional ``(node, param, value, node_input) -> error message | None``;
            a fork calls it before anything is written, so a param value the node cannot use is
            refused up front (``node_input`` is the node's recorded input document, decoded).
        param_hints: optional ``(node, param, node_input) -> hint | None``: the values a param
            may take, for people choosing an override (the UI's node editor) — ``{"choices":
            [...]}`` and/or ``{"type": "number"|"integer", "min": x, "max": y}``, plus an
            optional ``"description"``. A fork refuses a value outside a declared hint before
            anything is written (:func:`rewind.engine.plan.param_hints`).
        initial_state: the state a run starts from when ``Rewind.record`` gets none (an app's
            ``with_state(...)``/``initialize_from(default_state=...)``); Burr's ``__`` keys removed.
        hooks: the app's own Burr lifecycle adapters, added to every run's app.
        tracker: the app's Burr tracker; each run gets its own ``copy()`` of it.
        typing_system: the app's ``with_typing(...)`` system, or None.
        executor_factory: the app's ``with_parallel_executor(...)`` factory, or None.

    Raises:
        InvalidRequest: the name or a node's name is not 1 to 200 characters without NUL
            (UTF-8): a store would refuse the run's rows after its nodes ran and spent their
            calls.
    """

    name: str
    graph: Graph
    entrypoint: str
    ref: str = ""
    halt_after: tuple[str, ...] = ()
    param_check: Callable[[str, str, Any, dict[str, Any]], str | None] | None = None
    initial_state: Mapping[str, Any] | None = None
    hooks: tuple[Any, ...] = ()
    tracker: Any = None
    typing_system: Any = None
    executor_factory: Callable[[], Any] | None = None
    param_hints: Callable[[str, str, dict[str, Any]], dict[str, Any] | None] | None = None

    def __post_init__(self) -> None:
        for what, name in [("pipeline", self.name)] + [("node", n) for n in self.node_names()]:
            if not storable_name(name):
                raise InvalidRequest(
                    f"a {what} needs a name {NAME_RULE}, not {name!r:.80}",
                    f"rename the {what}: every store keeps its name in a 200-character column",
                )

    def node_names(self) -> list[str]:
        """Names of the graph's nodes."""
        return [a.name for a in self.graph.actions]

    def edges(self) -> list[tuple[str, str, str]]:
        """(src, dst, condition) for every transition."""
        return [(t.from_.name, t.to.name, t.condition.name) for t in self.graph.transitions]

    def terminal_nodes(self) -> list[str]:
        """Nodes with no outgoing transition (where a run ends)."""
        sources = {t.from_.name for t in self.graph.transitions}
        return [n for n in self.node_names() if n not in sources]

    def graph_document(self) -> dict[str, Any]:
        """The graph a run of this pipeline records: nodes with code fingerprints, transitions,
        entrypoint, param check (see :func:`rewind.drift.graph_document`)."""
        return graph_document(self.graph, self.entrypoint, self.param_check)

    def is_async(self) -> bool:
        """True when some node is an ``async`` Burr action (the run is driven with ``astep``)."""
        return any(a.is_async() for a in self.graph.actions)

    def builder(self, app_id: str) -> ApplicationBuilder:
        """A fresh Burr builder for one run: the graph, the run id as Burr ``app_id``, and the
        app's typing system, parallel executor, hooks and (a copy of its) tracker. State,
        entrypoint and persister are the caller's."""
        b = ApplicationBuilder().with_graph(self.graph).with_identifiers(app_id=app_id)
        if self.typing_system is not None:
            b = b.with_typing(self.typing_system)
        if self.executor_factory is not None:
            b = b.with_parallel_executor(self.executor_factory)
        if self.hooks:
            b = b.with_hooks(*self.hooks)
        if self.tracker is not None:
            copy = getattr(self.tracker, "copy", None)
            # A tracker keeps per-app handles (the log file): one copy per app, as Burr does
            # for sub-applications.
            b = b.with_tracker(copy() if callable(copy) else self.tracker)
        return b


def attach(target: object, *, ref: str = "") -> Pipeline:
    """The pipeline of a ``rewind.Pipeline``, a Burr ``ApplicationBuilder`` or a built
    ``Application``.

    Args:
        target: what to attach to.
        ref: ``"module:attribute"`` that re-imports ``target`` (stored on its runs for forks);
            kept from a Pipeline that already has one.
    Raises:
        RewindError: ``target`` is none of these, or its builder has no graph or entrypoint.
    """
    if isinstance(target, Pipeline):
        if ref and not target.ref:
            return dataclasses.replace(target, ref=ref)
        return target
    if isinstance(target, Application):
        builder = target.builder
        if builder is None:
            raise RewindError(
                "this Burr Application was not built by an ApplicationBuilder",
                "pass the ApplicationBuilder (or a factory returning it) instead",
            )
        return _from_builder(builder, ref)
    if isinstance(target, ApplicationBuilder):
        return _from_builder(target, ref)
    raise RewindError(
        f"cannot record a {type(target).__name__}",
        "pass a rewind.Pipeline, a burr ApplicationBuilder or a built burr Application",
    )


def _from_builder(b: ApplicationBuilder, ref: str) -> Pipeline:
    try:
        graph = b._get_built_graph()  # the only way Burr offers to read a builder's graph
    except ValueError as exc:
        raise RewindError(
            "the Burr app has no graph", "add actions and transitions (or with_graph)"
        ) from exc
    if not b.start:
        raise RewindError("the Burr app has no entrypoint", "call .with_entrypoint(NODE)")
    state = b.state.get_all() if b.state is not None else dict(b.default_state or {})
    initial = {k: v for k, v in state.items() if not k.startswith("__")}
    persister = b.state_persister
    hooks = tuple(
        a
        for a in b.lifecycle_adapters
        if a is not b.tracker and a is not persister and not isinstance(a, PersisterHook)
    )
    edges = sorted(f"{t.from_.name}>{t.to.name}:{t.condition.name}" for t in graph.transitions)
    name = ref or f"app:{b.start}@{sha256_hex('|'.join(edges).encode())[:8]}"
    return Pipeline(
        name=name,
        graph=graph,
        entrypoint=b.start,
        ref=ref,
        initial_state=initial,
        hooks=hooks,
        tracker=b.tracker,
        typing_system=b.typing_system,
        executor_factory=b.parallel_executor_factory,
    )


def import_pipeline_module(ref: str) -> None:
    """Import the module of a recorded ``module:attribute`` reference (not its factory), best
    effort: Burr serializers are registered at that module's import time (README, "What a run
    stores exactly"), and a command that only reads a run must still load the values they wrote.
    A module that cannot be imported is skipped; loading a value then says what is missing."""
    module_name = ref.partition(":")[0]
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        return
    if module_name in sys.modules:
        return
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        importlib.import_module(module_name)
    except Exception:
        return


def load_pipeline(ref: str) -> Pipeline:
    """Import the app ``"module:attribute"`` names and attach to it.

    The attribute may be a Pipeline, a Burr Application or ApplicationBuilder, or a
    zero-argument factory returning one (like the ``application()`` of Burr's examples). The
    current folder is importable, like ``python -m``.

    Raises:
        RewindError: the module or attribute cannot be imported, the factory fails, or the
            object is none of these.
    """
    module_name, colon, attr = ref.partition(":")
    if not colon or not module_name or not attr:
        raise RewindError(
            f"pipeline reference {ref!r} is not module:attribute",
            "e.g. --app myapp.application:application",
        )
    if not all(part.isidentifier() for part in module_name.split(".")):
        # import_module would take "../x" as a relative import and raise a TypeError.
        raise RewindError(
            f"pipeline reference {ref!r}: {module_name!r} is not a module name",
            "name a dotted module (myapp.pipelines:pipeline), not a file path; run from the "
            "folder that contains it or put that folder on PYTHONPATH",
        )
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise RewindError(
            f"cannot import pipeline {ref!r}: {exc}",
            "make the module importable (installed or on PYTHONPATH)",
        ) from exc
    except Exception as exc:  # the module itself raised (or has a syntax error) on import
        first = (str(exc).strip().splitlines() or [""])[0]
        raise RewindError(
            f"importing pipeline {ref!r} raised {type(exc).__name__}: {first}",
            "fix the module so it imports (python -c 'import MODULE' shows the traceback)",
        ) from exc
    if callable(obj) and not isinstance(obj, Pipeline | Application | ApplicationBuilder):
        try:
            obj = obj()
        except Exception as exc:
            raise RewindError(
                f"calling {ref}() failed: {type(exc).__name__}: {exc}",
                "point it at a factory that takes no arguments",
            ) from exc
    if not isinstance(obj, Pipeline | Application | ApplicationBuilder):
        raise RewindError(
            f"{ref!r} is a {type(obj).__name__}, not an app Rewind can record",
            "point it at a Burr Application, ApplicationBuilder, rewind Pipeline or a "
            "zero-argument factory of one",
        )
    return attach(obj, ref=ref)
