"""Correlation analysis of failures: where do failures concentrate? (seed 003)

Each dimension splits a corpus into groups and gives every group its count, its failures, its
failure rate and example trace ids, next to the dimension's overall rate:

* ``input_length`` — per **trace**: the largest prompt of any of its LLM steps, in tokens (the
  recorded ``prompt_tokens``), bucketed by :data:`INPUT_BUCKETS`; a trace whose prompts recorded
  no token count goes to ``unknown`` (never estimated from characters). A trace fails when its
  status is failed.
* ``step_type`` — per **step**: its type (``llm_call``, ``tool_call``, ``parse``...).
* ``model`` — per **LLM step**: the model it called.
* ``params`` — per **LLM step** and request parameter: ``temperature=0.7``, ``max_tokens=64``...
  (the parameters of its recorded calls, and the params it read with :func:`rewind.param`).

A step fails when its status is failed. A group is a **finding** when it holds at least
:data:`MIN_FAILURES` failures and its rate is at least halfway from the dimension's overall
rate to 100 % (25 % overall → 62.5 %; 60 % → 80 %): the "fails only above 4,000 input tokens"
kind of pattern the analysis must surface. Nothing is a finding when every unit, or none, failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rewind.errors import InvalidOverride
from rewind.tracing.model import StepStatus, StepView, TraceView

__all__ = [
    "DIMENSIONS",
    "INPUT_BUCKETS",
    "Correlation",
    "FailureGroup",
    "correlate_failures",
]

DIMENSIONS = ("input_length", "step_type", "model", "params")
INPUT_BUCKETS: tuple[int, ...] = (0, 500, 1000, 2000, 4000, 8000, 16000, 32000)
"""Lower edges of the input-length buckets, in tokens (the last bucket is open-ended)."""
MIN_FAILURES = 2


@dataclass
class FailureGroup:
    """One group of a dimension: ``failed`` of ``total`` units (traces or steps) failed."""

    key: str
    total: int = 0
    failed: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """Failed / total (0 when empty)."""
        return self.failed / self.total if self.total else 0.0

    def add(self, trace_id: str, failed: bool, max_examples: int) -> None:
        """Count one unit of ``trace_id``."""
        self.total += 1
        if failed:
            self.failed += 1
            if trace_id not in self.examples and len(self.examples) < max_examples:
                self.examples.append(trace_id)


@dataclass
class Correlation:
    """One dimension's groups (sorted by key order of the dimension) and its findings."""

    dimension: str
    unit: str
    groups: list[FailureGroup]

    @property
    def total(self) -> int:
        """Units counted."""
        return sum(g.total for g in self.groups)

    @property
    def failed(self) -> int:
        """Failed units."""
        return sum(g.failed for g in self.groups)

    @property
    def rate(self) -> float:
        """The dimension's overall failure rate."""
        return self.failed / self.total if self.total else 0.0

    @property
    def finding_rate(self) -> float | None:
        """The rate a group needs to be a finding: halfway from the overall rate to 100 %
        (None when every unit, or none, failed: then nothing is a finding)."""
        overall = self.rate
        if overall == 0.0 or overall == 1.0:
            return None
        return overall + (1.0 - overall) / 2

    def findings(self) -> list[FailureGroup]:
        """Groups where failures concentrate (see the module doc), highest rate first."""
        bar = self.finding_rate
        if bar is None:
            return []
        hot = [g for g in self.groups if g.failed >= MIN_FAILURES and g.rate >= bar]
        return sorted(hot, key=lambda g: (-g.rate, g.key))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON for the CLI and the API. Each group says whether it is a ``finding``;
        ``finding_rate`` and ``min_failures`` are the bar it had to pass. ``input_length`` also
        gives ``edges``: the lower edges of its buckets in tokens (:data:`INPUT_BUCKETS`; each
        bucket runs up to the next edge minus one, the last is open-ended)."""
        edges = {"edges": list(INPUT_BUCKETS)} if self.dimension == "input_length" else {}
        hot = {g.key for g in self.findings()}
        bar = self.finding_rate
        return edges | {
            "dimension": self.dimension,
            "unit": self.unit,
            "total": self.total,
            "failed": self.failed,
            "rate": round(self.rate, 4),
            "finding_rate": None if bar is None else round(bar, 4),
            "min_failures": MIN_FAILURES,
            "groups": [
                {
                    "key": g.key,
                    "total": g.total,
                    "failed": g.failed,
                    "rate": round(g.rate, 4),
                    "finding": g.key in hot,
                    "examples": g.examples,
                }
                for g in self.groups
            ],
            "findings": [
                f"{self.dimension} {g.key}: {g.failed}/{g.total} {self.unit} failed "
                f"({g.rate:.0%} vs {self.rate:.0%} overall)"
                for g in self.findings()
            ],
        }


def correlate_failures(
    views: Iterable[TraceView], by: Sequence[str], *, examples: int = 5
) -> list[Correlation]:
    """Failure rates of ``views`` grouped by each dimension of ``by`` (see the module doc).

    Args:
        views: traces (load them with ``payloads=True`` for the ``params`` dimension to see the
            recorded request parameters).
        by: dimensions, each one of :data:`DIMENSIONS`.
        examples: example trace ids kept per group (failed ones).
    Returns:
        one :class:`Correlation` per dimension, in the order asked.
    Raises:
        InvalidOverride: an unknown dimension.
    """
    unknown = [d for d in by if d not in DIMENSIONS]
    if unknown:
        raise InvalidOverride(
            f"cannot group failures by {', '.join(map(repr, unknown))}",
            f"use --by with one of: {', '.join(DIMENSIONS)}",
        )
    views = list(views)
    return [_correlate(views, d, examples) for d in dict.fromkeys(by)]


def _correlate(views: list[TraceView], dimension: str, examples: int) -> Correlation:
    groups: dict[str, FailureGroup] = {}

    def count(key: str, trace_id: str, failed: bool) -> None:
        groups.setdefault(key, FailureGroup(key)).add(trace_id, failed, examples)

    for v in views:
        if dimension == "input_length":
            count(_bucket(v), v.trace_id, v.failed)
            continue
        for s in v.steps:
            failed = s.status == StepStatus.FAILED
            if dimension == "step_type":
                count(s.step_type, v.trace_id, failed)
            elif s.step_type == "llm_call" and dimension == "model":
                count(s.model or "unknown", v.trace_id, failed)
            elif s.step_type == "llm_call":
                for key in _param_keys(s):
                    count(key, v.trace_id, failed)
    ordered = sorted(groups.values(), key=lambda g: _order(dimension, g.key))
    unit = "traces" if dimension == "input_length" else "steps"
    return Correlation(dimension, unit, ordered)


def _bucket(view: TraceView) -> str:
    tokens = [s.prompt_tokens for s in view.steps if s.step_type == "llm_call" and s.prompt_tokens]
    if not tokens:
        return "unknown"
    n = max(tokens)
    lower = max(edge for edge in INPUT_BUCKETS if edge <= n)
    i = INPUT_BUCKETS.index(lower)
    upper = INPUT_BUCKETS[i + 1] if i + 1 < len(INPUT_BUCKETS) else None
    return f"{lower}-{upper - 1} tokens" if upper is not None else f"{lower}+ tokens"


def _order(dimension: str, key: str) -> tuple[int, Any]:
    if dimension == "input_length":
        head = key.split("-")[0].split("+")[0]
        return (0, int(head)) if head.isdigit() else (1, 0)
    return (0, key)


def _param_keys(s: StepView) -> list[str]:
    params: dict[str, Any] = {}
    for call in s.llm_calls:
        params.update({k: v for k, v in call.params.items() if k != "model"})
    params.update(s.params)
    return [
        f"{k}={json.dumps(v, sort_keys=True, separators=(',', ':'))}"
        for k, v in sorted(params.items())
        if v is not None
    ]
