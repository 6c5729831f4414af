"""The ``rewind`` command line: demo, run, runs, show, fork, diff, verify, gc, archive.

Bad input (unknown run, unknown node, a field the node does not have, malformed JSON, a fork of a
run still running or that failed before the fork node) exits with status 2 and one line saying
what is wrong and how to fix it; nothing is written to the store in that case.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.table import Table

from rewind.canonical import canonical_bytes
from rewind.errors import InvalidOverride, RewindError, StoreError
from rewind.store import NodeRecord, RunRecord
from rewind.terminal import InertLogFormatter, inert, json_text, visible
from rewind.terminal import console as make_console

if TYPE_CHECKING:
    # Imported where used: Burr (and pandas through it), SQLAlchemy and httpx cost ~0.8 s at
    # start-up, which `rewind --help` and the read commands need not pay.
    from rewind.diff import NodeDiff, TrajectoryDiff
    from rewind.replay import Override, Rewind

DEFAULT_STORE = ".rewind"
EXIT_BAD_INPUT = 2
R = TypeVar("R")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Rewind: record, fork, replay and diff LLM agent runs (Apache Burr).",
)
console = make_console()
err_console = make_console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for machines.")]
STORE_ENV = "REWIND_STORE"

_state: dict[str, str | None] = {"store": None}


def _take_store(value: str | None) -> str | None:
    if value is not None:
        _state["store"] = value
    return value


StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        callback=_take_store,
        help=f"Store folder, .db file or database URL (default {DEFAULT_STORE}, or ${STORE_ENV}); "
        "accepted before or after the command.",
        show_default=False,
    ),
]


@app.callback()
def _root(store: StoreOpt = None) -> None:
    _state["store"] = store


# Click's usage error (unknown option, a value of the wrong type): Typer ≥ 0.20 raises it from its
# own copy of Click, older Typer from Click itself; typer.BadParameter derives from it in both.
_UsageError: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)


def _store() -> str:
    """The store location: ``--store`` (before or after the command), else ``$REWIND_STORE``,
    else ``.rewind``.

    Raises:
        StoreError: ``REWIND_STORE`` is set but empty (Click would silently ignore it, and the
            command would use another store than the user meant).
    """
    if _state["store"] is not None:
        return _state["store"]
    env = os.environ.get(STORE_ENV)
    if env is None:
        return DEFAULT_STORE
    if not env.strip():
        raise StoreError(
            f"the environment variable {STORE_ENV} is set but empty",
            f"set it to a store folder, .db file or URL, or unset it (default {DEFAULT_STORE})",
        )
    return env


def _is_store_error(exc: BaseException) -> bool:
    """True for a SQLAlchemy error (without importing SQLAlchemy when nothing loaded it: then no
    such error can have been raised)."""
    module = sys.modules.get("sqlalchemy.exc")
    return module is not None and isinstance(exc, module.SQLAlchemyError)


def main() -> None:
    """Entry point of the ``rewind`` console script.

    Exit status: 0 done; 1 a run, replay or check failed (or another failure the command
    reports); 2 bad input — one ``error:`` line on stderr saying what is wrong and how to fix
    it, nothing written to the store; 130 interrupted.
    """
    logging.getLogger("burr").setLevel(logging.CRITICAL)
    _log_inertly()
    # SIGTERM (timeout, kill) unwinds like Ctrl-C: the run is marked interrupted and the
    # embedded model server is stopped.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        code = app(standalone_mode=False)
    except _UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            # `rewind` (or `rewind otel`) alone: Typer printed the help while raising this.
            raise SystemExit(EXIT_BAD_INPUT) from None
        _fail(_usage_error(exc))
    except typer.Abort:  # Click turns Ctrl-C while parsing or prompting into Abort
        err_console.print("[bold red]interrupted[/]")
        raise SystemExit(130) from None
    except RewindError as exc:
        _fail(exc)
    except Exception as exc:
        if not _is_store_error(exc):
            raise
        orig = getattr(exc, "orig", None) or exc
        first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
        _fail(RewindError(f"the store failed: {first}", "check that --store is writable"))
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/] — the run in progress is marked interrupted")
        raise SystemExit(130) from None
    raise SystemExit(code if isinstance(code, int) else 0)


def _usage_error(exc: Any) -> RewindError:
    """Click's usage error (unknown option, a value of the wrong type...) as Rewind's one line."""
    command = exc.ctx.command_path if exc.ctx is not None else "rewind"
    return InvalidOverride(exc.format_message().rstrip("."), f"see `{command} --help`")


def _log_inertly() -> None:
    """Log lines (warnings and errors of Rewind and its libraries) reach stderr through
    :class:`rewind.terminal.InertLogFormatter`, like the lines Python prints without a handler."""
    handler = logging.StreamHandler()
    handler.setFormatter(InertLogFormatter("%(message)s"))
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _fail(exc: RewindError) -> None:
    from rewind.session import error_line

    err_console.print(error_line(exc), soft_wrap=True)
    run_id = getattr(exc, "run_id", None)
    if run_id:
        # Not bad input: the run started and was recorded as failed at that node.
        err_console.print(
            f"(run {inert(run_id)} was recorded as failed; `rewind show {inert(run_id[:12])}`)"
        )
        raise SystemExit(1)
    raise SystemExit(EXIT_BAD_INPUT)


@contextmanager
def _session(
    store: str | None = None, *, model: bool = True, read_only: bool = False
) -> Iterator[Rewind]:
    """A :class:`Rewind` on the command's store; ``read_only`` for commands that only read (the
    store is then neither created nor written, so it may live on read-only media)."""
    from rewind.session import LazyChatClient
    from rewind.store import open_store
    from rewind.store.users import local_user

    local_user()  # a bad $REWIND_USER is refused before the store is opened (or created)
    opened = open_store(store or _store(), read_only=read_only)
    client = LazyChatClient() if model else None
    if model and os.environ.get("REWIND_MODEL") and not os.environ.get("REWIND_BASE_URL"):
        err_console.print(
            "[yellow]warning:[/] REWIND_MODEL is set but REWIND_BASE_URL is not, so the embedded "
            "model is used; set REWIND_BASE_URL too, or unset REWIND_MODEL"
        )
    from rewind.replay import Rewind

    rw = Rewind(opened, chat_client=client, on_event=_Progress().on_event)
    try:
        yield rw
    except RewindError as exc:
        _fail(exc)
    finally:
        if client is not None:
            client.close()
        rw.store.close()


class _Progress:
    """Prints one line per finished node while a run executes (the model can be slow)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.status: Any = None

    def on_event(self, event: str, payload: dict[str, Any]) -> None:
        if event == "warning":
            self._status(None)
            # Warnings carry untrusted text (resource and file names): shown as typed.
            err_console.print(f"[yellow]warning:[/] {inert(payload['message'])}")
            return
        if not sys.stderr.isatty() and event == "node_started":
            return
        if event == "node_started":
            self._status(
                f"node {payload['position'] + 1} [bold]{inert(payload['name'])}[/] running…"
            )
        elif event == "node_finished":
            self._status(None)
            err_console.print(
                f"  {payload['position'] + 1:>2} {inert(payload['name']):<10} "
                f"{_outcome(payload['outcome'], payload['reason'])}  "
                f"{payload['tokens']:>5} tok  {payload['latency_ms']:>8.1f} ms"
            )
        elif event == "run_finished":
            self._status(None)

    def _status(self, text: str | None) -> None:
        if not err_console.is_terminal:
            return
        if self.status is not None:
            self.status.stop()
            self.status = None
        if text:
            self.status = err_console.status(text)
            self.status.start()


def _outcome(outcome: str, reason: str) -> str:
    colour = {
        "hit": "green",
        "miss": "dark_orange",
        "inherited": "grey50",
        "failed": "red",
        "override": "magenta",
    }.get(outcome, "white")
    label = outcome if reason in ("", outcome, "hit") else f"{outcome}:{reason}"
    return f"[{colour}]{inert(label):<17}[/]"


# -- rendering --------------------------------------------------------------------------------


def _run_json(run: RunRecord) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "pipeline": run.pipeline,
        "status": run.status,
        "parent_run_id": run.parent_run_id,
        "fork_node": run.fork_node,
        "override": run.override,
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.completion_tokens,
        "tokens": run.tokens,
        "latency_ms": round(run.latency_ms, 3),
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "error": run.error,
        "launch": run.launch,
        "effects_mode": run.effects_mode,
        "admissible": run.admissible,
        "spawning_run_id": run.spawning_run_id,
        "spawning_position": run.spawning_position,
        "spawn_key": run.spawn_key,
    }


def _node_json(n: NodeRecord) -> dict[str, Any]:
    return {
        "position": n.position,
        "number": n.position + 1,
        "name": n.name,
        "sequence_id": n.sequence_id,
        "src_app_id": n.src_app_id,
        "src_sequence_id": n.src_sequence_id,
        "inherited": n.inherited,
        "input_hash": n.input_hash,
        "output_hash": n.output_hash,
        "state_hash": n.state_hash,
        "params": n.params,
        "cache_outcome": n.cache_outcome,
        "cache_reason": n.cache_reason,
        "determinism": n.determinism,
        "prompt_tokens": n.prompt_tokens,
        "completion_tokens": n.completion_tokens,
        "tokens": n.tokens,
        "latency_ms": round(n.latency_ms, 3),
        "error": n.error,
        "calls": [
            {
                "kind": c.kind,
                "name": c.name,
                "key": c.key,
                "outcome": c.outcome,
                "reason": c.reason,
                "determinism": c.determinism,
                "tokens": c.prompt_tokens + c.completion_tokens,
            }
            for c in n.calls
        ],
    }


def _nodes_table(nodes: list[NodeRecord], title: str) -> Table:
    t = Table(title=inert(title), title_justify="left")
    t.add_column("#", justify="right")
    t.add_column("node", no_wrap=True, min_width=8)
    t.add_column("outcome", no_wrap=True)
    t.add_column("tokens", justify="right")
    t.add_column("ms", justify="right")
    t.add_column("output sha256", no_wrap=True)
    t.add_column("flag")
    errors = any(n.error for n in nodes)
    if errors:
        t.add_column("error")
    for n in nodes:
        row = [
            str(n.position + 1),
            inert(n.name),
            _outcome(n.cache_outcome, n.cache_reason),
            str(n.tokens),
            f"{n.latency_ms:.1f}",
            (n.output_hash or "—")[:16],
            "" if n.determinism == "deterministic" else n.determinism,
        ]
        if errors:
            row.append(inert(n.error or ""))
        t.add_row(*row)
    return t


def _run_summary(run: RunRecord) -> str:
    parts = [
        f"run [bold]{inert(run.run_id)}[/] ({inert(run.pipeline)}) {inert(run.status)}",
        f"{run.tokens} tokens",
    ]
    if run.parent_run_id:
        change = _override_text(run.override) if run.override else "no override (unchanged replay)"
        parts.append(f"fork of {inert(run.parent_run_id[:12])} at {inert(run.fork_node)}: {change}")
    if run.spawning_run_id:
        parts.append(
            f"sub-run {inert(run.spawn_key or '')} of {inert(run.spawning_run_id[:12])} node "
            f"{(run.spawning_position or 0) + 1}"
        )
    if run.launch.get("sub_run_fork"):
        sub = run.launch["sub_run_fork"]
        change = _override_text(sub["override"]) if sub.get("override") else "unchanged"
        parts.append(f"re-runs sub-run {inert(sub['run_id'][:12])} at {inert(sub['at'])}: {change}")
    if run.launch.get("inputs"):
        parts.append(f"inputs {inert(json.dumps(run.launch['inputs'])[:80])}")
    if run.parent_run_id:
        parts.append(f"effects {run.effects_mode}")
    if run.admissible is not None:
        colour = "red" if run.admissible == "not-admissible" else "green"
        parts.append(f"audit [{colour}]{run.admissible}[/]")
    if run.error:
        parts.append(f"[red]{inert(run.error)}[/]")
    return " · ".join(parts)


def _drift_lines(drift: dict[str, Any] | None) -> list[str]:
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


def _override_text(override: dict[str, Any]) -> str:
    from rewind.replay import override_target

    kind, node, name = override_target(override)
    value = json.dumps(override.get("value"))
    return inert(f"{kind} {node}.{name}={value[:60]}")


def _code_change(nd: NodeDiff) -> str:
    """``analyse`` or ``analyse (helper pkg.mod.score)``: a node whose code changed, naming the
    helpers whose code changed when those are known."""
    if not nd.helpers_changed:
        return nd.name
    return f"{nd.name} (helper {', '.join(nd.helpers_changed)})"


def _print_diff(d: TrajectoryDiff) -> None:
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
    console.print(t)
    first = d.first_divergence
    code_changed = [_code_change(nd) for nd in d.nodes if nd.code_changed]
    if code_changed:
        console.print(
            f"[magenta]code changed[/] between the runs in: {inert(', '.join(code_changed))} — "
            "differences there may come from the code, not from the override"
        )
    if first is None:
        console.print("[green]no divergence: every node output is equal[/]")
        return
    cause = (
        f" — [magenta]code changed[/] ({inert(_code_change(first))}), not only the override"
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
            old, new = _short(c.old), _short(c.new)
            if c.kind == "type_changed":
                old, new = f"{old} ({_type_of(c.old)})", f"{new} ({_type_of(c.new)})"
            moved = f" (was {c.old_path})" if c.old_path else ""
            line = f"  {c.path or '(value)'}{moved}: {old} → {new} ({c.kind})"
            console.print(visible(line), markup=False)
    if len(first.changes) > len(shown_changes):
        more = len(first.changes) - len(shown_changes)
        console.print(f"  … and {more} more (rewind diff A B --json lists every change)")
    executed_b = sum(n.b.tokens for n in (x for x in d.nodes) if n.b and n.b.outcome != "inherited")
    console.print(
        f"tokens spent: {inert(d.run_a[:12])} {d.tokens_a} · {inert(d.run_b[:12])} {d.tokens_b} "
        f"(its executed nodes: {executed_b}; inherited nodes cost nothing)"
    )


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


def _emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


# -- commands ---------------------------------------------------------------------------------


@app.command()
def demo(
    csv: Annotated[
        Path | None, typer.Option(help="CSV to analyse (default: Seattle weather).")
    ] = None,
    question: Annotated[str | None, typer.Option(help="Question to answer.")] = None,
    store: StoreOpt = None,
) -> None:
    """Record the 8-node research pipeline, fork it at node 3, replay unchanged, and diff."""
    from rewind.demo import run_demo

    _demo_state(csv, question)  # validate before the store is opened
    with _session() as rw:
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
        console.print(_nodes_table(rw.store.nodes_of(result.parent.run_id), "recorded run"))
        console.print(_run_summary(result.parent))
        console.print(_nodes_table(rw.store.nodes_of(result.fork.run_id), "fork"))
        console.print(_run_summary(result.fork))
        _print_diff(result.diff)
        console.print(_nodes_table(rw.store.nodes_of(result.replay.run_id), "unchanged replay"))
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


@app.command()
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
        initial = _json_object("--state", state) if state is not None else None
        run_inputs = _json_object("--inputs", inputs) if inputs is not None else None
    else:
        p = research.build()
        initial = _demo_state(csv, question)
    with _session() as rw:
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
        _show_run(rw, result, as_json)
        if result.status != "completed":
            raise SystemExit(1)


def _json_object(flag: str, text: str | None) -> dict[str, Any]:
    """``--state``/``--inputs`` (``flag``): a JSON object whose values Rewind can hash.

    Raises:
        InvalidOverride: not JSON, not an object, nested too deeply, or holding NaN/±Infinity
            (Python's JSON accepts them; canonical hashing refuses them, DESIGN rule 2).
    """
    try:
        initial = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise InvalidOverride(
            f"{flag} is not valid JSON: {exc.msg} at column {exc.colno}", "pass a JSON object"
        ) from exc
    except ValueError as exc:  # e.g. an integer longer than Python's 4300-digit limit
        raise InvalidOverride(f"{flag} cannot be read: {exc}", "pass a JSON object") from exc
    except RecursionError:
        raise InvalidOverride(
            f"{flag} is nested too deeply", "pass a flatter JSON object"
        ) from None
    if not isinstance(initial, dict):
        raise InvalidOverride(
            f"{flag} must be a JSON object (name → value)", f"e.g. {flag} '{{\"x\": 5}}'"
        )
    try:
        canonical_bytes(initial)
    except ValueError as exc:  # CanonicalError: NaN/Infinity, a lone surrogate
        raise InvalidOverride(
            f"{flag} cannot be recorded: {str(exc).split(';')[0]}",
            "use plain JSON values there (null, a finite number, a string)",
        ) from exc
    except RecursionError:
        raise InvalidOverride(
            f"{flag} is nested too deeply", "pass a flatter JSON object"
        ) from None
    return initial


MAX_COUNT = 1_000_000_000
"""Largest --limit/--examples/-k/--workers accepted (SQLite's LIMIT is a signed 64-bit int;
nothing Rewind lists or runs comes near a billion)."""


def _count(option: str, value: int, low: int = 1, high: int = MAX_COUNT) -> int:
    """``value`` if ``low <= value <= high``.

    Raises:
        InvalidOverride: out of range (a huge --limit made SQLite raise OverflowError).
    """
    if not low <= value <= high:
        raise InvalidOverride(
            f"{option} {value} is out of range", f"pass a whole number from {low} to {high:_}"
        )
    return value


def _demo_state(csv: Path | None, question: str | None) -> dict[str, Any]:
    from rewind.examples import research, weather

    if question is not None and not question.strip():
        raise InvalidOverride("--question is empty", "ask a question, or omit --question")
    try:
        return research.initial_state(csv, question)
    except weather.DataError as exc:
        raise RewindError(str(exc).rstrip("."), "") from exc


@app.command()
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
    _count("--limit", limit)
    with _session(model=False, read_only=True) as rw:
        items = rw.store.list_runs(limit, include_sub_runs=sub_runs)
        if as_json:
            _emit_json([_run_json(r) for r in items])
            return
        t = Table(title=f"runs in {inert(rw.store.root)}", title_justify="left")
        columns = ("run", "pipeline", "status", "tokens", "parent", "fork", "effects", "audit")
        for col in (*columns, "created"):
            t.add_column(col)
        for r in items:
            fork = (
                f"{inert(r.fork_node)}: {_override_text(r.override)}"
                if r.override
                else (f"{inert(r.fork_node)} (replay)" if r.fork_node else "")
            )
            if r.spawning_run_id:
                fork = (
                    f"sub-run {inert(r.spawn_key or '')} of node {(r.spawning_position or 0) + 1}"
                )
            t.add_row(
                inert(r.run_id[:12]),
                inert(r.pipeline),
                inert(r.status),
                str(r.tokens),
                inert((r.parent_run_id or r.spawning_run_id or "")[:12]),
                fork,
                r.effects_mode,
                r.admissible or "",
                time.strftime("%m-%d %H:%M", time.localtime(r.created_at)),
            )
        console.print(t)


@app.command()
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

    with _session(model=False, read_only=True) as rw:
        r = rw.store.get_run(run_id)
        if node is None:
            _show_run(rw, r, as_json)
            return
        nodes = rw.store.nodes_of(r.run_id)
        n = nodes[resolve_node(r, nodes, node)]
        detail = {
            "node": _node_json(n),
            "input": display(rw.node_input(n)),
            "output": display(rw.node_output(n)),
            "state": display(rw.node_state(n)) if n.error is None else None,
        }
        if as_json:
            _emit_json(detail)
        else:
            console.print(json_text(_abridge(detail)), soft_wrap=True)
            console.print("[dim](long values abridged; --json prints everything)[/]")


def _abridge(value: Any, depth: int = 0) -> Any:
    """A readable excerpt of a large JSON value: long strings cut, long lists shortened."""
    if isinstance(value, str) and len(value) > 300:
        return value[:300] + f"… ({len(value)} chars)"
    if isinstance(value, list):
        head = [_abridge(v, depth + 1) for v in value[:12]]
        return head + ([f"… {len(value) - 12} more items"] if len(value) > 12 else [])
    if isinstance(value, dict):
        return {k: _abridge(v, depth + 1) for k, v in value.items()}
    return value


def _show_run(rw: Rewind, r: RunRecord, as_json: bool) -> None:
    nodes = rw.store.nodes_of(r.run_id)
    graph = rw.store.run_graph(r.run_id)
    drift = graph.drift if graph is not None else None
    spawned = rw.node_sub_runs(r.run_id)
    if as_json:
        code = {"graph_hash": graph.graph_hash if graph else None, "drift": drift}
        _emit_json(
            {
                "run": _run_json(r) | code,
                "nodes": [
                    _node_json(n) | {"sub_runs": [c.run_id for c in spawned.get(n.position, [])]}
                    for n in nodes
                ],
            }
        )
        return
    console.print(_nodes_table(nodes, f"run {r.run_id}"))
    console.print(_run_summary(r))
    for position, children in sorted(spawned.items()):
        listed = ", ".join(
            f"{inert(c.spawn_key or '')}={inert(c.run_id[:12])} ({inert(c.status)}, {c.tokens} tok)"
            for c in children
        )
        console.print(f"node {position + 1} spawned {len(children)} sub-run(s): {listed}")
    for line in _drift_lines(drift):
        console.print(line)
    for art in rw.store.artifacts_of(r.run_id):
        console.print(
            f"artifact {inert(art['name'])}: {inert(art['path'])} (sha256 {art['sha256'][:16]})"
        )


@app.command()
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
    with _session() as rw:
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
            _show_run(rw, child, True)
            return
        _show_run(rw, child, False)
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
            _print_diff(d)
            if (
                override is None
                and d.first_divergence is not None
                and any(n.code_changed for n in d.nodes)
            ):
                changed = ", ".join(_code_change(n) for n in d.nodes if n.code_changed)
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


@app.command()
def diff(
    run_a: Annotated[str, typer.Argument(help="First run (id or prefix).")],
    run_b: Annotated[str, typer.Argument(help="Second run (id or prefix).")],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Field-level diff of two runs: per node equal/changed, changed paths, first divergence."""
    with _session(model=False, read_only=True) as rw:
        d = rw.diff(run_a, run_b)
        if as_json:
            _emit_json(d.to_json())
        else:
            _print_diff(d)


@app.command()
def audit(
    run_id: Annotated[str, typer.Argument(help="Run to audit (id or unique prefix).")],
    against: Annotated[
        str | None,
        typer.Option(
            "--against",
            help="Reference run (default: the run's parent; 'current' or no parent: the "
            "resources' current state).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Effect-equivalence audit: one verdict per side-effecting call (exit 0 only if all are
    faithful)."""
    from rewind.audit import audit_command

    try:
        try:
            # Writable, so the verdict is kept as the run's "admissible" label.
            code = audit_command(_store(), run_id, against, as_json, read_only=False)
        except Exception as exc:
            if not (isinstance(exc, StoreError) or _is_store_error(exc)):
                raise
            # A store on read-only media (refused at open, or at the verdict's write) is still
            # audited; the verdict is then not kept.
            code = audit_command(_store(), run_id, against, as_json, read_only=True)
    except RewindError as exc:
        _fail(exc)
    raise SystemExit(code)


@app.command("stability")
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
    from rewind.stability import stability_command

    _count("-k", k)
    try:
        code = stability_command(
            _store(), run_id, k, from_node, set_ or [], as_json, temperature=temperature
        )
    except RewindError as exc:
        _fail(exc)
    if code:
        raise SystemExit(code)


@app.command("grid")
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
    from rewind.grid import grid_command

    _count("--workers", workers)
    try:
        code = grid_command(
            _store(), run_id, at, set_ or [], workers, as_json, effects=effects, restore=restore
        )
    except RewindError as exc:
        _fail(exc)
    if code:
        raise SystemExit(code)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Bind address; non-loopback needs --token.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="TCP port; 0 picks a free one.")] = 0,
    token: Annotated[
        str | None, typer.Option(envvar="REWIND_TOKEN", help="Bearer token for every request.")
    ] = None,
    workers: Annotated[int, typer.Option(help="Runs that may execute at once.")] = 2,
    auth: Annotated[
        bool,
        typer.Option(
            "--auth",
            help="Every API request needs a user's token (rewind user add), even on loopback; "
            "on by itself once the store has users.",
        ),
    ] = False,
    store: StoreOpt = None,
) -> None:
    """Serve the HTTP API (OpenAPI at /openapi.json) and the browser UI at /."""
    from rewind.api.command import serve as serve_api

    _count("--port", port, low=0, high=65535)
    _count("--workers", workers)
    serve_api(_store(), host, port, token, workers=workers, require_auth=auth)


@app.command()
def worker(
    queue: Annotated[
        str | None,
        typer.Option(
            envvar="REWIND_QUEUE", help="The task queue's Redis URL (redis://HOST:PORT/0)."
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Worker processes: jobs executed at once.")] = 2,
    store: StoreOpt = None,
) -> None:
    """Execute runs and forks from the task queue (a Celery worker over Redis) until stopped.

    Jobs name their store; --store (or $REWIND_STORE) makes every job use this one instead
    (needed for a database URL with a password, which jobs never carry).
    """
    from rewind.jobs.queue import WORKER_STORE_ENV, QueueUnavailable, check_queue, start_worker
    from rewind.store import open_store

    _count("--concurrency", concurrency)
    if not queue or not queue.strip():
        raise QueueUnavailable(
            "no task queue is configured",
            "pass --queue redis://127.0.0.1:6379/0 or set REWIND_QUEUE",
        )
    check_queue(queue)
    if _state["store"] is not None or os.environ.get(STORE_ENV) is not None:
        location = _store()
        st = open_store(location)  # checks, creates or migrates it before any job arrives
        reaped = st.reap_orphans()
        st.close()
        if reaped:
            err_console.print(f"marked {len(reaped)} run(s) of dead processes interrupted")
        os.environ[WORKER_STORE_ENV] = location
    start_worker(queue, concurrency=concurrency)


@app.command()
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
        from rewind.api.command import verify_server

        team_store = None
        if _state["store"] is not None or os.environ.get(STORE_ENV) is not None:
            location = _store()
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
    with _session(folder) as rw:
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


# -- tracing: any LLM chain, not only Burr apps (see rewind.tracing) ----------------------


@app.command("replay-trace")
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
    from rewind.tracing import commands
    from rewind.tracing.replay import ReplaySwitches

    switches = ReplaySwitches(cached_llm, cached_tools, stop_at_divergence)
    with _session() as rw:
        code = commands.replay_trace_command(
            rw, trace, set_, as_json=as_json, console=console, chain=chain, switches=switches
        )
    raise typer.Exit(code)


@app.command("inspect")
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
    from rewind.tracing import commands

    with _session(model=False, read_only=True) as rw:
        code = commands.inspect_command(
            rw, trace, step, settings=setting, as_json=as_json, console=console
        )
    raise typer.Exit(code)


@app.command("failures")
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
    from rewind.tracing import commands

    _count("--limit", limit)
    _count("--examples", examples, low=0)
    with _session(model=False, read_only=True) as rw:
        code = commands.failures_command(
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


@app.command("root-cause")
def root_cause_cmd(
    trace: Annotated[str, typer.Argument(help="Trace or run id (or a unique prefix).")],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Why a trace or run failed: failing step, its input, earlier steps, fixes, fork command."""
    from rewind.tracing import commands

    with _session(model=False, read_only=True) as rw:
        code = commands.root_cause_command(rw, trace, as_json=as_json, console=console)
    raise typer.Exit(code)


@app.command("debug")
def debug_cmd(
    run: Annotated[str, typer.Argument(help="Run or trace id (or a unique prefix).")],
    store: StoreOpt = None,
) -> None:
    """Step through a recorded run or trace (commands from stdin when it is not a terminal)."""
    from rewind.tracing import commands

    with _session() as rw:
        code = commands.debug_command(rw, run, console=console)
    raise typer.Exit(code)


otel_app = typer.Typer(
    no_args_is_help=True, help="OpenTelemetry: export runs/traces as spans, import OTLP/JSON."
)
app.add_typer(otel_app, name="otel")


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
    from rewind.tracing import commands

    with _session(model=False, read_only=True) as rw:
        code = commands.otel_export_command(
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
    from rewind.tracing import commands
    from rewind.tracing.otel import read_otlp_file

    docs: list[dict[str, Any]] = []
    try:  # a bad file is refused before the store is opened: nothing is written
        for file in files:
            docs.extend(read_otlp_file(file))
    except RewindError as exc:
        _fail(exc)
    label = Path(files[0]) if len(files) == 1 else Path(f"{len(files)} files")
    with _session(model=False) as rw:
        code = commands.otel_import_command(rw, label, docs=docs, as_json=as_json, console=console)
    raise typer.Exit(code)


@app.command("gc")
def gc_cmd(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            help="Age: runs finished and cache entries last used longer ago go (30d, 12h, 90m).",
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only print what would go; write nothing.")
    ] = False,
    archive: Annotated[
        str | None,
        typer.Option(
            "--archive",
            help="Object store URL for run archives (default: $REWIND_OBJECTS, else the store "
            "folder).",
        ),
    ] = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Retention: expire unused cache entries, archive old finished runs to the object store
    (never an ancestor of a kept run, never a running one), delete blobs no row names."""
    from rewind.store import open_store
    from rewind.store.retention import archive_store, collect_garbage, parse_age

    try:
        age = parse_age(older_than)  # bad input is refused before the store is opened
        location = _store()
        _require_existing_store(location)
        opened = open_store(location, read_only=dry_run)
    except RewindError as exc:
        _fail(exc)
    try:
        report = collect_garbage(
            opened, age, dry_run=dry_run, archive=archive_store(opened, archive)
        )
    except RewindError as exc:
        _fail(exc)
    finally:
        opened.close()
    if as_json:
        _emit_json(report.to_json())
        return

    def did(past: str, base: str) -> str:
        return f"would {base}" if dry_run else past

    head = "gc (dry run: nothing written)" if dry_run else "gc"
    console.print(
        f"[bold]{head}[/] older than {inert(older_than)}; archives in {inert(report.archive_url)}"
    )
    console.print(
        f"  cache entries {did('expired', 'expire')}: "
        f"{report.llm_cache_expired} llm, {report.tool_cache_expired} tool"
    )
    archived_bytes = sum(a.archive_bytes for a in report.archived)
    console.print(
        f"  runs {did('archived', 'archive')}: {len(report.archived)} "
        f"({sum(a.rows for a in report.archived)} rows, {archived_bytes} archive bytes)"
    )
    for a in report.archived:
        console.print(
            f"    {inert(a.run_id)}  {inert(a.pipeline)}  {a.status}  {a.rows} rows  "
            f"{a.blobs} blobs  {a.archive_bytes} B"
        )
    if report.kept_ancestors:
        console.print(
            f"  kept as ancestors of kept runs: {len(report.kept_ancestors)} "
            f"({', '.join(inert(r[:12]) for r in report.kept_ancestors)})"
        )
    if report.left_unfinished:
        console.print(f"  left alone, not finished: {len(report.left_unfinished)}")
    for item in report.skipped:
        console.print(f"  skipped {inert(item['run_id'])}: {inert(item['reason'])}")
    console.print(
        f"  blobs {did('deleted', 'delete')}: {report.blobs_deleted} "
        f"({report.blob_bytes} bytes; {report.objects_deleted} in the object store)"
    )


@app.command("cancel")
def cancel_cmd(
    run_id: Annotated[str, typer.Argument(help="The running run (id or unique prefix).")],
    store: StoreOpt = None,
) -> None:
    """Cancel a running run, whichever process executes it (a server, another `rewind run`):
    it stops before its next node and ends `cancelled`; a run whose process is gone is marked
    `interrupted` at once."""
    from rewind import progress
    from rewind.store import open_store

    try:
        location = _store()
        _require_existing_store(location)
        opened = open_store(location)
    except RewindError as exc:
        _fail(exc)
    try:
        run = opened.get_run(run_id)
        if opened.reap_orphans([run.run_id]):
            console.print(f"run {inert(run.run_id)}: its process is gone; marked interrupted")
            return
        if not progress.request_cancel(opened, run.run_id, os.environ.get("REWIND_USER")):
            raise InvalidOverride(
                f"run {run.run_id[:12]} already finished ({opened.get_run(run.run_id).status})",
                "only a running run can be cancelled",
            )
    except RewindError as exc:
        _fail(exc)
    finally:
        opened.close()
    console.print(
        f"cancel requested: run {inert(run.run_id)} stops before its next node "
        "(a node already executing finishes first)"
    )


@app.command("delete")
def delete_cmd(
    run_id: Annotated[str, typer.Argument(help="The run to delete (id or unique prefix).")],
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Delete without asking for confirmation.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only check and print what would go.")
    ] = False,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Delete a run for good (no archive), with gc's rules: never a run a kept run descends
    from (delete its forks first), its sub-runs go with it, never a running run; then the blobs
    no row names any more."""
    from rewind.store import open_store
    from rewind.store.retention import delete_run

    try:
        location = _store()
        _require_existing_store(location)
        opened = open_store(location, read_only=dry_run)
    except RewindError as exc:
        _fail(exc)
    try:
        run = opened.get_run(run_id)
        if not dry_run:
            opened.reap_orphans([run.run_id])  # a dead process's run is no longer running
        plan = delete_run(opened, run.run_id, dry_run=True)
        if not (dry_run or yes):
            if not sys.stdin.isatty():
                raise InvalidOverride(
                    f"deleting run {run.run_id[:12]} needs a confirmation",
                    "pass --yes (or --dry-run to see what would go)",
                    field="yes",
                )
            subs = f" and its {len(plan.sub_runs)} sub-run(s)" if plan.sub_runs else ""
            if not typer.confirm(f"Delete run {inert(run.run_id)}{subs} ({plan.rows} rows)?"):
                raise SystemExit(1)
        deleted = plan if dry_run else delete_run(opened, run.run_id)
    except RewindError as exc:
        _fail(exc)
    finally:
        opened.close()
    if as_json:
        _emit_json({"dry_run": dry_run} | deleted.to_json())
        return
    verb = "would delete" if dry_run else "deleted"
    console.print(
        f"{verb} run {inert(deleted.run_id)}: {deleted.rows} rows"
        + (f", {len(deleted.sub_runs)} sub-run(s)" if deleted.sub_runs else "")
    )
    if not dry_run:
        console.print(
            f"  blobs deleted: {deleted.blobs_deleted} ({deleted.blob_bytes} bytes; "
            f"{deleted.objects_deleted} in the object store)"
        )


def _require_existing_store(location: str) -> None:
    """Refuse a SQLite location holding no store (gc must not create an empty one)."""
    from rewind.store.store import DB_FILENAME

    if "://" in location:
        return
    path = Path(location).expanduser()
    db = path if path.suffix in (".db", ".sqlite", ".sqlite3") else path / DB_FILENAME
    if not db.is_file():
        raise StoreError(
            f"no store at {path.resolve()} (nothing was recorded there)",
            "pass --store with the folder you recorded into",
        )


archive_app = typer.Typer(
    no_args_is_help=True, help="Runs archived by `rewind gc`: list them, restore one."
)
app.add_typer(archive_app, name="archive")


@archive_app.command("list")
def archive_list_cmd(as_json: JsonOpt = False, store: StoreOpt = None) -> None:
    """List archived runs, newest archive first."""
    from rewind.store.retention import archived_runs

    with _session(model=False, read_only=True) as rw:
        items = archived_runs(rw.store)
    if as_json:
        _emit_json(items)
        return
    t = Table(title="archived runs", title_justify="left")
    for col in ("run", "pipeline", "status", "parent", "archived", "bytes", "archive"):
        t.add_column(col)
    for r in items:
        t.add_row(
            inert(r["run_id"][:12]),
            inert(r["pipeline"]),
            inert(r["status"]),
            inert((r["parent_run_id"] or "")[:12]),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(r["archived_at"])),
            str(r["archive_bytes"]),
            inert(r["archive_ref"]),
        )
    console.print(t)


@archive_app.command("restore")
def archive_restore_cmd(
    run_id: Annotated[str, typer.Argument(help="Archived run id (or a unique prefix).")],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Bring an archived run back exactly (same rows and hashes), with its archived ancestors."""
    from rewind.store.retention import restore_run

    with _session(model=False) as rw:
        restored = restore_run(rw.store, run_id)
    if as_json:
        _emit_json(
            {
                "run_id": restored.run_id,
                "rows": restored.rows,
                "blobs": restored.blobs,
                "ancestors": list(restored.ancestors),
            }
        )
        return
    console.print(
        f"restored run {inert(restored.run_id)}: {restored.rows} rows, {restored.blobs} blobs"
        + (
            f" (and archived ancestors {', '.join(inert(a[:12]) for a in restored.ancestors)})"
            if restored.ancestors
            else ""
        )
    )


user_app = typer.Typer(
    no_args_is_help=True,
    help="API users: bearer tokens (stored hashed), teams and admins. With any user, every "
    "request to `rewind serve` needs a token, and each user sees their own and their team's runs.",
)
app.add_typer(user_app, name="user")

TeamOpt = Annotated[
    str | None,
    typer.Option("--team", help="The user's team: users of one team see each other's runs."),
]


@user_app.command("add")
def user_add_cmd(
    name: Annotated[str, typer.Argument(help="User name: letters, digits, '.', '_', '-'.")],
    admin: Annotated[bool, typer.Option("--admin", help="The user sees every run.")] = False,
    team: TeamOpt = None,
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Add a user and print their new API token (shown once: only its hash is stored)."""
    from rewind.store.users import add_user, check_name

    try:
        check_name(name)  # bad input is refused before the store is opened or created
        if team is not None:
            check_name(team, "team name")
    except RewindError as exc:
        _fail(exc)
    user, token = _on_store(lambda st: add_user(st, name, team=team, admin=admin))
    _print_token(user.to_json(), token, as_json, "added")


@user_app.command("list")
def user_list_cmd(as_json: JsonOpt = False, store: StoreOpt = None) -> None:
    """List users (name, team, admin, active or revoked); never tokens."""
    from rewind.store.users import list_users

    users = _on_store(list_users, read_only=True)
    if as_json:
        console.print(json_text([u.to_json() for u in users]), soft_wrap=True)
        return
    if not users:
        console.print("no users: the API is open on loopback (add one with `rewind user add`)")
        return
    table = Table("user", "team", "admin", "status", "created")
    for u in users:
        table.add_row(
            inert(u.name),
            inert(u.team or "-"),
            "yes" if u.admin else "no",
            "active" if u.active else "revoked",
            time.strftime("%Y-%m-%d %H:%M", time.localtime(u.created_at)),
        )
    console.print(table)


@user_app.command("revoke")
def user_revoke_cmd(
    name: Annotated[str, typer.Argument(help="The user whose token stops working.")],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Revoke a user's token (their runs stay theirs; `rewind user rotate` re-enables them)."""
    from rewind.store.users import revoke_user

    user = _on_store(lambda st: revoke_user(st, name))
    if as_json:
        console.print(json_text(user.to_json()), soft_wrap=True)
    else:
        console.print(f"revoked user {inert(user.name)}: the API refuses their token from now on")


@user_app.command("rotate")
def user_rotate_cmd(
    name: Annotated[str, typer.Argument(help="The user who gets a new token.")],
    as_json: JsonOpt = False,
    store: StoreOpt = None,
) -> None:
    """Give a user a new token (printed once); the old one stops working at once."""
    from rewind.store.users import rotate_token

    user, token = _on_store(lambda st: rotate_token(st, name))
    _print_token(user.to_json(), token, as_json, "rotated the token of")


def _on_store(act: Callable[[Any], R], *, read_only: bool = False) -> R:
    """``act(store)`` on the command's store, opened for it and closed after; a RewindError
    is the command's one error line (exit 2)."""
    from rewind.store import open_store

    try:
        opened = open_store(_store(), read_only=read_only)
        try:
            return act(opened)
        finally:
            opened.close()
    except RewindError as exc:
        _fail(exc)
        raise  # unreachable: _fail exits


def _print_token(user: dict[str, Any], token: str, as_json: bool, done: str) -> None:
    if as_json:
        console.print(json_text(user | {"token": token}), soft_wrap=True)
        return
    console.print(f"{done} user {inert(str(user['name']))}; their API token (shown only once):")
    console.print(token, soft_wrap=True, highlight=False)
    console.print("send it as 'Authorization: Bearer <token>', or paste it in the UI's Settings")


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
