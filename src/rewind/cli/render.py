"""Rich rendering shared by the commands: node tables, run summaries, the trajectory diff, JSON.

Every string that comes from a run (ids, node names, values, errors) goes through
:mod:`rewind.terminal` (``inert``/``visible``) before it reaches the terminal.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from rich.table import Table

from rewind.errors import RewindError
from rewind.store import NodeRecord, RunRecord
from rewind.terminal import console as make_console
from rewind.terminal import inert, visible

if TYPE_CHECKING:
    from rewind.diff import NodeDiff, TrajectoryDiff
    from rewind.replay import Rewind

console = make_console()
err_console = make_console(stderr=True)


def error_line(exc: RewindError) -> str:
    """The one line a command prints for a user-facing error: what is wrong — how to fix it.

    Returns Rich markup. The message and hint quote what the user typed and what runs recorded
    (run ids, node names, error messages), so they are made inert (:func:`rewind.terminal.inert`):
    markup in them is shown literally and control characters, line breaks included, as escapes.
    """
    return "[bold red]error:[/] " + inert(exc.message + (f" — {exc.hint}" if exc.hint else ""))


def outcome_text(outcome: str, reason: str) -> str:
    """A node's cache outcome (``hit``, ``miss:new-input``...) as coloured markup, padded."""
    colour = {
        "hit": "green",
        "miss": "dark_orange",
        "inherited": "grey50",
        "failed": "red",
        "override": "magenta",
    }.get(outcome, "white")
    label = outcome if reason in ("", outcome, "hit") else f"{outcome}:{reason}"
    return f"[{colour}]{inert(label):<17}[/]"


def run_json(run: RunRecord) -> dict[str, Any]:
    """A run record as the ``--json`` object of ``runs``, ``show`` and ``fork``: the API's run
    object (:func:`rewind.record_json.run_json`), plus ``spawning_position`` (0-based; the API's
    ``spawning_number`` is the same position 1-based), kept for scripts written against it."""
    from rewind import record_json  # imports Burr: not at `rewind --help`

    return record_json.run_json(run) | {"spawning_position": run.spawning_position}


def node_json(n: NodeRecord) -> dict[str, Any]:
    """A node row (with its calls) as the ``--json`` object of ``show`` and ``fork``: the API's
    execution object (:func:`rewind.record_json.node_json`)."""
    from rewind import record_json  # imports Burr: not at `rewind --help`

    return record_json.node_json(n)


def nodes_table(nodes: list[NodeRecord], title: str) -> Table:
    """A run's nodes: number, name, outcome, tokens, ms, output hash, flag (and error)."""
    t = Table(title=inert(title), title_justify="left")

    # The numbers keep their width: on a narrow terminal (80 columns, or output to a pipe)
    # Rich shortened them to nothing, so the table showed no node number to fork at and no
    # tokens; the text columns give way instead (names and hashes cut with an ellipsis).
    def number(header: str, texts: list[str]) -> None:
        t.add_column(header, justify="right", width=max(map(len, [header, *texts])))

    number("#", [str(len(nodes))])
    t.add_column("node", overflow="ellipsis", min_width=8)
    t.add_column("outcome")
    number("tokens", [str(n.tokens) for n in nodes])
    number("ms", [f"{n.latency_ms:.1f}" for n in nodes])
    t.add_column("output sha256", overflow="ellipsis")
    t.add_column("flag")
    errors = any(n.error for n in nodes)
    if errors:
        t.add_column("error")
    for n in nodes:
        row = [
            str(n.position + 1),
            inert(n.name),
            outcome_text(n.cache_outcome, n.cache_reason),
            str(n.tokens),
            f"{n.latency_ms:.1f}",
            (n.output_hash or "—")[:16],
            "" if n.determinism == "deterministic" else n.determinism,
        ]
        if errors:
            row.append(inert(n.error or ""))
        t.add_row(*row)
    return t


def run_summary(run: RunRecord) -> str:
    """One markup line about a run: status, tokens, fork point and change, audit label."""
    parts = [
        f"run [bold]{inert(run.run_id)}[/] ({inert(run.pipeline)}) {inert(run.status)}",
        f"{run.tokens} tokens",
    ]
    from rewind.record_json import trace_replay_text  # imports Burr: not at `rewind --help`

    traced = trace_replay_text(run)
    if traced is not None:
        change = f": {override_text(run.override)}" if run.override else ""
        parts.append(inert(traced) + change)
    elif run.parent_run_id:
        change = override_text(run.override) if run.override else "no override (unchanged replay)"
        parts.append(f"fork of {inert(run.parent_run_id[:12])} at {inert(run.fork_node)}: {change}")
    if run.spawning_run_id:
        parts.append(
            f"sub-run {inert(run.spawn_key or '')} of {inert(run.spawning_run_id[:12])} node "
            f"{(run.spawning_position or 0) + 1}"
        )
    if run.launch.get("sub_run_fork"):
        sub = run.launch["sub_run_fork"]
        change = override_text(sub["override"]) if sub.get("override") else "unchanged"
        parts.append(f"re-runs sub-run {inert(sub['run_id'][:12])} at {inert(sub['at'])}: {change}")
    if run.launch.get("inputs"):
        inputs = json.dumps(run.launch["inputs"])  # cut, but saying so: `rewind show --json`
        parts.append(f"inputs {inert(inputs if len(inputs) <= 80 else inputs[:79] + '…')}")
    if run.parent_run_id:
        parts.append(f"effects {run.effects_mode}")
    if run.admissible is not None:
        colour = "red" if run.admissible == "not-admissible" else "green"
        parts.append(f"audit [{colour}]{run.admissible}[/]")
    if run.error:
        parts.append(f"[red]{inert(run.error)}[/]")
    return " · ".join(parts)


def drift_lines(drift: dict[str, Any] | None) -> list[str]:
    """What a fork's run record says about the code it ran (``RunGraph.drift``)."""
    if drift is None:
        return []
    if not drift.get("checked", True):
        return [
            "[yellow]drift not checked:[/] the parent was recorded without its graph, so code "
            "changes cannot be detected"
        ]
    lines = []
    if drift.get("code_changed"):
        names = inert(", ".join(drift["code_changed"]))
        lines.append(f"[magenta]code changed[/] since the parent's recording: {names}")
    if drift.get("helpers_changed"):
        helpers = inert(", ".join(drift["helpers_changed"]))
        lines.append(f"[magenta]helper code changed[/] (node: helper): {helpers}")
    if drift.get("param_check_changed"):
        lines.append("[magenta]code changed[/]: the pipeline's param check")
    if drift.get("structural"):
        accepted = inert("; ".join(drift["structural"]))
        lines.append(f"[magenta]graph changed[/] (accepted with --allow-code-change): {accepted}")
    return lines


def override_text(override: dict[str, Any]) -> str:
    """``param node.name=VALUE`` for a stored override (inert markup, value cut at 60)."""
    from rewind.replay import override_target

    kind, node, name = override_target(override)
    value = json.dumps(override.get("value"))
    return inert(f"{kind} {node}.{name}={value[:60]}")


def code_change(nd: NodeDiff) -> str:
    """``analyse`` or ``analyse (helper pkg.mod.score)``: a node whose code changed, naming the
    helpers whose code changed when those are known."""
    if not nd.helpers_changed:
        return nd.name
    return f"{nd.name} (helper {', '.join(nd.helpers_changed)})"


def print_diff(d: TrajectoryDiff) -> None:
    """Print a trajectory diff: the per-node table, the nodes whose code changed, the first
    divergence's changed fields (at most :data:`DIFF_LINES`) and the tokens each run spent."""
    console.print(diff_table(d))
    code_changed = [code_change(nd) for nd in d.nodes if nd.code_changed]
    if code_changed:
        console.print(
            f"[magenta]code changed[/] between the runs in: {inert(', '.join(code_changed))} — "
            "differences there may come from the code, not from the override"
        )
    first = d.first_divergence
    if first is None:
        console.print("[green]no divergence: every node output is equal[/]")
        return
    _print_first_divergence(first)
    executed_b = sum(n.b.tokens for n in d.nodes if n.b and n.b.outcome != "inherited")
    console.print(
        f"tokens spent: {inert(d.run_a[:12])} {d.tokens_a} · {inert(d.run_b[:12])} {d.tokens_b} "
        f"(its executed nodes: {executed_b}; inherited nodes cost nothing)"
    )


def diff_table(d: TrajectoryDiff) -> Table:
    """One row per aligned node pair: status (and "code changed", the first-divergence marker),
    hash equality, token delta, the first changed field paths."""
    t = Table(title=inert(f"diff {d.run_a[:12]} → {d.run_b[:12]}"), title_justify="left")
    for col in ("#", "node", "status", "hash", "tokens Δ", "changed fields"):
        t.add_column(col)
    for nd in d.nodes:
        paths = [c.path or "(value)" for c in nd.changes]
        shown = ", ".join(paths[:4]) + (f" (+{len(paths) - 4})" if len(paths) > 4 else "")
        colour = {"equal": "green", "changed": "dark_orange"}.get(nd.status, "red")
        marker = " ◀ first divergence" if d.first_divergence is nd else ""
        inherited = nd.b is not None and nd.b.outcome == "inherited"
        code = " · [magenta]code changed[/]" if nd.code_changed else ""
        t.add_row(
            str(nd.index + 1),
            inert(nd.name),
            f"[{colour}]{nd.status}[/]{code}{marker}",
            "=" if nd.hash_equal else "≠",
            "inherited" if inherited else f"{nd.token_delta:+d}",
            inert(shown),
        )
    return t


def _print_first_divergence(first: NodeDiff) -> None:
    cause = (
        f" — [magenta]code changed[/] ({inert(code_change(first))}), not only the override"
        if first.code_changed
        else ""
    )
    console.print(
        f"first divergence: node {first.index + 1} [bold]{inert(first.name)}[/] "
        f"({len(first.changes)} changed field{'s' if len(first.changes) != 1 else ''}){cause}"
    )
    shown_changes = _headline_first(first.changes)[:DIFF_LINES]
    for c in shown_changes:
        if c.text_diff:
            console.print(
                f"  {visible(c.path)}:\n{visible(c.text_diff, multiline=True)}", markup=False
            )
        else:
            console.print(visible(_change_line(c)), markup=False)
    if len(first.changes) > len(shown_changes):
        more = len(first.changes) - len(shown_changes)
        console.print(f"  … and {more} more (rewind diff A B --json lists every change)")


def _change_line(c: Any) -> str:
    """``  path (was old.path): OLD → NEW (kind)`` for one field change."""
    old, new = _short(c.old), _short(c.new)
    if c.kind == "type_changed":
        old, new = f"{old} ({_type_of(c.old)})", f"{new} ({_type_of(c.new)})"
    moved = f" (was {c.old_path})" if c.old_path else ""
    return f"  {c.path or '(value)'}{moved}: {old} → {new} ({c.kind})"


DIFF_LINES = 10


def _headline_first(changes: Any) -> list[Any]:
    """Changes ordered so the shallowest paths (``analysis.top.group``) come before deep table
    cells (``analysis.table[7].mean``): the headline of a change first."""
    return sorted(changes, key=lambda c: (c.path.count("[") + c.path.count("."), c.path))


def _short(value: Any, limit: int = 80) -> str:
    from rewind.serde import display

    text = json.dumps(display(value), ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _type_of(value: Any) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def show_run(rw: Rewind, r: RunRecord, as_json: bool) -> None:
    """Print run ``r``: its node table, summary, sub-runs, drift and artifacts (or, with
    ``as_json``, ``{"run": {...}, "nodes": [...]}`` on stdout)."""
    nodes = rw.store.nodes_of(r.run_id)
    graph = rw.store.run_graph(r.run_id)
    drift = graph.drift if graph is not None else None
    spawned = rw.node_sub_runs(r.run_id)
    if as_json:
        code = {"graph_hash": graph.graph_hash if graph else None, "drift": drift}
        emit_json(
            {
                "run": run_json(r) | code,
                "nodes": [
                    node_json(n) | {"sub_runs": [c.run_id for c in spawned.get(n.position, [])]}
                    for n in nodes
                ],
            }
        )
        return
    console.print(nodes_table(nodes, f"run {r.run_id}"))
    console.print(run_summary(r))
    for position, children in sorted(spawned.items()):
        listed = ", ".join(
            f"{inert(c.spawn_key or '')}={inert(c.run_id[:12])} ({inert(c.status)}, {c.tokens} tok)"
            for c in children
        )
        console.print(f"node {position + 1} spawned {len(children)} sub-run(s): {listed}")
    for line in drift_lines(drift):
        console.print(line)
    for art in rw.store.artifacts_of(r.run_id):
        console.print(
            f"artifact {inert(art['name'])}: {inert(art['path'])} (sha256 {art['sha256'][:16]})"
        )


def emit_json(value: Any) -> None:
    """Print ``value`` as indented JSON with sorted keys on stdout (``--json``)."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def abridge(value: Any, depth: int = 0) -> Any:
    """A readable excerpt of a large JSON value: long strings cut, long lists shortened."""
    if isinstance(value, str) and len(value) > 300:
        return value[:300] + f"… ({len(value)} chars)"
    if isinstance(value, list):
        head = [abridge(v, depth + 1) for v in value[:12]]
        return head + ([f"… {len(value) - 12} more items"] if len(value) > 12 else [])
    if isinstance(value, dict):
        return {k: abridge(v, depth + 1) for k, v in value.items()}
    return value
