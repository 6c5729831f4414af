"""``rewind runs``, ``rewind show`` and ``rewind diff``: read recorded runs."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from rewind.cli.app import (
    JsonOpt,
    StoreOpt,
    check_count,
    session,
)
from rewind.cli.render import (
    abridge,
    console,
    emit_json,
    node_json,
    override_text,
    print_diff,
    run_json,
    show_run,
)
from rewind.terminal import inert, json_text

if TYPE_CHECKING:
    from rewind.store import RunRecord


def runs(
    limit: Annotated[int, typer.Option(help="How many runs to list.")] = 50,
    sub_runs: Annotated[
        bool,
        typer.Option(
            "--sub-runs",
            help="Also list the runs of Burr sub-applications (MapStates/MapActions children, "
            "recursive apps); `rewind show RUN` lists them under the node that spawned them.",
        ),
    ] = False,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """List recorded runs, newest first."""
    check_count("--limit", limit)
    with session(model=False, read_only=True) as rw:
        items = rw.store.list_runs(limit, include_sub_runs=sub_runs)
        if as_json:
            emit_json([run_json(r) for r in items])
            return
        t = Table(title=f"runs in {inert(rw.store.root)}", title_justify="left")
        columns = ("run", "pipeline", "status", "tokens", "parent", "fork", "effects", "audit")
        for col in (*columns, "created"):
            t.add_column(col)
        for r in items:
            t.add_row(
                inert(r.run_id[:12]),
                inert(r.pipeline),
                inert(r.status),
                str(r.tokens),
                inert((r.parent_run_id or r.spawning_run_id or "")[:12]),
                fork_cell(r),
                r.effects_mode,
                r.admissible or "",
                time.strftime("%m-%d %H:%M", time.localtime(r.created_at)),
            )
        console.print(t)


def show(
    run_id: Annotated[str, typer.Argument(help="Run id (or a unique prefix).")],
    node: Annotated[
        str | None, typer.Option(help="Show one node's input, output and state.")
    ] = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Show a run's nodes: outcome and reason, tokens, latency, hashes."""
    from rewind.replay import resolve_node
    from rewind.serde import display

    with session(model=False, read_only=True) as rw:
        r = rw.store.get_run(run_id)
        if node is None:
            show_run(rw, r, as_json)
            return
        nodes = rw.store.nodes_of(r.run_id)
        n = nodes[resolve_node(r, nodes, node)]
        detail = {
            "node": node_json(n),
            "input": display(rw.node_input(n)),
            "output": display(rw.node_output(n)),
            "state": display(rw.node_state(n)) if n.error is None else None,
        }
        if as_json:
            emit_json(detail)
        else:
            console.print(json_text(abridge(detail)), soft_wrap=True)
            console.print("[dim](long values abridged; --json prints everything)[/]")


def diff(
    run_a: Annotated[str, typer.Argument(help="First run (id or prefix).")],
    run_b: Annotated[str, typer.Argument(help="Second run (id or prefix).")],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Field-level diff of two runs: per node equal/changed, changed paths, first divergence."""
    with session(model=False, read_only=True) as rw:
        d = rw.diff(run_a, run_b)
        if as_json:
            emit_json(d.to_json())
        else:
            print_diff(d)


def fork_cell(r: RunRecord) -> str:
    """The ``fork`` column of ``rewind runs`` (inert markup): where a fork started and its
    change, ``replay`` and its change for a replay of a traced chain (it re-runs the whole chain:
    its first step is no fork point), or which sub-run of which node a sub-run is."""
    if r.spawning_run_id:
        return f"sub-run {inert(r.spawn_key or '')} of node {(r.spawning_position or 0) + 1}"
    if r.parent_run_id and (r.config or {}).get("kind") == "trace":
        o = r.override
        if not o:
            return "replay"
        value = json.dumps(o.get("value"))[:60]
        return "replay: " + inert(f"{o.get('node')}.{o.get('param')}={value}")
    if r.override:
        return f"{inert(r.fork_node)}: {override_text(r.override)}"
    return f"{inert(r.fork_node)} (replay)" if r.fork_node else ""
