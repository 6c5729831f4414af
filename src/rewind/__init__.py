"""Rewind: a time-travel debugger for LLM agent pipelines built on Apache Burr.

Record every node of a run, fork a finished run at any node with exactly one change, replay only
the downstream nodes through a content-addressed cache, and diff the two trajectories by field.

Public API::

    from rewind import Rewind, Pipeline, ParamOverride, OutputOverride, InputOverride
    from rewind import param, tool, chat

The names are imported on first use (PEP 562), so ``import rewind`` (and the CLI's start-up)
does not pay for Burr, SQLAlchemy or httpx until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rewind._lazy import submodule

if TYPE_CHECKING:
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

_LAZY = {
    "InputOverride": "rewind.replay",
    "OutputOverride": "rewind.replay",
    "ParamOverride": "rewind.replay",
    "Pipeline": "rewind.replay",
    "Rewind": "rewind.replay",
    "RewindError": "rewind.errors",
    "chat": "rewind.calls",
    "idempotency_key": "rewind.effects",
    "param": "rewind.context",
    "parse_override": "rewind.replay",
    "tool": "rewind.tools",
}

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


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use (PEP 562).

    Raises:
        AttributeError: ``name`` is not a public name of the package (nor a submodule).
    """
    module = _LAZY.get(name)
    if module is None:
        return submodule("rewind", name)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
