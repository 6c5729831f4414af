"""Canonical JSON bytes, SHA-256 digests and length-prefixed cache keys.

Every hash Rewind records (node inputs, outputs, semantic state, tool arguments, cache keys) goes
through this module, so that "same content" always means "same bytes" — across processes, across
``PYTHONHASHSEED`` values, across machines and across Python versions. The output follows RFC 8785
(JSON Canonicalization Scheme, JCS):

* object members sorted by their keys compared as UTF-16 code units, no insignificant whitespace;
* strings with the minimal JSON escaping (``\\"``, ``\\\\``, ``\\b \\f \\n \\r \\t``, other
  control characters as lower-case ``\\u00XX``), everything else as raw UTF-8, and **no** Unicode
  normalization (NFC ``"café"`` and NFD ``"café"`` are different content and hash differently);
* integers as exact decimal digits at any size (never routed through float64);
* floats with the ECMAScript Number-to-String algorithm (shortest round-trip digits).

Deliberate deviations from JCS, all of them so that values Python tells apart stay apart:

* **Floats always look like floats.** JCS writes ``1.0`` as ``1``, which would make ``1`` and
  ``1.0`` hash the same. Rewind appends ``.0`` to a float whose JCS form has neither ``.`` nor
  ``e`` (``1.0 -> 1.0``, ``1e20 -> 100000000000000000000.0``, ``1e21 -> 1e+21``).
* **Negative zero is kept.** ``-0.0 -> -0.0`` and ``0.0 -> 0.0`` (JCS writes both as ``0``).
* **NaN and ±Infinity are refused** with :class:`CanonicalError`. JSON cannot carry them, and a
  ``NaN`` in a state is almost always a bug upstream; silently tagging it would let it flow into
  prompts and cache keys. Convert it explicitly (``None``, a string, a sentinel) before hashing.
* **Non-string keys.** ``int`` keys are written as their decimal string (what ``json.dumps``
  does, so ``{2: 2, 10: 10}`` hashes like its JSON round trip); every other key type is refused,
  and two keys that collide after stringification (``{1: "p", "1": "q"}``) are refused.
* **More Python types.** ``tuple`` is an array, ``set``/``frozenset`` an array sorted by each
  element's canonical bytes, a dataclass instance an object of its fields, a pydantic model its
  ``model_dump(mode="python")``, an ``Enum`` member its ``value``. Anything else (``bytes``,
  ``datetime``, numpy scalars, arbitrary objects) is refused: hashing ``repr()``, ``hash()`` or
  ``id()`` would tie the digest to one process.

Errors name the JSON path of the offending value (``$.a[3].b``; ``$["key with space"]`` for keys
that are not identifiers; ``[?]`` for an element of a set, whose position is not defined yet).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
from enum import Enum
from json.encoder import encode_basestring as _encode_str  # C-accelerated when available
from typing import Any

__all__ = [
    "CanonicalError",
    "KeyPrefix",
    "canonical_bytes",
    "canonical_json",
    "content_hash",
    "key_of",
    "loads",
    "loads_exactly",
    "sha256_hex",
]

# Containers nested deeper than this are refused (a self-referencing list would otherwise end in
# RecursionError with no path). Far beyond any real pipeline state.
MAX_DEPTH = 400

# |int| below this converts with int.__repr__ without hitting sys.int_max_str_digits (4300).
_SMALL_INT = 10**4000
_INT_CHUNK_DIGITS = 4000

_int_repr = int.__repr__
_float_repr = float.__repr__


class CanonicalError(ValueError):
    """A value cannot be turned into canonical JSON.

    The message starts with the JSON path of the offending value (``$`` is the root, e.g.
    ``$.rows[3].mean``), says what is wrong and how to fix it. ``path`` holds the same path.
    Subclasses ``ValueError`` so callers that already guard ``json.dumps`` keep working.
    """

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class _Failure(Exception):
    """Internal: raised at the offending value; containers add their segment on the way up."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.segments: list[str] = []  # innermost first


def _key_segment(key: str) -> str:
    if key.isidentifier() and key.isascii():
        return "." + key
    return "[" + json.dumps(key, ensure_ascii=False) + "]"


def _format_path(segments: list[str]) -> str:
    path = "$" + "".join(reversed(segments))
    if len(path) > 300:
        path = path[:140] + " ... " + path[-140:]
    return path


def _big_int_digits(n: int) -> str:
    """Decimal digits of an int too large for ``int.__repr__`` (sys.int_max_str_digits)."""
    sign = ""
    if n < 0:
        sign, n = "-", -n
    chunks: list[str] = []
    while n >= _SMALL_INT:
        n, low = divmod(n, _SMALL_INT)
        chunks.append(_int_repr(low).zfill(_INT_CHUNK_DIGITS))
    chunks.append(_int_repr(n))
    return sign + "".join(reversed(chunks))


def _float_text(f: float) -> str:
    """ECMAScript Number-to-String of a finite float, with Rewind's ``.0`` / ``-0.0`` rule.

    ``float.__repr__`` already yields the shortest round-trip digits ECMAScript asks for; it uses
    positional notation exactly for 1e-4 <= |f| < 1e16 (and zero), where ECMAScript does too, and
    there the repr (with its ``.0``) is already Rewind's form. Only exponent forms need rework.
    """
    r = _float_repr(f)
    if "e" not in r:
        if r[-1] == "f" or r[-1] == "n":  # 'inf', '-inf', 'nan'
            raise _Failure(
                f"float {r} is not allowed: JSON has no NaN/Infinity and Rewind refuses to hash "
                "them; replace it (e.g. with None or a string) before hashing"
            )
        return r
    mantissa, _, exp_text = r.partition("e")
    sign = ""
    if mantissa[0] == "-":
        sign, mantissa = "-", mantissa[1:]
    digits = mantissa.replace(".", "")  # repr's mantissa is d[.ddd], no trailing zeros
    k = len(digits)
    n = int(exp_text) + 1  # value = 0.digits * 10**n
    if k <= n <= 21:
        body = digits + "0" * (n - k) + ".0"
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        body = digits[0] + ("." + digits[1:] if k > 1 else "") + ("e+" if e >= 0 else "e-")
        body += _int_repr(abs(e))
    return sign + body


def utf16_key(s: str) -> bytes:
    """Sort key of a JSON object key in RFC 8785 order: its UTF-16 code units (big-endian
    bytes compare as the units do; a lone surrogate is kept, not refused)."""
    return s.encode("utf-16-be", "surrogatepass")


def _object_items(value: dict[Any, Any]) -> list[tuple[str, Any]]:
    """Members of a dict as (str key, value), sorted the JCS way; checks key types."""
    items: list[tuple[str, Any]] = []
    converted = False
    ascii_only = True
    for key, val in value.items():
        tk = type(key)
        if tk is not str:
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                raise _Failure(
                    f"object key {_short(key)} of type {type(key).__name__} is not allowed: keys "
                    "must be str (or int, written as its decimal string); convert it to str"
                )
            key = str.__str__(key) if isinstance(key, str) else _int_repr(int.__int__(key))
            converted = True
        if ascii_only and not key.isascii():
            ascii_only = False
        items.append((key, val))
    if converted:
        seen: dict[str, object] = {}
        for (key, _), original in zip(items, value, strict=True):
            if key in seen:
                raise _Failure(
                    f"object keys {_short(seen[key])} and {_short(original)} both become the "
                    f"JSON key {_short(key)}; rename one of them"
                )
            seen[key] = original
    if ascii_only:
        items.sort(key=_first)
    else:
        # JCS orders keys by UTF-16 code units; this differs from code-point order only when a
        # key holds a character above U+FFFF (its surrogates sort below U+E000..U+FFFF).
        items.sort(key=_utf16_first)
    return items


def _short(key: object) -> str:
    # Only for error messages (never hashed): keys here are str, int or simple scalars.
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


def _first(item: tuple[str, object]) -> str:
    return item[0]


def _utf16_first(item: tuple[str, object]) -> bytes:
    return utf16_key(item[0])


def _encode(value: Any, out: list[str], depth: int) -> None:
    """Append the canonical JSON text of ``value`` to ``out``.

    Hot path: exact built-in types are dispatched with ``type(x) is``; scalar children are
    written inline instead of through a recursive call; homogeneous scalar lists go through
    ``map`` at C speed. Everything unusual goes to ``_encode_other``.
    """
    t = type(value)
    if t is str:
        out.append(_encode_str(value))
    elif t is dict:
        _encode_dict(value, out, depth)
    elif t is list or t is tuple:
        _encode_array(value, out, depth)
    elif t is int:
        out.append(_int_repr(value) if -_SMALL_INT < value < _SMALL_INT else _big_int_digits(value))
    elif t is float:
        out.append(_float_text(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    else:
        _encode_other(value, out, depth)


def _encode_dict(value: dict[Any, Any], out: list[str], depth: int) -> None:
    if not value:
        out.append("{}")
        return
    if depth >= MAX_DEPTH:
        raise _Failure(_too_deep())
    key_types = set(map(type, value))
    if len(key_types) == 1 and str in key_types:
        keys = sorted(value)
        if not all(map(str.isascii, keys)):
            keys.sort(key=utf16_key)
        items: list[tuple[str, Any]] = [(k, value[k]) for k in keys]
    else:
        items = _object_items(value)
    append = out.append
    key = ""
    try:
        sep = "{"
        for key, val in items:
            append(sep)
            append(_encode_str(key))
            tv = type(val)
            if tv is str:
                append(":" + _encode_str(val))
            elif tv is int and -_SMALL_INT < val < _SMALL_INT:
                append(":" + _int_repr(val))
            elif tv is float:
                append(":" + _float_text(val))
            elif val is None:
                append(":null")
            else:
                append(":")
                _encode(val, out, depth + 1)
            sep = ","
    except _Failure as f:
        f.segments.append(_key_segment(key))
        raise
    append("}")


def _encode_array(value: list[Any] | tuple[Any, ...], out: list[str], depth: int) -> None:
    if not value:
        out.append("[]")
        return
    if depth >= MAX_DEPTH:
        raise _Failure(_too_deep())
    types = set(map(type, value))
    if len(types) == 1:
        t = types.pop()
        if t is str:
            out.append("[" + ",".join(map(_encode_str, value)) + "]")
            return
        if t is int and min(value) > -_SMALL_INT and max(value) < _SMALL_INT:
            out.append("[" + ",".join(map(_int_repr, value)) + "]")
            return
        if t is float:
            try:
                out.append("[" + ",".join(map(_float_text, value)) + "]")
                return
            except _Failure:
                pass  # NaN/Infinity: the loop below raises again, naming the index
    append = out.append
    index = 0
    try:
        sep = "["
        for index, val in enumerate(value):  # noqa: B007 (read in the except clause)
            append(sep)
            tv = type(val)
            if tv is str:
                append(_encode_str(val))
            elif tv is int and -_SMALL_INT < val < _SMALL_INT:
                append(_int_repr(val))
            elif tv is float:
                append(_float_text(val))
            else:
                _encode(val, out, depth + 1)
            sep = ","
    except _Failure as f:
        f.segments.append(f"[{index}]")
        raise
    append("]")


def _too_deep() -> str:
    return (
        f"containers nest deeper than {MAX_DEPTH} levels (a reference cycle?); "
        "flatten the value or break the cycle"
    )


def _encode_other(value: Any, out: list[str], depth: int) -> None:
    """Subclasses of the JSON types and the extra Python types (rare, so off the fast path)."""
    if isinstance(value, Enum):
        _encode(value.value, out, depth + 1)
    elif isinstance(value, str):
        out.append(_encode_str(str.__str__(value)))
    elif isinstance(value, int):
        _encode(int.__int__(value), out, depth)  # the plain int, ignoring overridden methods
    elif isinstance(value, float):
        out.append(_float_text(value))
    elif isinstance(value, dict):
        _encode(dict(value), out, depth)
    elif isinstance(value, (list, tuple)):
        _encode(list(value), out, depth)
    elif isinstance(value, (set, frozenset)):
        _encode_set(value, out, depth)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        _encode(fields, out, depth)
    elif _is_pydantic_model(value):
        _encode(value.model_dump(mode="python"), out, depth)
    else:
        raise _Failure(_refusal(value))


def _encode_set(value: set | frozenset, out: list[str], depth: int) -> None:
    if not value:
        out.append("[]")
        return
    if depth >= MAX_DEPTH:
        raise _Failure(_too_deep())
    texts: list[str] = []
    try:
        for element in value:
            piece: list[str] = []
            _encode(element, piece, depth + 1)
            texts.append("".join(piece))
    except _Failure as f:
        f.segments.append("[?]")
        raise
    # Code-point order of the JSON text equals byte order of its UTF-8 encoding.
    texts.sort()
    out.append("[")
    out.append(",".join(texts))
    out.append("]")


def _is_pydantic_model(value: object) -> bool:
    # Lazy and optional: if pydantic was never imported, no object can be one of its models.
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None) if pydantic is not None else None
    return base is not None and isinstance(value, base)


def _refusal(value: object) -> str:
    name = type(value).__qualname__
    module = type(value).__module__
    if not isinstance(module, str):  # None for the types numpy.ctypeslib.as_ctypes makes
        module = "builtins"
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        hint = "decode it to str, or hash it with sha256_hex() and store the hex digest"
    elif module.startswith("numpy"):
        hint = "convert it with .item() or .tolist()"
    elif module == "datetime":
        hint = "convert it to an ISO 8601 string (value.isoformat())"
    elif module == "decimal":
        hint = "convert it to str (exact) or int"
    elif hasattr(value, "keys") and hasattr(value, "__getitem__"):
        hint = "convert it to a dict (dict(value))"
    else:
        hint = "convert it to JSON types (dict, list, str, int, float, bool, None) first"
    return f"type {name} cannot be hashed canonically; {hint}"


def canonical_json(value: object) -> str:
    """Return the canonical JSON text of ``value`` (RFC 8785 style, see the module docstring).

    Args:
        value: a JSON-like Python value: ``dict`` (``str``/``int`` keys), ``list``, ``tuple``,
            ``set``/``frozenset``, ``str``, ``int``, finite ``float``, ``bool``, ``None``,
            dataclass instances, pydantic models and ``Enum`` members, nested at most
            ``MAX_DEPTH`` levels.

    Returns:
        The canonical text: no whitespace, sorted keys, non-ASCII characters unescaped.

    Raises:
        CanonicalError: a value or key of an unsupported type, NaN/±Infinity, colliding keys,
            a string that is not valid Unicode (lone surrogate), or a too-deep/cyclic value.
            The message names the JSON path, because a digest that silently depended on
            ``repr()`` or on process state would break replay determinism.
    """
    t = type(value)
    if (t is dict or t is list or t is tuple) and _plain_json(value, 0):
        text = _c_json(value)
        if text is not None:
            return text
    return _python_json(value)


def _python_json(value: object) -> str:
    """The reference encoder: handles every accepted type and names the path of every refusal."""
    out: list[str] = []
    try:
        _encode(value, out, 0)
    except _Failure as f:
        raise CanonicalError(_format_path(f.segments), f.problem) from None
    except RecursionError:
        raise CanonicalError("$", _too_deep()) from None
    return "".join(out)


# --- Fast path --------------------------------------------------------------------------------
# For the common case (plain dict/list/str/int/float/bool/None trees) the C encoder of the
# standard json module writes exactly the canonical text, provided that: every key is an exact
# str without characters above U+FFFF (so its code-point sort equals JCS's UTF-16 order), every
# value has an exact JSON type (no subclasses, sets, dataclasses...), and every float is zero or
# has 1e-4 <= |f| < 1e16 — the range where repr() writes positional notation, ECMAScript does too,
# and repr's trailing ".0" is the one Rewind wants. _plain_json checks all three with mostly
# C-speed map/set calls; anything doubtful (and every error) goes to the reference encoder.
# Tests assert that both paths give identical text.

_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})
_C_ENCODE = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, check_circular=False, sort_keys=True, separators=(",", ":")
).encode
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")

# orjson (when installed) writes the same bytes as the C encoder for every value _plain_json
# admits — sorted str keys without astral characters, exact JSON types, floats in repr's
# positional range — about 10x faster, and straight to UTF-8. It refuses ints beyond 64 bits,
# nesting beyond 254 levels and lone surrogates: those go on to the C encoder and the reference.
# Tests compare its bytes with the reference encoder's and pin known digests.
try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency; the stdlib path is the fallback
    _orjson = None  # type: ignore[assignment]
    _ORJSON_SORT = 0
else:
    _ORJSON_SORT = _orjson.OPT_SORT_KEYS | _orjson.OPT_PASSTHROUGH_SUBCLASS


def _plain_json(value: dict[Any, Any] | list[Any] | tuple[Any, ...], depth: int) -> bool:
    """True if the C encoder writes ``value`` canonically (see the comment above)."""
    if type(value) is dict:
        key_types = set(map(type, value))
        if len(key_types) != 1 or str not in key_types:
            return len(key_types) == 0
        if not all(map(str.isascii, value)) and any(map(_ASTRAL.search, value)):
            return False
        children: Any = value.values()
    else:
        children = value
    types = set(map(type, children))
    if float in types:
        for child in children:
            if type(child) is float and not (1e-4 <= abs(child) < 1e16 or child == 0.0):
                return False  # exponent notation (or NaN/Infinity) needed
    if types <= _SCALAR_TYPES:
        return True
    if depth >= MAX_DEPTH:
        return False
    for child in children:
        tc = type(child)
        if tc is dict or tc is list or tc is tuple:
            if not _plain_json(child, depth + 1):
                return False
        elif tc not in _SCALAR_TYPES:
            return False
    return True


def _c_json(value: object) -> str | None:
    """Canonical text through the C encoder, or None when the reference encoder must decide."""
    try:
        return _C_ENCODE(value)
    except (ValueError, RecursionError):
        return None  # an int beyond sys.int_max_str_digits, or nesting: let the slow path decide


def canonical_bytes(value: object) -> bytes:
    """Return the canonical JSON of ``value`` as UTF-8 bytes: the input of every Rewind hash.

    Accepts and refuses exactly what :func:`canonical_json` does. Strings are encoded as their
    UTF-8 bytes without Unicode normalization.

    Raises:
        CanonicalError: as :func:`canonical_json`; also when a string holds a lone surrogate
            (``"\\ud800"``), which has no UTF-8 encoding — the path names that string.
    """
    t = type(value)
    if _orjson is not None and (t is dict or t is list or t is tuple) and _plain_json(value, 0):
        try:
            return _orjson.dumps(value, option=_ORJSON_SORT)
        except (TypeError, _orjson.JSONEncodeError):
            pass  # a big int, deep nesting or a lone surrogate: the encoders below decide
    text = canonical_json(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise CanonicalError(
            _surrogate_path(value, "$", 0) or "$",
            "string holds a lone surrogate (not valid Unicode, no UTF-8 form); fix the decoder "
            "that produced it, e.g. decode bytes with errors='replace'",
        ) from None


def _surrogate_path(value: Any, path: str, depth: int) -> str | None:
    """Slow path: the path of the first string (or key) that has no UTF-8 form, else None."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(value, str):
        return None if _utf8_ok(value) else path
    children: list[tuple[str, Any]] = []
    if isinstance(value, Enum):
        children = [(path, value.value)]
    elif isinstance(value, dict):
        for key, val in value.items():
            if isinstance(key, str) and not _utf8_ok(key):
                return f"{path} (key {_short(key)})"
            children.append(
                (path + _key_segment(str.__str__(key) if isinstance(key, str) else "?"), val)
            )
    elif isinstance(value, (list, tuple)):
        children = [(f"{path}[{i}]", val) for i, val in enumerate(value)]
    elif isinstance(value, (set, frozenset)):
        children = [(f"{path}[?]", val) for val in value]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        children = [
            (path + _key_segment(f.name), getattr(value, f.name)) for f in dataclasses.fields(value)
        ]
    elif _is_pydantic_model(value):
        children = [(path, value.model_dump(mode="python"))]
    for child_path, child in children:
        found = _surrogate_path(child, child_path, depth + 1)
        if found is not None:
            return found
    return None


def _utf8_ok(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def sha256_hex(data: bytes) -> str:
    """Return the SHA-256 digest of ``data`` as 64 lower-case hex characters.

    Rewind always stores the full digest: truncated digests invite collisions between cache
    entries that would silently replay the wrong output.

    Raises:
        TypeError: ``data`` is not bytes-like (hash text through :func:`content_hash` or
            encode it explicitly, so the encoding is never implicit).
    """
    return hashlib.sha256(data).hexdigest()


def content_hash(value: object) -> str:
    """Return ``sha256_hex(canonical_bytes(value))``: the content address of a JSON-like value.

    Two values get the same hash exactly when their canonical JSON is identical: dict insertion
    order, ``PYTHONHASHSEED`` and ``\\u`` escaping of the source never matter; list order, ``1``
    vs ``1.0``, ``0.0`` vs ``-0.0`` and Unicode normalization form do.

    Raises:
        CanonicalError: as :func:`canonical_bytes`.
    """
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def key_of(*parts: bytes | str) -> str:
    """Return a cache key: SHA-256 hex over the parts, each written as ``b"<len>:" + part``.

    Args:
        parts: byte strings, or ``str`` (encoded as UTF-8, so ``"é"`` and ``b"\\xc3\\xa9"`` give
            the same key). ``<len>`` is the part's length in bytes, in decimal.

    The length prefix is why ``("ab", "c")`` and ``("a", "bc")`` cannot collide: plain
    concatenation would feed both as ``abc`` to the hash.

    Raises:
        TypeError: a part is neither ``bytes``/``bytearray`` nor ``str`` (canonicalize structured
            values with :func:`canonical_bytes` first, so their encoding is explicit).
        CanonicalError: a ``str`` part holds a lone surrogate (no UTF-8 form).
    """
    h = hashlib.sha256()
    for i, part in enumerate(parts):
        data = _key_part(i, part)
        h.update(b"%d:" % len(data))
        h.update(data)
    return h.hexdigest()


class KeyPrefix:
    """:func:`key_of` with its leading parts hashed once: ``KeyPrefix(*head).key(data)`` is
    ``key_of(*head, data)``, the same digest, without hashing the head again for each key (a
    cache lookup keys every call with the same ``"llm/v1"`` or ``"tool/v1", name`` head).

    Raises:
        TypeError, CanonicalError: a part of the head, as :func:`key_of`.
    """

    __slots__ = ("_state", "head")

    def __init__(self, *head: bytes | str) -> None:
        self.head = head
        state = hashlib.sha256()
        for i, part in enumerate(head):
            data = _key_part(i, part)
            state.update(b"%d:" % len(data))
            state.update(data)
        self._state = state

    def key(self, data: bytes) -> str:
        """``key_of(*head, data)`` for one last part of bytes (64 hex characters)."""
        h = self._state.copy()
        h.update(b"%d:" % len(data))
        h.update(data)
        return h.hexdigest()


def _key_part(i: int, part: bytes | str) -> bytes:
    if isinstance(part, str):
        try:
            return part.encode("utf-8")
        except UnicodeEncodeError:
            raise CanonicalError(
                f"key_of part {i}", "string holds a lone surrogate (no UTF-8 form)"
            ) from None
    if isinstance(part, (bytes, bytearray)):
        return bytes(part)
    raise TypeError(
        f"key_of part {i} is {type(part).__name__}; pass bytes or str "
        "(use canonical_bytes() for structured values)"
    )


# An integer literal of 19 digits or more may lie beyond 64 bits, which orjson reads as a float
# (json reads every integer exactly): such text, and whatever orjson refuses (NaN, 1e400, lone
# surrogates, a byte order mark...), is read by json. Runs of digits are found by mapping every
# digit to "0" and every other byte to " " (bytes.translate: several times faster than a regex).
_DIGIT_MAP = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_DIGITS = b"0" * 19


def loads_exactly(data: bytes) -> bool:
    """Whether :func:`loads` reads ``data`` with orjson (no run of 19 or more digits, and orjson
    takes it), so that ``orjson.loads(data)`` is ``loads(data)``: for a caller that reads the
    same bytes again and again and checks them once."""
    if _orjson is None or type(data) is not bytes or _LONG_DIGITS in data.translate(_DIGIT_MAP):
        return False
    try:
        _orjson.loads(data)
    except _orjson.JSONDecodeError:
        return False
    return True


def loads(data: bytes) -> Any:
    """``json.loads(data)`` for JSON bytes: the same value, read by orjson (several times
    faster) unless the text holds a run of 19 or more digits or orjson refuses it, which json
    then reads. What a cache hit parses its recorded bytes with (the bytes stay as stored).

    Raises:
        ValueError: as ``json.loads`` (not JSON, not UTF-8).
    """
    if (
        _orjson is not None
        and type(data) is bytes
        and _LONG_DIGITS not in data.translate(_DIGIT_MAP)
    ):
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(data)
