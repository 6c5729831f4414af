"""Recording: Burr lifecycle hooks that write one node row per step.

The recorder is handed to Burr as its state persister in "lifecycle adapter" mode, so one
post-step transaction writes the node row, its calls, the cache entries they produced and the
content-addressed state row together: a crash can never leave a node without its state or the
other way round. Hooks never raise into Burr (a raising hook aborts the run before the state is
saved); failures are collected in :attr:`Recorder.errors` and fail the run afterwards.
"""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

from burr.core import State
from burr.core.action import Action
from burr.lifecycle import PostRunStepHook, PreRunStepHook

from rewind.canonical import CanonicalError, canonical_bytes, sha256_hex
from rewind.context import NodeScope, RunContext
from rewind.persister import RewindPersister, state_fields

logger = logging.getLogger(__name__)

BURR_INTERNAL_PREFIX = "__"
"""Burr keeps ``__PRIOR_STEP``/``__SEQUENCE_ID`` in state; semantic state drops them (rule 1)."""


def semantic_state(values: dict[str, Any]) -> dict[str, Any]:
    """State minus Burr's internal ``__`` keys (DESIGN rule 1)."""
    return {k: v for k, v in values.items() if not k.startswith(BURR_INTERNAL_PREFIX)}


def object_bytes(parts: dict[str, bytes]) -> bytes:
    """Canonical bytes of an object whose values are already canonical bytes.

    Equal to ``canonical_bytes({k: loads(v)})`` without decoding and re-encoding every value;
    keys are ordered by UTF-16 code units as RFC 8785 requires.
    """
    keys = sorted(parts, key=lambda k: k.encode("utf-16-be"))
    return b"{" + b",".join(canonical_bytes(k) + b":" + parts[k] for k in keys) + b"}"


def _jsonable_bytes(value: Any) -> bytes:
    try:
        return canonical_bytes(value)
    except CanonicalError:
        # A live object (a client, a connection) passed as a Burr input: hash its type only.
        return canonical_bytes({"$unhashable": type(value).__name__})


class Recorder(PreRunStepHook, PostRunStepHook):
    """Burr hooks recording every node of a run into Rewind's store.

    Args:
        ctx: the run context (store, run id, overrides, cache policy).
        persister: writes the content-addressed state rows.
        first_position: position (0-based) of the first node this recorder will see; a fork's
            inherited nodes occupy the positions before it.
    """

    def __init__(self, ctx: RunContext, persister: RewindPersister, first_position: int = 0):
        self.ctx = ctx
        self.persister = persister
        self.position = first_position
        self.errors: list[str] = []
        self.executed: list[str] = []
        self._reads_bytes = b"{}"
        self._inputs_bytes = b"{}"

    def is_async(self) -> bool:
        """Burr asks its persister this; the recorder is synchronous."""
        return False

    def pre_run_step(
        self,
        *,
        app_id: str,
        partition_key: str,
        sequence_id: int,
        state: State,
        action: Action,
        inputs: dict[str, Any],
        **future_kwargs: Any,
    ) -> None:
        try:
            self.ctx.begin_node(action.name, self.position)
            reads = [k for k in action.reads if k in state]
            self._reads_bytes = object_bytes(state_fields(state.subset(*reads)))
            self._inputs_bytes = object_bytes(
                {k: _jsonable_bytes(v) for k, v in (inputs or {}).items()}
            )
            self.ctx.emit("node_started", position=self.position, name=action.name)
        except Exception as exc:
            self._fail("before", action, exc)

    def post_run_step(
        self,
        *,
        app_id: str,
        partition_key: str,
        sequence_id: int,
        state: State,
        action: Action,
        result: dict[str, Any] | None,
        exception: Exception | None,
        **future_kwargs: Any,
    ) -> None:
        try:
            self._write(app_id, partition_key, sequence_id, state, action, exception)
        except Exception as exc:
            self._fail("after", action, exc)
        finally:
            self.position += 1
            self.ctx.node = None

    def _write(
        self,
        app_id: str,
        partition_key: str | None,
        sequence_id: int,
        state: State,
        action: Action,
        exception: Exception | None,
    ) -> None:
        scope = self.ctx.node
        if scope is None or scope.name != action.name:
            scope = self.ctx.begin_node(action.name, self.position)
        latency_ms = (time.perf_counter() - scope.started_perf) * 1000
        fields = state_fields(state)
        params_bytes = canonical_bytes(scope.params)
        input_doc = object_bytes(
            {
                "inputs": self._inputs_bytes,
                "node": canonical_bytes(action.name),
                "params": params_bytes,
                "reads": self._reads_bytes,
            }
        )
        input_hash = sha256_hex(input_doc)
        if exception is None:
            output = object_bytes({k: fields[k] for k in action.writes if k in fields})
            output_hash: str | None = sha256_hex(output)
            semantic = object_bytes(semantic_state(fields))
            state_hash: str | None = sha256_hex(semantic)
        else:
            output, output_hash, state_hash = b"", None, None
        outcome, reason = node_outcome(scope, exception)
        prompt_tokens, completion_tokens = scope.tokens
        store = self.ctx.store
        with store.write() as conn:
            for pw in scope.pending.values():
                store.put_blob_hashed(conn, pw.request_hash, pw.request_bytes)
                store.put_blob_hashed(conn, pw.result_hash, pw.result_bytes)
                if pw.kind == "llm":
                    store.llm_cache_put(
                        conn,
                        key=pw.key,
                        model=pw.name,
                        request_hash=pw.request_hash,
                        response_hash=pw.result_hash,
                        prompt_tokens=pw.prompt_tokens,
                        completion_tokens=pw.completion_tokens,
                    )
                else:
                    store.tool_cache_put(
                        conn,
                        key=pw.key,
                        tool=pw.name,
                        args_hash=pw.request_hash,
                        result_hash=pw.result_hash,
                    )
            store.put_blob_hashed(conn, input_hash, input_doc)
            if output_hash is not None:
                store.put_blob_hashed(conn, output_hash, output)
            self.persister.save_in(
                conn,
                partition_key,
                app_id,
                sequence_id,
                action.name,
                fields,
                "completed" if exception is None else "failed",
            )
            store.insert_node(
                conn,
                {
                    "run_id": self.ctx.run_id,
                    "position": self.position,
                    "name": action.name,
                    "sequence_id": sequence_id,
                    "src_app_id": app_id,
                    "src_sequence_id": sequence_id,
                    "inherited": False,
                    "input_hash": input_hash,
                    "output_hash": output_hash,
                    "state_hash": state_hash,
                    "params_json": params_bytes.decode(),
                    "latency_ms": latency_ms,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "cache_outcome": outcome,
                    "cache_reason": reason,
                    "error": None if exception is None else _error_line(exception),
                    "started_at": scope.started_at,
                },
                scope.calls,
            )
        self.executed.append(action.name)
        self.ctx.emit(
            "node_finished",
            position=self.position,
            name=action.name,
            outcome=outcome,
            reason=reason,
            tokens=prompt_tokens + completion_tokens,
            latency_ms=latency_ms,
            output_hash=output_hash,
        )

    def _fail(self, when: str, action: Action, exc: Exception) -> None:
        msg = f"recording {when} node {action.name!r} failed: {_error_line(exc)}"
        logger.error("%s\n%s", msg, traceback.format_exc())
        self.errors.append(msg)


def node_outcome(scope: NodeScope, exception: Exception | None) -> tuple[str, str]:
    """A node's cache outcome and reason from its calls (DESIGN rule 6).

    ``failed``/<exception type> when the node raised; ``none``/``no-calls`` when it made no
    cacheable call; ``hit``/``hit`` when every call hit; otherwise ``miss`` with the first miss's
    reason (``bypass``, ``override``, ``new-input``, ``no-entry``).
    """
    if exception is not None:
        return "failed", type(exception).__name__
    if not scope.calls:
        return "none", "no-calls"
    for call in scope.calls:
        if call.outcome != "hit":
            return "miss", call.reason
    return "hit", "hit"


def _error_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]
