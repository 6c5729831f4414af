"""``rewind grid``: fork a run at one node N ways; the node × variant matrix."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from rewind.cli.app import (
    JsonOpt,
    StoreOpt,
    check_count,
    fail,
    require_existing_store,
    store_location,
)
from rewind.errors import RewindError
from rewind.terminal import console as make_console
from rewind.terminal import inert

if TYPE_CHECKING:
    from rich.console import Console

    from rewind.grid import GridCell, GridReport, VariantResult


def grid_cmd(
    run_id: Annotated[str, typer.Argument(help="Run to fork (id or unique prefix).")],
    at: Annotated[str, typer.Option("--at", help="Fork node: name or 1-based number.")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="One variant: node.param=VALUE (repeat: one per variant)."),
    ] = None,
    workers: Annotated[int, typer.Option(help="Variants run at once.")] = 4,
    effects: Annotated[
        str,
        typer.Option(help="Side-effecting calls: live (default), recorded, or dry-run."),
    ] = "live",
    as_json: JsonOpt = False,
    store: StoreOpt = None,
    restore: Annotated[
        str,
        typer.Option(
            help="With --effects live: refuse (default) to delete files a pinned snapshot does "
            "not hold, or replace (delete them)."
        ),
    ] = "refuse",
) -> None:
    """Fork a run at one node N ways (one --set per variant), run the variants concurrently, and
    print the node × variant matrix, first divergences and artifact changes. Exit 1 when a
    variant failed."""
    check_count("--workers", workers)
    try:
        code = grid_command(
            store_location(),
            run_id,
            at,
            set_ or [],
            workers,
            as_json,
            effects=effects,
            restore=restore,
        )
    except RewindError as exc:
        fail(exc)
    if code:
        raise SystemExit(code)


def render_grid(report: GridReport, console: Console) -> None:
    """Print the matrix (rows = nodes, columns = variants), then one line per variant."""
    t = Table(
        title=(
            f"grid of {inert(report.run_id[:12])} at node {report.at_number} "
            f"({inert(report.at)}) · "
            f"{len(report.variants)} variants · {report.workers} workers · effects "
            f"{report.effects}"
        ),
        title_justify="left",
    )
    from rewind.grid import SHORT_HASH

    t.add_column("#", justify="right", no_wrap=True, min_width=1)
    t.add_column("node", no_wrap=True, min_width=8)
    t.add_column("parent", no_wrap=True)
    for v in report.variants:
        t.add_column(inert(f"{v.index + 1}: {v.label}"), no_wrap=True)
    for row in report.rows:
        cells = []
        for v, cell in zip(report.variants, row.cells, strict=True):
            marker = " ◀" if v.first_divergence == row.index else ""
            cells.append(_cell_text(cell) + marker)
        t.add_row(
            str(row.index + 1), inert(row.label), (row.parent_hash or "—")[:SHORT_HASH], *cells
        )
    console.print(t)
    console.print("cell: output sha256 prefix · = equal to the parent, Δn = n fields changed")
    for v in report.variants:
        first = (
            f"first divergence: node {v.first_divergence + 1} {inert(v.first_divergence_node)}"
            if v.first_divergence is not None
            else "no divergence"
        )
        if v.changes_artifact is None:
            artifact = (
                "artifact not published (dry-run)" if report.effects == "dry-run" else "no artifact"
            )
        else:
            artifact = "[magenta]changes the artifact[/]" if v.changes_artifact else "same artifact"
        line = (
            f"{v.index + 1}: [bold]{inert(v.label)}[/] · {v.status} · {first} · {artifact} · "
            f"{v.tokens} tok · {v.llm_requests} LLM requests"
        )
        if v.llm_shared:
            line += f" (+{v.llm_shared} shared)"
        if v.run is not None:
            line += f" · run {inert(v.run.run_id[:12])}"
        console.print(line)
        if v.error:
            console.print(f"   [red]{inert(v.error)}[/]")
    console.print(
        f"{report.llm_requests} LLM requests for {report.new_llm_inputs} new LLM inputs · "
        f"{report.tokens} tokens · {report.wall_ms / 1000:.1f} s"
    )


def _cell_text(cell: GridCell | None) -> str:
    if cell is None:
        return "[grey50]—[/]"
    if cell.status == "failed":
        return f"[red]failed[/] [grey50]{inert(cell.outcome)}[/]"
    if cell.status == "equal":
        colour = "grey50" if cell.outcome == "inherited" else "green"
        return f"[{colour}]{cell.short} =[/]"
    if cell.status == "only_b":
        return f"[dark_orange]{cell.short} new[/]"
    return f"[dark_orange]{cell.short} Δ{cell.changed_fields}[/]"


def grid_command(
    store: str,
    run_id: str,
    at: str,
    set_: list[str],
    workers: int,
    as_json: bool,
    effects: str = "live",
    restore: str = "refuse",
) -> int:
    """``rewind grid RUN --at NODE --set node.param=V1 --set node.param=V2 … [--workers N]
    [--effects MODE] [--restore replace]``.

    Each ``--set`` is one variant. Opens a session on ``store`` (the model endpoint starts only
    when a call needs it), runs :func:`grid`, prints the matrix (a line per finished variant on
    stderr) or, with ``as_json``, the report's JSON on stdout.

    Returns:
        the exit status: 0 every variant completed, 1 some variant failed, 2 bad input or an
        unavailable endpoint (one ``error:`` line on stderr).
    """
    from rewind.cli.render import error_line
    from rewind.grid import grid
    from rewind.replay import parse_override
    from rewind.session import command_session

    out = make_console()
    err = make_console(stderr=True)

    def progress(v: VariantResult) -> None:
        err.print(
            f"  variant {v.index + 1} {inert(v.label)}: {v.status} · {v.tokens} tok · "
            f"{v.wall_ms / 1000:.1f} s"
        )

    try:
        overrides = [parse_override(spec) for spec in set_]
        require_existing_store(store)
        with command_session(store) as rw:
            report = grid(
                rw,
                run_id,
                at=at,
                overrides=overrides,
                max_workers=workers,
                effects=effects,
                on_variant=progress,
                restore=restore,
            )
    except RewindError as exc:
        err.print(error_line(exc), soft_wrap=True)
        return 2
    if as_json:
        out.file.write(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    else:
        render_grid(report, out)
    return 0 if all(v.status == "completed" for v in report.variants) else 1
