"""Tracing commands for any LLM chain, not only Burr apps: ``replay-trace``, ``inspect``,
``failures``, ``root-cause``, ``debug`` (see :mod:`rewind.tracing`), and ``otel export|import``.

The Typer commands live here; what they print is in :mod:`rewind.cli.trace_views` (imported when a
command runs: it loads Burr and the store).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from rewind.cli.app import (
    JsonOpt,
    StoreOpt,
    check_count,
    fail,
    session,
)
from rewind.cli.render import console
from rewind.errors import RewindError


def replay_trace_cmd(
    trace: Annotated[str, typer.Argument(help="Trace id (or a unique prefix).")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="One change: input.FIELD=VALUE or STEP.PARAM=VALUE."),
    ] = None,
    chain: Annotated[
        str | None,
        typer.Option(
            help="The chain's code as module:function (default: the recorded one; without "
            "any, the recorded calls are replayed)."
        ),
    ] = None,
    cached_llm: Annotated[
        bool,
        typer.Option(
            "--cached-llm/--no-cached-llm",
            help="Serve unchanged model calls from the recorded answers (off: re-send them all).",
        ),
    ] = True,
    cached_tools: Annotated[
        bool,
        typer.Option(
            "--cached-tools/--no-cached-tools",
            help="Serve unchanged tool calls from their recorded results (off: run them again).",
        ),
    ] = True,
    stop_at_divergence: Annotated[
        bool,
        typer.Option(
            "--stop-at-divergence", help="Stop after the first step whose output differs."
        ),
    ] = False,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Replay a traced chain with its recorded LLM answers and one change; diff the two."""
    from rewind.cli import trace_views as views
    from rewind.tracing.replay import ReplaySwitches

    switches = ReplaySwitches(cached_llm, cached_tools, stop_at_divergence)
    with session(must_exist=True) as rw:
        code = views.replay_trace_command(
            rw, trace, set_, as_json=as_json, console=console, chain=chain, switches=switches
        )
    raise typer.Exit(code)


def inspect_cmd(
    trace: Annotated[str, typer.Argument(help="Trace or run id (or a unique prefix).")],
    step: Annotated[
        str | None, typer.Option(help="Only this step: name, name#k or number.")
    ] = None,
    setting: Annotated[
        list[str] | None,
        typer.Option("--setting", help="Override a threshold: name=value (slow_llm_ms=5000)."),
    ] = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Findings per step (severity, message, suggestion) of a trace or run."""
    from rewind.cli import trace_views as views

    with session(model=False, read_only=True) as rw:
        code = views.inspect_command(
            rw, trace, step, settings=setting, as_json=as_json, console=console
        )
    raise typer.Exit(code)


def failures_cmd(
    since: Annotated[
        str | None, typer.Option(help="Started since: 24h, 7d, 2024-05-01, or unix seconds.")
    ] = None,
    until: Annotated[str | None, typer.Option(help="Started until (same forms).")] = None,
    name: Annotated[str | None, typer.Option(help="Only this chain (pipeline) name.")] = None,
    kind: Annotated[str, typer.Option(help="trace, run (Burr runs) or any.")] = "any",
    limit: Annotated[int, typer.Option(help="How many of the newest traces to analyse.")] = 1000,
    examples: Annotated[int, typer.Option(help="Example trace ids per pattern.")] = 5,
    by: Annotated[
        list[str] | None,
        typer.Option(
            "--by",
            help="Also give failure rates by input_length, step_type, model or params "
            "(repeatable).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Failure patterns across traces and runs: counts, example ids, suggested fixes."""
    from rewind.cli import trace_views as views

    check_count("--limit", limit)
    check_count("--examples", examples, low=0)
    with session(model=False, read_only=True) as rw:
        code = views.failures_command(
            rw,
            since=since,
            until=until,
            name=name,
            kind=kind,
            limit=limit,
            examples=examples,
            by=by,
            as_json=as_json,
            console=console,
        )
    raise typer.Exit(code)


def root_cause_cmd(
    trace: Annotated[str, typer.Argument(help="Trace or run id (or a unique prefix).")],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Why a trace or run failed: failing step, its input, earlier steps, fixes, fork command."""
    from rewind.cli import trace_views as views

    with session(model=False, read_only=True) as rw:
        code = views.root_cause_command(rw, trace, as_json=as_json, console=console)
    raise typer.Exit(code)


def debug_cmd(
    run: Annotated[str, typer.Argument(help="Run or trace id (or a unique prefix).")],
    store: StoreOpt = None,
) -> None:
    """Step through a recorded run or trace (commands from stdin when it is not a terminal)."""
    from rewind.cli import trace_views as views

    with session(must_exist=True) as rw:
        code = views.debug_command(rw, run, console=console)
    raise typer.Exit(code)


otel_app = typer.Typer(
    no_args_is_help=True, help="OpenTelemetry: export runs/traces as spans, import OTLP/JSON."
)


@otel_app.command("export")
def otel_export_cmd(
    runs: Annotated[list[str], typer.Argument(help="Runs or traces (ids or unique prefixes).")],
    out: Annotated[Path | None, typer.Option("--out", help="Write OTLP/JSON to this file.")] = None,
    endpoint: Annotated[
        str | None, typer.Option(help="Also send to an OTLP/HTTP endpoint (http://host:4318).")
    ] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", help="HTTP header for --endpoint: name=value.")
    ] = None,
    service_name: Annotated[str, typer.Option(help="The exported service.name.")] = "rewind",
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Export runs and traces as OTel spans (GenAI semantic conventions)."""
    from rewind.cli import trace_views as views

    with session(model=False, read_only=True) as rw:
        code = views.otel_export_command(
            rw,
            runs,
            out=out,
            endpoint=endpoint,
            headers=header,
            service_name=service_name,
            as_json=as_json,
            console=console,
        )
    raise typer.Exit(code)


@otel_app.command("import")
def otel_import_cmd(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="OTLP/JSON file(s) (one request, or one per line); spans of one trace split "
            "across files are imported together."
        ),
    ],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Import OTLP/JSON traces (trace ids kept) so they can be inspected, analysed, diffed.
    Malformed spans are rejected one by one (exit 1; 2 when nothing could be imported)."""
    from rewind.cli import trace_views as views
    from rewind.tracing.otel import read_otlp_file

    docs: list[dict[str, Any]] = []
    try:  # a bad file is refused before the store is opened: nothing is written
        for file in files:
            docs.extend(read_otlp_file(file))
    except RewindError as exc:
        fail(exc)
    label = Path(files[0]) if len(files) == 1 else Path(f"{len(files)} files")
    with session(model=False) as rw:
        code = views.otel_import_command(rw, label, docs=docs, as_json=as_json, console=console)
    raise typer.Exit(code)
