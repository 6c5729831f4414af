"""Root cause of one failed trace (or Burr run).

Names the failing step (:func:`rewind.tracing.failures.failing_step`), summarises its input, lists
the steps before it with status and duration, notes upstream steps that explain the failure (an
empty or truncated LLM answer before a parse error), collects suggestions (the pattern's fix and
the inspector's findings for the failing step and the steps feeding it) and says how to re-run:
for a Burr run the exact ``rewind fork RUN --at NODE`` command that re-executes from the failing
node, for a replayable trace ``rewind replay-trace TRACE --set input.FIELD=…``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rewind.tracing.failures import classify_trace, pattern_info
from rewind.tracing.inspect import ERROR, WARNING, InspectionSettings, inspect_step, preview
from rewind.tracing.model import StepStatus, StepView, TraceView

__all__ = ["RootCause", "root_cause", "summarize_value"]


@dataclass(frozen=True)
class RootCause:
    """The analysis of one trace. ``failed`` False means there is nothing to explain."""

    trace_id: str
    name: str
    kind: str
    status: str
    failed: bool
    pattern: str | None = None
    signature: str | None = None
    error: str | None = None
    failing_step: dict[str, Any] | None = None
    input_summary: dict[str, Any] | None = None
    previous_steps: list[dict[str, Any]] = field(default_factory=list)
    upstream: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    fork_command: str | None = None
    replay_command: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON object of the analysis."""
        return {
            "trace_id": self.trace_id,
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "failed": self.failed,
            "pattern": self.pattern,
            "signature": self.signature,
            "error": self.error,
            "failing_step": self.failing_step,
            "input_summary": self.input_summary,
            "previous_steps": self.previous_steps,
            "upstream": self.upstream,
            "suggestions": self.suggestions,
            "fork_command": self.fork_command,
            "replay_command": self.replay_command,
        }


def summarize_value(value: Any, settings: InspectionSettings | None = None) -> dict[str, Any]:
    """Type, size and a preview of a value (chat messages: count, roles, characters)."""
    s = settings or InspectionSettings()
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    out: dict[str, Any] = {
        "type": _json_type(value),
        "chars": len(text),
        "approx_tokens": int(len(text) / max(s.chars_per_token, 0.1)),
        "preview": preview(value, s.preview_chars),
    }
    if isinstance(value, Mapping):
        out["keys"] = sorted(str(k) for k in value)
        messages = value.get("messages")
        if isinstance(messages, list):
            out["messages"] = len(messages)
            out["roles"] = [m.get("role") for m in messages if isinstance(m, Mapping)]
    elif isinstance(value, list):
        out["items"] = len(value)
    elif isinstance(value, str):
        out["lines"] = value.count("\n") + 1 if value else 0
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def root_cause(view: TraceView, settings: InspectionSettings | None = None) -> RootCause:
    """Explain why a trace failed (a trace that did not fail gets ``failed=False``)."""
    s = settings or InspectionSettings()
    if not view.failed:
        return RootCause(view.trace_id, view.name, view.kind, view.status, False)
    c = classify_trace(view)
    step = _failing(view, c.step)
    info = pattern_info(c.pattern)
    suggestions: list[str] = [f"{info.description}: {info.suggested_fix}"]
    upstream: list[str] = []
    pointed = c.step if c.step is not None and step is not None else None
    if pointed is not None and step is not None and pointed.position != step.position:
        upstream.append(f"step {pointed.number} {pointed.name!r}: {c.reason}")
    limit = step.position if step is not None else len(view.steps)
    _upstream_findings(view, s, c, pointed, limit, upstream, suggestions)
    if step is not None:
        for f in inspect_step(step, s).findings:
            if f.code != "step_failed":
                suggestions.append(f.suggestion)
    previous = [
        {
            "number": p.number,
            "name": p.name,
            "type": p.step_type,
            "status": p.status,
            "duration_ms": round(p.duration_ms, 3),
            "depth": view.depth(p),
        }
        for p in view.steps[:limit]
    ]
    failing = None
    if step is not None:
        failing = step.summary() | {
            "error_type": step.error_type,
            "error_message": step.error_message,
            "model": step.model,
        }
    fork_command, replay_command = _next_commands(view, step, suggestions)
    return RootCause(
        trace_id=view.trace_id,
        name=view.name,
        kind=view.kind,
        status=view.status,
        failed=True,
        pattern=c.pattern,
        signature=c.signature,
        error=(step.error if step is not None else view.error),
        failing_step=failing,
        input_summary=summarize_value(step.input, s) if step is not None else None,
        previous_steps=previous,
        upstream=upstream,
        suggestions=list(dict.fromkeys(suggestions)),
        fork_command=fork_command,
        replay_command=replay_command,
    )


def _upstream_findings(
    view: TraceView,
    s: InspectionSettings,
    c: Any,
    pointed: StepView | None,
    limit: int,
    upstream: list[str],
    suggestions: list[str],
) -> None:
    """Add the errors and warnings of the steps before the failure (not slowness, not the
    classified pattern's own note) to ``upstream`` and their fixes to ``suggestions``."""
    for earlier in view.steps[:limit]:
        for f in inspect_step(earlier, s).findings:
            if f.severity not in (ERROR, WARNING) or f.code in ("slow_step", "slow_response"):
                continue
            if pointed is not None and earlier.position == pointed.position and f.code == c.pattern:
                continue  # the pattern's own note and fix already say it
            upstream.append(f"step {earlier.number} {earlier.name!r}: {f.message}")
            suggestions.append(f.suggestion)


def _next_commands(
    view: TraceView, step: StepView | None, suggestions: list[str]
) -> tuple[str | None, str | None]:
    """(fork command for a failed run, replay command for a failed chain trace); a run's
    failing step with params also suggests trying another value."""
    if view.kind == "run" and step is not None:
        at = view.occurrence(step)
        fork_command = f"rewind fork {view.trace_id} --at {at}"
        if step.params:
            name = sorted(step.params)[0]
            suggestions.append(
                f"try another value of {step.name}.{name}: "
                f"{fork_command} --set {step.name}.{name}=VALUE"
            )
        return fork_command, None
    if view.kind == "trace" and view.config.get("chain_ref"):
        field_name = next(iter(sorted(view.input)), None)
        if field_name is not None:
            return None, f"rewind replay-trace {view.trace_id} --set input.{field_name}=VALUE"
        return None, f"rewind replay-trace {view.trace_id}"
    return None, None


def _failing(view: TraceView, pointed: StepView | None) -> StepView | None:
    """The failed step itself (an empty-response classification points at the LLM step that
    caused it, which did not fail)."""
    from rewind.tracing.failures import failing_step

    step = failing_step(view)
    if step is not None:
        return step
    if pointed is not None and pointed.status == StepStatus.FAILED:
        return pointed
    return None
