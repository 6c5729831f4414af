"""Replay a trace without its code: the recorded steps as a chain of recorded calls.

A trace imported from production tracing usually comes without importable chain code. It can
still be replayed: each step is taken in recorded order (nested as recorded) and

* a **model call** is sent again — its recorded request, with the change applied — through the
  LLM cache, so an unchanged request is served from the entry the import seeded (0 requests, 0
  tokens) and a changed one goes to the configured model endpoint;
* a **tool call** is served from its recorded result when its arguments are unchanged; with
  changed arguments it cannot run (its code is not here), so the step fails saying so;
* any other step (a chain or agent span, a retrieval without a tool call) keeps its recorded
  output.

A step the recording skipped, or that failed and was caught by the chain, keeps its recorded
status while the replay does not change it; and when the recorded chain itself raised, the
replay ends as it did: failed, with the recorded error (without the code nothing can show that
the chain would not raise again; :func:`ended_as_recorded` tells such a replay).

**How a change travels.** Without the code, the only data flow Rewind can see is text: a
changed input field (a string) and every changed answer are carried as verbatim substitutions
(old text → new text) into the inputs, requests and outputs of the steps after it. A step whose
request contains none of the changed texts is unchanged and served from the cache. A step param
change (``STEP.temperature=0.7``, any request field but ``messages``) applies to every model
call of the steps with that name. A step the import marked not replayable (its request was not
recorded whole) keeps its recorded output while nothing it shows depends on the change, and
fails saying why when something does (or when its inputs were not recorded at all, so nothing
shows it is untouched).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from rewind.cache import CallPolicy, Executed, through_cache
from rewind.call import CALL_FAILURES
from rewind.calls import send
from rewind.capture.exchange import ModelRequest, stored_request
from rewind.capture.http import call_of
from rewind.errors import EndpointUnavailable, InvalidOverride, RewindError
from rewind.llm import PROVIDER_DEFAULTS
from rewind.store import RunRecord, Store
from rewind.store.records import stored_name
from rewind.tracing.model import INPUT_KEY, StepView, TraceView
from rewind.tracing.switches import ReplaySwitches, replay_context, replay_trace_of, run_replay
from rewind.tracing.tracer import Step, StoppedAtDivergence, Trace

__all__ = ["RECORDED_MODE", "ended_as_recorded", "recorded_params", "replay_recorded"]

RECORDED_MODE = "recorded-calls"
"""The ``replay_mode`` of a replay without chain code (``chain`` when the code ran)."""


class NotReplayable(RewindError):
    """A recorded step cannot be replayed with the change (recorded on the step, not raised to
    the caller)."""


def recorded_params(store: Store, view: TraceView) -> dict[str, list[str]]:
    """Step name → the request fields a change may set on its model calls (every recorded
    request field but ``messages``, and every output-affecting parameter Rewind keys:
    :data:`rewind.llm.PROVIDER_DEFAULTS`), for the steps whose calls were recorded."""
    blobs = _request_blobs(store, view)
    out: dict[str, set[str]] = {}
    for s in view.steps:
        for c in s.calls:
            # A request an SDK sent (captured over HTTP) is served, never re-sent changed.
            if c.kind == "llm" and c.request_hash in blobs:
                if stored_request(blobs[c.request_hash]) is not None:
                    continue
                request = json.loads(blobs[c.request_hash])
                fields = out.setdefault(s.name, set(PROVIDER_DEFAULTS))
                fields.update(k for k in request if k != "messages")
    return {k: sorted(v) for k, v in out.items()}


def replay_recorded(
    store: Store,
    run: RunRecord,
    view: TraceView,
    *,
    change: Any,
    chat_client: Any,
    new_id: str,
    override: dict[str, Any] | None,
    switches: ReplaySwitches | None = None,
) -> RunRecord:
    """Replay ``view`` as its recorded calls (see the module doc) into a new trace ``new_id``.

    Args:
        store: holds the trace and its calls; the replay is written there.
        run, view: the recorded trace's run row and its steps.
        change: a :class:`rewind.tracing.replay.TraceChange` or None.
        chat_client: the model client for calls that miss (None: a miss fails the step).
        new_id: the replay's trace id.
        override: the change as the run row keeps it.
        switches: :class:`ReplaySwitches` (None: the defaults).
    Returns:
        the replay's run row; ``config.replay_mode`` is :data:`RECORDED_MODE`.
    Raises:
        InvalidOverride: an input change that is not text (a recorded-calls replay can carry only
            text into the recorded requests). Nothing is written.
        EndpointUnavailable: a call missed and the endpoint cannot be reached (the replay is
            written, failed at that step).
    """
    chain_input = copy.deepcopy(view.input)
    subs: list[tuple[str, str]] = []
    overrides: dict[str, dict[str, Any]] = {}
    if change is not None and change.target == INPUT_KEY:
        node = chain_input
        for key in change.path[:-1]:
            node = node[key]
        old = node.get(change.path[-1])
        if not isinstance(old, str) or not isinstance(change.value, str) or not old:
            raise InvalidOverride(
                f"input.{'.'.join(change.path)} is not text; a replay without the chain's code "
                "can only carry changed text into the recorded requests",
                "pass --chain module:function to run the chain's code",
            )
        node[change.path[-1]] = change.value
        subs.append((old, change.value))
    elif change is not None:
        overrides = {change.target: {change.path[0]: change.value}}
    switches = switches or ReplaySwitches()
    ctx = replay_context(
        store,
        run,
        view,
        run_id=new_id,
        param_overrides={k.partition("#")[0]: v for k, v in overrides.items()},
        chat_client=chat_client,
        switches=switches,
    )
    requests = _request_blobs(store, view)
    trace = replay_trace_of(
        store,
        run,
        view,
        ctx,
        chain_input=chain_input,
        override=override,
        mode=RECORDED_MODE,
        switches=switches,
    )
    return run_replay(trace, lambda: _replay_steps(trace, view, requests, subs, overrides, []))


def _replay_steps(
    trace: Trace,
    view: TraceView,
    requests: Mapping[str, bytes],
    subs: list[tuple[str, str]],
    overrides: Mapping[str, Mapping[str, Any]],
    stack: list[tuple[StepView, Step]],
) -> EndpointUnavailable | None:
    """Replay the recorded steps in order. A step that fails (a missed call whose endpoint is
    down, a tool that cannot run again, a step not replayable) is recorded failed and the rest
    still replays; then the first failure is raised, so the replay is written failed rather
    than with the recorded output (an EndpointUnavailable first: the caller learns the model
    endpoint is down)."""
    unavailable: EndpointUnavailable | None = None
    failed: RewindError | None = None
    try:
        for s in view.steps:
            while stack and stack[-1][0].position != s.parent_position:
                _close(*stack.pop(), subs)
            step = trace.step(
                stored_name(s.name), s.step_type, inputs=_substituted(_inputs(s), subs)
            )
            step.set(**s.attributes)
            step.start()
            stack.append((s, step))
            changes = overrides.get(view.occurrence(s)) or overrides.get(s.name) or {}
            try:
                if not _run_calls(s, step, requests, subs, changes):
                    _as_recorded(s, step)
            except EndpointUnavailable as exc:
                unavailable = unavailable or exc
                step.finish(exc)
            except RewindError as exc:  # NotReplayable, ModelCallError...
                failed = failed or exc
                step.finish(exc)
        while stack:
            _close(*stack.pop(), subs)
    except StoppedAtDivergence as stop:
        trace.stop_after = None
        while stack:
            stack.pop()[1].finish(stop)
        raise
    if unavailable is not None:
        raise unavailable
    if failed is not None:
        raise failed
    trace.set_output(_substituted(view.output, subs))
    if view.failed:  # the recorded chain raised after these steps: it ends as it did
        trace.fail(view.error_message or "", view.error_type or "ChainFailed")
    return None


def ended_as_recorded(source: TraceView, replay: TraceView) -> bool:
    """Whether ``replay``, a recorded-calls replay of ``source``, failed because the recorded
    chain raised (it ends with the recorded error, see the module doc), not because a step of
    the replay failed."""
    return (
        replay.config.get("replay_mode") == RECORDED_MODE
        and source.failed
        and replay.failed
        and (replay.error_type, replay.error_message) == (source.error_type, source.error_message)
    )


def _inputs(s: StepView) -> dict[str, Any]:
    inputs = s.input_doc.get("inputs") if isinstance(s.input_doc, Mapping) else None
    return dict(inputs) if isinstance(inputs, Mapping) else {}


def _as_recorded(s: StepView, step: Step) -> None:
    """Give a step the replay left unchanged its recorded status: skipped, or failed with the
    recorded error (a failure the chain caught: an unchanged replay keeps it, so its hashes,
    and the state of every step after it, are the recording's)."""
    if s.status == "skipped":
        step.skip()  # the reason is among the attributes set already
    elif s.status == "failed":
        step.fail(s.error_message or "", s.error_type or "StepFailed")


def _close(s: StepView, step: Step, subs: list[tuple[str, str]]) -> None:
    if step.status in ("running", "skipped", "failed") and step.ended_at is None:
        if not any(c.kind == "llm" for c in s.calls) and (
            s.output_hash is not None or s.status == "success"
        ):
            step.set_output(_substituted(s.output, subs))
        step.finish()


def _run_calls(
    s: StepView,
    step: Step,
    requests: Mapping[str, bytes],
    subs: list[tuple[str, str]],
    changes: Mapping[str, Any],
) -> bool:
    """Send the step's recorded calls again, changed by ``subs`` and ``changes`` (request field
    → value). Returns whether the step is not the recorded one: a change applies to it, its
    answer is another, or a changed text reaches its inputs or output."""
    if s.attributes.get("replayable") is False:
        _check_untouched(s, subs, changes)
        return False
    changed = bool(changes) or _substituted(s.output, subs) != s.output
    changed = changed or _substituted(_inputs(s), subs) != _inputs(s)
    answer: str | None = None
    resent = False
    for c in s.calls:
        raw = requests.get(c.request_hash)
        if raw is None:
            continue
        request = json.loads(raw)
        captured = stored_request(raw) if c.kind == "llm" else None
        if captured is not None:
            changed = bool(changes) or _substituted(request, subs) != request
            _serve_captured(s.name, captured, changed)
            continue
        if c.kind == "llm":
            same = not changes and _substituted(request, subs) == request
            resent = resent or not same
            answer = _send_recorded(c.outcome == "failed" and same, request, step, subs, changes)
        else:
            _serve_tool(stored_name(c.name), c.key, raw, _substituted(request, subs) != request)
    answered = _set_answer(s, step, subs, answer, resent=resent)
    return changed or answered


def _send_recorded(
    raised: bool,
    request: dict[str, Any],
    step: Step,
    subs: list[tuple[str, str]],
    changes: Mapping[str, Any],
) -> str | None:
    """:func:`_send_changed`; ``raised``: the recorded call raised (a ``failed`` call row) and
    is sent unchanged, so the cache raises its recorded failure again (``failed:replayed``,
    nothing sent): that failure is the recording's, not the endpoint being down now. It gives
    no answer (None) and the step ends as recorded."""
    if not raised:
        return _send_changed(request, step, subs, changes)
    try:
        return _send_changed(request, step, subs, changes)
    except CALL_FAILURES:
        return None


def _set_answer(
    s: StepView, step: Step, subs: list[tuple[str, str]], answer: str | None, *, resent: bool
) -> bool:
    """Set the replayed step's output from its model ``answer`` (None: no model call; ``resent``:
    a model request of the step was changed). Returns whether the answer is another than the
    recorded one, whose old → new text then joins ``subs``."""
    old = _recorded_answer(s)
    if answer is None or (old is None and not resent):
        # No model call, or one sent unchanged whose recorded answer has no text (a tool call:
        # the import kept the message as the output): the recorded output is the answer.
        if s.output_hash is not None or s.status == "success":
            step.set_output(_substituted(s.output, subs))
        return False
    if old and answer != old:
        subs.append((old, answer))
        step.set_output(_substituted(s.output, subs))
        return True
    step.set_output(_substituted(s.output, subs) if old else answer)
    return False


def _check_untouched(s: StepView, subs: list[tuple[str, str]], changes: Mapping[str, Any]) -> None:
    """Raise :class:`NotReplayable` when a step recorded without its content (attribute
    ``replayable`` false) may depend on the change."""
    recorded = _inputs(s)
    # Without recorded inputs nothing shows that the step is untouched by the change.
    if changes or (subs and (not recorded or _substituted(recorded, subs) != recorded)):
        raise NotReplayable(
            f"step {s.name!r} depends on the change but was not recorded whole: "
            f"{s.attributes.get('not_replayable')}",
            "record the production trace with message content and parameters captured",
        )


def _send_changed(
    request: dict[str, Any],
    step: Step,
    subs: list[tuple[str, str]],
    changes: Mapping[str, Any],
) -> str | None:
    """Send a recorded chat body again with ``subs`` applied to its messages and ``changes``
    (request field → value) set; returns the answer's content."""
    body = dict(request)
    body["messages"] = _substituted(body.get("messages"), subs)
    for name, value in changes.items():
        body[name] = value
        if step.scope is not None:  # recorded like rewind.param: enters the input hash
            step.scope.params[name] = value
    return send(body).content


def _serve_tool(name: str, key: str, request: bytes, changed: bool) -> None:
    from rewind.context import current

    if changed:
        raise NotReplayable(
            f"tool {name!r} is called with changed arguments and its code is not here",
            "pass --chain module:function to run the chain's code",
        )

    def refuse() -> Executed:
        raise NotReplayable(
            f"tool {name!r} cannot run again: its code is not here",
            "serve its recorded result (--cached-tools) or pass --chain module:function",
        )

    ctx = current()
    assert ctx is not None
    through_cache(
        ctx,
        kind="tool",
        name=name,
        key=key,
        request=request,
        execute=refuse,
        policy=CallPolicy("deterministic"),
    )


def _serve_captured(step_name: str, described: ModelRequest, changed: bool) -> None:
    """Serve a model request an SDK sent (captured at the HTTP transport) from the cache. Its
    stored form has no credentials and its answer is the SDK's, so without the chain's code a
    changed request cannot be sent again, nor a missing answer rebuilt."""
    from rewind.context import current

    if changed:
        raise NotReplayable(
            f"step {step_name!r} sent its model request through an SDK (captured over HTTP) and "
            "the change alters it; it cannot be sent again without the chain's code",
            "pass --chain module:function to run the chain's code",
        )

    def refuse() -> Executed:
        raise NotReplayable(
            f"the SDK model request of step {step_name!r} is not in the cache and cannot be "
            "sent again without the chain's code",
            "serve it from the cache (--cached-llm) or pass --chain module:function",
        )

    ctx = current()
    assert ctx is not None
    through_cache(ctx, execute=refuse, **call_of(described))


def _recorded_answer(s: StepView) -> str | None:
    for call in s.llm_calls:
        if call.content:
            return call.content
    return s.output if isinstance(s.output, str) else None


def _substituted(value: Any, subs: list[tuple[str, str]]) -> Any:
    """``value`` with every ``old`` text replaced by ``new`` in its strings (keys kept)."""
    if not subs:
        return value
    if isinstance(value, str):
        for old, new in reversed(subs):
            if value == old:
                return new
        # Longest first: a recorded answer usually contains the text it was asked about.
        for old, new in sorted(subs, key=lambda pair: -len(pair[0])):
            value = value.replace(old, new)
        return value
    if isinstance(value, Mapping):
        return {k: _substituted(v, subs) for k, v in value.items()}
    if isinstance(value, list):
        return [_substituted(v, subs) for v in value]
    return value


def _request_blobs(store: Store, view: TraceView) -> dict[str, bytes]:
    wanted = {c.request_hash for s in view.steps for c in s.calls}
    return store.get_blobs(wanted) if wanted else {}
