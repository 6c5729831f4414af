"""Replay a traced chain with its recorded LLM answers and at most one change.

A traced chain is a plain Python function, so a replay cannot resume in the middle of it the way a
Burr fork does: it calls the chain again, from the start, with the recorded input (and the one
change), inside a new trace whose LLM calls are served through the cache — the recorded trace's
own calls first (its lineage), so an unchanged replay returns every recorded answer byte for byte,
spends 0 tokens and reproduces every hash. The change is either a field of the chain's input
(``input.question=…``, nested paths allowed: ``input.options.k=5``) or a param a step reads with
:func:`rewind.param` (``retrieve.top_k=3``). The new trace records the original as its parent, so
``rewind diff ORIGINAL REPLAY`` compares them step by step.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import inspect
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from rewind.canonical import canonical_bytes
from rewind.context import RunContext
from rewind.errors import InvalidOverride, RewindError, RunBusy
from rewind.store import RunRecord, Store
from rewind.store.records import stored_name
from rewind.tracing.model import INPUT_KEY, SOURCE_INPUT, StepView, TraceView
from rewind.tracing.recorded import recorded_params, replay_recorded
from rewind.tracing.store import is_trace, lineage_blobs, lineage_index, load_trace
from rewind.tracing.switches import (
    ReplaySwitches,
    divergence_check,
    replay_context,
    replay_trace_of,
    run_replay,
)
from rewind.tracing.tracer import IN_PLACE_MODE, Trace, Tracer, new_trace_id
from rewind.tracing.tracer_source import source_rows

CHAIN_MODE = "chain"
"""The ``replay_mode`` of a replay that ran the chain's code."""

__all__ = [
    "ReplaySwitches",
    "TraceChange",
    "chain_client",
    "divergence_check",
    "load_chain",
    "parse_change",
    "replay_in_place",
    "replay_trace",
]


@dataclass(frozen=True)
class TraceChange:
    """One change a replay carries: an input field (``target == "input"``, ``path`` its keys) or
    a step param (``target`` the step's name, ``path`` = (param,))."""

    target: str
    path: tuple[str, ...]
    value: Any

    def to_json(self) -> dict[str, Any]:
        """The run row's ``override``: a param override of the pseudo-node ``input`` or a step."""
        return {
            "kind": "param",
            "node": self.target,
            "param": ".".join(self.path),
            "value": self.value,
            "target": "trace-input" if self.target == INPUT_KEY else "step-param",
        }


def parse_change(
    spec: str, view: TraceView, extra_params: Mapping[str, Sequence[str]] | None = None
) -> TraceChange:
    """Parse ``input.field=VALUE`` or ``step.param=VALUE`` against a recorded trace.

    VALUE is JSON when it parses as JSON, else a plain string. ``extra_params`` adds settable
    params per step name (a replay of recorded calls may set any recorded request field).

    Raises:
        InvalidOverride: malformed, an input field the chain's input does not have, a step or
            param the trace does not have, or a value that cannot be hashed (NaN...).
    """
    left, sep, raw = spec.partition("=")
    target, dot, rest = _split_target(left.strip(), view)
    if not sep or not dot or not target or not rest:
        raise InvalidOverride(
            f"malformed change {spec!r}",
            "write it as --set input.field=VALUE (or step.param=VALUE)",
        )
    value = _change_value(left.strip(), raw)
    path = tuple(p for p in rest.split("."))
    if any(not p for p in path):
        raise InvalidOverride(f"malformed path in {left.strip()!r}", "e.g. input.options.k=5")
    if target == INPUT_KEY:
        _check_input_path(view, path)
        return TraceChange(INPUT_KEY, path, value)
    _check_step_param(view, target, path, extra_params)
    return TraceChange(target, path, value)


def _change_value(left: str, raw: str) -> Any:
    """A change's VALUE: JSON when it parses as JSON, else the plain string; it must hash."""
    try:
        value = json.loads(raw, parse_constant=_no_constant)
    except json.JSONDecodeError:
        value = raw
    try:
        canonical_bytes(value)
    except ValueError as exc:
        raise InvalidOverride(
            f"the value of {left} cannot be hashed: {exc}",
            "use a finite number or a string",
        ) from exc
    return value


def _check_input_path(view: TraceView, path: tuple[str, ...]) -> None:
    """Refuse an input field the chain's input does not have (or a path through a non-object)."""
    fields = sorted(view.input)
    if path[0] not in view.input:
        raise InvalidOverride(
            f"the chain's input has no field {path[0]!r}",
            f"its fields: {', '.join(fields) or 'none'}",
        )
    node: Any = view.input
    for i, key in enumerate(path[:-1]):
        node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise InvalidOverride(
                f"input.{'.'.join(path[: i + 1])} is not an object",
                "set the whole field instead",
            )


def _check_step_param(
    view: TraceView,
    target: str,
    path: tuple[str, ...],
    extra_params: Mapping[str, Sequence[str]] | None,
) -> None:
    """Refuse a step (``name`` or ``name#k``) the trace does not have, or a param it lacks."""
    name, _, occ = target.partition("#")
    steps = [s for s in view.steps if s.name == name]
    if occ and steps:
        try:
            steps = [view.find(target)] if occ.isdigit() else []
        except LookupError:
            steps = []
    if not steps:
        names = sorted({s.name for s in view.steps})
        raise InvalidOverride(
            f"trace {view.trace_id[:12]} has no step {target!r}",
            f"change input.FIELD, or a param of: {', '.join(names) or 'no step'}",
        )
    params = sorted({p for s in steps for p in s.params} | set((extra_params or {}).get(name, ())))
    if len(path) != 1 or path[0] not in params:
        _refuse_param(target, path, params, steps)


def _refuse_param(
    target: str, path: tuple[str, ...], params: Sequence[str], steps: Sequence[StepView]
) -> NoReturn:
    """Raise the :class:`InvalidOverride` of a param the step ``target`` does not have: an
    imported step whose model call is not replayable says why."""
    unreplayable = [s for s in steps if s.attributes.get("replayable") is False]
    if unreplayable and not params:
        raise InvalidOverride(
            f"step {target!r} cannot be changed: its model call was imported without a "
            f"replayable request ({unreplayable[0].attributes.get('not_replayable')})",
            "change the input or another step, or record the production trace with its "
            "requests captured whole",
        )
    raise InvalidOverride(
        f"step {target!r} has no param {'.'.join(path)!r}",
        f"its params: {', '.join(params) or 'none (read params with rewind.param)'}",
    )


def _split_target(left: str, view: TraceView) -> tuple[str, str, str]:
    """(target, ".", path) of ``target.path``: the longest step name (``name`` or ``name#k``)
    the left side starts with, so that step names holding dots (``openai.chat``) parse."""
    names = sorted({s.name for s in view.steps}, key=len, reverse=True)
    for name in names:
        m = re.match(rf"^({re.escape(name)}(?:#[0-9]+)?)\.(.+)$", left)
        if m:
            return m.group(1), ".", m.group(2)
    return left.partition(".")


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


def load_chain(ref: str) -> Any:
    """Import the chain function ``module:qualname`` recorded with a trace.

    Returns:
        the undecorated function (``__wrapped__`` of a ``@tracer.chain`` function).
    Raises:
        RewindError: the module or attribute cannot be imported, or is not callable.
    """
    obj = _import_chain(ref)
    return getattr(obj, "__wrapped__", obj)


def chain_client(ref: str) -> Any:
    """The model client of the :class:`Tracer` whose ``@tracer.chain`` decorated ``ref``, or
    None (a plain function, or a tracer without a client). A chain-mode replay sends its
    misses there, as the chain did when it was recorded: the model it fills into requests that
    name none is part of every cache key, so another client's model would miss every call.

    Raises:
        RewindError: as :func:`load_chain`.
    """
    tracer = getattr(_import_chain(ref), "__rewind_tracer__", None)
    return getattr(tracer, "chat_client", None)


def _import_chain(ref: str) -> Any:
    module_name, colon, qualname = ref.partition(":")
    if not colon or not module_name or not qualname:
        raise RewindError(f"chain reference {ref!r} is not module:function", "")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise RewindError(
            f"cannot import the chain {ref!r}: {exc}",
            "run the replay where the chain's module is importable (installed or on PYTHONPATH)",
        ) from exc
    if not callable(obj):
        raise RewindError(f"{ref!r} is not a function", "")
    return obj


def replay_trace(
    store: Store,
    trace_id: str,
    *,
    change: TraceChange | str | None = None,
    chat_client: Any = None,
    new_id: str | None = None,
    chain: str | None = None,
    switches: ReplaySwitches | None = None,
) -> RunRecord:
    """Replay a recorded trace: re-run its chain with the recorded input (plus one change), LLM
    calls served from the recorded answers where the request is unchanged.

    Args:
        store: the store holding the trace; the replay is written there too.
        trace_id: the trace (id or unique prefix).
        change: a :class:`TraceChange`, a ``target.path=VALUE`` spec, or None for an unchanged
            replay (expected: every LLM call a hit, 0 tokens, identical hashes).
        chat_client: the model client for calls that miss (a changed prompt); in chain mode the
            chain's own tracer's client comes first (:func:`chain_client`).
        new_id: the replay's trace id (default: a new one).
        chain: ``module:function`` of the chain's code; default: the ``chain_ref`` recorded by
            Rewind's tracer in this store. An imported trace's ``chain_ref`` is never used on its
            own (a trace file must not choose code to run): pass it here. Without code, the
            recorded steps are replayed as a chain of recorded calls
            (:mod:`rewind.tracing.recorded`).
        switches: :class:`ReplaySwitches` (default: everything cached, no stop).
    Returns:
        the replay's run row (``failed`` if the chain raised; the exception is recorded on it);
        its ``config["replay_mode"]`` says which mode ran: ``chain`` or ``recorded-calls``.
    Raises:
        UnknownRun, InvalidOverride, RunBusy, RewindError: nothing is written.
        EndpointUnavailable: a call missed and no model endpoint answers (the replay is written,
            failed at that step).
    """
    run = store.get_run(trace_id)
    view = load_trace(store, run.run_id)
    if view.kind != "trace":
        raise RewindError(
            f"run {run.run_id[:12]} is a Burr run, not a traced chain",
            f"fork it instead: rewind fork {run.run_id[:12]} --at NODE",
        )
    if run.status == "running":
        raise RunBusy(f"trace {run.run_id} is still running", "wait until it has finished")
    # A chain reference read from an imported trace names code to import and call: only the
    # person replaying may name it (``chain``), never the trace file.
    trusted = run.config.get("source") != "otlp"
    ref = chain or (run.config.get("chain_ref") if trusted else None)
    if not ref:
        view = load_trace(store, run.run_id, payloads=True)
        if isinstance(change, str):
            change = parse_change(change, view, recorded_params(store, view))
        return replay_recorded(
            store,
            run,
            view,
            change=change,
            chat_client=chat_client,
            new_id=new_id or new_trace_id(),
            override=change.to_json() if change is not None else None,
            switches=switches,
        )
    if isinstance(change, str):
        change = parse_change(change, view)
    fn = load_chain(ref)
    chat_client = chain_client(ref) or chat_client
    chain_input = copy.deepcopy(view.input)
    overrides: dict[str, dict[str, Any]] = {}
    if change is not None and change.target == INPUT_KEY:
        node = chain_input
        for key in change.path[:-1]:
            node = node[key]
        node[change.path[-1]] = change.value
    elif change is not None:
        overrides = {change.target: {change.path[0]: change.value}}
    new_id = new_id or new_trace_id()
    switches = switches or ReplaySwitches()
    ctx = replay_context(
        store,
        run,
        view,
        run_id=new_id,
        param_overrides=overrides,
        chat_client=chat_client,
        switches=switches,
    )
    trace = replay_trace_of(
        store,
        run,
        view,
        ctx,
        chain_input=chain_input,
        override=change.to_json() if change is not None else None,
        mode=CHAIN_MODE,
        switches=switches,
        chain_ref=ref,
    )

    def body() -> None:
        trace.set_output(_call(fn, chain_input))

    return run_replay(trace, body)


def _call(fn: Any, values: dict[str, Any]) -> Any:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        params = []  # type: ignore[assignment]
    for p in params:
        if p.name not in values:
            continue
        v = values[p.name]
        if p.kind is p.VAR_POSITIONAL:
            args.extend(v or [])
        elif p.kind is p.VAR_KEYWORD:
            kwargs.update(v or {})
        elif p.kind is p.POSITIONAL_ONLY:
            args.append(v)
        else:
            kwargs[p.name] = v
    if inspect.iscoroutinefunction(fn):
        return asyncio.run(fn(*args, **kwargs))
    return fn(*args, **kwargs)


def recorded_input(store: Store, run: RunRecord) -> dict[str, Any]:
    """The input fields the trace ``run`` recorded (its initial state), decoded from the
    stored JSON: ``{}`` when it had none. One read transaction, two blob reads.

    Raises:
        StoreError: a blob of the input is missing (the store is damaged).
    """
    if not run.initial_state_hash:
        return {}
    with store.read() as conn:
        fields: dict[str, str] = store.get_json(run.initial_state_hash, conn)
        blobs = store.get_blobs(fields.values(), conn)
    return {name: json.loads(blobs[digest]) for name, digest in fields.items()}


def replay_in_place(
    tracer: Tracer,
    source: str,
    *,
    name: str | None = None,
    input: Any = SOURCE_INPUT,
    switches: ReplaySwitches | None = None,
    trace_id: str | None = None,
) -> Trace:
    """A new trace that replays the recorded trace ``source`` around the caller's own code (use
    it with ``with``): the block runs again, and its LLM and tool calls are served from the
    calls ``source`` (and its ancestors) recorded first, then from the cache.

    The source's calls and their result bytes are read once, when this is called (one
    transaction for the calls, one query per 500 blobs); lookups during the block are
    dictionary reads, so an unchanged replay makes no SQL query until it is written. The new
    trace's parent is ``source`` (``rewind diff SOURCE REPLAY`` compares them) and its config
    says ``replay_mode: in-place``.

    Args:
        tracer: whose store, model client (for calls that miss), clock and callbacks to use.
        source: the recorded trace (id or unique prefix).
        name: the new trace's name (default: the source's).
        input: the block's input (default :data:`SOURCE_INPUT`: the input ``source`` recorded,
            its fields as stored, so an unchanged block replays unchanged). Another input is
            part of every step's state, so such a replay shares no step with its source (each
            is stored again); ``None`` is no input, as ``Tracer.trace``.
        switches: :class:`ReplaySwitches` (default: everything cached, no stop).
        trace_id: the new trace's id (default: a new one).
    Raises:
        UnknownRun: no such trace. RunBusy: it is still running. RewindError: ``source`` is a
            Burr run, not a trace (fork it instead). Nothing is written.
    """
    store = tracer.store
    run = store.get_run(source)
    if not is_trace(store, run.run_id):
        raise RewindError(
            f"run {run.run_id[:12]} is a Burr run, not a traced chain",
            f"fork it instead: rewind fork {run.run_id[:12]} --at NODE",
        )
    if run.status == "running":
        raise RunBusy(f"trace {run.run_id} is still running", "wait until it has finished")
    switches = switches or ReplaySwitches()
    # The chain whose call is the body: the source's, or the one the source replayed (a
    # replay given another name is a trace of that name, its chain still the recorded one).
    chain = run.config.get(REPLAYS_CHAIN_KEY) or run.pipeline
    name = name or stored_name(run.pipeline)
    ctx = RunContext(
        store=store,
        run_id=new_trace_id() if trace_id is None else trace_id,
        read_cache=True,
        chat_client=tracer.chat_client,
        clock=tracer.clock,
    )
    ctx.cached_kinds = switches.cached_kinds
    ctx.lineage, ctx.lineage_at = lineage_index(store, run)
    ctx.lineage_blobs = lineage_blobs(store, ctx.lineage)
    trace = Trace(
        name,
        input=recorded_input(store, run) if input is SOURCE_INPUT else input,
        store=lambda: store,
        run_context=ctx,
        clock=tracer.clock,
        trace_id=ctx.run_id,
        parent_run_id=run.run_id,
        raise_on_write_error=tracer.raise_on_write_error,
        config=_in_place_config(switches, chain, name),
        callbacks=tracer.callbacks,
    )
    if switches.stop_at_divergence:
        trace.stop_after = divergence_check(load_trace(store, run.run_id))
    # The source's rows as this process keeps them (read once per source): the replay is
    # compared with them when it is written, and steps proven equal by an earlier replay of
    # the same source are not built again (rewind.tracing.step_memo).
    with store.read() as conn:
        trace._source = source_rows(store, conn, run.run_id)
    ctx.failed_at.update(trace._source.failed_steps)
    ctx.failed_calls.update(trace._source.failed_calls)
    trace._input_from_source = input is SOURCE_INPUT
    trace._replays_chain = chain  # a call of this chain is the body, whatever ``name``
    return trace


REPLAYS_CHAIN_KEY = "replays_chain"
"""The config key of an in-place replay named otherwise than the chain it replays: that chain's
name, so a replay of this replay still runs the chain as its body."""


def _in_place_config(switches: ReplaySwitches, chain: str, name: str) -> dict[str, Any]:
    """An in-place replay's run config; the replayed chain's name only when the replay is
    named otherwise (a replay keeping the name writes nothing more)."""
    config: dict[str, Any] = {"replay_mode": IN_PLACE_MODE, "switches": switches.to_json()}
    if stored_name(chain) != name:
        config[REPLAYS_CHAIN_KEY] = stored_name(chain)  # as a store keeps names (no NUL)
    return config
