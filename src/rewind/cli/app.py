"""The ``rewind`` Typer application and what every command shares: the ``--store`` option, the
store and session a command opens, its one-line errors and exit codes.

Exit status of every command: 0 done; 1 a run, replay or check failed (or another failure the
command reports); 2 bad input — one ``error:`` line on stderr saying what is wrong and how to fix
it, nothing written to the store; 130 interrupted.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.cells import cell_len

from rewind.canonical import canonical_bytes
from rewind.cli.render import err_console, error_line, outcome_text
from rewind.errors import InvalidOverride, RewindError, StoreError
from rewind.terminal import InertLogFormatter, inert, visible

if TYPE_CHECKING:
    # Imported where used: Burr (and pandas through it), SQLAlchemy and httpx cost ~0.8 s at
    # start-up, which `rewind --help` and the read commands need not pay.
    from rewind.replay import Rewind
    from rewind.store import Store

DEFAULT_STORE = ".rewind"
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
_INTERRUPTED_LINE = "[bold red]interrupted[/] — the run in progress is marked interrupted"

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Rewind: record, fork, replay and diff LLM agent runs (Apache Burr).",
)
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


def store_location() -> str:
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


def is_store_error(exc: BaseException) -> bool:
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
    try:
        _main()
    finally:
        # The process exits next. Interpreter shutdown garbage-collects every object alive,
        # cycles included: with pandas, SQLAlchemy and FastAPI loaded that took ~1-1.5 s of CPU
        # for each `rewind serve` or `rewind worker` stopped (SIGTERM to exit: 1.8 s -> 0.2 s).
        # Frozen objects are left to the OS instead; reference counting still frees the rest,
        # atexit handlers still run, and everything the command wrote is already closed.
        gc.freeze()


def _main() -> None:
    logging.getLogger("burr").setLevel(logging.CRITICAL)
    _log_inertly()
    # SIGTERM (timeout, kill) unwinds like Ctrl-C: the run is marked interrupted and the
    # embedded model server is stopped.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        code = app(standalone_mode=False)
        if code == EXIT_INTERRUPTED:  # Typer turns Ctrl-C inside a command into Exit(130)
            err_console.print(_INTERRUPTED_LINE)
    except _UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            # `rewind` (or `rewind otel`) alone: Typer printed the help while raising this.
            raise SystemExit(EXIT_BAD_INPUT) from None
        fail(_usage_error(exc))
    except typer.Abort:  # Click turns Ctrl-C while parsing or prompting into Abort
        err_console.print("[bold red]interrupted[/]")
        raise SystemExit(130) from None
    except RewindError as exc:
        fail(exc)
    except Exception as exc:
        if not is_store_error(exc):
            raise
        orig = getattr(exc, "orig", None) or exc
        first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
        fail(RewindError(f"the store failed: {first}", "check that --store is writable"))
    except KeyboardInterrupt:
        err_console.print(_INTERRUPTED_LINE)
        raise SystemExit(EXIT_INTERRUPTED) from None
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


def fail(exc: RewindError) -> NoReturn:
    """Print ``exc`` as the command's one ``error:`` line on stderr and exit: 2 (bad input,
    nothing written), or 1 when the error names a run that was recorded as failed."""
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
def session(
    store: str | None = None,
    *,
    model: bool = True,
    read_only: bool = False,
    must_exist: bool = False,
) -> Iterator[Rewind]:
    """A :class:`Rewind` on ``store`` (default: the command's store, :func:`opened_store`);
    ``read_only`` for commands that only read (the store is then neither created nor written, so
    it may live on read-only media); ``must_exist`` for commands on a recorded run (a mistyped
    ``--store`` is refused, never created empty); ``model``: with the lazily started model
    client. A :class:`RewindError` inside is the command's one error line (:func:`fail`)."""
    from rewind.session import LazyChatClient
    from rewind.store.users import local_user

    local_user()  # a bad $REWIND_USER is refused before the store is opened (or created)
    with opened_store(store, read_only=read_only, must_exist=must_exist) as opened:
        client = LazyChatClient() if model else None
        if model and os.environ.get("REWIND_MODEL") and not os.environ.get("REWIND_BASE_URL"):
            err_console.print(
                "[yellow]warning:[/] REWIND_MODEL is set but REWIND_BASE_URL is not, so the "
                "embedded model is used; set REWIND_BASE_URL too, or unset REWIND_MODEL"
            )
        from rewind.replay import Rewind

        try:
            yield Rewind(opened, chat_client=client, on_event=Progress().on_event)
        finally:
            if client is not None:
                client.close()


class Progress:
    """Prints one line per finished node while a run executes (the model can be slow)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.status: Any = None
        self.name_width = 10
        """Width of the node name column: the longest name printed so far (at least 10), so
        the outcome, token and time columns stay aligned under names like
        ``determine_clarifications``."""

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
            name = visible(payload["name"])
            width = cell_len(name)
            self.name_width = max(self.name_width, width)
            err_console.print(
                f"  {payload['position'] + 1:>2} {inert(name)}{' ' * (self.name_width - width)} "
                f"{outcome_text(payload['outcome'], payload['reason'])}  "
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


def json_object(flag: str, text: str | None) -> dict[str, Any]:
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


def check_count(option: str, value: int, low: int = 1, high: int = MAX_COUNT) -> int:
    """``value`` if ``low <= value <= high``.

    Raises:
        InvalidOverride: out of range (a huge --limit made SQLite raise OverflowError).
    """
    if not low <= value <= high:
        raise InvalidOverride(
            f"{option} {value} is out of range", f"pass a whole number from {low} to {high:_}"
        )
    return value


def demo_state(csv: Path | None, question: str | None) -> dict[str, Any]:
    """The demo pipeline's initial state for ``--csv``/``--question``.

    Raises:
        InvalidOverride: an empty question.
        RewindError: the CSV cannot be read as the demo's data.
    """
    from rewind.examples import research, weather

    if question is not None and not question.strip():
        raise InvalidOverride("--question is empty", "ask a question, or omit --question")
    try:
        return research.initial_state(csv, question)
    except weather.DataError as exc:
        raise RewindError(str(exc).rstrip("."), "") from exc


def require_existing_store(location: str) -> None:
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


@contextmanager
def opened_store(
    location: str | None = None, *, read_only: bool = False, must_exist: bool = False
) -> Iterator[Store]:
    """The store at ``location`` (default: the command's ``--store``, else ``$REWIND_STORE``,
    else ``.rewind``), opened for the block and closed after it.

    Args:
        location: a store folder, ``.db`` file or database URL instead of the command's store.
        read_only: open it read-only: nothing is created or written (``--dry-run``, listings).
        must_exist: refuse a SQLite location that holds no store instead of creating an empty
            one (commands on a recorded run: fork, replay-trace, debug, gc, cancel, delete...).
    A :class:`RewindError` raised while opening the store or inside the block becomes the
    command's one error line (:func:`fail`: exit 2, or 1 for a run recorded as failed).
    """
    from rewind.store import open_store

    try:
        location = location or store_location()
        if must_exist:
            require_existing_store(location)
        opened = open_store(location, read_only=read_only)
    except RewindError as exc:
        fail(exc)
    try:
        yield opened
    except RewindError as exc:
        fail(exc)
    finally:
        opened.close()


def store_given() -> bool:
    """True when the user named a store (``--store`` or ``$REWIND_STORE``)."""
    return _state["store"] is not None or os.environ.get(STORE_ENV) is not None
