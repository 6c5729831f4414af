"""Recording: Burr lifecycle hooks that write one node row per step.

The recorder is handed to Burr as its state persister in "lifecycle adapter" mode, so the node
row, its calls, the cache entries they produced and the content-addressed state row are written
together, in one transaction: a crash can never leave a node without its state or the other way
round. Rows are batched (group commit): a node that finishes ``flush_interval_ms`` or more after
the last commit is committed at once, inside its hook (a slow LLM node is written as soon as it
finishes); otherwise its rows wait, and a flusher thread commits them
when the oldest waiting node is ``flush_interval_ms`` old, even while the next node is still
running. So a chain of cheap nodes shares one commit, and a process killed at any moment
(``kill -9``) loses at most the nodes that finished in the last ``flush_interval_ms`` plus the
duration of the commit under way (see README, "How it works" → Record). A commit's small blobs
go to two compressed packs, its documents and its call payloads (``blob_packs``, SQLite), written
in the same transaction as the rows that name them. Hooks never raise into Burr (a raising hook
aborts the run before the state is saved); failures are collected in :attr:`Recorder.errors` and
fail the run afterwards.

Hashes (all sha256 hex of canonical JSON): every semantic state field is hashed once as a blob;
a node's ``output_hash`` is the hash of the map {written field: field hash} and ``state_hash`` the
hash of {field: field hash} over the whole semantic state (Merkle style: equal iff every field's
content is equal), and ``input_hash`` covers the node's name, the hashes of the fields it reads,
its Burr inputs and its params.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import logging
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from burr.core import State
from burr.core.action import Action
from burr.lifecycle import PostApplicationCreateHook, PostRunStepHook, PreRunStepHook
from sqlalchemy import Connection

from rewind import progress
from rewind.cache import release_flights
from rewind.canonical import CanonicalError, canonical_bytes, sha256_hex
from rewind.context import (
    LineageEntry,
    NodeScope,
    RunContext,
    current,
    current_lane,
    enter,
    leave,
)
from rewind.drift import graph_document
from rewind.errors import UnstorableValue
from rewind.persister import (
    BURR_INTERNAL_PREFIX,
    FieldEncoder,
    RewindPersister,
    field_map,
    map_hash,
    plain_map_bytes,
    plain_text,
    state_values,
)
from rewind.serde import encode
from rewind.store.records import CallRecord, storable_text
from rewind.store.store import Store, WriteBatch, call_rows, pack_groups, state_row

logger = logging.getLogger(__name__)

FLUSH_INTERVAL_MS = 50.0
"""Longest time a finished node's rows wait in memory before their commit starts (ms)."""

__all__ = [
    "BURR_INTERNAL_PREFIX",
    "Recorder",
    "SubRunSetup",
    "SubRunSource",
    "node_outcome",
    "semantic_state",
]

SubRunPath = tuple[tuple[int, str], ...]
"""Where a sub-run sits below its top-level run: (spawning node position, spawn key) per level."""


@dataclass(frozen=True)
class SubRunSource:
    """The sub-run of the source trajectory that a fork's sub-run replays: its calls serve the
    new sub-run's calls first (as a fork's parent serves the fork)."""

    run_id: str
    lineage: dict[str, LineageEntry]
    lineage_at: dict[tuple[int, str], LineageEntry]
    lineage_slots: dict[tuple[int, int], LineageEntry]
    lineage_blobs: dict[str, bytes]


@dataclass
class SubRunSetup:
    """How a run records the Burr sub-applications its nodes spawn, as runs of their own.

    Args:
        pipeline: pipeline name stored on every sub-run (the top-level run's).
        pipeline_ref: its ``module:attribute`` reference.
        config: settings stored on every sub-run (the top-level run's).
        source: ``(source run id, node position, node name, spawn key) -> SubRunSource | None``:
            the recorded sub-run a fork's new sub-run replays (None: no such sub-run; the
            sub-run then replays from its spawning run's lineage).
        overrides: ``{path: (param overrides, input overrides)}``: the change a fork of a
            sub-run carries into the sub-run at ``path`` (``{node: {name: value}}`` each).
    """

    pipeline: str
    pipeline_ref: str
    config: Mapping[str, Any] = field(default_factory=dict)
    source: Callable[[str, int, str, str], SubRunSource | None] | None = None
    overrides: dict[SubRunPath, tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]] = (
        field(default_factory=dict)
    )


class _Family:
    """The recorders of one top-level run and of its open sub-runs, by Burr app id and run id."""

    def __init__(self, root: Recorder) -> None:
        self.root = root
        self.lock = threading.Lock()
        self.by_app: dict[str, Recorder] = {}
        self.by_run: dict[str, Recorder] = {root.ctx.run_id: root}


def semantic_state(values: dict[str, Any]) -> dict[str, Any]:
    """State minus Burr's internal ``__`` keys (DESIGN rule 1)."""
    return {k: v for k, v in values.items() if not k.startswith(BURR_INTERNAL_PREFIX)}


def runtime_inputs(action: Action, inputs: dict[str, Any] | None) -> dict[str, Any]:
    """The Burr runtime inputs ``action`` receives out of ``inputs``: the ones it declares,
    without the ``__`` inputs Burr injects (``__context``, ``__tracer``).

    Burr's ``step`` hands hooks the inputs already filtered, ``astep`` the raw ones; filtering
    here makes a node's input hash the same either way.
    """
    given = [k for k in inputs or () if not k.startswith(BURR_INTERNAL_PREFIX)]
    if not given:
        return {}  # most nodes take no runtime input: Burr's input sets are not computed
    assert inputs is not None
    required, optional = action.optional_and_required_inputs
    declared = required | optional
    return {k: _input_doc(inputs[k]) for k in given if k in declared}


def bound_params(action: Action) -> dict[str, Any]:
    """Values bound to a function action with ``.bind(...)`` (they shape its output as much as
    its inputs do, so they enter its input hash)."""
    bound = getattr(action, "_bound_params", None) or {}  # FunctionBasedAction's, Burr 0.43
    return {k: _input_doc(v) for k, v in bound.items()}


def _input_doc_bytes(
    action: Action, reads: dict[str, str], inputs: dict[str, Any], params: dict[str, Any]
) -> bytes:
    """The canonical bytes a node's ``input_hash`` hashes: its name, the hashes of the fields it
    reads (``reads``), its runtime ``inputs``, its ``params`` and its bound values."""
    bound = bound_params(action)
    name = action.name
    if not inputs and not params and not bound and plain_text(name):
        # Most nodes: written directly (the bytes canonical_bytes writes for this document)
        reads_doc = plain_map_bytes(reads)
        if reads_doc is not None:
            return b'{"inputs":{},"node":"%s","params":{},"reads":%s}' % (name.encode(), reads_doc)
    doc = {"node": name, "reads": reads, "inputs": inputs, "params": params}
    if bound:
        doc["bound"] = bound
    return canonical_bytes(doc)


def _input_doc(value: Any) -> Any:
    """The exact document of a Burr input (:func:`rewind.serde.encode`), so that inputs of
    different types hash differently."""
    try:
        doc = encode(value, path="input")
        canonical_bytes(doc)
        return doc
    except (UnstorableValue, CanonicalError):
        # A live object (a client, a connection) passed as a Burr input: hash its type only.
        return {"$unhashable": type(value).__name__}


class Recorder(PreRunStepHook, PostRunStepHook, PostApplicationCreateHook):
    """Burr hooks recording every node of a run into Rewind's store.

    Burr sub-applications (``MapStates``/``MapActions`` children, which inherit the parent's
    persister and tracker, and recursive apps built with the parent's tracker,
    ``__context.tracker.copy()``) reach these hooks too: each is recorded as a sub-run of its own
    (its nodes, calls, states, hashes), linked to the node that spawned it, and the spawning
    node's cache outcome and tokens include its sub-runs' calls.

    Args:
        ctx: the run context (store, run id, overrides, cache policy).
        persister: writes the content-addressed state rows.
        first_position: position (0-based) of the first node this recorder will see; a fork's
            inherited nodes occupy the positions before it.
        sub_runs: how sub-applications are recorded (None: their steps and calls belong to the
            spawning node, as in a run recorded before sub-runs existed).
        source_run_id: the run a fork replays (its sub-runs serve the fork's sub-runs).
    """

    def __init__(
        self,
        ctx: RunContext,
        persister: RewindPersister,
        first_position: int = 0,
        *,
        flush_interval_ms: float = FLUSH_INTERVAL_MS,
        sub_runs: SubRunSetup | None = None,
        source_run_id: str | None = None,
        _family: _Family | None = None,
        _app_id: str | None = None,
        _path: SubRunPath = (),
    ) -> None:
        self.ctx = ctx
        self.app_id = _app_id or ctx.run_id  # the Burr app id of the app this recorder records
        self.sub_run_setup = sub_runs
        self.source_run_id = source_run_id
        self.path = _path
        self.family = _family or _Family(self)
        self.open_sub_runs: dict[int, list[Recorder]] = {}  # node position -> its open sub-runs
        self.sub_calls: list[CallRecord] = []  # every call of this sub-run and its own sub-runs
        self.failed = False
        self._seen: set[tuple[int, str]] = set()  # (sequence id, hook) already handled
        self._token: contextvars.Token[RunContext | None] | None = None
        self.persister = persister
        self.position = first_position
        self.flush_interval_ms = flush_interval_ms
        self.errors: list[str] = []
        self.executed: list[str] = []
        self.encoder = FieldEncoder()
        self.batch = WriteBatch()
        self._last_flush = time.perf_counter()
        # _lock guards batch, _due and _closed; _write_lock keeps commits one at a time and in
        # order (taken before _lock, never while holding it).
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._due: float | None = None  # perf_counter time the waiting rows must be committed by
        self._closed = False
        self._reads: dict[str, str] = {}
        self._inputs: dict[str, Any] = {}
        # The {field: hash} map of this recorder's last state row, as the row carries it.
        self._last_state_fields: dict[str, str] | None = None

    def is_async(self) -> bool:
        """Burr asks its persister this; the recorder is synchronous."""
        return False

    def pre_run_step(
        self,
        *,
        app_id: str,
        partition_key: str,
        sequence_id: int,
        state: State,
        action: Action,
        inputs: dict[str, Any],
        **future_kwargs: Any,
    ) -> None:
        """Open the node's scope and capture the hashes of the fields it reads and its inputs
        (Burr's post hook receives no inputs). A sub-application's step goes to its sub-run's
        recorder (an app Rewind does not record as a sub-run is part of the spawning node)."""
        target = self._route(app_id, sequence_id, "pre")
        if target is None:
            return
        if target is not self:
            target.pre_run_step(
                app_id=app_id,
                partition_key=partition_key,
                sequence_id=sequence_id,
                state=state,
                action=action,
                inputs=inputs,
                **future_kwargs,
            )
            return
        if self.path:
            self._token = enter(self.ctx)  # the sub-app step's calls belong to the sub-run
            changed = self.ctx.input_overrides.get(action.name)
            if changed and inputs is not None:
                # the dict Burr hands the action too: a sub-run fork's --set-input
                required, optional = action.optional_and_required_inputs
                inputs.update({k: v for k, v in changed.items() if k in required | optional})
        try:
            self.ctx.begin_node(action.name, self.position)
            values = state_values(state)
            self._reads = {
                k: self.encoder.field(k, values[k]).digest
                for k in action.reads
                if k in values and not k.startswith(BURR_INTERNAL_PREFIX)
            }
            self._inputs = runtime_inputs(action, inputs)
            self.ctx.emit("node_started", position=self.position, name=action.name)
        except Exception as exc:
            self._fail("before", action, exc)
        if not self.path:
            # The running node goes to the store (other processes show it) and a cancel asked
            # anywhere stops the run here, before the node executes (rewind.progress).
            ctx = self.ctx
            asked = progress.node_started(
                ctx.store, ctx.run_id, self.position, action.name, before_write=self.flush
            )
            if asked is not None:
                who = f" by {asked['by']}" if asked.get("by") else ""
                raise progress.RunCancelled(
                    f"the run was cancelled{who} before node {self.position + 1} ({action.name})",
                    "fork it from that node to continue",
                )

    def post_run_step(
        self,
        *,
        app_id: str,
        partition_key: str,
        sequence_id: int,
        state: State,
        action: Action,
        result: dict[str, Any] | None,
        exception: Exception | None,
        **future_kwargs: Any,
    ) -> None:
        """Record the node (outputs, hashes, tokens, calls, state row); flush when due."""
        target = self._route(app_id, sequence_id, "post")
        if target is None:
            return
        if target is not self:
            target.post_run_step(
                app_id=app_id,
                partition_key=partition_key,
                sequence_id=sequence_id,
                state=state,
                action=action,
                result=result,
                exception=exception,
                **future_kwargs,
            )
            return
        try:
            self._post_run_step(partition_key, sequence_id, state, action, exception)
        finally:
            if self._token is not None:
                token, self._token = self._token, None
                leave(token)

    def _post_run_step(
        self,
        partition_key: str,
        sequence_id: int,
        state: State,
        action: Action,
        exception: Exception | None,
    ) -> None:
        self._finish_sub_runs(self.position)
        if exception is not None:
            self.failed = True
        if exception is None:
            # Burr catches Exception only: a KeyboardInterrupt/SystemExit unwinding through its
            # step reaches this hook with exception=None. Record the node as failed, not as done.
            in_flight = sys.exc_info()[1]
            if in_flight is not None and not isinstance(in_flight, Exception):
                exception = in_flight  # type: ignore[assignment]
        refusal: UnstorableValue | None = None
        scope = self.ctx.node
        started = scope.started_perf if scope is not None else time.perf_counter()
        try:
            rows, refusal = self._record(
                self.ctx.run_id, partition_key, sequence_id, state, action, exception
            )
            self._queue(rows, started)
        except Exception as exc:
            self._fail("after", action, exc)
        finally:
            self.position += 1
            self.ctx.node = None
        if refusal is not None:
            # The one exception this hook lets through: a state that cannot be stored exactly
            # must stop the run here (Burr aborts on a raising hook), not flow into later nodes.
            raise refusal

    def post_application_create(
        self,
        *,
        app_id: str,
        partition_key: str | None,
        state: State,
        application_graph: Any,
        parent_pointer: Any,
        spawning_parent_pointer: Any,
        **future_kwargs: Any,
    ) -> None:
        """Open a sub-run when a Burr sub-application is built with this recorder (as the
        persister ``MapStates`` cascades, or through the run's tracker). Never raises."""
        root = self.family.root
        if app_id == root.app_id or root.sub_run_setup is None:
            return  # the run's own app; or sub-runs are not recorded
        try:
            root._spawn(app_id, state, application_graph, spawning_parent_pointer)
        except Exception as exc:
            msg = f"recording sub-application {app_id!r} failed: {_error_line(exc)}"
            logger.error("%s\n%s", msg, traceback.format_exc())
            self.errors.append(msg)
            root.errors.append(msg)

    def _route(self, app_id: str, sequence_id: int, hook: str) -> Recorder | None:
        """The recorder of ``app_id``'s step, or None to skip it: an app not recorded as a
        sub-run (its calls belong to the spawning node), or a hook already handled (a
        sub-application reached through both the persister and the tracker)."""
        if app_id == self.app_id:
            return self  # the run's own app, or a sub-run's app routed here by the root
        with self.family.lock:
            target = self.family.by_app.get(app_id)
            if target is None or (sequence_id, hook) in target._seen:
                return None
            target._seen.add((sequence_id, hook))
        return target

    def _spawn(self, app_id: str, state: State, graph: Any, spawning_parent_pointer: Any) -> None:
        """Create the sub-run of a sub-application being built (the root recorder does this)."""
        setup = self.sub_run_setup
        assert setup is not None
        parent = self._spawning_parent(app_id, spawning_parent_pointer)
        if parent is None or parent.ctx.node is None:
            return  # not built by a node of this run (or already seen): nothing to link it to
        scope = parent.ctx.node
        key = scope.spawn_key(current_lane())
        path = (*parent.path, (scope.position, key))
        store = self.ctx.store
        with self.family.lock:
            taken = app_id in self.family.by_run
        # the sub-run id is the Burr app id (DESIGN), unless a run has it already (a looped node
        # re-spawns MapStates children under the same ids) or it does not fit a run id
        fits = 0 < len(app_id) <= 64
        run_id = app_id if fits and not taken and not store.run_exists(app_id) else uuid.uuid4().hex
        pctx = parent.ctx
        source = None
        if setup.source is not None and parent.source_run_id is not None:
            source = setup.source(parent.source_run_id, scope.position, scope.name, key)
        params, inputs = setup.overrides.get(path, ({}, {}))
        child_ctx = self._sub_run_context(pctx, store, run_id, params, inputs, source)
        self._create_sub_run(run_id, state, graph, pctx.run_id, scope.position, key)
        child = Recorder(
            child_ctx,
            self.persister,
            0,
            flush_interval_ms=self.flush_interval_ms,
            source_run_id=source.run_id if source is not None else None,
            _family=self.family,
            _app_id=app_id,
            _path=path,
        )
        with self.family.lock:
            self.family.by_app[app_id] = child
            self.family.by_run[run_id] = child
            parent.open_sub_runs.setdefault(scope.position, []).append(child)

    @staticmethod
    def _sub_run_context(
        pctx: RunContext,
        store: Store,
        run_id: str,
        params: dict[str, dict[str, Any]],
        inputs: dict[str, dict[str, Any]],
        source: Any,
    ) -> RunContext:
        """A sub-run's context: the spawning run's settings, the sub-run's own overrides, and
        the recorded sub-run's lineage (else what the spawning run's source made)."""
        child_ctx = RunContext(
            store=store,
            run_id=run_id,
            read_cache=pctx.read_cache,
            param_overrides=params,
            input_overrides=inputs,
            chat_client=pctx.chat_client,
            fork_node=next(iter(params or inputs), None),
            effects_mode=pctx.effects_mode,
            restore_mode=pctx.restore_mode,
            write_cache=pctx.write_cache,
            bypass_reason=pctx.bypass_reason,
            cached_kinds=pctx.cached_kinds,
            clock=pctx.clock,
        )
        if source is not None:
            child_ctx.lineage = source.lineage
            child_ctx.lineage_at = source.lineage_at
            child_ctx.lineage_slots = source.lineage_slots
            child_ctx.lineage_blobs = source.lineage_blobs
        else:  # no recorded sub-run to replay: serve from what the spawning run's source made
            child_ctx.lineage = pctx.lineage
            child_ctx.lineage_blobs = pctx.lineage_blobs
        return child_ctx

    def _spawning_parent(self, app_id: str, pointer: Any) -> Recorder | None:
        """The recorder of the run whose node builds this sub-application (the current run,
        else the app the pointer names); None when unknown or this build was seen already."""
        ctx = current()
        with self.family.lock:
            known = self.family.by_app.get(app_id)
            if known is not None and not known._seen:
                return None  # the same build, reported by its second route
            parent = self.family.by_run.get(ctx.run_id) if ctx is not None else None
            if parent is None and pointer is not None:
                parent = self.family.by_app.get(pointer.app_id)
                if parent is None and pointer.app_id == self.app_id:
                    parent = self
        return parent

    def _create_sub_run(
        self, run_id: str, state: State, graph: Any, spawning_run_id: str, position: int, key: str
    ) -> None:
        """Write the sub-run's row (its initial state when storable) and its graph."""
        setup = self.sub_run_setup
        assert setup is not None
        store = self.ctx.store
        initial_hash: str | None = None
        try:
            fields, _ = FieldEncoder().encode(semantic_state(state.get_all()))
        except UnstorableValue:
            fields = None
        entry = graph.entrypoint  # Burr's ApplicationGraph holds the entrypoint action
        document = graph_document(graph, getattr(entry, "name", entry))
        with store.write() as conn:
            if fields is not None:
                for f in fields.values():
                    store.put_blob(conn, f.data)
                initial_hash = store.put_blob(conn, map_hash(field_map(fields))[0])
            store.create_run(
                conn,
                run_id=run_id,
                pipeline=setup.pipeline,
                pipeline_ref=setup.pipeline_ref,
                initial_state_hash=initial_hash,
                config=dict(setup.config),
                launch={},
                spawning_run_id=spawning_run_id,
                spawning_position=position,
                spawn_key=key,
            )
            store.put_run_graph(conn, run_id, document)

    def _finish_sub_runs(self, position: int, status: str | None = None) -> None:
        """Commit and finish the sub-runs the node at ``position`` spawned (their apps are done
        when the node is); their calls join the node's cache outcome and tokens."""
        with self.family.lock:
            subs = self.open_sub_runs.pop(position, [])
        scope = self.ctx.node
        for sub in subs:
            for left in list(sub.open_sub_runs):  # spawned by a node that never finished
                sub._finish_sub_runs(left, "interrupted")
            sub.close()
            error = sub.errors[0] if sub.errors else None
            done = status or ("failed" if sub.failed or error else "completed")
            self.ctx.store.finish_run(sub.ctx.run_id, done, error=error)
            with self.family.lock:
                if self.family.by_app.get(sub.app_id) is sub:
                    del self.family.by_app[sub.app_id]
                self.family.by_run.pop(sub.ctx.run_id, None)
            if scope is not None:
                with scope.lock:
                    scope.sub_calls.extend(sub.sub_calls)
            self.sub_calls.extend(sub.sub_calls)

    def flush(self, after: Callable[[Connection], None] | None = None) -> None:
        """Commit the rows recorded so far (one transaction; ``after``'s writes join it, even
        when no row waits). Never raises (a failure is added to :attr:`errors`); thread-safe."""
        with self._write_lock:
            with self._lock:
                batch, self.batch = self.batch, WriteBatch()
                self._due = None
                self._last_flush = time.perf_counter()
            if not batch and after is None:
                return
            # The batch's small blobs go to two compressed packs (documents; call payloads),
            # committed with the node rows that name them (SQLite; see Store.write_batch).
            batch.packs = pack_groups(batch)
            try:
                self.ctx.store.write_batch(batch, after=after)
            except Exception as exc:
                msg = f"writing recorded nodes failed: {_error_line(exc)}"
                logger.error("%s\n%s", msg, traceback.format_exc())
                self.errors.append(msg)
            finally:
                keys = [row["key"] for row in batch.llm_cache + batch.tool_cache]
                release_flights(self.ctx.store, keys)

    def close(self, after: Callable[[Connection], None] | None = None) -> None:
        """Commit what is waiting (at the end of the run), with ``after``'s writes in the same
        transaction (finishing the run row). Never raises. Rows recorded after this are
        committed inside their hook."""
        for position in list(self.open_sub_runs):
            self._finish_sub_runs(position, "interrupted")  # the spawning node never finished
        with self._lock:
            self._closed = True
        self.flush(after)

    def flush_if_due(self, now: float) -> None:
        """Commit the waiting rows if their deadline (``time.perf_counter()`` s) is ``now`` or
        earlier; the flusher thread calls this. Never raises."""
        with self._lock:
            due = self._due
        if due is not None and due <= now:
            self.flush()

    def _queue(self, rows: WriteBatch, started: float) -> None:
        """Add a finished node's rows to the batch; commit now, or arm the deadline flush.

        The node is committed at once when it finished ``flush_interval_ms`` or more after the
        last commit (or the recorder's start: a run's first node after a slow app build commits
        alone, so a forked worker's first node does not wait for the flusher thread), or when
        the waiting rows are past their deadline (the flusher thread is late). ``started`` is
        the node's start (``time.perf_counter()`` s)."""
        now = time.perf_counter()
        armed: float | None = None
        with self._lock:
            self.batch.absorb(rows)
            since = self._last_flush
            late = self._due is not None and self._due <= now
            commit_now = self._closed or late or (now - since) * 1000 >= self.flush_interval_ms
            if not commit_now and self._due is None:
                armed = self._due = now + self.flush_interval_ms / 1000
        if commit_now:
            self.flush()
        elif armed is not None:
            _FLUSHER.schedule(armed, self)

    def _record(
        self,
        app_id: str,
        partition_key: str | None,
        sequence_id: int,
        state: State,
        action: Action,
        exception: Exception | None,
    ) -> tuple[WriteBatch, UnstorableValue | None]:
        """The node's rows (node, calls, cache entries, effects, state row, new blobs), and the
        refusal when its state cannot be stored exactly (the node is then recorded as failed,
        with no state row)."""
        scope = self.ctx.node
        if scope is None or scope.name != action.name:
            scope = self.ctx.begin_node(action.name, self.position)
        latency_ms = (time.perf_counter() - scope.started_perf) * 1000
        values = state_values(state)
        refusal: UnstorableValue | None = None
        try:
            # The fields the node declares are checked even when their object is the same (an
            # action may change a list it reads or writes in place): see FieldEncoder.
            step = self.encoder.step(values, recheck=(*action.reads, *action.writes))
            digests, fresh, internal = step.digests, step.fresh, step.internal
            state_digest, fields_json = self.encoder.state_hash()
        except UnstorableValue as exc:
            step = None
            refusal, digests, fresh, internal = exc, {}, {}, {}
            state_digest, fields_json = "", ""
            exception = exception or exc
        batch = WriteBatch()
        for f in fresh.values():
            # Every fresh field's bytes travel with the batch, even when the store believes the
            # blob is stored: write_batch skips the known ones, and has the bytes at hand to
            # write them again if a concurrent rewind gc deleted them meanwhile.
            batch.blobs.setdefault(f.digest, f.data)
        input_doc = _input_doc_bytes(action, self._reads, self._inputs, scope.params)
        input_hash = sha256_hex(input_doc)
        batch.blobs.setdefault(input_hash, input_doc)
        output_hash: str | None = None
        state_hash: str | None = None
        if exception is None:
            written = {k: digests[k] for k in action.writes if k in digests}
            output_doc, output_hash = map_hash(written)
            batch.blobs.setdefault(output_hash, output_doc)
            state_hash = state_digest
        add_scope_rows(batch, scope)
        if step is not None:
            last = self._last_state_fields
            row = state_row(
                partition_key=partition_key or "",
                app_id=app_id,
                sequence_id=sequence_id,
                position=action.name,
                status="completed" if exception is None else "failed",
                fields=digests,
                internal=internal,
                fields_json=fields_json,
                # the encoder's map changed since its last step by these fields only
                since=None if last is None else (last, fresh.keys(), step.removed),
            )
            self._last_state_fields = row["_fields"]
            batch.states.append(row)
        outcome, reason = node_outcome(scope, exception)
        prompt_tokens, completion_tokens = scope.tokens
        batch.nodes.append(
            {
                "run_id": self.ctx.run_id,
                "position": self.position,
                "name": action.name,
                "sequence_id": sequence_id,
                "src_app_id": app_id,
                "src_sequence_id": sequence_id,
                "inherited": False,
                "input_hash": input_hash,
                "output_hash": output_hash,
                "state_hash": state_hash,
                "params_json": canonical_bytes(scope.params).decode() if scope.params else "{}",
                "latency_ms": latency_ms,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "cache_outcome": outcome,
                "cache_reason": reason,
                "determinism": node_determinism(scope),
                "error": None if exception is None else _error_line(exception),
                "started_at": scope.started_at,
            }
        )
        own_calls = sorted_calls(scope)
        batch.calls.extend(call_rows(self.ctx.run_id, self.position, own_calls))
        if self.path:
            self.sub_calls.extend(own_calls)
        self.ctx.remember(scope)
        self.executed.append(action.name)
        self.ctx.emit(
            "node_finished",
            position=self.position,
            name=action.name,
            outcome=outcome,
            reason=reason,
            tokens=prompt_tokens + completion_tokens,
            latency_ms=latency_ms,
            output_hash=output_hash,
        )
        return batch, refusal

    def _fail(self, when: str, action: Action, exc: Exception) -> None:
        msg = f"recording {when} node {action.name!r} failed: {_error_line(exc)}"
        logger.error("%s\n%s", msg, traceback.format_exc())
        self.errors.append(msg)


class _DeadlineFlusher:
    """One daemon thread per process that commits recorders' waiting rows at their deadlines.

    Shared by every recorder: a thread per run would add its start-up to every run
    (``Thread.start`` waits until the new thread runs, which takes long on a loaded machine).
    Deadlines sit in a heap; an entry whose rows were committed meanwhile (inside a hook, or at
    the end of the run) is a no-op.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, Recorder]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, due: float, recorder: Recorder) -> None:
        """Call ``recorder.flush_if_due`` at ``due`` (``time.perf_counter()`` s)."""
        with self._cond:
            heapq.heappush(self._heap, (due, next(self._order), recorder))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rewind-flusher", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is recorder:  # a new earliest deadline: wake the thread
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.perf_counter()
                    if self._heap and self._heap[0][0] <= now:
                        _, _, recorder = heapq.heappop(self._heap)
                        break
                    self._cond.wait(self._heap[0][0] - now if self._heap else None)
            try:
                recorder.flush_if_due(now)
            except BaseException:  # flush never raises; keep the thread for the other recorders
                logger.exception("the flusher thread could not commit recorded nodes")


_FLUSHER = _DeadlineFlusher()


def _new_flusher_in_child() -> None:
    # Threads do not survive fork(): a forked worker gets its own flusher when it first needs one.
    global _FLUSHER
    _FLUSHER = _DeadlineFlusher()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_flusher_in_child)


def add_scope_rows(batch: WriteBatch, scope: NodeScope) -> None:
    """Add what one node execution (a Burr node or a traced step) produced besides its node row:
    request/result blobs, the cache entries of its cacheable calls, and the effect rows of its
    side-effecting calls with their pinned snapshots.

    The one place these rows are built, so Burr runs and traced chains record side effects alike
    (an effect without rows would audit as "no resources declared").
    """
    for pw in scope.pending.values():
        batch.blobs.setdefault(pw.request_hash, pw.request_bytes)
        batch.blobs.setdefault(pw.result_hash, pw.result_bytes)
        if not pw.cacheable:
            continue
        row = {"key": pw.key, "created_at": pw.produced_at or time.time(), "origin": pw.origin}
        if pw.kind == "llm":
            batch.llm_cache.append(
                row
                | {
                    "model": pw.name,
                    "request_hash": pw.request_hash,
                    "response_hash": pw.result_hash,
                    "prompt_tokens": pw.prompt_tokens,
                    "completion_tokens": pw.completion_tokens,
                }
            )
        else:
            batch.tool_cache.append(
                row | {"tool": pw.name, "args_hash": pw.request_hash, "result_hash": pw.result_hash}
            )
    for effect in scope.effects:
        effect = dict(effect)
        snapshot = effect.pop("_snapshot", None)
        if snapshot is not None and effect["snapshot_hash"]:
            batch.blobs.setdefault(effect["snapshot_hash"], snapshot)
        batch.effects.append(effect)


def sorted_calls(scope: NodeScope) -> list[CallRecord]:
    """The scope's calls by call index: calls from worker threads finish in any order, their
    indices were taken when they began."""
    return sorted(scope.calls, key=lambda c: c.call_index)


def node_outcome(scope: NodeScope, exception: Exception | None) -> tuple[str, str]:
    """A node's cache outcome and reason from its calls (DESIGN rule 6).

    ``failed``/<exception type> when the node raised; ``none``/``no-calls`` when it made no
    cacheable call; ``hit``/``hit`` when every call hit (``hit``/``side-effect-recorded`` when
    some side-effecting call was served from record: nothing executed, nothing spent);
    ``dry-run`` when a side-effecting call was only logged; otherwise the first non-hit call's
    outcome and reason (``miss:override``, ``miss:new-input``, ``bypass:stability``…). A model
    call that raised and that the node caught counts as ``miss:raised`` when it was sent and
    as a hit when its recorded failure was raised again (``failed:replayed``): ``failed`` is
    the outcome of a node that raised, only.
    """
    if exception is not None:
        return "failed", type(exception).__name__
    calls = [*scope.calls, *scope.sub_calls]  # a node's sub-runs' calls are its calls too
    if not calls:
        return "none", "no-calls"
    for call in calls:
        if call.outcome not in ("hit", "served", "dry-run", "failed"):
            return call.outcome, call.reason
        if call.outcome == "failed" and call.reason != "replayed":
            return "miss", call.reason
    for call in calls:
        if call.outcome == "dry-run":
            return "dry-run", call.reason
    if any(call.outcome == "served" for call in calls):
        return "hit", "side-effect-recorded"
    return "hit", "hit"


def node_determinism(scope: NodeScope) -> str:
    """A node's determinism flag from its calls: ``side-effect`` > ``non-deterministic`` (an
    LLM sampled at temperature > 0) > ``time-bound`` > ``deterministic``."""
    flags = {call.determinism for call in [*scope.calls, *scope.sub_calls]}
    for flag in ("side-effect", "non-deterministic", "time-bound"):
        if flag in flags:
            return flag
    return "deterministic"


def _error_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return storable_text(f"{type(exc).__name__}: {text[0] if text else ''}"[:500])
