"""The one JSON shape of a run and of a node execution (with its calls): served by the HTTP API
(``rewind.api.models.Run``/``Execution`` declare it) and printed by the CLI's ``--json``, so the
two never disagree on the same record (issue 9: one schema per record).

Pure functions over store records; no web framework is imported here, so the CLI can use them
without loading FastAPI.
"""

from __future__ import annotations

from typing import Any

from rewind.replay import override_target
from rewind.store import NodeRecord, RunRecord
from rewind.store.references import REFERENCE_KEY, reference_of

# Display status of a node execution (one colour each in the UI).
INHERITED = "inherited"  # copied from the parent, not executed (grey)
HIT = "hit"  # executed, every call served from the cache (green)
EXECUTED = "executed"  # executed live or re-executed: a miss, or no cacheable call (orange)
OVERRIDE = "override"  # output replaced by the fork's override, not executed
FAILED = "failed"  # raised (red)
RUNNING = "running"  # executing now (animated)
PENDING = "pending"  # not reached yet, the run is in flight
SKIPPED = "skipped"  # not executed by this (finished) run: another branch was taken

ACTIVE_STATUSES = ("queued", "running")


def display_status(outcome: str, error: str | None = None) -> str:
    """Map a node's cache outcome to its display status."""
    if outcome == "failed" or error:
        return FAILED
    if outcome == "inherited":
        return INHERITED
    if outcome == "hit":
        return HIT
    if outcome == "override":
        return OVERRIDE
    return EXECUTED


def run_json(run: RunRecord) -> dict[str, Any]:
    """A run as the API shows it (tokens are the tokens this run spent; latency in ms)."""
    return {
        "run_id": run.run_id,
        "pipeline": run.pipeline,
        "status": run.status,
        "parent_run_id": run.parent_run_id,
        "fork_node": run.fork_node,
        "fork_number": None if run.fork_position is None else run.fork_position + 1,
        "override": run.override,
        "change": change_text(run),
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "tokens": run.tokens,
        "latency_ms": round(run.latency_ms, 3),
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "error": run.error,
        "config": run.config,
        "launch": run.launch,
        "effects_mode": run.effects_mode,
        "admissible": run.admissible,
        "last_audit": run.last_audit,
        # the run of a Burr sub-application: the run and node that spawned it, which child
        "spawning_run_id": run.spawning_run_id,
        "spawning_number": None if run.spawning_position is None else run.spawning_position + 1,
        "spawn_key": run.spawn_key,
        "created_by": run.created_by,
    }


def trace_replay_text(run: RunRecord) -> str | None:
    """What a replay of a traced chain (a cached trace, ``rewind replay-trace`` or
    ``Tracer.replay``) shares with the trace it replays, or None for any other run.

    Such a replay runs the caller's code again, which may have changed: it is not an
    "unchanged replay" of its parent just because it carries no override. The steps it shares
    with its source are named when it is stored by reference (:mod:`rewind.store.references`).
    """
    config = run.config or {}
    if run.parent_run_id is None or config.get("kind") != "trace":
        return None
    ref = reference_of(config)
    if ref is None:
        return f"replay of trace {run.parent_run_id[:12]} (no step shared)"
    if config[REFERENCE_KEY].get("all"):
        return f"replay of trace {run.parent_run_id[:12]}: every step equal (stored by reference)"
    return (
        f"replay of trace {run.parent_run_id[:12]}: its first {ref[1]} step(s) equal, "
        f"differs from step {ref[1] + 1}"
    )


def change_text(run: RunRecord) -> str | None:
    """One line saying what a fork changed (None for a recorded run); a grid variant or a
    stability sample says so."""
    if run.parent_run_id is None:
        return None
    o = run.override
    traced = trace_replay_text(run)
    if traced is not None:
        return traced if not o else "{} · {} {}.{}".format(traced, *override_target(o))
    sub = run.launch.get("sub_run_fork")
    if sub:
        o = sub.get("override")
        what = "unchanged" if not o else "{} {}.{}".format(*override_target(o))
        text = f"re-runs sub-run {str(sub['run_id'])[:12]} from {sub['at']}: {what}"
    elif not o:
        text = f"unchanged replay from {run.fork_node}"
    else:
        kind, node, name = override_target(o)
        text = f"{kind} {node}.{name}"
    config = run.config or {}
    purpose = config.get("purpose")
    if purpose == "stability":
        sample = f"stability sample {config.get('sample', '?')}/{config.get('k', '?')}"
        return sample if not o else f"{sample} · {text}"
    if purpose == "grid" and isinstance(config.get("grid_variant"), int):
        return f"grid variant {config['grid_variant'] + 1} · {text}"
    return text


def node_json(n: NodeRecord, *, live: bool = False) -> dict[str, Any]:
    """One node execution: outcome and reason, display status, hashes, tokens, latency, calls."""
    return {
        "position": n.position,
        "number": n.position + 1,
        "name": n.name,
        "status": display_status(n.cache_outcome, n.error),
        "cache_outcome": n.cache_outcome,
        "cache_reason": n.cache_reason,
        "inherited": n.inherited,
        "sequence_id": n.sequence_id,
        "src_app_id": n.src_app_id,
        "src_sequence_id": n.src_sequence_id,
        "input_hash": n.input_hash,
        "output_hash": n.output_hash,
        "state_hash": n.state_hash,
        "params": n.params,
        "prompt_tokens": n.prompt_tokens,
        "completion_tokens": n.completion_tokens,
        "tokens": n.tokens,
        "latency_ms": round(n.latency_ms, 3),
        "error": n.error,
        "started_at": n.started_at,
        "determinism": getattr(n, "determinism", None),
        "live": live,
        "calls": [
            {
                "index": c.call_index,
                "kind": c.kind,
                "name": c.name,
                "key": c.key,
                "request_hash": c.request_hash,
                "result_hash": c.result_hash,
                "outcome": c.outcome,
                "reason": c.reason,
                "prompt_tokens": c.prompt_tokens,
                "completion_tokens": c.completion_tokens,
                "tokens": c.prompt_tokens + c.completion_tokens,
                "latency_ms": round(c.latency_ms, 3),
                "determinism": getattr(c, "determinism", None),
            }
            for c in n.calls
        ],
    }
