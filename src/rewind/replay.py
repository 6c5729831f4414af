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

import json
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from burr.core import Application, ApplicationBuilder
from sqlalchemy import Connection

from rewind import progress
from rewind.call import raised_out_of_a_call
from rewind.canonical import canonical_bytes, sha256_hex
from rewind.context import LineageEntry, RunContext, activate
from rewind.diff import ERROR_FIELD, NodeSide, TrajectoryDiff, diff_trajectories
from rewind.drift import GraphDrift, compare_graphs
from rewind.effects import EffectPreconditionFailed, SideEffectBlocked
from rewind.engine.attach import Pipeline, attach, import_pipeline_module, load_pipeline
from rewind.engine.drive import Launch, drive, plan_launch
from rewind.engine.parent_reads import Lineages, ParentReads
from rewind.engine.plan import (
    ForkPlan,
    InputOverride,
    OutputOverride,
    Override,
    ParamOverride,
    override_target,
    parse_override,
    plan_fork,
    resolve_node,
    validate_override,
)
from rewind.engine.subapps import RunTracker
from rewind.errors import (
    CodeDrift,
    EndpointUnavailable,
    ForkError,
    InvalidOverride,
    RewindError,
    RunBusy,
    StateLoadError,
    UnstorableValue,
)
from rewind.persister import (
    EncodedField,
    FieldEncoder,
    ForkStartLoader,
    RewindPersister,
    field_map,
    map_hash,
)
from rewind.recorder import Recorder, SubRunPath, SubRunSetup, SubRunSource, semantic_state
from rewind.store import NodeRecord, RunRecord, Store, open_store
from rewind.store.records import NOT_ANSWERS, storable_text
from rewind.store.store import state_row
from rewind.store.users import local_user

__all__ = [
    "ForkPlan",
    "InputOverride",
    "OutputOverride",
    "Override",
    "ParamOverride",
    "Pipeline",
    "Rewind",
    "load_pipeline",
    "new_run_id",
    "override_target",
    "parse_override",
    "plan_fork",
    "resolve_node",
    "validate_override",
]

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

    Attributes:
        created_by: the user the runs and forks this session creates belong to
            (:mod:`rewind.store.users`): ``$REWIND_USER`` by default, else None (unowned local
            runs); the API server sets it to the requester for each job.
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
        self.parent_reads = ParentReads(self.store)
        self._pipelines: dict[str, Pipeline] = {}
        self.created_by: str | None = local_user()
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
                "call Rewind.register(pipeline) before forking it, or record the app with a "
                "reference (`rewind run --app module:attr`, or record "
                "rewind.engine.attach(app, ref='module:attr')); a traced chain is replayed with "
                "`rewind replay-trace RUN`",
            )
        return load_pipeline(run.pipeline_ref)

    def finished_run(self, run_id: str) -> RunRecord:
        """The run ``run_id`` (id or unique prefix) once it can be forked: not ``running``
        (its ``last_audit`` is not read: None).

        A run still listed as ``running`` whose process has died since this session opened the
        store (a killed worker) is marked ``interrupted`` first, so a fork says where it stopped
        instead of waiting for a run that can never finish.

        Raises:
            UnknownRun: no such run.
            RunBusy: a live process is still executing the run.
        """
        run = self.store.get_run(run_id, audit=False)  # a fork reads no audit
        if run.status == "running" and self.store.reap_orphans([run.run_id]):
            run = self.store.get_run(run.run_id, audit=False)
        if run.status == "running":
            raise RunBusy(
                f"run {run.run_id} is still running",
                "wait for it to finish (rewind show RUN), then fork it",
            )
        return run

    # -- record -------------------------------------------------------------------------------
    def record(
        self,
        target: Pipeline | Application | ApplicationBuilder,
        state: dict[str, Any] | None = None,
        *,
        inputs: dict[str, Any] | None = None,
        halt_after: Sequence[str] | None = None,
        halt_before: Sequence[str] | None = None,
        run_id: str | None = None,
        config: dict[str, Any] | None = None,
    ) -> RunRecord:
        """Execute a pipeline or a user's Burr app and record every node.

        Calls execute live (the cache is written, not read: reason ``bypass``), so a recorded run
        reflects the model and tools as they are now.

        Args:
            target: a :class:`Pipeline`, a Burr ``ApplicationBuilder`` or a built Burr
                ``Application`` (see :func:`rewind.engine.attach`); its hooks and tracker keep
                working, its state persister is replaced by Rewind's.
            state: the initial Burr state: field → any value :mod:`rewind.serde` stores
                exactly (JSON values, tuples, sets, enums, dates, pydantic models...); None: the
                app's own initial state.
            inputs: Burr runtime inputs (``app.run(inputs=...)``), JSON values; each node gets
                the ones it declares, they enter its input hash, and forks replay them.
            halt_after: stop after one of these nodes (Burr's ``halt_after``); default: the
                pipeline's ``halt_after`` or its terminal nodes.
            halt_before: stop before one of these nodes (Burr's ``halt_before``).
            run_id: the run id (= Burr app id); a new uuid when None.
            config: JSON-like settings shown with the run (model, endpoint...).
        Returns:
            the finished run (status ``completed`` or ``failed``; a failed run is recorded up
            to and including the failing node).
        Raises:
            UnstorableValue: ``state`` holds a value that cannot be stored exactly (nothing is
                written); a node that writes one fails the run at that node with this error.
            RewindError: ``target`` is not something Rewind can attach to.
            InvalidOverride: an input is not JSON, a halt node is unknown, a looping graph
                has no halt condition, or a state field name is not a string (nothing is
                written).
            EndpointUnavailable: the model endpoint cannot be reached (the run is recorded as
                failed at the node that needed it first).
        """
        pipeline = attach(target)
        launch = plan_launch(
            pipeline, inputs=inputs, halt_after=halt_after, halt_before=halt_before
        )
        if state is None:
            state = dict(pipeline.initial_state or {})
        _check_field_names(state)
        self.register(pipeline)
        run_id = run_id or new_run_id()
        # Refuses, before anything is written, a value that could not be stored exactly; the
        # run then starts from the caller's own values (typed, never round-tripped through JSON).
        fields, _ = FieldEncoder().encode(dict(state))
        graph = pipeline.graph_document()  # reads source files: outside the write lock
        # Built before the run row is written: a state Burr refuses leaves nothing behind.
        builder = pipeline.builder(run_id).with_state(**state).with_entrypoint(pipeline.entrypoint)
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
                launch=launch.to_json(),
                created_by=self.created_by,
            )
            self.store.put_run_graph(conn, run_id, graph)
        self.store.put_edges(pipeline.name, pipeline.edges())
        ctx = self._context(run_id, read_cache=False)
        recorder = Recorder(
            ctx,
            self.persister,
            0,
            sub_runs=SubRunSetup(pipeline.name, pipeline.ref, config or {}),
        )
        # The run row, just committed ``running``, counts as the first progress write (as a
        # fork's does): the first node start reads the cancel flag instead of writing a mark.
        # Only now, when the run executes: a run that failed to start (a builder that raised)
        # is never watched by the progress thread.
        progress.run_created(self.store, run_id)
        return self._execute(builder, ctx, recorder, launch)

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
        allow_code_change: bool = False,
        restore: str = "refuse",
        _sub_run: tuple[SubRunPath, Override | None, dict[str, Any]] | None = None,
    ) -> RunRecord:
        """Fork a finished run at a node with at most one override and replay downstream.

        ``run_id`` may name a sub-run (the run of a Burr sub-application a node spawned; see
        :meth:`fork_sub_run`): the fork then re-runs the spawning node of its top-level run.

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
            allow_code_change: fork even when the re-imported pipeline's graph differs from the
                recording where the fork runs it (a node renamed, removed or inserted; a
                transition changed). Changed code of a node is always allowed; either way the
                differences are stored with the fork (:meth:`Store.run_graph`).
            restore: ``refuse`` (default) or ``replace``: whether a ``live`` restore of a
                pinned snapshot may delete files the snapshot does not hold; ``replace`` only
                with ``effects="live"`` (restore never destroys data silently).
        Raises:
            UnknownRun, UnknownNode, InvalidOverride, RunBusy, ForkError: nothing is written.
            SideEffectBlocked, EffectPreconditionFailed, UnstorableValue: raised by the replay
                itself (the fork is recorded as failed at that node).
            StateLoadError: the fork's starting state cannot be loaded in this process (a class
                that no longer imports...); the fork run is recorded ``failed`` with the reason.
            CodeDrift: (a ForkError) the graph drifted and ``allow_code_change`` is False.
            ForkError: after the fork Burr's next action would not be the fork node (a graph
                that drifted with ``allow_code_change``, or one recorded without its graph).
        """
        parent = self.finished_run(run_id)
        if parent.is_sub_run:
            return self.fork_sub_run(
                parent.run_id,
                at=at,
                override=override,
                new_run_id=new_run_id,
                effects=effects,
                cache_mode=cache_mode,
                config=config,
                allow_code_change=allow_code_change,
                restore=restore,
            )
        plan = plan_fork(
            self,
            parent.run_id,
            at=at,
            override=override,
            effects=effects,
            restore=restore,
            cache_mode=cache_mode,
            allow_code_change=allow_code_change,
            parent=parent,
        )
        parent, nodes, idx, fork_node = plan.parent, plan.nodes, plan.index, plan.fork_node
        pipeline, launch, drift = plan.pipeline, plan.launch, plan.drift
        child_id = new_run_id or new_run_id_default()
        builder, burr_src, state_row_ = self._fork_builder(plan, override, child_id)
        ctx, input_overrides = self._fork_context(
            plan, override, child_id, cache_mode=cache_mode, effects=effects, restore=restore
        )
        first = idx + 1 if isinstance(override, OutputOverride) else idx
        sub_setup = self._fork_sub_runs(parent, config, _sub_run)
        recorder = Recorder(
            ctx, self.persister, first, sub_runs=sub_setup, source_run_id=parent.run_id
        )
        start: Application | ApplicationBuilder | Callable[[], ApplicationBuilder] = builder
        if not isinstance(override, OutputOverride):
            # Built before anything is written, so its first action is checked, never assumed.
            # A state that cannot be loaded is not refused here: the fork run records it as its
            # failure (a run that fails to start ends `failed`, never stays `running`).
            try:
                start = _build(builder, recorder)
            except Exception as exc:
                start = _raise_on_start(exc)
            else:
                _check_next_action(start, fork_node.name, nodes[idx - 1].name if idx else None)
        if drift is None:
            ctx.emit(
                "warning",
                run_id=child_id,
                message=f"run {parent.run_id[:12]} was recorded without its graph, so code "
                "and graph drift cannot be checked for this fork",
            )
        self._write_fork_rows(
            plan,
            override,
            child_id,
            burr_src,
            state_row_,
            config=config,
            launch=launch.to_json() | {"effects": effects} | (_sub_run[2] if _sub_run else {}),
        )
        progress.run_created(self.store, child_id)
        if isinstance(override, OutputOverride):
            assert isinstance(builder, ApplicationBuilder)
            # Burr 0.43 hands trackers a fork pointer without an app id when an app resumes its
            # own rows, which its LocalTrackingClient refuses (the fork would fail to start):
            # Burr is told the fork node's source row, and loads the fork's own row instead.
            source = plan.fork_node
            builder = builder.initialize_from(
                ForkStartLoader(self.persister, source.src_app_id, loads=child_id),
                resume_at_next_action=True,
                default_state={},
                default_entrypoint=pipeline.entrypoint,
                fork_from_app_id=source.src_app_id,
                fork_from_sequence_id=source.src_sequence_id,
            )
        return self._execute(start, ctx, recorder, launch, input_overrides)

    def _fork_builder(
        self, plan: ForkPlan, override: Override | None, child_id: str
    ) -> tuple[
        ApplicationBuilder | Callable[[], ApplicationBuilder],
        tuple[str | None, int | None],
        dict[str, Any] | None,
    ]:
        """(the fork's application builder, the Burr (app id, sequence id) it forks from, the
        fork node's state row for an output override)."""
        pipeline = plan.pipeline
        builder: ApplicationBuilder | Callable[[], ApplicationBuilder]
        builder = pipeline.builder(child_id)
        if isinstance(override, OutputOverride):
            return builder, (None, None), self._state_row_of(plan.fork_node, values=False)
        if plan.source is None:
            initial_fields, initial_blobs = self.parent_reads.initial_state(plan.parent)
            first_builder = builder

            def start_from_initial() -> ApplicationBuilder:
                # Loaded when the fork starts, so a value that cannot be loaded fails the fork
                # run (like a Burr load from the persister) instead of leaving no trace.
                initial = self.store.resolve_fields(initial_fields, initial_blobs)
                return first_builder.with_state(**initial).with_entrypoint(pipeline.entrypoint)

            return start_from_initial, (None, None), None
        builder = builder.initialize_from(
            # loads the fork's start only: sub-applications start fresh, as when recorded
            ForkStartLoader(self.persister, str(plan.source[0])),
            resume_at_next_action=True,
            default_state={},
            default_entrypoint=pipeline.entrypoint,
            fork_from_app_id=plan.source[0],
            fork_from_sequence_id=plan.source[1],
        )
        return builder, plan.source, None

    def _fork_context(
        self,
        plan: ForkPlan,
        override: Override | None,
        child_id: str,
        *,
        cache_mode: str,
        effects: str,
        restore: str,
    ) -> tuple[RunContext, dict[str, dict[str, Any]]]:
        """The fork's run context (overrides, lineage, effects mode) and its input overrides."""
        parent = plan.parent
        # A fork of a fork keeps the params and inputs its ancestors changed, plus its own change.
        param_overrides = self._ancestor_overrides(parent, "param")
        input_overrides = self._ancestor_overrides(parent, "input")
        if isinstance(override, ParamOverride):
            param_overrides.setdefault(override.node, {})[override.param] = override.value
        if isinstance(override, InputOverride):
            input_overrides.setdefault(override.node, {})[override.name] = override.value
        ctx = self._context(child_id, read_cache=cache_mode == "replay")
        if cache_mode == "stability":
            ctx.write_cache = False
            ctx.bypass_reason = "stability"
        ctx.param_overrides = param_overrides
        ctx.input_overrides = input_overrides
        (ctx.lineage, ctx.lineage_at, ctx.lineage_slots, ctx.failed_calls), ctx.lineage_blobs = (
            self.parent_reads.lineage(
                parent, lambda ancestors: self._lineages(parent, plan.nodes, ancestors)
            )
        )
        ctx.effects_mode = effects
        ctx.restore_mode = restore
        ctx.fork_node = plan.fork_node.name
        return ctx, input_overrides

    def _fork_sub_runs(
        self,
        parent: RunRecord,
        config: dict[str, Any] | None,
        sub_run: tuple[SubRunPath, Override | None, dict[str, Any]] | None,
    ) -> SubRunSetup:
        """How the fork's sub-applications run: the changes its ancestors made to sub-runs,
        plus this fork's own sub-run change."""
        sub_setup = SubRunSetup(
            parent.pipeline,
            parent.pipeline_ref,
            parent.config if config is None else config,
            source=self._sub_run_source,
        )
        sub_changes = self._ancestor_sub_run_overrides(parent)
        if sub_run is not None and sub_run[1] is not None:
            sub_changes.append((sub_run[0], sub_run[1].to_json()))
        for path, doc in sub_changes:
            params, changed = sub_setup.overrides.setdefault(path, ({}, {}))
            kind, node, name = override_target(doc)
            (params if kind == "param" else changed).setdefault(node, {})[name] = doc["value"]
        return sub_setup

    def _write_fork_rows(
        self,
        plan: ForkPlan,
        override: Override | None,
        child_id: str,
        burr_src: tuple[str | None, int | None],
        state_row_: dict[str, Any] | None,
        *,
        config: dict[str, Any] | None,
        launch: dict[str, Any],
    ) -> None:
        """One transaction: the fork's run row, its graph and drift, its inherited nodes and an
        output override's node row."""
        parent, nodes, idx, fork_node, drift = (
            plan.parent,
            plan.nodes,
            plan.index,
            plan.fork_node,
            plan.drift,
        )
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
                launch=launch,
                created_by=self.created_by,
            )
            drift_doc = (drift or GraphDrift()).to_json() | {
                "checked": drift is not None,
                "allowed": bool(drift is not None and drift.structural),
            }
            self.store.put_run_graph(conn, child_id, plan.graph, drift_doc, plan.graph_bytes)
            for node in nodes[:idx]:
                self.store.insert_node(conn, _inherited_row(child_id, node))
            if isinstance(override, OutputOverride) and state_row_ is not None:
                assert plan.output is not None
                self._write_output_override(
                    conn, child_id, fork_node, override, plan.output, state_row_
                )

    # -- sub-runs (Burr sub-applications) -------------------------------------------------------
    def fork_sub_run(
        self,
        run_id: str,
        *,
        at: str | int,
        override: Override | None = None,
        **fork_options: Any,
    ) -> RunRecord:
        """Fork a sub-run (the run of a Burr sub-application: a ``MapStates``/``MapActions``
        child or a recursive app) at one of its nodes, with at most one change.

        A sub-application only exists inside the node that spawned it, so this forks the
        sub-run's top-level run at that node: the node re-executes, its other sub-runs and the
        changed sub-run's nodes before ``at`` replay from the cache (0 requests), ``at`` and the
        sub-run's later nodes run with the change, and the top-level run's downstream nodes
        replay through the cache (a node whose input the changed sub-run's result changed
        misses). The recorded top-level run and sub-run are never changed (rule 7).

        Args:
            run_id: the sub-run (id or unique prefix).
            at: a node of the sub-run (name, ``name#k`` or 1-based number).
            override: a :class:`ParamOverride` or :class:`InputOverride` of a node of the
                sub-run at or after ``at``; None replays the sub-run unchanged.
            fork_options: :meth:`fork`'s other options (``new_run_id``, ``effects``...).
        Returns:
            the new fork of the top-level run; :meth:`sub_run_at` finds the new sub-run in it
            (``launch["sub_run_fork"]`` says which sub-run was forked and how).
        Raises:
            InvalidOverride: an output override (replacing a sub-run node's output is not
                supported), or one :meth:`fork` would refuse; UnknownRun, UnknownNode,
                RunBusy, ForkError as :meth:`fork`. Nothing is written.
        """
        run = self.finished_run(run_id)
        nodes = self.store.nodes_of(run.run_id)
        idx = resolve_node(run, nodes, at)
        if isinstance(override, OutputOverride):
            raise InvalidOverride(
                "replacing the output of a sub-run's node is not supported",
                "change one of its runtime inputs (--set-input) or params (--set), or fork "
                "the spawning run with --set-output on the spawning node",
            )
        validate_override(nodes, idx, override, node_inputs=self.node_runtime_inputs)
        path: list[tuple[int, str]] = []
        top = run
        while top.spawning_run_id is not None:
            path.insert(0, (int(top.spawning_position or 0), str(top.spawn_key)))
            top = self.store.get_run(top.spawning_run_id)
        top_nodes = self.store.nodes_of(top.run_id, with_calls=False)
        number = next((i + 1 for i, n in enumerate(top_nodes) if n.position == path[0][0]), None)
        if number is None:
            raise ForkError(
                f"run {top.run_id[:12]} has no node at position {path[0][0]}, which spawned "
                f"sub-run {run.run_id[:12]}",
                "the store is incomplete; record the run again",
            )
        doc = {
            "sub_run_fork": {
                "run_id": run.run_id,
                "path": [list(step) for step in path],
                "at": nodes[idx].name,
                "override": override.to_json() if override is not None else None,
            }
        }
        return self.fork(
            top.run_id,
            at=number,
            override=None,
            _sub_run=(tuple(path), override, doc),
            **fork_options,
        )

    def sub_run_at(self, run_id: str, path: Sequence[Sequence[Any]]) -> RunRecord | None:
        """The sub-run of ``run_id`` at ``path`` (``[[node position, spawn key], …]``, as in a
        fork's ``launch["sub_run_fork"]["path"]``), or None."""
        current: RunRecord | None = self.store.get_run(run_id)
        for position, key in path:
            if current is None:
                return None
            current = next(
                (
                    r
                    for r in self.node_sub_runs(current.run_id).get(int(position), [])
                    if r.spawn_key == str(key)
                ),
                None,
            )
        return current

    def node_sub_runs(self, run_id: str) -> dict[int, list[RunRecord]]:
        """The sub-runs each node of ``run_id`` spawned (see :func:`node_sub_runs`)."""
        return node_sub_runs(self.store, run_id)

    def _sub_run_source(
        self, source_run_id: str, position: int, name: str, key: str
    ) -> SubRunSource | None:
        """The sub-run a fork's new sub-run replays: the one the source trajectory's node at
        ``position`` (named ``name``) spawned with spawn key ``key``."""
        nodes = self.store.nodes_of(source_run_id, with_calls=False)
        node = next((n for n in nodes if n.position == position), None)
        if node is None or node.name != name:
            return None
        run = next(
            (r for r in self.store.sub_runs(node.src_app_id, position) if r.spawn_key == key),
            None,
        )
        if run is None:
            return None
        lineage, at, slots, _failed = self._lineages(run)  # a sub-run's failures run again
        blobs = self.store.get_blobs({e.result_hash for e in lineage.values()})
        return SubRunSource(run.run_id, lineage, at, slots, blobs)

    def check_drift(
        self,
        parent: RunRecord,
        nodes: Sequence[NodeRecord],
        idx: int,
        current_graph: dict[str, Any],
        *,
        output_override: bool = False,
        allow_code_change: bool = False,
        current_hash: str | None = None,
    ) -> GraphDrift | None:
        """Compare the pipeline as re-imported now with what ``parent`` recorded, for a fork at
        ``nodes[idx]``.

        Covers the nodes the fork inherits, the node Burr resumes from and every node reachable
        after it (see :func:`rewind.drift.compare_graphs`); a node's code is compared with the
        code of the run that produced its row (an inherited row's producer is an ancestor).

        Args:
            current_graph: :meth:`Pipeline.graph_document` of the re-imported pipeline.
            output_override: the fork replaces the fork node's output (Burr resumes after it).
            current_hash: the hash of ``current_graph``'s canonical bytes, when known.
        Returns:
            the drift (falsy when nothing changed), or None when ``parent`` was recorded
            without its graph (a store older than graph recording): drift cannot be checked.
        Raises:
            CodeDrift: structural drift and ``allow_code_change`` is False; nothing is written.
        """
        producers = [parent.run_id, *(n.src_app_id for n in nodes[idx:])]
        hashes = self.parent_reads.graph_hashes(parent, producers)
        if parent.run_id not in hashes:
            return None
        if current_hash is None:
            current_hash = sha256_hex(canonical_bytes(current_graph))
        if all(h == current_hash for h in hashes.values()):
            # Every recorded graph the fork touches is the current one: nothing can differ
            # (compare_graphs of equal documents), and no document needs reading.
            return GraphDrift()
        graphs = self.store.run_graphs(producers)
        recorded = graphs.get(parent.run_id)
        if recorded is None:
            return None
        produced: dict[str, str] = {}
        for n in nodes[idx:]:
            g = graphs.get(n.src_app_id)
            if g is not None and n.name in g.document["nodes"]:
                produced.setdefault(n.name, g.document["nodes"][n.name])
        upto = idx + 1 if output_override else idx
        drift = compare_graphs(
            recorded.document,
            current_graph,
            inherited=[n.name for n in nodes[:upto]],
            resume_from=nodes[upto - 1].name if upto else None,
            produced_code=produced,
        )
        if drift.structural and not allow_code_change:
            raise CodeDrift(
                f"pipeline {parent.pipeline!r} changed since run {parent.run_id[:12]} was "
                f"recorded: {'; '.join(drift.structural)}",
                "restore the pipeline as recorded, or fork anyway with --allow-code-change "
                "(allow_code_change=True)",
                drift.structural,
            )
        return drift

    def replay(
        self, run_id: str, *, at: str | int = 1, effects: str = "recorded", restore: str = "refuse"
    ) -> RunRecord:
        """Unchanged replay: a fork at ``at`` with no override (expected: all hits, 0 tokens)."""
        return self.fork(run_id, at=at, override=None, effects=effects, restore=restore)

    # -- diff ---------------------------------------------------------------------------------
    def diff(self, run_a: str, run_b: str) -> TrajectoryDiff:
        """Field-level diff of two runs' trajectories (see :mod:`rewind.diff`)."""
        a, b = self.store.get_run(run_a), self.store.get_run(run_b)
        for run in (a, b):
            self._serializers_of(run.run_id, run)
        return diff_trajectories(
            a.run_id, self.node_sides(a.run_id), b.run_id, self.node_sides(b.run_id)
        )

    def node_sides(self, run_id: str) -> list[NodeSide]:
        """A run's nodes as the diff sees them (outputs loaded from blobs, a failed node's error
        under :data:`rewind.diff.ERROR_FIELD`; ``code`` is the fingerprint recorded by the run
        that produced each row, "" when it recorded none)."""
        nodes = self.store.nodes_of(run_id, with_calls=False)
        graphs = self.store.run_graphs({n.src_app_id for n in nodes})
        return [
            NodeSide(
                position=n.position,
                name=n.name,
                output=self.node_output(n) | ({ERROR_FIELD: n.error} if n.error else {}),
                failed=bool(n.error),
                output_hash=n.output_hash or "",
                tokens=n.tokens,
                outcome=n.cache_outcome,
                code=graphs[n.src_app_id].document["nodes"].get(n.name, "")
                if n.src_app_id in graphs
                else "",
                helpers=graphs[n.src_app_id].document["helpers"].get(n.name, {})
                if n.src_app_id in graphs and "helpers" in graphs[n.src_app_id].document
                else None,
            )
            for n in nodes
        ]

    def node_output(self, node: NodeRecord) -> dict[str, Any]:
        """The fields a node wrote, decoded ({} for a failed node)."""
        self._serializers_of(node.run_id)
        return self.store.resolve_fields(self._output_map(node))

    def _output_map(self, node: NodeRecord) -> dict[str, str]:
        if node.output_hash is None:
            return {}
        fields: dict[str, str] = self.store.get_json(node.output_hash)
        return fields

    def node_input(self, node: NodeRecord) -> dict[str, Any]:
        """The node's input document: its name, the fields it read (decoded), Burr inputs and
        params."""
        self._serializers_of(node.run_id)
        doc: dict[str, Any] = self.store.get_json(node.input_hash)
        return doc | {"reads": self.store.resolve_fields(doc.get("reads", {}))}

    def node_runtime_inputs(self, node: NodeRecord) -> dict[str, Any]:
        """The Burr runtime inputs a node received, as recorded in its input document."""
        inputs: dict[str, Any] = self.store.get_json(node.input_hash).get("inputs", {})
        return inputs

    def node_state(self, node: NodeRecord) -> dict[str, Any]:
        """Semantic state after the node (Burr's ``__`` keys removed)."""
        self._serializers_of(node.run_id)
        row = self._state_row_of(node)
        return semantic_state(row["values"])

    # -- internals ----------------------------------------------------------------------------
    def _serializers_of(self, run_id: str, run: RunRecord | None = None) -> None:
        """Import the run's pipeline module once, so that Burr serializers registered there
        (``register_type_to_pickle``...) can load its values in a command that only reads."""
        done: set[str] = self.__dict__.setdefault("_serde_runs", set())
        if run_id in done:
            return
        done.add(run_id)
        ref = (run or self.store.get_run(run_id)).pipeline_ref
        if ref:
            import_pipeline_module(ref)

    def _context(self, run_id: str, *, read_cache: bool) -> RunContext:
        return RunContext(
            store=self.store,
            run_id=run_id,
            read_cache=read_cache,
            chat_client=self.chat_client,
            on_event=self.on_event,
            clock=self.clock,
        )

    def _state_row_of(self, node: NodeRecord, *, values: bool = True) -> dict[str, Any]:
        row = self.store.load_state_row("", node.src_app_id, node.src_sequence_id, values=values)
        if row is None:
            raise ForkError(
                f"state row {node.src_app_id}#{node.src_sequence_id} of node {node.name!r} is "
                "missing",
                "the store is incomplete; record the run again",
            )
        return row

    def _ancestor_overrides(self, run: RunRecord, kind: str) -> dict[str, dict[str, Any]]:
        """The ``param`` or ``input`` overrides ``run`` executed with, ``{node: {name: value}}``:
        its own and its ancestors' (nearest wins)."""
        chain = [run, *self.store.ancestors(run)]
        merged: dict[str, dict[str, Any]] = {}
        for r in reversed(chain):
            o = r.override or {}
            if o.get("kind") == kind:
                merged.setdefault(o["node"], {})[o["param" if kind == "param" else "name"]] = o[
                    "value"
                ]
        return merged

    def _ancestor_sub_run_overrides(
        self, run: RunRecord
    ) -> list[tuple[SubRunPath, dict[str, Any]]]:
        """The changes forks of sub-runs made in ``run`` and its ancestors, oldest first:
        (sub-run path, override document); a fork of such a fork keeps them."""
        chain: list[RunRecord] = []
        current: RunRecord | None = run
        while current is not None and all(r.run_id != current.run_id for r in chain):
            chain.append(current)
            current = self.store.get_run(current.parent_run_id) if current.parent_run_id else None
        found: list[tuple[SubRunPath, dict[str, Any]]] = []
        for r in reversed(chain):
            doc = r.launch.get("sub_run_fork") or {}
            if doc.get("override"):
                path = tuple((int(p), str(k)) for p, k in doc["path"])
                found.append((path, doc["override"]))
        return found

    def _lineage(self, run: RunRecord) -> dict[str, LineageEntry]:
        """Cache key → the call that produced its result, over the run and its ancestors
        (nearest wins; a side-effecting call served or dry-run does not replace the execution
        it was served from)."""
        return self._lineages(run)[0]

    def _lineages(
        self,
        run: RunRecord,
        nodes: Sequence[NodeRecord] | None = None,
        ancestors: Sequence[RunRecord] | None = None,
    ) -> Lineages:
        """:meth:`_lineage`, the same calls by (node position, cache key): a looped node that
        sends one request in every execution gets each execution's own answer back; the
        executed side-effecting calls by slot (node position, call index), whose recorded
        pre-state a ``live`` re-execution verifies whatever its arguments; and the model calls
        that raised by (node position, cache key) (``failed`` rows: a replay raises their
        recorded failure again), the nearest run's row at a place winning, answer or failure;
        only those the lineage got a model answer after (:func:`_recovered`).

        ``nodes``: ``run``'s own node executions with their calls when the caller read them
        already (a fork's plan has them): not read again; ``ancestors``: likewise, ``run``'s
        ancestors (:meth:`Store.ancestors`)."""
        if ancestors is None:
            ancestors = self.store.ancestors(run)
        chain = [run.run_id, *(a.run_id for a in ancestors)]
        lineage: dict[str, LineageEntry] = {}
        at: dict[tuple[int, str], LineageEntry] = {}
        slots: dict[tuple[int, int], LineageEntry] = {}
        failed: dict[tuple[int, str], LineageEntry] = {}
        answered: dict[str, tuple[int, int]] = {}  # run id -> its last model answer's place
        raised_out: set[tuple[str, int]] = set()  # (run id, position) of nodes a failure ended
        for rid in reversed(chain):
            of_run = nodes if nodes is not None and rid == run.run_id else None
            for node in of_run if of_run is not None else self.store.nodes_of(rid):
                if node.cache_outcome == "failed" and raised_out_of_a_call(
                    node.cache_reason, any(c.outcome == "failed" for c in node.calls)
                ):
                    raised_out.add((rid, node.position))
                for call in node.calls:
                    if not call.result_hash:
                        continue
                    entry = LineageEntry(
                        call.result_hash, call.produced_at, rid, node.position, call.call_index
                    )
                    if call.outcome == "failed":
                        failed[(node.position, call.key)] = entry
                        at.pop((node.position, call.key), None)
                    if call.outcome in NOT_ANSWERS:
                        continue
                    lineage[call.key] = entry
                    at[(node.position, call.key)] = entry
                    failed.pop((node.position, call.key), None)
                    if call.determinism == "side-effect":
                        slots[(node.position, call.call_index)] = entry
                    if call.kind == "llm":
                        place = (node.position, call.call_index)
                        answered[rid] = max(answered.get(rid, place), place)
        return lineage, at, slots, _recovered(failed, answered, raised_out)

    def _write_output_override(
        self,
        conn: Any,
        child_id: str,
        node: NodeRecord,
        override: OutputOverride,
        new: EncodedField,
        parent_row: dict[str, Any],
    ) -> None:
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
        self,
        start: Application | ApplicationBuilder | Callable[[], ApplicationBuilder],
        ctx: RunContext,
        recorder: Recorder,
        launch: Launch,
        input_overrides: dict[str, dict[str, Any]] | None = None,
    ) -> RunRecord:
        """Build the Burr app (``start``: the app, a builder or a factory of one), drive it as
        ``launch`` says
        (inputs, halt conditions; ``input_overrides``: node → input → value) and
        finish the run row; the run always ends ``completed``, ``failed`` or ``interrupted``.

        Raises:
            StateLoadError, or another RewindError: the app could not be built (its state could
                not be loaded); the run is recorded ``failed`` with the reason first.
            UnstorableValue, EndpointUnavailable, SideEffectBlocked, EffectPreconditionFailed:
                the run stopped at a node for that reason and is recorded ``failed``.
        """
        try:
            app = start if isinstance(start, Application) else _build(start, recorder)
        except Exception as exc:
            # Loading the fork's state happens here (Burr loads from the persister in build()):
            # a failure must end the run, never leave it `running`.
            failure = (
                exc.for_run(ctx.run_id)
                if isinstance(exc, RewindError)
                else ForkError(
                    f"the run could not start: {_first_line(exc)}", "", run_id=ctx.run_id
                )
            )
            self.store.finish_run(ctx.run_id, "failed", error=failure.message)
            ctx.emit("run_finished", run_id=ctx.run_id, status="failed", error=failure.message)
            raise failure from exc
        ctx.emit("run_started", run_id=ctx.run_id)
        error: str | None = None
        unavailable: RewindError | None = None
        cancelled: progress.RunCancelled | None = None
        try:
            with activate(ctx):
                drive(app, launch, input_overrides)
        except progress.RunCancelled as exc:
            recorder.close()
            cancelled = exc
        except Exception as exc:
            recorder.close()
            error = _first_line(exc)
            if isinstance(exc, RewindError):
                error = exc.message
            if isinstance(
                exc,
                EndpointUnavailable
                | SideEffectBlocked
                | EffectPreconditionFailed
                | UnstorableValue
                | StateLoadError,
            ):
                unavailable = exc
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: the run cannot finish
            recorder.close()
            self.store.finish_run(
                ctx.run_id, "interrupted", error=f"interrupted ({type(exc).__name__})"
            )
            ctx.emit("run_finished", run_id=ctx.run_id, status="interrupted", error=None)
            raise
        status, final = _final_status(error, recorder.errors, cancelled)
        failures = len(recorder.errors)
        # The run row is finished in the transaction of its last rows (one commit less); if
        # that commit fails, the run is finished failed with the reason below.
        finished: list[RunRecord | None] = []

        def finish(conn: Connection) -> None:
            self.store.finish_run_in(conn, ctx.run_id, status, final)
            finished.append(self.store.run_in(conn, ctx.run_id))  # read in the same transaction

        recorder.close(after=finish)
        if len(recorder.errors) > failures:
            status, final = _final_status(error, recorder.errors, cancelled)
            self.store.finish_run(ctx.run_id, status, error=final)
            finished.clear()  # that commit failed: the row is the one just finished
        else:
            progress.run_ended(ctx.run_id)  # after the commit (see Store.finish_run_in)
        run = finished[0] if finished else None
        if run is None:
            run = self.store.get_run(ctx.run_id, audit=False)  # just finished: never audited yet
        ctx.emit("run_finished", run_id=run.run_id, status=run.status, error=run.error)
        if unavailable is not None:
            # The environment, not the pipeline, is at fault: say what to set or install.
            raise unavailable.for_run(run.run_id) from unavailable
        return run


# -- helpers -----------------------------------------------------------------------------------


def node_sub_runs(store: Store, run_id: str) -> dict[int, list[RunRecord]]:
    """The runs of the Burr sub-applications each node of ``run_id`` spawned, by node position
    (in spawn-key order); an inherited node's are those of the run that executed it."""
    found: dict[int, list[RunRecord]] = {}
    for r in store.sub_runs(run_id):
        found.setdefault(int(r.spawning_position or 0), []).append(r)
    for n in store.nodes_of(run_id, with_calls=False):
        if n.inherited and n.src_app_id != run_id:
            subs = store.sub_runs(n.src_app_id, n.position)
            if subs:
                found[n.position] = subs
    return found


def _final_status(
    error: str | None, recorder_errors: list[str], cancelled: progress.RunCancelled | None
) -> tuple[str, str | None]:
    """(status, error) a run ends with: ``cancelled`` when it was, ``failed`` with the first
    error (the pipeline's, else the recorder's), else ``completed``."""
    if cancelled is not None:
        return progress.CANCELLED, cancelled.message
    error = error if error is not None else (recorder_errors[0] if recorder_errors else None)
    return ("failed" if error else "completed"), error


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return storable_text(f"{type(exc).__name__}: {text[0] if text else ''}")


def new_run_id() -> str:
    """A new run id (uuid4 hex, 32 characters)."""
    return uuid.uuid4().hex


new_run_id_default = new_run_id


def _build(
    builder: ApplicationBuilder | Callable[[], ApplicationBuilder], recorder: Recorder
) -> Application:
    """Build the Burr app from a builder (or a factory of one) with ``recorder`` attached; Burr
    loads a fork's starting state here."""
    if not isinstance(builder, ApplicationBuilder):
        builder = builder()
    builder = builder.with_state_persister(recorder)
    # __context.tracker inside the app's actions: its copies record sub-applications
    return builder.with_tracker(RunTracker(builder.tracker, recorder)).build()


def _raise_on_start(exc: Exception) -> Callable[[], ApplicationBuilder]:
    """A builder factory that raises ``exc``: the failure of an app built ahead of time,
    surfaced where the run starts (so it is recorded on the run)."""

    def start() -> ApplicationBuilder:
        raise exc

    return start


def _check_next_action(app: Application, fork_node: str, resumed_after: str | None) -> None:
    """Refuse a fork whose first action is not the fork node.

    Burr picks the next action from the persisted prior step and the *current* transitions, so a
    pipeline edited since the recording can silently resume elsewhere: report ``completed``
    without running the node asked for, or run one nobody asked for.

    Raises:
        ForkError: the next action is another node (or none).
    """
    nxt = app.get_next_action()
    if nxt is not None and nxt.name == fork_node:
        return
    where = f"after {resumed_after!r}" if resumed_after else "from the entrypoint"
    found = f"node {nxt.name!r}" if nxt is not None else "no node at all"
    raise ForkError(
        f"resuming {where}, the pipeline would run {found} next, not the fork node {fork_node!r}",
        "the pipeline's graph changed since the run was recorded: restore it, or fork at the "
        "node it now runs",
    )


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


def _check_field_names(state: dict[Any, Any]) -> None:
    """Refuse a state whose field names are not all strings (Burr's ``with_state`` would raise
    a bare ``TypeError`` for them).

    Raises:
        InvalidOverride: a field name is not a string (nothing is written).
    """
    odd = [name for name in state if not isinstance(name, str)]
    if odd:
        raise InvalidOverride(
            f"state field names must be strings; got {odd[0]!r} ({type(odd[0]).__name__})",
            "name every field of the state with a string",
            field="state",
        )


def _recovered(
    failed: dict[tuple[int, str], LineageEntry],
    answered: dict[str, tuple[int, int]],
    raised_out: set[tuple[str, int]],
) -> dict[tuple[int, str], LineageEntry]:
    """The model calls of ``failed`` that a replay raises again: those the run that recorded
    them got a model answer after (``answered``: run id → (node position, call index) of its
    last answered model call), so it recovered (a node that caught the failure and asked
    again). A failure after its run's last answer is sent again: the endpoint never answered
    after it (down at the recording), and a fork at that node, the endpoint answering now,
    would raise it again at every try. So is one of a node that raised out of a model-call
    failure (``raised_out``: (run id, node position)), whatever was answered after it (a
    ``finally`` that asked the model): that node failed because its endpoint did."""
    return {
        where: entry
        for where, entry in failed.items()
        if (entry.position, entry.call_index) < answered.get(entry.run_id, (-1, -1))
        and (entry.run_id, entry.position) not in raised_out
    }
