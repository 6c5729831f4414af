"""Side-effect audit records on OpenTelemetry spans (``rewind.effects``, ``rewind.determinism``).

An exported run must audit like the original once imported (issue 12, seed 004): so every step
span of a Rewind export carries its node's determinism flag and, for each side-effecting call,
the call's identity (index, tool, cache key, outcome, result hash) with the pre/post fingerprints
of every resource it touched. Pinned snapshots are not carried (only their bytes could restore a
resource): an imported run audits, but a ``live`` replay of it refuses to restore.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rewind.store.records import CallRecord, EffectRecord

__all__ = ["EFFECTS_ATTRIBUTE", "effects_attribute", "effects_from_attribute"]

EFFECTS_ATTRIBUTE = "rewind.effects"
"""Span attribute: JSON list, one entry per side-effecting call of the step."""

_MAX_ENTRIES = 10_000


def effects_attribute(calls: Sequence[CallRecord], effects: Sequence[EffectRecord]) -> str | None:
    """The ``rewind.effects`` attribute of a step: its side-effecting calls with their effect
    fingerprints, or None when the step made none.

    Args:
        calls: the step's calls (only ``determinism == "side-effect"`` ones are carried).
        effects: the step's effect rows (matched to calls by call index).
    Returns:
        compact JSON text: ``[{"call_index", "tool", "key", "request_hash", "result_hash",
        "outcome", "reason", "produced_at", "resources": [{"resource", "kind", "mode", "pre",
        "post", "idempotency_key", "spec"}]}]`` with ``pre``/``post`` = ``{"digest", "epoch"}``.
    """
    by_call: dict[int, list[EffectRecord]] = {}
    for e in effects:
        by_call.setdefault(e.call_index, []).append(e)
    out = []
    for c in calls:
        if c.determinism != "side-effect":
            continue
        out.append(
            {
                "call_index": c.call_index,
                "tool": c.name,
                "key": c.key,
                "request_hash": c.request_hash,
                "result_hash": c.result_hash,
                "outcome": c.outcome,
                "reason": c.reason,
                "produced_at": c.produced_at,
                "resources": [
                    {
                        "resource": e.resource,
                        "kind": e.kind,
                        "mode": e.mode,
                        "pre": {"digest": e.pre_digest, "epoch": e.pre_epoch},
                        "post": {"digest": e.post_digest, "epoch": e.post_epoch},
                        "idempotency_key": e.idempotency_key,
                        "spec": e.spec,
                    }
                    for e in sorted(by_call.get(c.call_index, []), key=lambda e: e.resource)
                ],
            }
        )
    if not out:
        return None
    return json.dumps(out, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def effects_from_attribute(value: Any) -> list[dict[str, Any]]:
    """Effect rows (as :mod:`rewind.effects` builds them, without ``run_id``/``position``, which
    the trace writer fills in) from a ``rewind.effects`` attribute; each row carries its call
    under ``_call`` (a :class:`CallRecord`) so a run imported without its ``rewind.calls`` still
    knows its side-effecting calls. Malformed entries are skipped; never raises."""
    try:
        entries = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return []
    if not isinstance(entries, list):
        return []
    rows: list[dict[str, Any]] = []
    for item in entries[:_MAX_ENTRIES]:
        try:
            call = CallRecord(
                call_index=int(item["call_index"]),
                kind="tool",
                name=str(item["tool"]),
                key=str(item["key"]),
                request_hash=str(item["request_hash"]),
                result_hash=None if item.get("result_hash") is None else str(item["result_hash"]),
                outcome=str(item.get("outcome") or "miss"),
                reason=str(item.get("reason") or "imported"),
                determinism="side-effect",
                produced_at=_number(item.get("produced_at")),
            )
            for r in item.get("resources") or []:
                pre, post = r.get("pre") or {}, r.get("post") or {}
                spec = r.get("spec")
                rows.append(
                    {
                        "call_index": call.call_index,
                        "resource": str(r["resource"])[:400],
                        "kind": str(r["kind"])[:32],
                        "mode": str(r.get("mode") or "record")[:16],
                        "pre_digest": _text(pre.get("digest")),
                        "pre_epoch": _text(pre.get("epoch")),
                        "post_digest": _text(post.get("digest")),
                        "post_epoch": _text(post.get("epoch")),
                        "snapshot_hash": None,  # snapshots are not exported
                        "idempotency_key": _text(r.get("idempotency_key")),
                        "spec_json": json.dumps(spec, sort_keys=True)
                        if isinstance(spec, dict)
                        else None,
                        "_call": call,
                    }
                )
            if not item.get("resources"):
                rows.append({"call_index": call.call_index, "_call": call})
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return rows


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
