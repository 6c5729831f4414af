"""Steps of a replay already proven equal to their source's, remembered per source in-process.

Writing a replay (:func:`rewind.tracing.store.write_trace`) builds every step's rows (input,
output and state hashes, call and span rows) only to find, for an unchanged replay, that they
are exactly the source's rows and need not be stored (:mod:`rewind.store.references`). Once a
step at position *p* was found equal that way, the same step seen again in a later replay of
the same source needs no rows: when its data is the same, its rows are the same.

"The same data" is decided on a signature: the step's fields that its rows are made of (every
:class:`~rewind.tracing.model.StepData` field except its span id and timing, which the
comparison ignores too), as JSON with sorted keys (orjson). The values a tracer hands over are
plain JSON already (:func:`rewind.tracing.model.jsonable`), and orjson's text tells apart what the
hashes tell apart (``1``, ``1.0``, ``true`` and ``"1"``; ``0.0`` and ``-0.0``; list order);
anything else (an object, a non-string key, an integer beyond 64 bits, a date) makes the step
unsigned, and it is compared the full way. A signature equal to the remembered one therefore
implies equal rows; any difference, even one the hashes would not see, only sends the step
down the full comparison. What is kept is the signature's sha256 (32 bytes however large the
step's input), and the state fields (field → hash) the step changed, so the steps after the
shared prefix are built on the state they would have had; memory stays linear in the steps.

Entries are kept per source (the in-process :class:`~rewind.store.references.SourceRows`
object, immutable while its run exists, see :func:`rewind.tracing.tracer_source.source_rows`)
and per initial state of the trace, for the last :data:`SOURCES_KEPT` sources.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import threading
from collections import OrderedDict
from typing import Any

import orjson

from rewind.store.records import CallRecord
from rewind.store.references import SourceRows
from rewind.tracing.model import StepData

__all__ = ["SOURCES_KEPT", "held", "remember", "remembered", "signature"]

SOURCES_KEPT = 8
"""How many sources' proven steps this process keeps."""

_UNSIGNED_FIELDS = frozenset({"position", "span_id", "started_at", "ended_at", "duration_ms"})
_SIGNED = tuple(
    f.name
    for f in dataclasses.fields(StepData)
    if f.name not in _UNSIGNED_FIELDS and f.name not in ("calls", "pending", "effects")
)
_CALL_FIELDS = tuple(f.name for f in dataclasses.fields(CallRecord) if f.name != "latency_ms")
_signed_values = operator.attrgetter(*_SIGNED)
_call_values = operator.attrgetter(*_CALL_FIELDS)
_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)

# id of the source rows -> (the rows, {initial state hash: [(signature, fields changed)]})
_Entries = list[tuple[bytes, dict[str, str]]]
_MEMO: OrderedDict[int, tuple[SourceRows, dict[str, _Entries]]] = OrderedDict()
_LOCK = threading.Lock()


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)


def signature(s: StepData) -> bytes | None:
    """The sha256 of the step's signature (see the module docstring), or None when it has none:
    a value that is not plain JSON, or pending cache entries or effects (a step that stores
    rows of its own is never shared)."""
    if s.pending or s.effects:
        return None
    # Tuples of the fields (one attrgetter call each): orjson writes a tuple as the array a
    # list of the same values gives, so the text is what the field-by-field lists gave.
    values = (*_signed_values(s), [_call_values(c) for c in s.calls])
    try:
        text = orjson.dumps(values, default=_refuse, option=_OPTIONS)
    except (TypeError, orjson.JSONEncodeError):
        return None
    return hashlib.sha256(text).digest()


def remembered(source: SourceRows, init_hash: str) -> _Entries:
    """The proven steps of replays of ``source`` starting from state ``init_hash``, by position
    from 0 (a copy: entries are appended under the lock)."""
    with _LOCK:
        held = _MEMO.get(id(source))
        if held is None or held[0] is not source:
            return []
        _MEMO.move_to_end(id(source))
        return list(held[1].get(init_hash, ()))


def remember(
    source: SourceRows, init_hash: str, start: int, proven: list[tuple[bytes, dict[str, str]]]
) -> None:
    """Remember steps ``start, start + 1, ...`` of a replay of ``source`` as proven equal to the
    source's (their signatures and the state fields each changed). Kept only where they
    continue the entries held (positions 0.. without gaps)."""
    if not proven:
        return
    with _LOCK:
        held = _MEMO.get(id(source))
        if held is None or held[0] is not source:
            held = (source, {})
            _MEMO[id(source)] = held
            while len(_MEMO) > SOURCES_KEPT:
                _MEMO.popitem(last=False)
        entries = held[1].setdefault(init_hash, [])
        if len(entries) == start:
            entries.extend(proven)


def held() -> int:
    """How many proven steps this process holds, over every source (for diagnostics)."""
    with _LOCK:
        return sum(len(e) for _, per in _MEMO.values() for e in per.values())
