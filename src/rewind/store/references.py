"""Replays stored by reference: the steps a replay shares with the trace it replays are not
copied, they are read through the source's rows.

An unchanged replay of a recorded trace computes, step by step, exactly the rows of its source
with every call a cache hit: the same names, input/output/state hashes, call keys and result
hashes. Writing them again would store the whole trace once more for every replay. Instead the
replay's run row carries ``config["reference"] = {"run": SOURCE, "steps": k, "all": bool}``:
positions ``0..k-1`` of the replay are the source's rows at those positions, seen as a cached
replay sees them (:func:`virtual_node`, :func:`virtual_call`, :func:`virtual_span`), and only
positions from ``k`` on (the first divergence) have rows of their own. ``all`` says that every
step is by reference (an unchanged replay: one run row and its root span).

What a reference leaves out is the replay's own timing of those steps: their latency and span
duration read as 0 ms and they start when the replay started (the run row keeps the replay's
total latency). Tokens are 0 (cache hits spend none), call outcomes ``hit``/``hit``.

Readers (:meth:`rewind.store.Store.nodes_of`, :func:`rewind.tracing.store.load_traces`) resolve
references with :func:`resolve`; a reference's source can itself be a reference (resolved
recursively, at most :data:`MAX_DEPTH` deep).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, select, text

from rewind.context import LineageEntry
from rewind.store import schema
from rewind.store.spans import expand as expand_spans

__all__ = [
    "MAX_DEPTH",
    "REFERENCE_KEY",
    "MappingRow",
    "SourceRows",
    "reference_of",
    "resolve",
    "virtual_call",
    "virtual_node",
    "virtual_span",
]

REFERENCE_KEY = "reference"
"""The run config key of a replay stored by reference."""
MAX_DEPTH = 64
"""How many references deep a chain of replays is followed."""

_NODE_TIMING = ("latency_ms", "started_at")
_HIT = {"outcome": "hit", "reason": "hit", "prompt_tokens": 0, "completion_tokens": 0}
_REPLAYED = {**_HIT, "outcome": "failed", "reason": "replayed"}


class MappingRow:
    """A row built in memory that readers use like a SQLAlchemy row (``row._mapping[...]``)."""

    __slots__ = ("_mapping",)

    def __init__(self, mapping: Mapping[str, Any]) -> None:
        self._mapping = mapping

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass
class SourceRows:
    """The node, call and span rows of one run, references resolved (column → value dicts).

    ``nodes`` is in position order; ``calls`` maps position → that node's call rows in call
    order; ``spans`` maps position → its step span row (the root span, position -1, included
    when the run has one).
    """

    run_id: str
    nodes: list[dict[str, Any]] = field(default_factory=list)
    calls: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    spans: dict[int, dict[str, Any]] = field(default_factory=dict)
    reference: tuple[str, int] | None = None
    holders: list[str] = field(default_factory=list)
    """The runs whose own rows these are (the run, then the sources it refers to)."""
    initial_state_hash: str | None = None
    """The run row's initial state hash, when read (:func:`load_rows`): a blob the run row
    names, so one the store holds while the run is stored."""
    pipeline: str | None = None
    """The run row's pipeline (a trace's name), when read (:func:`load_rows`)."""
    chain: list[tuple[str, int] | None] = field(default_factory=list)
    """``chain[i]``: the reference ``(source run id, k)`` of ``holders[i]``, None for the run
    that holds all its rows."""

    @property
    def failed_steps(self) -> dict[int, str]:
        """Position → name of the nodes that failed (their ``cache_outcome`` is ``failed``)."""
        return {n["position"]: n["name"] for n in self.nodes if n["cache_outcome"] == "failed"}

    @property
    def failed_calls(self) -> dict[tuple[int, str], LineageEntry]:
        """``(position, cache key)`` → the calls that raised (``failed`` call rows; their
        ``result_hash`` names the failure's document, :func:`rewind.call.failure_bytes`)."""
        return {
            (p, c["key"]): LineageEntry(
                c["result_hash"], c["produced_at"], c["run_id"], p, c["call_index"]
            )
            for p, calls in self.calls.items()
            for c in calls
            if c["outcome"] == "failed" and c["result_hash"]
        }

    @property
    def is_trace(self) -> bool:
        """True when the run has a root span (a traced chain)."""
        return -1 in self.spans


def reference_of(config: Mapping[str, Any] | None) -> tuple[str, int] | None:
    """``(source run id, k)`` of a run stored by reference (its config), else None.

    Only a trace (``config["kind"] == "trace"``, which the trace writer sets with the reference)
    is stored by reference: a Burr run's config holds the user's own keys, and one named
    ``reference`` must not make another run's rows its own."""
    if (config or {}).get("kind") != "trace":
        return None
    ref = (config or {}).get(REFERENCE_KEY)
    if not isinstance(ref, dict):
        return None
    run, steps = ref.get("run"), ref.get("steps")
    if not isinstance(run, str) or not isinstance(steps, int) or steps <= 0:
        return None
    return run, steps


def virtual_call(row: Mapping[str, Any], run_id: str) -> dict[str, Any]:
    """A source call row as the replay that served it from the cache records it: a hit, or for
    a call that raised (``failed``) its failure raised again (``failed:replayed``)."""
    if row["outcome"] == "failed":
        return {**row, "run_id": run_id, **_REPLAYED, "latency_ms": 0.0}
    return {**row, "run_id": run_id, **_HIT, "latency_ms": 0.0}


def virtual_node(
    row: Mapping[str, Any], calls: list[dict[str, Any]], run_id: str, started_at: float
) -> dict[str, Any]:
    """A source node row as a replay whose calls all hit records it (0 tokens, 0 ms)."""
    outcome, reason = row["cache_outcome"], row["cache_reason"]
    if calls and outcome not in ("failed", "none"):
        outcome, reason = "hit", "hit"
    return {
        **row,
        "run_id": run_id,
        "inherited": False,
        "latency_ms": 0.0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cache_outcome": outcome,
        "cache_reason": reason,
        "started_at": started_at,
    }


def virtual_span(row: Mapping[str, Any], run_id: str, started_at: float) -> dict[str, Any]:
    """A source step span as the replay's: a span id of its own (derived from the replay's id
    and the position), starting when the replay started, 0 ms long."""
    span_id = hashlib.sha256(f"{run_id}:{row['position']}".encode()).hexdigest()[:16]
    return {
        **row,
        "run_id": run_id,
        "span_id": span_id,
        "started_at": started_at,
        "ended_at": started_at,
        "duration_ms": 0.0,
    }


def same_node(replay: Mapping[str, Any], virtual: Mapping[str, Any]) -> bool:
    """Whether a replay's node row is the virtual row of its source (timing aside)."""
    return all(v == replay.get(k) for k, v in virtual.items() if k not in _NODE_TIMING)


_SPAN_FIELDS = (
    "parent_position",
    "step_type",
    "status",
    "error_type",
    "error_message",
    "attributes_json",
    "output_hash",
)


def same_span(replay: Mapping[str, Any], source: Mapping[str, Any]) -> bool:
    """Whether a replay's step span says what its source's does (ids and timing aside)."""
    return all(replay.get(k) == source.get(k) for k in _SPAN_FIELDS)


def same_calls(replay: list[dict[str, Any]], virtual: list[dict[str, Any]]) -> bool:
    """Whether a replay's call rows are the virtual rows of its source's (latency aside)."""
    if len(replay) != len(virtual):
        return False
    for r, v in zip(replay, virtual, strict=True):
        if any(val != r.get(k) for k, val in v.items() if k != "latency_ms"):
            return False
    return True


def load_rows(conn: Connection, run_id: str, *, depth: int = 0) -> SourceRows:
    """The rows of one run with its reference (if any) resolved (three to four queries per
    level).

    Raises:
        RuntimeError: references nest deeper than :data:`MAX_DEPTH` (a damaged store).
    """
    runs = schema.runs
    config = conn.execute(
        select(
            runs.c.config_json, runs.c.created_at, runs.c.initial_state_hash, runs.c.pipeline
        ).where(runs.c.run_id == run_id)
    ).first()
    out = SourceRows(run_id)
    if config is None:
        return out
    out.initial_state_hash = config[2]
    out.pipeline = config[3]
    _physical(conn, out)
    ref = reference_of(json.loads(config[0] or "{}"))
    out.chain.append(ref)
    if ref is not None:
        if depth >= MAX_DEPTH:
            raise RuntimeError(f"run {run_id} refers to runs more than {MAX_DEPTH} deep")
        out.reference = ref
        source = load_rows(conn, ref[0], depth=depth + 1)
        add_virtual(out, source, ref[1], float(config[1]))
        out.holders.extend(source.holders)
        out.chain.extend(source.chain)
    return out


def _physical(conn: Connection, out: SourceRows) -> None:
    # Plain text queries: rows come back as tuples, several times cheaper to turn into dicts
    # than Core selects (these run on a replay's hot path, over every row of a trace).
    out.holders.append(out.run_id)
    out.nodes = _dicts(conn, "SELECT * FROM nodes WHERE run_id = :r ORDER BY position", out.run_id)
    calls = "SELECT * FROM calls WHERE run_id = :r ORDER BY position, call_index"
    for row in _dicts(conn, calls, out.run_id):
        out.calls.setdefault(row["position"], []).append(row)
    for stored in _dicts(conn, "SELECT * FROM spans WHERE run_id = :r", out.run_id):
        for row in expand_spans(stored):  # a root row carries the step spans packed
            out.spans[row["position"]] = row
    for row in out.nodes:
        row["inherited"] = bool(row["inherited"])
        # stored "" for the row's own run (SQLite): resolved before a virtual row rebinds run_id
        row["src_app_id"] = schema.src_app_of(row["src_app_id"], row["run_id"])


_DIGESTS: dict[str, Any] = {
    **{name: schema.Digest() for names in schema.DIGEST_COLUMNS.values() for name in names},
    **{
        name: schema.Usual(usual)
        for c in schema.USUAL_COLUMNS.values()
        for name, usual in c.items()
    },
}
"""Result types that read :class:`~rewind.store.schema.Digest` columns back as hex and
:class:`~rewind.store.schema.Usual` ones as their values (by name: the same in every table)."""


def _dicts(conn: Connection, query: str, run_id: str) -> list[dict[str, Any]]:
    result = conn.execute(text(query).columns(**_DIGESTS), {"r": run_id})
    columns = list(result.keys())
    return [dict(zip(columns, values, strict=True)) for values in result.fetchall()]


def add_virtual(out: SourceRows, source: SourceRows, k: int, started_at: float) -> None:
    """Put the virtual rows of ``source``'s first ``k`` positions in front of ``out``'s own."""
    run_id = out.run_id
    nodes: list[dict[str, Any]] = []
    for row in source.nodes:
        p = row["position"]
        if p >= k:
            break
        calls = [virtual_call(cr, run_id) for cr in source.calls.get(p, ())]
        nodes.append(virtual_node(row, calls, run_id, started_at))
        if calls:
            out.calls[p] = calls
        span = source.spans.get(p)
        if span is not None:
            out.spans[p] = virtual_span(span, run_id, started_at)
    out.nodes = nodes + [r for r in out.nodes if r["position"] >= k]


def resolve(
    conn: Connection, run_id: str, config: Mapping[str, Any], started_at: float
) -> SourceRows | None:
    """The virtual rows of a run stored by reference (its own rows included), or None when
    the run is not stored by reference.

    Args:
        conn: an open read transaction.
        run_id: the run.
        config, started_at: the run row's config and ``created_at``.
    """
    ref = reference_of(config)
    if ref is None:
        return None
    out = SourceRows(run_id, reference=ref, chain=[ref])
    _physical(conn, out)
    source = load_rows(conn, ref[0], depth=1)
    add_virtual(out, source, ref[1], started_at)
    out.holders.extend(source.holders)
    out.chain.extend(source.chain)
    return out
