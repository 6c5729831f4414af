"""JSON shapes the HTTP API returns: runs, the fork tree, a run's graph, nodes, cost.

Pure functions over store records (plus the live progress a worker has seen but the recorder has
not committed yet), so the routes stay thin and the shapes are tested in one place.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rewind.record_json import (  # noqa: F401 (re-exported: the API's shapes)
    ACTIVE_STATUSES,
    EXECUTED,
    FAILED,
    HIT,
    INHERITED,
    OVERRIDE,
    PENDING,
    RUNNING,
    SKIPPED,
    change_text,
    display_status,
    node_json,
    run_json,
)
from rewind.store import NodeRecord, RunRecord, Store


def live_node_json(event: Mapping[str, Any]) -> dict[str, Any]:
    """A node the worker reported finished whose row is not committed yet (from its event)."""
    outcome = str(event.get("outcome", ""))
    return {
        "position": event["position"],
        "number": event["position"] + 1,
        "name": event["name"],
        "status": display_status(outcome),
        "cache_outcome": outcome,
        "cache_reason": event.get("reason", ""),
        "inherited": False,
        "sequence_id": None,
        "src_app_id": None,
        "src_sequence_id": None,
        "input_hash": None,
        "output_hash": event.get("output_hash"),
        "state_hash": None,
        "params": {},
        "prompt_tokens": None,
        "completion_tokens": None,
        "tokens": event.get("tokens", 0),
        "latency_ms": round(float(event.get("latency_ms", 0.0)), 3),
        "error": None,
        "started_at": None,
        "determinism": None,
        "live": True,
        "calls": [],
    }


def pipeline_nodes(edges: Sequence[tuple[str, str, str]], executed: Iterable[str]) -> list[str]:
    """Node names of a pipeline in a stable display order: executed order first, then the rest
    in breadth-first order over the edges."""
    order: list[str] = []
    for name in executed:
        if name not in order:
            order.append(name)
    successors: dict[str, list[str]] = {}
    all_names: list[str] = []
    for src, dst, _ in edges:
        successors.setdefault(src, []).append(dst)
        for n in (src, dst):
            if n not in all_names:
                all_names.append(n)
    queue = list(order) or all_names[:1]
    seen = set(queue)
    while queue:
        current = queue.pop(0)
        if current not in order:
            order.append(current)
        for nxt in successors.get(current, []):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    order.extend(n for n in all_names if n not in order)
    return order


def _executions(
    nodes: Sequence[NodeRecord],
    live_finished: Mapping[int, Mapping[str, Any]] | None,
    running: Mapping[str, Any] | None,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """A run's node executions by position (committed rows, then the finished nodes only the
    worker's events know of yet), and the node running now unless it already has a row."""
    executions = [node_json(n) for n in nodes]
    committed = {n.position for n in nodes}
    for pos, event in sorted((live_finished or {}).items()):
        if pos not in committed:
            executions.append(live_node_json(event))
    executions.sort(key=lambda e: e["position"])
    if running is None or any(e["position"] == running["position"] for e in executions):
        return executions, None
    position = running["position"]
    return executions, {"position": position, "number": position + 1, "name": running["name"]}


def graph_json(
    run: RunRecord,
    nodes: Sequence[NodeRecord],
    edges: Sequence[tuple[str, str, str]],
    *,
    live_finished: Mapping[int, Mapping[str, Any]] | None = None,
    running: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A run's graph: the pipeline's nodes and edges, each node coloured by its latest execution.

    Args:
        run: the run (status decides whether unreached nodes are ``pending`` or ``skipped``).
        nodes: its committed node rows.
        edges: the pipeline's transitions (src, dst, condition).
        live_finished: node_finished events (by position) not yet visible as rows.
        running: the node_started event of the node executing now, if any.
    """
    executions, running_json = _executions(nodes, live_finished, running)
    names = pipeline_nodes(edges, [e["name"] for e in executions])
    if running_json and running_json["name"] not in names:
        names.append(running_json["name"])
    active = run.status in ACTIVE_STATUSES
    graph_nodes = []
    for name in names:
        runs_of = [e for e in executions if e["name"] == name]
        if running_json and running_json["name"] == name:
            status = RUNNING
        elif runs_of:
            status = runs_of[-1]["status"]
        else:
            status = PENDING if active else SKIPPED
        graph_nodes.append(
            {
                "name": name,
                "status": status,
                "numbers": [e["number"] for e in runs_of]
                + (
                    [running_json["number"]]
                    if running_json and running_json["name"] == name
                    else []
                ),
                "executions": len(runs_of),
            }
        )
    return {
        "run": run_json(run),
        "pipeline": run.pipeline,
        "nodes": graph_nodes,
        "edges": [{"src": s, "dst": d, "condition": c} for s, d, c in edges],
        "executions": executions,
        "running": running_json,
        "live": active,
    }


def fork_tree(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Nest runs under their parents: ``[{"run_id", "children": [...]}]``; a run whose parent is
    not in ``runs`` is a root. Children are oldest first."""
    by_id = {r["run_id"]: {"run_id": r["run_id"], "children": []} for r in runs}
    roots: list[dict[str, Any]] = []
    for r in sorted(runs, key=lambda r: r.get("created_at") or 0.0):
        item = by_id[r["run_id"]]
        parent = r.get("parent_run_id")
        if parent in by_id and parent != r["run_id"]:
            by_id[parent]["children"].append(item)
        else:
            roots.append(item)
    roots.reverse()  # newest tree first, like the list
    return roots


def _trajectory_costs(store: Store, run: RunRecord) -> list[dict[str, Any]]:
    """Per node of ``run``: the tokens and latency the node cost in the run that executed it
    (an inherited node is looked up in its ancestors by position)."""
    nodes = store.nodes_of(run.run_id, with_calls=False)
    out = []
    lineage = store.ancestors(run)
    ancestors: dict[str, list[NodeRecord]] = {}
    for n in nodes:
        source: NodeRecord | None = n
        for ancestor in lineage:
            if source is None or not source.inherited:
                break
            pid = ancestor.run_id
            if pid not in ancestors:
                ancestors[pid] = store.nodes_of(pid, with_calls=False)
            source = next(
                (a for a in ancestors[pid] if a.position == n.position and a.name == n.name), None
            )
        out.append(
            {
                "position": n.position,
                "name": n.name,
                "outcome": n.cache_outcome,
                "status": display_status(n.cache_outcome, n.error),
                "spent_tokens": n.tokens,
                "spent_latency_ms": n.latency_ms,
                "full_tokens": source.tokens if source is not None else 0,
                "full_latency_ms": source.latency_ms if source is not None else 0.0,
            }
        )
    return out


def cost_json(store: Store, original: RunRecord, replay: RunRecord) -> dict[str, Any]:
    """Tokens and latency of an original run vs a replay (usually a fork and its parent).

    ``original``: what its whole trajectory cost (inherited nodes counted at what they cost in
    the run that executed them). ``replay``: what the replay actually spent. ``delta`` = replay −
    original. ``saved``: over the replay's nodes that were inherited or served from the cache,
    what the original spent on them (latency: minus what the replay spent on them).
    """
    a = _trajectory_costs(store, original)
    b = _trajectory_costs(store, replay)
    a_by_pos = {c["position"]: c for c in a}
    saved_tokens = 0
    saved_latency = 0.0
    rows = []
    for c in b:
        orig = a_by_pos.get(c["position"])
        if orig is not None and orig["name"] != c["name"]:
            orig = None
        if orig is not None and c["status"] in (INHERITED, HIT):
            saved_tokens += max(orig["full_tokens"] - c["spent_tokens"], 0)
            saved_latency += max(orig["full_latency_ms"] - c["spent_latency_ms"], 0.0)
        rows.append(
            {
                "position": c["position"],
                "number": c["position"] + 1,
                "name": c["name"],
                "status": c["status"],
                "original_tokens": None if orig is None else orig["full_tokens"],
                "replay_tokens": c["spent_tokens"],
                "original_latency_ms": None if orig is None else _ms(orig["full_latency_ms"]),
                "replay_latency_ms": _ms(c["spent_latency_ms"]),
            }
        )
    orig_tokens = sum(c["full_tokens"] for c in a)
    orig_latency = math.fsum(c["full_latency_ms"] for c in a)
    rep_tokens = sum(c["spent_tokens"] for c in b)
    rep_latency = math.fsum(c["spent_latency_ms"] for c in b)
    return {
        "original": {
            "run_id": original.run_id,
            "tokens": orig_tokens,
            "latency_ms": _ms(orig_latency),
        },
        "replay": {"run_id": replay.run_id, "tokens": rep_tokens, "latency_ms": _ms(rep_latency)},
        "delta": {
            "tokens": rep_tokens - orig_tokens,
            "latency_ms": _ms(rep_latency - orig_latency),
        },
        "saved": {"tokens": saved_tokens, "latency_ms": _ms(saved_latency)},
        "nodes": rows,
    }


def _ms(value: float) -> float:
    return round(float(value), 1)
