"""The lane of a cached trace: steps served as a replay before proved them equal to the source.

A trace of ``Tracer(read_cache=True)`` replays the recorded trace its first lookup finds
(:mod:`rewind.tracing.tracer_source`). Once a replay of that source was written, the steps it
proved equal to the source's are remembered in this process (:mod:`rewind.tracing.step_memo`,
with :class:`~rewind.tracing.step_memo.Proven`). A later trace of the same name and input then
runs in a *lane* while each of its steps is, at the same position, the remembered one: a
:func:`rewind.tracing.chat_step` or a ``@step``-wrapped :func:`rewind.tool` (deterministic, no
resources, idempotency argument or ``on_served``) at the top level of the trace, in the thread
that started it, with the same name, type, inputs (as a signature sees them), call key, and the
same answer available from the source (its lineage entry at that position, read ahead). Such a
step is not run through a node scope and the cache: its answer is the bytes the source's call
recorded, and its :class:`~rewind.tracing.tracer.Step` is made finished, with the values the
remembered step had (fresh copies) and its own span id and timing, when something first reads
the trace's steps (until then the trace holds a :class:`Served` record of it). Its data is
therefore what the full path would have produced, and the trace is written by the usual writer
(stored by reference when every step matched).

The first step that is not served this way (anything else: another request, a miss, a step
opened any other way, nesting, another thread, an async step, a user attribute on the step
spec, a step past the remembered ones) runs the full path, and so does every step after it in
that trace (:meth:`~rewind.tracing.tracer.Trace.step` ends the lane). Nothing is served unless
every check passes, so a step either is served exactly as the full path would serve it or is
not touched by the lane at all.

What a step's checks need of values that do not change is made once per process and kept
(bounded): a request's plain text, key and request bytes per request value (told apart with
its exact types by its ``marshal`` bytes), an answer's parsed fields per answer bytes, and a
remembered step's expected call per remembered step. What the step hands out (its input, the
answer's ``data``, its attributes) is read from text again at each step, so no two steps share
a mutable value.
"""

from __future__ import annotations

import dataclasses
import marshal
import threading
import time
from typing import TYPE_CHECKING, Any

import orjson

from rewind.call import DEFAULT_POLICY
from rewind.canonical import canonical_bytes, loads, loads_exactly
from rewind.context import current
from rewind.llm import DEFAULT_TEMPERATURE, ChatResponse, plain_request_key
from rewind.store.records import CallRecord
from rewind.tracing import step_memo
from rewind.tracing.model import (
    ROOT_POSITION,
    StepData,
    StepStatus,
    StepType,
    jsonable,
    plain_fields,
)

if TYPE_CHECKING:
    from rewind.context import RunContext
    from rewind.tools import Tool
    from rewind.tracing.tracer import Step, Trace

__all__ = [
    "NOT_SERVED",
    "Lane",
    "Served",
    "ServedData",
    "serve_chat",
    "serve_tool",
    "step_data",
    "steps_data",
    "steps_of",
]

NOT_SERVED = object()
"""What :func:`serve_tool` returns when the step takes the full path."""

_LLM = StepType.LLM_CALL.value


class Lane:
    """A trace's lane: the steps remembered for its source and initial state, by position."""

    __slots__ = ("proven", "thread")

    def __init__(self, proven: list[step_memo.Proven | None], thread: int) -> None:
        self.proven = proven
        self.thread = thread


def _lane(trace: Trace, kind: str, key: str) -> Lane | None:
    """The trace's lane for a step about to make the call ``(kind, key)``, or None: this step
    takes the full path (and, when the trace cannot have a lane at all, ends it)."""
    ctx = trace._ctx
    lane = trace._lane
    if lane is None:
        if trace._steps or ctx is None:
            trace._lane_off = True
            return None
        lane = _start(trace, ctx, kind, key)
        if lane is None:
            trace._lane_off = True
            return None
        trace._lane = lane
    # Checked at every step (callbacks and stop conditions may be set at any time); what
    # _observed says, without its call.
    callbacks = trace.callbacks
    if (
        threading.get_ident() != lane.thread
        or callbacks.step_end
        or callbacks.chain_end
        or trace.stop_after is not None
        or (_STEP or _step_var()).get() is not None
        or current() is not ctx
    ):
        return None
    return lane


def _observed(trace: Trace) -> bool:
    """Whether step or chain callbacks or a stop condition watch the trace (registered on its
    tracer at any time): their steps take the full path, which calls them."""
    callbacks = trace.callbacks
    return bool(callbacks.step_end or callbacks.chain_end or trace.stop_after is not None)


def _start(trace: Trace, ctx: RunContext, kind: str, key: str) -> Lane | None:
    """Set up the lane at a trace's first step: the trace must be a plain cached trace (no
    callbacks, stop, override, parameter or input overrides) whose source is found and has
    remembered steps for this trace's input."""
    if (
        not trace._read_cache
        or not ctx.read_cache
        or not {"llm", "tool"} <= ctx.cached_kinds
        or _observed(trace)
        or trace.override is not None
        or ctx.param_overrides
        or ctx.input_overrides
        or ctx.recent
    ):
        return None
    finder = ctx.find_source
    if finder is not None:
        # What the first lookup does (rewind.cache._read_source); ctx is the trace's own run
        # context here, whose finder clears it itself.
        ctx.prefetched = finder(kind, key)
    source = trace._source
    if source is None or trace.parent_run_id != source.run_id:
        return None
    from rewind.tracing.store import initial_state_hash

    try:
        init_hash = initial_state_hash(trace.input)
    except Exception:  # an input set later that Rewind cannot store: only the write fails
        return None
    proven = [p for _sig, _changed, p in step_memo.remembered(source, init_hash)]
    if not proven or proven[0] is None:
        return None
    return Lane(proven, threading.get_ident())


_TRACER: Any = None
_STEP: Any = None


def _tracer() -> Any:
    """The module :mod:`rewind.tracing.tracer` (it imports this one: imported at the first
    step served, then kept, instead of an import statement on every step)."""
    global _TRACER
    if _TRACER is None:
        from rewind.tracing import tracer

        _TRACER = tracer
    return _TRACER


def _step_var() -> Any:
    """The tracer's current-step context variable (read once, then kept)."""
    global _STEP
    _STEP = _tracer()._STEP
    return _STEP


_Call = tuple[str, str, str, str, str, str, bytes | None]
"""The call a step is about to make, as the lane checks it against the remembered one:
``(step name, step type, call key, call kind, call name, determinism, inputs text)`` (the
inputs as :func:`step_memo.text_of` writes them, None when they are not plain JSON)."""


_Found = tuple[int, step_memo.Proven, CallRecord, bytes, Any]
"""What :func:`_answer` finds: (position, the remembered step there, its one call, the result
bytes, the remembered output as :func:`_remembered` gives it)."""


def _answer(trace: Trace, c: _Call) -> _Found | None:
    """(position, the remembered step there, its one call, the result bytes, its remembered
    output) when the step about to make the call ``c`` is, at the next position, the
    remembered step and its call, and the source's answer to that call is at hand; else None
    (the full path)."""
    key = c[2]
    lane = _lane(trace, c[3], key)
    ctx = trace._ctx
    if lane is None or ctx is None:
        return None
    p = len(trace._steps)
    remembered = _remembered(lane, p, c)
    if remembered is None or key in ctx.recent:
        return None
    proven, call, output = remembered
    # What rewind.cache._lookup serves first: the source's call at this position.
    entry = ctx.lineage_at.get((p, key))
    if entry is None or entry.result_hash != call.result_hash:
        return None
    data = ctx.lineage_blobs.get(call.result_hash)
    if data is None or entry.produced_at != call.produced_at:
        return None
    return p, proven, call, data, output


def _remembered(lane: Lane, p: int, c: _Call) -> tuple[step_memo.Proven, CallRecord, Any] | None:
    """(the remembered step at position ``p``, its one call, its output when it is a string,
    an int of at most 63 bits, a bool or None, else ``_NOT_SAME``) when they are the step and
    call ``c`` served from the cache (a hit, 0 ms) with ``c``'s inputs, else None."""
    proven = lane.proven[p] if p < len(lane.proven) else None
    if proven is None:
        return None
    held = _EXPECTED.get(id(proven))
    if held is None or held[0] is not proven:
        held = (proven, _expected(proven), _scalar_output(proven))
        if len(_EXPECTED) >= EXPECTED_KEPT:
            _EXPECTED.clear()
        _EXPECTED[id(proven)] = held
    expected = held[1]
    if expected is None or expected != c:
        return None
    return proven, proven.calls[0], held[2]


EXPECTED_KEPT = 4096
"""How many remembered steps' expected calls (:func:`_expected`) this process keeps."""

_EXPECTED: dict[int, tuple[step_memo.Proven, tuple[Any, ...] | None, Any]] = {}


def _scalar_output(proven: step_memo.Proven) -> Any:
    """The remembered step's output, read from its text, when it is a string, an int of at
    most 63 bits, a bool or None (an immutable value, kept per remembered step: what
    :func:`_same_output` takes as is), else ``_NOT_SAME`` (outputs are compared as text)."""
    fields = orjson.loads(proven.fields_text)
    value = fields.get(proven.name, _NOT_SAME) if type(fields) is dict else _NOT_SAME
    t = type(value)
    if t is str or t is bool or value is None or (t is int and -_INT_BOUND < value < _INT_BOUND):
        return value
    return _NOT_SAME


def _expected(proven: step_memo.Proven) -> tuple[Any, ...] | None:
    """What a step must be to be served as ``proven`` (a frozen value: made once per remembered
    step): ``(name, type, call key, call kind, call name, determinism, inputs text)``, or None
    when ``proven`` is not a top-level step of one call served from the cache (a hit, 0 ms)."""
    if proven.parent_position != ROOT_POSITION or len(proven.calls) != 1:
        return None
    call = proven.calls[0]
    hit = (call.call_index, call.outcome, call.reason, call.latency_ms) == (0, "hit", "hit", 0.0)
    if not hit:
        return None
    return (
        proven.name,
        proven.step_type,
        call.key,
        call.kind,
        call.name,
        call.determinism,
        proven.inputs_text,
    )


def serve_chat(trace: Trace, name: str, request: dict[str, Any]) -> ChatResponse | None:
    """:func:`rewind.tracing.chat_step`'s step served in the lane, or None (take the full
    path). ``request``: the step's request as the caller built it (``{"messages": ...,
    **params}``); only a plain one (:func:`~rewind.tracing.model.plain_fields`) is served, and
    the step's input is its plain copy."""
    ctx = trace._ctx
    client = ctx.chat_client if ctx is not None else None
    if client is None:
        return None
    made = _chat_request(request, client.endpoint.model)
    if made is None:
        return None
    inputs_text, key, request_bytes, model, determinism = made
    found = _answer(trace, (name, _LLM, key, "llm", model, determinism, inputs_text))
    if found is None:
        return None
    response = _response(found[3])
    if response is None:
        return None
    # The inputs: the plain copy, read from its text (_chat_request) when the step is read.
    served = _finish(trace, None, inputs_text, request_bytes, found, response.content)
    return response if served else None


MEMO_BYTES = 16 * 1024 * 1024
"""The most bytes (of request and answer texts, keys and values counted) each of the lane's
per-value memos holds; a memo past it, or past :data:`CHAT_CALLS_KEPT` entries, is emptied and
refilled. Without it, 4,096 requests of a 100 KB prompt would keep ~1.6 GB."""


class _Memo:
    """A process memo bounded by entries (:data:`CHAT_CALLS_KEPT`) and by bytes
    (:data:`MEMO_BYTES`): ``get`` as a dict's, ``put(key, value, size)`` with the bytes
    (int) the entry holds. Sizes are added without a lock: two threads putting at once may
    miscount by an entry, never keep more than the bound plus one entry."""

    __slots__ = ("entries", "size")

    def __init__(self) -> None:
        self.entries: dict[Any, Any] = {}
        self.size = 0

    def get(self, key: Any, default: Any = None) -> Any:
        """The value kept for ``key``, else ``default``."""
        return self.entries.get(key, default)

    def put(self, key: Any, value: Any, size: int) -> None:
        """Keep ``value`` for ``key``; ``size``: the bytes it holds (its texts)."""
        if len(self.entries) >= CHAT_CALLS_KEPT or self.size + size > MEMO_BYTES:
            self.clear()
        if size <= MEMO_BYTES:
            self.entries[key] = value
            self.size += size

    def clear(self) -> None:
        """Forget every entry."""
        self.entries = {}
        self.size = 0

    def __len__(self) -> int:
        return len(self.entries)


_UNKNOWN = object()

_REQUESTS = _Memo()
"""(marshal bytes of a chat request, default model) -> :func:`_chat_request`'s answer."""


def _chat_request(
    request: dict[str, Any], default_model: Any
) -> tuple[bytes, str, bytes, str, str] | None:
    """(the plain request's :func:`step_memo.text_of` text, then what :func:`_chat_call` makes
    of it) for a request sent through a client whose default model is ``default_model``, or
    None when the request is not plain or its key cannot be made (the full path takes it).

    Made once per request value and default model: the request is told apart by its
    ``marshal`` bytes, which write every value with its exact type (``1``, ``1.0``, ``True``;
    a list and a tuple; ``0.0`` and ``-0.0``; ASCII or not) and refuse any subclass or other
    object, so equal bytes are an equal value of the same exact types, whose plain copy and text
    are equal too. A value marshal refuses (an object, a subclass, nesting too deep) is never
    plain. The plain copy itself is ``orjson.loads`` of the text (keys sorted, ASCII strings,
    ints of at most 63 bits: the same dicts, lists and scalars :func:`plain_fields` copies)."""
    try:
        dumped = marshal.dumps(request)
    except Exception:  # ValueError: an object, a subclass, nesting too deep
        return None
    memo = (dumped, default_model) if type(default_model) is str else None
    if memo is not None:
        known = _REQUESTS.get(memo, _UNKNOWN)
        if known is not _UNKNOWN:
            return known  # type: ignore[return-value]
    plain = plain_fields(request)
    text = step_memo.text_of(plain) if plain is not None else None
    call = _chat_call(plain, default_model, text) if plain is not None else None
    made = (text, *call) if text is not None and call is not None else None
    if memo is not None:
        size = len(dumped) + (len(made[0]) + len(made[2]) if made is not None else 0)
        _REQUESTS.put(memo, made, size)
    return made


RESPONSE_BYTES_KEPT = 16384
"""The longest answer (bytes) whose parsed fields :func:`_response` keeps."""

_RESPONSES = _Memo()
"""Answer bytes -> (text, finish reason, prompt tokens, completion tokens, read exactly)."""


def _response(raw: bytes) -> ChatResponse | None:
    """``ChatResponse.from_raw(raw, latency_ms=0.0)``, or None when it raises. Its fields
    other than ``data`` (the text, finish reason, token counts) and whether orjson reads
    ``raw`` exactly are kept per answer bytes; ``data`` is parsed again each time (the caller
    owns it)."""
    known = _RESPONSES.get(raw) if type(raw) is bytes else None
    if known is None:
        try:
            response = ChatResponse.from_raw(raw, latency_ms=0.0)
        except Exception:
            return None
        if type(raw) is bytes and len(raw) <= RESPONSE_BYTES_KEPT:
            exact = loads_exactly(raw)
            fields = (
                response.content,
                response.finish_reason,
                response.prompt_tokens,
                response.completion_tokens,
                exact,
            )
            _RESPONSES.put(raw, fields, 2 * len(raw))
        return response
    content, finish_reason, prompt_tokens, completion_tokens, exact = known
    response = object.__new__(ChatResponse)
    response.__dict__.update(
        raw=raw,
        data=orjson.loads(raw) if exact else loads(raw),
        content=content,
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        latency_ms=0.0,
    )
    return response


CHAT_CALLS_KEPT = 4096
"""How many chat requests' keys (:func:`_chat_call`) this process keeps."""

_CHAT_CALLS = _Memo()
"""(request text, default model) -> :func:`_chat_call`'s answer."""


def _chat_call(
    plain: dict[str, Any], default_model: Any, inputs_text: bytes | None
) -> tuple[str, bytes, str, str] | None:
    """(cache key, canonical request bytes, model name, determinism) of the call a
    :func:`rewind.tracing.chat_step` with the plain request ``plain`` makes through a client
    whose default model is ``default_model``, or None when the key cannot be made (the full
    path raises it where the step records it).

    All four are functions of the request's value and the default model alone, and
    ``inputs_text`` (the request as :func:`step_memo.text_of` writes it: keys sorted, exact
    JSON types, so ``1``, ``1.0``, ``true`` and ``"1"`` are told apart) is equal only for equal
    values: they are made once per text and default model, and a later step of the same
    request (the same step in the next replay) reads them back instead of normalizing and
    hashing the request again."""
    memo = None
    if inputs_text is not None and type(default_model) is str:
        memo = (inputs_text, default_model)
        known = _CHAT_CALLS.get(memo)
        if known is not None:
            return known
    fields = {k: v for k, v in plain.items() if v is not None}
    try:
        key, request = plain_request_key(fields, default_model=default_model)
    except Exception:
        return None
    temperature = fields.get("temperature", DEFAULT_TEMPERATURE)
    sampled = isinstance(temperature, int | float) and temperature > 0
    model = str(fields.get("model") or default_model)
    determinism = "non-deterministic" if sampled else DEFAULT_POLICY.determinism
    made = (key, request, model, determinism)
    if memo is not None:
        _CHAT_CALLS.put(memo, made, len(memo[0]) + len(request))
    return made


def serve_tool(
    trace: Trace,
    name: str,
    step_type: str,
    tool: Tool,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """A ``@step``-wrapped tool's step served in the lane, or :data:`NOT_SERVED`."""
    ctx = trace._ctx
    if (
        ctx is None
        or tool.determinism != "deterministic"
        or tool.resources is not None
        or tool.idempotency_arg is not None
        or tool.on_served is not None
        or ctx.in_child_process()
    ):
        return NOT_SERVED
    try:
        made = _tool_call(tool, args, kwargs)
    except Exception:  # the full path raises it where the step records it
        return NOT_SERVED
    inputs, inputs_text, request, key = made
    found = _answer(trace, (name, step_type, key, "tool", tool.name, "deterministic", inputs_text))
    if found is None:
        return NOT_SERVED
    try:
        value = _value(found[3])
    except ValueError:
        return NOT_SERVED
    # Inputs None: the plain copy, read from its text (_tool_call) when the step is read.
    served = _finish(trace, inputs, request, request, found, value)
    return value if served else NOT_SERVED


_EXACT = _Memo()
"""Tool result bytes -> whether orjson reads them exactly."""


def _value(raw: bytes) -> Any:
    """``loads(raw)`` (a tool's recorded result), whether orjson reads ``raw`` exactly kept per
    result bytes (:func:`~rewind.canonical.loads_exactly`).

    Raises:
        ValueError: as :func:`~rewind.canonical.loads`.
    """
    exact = _EXACT.get(raw) if type(raw) is bytes else None
    if exact is None:
        value = loads(raw)
        if type(raw) is bytes and len(raw) <= RESPONSE_BYTES_KEPT:
            _EXACT.put(raw, loads_exactly(raw), len(raw))
        return value
    return orjson.loads(raw) if exact else loads(raw)


_TOOL_CALLS = _Memo()
"""(tool name, marshal bytes of its bound arguments) -> (request text, cache key)."""


def _tool_call(
    tool: Tool, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[dict[str, Any] | None, bytes | None, bytes, str]:
    """(the step's inputs, their text, the call's request bytes, its key) for a tool call
    (:func:`_tool_request`, then the tool's key of the request). The inputs are None when the
    bound arguments are plain and were seen before: their text is the request, and the inputs
    are ``orjson.loads`` of it, made only if the step is served.

    For plain bound arguments the text and key are kept per tool name and arguments as their
    ``marshal`` bytes (exact types, subclasses refused: see :func:`_chat_request`), so the
    same call in a later replay neither copies, writes nor hashes them again.

    Raises:
        Exception: as :func:`_tool_request`.
    """
    bound = tool.bind(*args, **kwargs)
    memo = None
    if "self" not in bound and "cls" not in bound:
        try:
            memo = (tool.name, marshal.dumps(bound))
        except ValueError:  # an object or a subclass: not plain
            memo = None
        else:
            known = _TOOL_CALLS.get(memo)
            if known is not None:
                return None, known[0], known[0], known[1]
    inputs, inputs_text, request = _tool_request(tool, args, kwargs, bound)
    key = tool._key_of(request)
    if memo is not None and inputs_text is not None and inputs_text is request:
        _TOOL_CALLS.put(memo, (request, key), len(memo[1]) + len(request))
    return inputs, inputs_text, request, key


def _tool_request(
    tool: Tool,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    bound: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], bytes | None, bytes]:
    """(the step's inputs as :func:`rewind.tracing.tracer.bound_input` makes them, their
    :func:`step_memo.text_of` text, the call's canonical request bytes) of a call of a tool
    without an idempotency argument (its key arguments are its bound arguments).

    Bound arguments of plain JSON (:func:`~rewind.tracing.model.plain_fields`; no ``self`` or
    ``cls``, which ``bound_input`` leaves out) are copied once: that copy is what
    ``bound_input`` returns (``jsonable`` of the same dict), and its text (orjson, keys sorted)
    is, byte for byte, their canonical bytes, as :func:`rewind.llm.plain_request_key` has it
    for a plain request. Other arguments go the general way.

    ``bound``: ``tool.bind(*args, **kwargs)`` when the caller made it already.

    Raises:
        Exception: what binding the arguments or encoding them raises (the full path raises
            it where the step records it).
    """
    if bound is None:
        bound = tool.bind(*args, **kwargs)
    if "self" not in bound and "cls" not in bound:
        inputs = plain_fields(bound)
        text = step_memo.text_of(inputs) if inputs is not None else None
        if inputs is not None and text is not None:
            return inputs, text, text
    inputs = _tracer().bound_input(tool, args, kwargs)
    return inputs, step_memo.text_of(inputs), canonical_bytes(tool.key_args(bound))


class Served:
    """A step served in the lane, as its trace holds it until one of the trace's steps is read
    (:func:`steps_of`): what its :class:`~rewind.tracing.tracer.Step` is made of, no more.

    Nothing outside the trace can reach such a step before it is read (the lane hands out the
    answer, never the step, and sets no current step), so its values are still the ones it was
    served with; the Step is made, with fresh values read from the remembered texts, only when
    something reads the trace's steps (:attr:`Trace.steps <rewind.tracing.tracer.Trace.steps>`),
    and at the trace's exit an unread step's data is rebuilt from this record alone."""

    __slots__ = (
        "call",
        "duration_ms",
        "inputs",
        "inputs_text",
        "output",
        "perf",
        "position",
        "proven",
        "snapshot",
        "span_id",
        "started_at",
    )

    def __init__(
        self,
        position: int,
        proven: step_memo.Proven,
        call: CallRecord,
        inputs: tuple[dict[str, Any] | None, bytes],
        output: tuple[Any, Any],
        timing: tuple[float, float, float],
    ) -> None:
        self.position = position
        self.proven = proven
        self.call = call
        self.inputs, self.inputs_text = inputs
        self.output, self.snapshot = output
        self.started_at, self.duration_ms, self.perf = timing
        self.span_id: str | None = None

    def _span_id(self) -> str:
        """The step's span id, drawn when first asked for (the writer of a replay stored by
        reference never asks: the source's spans stand for its steps), then kept: every
        Step and data made of this record carry the same one."""
        span_id = self.span_id
        if span_id is None:
            with _SPAN_LOCK:
                span_id = self.span_id
                if span_id is None:
                    span_id = self.span_id = _tracer().new_span_id()
        return span_id

    def _values(self) -> tuple[Any, Any, Any, Any]:
        """Fresh (params, fields, attributes, inputs) of the step, read from the remembered
        texts (the inputs: the step's own when the lane kept them, else read from their text)."""
        params, fields, attributes = orjson.loads(self.proven.rest_text)
        inputs = self.inputs if self.inputs is not None else orjson.loads(self.inputs_text)
        return params, fields, attributes, inputs

    def step(self, trace: Trace) -> Step:
        """The step of ``trace`` this record stands for, made finished as the lane served it
        (its inputs, params, fields and attributes fresh objects of its own)."""
        proven = self.proven
        params, fields, attributes, inputs = self._values()
        s = _tracer().Step(
            trace, proven.name, proven.step_type, inputs, attributes, self.position, ROOT_POSITION
        )
        s.attributes = attributes  # Step copies them: these are this step's own already
        s.span_id = self._span_id()
        s.status = StepStatus.SUCCESS
        s.output = self.output
        s.started_at = self.started_at
        s.ended_at = self.started_at + self.duration_ms / 1000.0
        s.duration_ms = self.duration_ms
        s._perf = self.perf  # a step finished again (after fail or skip) times from its start
        s.prompt_tokens = proven.prompt_tokens
        s.completion_tokens = proven.completion_tokens
        _set_finished(s, params, [self.call], self.snapshot)
        s._proven = proven
        s._lane_fields = fields  # read once, this step's own: step_data uses them
        return s

    def data(self) -> StepData:
        """The step's data, as :func:`step_data` rebuilds it from the step :meth:`step`
        makes (fresh values, read from the remembered texts)."""
        proven = self.proven
        params, fields, attributes, inputs = self._values()
        started = self.started_at
        ended = started + self.duration_ms / 1000.0
        timing = (self._span_id(), started, ended, self.duration_ms)
        return proven.step_data(self.position, inputs, attributes, timing, (params, fields))


_SPAN_LOCK = threading.Lock()


def steps_of(trace: Trace) -> list[Step]:
    """The trace's steps, by position, each :class:`Served` record among them made a Step
    (once: the trace keeps that Step in its place). The caller holds the trace's lock."""
    steps = trace._steps
    for i, s in enumerate(steps):
        if type(s) is Served:
            steps[i] = s.step(trace)
    return list(steps)


def _finish(
    trace: Trace,
    inputs: dict[str, Any] | None,
    inputs_text: bytes,
    request: bytes,
    found: _Found,
    output: Any,
) -> bool:
    """Add the finished step at the position found, as a :class:`Served` record (False,
    nothing added: the output is not the remembered one, or another step took the position
    meanwhile). ``inputs``: the step's own, or None: ``orjson.loads(inputs_text)``, read
    when the step is; ``request``: the call's request bytes.

    The step starts here: the trace's clock is read once, for its start, as the full path
    reads it once per step (a step the lane looks at and does not serve never reads it, so an
    injected clock gives the times it gives with the lane off), and the step lasts until its
    record is made (its start and end read together: a served step never ends after the
    next one starts, nor after its trace)."""
    p, proven, call, data, remembered = found
    snapshot = _same_output(output, remembered)
    if snapshot is _NOT_SAME:
        snapshot = jsonable(output)
        if step_memo.text_of({proven.name: snapshot}, sort_keys=False) != proven.fields_text:
            return False
    started = trace.clock()
    perf = time.perf_counter()
    duration = (time.perf_counter() - perf) * 1000.0
    timing = (started, duration, perf)
    record = Served(p, proven, call, (inputs, inputs_text), (output, snapshot), timing)
    with trace._lock:
        if trace._lane_off or len(trace._steps) != p:
            return False
        trace._steps.append(record)
    ctx = trace._ctx
    if ctx is not None and ctx.served is not None:
        # Kept as rewind.cache._hit keeps it, in case the source leaves the store.
        ctx.served[call.key] = (request, data)
    return True


_NOT_SAME = object()
_INT_BOUND = 1 << 63


def _same_output(output: Any, remembered: Any) -> Any:
    """``output`` (its :func:`jsonable` snapshot) when it is, with its exact type, the
    remembered output, a string, an int of at most 63 bits, a bool or None: its text is then
    the remembered text (``remembered`` was read from it, so holds no lone surrogate). Else
    ``_NOT_SAME`` (the caller compares the texts)."""
    t = type(output)
    if t is not type(remembered) or output != remembered:
        return _NOT_SAME
    if t is str or t is bool or output is None or (t is int and -_INT_BOUND < output < _INT_BOUND):
        return output
    return _NOT_SAME


def _set_finished(s: Step, params: dict[str, Any], calls: list[CallRecord], snapshot: Any) -> None:
    """What a finished step keeps of its scope (:meth:`Step._release`) and its output's
    snapshot (:meth:`Step._collect`)."""
    s._params = params
    s._calls = calls
    s._pending = {}
    s._effects = []
    s._snapshot = snapshot


def step_data(s: Step) -> tuple[StepData, bytes] | None:
    """(the data of a step served in the lane, its signature), rebuilt from what it was served
    as when the step is still as the lane finished it (status, name, type, parent, errors,
    tokens, and its inputs and attributes as JSON text: the public fields its data is made of),
    else None (its data is built the full way, :meth:`Step.data`)."""
    if not _as_finished(s):
        return None
    proven = s._proven
    if step_memo.text_of(s.attributes, sort_keys=False) != proven.attributes_text:
        return None
    if step_memo.text_of(s.inputs) != proven.inputs_text:
        return None
    return _rebuilt(s), proven.signature


def steps_data(steps: list[Step | Served]) -> tuple[list[StepData], dict[int, bytes]]:
    """The data of each of ``steps`` (:meth:`Step.data`, or for a step served in the lane
    what :func:`step_data` rebuilds, filled in only when a field besides its position, name,
    tokens and calls is read: :class:`ServedData`), and ``id(data)`` -> signature of the
    served ones. A :class:`Served` record (a step nothing read) is as it was served: its
    data is rebuilt from it (:meth:`Served.data`), unchecked.

    The inputs and attributes of the served steps are compared with what they were served as
    in two texts (one orjson call each, a JSON array of the values), not two per step: each
    element of such an array is a whole JSON value, so two arrays' texts are equal exactly
    when they are element by element. When they differ (a caller changed a served step),
    each served step is compared on its own. One pass over the steps (a trace's exit walks
    them cold from memory)."""
    out: list[StepData] = []
    signed: dict[int, bytes] = {}
    unread: dict[int, bytes] = {}  # the Served records' data: as they were served
    served: list[int] = []
    inputs: list[Any] = []
    attributes: list[Any] = []
    inputs_texts: list[bytes] = []
    attributes_texts: list[bytes] = []
    doubtful = False
    for s in steps:
        if type(s) is Served:
            data = ServedData.of(s)
            unread[id(data)] = s.proven.signature
            out.append(data)
            continue
        proven = s._proven
        if proven is None or not _as_finished(s):
            out.append(s._data())
            continue
        served.append(len(out))
        inputs.append(s.inputs)
        attributes.append(s.attributes)
        inputs_texts.append(proven.inputs_text)
        attributes_texts.append(proven.attributes_text)
        doubtful = doubtful or proven.doubtful
        data = ServedData.of(s)
        signed[id(data)] = proven.signature
        out.append(data)
    if inputs and not _as_served(inputs, attributes, inputs_texts, attributes_texts, doubtful):
        signed = {}
        for i in served:
            rebuilt = step_data(steps[i])
            out[i] = steps[i]._data() if rebuilt is None else rebuilt[0]
            if rebuilt is not None:
                signed[id(rebuilt[0])] = rebuilt[1]
    if unread:
        signed.update(unread)
    return out, signed


def _as_served(
    inputs: list[Any],
    attributes: list[Any],
    inputs_texts: list[bytes],
    attributes_texts: list[bytes],
    doubtful: bool,
) -> bool:
    """Whether the served steps' ``inputs`` and ``attributes`` are still, as texts, the ones
    they were served with (``doubtful``: whether any of those holds a ``null`` or a string
    shaped like a UUID, :func:`step_memo.doubtful`; only then can an equal text hide a NaN or a
    ``uuid.UUID``, which :func:`step_memo.reads_back` reads the texts back for)."""
    inputs_text = step_memo.raw_text(inputs)
    attributes_text = step_memo.raw_text(attributes, sort_keys=False)
    if (
        inputs_text is None
        or attributes_text is None
        or inputs_text != _joined(inputs_texts)
        or attributes_text != _joined(attributes_texts)
    ):
        return False
    return not doubtful or (
        step_memo.reads_back(inputs_text, inputs)
        and step_memo.reads_back(attributes_text, attributes)
    )


def _joined(texts: list[bytes]) -> bytes:
    """The JSON array of the JSON ``texts``, as orjson writes it (no spaces)."""
    return b"[" + b",".join(texts) + b"]"


def _as_finished(s: Step) -> bool:
    """Whether a step served in the lane still has the status, name, type, parent, errors,
    tokens and timing the lane finished it with."""
    proven = s._proven
    return not (
        proven is None
        or s.status != StepStatus.SUCCESS
        or s.name != proven.name
        or s.step_type != proven.step_type
        or s.parent_position != proven.parent_position
        or s.error_type is not None
        or s.error_message is not None
        or s.prompt_tokens != proven.prompt_tokens
        or s.completion_tokens != proven.completion_tokens
        or s.scope is not None
        or s.started_at is None
    )


def _rebuilt(s: Step) -> StepData:
    """The data of a step served in the lane, rebuilt from what it was served as (the caller
    checked it is still as the lane finished it)."""
    timing = (s.span_id, s.started_at, s.ended_at, s.duration_ms)
    fields = s._lane_fields
    parsed = (s._params, fields) if s._params is not None and fields is not None else None
    return s._proven.step_data(s.position, s.inputs, s.attributes, timing, parsed)


class ServedData(StepData):
    """The data of a step served in the lane (:func:`steps_data`), whose fields besides its
    position, name, tokens and calls are filled in when one of them is first read, all at
    once, with the values :func:`step_data` gives (from the step as it is then: the trace's
    writer reads it while the trace ends).

    The writer of an unchanged replay reads no other field of a step it stores by reference
    (its signature is known, :func:`rewind.tracing.store.write_trace`), and rebuilding every
    step's data was about a fifth of such a trace's exit. Only :meth:`Trace.finish` makes
    them (a ``chain_end`` callback gets data built the full way)."""

    @classmethod
    def of(cls, s: Step | Served) -> ServedData:
        """The data of the served step ``s`` (a Step checked by the caller to be as the lane
        finished it, or a :class:`Served` record), its other fields not filled in yet."""
        proven = s.proven if type(s) is Served else s._proven
        out = object.__new__(cls)
        out.__dict__.update(
            position=s.position,
            name=proven.name,
            prompt_tokens=proven.prompt_tokens,
            completion_tokens=proven.completion_tokens,
            calls=list(proven.calls),
            _step=s,
        )
        return out

    def _fill(self) -> None:
        """Fill in every field from the step (kept beside them: filling in twice, as two
        threads reading at once may, sets the same values)."""
        step = self.__dict__["_step"]
        self.__dict__.update((step.data() if type(step) is Served else _rebuilt(step)).__dict__)


class _Filled:
    """A field of :class:`ServedData` read before it is filled in: fills it in (a non-data
    descriptor: once the field is in the instance's dict, it is read from there)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, obj: ServedData | None, owner: type | None = None) -> Any:
        if obj is None:
            return getattr(StepData, self.name, self)
        obj._fill()
        return obj.__dict__[self.name]


for _field in dataclasses.fields(StepData):
    if _field.name not in ("position", "name", "prompt_tokens", "completion_tokens", "calls"):
        setattr(ServedData, _field.name, _Filled(_field.name))
