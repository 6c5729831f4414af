"""Tracing and failure analysis for any LLM chain, in the same store as Burr runs.

A trace is a run and each step a node row (plus a ``spans`` row for what a node cannot say), so
``rewind show``, ``rewind diff`` and the UI work on traces unchanged. Modules: :mod:`.tracer`
(record), :mod:`.replay` (replay with recorded LLM answers and one change), :mod:`.inspect`
(per-step findings), :mod:`.failures` (patterns across traces), :mod:`.rootcause`,
:mod:`.debug` (a stepping session), :mod:`.otel` (OpenTelemetry export/import), :mod:`.service`
(HTTP routes) and :mod:`.commands` (what the CLI runs).
"""

from rewind.tracing.model import StepStatus, StepType, StepView, TraceView
from rewind.tracing.store import load_trace, load_traces
from rewind.tracing.tracer import (
    Step,
    Trace,
    Tracer,
    chat_step,
    current_step,
    current_trace,
    propagate,
    step,
)

__all__ = [
    "Step",
    "StepStatus",
    "StepType",
    "StepView",
    "Trace",
    "TraceView",
    "Tracer",
    "chat_step",
    "current_step",
    "current_trace",
    "load_trace",
    "load_traces",
    "propagate",
    "step",
]
