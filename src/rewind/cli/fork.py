"""``rewind fork``: fork a run at a node with one change and replay downstream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from rewind.cli.app import (
    JsonOpt,
    StoreOpt,
    session,
)
from rewind.cli.render import (
    code_change,
    console,
    err_console,
    print_diff,
    show_run,
)
from rewind.errors import InvalidOverride
from rewind.terminal import inert

if TYPE_CHECKING:
    from rewind.diff import TrajectoryDiff
    from rewind.replay import Override, Rewind
    from rewind.store import RunRecord


def fork(
    run_id: Annotated[str, typer.Argument(help="Run to fork (id or unique prefix).")],
    at: Annotated[str, typer.Option("--at", help="Fork node: name or 1-based number.")],
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Change a node param: node.param=VALUE")
    ] = None,
    set_output: Annotated[
        list[str] | None,
        typer.Option("--set-output", help="Replace a node's output field: node.field=JSON"),
    ] = None,
    set_input: Annotated[
        list[str] | None,
        typer.Option("--set-input", help="Change a node's Burr runtime input: node.input=JSON"),
    ] = None,
    effects: Annotated[
        str,
        typer.Option(help="Side-effecting calls: recorded (serve the record), dry-run, or live."),
    ] = "recorded",
    allow_code_change: Annotated[
        bool,
        typer.Option(
            "--allow-code-change",
            help="Fork even if the pipeline's graph changed since the recording (a node renamed, "
            "removed or inserted after the fork point); the differences are kept on the fork.",
        ),
    ] = False,
    restore: Annotated[
        str,
        typer.Option(
            help="With --effects live: refuse (default) to delete files a pinned snapshot does "
            "not hold when restoring it, or replace them."
        ),
    ] = "refuse",
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Fork a run at a node with one change (or none: an unchanged replay) and replay downstream.

    The pipeline is re-imported and compared with the graph the run recorded: a node renamed,
    removed or inserted where the fork runs refuses the fork (exit 2) unless --allow-code-change;
    a node whose code changed is allowed and labelled "code changed" (show, diff).
    """
    override = _one_change(set_, set_output, set_input)
    with session(must_exist=True) as rw:
        _warn_model_change(rw, run_id)
        child = rw.fork(
            run_id,
            at=at,
            override=override,
            effects=effects,
            allow_code_change=allow_code_change,
            restore=restore,
        )
        if as_json:
            show_run(rw, child, True)
            return
        show_run(rw, child, False)
        _print_sub_run_fork(rw, child)
        if child.parent_run_id:
            d = rw.diff(child.parent_run_id, child.run_id)
            print_diff(d)
            if override is None:
                _warn_unchanged_divergence(d)
        if child.status != "completed":
            raise SystemExit(1)


def _one_change(
    set_: list[str] | None, set_output: list[str] | None, set_input: list[str] | None
) -> Override | None:
    """The fork's override from ``--set``/``--set-output``/``--set-input`` (None: no change).

    Raises:
        InvalidOverride: more than one change, or a malformed one.
    """
    specs = (
        [(s, "param") for s in set_ or []]
        + [(s, "output") for s in set_output or []]
        + [(s, "input") for s in set_input or []]
    )
    if len(specs) > 1:
        raise InvalidOverride(
            f"a fork carries exactly one change, got {len(specs)}",
            "pass one --set, --set-output or --set-input (use several forks for several changes)",
        )
    if not specs:
        return None
    from rewind.replay import parse_override

    spec, kind = specs[0]
    return parse_override(spec, output=kind == "output", input_=kind == "input")


def _print_sub_run_fork(rw: Rewind, child: RunRecord) -> None:
    """For a fork that re-ran a sub-run: which new sub-run replaced it."""
    sub = child.launch.get("sub_run_fork")
    if not sub:
        return
    new = rw.sub_run_at(child.run_id, sub["path"])
    console.print(
        f"sub-run {inert(sub['run_id'][:12])} re-ran as "
        f"{inert(new.run_id[:12] if new else '?')} inside this fork of its spawning run "
        "(the spawning node re-executed; its other sub-runs and the downstream nodes "
        "replayed through the cache)"
    )


def _warn_unchanged_divergence(d: TrajectoryDiff) -> None:
    """An unchanged replay that diverged: warn that code changed, or that something the node
    does is not routed through Rewind's caches."""
    if d.first_divergence is None:
        return
    if any(n.code_changed for n in d.nodes):
        changed = ", ".join(code_change(n) for n in d.nodes if n.code_changed)
        err_console.print(
            "[yellow]warning:[/] this unchanged replay diverged, and the code of "
            f"{inert(changed)} changed since the recording: the divergence may come "
            "from the code"
        )
        return
    node = d.first_divergence
    err_console.print(
        f"[yellow]warning:[/] this unchanged replay diverged at node "
        f"{node.index + 1} ({inert(node.name)}): something it does is not routed "
        "through rewind.tool / rewind.calls.chat (time, randomness, a live service), "
        "or the model differs from the recorded one"
    )


def _warn_model_change(rw: Rewind, run_id: str) -> None:
    recorded = rw.store.get_run(run_id).config.get("model")
    current = rw.chat_client.endpoint.model if rw.chat_client is not None else None
    if recorded and current and recorded != current:
        err_console.print(
            f"[yellow]warning:[/] the run was recorded with model {inert(repr(recorded))} but the "
            f"current endpoint serves {inert(repr(current))}: its LLM calls will miss the cache"
        )
