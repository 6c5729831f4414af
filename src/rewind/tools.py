"""Tools: a registry of named functions whose calls go through the tool cache.

The tool cache key is the tool's name plus its canonical arguments (DESIGN rule 5): positional and
keyword spellings of the same call share one entry (``add(5, 3)`` == ``add(b=3, a=5)``), argument
order inside lists matters, and renaming a tool is a miss, never a positional match.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from typing import Any

from rewind.cache import Executed, through_cache
from rewind.canonical import canonical_bytes, key_of
from rewind.context import current
from rewind.errors import RewindError

DETERMINISM_FLAGS = ("deterministic", "time-bound", "side-effect")

_REGISTRY: dict[str, Tool] = {}


class Tool:
    """A registered tool. Calling it inside a Rewind run goes through the tool cache.

    The result must be JSON-like; callers receive it after a canonical round trip, so a recorded
    run and its replay see exactly the same value (tuples become lists, and so on).

    Args:
        fn: the function.
        name: registry name (defaults to the function's ``__name__``); part of the cache key.
        determinism: one of ``deterministic``, ``time-bound``, ``side-effect``.
    """

    def __init__(self, fn: Callable[..., Any], name: str, determinism: str) -> None:
        if determinism not in DETERMINISM_FLAGS:
            raise ValueError(f"determinism must be one of {DETERMINISM_FLAGS}, not {determinism!r}")
        self.fn = fn
        self.name = name
        self.determinism = determinism
        self.signature = inspect.signature(fn)
        functools.update_wrapper(self, fn)

    def bind(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Arguments by parameter name with defaults applied (the cache key's argument part)."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise RewindError(
                f"tool {self.name!r}: {exc}", f"signature is {self.signature}"
            ) from exc
        bound.apply_defaults()
        return dict(bound.arguments)

    def key(self, args: dict[str, Any]) -> str:
        """The tool cache key for bound arguments."""
        return key_of("tool/v1", self.name, canonical_bytes(args))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = current()
        if ctx is None:
            return self.fn(*args, **kwargs)
        bound = self.bind(*args, **kwargs)
        request = canonical_bytes(bound)
        key = key_of("tool/v1", self.name, request)

        def execute() -> Executed:
            return Executed(canonical_bytes(self.fn(**bound)))

        data, _ = through_cache(
            ctx, kind="tool", name=self.name, key=key, request=request, execute=execute
        )
        return json.loads(data)


def tool(
    name: str | None = None, *, determinism: str = "deterministic"
) -> Callable[[Callable[..., Any]], Tool]:
    """Register a function as a tool.

    Args:
        name: registry name; defaults to the function name. Two tools may not share a name.
        determinism: ``deterministic`` (default), ``time-bound`` or ``side-effect``.
    Raises:
        ValueError: the name is taken by another function.
    """

    def decorate(fn: Callable[..., Any]) -> Tool:
        tool_name = name or fn.__name__
        existing = _REGISTRY.get(tool_name)
        if existing is not None and existing.fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"a tool named {tool_name!r} is already registered")
        t = Tool(fn, tool_name, determinism)
        _REGISTRY[tool_name] = t
        return t

    return decorate


def registered() -> dict[str, Tool]:
    """A copy of the tool registry (name → tool)."""
    return dict(_REGISTRY)
