"""Fork planning: every check a fork needs before anything is written, in one place.

:func:`plan_fork` turns a fork request — parent run, fork node, at most one override, effects
mode — into a :class:`ForkPlan`, or refuses it with an :class:`~rewind.errors.InvalidRequest`
(the CLI exits 2, the API answers 422; an unknown node or run is 404) whose ``field`` names the
request field at fault, or a :class:`~rewind.errors.ForkError`/``RunBusy`` (409). Every surface
that starts a fork goes through it: ``rewind fork`` and :meth:`Rewind.fork`, the what-if grid,
stability runs and the HTTP API (hence the UI), so a value one of them refuses is refused by all,
with the same message and field — including the values the pipeline's own ``param_check``
refuses.

The override records themselves (:class:`ParamOverride`, :class:`OutputOverride`,
:class:`InputOverride`) and their command-line syntax (:func:`parse_override`) live here too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rewind.canonical import CanonicalError, canonical_bytes, sha256_hex
from rewind.drift import GraphDrift
from rewind.effects import EFFECT_MODES, RESTORE_MODES
from rewind.engine.attach import Pipeline
from rewind.engine.drive import Launch, plan_launch
from rewind.errors import (
    ForkError,
    InvalidOverride,
    RewindError,
    UnknownNode,
    UnstorableValue,
)
from rewind.persister import EncodedField, encode_value
from rewind.store import NodeRecord, RunRecord

if TYPE_CHECKING:
    from rewind.replay import Rewind

CACHE_MODES = ("replay", "stability")
"""``replay``: read and write the caches; ``stability``: every call live, nothing cached."""


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


@dataclass(frozen=True)
class InputOverride:
    """Change one Burr runtime input of one node (``app.run(inputs=...)``), e.g.
    ``prompt.prompt``; the other nodes keep the recorded inputs. Carried in the run context,
    never in state."""

    node: str
    name: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        """The override as stored on the fork's run row."""
        return {"kind": "input", "node": self.node, "name": self.name, "value": self.value}


Override = ParamOverride | OutputOverride | InputOverride


def override_target(doc: Mapping[str, Any]) -> tuple[str, str, str]:
    """``(kind, node, name)`` of a stored override (``override.to_json()``): kind ``param``,
    ``output`` or ``input``; name the param, output field or runtime input it changes."""
    kind = str(doc.get("kind") or "output")
    key = {"param": "param", "input": "name"}.get(kind, "field")
    return kind, str(doc.get("node")), str(doc.get(key))


def parse_override(spec: str, *, output: bool = False, input_: bool = False) -> Override:
    """Parse ``node.name=VALUE`` from the command line.

    For a param (``--set``) VALUE is JSON when it parses as JSON, else a plain string. For an
    output field (``--set-output``) or a runtime input (``--set-input``, ``input_=True``) VALUE
    must be JSON.

    Raises:
        InvalidOverride: the spec is malformed or an output/input value is not valid JSON.
    """
    flag = "--set-output" if output else "--set-input" if input_ else "--set"
    left, sep, raw = spec.partition("=")
    node, dot, name = left.strip().partition(".")
    if not sep or not dot or not node or not name:
        raise InvalidOverride(
            f"malformed override {spec!r}", f"write it as {flag} node.field=VALUE"
        )
    if output or input_:
        try:
            value = json.loads(raw, parse_constant=_no_constant)
            _finite(value, left)
        except json.JSONDecodeError as exc:
            raise InvalidOverride(
                f"the value of {left} is not valid JSON: {exc.msg} at column {exc.colno}",
                f"quote strings as JSON, e.g. {flag} {left}='\"new text\"'",
            ) from exc
        return InputOverride(node, name, value) if input_ else OutputOverride(node, name, value)
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


# -- checks -----------------------------------------------------------------------------------


def resolve_node(
    run: RunRecord, nodes: Sequence[NodeRecord], at: str | int, *, field: str | None = None
) -> int:
    """Index into ``nodes`` of the node ``at`` names.

    Args:
        at: a node name, ``"name#k"`` (k-th execution, 1-based), or a 1-based node number.
        field: the request field ``at`` came from, carried by the errors (``at``,
            ``from_node``); None outside a request.
    Raises:
        UnknownNode: no such node in the run.
        ForkError: the run failed or was interrupted before reaching that node (or before any).
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
            field=field,
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
                field=field,
            )
        raise UnknownNode(
            f"run {run.run_id[:12]} has no node number {number} (it has {len(nodes)})",
            f"its nodes: {listing}",
            field=field,
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
            field=field,
        )
    raise UnknownNode(
        f"run {run.run_id[:12]} has no node {str(at)!r}", f"its nodes: {listing}", field=field
    )


def validate_override(
    nodes: Sequence[NodeRecord],
    idx: int,
    override: Override | None,
    *,
    node_inputs: Callable[[NodeRecord], Mapping[str, Any]] | None = None,
    field: str = "override",
) -> None:
    """Check an override names a param/input/field the target node has, at or after the fork
    point (part of :func:`plan_fork`).

    Args:
        node_inputs: a node's recorded Burr runtime inputs (``Rewind.node_runtime_inputs``);
            required to check an :class:`InputOverride`.
        field: where the override sits in the request; errors name ``<field>.node``,
            ``<field>.param`` or ``<field>.name``.
    Raises:
        InvalidOverride: it does not (the message names the field and lists the valid ones).
    """
    if override is None:
        return
    fork_node = nodes[idx]
    if isinstance(override, OutputOverride):
        if override.node != fork_node.name:
            raise InvalidOverride(
                f"the output override names node {override.node!r}, which is not the fork node: "
                f"the fork is at {fork_node.name!r}",
                f"an output override replaces what the fork node wrote: fork at {override.node}",
                field=f"{field}.node",
            )
        return
    what = "param" if isinstance(override, ParamOverride) else "input"
    later = _override_nodes(nodes, idx, override.node, what, field)
    if isinstance(override, ParamOverride):
        name, known, where = override.param, [n.params for n in later], f"{field}.param"
    else:
        if node_inputs is None:
            raise TypeError("validate_override needs node_inputs to check an InputOverride")
        name, known, where = override.name, [node_inputs(n) for n in later], f"{field}.name"
    names = sorted({k for doc in known for k in doc})
    if name not in names:
        raise InvalidOverride(
            f"node {override.node!r} has no {what} {name!r}",
            f"its {what}s: {', '.join(names) or 'none'}",
            field=where,
        )
    recorded = next(doc[name] for doc in known if name in doc)
    _check_value_type(override.node, name, what, recorded, override.value, where)


def _override_nodes(
    nodes: Sequence[NodeRecord], idx: int, node: str, what: str, field: str
) -> list[NodeRecord]:
    """The executions of ``node`` at or after the fork point (InvalidOverride when none)."""
    later = [n for n in nodes[idx:] if n.name == node]
    if later:
        return later
    if any(n.name == node for n in nodes[:idx]):
        raise InvalidOverride(
            f"node {node!r} runs before the fork node {nodes[idx].name!r}, so "
            f"changing its {what} would have no effect",
            f"fork at {node} instead",
            field=f"{field}.node",
        )
    raise InvalidOverride(
        f"the run has no node {node!r}",
        f"nodes from the fork point on: {', '.join(n.name for n in nodes[idx:])}",
        field=f"{field}.node",
    )


def _check_value_type(
    node: str, name: str, what: str, recorded: Any, value: Any, where: str
) -> None:
    """Refuse a new value of another JSON type than the recorded one (null fits any)."""
    was, now = _json_type(recorded), _json_type(value)
    if recorded is not None and value is not None and was != now:
        raise InvalidOverride(
            f"{node}.{name} was recorded as a {was} "
            f"({json.dumps(recorded)[:40]}); the new value is a {now}",
            f"pass a {was}"
            + (
                " (JSON strings need quotes only with --set-output/--set-input)"
                if was == "string" and what == "param"
                else ""
            ),
            field=where,
        )


def _plain_json(value: Any) -> bool:
    """True for a value JSON writes as itself (str, number, bool, null, list, dict)."""
    return value is None or isinstance(value, str | int | float | bool | list | dict)


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


# -- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForkPlan:
    """A fork request that passed every check: what :meth:`Rewind.fork` executes.

    Attributes:
        parent: the finished run forked.
        nodes: the parent's node executions, in order.
        index: 0-based index into ``nodes`` of the fork node.
        override: the one change, or None (an unchanged replay).
        effects: side-effect mode (``recorded``, ``dry-run``, ``live``).
        restore: ``refuse`` or ``replace`` (only with ``live``).
        cache_mode: ``replay`` or ``stability``.
        pipeline: the parent's pipeline as re-imported now.
        graph: that pipeline's graph document (:meth:`Pipeline.graph_document`).
        drift: the graph's drift from the recording where the fork runs it; None when the parent
            was recorded without its graph (drift cannot be checked).
        launch: the parent's runtime inputs and halt conditions, re-checked on ``pipeline``.
        source: ``(app_id, sequence_id)`` of the Burr state row the fork resumes from (the last
            completed node before the fork node); None when the fork starts from the initial
            state or replaces the fork node's output.
        output: the output override's value encoded as a state field (:mod:`rewind.serde`);
            None without an output override.
        graph_bytes: ``graph``'s canonical bytes (the blob the fork's run records).
    """

    parent: RunRecord
    nodes: tuple[NodeRecord, ...]
    index: int
    override: Override | None
    effects: str
    restore: str
    cache_mode: str
    pipeline: Pipeline
    graph: dict[str, Any]
    drift: GraphDrift | None
    launch: Launch
    source: tuple[str, int] | None = None
    output: EncodedField | None = None
    graph_bytes: bytes | None = None

    @property
    def fork_node(self) -> NodeRecord:
        """The node the fork starts at."""
        return self.nodes[self.index]

    @property
    def at_number(self) -> int:
        """The fork node's 1-based number (as ``rewind show`` lists it)."""
        return self.index + 1


def plan_fork(
    rw: Rewind,
    run_id: str,
    *,
    at: str | int,
    override: Override | None = None,
    effects: str = "recorded",
    restore: str = "refuse",
    cache_mode: str = "replay",
    allow_code_change: bool = False,
    at_field: str = "at",
    override_field: str = "override",
    parent: RunRecord | None = None,
) -> ForkPlan:
    """Check a fork request against the stored parent and the pipeline as re-imported now.

    Reads only: nothing is written whatever the outcome. Checks, in this order: the modes;
    the parent (exists, finished); the fork node; the override (a node at or after the fork
    node that has this param or runtime input, a value of the recorded JSON type; an output
    field the fork node wrote); that its value can be hashed and stored (:mod:`rewind.serde`);
    that the pipeline re-imports; the pipeline's ``param_check``; code drift; the recorded
    launch; the state row the fork resumes from.

    Args:
        rw: the session (store, registered pipelines).
        run_id: the parent run (id or unique prefix).
        at: the fork node: name, ``name#k`` or 1-based number.
        override: at most one change; see :class:`ParamOverride`, :class:`OutputOverride`,
            :class:`InputOverride`.
        effects, restore, cache_mode, allow_code_change: as :meth:`Rewind.fork`.
        at_field: the request field ``at`` came from (``at``; ``from_node`` for stability).
        override_field: where the override sits in the request (``override``;
            ``overrides.2`` for a grid's third variant); errors name ``<override_field>.param``.
        parent: ``run_id``'s record when the caller has just read it with
            :meth:`Rewind.finished_run` (not read again).
    Returns:
        the plan.
    Raises:
        InvalidOverride: an unknown mode, a malformed override, a param/input/field the node
            does not have, a value of another type, one that cannot be hashed, or one the
            pipeline's ``param_check`` refuses (``field`` names the request field).
        UnknownRun, UnknownNode: no such run or node.
        RunBusy: the parent is still running.
        ForkError: the parent failed before the fork node, its pipeline cannot be re-imported,
            or the state row the fork resumes from is missing; CodeDrift (a ForkError): the
            graph changed where the fork runs it and ``allow_code_change`` is False.
    """
    _check_modes(effects, restore, cache_mode)
    if parent is None or parent.run_id != run_id:
        parent = rw.finished_run(run_id)
    nodes = rw.parent_reads.nodes(parent)  # read once per finished parent and session
    if override is not None and not isinstance(
        override, ParamOverride | OutputOverride | InputOverride
    ):
        raise InvalidOverride(
            "override must be a ParamOverride, an OutputOverride or an InputOverride, not "
            f"{type(override)}",
            "e.g. ParamOverride('analyse', 'group_by', 'season')",
            field=override_field,
        )
    idx = resolve_node(parent, nodes, at, field=at_field)
    fork_node = nodes[idx]
    validate_override(
        nodes, idx, override, node_inputs=rw.node_runtime_inputs, field=override_field
    )
    output: EncodedField | None = None
    if isinstance(override, OutputOverride):
        recorded_output = rw.node_output(fork_node)
        written = sorted(recorded_output)
        if override.field not in written:
            raise InvalidOverride(
                f"node {fork_node.name!r} has no output field {override.field!r}",
                f"its fields: {', '.join(written) or 'none'}",
                field=f"{override_field}.field",
            )
        recorded_value = recorded_output[override.field]
        if _plain_json(recorded_value) and _plain_json(override.value):
            # a typed Python value (a tuple, a model) goes through serde: no JSON type to compare
            _check_value_type(
                fork_node.name,
                override.field,
                "output",
                recorded_value,
                override.value,
                f"{override_field}.value",
            )
        output = _encoded(override, f"{override_field}.value")
    elif override is not None:
        _hashable(override.value, f"{override_field}.value")
    try:
        pipeline = rw.pipeline_of(parent)
    except RewindError as exc:
        raise ForkError(
            f"cannot rebuild pipeline {parent.pipeline!r}: {exc.message}", exc.hint
        ) from exc
    if isinstance(override, ParamOverride):
        _check_param(rw, pipeline, nodes, idx, override, f"{override_field}.value")
    graph = pipeline.graph_document()
    graph_bytes = canonical_bytes(graph)
    drift = rw.check_drift(
        parent,
        list(nodes),
        idx,
        graph,
        output_override=isinstance(override, OutputOverride),
        allow_code_change=allow_code_change,
        current_hash=sha256_hex(graph_bytes),
    )
    recorded = Launch.from_json(parent.launch)
    launch = plan_launch(
        pipeline,
        inputs=recorded.inputs,
        halt_after=recorded.halt_after,
        halt_before=recorded.halt_before,
    )
    return ForkPlan(
        parent=parent,
        nodes=nodes,
        index=idx,
        override=override,
        effects=effects,
        restore=restore,
        cache_mode=cache_mode,
        pipeline=pipeline,
        graph=graph,
        drift=drift,
        launch=launch,
        source=None if isinstance(override, OutputOverride) else _source(rw, parent, nodes, idx),
        output=output,
        graph_bytes=graph_bytes,
    )


def _check_modes(effects: str, restore: str, cache_mode: str) -> None:
    if cache_mode not in CACHE_MODES:
        raise InvalidOverride(
            f"unknown cache mode {cache_mode!r}", "use replay or stability", field="cache_mode"
        )
    if effects not in EFFECT_MODES:
        raise InvalidOverride(
            f"unknown effects mode {effects!r}",
            f"use one of {', '.join(EFFECT_MODES)}",
            field="effects",
        )
    if restore not in RESTORE_MODES:
        raise InvalidOverride(
            f"unknown restore mode {restore!r}",
            f"use one of {', '.join(RESTORE_MODES)}",
            field="restore",
        )
    if restore == "replace" and effects != "live":
        raise InvalidOverride(
            f"restore=replace deletes files a pinned snapshot does not hold: it needs "
            f"effects=live, not {effects}",
            "fork with effects live too (CLI: --effects live --restore replace), or leave "
            "restore at refuse",
            field="restore",
        )


def _hashable(value: Any, field: str) -> None:
    """Refuse a value the canonical hasher cannot hash (NaN, ±Infinity, a non-JSON type)."""
    try:
        canonical_bytes(value)
    except (CanonicalError, ValueError, TypeError) as exc:
        raise InvalidOverride(
            f"the new value cannot be hashed: {exc}", "send plain JSON", field=field
        ) from exc


def _encoded(override: OutputOverride, field: str) -> EncodedField:
    """The output override's value as the state field it replaces, encoded exactly as the
    recorder encodes state (typed values through :mod:`rewind.serde`)."""
    try:
        return encode_value(override.field, override.value)
    except UnstorableValue as exc:
        raise InvalidOverride(
            f"the new value cannot be hashed: {exc.message}", exc.hint, field=field
        ) from exc


def _check_param(
    rw: Rewind,
    pipeline: Pipeline,
    nodes: Sequence[NodeRecord],
    idx: int,
    override: ParamOverride,
    field: str,
) -> None:
    """Ask the pipeline's ``param_check`` whether the node can use a param override's value.

    Raises:
        InvalidOverride: it cannot (the message is the pipeline's).
    """
    if pipeline.param_check is None and pipeline.param_hints is None:
        return
    target = next(n for n in nodes[idx:] if n.name == override.node)
    node_input = rw.node_input(target)
    problem = None
    if pipeline.param_check is not None:
        problem = pipeline.param_check(override.node, override.param, override.value, node_input)
    if not problem:
        problem = hint_problem(
            _declared_hint(pipeline, override.node, override.param, node_input), override.value
        )
    if problem:
        raise InvalidOverride(
            f"{override.node}.{override.param}={json.dumps(override.value)}: {problem}",
            "",
            field=field,
        )


def _declared_hint(
    pipeline: Pipeline, node: str, param: str, node_input: dict[str, Any]
) -> dict[str, Any] | None:
    """The pipeline's ``param_hints`` for one param (None: nothing declared, or the hook
    failed: a hint is advice, it never breaks a fork by raising)."""
    if pipeline.param_hints is None:
        return None
    try:
        hint = pipeline.param_hints(node, param, node_input)
    except Exception:  # a pipeline's hook must not turn a fork into a crash
        return None
    return dict(hint) if isinstance(hint, Mapping) else None


def hint_problem(hint: Mapping[str, Any] | None, value: Any) -> str | None:
    """Why ``value`` is outside a declared param hint (``choices``, ``type``, ``min``,
    ``max``), or None when it fits (or nothing is declared)."""
    if not hint:
        return None
    choices = hint.get("choices")
    if isinstance(choices, list) and choices and value not in choices:
        shown = ", ".join(json.dumps(c) for c in choices[:20])
        return f"allowed values: {shown}" + (" …" if len(choices) > 20 else "")
    kind = hint.get("type")
    if kind in ("number", "integer"):
        is_num = isinstance(value, int | float) and not isinstance(value, bool)
        if not is_num or (kind == "integer" and not isinstance(value, int)):
            return f"must be {'an integer' if kind == 'integer' else 'a number'}"
        low, high = hint.get("min"), hint.get("max")
        if (low is not None and value < low) or (high is not None and value > high):
            return f"must be from {low} to {high}"
    return None


def param_hints(rw: Rewind, run_id: str, at: str | int) -> dict[str, dict[str, Any]]:
    """The declared hints of each param a node execution recorded (what a fork at it may set),
    from the run's pipeline's ``param_hints``: ``{param: hint}``; params without a hint are
    left out.

    Args:
        rw: the session (its registered pipelines, or the run's ``pipeline_ref``).
        run_id: the run (id or unique prefix).
        at: the node (name, ``name#k`` or 1-based number).
    Raises:
        UnknownRun, UnknownNode: as :func:`plan_fork`.
    """
    run = rw.store.get_run(run_id)
    nodes = rw.store.nodes_of(run.run_id, with_calls=False)
    node = nodes[resolve_node(run, nodes, at)]
    try:
        pipeline = rw.pipeline_of(run)
    except RewindError:
        return {}  # its code cannot be imported here: no hints (a fork would say why)
    if pipeline.param_hints is None:
        return {}
    node_input = rw.node_input(node)
    out: dict[str, dict[str, Any]] = {}
    for name in node.params:
        hint = _declared_hint(pipeline, node.name, name, node_input)
        if hint:
            out[name] = hint
    return out


def _source(
    rw: Rewind, parent: RunRecord, nodes: Sequence[NodeRecord], idx: int
) -> tuple[str, int] | None:
    """The Burr state row a fork at ``nodes[idx]`` resumes from: the row of the last completed
    node before it, found through ``src_app_id``/``src_sequence_id`` (a nested fork's row may
    live in an ancestor). None for the first node: the fork starts from the initial state.

    Raises:
        ForkError: the row (or the initial state) is missing; Burr would silently start from
            its default state instead.
    """
    if idx == 0:
        if parent.initial_state_hash is None:
            raise ForkError(f"run {parent.run_id} has no recorded initial state", "")
        return None
    pred = nodes[idx - 1]
    row = rw.store.load_state_row("", pred.src_app_id, pred.src_sequence_id, values=False)
    if row is None or row["status"] != "completed":
        raise ForkError(
            f"fork source row {pred.src_app_id}#{pred.src_sequence_id} (state after "
            f"{pred.name!r}) is missing from the store",
            "the store is incomplete; record the run again",
        )
    return pred.src_app_id, pred.src_sequence_id
