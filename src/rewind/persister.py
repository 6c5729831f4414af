"""Rewind's Burr persister: state stored content-addressed, one blob per top-level field.

Burr's ``SQLitePersister`` writes the whole state as one JSON document per step; here each
semantic field is a blob keyed by its sha256, so a field that did not change costs no new bytes
(the same idea as LangGraph's per-channel versions). The state row itself is a small
``{field: hash}`` map plus Burr's internal ``__`` keys inline.
"""

from __future__ import annotations

import copyreg
import hashlib
import io
import json
import pickle
import re
import sys
import threading
from bisect import bisect_left
from collections.abc import Collection, Mapping
from dataclasses import dataclass, is_dataclass
from dataclasses import fields as dataclass_fields
from datetime import UTC, datetime
from itertools import compress, repeat
from operator import is_not
from typing import Any, ClassVar, Literal

from burr.core import State
from burr.core.persistence import BaseStateLoader, BaseStatePersister, PersistedStateData

from rewind.canonical import CanonicalError, canonical_bytes, sha256_hex
from rewind.errors import UnstorableValue
from rewind.serde import encode_field
from rewind.store import Store
from rewind.store.store import WriteBatch, state_row

PARTITION_KEY_DEFAULT = ""
BURR_INTERNAL_PREFIX = "__"
"""Burr keeps ``__PRIOR_STEP``/``__SEQUENCE_ID`` in state; semantic state drops them (rule 1)."""


@dataclass(frozen=True)
class EncodedField:
    """One state field as canonical JSON bytes and their sha256 hex."""

    data: bytes
    digest: str


def encode_value(key: str, value: Any) -> EncodedField:
    """Canonical bytes of one state field's exact document (:func:`rewind.serde.encode_field`).

    Plain JSON values (str keys in canonical order) are hashed as they are, so their bytes and
    hashes are the ones Rewind always wrote; any other value is hashed over its tagged document,
    so two values that load back differently never share a hash.

    Raises:
        UnstorableValue: the value cannot be stored exactly (the message names the path from
            ``key``, the type and how to register a serializer).
            NaN and ±Infinity are refused the same way (:mod:`rewind.canonical`'s rule).
    """
    try:
        data = canonical_bytes(encode_field(key, value))
    except CanonicalError as exc:
        where = key + exc.path[1:]
        raise UnstorableValue(
            f"state field {where} cannot be hashed: {exc.problem}",
            "replace the value before the node writes it to state",
            path=where,
            type_name="",
        ) from exc
    return EncodedField(data, sha256_hex(data))


def split_internal(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(semantic fields, Burr's internal ``__`` fields) of a state's values."""
    semantic, internal = {}, {}
    for k, v in values.items():
        (internal if k.startswith(BURR_INTERNAL_PREFIX) else semantic)[k] = v
    return semantic, internal


_IMMUTABLE_TYPES = frozenset({str, int, float, bool, type(None), bytes})
"""Types whose value an object cannot change in place: the same object is the same value."""

_MISSING = object()

_HASH_BLOCK = 16
"""Map fragments between two kept hash states of :meth:`FieldEncoder.state_hash`."""

SEAL_AFTER_LOOSE = 4
"""Mutable fields compared one by one (outside the seal) that make :class:`FieldEncoder` seal
every mutable field again at the end of a step."""
SEAL_FALSE_ALARMS = 3
"""Steps whose sealed pickle differed while no sealed field's encoding did, after which a
:class:`FieldEncoder` compares every field on its own."""


def _pickled(value: Any) -> bytes | None:
    """The pickle of a state value (what :class:`FieldEncoder` compares to see an in-place
    change), or None when it cannot be pickled (then the value is re-encoded every node).

    Instances :mod:`rewind.serde` stores by their fields (dataclasses, pydantic models) or
    through a Burr serializer are pickled as what is stored of them, not through their own
    ``__getstate__``/``__reduce__``: a class may leave out of its pickle a part that is stored
    (a memo, a cache), and a change to that part alone must still be seen."""
    # One pickler per thread, reused (taken out while in use, so a reducer that pickles state
    # of its own gets another): building one per value doubled the cost for small values.
    pair = _PICKLERS.__dict__.pop("pair", None)
    if pair is None:
        out = io.BytesIO()
        pair = (out, _StatePickler(out, pickle.HIGHEST_PROTOCOL))
    out, pickler = pair
    try:
        pickler.dump(value)
        data = out.getvalue()
    except Exception:  # any object's __reduce__ may raise anything
        return None  # this pickler is dropped: the next value gets a fresh one
    out.seek(0)
    out.truncate()
    pickler.clear_memo()
    _PICKLERS.pair = pair
    return data


_PICKLERS = threading.local()


def _dataclass_reduce(obj: Any) -> Any:
    """A dataclass instance as serde stores it: every field (``init=False`` ones included)
    and any other instance attribute."""
    values = []
    for f in dataclass_fields(obj):
        try:
            values.append((f.name, getattr(obj, f.name)))
        except AttributeError:
            continue  # an init=False field never assigned
    return (type(obj), (), (values, getattr(obj, "__dict__", None)))


def _pydantic_reduce(obj: Any) -> Any:
    """A pydantic model as serde stores it: fields, fields set, private attributes, extras."""
    state = (
        obj.__dict__,
        sorted(obj.model_fields_set),
        obj.__pydantic_private__,
        obj.__pydantic_extra__,
    )
    return (type(obj), (), state)


def _reducer_for(cls: type) -> Any:
    """How :class:`_StatePickler` pickles instances of ``cls`` (serde's order of handlers), or
    None for the class's own pickle."""
    from rewind.serde import _burr_serializer

    numpy = sys.modules.get("numpy")
    if numpy is not None and issubclass(cls, numpy.ndarray | numpy.generic):
        return None  # its pickle holds its dtype, shape and bytes
    serializer = _burr_serializer(cls)
    if serializer is not None:
        return lambda obj: (cls, (serializer(obj),))
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and issubclass(cls, pydantic.BaseModel):
        return _pydantic_reduce
    if is_dataclass(cls):
        return _dataclass_reduce
    return None


class _Reducers(dict[type, Any]):
    """:class:`_StatePickler`'s ``dispatch_table``: the reducer of each class, found once. The C
    pickler consults it only for instances of classes it does not pickle itself (not for
    lists, dicts, strings, numbers...)."""

    _own: ClassVar[set[type]] = set()  # classes pickled as they pickle themselves

    def __missing__(self, cls: type) -> Any:
        if cls not in self._own:
            # this table replaces copyreg's for this pickler: classes registered there keep theirs
            reducer = _reducer_for(cls) or copyreg.dispatch_table.get(cls)
            if reducer is not None:
                self[cls] = reducer
                return reducer
            self._own.add(cls)
        raise KeyError(cls)  # the pickler's usual way


class _StatePickler(pickle.Pickler):
    """The pickler of :func:`_pickled` (see there)."""

    dispatch_table = _Reducers()


def state_values(state: State) -> Mapping[str, Any]:
    """A Burr state's field → value mapping, read only (no copy where Burr allows it).

    ``State.get_all`` copies the state through ``__getitem__`` one key at a time (~100 Python
    calls for a 100-field state); Burr keeps the values in ``State._state``, a plain dict, which
    this reads when it is there. Callers must not modify the result.
    """
    values = getattr(state, "_state", None)
    return values if type(values) is dict else state.get_all()


@dataclass(frozen=True)
class StepFields:
    """The encoded semantic state after one node (see :meth:`FieldEncoder.step`).

    Attributes:
        digests: field → sha256 of every semantic field, in state order (the encoder's own map:
            read it before the next :meth:`FieldEncoder.step`, copy it to keep it).
        fresh: field → encoding of the fields encoded afresh at this step (their blobs go to the
            store; an unchanged field's blob was written with the node that produced it).
        internal: Burr's ``__`` fields of the state, by name.
        removed: the semantic fields the node deleted (in the previous step, not in this one).
    """

    digests: dict[str, str]
    fresh: dict[str, EncodedField]
    internal: dict[str, Any]
    removed: tuple[str, ...] = ()


class FieldEncoder:
    """Encodes a run's successive states, re-encoding only fields that can have changed.

    Burr's contract is that an action changes only the fields it declares in ``writes``; every
    other field of the new state is the very same object as before. So a field is re-encoded when
    its object is not the one encoded last time; an action may also change in place a mutable
    value it declares in ``reads`` or ``writes`` (append to a list: the object stays), and Burr
    hands an action the whole state without enforcing the contract (a helper the action calls
    may append to a list the action declares nowhere). So every mutable field (list, dict, set,
    array, object...) whose object is the one encoded last, declared or not, is compared by its
    pickle (C speed, exact types; ~1 µs for a small dict, ~1 ms per MB) with the pickle taken
    when it was encoded, and re-encoded when they differ or it cannot be pickled; otherwise the
    previous encoding is reused. When a re-encoded object turns out to have changed in place,
    every field is re-encoded (another field may hold the same object, or a part of it).

    The pickles are compared in one piece: the mutable fields are *sealed* together at the end of
    a step (one pickle of the list of their objects, taken once every field is known to hold what
    was encoded), and each later step pickles that list again and compares the two (one C call
    instead of one Python call per field: ~0.1 µs a small field instead of ~1 µs). Fields that
    get a new object meanwhile are compared one by one until the next seal, which happens when
    a sealed field got a new object or was deleted, or when :data:`SEAL_AFTER_LOOSE` fields wait
    outside the seal. When the sealed pickle differs, every sealed field still holding its
    object is re-encoded and compared (the change is found, whichever field it is in). A field
    whose pickle differs while its encoding does not (a pickle that is not stable) turns the
    seal off for this encoder after :data:`SEAL_FALSE_ALARMS` such steps (back to one pickle per
    field), so such a value never costs a re-encoding of the whole state at every node.
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[Any, EncodedField]] = {}
        self._objs: dict[str, Any] = {}  # field -> the object encoded last (kept alive)
        self._prints: dict[str, bytes | None] = {}  # mutable field -> its pickle when encoded
        self._digests: dict[str, str] = {}  # field -> sha256 of that encoding
        # The {field: sha256} map's encodings as fragments in sorted field order, kept up to
        # date field by field: canonical JSON (_canon) and json.dumps text (_text).
        self._canon: list[bytes] = []
        self._text: list[str] = []
        self._order: list[str] | None = None  # the fields sorted (None: rebuild the lists)
        # sha256 states of the map's bytes at every _HASH_BLOCK-th fragment (see state_hash),
        # valid for the fragments before _clean (the first one changed since they were taken)
        self._marks: list[Any] = []
        self._clean = 0
        # The seal (see the class docstring): field -> its object when sealed, the pickle of the
        # list of those objects, and whether sealing is on. A field is in _prints (compared on
        # its own: "loose") or in _sealed, never in both; immutable values are in neither.
        self._sealed: dict[str, Any] = {}
        self._sealed_print: bytes | None = None
        self._seal_on = True
        self._false_alarms = 0

    def field(self, key: str, value: Any) -> EncodedField:
        """Encoding of one field, reusing the last one when the object is the one encoded last
        (see the class docstring for when that holds)."""
        prev = self._last.get(key)
        if prev is not None and prev[0] is value:
            return prev[1]
        return encode_value(key, value)

    def step(self, values: Mapping[str, Any], *, recheck: Collection[str] = ()) -> StepFields:
        """Encode the semantic state after a node, re-encoding only what can have changed.

        Args:
            values: the state's field → value, Burr's ``__`` keys included (skipped); read only.
            recheck: the fields the node declares (its ``reads`` and ``writes``): compared by
                pickle as every mutable field is, and re-encoded when no pickle of theirs is at
                hand; immutable values are not re-encoded.
        Returns:
            the digests of every semantic field and the encodings made afresh.
        Raises:
            UnstorableValue: a field cannot be stored exactly (the encoder is left unchanged).
        """
        internal, todo = self._changed(values)
        same = self._rechecked(values, recheck, todo)
        suspects = self._check_sealed(values, todo, same)
        fresh = self._encode_todo(values, todo, same)
        for k in same:
            if k not in fresh and k in self._prints:  # same value, another pickle (dict order)
                self._prints[k] = _pickled(values[k])
        if suspects and not any(k in fresh for k in suspects):
            # the sealed pickle changed, while no sealed field that kept its object did
            self._false_alarms += 1
            self._seal_on = self._false_alarms < SEAL_FALSE_ALARMS
        removed = self._remember(values, fresh, len(values) - len(internal))
        self._seal(fresh, removed, alarm=suspects is not None)
        if self._order is not None:
            self._update_fragments(fresh, removed)
        return StepFields(self._digests, fresh, internal, tuple(removed))

    def _check_sealed(
        self, values: Mapping[str, Any], todo: dict[str, Any], same: list[str]
    ) -> list[str] | None:
        """Compare the sealed fields' pickle with the one taken when they were sealed. When it
        differs, every sealed field whose object is still the sealed one is added to ``todo``
        and ``same`` (re-encoded and compared) and their names are returned; else None."""
        sealed = self._sealed
        if not sealed:
            return None
        now = _pickled(list(sealed.values()))
        if now is not None and now == self._sealed_print:
            return None
        suspects = [
            k for k, obj in sealed.items() if k not in todo and values.get(k, _MISSING) is obj
        ]
        for k in suspects:
            todo[k] = sealed[k]
            if k not in same:
                same.append(k)
        return suspects

    def _seal(self, fresh: dict[str, EncodedField], removed: list[str], *, alarm: bool) -> None:
        """After a step: seal every mutable field again when a sealed field got a new object or
        was deleted, when the sealed pickle differed (``alarm``), or when enough fields are
        loose; otherwise the fresh mutable fields get pickles of their own (they are loose).
        Every field holds what was encoded at this point, so pickles taken now are valid."""
        objs, prints, sealed = self._objs, self._prints, self._sealed
        new = [k for k in fresh if type(objs[k]) not in _IMMUTABLE_TYPES]
        if not self._seal_on:
            if sealed:  # the seal was just turned off: every field on its own again
                self._unseal(fresh)
            self._prints.update((k, _pickled(objs[k])) for k in new)
            return
        moved = any(k in sealed for k in fresh) or any(k in sealed for k in removed)
        if not (alarm or moved or len(prints) + len(new) >= SEAL_AFTER_LOOSE):
            prints.update((k, _pickled(objs[k])) for k in new)
            return
        self._seal_all()

    def _unseal(self, fresh: dict[str, EncodedField]) -> None:
        """Turn the seal off: each sealed field not just encoded gets a pickle of its own."""
        objs = self._objs
        self._prints.update(
            (k, _pickled(objs[k]))
            for k in self._sealed
            if k in objs and k not in fresh and type(objs[k]) not in _IMMUTABLE_TYPES
        )
        self._sealed, self._sealed_print = {}, None

    def _seal_all(self) -> None:
        """Seal every mutable field that can be pickled together (one pickle); fields that
        cannot be pickled stay loose, and all do when they pickle only one by one."""
        objs = self._objs
        keep = {k: p for k, p in self._prints.items() if p is None}  # cannot be pickled: loose
        members = [k for k, v in objs.items() if type(v) not in _IMMUTABLE_TYPES and k not in keep]
        packed = _pickled([objs[k] for k in members])
        if packed is None:  # some member cannot be pickled: find it, seal the others
            each = {k: _pickled(objs[k]) for k in members}
            keep.update((k, p) for k, p in each.items() if p is None)
            members = [k for k in members if each[k] is not None]
            packed = _pickled([objs[k] for k in members])
            if packed is None:  # each can be pickled, not all together: all stay loose
                self._prints = keep | each
                self._sealed, self._sealed_print = {}, None
                return
        self._sealed = {k: objs[k] for k in members}
        self._sealed_print = packed
        self._prints = keep

    def _changed(self, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(Burr's ``__`` fields, semantic fields) whose object is not the one encoded last."""
        objs = self._objs
        keys = list(values)
        # C-speed map/compress calls: this runs once per node over every field.
        changed = list(
            compress(keys, map(is_not, values.values(), map(objs.get, keys, repeat(_MISSING))))
        )
        internal = {k: values[k] for k in changed if k.startswith(BURR_INTERNAL_PREFIX)}
        todo = {k: values[k] for k in changed if k not in internal}  # Burr's keys: never in objs
        return internal, todo

    def _rechecked(
        self, values: Mapping[str, Any], recheck: Collection[str], todo: dict[str, Any]
    ) -> list[str]:
        """Add to ``todo`` the mutable fields whose object did not change but whose value may
        have (their names are returned): an in-place change keeps the object.

        A sealed field is left to :meth:`_check_sealed`, declared (``recheck``) or not; a loose
        one is compared by its own pickle, and re-encoded when that differs or is missing."""
        objs, prints, sealed = self._objs, self._prints, self._sealed
        same: list[str] = []
        for k in recheck:
            if k not in todo and k in objs:
                v = values.get(k, _MISSING)
                if v is objs[k] and type(v) not in _IMMUTABLE_TYPES and sealed.get(k) is not v:
                    before = prints.get(k)
                    if before is None or _pickled(v) != before:
                        todo[k] = v
                        same.append(k)
        # Fields the node declares nowhere: changed in place only if their pickle changed.
        declared = set(recheck)
        for k, before in prints.items():
            if k not in todo and k not in declared:
                v = values.get(k, _MISSING)
                if v is objs[k] and (before is None or _pickled(v) != before):
                    todo[k] = v
                    same.append(k)
        return same

    def _encode_todo(
        self, values: Mapping[str, Any], todo: dict[str, Any], same: list[str]
    ) -> dict[str, EncodedField]:
        """Encode ``todo``; every semantic field when a re-checked object changed in place.
        Returns the encodings that differ from the last ones (unchanged ``same`` fields dropped).
        """
        objs, digests = self._objs, self._digests
        fresh = {k: encode_value(k, v) for k, v in todo.items()}
        if any(fresh[k].digest != digests[k] for k in same):
            # An object changed in place: any other field may hold it (or a part of it).
            fresh.update(
                (k, encode_value(k, v))
                for k, v in values.items()
                if k not in fresh and not k.startswith(BURR_INTERNAL_PREFIX)
            )
            same = [
                k
                for k, v in objs.items()
                if values.get(k, _MISSING) is v and fresh[k].digest == digests[k]
            ]
        for k in same:
            del fresh[k]  # the same object, unchanged: its blob went with an earlier node
        return fresh

    def _remember(
        self, values: Mapping[str, Any], fresh: dict[str, EncodedField], n_semantic: int
    ) -> list[str]:
        """Record the fresh encodings and forget deleted fields (``n_semantic``: the state's
        semantic field count); returns the deleted fields' names."""
        objs, digests, last, prints = self._objs, self._digests, self._last, self._prints
        for k, f in fresh.items():
            v = values[k]
            objs[k] = v
            last[k] = (v, f)
            digests[k] = f.digest
            prints.pop(k, None)  # a mutable one gets its pickle from _seal
        removed: list[str] = []
        if len(objs) != n_semantic:
            removed = [k for k in objs if k not in values]  # fields the node deleted
            for k in removed:
                del objs[k], digests[k], last[k]
                prints.pop(k, None)
        return removed

    def _update_fragments(self, fresh: dict[str, EncodedField], removed: list[str]) -> None:
        """Bring the sorted map fragments up to date after a step (bisect per changed field)."""
        order, canon, text = self._order, self._canon, self._text
        assert order is not None
        for k in removed:
            i = bisect_left(order, k)
            del order[i], canon[i], text[i]
            self._clean = min(self._clean, i)
        for k, f in fresh.items():
            i = bisect_left(order, k)
            self._clean = min(self._clean, i)
            c, t = _map_fragments(k, f.digest)
            if i < len(order) and order[i] == k:
                canon[i], text[i] = c, t
            elif k.isascii() or not _ASTRAL.search(k):
                order.insert(i, k)
                canon.insert(i, c)
                text.insert(i, t)
            else:
                self._order = None  # JCS sorts this name differently: encode whole maps
                return

    def state_map(self) -> tuple[bytes, str]:
        """The {field: sha256} map of the last :meth:`step` as (its canonical JSON bytes, as
        :func:`map_hash` hashes them; its ``json.dumps(..., sort_keys=True)`` text, as state
        rows store it), joined from per-field fragments kept up to date by :meth:`step`: a
        node that changed one field of a 100-field state re-encodes one fragment, not the map.

        Raises:
            CanonicalError: a field name cannot be encoded (a lone surrogate).
        """
        if not self._fragments_ready():
            digests = self._digests
            return canonical_bytes(digests), json.dumps(digests, sort_keys=True)
        return b"{" + b",".join(self._canon) + b"}", "{" + ", ".join(self._text) + "}"

    def state_hash(self) -> tuple[str, str]:
        """As :meth:`state_map`, with the sha256 hex of the map's canonical bytes in place of
        the bytes (``sha256_hex(state_map()[0])``, computed without hashing the whole map).

        The hash state is kept every :data:`_HASH_BLOCK` fragments; hashing resumes from the
        last one before the first fragment changed since: a node that writes a field late in
        the sorted map (a chain's next field) hashes the map's tail, not all of it.

        Raises:
            CanonicalError: a field name cannot be encoded (a lone surrogate).
        """
        if not self._fragments_ready():
            doc, text = self.state_map()
            return sha256_hex(doc), text
        canon, marks = self._canon, self._marks
        n = len(canon)
        # marks[b] hashed b"{" and blocks 0..b-1, each followed by b",": still valid when those
        # fragments are unchanged and one follows them (a comma after the last is not JSON)
        del marks[max(0, min(self._clean, n - 1) // _HASH_BLOCK + 1) :]
        if not marks:
            marks.append(hashlib.sha256(b"{"))
        block = len(marks) - 1
        h = marks[block].copy()
        while True:
            end = (block + 1) * _HASH_BLOCK
            h.update(b",".join(canon[block * _HASH_BLOCK : end]))
            if end >= n:
                break
            h.update(b",")
            marks.append(h.copy())
            block += 1
        self._clean = n
        h.update(b"}")
        return h.hexdigest(), "{" + ", ".join(self._text) + "}"

    def _fragments_ready(self) -> bool:
        """Build the sorted map fragments if needed; False when the map cannot be joined from
        them (a field name JCS sorts differently from Python)."""
        if self._order is None:
            digests = self._digests
            order = sorted(digests)
            if not all(map(str.isascii, order)) and any(map(_ASTRAL.search, order)):
                # JCS orders names by UTF-16 code units, Python by code points
                return False
            pairs = [_map_fragments(k, digests[k]) for k in order]
            self._canon = [c for c, _ in pairs]
            self._text = [t for _, t in pairs]
            self._order = order
            self._marks = []
        return True

    def encode(
        self, semantic: dict[str, Any], *, written: Collection[str] = ()
    ) -> tuple[dict[str, EncodedField], list[str]]:
        """Encode every semantic field.

        Args:
            semantic: field → value (no ``__`` keys).
            written: fields the action declared in ``writes`` (always re-encoded).
        Returns:
            (field → encoding, names of the fields encoded afresh in this call)
        """
        out: dict[str, EncodedField] = {}
        fresh: list[str] = []
        for k, v in semantic.items():
            prev = self._last.get(k)
            if prev is not None and prev[0] is v and k not in written:
                out[k] = prev[1]
            else:
                out[k] = encode_value(k, v)
                fresh.append(k)
        self._last = {k: (semantic[k], out[k]) for k in out}
        self._objs = {k: semantic[k] for k in out}
        self._prints = {
            k: _pickled(v) for k, v in self._objs.items() if type(v) not in _IMMUTABLE_TYPES
        }
        self._digests = {k: f.digest for k, f in out.items()}
        self._order = None
        self._sealed, self._sealed_print = {}, None
        return out, fresh


_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


_PLAIN_NAME = re.compile(r"[ !#-\[\]-~]*\Z")
"""Printable ASCII without ``"`` and ``\\``: a name both encodings write as it is."""


def _map_fragments(key: str, digest: str) -> tuple[bytes, str]:
    """One field's entry in the canonical JSON and in the ``json.dumps`` text of a
    {field: sha256} map (``"key":"hash"`` and ``"key": "hash"``)."""
    if _PLAIN_NAME.match(key) and _PLAIN_NAME.match(digest):
        return f'"{key}":"{digest}"'.encode(), f'"{key}": "{digest}"'
    one = {key: digest}
    return canonical_bytes(one)[1:-1], json.dumps(one)[1:-1]


def field_map(fields: dict[str, EncodedField]) -> dict[str, str]:
    """{field: sha256} of encoded fields."""
    return {k: f.digest for k, f in fields.items()}


def map_hash(fields: dict[str, str]) -> tuple[bytes, str]:
    """Canonical bytes and sha256 of a {field: sha256} map: the Merkle hash of those fields."""
    data = plain_map_bytes(fields)
    if data is None:
        data = canonical_bytes(fields)
    return data, sha256_hex(data)


def plain_text(value: Any) -> bool:
    """Whether ``value`` is a str of printable ASCII without ``"`` and ``\\``: JSON text
    (canonical or ``json.dumps``) writes it between quotes as it is."""
    return type(value) is str and _PLAIN_NAME.match(value) is not None


def plain_map_bytes(values: Mapping[str, str]) -> bytes | None:
    """The canonical JSON bytes of a {name: string} map (a node's {field: sha256} maps), when
    every name and string is printable ASCII without ``"`` and ``\\`` (written as they are,
    sorted by code point as RFC 8785 sorts them); else None (ask :func:`canonical_bytes`).

    The same bytes as :func:`canonical_bytes` without its walk over the value: these maps are
    encoded at every node."""
    plain = _PLAIN_NAME.match
    parts = []
    try:
        for k in sorted(values):
            v = values[k]
            if type(k) is not str or type(v) is not str or not plain(k) or not plain(v):
                return None
            parts.append(f'"{k}":"{v}"')
    except TypeError:  # names that do not sort together (not all str)
        return None
    return ("{" + ",".join(parts) + "}").encode()


class ForkStartLoader(BaseStateLoader):
    """The state initializer of a fork's Burr app: it loads the fork's starting state (the rows
    of ``app_id``) and nothing else.

    Burr hands an app's state initializer on to the sub-applications of its parallel actions
    (``MapStates``...), which then resume from the latest state stored under their own app id.
    A recorded run has no initializer, so its sub-applications always start fresh; a fork must
    do the same, or a looped map node would find the first round's sub-run states (Burr gives
    the children the same app ids each round) and run nothing.

    Args:
        persister: the store's persister.
        app_id: the app whose rows the fork starts from (the one Burr asks for).
        loads: the app whose newest row is loaded instead when Burr asks for ``app_id`` (an
            output override's fork: Burr is told it forks from the fork node's source row, and
            gets the fork's own row, which holds the replaced output). Default: ``app_id``'s
            row Burr asks for.
    """

    def __init__(
        self, persister: RewindPersister, app_id: str, *, loads: str | None = None
    ) -> None:
        self.persister = persister
        self.app_id = app_id
        self.loads = loads

    def list_app_ids(self, partition_key: str, **kwargs: Any) -> list[str]:
        """Burr's loader interface: the one app this loader loads."""
        return [self.app_id]

    def load(
        self,
        partition_key: str,
        app_id: str | None,
        sequence_id: int | None = None,
        **kwargs: Any,
    ) -> PersistedStateData | None:
        """The state row :meth:`RewindPersister.load` finds for ``app_id`` when it is the fork's
        source; None (start fresh) for any other app."""
        if app_id != self.app_id:
            return None
        if self.loads is not None:
            return self.persister.load(partition_key, self.loads, None, **kwargs)
        return self.persister.load(partition_key, app_id, sequence_id, **kwargs)


class RewindPersister(BaseStatePersister):
    """A Burr ``BaseStatePersister`` over Rewind's store.

    Args:
        store: the Rewind store holding ``burr_state`` rows and blobs.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def is_initialized(self) -> bool:
        """Always True: the store creates its tables when it opens."""
        return True

    def list_app_ids(self, partition_key: str, **kwargs: Any) -> list[str]:
        """App ids with state rows in a partition (Burr's persister interface)."""
        return self.store.state_app_ids(partition_key or PARTITION_KEY_DEFAULT)

    def load(
        self,
        partition_key: str,
        app_id: str | None,
        sequence_id: int | None = None,
        **kwargs: Any,
    ) -> PersistedStateData | None:
        """Load a state row (the latest of ``app_id`` when ``sequence_id`` is None), every field
        of its recorded type.

        Raises:
            StateLoadError: a field cannot be rebuilt in this process (the fork fails with it).
        """
        if app_id is None:
            return None
        row = self.store.load_state_row(partition_key or PARTITION_KEY_DEFAULT, app_id, sequence_id)
        if row is None:
            return None
        return PersistedStateData(
            partition_key=row["partition_key"],
            app_id=row["app_id"],
            sequence_id=row["sequence_id"],
            position=row["position"],
            state=State(row["values"]),
            created_at=datetime.fromtimestamp(row["created_at"], UTC).isoformat(),
            status=row["status"],
        )

    def save(
        self,
        partition_key: str | None,
        app_id: str,
        sequence_id: int,
        position: str,
        state: State,
        status: Literal["completed", "failed"],
        **kwargs: Any,
    ) -> None:
        """Save a state row in its own transaction (the recorder batches its rows instead)."""
        batch = WriteBatch()
        self.add_state(batch, partition_key, app_id, sequence_id, position, state, status)
        self.store.write_batch(batch)

    def add_state(
        self,
        batch: WriteBatch,
        partition_key: str | None,
        app_id: str,
        sequence_id: int,
        position: str,
        state: State,
        status: str,
        encoder: FieldEncoder | None = None,
    ) -> dict[str, EncodedField]:
        """Add a state row and its new field blobs to ``batch``; returns the encoded fields."""
        semantic, internal = split_internal(state.get_all())
        fields, fresh = (encoder or FieldEncoder()).encode(semantic)
        for k in fresh:
            batch.blobs.setdefault(fields[k].digest, fields[k].data)
        batch.states.append(
            state_row(
                partition_key=partition_key or PARTITION_KEY_DEFAULT,
                app_id=app_id,
                sequence_id=sequence_id,
                position=position,
                status=status,
                fields=field_map(fields),
                internal=internal,
            )
        )
        return fields
