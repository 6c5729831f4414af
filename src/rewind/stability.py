"""Hash-stability mode: run one branch of a recorded run K times live and count what spreads.

"Is my agent deterministic?" becomes a number. :func:`stability` forks the run K times at the same
node with ``cache_mode="stability"`` (every LLM and tool call executes live with reason
``bypass:stability``; nothing becomes a cache entry; side effects are served from record), one
sample after the other (a local model serves one request at a time). Then, per node of the branch,
it counts the distinct output hashes the K samples produced, the modal hash and its share, and
finds the first node where hashes spread. The overall **stable share** is the fraction of the
branch's nodes that every sample completed with one identical output hash.

Samples are aligned by node name and occurrence (the k-th execution of ``critique`` in one sample
pairs with the k-th in another), so a sample that takes another conditional branch shows up as a
node some samples never reached: not stable.

Where reports live: the store has no table for reports yet, so a report is written as JSON
(sorted keys) to ``<store root>/reports/stability-<run id[:12]>-<batch>.json`` (see
:func:`save_report`),
and every sample fork carries ``{"purpose": "stability", "stability_batch": <batch>}`` in its run
config, so the samples of one report can be found from the runs table. A ``reports`` table (one
row per report: id, kind, run id, created_at, body blob hash) is the intended home; the file
layout is what a migration would read.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rewind.canonical import canonical_bytes
from rewind.effects import EffectPreconditionFailed, SideEffectBlocked
from rewind.engine.batch import ForkBatch, ForkMember, ForkOutcome, RemoteFork, run_fork_batch
from rewind.errors import InvalidOverride, RewindError
from rewind.replay import (
    ForkPlan,
    Override,
    ParamOverride,
    Rewind,
    plan_fork,
    validate_override,
)
from rewind.store import NodeRecord, RunRecord

__all__ = [
    "NodeStability",
    "StabilityReport",
    "merge_key_orders",
    "occurrence_keys",
    "plan_stability",
    "save_report",
    "saved_reports",
    "stability",
    "temperature_override",
]

REPORTS_DIR = "reports"
"""Folder under the store root that holds saved reports."""

SampleListener = Callable[[int, RunRecord], None]


# -- records -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeStability:
    """How one node of the branch behaved across the K samples.

    Attributes:
        index: 0-based row in the report (branch order).
        name: node name; ``occurrence`` is 1 for its first execution in the branch, 2 for the
            second…
        hashes: per sample (in sample order), the node's output hash, or None when the sample
            failed at this node or never reached it.
        distinct: number of distinct output hashes among the samples that produced one.
        modal_hash: the most frequent output hash (ties: the one seen first), or None.
        modal_count: how many samples produced ``modal_hash``.
        modal_share: ``modal_count / k`` (a sample that did not produce an output counts against
            it), 0.0–1.0.
        completed: samples that completed the node with an output.
        parent_hash: the node's output hash in the recorded run, or None if the run did not
            execute it (at this occurrence) or failed there.
        determinism: the node's determinism flag in the first sample that completed it (else
            the first that ran it): ``deterministic``, ``non-deterministic`` for an LLM sampled
            at temperature > 0, ``side-effect``…
    """

    index: int
    name: str
    occurrence: int
    hashes: tuple[str | None, ...]
    distinct: int
    modal_hash: str | None
    modal_count: int
    modal_share: float
    completed: int
    parent_hash: str | None
    determinism: str

    @property
    def label(self) -> str:
        """``name``, or ``name#k`` for the k-th execution (k ≥ 2)."""
        return self.name if self.occurrence == 1 else f"{self.name}#{self.occurrence}"

    @property
    def stable(self) -> bool:
        """Every sample completed the node with one identical output hash."""
        return self.completed == len(self.hashes) and self.distinct == 1

    @property
    def matches_parent(self) -> bool:
        """The modal hash is the recorded run's output hash."""
        return self.modal_hash is not None and self.modal_hash == self.parent_hash

    def to_json(self) -> dict[str, Any]:
        """``{"index", "name", "occurrence", "label", "stable", "distinct", "modal_hash",
        "modal_count", "modal_share", "completed", "parent_hash", "matches_parent",
        "determinism", "hashes"}``."""
        return {
            "index": self.index,
            "name": self.name,
            "occurrence": self.occurrence,
            "label": self.label,
            "stable": self.stable,
            "distinct": self.distinct,
            "modal_hash": self.modal_hash,
            "modal_count": self.modal_count,
            "modal_share": self.modal_share,
            "completed": self.completed,
            "parent_hash": self.parent_hash,
            "matches_parent": self.matches_parent,
            "determinism": self.determinism,
            "hashes": list(self.hashes),
        }


@dataclass(frozen=True)
class StabilityReport:
    """The result of one :func:`stability` call.

    Attributes:
        run_id: the recorded run whose branch was sampled.
        batch: id of this report (also in every sample's run config as ``stability_batch``).
        from_node: name of the fork node; ``from_number`` its 1-based node number.
        k: number of samples.
        override: the one change every sample carried (JSON form), or None.
        samples: the sample forks, in order (their status may be ``failed``).
        nodes: one row per node of the branch.
        wall_ms: wall time of the K samples (ms).
        created_at: unix seconds.
        path: where the report was saved, or None.
    """

    run_id: str
    batch: str
    from_node: str
    from_number: int
    k: int
    override: dict[str, Any] | None
    samples: tuple[RunRecord, ...]
    nodes: tuple[NodeStability, ...]
    wall_ms: float
    created_at: float
    path: Path | None = None

    @property
    def stable_nodes(self) -> int:
        """Nodes every sample completed with one identical output hash."""
        return sum(n.stable for n in self.nodes)

    @property
    def stable_share(self) -> float:
        """``stable_nodes / len(nodes)`` (1.0 for an empty branch), 0.0–1.0."""
        return self.stable_nodes / len(self.nodes) if self.nodes else 1.0

    @property
    def first_spread(self) -> NodeStability | None:
        """The first node (branch order) that is not stable, or None when all are."""
        return next((n for n in self.nodes if not n.stable), None)

    @property
    def tokens(self) -> int:
        """Tokens the samples spent (prompt + completion)."""
        return sum(s.tokens for s in self.samples)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict: ``{"kind": "stability", "run_id", "batch", "from_node",
        "from_number", "k", "override", "stable_share", "stable_nodes", "node_count",
        "first_spread": {"index", "label"} | None, "tokens", "wall_ms", "created_at", "path",
        "samples": [{"run_id", "status", "tokens", "error"}], "nodes": [NodeStability.to_json()]}``.
        """
        first = self.first_spread
        return {
            "kind": "stability",
            "run_id": self.run_id,
            "batch": self.batch,
            "from_node": self.from_node,
            "from_number": self.from_number,
            "k": self.k,
            "override": self.override,
            "stable_share": self.stable_share,
            "stable_nodes": self.stable_nodes,
            "node_count": len(self.nodes),
            "first_spread": None if first is None else {"index": first.index, "label": first.label},
            "tokens": self.tokens,
            "wall_ms": round(self.wall_ms, 3),
            "created_at": self.created_at,
            "path": None if self.path is None else str(self.path),
            "samples": [
                {"run_id": s.run_id, "status": s.status, "tokens": s.tokens, "error": s.error}
                for s in self.samples
            ],
            "nodes": [n.to_json() for n in self.nodes],
        }


# -- alignment helpers (shared with rewind.grid) ---------------------------------------------------


def occurrence_keys(names: Iterable[str]) -> list[tuple[str, int]]:
    """``(name, occurrence)`` per node, occurrence counting from 1: ``a, b, a`` →
    ``(a,1), (b,1), (a,2)``."""
    seen: Counter[str] = Counter()
    keys = []
    for name in names:
        seen[name] += 1
        keys.append((name, seen[name]))
    return keys


def merge_key_orders(orders: Iterable[Sequence[tuple[str, int]]]) -> list[tuple[str, int]]:
    """One row order covering several trajectories' node keys.

    The first order is taken as is; a key another order adds is inserted right after the key
    that precedes it in that order (at the front when it has none), so every trajectory's own
    order is kept wherever the orders agree.
    """
    merged: list[tuple[str, int]] = []
    for order in orders:
        anchor: int | None = None  # index in merged of the last key of `order` seen so far
        for key in order:
            if key in merged:
                anchor = merged.index(key)
                continue
            at = 0 if anchor is None else anchor + 1
            merged.insert(at, key)
            anchor = at
    return merged


# -- the mode ----------------------------------------------------------------------------------


def temperature_override(nodes: Sequence[NodeRecord], idx: int, value: float) -> ParamOverride:
    """The override that samples the branch from ``nodes[idx]`` at temperature ``value``.

    An LLM node is one that made an LLM call and read a ``temperature`` param
    (``rewind.param("temperature", …)``). When the engine accepts a wildcard param override
    (``ParamOverride("*", "temperature", value)``: every node that reads the param), that is
    returned; otherwise — the engine carries one node's override per fork — the override goes to
    the first LLM node at or after ``nodes[idx]``, and the nodes after it see its (possibly
    spread) output. ``report.override`` says which one was used.

    Raises:
        InvalidOverride: no node from ``idx`` on reads a ``temperature`` param in an LLM call.
    """
    first = next(
        (
            n.name
            for n in nodes[idx:]
            if "temperature" in n.params and any(c.kind == "llm" for c in n.calls)
        ),
        None,
    )
    if first is None:
        raise InvalidOverride(
            f"no LLM node from {nodes[idx].name!r} on reads a temperature param",
            "fork earlier (--from), or set the param directly with --set node.param=VALUE",
            field="temperature",
        )
    wildcard = ParamOverride("*", "temperature", value)
    try:
        validate_override(nodes, idx, wildcard)
    except InvalidOverride:
        return ParamOverride(first, "temperature", value)
    return wildcard


def plan_stability(
    rw: Rewind,
    run_id: str,
    from_node: str | int,
    override: Override | None,
    temperature: float | None,
) -> ForkPlan:
    """The plan every sample of a stability run forks with (:func:`~rewind.engine.plan.plan_fork`
    at ``from_node``, caches bypassed, side effects served from record); a ``temperature``
    becomes its override (:func:`temperature_override`) once the fork node is known.

    Raises:
        as :func:`~rewind.engine.plan.plan_fork`; errors name ``from_node``, ``override.*`` or
        ``temperature`` as their field.
    """
    plan = plan_fork(
        rw,
        run_id,
        at=from_node,
        override=override,
        effects="recorded",
        cache_mode="stability",
        at_field="from_node",
    )
    if temperature is None:
        return plan
    chosen = temperature_override(list(plan.nodes), plan.index, temperature)
    try:
        return plan_fork(
            rw,
            plan.parent.run_id,
            at=plan.at_number,
            override=chosen,
            effects="recorded",
            cache_mode="stability",
            at_field="from_node",
        )
    except InvalidOverride as exc:  # the pipeline's param_check refused the temperature
        raise InvalidOverride(exc.message, exc.hint, field="temperature") from exc


def stability(
    rw: Rewind,
    run_id: str,
    *,
    k: int,
    from_node: str | int = 1,
    override: Override | None = None,
    temperature: float | None = None,
    save: bool = True,
    on_sample: SampleListener | None = None,
    run_fork: RemoteFork | None = None,
) -> StabilityReport:
    """Run the branch of ``run_id`` from ``from_node`` K times live and measure hash spread.

    Each sample is ``rw.fork(run_id, at=from_node, override=…, cache_mode="stability",
    effects="recorded")``, run one after the other. Nothing is read from or written to the LLM and
    tool caches; the samples are recorded as ordinary forks (config ``{"purpose": "stability",
    "stability_batch", "stability_of", "sample", "k"}`` merged over the parent's config).

    Args:
        rw: the session (its chat client answers the LLM calls).
        run_id: the recorded run (id or unique prefix).
        k: number of samples (≥ 2).
        from_node: fork node (name, ``name#k`` or 1-based number); default the first node.
        override: one change every sample carries (e.g. a :class:`ParamOverride`), or None.
        temperature: shorthand for a ``temperature`` override on the first LLM node at or after
            ``from_node`` (see :func:`temperature_override`); excludes ``override``.
        save: write the report under ``<store root>/reports/`` (see :func:`save_report`).
        on_sample: called with (0-based sample index, its run) after each sample.
        run_fork: executes one sample's fork elsewhere and returns its run once it ended —
            ``run_fork(parent_run_id, at, override, new_run_id, effects, config)`` with
            ``cache_mode="stability"`` applied by the callee (a task queue's workers); default:
            ``rw.fork`` here. Samples still run one after the other.
    Returns:
        the report; ``report.path`` is set when saved.
    Raises:
        RewindError: ``k < 2``.
        UnknownRun, UnknownNode, ForkError, RunBusy, InvalidOverride: before any sample runs
            (:func:`~rewind.engine.plan.plan_fork`, as ``rewind fork`` checks); nothing is
            written.
        EndpointUnavailable: the model endpoint is down (the sample is recorded as failed).
        A sample that stops at a side-effecting call it has no record of (its arguments spread
        upstream: ``SideEffectBlocked``) is not an error here: the node counts as not completed.
    """
    if k < 2:
        raise RewindError(f"k must be at least 2, got {k}", "pass -k 5 (or more) samples")
    if temperature is not None and override is not None:
        raise InvalidOverride(
            "a stability run carries one change: --temperature or one --set, not both",
            "drop one of them",
            field="temperature",
        )
    plan = plan_stability(rw, run_id, from_node, override, temperature)
    parent, nodes, idx, override = plan.parent, list(plan.nodes), plan.index, plan.override

    batch = ForkBatch(
        parent=parent,
        at=idx + 1,
        purpose="stability",
        members=tuple(
            ForkMember(override, {"stability_of": parent.run_id, "sample": i + 1, "k": k})
            for i in range(k)
        ),
        effects="recorded",
        cache_mode="stability",
    )

    def announce(o: ForkOutcome) -> None:
        if o.run is None:  # the fork never recorded its run
            raise o.exc if o.exc is not None else RewindError(f"sample {o.index + 1} has no run")
        if on_sample is not None:
            on_sample(o.index, o.run)

    # A sample stopped at a side-effecting call is recorded as failed at that node; the failure
    # is part of what the report shows. Any other error stops the batch.
    outcomes, wall_ms = run_fork_batch(
        rw,
        batch,
        run_fork=run_fork,
        on_outcome=announce,
        keep=(SideEffectBlocked, EffectPreconditionFailed),
    )
    samples = [o.run for o in outcomes if o.run is not None]

    report = StabilityReport(
        run_id=parent.run_id,
        batch=batch.batch,
        from_node=nodes[idx].name,
        from_number=idx + 1,
        k=k,
        override=override.to_json() if override is not None else None,
        samples=tuple(samples),
        nodes=tuple(_node_rows(nodes[idx:], [rw.store.nodes_of(s.run_id)[idx:] for s in samples])),
        wall_ms=wall_ms,
        created_at=time.time(),
    )
    if save:
        path = save_report(rw.store.root, "stability", parent.run_id, batch.batch, report.to_json())
        report = dataclasses.replace(report, path=path)
    return report


def _node_rows(
    parent: Sequence[NodeRecord], samples: Sequence[Sequence[NodeRecord]]
) -> list[NodeStability]:
    parent_by = _by_key(parent)
    sample_by = [_by_key(s) for s in samples]
    order = merge_key_orders(
        [list(parent_by)] + [occurrence_keys(n.name for n in s) for s in samples]
    )
    return [
        _node_row(index, key, parent_by.get(key), [sb.get(key) for sb in sample_by])
        for index, key in enumerate(order)
    ]


def _by_key(nodes: Sequence[NodeRecord]) -> dict[tuple[str, int], NodeRecord]:
    """Nodes by (name, occurrence)."""
    return dict(zip(occurrence_keys(n.name for n in nodes), nodes, strict=True))


def _node_row(
    index: int, key: tuple[str, int], p: NodeRecord | None, runs: Sequence[NodeRecord | None]
) -> NodeStability:
    """The spread of one node (``key``) over the samples' ``runs`` of it (None: not reached)."""
    hashes = tuple(n.output_hash if n is not None and n.error is None else None for n in runs)
    counts = Counter(h for h in hashes if h is not None)
    modal_hash, modal_count = counts.most_common(1)[0] if counts else (None, 0)
    done = [n for n in runs if n is not None and n.error is None]
    ran = done[0] if done else next((n for n in runs if n is not None), None)
    return NodeStability(
        index=index,
        name=key[0],
        occurrence=key[1],
        hashes=hashes,
        distinct=len(counts),
        modal_hash=modal_hash,
        modal_count=modal_count,
        modal_share=modal_count / len(runs) if runs else 0.0,
        completed=sum(counts.values()),
        parent_hash=p.output_hash if p is not None and p.error is None else None,
        determinism=ran.determinism if ran is not None else "",
    )


def save_report(root: Path, kind: str, run_id: str, batch: str, body: dict[str, Any]) -> Path:
    """Write a report as canonical JSON to ``<root>/reports/<kind>-<run_id[:12]>-<batch>.json``.

    The write is atomic (temporary file, then rename). Returns the path.

    Raises:
        StoreError: the folder cannot be written.
    """
    from rewind.errors import StoreError

    folder = Path(root) / REPORTS_DIR
    path = folder / f"{kind}-{_file_part(run_id)}-{batch}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        body = {**body, "path": str(path)}
        canonical_bytes(body)  # refuses what JSON cannot carry exactly (NaN, bytes…)
        text = json.dumps(body, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
        tmp.write_text(text + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise StoreError(f"cannot write report {path}: {exc}", "check the store folder") from exc
    return path


def saved_reports(root: Path, kind: str = "stability", run_id: str = "") -> list[Path]:
    """Saved report files of a kind (optionally of one run: its id or a prefix of ≥ 12
    characters), oldest first."""
    folder = Path(root) / REPORTS_DIR
    if not folder.is_dir():
        return []
    return sorted(folder.glob(f"{kind}-{_file_part(run_id)}*.json"))


def _file_part(run_id: str) -> str:
    """The first 12 characters of a run id, safe in a file name and a glob pattern: a run id is
    any string a user or a trace chose (``/``, ``[``, control characters), not always a uuid."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", run_id[:12])
