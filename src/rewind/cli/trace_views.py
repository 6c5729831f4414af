"""What the tracing commands print, as functions the Typer commands in :mod:`rewind.cli.traces`
call.

Each function takes the command's session (a :class:`rewind.replay.Rewind`: its store, and its
model client where a command may call the model), the command's arguments and a Rich console,
prints a table (or JSON on stdout with ``as_json``) and returns the exit code: 0 done, 1 the
replay/fork it ran failed (or a debug script had failing commands). Bad input raises a
:class:`~rewind.errors.RewindError` — the CLI's ``session`` turns it into one line on stderr and
exit status 2, having written nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from rewind.cli.render import emit_json
from rewind.errors import InvalidOverride, RewindError, UnknownNode
from rewind.replay import Rewind, parse_override
from rewind.terminal import console as make_console
from rewind.terminal import inert, visible
from rewind.tracing.correlation import Correlation, correlate_failures
from rewind.tracing.debug import DebugError, DebugQuit, DebugSession, run_script
from rewind.tracing.failures import analyze_failures
from rewind.tracing.inspect import (
    ERROR,
    INFO,
    WARNING,
    InspectionSettings,
    compare_traces,
    inspect_trace,
)
from rewind.tracing.model import StepView, TraceView
from rewind.tracing.recorded import ended_as_recorded
from rewind.tracing.replay import ReplaySwitches, replay_trace
from rewind.tracing.rootcause import root_cause
from rewind.tracing.store import load_trace, load_traces, parse_time, search_runs, state_at
from rewind.tracing.tracer import StoppedAtDivergence

__all__ = [
    "debug_command",
    "failures_command",
    "inspect_command",
    "otel_export_command",
    "otel_import_command",
    "replay_trace_command",
    "root_cause_command",
    "settings_from",
]

_SEVERITY_STYLE = {ERROR: "bold red", WARNING: "dark_orange", INFO: "cyan"}
_STATUS_STYLE = {
    "success": "green",
    "failed": "red",
    "skipped": "grey50",
    "running": "yellow",
    "pending": "yellow",
}


def _console(console: Console | None) -> Console:
    return console or make_console()


def settings_from(specs: Iterable[str] | None) -> InspectionSettings:
    """Inspection settings with ``name=value`` overrides (``--setting slow_llm_ms=5000``).

    Raises:
        InvalidOverride: malformed, an unknown setting, or a value of the wrong type.
    """
    overrides: dict[str, str] = {}
    for spec in specs or []:
        name, sep, value = spec.partition("=")
        if not sep or not name.strip():
            raise InvalidOverride(f"malformed setting {spec!r}", "write it as --setting name=value")
        overrides[name.strip()] = value.strip()
    return InspectionSettings().with_overrides(overrides)


def _status(status: str) -> str:
    return f"[{_STATUS_STYLE.get(status, 'white')}]{inert(status)}[/]"


def trace_table(view: TraceView, title: str | None = None) -> Table:
    """A trace's steps as a Rich table (nesting shown by indentation)."""
    t = Table(
        title=inert(title or f"{view.kind} {view.trace_id} ({view.name})"), title_justify="left"
    )
    for col, justify in (
        ("#", "right"),
        ("step", "left"),
        ("type", "left"),
        ("status", "left"),
        ("cache", "left"),
        ("tokens", "right"),
        ("ms", "right"),
        ("error", "left"),
    ):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for s in view.steps:
        reason = s.cache_reason if s.cache_reason not in ("", s.cache_outcome) else ""
        t.add_row(
            str(s.number),
            "  " * view.depth(s) + inert(s.name),
            inert(s.step_type),
            _status(s.status),
            inert(s.cache_outcome + (f":{reason}" if reason else "")),
            str(s.tokens),
            f"{s.duration_ms:.1f}",
            inert(s.error or ""),
        )
    return t


def _summary_line(view: TraceView) -> str:
    parts = [
        f"{inert(view.kind)} [bold]{inert(view.trace_id)}[/] ({inert(view.name)}) "
        f"{_status(view.status)}",
        f"{len(view.steps)} steps",
        f"{view.tokens} tokens",
        f"{view.duration_ms:.1f} ms",
    ]
    if view.parent_run_id:
        change = view.override
        what = (
            f"{change.get('node')}.{change.get('param') or change.get('field')}="
            f"{json.dumps(change.get('value'))[:60]}"
            if change
            else "no change (unchanged replay)"
        )
        parts.append(f"replay of {inert(view.parent_run_id[:12])}: {inert(what)}")
    if view.error:
        parts.append(f"[red]{inert(view.error)}[/]")
    return " · ".join(parts)


# -- replay-trace ------------------------------------------------------------------------------


def replay_trace_command(
    rw: Rewind,
    trace: str,
    changes: list[str] | None = None,
    *,
    as_json: bool = False,
    console: Console | None = None,
    chain: str | None = None,
    switches: ReplaySwitches | None = None,
) -> int:
    """``rewind replay-trace TRACE [--set input.field=VALUE | --set step.param=VALUE]
    [--chain module:function]``: re-run a traced chain (its code, or its recorded calls when no
    code is known) with its recorded LLM answers and at most one change, then diff it against the
    original. ``switches``: :class:`ReplaySwitches`. Exit 0 when the replay completed or stopped
    at the first divergence as asked, 1 when it failed (a recorded-calls replay of a trace whose
    chain raised fails with the recorded error, and says so: ``ended_as_recorded``)."""
    out = _console(console)
    if changes and len(changes) > 1:
        raise InvalidOverride(
            f"a replay carries exactly one change, got {len(changes)}",
            "pass one --set (replay several times for several changes)",
        )
    record = replay_trace(
        rw.store,
        trace,
        change=changes[0] if changes else None,
        chat_client=rw.chat_client,
        chain=chain,
        switches=switches,
    )
    mode = str(record.config.get("replay_mode") or "chain")
    stopped = (record.error or "").startswith(f"{StoppedAtDivergence.__name__}:")
    parent = record.parent_run_id
    assert parent is not None
    a, b = load_trace(rw.store, parent), load_trace(rw.store, record.run_id)
    comparison = compare_traces(a, b)
    as_recorded = ended_as_recorded(a, b)
    if as_json:
        emit_json(
            {
                "mode": mode,
                "switches": record.config.get("switches"),
                "stopped": stopped,
                "ended_as_recorded": as_recorded,
                "trace": b.to_json(),
                "diff": comparison,
            }
        )
    else:
        out.print(f"mode: {_MODES.get(mode, mode)}")
        if stopped:
            out.print(f"[yellow]{inert(b.error_message or '')}[/]")
        if as_recorded:
            out.print(
                f"[yellow]failed: the recorded chain raised {inert(a.error or '')}; without its "
                "code the replay ends as the recording did (pass --chain module:function to run "
                "the code again)[/]"
            )
        out.print(trace_table(b, f"replay {b.trace_id}"))
        out.print(_summary_line(b))
        _print_comparison(out, comparison)
        if not changes and comparison["first_divergence"] is not None:
            out.print(f"[yellow]warning:[/] {_divergence_cause(switches)}")
    return 0 if record.status == "completed" or stopped else 1


def _divergence_cause(switches: ReplaySwitches | None) -> str:
    """Why an unchanged replay may have diverged: calls the switches made it run again, or
    something not routed through Rewind."""
    rerun = [
        flag
        for flag, cached in (
            ("--no-cached-llm", switches is None or switches.cached_llm),
            ("--no-cached-tools", switches is None or switches.cached_tools),
        )
        if not cached
    ]
    if rerun:
        return (
            f"this replay diverged: {' and '.join(rerun)} ran the calls again and they returned "
            "other results than recorded (a tool's code or data, or the model's sampling, "
            "changed since the recording)"
        )
    return (
        "this unchanged replay diverged: the chain's code changed since the recording (a "
        "prompt, a tool's arguments), something it does is not routed through rewind.calls.chat "
        "or a @rewind.tool (time, randomness, a live service), or the model differs from the "
        "recorded one"
    )


def _print_correlation(out: Console, c: Correlation, examples: int) -> None:
    t = Table(
        title=f"failure rate by {c.dimension} ({c.failed}/{c.total} {c.unit}, {c.rate:.0%})",
        title_justify="left",
    )
    for col in ("group", c.unit, "failed", "rate", "examples"):
        t.add_column(col)
    hot = {g.key for g in c.findings()}
    for g in c.groups:
        colour = "red" if g.key in hot else "default"
        t.add_row(
            f"[{colour}]{inert(g.key)}[/]",
            str(g.total),
            str(g.failed),
            f"{g.rate:.0%}",
            " ".join(e[:12] for e in g.examples[: min(examples, 3)]),
        )
    out.print(t)
    for line in c.to_json()["findings"]:
        out.print(f"[red]failures concentrate:[/] {inert(line)}")


_MODES = {
    "chain": "chain (the chain's code ran again)",
    "recorded-calls": "recorded calls (no chain code: the recorded model calls were re-sent "
    "through the cache; pass --chain module:function to run code)",
}


def _print_comparison(out: Console, comparison: dict[str, Any]) -> None:
    t = Table(
        title=inert(f"diff {comparison['run_a'][:12]} → {comparison['run_b'][:12]}"),
        title_justify="left",
    )
    for col in ("#", "step", "status", "hash", "similarity", "tokens Δ", "changed fields"):
        t.add_column(col)
    for row in comparison["nodes"]:
        paths = [c["path"] or "(value)" for c in row["changes"]]
        shown = ", ".join(paths[:4]) + (f" (+{len(paths) - 4})" if len(paths) > 4 else "")
        colour = {"equal": "green", "changed": "dark_orange"}.get(row["status"], "red")
        mark = " ◀ first divergence" if comparison["first_divergence"] == row["index"] else ""
        t.add_row(
            str(row["index"] + 1),
            inert(row["name"]),
            f"[{colour}]{row['status']}[/]{mark}",
            "=" if row["hash_equal"] else "≠",
            f"{row['similarity']:.3f}",
            f"{row['token_delta']:+d}",
            inert(shown),
        )
    out.print(t)
    if comparison["first_divergence"] is None:
        out.print("[green]no divergence: every step output is equal[/]")
    out.print(
        f"tokens: {comparison['tokens_a']} → {comparison['tokens_b']} "
        f"({comparison['token_delta']:+d}); output similarity "
        f"{comparison['output']['similarity']:.3f}"
    )


# -- inspect -----------------------------------------------------------------------------------


def inspect_command(
    rw: Rewind,
    trace: str,
    step: str | None = None,
    *,
    settings: list[str] | None = None,
    as_json: bool = False,
    console: Console | None = None,
) -> int:
    """``rewind inspect TRACE [--step NAME] [--setting name=value]``: findings per step with a
    severity and a suggestion. Works on Burr runs too. Exit 0 (findings are not an error)."""
    out = _console(console)
    config = settings_from(settings)
    view = load_trace(rw.store, trace, payloads=True)
    try:
        report = inspect_trace(view, step=step, settings=config)
    except LookupError as exc:
        raise UnknownNode(str(exc), "name a step as rewind show lists it") from exc
    if as_json:
        emit_json(report.to_json())
        return 0
    t = Table(
        title=inert(f"inspect {view.kind} {view.trace_id} ({view.name})"), title_justify="left"
    )
    for col in ("#", "step", "type", "status", "ms", "tokens", "findings"):
        t.add_column(col)
    for si in report.steps:
        s = si.step
        findings = (
            ", ".join(f"[{_SEVERITY_STYLE[f.severity]}]{f.code}[/]" for f in si.findings)
            or "[green]ok[/]"
        )
        t.add_row(
            str(s.number),
            "  " * view.depth(s) + inert(s.name),
            inert(s.step_type),
            _status(s.status),
            f"{s.duration_ms:.1f}",
            str(s.tokens),
            findings,
        )
    out.print(t)
    for si in report.steps:
        for f in si.findings:
            style = _SEVERITY_STYLE[f.severity]
            out.print(
                f"[{style}]{f.severity:<7}[/] step {si.step.number} [bold]{inert(si.step.name)}"
                f"[/]: {inert(f.message)}\n          → {inert(f.suggestion)}",
                soft_wrap=True,
            )
    counts = report.counts()
    out.print(f"{counts[ERROR]} error(s), {counts[WARNING]} warning(s), {counts[INFO]} note(s)")
    return 0


# -- failures ----------------------------------------------------------------------------------


def failures_command(
    rw: Rewind,
    *,
    since: str | None = None,
    until: str | None = None,
    name: str | None = None,
    kind: str = "any",
    limit: int = 1000,
    examples: int = 5,
    as_json: bool = False,
    console: Console | None = None,
    by: Sequence[str] | None = None,
) -> int:
    """``rewind failures [--since 24h|DATE] [--until …] [--name CHAIN] [--kind trace|run|any]
    [--by input_length|step_type|model|params ...]``: failure patterns across traces and runs,
    each with its count, example trace ids and a suggested fix; with ``--by``, failure rates per
    group of each dimension and the groups where failures concentrate
    (:mod:`rewind.tracing.correlation`). Exit 0."""
    out = _console(console)
    if limit < 1:
        raise InvalidOverride("--limit must be at least 1", "e.g. --limit 1000")
    runs, total = search_runs(
        rw.store,
        name=name,
        since=parse_time(since),
        until=parse_time(until),
        kind=kind,
        limit=limit,
    )
    views = load_traces(rw.store, [r.run_id for r in runs], payloads=bool(by))
    correlations = correlate_failures(views, by, examples=examples) if by else []
    report = analyze_failures(views)
    if as_json:
        extra = {"matched": total, "analysed": len(runs)}
        if by:
            extra["correlations"] = [c.to_json() for c in correlations]
        emit_json(report.to_json(examples) | extra)
        return 0
    for c in correlations:
        _print_correlation(out, c, examples)
    scope = f"{report.total_traces} traces" + (
        f" (newest {len(runs)} of {total})" if total > len(runs) else ""
    )
    out.print(f"{scope}, {report.failed_traces} failed")
    if not report.patterns:
        out.print("[green]no failures[/]")
        return 0
    t = Table(title="failure patterns", title_justify="left")
    for col in ("pattern", "count", "share", "failing steps", "examples", "suggested fix"):
        t.add_column(col)
    for p in report.patterns:
        label = p.pattern if p.signature is None else f"{p.pattern}: {p.signature}"
        steps = ", ".join(f"{k}×{v}" for k, v in p.steps.most_common(3))
        t.add_row(
            inert(label),
            str(p.count),
            f"{p.count / report.failed_traces:.0%}",
            inert(steps),
            "\n".join(inert(i[:12]) for i in p.examples(min(examples, 3))),
            inert(p.suggested_fix),
        )
    out.print(t)
    out.print("see one example: rewind root-cause TRACE")
    return 0


# -- root-cause --------------------------------------------------------------------------------


def root_cause_command(
    rw: Rewind,
    trace: str,
    *,
    as_json: bool = False,
    console: Console | None = None,
) -> int:
    """``rewind root-cause TRACE``: the failing step, its input, the steps before it,
    suggestions and the command that re-runs from it. Exit 0 (also for a trace that did not
    fail: it says so)."""
    out = _console(console)
    rc = root_cause(load_trace(rw.store, trace, payloads=True))
    if as_json:
        emit_json(rc.to_json())
        return 0
    if not rc.failed:
        out.print(inert(f"{rc.kind} {rc.trace_id} ({rc.name}) did not fail ({rc.status})"))
        return 0
    out.print(f"{inert(rc.kind)} [bold]{inert(rc.trace_id)}[/] ({inert(rc.name)}) [red]failed[/]")
    out.print(
        f"pattern: [bold]{rc.pattern}[/]"
        + (f" ({inert(rc.signature or '')})" if rc.pattern == "cluster" else "")
    )
    if rc.failing_step:
        f = rc.failing_step
        out.print(
            f"failing step: {f['number']} [bold]{inert(f['name'])}[/] ({inert(f['type'])}, "
            f"{f['duration_ms']:.1f} ms): [red]{inert(rc.error or '')}[/]",
            soft_wrap=True,
        )
    else:
        out.print(f"the chain failed outside any step: [red]{inert(rc.error or '')}[/]")
    if rc.input_summary:
        s = rc.input_summary
        extra = f", keys: {', '.join(s['keys'])}" if s.get("keys") else ""
        size = f"{s['chars']} chars (~{s['approx_tokens']} tokens)"
        out.print(f"its input: {inert(s['type'])}, {size}{inert(extra)}")
        out.print(f"  {inert(s['preview']) or '(empty)'}", soft_wrap=True)
    if rc.previous_steps:
        t = Table(title="steps before it", title_justify="left")
        for col in ("#", "step", "type", "status", "ms"):
            t.add_column(col)
        for p in rc.previous_steps:
            t.add_row(
                str(p["number"]),
                "  " * p["depth"] + inert(p["name"]),
                inert(p["type"]),
                _status(p["status"]),
                f"{p['duration_ms']:.1f}",
            )
        out.print(t)
    for note in rc.upstream:
        out.print(f"[dark_orange]upstream:[/] {inert(note)}", soft_wrap=True)
    out.print("suggestions:")
    for s in rc.suggestions:
        out.print(f"  • {inert(s)}", soft_wrap=True)
    if rc.fork_command:
        out.print(f"re-run from the failing node: [bold]{inert(rc.fork_command)}[/]")
    if rc.replay_command:
        out.print(f"replay with a change: [bold]{inert(rc.replay_command)}[/]")
    return 0


# -- debug -------------------------------------------------------------------------------------


def debug_command(
    rw: Rewind,
    run: str,
    *,
    lines: Iterable[str] | None = None,
    console: Console | None = None,
) -> int:
    """``rewind debug RUN``: a stepping session over a run or trace. Commands come from
    ``lines`` or stdin (a terminal gets a ``(rewind)`` prompt); ``help`` lists them. Exit 0, or 1
    when a scripted command failed."""
    out = _console(console)
    view = load_trace(rw.store, run)
    session = DebugSession(
        view,
        state_loader=lambda step: state_at(rw.store, step),
        forker=lambda step, spec, output, effects, restore: _fork(
            rw, view, step, spec, output, effects, restore
        ),
    )

    def write(text: str) -> None:
        out.print(visible(text, multiline=True), markup=False, highlight=False, soft_wrap=True)

    if lines is None and sys.stdin.isatty():
        write(f"debugging {view.kind} {view.trace_id} ({view.name}); type help, quit to leave")
        for line in session._where():
            write(line)
        errors = 0
        while True:
            try:
                line = input("(rewind) ")
            except EOFError:
                break
            try:
                for text in session.execute(line):
                    write(text)
            except DebugQuit:
                break
            except DebugError as exc:
                errors += 1
                write(f"error: {exc}")
        return 0
    errors = run_script(session, lines if lines is not None else sys.stdin, write)
    return 1 if errors else 0


def _fork(
    rw: Rewind,
    view: TraceView,
    step: StepView,
    spec: str | None,
    output: bool,
    effects: str,
    restore: str = "refuse",
) -> str:
    try:
        if view.kind == "trace":
            if output:
                raise DebugError("a trace replays with --set input.FIELD=VALUE or step.param=VALUE")
            if effects != "recorded":
                raise DebugError(
                    "--effects applies to forks of Burr runs; a traced chain replays with its "
                    "recorded calls"
                )
            record = replay_trace(rw.store, view.trace_id, change=spec, chat_client=rw.chat_client)
            what = "replayed trace"
        else:
            override = parse_override(spec, output=output) if spec else None
            record = rw.fork(
                view.trace_id, at=step.number, override=override, effects=effects, restore=restore
            )
            what = f"forked at step {step.number} ({step.name}), effects {effects}:"
        d = rw.diff(view.trace_id, record.run_id)
        first = d.first_divergence
        where = (
            "no divergence"
            if first is None
            else f"first divergence at step {first.index + 1} {first.name}"
        )
        return f"{what} new run {record.run_id} {record.status}, {record.tokens} tokens; {where}"
    except RewindError as exc:
        raise DebugError(exc.message + (f" — {exc.hint}" if exc.hint else "")) from exc


# -- OpenTelemetry -----------------------------------------------------------------------------


def otel_export_command(
    rw: Rewind,
    runs: list[str],
    *,
    out: Path | None = None,
    endpoint: str | None = None,
    service_name: str = "rewind",
    headers: list[str] | None = None,
    as_json: bool = False,
    console: Console | None = None,
) -> int:
    """``rewind otel export RUN... --out FILE`` (OTLP/JSON) and/or ``--endpoint URL`` (OTLP/HTTP
    protobuf; ``/v1/traces`` is appended to a base URL): runs and traces as GenAI-convention
    spans. Exit 0."""
    con = _console(console)
    if not runs:
        raise InvalidOverride("name at least one run or trace", "rewind otel export RUN --out FILE")
    if out is None and endpoint is None:
        raise InvalidOverride("say where to export", "pass --out FILE and/or --endpoint URL")
    exported: list[str] = []
    if out is not None:
        exported = _export_to_file(rw, runs, out, service_name)
    if endpoint is not None:
        exported = _export_to_endpoint(rw, runs, endpoint, headers or [], service_name)
    if as_json:
        emit_json({"trace_ids": exported, "out": str(out) if out else None, "endpoint": endpoint})
        return 0
    where = " and ".join(x for x in (str(out) if out else "", endpoint or "") if x)
    con.print(f"exported {len(exported)} trace(s) to {inert(where)}")
    for tid in exported:
        con.print(f"  {inert(tid)}")
    return 0


def _export_to_file(rw: Rewind, runs: list[str], out: Path, service_name: str) -> list[str]:
    """Write the runs' spans as OTLP/JSON to ``out``; the exported trace ids.

    Raises:
        InvalidOverride: ``out`` is a folder or its folder does not exist.
        RewindError: the file cannot be written.
    """
    from rewind.tracing.otel import export_to_file

    if out.exists() and out.is_dir():
        raise InvalidOverride(f"--out {out} is a folder", "give a file name")
    if not out.parent.is_dir():
        raise InvalidOverride(
            f"--out {out}: the folder {out.parent} does not exist",
            "create it first, or pass a file in an existing folder",
        )
    try:
        return export_to_file(rw.store, runs, out, service_name=service_name)
    except OSError as exc:
        raise RewindError(
            f"cannot write --out {out}: {exc.strerror or exc}",
            "pass a file in a folder you can write to",
        ) from exc


def _export_to_endpoint(
    rw: Rewind, runs: list[str], endpoint: str, headers: list[str], service_name: str
) -> list[str]:
    """Send the runs' spans to an OTLP/HTTP collector at ``endpoint`` (``/v1/traces`` appended
    to a base URL) with ``headers`` (``name=value``); the exported trace ids.

    Raises:
        InvalidOverride: not an http(s) URL, or a malformed header.
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from rewind.tracing.otel import export_runs

    if not endpoint.startswith(("http://", "https://")):
        raise InvalidOverride(
            f"--endpoint {endpoint!r} is not an http(s) URL",
            "pass the collector's OTLP/HTTP address, e.g. http://localhost:4318",
        )
    url = endpoint.rstrip("/")
    url = url if url.endswith("/v1/traces") else url + "/v1/traces"
    pairs = {}
    for h in headers:
        k, sep, v = h.partition("=")
        if not sep:
            raise InvalidOverride(f"malformed header {h!r}", "write it as --header name=value")
        pairs[k.strip()] = v.strip()
    exporter = OTLPSpanExporter(endpoint=url, headers=pairs or None, timeout=30)
    try:
        return export_runs(rw.store, runs, exporter, service_name=service_name)
    finally:
        exporter.shutdown()


def otel_import_command(
    rw: Rewind,
    file: Path,
    *,
    docs: list[dict[str, Any]] | None = None,
    as_json: bool = False,
    console: Console | None = None,
) -> int:
    """``rewind otel import FILE``: OTLP/JSON traces into the store (trace ids kept; traces
    already stored are skipped). Malformed spans are rejected one by one, each printed with its
    reason; the rest is imported.

    Args:
        docs: the file's request objects when already read (:func:`read_otlp_file`), so a
            caller can refuse a bad file before it opens the store.
    Returns:
        the exit code: 0 all spans imported (or already stored); 1 some spans rejected, the
        rest imported; 2 spans rejected and no trace imported.
    Raises:
        InvalidOtlp: the file is unreadable, too large, too deep or not OTLP/JSON (nothing
            imported; the CLI exits 2).
    """
    from rewind.tracing.otel import import_otlp, read_otlp_file

    con = _console(console)
    result = import_otlp(rw.store, docs if docs is not None else read_otlp_file(file))
    code = 0 if not result.rejected else (1 if result.imported else 2)
    if as_json:
        emit_json(result.to_json())
        return code
    con.print(
        f"imported {len(result.imported)} trace(s) from {inert(str(file))} "
        f"({result.spans} spans); {len(result.skipped)} already stored; "
        f"{result.rejected} span(s) rejected"
    )
    for tid in result.imported:
        view = load_trace(rw.store, tid)
        con.print(f"  {tid} {inert(view.name)} {_status(view.status)} {len(view.steps)} steps")
    for note in result.notes:
        con.print(f"[yellow]note:[/] {inert(note)}")
    for err in result.errors:
        con.print(f"[red]rejected:[/] {inert(err)}")
    return code
