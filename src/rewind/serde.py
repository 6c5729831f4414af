"""Exact encoding of typed state values: what a run stores is what a fork loads back.

A debugger that changes the data it replays cannot be trusted, so every value a Burr state field
holds is turned into a *tagged document* — JSON-compatible, hashed by :mod:`rewind.canonical` —
from which :func:`decode` rebuilds a value of the very same type, equal to the original. A value
Rewind cannot rebuild exactly is refused when it is recorded (:class:`UnstorableValue`, naming the
field path, the type and how to register a serializer), never silently converted.

The document of a value:

* ``str``, ``int``, finite ``float``, ``bool``, ``None`` and ``list`` are themselves.
* A ``dict`` whose keys are all ``str`` and already in canonical order (the order
  :func:`rewind.canonical.canonical_json` writes, which is the order ``json.loads`` gives back) is
  a JSON object. Any other ``dict`` is ``{"$rw": "dict", "keys": [...], "values": [...]}`` in its
  own order: **key order is part of the value** (Python dicts are ordered, and code that iterates
  a state dict — to build a prompt, say — sees the order), and ``int``/``tuple``/enum keys keep
  their types. A dict
  that itself holds a ``"$rw"`` or Burr ``"__burr_serde__"`` key takes the same form, so user data
  can never pass for a tag.
* Tagged (``{"$rw": <tag>, ...}``): ``tuple``, ``set``/``frozenset`` (elements sorted by their
  canonical JSON), ``Enum`` members (``IntEnum``/``StrEnum``/``Flag`` included: class + value),
  ``datetime``/``date``/``time`` (with ``fold`` and a fixed-offset or ``zoneinfo`` zone),
  ``timedelta``, ``Decimal`` (its exact string), ``UUID``, ``bytes``/``bytearray`` (base64),
  ``complex``, ``OrderedDict``, ``defaultdict`` (with its ``default_factory``), ``Counter``,
  ``deque`` (with its ``maxlen``), numpy scalars and arrays of non-object dtypes (dtype, shape and
  raw bytes), pydantic models (every field, ``model_fields_set``, private attributes and extras;
  computed fields are recomputed), dataclass instances (every field, ``init=False`` ones
  included), and values of types with a Burr serializer (``burr.core.serde.serialize.register``,
  or ``burr.integrations.serde.pickle.register_type_to_pickle``), which is honoured.

Classes are named ``module:QualName`` (nested classes through ``__qualname__``) and must import
back to the very same class: a class defined inside a function (``<locals>``) or in ``__main__``
is refused at record time, because a fork runs in another process. Loading imports the named
module, as Burr's own pydantic loader does: load only stores you trust.

Because the hash is taken over this document, two values that load back differently (a tuple and
a list, an ``IntEnum`` and its int, an ``OrderedDict`` and a dict, ``{"a", "b"}`` and ``["a",
"b"]``, two key orders) never share a hash, while plain JSON values keep the bytes — and hashes —
they had before tags existed. Blobs written before tags existed have no ``"$rw"`` key and load as
before (through Burr's serde when they carry its ``__burr_serde__`` marker).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import importlib
import json
import math
import sys
import uuid
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable
from decimal import Decimal
from enum import Enum
from typing import Any
from zoneinfo import ZoneInfo

from burr.core import serde as burr_serde
from burr.core.state import FIELD_SERIALIZATION, State

from rewind.canonical import MAX_DEPTH, canonical_json
from rewind.errors import StateLoadError, UnstorableValue

__all__ = ["TAG", "decode", "decode_field", "display", "encode", "encode_field"]

TAG = "$rw"
"""The key that marks a tagged document (see the module docstring)."""

_TAG_BYTES = b'"$rw":'
_BURR_KEY = burr_serde.KEY
_BURR_KEY_BYTES = b'"' + burr_serde.KEY.encode() + b'"'
_SCALARS = frozenset({str, int, float, bool, type(None)})
_BURR_OWN_MODULES = frozenset(
    {
        "burr.core.serde",
        "burr.integrations.serde.pydantic",
        "burr.integrations.serde.pandas",
        "burr.integrations.serde.langchain",
    }
)
"""Burr's built-in serializers lose types (a pydantic model of a nested class cannot be loaded
back, a pandas frame needs a path); Rewind's exact handlers take precedence over them. Any
serializer registered from elsewhere (the user's code, Burr's pickle helper) is honoured."""

_HOW_TO_REGISTER = (
    "register a Burr serializer for {name}: @burr.core.serde.serialize.register({short}) "
    "returning {{burr.core.serde.KEY: 'my-key', ...}} plus @burr.core.serde.deserializer."
    "register('my-key'), or burr.integrations.serde.pickle.register_type_to_pickle({short})"
)


# -- encoding -----------------------------------------------------------------------------------


def encode_field(key: str, value: Any) -> Any:
    """The tagged document of one top-level state field.

    A field with a Burr field serde (``burr.core.state.register_field_serde``) goes through it
    (``{"$rw": "field", "v": <its dict>}``); any other value through :func:`encode`.

    Raises:
        UnstorableValue: the value (or something inside it) cannot be stored exactly; the
            message names the path from ``key``, the type and how to register a serializer.
    """
    if key in FIELD_SERIALIZATION:
        try:
            doc = FIELD_SERIALIZATION[key][0](value)
        except Exception as exc:
            raise _refuse(key, value, f"its field serializer raised {_line(exc)}") from exc
        if not isinstance(doc, dict):
            raise _refuse(key, value, f"its field serializer returned {type(doc).__name__}")
        try:
            return {TAG: "field", "v": _enc(doc, key, 0, False)}
        except RecursionError:
            raise _too_deep(key, value) from None
    return encode(value, path=key)


def encode(value: Any, *, path: str = "$") -> Any:
    """The tagged, JSON-compatible document of ``value`` (see the module docstring).

    Args:
        value: any value a Burr state field may hold.
        path: where the value sits, for error messages (a state field name, ``$`` by default).
    Returns:
        a document of ``dict``/``list``/``str``/``int``/``float``/``bool``/``None``; plain JSON
        values are returned as they are (the same object, not a copy).
    Raises:
        UnstorableValue: a value that cannot be stored exactly (a lambda, an open file, a class
            defined inside a function, a custom class with no serializer...).
    """
    if _plain(value, 0):
        return value
    try:
        return _enc(value, path, 0, False)
    except RecursionError:
        # A value that contains itself (or nests deeper than the interpreter's stack): each
        # level costs a few frames, so Python's limit is met before MAX_DEPTH is.
        raise _too_deep(path, value) from None


def _too_deep(path: str, value: Any) -> UnstorableValue:
    return _refuse(
        path,
        value,
        f"it contains itself (a cycle) or nests deeper than {MAX_DEPTH} levels; store a "
        "flat form (ids instead of references)",
        register=False,
    )


def display(value: Any) -> Any:
    """A JSON view of a decoded value for people (the CLI and the API): plain dicts stay objects
    in their own key order, every other non-JSON value is shown as its tagged document (so its
    type is visible). Never raises: a value that cannot be encoded is shown as its ``repr``."""
    try:
        return _enc(value, "$", 0, True)
    except (UnstorableValue, RecursionError):
        return {TAG: "unstorable", "type": _type_name(value), "repr": repr(value)[:200]}


def _plain(value: Any, depth: int) -> bool:
    """True if ``value`` is its own document: exact JSON types, str keys in canonical order."""
    t = type(value)
    if t is dict:
        if not value:
            return True
        if TAG in value or _BURR_KEY in value:
            return False
        keys = list(value)
        if set(map(type, keys)) != {str} or keys != _canonical_order(keys):
            return False
        children: Any = value.values()
    elif t is list:
        children = value
    else:
        return t in _SCALARS and not (t is int and _huge(value))
    types = set(map(type, children))
    if int in types and not _all_small_ints(children):
        return False
    if types <= _SCALARS:
        return True
    if depth >= MAX_DEPTH:
        return False
    for child in children:
        if type(child) not in _SCALARS and not _plain(child, depth + 1):
            return False
    return True


_BIG_INT = 10**4300
"""Ints from here on have more digits than ``json.loads`` reads back (sys.int_max_str_digits,
4300 by default): they are stored as ``{"$rw": "int", "v": <hex>}`` (hex has no such limit)."""


def _huge(value: int) -> bool:
    return not -_BIG_INT < value < _BIG_INT


def _all_small_ints(values: Any) -> bool:
    return all(-_BIG_INT < v < _BIG_INT for v in values if type(v) is int)


def _canonical_order(keys: list[str]) -> list[str]:
    if all(map(str.isascii, keys)):
        return sorted(keys)
    return sorted(keys, key=lambda k: k.encode("utf-16-be", "surrogatepass"))


def _enc(value: Any, path: str, depth: int, view: bool) -> Any:
    """Document of ``value``; ``view`` keeps str-keyed dicts as objects (for :func:`display`)."""
    t = type(value)
    if t in _SCALARS:
        if t is float and not math.isfinite(value):
            raise _refuse(
                path,
                value,
                f"{value!r} has no JSON form and Rewind refuses to hash it (canonical.py's rule); "
                "replace it (e.g. with None) before writing it to state",
                register=False,
            )
        if t is int and _huge(value):
            return {TAG: "int", "v": hex(value)}
        return value
    if depth >= MAX_DEPTH:
        raise _refuse(path, value, f"it nests deeper than {MAX_DEPTH} levels (a cycle?)")
    if t is list:
        return _elements(value, path, depth, view)
    if t is dict:
        return _enc_dict(value, path, depth, view)
    if isinstance(value, Enum):
        return {
            TAG: "enum",
            "cls": _ref(type(value), path, value),
            "value": _enc(value.value, path, depth + 1, view),
        }
    handler = _BY_TYPE.get(t)
    if handler is not None:
        return handler(value, path, depth, view)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic | numpy.ndarray):
        dtype = value.dtype
        if not (dtype.hasobject or dtype.fields is not None) or _burr_serializer(t) is None:
            return _enc_numpy(value, path, numpy)
        # An object/structured array has no exact byte form: the user's serializer, as the
        # refusal's hint says.
    custom = _burr_serializer(t)
    if custom is not None:
        return _enc_burr(custom, value, path, depth, view)
    if _is_pydantic(value):
        return _enc_pydantic(value, path, depth, view)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _enc_dataclass(value, path, depth, view)
    raise _refuse(path, value, _why_not(value))


def _all_scalar(values: Any) -> bool:
    """True if every value is a JSON scalar that is its own document (hot path: C-speed maps)."""
    types = set(map(type, values))
    if not types <= _SCALARS:
        return False
    if int in types and not _all_small_ints(values):
        return False
    return float not in types or all(math.isfinite(v) for v in values if type(v) is float)


def _enc_dict(value: dict[Any, Any], path: str, depth: int, view: bool) -> Any:
    keys = list(value)
    if set(map(type, keys)) <= {str} and (
        view or (TAG not in value and _BURR_KEY not in value and keys == _canonical_order(keys))
    ):
        if _all_scalar(value.values()):
            return dict(value)
        return {k: _enc(v, _key_path(path, k), depth + 1, view) for k, v in value.items()}
    return {TAG: "dict", **_items(value, path, depth, view)}


def _items(value: dict[Any, Any], path: str, depth: int, view: bool) -> dict[str, list[Any]]:
    """``{"keys": [...], "values": [...]}`` in the dict's own order (two flat lists: cheaper to
    build and to hash than a list of pairs)."""
    keys = list(value)
    if not _all_scalar(keys):
        keys = [_enc(k, f"{path} (key {_key_repr(k)})", depth + 1, view) for k in keys]
    values = list(value.values())
    if not _all_scalar(values):
        values = [_enc(v, _key_path(path, k), depth + 1, view) for k, v in value.items()]
    return {"keys": keys, "values": values}


def _key_path(path: str, key: Any) -> str:
    if isinstance(key, str):
        return f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key)}]"
    return f"{path}[{_key_repr(key)}]"


def _key_repr(key: Any) -> str:
    """``repr`` of a dict key for a path; an int too long for ``repr`` is shown by its size."""
    if type(key) is int and _huge(key):
        return f"<int of {key.bit_length()} bits>"
    return repr(key)


def _elements(value: Any, path: str, depth: int, view: bool) -> list[Any]:
    if _all_scalar(value):
        return list(value)
    return [_enc(v, f"{path}[{i}]", depth + 1, view) for i, v in enumerate(value)]


def _enc_tuple(value: tuple[Any, ...], path: str, depth: int, view: bool) -> Any:
    return {TAG: "tuple", "items": _elements(value, path, depth, view)}


def _enc_set(value: set[Any] | frozenset[Any], path: str, depth: int, view: bool) -> Any:
    docs = [_enc(v, f"{path}[?]", depth + 1, view) for v in value]
    # Sorted by canonical JSON: iteration order of a set depends on PYTHONHASHSEED.
    docs.sort(key=canonical_json)
    return {TAG: type(value).__name__, "items": docs}


def _enc_deque(value: deque[Any], path: str, depth: int, view: bool) -> Any:
    return {TAG: "deque", "maxlen": value.maxlen, "items": _elements(value, path, depth, view)}


def _enc_ordered(value: OrderedDict[Any, Any], path: str, depth: int, view: bool) -> Any:
    return {TAG: "OrderedDict", **_items(value, path, depth, view)}


def _enc_counter(value: Counter[Any], path: str, depth: int, view: bool) -> Any:
    return {TAG: "Counter", **_items(value, path, depth, view)}


def _enc_defaultdict(value: defaultdict[Any, Any], path: str, depth: int, view: bool) -> Any:
    factory = value.default_factory
    return {
        TAG: "defaultdict",
        "factory": None if factory is None else _ref(factory, f"{path}.default_factory", factory),
        **_items(value, path, depth, view),
    }


def _enc_datetime(value: dt.datetime, path: str, depth: int, view: bool) -> Any:
    doc: dict[str, Any] = {TAG: "datetime", "v": value.replace(tzinfo=None, fold=0).isoformat()}
    return _with_zone(doc, value, path)


def _enc_time(value: dt.time, path: str, depth: int, view: bool) -> Any:
    doc: dict[str, Any] = {TAG: "time", "v": value.replace(tzinfo=None, fold=0).isoformat()}
    return _with_zone(doc, value, path)


def _with_zone(doc: dict[str, Any], value: dt.datetime | dt.time, path: str) -> dict[str, Any]:
    if value.fold:
        doc["fold"] = 1
    tz = value.tzinfo
    if tz is None:
        return doc
    if type(tz) is dt.timezone:
        offset = tz.utcoffset(None)
        doc["offset_us"] = offset // dt.timedelta(microseconds=1)
        if tz.tzname(None) != dt.timezone(offset).tzname(None):
            doc["tzname"] = tz.tzname(None)
    elif type(tz) is ZoneInfo and tz.key is not None:
        doc["zone"] = tz.key
    else:
        raise _refuse(
            path,
            value,
            f"its tzinfo {_type_name(tz)} cannot be stored exactly; use datetime.timezone or "
            "zoneinfo.ZoneInfo",
        )
    return doc


def _enc_simple(tag: str, text: Callable[[Any], Any]) -> Callable[..., Any]:
    def encode_one(value: Any, path: str, depth: int, view: bool) -> Any:
        return {TAG: tag, "v": text(value)}

    return encode_one


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _enc_complex(value: complex, path: str, depth: int, view: bool) -> Any:
    return {TAG: "complex", "v": [value.real, value.imag]}


_BY_TYPE: dict[type, Callable[[Any, str, int, bool], Any]] = {
    tuple: _enc_tuple,
    set: _enc_set,
    frozenset: _enc_set,
    deque: _enc_deque,
    OrderedDict: _enc_ordered,
    Counter: _enc_counter,
    defaultdict: _enc_defaultdict,
    dt.datetime: _enc_datetime,
    dt.time: _enc_time,
    dt.date: _enc_simple("date", dt.date.isoformat),
    dt.timedelta: _enc_simple("timedelta", lambda v: [v.days, v.seconds, v.microseconds]),
    Decimal: _enc_simple("Decimal", str),
    uuid.UUID: _enc_simple("UUID", str),
    bytes: _enc_simple("bytes", _b64),
    bytearray: _enc_simple("bytearray", _b64),
    complex: _enc_complex,
}


def _enc_numpy(value: Any, path: str, numpy: Any) -> Any:
    if type(value) is not numpy.ndarray and not isinstance(value, numpy.generic):
        raise _refuse(path, value, "numpy array subclasses are not stored; use numpy.asarray()")
    dtype = value.dtype
    if dtype.hasobject or dtype.fields is not None:
        raise _refuse(
            path,
            value,
            f"numpy dtype {dtype} (object or structured) has no exact byte form; use a plain "
            "dtype, or lists",
        )
    if isinstance(value, numpy.generic):
        return {TAG: "numpy", "dtype": dtype.str, "data": _b64(value.tobytes())}
    return {
        TAG: "ndarray",
        "dtype": dtype.str,
        "shape": list(value.shape),
        "data": _b64(numpy.ascontiguousarray(value).tobytes()),
    }


def _enc_burr(serializer: Callable[..., Any], value: Any, path: str, depth: int, view: bool) -> Any:
    try:
        doc = serializer(value)
    except Exception as exc:
        raise _refuse(path, value, f"its Burr serializer raised {_line(exc)}") from exc
    key = doc.get(_BURR_KEY) if isinstance(doc, dict) else None
    if key is None:
        raise _refuse(path, value, f"its Burr serializer did not return a dict with {_BURR_KEY!r}")
    if key not in burr_serde.deserializer.func_map:
        raise _refuse(path, value, f"no Burr deserializer is registered for key {key!r}")
    return {TAG: "burr", "v": _enc(doc, path, depth + 1, view)}


def _burr_serializer(t: type) -> Callable[..., Any] | None:
    """The Burr serializer registered for ``t`` by someone other than Burr itself, if any."""
    impl = burr_serde.serialize.dispatch(t)
    if getattr(impl, "__module__", "") in _BURR_OWN_MODULES:
        return None
    return impl


def _is_pydantic(value: object) -> bool:
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(value, pydantic.BaseModel)


def _enc_pydantic(value: Any, path: str, depth: int, view: bool) -> Any:
    fields = value.__dict__
    doc: dict[str, Any] = {
        TAG: "pydantic",
        "cls": _ref(type(value), path, value),
        "fields": {k: _enc(v, _key_path(path, k), depth + 1, view) for k, v in fields.items()},
        "fields_set": sorted(value.model_fields_set),
    }
    private = value.__pydantic_private__
    if private is not None:
        doc["private"] = {
            k: _enc(v, _key_path(path, k), depth + 1, view) for k, v in private.items()
        }
    extra = value.__pydantic_extra__
    if extra is not None:
        doc["extra"] = _enc(extra, path, depth + 1, view)
    return doc


def _enc_dataclass(value: Any, path: str, depth: int, view: bool) -> Any:
    names = [f.name for f in dataclasses.fields(value)]
    names += [k for k in getattr(value, "__dict__", {}) if k not in names]
    fields = {}
    for name in names:
        try:
            attr = getattr(value, name)
        except AttributeError:
            continue  # an init=False field never assigned: restored as unassigned too
        fields[name] = _enc(attr, _key_path(path, name), depth + 1, view)
    return {TAG: "dataclass", "cls": _ref(type(value), path, value), "fields": fields}


# -- class references ---------------------------------------------------------------------------

_REFS: dict[Any, str] = {}


def _ref(obj: Any, path: str, value: Any) -> str:
    """``module:QualName`` of a class or function that imports back to the very same object."""
    known = _REFS.get(obj)
    if known is not None:
        return known
    module = getattr(obj, "__module__", None) or ""
    qualname = getattr(obj, "__qualname__", None) or ""
    what = f"{module}.{qualname}"
    if "<lambda>" in qualname:
        raise _refuse(
            path,
            value,
            f"{what} is a lambda, which cannot be imported by name; use a named function defined "
            "at the top level of an importable module",
            register=False,
        )
    if "<locals>" in qualname:
        raise _refuse(
            path,
            value,
            f"{what} is defined inside a function, so a fork in another process cannot import "
            "it; define it at the top level of an importable module",
            register=False,
        )
    if module == "__main__":
        raise _refuse(
            path,
            value,
            f"{what} lives in __main__ (the script being run), which a fork in another process "
            "cannot import; move it into an importable module",
            register=False,
        )
    ref = f"{module}:{qualname}"
    try:
        found = _resolve(ref)
    except Exception:
        found = None
    if found is not obj:
        raise _refuse(
            path,
            value,
            f"{ref} does not import back to the same object; define it at the top level of an "
            "importable module",
            register=False,
        )
    _REFS[obj] = ref
    return ref


def _resolve(ref: str) -> Any:
    module, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# -- refusals -----------------------------------------------------------------------------------


def _type_name(value: object) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def _why_not(value: object) -> str:
    if callable(value) and hasattr(value, "__code__"):
        return "functions cannot be stored; keep them out of state (bind them to the action)"
    if hasattr(value, "read") and hasattr(value, "close"):
        return "open files and connections cannot be stored; keep a path or an id in state"
    return "Rewind has no exact encoding for it"


def _refuse(path: str, value: object, why: str, *, register: bool = True) -> UnstorableValue:
    name = _type_name(value)
    hint = _HOW_TO_REGISTER.format(name=name, short=type(value).__qualname__) if register else ""
    if register and name.split(".")[0] == "pandas":
        hint = (
            f"burr.integrations.serde.pickle.register_type_to_pickle({name}) stores it exactly "
            "(Burr's own pandas serde is not used: it writes a parquet file to a path and the "
            "state keeps only that path); or register your own Burr serializer for it"
        )
    return UnstorableValue(
        f"state field {path} holds a {name}, which Rewind cannot store exactly: {why}",
        hint,
        path=path,
        type_name=name,
    )


# -- decoding -----------------------------------------------------------------------------------


def decode_field(key: str, data: bytes) -> Any:
    """Load one top-level state field from its stored bytes (canonical JSON).

    Documents written before tags existed (no ``"$rw"`` key) load as they did then: plain JSON,
    through Burr's serde when they carry its marker or the field has a Burr field serde.

    Raises:
        StateLoadError: the value cannot be rebuilt (a class that no longer imports, a
            serializer not registered in this process...); the message names the field.
    """
    if _TAG_BYTES not in data:
        doc = json.loads(data)
        if key in FIELD_SERIALIZATION or _BURR_KEY_BYTES in data:
            try:
                return State.deserialize({key: doc})[key]
            except Exception as exc:
                raise _load_error(key, f"Burr's serde failed: {_line(exc)}") from exc
        return doc
    doc = json.loads(data)
    if isinstance(doc, dict) and doc.get(TAG) == "field":
        if key not in FIELD_SERIALIZATION:
            raise _load_error(key, "it was stored with a Burr field serde that is not registered")
        inner = decode(doc["v"], path=key)
        try:
            return FIELD_SERIALIZATION[key][1](inner)
        except Exception as exc:
            raise _load_error(key, f"its field deserializer raised {_line(exc)}") from exc
    return decode(doc, path=key)


def decode(doc: Any, *, path: str = "$") -> Any:
    """Rebuild the value a document of :func:`encode` describes (same type, equal value).

    Raises:
        StateLoadError: a class or function the document names cannot be imported, or a tagged
            part is malformed; the message names the path.
    """
    t = type(doc)
    if t is list:
        return [decode(v, path=f"{path}[{i}]") for i, v in enumerate(doc)]
    if t is not dict:
        return doc
    tag = doc.get(TAG)
    if tag is None:
        return {k: decode(v, path=_key_path(path, k)) for k, v in doc.items()}
    decoder = _DECODERS.get(tag)
    if decoder is None:
        raise _load_error(path, f"unknown tag {tag!r} (written by a newer Rewind?)")
    try:
        return decoder(doc, path)
    except StateLoadError:
        raise
    except Exception as exc:
        raise _load_error(path, f"malformed {tag} document: {_line(exc)}") from exc


def _load_error(path: str, why: str) -> StateLoadError:
    return StateLoadError(
        f"cannot load state field {path}: {why}",
        "make the class (or serializer) importable in the process that forks the run: install "
        "its module or put it on PYTHONPATH, and register its serializers at import time",
    )


def _load_ref(ref: str, path: str) -> Any:
    try:
        return _resolve(ref)
    except Exception as exc:
        raise _load_error(path, f"{ref} cannot be imported ({_line(exc)})") from exc


def _dec_items(doc: dict[str, Any], path: str) -> list[tuple[Any, Any]]:
    keys = [decode(k, path=f"{path} (key {i})") for i, k in enumerate(doc["keys"])]
    values = [decode(v, path=_key_path(path, k)) for k, v in zip(keys, doc["values"], strict=True)]
    return list(zip(keys, values, strict=True))


def _dec_elements(doc: dict[str, Any], path: str) -> list[Any]:
    return [decode(v, path=f"{path}[{i}]") for i, v in enumerate(doc["items"])]


def _dec_defaultdict(doc: dict[str, Any], path: str) -> Any:
    factory = None if doc["factory"] is None else _load_ref(doc["factory"], path)
    return defaultdict(factory, _dec_items(doc, path))


def _zone(doc: dict[str, Any]) -> dt.tzinfo | None:
    if "zone" in doc:
        return ZoneInfo(doc["zone"])
    if "offset_us" in doc:
        offset = dt.timedelta(microseconds=doc["offset_us"])
        return dt.timezone(offset, doc["tzname"]) if "tzname" in doc else dt.timezone(offset)
    return None


def _dec_datetime(doc: dict[str, Any], path: str) -> Any:
    value = dt.datetime.fromisoformat(doc["v"])
    return value.replace(tzinfo=_zone(doc), fold=doc.get("fold", 0))


def _dec_time(doc: dict[str, Any], path: str) -> Any:
    value = dt.time.fromisoformat(doc["v"])
    return value.replace(tzinfo=_zone(doc), fold=doc.get("fold", 0))


def _dec_numpy(doc: dict[str, Any], path: str) -> Any:
    try:
        import numpy
    except ImportError as exc:
        raise _load_error(path, "it is a numpy value and numpy is not installed") from exc
    data = base64.b64decode(doc["data"])
    dtype = numpy.dtype(doc["dtype"])
    if doc[TAG] == "numpy":
        return numpy.frombuffer(data, dtype=dtype)[0]
    return numpy.frombuffer(data, dtype=dtype).reshape(doc["shape"]).copy()


def _dec_enum(doc: dict[str, Any], path: str) -> Any:
    cls = _load_ref(doc["cls"], path)
    return cls(decode(doc["value"], path=path))


def _dec_burr(doc: dict[str, Any], path: str) -> Any:
    inner = decode(doc["v"], path=path)
    try:
        return burr_serde.deserialize(inner)
    except Exception as exc:
        raise _load_error(path, f"its Burr deserializer failed: {_line(exc)}") from exc


def _dec_pydantic(doc: dict[str, Any], path: str) -> Any:
    cls = _load_ref(doc["cls"], path)
    obj = cls.__new__(cls)
    # Restored as stored, not re-validated: validators already ran when the value was made, and
    # running them again could change it (this is what model_construct does, minus defaults).
    fields = {k: decode(v, path=_key_path(path, k)) for k, v in doc["fields"].items()}
    ordered = {k: fields[k] for k in cls.model_fields if k in fields}
    ordered |= fields
    object.__setattr__(obj, "__dict__", ordered)
    object.__setattr__(obj, "__pydantic_fields_set__", set(doc["fields_set"]))
    extra = decode(doc["extra"], path=path) if "extra" in doc else None
    object.__setattr__(obj, "__pydantic_extra__", extra)
    private = doc.get("private")
    object.__setattr__(
        obj,
        "__pydantic_private__",
        None if private is None else {k: decode(v, path=path) for k, v in private.items()},
    )
    return obj


def _dec_dataclass(doc: dict[str, Any], path: str) -> Any:
    cls = _load_ref(doc["cls"], path)
    obj = cls.__new__(cls)
    fields = doc["fields"]
    order = [f.name for f in dataclasses.fields(cls) if f.name in fields]
    order += [k for k in fields if k not in order]
    for name in order:
        # object.__setattr__: frozen dataclasses too; __post_init__ is not run again.
        object.__setattr__(obj, name, decode(fields[name], path=_key_path(path, name)))
    return obj


_DECODERS: dict[str, Callable[[dict[str, Any], str], Any]] = {
    "dict": lambda d, p: dict(_dec_items(d, p)),
    "tuple": lambda d, p: tuple(_dec_elements(d, p)),
    "set": lambda d, p: set(_dec_elements(d, p)),
    "frozenset": lambda d, p: frozenset(_dec_elements(d, p)),
    "deque": lambda d, p: deque(_dec_elements(d, p), maxlen=d["maxlen"]),
    "OrderedDict": lambda d, p: OrderedDict(_dec_items(d, p)),
    "Counter": lambda d, p: Counter(dict(_dec_items(d, p))),
    "defaultdict": _dec_defaultdict,
    "datetime": _dec_datetime,
    "time": _dec_time,
    "date": lambda d, p: dt.date.fromisoformat(d["v"]),
    "timedelta": lambda d, p: dt.timedelta(*d["v"]),
    "Decimal": lambda d, p: Decimal(d["v"]),
    "UUID": lambda d, p: uuid.UUID(d["v"]),
    "bytes": lambda d, p: base64.b64decode(d["v"]),
    "bytearray": lambda d, p: bytearray(base64.b64decode(d["v"])),
    "complex": lambda d, p: complex(*d["v"]),
    "int": lambda d, p: int(d["v"], 16),
    "numpy": _dec_numpy,
    "ndarray": _dec_numpy,
    "enum": _dec_enum,
    "burr": _dec_burr,
    "pydantic": _dec_pydantic,
    "dataclass": _dec_dataclass,
}
