"""Store functions for traces: write one trace as a run, read runs and traces back as views.

Functions over a :class:`~rewind.store.Store` (its own class stays the engine's): a trace is
written in one ``BEGIN IMMEDIATE`` transaction — the run row, node rows with their calls, the LLM
and tool cache entries the calls produced, content-addressed blobs, a Burr-style state row per
failed step (a completed step's state row is derived from its state document, see
:meth:`Store.load_state_row`) and the ``spans`` rows — so a trace is either wholly there or not
at all. Hashes are made exactly as the Burr recorder makes them (see :mod:`rewind.recorder`):
``input_hash`` covers the node name, the hashes of the fields it read, its inputs and params;
``output_hash`` is the Merkle hash of ``{field: field hash}`` of what it wrote; ``state_hash``
that of the whole state after it. A replay's steps that equal its source's are not written again
(:mod:`rewind.store.references`); the readers here resolve them.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, select, text

from rewind.canonical import canonical_bytes, sha256_hex
from rewind.context import LineageEntry, NodeScope
from rewind.errors import RewindError, StoreError, UnknownRun
from rewind.llm import ChatResponse
from rewind.persister import encode_value, map_hash
from rewind.recorder import add_scope_rows, node_determinism, node_outcome, sorted_calls
from rewind.serde import TAG, decode, display
from rewind.store import CallRecord, NodeRecord, RunRecord, Store, schema
from rewind.store.codec import unpack as unpack_blob
from rewind.store.records import NOT_ANSWERS, EffectRecord, storable_text
from rewind.store.references import (
    MAX_DEPTH,
    REFERENCE_KEY,
    MappingRow,
    SourceRows,
    load_rows,
    same_calls,
    same_node,
    same_span,
    virtual_call,
    virtual_node,
)
from rewind.store.references import resolve as resolve_reference
from rewind.store.spans import expand as expand_spans
from rewind.store.spans import pack_rows as pack_span_rows
from rewind.store.store import WriteBatch, call_rows, pack_groups, state_row
from rewind.tracing import step_memo
from rewind.tracing.model import (
    CHAIN_TYPE,
    ROOT_POSITION,
    LlmCallView,
    StepData,
    StepStatus,
    StepView,
    TraceData,
    TraceView,
    error_line,
    natural,
    run_status_of,
    split_error,
    trace_status_of,
)

__all__ = [
    "count_traces",
    "is_trace",
    "lineage_blobs",
    "lineage_index",
    "load_trace",
    "load_traces",
    "parse_time",
    "search_runs",
    "state_at",
    "trace_exists",
    "write_trace",
]

_IN_CHUNK = 400


# -- write -------------------------------------------------------------------------------------


def write_trace(
    store: Store,
    data: TraceData,
    *,
    source: SourceRows | None = None,
    signed: dict[int, bytes] | None = None,
) -> RunRecord:
    """Write a trace: run row, node rows, calls, cache entries, blobs, state rows, spans.

    A replay (``data.parent_run_id`` set) whose first steps are, row for row, what its source
    recorded seen through the cache (same hashes, call keys and results, every call a hit) is
    stored by reference (:mod:`rewind.store.references`): those steps get no rows of their own,
    only the steps from the first divergence on are written in full.

    Args:
        store: the store.
        data: the trace; steps in any order (written by position, which must be 0..n-1).
        source: the rows of ``data.parent_run_id`` when the caller has them already (read
            here otherwise).
        signed: ``id(step)`` -> signature (:func:`rewind.tracing.step_memo.signature`) of
            steps of ``data`` the caller rebuilt from remembered ones (the tracer's lane), so
            they are not signed again; the others are signed here when needed.
    Returns:
        the run row as written.
    Raises:
        StoreError: the trace id exists already, or positions are not 0..n-1.
        CanonicalError: a value cannot be hashed (callers pass values through ``jsonable``).
    """
    steps = _steps_in_order(data)
    blobs: dict[str, bytes] = dict(data.extra_blobs)
    state = _encode_map(data.input, blobs)
    initial = state
    init_doc, init_hash = map_hash(state)
    blobs[init_hash] = init_doc
    # Node, call, cache, effect and span rows go through the recorder's batch and
    # Store.write_batch: one write path for Burr runs and traced chains.
    batch = WriteBatch(blobs=blobs)
    # A replay step whose state is its source's at the same position refers to the source's
    # state row (as a fork's inherited node does) instead of storing a copy of it.
    memo_source = source is not None and source.is_trace and bool(data.parent_run_id)
    source = _source_of(store, data, source)
    source_states = _source_states(store, data.parent_run_id, source)
    # Steps a replay of this source (the caller's rows, kept in-process) already proved equal
    # to it need no rows when their data is the same (rewind.tracing.step_memo).
    proven = step_memo.remembered(source, init_hash) if memo_source else []
    fast, state, tokens = _fast_forward(steps, proven, state, signed or {})
    parts, states = _rows_from(data, steps[fast:], state, source_states)
    shared = fast + _shared_prefix(data.trace_id, parts, source, start=fast)
    if memo_source and source is not None and shared > fast:
        step_memo.remember(
            source, init_hash, fast, _proven(steps[fast:shared], states[: shared - fast + 1])
        )
    node_rows = [p[0] for p in parts]
    _absorb(batch, parts[shared - fast :])
    config = {"kind": "trace"} | data.config
    target = _reference_target(source, shared) if shared and source is not None else None
    if target is None and shared:
        # too deep a chain of references: this replay's rows are written in full (the rows
        # of the steps proven equal before are built now)
        parts = _early_rows(data, steps[:fast], source_states) + parts
        node_rows = [p[0] for p in parts]
        tokens = (0, 0)
        _absorb(batch, parts[:shared])
        batch.nodes.sort(key=lambda n: n["position"])
        shared = 0
    if shared and source is not None and target is not None:
        _refer(config, target, shared, every=shared == len(steps) == len(source.nodes))
    output_bytes = canonical_bytes(data.output)
    output_hash = sha256_hex(output_bytes)
    blobs[output_hash] = output_bytes
    batch.spans.append(_root_span(data, output_hash))
    # Ctrl-C (and SIGTERM, which the CLI raises as KeyboardInterrupt) ends a trace as it ends a
    # Burr run: interrupted, not failed by the chain (its view still says `failed`).
    interrupted = data.error_type == "KeyboardInterrupt"
    run_status = "interrupted" if interrupted else run_status_of(data.status)
    trace_error = _trace_error(data)
    edges = _new_edges(data, steps, source, shared)

    def run_row(conn: Connection) -> dict[str, Any]:
        values = store.create_run(
            conn,
            run_id=data.trace_id,
            pipeline=data.name,
            pipeline_ref="",
            status=run_status,
            parent_run_id=data.parent_run_id,
            fork_node=data.fork_node,
            fork_position=data.fork_position,
            override=data.override,
            initial_state_hash=init_hash,
            config=config,
            created_at=data.started_at,
            finished_at=None if run_status == "running" else data.ended_at,
            prompt_tokens=tokens[0] + sum(int(r["prompt_tokens"]) for r in node_rows),
            completion_tokens=tokens[1] + sum(int(r["completion_tokens"]) for r in node_rows),
            latency_ms=float(data.duration_ms),
            error=trace_error,
            owner=None,
        )
        store.put_edges(data.name, edges, conn)
        return values

    _drop_named_by_source(blobs, data, source, (init_hash, initial, output_hash))
    batch.spans = pack_span_rows(batch.spans)  # one root row carrying the step spans
    batch.packs = pack_groups(batch, exclude=data.extra_blobs)  # the tracer's extras alone
    return _write_read_back(store, batch, run_row, data.trace_id)


def _write_read_back(store: Store, batch: WriteBatch, run_row: Any, trace_id: str) -> RunRecord:
    """Write ``batch`` (``run_row`` first: it inserts the run row and returns the values
    :meth:`Store.create_run` inserted) and return the trace's run row: as inserted when the
    store tells it is stored as given (:meth:`Store.run_as_inserted`), else read back in the
    write transaction (no read transaction after it; a run just created has no audit yet).

    Raises:
        StoreError: the write failed (nothing of it is stored).
    """
    inserted: list[dict[str, Any]] = []
    written: list[RunRecord | None] = []

    def after(conn: Connection) -> None:
        run = store.run_as_inserted(inserted[0]) if inserted else None
        written.append(run if run is not None else store.run_in(conn, trace_id))

    store.write_batch(batch, before=lambda conn: inserted.append(run_row(conn)), after=after)
    run = written[0] if written else None
    return run if run is not None else store.get_run(trace_id)


def _new_edges(
    data: TraceData, steps: list[StepData], source: SourceRows | None, shared: int
) -> list[tuple[str, str, str]]:
    """The trace's graph edges (step name to the next step's), or none when its source holds
    them all: every step of the trace is one of the source's first ``shared`` ones (stored by
    reference to them: the same node rows, names included), under the same pipeline. The
    source's run row was written with its edges (these pairs among them) in one transaction,
    and edge rows are never deleted: writing them again would insert nothing (two statements
    of an unchanged replay's exit)."""
    if (
        source is not None
        and source.pipeline == data.name
        and shared == len(steps)
        and shared <= len(source.nodes)
    ):
        return []
    return sorted({(a.name, b.name, "default") for a, b in itertools.pairwise(steps)})


def _drop_named_by_source(
    blobs: dict[str, bytes],
    data: TraceData,
    source: SourceRows | None,
    hashes: tuple[str, dict[str, str], str],
) -> None:
    """Leave out of a replay's ``blobs`` (sha256 -> bytes) its initial state document and
    field values, and its output (``hashes``: the document's hash, field -> value hash, the
    output's hash), when ``source`` holds the rows of its parent and the source's run row and
    root span name the same hashes. The replay's run row names the source as its parent (a
    foreign key), so the source's run is stored when the write commits (else the write fails
    as ParentMissing and the trace is written again in full, unlinked), and ``rewind gc``
    never deletes a blob a stored row names (nor the values its map documents name). Writing
    them again would only find them stored (a probe of the source's packs, ~1 ms per
    unchanged replay)."""
    if source is None or data.parent_run_id != source.run_id:
        return
    init_hash, initial, output_hash = hashes
    if source.initial_state_hash == init_hash:
        blobs.pop(init_hash, None)
        for digest in initial.values():
            blobs.pop(digest, None)
    root = source.spans.get(ROOT_POSITION)
    if root is not None and root.get("output_hash") == output_hash:
        blobs.pop(output_hash, None)


def _steps_in_order(data: TraceData) -> list[StepData]:
    """The trace's steps by position. Raises StoreError: positions are not 0..n-1."""
    steps = list(data.steps)
    positions = list(map(_POSITION, steps))
    if positions != list(range(len(steps))):  # a tracer's steps are in order already
        steps.sort(key=_POSITION)
        positions = list(map(_POSITION, steps))
    if positions != list(range(len(steps))):
        raise StoreError(
            f"trace {data.trace_id} has step positions {[s.position for s in steps]}",
            "positions must be 0, 1, 2, ... in execution order",
        )
    return steps


_POSITION = operator.attrgetter("position")


def _rows_from(
    data: TraceData, steps: list[StepData], state: dict[str, str], source_states: dict[int, Any]
) -> tuple[list[_StepRows], list[dict[str, str]]]:
    """(the rows of ``steps``, the state before the first and after each) from ``state``."""
    parts: list[_StepRows] = []
    states: list[dict[str, str]] = [state]
    for s in steps:
        step_rows, state = _step_rows(data, s, state, source_states.get(s.position))
        parts.append(step_rows)
        states.append(state)
    return parts, states


def _source_of(store: Store, data: TraceData, source: SourceRows | None) -> SourceRows | None:
    """The rows of the replay's source: ``source`` when given, read when the trace has a
    parent, None for a trace that is no replay."""
    if data.parent_run_id and source is None:
        with store.read() as conn:
            return load_rows(conn, data.parent_run_id)
    return source


def _refer(config: dict[str, Any], target: str, shared: int, *, every: bool) -> None:
    """Mark the run's ``config`` as stored by reference to ``target``'s first ``shared`` steps
    (``every``: all of them, and the source has no more)."""
    config[REFERENCE_KEY] = {"run": target, "steps": shared, "all": every}
    config["kind"] = "trace"  # what reference_of requires (a user config may set "kind")


def _absorb(batch: WriteBatch, parts: list[_StepRows]) -> None:
    """Add the steps' node, call and span rows and their other rows to ``batch``."""
    for node, calls, span, part in parts:
        batch.absorb(part)
        batch.nodes.append(node)
        batch.calls.extend(calls)
        batch.spans.append(span)


def _trace_error(data: TraceData) -> str | None:
    """The run row's error line of a failed trace (None when it did not fail)."""
    if data.error_type is None and data.error_message is None:
        return None
    return error_line(data.error_type, data.error_message)


def _fast_forward(
    steps: list[StepData],
    proven: list[tuple[bytes, dict[str, str], step_memo.Proven | None]],
    state: dict[str, str],
    signed: dict[int, bytes],
) -> tuple[int, dict[str, str], tuple[int, int]]:
    """(how many leading ``steps`` match the remembered ``proven`` ones by signature, the
    state after them, their prompt and completion tokens): ``state`` with the fields those
    steps changed folded in (:mod:`rewind.tracing.step_memo`). ``signed``: the signatures
    known already, by ``id(step)``."""
    fast = prompt = completion = 0
    folded: dict[str, str] | None = None
    for s, (remembered, changed, _step) in zip(steps, proven, strict=False):
        sig = signed.get(id(s))
        if sig is None:
            sig = step_memo.signature(s)
        if sig != remembered:
            break
        if changed:  # the state fields the step changed
            folded = dict(state) if folded is None else folded
            folded.update(changed)
        prompt += int(s.prompt_tokens)
        completion += int(s.completion_tokens)
        fast += 1
    return fast, folded if folded is not None else state, (prompt, completion)


def _early_rows(
    data: TraceData, steps: list[StepData], source_states: dict[int, Any]
) -> list[_StepRows]:
    """The rows of the leading ``steps`` a fast-forward skipped, built from the trace's input
    state (when the replay is written in full after all)."""
    return _rows_from(data, steps, _encode_map(data.input, {}), source_states)[0]


def _proven(
    steps: list[StepData], states: list[dict[str, str]]
) -> list[tuple[bytes, dict[str, str], step_memo.Proven | None]]:
    """(signature, state fields changed) of steps just proven equal to their source's, given
    the state before the first and after each (``states``, one more than ``steps``); up to the
    first step without a signature."""
    out = []
    for s, before, after in zip(steps, states, states[1:], strict=False):
        sig = step_memo.signature(s)
        if sig is None:
            break
        changed = {k: after[k] for k in s.fields or ()} if after is not before else {}
        if before | changed != after:  # not what _step_rows does: not remembered
            break
        out.append((sig, changed, step_memo.proven_of(s, sig)))
    return out


_StepRows = tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any], WriteBatch]
"""One step's node row, call rows, span row and the rest of its rows (blobs, state, cache,
effects) as a batch."""


def initial_state_hash(inputs: dict[str, Any]) -> str:
    """The hash of a trace's initial state (its input fields), as :func:`write_trace` computes
    it (the key of :func:`rewind.tracing.step_memo.remembered`)."""
    return map_hash(_encode_map(inputs, {}))[1]


def _encode_map(values: dict[str, Any], into: dict[str, bytes]) -> dict[str, str]:
    """Field → hash of each value's encoding; the encodings are added to ``into`` by hash."""
    out = {}
    for k, v in values.items():
        f = encode_value(k, v)
        into[f.digest] = f.data
        out[k] = f.digest
    return out


def _step_rows(
    data: TraceData,
    s: StepData,
    state: dict[str, str],
    same: tuple[str, str, str, str, int] | None,
) -> tuple[_StepRows, dict[str, str]]:
    """The rows of step ``s`` given the state (field → hash) before it, and the state after it.

    ``same`` is the source's (node name, state hash, status, app id, sequence id) at this
    position in a replay: when it matches, the node refers to that state row instead of
    storing a copy.
    """
    part = WriteBatch()
    input_doc = canonical_bytes(
        {
            "node": s.name,
            "reads": _encode_map(s.reads, part.blobs),
            "inputs": s.inputs,
            "params": s.params,
        }
    )
    input_hash = sha256_hex(input_doc)
    part.blobs[input_hash] = input_doc
    output_hash: str | None = None
    state_hash: str | None = None
    failed = s.status == StepStatus.FAILED
    if not failed:
        if s.fields is not None:
            written = _encode_map(s.fields, part.blobs)
            output_doc, output_hash = map_hash(written)
            part.blobs[output_hash] = output_doc
            state = state | written
        state_doc, state_hash = map_hash(state)
        part.blobs[state_hash] = state_doc
    status = "failed" if failed else "completed"
    src_app_id, src_sequence_id = data.trace_id, s.position
    if same is not None and same[:3] == (s.name, state_hash, status) and state_hash:
        src_app_id, src_sequence_id = same[3], same[4]
    elif failed and same is not None and same[:3] == (s.name, map_hash(state)[1], status):
        # failed as the source's step did, from the same state: its row is the source's
        src_app_id, src_sequence_id = same[3], same[4]
    elif failed:
        # A completed step's state row is its state document (``state_hash``), which
        # Store.load_state_row reads instead (migration 0012); a failed step has none, so its
        # row (the state before it) is stored.
        part.states.append(
            state_row(
                partition_key="",
                app_id=data.trace_id,
                sequence_id=s.position,
                position=s.name,
                status=status,
                fields=dict(state),
                internal={},
            )
        )
    scope = NodeScope(s.name, s.position, 0.0, 0.0, {}, calls=list(s.calls))
    scope.pending = {f"{i}": pw for i, pw in enumerate(s.pending)}
    scope.effects = _effect_rows(data.trace_id, s, scope.calls)
    add_scope_rows(part, scope)
    outcome, reason = _outcome(s, scope)
    node = {
        "run_id": data.trace_id,
        "position": s.position,
        "name": s.name,
        "sequence_id": s.position,
        "src_app_id": src_app_id,
        "src_sequence_id": src_sequence_id,
        "inherited": False,
        "input_hash": input_hash,
        "output_hash": output_hash,
        "state_hash": state_hash,
        "params_json": canonical_bytes(s.params).decode(),
        "latency_ms": float(s.duration_ms),
        "prompt_tokens": int(s.prompt_tokens),
        "completion_tokens": int(s.completion_tokens),
        "cache_outcome": outcome,
        "cache_reason": reason,
        "determinism": _determinism(s, scope),
        "error": error_line(s.error_type, s.error_message) if failed else None,
        "started_at": s.started_at if s.started_at is not None else data.started_at,
    }
    calls = call_rows(data.trace_id, s.position, sorted_calls(scope))
    span = {
        "run_id": data.trace_id,
        "position": s.position,
        "span_id": s.span_id,
        "parent_position": s.parent_position,
        "step_type": s.step_type,
        "status": s.status,
        "error_type": _storable(s.error_type),
        "error_message": _storable(s.error_message),
        "attributes_json": json.dumps(s.attributes, sort_keys=True, default=str),
        "started_at": s.started_at,
        "ended_at": s.ended_at,
        "duration_ms": float(s.duration_ms),
        "output_hash": None,
    }
    return (node, calls, span, part), state


def _storable(text: str | None) -> str | None:
    """An error's type or message as every backend keeps it (imported spans carry any text;
    the tracer's are made storable when they are set)."""
    return None if text is None else storable_text(text)


def _root_span(data: TraceData, output_hash: str) -> dict[str, Any]:
    """The trace's own span row (position -1): the chain's status, timing and output."""
    return {
        "run_id": data.trace_id,
        "position": ROOT_POSITION,
        "span_id": data.span_id,
        "parent_position": None,
        "step_type": CHAIN_TYPE,
        "status": data.status,
        "error_type": _storable(data.error_type),
        "error_message": _storable(data.error_message),
        "attributes_json": json.dumps(data.attributes, sort_keys=True, default=str),
        "started_at": data.started_at,
        "ended_at": data.ended_at,
        "duration_ms": float(data.duration_ms),
        "output_hash": output_hash,
    }


def _reference_target(source: SourceRows, shared: int) -> str | None:
    """The run a replay sharing ``shared`` leading steps with ``source`` refers to: the deepest
    run along ``source``'s chain of references that holds those steps (so replays of replays
    do not nest one level per replay), or None when even that is MAX_DEPTH - 1 deep."""
    holders, chain = source.holders, source.chain
    i = 0
    while i + 1 < len(holders) and i < len(chain):
        ref = chain[i]
        if ref is None or ref[0] != holders[i + 1] or shared > ref[1]:
            break
        i += 1
    if len(holders) - i >= MAX_DEPTH:
        return None
    return holders[i]


def _shared_prefix(
    trace_id: str,
    parts: list[_StepRows],
    source: SourceRows | None,
    start: int = 0,
) -> int:
    """How many leading steps of a replay are exactly its source's, seen through the cache
    (same node row but timing, every call a hit on the source's call, same span, nothing
    new to store): those are stored by reference. ``parts`` are the rows of the steps from
    position ``start`` on (the ones before are known to be shared)."""
    if source is None or not source.is_trace:
        return 0
    shared = 0
    for (node, calls, span, part), src in zip(parts, source.nodes[start:], strict=False):
        p = node["position"]
        src_span = source.spans.get(p)
        if src["position"] != p or src_span is None:
            break
        if part.states or part.llm_cache or part.tool_cache or part.effects:
            break
        virtual = [virtual_call(c, trace_id) for c in source.calls.get(p, ())]
        if not (
            same_calls(calls, virtual)
            and same_node(node, virtual_node(src, virtual, trace_id, 0.0))
            and same_span(span, src_span)
        ):
            break
        shared += 1
    return shared


def _source_states(
    store: Store, run_id: str | None, source: SourceRows | None
) -> dict[int, tuple[str, str, str, str, int]]:
    """Position → (node name, state hash, state row status, app id, sequence id) of the
    source's nodes with a state row: from its rows when it is a trace, else read from the
    store. A trace's completed step's row is its state document (the state hash after it); a
    failed step's is the state before it, stored as a row, whose hash is given (the state
    after the last step before it that did not fail, or the trace's initial state): a replay
    step that fails there from the same state refers to that row instead of copying it."""
    if run_id is None:
        return {}
    if source is None or not source.is_trace:
        return _state_rows_of(store, run_id)
    with _STATES_LOCK:
        held = _STATES.get(id(source))
        if held is not None and held[0] is source:
            _STATES.move_to_end(id(source))
            return held[1]
    states = _trace_states(source)
    with _STATES_LOCK:
        _STATES[id(source)] = (source, states)
        while len(_STATES) > _STATES_KEPT:
            _STATES.popitem(last=False)
    return states


def _trace_states(source: SourceRows) -> dict[int, tuple[str, str, str, str, int]]:
    """:func:`_source_states` of a trace's rows: a completed step's state row is its state
    document; a failed step's row holds the state before it (the state after the last step
    that completed before it, or the initial state), named here by that state's hash."""
    states: dict[int, tuple[str, str, str, str, int]] = {}
    before = source.initial_state_hash
    for n in source.nodes:
        done = n["state_hash"] and n["error"] is None
        if done or (n["cache_outcome"] == "failed" and before):
            status = "completed" if done else "failed"
            state = n["state_hash"] if done else before
            states[n["position"]] = (
                n["name"],
                state,
                status,
                n["src_app_id"],
                n["src_sequence_id"],
            )
        if done:
            before = n["state_hash"]
    return states


# id of a source's rows -> (the rows, their states): made once per rows object (the rows a
# process keeps between replays, rewind.tracing.tracer_source.source_rows, are immutable); the
# dict returned is only read.
_STATES: OrderedDict[int, tuple[SourceRows, dict[int, tuple[str, str, str, str, int]]]] = (
    OrderedDict()
)
_STATES_LOCK = threading.Lock()
_STATES_KEPT = 8


def _state_rows_of(store: Store, run_id: str) -> dict[int, tuple[str, str, str, str, int]]:
    """Position → (node name, state hash, state row status, app id, sequence id) of the nodes of
    ``run_id`` whose state row exists (one query); empty when the run has none."""
    n, st = schema.nodes, schema.burr_state
    # a node row's src_app_id is stored "" when it is its own run (SQLite)
    src_app = func.coalesce(func.nullif(n.c.src_app_id, schema.OWN_APP), n.c.run_id)
    query = (
        select(n.c.position, n.c.name, n.c.state_hash, st.c.status, src_app, n.c.src_sequence_id)
        .join(
            st,
            (st.c.partition_key == "")
            & (st.c.app_id == src_app)
            & (st.c.sequence_id == n.c.src_sequence_id),
        )
        .where(n.c.run_id == run_id)
    )
    with store.read() as conn:
        return {r[0]: (r[1], r[2], r[3], r[4], r[5]) for r in conn.execute(query)}


def _effect_rows(run_id: str, s: StepData, calls: list[CallRecord]) -> list[dict[str, Any]]:
    """The step's effect rows for this trace; a side-effecting call known only from its effect
    record (an OpenTelemetry import without ``rewind.calls``) is added to ``calls``."""
    have = {c.call_index for c in calls}
    rows = []
    for e in s.effects:
        e = dict(e)
        call = e.pop("_call", None)
        if isinstance(call, CallRecord) and call.call_index not in have:
            calls.append(call)
            have.add(call.call_index)
        if "resource" in e:
            rows.append(e | {"run_id": run_id, "position": s.position})
    return rows


def _outcome(s: StepData, scope: NodeScope) -> tuple[str, str]:
    if s.cache_outcome is not None:
        return s.cache_outcome, s.cache_reason or ""
    if s.status == StepStatus.FAILED:
        return "failed", s.error_type or "Error"
    if s.status in (StepStatus.SKIPPED, StepStatus.PENDING, StepStatus.RUNNING):
        return "none", str(s.status)
    return node_outcome(scope, None)


# -- read --------------------------------------------------------------------------------------


def trace_exists(store: Store, trace_id: str) -> bool:
    """True when a run with exactly this id exists."""
    with store.read() as conn:
        row = conn.execute(
            select(schema.runs.c.run_id).where(schema.runs.c.run_id == trace_id)
        ).first()
    return row is not None


def stored_span_ids(store: Store, trace_id: str) -> set[str]:
    """The OTLP span ids (16 hex) of a stored trace's spans, root included; empty when the
    trace is not stored."""
    t = schema.spans
    with store.read() as conn:
        rows = conn.execute(select(t).where(t.c.run_id == trace_id)).all()
    return {s["span_id"] for r in rows for s in expand_spans(dict(r._mapping))}


def is_trace(store: Store, run_id: str) -> bool:
    """True when the run is a trace (it has a root span row)."""
    t = schema.spans
    with store.read() as conn:
        row = conn.execute(
            select(t.c.run_id).where(t.c.run_id == run_id, t.c.position == ROOT_POSITION)
        ).first()
    return row is not None


def load_trace(store: Store, run_id: str, *, payloads: bool = False) -> TraceView:
    """A run or trace (id or unique prefix) with every step's values decoded.

    Args:
        payloads: also decode each LLM call's request messages and answer (for inspection).
    Raises:
        UnknownRun: no such run.
    """
    run = store.get_run(run_id)
    return load_traces(store, [run.run_id], payloads=payloads)[0]


def load_traces(store: Store, run_ids: Sequence[str], *, payloads: bool = False) -> list[TraceView]:
    """Many runs/traces in few queries (chunks of ids), in the order given.

    Raises:
        UnknownRun: an id is not a stored run (full ids only here).
    """
    ids = list(dict.fromkeys(run_ids))
    out: dict[str, TraceView] = {}
    for i in range(0, len(ids), _IN_CHUNK):
        out.update(_load_chunk(store, ids[i : i + _IN_CHUNK], payloads))
    missing = [r for r in ids if r not in out]
    if missing:
        raise UnknownRun(f"unknown run {missing[0]!r}", "list runs with `rewind runs`")
    return [out[r] for r in ids]


def _load_chunk(store: Store, ids: list[str], payloads: bool) -> dict[str, TraceView]:
    with store.read() as conn:
        rows = _chunk_rows(conn, ids)
        for run in rows.runs:
            _by_reference(conn, run, rows.nodes, rows.calls, rows.spans)
        # Round 1: documents (input docs, output/state maps, initial states, trace outputs).
        docs = _doc_hashes(rows)
        decoded = {h: json.loads(b) for h, b in store.get_blobs(docs, conn).items()}
        # Round 2: the fields those documents reference.
        fields = _field_hashes(rows, decoded)
        values = {h: _field_value(b) for h, b in store.get_blobs(fields, conn).items()}
        payload = store.get_blobs(_payload_hashes(rows.calls), conn) if payloads else {}
    return {
        run.run_id: _view(
            run,
            rows.nodes.get(run.run_id, []),
            rows.calls,
            rows.spans,
            decoded,
            values,
            payload,
            rows.effects,
        )
        for run in rows.runs
    }


_TAGGED = f'"{TAG}":'.encode()


def _field_value(data: bytes) -> Any:
    """A stored field value as readers see it: plain JSON as it is; a tagged document (a dict
    the store writes as ``{"$rw": "dict", "keys", "values"}``: one holding a ``"$rw"`` key, or
    an old trace's dict in its own key order) rebuilt and shown as :func:`rewind.serde.display`
    shows it, so a dict reads back as the dict written. Its raw document was taken for the
    value: a recorded-calls replay set it as the step's output, escaped once more by every
    replay. A document that cannot be rebuilt here (a class that does not import) is shown as
    it is stored."""
    doc = json.loads(data)
    if _TAGGED not in data:
        return doc
    try:
        return display(decode(doc))
    except RewindError:
        return doc


@dataclass
class _ChunkRows:
    """The rows of a chunk of runs: run records, node rows by run, calls/effects/spans by
    (run id, position)."""

    runs: list[RunRecord]
    nodes: dict[str, list[Any]]
    calls: dict[tuple[str, int], list[CallRecord]]
    effects: dict[tuple[str, int], list[EffectRecord]]
    spans: dict[tuple[str, int], dict[str, Any]]


def _chunk_rows(conn: Connection, ids: list[str]) -> _ChunkRows:
    """Read the run, node, call, effect and span rows of ``ids`` (one query per table)."""
    runs = [
        RunRecord.from_row(r)
        for r in conn.execute(select(schema.runs).where(schema.runs.c.run_id.in_(ids)))
    ]
    nodes: dict[str, list[Any]] = {}
    for r in conn.execute(
        select(schema.nodes)
        .where(schema.nodes.c.run_id.in_(ids))
        .order_by(schema.nodes.c.run_id, schema.nodes.c.position)
    ):
        nodes.setdefault(r._mapping["run_id"], []).append(r)
    calls: dict[tuple[str, int], list[CallRecord]] = {}
    for r in conn.execute(
        select(schema.calls)
        .where(schema.calls.c.run_id.in_(ids))
        .order_by(schema.calls.c.run_id, schema.calls.c.position, schema.calls.c.call_index)
    ):
        m = r._mapping
        calls.setdefault((m["run_id"], m["position"]), []).append(CallRecord.from_row(r))
    effects: dict[tuple[str, int], list[EffectRecord]] = {}
    for r in conn.execute(
        select(schema.effects)
        .where(schema.effects.c.run_id.in_(ids))
        .order_by(schema.effects.c.call_index, schema.effects.c.resource)
    ):
        e = EffectRecord.from_row(r)
        effects.setdefault((e.run_id, e.position), []).append(e)
    spans: dict[tuple[str, int], dict[str, Any]] = {}
    for r in conn.execute(select(schema.spans).where(schema.spans.c.run_id.in_(ids))):
        for m in expand_spans(dict(r._mapping)):
            spans[(m["run_id"], m["position"])] = m
    return _ChunkRows(runs, nodes, calls, effects, spans)


def _doc_hashes(rows: _ChunkRows) -> set[str]:
    """Hashes of the documents the runs' views need: input docs, output maps, initial states
    and trace outputs."""
    docs = set()
    for node_rows in rows.nodes.values():
        for r in node_rows:
            m = r._mapping
            docs.add(m["input_hash"])
            if m["output_hash"]:
                docs.add(m["output_hash"])
    for run in rows.runs:
        if run.initial_state_hash:
            docs.add(run.initial_state_hash)
        root = rows.spans.get((run.run_id, ROOT_POSITION))
        if root and root["output_hash"]:
            docs.add(root["output_hash"])
    return docs


def _field_hashes(rows: _ChunkRows, decoded: dict[str, Any]) -> set[str]:
    """Hashes of the field values the decoded documents refer to."""
    fields = set()
    for node_rows in rows.nodes.values():
        for r in node_rows:
            m = r._mapping
            fields.update(decoded[m["input_hash"]].get("reads", {}).values())
            if m["output_hash"]:
                fields.update(decoded[m["output_hash"]].values())
    for run in rows.runs:
        if run.initial_state_hash:
            fields.update(decoded[run.initial_state_hash].values())
    return fields


def _payload_hashes(calls: dict[tuple[str, int], list[CallRecord]]) -> set[str]:
    """Request and result hashes of the LLM calls (their messages and answers)."""
    wanted = set()
    for cl in calls.values():
        for c in cl:
            if c.kind == "llm":
                wanted.add(c.request_hash)
                if c.result_hash:
                    wanted.add(c.result_hash)
    return wanted


def _by_reference(
    conn: Connection,
    run: RunRecord,
    nodes: dict[str, list[Any]],
    calls: dict[tuple[str, int], list[CallRecord]],
    spans: dict[tuple[str, int], dict[str, Any]],
) -> None:
    """Put the resolved rows of a replay stored by reference (:mod:`rewind.store.references`)
    in place of its own rows; nothing for any other run."""
    own = nodes.get(run.run_id)
    if own and own[0]._mapping["position"] == 0:
        return
    resolved = resolve_reference(conn, run.run_id, run.config, run.created_at)
    if resolved is None:
        return
    nodes[run.run_id] = [MappingRow(n) for n in resolved.nodes]
    for position, rows in resolved.calls.items():
        calls[(run.run_id, position)] = [CallRecord.from_row(MappingRow(c)) for c in rows]
    for position, span in resolved.spans.items():
        spans[(run.run_id, position)] = span


def _view(
    run: RunRecord,
    rows: list[Any],
    calls: dict[tuple[str, int], list[CallRecord]],
    spans: dict[tuple[str, int], dict[str, Any]],
    docs: dict[str, Any],
    values: dict[str, Any],
    payload: dict[str, bytes],
    effects: dict[tuple[str, int], list[EffectRecord]],
) -> TraceView:
    root = spans.get((run.run_id, ROOT_POSITION))
    initial = (
        {k: values[h] for k, h in docs[run.initial_state_hash].items()}
        if run.initial_state_hash
        else {}
    )
    steps = []
    for r in rows:
        n = NodeRecord.from_row(r, tuple(calls.get((run.run_id, r._mapping["position"]), ())))
        span = spans.get((run.run_id, n.position))
        own_effects = () if n.inherited else tuple(effects.get((run.run_id, n.position), ()))
        steps.append(_step_view(n, span, docs, values, payload, own_effects))
    return TraceView(
        trace_id=run.run_id,
        name=run.pipeline,
        kind="trace" if root is not None else "run",
        run_status=run.status,
        input=initial,
        prompt_tokens=run.prompt_tokens,
        completion_tokens=run.completion_tokens,
        parent_run_id=run.parent_run_id,
        config=run.config,
        override=run.override,
        steps=tuple(steps),
        **(_root_fields(run, root, docs) if root is not None else _run_fields(run)),
    )


def _root_fields(run: RunRecord, root: dict[str, Any], docs: dict[str, Any]) -> dict[str, Any]:
    """A trace's own fields of its view, from its root span row."""
    status = root["status"]
    if run.status == "interrupted":
        status = StepStatus.FAILED.value
    return {
        "status": status,
        "error_type": root["error_type"],
        "error_message": root["error_message"],
        "output": docs.get(root["output_hash"]) if root["output_hash"] else None,
        "attributes": json.loads(root["attributes_json"] or "{}"),
        "started_at": root["started_at"] if root["started_at"] is not None else run.created_at,
        "ended_at": root["ended_at"],
        "duration_ms": float(root["duration_ms"] or 0.0),
        "span_id": root["span_id"],
    }


def _run_fields(run: RunRecord) -> dict[str, Any]:
    """A Burr run's own fields of its view (it has no root span), from its run row."""
    error_type, error_message = split_error(run.error)
    started, ended = run.created_at, run.finished_at
    duration = run.latency_ms
    if ended is not None and not duration:
        duration = (ended - started) * 1000.0
    return {
        "status": trace_status_of(run.status),
        "error_type": error_type,
        "error_message": error_message,
        "output": None,
        "attributes": {},
        "started_at": started,
        "ended_at": ended,
        "duration_ms": float(duration or 0.0),
        "span_id": None,
    }


def _step_view(
    n: NodeRecord,
    span: dict[str, Any] | None,
    docs: dict[str, Any],
    values: dict[str, Any],
    payload: dict[str, bytes],
    effects: tuple[EffectRecord, ...],
) -> StepView:
    """One step's view: its node row, its span row (None for a Burr node) and decoded values."""
    doc = docs[n.input_hash]
    reads = {k: values[h] for k, h in doc.get("reads", {}).items()}
    inputs = doc.get("inputs", {}) or {}
    out_fields = {k: values[h] for k, h in docs[n.output_hash].items()} if n.output_hash else {}
    llm = tuple(_llm_view(c, payload) for c in n.calls if c.kind == "llm" and payload)
    if span is not None:
        own = _span_step_fields(n, span, reads, inputs, out_fields)
    else:
        own = _node_step_fields(n, llm, reads, inputs, out_fields)
    return StepView(
        position=n.position,
        name=n.name,
        input_doc={
            "node": doc.get("node"),
            "reads": reads,
            "inputs": inputs,
            "params": doc.get("params", {}),
        },
        output_fields=out_fields,
        prompt_tokens=n.prompt_tokens,
        completion_tokens=n.completion_tokens,
        cache_outcome=n.cache_outcome,
        cache_reason=n.cache_reason,
        params=n.params,
        input_hash=n.input_hash,
        output_hash=n.output_hash,
        state_hash=n.state_hash,
        src_app_id=n.src_app_id,
        src_sequence_id=n.src_sequence_id,
        inherited=n.inherited,
        calls=n.calls,
        llm_calls=llm,
        determinism=n.determinism,
        effects=effects,
        **own,
    )


def _span_step_fields(
    n: NodeRecord,
    span: dict[str, Any],
    reads: dict[str, Any],
    inputs: dict[str, Any],
    out_fields: dict[str, Any],
) -> dict[str, Any]:
    """A traced step's fields of its view, from its span row."""
    single = set(out_fields) == {n.name}
    return {
        "step_type": span["step_type"],
        "status": span["status"],
        "input": natural(inputs) if not reads else reads | inputs,
        "output": out_fields[n.name] if single else out_fields or None,
        "error_type": span["error_type"],
        "error_message": span["error_message"],
        "duration_ms": float(span["duration_ms"] or 0.0),
        "started_at": span["started_at"],
        "ended_at": span["ended_at"],
        "attributes": json.loads(span["attributes_json"] or "{}"),
        "parent_position": span["parent_position"],
        "span_id": span["span_id"],
    }


def _node_step_fields(
    n: NodeRecord,
    llm: tuple[LlmCallView, ...],
    reads: dict[str, Any],
    inputs: dict[str, Any],
    out_fields: dict[str, Any],
) -> dict[str, Any]:
    """A Burr node's fields of its step view (no span row): type and attributes inferred from
    its calls."""
    error_type, error_message = split_error(n.error)
    attributes: dict[str, Any] = {}
    if n.calls and any(c.kind == "llm" for c in n.calls):
        attributes["model"] = next(c.name for c in n.calls if c.kind == "llm")
    if llm and llm[-1].finish_reason:
        attributes["finish_reason"] = llm[-1].finish_reason
    return {
        "step_type": _inferred_type(n),
        "status": StepStatus.FAILED.value if n.error else StepStatus.SUCCESS.value,
        "input": reads | inputs,
        "output": out_fields,
        "error_type": error_type,
        "error_message": error_message,
        "duration_ms": float(n.latency_ms or 0.0),
        "started_at": n.started_at,
        "ended_at": n.started_at + n.latency_ms / 1000.0,
        "attributes": attributes,
        "parent_position": ROOT_POSITION,
        "span_id": None,
    }


def _inferred_type(n: NodeRecord) -> str:
    kinds = {c.kind for c in n.calls}
    if "llm" in kinds:
        return "llm_call"
    if "tool" in kinds:
        return "tool_call"
    return "transform"


def _llm_view(call: CallRecord, payload: dict[str, bytes]) -> LlmCallView:
    request: dict[str, Any] = {}
    raw = payload.get(call.request_hash)
    if raw is not None:
        try:
            request = json.loads(raw)
        except ValueError:
            request = {}
    content = finish = None
    prompt = completion = 0
    result = payload.get(call.result_hash or "")
    if result is not None:
        try:
            response = ChatResponse.from_raw(result)
            content, finish = response.content, response.finish_reason
            prompt, completion = response.prompt_tokens, response.completion_tokens
        except RewindError:
            pass
    messages = request.get("messages") if isinstance(request.get("messages"), list) else []
    params = {k: v for k, v in request.items() if k != "messages"}
    return LlmCallView(
        model=call.name,
        outcome=call.outcome,
        messages=tuple(m for m in messages if isinstance(m, dict)),
        params=params,
        content=content,
        finish_reason=finish,
        prompt_tokens=prompt,
        completion_tokens=completion,
    )


def state_at(store: Store, step: StepView) -> dict[str, Any] | None:
    """The semantic state after a step (None when it has no state row, e.g. a failed Burr node
    whose state was not saved)."""
    row = store.load_state_row("", step.src_app_id, step.src_sequence_id)
    if row is None:
        return None
    return {k: v for k, v in row["values"].items() if not k.startswith("__")}


# -- search ------------------------------------------------------------------------------------

_STATUS_FILTER = {
    "success": ("completed",),
    "completed": ("completed",),
    "failed": ("failed", "interrupted"),
    "running": ("running",),
    "interrupted": ("interrupted",),
}


def search_runs(
    store: Store,
    *,
    name: str | None = None,
    status: str | None = None,
    since: float | None = None,
    until: float | None = None,
    kind: str = "any",
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[RunRecord], int]:
    """Runs/traces matching the filters, newest first, and how many match in all.

    Args:
        name: chain (pipeline) name, exact.
        status: ``success``/``completed``, ``failed`` (includes interrupted), ``running`` or
            ``interrupted``.
        since, until: bounds on the start time (unix seconds, inclusive).
        kind: ``trace``, ``run`` (Burr runs) or ``any``.
        limit, offset: paging (any ``offset`` >= 0; past the last match the page is empty).
    Raises:
        RewindError: an unknown status or kind.
    """
    t = schema.runs
    conds = []
    if name:
        conds.append(t.c.pipeline == name)
    if status:
        if status not in _STATUS_FILTER:
            raise RewindError(
                f"unknown status {status!r}", f"use one of {', '.join(_STATUS_FILTER)}"
            )
        conds.append(t.c.status.in_(_STATUS_FILTER[status]))
    if since is not None:
        conds.append(t.c.created_at >= since)
    if until is not None:
        conds.append(t.c.created_at <= until)
    traces = select(schema.spans.c.run_id).where(schema.spans.c.position == ROOT_POSITION)
    if kind == "trace":
        conds.append(t.c.run_id.in_(traces))
    elif kind == "run":
        conds.append(t.c.run_id.not_in(traces))
    elif kind != "any":
        raise RewindError(f"unknown kind {kind!r}", "use trace, run or any")
    with store.read() as conn:
        total = conn.execute(select(func.count()).select_from(t).where(*conds)).scalar_one()
        # Past the last match there is nothing to read, and an offset past the database's
        # integer range (a query string can name any) would fail in the driver.
        rows = (
            []
            if offset >= total
            else conn.execute(
                select(t)
                .where(*conds)
                .order_by(t.c.created_at.desc(), t.c.run_id)
                .limit(limit)
                .offset(offset)
            ).all()
        )
    return [RunRecord.from_row(r) for r in rows], int(total)


def count_traces(store: Store) -> dict[str, int]:
    """How many traces (runs with a root span), step spans and runs the store holds."""
    s = schema.spans
    with store.read() as conn:
        traces = conn.execute(
            select(func.count()).select_from(s).where(s.c.position == ROOT_POSITION)
        ).scalar_one()
        steps = conn.execute(
            select(func.count()).select_from(s).where(s.c.position != ROOT_POSITION)
        ).scalar_one()
        # Packed step spans (rewind.store.spans): write_trace stores a step's span with its
        # node row, so a packed trace has as many step spans as node rows.
        n = schema.nodes
        packed = select(s.c.run_id).where(s.c.position == ROOT_POSITION, s.c.steps.is_not(None))
        steps += conn.execute(
            select(func.count()).select_from(n).where(n.c.run_id.in_(packed))
        ).scalar_one()
        runs = conn.execute(select(func.count()).select_from(schema.runs)).scalar_one()
    return {"traces": int(traces), "step_spans": int(steps), "runs": int(runs)}


# -- lineage -----------------------------------------------------------------------------------


def lineage_index(
    store: Store, run: RunRecord
) -> tuple[dict[str, LineageEntry], dict[tuple[int, str], LineageEntry]]:
    """The lineage of ``run`` read in one transaction (its ancestors' walk aside): ``(by cache
    key, by (node position, cache key))`` over the calls of the run and its ancestors, nearest
    run winning. Served/dry-run side-effect records and calls without a result are left out."""
    chain = [run.run_id, *(a.run_id for a in store.ancestors(run))]
    rank = {rid: i for i, rid in enumerate(chain)}
    rows: list[Any] = []
    with store.read() as conn:
        for run_id in chain:  # a plain query per run: no key list, no Core compile per call
            rows.extend(conn.execute(_LINEAGE_CALLS, {"r": run_id}).fetchall())
    # Farthest ancestor first, calls in order: later (nearer) entries overwrite earlier ones.
    rows.sort(key=lambda r: (-rank[r.run_id], r.position, r.call_index))
    lineage: dict[str, LineageEntry] = {}
    at: dict[tuple[int, str], LineageEntry] = {}
    for r in rows:
        if not r.result_hash or r.outcome in NOT_ANSWERS:
            continue
        entry = LineageEntry(r.result_hash, r.produced_at, r.run_id, r.position, r.call_index)
        lineage[r.key] = entry
        at[(r.position, r.key)] = entry
    return lineage, at


_LINEAGE_CALLS = text(
    "SELECT run_id, position, call_index, key, result_hash, outcome, produced_at"
    " FROM calls WHERE run_id = :r"
).columns(key=schema.Digest(), result_hash=schema.Digest())  # hex on SQLite too (schema.Digest)
_RESULT_BLOBS = text(
    "SELECT b.hash, b.codec, b.data FROM calls c JOIN blobs b ON b.hash = c.result_hash"
    " WHERE c.run_id = :r"
).columns(hash=schema.Digest())


def lineage_blobs(store: Store, lineage: dict[str, LineageEntry]) -> dict[str, bytes]:
    """The result bytes of a lineage's calls by hash: one join per run that made them (blobs
    kept in object storage are fetched the usual way).

    Raises:
        StoreError: a result blob is missing (a damaged store).
    """
    wanted = {e.result_hash for e in lineage.values()}
    out: dict[str, bytes] = {}
    with store.read() as conn:
        for run_id in sorted({e.run_id for e in lineage.values()}):
            for digest, codec, data in conn.execute(_RESULT_BLOBS, {"r": run_id}).fetchall():
                if digest in wanted and codec in ("raw", "zlib"):
                    out[digest] = unpack_blob(codec, data)
    missing = wanted - out.keys()
    if missing:
        out.update(store.get_blobs(missing))
    return out


_RELATIVE = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str | float | int | None, *, now: float | None = None) -> float | None:
    """A point in time as unix seconds: a number (unix seconds), an ISO date or datetime
    (``2024-05-01``, ``2024-05-01T12:00:00Z``; naive means UTC), or a duration back from now
    (``30m``, ``24h``, ``7d``, ``2w``).

    Raises:
        RewindError: none of these.
    """
    from datetime import UTC, datetime

    if text is None:
        return None
    if isinstance(text, int | float):
        return float(text)
    value = text.strip()
    if not value:
        return None
    unit = value[-1:].lower()
    if unit in _RELATIVE and value[:-1].replace(".", "", 1).isdigit():
        return (now if now is not None else time.time()) - float(value[:-1]) * _RELATIVE[unit]
    hint = "give an ISO date (2024-05-01, 2024-05-01T12:00Z), unix seconds, or 30m/24h/7d"
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if math.isfinite(seconds):  # "nan", "inf", "1e400" would silently match nothing
            return seconds
        raise RewindError(f"cannot read the time {text!r}", hint)
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise RewindError(f"cannot read the time {text!r}", hint) from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _determinism(step: StepData, scope: NodeScope) -> str:
    """The node's flag from its calls, or the recorded one when that is stronger (an imported
    node whose side-effecting calls were not exported keeps its ``side-effect`` flag, so the
    audit cannot take it for a node without side effects)."""
    computed = node_determinism(scope)
    order = ("deterministic", "time-bound", "non-deterministic", "side-effect")
    if step.determinism in order and order.index(step.determinism) > order.index(computed):
        return step.determinism
    return computed
