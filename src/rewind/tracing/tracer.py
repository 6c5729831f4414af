"""Trace plain Python LLM chains into Rewind's store: a trace is a run, a step is a node.

Usage::

    from rewind.tracing import Tracer, step
    from rewind.calls import chat

    tracer = Tracer(".rewind", chat_client=client)

    @tracer.step("retrieve", "retrieval")
    def retrieve(query: str) -> list[dict]: ...

    @tracer.chain("qa")
    def answer(question: str) -> str:
        docs = retrieve(question)
        with step("generate", "llm_call", input={"question": question}) as s:
            reply = chat([{"role": "user", "content": question}], temperature=0)
            s.set_output(reply.content)
        return reply.content

Steps attach to the trace active in the current context (a ``contextvars`` variable), so nested
steps, threads (wrap the callable with :func:`propagate`) and asyncio tasks (which copy the
context) all land in the right trace under the right parent. LLM calls made through
:func:`rewind.calls.chat` inside a step go through Rewind's LLM cache exactly like a Burr node's:
the step's node row lists the calls with their cache outcome, and a replay
(:func:`rewind.tracing.replay.replay_trace`) serves the recorded responses. An exception inside a
step or chain is recorded (type and message) and re-raised. Nothing is written until the trace
ends; then the whole trace is written in one transaction. A failure to write is logged and kept in
:attr:`Trace.write_error`, never raised into the chain (unless ``raise_on_write_error``).

A tool or ``chat`` call made in the chain's own body, outside any step, becomes a ``tool_call`` /
``llm_call`` step of its own (named after the tool or model), so it is stored and served on replay
like any other call.

A trace of a ``Tracer(read_cache=True)`` is a replay of the recorded trace its first cache hit
comes from (:mod:`rewind.tracing.tracer_source`): that trace becomes its ``parent`` and its calls'
cache entries and answers are read once, so later lookups are dictionary reads. A replay (this
one, or :meth:`Tracer.replay`'s) is stored by reference where it equals its source step for step
(:mod:`rewind.store.references`): an unchanged replay adds one run row and its root span; one
that diverges is written in full from the first divergence on. Once a replay of a source was
written, a later one runs its steps in a lane while they are the steps that replay proved equal
(:mod:`rewind.tracing.lane`): no node scope or cache lookup per step, the same data.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import json
import logging
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from itertools import takewhile
from pathlib import Path
from typing import Any, TypeVar

from rewind.cache import release_flights
from rewind.call import raised_out_of_a_call
from rewind.canonical import sha256_hex
from rewind.context import LineageEntry, NodeScope, RunContext, activate, enter, leave
from rewind.errors import ParentMissing, RewindError
from rewind.interrupts import held_interrupts
from rewind.llm import ChatResponse
from rewind.store import RunRecord, Store, open_store
from rewind.store.records import (
    NAME_RULE,
    NOT_ANSWERS,
    storable_name,
    storable_string,
    storable_text,
)
from rewind.store.references import SourceRows
from rewind.tools import Tool
from rewind.tracing.model import (
    ROOT_POSITION,
    SOURCE_INPUT,
    StepData,
    StepStatus,
    StepType,
    TraceData,
    as_fields,
    jsonable,
    plain_fields,
    step_type_of,
)
from rewind.tracing.store import write_trace

__all__ = [
    "Step",
    "StoppedAtDivergence",
    "Trace",
    "TraceCallbacks",
    "Tracer",
    "chat_step",
    "current_step",
    "current_trace",
    "new_span_id",
    "new_trace_id",
    "propagate",
    "step",
]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("rewind_trace", default=None)
_STEP: contextvars.ContextVar[Step | None] = contextvars.ContextVar("rewind_step", default=None)

MAX_ERROR_CHARS = 4000
"""Longest exception message kept on a step (characters)."""


MAX_TRACE_ID_CHARS = 64
"""The longest trace id a store keeps (its run id column, on every backend)."""


def _storable_id(trace_id: object) -> bool:
    """Whether ``trace_id`` names a trace every store backend keeps: a string of 1 to
    :data:`MAX_TRACE_ID_CHARS` characters, without NUL, encodable as UTF-8
    (:func:`rewind.store.records.storable_string`)."""
    return storable_string(trace_id, MAX_TRACE_ID_CHARS)


def new_trace_id() -> str:
    """A new trace id: 32 lower-case hex characters (an OpenTelemetry trace id, a run id)."""
    return uuid.uuid4().hex


# Span ids only need to be unique, not secret: drawn from a generator of this module's own
# (seeded from os.urandom, again in a forked child), not one system call per step; never from
# the global ``random``, whose sequence a traced chain may have seeded for itself.
_SPAN_IDS = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _SPAN_IDS.seed(os.urandom(32)))


def new_span_id() -> str:
    """A new span id: 16 lower-case hex characters, never all zeros (OpenTelemetry's invalid
    id)."""
    return "%016x" % (_SPAN_IDS.getrandbits(64) or 1)


IN_PLACE_MODE = "in-place"
"""The ``replay_mode`` of a replay whose code ran in the caller's own ``with`` block."""


def current_trace() -> Trace | None:
    """The trace active in this context (thread or task), or None."""
    return _TRACE.get()


def current_step() -> Step | None:
    """The innermost step active in this context, or None."""
    return _STEP.get()


def propagate(fn: F) -> F:
    """Wrap ``fn`` so that it runs in (a copy of) the current context: the current trace and step
    follow it into a thread (``executor.submit(propagate(work), x)``).

    Threads do not inherit ``contextvars``; asyncio tasks do, so async code needs no wrapper.
    """
    captured = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return captured.copy().run(fn, *args, **kwargs)

    return run  # type: ignore[return-value]


# -- steps -------------------------------------------------------------------------------------


class Step:
    """One step of a trace, handed out by ``with step(...) as s`` or :meth:`Trace.step`.

    Its status goes ``pending`` → ``running`` (entered) → ``success`` / ``failed`` (an exception,
    or :meth:`fail`) / ``skipped`` (:meth:`skip`). A step created outside any trace records
    nothing but behaves the same, so traced code also runs untraced.
    """

    def __init__(
        self,
        trace: Trace | None,
        name: str,
        step_type: str,
        inputs: dict[str, Any],
        attributes: dict[str, Any],
        position: int,
        parent_position: int,
    ) -> None:
        self.trace = trace
        self.name = name
        self.step_type = step_type
        self.inputs = inputs
        self.attributes = dict(attributes)
        self.position = position
        self.parent_position = parent_position
        self.span_id = new_span_id()
        self.status = StepStatus.PENDING
        self.output: Any = None
        self.error_type: str | None = None
        self.error_message: str | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.duration_ms = 0.0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.scope: NodeScope | None = None
        self._manual_tokens: tuple[int, int] | None = None
        self._perf = 0.0
        self._ctx_token: contextvars.Token[RunContext | None] | None = None
        self._token: contextvars.Token[Step | None] | None = None
        self._snapshot: Any = None
        self._response: ChatResponse | None = None
        # What data() reads of the scope once the step finished (see _release): params, calls,
        # pending cache writes, effects (attributes, not a tuple: one object less per step).
        self._params: dict[str, Any] | None = None
        self._calls: list[Any] | None = None
        self._pending: dict[str, Any] | None = None
        self._effects: list[Any] | None = None
        self._proven: Any = None  # a step served in the trace's lane: what it was served as
        self._lane_fields: dict[str, Any] | None = None  # and its fields, as read then

    # -- life cycle ------------------------------------------------------------------------
    def __enter__(self) -> Step:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.finish(exc)

    def start(self) -> None:
        """Mark the step running and make it the current step (its LLM calls are recorded on it).

        Raises:
            RuntimeError: the step was already started.
        """
        if self.status != StepStatus.PENDING:
            raise RuntimeError(f"step {self.name!r} was already started")
        self.status = StepStatus.RUNNING
        clock = self.trace.clock if self.trace is not None else time.time
        self.started_at = clock()
        self._perf = time.perf_counter()
        self._token = _STEP.set(self)
        if self.trace is not None:
            base = self.trace.run_context
            overrides = base.param_overrides.get(self.name)
            self.scope = NodeScope.fresh(
                self.name,
                self.position,
                self.started_at,
                self._perf,
                dict(overrides) if overrides else {},
            )
            # A shallow copy with this step's scope (cheaper than dataclasses.replace, which
            # runs __init__ over every field, and than copy.copy's reduce protocol; the copy
            # shares the trace's maps, as replace does).
            ctx = object.__new__(RunContext)
            ctx.__dict__.update(base.__dict__)
            ctx.node = self.scope
            # The trace activated its run (capture installed, run counted as active): a step
            # only switches the current context (no context manager, lock or counter per step).
            self._ctx_token = enter(ctx)

    def finish(self, exc: BaseException | None = None) -> None:
        """End the step: record the exception (if any), duration, calls and tokens."""
        if self.status not in (StepStatus.RUNNING, StepStatus.FAILED, StepStatus.SKIPPED):
            return
        if self.started_at is None:  # skipped before it ever ran
            return
        self.duration_ms = (time.perf_counter() - self._perf) * 1000.0
        self.ended_at = self.started_at + self.duration_ms / 1000.0
        if exc is not None:
            self.status = StepStatus.FAILED
            self.error_type = storable_text(type(exc).__name__)
            self.error_message = storable_text(str(exc)[:MAX_ERROR_CHARS])
            if self.trace is not None:
                self.trace._look_for_source_again()
        elif self.status == StepStatus.RUNNING:
            self.status = StepStatus.SUCCESS
        try:
            self._collect()
        except Exception:  # telemetry must never break the chain
            logger.exception("collecting step %r failed", self.name)
        finally:
            if self._ctx_token is not None:
                try:
                    leave(self._ctx_token)
                except ValueError:  # finished in another context than it started in
                    if self.trace is not None:
                        enter(self.trace.run_context)
                self._ctx_token = None
            if self._token is not None:
                try:
                    _STEP.reset(self._token)
                except ValueError:  # finished in another context than it started in
                    _STEP.set(None)
                self._token = None
            self._release()
        if self.trace is not None and (self.trace.callbacks.step_end or self.trace.stop_after):
            data = self.data()
            for fn in self.trace.callbacks.step_end:
                self.trace._notify(fn, step=data, trace_id=self.trace.trace_id)
            reason = self.trace.stop_after(data) if self.trace.stop_after else None
            if reason:
                raise StoppedAtDivergence(
                    reason, "the replay stopped as asked (switch: stop at the first divergence)"
                )

    def _release(self) -> None:
        """Keep of the finished step's scope only what :meth:`data` reads (the same objects, so
        a call a straggling worker thread still adds is seen as before), and drop the parsed
        answer: a trace holds every step until it ends, and the fewer objects each keeps, the
        fewer the garbage collector walks (its full collections were about a third of a cached
        replay's time)."""
        scope = self.scope
        if scope is not None:
            self._params, self._calls = scope.params, scope.calls
            self._pending, self._effects = scope.pending, scope.effects
            self.scope = None
        self._response = None

    def _collect(self) -> None:
        self._snapshot = jsonable(self.output)
        scope = self.scope
        if scope is not None and scope.calls:
            self.prompt_tokens, self.completion_tokens = scope.tokens
            self._llm_attributes(scope)
        elif self._manual_tokens is not None:
            self.prompt_tokens, self.completion_tokens = self._manual_tokens
        if scope is not None and self.trace is not None:
            self.trace.run_context.remember(scope)

    def _llm_attributes(self, scope: NodeScope) -> None:
        ctx = self.trace.run_context if self.trace is not None else None
        usage = [0, 0]
        last_finish: str | None = None
        for call in scope.calls:
            if call.kind != "llm" or not call.result_hash or call.outcome == "failed":
                continue
            self.attributes.setdefault("model", call.name)
            raw = _result_bytes(ctx, scope, call.key, call.result_hash)
            if raw is None:
                continue
            if self._response is not None and self._response.raw is raw:
                response = self._response  # the answer set as the output: parsed already
            else:
                try:
                    response = ChatResponse.from_raw(raw)
                except Exception:
                    continue
            usage[0] += response.prompt_tokens
            usage[1] += response.completion_tokens
            last_finish = response.finish_reason
        if last_finish is not None:
            self.attributes.setdefault("finish_reason", last_finish)
        if usage != [0, 0]:
            self.attributes.setdefault(
                "usage", {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
            )

    # -- what the chain tells the step -----------------------------------------------------
    def set_output(self, value: Any) -> None:
        """Set the step's output (a decorated step's return value is set automatically)."""
        if isinstance(value, ChatResponse):
            self._from_response(value)
            self._response = value
            value = value.content
        self.output = value

    def set(self, **attributes: Any) -> None:
        """Add attributes: ``model``, ``finish_reason``, ``scores``, ``tool``, ``context_window``…
        (JSON-like values)."""
        self.attributes.update(attributes)

    def set_tokens(self, prompt: int = 0, completion: int = 0) -> None:
        """Tokens of an LLM call made outside Rewind's client (calls through
        :func:`rewind.calls.chat` count themselves)."""
        self._manual_tokens = (int(prompt), int(completion))

    def fail(self, message: str, error_type: str = "StepFailed") -> None:
        """Mark the step failed without raising (e.g. a validation that rejects its input)."""
        self.status = StepStatus.FAILED
        self.error_type = storable_text(error_type)
        self.error_message = storable_text(message[:MAX_ERROR_CHARS])

    def skip(self, reason: str | None = None) -> None:
        """Mark the step skipped (before or while it runs)."""
        self.status = StepStatus.SKIPPED
        if reason:
            self.attributes["skip_reason"] = reason

    def _from_response(self, response: ChatResponse) -> None:
        model = response.data.get("model") if isinstance(response.data, dict) else None
        if isinstance(model, str) and model:
            self.attributes.setdefault("model", model)
        if response.finish_reason:
            self.attributes.setdefault("finish_reason", response.finish_reason)

    def data(self) -> StepData:
        """The step as the store writes it, its inputs and output copies of its own (changing
        the data changes neither the step nor what is stored)."""
        return self._data(copy=True)

    def _data(self, *, copy: bool = False) -> StepData:
        """:meth:`data`; ``copy`` False: its inputs and output are the step's own objects (a
        trace's exit, which hands the data to its writer alone, makes no copy)."""
        status = str(self.status)
        scope = self.scope
        params = scope.params if scope is not None else self._params
        calls = scope.calls if scope is not None else self._calls
        pending = scope.pending if scope is not None else self._pending
        effects = scope.effects if scope is not None else self._effects
        duration = self.duration_ms
        snapshot = self._snapshot
        inputs = self.inputs
        if copy:
            # What a caller does to the data (Trace.data(), a step_end callback) must not
            # change the inputs and output the step is stored with.
            if type(snapshot) is dict or type(snapshot) is list:
                snapshot = jsonable(snapshot)
            if type(inputs) is dict or type(inputs) is list:
                inputs = jsonable(inputs)
        if self.status == StepStatus.RUNNING:  # still running when the trace ended
            duration = (time.perf_counter() - self._perf) * 1000.0
        # Every field set as StepData(...) with these keywords sets it, without the generated
        # __init__ (a trace builds one per step when it ends; tests check the field names).
        out = object.__new__(StepData)
        out.__dict__.update(
            position=self.position,
            name=self.name,
            step_type=self.step_type,
            status=status,
            inputs=inputs,
            reads={},
            params=jsonable(params) if params else {},
            fields={self.name: snapshot} if status == StepStatus.SUCCESS else None,
            error_type=self.error_type,
            error_message=self.error_message,
            parent_position=self.parent_position,
            span_id=self.span_id,
            started_at=self.started_at,
            ended_at=self.ended_at,
            duration_ms=duration,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            attributes=jsonable(self.attributes),
            calls=list(calls) if calls is not None else [],
            pending=list(pending.values()) if pending is not None else [],
            effects=list(effects) if effects is not None else [],
            cache_outcome=None,
            cache_reason=None,
            determinism=None,
        )
        return out


def _raised_out_of_a_call(rows: SourceRows) -> bool:
    """Whether the trace ``rows`` were read from failed with a model-call failure
    (:func:`rewind.call.raised_out_of_a_call`: its root span's error, a
    :data:`rewind.call.CALL_FAILURES` or an SDK's error after a failed call): it failed
    because its endpoint did, and a cached replay (``read_cache=True``, its source found by
    its first call) sends every model call that raised in it again, answered or not after (a
    ``finally`` that asked the model); replaying them would keep the cached chain failing
    after the endpoint answers again (an explicit ``Tracer.replay``/``replay-trace`` still
    replays them). A trace that
    failed otherwise (the chain's own error, after it recovered from a dropped request) keeps
    its recovered failures as its recorded path (:func:`_recovered_failures`), as a completed
    one does: its unchanged cached replay sends nothing."""
    root = rows.spans.get(-1)
    return (
        root is not None
        and root.get("status") == StepStatus.FAILED.value
        and raised_out_of_a_call(root.get("error_type"), bool(rows.failed_calls))
    )


def _recovered_failures(rows: SourceRows) -> dict[tuple[int, str], LineageEntry]:
    """The model-call failures of ``rows`` (``(position, cache key)`` → entry) that a cached
    replay raises again: those the source got a model answer after (:func:`_answered_after`),
    so the chain recovered and the failure is part of its recorded path. A failure after the
    source's last answer is sent again: the endpoint did not answer again in that trace (down,
    refusing, rate-limiting), and replaying it would keep a chain that catches such errors (a
    fallback answer) returning its fallback at every cached run after the endpoint came back."""
    failed = rows.failed_calls
    if not failed:  # the usual source: no second pass over its calls
        return failed
    answered = sorted(
        (
            (position, c["call_index"], c["produced_at"])
            for position, calls in rows.calls.items()
            for c in calls
            if c["kind"] == "llm" and c["outcome"] not in NOT_ANSWERS
        ),
        key=lambda a: a[:2],
        reverse=True,  # by place, the last first: those at or after a failure's step lead
    )
    parents = {position: span.get("parent_position") for position, span in rows.spans.items()}
    # The newest answer settles most failures at once (one pass, not one per failure).
    latest = max((a[2] for a in answered if a[2] is not None), default=None)
    return {
        where: entry
        for where, entry in failed.items()
        if (latest is not None and entry.produced_at is not None and latest > entry.produced_at)
        or any(
            _answered_after(entry, a, parents)
            for a in takewhile(lambda a, step=entry.position: a[0] >= step, answered)
        )
    }


def _answered_after(
    failure: LineageEntry, answer: tuple[int, int, float | None], parents: dict[int, int | None]
) -> bool:
    """Whether the answered call ``answer`` (step position, call index, produced_at) of a trace
    was surely made after its failed call ``failure`` (``parents``: step position → its
    parent's). An answer produced after the failure was recorded is (a cached answer is served
    after it was produced). Else by place: positions number steps as they are created (a child
    after its parent), so a later call of the same step is after it, and so is a call of a step
    created later and not inside the failure's step (that step had ended). A call of a step
    inside it may have come before the step's own failed call, one of a step created before it
    too (an earlier step, or its parent before the child ran): neither counts, and the failure
    is sent again rather than replayed at every cached run after the endpoint came back."""
    position, call_index, produced_at = answer
    recorded = failure.produced_at
    if produced_at is not None and recorded is not None and produced_at > recorded:
        return True
    step = failure.position
    if position == step:
        return call_index > failure.call_index
    if position < step:
        return False
    while position is not None and position > step:
        position = parents.get(position)
    return position != step


def _result_bytes(ctx: RunContext | None, scope: NodeScope, key: str, digest: str) -> bytes | None:
    pending = scope.pending.get(key)
    if pending is not None and pending.result_hash == digest:
        return pending.result_bytes
    if ctx is None:
        return None
    recent = ctx.recent.get(key)
    if recent is not None and recent.result_hash == digest:
        return recent.result_bytes
    if digest in ctx.lineage_blobs:
        return ctx.lineage_blobs[digest]
    try:
        return ctx.store.get_blob(digest)
    except Exception:
        return None


class _StepSpec:
    """What :func:`step` returns: a context manager and a decorator at once."""

    def __init__(
        self,
        name: str | None,
        step_type: str | StepType,
        input: Any,
        attributes: dict[str, Any],
        has_input: bool,
    ) -> None:
        self.name = name
        self.step_type = step_type_of(step_type)
        self.input = input
        self.has_input = has_input
        self.attributes = attributes
        self._active: list[Step] = []

    def open(self, name: str, inputs: dict[str, Any]) -> Step:
        trace = _TRACE.get()
        if trace is not None:
            return trace.step(name, self.step_type, inputs=inputs, **self.attributes)
        return Step(None, name, self.step_type, inputs, self.attributes, 0, ROOT_POSITION)

    def __enter__(self) -> Step:
        inputs = as_fields(self.input) if self.has_input else {}
        s = self.open(self.name or self.step_type, inputs)
        s.start()
        self._active.append(s)
        return s

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._active.pop().finish(exc)

    def __call__(self, fn: F) -> F:
        name = self.name or fn.__name__
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                s = self.open(name, bound_input(fn, args, kwargs))
                with s:
                    out = await fn(*args, **kwargs)
                    s.set_output(out)
                    return out

            return awrapper  # type: ignore[return-value]

        lane_tool = isinstance(fn, Tool) and not self.attributes

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if lane_tool:
                trace = _TRACE.get()
                if trace is not None and not trace._lane_off:
                    served = _lane.serve_tool(trace, name, self.step_type, fn, args, kwargs)
                    if served is not _lane.NOT_SERVED:
                        return served
            s = self.open(name, bound_input(fn, args, kwargs))
            with s:
                out = fn(*args, **kwargs)
                s.set_output(out)
                return out

        return wrapper  # type: ignore[return-value]


_NO_INPUT = object()


def step(
    name: str | None = None,
    type: str | StepType = StepType.TRANSFORM,
    *,
    input: Any = _NO_INPUT,
    **attributes: Any,
) -> Any:
    """A traced step, as a context manager or a decorator.

    ``with step("parse", "parse", input=text) as s: ... s.set_output(value)`` or
    ``@step("retrieve", "retrieval")`` on a function (sync or async): its bound arguments are the
    input and its return value the output. Outside a trace the step records nothing.

    Args:
        name: the step's name (default: the function's name, or the type).
        type: one of ``llm_call``, ``retrieval``, ``tool_call``, ``transform``, ``parse``,
            ``validate``.
        input: the step's input (context-manager use); a dict is kept as is, any other value as
            ``{"input": value}``.
        **attributes: attributes to record (``model``, ``tool``…).
    Raises:
        ValueError: an unknown step type.
    """
    has_input = input is not _NO_INPUT
    return _StepSpec(name, type, input if has_input else None, attributes, has_input)


def bound_input(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """A call's arguments by parameter name (defaults applied; ``self``/``cls`` dropped), as
    JSON."""
    try:
        try:
            signature, names = _signature(fn)
        except TypeError:  # an unhashable callable object: not cached
            signature, names = inspect.signature(fn), None
        if names is not None and not kwargs and len(args) == len(names):
            arguments = dict(zip(names, args, strict=True))  # what bind + apply_defaults give
        else:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
        values = {k: v for k, v in arguments.items() if k not in ("self", "cls")}
    except (TypeError, ValueError):
        values = {"args": list(args), "kwargs": kwargs}
    return jsonable(values)


@functools.lru_cache(maxsize=4096)
def _signature(fn: Callable[..., Any]) -> tuple[inspect.Signature, tuple[str, ...] | None]:
    """``inspect.signature(fn)`` and its positional names (:func:`rewind.tools.positional_names`),
    computed once per function (they cost more than the bind)."""
    from rewind.tools import positional_names

    signature = inspect.signature(fn)
    return signature, positional_names(signature)


def chat_step(name: str, messages: list[dict[str, Any]], **params: Any) -> ChatResponse:
    """An ``llm_call`` step around one :func:`rewind.calls.chat` call: the request is the input,
    the answer's text the output; model, finish_reason and tokens are recorded."""
    request = {"messages": messages, **params}
    trace = _TRACE.get()
    if trace is not None and not trace._lane_off:
        served = _lane.serve_chat(trace, name, request)
        if served is not None:
            return served
    from rewind.calls import chat, chat_plain

    # A plain request (the common case) is copied once, as the step's input, and keyed from
    # that copy; any other goes through as_fields and chat().
    plain = plain_fields(request)
    s = _open_step(
        name, StepType.LLM_CALL.value, plain if plain is not None else as_fields(request)
    )
    with s:
        if plain is not None:
            response = chat_plain(plain, messages, params)
        else:
            response = chat(messages, **params)
        s.set_output(response)
        return response


def _open_step(name: str, step_type: str, inputs: dict[str, Any]) -> Step:
    """A new (pending) step of the current trace, or an unrecorded one outside any trace."""
    trace = _TRACE.get()
    if trace is not None:
        return trace.step(name, step_type, inputs=inputs)
    return Step(None, name, step_type, inputs, {}, 0, ROOT_POSITION)


# -- traces ------------------------------------------------------------------------------------


class StoppedAtDivergence(RewindError):
    """Raised at the end of a replayed step that diverged from the recorded one when the replay
    was asked to stop at the first divergence (:attr:`Trace.stop_after`); the replay is written
    with this as its failure, so it shows where it stopped."""


@dataclasses.dataclass
class TraceCallbacks:
    """Functions called as steps and chains end (see :meth:`Tracer.on_step_end`)."""

    step_end: list[Callable[..., Any]] = dataclasses.field(default_factory=list)
    chain_end: list[Callable[..., Any]] = dataclasses.field(default_factory=list)


class Trace:
    """One execution of a chain. Use as a context manager (``with tracer.trace(...) as t``).

    Attributes:
        trace_id: 32 hex characters; also the run id in the store.
        record: the stored run after the trace ended (None before, or if writing failed).
        write_error: why writing failed, if it did.

    Raises:
        ValueError: a name that is not 1 to 200 characters without NUL (UTF-8), or a
            ``trace_id`` given that is not a string of 1 to :data:`MAX_TRACE_ID_CHARS`
            characters without NUL, in UTF-8.
    """

    def __init__(
        self,
        name: str,
        *,
        input: Any = None,
        store: Callable[[], Store],
        run_context: RunContext | None = None,
        chat_client: Any = None,
        read_cache: bool = False,
        clock: Callable[[], float] = time.time,
        trace_id: str | None = None,
        chain_ref: str | None = None,
        attributes: dict[str, Any] | None = None,
        parent_run_id: str | None = None,
        override: dict[str, Any] | None = None,
        raise_on_write_error: bool = False,
        config: dict[str, Any] | None = None,
        callbacks: TraceCallbacks | None = None,
    ) -> None:
        if not storable_name(name):
            # PostgreSQL refuses NUL and longer names at the write, no backend a lone surrogate:
            # refused before the chain runs, not after it paid for its calls.
            raise ValueError(f"a trace needs a name {NAME_RULE}, not {name!r:.80}")
        if trace_id is not None and not _storable_id(trace_id):
            # SQLite would store it and PostgreSQL refuse it (varchar(64), no NUL): the same
            # trace must not be kept on one backend and lost on the other. One that is not
            # UTF-8 (a lone surrogate) neither keeps: refused before the chain runs.
            raise ValueError(
                f"a trace id is a string of 1 to {MAX_TRACE_ID_CHARS} characters without NUL "
                f"(UTF-8), not {trace_id!r:.80}; pass None for a new one"
            )
        self.config = dict(config or {})
        self.callbacks = callbacks or TraceCallbacks()
        self.callback_errors: list[str] = []
        self.stop_after: Callable[[StepData], str | None] | None = None
        self.name = name
        self.trace_id = new_trace_id() if trace_id is None else trace_id
        self.span_id = new_span_id()
        self.input = as_fields(input) if input is not None else {}
        self._input_from_source = False  # set by Tracer.replay when it defaulted the input
        self._body_started = False  # a chain call began as this in-place replay's body
        self._replays_chain: str | None = None  # set by Tracer.replay: the source's name
        self.attributes = dict(attributes or {})
        self.chain_ref = chain_ref
        self.parent_run_id = parent_run_id
        self.override = override
        self.clock = clock
        self.output: Any = None
        self.status = StepStatus.PENDING
        self.error_type: str | None = None
        self.error_message: str | None = None
        self.started_at = 0.0
        self.ended_at: float | None = None
        self.duration_ms = 0.0
        self.record: RunRecord | None = None
        self.write_error: str | None = None
        self.raise_on_write_error = raise_on_write_error
        self._store = store
        self._ctx = run_context
        self._chat_client = chat_client
        self._read_cache = read_cache
        # (and the lane's records of steps it served, made Steps when read: see self.steps)
        self._steps: list[Step | _lane.Served] = []
        self._lock = threading.Lock()
        self._perf = 0.0
        self._tokens: list[contextvars.Token[Any]] = []
        self._stack: ExitStack | None = None
        self._source: SourceRows | None = None
        self._source_missed = False  # a cached trace's first lookup found no source
        # The lane (rewind.tracing.lane): set up at the first step, off for good from the
        # first step that takes the full path.
        self._lane: Any = None
        self._lane_off = not read_cache

    @property
    def run_context(self) -> RunContext:
        """The run context the trace's LLM calls use (created when the trace starts)."""
        if self._ctx is None:
            self._ctx = RunContext(
                store=self._store(),
                run_id=self.trace_id,
                read_cache=self._read_cache,
                chat_client=self._chat_client,
                # The trace's clock, as its start time: a call's produced_at (its cache entry's
                # time) is compared with traces' start times to find who recorded it.
                clock=self.clock,
            )
            if self._read_cache and self.parent_run_id is None:
                self._ctx.find_source = self._find_source
        return self._ctx

    def _find_source(self, kind: str, key: str) -> dict[tuple[str, str], Any] | None:
        """At the first cache lookup of a cached trace: link the trace to the recorded trace
        that made this call and read that trace's cache entries and results ahead (see
        :mod:`rewind.tracing.tracer_source`). Returns the entries read (None: no source)."""
        from rewind.tracing.store import initial_state_hash
        from rewind.tracing.tracer_source import find_source, lineage_at

        ctx = self.run_context  # steps run in copies of it: they see what is set here
        with self._lock:
            if ctx.find_source is None:
                return ctx.prefetched
            ctx.find_source = None
            try:
                found = find_source(ctx.store, self.name, kind, key, initial_state_hash(self.input))
            except Exception:  # reading ahead is an optimisation: lookups use the store
                logger.exception("finding the source of trace %s failed", self.trace_id)
                return None
            if found is None or self.parent_run_id is not None:
                self._source_missed = found is None and self.parent_run_id is None
                return None
            self.parent_run_id = found.rows.run_id
            self._source = found.rows
            ctx.lineage_blobs.update(found.blobs)
            # Lineage first (DESIGN rule 5): a call the source made at the same position is
            # served as the source recorded it, so a deterministic tool it ran twice keeps
            # each run's time and an unchanged replay stays stored by reference.
            ctx.lineage_at.update(lineage_at(found))
            ctx.failed_at.update(found.rows.failed_steps)  # in place: steps hold copies
            if not _raised_out_of_a_call(found.rows):
                # A trace that raised out of a model call is linked, but the model calls that
                # raised in it are sent again (miss:source-failed): replaying them would keep a
                # chain whose endpoint was down at its recording failing after the endpoint
                # came back; so are those after the source's last answer (its endpoint never
                # recovered).
                ctx.failed_calls.update(_recovered_failures(found.rows))
            ctx.prefetched = found.entries
            return found.entries

    def _look_for_source_again(self) -> None:
        """After a step raised: when the first lookup found no source, the next looks again.
        The call it looked up may be the one that raised, which the source never recorded (a
        raising call leaves no call row): a replay of a trace whose first call failed was
        never linked to it, and stored in full."""
        with self._lock:
            if self._source_missed and self.parent_run_id is None and self._ctx is not None:
                self._source_missed = False
                self._ctx.find_source = self._find_source

    @property
    def steps(self) -> list[Step]:
        """The steps created so far, by position."""
        with self._lock:
            return _lane.steps_of(self)

    def __enter__(self) -> Trace:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.finish(exc)

    def start(self) -> None:
        """Make this the current trace and start its clock."""
        self.status = StepStatus.RUNNING
        self.started_at = self.clock()
        self._perf = time.perf_counter()
        ctx = self.run_context
        ctx.outside_node = self._outside_step
        if ctx.served is None:
            ctx.served = {}
        self._tokens = [_TRACE.set(self), _STEP.set(None)]
        self._stack = ExitStack()
        self._stack.enter_context(activate(ctx))

    def finish(self, exc: BaseException | None = None) -> RunRecord | None:
        """End the trace, record the exception (if any) and write it to the store.

        A Ctrl-C or SIGTERM arriving meanwhile is held until the trace is written, then raised
        (:func:`rewind.interrupts.held_interrupts`): raised inside the write, it rolled the
        write back and the trace was lost."""
        with held_interrupts():
            return self._finish(exc)

    def _finish(self, exc: BaseException | None) -> RunRecord | None:
        """:meth:`finish` with interrupts held."""
        self.duration_ms = (time.perf_counter() - self._perf) * 1000.0
        self.ended_at = self.started_at + self.duration_ms / 1000.0
        if exc is not None:
            self.status = StepStatus.FAILED
            self.error_type = storable_text(type(exc).__name__)
            self.error_message = storable_text(str(exc)[:MAX_ERROR_CHARS])
        elif self.status == StepStatus.RUNNING:
            self.status = StepStatus.SUCCESS
        if self._stack is not None:
            self._stack.close()
            self._stack = None
        for token in reversed(self._tokens):
            try:
                token.var.reset(token)
            except ValueError:
                token.var.set(None)
        self._tokens = []
        # (a chain_end callback gets the steps built the full way, as it always did)
        data, signed = self._data(lane=not self.callbacks.chain_end)
        try:
            try:
                self.record = write_trace(
                    self.run_context.store, data, source=self._source, signed=signed
                )
            except ParentMissing:
                if data.parent_run_id is None:
                    raise
                data = self._unlinked(data)
                self.record = write_trace(self.run_context.store, data)
        except Exception as exc_write:
            self.write_error = f"{type(exc_write).__name__}: {exc_write}"
            logger.error("writing trace %s failed: %s", self.trace_id, self.write_error)
            if self.raise_on_write_error:
                raise
        finally:
            # The calls this trace executed shared their results with concurrent replays
            # (rewind.cache's single flight) until their cache rows were committed: now.
            release_flights(self.run_context.store, (c.key for s in data.steps for c in s.calls))
            for fn in self.callbacks.chain_end:
                self._notify(fn, trace=data, record=self.record)
        return self.record

    def _unlinked(self, data: TraceData) -> TraceData:
        """The trace written again when the source it replays left the store while it ran
        (archived by ``rewind gc`` or deleted): no parent, every row in full, the result bytes
        of its calls included (the source's blobs may have gone with it), and
        ``config["source_missing"]`` naming the source. Losing the trace would lose the run
        the user just made."""
        source = data.parent_run_id
        logger.warning(
            "trace %s replays %s, which left the store while it ran (archived or deleted): "
            "stored without a parent, every row in full",
            self.trace_id,
            source,
        )
        self.parent_run_id = None
        self._source = None
        # The request and result bytes of the calls served from the cache: the source's rows
        # were their only references, and gc may have swept them with it.
        blobs = dict(self.run_context.lineage_blobs)
        for request, result in (self.run_context.served or {}).values():
            blobs[sha256_hex(request)] = request
            blobs[sha256_hex(result)] = result
        results = {
            h: blobs[h]
            for s in data.steps
            for c in s.calls
            for h in (c.request_hash, c.result_hash)
            if h and h in blobs
        }
        return dataclasses.replace(
            data,
            parent_run_id=None,
            fork_node=None,
            fork_position=None,
            config=data.config | {"source_missing": source},
            extra_blobs=results,
        )

    def _outside_step(self, kind: str, name: str, request: bytes) -> Step:
        """The step a call made in the chain's body, outside any step, runs in (see
        :attr:`rewind.context.RunContext.outside_node`): a ``tool_call`` or ``llm_call`` step
        named after the tool or model, whose input is the call's request."""
        try:
            inputs = as_fields(json.loads(request))
        except ValueError:
            inputs = {}
        step_type = StepType.TOOL_CALL if kind == "tool" else StepType.LLM_CALL
        return self.step(name or kind, step_type, inputs=inputs)

    def _notify(self, fn: Callable[..., Any], **kwargs: Any) -> None:
        """Call a callback; what it raises is logged and kept, never raised into the chain."""
        try:
            fn(**kwargs)
        except Exception as exc:  # a callback must never break the traced chain
            text = f"{getattr(fn, '__name__', fn)!s}: {type(exc).__name__}: {exc}"
            self.callback_errors.append(text[:MAX_ERROR_CHARS])
            logger.warning("trace callback failed (%s)", text)

    def data(self) -> TraceData:
        """The trace as the store writes it, each step's inputs and output copies of its own
        (:meth:`Step.data`)."""
        return self._data(lane=False, copy=True)[0]

    def _data(self, *, lane: bool, copy: bool = False) -> tuple[TraceData, dict[int, bytes]]:
        """The trace as the store writes it, and ``id(step data)`` -> signature of the steps
        served in the lane (``lane``: rebuilt from what they were served as, which the writer
        need not sign again, see :func:`rewind.tracing.lane.steps_data`). ``copy``: the
        steps' data made by :meth:`Step.data` (copies), else by ``Step._data`` (the steps'
        own inputs and outputs, as written: a copy is :func:`jsonable`, which turns a value
        the hashes refuse into a marker the write would then store)."""
        config: dict[str, Any] = {"source": "tracer", **self.config}
        if self.chain_ref:
            config["chain_ref"] = self.chain_ref
        if lane:
            with self._lock:  # the steps served in the lane and not read since: as records
                held = list(self._steps)
            steps, signed = _lane.steps_data(held)
        else:
            steps = [s.data() if copy else s._data() for s in self.steps]
            signed = {}
        trace = TraceData(
            trace_id=self.trace_id,
            name=self.name,
            status=str(self.status),
            input=self.input,
            output=jsonable(self.output),
            error_type=self.error_type,
            error_message=self.error_message,
            span_id=self.span_id,
            started_at=self.started_at,
            ended_at=self.ended_at,
            duration_ms=self.duration_ms,
            attributes=jsonable(self.attributes),
            config=config,
            parent_run_id=self.parent_run_id,
            fork_node=steps[0].name if self.parent_run_id and steps else None,
            fork_position=0 if self.parent_run_id else None,
            override=self.override,
            steps=steps,
        )
        return trace, signed

    # -- steps -----------------------------------------------------------------------------
    def step(
        self,
        name: str,
        type: str | StepType = StepType.TRANSFORM,
        *,
        input: Any = _NO_INPUT,
        inputs: dict[str, Any] | None = None,
        **attributes: Any,
    ) -> Step:
        """Create a step of this trace (``pending``; enter it with ``with``). Its parent is the
        step current in this context, if that step belongs to this trace.

        Raises:
            ValueError: a name that is not 1 to 200 characters without NUL (UTF-8).
        """
        if not storable_name(name):
            raise ValueError(f"a step needs a name {NAME_RULE}, not {name!r:.80}")
        if inputs is None:
            inputs = as_fields(input) if input is not _NO_INPUT else {}
        parent = _STEP.get()
        parent_position = (
            parent.position if parent is not None and parent.trace is self else ROOT_POSITION
        )
        with self._lock:
            self._lane_off = True  # a step on the full path: the lane ends here
            s = Step(
                self,
                name,
                step_type_of(type),
                inputs,
                attributes,
                len(self._steps),
                parent_position,
            )
            self._steps.append(s)
        return s

    def skip(
        self,
        name: str,
        type: str | StepType = StepType.TRANSFORM,
        *,
        reason: str | None = None,
        input: Any = _NO_INPUT,
    ) -> Step:
        """Record a step the chain decided not to run (status ``skipped``)."""
        s = self.step(name, type, input=input)
        s.skip(reason)
        return s

    def set_output(self, value: Any) -> None:
        """Set the chain's output (a decorated chain's return value is set automatically)."""
        self.output = value.content if isinstance(value, ChatResponse) else value

    def set(self, **attributes: Any) -> None:
        """Add attributes to the trace (the root span)."""
        self.attributes.update(attributes)

    def fail(self, message: str, error_type: str = "ChainFailed") -> None:
        """Mark the trace failed without raising."""
        self.status = StepStatus.FAILED
        self.error_type = storable_text(error_type)
        self.error_message = storable_text(message[:MAX_ERROR_CHARS])


# -- the tracer --------------------------------------------------------------------------------


class Tracer:
    """Creates traces in one store.

    Args:
        store: a :class:`Store`, a location for :func:`open_store`, or None for ``REWIND_STORE``
            (default ``.rewind``); opened on the first trace, not at construction, so a module
            can create its tracer at import time.
        chat_client: the model client :func:`rewind.calls.chat` uses inside traced steps.
        read_cache: serve LLM calls from the cache while tracing (default False: calls run live
            and their answers are recorded, reason ``bypass``, as when recording a Burr run).
            A model call that raised in the replayed trace (the endpoint dropped, timed out or
            refused it: a ``failed`` call row) and that the trace got a model answer after
            (the chain caught it and went on) raises that recorded error again, sending
            nothing, even when the endpoint would answer now: the failure is the recorded
            behaviour. One after the source's last answer, or in a source that raised out of
            it, is sent again. To try it live, trace without ``read_cache``.
        clock: unix seconds now (injectable for tests).
        raise_on_write_error: raise when a trace cannot be written (default: log it).
        on_step_end, on_chain_end: callbacks (see :meth:`on_step_end`, :meth:`on_chain_end`).
    """

    def __init__(
        self,
        store: Store | str | Path | None = None,
        *,
        chat_client: Any = None,
        read_cache: bool = False,
        clock: Callable[[], float] = time.time,
        raise_on_write_error: bool = False,
        on_step_end: Callable[..., Any] | None = None,
        on_chain_end: Callable[..., Any] | None = None,
    ) -> None:
        self.callbacks = TraceCallbacks()
        if on_step_end is not None:
            self.on_step_end(on_step_end)
        if on_chain_end is not None:
            self.on_chain_end(on_chain_end)
        self._store = store if isinstance(store, Store) else None
        self._location = None if isinstance(store, Store) else store
        self._lock = threading.Lock()
        self.chat_client = chat_client
        self.read_cache = read_cache
        self.clock = clock
        self.raise_on_write_error = raise_on_write_error

    @property
    def store(self) -> Store:
        """The store (opened on first use)."""
        with self._lock:
            if self._store is None:
                location = self._location or os.environ.get("REWIND_STORE") or ".rewind"
                self._store = open_store(location)
            return self._store

    def configure(
        self,
        *,
        store: Store | str | Path | None = None,
        chat_client: Any = None,
        read_cache: bool | None = None,
    ) -> Tracer:
        """Point a tracer created at import time at a store and a model client (at start-up,
        or per test). Arguments left None keep their value. Returns the tracer."""
        with self._lock:
            if store is not None:
                self._store = store if isinstance(store, Store) else None
                self._location = None if isinstance(store, Store) else store
        if chat_client is not None:
            self.chat_client = chat_client
        if read_cache is not None:
            self.read_cache = read_cache
        return self

    def on_step_end(self, fn: F) -> F:
        """Register ``fn(*, step: StepData, trace_id: str, **future_kwargs)``, called when any
        step of this tracer's traces ends (success, failure or skip), in the thread that ended
        it. Usable as a decorator. What ``fn`` raises is logged and kept on
        :attr:`Trace.callback_errors`; it never breaks the traced chain (seed 003: callbacks
        observe, they do not steer)."""
        self.callbacks.step_end.append(fn)
        return fn

    def on_chain_end(self, fn: F) -> F:
        """Register ``fn(*, trace: TraceData, record: RunRecord | None, **future_kwargs)``,
        called when a trace ends, after it was written (``record`` is None when writing failed).
        Usable as a decorator; exceptions are kept, never raised (as :meth:`on_step_end`)."""
        self.callbacks.chain_end.append(fn)
        return fn

    def close(self) -> None:
        """Close the store if this tracer opened it."""
        if self._store is not None and self._location is not None:
            self._store.close()
            self._store = None

    def trace(
        self,
        name: str,
        input: Any = None,
        *,
        trace_id: str | None = None,
        chain_ref: str | None = None,
        **attributes: Any,
    ) -> Trace:
        """A new trace (use it with ``with``): ``input`` is the chain's input (a dict of fields,
        or any value, kept as ``{"input": value}``)."""
        return Trace(
            name,
            input=input,
            store=lambda: self.store,
            chat_client=self.chat_client,
            read_cache=self.read_cache,
            clock=self.clock,
            trace_id=trace_id,
            chain_ref=chain_ref,
            attributes=attributes,
            raise_on_write_error=self.raise_on_write_error,
            callbacks=self.callbacks,
        )

    def replay(
        self,
        source: str,
        *,
        name: str | None = None,
        input: Any = SOURCE_INPUT,
        switches: Any = None,
        trace_id: str | None = None,
    ) -> Trace:
        """A trace that replays the recorded trace ``source`` in place, around the caller's own
        code: ``with tracer.replay(trace_id): run_the_same_code()``. Calls are served from
        ``source``'s recorded calls first (loaded once, in memory), then from the cache; the
        replay is written as a child of ``source``. See
        :func:`rewind.tracing.replay.replay_in_place` (arguments, errors)."""
        from rewind.tracing.replay import replay_in_place

        return replay_in_place(
            self, source, name=name, input=input, switches=switches, trace_id=trace_id
        )

    def chain(self, name: str | None = None, **attributes: Any) -> Callable[[F], F]:
        """Decorate a chain function (sync or async): each call is one trace whose input is the
        call's bound arguments and output its return value. Called inside another trace, it is a
        ``transform`` step of that trace instead, except as the body of an in-place replay of
        this chain (``with tracer.replay(trace_id): chain(...)``, its first call, made before
        any step): it then runs as that trace, its return value the trace's output and its
        bound arguments the trace's input unless :meth:`replay` was given one. A chain defined
        at module level can be replayed (``rewind replay-trace``)."""

        def decorate(fn: F) -> F:
            chain_name = name or fn.__name__
            ref = chain_ref_of(fn)
            if inspect.iscoroutinefunction(fn):

                @functools.wraps(fn)
                async def arun(*args: Any, **kwargs: Any) -> Any:
                    bound = bound_input(fn, args, kwargs)
                    body = _replay_body(chain_name, bound)
                    if body is not None:
                        out = await fn(*args, **kwargs)
                        body.set_output(out)
                        return out
                    if _TRACE.get() is not None:
                        with step(chain_name, StepType.TRANSFORM, input=bound) as s:
                            out = await fn(*args, **kwargs)
                            s.set_output(out)
                            return out
                    with self.trace(chain_name, bound, chain_ref=ref, **attributes) as t:
                        out = await fn(*args, **kwargs)
                        t.set_output(out)
                        return out

                arun.__rewind_chain__ = chain_name  # type: ignore[attr-defined]
                arun.__rewind_tracer__ = self  # type: ignore[attr-defined]
                return arun  # type: ignore[return-value]

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                bound = bound_input(fn, args, kwargs)
                body = _replay_body(chain_name, bound)
                if body is not None:
                    out = fn(*args, **kwargs)
                    body.set_output(out)
                    return out
                if _TRACE.get() is not None:
                    with step(chain_name, StepType.TRANSFORM, input=bound) as s:
                        out = fn(*args, **kwargs)
                        s.set_output(out)
                        return out
                with self.trace(chain_name, bound, chain_ref=ref, **attributes) as t:
                    out = fn(*args, **kwargs)
                    t.set_output(out)
                    return out

            run.__rewind_chain__ = chain_name  # type: ignore[attr-defined]
            run.__rewind_tracer__ = self  # type: ignore[attr-defined]
            return run  # type: ignore[return-value]

        return decorate

    step = staticmethod(step)


def _replay_body(chain_name: str, bound: dict[str, Any]) -> Trace | None:
    """The in-place replay (:meth:`Tracer.replay`) a call of the chain ``chain_name`` is the
    body of: the current trace is an in-place replay of a trace of that name (under its own
    name or another, ``Tracer.replay(..., name=)``), no step is open, none was made and no
    call of the chain began as its body before (a chain calling itself before its first step
    was recorded as a step of its trace, and is replayed as one). Its input becomes
    ``bound`` unless :meth:`Tracer.replay` was given one (the source's recorded input, its
    default, is replaced: the chain's arguments are what ran). None otherwise (the chain call
    is a step, or a trace of its own)."""
    trace = _TRACE.get()
    if trace is None or trace._replays_chain != chain_name or _STEP.get() is not None:
        return None
    if trace.config.get("replay_mode") != IN_PLACE_MODE or trace._steps or trace._body_started:
        return None
    trace._body_started = True
    if not trace.input or trace._input_from_source:
        trace.input = as_fields(bound)
        trace._input_from_source = False
    return trace


def chain_ref_of(fn: Callable[..., Any]) -> str | None:
    """``module:qualname`` that re-imports ``fn``, or None when it cannot be imported (defined
    inside a function, or in ``__main__``)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname:
        return None
    return f"{module}:{qualname}"


from rewind.tracing import lane as _lane  # noqa: E402  (it reads this module's names)
