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
import re
import threading
from collections import OrderedDict
from typing import Any

import orjson

from rewind.store.records import CallRecord
from rewind.store.references import SourceRows
from rewind.tracing.model import StepData

__all__ = [
    "SOURCES_KEPT",
    "Proven",
    "doubtful",
    "held",
    "proven_of",
    "raw_text",
    "reads_back",
    "remember",
    "remembered",
    "signature",
    "text_of",
]

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


@dataclasses.dataclass(frozen=True)
class Proven:
    """A step proven equal to its source's, frozen as the tracer's lane needs it
    (:mod:`rewind.tracing.lane`). Its values are kept as orjson text (``inputs_text``: the
    inputs, keys sorted, as a signature has them; ``rest_text``: ``[params, fields,
    attributes]``, keys in their order), so nothing a caller does later to the step it handed
    over changes what is remembered, and every step rebuilt from it has fresh values."""

    signature: bytes
    name: str
    step_type: str
    parent_position: int
    inputs_text: bytes
    rest_text: bytes
    attributes_text: bytes
    fields_text: bytes
    calls: tuple[CallRecord, ...]
    prompt_tokens: int
    completion_tokens: int
    doubtful: bool = False
    """Whether ``inputs_text`` or ``attributes_text`` holds a ``null`` or a string shaped like
    a UUID (a value equal in text to them may then hold a NaN or a ``uuid.UUID`` there, which
    the hashes refuse: :func:`reads_back`)."""

    def step_data(
        self,
        position: int,
        inputs: dict[str, Any],
        attributes: dict[str, Any],
        timing: tuple[str, float | None, float | None, float],
        parsed: tuple[dict[str, Any], dict[str, Any]] | None = None,
    ) -> StepData:
        """The step rebuilt at ``position`` with a run's own inputs and attributes (the caller
        checked they are ``inputs_text`` and ``attributes_text``) and its span id, start, end
        and duration (``timing``): the same signed fields, so the same :attr:`signature`.
        ``parsed``: ``(params, fields)`` read from ``rest_text`` already for this step alone
        (fresh objects nothing else holds), used instead of reading it again."""
        if parsed is None:
            params, fields, _attributes = orjson.loads(self.rest_text)
        else:
            params, fields = parsed
        span_id, started_at, ended_at, duration_ms = timing
        out = object.__new__(StepData)
        out.__dict__.update(
            position=position,
            name=self.name,
            step_type=self.step_type,
            status="success",
            inputs=inputs,
            reads={},
            params=params,
            fields=fields,
            error_type=None,
            error_message=None,
            parent_position=self.parent_position,
            span_id=span_id,
            started_at=started_at,
            ended_at=ended_at,
            duration_ms=duration_ms,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            attributes=attributes,
            calls=list(self.calls),
            pending=[],
            effects=[],
            cache_outcome=None,
            cache_reason=None,
            determinism=None,
        )
        return out


def text_of(value: Any, *, sort_keys: bool = True) -> bytes | None:
    """``value`` as the orjson text a signature is made of (``sort_keys=False``: keys in their
    order), or None when it is not plain JSON or holds a value the hashes refuse that orjson
    writes as a plain one (:func:`reads_back`)."""
    text = raw_text(value, sort_keys=sort_keys)
    return text if text is not None and reads_back(text, value) else None


def raw_text(value: Any, *, sort_keys: bool = True) -> bytes | None:
    """:func:`text_of` without its check that the value reads back from the text
    (:func:`reads_back`): for a caller that compares the text with one of :func:`text_of`
    that is not :func:`doubtful` (so neither is the value's, when they are equal), or checks
    it itself."""
    try:
        return orjson.dumps(
            value,
            default=_refuse,
            option=_OPTIONS if sort_keys else _OPTIONS & ~orjson.OPT_SORT_KEYS,
        )
    except (TypeError, orjson.JSONEncodeError):
        return None


_UUID_TAIL = re.compile(rb'-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"')
"""The end of a JSON string as orjson writes a ``uuid.UUID`` (``"8-4-4-4-12"``, lower-case
hex). Searched from each ``-`` of a text (the pattern's literal first byte)."""


def doubtful(text: bytes) -> bool:
    """Whether orjson's ``text`` of a value might stand for a value the hashes refuse: it holds
    a ``null`` (orjson writes NaN and the infinities so) or a string ending like a UUID's
    (orjson writes a ``uuid.UUID`` as that string, natively: ``default`` is not called and no
    option refuses it). ~0.5 ns per byte, more on text dense with ``-`` and hex digits."""
    return b"null" in text or _UUID_TAIL.search(text) is not None


def reads_back(text: bytes, value: Any) -> bool:
    """Whether ``text`` (orjson's text of ``value``) stands for ``value`` alone, as far as the
    hashes see: a NaN, an infinity or a ``uuid.UUID`` in ``value`` (which the hashes refuse, a
    CanonicalError) must not share the text of a value holding None or that string there.
    Checked by reading the text back, only when it is :func:`doubtful` (then a value read back
    as another, a tuple or a str subclass, is refused too: the full comparison decides)."""
    return not doubtful(text) or orjson.loads(text) == value


def proven_of(s: StepData, sig: bytes) -> Proven | None:
    """The frozen form of a step proven equal (its signature ``sig``), or None when it is not
    a step a lane serves: anything but a successful step with its output as its only field and
    no reads, errors, kept outcomes or determinism, pending entries or effects."""
    if (
        s.status != "success"
        or s.reads
        or s.error_type is not None
        or s.error_message is not None
        or s.pending
        or s.effects
        or s.cache_outcome is not None
        or s.cache_reason is not None
        or s.determinism is not None
        or not isinstance(s.fields, dict)
        or list(s.fields) != [s.name]
    ):
        return None
    inputs_text = text_of(s.inputs)
    rest_text = text_of([s.params, s.fields, s.attributes], sort_keys=False)
    attributes_text = text_of(s.attributes, sort_keys=False)
    fields_text = text_of(s.fields, sort_keys=False)
    if inputs_text is None or rest_text is None or attributes_text is None or fields_text is None:
        return None
    return Proven(
        sig,
        s.name,
        s.step_type,
        s.parent_position,
        inputs_text,
        rest_text,
        attributes_text,
        fields_text,
        tuple(s.calls),
        int(s.prompt_tokens),
        int(s.completion_tokens),
        doubtful(inputs_text) or doubtful(attributes_text),
    )


# id of the source rows -> (the rows, {initial state hash: [(signature, fields changed,
# the step frozen for the tracer's lane or None)]})
_Entries = list[tuple[bytes, dict[str, str], Proven | None]]
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
    # The JSON-valued fields (the inputs as the caller gave them) hold no NaN, infinity or UUID
    # written as a plain value (see reads_back); the others are text, numbers and call records.
    documents = [s.inputs, s.reads, s.params, s.fields, s.attributes]
    if text_of(documents, sort_keys=False) is None:
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


def remember(source: SourceRows, init_hash: str, start: int, proven: _Entries) -> None:
    """Remember steps ``start, start + 1, ...`` of a replay of ``source`` as proven equal to the
    source's (their signatures, the state fields each changed, and the step itself). Kept only
    where they continue the entries held (positions 0.. without gaps)."""
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
