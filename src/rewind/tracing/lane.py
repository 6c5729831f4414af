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
remembered step had (fresh copies) and its own span id and timing. Its data is therefore what
the full path would have produced, and the trace is written by the usual writer (stored by
reference when every step matched).

The first step that is not served this way (anything else: another request, a miss, a step
opened any other way, nesting, another thread, an async step, a user attribute on the step
spec, a step past the remembered ones) runs the full path, and so does every step after it in
that trace (:meth:`~rewind.tracing.tracer.Trace.step` ends the lane). Nothing is served unless
every check passes, so a step either is served exactly as the full path would serve it or is
not touched by the lane at all.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any

from rewind.call import DEFAULT_POLICY
from rewind.canonical import canonical_bytes, loads
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
    "ServedData",
    "serve_chat",
    "serve_tool",
    "step_data",
    "steps_data",
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
    if threading.get_ident() != lane.thread or _observed(trace):
        return None
    if _tracer()._STEP.get() is not None or current() is not ctx:
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


def _tracer() -> Any:
    """The module :mod:`rewind.tracing.tracer` (it imports this one: imported at the first
    step served, then kept, instead of an import statement on every step)."""
    global _TRACER
    if _TRACER is None:
        from rewind.tracing import tracer

        _TRACER = tracer
    return _TRACER


class _Call:
    """The call a step is about to make, as the lane checks it against the remembered one
    (``inputs_text``: the inputs as :func:`step_memo.text_of` writes them, None when they are
    not plain JSON)."""

    __slots__ = (
        "determinism",
        "inputs",
        "inputs_text",
        "key",
        "kind",
        "name",
        "request",
        "step",
        "step_type",
    )

    def __init__(
        self,
        step: str,
        step_type: str,
        inputs: dict[str, Any],
        inputs_text: bytes | None,
        kind: str,
        name: str,
        key: str,
        request: bytes,
        determinism: str,
    ) -> None:
        self.step, self.step_type = step, step_type
        self.inputs, self.inputs_text = inputs, inputs_text
        self.kind, self.name, self.key, self.request = kind, name, key, request
        self.determinism = determinism


def _answer(trace: Trace, c: _Call) -> tuple[int, step_memo.Proven, CallRecord, bytes] | None:
    """(position, the remembered step there, its one call, the result bytes) when the step
    about to make the call ``c`` is, at the next position, the remembered step and its call,
    and the source's answer to that call is at hand; else None (the full path)."""
    lane = _lane(trace, c.kind, c.key)
    ctx = trace._ctx
    if lane is None or ctx is None:
        return None
    p = len(trace._steps)
    remembered = _remembered(lane, p, c)
    if remembered is None or c.key in ctx.recent:
        return None
    proven, call = remembered
    # What rewind.cache._lookup serves first: the source's call at this position.
    entry = ctx.lineage_at.get((p, c.key))
    if entry is None or entry.result_hash != call.result_hash:
        return None
    data = ctx.lineage_blobs.get(call.result_hash)
    if data is None or entry.produced_at != call.produced_at:
        return None
    if c.inputs_text is None or c.inputs_text != proven.inputs_text:
        return None
    return p, proven, call, data


def _remembered(lane: Lane, p: int, c: _Call) -> tuple[step_memo.Proven, CallRecord] | None:
    """(the remembered step at position ``p``, its one call) when they are the step and call
    ``c`` served from the cache (a hit, 0 ms), else None."""
    proven = lane.proven[p] if p < len(lane.proven) else None
    if (
        proven is None
        or proven.name != c.step
        or proven.step_type != c.step_type
        or proven.parent_position != ROOT_POSITION
        or len(proven.calls) != 1
    ):
        return None
    call = proven.calls[0]
    same = (call.key, call.kind, call.name, call.determinism) == (
        c.key,
        c.kind,
        c.name,
        c.determinism,
    )
    hit = (call.call_index, call.outcome, call.reason, call.latency_ms) == (0, "hit", "hit", 0.0)
    return (proven, call) if same and hit else None


def serve_chat(trace: Trace, name: str, plain: dict[str, Any]) -> ChatResponse | None:
    """:func:`rewind.tracing.chat_step`'s step served in the lane, or None (take the full
    path). ``plain`` is the request's plain copy (the step's input)."""
    started, perf = trace.clock(), time.perf_counter()
    ctx = trace._ctx
    client = ctx.chat_client if ctx is not None else None
    if client is None:
        return None
    inputs_text = step_memo.text_of(plain)
    made = _chat_call(plain, client.endpoint.model, inputs_text)
    if made is None:
        return None
    key, request, model, determinism = made
    c = _Call(name, _LLM, plain, inputs_text, "llm", model, key, request, determinism)
    found = _answer(trace, c)
    if found is None:
        return None
    try:
        response = ChatResponse.from_raw(found[3], latency_ms=0.0)
    except Exception:
        return None
    return response if _finish(trace, c, found, response.content, (started, perf)) else None


CHAT_CALLS_KEPT = 4096
"""How many chat requests' keys (:func:`_chat_call`) this process keeps."""

_CHAT_CALLS: dict[tuple[bytes, str], tuple[str, bytes, str, str]] = {}


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
        if len(_CHAT_CALLS) >= CHAT_CALLS_KEPT:
            _CHAT_CALLS.clear()
        _CHAT_CALLS[memo] = made
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
    started, perf = trace.clock(), time.perf_counter()
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
        inputs, inputs_text, request = _tool_request(tool, args, kwargs)
        key = tool._key_of(request)
    except Exception:  # the full path raises it where the step records it
        return NOT_SERVED
    c = _Call(
        name, step_type, inputs, inputs_text, "tool", tool.name, key, request, "deterministic"
    )
    found = _answer(trace, c)
    if found is None:
        return NOT_SERVED
    try:
        value = loads(found[3])
    except ValueError:
        return NOT_SERVED
    return value if _finish(trace, c, found, value, (started, perf)) else NOT_SERVED


def _tool_request(
    tool: Tool, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[dict[str, Any], bytes | None, bytes]:
    """(the step's inputs as :func:`rewind.tracing.tracer.bound_input` makes them, their
    :func:`step_memo.text_of` text, the call's canonical request bytes) of a call of a tool
    without an idempotency argument (its key arguments are its bound arguments).

    Bound arguments of plain JSON (:func:`~rewind.tracing.model.plain_fields`; no ``self`` or
    ``cls``, which ``bound_input`` leaves out) are copied once: that copy is what
    ``bound_input`` returns (``jsonable`` of the same dict), and its text (orjson, keys sorted)
    is, byte for byte, their canonical bytes, as :func:`rewind.llm.plain_request_key` has it
    for a plain request. Other arguments go the general way.

    Raises:
        Exception: what binding the arguments or encoding them raises (the full path raises
            it where the step records it).
    """
    bound = tool.bind(*args, **kwargs)
    if "self" not in bound and "cls" not in bound:
        inputs = plain_fields(bound)
        text = step_memo.text_of(inputs) if inputs is not None else None
        if inputs is not None and text is not None:
            return inputs, text, text
    inputs = _tracer().bound_input(tool, args, kwargs)
    return inputs, step_memo.text_of(inputs), canonical_bytes(tool.key_args(bound))


def _finish(
    trace: Trace,
    c: _Call,
    found: tuple[int, step_memo.Proven, CallRecord, bytes],
    output: Any,
    clock: tuple[float, float],
) -> bool:
    """Add the finished step at the position found (False, nothing added: the output is not
    the remembered one, or another step took the position meanwhile). ``clock``: the unix and
    perf-counter seconds the step started at."""
    p, proven, call, data = found
    name = c.step
    snapshot = jsonable(output)
    if step_memo.text_of({name: snapshot}, sort_keys=False) != proven.fields_text:
        return False
    params, fields, attributes = loads(proven.rest_text)
    started, perf = clock
    s = _tracer().Step(trace, name, proven.step_type, c.inputs, attributes, p, ROOT_POSITION)
    s.attributes = attributes  # Step copies them: these are this step's own already
    duration = (time.perf_counter() - perf) * 1000.0
    s.status = StepStatus.SUCCESS
    s.output = output
    s.started_at = started
    s.ended_at = started + duration / 1000.0
    s.duration_ms = duration
    s.prompt_tokens = proven.prompt_tokens
    s.completion_tokens = proven.completion_tokens
    _set_finished(s, params, [call], snapshot)
    s._proven = proven
    s._lane_fields = fields  # read once, this step's own: step_data uses them
    with trace._lock:
        if trace._lane_off or len(trace._steps) != p:
            return False
        trace._steps.append(s)
    ctx = trace._ctx
    if ctx is not None and ctx.served is not None:
        # Kept as rewind.cache._hit keeps it, in case the source leaves the store.
        ctx.served[c.key] = (c.request, data)
    return True


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


def steps_data(steps: list[Step]) -> tuple[list[StepData], dict[int, bytes]]:
    """The data of each of ``steps`` (:meth:`Step.data`, or for a step served in the lane
    what :func:`step_data` rebuilds, filled in only when a field besides its position, name,
    tokens and calls is read: :class:`ServedData`), and ``id(data)`` -> signature of the
    served ones.

    The inputs and attributes of the served steps are compared with what they were served as
    in two texts (one orjson call each, a JSON array of the values), not two per step: each
    element of such an array is a whole JSON value, so two arrays' texts are equal exactly
    when they are element by element. When they differ (a caller changed a served step),
    each served step is compared on its own. One pass over the steps (a trace's exit walks
    them cold from memory)."""
    out: list[StepData] = []
    signed: dict[int, bytes] = {}
    served: list[int] = []
    inputs: list[Any] = []
    attributes: list[Any] = []
    inputs_texts: list[bytes] = []
    attributes_texts: list[bytes] = []
    for s in steps:
        proven = s._proven
        if proven is None or not _as_finished(s):
            out.append(s.data())
            continue
        served.append(len(out))
        inputs.append(s.inputs)
        attributes.append(s.attributes)
        inputs_texts.append(proven.inputs_text)
        attributes_texts.append(proven.attributes_text)
        data = ServedData.of(s)
        signed[id(data)] = proven.signature
        out.append(data)
    if inputs and (
        step_memo.text_of(inputs) != _joined(inputs_texts)
        or step_memo.text_of(attributes, sort_keys=False) != _joined(attributes_texts)
    ):
        signed = {}
        for i in served:
            rebuilt = step_data(steps[i])
            out[i] = steps[i].data() if rebuilt is None else rebuilt[0]
            if rebuilt is not None:
                signed[id(rebuilt[0])] = rebuilt[1]
    return out, signed


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
    def of(cls, s: Step) -> ServedData:
        """The data of the served step ``s`` (checked by the caller to be as the lane
        finished it), its other fields not filled in yet."""
        proven = s._proven
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
        self.__dict__.update(_rebuilt(self.__dict__["_step"]).__dict__)


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
