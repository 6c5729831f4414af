"""The effect-equivalence audit: did each side-effecting call leave the world as recorded?

Same output is not the same effect (seed 004). A tool can return an identical string while the
resource it wrote ends up in another state, so the audit never compares return values alone: it
compares **(output, post-state) pairs** — the call's result hash and the post-call fingerprints
Rewind records for every resource a side-effecting call declares (:mod:`rewind.effects`) — and
gives one verdict per call:

``faithful``
    the call was executed against the reference's pre-state and its (output, post-state) pair
    equals the reference's.
``divergent``
    executed, but the output or the post-state differs (``differs`` names the half; both digests
    and the epoch delta are shown).
``audit-incomplete``
    nothing sound to compare: the tool declares no resources, the row has no post digest, the
    reference has none, the resource cannot be fingerprinted again, the call touched another
    resource than the reference, or it ran against another pre-state.
``not-re-executed``
    the call was served from record or dry-run, inherited from the run that executed it, made
    by the reference but never by this run, or there is evidence that a tool-side idempotency
    cache answered it (its idempotency key equals the reference call's, or its post-state matches
    only because it changed nothing where the reference call changed its resource). Neither
    faithful nor divergent.

The audit **fails closed** (seed 004, "Decision Boundary"): only ``faithful`` passes. Absence of
a mismatch is not evidence of a match, so ``audit-incomplete`` and ``not-re-executed`` fail too,
and every verdict that is not ``faithful`` lists the downstream nodes whose conclusions depend on
the call.

The reference a call is compared with (rule of this module):

* ``against=RUN`` — the corresponding call of that run: the call at the same node name,
  occurrence and call index when it has the same cache key, else the call that produced the same
  cache key in that run's lineage, else the call at the same slot with other arguments (then the
  reason says the arguments differ). A reference call that was itself served from record is
  followed to the execution it was served from; when that execution is the audited call itself
  (a run audited against its own served replay) there is no independent evidence:
  ``audit-incomplete``.
* ``against=None`` on a fork — its parent, as above.
* ``against=None`` on a run without parent, or ``against="current"`` — the resource's current
  state: "does the world still hold what the run wrote". A resource the same run writes again
  later is compared with the pre-state fingerprint of that later call (the run's own next
  observation), so only the last write is compared with the world as it is now.

A fork's inherited nodes were executed by an ancestor, not by the fork: their side-effecting
calls are ``not-re-executed`` here (listed in :attr:`AuditReport.inherited_skipped` too; their
own verdict comes from auditing the run that executed them), so a fork past a side effect never
passes vacuously.

Digests are compared, epochs are reported. Where the epoch is part of the state the fingerprinter
folds it into the digest (:class:`~rewind.effects.SQLiteTable` with ``epoch_sql``: same rows from
another epoch is another digest); a :class:`~rewind.effects.FileTree` epoch is an mtime, which
must not make equal content divergent.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from rewind.effects import (
    FileTree,
    Fingerprinter,
    FingerprintUnavailable,
    HttpResource,
    SQLiteTable,
    same_resource,
)
from rewind.errors import InvalidOverride, RewindError
from rewind.store import NodeRecord, RunRecord
from rewind.store.records import CallRecord, EffectRecord

if TYPE_CHECKING:
    from rewind.context import LineageEntry
    from rewind.demo import DemoResult
    from rewind.replay import Rewind

FAITHFUL = "faithful"
DIVERGENT = "divergent"
INCOMPLETE = "audit-incomplete"
NOT_RE_EXECUTED = "not-re-executed"
VERDICTS = (FAITHFUL, DIVERGENT, INCOMPLETE, NOT_RE_EXECUTED)
"""The four verdicts of seed 004's decision boundary; only ``faithful`` passes."""

CURRENT = "current"
"""``against`` value meaning "compare with the resources' current state" (reserved: a run id
is 32 hex characters, so it cannot be mistaken for one)."""

__all__ = [
    "CURRENT",
    "VERDICTS",
    "AuditReport",
    "CallVerdict",
    "ResourceAudit",
    "audit_run",
    "epoch_delta",
    "live_fork_resources",
    "verify_effects_check",
]


# -- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceAudit:
    """One resource of one audited call: its recorded post-state and the reference's.

    Attributes:
        resource: the resource's name as recorded (``file:/path``, ``sqlite:/db#table``, a URL).
        kind: fingerprinter kind (``file-tree``, ``sqlite-table``, ``http``).
        recorded_digest, recorded_epoch: the audited call's post-state fingerprint (None: not
            captured).
        reference: what it is compared with: ``run <id>#<node number>/<call index>``,
            ``current`` or ``next call #<n>/<i> of this run``; empty when there is nothing to
            compare with.
        reference_digest, reference_epoch: the reference's post-state fingerprint (for
            ``current``: the fingerprint taken now; for the run's next call: that call's
            pre-state).
        epoch_delta: reference epoch minus recorded epoch as text (see :func:`epoch_delta`).
        status: ``match``, ``mismatch`` or ``missing`` (nothing to compare).
    """

    resource: str
    kind: str
    recorded_digest: str | None
    recorded_epoch: str | None
    reference: str
    reference_digest: str | None
    reference_epoch: str | None
    epoch_delta: str
    status: str

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return {
            "resource": self.resource,
            "kind": self.kind,
            "recorded": {"digest": self.recorded_digest, "epoch": self.recorded_epoch},
            "reference": self.reference,
            "reference_post": {"digest": self.reference_digest, "epoch": self.reference_epoch},
            "epoch_delta": self.epoch_delta,
            "status": self.status,
        }


@dataclass(frozen=True)
class CallVerdict:
    """The audit verdict of one side-effecting call.

    Attributes:
        run_id: the audited run.
        position: 0-based position of the call's node in the run (``rewind show`` numbers it
            ``position + 1``).
        node: the node's name.
        call_index: the call's index among the node's calls (0-based).
        tool: the tool's name.
        verdict: one of :data:`VERDICTS`.
        resources: per-resource fingerprints compared (empty when none were recorded).
        reason: one line saying which rule decided.
        dependents: ``"<number>:<name>"`` of the later nodes that read, directly or through other
            nodes, a field the call's node wrote; empty when the verdict is ``faithful``.
        output: the output half of the (output, post-state) pair (seed 004, condition 4):
            ``match`` / ``mismatch`` against the reference call's result hash, or ``""`` when
            there is no reference output (compared with the world as it is now, or nothing).
        differs: which halves differ for a ``divergent`` verdict: ``("output",)``,
            ``("post-state",)`` or both; empty otherwise.
    """

    run_id: str
    position: int
    node: str
    call_index: int
    tool: str
    verdict: str
    resources: tuple[ResourceAudit, ...]
    reason: str
    dependents: tuple[str, ...] = ()
    output: str = ""
    differs: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        """True only for ``faithful``."""
        return self.verdict == FAITHFUL

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return {
            "run_id": self.run_id,
            "position": self.position,
            "node": self.node,
            "call_index": self.call_index,
            "tool": self.tool,
            "verdict": self.verdict,
            "resources": [r.to_json() for r in self.resources],
            "reason": self.reason,
            "dependents": list(self.dependents),
            "output": self.output,
            "differs": list(self.differs),
        }


@dataclass(frozen=True)
class AuditReport:
    """The audit of one run: one verdict per side-effecting call it executed or served.

    Attributes:
        run_id: the audited run.
        against: the reference run's id, ``"current"`` (the resources' current state), or None
            when the run made no side-effecting call and has no reference run.
        verdicts: in call order.
        inherited_skipped: side-effecting nodes the run inherited from its parent (not executed
            by this run: their calls are ``not-re-executed`` here; audit the run that produced
            them for their own verdict).
        run_status: the audited run's status; only a ``completed`` run can pass.
    """

    run_id: str
    against: str | None
    verdicts: tuple[CallVerdict, ...]
    inherited_skipped: tuple[str, ...] = field(default=())
    run_status: str = "completed"

    @property
    def completed(self) -> bool:
        """Whether the audited run completed (a failed or running run fails the audit)."""
        return self.run_status == "completed"

    @property
    def vacuous(self) -> bool:
        """A completed run whose reference has no side-effecting call (and that made none
        itself): the only pass without a ``faithful`` verdict, and :attr:`note` says so."""
        return self.completed and not self.verdicts

    @property
    def passed(self) -> bool:
        """True only for a completed run whose every call — its own and every reference call
        it should have re-executed — is ``faithful``, or a vacuous pass (fails closed)."""
        return self.completed and all(v.verdict == FAITHFUL for v in self.verdicts)

    @property
    def label(self) -> str:
        """The run's admissibility (seed 004, "Operational Effect"): ``admissible`` (every call
        faithful), ``vacuous`` (nothing to audit) or ``not-admissible`` (a hypothesis, not
        evidence)."""
        if not self.passed:
            return "not-admissible"
        return "vacuous" if self.vacuous else "admissible"

    @property
    def counts(self) -> dict[str, int]:
        """Number of calls per verdict (every verdict present, zeros included)."""
        return {k: sum(1 for v in self.verdicts if v.verdict == k) for k in VERDICTS}

    @property
    def note(self) -> str:
        """One line: why the report passes or fails."""
        if not self.completed:
            done = (
                f"; {self.counts[FAITHFUL]}/{len(self.verdicts)} calls faithful"
                if self.verdicts
                else ""
            )
            return (
                f"the run did not complete (status {self.run_status}): its effects cannot be "
                f"audited as a whole, fails closed{done}"
            )
        if not self.verdicts:
            return (
                "no side-effecting call in the run nor in its reference: nothing to audit "
                "(passes vacuously)"
            )
        c = self.counts
        if self.passed:
            return f"all {len(self.verdicts)} side-effecting calls faithful"
        bad = ", ".join(f"{n} {k}" for k, n in c.items() if n and k != FAITHFUL)
        return f"{c[FAITHFUL]}/{len(self.verdicts)} faithful; fails closed on {bad}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: run_id, against, passed, note, counts, verdicts."""
        return {
            "run_id": self.run_id,
            "against": self.against,
            "passed": self.passed,
            "vacuous": self.vacuous,
            "label": self.label,
            "run_status": self.run_status,
            "note": self.note,
            "counts": self.counts,
            "inherited_skipped": list(self.inherited_skipped),
            "verdicts": [v.to_json() for v in self.verdicts],
        }


# -- epochs ------------------------------------------------------------------------------------


def _as_number(text: str | None) -> int | float | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def epoch_delta(kind: str, recorded: str | None, reference: str | None) -> str:
    """Reference epoch minus recorded epoch, as text.

    Args:
        kind: the fingerprinter kind; a ``file-tree`` epoch is an mtime in ns, shown in seconds.
        recorded: the audited call's post-state epoch.
        reference: the reference's epoch.
    Returns:
        ``"+3"`` / ``"+1.250 s"`` when both are numeric, ``"0"`` when equal, otherwise
        ``"<recorded> → <reference>"`` (``none`` for a missing epoch), ``""`` when both are None.
    """
    if recorded is None and reference is None:
        return ""
    a, b = _as_number(recorded), _as_number(reference)
    if a is not None and b is not None:
        d = b - a
        if d == 0:
            return "0"
        if kind == FileTree.kind and isinstance(d, int):
            return f"{d / 1e9:+.3f} s"
        return f"{d:+d}" if isinstance(d, int) else f"{d:+g}"
    if recorded == reference:
        return "0"
    return f"{recorded or 'none'} → {reference or 'none'}"


# -- the audit ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """A side-effecting call located in a run: who produced it and where."""

    run_id: str  # the run that actually executed (or served) it
    position: int
    node: str
    occurrence: int
    call: CallRecord


class _Runs:
    """Cached store reads shared by one audit."""

    def __init__(self, rw: Rewind) -> None:
        self.rw = rw
        self._nodes: dict[str, list[NodeRecord]] = {}
        self._effects: dict[str, dict[tuple[int, int], list[EffectRecord]]] = {}

    def nodes(self, run_id: str) -> list[NodeRecord]:
        if run_id not in self._nodes:
            self._nodes[run_id] = self.rw.store.nodes_of(run_id)
        return self._nodes[run_id]

    def effects(self, run_id: str, position: int, call_index: int) -> list[EffectRecord]:
        if run_id not in self._effects:
            grouped: dict[tuple[int, int], list[EffectRecord]] = {}
            for e in self.rw.store.effects_of(run_id):
                grouped.setdefault((e.position, e.call_index), []).append(e)
            for rows in grouped.values():
                rows.sort(key=lambda e: e.resource)
            self._effects[run_id] = grouped
        return self._effects[run_id].get((position, call_index), [])

    def call_at(self, run_id: str, position: int, call_index: int) -> CallRecord | None:
        """The call recorded at (position, call index) of a run, None when there is none."""
        for node in self._nodes_or_empty(run_id):
            if node.position == position:
                return next((c for c in node.calls if c.call_index == call_index), None)
        return None

    def side_effect_calls(self, run_id: str) -> list[_Call]:
        """Side-effecting calls at every node of the run, inherited nodes resolved to the run
        that produced them (nodes are numbered by name occurrence like ``name#k``)."""
        out: list[_Call] = []
        seen: dict[str, int] = {}
        for node in self.nodes(run_id):
            seen[node.name] = seen.get(node.name, 0) + 1
            producer, calls = run_id, node.calls
            if node.inherited and node.src_app_id != run_id:
                producer = node.src_app_id
                src = next(
                    (
                        n
                        for n in self._nodes_or_empty(producer)
                        if n.position == node.position and n.name == node.name
                    ),
                    None,
                )
                calls = src.calls if src is not None else ()
            for call in calls:
                if call.determinism == "side-effect":
                    out.append(_Call(producer, node.position, node.name, seen[node.name], call))
        return out

    def _nodes_or_empty(self, run_id: str) -> list[NodeRecord]:
        try:
            return self.nodes(run_id)
        except RewindError:
            return []


def audit_run(
    rw: Rewind,
    run_id: str,
    against: str | None = None,
    *,
    resources: Mapping[str, Fingerprinter] | Sequence[Fingerprinter] | None = None,
    record: bool = True,
) -> AuditReport:
    """Audit every side-effecting call a run executed or served (see the module docstring).

    Args:
        rw: the session whose store holds the run.
        run_id: the run (id or unique prefix).
        against: a reference run (id or prefix); ``"current"`` to compare with the resources'
            current state; None for the run's parent, or the current state if it has none.
        resources: fingerprinters to use when re-fingerprinting a resource's current state, by
            name (needed for a resource whose parameters the store does not record, e.g. a
            :class:`~rewind.effects.SQLiteTable` whose tool is not importable here).
        record: store the verdict as the run's last audit (its ``admissible`` label, shown by
            ``rewind show`` and the run API); False for a look that leaves no trace.
    Returns:
        the report; ``report.passed`` only when every call is ``faithful``.
    Raises:
        UnknownRun: the run or the reference run does not exist.
    """
    run = rw.store.get_run(run_id)
    ref_run = _reference_run(rw, run, against)
    runs = _Runs(rw)
    nodes = runs.nodes(run.run_id)
    own = [c for c in runs.side_effect_calls(run.run_id) if c.run_id == run.run_id]
    inherited = [c for c in runs.side_effect_calls(run.run_id) if c.run_id != run.run_id]
    skipped = tuple(dict.fromkeys(f"{c.position + 1}:{c.node}" for c in inherited))
    if isinstance(resources, Mapping):
        known = dict(resources)
    else:
        known = {r.name: r for r in resources or ()}
    if ref_run is not None:
        judge: _Judge = _AgainstRun(rw, runs, ref_run)
        label: str | None = ref_run.run_id
    else:
        judge = _AgainstCurrent(rw, runs, run, own, known)
        label = CURRENT if own or against == CURRENT else None
    graph = _Dataflow(rw, nodes)
    verdicts = [_inherited_verdict(run.run_id, c, graph) for c in inherited]
    for c in own:
        d = _Decision(*judge.judge(c))
        deps = () if d.verdict == FAITHFUL else graph.dependents(c.position)
        verdicts.append(_verdict(run.run_id, c, d, deps))
    if ref_run is not None:
        verdicts.extend(_not_re_executed(runs, run, ref_run))
    verdicts.extend(_flagged_without_calls(run.run_id, nodes, verdicts, graph))
    if verdicts and label is None:
        label = CURRENT
    report = AuditReport(run.run_id, label, tuple(verdicts), skipped, run.status)
    if record and not rw.store.read_only:  # a read-only store keeps no audit history
        rw.store.record_audit(
            run.run_id,
            against=label,
            label=report.label,
            note=report.note,
            counts=report.counts,
        )
    return report


def _reference_run(rw: Rewind, run: RunRecord, against: str | None) -> RunRecord | None:
    """The run ``run`` is audited against: ``against`` (not the run itself), else its parent;
    None for the resources' current state."""
    if against is not None and against != CURRENT:
        ref_run = rw.store.get_run(against)
        if ref_run.run_id == run.run_id:
            raise InvalidOverride(
                "a run cannot be audited against itself",
                "audit it against its parent, another run, or --against current",
            )
        return ref_run
    if against is None and run.parent_run_id:
        return rw.store.get_run(run.parent_run_id)
    return None


def _inherited_verdict(run_id: str, c: _Call, graph: _Dataflow) -> CallVerdict:
    """``not-re-executed`` for a call an ancestor executed: the run's conclusions downstream rest
    on an effect it never re-executed (its own verdict belongs to the run that executed it)."""
    why = (
        f"inherited from run {c.run_id[:12]}, which executed it at #{c.position + 1}; this "
        f"run did not re-execute it (audit run {c.run_id[:12]} for its effect)"
    )
    decision = _Decision(NOT_RE_EXECUTED, [], why)
    return _verdict(run_id, c, decision, graph.dependents(c.position))


def _not_re_executed(runs: _Runs, run: RunRecord, ref: RunRecord) -> list[CallVerdict]:
    """A ``not-re-executed`` verdict for every side-effecting call of the reference that the run
    neither made nor inherited (a fork that failed, or whose path skipped the call): absence of
    a re-execution is not evidence of a faithful one (seed 004)."""
    made = {(c.node, c.occurrence, c.call.call_index) for c in runs.side_effect_calls(run.run_id)}
    out = []
    for c in runs.side_effect_calls(ref.run_id):
        if (c.node, c.occurrence, c.call.call_index) in made:
            continue
        why = (
            f"run {ref.run_id[:12]} made this call at #{c.position + 1}; this run "
            f"(status {run.status}) never re-executed it"
        )
        out.append(_verdict(run.run_id, c, _Decision(NOT_RE_EXECUTED, [], why)))
    return out


def _flagged_without_calls(
    run_id: str, nodes: list[NodeRecord], verdicts: list[CallVerdict], graph: _Dataflow
) -> list[CallVerdict]:
    """``audit-incomplete`` for every node flagged ``side-effect`` that no other verdict covers:
    its side-effecting calls are not in this store (a run imported without them, or inherited
    from a run that is not here), so nothing says what it did (absence of a record is not
    absence of an effect)."""
    covered = {v.position for v in verdicts}
    out = []
    for n in nodes:
        if n.determinism != "side-effect" or n.position in covered:
            continue
        why = (
            f"node #{n.position + 1} {n.name} is flagged side-effect, but none of its "
            "side-effecting calls is recorded in this store (imported without them, or "
            "inherited from a run that is not here): nothing to audit it with"
        )
        out.append(
            CallVerdict(
                run_id=run_id,
                position=n.position,
                node=n.name,
                call_index=0,
                tool="",
                verdict=INCOMPLETE,
                resources=(),
                reason=why,
                dependents=graph.dependents(n.position),
            )
        )
    return out


def _verdict(run_id: str, c: _Call, d: _Decision, dependents: tuple[str, ...] = ()) -> CallVerdict:
    return CallVerdict(
        run_id=run_id,
        position=c.position,
        node=c.node,
        call_index=c.call.call_index,
        tool=c.call.name,
        verdict=d.verdict,
        resources=tuple(d.details),
        reason=d.reason,
        dependents=dependents,
        output=d.output,
        differs=d.differs,
    )


class _Decision(NamedTuple):
    """What a judge decided for one call (see :class:`CallVerdict` for the fields)."""

    verdict: str
    details: list[ResourceAudit]
    reason: str
    output: str = ""
    differs: tuple[str, ...] = ()


def live_fork_resources(rw: Rewind, run_id: str, at: str | int) -> list[dict[str, Any]]:
    """The resources a ``live`` fork of a run at node ``at`` would re-execute side-effecting
    calls against (what a person must confirm before choosing ``live``).

    Args:
        rw: the session whose store holds the run.
        run_id: the run to fork (id or unique prefix).
        at: the fork node (name, ``name#k`` or 1-based number).
    Returns:
        ``[{"number", "node", "call_index", "tool", "resource", "kind"}]`` for every effect row
        of the side-effecting calls at or after the fork node (calls of inherited nodes resolved
        to the run that executed them), in call order; resources of a call that declared none
        are listed with ``resource`` None.
    Raises:
        UnknownRun, UnknownNode, ForkError: as :meth:`Rewind.fork`.
    """
    from rewind.replay import resolve_node

    run = rw.store.get_run(run_id)
    runs = _Runs(rw)
    nodes = runs.nodes(run.run_id)
    idx = resolve_node(run, nodes, at)
    first = nodes[idx].position
    out: list[dict[str, Any]] = []
    for c in runs.side_effect_calls(run.run_id):
        if c.position < first:
            continue
        base = {
            "number": c.position + 1,
            "node": c.node,
            "call_index": c.call.call_index,
            "tool": c.call.name,
        }
        rows = runs.effects(c.run_id, c.position, c.call.call_index)
        for e in rows or [None]:
            out.append(
                base
                | {
                    "resource": None if e is None else e.resource,
                    "kind": None if e is None else e.kind,
                }
            )
    return out


class _Judge:
    def judge(self, c: _Call) -> tuple[Any, ...]:
        """The fields of a :class:`_Decision` for one call."""
        raise NotImplementedError

    @staticmethod
    def preliminary(
        c: _Call, rows: list[EffectRecord]
    ) -> tuple[str, list[ResourceAudit], str] | None:
        """Verdicts decided by the audited call alone (served, dry-run, nothing recorded)."""
        call = c.call
        if call.outcome in ("served", "dry-run"):
            how = (
                "served from record (effects mode recorded)"
                if call.outcome == "served"
                else "dry-run: logged, executed nothing"
            )
            details = [_detail(e, "", None, None, "missing") for e in rows]
            return NOT_RE_EXECUTED, details, f"{how}; the effect was not reproduced"
        if not rows:
            return (
                INCOMPLETE,
                [],
                "no effect fingerprint recorded (the tool declares no resources), so "
                "faithfulness cannot be asserted",
            )
        return None


def _detail(
    e: EffectRecord,
    reference: str,
    ref_digest: str | None,
    ref_epoch: str | None,
    status: str,
) -> ResourceAudit:
    return ResourceAudit(
        resource=e.resource,
        kind=e.kind,
        recorded_digest=e.post_digest,
        recorded_epoch=e.post_epoch,
        reference=reference,
        reference_digest=ref_digest,
        reference_epoch=ref_epoch,
        epoch_delta=epoch_delta(e.kind, e.post_epoch, ref_epoch) if reference else "",
        status=status,
    )


def _short(digest: str | None) -> str:
    return "none" if digest is None else digest[:12]


def _shorten_name(name: str, limit: int = 48) -> str:
    return name if len(name) <= limit else "…" + name[-(limit - 1) :]


def _decide(
    details: list[ResourceAudit], where: str, extra: str = ""
) -> tuple[str, list[ResourceAudit], str]:
    mismatched = [d for d in details if d.status == "mismatch"]
    missing = [d for d in details if d.status == "missing"]
    if mismatched:
        d = mismatched[0]
        delta = f", epoch Δ {d.epoch_delta}" if d.epoch_delta else ""
        more = f" (+{len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        return (
            DIVERGENT,
            details,
            f"post-state of {_shorten_name(d.resource)} differs from {where}: recorded "
            f"{_short(d.recorded_digest)} vs {_short(d.reference_digest)}{delta}{more}{extra}",
        )
    if missing:
        d = missing[0]
        why = (
            "the call recorded no post fingerprint"
            if d.recorded_digest is None
            else f"{where} has no post fingerprint"
        )
        name = _shorten_name(d.resource)
        return INCOMPLETE, details, f"{name}: {why}, so faithfulness cannot be asserted"
    same_epoch = all(d.epoch_delta in ("", "0") for d in details)
    epochs = "" if same_epoch else " (epochs differ; digests are what count)"
    return FAITHFUL, details, f"post-state equals {where}{epochs}{extra}"


class _AgainstRun(_Judge):
    """Compare with the corresponding call of a reference run (see the module docstring)."""

    def __init__(self, rw: Rewind, runs: _Runs, ref: RunRecord) -> None:
        self.runs = runs
        self.ref = ref
        self.slots: dict[tuple[str, int, int], _Call] = {
            (c.node, c.occurrence, c.call.call_index): c for c in runs.side_effect_calls(ref.run_id)
        }
        self.lineage: dict[str, LineageEntry] = rw._lineage(ref)

    def _reference(self, c: _Call) -> tuple[tuple[str, int, int] | None, str]:
        """(run id, position, call index) of the executed reference call, and how it was
        matched."""
        slot = self.slots.get((c.node, c.occurrence, c.call.call_index))
        executed = slot is not None and slot.call.outcome not in ("served", "dry-run")
        if slot is not None and executed and slot.call.key == c.call.key:
            return (slot.run_id, slot.position, slot.call.call_index), "same cache key"
        entry = self.lineage.get(c.call.key)
        if entry is not None:
            return (entry.run_id, entry.position, entry.call_index), "same cache key"
        if slot is not None:
            if not executed:
                entry = self.lineage.get(slot.call.key)
                if entry is None:
                    return None, "its corresponding call was never executed"
                at = (entry.run_id, entry.position, entry.call_index)
                return at, "same node and call index, other arguments"
            return (slot.run_id, slot.position, slot.call.call_index), (
                "same node and call index, other arguments"
            )
        return None, "no corresponding call"

    def _nothing_to_compare(
        self, c: _Call, rows: list[EffectRecord], at: tuple[str, int, int] | None, how: str
    ) -> tuple[str, list[ResourceAudit], str]:
        """``audit-incomplete``: the reference has no such call (``at`` None), or never executed
        it (served it from this run's record)."""
        ref_id = self.ref.run_id[:12]
        details = [_detail(e, "", None, None, "missing") for e in rows]
        if at is None:
            return INCOMPLETE, details, f"run {ref_id} has {how} to compare with"
        return (
            INCOMPLETE,
            details,
            f"run {ref_id} never executed this call (it served it from this run's record), "
            "so there is no independent post-state to compare with",
        )

    def judge(self, c: _Call) -> tuple[str, list[ResourceAudit], str]:
        rows = self.runs.effects(c.run_id, c.position, c.call.call_index)
        early = self.preliminary(c, rows)
        if early is not None:
            return early
        at, how = self._reference(c)
        if at is None or at == (c.run_id, c.position, c.call.call_index):
            return self._nothing_to_compare(c, rows, at, how)
        ref_rows = self.runs.effects(*at)
        where = f"run {at[0][:12]} #{at[1] + 1}/{at[2]}"
        pairs, unmatched_ref = _pair(rows, ref_rows)
        details = _paired_details(pairs, unmatched_ref, where)
        extra = "" if how == "same cache key" else f" ({how}: a new call, not a replay)"
        ref_call = self.runs.call_at(*at)
        output = ""
        if ref_call is not None and ref_call.result_hash and c.call.result_hash:
            output = "match" if ref_call.result_hash == c.call.result_hash else "mismatch"
        collided = _collided_key(pairs, where)
        if collided is not None:
            return NOT_RE_EXECUTED, details, collided
        decided = _decide(details, where, extra)
        if output == "mismatch" and ref_call is not None:
            post = decided[0] == DIVERGENT
            said = (
                f"output differs from {where}: result {_short(c.call.result_hash)} vs "
                f"{_short(ref_call.result_hash)}"
            )
            halves = ("output", "post-state") if post else ("output",)
            tail = decided[2] if post else f"post-state: {decided[2]}"
            return _Decision(DIVERGENT, details, f"{said}; {tail}", output, halves)
        if decided[0] == DIVERGENT:
            return _Decision(*decided, output, ("post-state",))
        if decided[0] == FAITHFUL:
            doubt = _faithful_doubt([(e, r) for e, r in pairs if r is not None], where)
            if doubt is not None:
                return _Decision(doubt[0], details, doubt[1], output)
        return _Decision(*decided, output)


def _collided_key(pairs: list[tuple[EffectRecord, EffectRecord | None]], where: str) -> str | None:
    """Why the call counts as not re-executed when it reused the idempotency key the reference
    call consumed; None when no key collided."""
    collided = [
        e.idempotency_key
        for e, r in pairs
        if r is not None and e.idempotency_key and e.idempotency_key == r.idempotency_key
    ]
    if not collided:
        return None
    return (
        f"idempotency key {collided[0][:16]} is the one {where} consumed: a tool-side "
        "idempotency cache can answer with the original result without re-executing "
        "(salt it with rewind.effects.idempotency_key)"
    )


def _paired_details(
    pairs: list[tuple[EffectRecord, EffectRecord | None]],
    unmatched_ref: list[EffectRecord],
    where: str,
) -> list[ResourceAudit]:
    """One resource audit per pair (post-states compared) and per reference resource the
    call did not touch (``missing``)."""
    details = []
    for e, r in pairs:
        if r is None:
            details.append(_detail(e, where, None, None, "missing"))
            continue
        status = (
            "missing"
            if e.post_digest is None or r.post_digest is None
            else ("match" if e.post_digest == r.post_digest else "mismatch")
        )
        details.append(_detail(e, where, r.post_digest, r.post_epoch, status))
    for r in unmatched_ref:
        details.append(
            ResourceAudit(
                r.resource,
                r.kind,
                None,
                None,
                where,
                r.post_digest,
                r.post_epoch,
                "",
                "missing",
            )
        )
    return details


def _faithful_doubt(
    compared: list[tuple[EffectRecord, EffectRecord]], where: str
) -> tuple[str, str] | None:
    """(verdict, why) when matching post-states are no evidence of a faithful re-execution;
    None when they are."""
    if all(e.pre_digest is not None and e.pre_digest == e.post_digest for e, _ in compared) and any(
        r.pre_digest is not None and r.pre_digest != r.post_digest for _, r in compared
    ):
        # The end state matches only because the world already held it: re-execution
        # cannot be told from an idempotency cache answering with the original result.
        return (
            NOT_RE_EXECUTED,
            f"the call changed nothing while {where} changed its resource: its matching "
            "post-state cannot be told from an answer served by an idempotency cache",
        )
    other_pre = [
        (e, r) for e, r in compared if e.pre_digest is None or e.pre_digest != r.pre_digest
    ]
    if other_pre:
        # Seed 004, condition 2: only a call run against the recorded pre-state reproduces
        # the recorded effect; the same end state from another start is not evidence.
        e, r = other_pre[0]
        return (
            INCOMPLETE,
            f"{_shorten_name(e.resource)}: the call ran against another pre-state than "
            f"{where} ({_short(e.pre_digest)} vs {_short(r.pre_digest)}), so its equal "
            "post-state is not a reproduction of that effect",
        )
    return None


def _pair(
    rows: list[EffectRecord], ref_rows: list[EffectRecord]
) -> tuple[list[tuple[EffectRecord, EffectRecord | None]], list[EffectRecord]]:
    """Pair each resource with the same resource of the reference: by name, or for a run-scoped
    resource (each run's own artifact folder) by the name with the run id swapped
    (:func:`rewind.effects.same_resource`). Another resource is never a pair, whatever its
    kind: a call that wrote another folder has no reference post-state (``missing``)."""
    rest = sorted(ref_rows, key=lambda r: r.resource)
    pairs: list[tuple[EffectRecord, EffectRecord | None]] = []
    for e in rows:
        match = next((r for r in rest if r.resource == e.resource), None) or next(
            (
                r
                for r in rest
                if r.kind == e.kind and same_resource(e.resource, e.run_id, r.resource, r.run_id)
            ),
            None,
        )
        if match is not None:
            rest.remove(match)
        pairs.append((e, match))
    return pairs, rest


class _AgainstCurrent(_Judge):
    """Compare with the world as it is now (the run's last write of each resource), or with the
    run's own next observation of the resource."""

    def __init__(
        self,
        rw: Rewind,
        runs: _Runs,
        run: RunRecord,
        calls: list[_Call],
        known: dict[str, Fingerprinter],
    ) -> None:
        self.rw = rw
        self.runs = runs
        self.run = run
        self.known = known
        self._imported = False
        self._now: dict[str, tuple[str | None, str | None, str]] = {}
        # Calls that observed each resource (pre fingerprint taken), in order.
        self.observers: dict[str, list[tuple[int, int, EffectRecord]]] = {}
        for c in calls:
            for e in runs.effects(c.run_id, c.position, c.call.call_index):
                if e.pre_digest is not None:
                    self.observers.setdefault(e.resource, []).append(
                        (c.position, c.call.call_index, e)
                    )

    def judge(self, c: _Call) -> tuple[str, list[ResourceAudit], str]:
        rows = self.runs.effects(c.run_id, c.position, c.call.call_index)
        early = self.preliminary(c, rows)
        if early is not None:
            return early
        details = []
        places = []
        for e in rows:
            later = [
                (p, i, o)
                for p, i, o in self.observers.get(e.resource, [])
                if (p, i) > (c.position, c.call.call_index)
            ]
            if later:
                p, i, o = later[0]
                where = f"next call #{p + 1}/{i} of this run"
                ref_digest, ref_epoch = o.pre_digest, o.pre_epoch
            else:
                where = CURRENT
                ref_digest, ref_epoch, why = self._now_of(e, c.call)
                if ref_digest is None:
                    details.append(_detail(e, "", None, None, "missing"))
                    places.append(why)
                    continue
            places.append(where)
            if e.post_digest is None:
                status = "missing"
            else:
                status = "match" if e.post_digest == ref_digest else "mismatch"
            details.append(_detail(e, where, ref_digest, ref_epoch, status))
        if any(d.status == "missing" and d.recorded_digest is not None for d in details):
            why = next(p for p, d in zip(places, details, strict=True) if not d.reference)
            return INCOMPLETE, details, f"cannot fingerprint the current state: {why}"
        where = (
            "the resource's current state"
            if all(p == CURRENT for p in places)
            else "the state this run observed before writing it again"
            if all(p != CURRENT for p in places)
            else "the current / next observed state"
        )
        return _decide(details, where)

    def _now_of(self, e: EffectRecord, call: CallRecord) -> tuple[str | None, str | None, str]:
        if e.resource not in self._now:
            fp, why = self._fingerprinter(e, call)
            if fp is None:
                self._now[e.resource] = (None, None, why)
            else:
                try:
                    now = fp.fingerprint()
                except FingerprintUnavailable as exc:
                    self._now[e.resource] = (None, None, exc.message)
                else:
                    self._now[e.resource] = (now.digest, now.epoch, "")
        return self._now[e.resource]

    def _fingerprinter(self, e: EffectRecord, call: CallRecord) -> tuple[Fingerprinter | None, str]:
        """Rebuild the resource's fingerprinter: the caller's, the one the tool declares for
        the recorded arguments, the recorded parameters (once the engine records them), then
        from the recorded kind and name (exact for file trees and URLs only)."""
        if e.resource in self.known:
            return self.known[e.resource], ""
        fp = self._declared(e, call)  # first: it carries the tool's own settings (HTTP client)
        if fp is not None:
            return fp, ""
        spec = getattr(e, "spec", None)  # forward-compatible: see the engine patch in the report
        if isinstance(spec, dict):
            fp = _from_spec(e.kind, spec)
            if fp is not None and fp.name == e.resource:
                return fp, ""
        if e.kind == FileTree.kind and e.resource.startswith("file:"):
            return FileTree(e.resource[len("file:") :]), ""
        if e.kind == HttpResource.kind:
            return HttpResource(e.resource), ""
        return None, (
            f"{e.resource} ({e.kind}) cannot be rebuilt from its name: the store does not record "
            "the fingerprinter's parameters (pass resources= or make the tool importable)"
        )

    def _declared(self, e: EffectRecord, call: CallRecord) -> Fingerprinter | None:
        from rewind.tools import registered

        if not self._imported:
            self._imported = True
            with contextlib.suppress(Exception):  # importing registers the pipeline's tools
                self.rw.pipeline_of(self.run)
        t = registered().get(call.name)
        if t is None or t.resources is None:
            return None
        declared: Sequence[Any]
        if callable(t.resources):
            try:
                args = json.loads(self.rw.store.get_blob(call.request_hash))
                if t.idempotency_arg and t.idempotency_arg not in args:
                    args[t.idempotency_arg] = None
                declared = tuple(t.resources(**args))
            except Exception:  # a resource function that needs its run: fall back to the name
                return None
        else:
            declared = tuple(t.resources)
        return next(
            (r for r in declared if isinstance(r, Fingerprinter) and r.name == e.resource), None
        )


def _from_spec(kind: str, spec: dict[str, Any]) -> Fingerprinter | None:
    try:
        if kind == FileTree.kind:
            return FileTree(spec["path"])
        if kind == SQLiteTable.kind:
            return SQLiteTable(
                spec["db_path"], spec["table"], spec.get("order_by", "rowid"), spec.get("epoch_sql")
            )
        if kind == HttpResource.kind:
            return HttpResource(spec["url"])
    except (KeyError, TypeError, ValueError):
        return None
    return None


class _Dataflow:
    """Which later nodes read (transitively) what a node wrote, from the recorded documents."""

    def __init__(self, rw: Rewind, nodes: list[NodeRecord]) -> None:
        self.rw = rw
        self.nodes = nodes

    def _writes(self, node: NodeRecord) -> set[str]:
        return set(self.rw._output_map(node))

    def _reads(self, node: NodeRecord) -> set[str]:
        doc = self.rw.store.get_json(node.input_hash)
        return set(doc.get("reads", {}))

    def dependents(self, position: int) -> tuple[str, ...]:
        """``"<number>:<name>"`` of nodes after ``position`` reading a field derived from what
        the node at ``position`` wrote. A field a clean node overwrites stops being derived."""
        source = next((n for n in self.nodes if n.position == position), None)
        if source is None:
            return ()
        tainted = self._writes(source)
        out = []
        for n in self.nodes:
            if n.position <= position or not tainted:
                continue
            writes = self._writes(n)
            if self._reads(n) & tainted:
                out.append(f"{n.position + 1}:{n.name}")
                tainted |= writes
            else:
                tainted -= writes
        return tuple(out)


# -- rewind verify, check 15 -------------------------------------------------------------------


def verify_effects_check(rw: Rewind, demo_result: DemoResult) -> tuple[bool, str]:
    """``rewind verify`` check 15: the effect audit tells the demo's calls apart, and catches a
    tampered artifact.

    Expected, and why:

    1. unchanged replay (effects ``recorded``), audited against its parent: exactly one
       side-effecting call, ``publish``'s ``rewind.publish``, verdict ``not-re-executed`` (it was
       served from record; the report therefore fails closed — by design).
    2. the parent (no parent of its own) audited against the current state of its artifact
       folder: ``faithful``.
    3. the param fork, which ran ``publish`` live: against the current state of its own folder,
       ``faithful``; against its parent, ``divergent`` — its arguments changed (the report is
       about another grouping, check 7), so its effect is not the parent's, and calling it
       faithful would be a lie.
    4. tamper: one byte appended to the parent's ``report.md`` → the parent's audit is
       ``divergent`` with both digests; the original bytes are written back (new mtime) → the
       audit is ``faithful`` again (an mtime is an epoch, not content); the mtime is restored.

    Returns:
        (passed, one line with the numbers). A crash inside counts as a failure of the caller.
    """
    from rewind.artifacts import ARTIFACT_TOOL

    parent, fork, replay = demo_result.parent, demo_result.fork, demo_result.replay

    def shape(r: AuditReport) -> list[tuple[str, str, str]]:
        return [(v.node, v.tool, v.verdict) for v in r.verdicts]

    publish = ("publish", ARTIFACT_TOOL)
    r_replay = audit_run(rw, replay.run_id)
    ok_replay = shape(r_replay) == [(*publish, NOT_RE_EXECUTED)] and (
        r_replay.against == parent.run_id and not r_replay.passed
    )
    r_parent = audit_run(rw, parent.run_id)
    ok_parent = shape(r_parent) == [(*publish, FAITHFUL)] and r_parent.against == CURRENT
    r_fork_now = audit_run(rw, fork.run_id, CURRENT)
    r_fork_parent = audit_run(rw, fork.run_id)
    ok_fork = shape(r_fork_now) == [(*publish, FAITHFUL)] and shape(r_fork_parent) == [
        (*publish, DIVERGENT)
    ]

    arts = rw.store.artifacts_of(parent.run_id)
    if not arts:
        return False, f"run {parent.run_id[:12]} has no artifact to tamper with"
    path = Path(arts[0]["path"])
    original = path.read_bytes()
    st = path.stat()
    try:
        path.write_bytes(original + b"!")
        r_tampered = audit_run(rw, parent.run_id)
        path.write_bytes(original)
        r_restored = audit_run(rw, parent.run_id)
    finally:
        path.write_bytes(original)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    t = r_tampered.verdicts[0] if r_tampered.verdicts else None
    res = t.resources[0] if t is not None and t.resources else None
    ok_tamper = (
        t is not None
        and t.verdict == DIVERGENT
        and res is not None
        and res.recorded_digest is not None
        and res.reference_digest is not None
        and res.recorded_digest != res.reference_digest
    )
    ok_restored = shape(r_restored) == [(*publish, FAITHFUL)]
    tamper_text = (
        f"{_short(res.recorded_digest)}→{_short(res.reference_digest)}" if res else "no verdict"
    )
    detail = (
        f"replay: {_counts_text(r_replay)}; parent vs current: {_counts_text(r_parent)}; "
        f"fork vs current: {_counts_text(r_fork_now)}, vs parent: {_counts_text(r_fork_parent)}; "
        f"tampered: {t.verdict if t else 'none'} {tamper_text}; "
        f"restored: {_counts_text(r_restored)}"
    )
    passed = ok_replay and ok_parent and ok_fork and ok_tamper and ok_restored
    return passed, detail


def _counts_text(report: AuditReport) -> str:
    parts = [f"{n} {k}" for k, n in report.counts.items() if n]
    return ", ".join(parts) or "no calls"
