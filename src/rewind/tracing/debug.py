"""A debugger-like session over a recorded run or trace: step through it after the fact.

The session has a cursor on one step. Commands (one per line; ``help`` lists them)::

    list                      the steps, the cursor marked with →
    show | where              the current step: status, timing, tokens, error, input/output preview
    next [N] | back [N]       move the cursor forward / backward
    jump STEP | first | last  move to a step by name (``name#k``) or number
    break PATTERN [if EXPR]   breakpoint on steps whose name matches (shell wildcards: ``*``)
    delete PATTERN | all      remove breakpoints;  breaks  lists them
    continue | rcontinue      run forward / backward to the next breakpoint that fires
    watch [NAME=]EXPR         evaluate EXPR at every stop;  unwatch NAME | all;  watches
    print EXPR                evaluate EXPR once
    input | output | state    the current step's input, output, or the state after it (JSON)
    fork [--set X=V | --set-output X=V] [--effects recorded|dry-run|live] [--restore replace]
                                          fork (Burr run) / replay (trace) from the current step
    quit

Watches, conditions and ``print`` are JMESPath expressions over the step's data — ``name``,
``number``, ``type``, ``status``, ``input``, ``output``, ``error.type``, ``error.message``,
``duration_ms``, ``tokens.prompt``, ``tokens.completion``, ``attributes``, ``params`` and
``state`` (the state after the step) — e.g. ``output.answer``, ``length(input.docs)``,
``status == 'failed'``, ``duration_ms > `1000```. Expressions are parsed by JMESPath, never
evaluated as Python. A script (commands from stdin) drives the same session for tests.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import jmespath
from jmespath.exceptions import JMESPathError

from rewind.effects import EFFECT_MODES, RESTORE_MODES
from rewind.tracing.inspect import preview
from rewind.tracing.model import StepView, TraceView

__all__ = ["DebugQuit", "DebugSession", "run_script"]

StateLoader = Callable[[StepView], dict[str, Any] | None]
Forker = Callable[[StepView, str | None, bool, str, str], str]


def _option(args: list[str], flag: str, choices: tuple[str, ...], default: str) -> str:
    """Take ``flag VALUE`` out of ``args`` (``flag=VALUE`` was split before); ``default`` when
    absent.

    Raises:
        DebugError: the value is missing or not one of ``choices``.
    """
    if flag not in args:
        return default
    at = args.index(flag)
    if at + 1 >= len(args) or args[at + 1] not in choices:
        raise DebugError(f"{flag} takes one of: {', '.join(choices)}")
    value = args[at + 1]
    del args[at : at + 2]
    return value


class DebugQuit(Exception):
    """Raised by the ``quit`` command."""


class DebugError(Exception):
    """A command could not be carried out (bad argument, unknown step, invalid expression)."""


@dataclass
class _Watch:
    name: str
    text: str
    expr: Any


@dataclass
class _Break:
    pattern: str
    condition: str | None
    expr: Any


def _compile(text: str) -> Any:
    try:
        return jmespath.compile(text)
    except JMESPathError as exc:
        raise DebugError(f"invalid expression {text!r}: {str(exc).splitlines()[0]}") from exc


def _dump(value: Any, limit: int | None = 200) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)
    if limit is not None and len(text) > limit:
        return text[: limit - 1] + "…"
    return text


class DebugSession:
    """Step through a recorded trace or run.

    Args:
        view: the trace (see :func:`rewind.tracing.store.load_trace`).
        state_loader: returns the semantic state after a step (``state`` command and the
            ``state`` field of expressions); None disables them.
        forker: ``(step, change spec or None, is_output_change, effects mode, restore mode)
            -> message``:
            forks (or replays) from a step; None disables ``fork``. The effects mode is
            ``recorded`` unless the user typed ``--effects dry-run|live``.
    """

    def __init__(
        self,
        view: TraceView,
        *,
        state_loader: StateLoader | None = None,
        forker: Forker | None = None,
    ) -> None:
        self.view = view
        self.cursor = 0
        self.breakpoints: list[_Break] = []
        self.watches: dict[str, _Watch] = {}
        self._state_loader = state_loader
        self._forker = forker
        self._states: dict[int, dict[str, Any] | None] = {}
        self._auto = 0

    # -- data ------------------------------------------------------------------------------
    @property
    def step(self) -> StepView | None:
        """The step under the cursor (None for a trace without steps)."""
        return self.view.steps[self.cursor] if self.view.steps else None

    def state(self, step: StepView) -> dict[str, Any] | None:
        """The semantic state after a step (cached)."""
        if self._state_loader is None:
            return None
        if step.position not in self._states:
            self._states[step.position] = self._state_loader(step)
        return self._states[step.position]

    def data(self, step: StepView, *, with_state: bool = True) -> dict[str, Any]:
        """The step's data as expressions see it."""
        out = {
            "number": step.number,
            "position": step.position,
            "name": step.name,
            "type": step.step_type,
            "status": step.status,
            "input": step.input,
            "output": step.output,
            "error": None
            if step.error_type is None and step.error_message is None
            else {"type": step.error_type, "message": step.error_message},
            "duration_ms": step.duration_ms,
            "tokens": {"prompt": step.prompt_tokens, "completion": step.completion_tokens},
            "attributes": step.attributes,
            "params": step.params,
            "cache": {"outcome": step.cache_outcome, "reason": step.cache_reason},
        }
        if with_state:
            out["state"] = self.state(step)
        return out

    def evaluate(self, text: str, step: StepView | None = None) -> Any:
        """Evaluate a JMESPath expression over a step's data (default: the current step).

        Raises:
            DebugError: the expression is invalid or there is no step.
        """
        target = step or self.step
        if target is None:
            raise DebugError("the trace has no steps")
        expr = _compile(text)
        return self._search(expr, target, "state" in text)

    def _search(self, expr: Any, step: StepView, with_state: bool) -> Any:
        try:
            return expr.search(self.data(step, with_state=with_state))
        except JMESPathError as exc:
            raise DebugError(f"cannot evaluate: {str(exc).splitlines()[0]}") from exc

    # -- commands --------------------------------------------------------------------------
    def execute(self, line: str) -> list[str]:
        """Run one command line; returns the lines to print.

        Raises:
            DebugQuit: on ``quit``.
            DebugError: the command failed (the session is unchanged).
        """
        text = line.strip()
        if not text or text.startswith("#"):
            return []
        word, _, rest = text.partition(" ")
        rest = rest.strip()
        handler = self._COMMANDS.get(word.lower())
        if handler is None:
            raise DebugError(f"unknown command {word!r} (type help)")
        return handler(self, rest)

    def _help(self, _: str) -> list[str]:
        doc = (__doc__ or "").replace("``", "")
        parts = doc.split("::", 1)[1].lstrip("\n").split("\n\n")
        listing = [ln.strip() for ln in parts[0].splitlines() if ln.strip()]
        notes = " ".join(" ".join(parts[1].split()).split()) if len(parts) > 1 else ""
        return listing + ([notes] if notes else [])

    def _list(self, _: str) -> list[str]:
        out = [
            f"{self.view.kind} {self.view.trace_id} ({self.view.name}) {self.view.status}, "
            f"{len(self.view.steps)} steps"
        ]
        marks = {b.pattern for b in self.breakpoints}
        for s in self.view.steps:
            arrow = "→" if self.step is not None and s.position == self.cursor else " "
            bp = "●" if any(fnmatch.fnmatchcase(s.name, p) for p in marks) else " "
            indent = "  " * self.view.depth(s)
            out.append(
                f"{arrow}{bp}{s.number:>3} {indent}{s.name} [{s.step_type}] {s.status} "
                f"{s.duration_ms:.1f} ms"
            )
        return out

    def _where(self, _: str = "") -> list[str]:
        s = self.step
        if s is None:
            return ["the trace has no steps"]
        line = (
            f"→ step {s.number}/{len(self.view.steps)} {s.name} [{s.step_type}] {s.status} "
            f"{s.duration_ms:.1f} ms, {s.tokens} tokens"
        )
        if s.error:
            line += f" — {s.error}"
        out = [line]
        for w in self.watches.values():
            try:
                value = _dump(self._search(w.expr, s, "state" in w.text))
            except DebugError as exc:
                value = f"<{exc}>"
            out.append(f"  {w.name} = {value}")
        return out

    def _show(self, _: str) -> list[str]:
        s = self.step
        if s is None:
            return ["the trace has no steps"]
        out = self._where()
        if s.model:
            out.append(f"  model: {s.model}")
        out.append(f"  input:  {preview(s.input)}")
        out.append(f"  output: {preview(s.output)}")
        if s.attributes:
            out.append(f"  attributes: {_dump(s.attributes)}")
        if s.params:
            out.append(f"  params: {_dump(s.params)}")
        digest = (s.output_hash or "—")[:16]
        out.append(f"  cache: {s.cache_outcome}:{s.cache_reason}  output sha256 {digest}")
        return out

    def _move(self, delta: int) -> list[str]:
        if not self.view.steps:
            return ["the trace has no steps"]
        target = self.cursor + delta
        note = []
        if target >= len(self.view.steps):
            target = len(self.view.steps) - 1
            note = ["(end of trace)"]
        elif target < 0:
            target = 0
            note = ["(start of trace)"]
        self.cursor = target
        return note + self._where()

    def _count(self, rest: str) -> int:
        if not rest:
            return 1
        if not rest.isdigit() or int(rest) < 1:
            raise DebugError(f"expected a positive count, got {rest!r}")
        return int(rest)

    def _next(self, rest: str) -> list[str]:
        return self._move(self._count(rest))

    def _back(self, rest: str) -> list[str]:
        return self._move(-self._count(rest))

    def _jump(self, rest: str) -> list[str]:
        if not rest:
            raise DebugError("jump needs a step name or number")
        try:
            self.cursor = self.view.find(rest).position
        except LookupError as exc:
            raise DebugError(str(exc)) from exc
        return self._where()

    def _first(self, _: str) -> list[str]:
        return self._move(-self.cursor)

    def _last(self, _: str) -> list[str]:
        return self._move(len(self.view.steps))

    def _break(self, rest: str) -> list[str]:
        if not rest:
            return self._breaks("")
        pattern, _, cond = rest.partition(" if ")
        pattern = pattern.strip()
        if not pattern:
            raise DebugError("break needs a step name (wildcards allowed)")
        expr = _compile(cond.strip()) if cond.strip() else None
        self.breakpoints = [b for b in self.breakpoints if b.pattern != pattern]
        self.breakpoints.append(_Break(pattern, cond.strip() or None, expr))
        hits = [s.number for s in self.view.steps if fnmatch.fnmatchcase(s.name, pattern)]
        where = f"steps {', '.join(map(str, hits))}" if hits else "no step yet"
        return [
            f"breakpoint at {pattern}" + (f" if {cond.strip()}" if expr else "") + f" ({where})"
        ]

    def _delete(self, rest: str) -> list[str]:
        if rest == "all":
            n = len(self.breakpoints)
            self.breakpoints = []
            return [f"deleted {n} breakpoint{'s' if n != 1 else ''}"]
        before = len(self.breakpoints)
        self.breakpoints = [b for b in self.breakpoints if b.pattern != rest]
        if len(self.breakpoints) == before:
            raise DebugError(f"no breakpoint at {rest!r}")
        return [f"deleted breakpoint at {rest}"]

    def _breaks(self, _: str) -> list[str]:
        if not self.breakpoints:
            return ["no breakpoints"]
        return [
            f"break {b.pattern}" + (f" if {b.condition}" if b.condition else "")
            for b in self.breakpoints
        ]

    def _fires(self, s: StepView) -> bool:
        for b in self.breakpoints:
            if not fnmatch.fnmatchcase(s.name, b.pattern):
                continue
            if b.expr is None or self._search(b.expr, s, "state" in (b.condition or "")):
                return True
        return False

    def _run(self, direction: int) -> list[str]:
        if not self.view.steps:
            return ["the trace has no steps"]
        i = self.cursor + direction
        while 0 <= i < len(self.view.steps):
            s = self.view.steps[i]
            if self._fires(s):
                self.cursor = i
                return [f"breakpoint hit at step {s.number} {s.name}", *self._where()]
            i += direction
        self.cursor = len(self.view.steps) - 1 if direction > 0 else 0
        where = "last" if direction > 0 else "first"
        return [f"no breakpoint hit; at the {where} step", *self._where()]

    def _continue(self, _: str) -> list[str]:
        return self._run(+1)

    def _rcontinue(self, _: str) -> list[str]:
        return self._run(-1)

    def _watch(self, rest: str) -> list[str]:
        if not rest:
            return self._watches("")
        name, eq, expr_text = rest.partition("=")
        if eq and name.strip().isidentifier() and not expr_text.startswith("="):
            name, text = name.strip(), expr_text.strip()
        else:
            self._auto += 1
            name, text = f"w{self._auto}", rest
        self.watches[name] = _Watch(name, text, _compile(text))
        value = "—"
        if self.step is not None:
            value = _dump(self._search(self.watches[name].expr, self.step, "state" in text))
        return [f"watch {name}: {text} = {value}"]

    def _unwatch(self, rest: str) -> list[str]:
        if rest == "all":
            self.watches = {}
            return ["removed every watch"]
        if self.watches.pop(rest, None) is None:
            raise DebugError(f"no watch named {rest!r} (see watches)")
        return [f"removed watch {rest}"]

    def _watches(self, _: str) -> list[str]:
        if not self.watches:
            return ["no watches"]
        return [f"{w.name}: {w.text}" for w in self.watches.values()]

    def _print(self, rest: str) -> list[str]:
        if not rest:
            raise DebugError("print needs an expression, e.g. print output")
        return [_dump(self.evaluate(rest), None)]

    def _input(self, _: str) -> list[str]:
        s = self._need_step()
        return json.dumps(s.input, indent=2, ensure_ascii=False, default=str).splitlines()

    def _output(self, _: str) -> list[str]:
        s = self._need_step()
        return json.dumps(s.output, indent=2, ensure_ascii=False, default=str).splitlines()

    def _state(self, rest: str) -> list[str]:
        s = self._need_step()
        if self._state_loader is None:
            raise DebugError("this session cannot load state")
        state = self.state(s)
        if state is None:
            return [f"no state recorded after step {s.number} ({s.status})"]
        value = state.get(rest) if rest else state
        if rest and rest not in state:
            raise DebugError(f"the state has no field {rest!r}: {', '.join(sorted(state))}")
        return json.dumps(value, indent=2, ensure_ascii=False, default=str).splitlines()

    def _fork(self, rest: str) -> list[str]:
        s = self._need_step()
        if self._forker is None:
            raise DebugError("this session cannot fork")
        try:
            args = shlex.split(rest)
        except ValueError as exc:
            raise DebugError(f"cannot read the arguments: {exc}") from exc
        args = [p for a in args for p in (a.split("=", 1) if a.startswith("--") else [a])]
        effects = _option(args, "--effects", EFFECT_MODES, "recorded")
        restore = _option(args, "--restore", RESTORE_MODES, "refuse")
        if restore == "replace" and effects != "live":
            raise DebugError(
                "--restore replace deletes files a pinned snapshot does not hold: it needs "
                "--effects live"
            )
        spec: str | None = None
        output = False
        if args:
            if len(args) != 2 or args[0] not in ("--set", "--set-output"):
                raise DebugError(
                    "use: fork [--set NODE.PARAM=VALUE | --set-output NODE.FIELD=JSON] "
                    "[--effects recorded|dry-run|live] [--restore refuse|replace]"
                )
            spec, output = args[1], args[0] == "--set-output"
        return [self._forker(s, spec, output, effects, restore)]

    def _quit(self, _: str) -> list[str]:
        raise DebugQuit

    def _need_step(self) -> StepView:
        if self.step is None:
            raise DebugError("the trace has no steps")
        return self.step

    _COMMANDS: ClassVar[dict[str, Callable[[DebugSession, str], list[str]]]] = {
        "help": _help,
        "h": _help,
        "?": _help,
        "list": _list,
        "ls": _list,
        "l": _list,
        "show": _show,
        "where": _where,
        "w": _where,
        "next": _next,
        "n": _next,
        "step": _next,
        "s": _next,
        "back": _back,
        "b": _back,
        "prev": _back,
        "jump": _jump,
        "j": _jump,
        "goto": _jump,
        "first": _first,
        "last": _last,
        "break": _break,
        "bp": _break,
        "delete": _delete,
        "clear": _delete,
        "breaks": _breaks,
        "continue": _continue,
        "c": _continue,
        "rcontinue": _rcontinue,
        "rc": _rcontinue,
        "watch": _watch,
        "unwatch": _unwatch,
        "watches": _watches,
        "print": _print,
        "p": _print,
        "input": _input,
        "output": _output,
        "state": _state,
        "fork": _fork,
        "quit": _quit,
        "q": _quit,
        "exit": _quit,
    }


def run_script(session: DebugSession, lines: Iterable[str], write: Callable[[str], None]) -> int:
    """Run commands (e.g. stdin's lines) and write their output; a failing command writes
    ``error: …`` and the script goes on. Returns the number of failed commands."""
    errors = 0
    for line in session._where():
        write(line)
    for line in lines:
        try:
            for out in session.execute(line):
                write(out)
        except DebugQuit:
            break
        except DebugError as exc:
            errors += 1
            write(f"error: {exc}")
    return errors
