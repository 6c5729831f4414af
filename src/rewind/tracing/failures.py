"""Failure patterns across many traces (and Burr runs).

Every failed trace is assigned to exactly one pattern, so the counts add up to the number of
failed traces. The failing step is the root cause's (:func:`failing_step`: the earliest failed
step with no failed child — a parent that failed because its child did is not the cause). Its
error is matched, in this order, against:

1. ``context_overflow`` — the prompt did not fit the model's context window;
2. ``rate_limit`` — the provider refused for rate or quota (HTTP 429);
3. ``timeout`` — a call or step timed out;
4. ``empty_response`` — an LLM step returned nothing before the failure (the usual cause of a parse
   failure that follows it), or the error says the response was empty;
5. ``parse_failure`` — a parse step failed, or the error is a JSON/validation parse error;

and any other failure is clustered by its normalized error signature (the exception type plus its
message with numbers, quoted strings, ids, paths and URLs replaced by placeholders), so
``KeyError: 'user_17'`` and ``KeyError: 'user_42'`` are one cluster.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rewind.tracing.model import StepStatus, StepView, TraceView

__all__ = [
    "KNOWN_PATTERNS",
    "Classification",
    "FailurePattern",
    "FailureReport",
    "PatternInfo",
    "analyze_failures",
    "classify_error",
    "classify_trace",
    "error_signature",
    "failing_step",
    "pattern_info",
]

KNOWN_PATTERNS = ("context_overflow", "rate_limit", "timeout", "empty_response", "parse_failure")
CLUSTER = "cluster"


@dataclass(frozen=True)
class PatternInfo:
    """What a pattern means and how to fix it."""

    name: str
    description: str
    suggested_fix: str


_INFO = {
    "context_overflow": PatternInfo(
        "context_overflow",
        "the prompt exceeded the model's context window",
        "shrink the prompt: fewer or chunked retrieved documents, a summarised history, "
        "or a model with a larger context window",
    ),
    "rate_limit": PatternInfo(
        "rate_limit",
        "the model provider refused the request: rate limit or quota exceeded (HTTP 429)",
        "retry with exponential backoff honouring Retry-After, limit concurrency, or raise "
        "the quota",
    ),
    "timeout": PatternInfo(
        "timeout",
        "a call or step did not finish in time",
        "raise the timeout, reduce the input or max_tokens, use a faster model, and retry "
        "idempotent calls",
    ),
    "empty_response": PatternInfo(
        "empty_response",
        "an LLM step returned an empty answer",
        "check content filtering and stop sequences, ask explicitly for a non-empty answer, "
        "and treat an empty answer as an error before parsing it",
    ),
    "parse_failure": PatternInfo(
        "parse_failure",
        "the model's output could not be parsed into the expected format",
        "use JSON mode or a JSON schema (response_format), show the format in the prompt, "
        "strip code fences and preambles before parsing",
    ),
}

_CLUSTER_FIX = {
    "KeyError": "a key the step expects is missing: validate the upstream output against a "
    "schema before using it",
    "IndexError": "a list was shorter than expected: check for empty results before indexing",
    "TypeError": "a value has an unexpected type (often None): check the upstream step's output",
    "AttributeError": "a value is not the object expected (often None): check the upstream "
    "step's output",
    "ValueError": "a value has an unexpected format or range: validate it before the step",
    "ZeroDivisionError": "guard the division against an empty or zero denominator",
    "ConnectionError": "the service could not be reached: check the endpoint and retry with "
    "backoff",
    "EndpointUnavailable": "the model endpoint could not be reached: check REWIND_BASE_URL and "
    "the server",
    "ModelCallError": "the model endpoint refused the request: read its message and fix the "
    "parameter it names",
    "AssertionError": "an assertion in the chain failed: check the values it guards",
}
_DEFAULT_FIX = "open one example with `rewind root-cause TRACE` and fix the step it names"


def pattern_info(name: str) -> PatternInfo:
    """Description and suggested fix of a known pattern (a generic one for clusters)."""
    return _INFO.get(name) or PatternInfo(name, "other failures with this error", _DEFAULT_FIX)


_RULES: dict[str, re.Pattern[str]] = {
    "context_overflow": re.compile(
        r"context[_ ]length|context[_ ]window|maximum context|context_length_exceeded|"
        r"too many tokens|prompt is too long|input is too long|token limit|"
        r"exceeds? the (model'?s? )?(maximum )?(context|token)",
        re.I,
    ),
    "rate_limit": re.compile(
        r"rate[_ -]?limit|ratelimit|too many requests|\b429\b|quota|throttl", re.I
    ),
    "timeout": re.compile(r"timed?[ _-]?out|timeout|deadline exceeded", re.I),
    "empty_response": re.compile(
        r"empty (response|completion|output|answer|reply)|no content (returned|in)|"
        r"returned nothing",
        re.I,
    ),
    "parse_failure": re.compile(
        r"expecting value|expecting property name|could not parse|failed to parse|"
        r"unable to parse|invalid json|not valid json|unterminated string|extra data|"
        r"json ?decode|output parser|parse error",
        re.I,
    ),
}
_TYPE_RULES = {
    "timeout": ("TimeoutError", "ReadTimeout", "ConnectTimeout", "Timeout", "TimeoutException"),
    "rate_limit": ("RateLimitError",),
    "context_overflow": ("ContextWindowExceededError", "ContextLengthExceeded"),
    "parse_failure": ("JSONDecodeError", "OutputParserException", "ParseError"),
}


def classify_error(
    error_type: str | None, message: str | None, *, order: Sequence[str] = KNOWN_PATTERNS
) -> str | None:
    """The known pattern an error matches (checked in ``order``), or None."""
    text = f"{error_type or ''}: {message or ''}"
    for name in order:
        if error_type in _TYPE_RULES.get(name, ()):
            return name
        if _RULES[name].search(text):
            return name
    return None


_SIGNATURE_RULES = (
    (re.compile(r"https?://\S+"), "<url>"),
    (re.compile(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"), "<id>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{6,}\b"), "<hex>"),
    (re.compile(r"(?<![\w<])(/[\w.\-]+)+/?"), "<path>"),
    (re.compile(r"\b[A-Za-z_]+[_-]?\d+\b"), "<id>"),
    (re.compile(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?"), "<n>"),
)


def error_signature(error_type: str | None, message: str | None) -> str:
    """A failure's normalized signature: ``Type: message`` with URLs, uuids, quoted strings, hex
    ids, paths, ``word_17``-style ids and numbers replaced by placeholders (first line, at most
    160 characters)."""
    lines = (message or "").strip().splitlines()
    text = lines[0] if lines else ""
    for pattern, repl in _SIGNATURE_RULES:
        text = pattern.sub(repl, text)
    text = " ".join(text.split())[:160]
    return f"{error_type or 'Error'}: {text}" if text else (error_type or "Error")


def failing_step(view: TraceView) -> StepView | None:
    """The step where a failed trace went wrong: the earliest failed step none of whose
    children failed (None when no step failed)."""
    failed = [s for s in view.steps if s.status == StepStatus.FAILED]
    parents = {s.parent_position for s in failed}
    leaves = [s for s in failed if s.position not in parents]
    return min(leaves or failed, key=lambda s: s.position, default=None)


@dataclass(frozen=True)
class Classification:
    """Why one trace failed: its pattern, the step it points at, the error signature."""

    pattern: str
    step: StepView | None
    signature: str
    reason: str


def classify_trace(view: TraceView) -> Classification:
    """Assign a failed trace to exactly one pattern (see the module's order)."""
    step = failing_step(view)
    error_type = step.error_type if step is not None else view.error_type
    message = step.error_message if step is not None else view.error_message
    signature = error_signature(error_type, message)
    early = classify_error(error_type, message, order=("context_overflow", "rate_limit", "timeout"))
    if early is not None:
        return Classification(early, step, signature, f"the error matches {early}")
    limit = step.position if step is not None else len(view.steps)
    empty = next(
        (
            s
            for s in view.steps
            if s.step_type == "llm_call"
            and s.position <= limit
            and s.status == StepStatus.SUCCESS
            and _empty(s.output)
        ),
        None,
    )
    if empty is not None:
        return Classification(
            "empty_response",
            empty,
            signature,
            f"LLM step {empty.name!r} returned an empty response before the failure",
        )
    late = classify_error(error_type, message, order=("empty_response", "parse_failure"))
    if late is None and step is not None and step.step_type == "parse":
        late = "parse_failure"
    if late is not None:
        return Classification(late, step, signature, f"the error matches {late}")
    return Classification(CLUSTER, step, signature, "no known pattern: clustered by signature")


def _empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, dict) and set(value) <= {"content", "text"}:
        return all(_empty(v) for v in value.values())
    return False


@dataclass
class FailurePattern:
    """One pattern across traces: how many failed traces it explains, examples and a fix.

    ``pattern`` is a known pattern's name or ``cluster`` (then ``signature`` names the cluster).
    ``trace_ids`` holds every trace it explains (oldest first); ``examples`` the first few.
    ``steps`` counts the failing step names.
    """

    pattern: str
    signature: str | None
    description: str
    suggested_fix: str
    trace_ids: list[str] = field(default_factory=list)
    steps: Counter[str] = field(default_factory=Counter)

    @property
    def count(self) -> int:
        """Number of failed traces in this pattern."""
        return len(self.trace_ids)

    def examples(self, n: int = 5) -> list[str]:
        """The first ``n`` example trace ids."""
        return self.trace_ids[:n]

    def to_json(self, examples: int = 5, failed_total: int = 0) -> dict[str, Any]:
        """JSON object: pattern, signature, count, share of failed traces, example ids, failing
        steps, description and suggested fix."""
        return {
            "pattern": self.pattern,
            "signature": self.signature,
            "count": self.count,
            "share": round(self.count / failed_total, 4) if failed_total else 0.0,
            "example_trace_ids": self.examples(examples),
            "steps": dict(self.steps.most_common()),
            "description": self.description,
            "suggested_fix": self.suggested_fix,
        }


@dataclass
class FailureReport:
    """Failure patterns over a set of traces; counts add up to ``failed_traces``."""

    total_traces: int
    failed_traces: int
    patterns: list[FailurePattern]

    def counts(self) -> dict[str, int]:
        """Count per pattern (clusters as ``cluster:<signature>``)."""
        return {
            (p.pattern if p.pattern != CLUSTER else f"{CLUSTER}:{p.signature}"): p.count
            for p in self.patterns
        }

    def to_json(self, examples: int = 5) -> dict[str, Any]:
        """JSON object: totals and every pattern (most frequent first)."""
        return {
            "total_traces": self.total_traces,
            "failed_traces": self.failed_traces,
            "patterns": [p.to_json(examples, self.failed_traces) for p in self.patterns],
        }


def analyze_failures(views: Iterable[TraceView]) -> FailureReport:
    """Classify every failed trace and group them into patterns, most frequent first (known
    patterns before clusters on ties)."""
    items = sorted(views, key=lambda v: (v.started_at, v.trace_id))
    groups: dict[tuple[str, str | None], FailurePattern] = {}
    failed = 0
    for view in items:
        if not view.failed:
            continue
        failed += 1
        c = classify_trace(view)
        key = (c.pattern, c.signature if c.pattern == CLUSTER else None)
        if key not in groups:
            if c.pattern == CLUSTER:
                err_type = c.signature.split(":", 1)[0]
                info = PatternInfo(
                    CLUSTER,
                    "other failures with this error signature",
                    _CLUSTER_FIX.get(err_type, _DEFAULT_FIX),
                )
            else:
                info = pattern_info(c.pattern)
            groups[key] = FailurePattern(c.pattern, key[1], info.description, info.suggested_fix)
        groups[key].trace_ids.append(view.trace_id)
        groups[key].steps[c.step.name if c.step is not None else "(chain)"] += 1
    order = {name: i for i, name in enumerate(KNOWN_PATTERNS)}
    patterns = sorted(
        groups.values(),
        key=lambda p: (-p.count, order.get(p.pattern, len(order)), p.signature or ""),
    )
    return FailureReport(len(items), failed, patterns)
