"""Tests for rewind.canonical: canonical JSON bytes, content hashes and cache keys."""

from __future__ import annotations

import ast
import dataclasses
import enum
import hashlib
import json
import math
import os
import random
import struct
import subprocess
import sys
import unicodedata
from collections import OrderedDict
from pathlib import Path

import pytest
import rfc8785
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rewind import canonical
from rewind.canonical import (
    CanonicalError,
    canonical_bytes,
    canonical_json,
    content_hash,
    key_of,
    sha256_hex,
)

SRC_DIR = Path(__file__).resolve().parents[1] / "src"

# --- strategies ---------------------------------------------------------------------------------

finite_floats = st.floats(allow_nan=False, allow_infinity=False)
# Floats spread over every magnitude, so exponent forms (|f| < 1e-6, |f| >= 1e21) and the
# positional ranges on both sides of repr()'s switch points (1e-4, 1e16) are all exercised.
wide_floats = st.one_of(
    finite_floats,
    st.builds(
        lambda m, e: m * 10.0**e,
        st.floats(min_value=-10, max_value=10, allow_nan=False),
        st.integers(-30, 30),
    ).filter(math.isfinite),
)
keys = st.text(max_size=8)  # includes non-ASCII and astral characters, never lone surrogates
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**80), 2**80), wide_floats, st.text()
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=6), st.dictionaries(keys, children, max_size=6)
    ),
    max_leaves=40,
)
# Values rfc8785 accepts and encodes exactly like Rewind: no floats, ints within 2**53.
jcs_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**53) + 1, 2**53 - 1), st.text(max_size=10)),
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(keys, children, max_size=5)
    ),
    max_leaves=30,
)


def _run_python(code: str, *args: str, hashseed: str | None = None) -> str:
    """Run ``code`` in a fresh interpreter with src/ on the path; return its stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC_DIR)
    if hashseed is not None:
        env["PYTHONHASHSEED"] = hashseed
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return result.stdout


# --- properties ---------------------------------------------------------------------------------


@given(json_values)
def test_hash_survives_json_round_trip(value: object) -> None:
    assert content_hash(value) == content_hash(json.loads(canonical_json(value)))


@given(json_values)
def test_canonical_bytes_parse_back_to_equal_value(value: object) -> None:
    assert json.loads(canonical_bytes(value)) == value


@given(st.dictionaries(keys, json_values, min_size=2, max_size=8), st.randoms())
def test_key_order_does_not_matter(mapping: dict[str, object], rnd: random.Random) -> None:
    items = list(mapping.items())
    rnd.shuffle(items)
    shuffled = dict(items)
    assert content_hash(shuffled) == content_hash(mapping)
    assert canonical_bytes(shuffled) == canonical_bytes(mapping)


@given(st.lists(json_values, min_size=2, max_size=6), st.data())
def test_list_order_matters(items: list[object], data: st.DataObject) -> None:
    permuted = data.draw(st.permutations(items))
    assume([canonical_json(x) for x in permuted] != [canonical_json(x) for x in items])
    assert content_hash(permuted) != content_hash(items)


@given(json_values)
def test_fast_path_matches_reference_encoder(value: object) -> None:
    # canonical_json may go through the C json encoder; the pure-Python encoder is the reference.
    assert canonical_json(value) == canonical._python_json(value)


@given(st.lists(st.dictionaries(keys, scalars, max_size=5), max_size=5))
def test_fast_path_matches_reference_on_flat_tables(rows: list[dict[str, object]]) -> None:
    assert canonical_json(rows) == canonical._python_json(rows)


def test_fast_path_is_taken_for_plain_values() -> None:
    value = {"rows": [{"a": 1, "b": 2.5, "c": "x", "d": None, "e": True}], "q": "é"}
    assert canonical._plain_json(value, 0)
    assert canonical._c_json(value) == canonical._python_json(value)
    assert not canonical._plain_json({"\U0001f600": 1}, 0)  # astral key: UTF-16 order needed
    assert not canonical._plain_json({1: 1}, 0)
    assert canonical._plain_json([0.0, -0.0, 1e-4, -9999999999999998.0], 0)
    assert not canonical._plain_json({"a": [0.5, 1e-5]}, 0)  # exponent float: reference encoder
    assert not canonical._plain_json({"a": {"b": 1e16}}, 0)
    assert not canonical._plain_json([math.nan], 0)


@given(wide_floats)
def test_fast_path_float_range_is_exactly_where_repr_is_positional(f: float) -> None:
    # The fast path relies on this: repr() writes no exponent iff f == 0 or 1e-4 <= |f| < 1e16.
    assert ("e" not in repr(f)) == (f == 0.0 or 1e-4 <= abs(f) < 1e16)


@given(jcs_values)
def test_matches_rfc8785_without_floats(value: object) -> None:
    # Strings, key order (UTF-16 code units, astral keys included), literals and ints are pure JCS.
    assert canonical_bytes(value) == rfc8785.dumps(value)


def _rewind_float(jcs: str, f: float) -> str:
    if f == 0:
        return "-0.0" if math.copysign(1.0, f) < 0 else "0.0"
    return jcs if ("." in jcs or "e" in jcs) else jcs + ".0"


@given(wide_floats)
def test_floats_are_jcs_plus_point_zero(f: float) -> None:
    assert canonical_json(f) == _rewind_float(rfc8785.dumps(f).decode(), f)
    assert float(canonical_json(f)) == f


# --- numbers ------------------------------------------------------------------------------------


def test_jcs_number_vector_from_the_issue() -> None:
    value = [1e30, 4.50, 6, 2e-3, 0.000000000000000000000000001]
    assert canonical_bytes(value) == b"[1e+30,4.5,6,0.002,1e-27]"


# RFC 8785 Appendix B: IEEE 754 bit patterns and their JCS text (Rewind adds ".0" when the text
# has neither "." nor "e", and keeps the sign of zero).
RFC8785_APPENDIX_B = [
    ("0000000000000000", "0.0"),
    ("8000000000000000", "-0.0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992.0"),
    ("c340000000000000", "-9007199254740992.0"),
    ("4430000000000000", "295147905179352830000.0"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000.0"),
    ("444b1ae4d6e2ef4f", "999999999999999900000.0"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


@pytest.mark.parametrize(("bits", "expected"), RFC8785_APPENDIX_B)
def test_rfc8785_appendix_b_floats(bits: str, expected: str) -> None:
    f = struct.unpack(">d", bytes.fromhex(bits))[0]
    assert canonical_json(f) == expected
    assert canonical_json([f]) == f"[{expected}]"  # the array fast path agrees


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, "1.0"),
        (-1.0, "-1.0"),
        (0.0001, "0.0001"),
        (1e-5, "0.00001"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (1e16, "10000000000000000.0"),
        (1.5e20, "150000000000000000000.0"),
        (1e21, "1e+21"),
        (-2.5e-8, "-2.5e-8"),
    ],
)
def test_float_formatting(value: float, expected: str) -> None:
    assert canonical_json(value) == expected
    assert canonical_json({"v": value}) == '{"v":' + expected + "}"


@pytest.mark.parametrize(
    "f",
    [
        math.nextafter(1e-4, 0.0),
        1e-4,
        math.nextafter(1e-6, 0.0),
        1e-6,
        math.nextafter(1e16, 0.0),
        1e16,
        math.nextafter(1e21, 0.0),
        1e21,
    ],
)
def test_float_notation_switch_points(f: float) -> None:
    # repr() and ECMAScript switch between positional and exponent notation at different
    # magnitudes; both sides of every switch point must give JCS text (plus Rewind's ".0").
    for value in (f, -f):
        expected = _rewind_float(rfc8785.dumps(value).decode(), value)
        assert canonical_json(value) == expected
        assert canonical_json({"k": [value]}) == '{"k":[' + expected + "]}"


def test_int_and_float_differ() -> None:
    assert canonical_json(1) == "1"
    assert canonical_json(1.0) == "1.0"
    assert content_hash(1) != content_hash(1.0)
    assert content_hash({"a": [1]}) != content_hash({"a": [1.0]})


def test_zero_and_negative_zero_differ() -> None:
    assert canonical_json(0.0) == "0.0"
    assert canonical_json(-0.0) == "-0.0"
    assert content_hash(0.0) != content_hash(-0.0)
    assert content_hash([0.0]) != content_hash([-0.0])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_refused(bad: float) -> None:
    with pytest.raises(CanonicalError, match=r"^\$: float"):
        content_hash(bad)
    with pytest.raises(CanonicalError, match=r"^\$\.a\[1\]: float .*(nan|inf)"):
        content_hash({"a": [1.0, bad]})
    with pytest.raises(CanonicalError, match=r"^\$\.x: float"):
        content_hash({"x": bad})


def test_big_ints_are_exact() -> None:
    assert canonical_json(2**80) == "1208925819614629174706176"
    assert canonical_json(-(2**80)) == "-1208925819614629174706176"
    assert content_hash(2**80) != content_hash(float(2**80))
    assert content_hash(2**80) != content_hash(2**80 + 1)  # float64 would merge these
    assert canonical_json(float(2**80)) == "1.2089258196146292e+24"


def test_ints_beyond_the_str_digit_limit_are_exact() -> None:
    big = 10**5000 + 12345
    text = canonical_json(big)
    assert len(text) == 5001
    assert text == "1" + "0" * 4995 + "12345"
    assert canonical_json([-big]) == "[-" + text + "]"
    assert canonical_json(10**8001 + 7) == "1" + "0" * 8000 + "7"
    near_limit = 10**4100 + 1  # below sys.int_max_str_digits: the C fast path writes it
    assert canonical_json({"n": [near_limit]}) == canonical._python_json({"n": [near_limit]})


def test_bool_is_not_int() -> None:
    assert canonical_json([True, False, None]) == "[true,false,null]"
    assert content_hash(True) != content_hash(1)
    assert content_hash(False) != content_hash(0)


# --- strings ------------------------------------------------------------------------------------


def test_no_unicode_normalization() -> None:
    nfc = unicodedata.normalize("NFC", "café")
    nfd = unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    assert content_hash(nfc) != content_hash(nfd)
    assert content_hash({nfc: 1}) != content_hash({nfd: 1})


def test_hash_does_not_depend_on_ascii_escaping() -> None:
    value = {"name": "café", "emoji": "\U0001f600", "list": ["naïve", "Ωmega"]}
    assert "é".encode() in canonical_bytes(value)
    assert b"\\u" not in canonical_bytes(value)
    escaped_copy = json.loads(json.dumps(value, ensure_ascii=True))
    assert content_hash(escaped_copy) == content_hash(value)


def _jcs_escape(ch: str) -> str:
    short = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r"}
    short["\t"] = "\\t"
    if ch in short:
        return short[ch]
    if ord(ch) < 0x20:
        return f"\\u{ord(ch):04x}"
    return ch


def test_string_escaping_is_minimal_jcs_for_every_bmp_character_and_some_astral() -> None:
    codepoints = [c for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF]
    codepoints += [0x10000, 0x1F600, 0x10FFFF]
    for c in codepoints:
        ch = chr(c)
        expected = '"' + _jcs_escape(ch) + '"'
        assert canonical_json(ch) == expected, hex(c)
        assert json.dumps(ch, ensure_ascii=False) == expected, hex(c)  # the claim we rely on


@given(st.text())
def test_strings_match_rfc8785(text: str) -> None:
    assert canonical_bytes(text) == rfc8785.dumps(text)
    assert canonical_bytes({text: text}) == rfc8785.dumps({text: text})


def test_keys_sort_by_utf16_code_units() -> None:
    # U+1F600 is D83D DE00 in UTF-16 and sorts before U+FF61; by code point it would sort after.
    value = {"\uff61": 1, "\U0001f600": 2, "a": 3, "é": 4, "": 5}
    assert canonical_json(value) == '{"":5,"a":3,"é":4,"\U0001f600":2,"\uff61":1}'
    assert canonical_bytes(value) == rfc8785.dumps(value)


def test_lone_surrogate_is_refused_with_path() -> None:
    with pytest.raises(CanonicalError, match=r"^\$\.msgs\[1\]: string holds a lone surrogate"):
        canonical_bytes({"msgs": ["ok", "bad\ud800"]})
    with pytest.raises(CanonicalError, match="lone surrogate"):
        content_hash({"\udc00": 1})


# --- keys ---------------------------------------------------------------------------------------


def test_int_keys_sort_as_strings_like_a_json_round_trip() -> None:
    value = {2: 2, 10: 10}
    assert canonical_json(value) == '{"10":10,"2":2}'
    assert content_hash(value) == content_hash(json.loads(json.dumps(value)))


def test_mixed_int_and_str_keys_are_fine() -> None:
    assert canonical_json({1: "x", "a": "y"}) == '{"1":"x","a":"y"}'
    assert content_hash({1: "x", "a": "y"}) == content_hash({"1": "x", "a": "y"})


def test_colliding_keys_are_refused_naming_both() -> None:
    with pytest.raises(CanonicalError) as info:
        canonical_json({1: "p", "1": "q"})
    message = str(info.value)
    assert message.startswith("$: ")
    assert "1 and '1'" in message
    with pytest.raises(CanonicalError, match=r"^\$\.inner: object keys"):
        canonical_json({"inner": {"7": 0, 7: 1}})


@pytest.mark.parametrize("key", [True, False, 1.5, (1, 2), None, b"k"])
def test_other_key_types_are_refused(key: object) -> None:
    with pytest.raises(CanonicalError, match=r"^\$\.outer\[0\]: object key .* is not allowed"):
        canonical_json({"outer": [{key: 1}]})


# --- containers and Python types ------------------------------------------------------------------


def test_tuple_is_an_array() -> None:
    assert canonical_json((1, "a", (2,))) == '[1,"a",[2]]'
    assert content_hash((1, 2)) == content_hash([1, 2])


def test_sets_are_sorted_by_canonical_bytes() -> None:
    assert canonical_json({"b", "a", "c"}) == '["a","b","c"]'
    assert canonical_json(frozenset({10, 2, 1})) == "[1,10,2]"  # bytes order, not numeric
    assert canonical_json({("x", 1), ("a", 2)}) == '[["a",2],["x",1]]'
    assert canonical_json(set()) == "[]"
    assert content_hash({"é", "e", "z"}) == content_hash(["e", "z", "é"])


def test_set_of_strings_hashes_identically_under_any_hash_seed() -> None:
    strings = [f"item-{i:02d}-{'é' * (i % 3)}" for i in range(50)]
    code = (
        "import json, sys\n"
        "from rewind.canonical import content_hash\n"
        "s = set(json.loads(sys.argv[1]))\n"
        "print(json.dumps({'digest': content_hash(s), 'order': list(s)}))\n"
    )
    out1 = json.loads(_run_python(code, json.dumps(strings), hashseed="1"))
    out2 = json.loads(_run_python(code, json.dumps(strings), hashseed="2"))
    assert out1["order"] != out2["order"]  # the seeds really do change set iteration order
    assert out1["digest"] == out2["digest"] == content_hash(set(strings))
    assert out1["digest"] == content_hash(sorted(strings))


@dataclasses.dataclass
class Point:
    x: int
    y: float
    label: str = "p"


@dataclasses.dataclass(frozen=True)
class Wrapper:
    points: tuple[Point, ...]
    meta: dict[str, object]


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


class Level(enum.IntEnum):
    LOW = 1


class Mode(str, enum.Enum):  # noqa: UP042 (the str mixin, not StrEnum, is under test)
    FAST = "fast"


class Size(enum.StrEnum):
    BIG = "big"


def test_dataclasses_become_objects_of_their_fields() -> None:
    assert canonical_json(Point(1, 2.0)) == '{"label":"p","x":1,"y":2.0}'
    nested = Wrapper(points=(Point(1, 0.5),), meta={"k": Point(2, 1.0, "q")})
    expected = {
        "points": [{"x": 1, "y": 0.5, "label": "p"}],
        "meta": {"k": {"x": 2, "y": 1.0, "label": "q"}},
    }
    assert content_hash(nested) == content_hash(expected)


def test_dataclass_class_itself_is_refused() -> None:
    with pytest.raises(CanonicalError, match="type"):
        canonical_json(Point)


def test_enums_become_their_values() -> None:
    assert canonical_json([Color.RED, Color.BLUE]) == '["red",2]'
    assert canonical_json(Level.LOW) == "1"
    assert canonical_json({"m": Mode.FAST}) == '{"m":"fast"}'
    assert content_hash({"level": Level.LOW}) == content_hash({"level": 1})
    assert content_hash({Mode.FAST: 1}) == content_hash({"fast": 1})
    assert canonical_json({Size.BIG: [Size.BIG]}) == '{"big":["big"]}'


def test_pydantic_models_use_model_dump() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Item(pydantic.BaseModel):
        name: str
        qty: int
        tags: list[str] = pydantic.Field(default_factory=list)

    class Order(pydantic.BaseModel):
        items: list[Item]
        note: str | None = None

    order = Order(items=[Item(name="a", qty=2)])
    expected = {"items": [{"name": "a", "qty": 2, "tags": []}], "note": None}
    assert content_hash(order) == content_hash(expected)
    assert content_hash({"order": order}) == content_hash({"order": expected})


def test_builtin_subclasses_are_encoded_as_their_base_type() -> None:
    class MyStr(str):
        def __str__(self) -> str:
            return "spoofed"

    class MyInt(int):
        def __repr__(self) -> str:
            return "spoofed"

    class MyFloat(float):
        def __repr__(self) -> str:
            return "spoofed"

    value = {"s": MyStr("x"), "i": MyInt(5), "f": MyFloat(1.5), "o": OrderedDict(b=1, a=2)}
    assert canonical_json(value) == '{"f":1.5,"i":5,"o":{"a":2,"b":1},"s":"x"}'
    assert canonical_json({MyStr("k"): 1, MyInt(3): 2}) == '{"3":2,"k":1}'


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "path", "type_name", "hint"),
    [
        ({"a": [1, 2, 3, {"b": b"raw"}]}, "$.a[3].b", "bytes", "decode"),
        ({"a": bytearray(b"x")}, "$.a", "bytearray", "decode"),
        ([Opaque()], "$[0]", "Opaque", "convert"),
        ({"when": __import__("datetime").date(2024, 1, 2)}, "$.when", "datetime.date", "iso"),
        ({"d": __import__("decimal").Decimal("1.5")}, "$.d", "decimal.Decimal", "str"),
        ({"with space": {"x": object()}}, '$["with space"].x', "object", "convert"),
        ({"s": {1, Opaque()}}, "$.s[?]", "Opaque", "convert"),
        (Point(1, Opaque()), "$.y", "Opaque", "convert"),  # type: ignore[arg-type]
    ],
)
def test_unsupported_types_are_refused_with_path_type_and_hint(
    value: object, path: str, type_name: str, hint: str
) -> None:
    with pytest.raises(CanonicalError) as info:
        canonical_bytes(value)
    err = info.value
    assert err.path == path
    assert str(err).startswith(path + ": type ")
    assert type_name in str(err)
    assert hint in str(err).lower()


def test_numpy_scalars_are_refused_with_a_hint() -> None:
    np = pytest.importorskip("numpy")
    with pytest.raises(CanonicalError, match=r"^\$\.n: type numpy\.int64 .*\.item\(\)"):
        canonical_json({"n": np.int64(3)})


def test_cycles_and_deep_nesting_are_refused() -> None:
    cyclic: list[object] = []
    cyclic.append(cyclic)
    with pytest.raises(CanonicalError, match="deeper than"):
        canonical_json(cyclic)
    deep: object = "leaf"
    for _ in range(canonical.MAX_DEPTH + 5):
        deep = {"k": deep}
    with pytest.raises(CanonicalError, match="deeper than"):
        canonical_json(deep)
    fine: object = "leaf"
    for _ in range(100):
        fine = [fine]
    assert canonical_json(fine) == "[" * 100 + '"leaf"' + "]" * 100


def test_canonical_error_is_a_value_error() -> None:
    assert issubclass(CanonicalError, ValueError)


def test_canonical_json_and_bytes_agree() -> None:
    value = {"z": [1, 2.5, "é"], "a": None}
    assert canonical_json(value) == '{"a":null,"z":[1,2.5,"é"]}'
    assert canonical_bytes(value) == canonical_json(value).encode("utf-8")
    assert content_hash(value) == sha256_hex(canonical_bytes(value))


# --- golden digests -------------------------------------------------------------------------------

GOLDEN_SOURCE = r"""[
    {"b": 1, "a": [1, 2.5, None, True, False], "c": {"é": "café"}},
    [1e30, 4.50, 6, 2e-3, 0.000000000000000000000000001],
    {2: 2, 10: 10},
    -0.0,
    1208925819614629174706176,
    "cafe\u0301",
    {"tags": {"zeta", "alpha", "mu"}, "n": {3, 1, 2}},
    ("tuple", 1.0, "\U0001f600", "\n\t\"\\\u001f", {"": [], "k": {}}),
]"""

GOLDEN = [
    (
        '{"a":[1,2.5,null,true,false],"b":1,"c":{"é":"café"}}',
        "e98206dc3c4a89432eca67e6ee38c9be802e297339f97fc85cda89592b76919d",
    ),
    (
        "[1e+30,4.5,6,0.002,1e-27]",
        "d81991026f1d8b138c13e492691ec526c4d61b418b29171f576b75973a3ee31c",
    ),
    (
        '{"10":10,"2":2}',
        "5355e5c9c48ddb40379a8a11e74e08cf4c2a364f10bf4b2324e32d5d20489385",
    ),
    (
        "-0.0",
        "c26617c7ccbcaa6631b45d851b8cf56e21d2ca624bdb1193afdbd4b560702cec",
    ),
    (
        "1208925819614629174706176",
        "f357dd857f636a730632409c3f9e7e4704762b2ef6ce89393d141b6589013f70",
    ),
    (
        '"cafe\u0301"',
        "c7d7e72b8ad0dd91beb4044a4bb17c6c8a9672cc620c4c76e6584f3525d400d1",
    ),
    (
        '{"n":[1,2,3],"tags":["alpha","mu","zeta"]}',
        "010ae24016ae63aeabd9632e7ba35d61b6e68928878dfbb90640a8ef44742fd8",
    ),
    (
        '["tuple",1.0,"\U0001f600","\\n\\t\\"\\\\\\u001f",{"":[],"k":{}}]',
        "e8f249e8a25703d711653f415201288fada61c55656f539ca3f05568fbb023eb",
    ),
]


def test_golden_digests_in_process() -> None:
    values = ast.literal_eval(GOLDEN_SOURCE)
    assert len(values) == len(GOLDEN)
    for value, (text, digest) in zip(values, GOLDEN, strict=True):
        assert canonical_json(value) == text
        assert hashlib.sha256(text.encode("utf-8")).hexdigest() == digest
        assert content_hash(value) == digest


def test_golden_digests_in_fresh_processes() -> None:
    code = (
        "import ast, json, sys\n"
        "from rewind.canonical import content_hash\n"
        "print(json.dumps([content_hash(v) for v in ast.literal_eval(sys.argv[1])]))\n"
    )
    expected = [digest for _, digest in GOLDEN]
    for seed in ("0", "1", "random"):
        assert json.loads(_run_python(code, GOLDEN_SOURCE, hashseed=seed)) == expected


# --- sha256_hex and key_of ------------------------------------------------------------------------


def test_sha256_hex() -> None:
    digest = sha256_hex(b"abc")
    assert digest == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert len(sha256_hex(b"")) == 64


def test_key_of_is_length_prefixed() -> None:
    assert key_of("ab", "c") != key_of("a", "bc")
    assert key_of("ab", "c") == sha256_hex(b"2:ab1:c")
    assert key_of("a", "bc") == sha256_hex(b"1:a2:bc")
    assert key_of("", "x") != key_of("x", "")
    assert key_of("x") != key_of("x", "")
    assert key_of() == sha256_hex(b"")


def test_key_of_str_and_bytes_parts_are_equal() -> None:
    assert key_of("café", b"tool") == key_of("café".encode(), "tool")
    assert key_of("é") == sha256_hex(b"2:\xc3\xa9")  # length counts UTF-8 bytes, not characters
    assert key_of(bytearray(b"ab")) == key_of(b"ab")


def test_key_of_refuses_other_part_types() -> None:
    with pytest.raises(TypeError, match="part 1"):
        key_of("a", 3)  # type: ignore[arg-type]
    with pytest.raises(CanonicalError, match="part 0"):
        key_of("\ud800")


@settings(max_examples=50)
@given(st.lists(st.one_of(st.text(), st.binary()), max_size=4))
def test_key_of_matches_its_definition(parts: list[str | bytes]) -> None:
    blob = b"".join(
        b"%d:%s" % (len(p), p) for p in (x.encode() if isinstance(x, str) else x for x in parts)
    )
    assert key_of(*parts) == hashlib.sha256(blob).hexdigest()


# --- pinned digests: a faster encoder must never change a hash ------------------------------------


def _pinned_table() -> list[dict[str, object]]:
    """A deterministic table of 400 records with every JSON type, non-ASCII text and floats."""
    rows: list[dict[str, object]] = []
    for i in range(400):
        rows.append(
            {
                "id": i,
                "name": f"row {i} café 東京 «{i % 7}»",
                "score": (i * 37 % 1000) / 7.0 - 50.0,
                "ok": i % 3 == 0,
                "none": None,
                "big": 3**i if i % 50 == 0 else i,
                "tags": ["a", "b\n", "\t", "\u2028"][: i % 5],
                "nested": {"x": i / 3, "y": [i, -i, 0.5], "z": {"deep": str(i)}},
            }
        )
    return rows


PINNED_DIGESTS = {
    "plain": "5e002b0e99fda3b5648f8e100e83fdab598695122cd6b4a59571e7c31168afcb",
    "chat": "92f9c8ce772d6faaf855010693ac1fd20e596b3daff4f8e2228dcfc258dc659e",
    "floats": "1c5f136b4c34eb3b7aefd45f06ff51a5ad1be426ea18406934b7073cab023fb3",
    "table": "2676d662c862afe537f5a0a4d7a2781417a45844a5738d7c5eb4d45951e8d0c5",
}


def _pinned_values() -> dict[str, object]:
    return {
        "plain": {
            "b": [1, 2.5, "x", None, True, False],
            "a": {"é": "café", "k": -0.0, "n": 10**30},
            "z": "line\nbreak\t\u2028",
        },
        "chat": {
            "messages": [
                {"content": "You are a terse arithmetic agent.", "role": "system"},
                {"content": "step 0: previous tool result 0", "role": "user"},
            ],
            "model": "stub-model",
            "temperature": 0,
            "max_tokens": 64,
        },
        "floats": [
            0.0,
            1.0,
            1e-4,
            0.1,
            123456789.123,
            9999999999999998.0,
            1e16,
            1e-7,
            5e-324,
            -1.5e300,
        ],
        "table": _pinned_table(),
    }


@pytest.mark.parametrize("name", sorted(PINNED_DIGESTS))
def test_known_values_keep_their_pinned_digest(name: str) -> None:
    # Digests recorded before the encoder was made faster: every stored hash depends on them.
    assert content_hash(_pinned_values()[name]) == PINNED_DIGESTS[name]


@given(json_values)
def test_canonical_bytes_equal_the_reference_encoders_utf8(value: object) -> None:
    # canonical_bytes has a fast path of its own (orjson when installed).
    try:
        expected = canonical._python_json(value).encode("utf-8")
    except UnicodeEncodeError:
        return
    assert canonical_bytes(value) == expected
