"""The tracing vocabulary: step types and statuses, and the two shapes a trace takes.

A trace *is* a run and each step *is* a node row (DESIGN: one store, one vocabulary). What a node
row cannot say lives in the ``spans`` table. Two value shapes move between the modules:

* :class:`TraceData` / :class:`StepData` — a trace about to be written (decoded values; the store
  module encodes and hashes them exactly as the Burr recorder does);
* :class:`TraceView` / :class:`StepView` — a stored run or trace read back for analysis. A Burr run
  reads as a trace too: its nodes become steps whose type is inferred from their calls.

How a step maps onto a node row: the step's input is the node's Burr ``inputs`` (a dict; a value
that is not a dict is wrapped as ``{"input": value}``), its params are the params it read with
:func:`rewind.param`, and its output is one state field named after the step, so the trace's
semantic state after step *k* is the chain input's fields plus the latest output of every step
so far — the same Merkle hashes, ``rewind show`` and ``rewind diff`` as a Burr run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import date, datetime
from datetime import time as dtime
from enum import StrEnum
from typing import Any

from rewind.canonical import MAX_DEPTH, CanonicalError, canonical_bytes, sha256_hex, utf16_key
from rewind.context import PendingWrite
from rewind.store.records import CallRecord, EffectRecord, has_lone_surrogate, storable_text

__all__ = [
    "CHAIN_TYPE",
    "ROOT_POSITION",
    "StepData",
    "StepStatus",
    "StepType",
    "StepView",
    "TraceData",
    "TraceView",
    "error_line",
    "jsonable",
    "plain_fields",
    "run_status_of",
    "split_error",
    "trace_status_of",
]

ROOT_POSITION = -1
"""Position of the trace's own row (the root span) in the ``spans`` table."""

CHAIN_TYPE = "chain"
"""Step type of the root span (the chain itself)."""

INPUT_KEY = "input"
"""Key a non-dict input is wrapped under, and the ``--set input.…`` prefix of a replay."""


class _SourceInput:
    """The type of :data:`SOURCE_INPUT` (its repr names it in signatures)."""

    def __repr__(self) -> str:
        return "SOURCE_INPUT"


SOURCE_INPUT: Any = _SourceInput()
"""Default ``input`` of ``Tracer.replay`` (:func:`rewind.tracing.replay.replay_in_place`):
the input the source trace recorded."""


class StepType(StrEnum):
    """What a step does; the inspector checks each type for its own failure modes."""

    LLM_CALL = "llm_call"
    RETRIEVAL = "retrieval"
    TOOL_CALL = "tool_call"
    TRANSFORM = "transform"
    PARSE = "parse"
    VALIDATE = "validate"


class StepStatus(StrEnum):
    """Where a step (or a trace) is in its life."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    SKIPPED = "skipped"


STEP_TYPES = tuple(t.value for t in StepType)
_STEP_TYPE_SET = frozenset(STEP_TYPES)
STEP_STATUSES = tuple(s.value for s in StepStatus)

_TO_RUN = {
    "success": "completed",
    "failed": "failed",
    "running": "running",
    "pending": "running",
    "skipped": "completed",
}
_TO_TRACE = {"completed": "success", "failed": "failed", "running": "running"}


def run_status_of(trace_status: str) -> str:
    """The ``runs.status`` of a trace status (``success`` → ``completed``)."""
    return _TO_RUN.get(trace_status, "failed")


def trace_status_of(run_status: str) -> str:
    """The trace status of a run status (``completed`` → ``success``; ``interrupted`` and
    anything unknown → ``failed``)."""
    return _TO_TRACE.get(run_status, "failed")


def step_type_of(value: str | StepType) -> str:
    """Validate a step type given as an enum or a string.

    Raises:
        ValueError: not one of :data:`STEP_TYPES`.
    """
    if type(value) is str and value in _STEP_TYPE_SET:
        return value
    text = str(value.value if isinstance(value, StepType) else value)
    if text not in STEP_TYPES:
        raise ValueError(f"unknown step type {text!r}; use one of {', '.join(STEP_TYPES)}")
    return text


# -- values ------------------------------------------------------------------------------------


_EXACT_INT = 2**63


def jsonable(value: Any, _depth: int = 0) -> Any:
    """A plain JSON value (dict/list/str/int/float/bool/None) the canonical hasher accepts.

    Values the hasher takes are returned as their canonical JSON decoded again (tuples become
    lists, dataclasses and pydantic models dicts). Dates and times become ISO strings. Anything
    else (a client object, NaN, bytes) becomes ``{"$unhashable": "<type>"}`` at the place it
    occurs, so one odd argument does not hide the rest of an input. Never raises.
    """
    t = type(value)
    if t is str and value.isascii():  # the common scalars, as the round trip returns them
        return value
    if t is bool or value is None or (t is int and -_EXACT_INT < value < _EXACT_INT):
        return value
    if t is dict and not value:
        return {}
    if t is dict or t is list:
        try:
            copied = _plain_copy(value, 0)
        except RecursionError:  # a caller with a few dozen frames left: a fresh stack below
            copied = _NOT_PLAIN
        if copied is not _NOT_PLAIN:
            return copied
    if not _depth:
        lacking = _frames_lacking()
        if lacking:
            with _stack_room(lacking):
                return _refused_or_canonical(value, 0)
    return _refused_or_canonical(value, _depth)


def _refused_or_canonical(value: Any, _depth: int) -> Any:
    """:func:`jsonable` of a value the plain copy does not take: its canonical round trip, or
    its parts when the hasher refuses it."""
    try:
        text = canonical_bytes(value)
        if not _depth or _nests_within(text, _STORED_DEPTH - _depth):
            return json.loads(text)
    except (CanonicalError, ValueError, TypeError, RecursionError):
        pass
    except Exception:  # a user's object raising from its own methods (see below)
        return {"$unhashable": type(value).__name__}
    try:
        return _unhashable_parts(value, _depth)
    except Exception:  # a mapping whose iteration fails, a date whose isoformat raises...:
        # that value has no form, the rest of the step's value keeps its own (the step was
        # stored with no output at all)
        return {"$unhashable": type(value).__name__}


_STACK_NEEDED = 600
"""Frames of stack :func:`jsonable`'s slow path may use: the canonical hasher's walk of a value
400 levels deep, or element-by-element copies 64 levels deep with a round trip at each, took up
to ~410 frames measured. Called with fewer left, a RecursionError it caught changed the form it
gave (a sub-value with no digest, so two outputs differing below it shared one hash): the form
depended on how deep the caller's stack was. The recursion limit is raised for the call instead
(:func:`_stack_room`)."""


def _frames_lacking() -> int:
    """How many frames the recursion limit lacks for :data:`_STACK_NEEDED` more from here (0
    the usual answer: ``sys._getframe`` finds the stack shallower in C, well under a
    microsecond)."""
    limit = sys.getrecursionlimit()
    probe = limit - _STACK_NEEDED
    if probe > 0:
        try:
            sys._getframe(probe)
        except ValueError:  # the stack is not that deep
            return 0
    depth = 0
    frame = sys._getframe()
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return max(0, depth + _STACK_NEEDED - limit)


_ROOM_LOCK = threading.Lock()
_ROOM = [0, 0]
"""[jsonable calls running with a raised recursion limit, the limit before the first of them]
(under :data:`_ROOM_LOCK`)."""


@contextmanager
def _stack_room(lacking: int) -> Iterator[None]:
    """The recursion limit raised by ``lacking`` frames (plus a margin for C calls the frame
    count does not see) while the block runs, on the caller's own thread: its locks, context
    variables and values stay as they are. The limit is process-wide: it goes back to what it
    was when the last of the calls running with it raised ends. CPython's default limit (1,000)
    is far below what the C stack holds: a few hundred frames more do not endanger it."""
    with _ROOM_LOCK:
        if _ROOM[0] == 0:
            _ROOM[1] = sys.getrecursionlimit()
        _ROOM[0] += 1
        wanted = sys.getrecursionlimit() + lacking + 100
        sys.setrecursionlimit(wanted)
    try:
        yield
    finally:
        with _ROOM_LOCK:
            _ROOM[0] -= 1
            if _ROOM[0] == 0:
                sys.setrecursionlimit(_ROOM[1])


_STORED_DEPTH = MAX_DEPTH + 1
"""Levels of a jsonable form the store keeps (a step's output nested deeper fails the whole
trace's write: "nests deeper than 400 levels")."""


def _nests_within(text: bytes, levels: int) -> bool:
    """Whether the canonical JSON ``text`` nests at most ``levels`` containers deep. An element
    :func:`_unhashable_parts` copies takes its own canonical round trip, up to
    :data:`~rewind.canonical.MAX_DEPTH` levels below those copied: kept as it was, a value
    nested 402 to ~465 levels had a form the store refused, and the trace was lost."""
    if text.count(b"[") + text.count(b"{") <= levels:  # the usual element: no walk
        return True
    todo = [(json.loads(text), 0)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, dict | list):
            if depth >= levels:
                return False
            children = node.values() if isinstance(node, dict) else node
            todo.extend((child, depth + 1) for child in children)
    return True


def _unhashable_parts(value: Any, _depth: int) -> Any:
    """:func:`jsonable` of a value the canonical hasher refused: dates as ISO strings,
    containers element by element (so one odd element does not hide the rest), anything else
    ``{"$unhashable": "<type>"}``, with the ``sha256`` of its exact document
    (:func:`rewind.serde.encode`) when it has one (bytes, Decimal, numpy arrays...). Below
    :data:`_CUT_DEPTH` levels the rest of the value is given by its digest alone
    (:func:`_cut_digest`); a container met again inside itself by its distance up
    (:func:`_copied`)."""
    if _depth > _CUT_DEPTH:
        return {"$unhashable": type(value).__name__, "sha256": _cut_digest(value)}
    if isinstance(value, datetime | date | dtime):
        return value.isoformat()
    if isinstance(value, Mapping | list | tuple | set | frozenset):
        return _copied(value, value, _depth)
    if isinstance(value, float) and not math.isfinite(value):
        return {"$unhashable": "float", "value": repr(value)}
    if isinstance(value, str):  # a lone surrogate (a file name decoded with surrogateescape)
        return {"$unhashable": "str", "value": storable_text(value)}
    digest = _content_digest(value, _depth)
    if digest is not None:
        return {"$unhashable": type(value).__name__, "sha256": digest}
    fields = _fields_of(value)
    if fields is not None:  # a dataclass or model too deep for serde: its fields, as hashed
        return _copied(value, fields, _depth)
    return {"$unhashable": type(value).__name__}


_COPYING: ContextVar[dict[int, int] | None] = ContextVar("rewind_jsonable_copying", default=None)
"""The containers :func:`_copied` is copying in this context (id -> place on the path)."""


def _copied(value: Any, parts: Any, depth: int) -> Any:
    """:func:`_unhashable_parts` of a container ``value`` (``parts``: itself, or a dataclass's
    fields), or ``{"$unhashable": "<type>", "cycle": <levels up>}`` when it is being copied
    already (a value holding itself: a tree whose nodes name their parent). Without it each
    back reference was copied again down to the cut: a value holding itself twice took 2^64
    copies and the trace never ended."""
    path = _COPYING.get()
    token = None
    if path is None:  # the outermost container of this jsonable call
        path = {}
        token = _COPYING.set(path)
    elif id(value) in path:
        return {"$unhashable": type(value).__name__, "cycle": len(path) - path[id(value)]}
    path[id(value)] = len(path)
    try:
        return _container_parts(parts, depth)
    finally:
        del path[id(value)]
        if token is not None:
            _COPYING.reset(token)


def _container_parts(value: Any, depth: int) -> Any:
    """A mapping, list, tuple or set copied element by element (:func:`jsonable` of each)."""
    if isinstance(value, Mapping):
        out = {_key(k): jsonable(v, depth + 1) for k, v in value.items()}
        if len(out) < len(value):  # 1 and "1" both became "1": both kept, the int typed
            out = _typed_entries(value, depth)
        # In canonical key order, as the round trip gives every other dict: in its own order
        # the store writes it as a tagged dict document, which readers and replays took for it.
        return dict(sorted(out.items(), key=_utf16_first))
    items = [jsonable(v, depth + 1) for v in value]
    return sorted(items, key=canonical_bytes) if isinstance(value, set | frozenset) else items


def _fields_of(value: Any) -> dict[str, Any] | None:
    """A dataclass instance's or pydantic model's fields by name (as the canonical hasher
    takes them: a model's ``model_dump`` holds its fields), else None. A chain of them (a
    linked list of 300 nodes) nests past both the hasher's depth and serde's: it was one
    ``{"$unhashable": "<type>"}`` with no digest, every such output one hash and nothing of
    it shown."""
    if isinstance(value, type):
        return None
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    pydantic = sys.modules.get("pydantic")  # never imported: no value is one of its models
    model = getattr(pydantic, "BaseModel", None) if pydantic is not None else None
    if model is not None and isinstance(value, model):
        fields = {name: getattr(value, name, None) for name in type(value).model_fields}
        extra = getattr(value, "model_extra", None)  # extra="allow": model_dump holds them too
        return fields | extra if isinstance(extra, dict) else fields
    return None


_CUT_DEPTH = 64
"""Levels of a refused value :func:`_unhashable_parts` copies element by element; deeper, the
value is one ``{"$unhashable": "<type>", "sha256": ...}`` (a value nests past the hasher's
``MAX_DEPTH`` of 400 only by accident or malice, and a copy must not exhaust the stack)."""


def _cut_digest(value: Any) -> str:
    """sha256 (hex) of a value nested too deep to copy: a Merkle digest of its tree (dicts by
    their typed keys in sorted order, sets by their members' sorted digests, lists and tuples
    in order, scalars by type and text, a pandas or numpy table by its form
    (:func:`_table_form`), other objects by their serde document), so two values that differ
    anywhere below the cut differ and equal ones are equal. Without it
    every value cut had one form per type: a replay whose deeply nested output changed was
    stored as unchanged. Walked with its own stack, never recursively: a hostile value
    100,000 levels deep (or one holding itself: a back reference digests as its distance up
    the path) neither raises RecursionError nor depends on the caller's stack depth.

    A container met again (a value sharing a sub-object) is digested once: its digest is
    remembered when nothing in it refers back (no cycle runs through it, so the tree walk gives
    it one digest wherever it is met), so a shared value costs its distinct containers, not
    its paths (a few dozen lists each holding the level below twice had 2^k).
    Every container walked is held until the walk ends, so the address of a form made for the
    walk (a table's ``tolist()``) is never given to another and taken for a back reference."""
    done: list[bytes] = []
    path: dict[int, int] = {}  # id of each container being walked -> its depth
    looped: list[bool] = []  # per container on the path: whether a back reference is in it
    known: dict[int, bytes] = {}  # id -> digest of a container holding no back reference
    held: list[Any] = []  # every container walked (ids stay unique while the walk lasts)
    todo: list[tuple[Any, Any]] = [(value, _ENTER)]
    while todo:
        node, mark = todo.pop()
        if mark is not _ENTER:  # every child is in ``done``: combine them
            path.popitem()
            _combine(mark[0], mark[1:], done)
            if not looped.pop():
                known[id(node)] = done[-1]
            elif looped:
                looped[-1] = True
            continue
        if id(node) in known:
            done.append(known[id(node)])
            continue
        parts = _cut_parts(node)
        if type(parts) is bytes:
            done.append(parts)
        elif id(node) in path:
            up = len(path) - path[id(node)]
            looped[-1] = True
            done.append(hashlib.sha256(b"cycle:%d" % up).digest())
        else:
            held.append(node)
            looped.append(False)
            path[id(node)] = len(path)
            tag, keys, children = parts
            todo.append((node, (len(children), tag, keys)))
            todo.extend((child, _ENTER) for child in reversed(children))
    return done[0].hex()


_ENTER = object()


def _cut_parts(value: Any) -> bytes | tuple[bytes, list[bytes] | None, list[Any]]:
    """(tag, key texts or None, children) of a container :func:`_cut_digest` walks into, or
    the sha256 of a leaf by its kind and text."""
    if isinstance(value, Mapping):
        keys = [
            b"s" + k.encode("utf-8", "surrogatepass")
            if isinstance(k, str)
            else b"o" + _key(k, typed=True).encode("utf-8", "surrogatepass")
            for k in value
        ]
        return b"{", keys, list(value.values())
    if isinstance(value, list | tuple):
        return b"[", None, list(value)
    if isinstance(value, set | frozenset):
        return b"(", None, list(value)
    fields = _fields_of(value)
    if fields is not None:  # walked as the mapping of its fields (serde recurses into them)
        return _cut_parts(fields)
    return _leaf_digest(value)


def _combine(count: int, parts: tuple[bytes, list[bytes] | None], done: list[bytes]) -> None:
    """Replace the last ``count`` digests of ``done`` by their container's digest."""
    tag, keys = parts
    children = done[len(done) - count :]
    del done[len(done) - count :]
    if keys is not None:  # a mapping: entries in key order, as the canonical text has them
        children = [k + b"\x00" + d for k, d in sorted(zip(keys, children, strict=True))]
    elif tag == b"(":  # a set: no order of its own
        children.sort()
    h = hashlib.sha256(tag)
    for child in children:
        h.update(b"%d:" % len(child))
        h.update(child)
    done.append(h.digest())


def _leaf_digest(value: Any) -> bytes | tuple[bytes, None, list[Any]]:
    """sha256 of a value that is not a container, by its kind and text, or the parts of a
    table serde has no document for (its form, walked as the one child of the table)."""
    if isinstance(value, str):
        text = b"s" + value.encode("utf-8", "surrogatepass")
    elif value is None or isinstance(value, bool):
        text = b"c" + repr(value).encode()
    elif isinstance(value, int):
        text = b"i" + hex(value).encode()
    elif isinstance(value, float):
        text = b"f" + float.hex(value).encode()
    elif isinstance(value, datetime | date | dtime):
        text = b"t" + value.isoformat().encode()
    else:
        digest = _serde_digest(value)
        form = _table_form(value) if digest is None else _NO_FORM
        if form is not _NO_FORM:
            return b"T" + type(value).__name__.encode(), None, [form]
        text = f"o{type(value).__name__}:{digest or ''}".encode()
    return hashlib.sha256(text).digest()


def _typed_entries(value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
    """The entries of a mapping whose keys collided as JSON keys, every key typed
    (:func:`_key`); keys still one text (objects without a JSON form: two classes, two
    functions) are numbered in the mapping's order (``<key>#2``), so no entry is dropped and a
    change to any of them changes the hash."""
    out: dict[str, Any] = {}
    for k, v in value.items():
        key = base = _key(k, typed=True)
        n = 1
        while key in out:
            n += 1
            key = f"{base}#{n}"
        out[key] = jsonable(v, depth + 1)
    return out


def _content_digest(value: Any, depth: int = 0) -> str | None:
    """sha256 of ``value``'s exact tagged document, or None when it has none (a client object).
    Without it two values of one type (two images' bytes, two amounts) had one JSON form and
    one hash: a replay whose step returned other bytes claimed the recorded step's hash."""
    digest = _serde_digest(value)
    return digest if digest is not None else _table_digest(value, depth)


def _serde_digest(value: Any) -> str | None:
    """sha256 of ``value``'s document as :func:`rewind.serde.encode` writes it, or None."""
    from rewind.errors import UnstorableValue
    from rewind.serde import encode

    try:
        return sha256_hex(canonical_bytes(encode(value)))
    except (UnstorableValue, CanonicalError, RecursionError):
        return None


def _table_digest(value: Any, depth: int = 0) -> str | None:
    """sha256 of the JSON form of a table or array serde has no exact document for
    (:func:`_table_form`), or None. Without it every DataFrame a step returned had one hash, so
    a replay whose table changed was stored as unchanged. The JSON form is taken one level
    deeper than ``value``: one that holds the object itself ends at jsonable's depth limit
    (where :func:`_cut_digest` names it by its place on the path), not in a RecursionError
    whose digest depended on the caller's stack depth."""
    form = _table_form(value)
    if form is _NO_FORM:
        return None
    try:
        return sha256_hex(canonical_bytes(jsonable(form, depth + 1)))
    except Exception:  # a user's object: no digest rather than a failed trace
        return None


def _table_form(value: Any) -> Any:
    """The JSON form of a pandas or numpy object, or ``_NO_FORM``: for anything else, when
    reading it raises, or when it is the object itself. Only objects of pandas and numpy classes
    (or their subclasses) are asked: a user's object whose ``to_dict`` holds a time or an id,
    counts its calls, loads from a database or is a test's mock had another digest at each call
    (an unchanged replay stored as changed) or saw calls it never made. The form is
    :func:`_labelled_form`'s; a named Series as ``[name, form]`` (``to_dict`` leaves the name
    out: a replay whose step returned the same numbers under another name, ``revenue`` for
    ``cost``, was stored as unchanged). A class whose ``__module__`` is None (numpy.ctypeslib's)
    is no pandas or numpy class."""
    if isinstance(value, type) or not any(
        str(c.__module__).partition(".")[0] in _TABLE_PACKAGES for c in type(value).__mro__
    ):
        return _NO_FORM
    try:
        form = _labelled_form(value)
        if form is None or form is value:
            return _NO_FORM
        if getattr(value, "columns", None) is not None:
            return form
        index = getattr(value, "index", None)
        name = getattr(value, "name", None) if index is not None else None
    except Exception:  # a user's object: no digest rather than a failed trace
        return _NO_FORM
    return form if name is None else [name, form]


_NO_FORM = object()


def _labelled_form(value: Any) -> Any:
    """``to_dict()`` or ``tolist()``; a table whose
    row or column labels repeat or cannot key a dict (lists, dicts) as its labels and columns in
    lists (``to_dict`` kept one entry per label, so a change to another was not seen, and
    pandas warned in the user's process; or it raised: no digest); a pandas scalar with no
    such method (``Timedelta``, ``Period``, ``Interval``, an offset) as its ``repr``, which
    states its value; None for anything else."""
    index, columns = getattr(value, "index", None), getattr(value, "columns", None)
    view = getattr(value, "to_dict", None) or getattr(value, "tolist", None)
    if callable(view) and (index is None or (_unique(index) and _unique(columns))):
        try:
            return view()
        except TypeError:  # labels that cannot key a dict (a list is unique to pandas)
            if index is None:
                raise
    if index is None:
        if any(c.__name__ in _SCALARS for c in type(value).__mro__):  # a pandas class
            return repr(value)
        return None
    if columns is None:
        return {"index": index.tolist(), "data": value.tolist()}
    data = [value.iloc[:, i].tolist() for i in range(len(columns))]
    return {"columns": columns.tolist(), "index": index.tolist(), "data": data}


def _unique(labels: Any) -> bool:
    """Whether a table's labels (a pandas ``Index``, or None) are unique; False when
    ``is_unique`` raises (an index of dicts)."""
    try:
        return getattr(labels, "is_unique", True) is not False
    except TypeError:
        return False


_SCALARS = frozenset({"Timedelta", "Period", "Interval", "BaseOffset"})
"""pandas scalar classes (and their subclasses: every date offset) without ``to_dict`` or
``tolist`` whose ``repr`` states their value."""


_TABLE_PACKAGES = frozenset({"pandas", "numpy"})
"""Top-level packages whose tables and arrays :func:`_table_digest` reads (to_dict, tolist)."""

_NOT_PLAIN = object()
_PLAIN_DEPTH = 16


def _plain_copy(value: Any, depth: int) -> Any:
    """What ``json.loads(canonical_bytes(value))`` returns, built directly, for the values where
    that is a plain copy: dicts with ASCII string keys (copied in sorted order, as the
    canonical text has them), lists, ASCII strings, bools, None and ints of at most 63 bits,
    nested at most 16 deep. Anything else (floats, whose canonical text may turn them into
    ints; other strings, which may hold lone surrogates; tuples, objects...) returns
    ``_NOT_PLAIN`` and goes the canonical round trip. About 2-5x faster on a step's small
    inputs and attributes."""
    t = type(value)
    if t is str:
        return value if value.isascii() else _NOT_PLAIN
    if t is bool or value is None or (t is int and -_EXACT_INT < value < _EXACT_INT):
        return value
    if depth >= _PLAIN_DEPTH:
        return _NOT_PLAIN
    if t is dict:
        if not set(map(type, value)) <= _STR_ONLY or not all(map(str.isascii, value)):
            return _NOT_PLAIN
        out = {}
        for k in sorted(value):
            v = _plain_child(value[k], depth)
            if v is _NOT_PLAIN:
                return _NOT_PLAIN
            out[k] = v
        return out
    if t is list:
        items = []
        for item in value:
            v = _plain_child(item, depth)
            if v is _NOT_PLAIN:
                return _NOT_PLAIN
            items.append(v)
        return items
    return _NOT_PLAIN


_STR_ONLY = frozenset({str})


def plain_fields(value: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`jsonable` of a dict when it is plain JSON copied directly (exact ``dict``,
    ``list``, ASCII ``str``, ``bool``, ``None``, ints of at most 63 bits, ASCII string keys, no
    floats, at most 16 deep), else None. A plain copy needs no canonical check to be hashed:
    :func:`rewind.llm.plain_request_key` keys it as it is."""
    if type(value) is not dict:
        return None
    copied = _plain_copy(value, 0)
    return None if copied is _NOT_PLAIN else copied


def _plain_child(v: Any, depth: int) -> Any:
    """:func:`_plain_copy` of a child, the common scalars without the recursive call."""
    tv = type(v)
    if tv is str:
        return v if v.isascii() else _NOT_PLAIN
    if tv is bool or v is None or (tv is int and -_EXACT_INT < v < _EXACT_INT):
        return v
    return _plain_copy(v, depth + 1)


def _utf16_first(item: tuple[str, Any]) -> bytes:
    """Sort key of a JSON object's member: its key's UTF-16 code units (RFC 8785's order)."""
    return utf16_key(item[0])


def _key(key: Any, *, typed: bool = False) -> str:
    """A mapping key as a JSON key: a string as it is (one holding a lone surrogate, which no
    store can write, escaped), a number (unless ``typed``) as ``str``, anything else as
    ``$key:<type>:<canonical JSON of its jsonable>``, so that two keys of one type (the tuples
    of a pandas group-by) stay two entries."""
    if isinstance(key, str):
        return key if not has_lone_surrogate(key) else f"$key:str:{storable_text(key)}"
    if not typed and isinstance(key, int | float | bool):
        return str(key)
    return f"$key:{type(key).__name__}:{canonical_bytes(jsonable(key)).decode()}"


def as_fields(value: Any) -> dict[str, Any]:
    """An input as a dict of fields: a dict with string keys as is, anything else wrapped as
    ``{"input": value}``."""
    value = jsonable(value)
    if isinstance(value, dict):
        return value
    return {INPUT_KEY: value}


def natural(fields: Mapping[str, Any]) -> Any:
    """Inverse of :func:`as_fields` for display: ``{"input": v}`` → ``v``."""
    if len(fields) == 1 and INPUT_KEY in fields:
        return fields[INPUT_KEY]
    return dict(fields)


_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*): (.*)$", re.S)


def error_line(error_type: str | None, message: str | None) -> str:
    """``Type: first line of message`` (at most 500 characters), as node rows show errors, in
    text every store backend keeps (:func:`rewind.store.records.storable_text`)."""
    lines = (message or "").strip().splitlines()
    return storable_text(f"{error_type or 'Error'}: {lines[0] if lines else ''}"[:500])


def split_error(text: str | None) -> tuple[str | None, str | None]:
    """(type, message) of a node row's ``Type: message`` error text."""
    if not text:
        return None, None
    m = _ERROR_LINE.match(text)
    if m:
        return m.group(1), m.group(2)
    return "Error", text


# -- write side --------------------------------------------------------------------------------


@dataclass
class StepData:
    """One step about to be written (decoded values).

    Attributes:
        position: 0-based order in the trace (execution start order; parents before children).
        name: the step's name (the node name, and the state field its output is written to).
        step_type: one of :data:`STEP_TYPES`.
        status: one of :data:`STEP_STATUSES`.
        inputs: the step's input as a dict (see :func:`as_fields`).
        reads: state fields the step read (decoded); Burr runs imported from OpenTelemetry use it.
        params: params read with :func:`rewind.param`.
        fields: the state fields the step wrote (``{name: output}`` for a traced step); None when
            it wrote nothing (failed, skipped, pending, running).
        parent_position: the enclosing step, or -1 for a top-level step.
        started_at, ended_at: unix seconds; duration_ms: milliseconds.
        prompt_tokens, completion_tokens: tokens spent (cache hits spend 0).
        calls, pending: the LLM/tool calls made through Rewind's caches and the cache entries
            they produced.
        effects: the effect rows of the step's side-effecting calls (pre/post fingerprints,
            pinned snapshots under ``_snapshot``), as :mod:`rewind.effects` builds them.
        determinism: the node's recorded determinism flag, kept when it is stronger than what
            its calls say (an imported inherited node whose calls stayed with its producer).
        cache_outcome, cache_reason: set to keep a recorded outcome (imports); computed from the
            calls otherwise.
    """

    position: int
    name: str
    step_type: str = StepType.TRANSFORM.value
    status: str = StepStatus.SUCCESS.value
    inputs: dict[str, Any] = field(default_factory=dict)
    reads: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, Any] | None = None
    error_type: str | None = None
    error_message: str | None = None
    parent_position: int = ROOT_POSITION
    span_id: str = ""
    started_at: float | None = None
    ended_at: float | None = None
    duration_ms: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attributes: dict[str, Any] = field(default_factory=dict)
    calls: list[CallRecord] = field(default_factory=list)
    pending: list[PendingWrite] = field(default_factory=list)
    effects: list[dict[str, Any]] = field(default_factory=list)
    cache_outcome: str | None = None
    cache_reason: str | None = None
    determinism: str | None = None


@dataclass
class TraceData:
    """A trace about to be written: the run row, the root span and the steps.

    ``status`` is the trace status (``success``/``failed``/``running``...); ``input`` the chain's
    input fields (the run's initial state); ``output`` the chain's return value;
    ``extra_blobs`` bytes by sha256 hex written with the trace besides its own (the results of
    cache hits, when the run that stored them may be gone).
    """

    trace_id: str
    name: str
    status: str = StepStatus.SUCCESS.value
    input: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    error_type: str | None = None
    error_message: str | None = None
    span_id: str = ""
    started_at: float = 0.0
    ended_at: float | None = None
    duration_ms: float = 0.0
    attributes: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    parent_run_id: str | None = None
    fork_node: str | None = None
    fork_position: int | None = None
    override: dict[str, Any] | None = None
    steps: list[StepData] = field(default_factory=list)
    extra_blobs: dict[str, bytes] = field(default_factory=dict)


# -- read side ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlmCallView:
    """One LLM call of a step as the inspector needs it (request messages, answer, usage)."""

    model: str
    outcome: str
    messages: tuple[dict[str, Any], ...]
    params: dict[str, Any]
    content: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class StepView:
    """One step of a stored trace (or one node of a Burr run read as a step).

    ``input``/``output`` are the natural values (a traced step's own input and return value; a
    Burr node's read fields + inputs and written fields); ``input_doc``/``output_fields`` the
    node's stored documents. ``number`` is 1-based as ``rewind show`` prints it.
    """

    position: int
    name: str
    step_type: str
    status: str
    input: Any
    output: Any
    input_doc: dict[str, Any]
    output_fields: dict[str, Any]
    error_type: str | None
    error_message: str | None
    duration_ms: float
    started_at: float | None
    ended_at: float | None
    prompt_tokens: int
    completion_tokens: int
    attributes: dict[str, Any]
    parent_position: int | None
    span_id: str | None
    cache_outcome: str
    cache_reason: str
    params: dict[str, Any]
    input_hash: str
    output_hash: str | None
    state_hash: str | None
    src_app_id: str
    src_sequence_id: int | None
    inherited: bool = False
    calls: tuple[CallRecord, ...] = ()
    llm_calls: tuple[LlmCallView, ...] = ()
    determinism: str = "deterministic"
    effects: tuple[EffectRecord, ...] = ()
    """Effect rows of the step's side-effecting calls (empty for inherited nodes: they belong
    to the run that executed them)."""

    @property
    def number(self) -> int:
        """1-based step number (as ``rewind show`` numbers nodes)."""
        return self.position + 1

    @property
    def tokens(self) -> int:
        """Prompt + completion tokens spent."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def failed(self) -> bool:
        """True when the step failed."""
        return self.status == StepStatus.FAILED

    @property
    def error(self) -> str | None:
        """``Type: message`` or None."""
        if self.error_type is None and self.error_message is None:
            return None
        return error_line(self.error_type, self.error_message)

    @property
    def model(self) -> str | None:
        """The model the step called (attribute ``model`` or its first LLM call)."""
        model = self.attributes.get("model")
        if isinstance(model, str) and model:
            return model
        for c in self.calls:
            if c.kind == "llm":
                return c.name
        return None

    def to_json(self) -> dict[str, Any]:
        """Everything about the step as JSON: listing fields, values, hashes, cache outcome."""
        return self.summary() | {
            "span_id": self.span_id,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "model": self.model,
            "input": self.input,
            "output": self.output,
            "params": self.params,
            "attributes": self.attributes,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "input_hash": self.input_hash,
            "output_hash": self.output_hash,
            "state_hash": self.state_hash,
            "cache_outcome": self.cache_outcome,
            "cache_reason": self.cache_reason,
            "inherited": self.inherited,
        }

    def summary(self) -> dict[str, Any]:
        """Number, name, type, status, duration (ms), tokens, error: one row of a listing."""
        return {
            "number": self.number,
            "position": self.position,
            "name": self.name,
            "type": self.step_type,
            "status": self.status,
            "duration_ms": round(self.duration_ms, 3),
            "tokens": self.tokens,
            "error": self.error,
            "parent": None
            if self.parent_position is None or self.parent_position < 0
            else self.parent_position + 1,
        }


@dataclass(frozen=True)
class TraceView:
    """A stored trace or Burr run, read back with every step's values.

    ``kind`` is ``"trace"`` (recorded by the tracer, posted to the service or imported from
    OpenTelemetry) or ``"run"`` (a Burr run). ``status`` uses the trace vocabulary
    (``success``/``failed``/``running``); ``run_status`` is the run row's.
    """

    trace_id: str
    name: str
    kind: str
    status: str
    run_status: str
    input: dict[str, Any]
    output: Any
    error_type: str | None
    error_message: str | None
    started_at: float
    ended_at: float | None
    duration_ms: float
    prompt_tokens: int
    completion_tokens: int
    attributes: dict[str, Any]
    span_id: str | None
    parent_run_id: str | None
    config: dict[str, Any]
    override: dict[str, Any] | None
    steps: tuple[StepView, ...]

    @property
    def failed(self) -> bool:
        """True when the trace (run) failed or was interrupted."""
        return self.status == StepStatus.FAILED

    @property
    def tokens(self) -> int:
        """Prompt + completion tokens spent by the whole trace."""
        return self.prompt_tokens + self.completion_tokens

    @property
    def error(self) -> str | None:
        """``Type: message`` of the trace's error, or None."""
        if self.error_type is None and self.error_message is None:
            return None
        return error_line(self.error_type, self.error_message)

    def find(self, ref: str | int) -> StepView:
        """The step named ``ref`` (``name`` or ``name#k`` for its k-th execution) or numbered
        ``ref`` (1-based).

        Raises:
            LookupError: no such step (the message lists the steps).
        """
        text = str(ref).strip()
        if text.isdigit():
            number = int(text)
            if 1 <= number <= len(self.steps):
                return self.steps[number - 1]
        else:
            name, _, occ = text.partition("#")
            want = int(occ) if occ.isdigit() else 1
            seen = 0
            for s in self.steps:
                if s.name == name:
                    seen += 1
                    if seen == want:
                        return s
        listing = ", ".join(f"{s.number}:{s.name}" for s in self.steps) or "none"
        raise LookupError(
            f"{self.kind} {self.trace_id[:12]} has no step {text!r} (steps: {listing})"
        )

    def occurrence(self, step: StepView) -> str:
        """``name`` or ``name#k`` naming exactly this step (as ``rewind fork --at`` accepts)."""
        k = sum(1 for s in self.steps[: step.position + 1] if s.name == step.name)
        return step.name if k <= 1 else f"{step.name}#{k}"

    def children(self, position: int) -> list[StepView]:
        """Steps whose parent is the step at ``position`` (-1: top-level steps)."""
        return [
            s
            for s in self.steps
            if (s.parent_position if s.parent_position is not None else -1) == position
        ]

    def depth(self, step: StepView) -> int:
        """Nesting depth of a step (0 for a top-level step)."""
        d, parent = 0, step.parent_position
        while parent is not None and parent >= 0 and d < len(self.steps):
            d += 1
            parent = self.steps[parent].parent_position if parent < len(self.steps) else None
        return d

    def to_json(self) -> dict[str, Any]:
        """The whole trace as JSON: listing fields, input, output, attributes and every step."""
        return self.summary() | {
            "span_id": self.span_id,
            "run_status": self.run_status,
            "input": self.input,
            "output": self.output,
            "attributes": self.attributes,
            "config": self.config,
            "override": self.override,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "steps": [s.to_json() for s in self.steps],
        }

    def summary(self) -> dict[str, Any]:
        """A listing row: id, name, kind, status, times, duration (ms), tokens, steps, error."""
        return {
            "trace_id": self.trace_id,
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration_ms": round(self.duration_ms, 3),
            "tokens": self.tokens,
            "steps": len(self.steps),
            "failed_steps": sum(1 for s in self.steps if s.failed),
            "error": self.error,
            "parent_trace_id": self.parent_run_id,
        }
