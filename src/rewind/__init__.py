"""Rewind: a time-travel debugger for LLM agent pipelines built on Apache Burr.

Record every node of a run, fork a finished run at any node with exactly one change, replay only
the downstream nodes through a content-addressed cache, and diff the two trajectories by field.

Public API::

    from rewind import Rewind, Pipeline, ParamOverride, OutputOverride, InputOverride
    from rewind import param, tool, chat
"""

from rewind.calls import chat
from rewind.context import param
from rewind.effects import idempotency_key
from rewind.errors import RewindError
from rewind.replay import (
    InputOverride,
    OutputOverride,
    ParamOverride,
    Pipeline,
    Rewind,
    parse_override,
)
from rewind.tools import tool

__version__ = "0.1.0"

__all__ = [
    "InputOverride",
    "OutputOverride",
    "ParamOverride",
    "Pipeline",
    "Rewind",
    "RewindError",
    "chat",
    "idempotency_key",
    "param",
    "parse_override",
    "tool",
]
