"""Step inspection: what looks wrong with each step, how bad it is, and what to try.

Each step type has its own checks (an LLM call fails differently from a retrieval); every finding
carries a severity (``error`` > ``warning`` > ``info``), a message and a suggestion. The numbers
the checks compare against are :class:`InspectionSettings`, a dataclass with defaults that a
caller (or ``--setting name=value`` on the command line) overrides. Output comparison
(:func:`compare_outputs`, :func:`compare_traces`) reuses :mod:`rewind.diff`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rewind.diff import (
    ERROR_FIELD,
    FieldChange,
    NodeSide,
    diff_trajectories,
    diff_values,
    similarity,
)
from rewind.errors import InvalidOverride
from rewind.store.records import stored_name
from rewind.tracing.model import StepStatus, StepView, TraceView

__all__ = [
    "Finding",
    "InspectionSettings",
    "OutputComparison",
    "StepInspection",
    "TraceInspection",
    "compare_outputs",
    "compare_traces",
    "inspect_step",
    "inspect_trace",
    "output_text",
    "prompt_text",
]

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITY_ORDER = {ERROR: 0, WARNING: 1, INFO: 2}

DEFAULT_CONTEXT_WINDOWS: Mapping[str, int] = {
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "o1": 200_000,
    "o3": 200_000,
    "claude": 200_000,
    "gemini": 1_048_576,
    "llama-3": 8_192,
    "mistral": 32_768,
    "smollm2": 8_192,
}
"""Context windows (tokens) by model-name prefix; the longest matching prefix wins."""


@dataclass(frozen=True)
class InspectionSettings:
    """Thresholds of the checks. Every field can be overridden.

    Attributes:
        slow_llm_ms: an LLM step slower than this is flagged (ms).
        slow_step_ms: any other step slower than this is flagged (ms).
        tool_timeout_ms: a tool call taking longer is reported as at or past its timeout (ms).
        context_near_ratio: a prompt using at least this share of the model's context window is
            "near" it.
        chars_per_token: characters per token when no token count was recorded.
        default_context_tokens: context window of a model not in ``context_windows``.
        context_windows: model-name prefix → context window (tokens).
        min_results: a retrieval returning fewer results is flagged.
        low_score: a retrieval whose best score is below this is flagged.
        refusal_markers: phrases (lower case) that mark a refusal near the start of an answer.
        refusal_window_chars: how far into the answer to look for them.
        known_tools: when not empty, a tool step naming another tool is "unknown tool".
        preview_chars: length of value previews in summaries.
    """

    slow_llm_ms: float = 30_000.0
    slow_step_ms: float = 10_000.0
    tool_timeout_ms: float = 30_000.0
    context_near_ratio: float = 0.9
    chars_per_token: float = 4.0
    default_context_tokens: int = 8_192
    context_windows: Mapping[str, int] = field(
        default_factory=lambda: dict(DEFAULT_CONTEXT_WINDOWS)
    )
    min_results: int = 3
    low_score: float = 0.5
    refusal_markers: tuple[str, ...] = (
        "i cannot",
        "i can't",
        "i can not",
        "i'm unable",
        "i am unable",
        "i'm not able",
        "i am not able",
        "i won't",
        "as an ai",
        "i'm sorry, but",
        "i apologize, but",
    )
    refusal_window_chars: int = 200
    known_tools: tuple[str, ...] = ()
    preview_chars: int = 200

    def context_window(self, model: str | None) -> int:
        """The context window (tokens) of a model, by longest matching prefix."""
        name = (model or "").lower()
        best, size = -1, self.default_context_tokens
        for prefix, tokens in self.context_windows.items():
            if name.startswith(prefix.lower()) and len(prefix) > best:
                best, size = len(prefix), int(tokens)
        return size

    def with_overrides(self, overrides: Mapping[str, Any]) -> InspectionSettings:
        """A copy with some fields replaced; string values (from the command line) are parsed
        as the field's type (lists comma-separated; ``context_windows`` as JSON or
        ``model:tokens,...``).

        Raises:
            InvalidOverride: an unknown setting or a value of the wrong type.
        """
        names = {f.name: f for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for key, raw in overrides.items():
            if key not in names:
                raise InvalidOverride(
                    f"unknown setting {key!r}", f"settings: {', '.join(sorted(names))}"
                )
            current = getattr(self, key)
            try:
                changes[key] = _coerce(current, raw)
            except (TypeError, ValueError) as exc:
                raise InvalidOverride(
                    f"setting {key} cannot be {raw!r}: {exc}",
                    f"give a {type(current).__name__}",
                ) from exc
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The settings as a JSON object."""
        out = dataclasses.asdict(self)
        out["context_windows"] = dict(self.context_windows)
        out["refusal_markers"] = list(self.refusal_markers)
        out["known_tools"] = list(self.known_tools)
        return out


def _coerce(current: Any, raw: Any) -> Any:
    if not isinstance(raw, str):
        if isinstance(current, tuple):
            return tuple(str(x) for x in raw)
        if isinstance(current, Mapping):
            return {str(k): int(v) for k, v in dict(raw).items()}
        if isinstance(current, float):
            return float(raw)
        if isinstance(current, int):
            return int(raw)
        return raw
    if isinstance(current, bool):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(current, int):
        return int(raw)
    if isinstance(current, float):
        return float(raw)
    if isinstance(current, tuple):
        return tuple(x.strip() for x in raw.split(",") if x.strip())
    if isinstance(current, Mapping):
        text = raw.strip()
        if text.startswith("{"):
            return {str(k): int(v) for k, v in json.loads(text).items()}
        pairs = [p.rpartition(":") for p in text.split(",") if p.strip()]
        return dict(current) | {k.strip(): int(v) for k, _, v in pairs}
    return raw


@dataclass(frozen=True)
class Finding:
    """One thing wrong (or worth knowing) about a step."""

    code: str
    severity: str
    message: str
    suggestion: str

    def to_json(self) -> dict[str, Any]:
        """JSON object of the finding."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class StepInspection:
    """The findings of one step and a summary of its data."""

    step: StepView
    findings: tuple[Finding, ...]
    summary: dict[str, Any]

    @property
    def worst(self) -> str | None:
        """The most severe finding's severity, or None."""
        if not self.findings:
            return None
        return min((f.severity for f in self.findings), key=SEVERITY_ORDER.__getitem__)

    def to_json(self) -> dict[str, Any]:
        """JSON object: the step's listing row, its findings and data summary."""
        return self.step.summary() | {
            "findings": [f.to_json() for f in self.findings],
            "data": self.summary,
        }


@dataclass(frozen=True)
class TraceInspection:
    """Inspection of a trace (or of one step of it)."""

    trace: TraceView
    steps: tuple[StepInspection, ...]

    def counts(self) -> dict[str, int]:
        """Number of findings per severity."""
        out = {ERROR: 0, WARNING: 0, INFO: 0}
        for s in self.steps:
            for f in s.findings:
                out[f.severity] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        """JSON object: the trace's listing row, finding counts and every step's inspection."""
        return {
            "trace": self.trace.summary(),
            "counts": self.counts(),
            "steps": [s.to_json() for s in self.steps],
        }


# -- values the checks look at ------------------------------------------------------------------


def _messages_text(messages: Sequence[Any]) -> str:
    parts = []
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
            )
    return "\n".join(parts)


def prompt_text(step: StepView) -> str | None:
    """The text sent to the model: the recorded request messages when the call went through
    Rewind's client, else the step input's ``prompt``/``messages`` (or the input itself when it
    is a string). None when the input has no recognisable prompt."""
    if step.llm_calls:
        return "\n".join(_messages_text(c.messages) for c in step.llm_calls)
    value = step.input
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        if isinstance(value.get("messages"), list):
            return _messages_text(value["messages"])
        for key in ("prompt", "input", "query", "question", "text"):
            if isinstance(value.get(key), str):
                return value[key]
        return None
    if isinstance(value, list) and value and all(isinstance(m, Mapping) for m in value):
        return _messages_text(value)
    return None


def output_text(step: StepView) -> str | None:
    """The model's answer as text (the step output when it is a string, else its
    ``content``/``text``/``answer`` field, else the last recorded answer). None when the output
    is not text."""
    value = step.output
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        for key in ("content", "text", "answer", "output", "completion"):
            if isinstance(value.get(key), str):
                return value[key]
    if step.llm_calls and step.llm_calls[-1].content is not None:
        return step.llm_calls[-1].content
    return None


def is_empty(value: Any) -> bool:
    """True for None, a blank string, or an empty container."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, list | dict | tuple):
        return len(value) == 0
    return False


def _prompt_tokens(step: StepView, text: str | None, settings: InspectionSettings) -> int:
    usage = step.attributes.get("usage")
    reported = usage.get("prompt_tokens") if isinstance(usage, Mapping) else None
    if isinstance(reported, int) and reported > 0:
        return reported
    if step.prompt_tokens > 0:
        return step.prompt_tokens
    return int(len(text or "") / max(settings.chars_per_token, 0.1))


def _results(step: StepView) -> list[Any] | None:
    value = step.output
    if isinstance(value, list):
        return value
    if isinstance(value, Mapping):
        for key in ("documents", "results", "docs", "hits", "items", "matches"):
            if isinstance(value.get(key), list):
                return value[key]
    return None


def _scores(step: StepView, results: list[Any] | None) -> list[float]:
    scores = step.attributes.get("scores")
    if isinstance(scores, list):
        return [float(s) for s in scores if isinstance(s, int | float) and not isinstance(s, bool)]
    out = []
    for r in results or []:
        if isinstance(r, Mapping):
            for key in ("score", "relevance_score", "similarity", "relevance"):
                v = r.get(key)
                if isinstance(v, int | float) and not isinstance(v, bool):
                    out.append(float(v))
                    break
    return out


def _error_text(step: StepView) -> str:
    return f"{step.error_type or ''}: {step.error_message or ''}".lower()


_TIMEOUT = re.compile(r"time[d ]?out|timeout|deadline exceeded", re.I)
_UNKNOWN_TOOL = re.compile(
    r"unknown tool|no such tool|tool .*not found|not a registered tool", re.I
)
_INVALID_ARGS = re.compile(
    r"invalid (tool )?arg|invalid param|validation error|missing (\d+ )?required|"
    r"unexpected keyword|got an unexpected|invalid input",
    re.I,
)


# -- checks ------------------------------------------------------------------------------------


def _check_llm(step: StepView, s: InspectionSettings, out: list[Finding]) -> dict[str, Any]:
    text = prompt_text(step)
    model = step.model
    tokens = _prompt_tokens(step, text, s)
    window = int(step.attributes.get("context_window") or s.context_window(model))
    if text is not None and not text.strip():
        out.append(
            Finding(
                "empty_prompt",
                ERROR,
                "the prompt is empty",
                "check how the prompt is built: a template variable or upstream step gave nothing",
            )
        )
    if tokens >= window:
        out.append(
            Finding(
                "context_overflow",
                ERROR,
                f"the prompt (~{tokens} tokens) does not fit the context window of "
                f"{model or 'the model'} ({window} tokens)",
                "shorten the prompt: fewer or chunked documents, a summary of the history, or a "
                "model with a larger context",
            )
        )
    elif tokens >= s.context_near_ratio * window:
        out.append(
            Finding(
                "context_near_limit",
                WARNING,
                f"the prompt (~{tokens} tokens) uses {tokens / window:.0%} of the context window "
                f"of {model or 'the model'} ({window} tokens)",
                "leave room for the answer: trim the prompt or lower max_tokens",
            )
        )
    finish = step.attributes.get("finish_reason")
    if finish == "length":
        out.append(
            Finding(
                "truncated_output",
                WARNING,
                "the answer was cut off (finish_reason = length)",
                "raise max_tokens, or ask for a shorter answer",
            )
        )
    answer = output_text(step)
    if step.status == StepStatus.SUCCESS:
        if is_empty(step.output) and is_empty(answer):
            out.append(
                Finding(
                    "empty_response",
                    ERROR,
                    "the model returned an empty response",
                    "check content filtering and the stop sequences; ask explicitly for an answer",
                )
            )
        elif answer:
            head = answer[: s.refusal_window_chars].lower()
            marker = next((m for m in s.refusal_markers if m in head), None)
            if marker:
                out.append(
                    Finding(
                        "refusal",
                        WARNING,
                        f"the model may have refused (answer contains {marker!r})",
                        "review the prompt for content the model declines; rephrase the task",
                    )
                )
    if step.duration_ms > s.slow_llm_ms:
        out.append(
            Finding(
                "slow_response",
                WARNING,
                f"slow response: {step.duration_ms:.0f} ms (threshold {s.slow_llm_ms:.0f} ms)",
                "use a faster model, a shorter prompt, or a lower max_tokens",
            )
        )
    return {
        "model": model,
        "prompt_chars": len(text) if text is not None else None,
        "prompt_tokens": tokens,
        "context_window": window,
        "finish_reason": finish,
        "output_chars": len(answer) if answer is not None else None,
    }


def _check_retrieval(step: StepView, s: InspectionSettings, out: list[Finding]) -> dict[str, Any]:
    results = _results(step)
    scores = _scores(step, results)
    if step.status == StepStatus.SUCCESS and results is not None:
        if not results:
            out.append(
                Finding(
                    "no_results",
                    ERROR,
                    "the retrieval returned no results",
                    "check the query and the index; widen the search (lower the threshold)",
                )
            )
        elif len(results) < s.min_results:
            out.append(
                Finding(
                    "few_results",
                    WARNING,
                    f"the retrieval returned only {len(results)} result"
                    f"{'s' if len(results) != 1 else ''} (fewer than {s.min_results})",
                    "lower the similarity threshold or raise top_k",
                )
            )
    if scores and max(scores) < s.low_score:
        out.append(
            Finding(
                "low_scores",
                WARNING,
                f"low relevance scores: best {max(scores):.2f} (threshold {s.low_score:.2f})",
                "the query may not match the documents: rewrite the query or check the index",
            )
        )
    _check_slow(step, s, out)
    return {
        "results": len(results) if results is not None else None,
        "best_score": max(scores) if scores else None,
        "scores": scores[:20],
    }


def _check_parse(step: StepView, s: InspectionSettings, out: list[Finding]) -> dict[str, Any]:
    text = step.input if isinstance(step.input, str) else None
    if text is None and isinstance(step.input, Mapping):
        text = next((v for v in step.input.values() if isinstance(v, str)), None)
    if step.status == StepStatus.FAILED:
        error = str(step.error or "")
        # JSON advice only for a JSON/format error; another exception is the parser's own rule.
        about_json = any(w in error for w in ("JSON", "json", "Expecting", "ValidationError"))
        hints = parse_hints(text) if about_json else []
        fallback = (
            "ask for the exact output format (JSON mode or a schema) and parse leniently"
            if about_json
            else "the parser rejected its input on its own rule: compare the input shown here "
            "with what the parser expects"
        )
        out.append(
            Finding(
                "parse_failure",
                ERROR,
                f"parsing failed: {step.error}",
                "; ".join(hints) or fallback,
            )
        )
    _check_slow(step, s, out)
    return {"input_chars": len(text) if text is not None else None, "parsed": not step.failed}


def parse_hints(text: str | None) -> list[str]:
    """What is wrong with text a parser refused: empty, a preamble, a code fence, cut off."""
    if text is None:
        return []
    hints = []
    stripped = text.strip()
    if not stripped:
        return ["the text to parse is empty: the model returned nothing (check the LLM step)"]
    if "```" in stripped:
        hints.append("the text is wrapped in a code fence: strip ```json fences before parsing")
    first = min((i for i in (stripped.find("{"), stripped.find("[")) if i >= 0), default=-1)
    if first > 0 and not stripped.startswith("```"):
        hints.append(
            f"the model wrote a preamble before the data ({stripped[: min(first, 40)]!r}…): "
            "ask for the data only, or extract the first JSON value"
        )
    elif first < 0:
        hints.append("the text holds no JSON object or array: ask for JSON (JSON mode)")
    if first >= 0:
        body = stripped[first:]
        if body.count("{") > body.count("}") or body.count("[") > body.count("]"):
            hints.append("the JSON is cut off: the model likely hit max_tokens")
    return hints


def _check_tool(step: StepView, s: InspectionSettings, out: list[Finding]) -> dict[str, Any]:
    tool = step.attributes.get("tool") or step.attributes.get("tool_name") or step.name
    err = _error_text(step)
    if step.status == StepStatus.FAILED:
        if _TIMEOUT.search(err) or (step.error_type or "").endswith("Timeout"):
            out.append(
                Finding(
                    "tool_timeout",
                    ERROR,
                    f"tool {tool!r} timed out: {step.error}",
                    "raise the tool's timeout, make it faster, or retry with backoff",
                )
            )
        elif _UNKNOWN_TOOL.search(err) or (s.known_tools and tool not in s.known_tools):
            out.append(
                Finding(
                    "unknown_tool",
                    ERROR,
                    f"unknown tool {tool!r}: {step.error}",
                    "check the tool's registration and the name the model used",
                )
            )
        elif _INVALID_ARGS.search(err) or step.error_type in ("TypeError", "ValidationError"):
            out.append(
                Finding(
                    "invalid_arguments",
                    ERROR,
                    f"invalid arguments for tool {tool!r}: {step.error}",
                    "compare the arguments with the tool's schema; give the model the schema",
                )
            )
        else:
            out.append(_failed(step))
    elif s.known_tools and tool not in s.known_tools:
        out.append(
            Finding(
                "unknown_tool",
                WARNING,
                f"tool {tool!r} is not one of the known tools",
                "check the tool's name",
            )
        )
    if step.duration_ms >= s.tool_timeout_ms and step.status != StepStatus.FAILED:
        out.append(
            Finding(
                "tool_near_timeout",
                WARNING,
                f"tool {tool!r} took {step.duration_ms:.0f} ms "
                f"(timeout {s.tool_timeout_ms:.0f} ms)",
                "raise the timeout or speed the tool up",
            )
        )
    return {"tool": tool, "duration_ms": round(step.duration_ms, 3)}


def _check_validate(step: StepView, s: InspectionSettings, out: list[Finding]) -> dict[str, Any]:
    value = step.output
    rejected = value is False or (
        isinstance(value, Mapping) and (value.get("valid") is False or value.get("ok") is False)
    )
    if step.status == StepStatus.FAILED:
        out.append(_failed(step))
    elif rejected:
        out.append(
            Finding(
                "validation_rejected",
                WARNING,
                "the validation rejected its input",
                "look at the upstream step's output that failed the check",
            )
        )
    _check_slow(step, s, out)
    return {"valid": not rejected and not step.failed}


def _check_default(step: StepView, s: InspectionSettings, out: list[Finding]) -> dict[str, Any]:
    if step.status == StepStatus.FAILED:
        out.append(_failed(step))
    _check_slow(step, s, out)
    return {}


def _failed(step: StepView) -> Finding:
    from rewind.tracing.failures import classify_error, pattern_info

    pattern = classify_error(step.error_type, step.error_message)
    fix = pattern_info(pattern).suggested_fix if pattern else "read the error and the step input"
    return Finding("step_failed", ERROR, f"the step failed: {step.error}", fix)


def _not_replayable(step: StepView) -> Finding:
    return Finding(
        "not_replayable",
        INFO,
        f"its call was imported without a replayable request: "
        f"{step.attributes.get('not_replayable') or 'not recorded whole'}",
        "a replay keeps this step's recorded output and refuses a change that reaches it; record "
        "the production trace with message content and parameters captured",
    )


def _check_slow(step: StepView, s: InspectionSettings, out: list[Finding]) -> None:
    if step.duration_ms > s.slow_step_ms:
        out.append(
            Finding(
                "slow_step",
                WARNING,
                f"slow step: {step.duration_ms:.0f} ms (threshold {s.slow_step_ms:.0f} ms)",
                "profile the step; cache or parallelise its work",
            )
        )


_CHECKS = {
    "llm_call": _check_llm,
    "retrieval": _check_retrieval,
    "parse": _check_parse,
    "tool_call": _check_tool,
    "validate": _check_validate,
}


def inspect_step(
    step: StepView, settings: InspectionSettings | None = None, *, finished: bool = True
) -> StepInspection:
    """Inspect one step.

    Args:
        finished: whether its trace has finished (a step still pending or running then means it
            never completed).
    """
    s = settings or InspectionSettings()
    findings: list[Finding] = []
    summary = _CHECKS.get(step.step_type, _check_default)(step, s, findings)
    if step.status == StepStatus.FAILED and not any(f.severity == ERROR for f in findings):
        findings.append(_failed(step))
    if step.attributes.get("replayable") is False:
        findings.append(_not_replayable(step))
    if step.status == StepStatus.SKIPPED:
        reason = step.attributes.get("skip_reason")
        findings.append(
            Finding(
                "skipped",
                INFO,
                "the step was skipped" + (f": {reason}" if reason else ""),
                "check the condition that skips it if its output was needed",
            )
        )
    elif finished and step.status in (StepStatus.PENDING, StepStatus.RUNNING):
        findings.append(
            Finding(
                "unfinished",
                WARNING,
                f"the step was still {step.status} when the trace ended",
                "await or join the step's work before the chain returns",
            )
        )
    summary = {
        "input": preview(step.input, s.preview_chars),
        "output": preview(step.output, s.preview_chars),
    } | summary
    findings.sort(key=lambda f: SEVERITY_ORDER[f.severity])
    return StepInspection(step, tuple(findings), summary)


def inspect_trace(
    trace: TraceView, *, step: str | int | None = None, settings: InspectionSettings | None = None
) -> TraceInspection:
    """Inspect every step of a trace, or only the one named (``name``, ``name#k`` or number).

    Raises:
        LookupError: no such step.
    """
    finished = trace.status != StepStatus.RUNNING
    steps = [trace.find(step)] if step is not None else list(trace.steps)
    return TraceInspection(
        trace, tuple(inspect_step(s, settings, finished=finished) for s in steps)
    )


def preview(value: Any, limit: int = 200) -> str:
    """A one-line preview of a value (JSON, cut to ``limit`` characters)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- output comparison -------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputComparison:
    """Equality, similarity (0..1) and the field-level differences of two outputs."""

    equal: bool
    similarity: float
    differences: tuple[FieldChange, ...]

    def to_json(self) -> dict[str, Any]:
        """JSON object with ``equal``, ``similarity`` and ``differences`` (path, kind, old, new,
        text_diff)."""
        return {
            "equal": self.equal,
            "similarity": round(self.similarity, 6),
            "differences": [
                {
                    "path": c.path,
                    "kind": c.kind,
                    "old": c.old,
                    "new": c.new,
                    "text_diff": c.text_diff,
                }
                for c in self.differences
            ],
        }


def compare_outputs(expected: Any, actual: Any) -> OutputComparison:
    """Compare two outputs with the trajectory diff's rules: equality as the canonical hasher
    sees it (``1`` ≠ ``1.0``), similarity (string ratio; field-wise for objects and lists) and
    every changed path."""
    changes = tuple(diff_values(expected, actual))
    return OutputComparison(not changes, similarity(expected, actual), changes)


def compare_traces(a: TraceView, b: TraceView) -> dict[str, Any]:
    """Step-by-step comparison of two traces (or runs): the trajectory diff, with the similarity
    of each aligned pair of outputs and of the chains' outputs."""
    diff = diff_trajectories(a.trace_id, _sides(a), b.trace_id, _sides(b))
    out = diff.to_json()
    for row, node in zip(out["nodes"], diff.nodes, strict=True):
        if node.a is not None and node.b is not None:
            row["similarity"] = round(similarity(node.a.output, node.b.output), 6)
        else:
            row["similarity"] = 0.0
    out["output"] = compare_outputs(a.output, b.output).to_json()
    return out


def _sides(view: TraceView) -> list[NodeSide]:
    """The steps as the trajectory diff sees them. A failed step has no output to compare: its
    error is compared (under :data:`rewind.diff.ERROR_FIELD`), so a replay whose step failed
    otherwise, or did not fail, is not reported equal.

    Each step is named as every store keeps names (:func:`stored_name`; an ordinary name is
    its own stored form), the one place names are normalised for pairing: a trace recorded
    before names were checked holds a NUL in a step name (SQLite kept it), and its replay,
    run with the name escaped, stores the step and its output field as ``a\\u0000b``; the
    diff paired steps by name and showed every such step only in one trace."""
    return [
        NodeSide(
            position=s.position,
            name=stored_name(s.name),
            output=_compared_output(s),
            output_hash=s.output_hash or "",
            tokens=s.tokens,
            outcome=s.cache_outcome,
            failed=s.status == "failed",
        )
        for s in view.steps
    ]


def _compared_output(step: StepView) -> dict[str, Any]:
    """A step's output fields, with its error when it failed; the field named after the step
    (a traced step's output) named as the step is (:func:`_sides`)."""
    fields = step.output_fields
    name = stored_name(step.name)
    if name != step.name and step.name in fields and name not in fields:
        fields = {name if k == step.name else k: v for k, v in fields.items()}
    if step.status != "failed":
        return fields
    return {**fields, ERROR_FIELD: f"{step.error_type}: {step.error_message}"}
