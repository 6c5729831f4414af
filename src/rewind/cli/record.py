"""``rewind demo``, ``rewind run`` and ``rewind verify``: record runs, prove the demo's claims."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from rewind.cli.app import (
    JsonOpt,
    StoreOpt,
    demo_state,
    json_object,
    session,
    store_given,
    store_location,
)
from rewind.cli.render import (
    console,
    nodes_table,
    print_diff,
    run_summary,
    show_run,
)
from rewind.errors import InvalidOverride
from rewind.terminal import inert

if TYPE_CHECKING:
    from rewind.replay import Rewind


def demo(
    csv: Annotated[
        Path | None, typer.Option(help="CSV to analyse (default: Seattle weather).")
    ] = None,
    question: Annotated[str | None, typer.Option(help="Question to answer.")] = None,
    store: StoreOpt = None,
) -> None:
    """Record the 8-node research pipeline, fork it at node 3, replay unchanged, and diff."""
    from rewind.demo import run_demo

    demo_state(csv, question)  # validate before the store is opened
    with session() as rw:
        console.print(f"store: {inert(rw.store.root)}")
        stages = {
            "record": "1/4 recording the research pipeline with the model (takes a minute)…",
            "fork": "2/4 forking at node 3 (analyse) with one param changed (effects: live, so "
            "the branch publishes its own report)…",
            "replay": "3/4 unchanged replay from node 3…",
            "diff": "4/4 diffing…",
        }
        rw.chat_client.open()
        result = run_demo(
            rw, csv_path=csv, question=question, on_stage=lambda s: console.print(stages[s])
        )
        console.print(nodes_table(rw.store.nodes_of(result.parent.run_id), "recorded run"))
        console.print(run_summary(result.parent))
        console.print(nodes_table(rw.store.nodes_of(result.fork.run_id), "fork"))
        console.print(run_summary(result.fork))
        print_diff(result.diff)
        console.print(nodes_table(rw.store.nodes_of(result.replay.run_id), "unchanged replay"))
        _print_proof(rw, result)


def _print_proof(rw: Rewind, result: Any) -> None:
    parent, replay = result.parent, result.replay
    pn, rn = rw.store.nodes_of(parent.run_id), rw.store.nodes_of(replay.run_id)
    executed = [n for n in rn if not n.inherited]
    hits = sum(1 for n in executed if n.cache_outcome == "hit")
    equal = sum(1 for a, b in zip(pn, rn, strict=False) if a.output_hash == b.output_hash)
    arts = {r: rw.store.artifacts_of(r) for r in (parent.run_id, replay.run_id)}
    a, b = (arts[parent.run_id][0]["sha256"], arts[replay.run_id][0]["sha256"])
    t = Table(title="proof: unchanged replay vs recorded run", title_justify="left")
    t.add_column("claim")
    t.add_column("value")
    t.add_column("")
    ok = "[green]✓[/]"
    bad = "[red]✗[/]"
    rows = [
        ("cache hits (nodes replayed)", f"{hits}/{len(executed)}", hits == len(executed)),
        ("tokens spent", f"{replay.tokens} (recorded run: {parent.tokens})", replay.tokens == 0),
        ("output hashes equal", f"{equal}/{len(pn)}", equal == len(pn)),
        ("artifact sha256", f"{b[:16]} vs {a[:16]}", a == b),
    ]
    for claim, value, passed in rows:
        t.add_row(claim, value, ok if passed else bad)
    console.print(t)
    console.print(f"artifact: {inert(arts[parent.run_id][0]['path'])}")


def run(
    csv: Annotated[Path | None, typer.Option(help="CSV for the demo pipeline.")] = None,
    question: Annotated[str | None, typer.Option(help="Question for the demo pipeline.")] = None,
    pipeline: Annotated[
        str | None, typer.Option(help="Another pipeline as module:attribute.")
    ] = None,
    app_ref: Annotated[
        str | None,
        typer.Option(
            "--app",
            help="Your Burr app as module:attribute: an Application, an ApplicationBuilder or "
            "a zero-argument factory of either.",
        ),
    ] = None,
    state: Annotated[
        str | None, typer.Option(help="Initial state JSON (default: the app's own).")
    ] = None,
    inputs: Annotated[
        str | None, typer.Option(help="Burr runtime inputs JSON, as app.run(inputs=...).")
    ] = None,
    halt_after: Annotated[
        list[str] | None, typer.Option("--halt-after", help="Stop after this node (repeatable).")
    ] = None,
    halt_before: Annotated[
        list[str] | None,
        typer.Option("--halt-before", help="Stop before this node (repeatable)."),
    ] = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Record one run: the demo research pipeline, or your app (--app) / pipeline (--pipeline)."""
    from rewind.examples import research

    if pipeline and app_ref:
        raise InvalidOverride("--pipeline and --app name the same thing", "pass one of them")
    ref = app_ref or pipeline
    if ref and (csv or question):
        raise InvalidOverride("--csv and --question belong to the demo pipeline", "drop them")
    if not ref and (state is not None or inputs is not None or halt_after or halt_before):
        raise InvalidOverride(
            "--state, --inputs, --halt-after and --halt-before need --app (or --pipeline)",
            "pass --app module:attribute",
        )
    # Everything the user typed is checked before the store is opened: bad input writes nothing.
    initial: dict[str, Any] | None = None
    run_inputs: dict[str, Any] | None = None
    if ref:
        from rewind.replay import load_pipeline

        p = load_pipeline(ref)
        initial = json_object("--state", state) if state is not None else None
        run_inputs = json_object("--inputs", inputs) if inputs is not None else None
    else:
        p = research.build()
        initial = demo_state(csv, question)
    with session() as rw:
        if not ref:
            rw.chat_client.open()  # fail before recording anything if the model is unreachable
        model = rw.chat_client.endpoint.model if rw.chat_client is not None else None
        result = rw.record(
            p,
            initial,
            inputs=run_inputs,
            halt_after=halt_after or None,
            halt_before=halt_before or None,
            config={"model": model},
        )
        show_run(rw, result, as_json)
        if result.status != "completed":
            raise SystemExit(1)


def verify(
    keep: Annotated[
        bool, typer.Option(help="Keep the temporary store and print its path.")
    ] = False,
    server: Annotated[
        bool, typer.Option("--server", help="Run the checks through the HTTP API.")
    ] = False,
    queue: Annotated[
        str | None,
        typer.Option(
            envvar="REWIND_QUEUE",
            help="With --server and a database --store: the Redis URL jobs go through (a "
            "`rewind worker` must consume it, else verify starts one).",
        ),
    ] = None,
    objects: Annotated[
        str | None,
        typer.Option(
            envvar="REWIND_OBJECTS",
            help="With --server: the object store URL for large blobs and artifacts "
            "(s3://bucket/prefix; endpoint and credentials from AWS_* / FSSPEC_S3_ENDPOINT_URL).",
        ),
    ] = None,
    store: StoreOpt = None,
) -> None:
    """Run the demo in a fresh store and prove its claims with 15 checks (exit 0 if all pass).

    With --server and a database URL as --store (or $REWIND_STORE), the checks run against the
    team setup: that store, --queue and --objects (or their variables). A store folder is
    ignored: verify records into a fresh one.
    """
    if server:
        from rewind.cli.serve import verify_server

        team_store = None
        if store_given():
            location = store_location()
            team_store = location if "://" in location else None
        raise SystemExit(
            verify_server(
                keep=keep,
                store=team_store,
                queue=(queue or "").strip() or None,
                objects=(objects or "").strip() or None,
            )
        )
    from rewind.demo import run_demo
    from rewind.verify import run_checks

    folder = tempfile.mkdtemp(prefix="rewind-verify-")
    with session(folder) as rw:
        console.print(f"verify: fresh store {folder}")
        result = run_demo(rw, on_stage=lambda s: console.print(f"  {s}…"))
        checks = run_checks(rw, result, folder)
    t = Table(title="rewind verify", title_justify="left")
    for col in ("#", "check", "result", "numbers"):
        t.add_column(col)
    for c in checks:
        verdict = "[green]PASS[/]" if c.passed else "[red]FAIL[/]"
        t.add_row(str(c.number), c.claim, verdict, inert(c.detail))
    console.print(t)
    passed = sum(c.passed for c in checks)
    console.print(f"{passed}/{len(checks)} checks passed")
    if keep:
        console.print(f"store kept at {folder}")
    else:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    raise SystemExit(0 if passed == len(checks) else 1)
