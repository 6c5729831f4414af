"""``rewind stability``: sample a branch K times live and report the per-node hash spread."""

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
from rewind.errors import InvalidOverride, RewindError
from rewind.terminal import console as make_console
from rewind.terminal import inert

if TYPE_CHECKING:
    from rich.console import Console

    from rewind.stability import StabilityReport
    from rewind.store import RunRecord


def stability_cmd(
    run_id: Annotated[str, typer.Argument(help="Run whose branch to sample (id or prefix).")],
    k: Annotated[
        int, typer.Option("-k", "--samples", help="How many times to run the branch.")
    ] = 5,
    from_node: Annotated[
        str, typer.Option("--from", help="Fork node: name or 1-based number.")
    ] = "1",
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="One change every sample carries: node.param=VALUE"),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(help="Sample the first LLM node from --from on at this temperature."),
    ] = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Run a branch K times live (caches neither read nor written) and report per-node hash
    spread: distinct hashes, modal share, first spread, stable share. Exit 0 when every node is
    stable, 1 when some node spread."""
    check_count("-k", k)
    try:
        code = stability_command(
            store_location(), run_id, k, from_node, set_ or [], as_json, temperature=temperature
        )
    except RewindError as exc:
        fail(exc)
    if code:
        raise SystemExit(code)


def render_stability(report: StabilityReport, console: Console) -> None:
    """Print the report: one table row per node, then the stable share and first spread."""
    change = ""
    if report.override:
        o = report.override
        name = o.get("param") or o.get("field")
        change = inert(f" · {o['node']}.{name}={json.dumps(o['value'])}")
    t = Table(
        title=(
            f"stability of {inert(report.run_id[:12])} from node {report.from_number} "
            f"({inert(report.from_node)}) · K={report.k}{change}"
        ),
        title_justify="left",
    )
    t.add_column("#", justify="right", no_wrap=True, min_width=1)
    t.add_column("node", no_wrap=True, min_width=8)
    for col in ("stable", "distinct", "modal share", "modal sha256", "= recorded", "determinism"):
        t.add_column(col, no_wrap=True)
    first = report.first_spread
    for n in report.nodes:
        marker = " ◀ first spread" if n is first else ""
        t.add_row(
            str(report.from_number + n.index),
            inert(n.label),
            ("[green]yes[/]" if n.stable else "[dark_orange]no[/]") + marker,
            str(n.distinct) + ("" if n.completed == report.k else f" ({report.k - n.completed}∅)"),
            f"{n.modal_count}/{report.k} ({n.modal_share:.0%})",
            (n.modal_hash or "—")[:16],
            "=" if n.matches_parent else "≠",
            inert(n.determinism),
        )
    console.print(t)
    console.print(
        f"stable share: [bold]{report.stable_nodes}/{len(report.nodes)}[/] nodes "
        f"({report.stable_share:.0%}) · first spread: "
        + (f"node {report.from_number + first.index} {inert(first.label)}" if first else "none")
        + f" · {report.tokens} tokens · {report.wall_ms / 1000:.1f} s"
    )
    failures: dict[str, list[str]] = {}
    for s in report.samples:
        if s.status != "completed":
            failures.setdefault(s.error or s.status, []).append(s.run_id[:12])
    for error, runs in failures.items():
        console.print(
            f"[dark_orange]{len(runs)}/{report.k} samples failed[/] ({inert(', '.join(runs))}): "
            + inert(error)
        )
    if report.path is not None:
        console.print(f"report: {inert(report.path)}")


def stability_command(
    store: str,
    run_id: str,
    k: int,
    from_node: str,
    set_: list[str],
    as_json: bool,
    temperature: float | None = None,
) -> int:
    """``rewind stability RUN [--from NODE] -k K [--set node.param=V | --temperature T]``.

    Opens a session on ``store`` (the model endpoint starts only when a call needs it), runs
    :func:`stability`, prints a table (progress per sample on stderr) or, with ``as_json``, the
    report's JSON on stdout.

    Returns:
        the exit status: 0 every node stable, 1 some node spread or a sample failed, 2 bad input
        or an unavailable endpoint (one ``error:`` line on stderr).
    """
    from rewind.cli.render import error_line
    from rewind.replay import parse_override
    from rewind.session import command_session
    from rewind.stability import stability

    out = make_console()
    err = make_console(stderr=True)
    try:
        if len(set_) > 1:
            raise InvalidOverride(
                f"a stability run carries one change, got {len(set_)} --set",
                "pass one --set (or --temperature)",
            )
        override = parse_override(set_[0]) if set_ else None
        require_existing_store(store)
        with command_session(store) as rw:

            def progress(i: int, run: RunRecord) -> None:
                err.print(
                    f"  sample {i + 1}/{k}: {inert(run.run_id[:12])} {run.status} · "
                    f"{run.tokens} tok · "
                    f"{run.latency_ms / 1000:.1f} s"
                )

            report = stability(
                rw,
                run_id,
                k=k,
                from_node=from_node,
                override=override,
                temperature=temperature,
                on_sample=progress,
            )
    except RewindError as exc:
        err.print(error_line(exc), soft_wrap=True)
        return 2
    if as_json:
        out.file.write(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    else:
        render_stability(report, out)
    ok = report.stable_share == 1.0 and all(s.status == "completed" for s in report.samples)
    return 0 if ok else 1
