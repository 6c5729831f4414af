"""Replay switches (seed 003) and the run context every trace replay starts from.

Shared by the two replay modes (:mod:`rewind.tracing.replay` runs the chain's code,
:mod:`rewind.tracing.recorded` re-sends the recorded calls).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rewind.canonical import canonical_bytes
from rewind.context import LineageEntry, RunContext
from rewind.errors import EndpointUnavailable, RewindError
from rewind.store import RunRecord, Store
from rewind.store.records import stored_name
from rewind.tracing.model import StepData, TraceView, jsonable
from rewind.tracing.store import lineage_blobs, lineage_index
from rewind.tracing.tracer import Trace

__all__ = [
    "ReplaySwitches",
    "divergence_check",
    "replay_context",
    "replay_trace_of",
    "run_replay",
]


@dataclass(frozen=True)
class ReplaySwitches:
    """The replay switches of seed 003.

    Attributes:
        cached_llm: serve unchanged model calls from the recorded answers (default). False
            re-sends every model call (spends tokens; shows how much a model's answers vary).
        cached_tools: serve unchanged tool calls from their recorded results (default). False
            runs every tool again (in a replay of recorded calls, a tool without its code then
            fails its step, saying so).
        stop_at_divergence: end the replay right after the first step whose status or output
            differs from the recorded step at the same position; the replay is written failed
            with :class:`rewind.tracing.tracer.StoppedAtDivergence` naming that step.
    """

    cached_llm: bool = True
    cached_tools: bool = True
    stop_at_divergence: bool = False

    @property
    def cached_kinds(self) -> frozenset[str]:
        """The call kinds served from the cache (:attr:`rewind.context.RunContext.cached_kinds`)."""
        return frozenset(
            k for k, on in (("llm", self.cached_llm), ("tool", self.cached_tools)) if on
        )

    def to_json(self) -> dict[str, bool]:
        """The switches as the replay's run config keeps them."""
        return {
            "cached_llm": self.cached_llm,
            "cached_tools": self.cached_tools,
            "stop_at_divergence": self.stop_at_divergence,
        }


def divergence_check(view: TraceView) -> Callable[[StepData], str | None]:
    """A :attr:`Trace.stop_after` predicate: the reason to stop after a replayed step whose name,
    status or output differs from the recorded step at its position, else None."""
    recorded = {s.position: s for s in view.steps}

    def check(data: StepData) -> str | None:
        before = recorded.get(data.position)
        where = f"step {data.name!r} (#{data.position + 1})"
        if before is None or before.name != data.name:
            return f"stopped at the first divergence: {where} is not the recorded step"
        if str(data.status) != str(before.status):
            return (
                f"stopped at the first divergence: {where} {data.status}, recorded {before.status}"
            )
        if data.fields is not None and canonical_bytes(jsonable(data.fields)) != canonical_bytes(
            jsonable(before.output_fields)
        ):
            return f"stopped at the first divergence: {where} changed its output"
        return None

    return check


def replay_context(
    store: Store,
    run: RunRecord,
    view: TraceView,
    *,
    run_id: str,
    param_overrides: dict[str, dict[str, Any]],
    chat_client: Any,
    switches: ReplaySwitches,
) -> RunContext:
    """The run context of a replay of ``run``: cache reads on, the recorded trace's calls as its
    lineage (served first, so an unchanged replay returns exactly the recorded results), the
    switches' cached call kinds, and the one change as ``param_overrides``.

    The lineage is indexed by step position and key too (served before the key alone): a trace
    that sent one request at several steps got an answer per step, and a lineage by key alone
    served every step the last one (what ``Tracer(read_cache=True)`` and the in-place replay
    already did)."""
    ctx = RunContext(
        store=store,
        run_id=run_id,
        read_cache=True,
        param_overrides=param_overrides,
        chat_client=chat_client,
        fork_node=view.steps[0].name if view.steps else None,
    )
    ctx.cached_kinds = switches.cached_kinds
    ctx.lineage, ctx.lineage_at = lineage_index(store, run)
    ctx.lineage_blobs = lineage_blobs(store, ctx.lineage)
    ctx.failed_at.update((s.position, s.name) for s in view.steps if s.status == "failed")
    ctx.failed_calls.update(
        (
            (s.position, c.key),
            LineageEntry(c.result_hash, c.produced_at, run.run_id, s.position, c.call_index),
        )
        for s in view.steps
        for c in s.calls
        if c.outcome == "failed" and c.result_hash
    )
    return ctx


def replay_trace_of(
    store: Store,
    run: RunRecord,
    view: TraceView,
    ctx: RunContext,
    *,
    chain_input: dict[str, Any],
    override: dict[str, Any] | None,
    mode: str,
    switches: ReplaySwitches,
    chain_ref: str | None = None,
) -> Trace:
    """The new trace a replay of ``run`` writes: its parent is ``run``, its config says the
    replay ``mode`` and ``switches``, and it stops after the first divergent step when asked."""
    trace = Trace(
        stored_name(view.name),
        input=chain_input,
        store=lambda: store,
        run_context=ctx,
        trace_id=ctx.run_id,
        chain_ref=chain_ref,
        attributes=dict(view.attributes),
        parent_run_id=run.run_id,
        override=override,
        raise_on_write_error=True,
        config={"replay_mode": mode, "switches": switches.to_json()},
    )
    if switches.stop_at_divergence:
        trace.stop_after = divergence_check(view)
    return trace


def run_replay(trace: Trace, body: Callable[[], EndpointUnavailable | None]) -> RunRecord:
    """Run a replay's ``body`` inside ``trace`` and write it.

    What the body raises is written on the replay as its failure (a chain's exception,
    :class:`rewind.tracing.tracer.StoppedAtDivergence`). ``body`` returns (or raises) the
    :class:`EndpointUnavailable` a missed call met; it is raised once the replay is written, so
    the caller learns that the model endpoint is down.

    Raises:
        EndpointUnavailable: as above, naming the written replay (``run_id``). RewindError: the
            replay could not be written.
    """
    unavailable: EndpointUnavailable | None = None
    try:
        with trace:
            unavailable = body()
    except EndpointUnavailable as exc:
        unavailable = exc
    except Exception:  # written on the replay as its failure
        pass
    if trace.record is None:
        raise RewindError(
            f"the replay {trace.trace_id} could not be written: {trace.write_error}",
            "check that the store is writable",
        )
    if unavailable is not None:
        # The replay is written (failed at that step): the error names it, so the CLI exits 1
        # and points at it instead of calling it bad input (exit 2, nothing written).
        raise unavailable.for_run(trace.record.run_id) from unavailable
    return trace.record
