"""Record, fork and replay Burr runs.

The data path reads as a straight line: :meth:`Rewind.record` executes a pipeline with the
recorder attached; :meth:`Rewind.fork` inherits the parent's nodes before the fork point and
resumes there with exactly one override; :meth:`Rewind.replay` is a fork with no override, which
must come back as 100% cache hits, 0 tokens and identical hashes; :meth:`Rewind.diff` compares two
trajectories. Burr's fork traps (DESIGN, measured on apache-burr 0.43.0) are handled here:

- to re-run node N, fork from the row of the last completed node *before* N, found by position
  (forking from N's own row silently starts at N+1);
- forking the first node starts a new app from the recorded initial state;
- nested forks resolve the source through each node's ``src_app_id``/``src_sequence_id``, since a
  child app only holds rows from its fork point on;
- a missing source row makes Burr fall back to default state with a warning: Rewind checks first
  and raises :class:`ForkError`.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from burr.core import ApplicationBuilder
from burr.core.graph import Graph

from rewind.canonical import canonical_bytes
from rewind.context import LineageEntry, RunContext, activate
from rewind.diff import NodeSide, TrajectoryDiff, diff_trajectories
from rewind.effects import EFFECT_MODES, EffectPreconditionFailed, SideEffectBlocked
from rewind.errors import (
    EndpointUnavailable,
    ForkError,
    InvalidOverride,
    RewindError,
    RunBusy,
    UnknownNode,
)
from rewind.persister import FieldEncoder, RewindPersister, encode_value, field_map, map_hash
from rewind.recorder import Recorder, semantic_state
from rewind.store import NodeRecord, RunRecord, Store, open_store
from rewind.store.store import state_row

# -- pipelines ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pipeline:
    """A Burr application graph Rewind can record, fork and replay.

    Args:
        name: pipeline name stored on every run.
        graph: the Burr graph (``GraphBuilder().with_actions(…).with_transitions(…).build()``).
        entrypoint: name of the first node.
        ref: ``"package.module:attribute"`` that re-imports this pipeline (an instance or a
            zero-argument factory); lets ``rewind fork`` rebuild the graph of a stored run.
        halt_after: nodes after which a run stops; defaults to the graph's terminal nodes.
        param_check: optional ``(node, param, value, node_input) -> error message | None``;
            a fork calls it before anything is written, so a param value the node cannot use is
            refused up front (``node_input`` is the node's recorded input document, decoded).
    """

    name: str
    graph: Graph
    entrypoint: str
    ref: str = ""
    halt_after: tuple[str, ...] = ()
    param_check: Callable[[str, str, Any, dict[str, Any]], str | None] | None = None

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


def load_pipeline(ref: str) -> Pipeline:
    """Import a pipeline from ``"module:attribute"``.

    Raises:
        RewindError: the module or attribute cannot be imported or is not a Pipeline.
    """
    module_name, colon, attr = ref.partition(":")
    if not colon or not module_name or not attr:
        raise RewindError(
            f"pipeline reference {ref!r} is not module:attribute",
            "e.g. --pipeline myapp.pipelines:pipeline",
        )
    if not all(part.isidentifier() for part in module_name.split(".")):
        # import_module would take "../x" as a relative import and raise a TypeError.
        raise RewindError(
            f"pipeline reference {ref!r}: {module_name!r} is not a module name",
            "name a dotted module (myapp.pipelines:pipeline), not a file path; run from the "
            "folder that contains it or put that folder on PYTHONPATH",
        )
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # like `python -m`: the current folder's modules import
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
    if callable(obj) and not isinstance(obj, Pipeline):
        obj = obj()
    if not isinstance(obj, Pipeline):
        raise RewindError(f"{ref!r} is not a rewind Pipeline", "point it at a Pipeline instance")
    return obj


# -- overrides ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamOverride:
    """Change one node param (read with :func:`rewind.param`), e.g. ``analyse.group_by``."""

    node: str
    param: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        """The override as stored on the fork's run row."""
        return {"kind": "param", "node": self.node, "param": self.param, "value": self.value}


@dataclass(frozen=True)
class OutputOverride:
    """Replace one field a node wrote, e.g. ``analyse.analysis``; the node is not executed."""

    node: str
    field: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        """The override as stored on the fork's run row."""
        return {"kind": "output", "node": self.node, "field": self.field, "value": self.value}


Override = ParamOverride | OutputOverride


def parse_override(spec: str, *, output: bool = False) -> Override:
    """Parse ``node.name=VALUE`` from the command line.

    For a param (``--set``) VALUE is JSON when it parses as JSON, else a plain string. For an
    output field (``--set-output``) VALUE must be JSON.

    Raises:
        InvalidOverride: the spec is malformed or an output value is not valid JSON.
    """
    flag = "--set-output" if output else "--set"
    left, sep, raw = spec.partition("=")
    node, dot, name = left.strip().partition(".")
    if not sep or not dot or not node or not name:
        raise InvalidOverride(
            f"malformed override {spec!r}", f"write it as {flag} node.field=VALUE"
        )
    if output:
        try:
            value = json.loads(raw, parse_constant=_no_constant)
            _finite(value, left)
        except json.JSONDecodeError as exc:
            raise InvalidOverride(
                f"the value of {left} is not valid JSON: {exc.msg} at column {exc.colno}",
                "quote strings as JSON, e.g. --set-output compose.prose='\"new text\"'",
            ) from exc
        return OutputOverride(node, name, value)
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except json.JSONDecodeError:
        value = raw
    _finite(value, left)
    return ParamOverride(node, name, value)


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


def _finite(value: Any, where: str) -> None:
    """Refuse values the canonical hasher cannot hash (NaN, ±Infinity, 1e999)."""
    try:
        canonical_bytes(value)
    except ValueError as exc:
        raise InvalidOverride(
            f"the value of {where} cannot be hashed: NaN and infinite numbers are not allowed",
            "use a finite number or a string",
        ) from exc


# -- the session -------------------------------------------------------------------------------


EventListener = Callable[[str, dict[str, Any]], None]


class Rewind:
    """Record, fork, replay and diff runs in one store.

    Args:
        store: a :class:`Store` or a location for :func:`open_store` (folder, .db path or URL).
        chat_client: the model endpoint's client for LLM calls (None: LLM nodes raise).
        on_event: optional progress listener ``(event, payload)``; events are ``run_started``,
            ``node_started``, ``node_finished``, ``run_finished``.
        clock: unix seconds now (injectable for tests of time-bound TTLs).
    """

    def __init__(
        self,
        store: Store | str | Path,
        *,
        chat_client: Any = None,
        on_event: EventListener | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store if isinstance(store, Store) else open_store(store)
        self.clock = clock
        self.chat_client = chat_client
        self.on_event = on_event
        self.persister = RewindPersister(self.store)
        self._pipelines: dict[str, Pipeline] = {}
        self.store.reap_orphans()

    def register(self, pipeline: Pipeline) -> None:
        """Make a pipeline available to forks of its runs without importing ``pipeline.ref``."""
        self._pipelines[pipeline.name] = pipeline

    def pipeline_of(self, run: RunRecord) -> Pipeline:
        """The pipeline a stored run was recorded with."""
        if run.pipeline in self._pipelines:
            return self._pipelines[run.pipeline]
        if not run.pipeline_ref:
            raise RewindError(
                f"run {run.run_id} used pipeline {run.pipeline!r}, which is not registered",
                "call Rewind.register(pipeline) before forking it; a traced chain is replayed "
                "with `rewind replay-trace RUN`",
            )
        return load_pipeline(run.pipeline_ref)

    # -- record -------------------------------------------------------------------------------
    def record(
        self,
        pipeline: Pipeline,
        state: dict[str, Any],
        *,
        run_id: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> RunRecord:
        """Execute ``pipeline`` from ``state`` and record every node.

        Calls execute live (the cache is written, not read: reason ``bypass``), so a recorded run
        reflects the model and tools as they are now.

        Args:
            pipeline: what to run.
            state: the initial Burr state (JSON-like values).
            run_id: the run id (= Burr app id); a new uuid when None.
            config: JSON-like settings shown with the run (model, endpoint...).
        Returns:
            the finished run (status ``completed`` or ``failed``; a failed run is recorded up
            to and including the failing node).
        Raises:
            CanonicalError: ``state`` holds a value that cannot be hashed canonically.
            EndpointUnavailable: the model endpoint cannot be reached (the run is recorded as
                failed at the node that needed it first).
        """
        self.register(pipeline)
        run_id = run_id or new_run_id()
        initial = json.loads(canonical_bytes(state))  # refuses what cannot be hashed, up front
        fields, _ = FieldEncoder().encode(initial)
        with self.store.write() as conn:
            for f in fields.values():
                self.store.put_blob(conn, f.data)
            initial_hash = self.store.put_blob(conn, map_hash(field_map(fields))[0])
            self.store.create_run(
                conn,
                run_id=run_id,
                pipeline=pipeline.name,
                pipeline_ref=pipeline.ref,
                initial_state_hash=initial_hash,
                config=config or {},
            )
        self.store.put_edges(pipeline.name, pipeline.edges())
        ctx = self._context(run_id, read_cache=False)
        builder = (
            ApplicationBuilder()
            .with_graph(pipeline.graph)
            .with_identifiers(app_id=run_id)
            .with_state(**initial)
            .with_entrypoint(pipeline.entrypoint)
        )
        return self._execute(pipeline, builder, ctx, Recorder(ctx, self.persister, 0))

    # -- fork ---------------------------------------------------------------------------------
    def fork(
        self,
        run_id: str,
        *,
        at: str | int,
        override: Override | None = None,
        new_run_id: str | None = None,
        effects: str = "recorded",
        cache_mode: str = "replay",
        config: dict[str, Any] | None = None,
    ) -> RunRecord:
        """Fork a finished run at a node with at most one override and replay downstream.

        Nodes before ``at`` are inherited (not executed; same hashes). From ``at`` on, nodes
        execute with LLM and tool calls served through the caches, preferring the calls the source
        trajectory made (its lineage).

        Args:
            run_id: the parent run (id or unique prefix).
            at: the fork node: a name (``"analyse"``, or ``"analyse#2"`` for its 2nd execution)
                or a 1-based node number as shown by ``rewind show`` (``3``).
            override: a :class:`ParamOverride` (node at or after ``at``) or an
                :class:`OutputOverride` (of node ``at``); None for an unchanged replay.
            new_run_id: id for the fork; a new uuid when None.
            effects: how side-effecting calls replay: ``recorded`` (serve the record; default),
                ``dry-run`` or ``live`` (see :mod:`rewind.effects`).
            cache_mode: ``replay`` (read and write the caches) or ``stability`` (every LLM and
                tool call runs live, results never become cache entries: reason
                ``bypass:stability``; side effects are served from record).
            config: JSON-like settings stored on the fork's run row (default: the parent's).
        Raises:
            UnknownRun, UnknownNode, InvalidOverride, RunBusy, ForkError: nothing is written.
            SideEffectBlocked, EffectPreconditionFailed: raised by the replay itself (the fork
                is recorded as failed at that node).
        """
        if cache_mode not in ("replay", "stability"):
            raise InvalidOverride(f"unknown cache mode {cache_mode!r}", "use replay or stability")
        if effects not in EFFECT_MODES:
            raise InvalidOverride(
                f"unknown effects mode {effects!r}", f"use one of {', '.join(EFFECT_MODES)}"
            )
        parent = self.store.get_run(run_id)
        if parent.status == "running":
            raise RunBusy(
                f"run {parent.run_id} is still running",
                "wait for it to finish (rewind show RUN), then fork it",
            )
        nodes = self.store.nodes_of(parent.run_id)
        if override is not None and not isinstance(override, ParamOverride | OutputOverride):
            raise InvalidOverride(
                f"override must be a ParamOverride or an OutputOverride, not {type(override)}",
                "e.g. ParamOverride('analyse', 'group_by', 'season')",
            )
        idx = resolve_node(parent, nodes, at)
        fork_node = nodes[idx]
        validate_override(nodes, idx, override)
        pipeline = self.pipeline_of(parent)
        self.check_param(parent, nodes, idx, override)
        child_id = new_run_id or new_run_id_default()
        builder = ApplicationBuilder().with_graph(pipeline.graph).with_identifiers(app_id=child_id)
        burr_src: tuple[str | None, int | None] = (None, None)
        state_row_: dict[str, Any] | None = None

        if isinstance(override, OutputOverride):
            written = self._output_map(fork_node)
            if override.field not in written:
                raise InvalidOverride(
                    f"node {fork_node.name!r} has no output field {override.field!r}",
                    f"its fields: {', '.join(sorted(written)) or 'none'}",
                )
            try:
                canonical_bytes(override.value)
            except ValueError as exc:
                raise InvalidOverride(f"the new value cannot be hashed: {exc}", "") from exc
            state_row_ = self._state_row_of(fork_node)
        elif idx == 0:
            if parent.initial_state_hash is None:
                raise ForkError(f"run {parent.run_id} has no recorded initial state", "")
            initial = self.store.resolve_fields(self.store.get_json(parent.initial_state_hash))
            builder = builder.with_state(**initial).with_entrypoint(pipeline.entrypoint)
        else:
            pred = nodes[idx - 1]
            src_row = self.store.load_state_row("", pred.src_app_id, pred.src_sequence_id)
            if src_row is None or src_row["status"] != "completed":
                raise ForkError(
                    f"fork source row {pred.src_app_id}#{pred.src_sequence_id} (state after "
                    f"{pred.name!r}) is missing from the store",
                    "the store is incomplete; record the run again",
                )
            burr_src = (pred.src_app_id, pred.src_sequence_id)
            builder = builder.initialize_from(
                self.persister,
                resume_at_next_action=True,
                default_state={},
                default_entrypoint=pipeline.entrypoint,
                fork_from_app_id=pred.src_app_id,
                fork_from_sequence_id=pred.src_sequence_id,
            )

        # A fork of a fork keeps the params its ancestors changed, plus its own change.
        param_overrides = self._ancestor_params(parent)
        if isinstance(override, ParamOverride):
            param_overrides.setdefault(override.node, {})[override.param] = override.value
        ctx = self._context(child_id, read_cache=cache_mode == "replay")
        if cache_mode == "stability":
            ctx.write_cache = False
            ctx.bypass_reason = "stability"
        ctx.param_overrides = param_overrides
        ctx.lineage = self._lineage(parent)
        ctx.lineage_blobs = self.store.get_blobs({e.result_hash for e in ctx.lineage.values()})
        ctx.effects_mode = effects
        ctx.fork_node = fork_node.name

        with self.store.write() as conn:
            self.store.create_run(
                conn,
                run_id=child_id,
                pipeline=parent.pipeline,
                pipeline_ref=parent.pipeline_ref,
                parent_run_id=parent.run_id,
                fork_node=fork_node.name,
                fork_position=idx,
                override=override.to_json() if override else None,
                initial_state_hash=parent.initial_state_hash,
                burr_fork_app_id=burr_src[0],
                burr_fork_sequence_id=burr_src[1],
                config=parent.config if config is None else config,
            )
            for node in nodes[:idx]:
                self.store.insert_node(conn, _inherited_row(child_id, node))
            if isinstance(override, OutputOverride) and state_row_ is not None:
                self._write_output_override(conn, child_id, fork_node, override, state_row_)
        first = idx + 1 if isinstance(override, OutputOverride) else idx
        if isinstance(override, OutputOverride):
            builder = builder.initialize_from(
                self.persister,
                resume_at_next_action=True,
                default_state={},
                default_entrypoint=pipeline.entrypoint,
            )
        return self._execute(pipeline, builder, ctx, Recorder(ctx, self.persister, first))

    def check_param(
        self,
        parent: RunRecord,
        nodes: Sequence[NodeRecord],
        idx: int,
        override: Override | None,
    ) -> None:
        """Ask the pipeline's ``param_check`` whether the node can use a param override's value.

        Raises:
            InvalidOverride: it cannot (the message is the pipeline's).
        """
        if not isinstance(override, ParamOverride):
            return
        pipeline = self.pipeline_of(parent)
        if pipeline.param_check is None:
            return
        target = next(n for n in nodes[idx:] if n.name == override.node)
        problem = pipeline.param_check(
            override.node, override.param, override.value, self.node_input(target)
        )
        if problem:
            raise InvalidOverride(
                f"{override.node}.{override.param}={json.dumps(override.value)}: {problem}", ""
            )

    def replay(self, run_id: str, *, at: str | int = 1, effects: str = "recorded") -> RunRecord:
        """Unchanged replay: a fork at ``at`` with no override (expected: all hits, 0 tokens)."""
        return self.fork(run_id, at=at, override=None, effects=effects)

    # -- diff ---------------------------------------------------------------------------------
    def diff(self, run_a: str, run_b: str) -> TrajectoryDiff:
        """Field-level diff of two runs' trajectories (see :mod:`rewind.diff`)."""
        a, b = self.store.get_run(run_a), self.store.get_run(run_b)
        return diff_trajectories(
            a.run_id, self.node_sides(a.run_id), b.run_id, self.node_sides(b.run_id)
        )

    def node_sides(self, run_id: str) -> list[NodeSide]:
        """A run's nodes as the diff sees them (outputs loaded from blobs)."""
        return [
            NodeSide(
                position=n.position,
                name=n.name,
                output=self.node_output(n),
                output_hash=n.output_hash or "",
                tokens=n.tokens,
                outcome=n.cache_outcome,
            )
            for n in self.store.nodes_of(run_id, with_calls=False)
        ]

    def node_output(self, node: NodeRecord) -> dict[str, Any]:
        """The fields a node wrote, decoded ({} for a failed node)."""
        return self.store.resolve_fields(self._output_map(node))

    def _output_map(self, node: NodeRecord) -> dict[str, str]:
        if node.output_hash is None:
            return {}
        fields: dict[str, str] = self.store.get_json(node.output_hash)
        return fields

    def node_input(self, node: NodeRecord) -> dict[str, Any]:
        """The node's input document: its name, the fields it read (decoded), Burr inputs and
        params."""
        doc: dict[str, Any] = self.store.get_json(node.input_hash)
        return doc | {"reads": self.store.resolve_fields(doc.get("reads", {}))}

    def node_state(self, node: NodeRecord) -> dict[str, Any]:
        """Semantic state after the node (Burr's ``__`` keys removed)."""
        row = self._state_row_of(node)
        return semantic_state(row["values"])

    # -- internals ----------------------------------------------------------------------------
    def _context(self, run_id: str, *, read_cache: bool) -> RunContext:
        return RunContext(
            store=self.store,
            run_id=run_id,
            read_cache=read_cache,
            chat_client=self.chat_client,
            on_event=self.on_event,
            clock=self.clock,
        )

    def _state_row_of(self, node: NodeRecord) -> dict[str, Any]:
        row = self.store.load_state_row("", node.src_app_id, node.src_sequence_id)
        if row is None:
            raise ForkError(
                f"state row {node.src_app_id}#{node.src_sequence_id} of node {node.name!r} is "
                "missing",
                "the store is incomplete; record the run again",
            )
        return row

    def _ancestor_params(self, run: RunRecord) -> dict[str, dict[str, Any]]:
        """The param overrides ``run`` executed with: its own and its ancestors' (nearest wins)."""
        chain: list[RunRecord] = []
        current: RunRecord | None = run
        while current is not None and all(r.run_id != current.run_id for r in chain):
            chain.append(current)
            current = self.store.get_run(current.parent_run_id) if current.parent_run_id else None
        merged: dict[str, dict[str, Any]] = {}
        for r in reversed(chain):
            o = r.override or {}
            if o.get("kind") == "param":
                merged.setdefault(o["node"], {})[o["param"]] = o["value"]
        return merged

    def _lineage(self, run: RunRecord) -> dict[str, LineageEntry]:
        """Cache key → the call that produced its result, over the run and its ancestors
        (nearest wins; a side-effecting call served or dry-run does not replace the execution
        it was served from)."""
        chain: list[str] = []
        current: RunRecord | None = run
        while current is not None and current.run_id not in chain:
            chain.append(current.run_id)
            current = self.store.get_run(current.parent_run_id) if current.parent_run_id else None
        lineage: dict[str, LineageEntry] = {}
        for rid in reversed(chain):
            for node in self.store.nodes_of(rid):
                for call in node.calls:
                    if not call.result_hash or call.outcome in ("served", "dry-run"):
                        continue
                    lineage[call.key] = LineageEntry(
                        call.result_hash, call.produced_at, rid, node.position, call.call_index
                    )
        return lineage

    def _write_output_override(
        self,
        conn: Any,
        child_id: str,
        node: NodeRecord,
        override: OutputOverride,
        parent_row: dict[str, Any],
    ) -> None:
        new = encode_value(override.field, override.value)
        self.store.put_blob(conn, new.data)
        fields = dict(parent_row["fields"]) | {override.field: new.digest}
        seq = int(parent_row["sequence_id"])
        self.store.save_state(
            conn,
            state_row(
                partition_key="",
                app_id=child_id,
                sequence_id=seq,
                position=node.name,
                status="completed",
                fields=fields,
                internal=parent_row["internal"],
            ),
        )
        output_doc, output_hash = map_hash(self._output_map(node) | {override.field: new.digest})
        self.store.put_blob(conn, output_doc)
        row = _inherited_row(child_id, node)
        row.update(
            inherited=False,
            sequence_id=seq,
            src_app_id=child_id,
            src_sequence_id=seq,
            output_hash=output_hash,
            state_hash=map_hash(fields)[1],
            cache_outcome="override",
            cache_reason="output-override",
            started_at=time.time(),
        )
        self.store.insert_node(conn, row)

    def _execute(
        self, pipeline: Pipeline, builder: ApplicationBuilder, ctx: RunContext, recorder: Recorder
    ) -> RunRecord:
        app = builder.with_state_persister(recorder).build()
        halt = list(pipeline.halt_after) or pipeline.terminal_nodes()
        ctx.emit("run_started", run_id=ctx.run_id)
        error: str | None = None
        unavailable: RewindError | None = None
        try:
            with activate(ctx):
                app.run(halt_after=halt)
        except Exception as exc:
            recorder.flush()
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
            if isinstance(exc, RewindError):
                error = exc.message
            if isinstance(exc, EndpointUnavailable | SideEffectBlocked | EffectPreconditionFailed):
                unavailable = exc
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: the run cannot finish
            recorder.flush()
            self.store.finish_run(
                ctx.run_id, "interrupted", error=f"interrupted ({type(exc).__name__})"
            )
            ctx.emit("run_finished", run_id=ctx.run_id, status="interrupted", error=None)
            raise
        recorder.flush()
        if error is None and recorder.errors:
            error = recorder.errors[0]
        self.store.finish_run(ctx.run_id, "failed" if error else "completed", error=error)
        run = self.store.get_run(ctx.run_id)
        ctx.emit("run_finished", run_id=run.run_id, status=run.status, error=run.error)
        if unavailable is not None:
            # The environment, not the pipeline, is at fault: say what to set or install.
            unavailable.run_id = run.run_id  # type: ignore[attr-defined]
            raise unavailable
        return run


# -- helpers -----------------------------------------------------------------------------------


def new_run_id() -> str:
    """A new run id (uuid4 hex, 32 characters)."""
    return uuid.uuid4().hex


new_run_id_default = new_run_id


def resolve_node(run: RunRecord, nodes: Sequence[NodeRecord], at: str | int) -> int:
    """Index into ``nodes`` of the node ``at`` names.

    Args:
        at: a node name, ``"name#k"`` (k-th execution, 1-based), or a 1-based node number.
    Raises:
        UnknownNode: no such node in the run.
        ForkError: the run failed before reaching that node.
    """
    if not nodes:
        # A run whose process died (or that was stopped) before its first node finished: "has
        # no node number 1" would send the user hunting for a node that was never recorded.
        why = {
            "interrupted": ": it was interrupted before its first node finished",
            "failed": ": it failed before its first node finished",
            "running": ": it is still running",
        }.get(run.status, f" ({run.status})")
        raise ForkError(
            f"run {run.run_id[:12]} recorded no nodes{why}",
            "record it again (rewind run …), or pick a run that has nodes (rewind runs)",
        )
    names = [n.name for n in nodes]
    listing = ", ".join(f"{i + 1}:{n}" for i, n in enumerate(names))
    if isinstance(at, int) or (isinstance(at, str) and at.strip().isdecimal()):
        number = int(at)
        if 1 <= number <= len(nodes):
            return number - 1
        if number > len(nodes) and run.status in ("failed", "interrupted") and nodes:
            raise ForkError(
                f"run {run.run_id[:12]} {run.status} at node {nodes[-1].name!r} (#{len(nodes)}) "
                f"before reaching node number {number}",
                f"fork at a node it reached: {listing}",
            )
        raise UnknownNode(
            f"run {run.run_id[:12]} has no node number {number} (it has {len(nodes)})",
            f"its nodes: {listing}",
        )
    name, _, occ = str(at).partition("#")
    want = int(occ) if occ.isdigit() else 1
    seen = 0
    for i, n in enumerate(names):
        if n == name:
            seen += 1
            if seen == want:
                return i
    if run.status in ("failed", "interrupted") and nodes:
        last = nodes[-1]
        raise ForkError(
            f"run {run.run_id[:12]} {run.status} at node {last.name!r} (#{len(nodes)}) before "
            f"reaching {str(at)!r}",
            f"fork at a node it reached: {listing}",
        )
    raise UnknownNode(f"run {run.run_id[:12]} has no node {str(at)!r}", f"its nodes: {listing}")


def validate_override(nodes: Sequence[NodeRecord], idx: int, override: Override | None) -> None:
    """Check an override names a param/field the target node has, at or after the fork point.

    Raises:
        InvalidOverride: it does not (the message names the field and lists the valid ones).
    """
    if override is None:
        return
    fork_node = nodes[idx]
    if isinstance(override, OutputOverride):
        if override.node != fork_node.name:
            raise InvalidOverride(
                f"--set-output names node {override.node!r} but the fork is at {fork_node.name!r}",
                f"fork at {override.node} to replace its output",
            )
        return
    later = [n for n in nodes[idx:] if n.name == override.node]
    if not later:
        if any(n.name == override.node for n in nodes[:idx]):
            raise InvalidOverride(
                f"node {override.node!r} runs before the fork node {fork_node.name!r}, so "
                "changing its param would have no effect",
                f"fork at {override.node} instead",
            )
        raise InvalidOverride(
            f"the run has no node {override.node!r}",
            f"nodes from the fork point on: {', '.join(n.name for n in nodes[idx:])}",
        )
    params = sorted({p for n in later for p in n.params})
    if override.param not in params:
        raise InvalidOverride(
            f"node {override.node!r} has no param {override.param!r}",
            f"its params: {', '.join(params) or 'none'}",
        )
    recorded = next(n.params[override.param] for n in later if override.param in n.params)
    was, now = _json_type(recorded), _json_type(override.value)
    if recorded is not None and override.value is not None and was != now:
        raise InvalidOverride(
            f"{override.node}.{override.param} was recorded as a {was} "
            f"({json.dumps(recorded)[:40]}); the new value is a {now}",
            f"pass a {was}"
            + (" (JSON strings need quotes only with --set-output)" if was == "string" else ""),
        )


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "null" if value is None else "object"


def _inherited_row(child_id: str, node: NodeRecord) -> dict[str, Any]:
    return {
        "run_id": child_id,
        "position": node.position,
        "name": node.name,
        "sequence_id": node.sequence_id,
        "src_app_id": node.src_app_id,
        "src_sequence_id": node.src_sequence_id,
        "inherited": True,
        "input_hash": node.input_hash,
        "output_hash": node.output_hash,
        "state_hash": node.state_hash,
        "params_json": json.dumps(node.params, sort_keys=True),
        "latency_ms": 0.0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cache_outcome": "inherited",
        "cache_reason": "fork",
        "determinism": node.determinism,
        "error": node.error,
        "started_at": time.time(),
    }
