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
    from rewind.replay import Override, Rewind


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
    override: Override | None = None
    if specs:
        from rewind.replay import parse_override

        spec, kind = specs[0]
        override = parse_override(spec, output=kind == "output", input_=kind == "input")
    with session() as rw:
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
        sub = child.launch.get("sub_run_fork")
        if sub:
            new = rw.sub_run_at(child.run_id, sub["path"])
            console.print(
                f"sub-run {inert(sub['run_id'][:12])} re-ran as "
                f"{inert(new.run_id[:12] if new else '?')} inside this fork of its spawning run "
                "(the spawning node re-executed; its other sub-runs and the downstream nodes "
                "replayed through the cache)"
            )
        if child.parent_run_id:
            d = rw.diff(child.parent_run_id, child.run_id)
            print_diff(d)
            if (
                override is None
                and d.first_divergence is not None
                and any(n.code_changed for n in d.nodes)
            ):
                changed = ", ".join(code_change(n) for n in d.nodes if n.code_changed)
                err_console.print(
                    "[yellow]warning:[/] this unchanged replay diverged, and the code of "
                    f"{inert(changed)} changed since the recording: the divergence may come "
                    "from the code"
                )
            elif override is None and d.first_divergence is not None:
                node = d.first_divergence
                err_console.print(
                    f"[yellow]warning:[/] this unchanged replay diverged at node "
                    f"{node.index + 1} ({inert(node.name)}): something it does is not routed "
                    "through rewind.tool / rewind.calls.chat (time, randomness, a live service), "
                    "or the model differs from the recorded one"
                )
        if child.status != "completed":
            raise SystemExit(1)


def _warn_model_change(rw: Rewind, run_id: str) -> None:
    recorded = rw.store.get_run(run_id).config.get("model")
    current = rw.chat_client.endpoint.model if rw.chat_client is not None else None
    if recorded and current and recorded != current:
        err_console.print(
            f"[yellow]warning:[/] the run was recorded with model {inert(repr(recorded))} but the "
            f"current endpoint serves {inert(repr(current))}: its LLM calls will miss the cache"
        )
