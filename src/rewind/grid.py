"""What-if grid: fork one run at one node N ways, concurrently, and compare the variants.

:func:`grid` forks a recorded run at one node once per override (``--set node.param=V1 --set
node.param=V2 …``), running the variants concurrently in a bounded thread pool. Work the variants
share is done once:

- nodes before the fork point are inherited by every variant (never executed);
- a call whose inputs a variant shares with the recorded run is served from the parent's lineage;
- a call two variants share (identical cache key) executes once: while it runs, the engine's
  single flight makes the other variant wait for it (``hit:in-flight``, 0 tokens); once its cache
  row is committed, the cache serves it (``hit``). Between the answer and that commit the engine
  has already dropped its in-flight entry, so for LLM calls the grid also routes every variant
  through one :class:`SharedChatClient`, which keeps each answer for the grid's lifetime: a
  variant arriving in that window gets the same bytes with 0 tokens instead of a second request.

The result is a :class:`GridReport`: an N-way matrix (rows = nodes, columns = variants; a cell is
a short output hash and the number of fields changed against the parent), the first divergent node
per variant, which variants change the final artifact (sha256 of the published bytes against the
parent's), and tokens per variant.

Concurrency: every variant is a plain :meth:`Rewind.fork` on the same :class:`Rewind` and
:class:`~rewind.store.Store`. The run context travels in a contextvar (one per worker thread),
each fork has its own recorder and Burr application, and SQLite writes queue on ``BEGIN
IMMEDIATE`` + ``busy_timeout`` (WAL lets reads proceed meanwhile).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from rewind.context import current
from rewind.diff import NodeDiff, NodeSide, TrajectoryDiff, diff_trajectories
from rewind.engine.batch import ForkBatch, ForkMember, ForkOutcome, RemoteFork, run_fork_batch
from rewind.errors import EndpointUnavailable, InvalidOverride, RewindError
from rewind.llm import ChatResponse
from rewind.replay import (
    OutputOverride,
    Override,
    Rewind,
    plan_fork,
)
from rewind.stability import merge_key_orders, occurrence_keys
from rewind.store import NodeRecord, RunRecord

__all__ = [
    "GridCell",
    "GridReport",
    "GridRow",
    "SharedChatClient",
    "VariantResult",
    "grid",
    "override_label",
]

SHORT_HASH = 8
"""Hex characters of an output hash shown in a matrix cell."""

VariantListener = Callable[["VariantResult"], None]


# -- sharing LLM requests between concurrent variants ----------------------------------------------


class SharedChatClient:
    """Wraps a chat client so identical requests from one grid's variants are sent once.

    Requests are identified by their LLM cache key (``inner.cache_key(body)``), the same key the
    cache uses. The first caller of a key sends it; a caller that arrives while it is in flight,
    or after it answered, gets the same response bytes with its token counts set to 0 (the tokens
    were spent once, by the first caller); its call is recorded as a miss spending 0 tokens. A
    failed request is not kept: the next caller retries. Thread-safe. Lives as long as one grid.

    The engine's single flight already shares a call while it executes; this closes the window
    after the answer and before the cache row is committed (see the module doc).

    Args:
        inner: a :class:`~rewind.llm.ChatClient` or :class:`~rewind.session.LazyChatClient`.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self._responses: dict[str, Future[ChatResponse]] = {}
        self.requests = 0
        self.shared = 0
        self.requests_by_run: dict[str, int] = {}
        self.shared_by_run: dict[str, int] = {}

    @property
    def endpoint(self) -> Any:
        """The inner client's endpoint (its ``model`` names the model in cache keys)."""
        return self.inner.endpoint

    def cache_key(self, body: Mapping[str, Any]) -> str:
        """The LLM cache key of ``body`` (the inner client's)."""
        key: str = self.inner.cache_key(body)
        return key

    def complete(self, body: Mapping[str, Any]) -> ChatResponse:
        """Send ``body`` unless an identical request was (or is being) sent; see the class doc.

        Raises:
            whatever the inner client raises (EndpointUnavailable, ModelCallError…), to the
            sender and to every caller that waited for it.
        """
        key = self.cache_key(body)
        ctx = current()
        run = ctx.run_id if ctx is not None else ""
        with self._lock:
            future = self._responses.get(key)
            leader = future is None
            if future is None:
                future = Future()
                self._responses[key] = future
                self.requests += 1
                self.requests_by_run[run] = self.requests_by_run.get(run, 0) + 1
            else:
                self.shared += 1
                self.shared_by_run[run] = self.shared_by_run.get(run, 0) + 1
        if not leader:
            response = future.result()
            return dataclasses.replace(
                response, prompt_tokens=0, completion_tokens=0, latency_ms=0.0
            )
        try:
            response = self.inner.complete(body)
        except BaseException as exc:
            with self._lock:
                self._responses.pop(key, None)
            future.set_exception(exc)
            raise
        future.set_result(response)
        return response


# -- records -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GridCell:
    """One variant's execution of one node.

    Attributes:
        output_hash: the node's output hash in the variant (None when it failed there).
        status: against the parent: ``equal``, ``changed``, ``only_b`` (the parent never ran
            this node) — see :mod:`rewind.diff`.
        changed_fields: number of field changes against the parent's output (0 when equal;
            None for ``only_b``).
        outcome: the node's cache outcome label in the variant (``inherited``, ``hit``,
            ``miss:override``, ``hit:in-flight``, ``failed:SideEffectBlocked``…).
        tokens: tokens the node spent in the variant.
    """

    output_hash: str | None
    status: str
    changed_fields: int | None
    outcome: str
    tokens: int

    @property
    def short(self) -> str:
        """The first :data:`SHORT_HASH` hex characters of the output hash (``—`` if none)."""
        return (self.output_hash or "—")[:SHORT_HASH]

    def to_json(self) -> dict[str, Any]:
        """``{"output_hash", "short", "status", "changed_fields", "outcome", "tokens"}``."""
        return {
            "output_hash": self.output_hash,
            "short": self.short,
            "status": self.status,
            "changed_fields": self.changed_fields,
            "outcome": self.outcome,
            "tokens": self.tokens,
        }


@dataclass(frozen=True)
class GridRow:
    """One node (row) of the matrix.

    Attributes:
        index: 0-based row.
        name, occurrence: the node and which of its executions (1-based).
        parent_hash: the parent's output hash, or None when the parent never ran it.
        cells: one per variant (column order); None where the variant did not run the node.
    """

    index: int
    name: str
    occurrence: int
    parent_hash: str | None
    cells: tuple[GridCell | None, ...]

    @property
    def label(self) -> str:
        """``name``, or ``name#k`` for the k-th execution (k ≥ 2)."""
        return self.name if self.occurrence == 1 else f"{self.name}#{self.occurrence}"

    def to_json(self) -> dict[str, Any]:
        """``{"index", "name", "occurrence", "label", "parent_hash", "cells": [cell | None]}``."""
        return {
            "index": self.index,
            "name": self.name,
            "occurrence": self.occurrence,
            "label": self.label,
            "parent_hash": self.parent_hash,
            "cells": [None if c is None else c.to_json() for c in self.cells],
        }


@dataclass(frozen=True)
class VariantResult:
    """One column of the grid.

    Attributes:
        index: 0-based column.
        label: the override as text (``critique.temperature=0.8``).
        override: its JSON form.
        run: the variant's run (None only if the fork never started).
        error: why the variant failed (its run is recorded as failed), or None.
        first_divergence: the first row (index into :attr:`GridReport.rows`) whose output differs
            from the parent, or None when every node is equal.
        first_divergence_node: that row's label.
        artifacts: ``{name: sha256}`` the variant published.
        changes_artifact: True when the published artifacts differ from the parent's (a name
            added, removed, or different bytes); False when identical; None when neither run
            published anything, or the variant ran with effects ``dry-run`` (it publishes
            nothing, which says nothing about its artifact).
        llm_requests: LLM requests this variant actually sent to the endpoint.
        llm_shared: LLM requests it got from another variant's identical request.
        wall_ms: the variant's wall time (ms).
    """

    index: int
    label: str
    override: dict[str, Any]
    run: RunRecord | None
    error: str | None
    first_divergence: int | None
    first_divergence_node: str | None
    artifacts: dict[str, str]
    changes_artifact: bool | None
    llm_requests: int
    llm_shared: int
    wall_ms: float

    @property
    def status(self) -> str:
        """The run's status (``completed``/``failed``), or ``error`` if it never started."""
        return self.run.status if self.run is not None else "error"

    @property
    def tokens(self) -> int:
        """Tokens the variant spent (prompt + completion; cache hits and shared calls 0)."""
        return self.run.tokens if self.run is not None else 0

    def to_json(self) -> dict[str, Any]:
        """``{"index", "label", "override", "run_id", "status", "error", "tokens",
        "prompt_tokens", "completion_tokens", "first_divergence": {"index", "node"} | None,
        "artifacts", "changes_artifact", "llm_requests", "llm_shared", "wall_ms"}``."""
        run = self.run
        return {
            "index": self.index,
            "label": self.label,
            "override": self.override,
            "run_id": run.run_id if run else None,
            "status": self.status,
            "error": self.error,
            "tokens": self.tokens,
            "prompt_tokens": run.prompt_tokens if run else 0,
            "completion_tokens": run.completion_tokens if run else 0,
            "first_divergence": (
                None
                if self.first_divergence is None
                else {"index": self.first_divergence, "node": self.first_divergence_node}
            ),
            "artifacts": self.artifacts,
            "changes_artifact": self.changes_artifact,
            "llm_requests": self.llm_requests,
            "llm_shared": self.llm_shared,
            "wall_ms": round(self.wall_ms, 3),
        }


@dataclass(frozen=True)
class GridReport:
    """The result of one :func:`grid` call.

    Attributes:
        run_id: the parent run.
        batch: id of this grid (in every variant's run config as ``grid_batch``).
        at, at_number: the fork node's name and 1-based number.
        effects: side-effect mode of the variants.
        workers: size of the thread pool.
        variants: the columns, in the order the overrides were given.
        rows: the matrix rows, in trajectory order.
        parent_artifacts: ``{name: sha256}`` the parent published.
        parent_tokens: tokens the parent spent.
        new_llm_inputs: distinct LLM cache keys the variants needed that the parent's own
            trajectory did not hold (the LLM work the grid had to do).
        llm_requests: LLM requests the variants sent to the endpoint in total.
        wall_ms: wall time of the whole grid (ms).
    """

    run_id: str
    batch: str
    at: str
    at_number: int
    effects: str
    workers: int
    variants: tuple[VariantResult, ...]
    rows: tuple[GridRow, ...]
    parent_artifacts: dict[str, str]
    parent_tokens: int
    new_llm_inputs: int
    llm_requests: int
    wall_ms: float

    @property
    def tokens(self) -> int:
        """Tokens all variants spent."""
        return sum(v.tokens for v in self.variants)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict: ``{"kind": "grid", "run_id", "batch", "at", "at_number", "effects",
        "workers", "wall_ms", "tokens", "parent": {"tokens", "artifacts"}, "new_llm_inputs",
        "llm_requests", "changes_artifact": [variant labels], "variants": [...], "rows": [...]}``.
        """
        return {
            "kind": "grid",
            "run_id": self.run_id,
            "batch": self.batch,
            "at": self.at,
            "at_number": self.at_number,
            "effects": self.effects,
            "workers": self.workers,
            "wall_ms": round(self.wall_ms, 3),
            "tokens": self.tokens,
            "parent": {"tokens": self.parent_tokens, "artifacts": self.parent_artifacts},
            "new_llm_inputs": self.new_llm_inputs,
            "llm_requests": self.llm_requests,
            "changes_artifact": [v.label for v in self.variants if v.changes_artifact],
            "variants": [v.to_json() for v in self.variants],
            "rows": [r.to_json() for r in self.rows],
        }


def override_label(override: Override) -> str:
    """``node.param=VALUE`` (VALUE as JSON), ``node.field:=VALUE`` for an output override."""
    data = override.to_json()
    name = data.get("param") or data.get("field")
    sep = ":=" if isinstance(override, OutputOverride) else "="
    value = json.dumps(override.value, ensure_ascii=False, sort_keys=True)
    if len(value) > 40:
        value = value[:39] + "…"
    return f"{override.node}.{name}{sep}{value}"


# -- the grid ----------------------------------------------------------------------------------


def grid(
    rw: Rewind,
    run_id: str,
    *,
    at: str | int,
    overrides: Sequence[Override],
    max_workers: int = 4,
    effects: str = "live",
    share_llm: bool = True,
    on_variant: VariantListener | None = None,
    restore: str = "refuse",
    run_fork: RemoteFork | None = None,
) -> GridReport:
    """Fork ``run_id`` at ``at`` once per override, concurrently, and compare the variants.

    Every override is checked against the parent before any variant starts
    (:func:`~rewind.engine.plan.plan_fork`, as ``rewind fork`` checks it). Each variant is
    ``rw.fork(run_id, at=at, override=o, effects=effects)`` (config: the parent's plus
    ``{"purpose": "grid", "grid_batch", "grid_variant"}``), run on a pool of ``max_workers``
    threads sharing ``rw`` and its store.

    Args:
        rw: the session; its chat client answers the variants' LLM misses.
        run_id: the parent run (id or unique prefix).
        at: the fork node (name, ``name#k`` or 1-based number).
        overrides: one change per variant (≥ 1); a :class:`~rewind.replay.ParamOverride` on a
            node at or after ``at``, or an :class:`~rewind.replay.OutputOverride` of ``at``.
        max_workers: threads (≥ 1); variants beyond it queue.
        effects: side-effect mode of every variant (``live`` default: a variant whose upstream
            changed publishes its own artifact; ``recorded`` would stop such a variant with
            SideEffectBlocked; ``dry-run`` logs the call).
        share_llm: route LLM calls through one :class:`SharedChatClient` (see the module doc).
        on_variant: called (in the calling thread) with each variant's run as it finishes
            (matrix fields not filled in yet).
        restore: ``refuse`` (default) or ``replace``: what a live restore does with data its
            pinned snapshot does not hold (``replace`` needs ``effects="live"``).
        run_fork: executes one variant's fork elsewhere and returns its run once it ended —
            ``run_fork(parent_run_id, at, override, new_run_id, effects, config)`` (``at``
            1-based); default: ``rw.fork`` on this process's threads. With a task queue
            (:meth:`rewind.api.runner.QueueRunManager.fork_and_wait`) the variants execute on
            the queue's workers; ``max_workers`` then bounds how many are queued at once.
    Returns:
        the report; a variant that failed is a column with ``error`` set (its run is recorded
        as failed at the node that failed).
    Raises:
        InvalidOverride: no overrides, ``max_workers < 1``, an unknown effects mode, or an
            override the parent cannot take (unknown node/param/field, before the fork point,
            a value the pipeline's ``param_check`` refuses) — nothing is written; ``field``
            names ``overrides.<i>.<field>``.
        UnknownRun, UnknownNode, ForkError, RunBusy, CodeDrift: as :meth:`Rewind.fork`,
            before anything runs.
        EndpointUnavailable: the model endpoint is down (raised after every variant stopped).
    """
    if not overrides:
        raise InvalidOverride(
            "a grid needs at least one variant", "pass --set node.param=V …", field="overrides"
        )
    if max_workers < 1:
        raise InvalidOverride(
            f"workers must be at least 1, got {max_workers}", "pass --workers 4", field="workers"
        )
    plans = [
        plan_fork(
            rw,
            run_id,
            at=at,
            override=o,
            effects=effects,
            restore=restore,
            override_field=f"overrides.{i}",
        )
        for i, o in enumerate(overrides)
    ]
    parent, nodes, idx = plans[0].parent, list(plans[0].nodes), plans[0].index

    local = run_fork is None
    shared = SharedChatClient(rw.chat_client) if local and share_llm and rw.chat_client else None
    session = rw
    if shared is not None:
        # Same store, persister and registered pipelines; only the chat client differs.
        session = copy.copy(rw)
        session.chat_client = shared
    workers = min(max_workers, len(overrides))
    batch = ForkBatch(
        parent=parent,
        at=idx + 1,
        purpose="grid",
        members=tuple(ForkMember(o, {"grid_variant": i}) for i, o in enumerate(overrides)),
        effects=effects,
        restore=restore,
    )

    def announce(o: ForkOutcome) -> None:
        if on_variant is not None:
            on_variant(_bare_variant(o.index, overrides[o.index], o.run, o.error, o.wall_ms))

    outcomes, wall_ms = run_fork_batch(
        session, batch, workers=workers, run_fork=run_fork, on_outcome=announce
    )
    unexpected = [o.exc for o in outcomes if o.exc is not None]
    for exc in unexpected:
        if not isinstance(exc, RewindError):
            raise exc
    for exc in unexpected:
        if isinstance(exc, EndpointUnavailable):
            raise exc
    return _report(
        rw, parent, nodes, idx, overrides, outcomes, shared, batch.batch, effects, workers, wall_ms
    )


def _bare_variant(
    i: int, override: Override, run: RunRecord | None, error: str | None, ms: float
) -> VariantResult:
    return VariantResult(
        index=i,
        label=override_label(override),
        override=override.to_json(),
        run=run,
        error=error,
        first_divergence=None,
        first_divergence_node=None,
        artifacts={},
        changes_artifact=None,
        llm_requests=0,
        llm_shared=0,
        wall_ms=ms,
    )


def _outcome_label(n: NodeRecord) -> str:
    if n.cache_reason in ("", n.cache_outcome, "hit") or n.cache_outcome == "inherited":
        return n.cache_outcome
    return f"{n.cache_outcome}:{n.cache_reason}"


def _report(
    rw: Rewind,
    parent: RunRecord,
    parent_nodes: list[NodeRecord],
    idx: int,
    overrides: Sequence[Override],
    outcomes: Sequence[ForkOutcome],
    shared: SharedChatClient | None,
    batch: str,
    effects: str,
    workers: int,
    wall_ms: float,
) -> GridReport:
    parent_keys = occurrence_keys(n.name for n in parent_nodes)
    parent_arts = {a["name"]: a["sha256"] for a in rw.store.artifacts_of(parent.run_id)}
    variant_nodes = [
        rw.store.nodes_of(run.run_id) if run is not None else []
        for run in (o.run for o in outcomes)
    ]
    sides = _node_sides(rw, [parent_nodes, *variant_nodes])
    order = merge_key_orders(
        [parent_keys] + [occurrence_keys(n.name for n in vn) for vn in variant_nodes]
    )
    cells: list[list[GridCell | None]] = [[None] * len(overrides) for _ in order]
    variants: list[VariantResult] = []
    new_llm: set[str] = set()
    for i, override in enumerate(overrides):
        run, error, ms = outcomes[i].run, outcomes[i].error, outcomes[i].wall_ms
        d = (
            None
            if run is None
            else diff_trajectories(parent.run_id, sides[0], run.run_id, sides[i + 1])
        )
        new_llm |= _fill_cells(cells, order, i, variant_nodes[i], d)
        first_row = _first_divergence_row(cells, order, i, set(parent_keys), run is not None)
        arts = {a["name"]: a["sha256"] for a in rw.store.artifacts_of(run.run_id)} if run else {}
        requests, got = _llm_requests(shared, run.run_id if run else "", variant_nodes[i])
        variants.append(
            VariantResult(
                index=i,
                label=override_label(override),
                override=override.to_json(),
                run=run,
                error=error,
                first_divergence=first_row,
                first_divergence_node=_row_name(order, first_row),
                artifacts=arts,
                changes_artifact=_changes_artifact(arts, parent_arts, effects),
                llm_requests=requests,
                llm_shared=got,
                wall_ms=ms,
            )
        )
    parent_by_key = dict(zip(parent_keys, sides[0], strict=True))
    rows = tuple(
        GridRow(
            index=r,
            name=key[0],
            occurrence=key[1],
            parent_hash=(parent_by_key[key].output_hash or None) if key in parent_by_key else None,
            cells=tuple(cells[r]),
        )
        for r, key in enumerate(order)
    )
    llm_requests = shared.requests if shared is not None else sum(v.llm_requests for v in variants)
    return GridReport(
        run_id=parent.run_id,
        batch=batch,
        at=parent_nodes[idx].name,
        at_number=idx + 1,
        effects=effects,
        workers=workers,
        variants=tuple(variants),
        rows=rows,
        parent_artifacts=parent_arts,
        parent_tokens=parent.tokens,
        new_llm_inputs=len(new_llm - _lineage_llm_keys(rw, parent, parent_nodes)),
        llm_requests=llm_requests,
        wall_ms=wall_ms,
    )


def _lineage_llm_keys(rw: Rewind, parent: RunRecord, parent_nodes: list[NodeRecord]) -> set[str]:
    """The LLM keys a fork serves from lineage: the parent's LLM calls and its ancestors' calls."""
    keys = {c.key for n in parent_nodes for c in n.calls if c.kind == "llm"}
    for ancestor in rw.store.ancestors(parent):
        keys |= {c.key for n in rw.store.nodes_of(ancestor.run_id) for c in n.calls}
    return keys


def _fill_cells(
    cells: list[list[GridCell | None]],
    order: Sequence[tuple[str, int]],
    column: int,
    vnodes: Sequence[NodeRecord],
    d: TrajectoryDiff | None,
) -> set[str]:
    """Fill variant ``column`` of ``cells`` (rows in ``order``) from its nodes and its diff with
    the parent; returns the LLM keys its executed nodes used."""
    row_of = {key: r for r, key in enumerate(order)}
    keys = occurrence_keys(n.name for n in vnodes)
    status_of: dict[tuple[str, int], NodeDiff] = {}
    if d is not None:
        b_keys = iter(keys)
        for nd in d.nodes:
            if nd.b is not None:
                status_of[next(b_keys)] = nd
    llm: set[str] = set()
    for key, n in zip(keys, vnodes, strict=True):
        nd = status_of.get(key)
        cells[row_of[key]][column] = GridCell(
            output_hash=n.output_hash if n.error is None else None,
            status="failed" if n.error is not None else (nd.status if nd is not None else "only_b"),
            changed_fields=len(nd.changes) if nd is not None and nd.a is not None else None,
            outcome=_outcome_label(n),
            tokens=n.tokens,
        )
        llm |= {c.key for c in n.calls if c.kind == "llm" and not n.inherited}
    return llm


def _first_divergence_row(
    cells: list[list[GridCell | None]],
    order: Sequence[tuple[str, int]],
    column: int,
    parent_keys: set[tuple[str, int]],
    ran: bool,
) -> int | None:
    """The first row where variant ``column`` differs from the parent: a cell not equal, or a
    node the parent ran that the variant (which ``ran``) stopped before."""
    for r, key in enumerate(order):
        cell = cells[r][column]
        if cell is None and key in parent_keys and ran:
            return r
        if cell is not None and cell.status != "equal":
            return r
    return None


def _row_name(order: Sequence[tuple[str, int]], row: int | None) -> str | None:
    """``name`` (first occurrence) or ``name#k`` of row ``row``; None for no row."""
    if row is None:
        return None
    name, occ = order[row]
    return name if occ == 1 else f"{name}#{occ}"


def _changes_artifact(
    arts: Mapping[str, str], parent_arts: Mapping[str, str], effects: str
) -> bool | None:
    """Whether a variant's artifacts differ from the parent's (None: no artifact to compare).
    A dry-run variant publishes nothing: that is not a changed artifact, it is none."""
    unpublished = not arts and effects == "dry-run"
    if unpublished or (not arts and not parent_arts):
        return None
    return dict(arts) != dict(parent_arts)


def _llm_requests(
    shared: SharedChatClient | None, run_id: str, vnodes: Sequence[NodeRecord]
) -> tuple[int, int]:
    """(LLM requests the variant sent, requests it got answered by another variant's)."""
    if shared is not None:
        return shared.requests_by_run.get(run_id, 0), shared.shared_by_run.get(run_id, 0)
    sent = sum(
        1
        for n in vnodes
        if not n.inherited
        for c in n.calls
        # a failed:raised call was sent too (the endpoint dropped or refused it)
        if c.kind == "llm" and (c.outcome in ("miss", "bypass") or c.reason == "raised")
    )
    return sent, 0


def _node_sides(rw: Rewind, runs: Sequence[Sequence[NodeRecord]]) -> list[list[NodeSide]]:
    """The diff's view of several runs' nodes, loading every output with two blob queries
    (inherited nodes and shared results are fetched once)."""
    maps = rw.store.get_blobs({n.output_hash for nodes in runs for n in nodes if n.output_hash})
    fields = {h: json.loads(data) for h, data in maps.items()}
    values = rw.store.get_blobs({f for m in fields.values() for f in m.values()})
    decoded = {h: json.loads(data) for h, data in values.items()}
    return [
        [
            NodeSide(
                position=n.position,
                name=n.name,
                output=(
                    {k: decoded[f] for k, f in fields[n.output_hash].items()}
                    if n.output_hash
                    else {}
                ),
                output_hash=n.output_hash or "",
                tokens=n.tokens,
                outcome=n.cache_outcome,
            )
            for n in nodes
        ]
        for nodes in runs
    ]
