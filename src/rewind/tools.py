"""Tools: a registry of named functions whose calls go through the tool cache.

The tool cache key is the tool's name plus its canonical arguments (DESIGN rule 5): positional and
keyword spellings of the same call share one entry (``add(5, 3)`` == ``add(b=3, a=5)``), argument
order inside lists matters, and renaming a tool is a miss, never a positional match. Each tool
declares its determinism flag: ``deterministic`` (entries never expire), ``time-bound`` (with
``ttl_s``) or ``side-effect`` (with the resources it touches; see :mod:`rewind.effects`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rewind.cache import CallPolicy, Executed, through_cache
from rewind.canonical import KeyPrefix, canonical_bytes, loads
from rewind.context import active_runs, current
from rewind.errors import ContextLost, RewindError
from rewind.store.records import NAME_RULE, storable_name

TOOL_FLAGS = ("deterministic", "time-bound", "side-effect")

_REGISTRY: dict[str, Tool] = {}

Resources = Sequence[Any] | Callable[..., Sequence[Any]]


class Tool:
    """A registered tool. Calling it inside a Rewind run goes through the tool cache.

    The result must be JSON-like; callers receive it after a canonical round trip, so a recorded
    run and its replay see exactly the same value (tuples become lists, and so on).

    Args:
        fn: the function.
        name: registry name (defaults to the function's ``__name__``); part of the cache key.
        determinism: ``deterministic``, ``time-bound`` or ``side-effect``.
        ttl_s: seconds a time-bound result stays valid (required for time-bound; no default).
        resources: for side-effect tools, the :class:`rewind.effects.Fingerprinter` s the call
            touches, or a function of the call's arguments returning them.
        idempotency_arg: name of the argument carrying an idempotency key; it is passed to the
            function but kept out of the cache key (its value is salted per replay attempt, see
            :func:`rewind.effects.idempotency_key`).
        on_served: called with (request bytes, recorded result bytes) when a side-effecting call
            is served from record on replay.
    Raises:
        ValueError: a name that is not 1 to 200 characters without NUL (UTF-8), an unknown
            flag, a time-bound tool without ``ttl_s``, resources on a tool that is not
            side-effecting, or an ``idempotency_arg`` the function does not take.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        determinism: str = "deterministic",
        *,
        ttl_s: float | None = None,
        resources: Resources | None = None,
        idempotency_arg: str | None = None,
        on_served: Callable[[bytes, bytes], None] | None = None,
    ) -> None:
        if not storable_name(name):
            # Every call row carries it: PostgreSQL would refuse the run's write, not this.
            raise ValueError(f"a tool needs a name {NAME_RULE}, not {name!r:.80}")
        if determinism not in TOOL_FLAGS:
            raise ValueError(f"determinism must be one of {TOOL_FLAGS}, not {determinism!r}")
        CallPolicy(determinism, ttl_s)  # validates the TTL rule
        if resources is not None and determinism != "side-effect":
            raise ValueError("only side-effect tools declare resources")
        self.fn = fn
        self.name = name
        self.determinism = determinism
        self.ttl_s = ttl_s
        self.resources = resources
        self.on_served = on_served
        self.signature = inspect.signature(fn)
        self._positional = positional_names(self.signature)
        self._policy_made: tuple[tuple[Any, ...], CallPolicy] | None = None
        self._key_prefix: KeyPrefix | None = None
        if idempotency_arg is not None and idempotency_arg not in self.signature.parameters:
            raise ValueError(f"{name}: no argument named {idempotency_arg!r}")
        self.idempotency_arg = idempotency_arg
        functools.update_wrapper(self, fn)

    def bind(self, /, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Arguments by parameter name with defaults applied (a ``*args`` parameter's values as
        a tuple, a ``**kwargs`` parameter's as a dict, under their parameter's name)."""
        names = self._positional
        if names is not None:
            # What bind + apply_defaults give when every parameter is passed, without their cost.
            if not kwargs and len(args) == len(names):
                return dict(zip(names, args, strict=True))
            if not args and len(kwargs) == len(names) and all(n in kwargs for n in names):
                return {n: kwargs[n] for n in names}
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise RewindError(
                f"tool {self.name!r}: {exc}", f"signature is {self.signature}"
            ) from exc
        bound.apply_defaults()
        return dict(bound.arguments)

    def key_args(self, args: dict[str, Any]) -> dict[str, Any]:
        """The arguments that enter the cache key (all but the idempotency argument; ``args``
        itself when the tool has none: treat it as read-only)."""
        if self.idempotency_arg is None:
            return args
        return {k: v for k, v in args.items() if k != self.idempotency_arg}

    def key(self, args: dict[str, Any]) -> str:
        """The tool cache key for bound arguments:
        ``key_of("tool/v1", name, canonical_bytes(key_args(args)))``."""
        return self._key_of(canonical_bytes(self.key_args(args)))

    def _key_of(self, request: bytes) -> str:
        """``key_of("tool/v1", self.name, request)``, its head hashed once per name."""
        prefix = self._key_prefix
        if prefix is None or prefix.head[1] != self.name:
            prefix = self._key_prefix = KeyPrefix("tool/v1", self.name)
        return prefix.key(request)

    def policy(self, args: dict[str, Any]) -> CallPolicy:
        """The cache policy of one call."""
        if self.resources is None and self.idempotency_arg is None:
            # The same for every call: built once (again if the tool's settings were changed).
            settings = (self.determinism, self.ttl_s, self.on_served)
            made = self._policy_made
            if made is None or made[0] != settings:
                made = self._policy_made = (settings, CallPolicy(*settings[:2], (), settings[2]))
            return made[1]
        resources: Sequence[Any] = ()
        if callable(self.resources):
            resources = tuple(self.resources(**args))
        elif self.resources is not None:
            resources = tuple(self.resources)
        idem = args.get(self.idempotency_arg) if self.idempotency_arg else None
        return CallPolicy(
            self.determinism,
            self.ttl_s,
            resources,
            self.on_served,
            None if idem is None else str(idem),
        )

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        ctx = current()
        if ctx is not None and ctx.in_child_process():
            if self.determinism == "side-effect":
                raise ContextLost(
                    f"side-effecting tool {self.name!r} was called in a child process of run "
                    f"{ctx.run_id[:12]}: nothing recorded there comes back, so it would execute "
                    "unrecorded",
                    "call it from the node's process (a thread pool carries the run context), "
                    "or return what the child computed and call the tool in the node",
                )
            return self.fn(*args, **kwargs)  # not recordable here; a pure call changes nothing
        if ctx is None:
            if self.determinism == "side-effect":
                _refuse_unrecorded_effect(self.name)
            return self.fn(*args, **kwargs)
        bound = self.bind(*args, **kwargs)
        request = canonical_bytes(self.key_args(bound))
        key = self._key_of(request)

        def execute() -> Executed:
            if self._positional is not None:  # every parameter positional-or-keyword
                return Executed(canonical_bytes(self.fn(**bound)))
            args, kwargs = call_arguments(self.signature, bound)
            return Executed(canonical_bytes(self.fn(*args, **kwargs)))

        data, _ = through_cache(
            ctx,
            kind="tool",
            name=self.name,
            key=key,
            request=request,
            execute=execute,
            policy=self.policy(bound),
        )
        return loads(data)


def call_arguments(
    signature: inspect.Signature, bound: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments of a call whose arguments :meth:`Tool.bind` gave as
    ``bound`` (parameter name -> value, every parameter present): what ``fn(*args, **kwargs)``
    needs to see them again. A ``*args`` parameter's tuple is spread, a ``**kwargs``
    parameter's dict given as keywords, positional-only parameters passed by position.

    Raises:
        KeyError: ``bound`` lacks a parameter that has no default.
    """
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, p in signature.parameters.items():
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            args.extend(bound.get(name, ()))
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            kwargs.update(bound.get(name, {}))
        elif p.kind is inspect.Parameter.KEYWORD_ONLY:
            if name in bound:
                kwargs[name] = bound[name]
        else:  # positional-only or positional-or-keyword: by position, in order
            args.append(bound[name])
    return args, kwargs


def positional_names(signature: inspect.Signature) -> tuple[str, ...] | None:
    """The parameter names of a signature whose parameters are all positional-or-keyword
    (``def f(a, b=1)``), else None. A call passing exactly that many positional arguments and
    no keywords binds them by zipping (what ``signature.bind`` + ``apply_defaults`` return,
    without their cost)."""
    params = signature.parameters.values()
    if all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params):
        return tuple(signature.parameters)
    return None


def _refuse_unrecorded_effect(name: str) -> None:
    """A side effect outside any run context while a run is active would escape the record
    (and be repeated, unaudited, on every replay): refuse it."""
    runs = active_runs()
    if runs:
        raise ContextLost(
            f"side-effecting tool {name!r} was called outside the run context while run "
            f"{runs[0][:12]} is active, so it would execute unrecorded",
            "hand the work to a concurrent.futures.ThreadPoolExecutor (Rewind carries the run "
            "context into it) or start the thread with target=rewind.context.propagate(fn)",
        )


def tool(
    name: str | None = None,
    *,
    determinism: str = "deterministic",
    ttl_s: float | None = None,
    resources: Resources | None = None,
    idempotency_arg: str | None = None,
    on_served: Callable[[bytes, bytes], None] | None = None,
) -> Callable[[Callable[..., Any]], Tool]:
    """Register a function as a tool (see :class:`Tool` for the arguments).

    Raises:
        ValueError: the name is taken by another function or is not 1 to 200 characters
            without NUL (UTF-8), or the flags are inconsistent.
    """

    def decorate(fn: Callable[..., Any]) -> Tool:
        tool_name = name or fn.__name__
        existing = _REGISTRY.get(tool_name)
        if existing is not None and existing.fn.__qualname__ != fn.__qualname__:
            raise ValueError(f"a tool named {tool_name!r} is already registered")
        t = Tool(
            fn,
            tool_name,
            determinism,
            ttl_s=ttl_s,
            resources=resources,
            idempotency_arg=idempotency_arg,
            on_served=on_served,
        )
        _REGISTRY[tool_name] = t
        return t

    return decorate


def registered() -> dict[str, Tool]:
    """A copy of the tool registry (name → tool)."""
    return dict(_REGISTRY)
