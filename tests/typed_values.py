"""Typed state values and the pipelines that carry them, for the type-fidelity tests.

Importable by name (``tests.typed_values``) so that a fork in a fresh process — and the process
that checks the fork's state — rebuild the very same classes. ``CASES`` maps a case name to a
factory of one value; :func:`same` compares two values exactly (types all the way down, dict key
order, a deque's ``maxlen``, a defaultdict's factory, pydantic private attributes).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
from burr.core import State, action, serde
from burr.core.graph import GraphBuilder
from pydantic import BaseModel, PrivateAttr, computed_field

from rewind.replay import Pipeline

# -- classes ------------------------------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = (0, 0, 255)


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mode(enum.StrEnum):
    FAST = "fast"
    SAFE = "safe"


class Perm(enum.Flag):
    R = 4
    W = 2
    X = 1


class Report(BaseModel):
    title: str
    tags: tuple[str, ...] = ()
    level: Level = Level.LOW
    when: dt.datetime | None = None


class Outer:
    """A plain class holding model classes: Burr's own pydantic loader cannot find these."""

    class Inner(BaseModel):
        x: int
        seen: set[str] = set()

    class Box(BaseModel):
        inner: Outer.Inner
        items: list[Outer.Inner] = []


Outer.Box.model_rebuild()


class Scored(BaseModel):
    values: list[float]
    _cache: dict[str, float] = PrivateAttr(default_factory=dict)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> float:
        return sum(self.values)


@dataclasses.dataclass
class Point:
    x: float
    y: float
    label: str = "p"
    moves: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        self.moves = 0  # a fork must not run this again: the recorded `moves` must survive


@dataclasses.dataclass(frozen=True)
class Frozen:
    key: tuple[int, ...]
    when: dt.date


class Money:
    """A class with a user-registered Burr serializer (honoured by Rewind)."""

    def __init__(self, cents: int, currency: str) -> None:
        self.cents, self.currency = cents, currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.cents, self.currency) == (
            other.cents,
            other.currency,
        )

    def __hash__(self) -> int:
        return hash((self.cents, self.currency))


@serde.serialize.register(Money)
def _money_out(value: Money, **kwargs: Any) -> dict[str, Any]:
    return {serde.KEY: "tests.money", "cents": value.cents, "currency": value.currency}


@serde.deserializer.register("tests.money")
def _money_in(value: dict[str, Any], **kwargs: Any) -> Money:
    return Money(value["cents"], value["currency"])


class NoSerializer:
    """A custom class nobody registered a serializer for: refused at record time."""

    def __init__(self, n: int) -> None:
        self.n = n


# -- cases --------------------------------------------------------------------------------------


def _point() -> Point:
    p = Point(1.5, -2.0, "origin")
    p.moves = 7
    return p


def _scored() -> Scored:
    s = Scored(values=[1.0, 2.5])
    s._cache["mean"] = 1.75
    return s


def _defaultdict() -> defaultdict[str, list[int]]:
    d: defaultdict[str, list[int]] = defaultdict(list)
    d["z"].append(1)
    d["a"].append(2)
    return d


CASES: dict[str, Callable[[], Any]] = {
    "pydantic_model": lambda: Report(
        title="t", tags=("a", "b"), level=Level.HIGH, when=dt.datetime(2024, 5, 1, 12)
    ),
    "pydantic_nested_class": lambda: Outer.Box(
        inner=Outer.Inner(x=1, seen={"a", "b"}), items=[Outer.Inner(x=2)]
    ),
    "pydantic_private_computed": _scored,
    "dataclass_init_false": _point,
    "dataclass_frozen": lambda: Frozen((1, 2), dt.date(2020, 2, 29)),
    "enum": lambda: Color.BLUE,
    "int_enum": lambda: Level.HIGH,
    "str_enum": lambda: Mode.SAFE,
    "flag_enum": lambda: Perm.R | Perm.X,
    "tuple": lambda: (1, "a", (2.5, None)),
    "set": lambda: {3, 1, 2},
    "frozenset": lambda: frozenset({"b", "a"}),
    "datetime_naive": lambda: dt.datetime(2024, 1, 2, 3, 4, 5, 678),
    "datetime_utc": lambda: dt.datetime(2024, 1, 2, 3, 4, tzinfo=dt.UTC),
    "datetime_offset": lambda: dt.datetime(2024, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
    "datetime_zoneinfo": lambda: dt.datetime(
        2024, 11, 3, 1, 30, fold=1, tzinfo=ZoneInfo("America/New_York")
    ),
    "date": lambda: dt.date(1999, 12, 31),
    "time": lambda: dt.time(23, 59, 59, 1),
    "timedelta": lambda: dt.timedelta(days=-1, seconds=5, microseconds=3),
    "decimal": lambda: Decimal("1.10"),
    "uuid": lambda: uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "bytes": lambda: b"\x00\xffraw",
    "bytearray": lambda: bytearray(b"ab"),
    "defaultdict": _defaultdict,
    "counter": lambda: Counter("mississippi"),
    "ordered_dict": lambda: OrderedDict([("z", 1), ("a", 2)]),
    "dict_key_order": lambda: {"zeta": 1, "alpha": {"y": 2, "b": 3}},
    "dict_int_and_tuple_keys": lambda: {2: "two", 1: "one", (1, 2): "pair"},
    "deque_maxlen": lambda: deque([1, 2, 3], maxlen=5),
    "numpy_scalars": lambda: [np.float32(1.25), np.int64(-3), np.bool_(True)],
    "numpy_array": lambda: np.arange(6, dtype=np.float64).reshape(2, 3) / 3,
    "numpy_datetime_array": lambda: np.array(["2024-01-01", "2024-02-29"], dtype="datetime64[D]"),
    "burr_registered": lambda: Money(1999, "EUR"),
    "nested_in_list_and_dict": lambda: [
        {"when": dt.date(2024, 1, 1), "level": Level.LOW, "tags": ("x",)},
        {"ids": {uuid.UUID(int=1)}, "amount": Decimal("-0.00")},
    ],
}


# -- exact comparison ---------------------------------------------------------------------------


def same(a: Any, b: Any, path: str = "$") -> str | None:
    """None when ``a`` and ``b`` are the same value of the same exact type (recursively),
    else a short reason naming the path."""
    if type(a) is not type(b):
        return f"{path}: {type(a).__qualname__} != {type(b).__qualname__}"
    if isinstance(a, np.ndarray):
        ok = a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        return None if ok else f"{path}: arrays differ"
    if isinstance(a, np.generic):
        ok = a.dtype == b.dtype and a.tobytes() == b.tobytes()
        return None if ok else f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{path}: keys {list(a)} != {list(b)}"
        if getattr(a, "default_factory", None) is not getattr(b, "default_factory", None):
            return f"{path}: default_factory differs"
        return _first(same(a[k], b[k], f"{path}[{k!r}]") for k in a)
    if isinstance(a, list | tuple | deque):
        if len(a) != len(b) or getattr(a, "maxlen", None) != getattr(b, "maxlen", None):
            return f"{path}: length or maxlen differs"
        return _first(same(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b, strict=True)))
    if isinstance(a, BaseModel):
        if a.model_fields_set != b.model_fields_set:
            return f"{path}: fields_set differs"
        priv_a, priv_b = a.__pydantic_private__ or {}, b.__pydantic_private__ or {}
        return same(dict(a.__dict__), dict(b.__dict__), path) or same(priv_a, priv_b, path)
    if dataclasses.is_dataclass(a):
        return same(vars(a), vars(b), path)
    if isinstance(a, float | Decimal):
        return None if repr(a) == repr(b) else f"{path}: {a!r} != {b!r}"
    if isinstance(a, dt.datetime | dt.time) and (a.tzinfo != b.tzinfo or a.fold != b.fold):
        return f"{path}: tzinfo/fold differ"
    return None if a == b else f"{path}: {a!r} != {b!r}"


def _first(reasons: Any) -> str | None:
    return next((r for r in reasons if r is not None), None)


# -- pipelines ----------------------------------------------------------------------------------


@action(reads=["cases"], writes=["values"])
def make(state: State) -> State:
    """Writes every case as one state field ``values`` (a dict: values inside a dict)."""
    return state.update(values={name: CASES[name]() for name in state["cases"]})


@action(reads=["values"], writes=["copies", "kinds"])
def keep(state: State) -> State:
    """Re-writes the loaded values: a fork at this node runs it on state loaded from the store."""
    values = state["values"]
    return state.update(
        copies=[values[name] for name in values],
        kinds={name: type(v).__qualname__ for name, v in values.items()},
    )


typed_pipeline = Pipeline(
    "typed",
    GraphBuilder().with_actions(make=make, keep=keep).with_transitions(("make", "keep")).build(),
    entrypoint="make",
    ref="tests.typed_values:typed_pipeline",
)


@action(reads=["given"], writes=["echoed"])
def echo(state: State) -> State:
    """Copies the typed initial state: forking this first node starts from the initial state."""
    return state.update(echoed=state["given"])


echo_pipeline = Pipeline(
    "typed-echo",
    GraphBuilder().with_actions(echo=echo).build(),
    entrypoint="echo",
    ref="tests.typed_values:echo_pipeline",
)


def _bad_value(kind: str) -> Any:
    if kind == "lambda":
        return lambda: 1
    if kind == "file":
        return open(__file__)  # an open file in state is the point of this case
    if kind == "local_class":

        @dataclasses.dataclass
        class Local:
            n: int

        return Local(1)
    return NoSerializer(1)


@action(reads=["bad"], writes=["ok", "holder"])
def refuse(state: State) -> State:
    """Writes an unstorable value (chosen by ``bad``) nested inside a dict and a list."""
    return state.update(ok=1, holder={"items": [0, _bad_value(state["bad"])]})


@action(reads=["holder"], writes=["after"])
def after_refusal(state: State) -> State:
    return state.update(after=True)


refusing_pipeline = Pipeline(
    "refusing",
    GraphBuilder()
    .with_actions(refuse=refuse, after=after_refusal)
    .with_transitions(("refuse", "after"))
    .build(),
    entrypoint="refuse",
    ref="tests.typed_values:refusing_pipeline",
)


def check_final_state(store: str, run_id: str, field: str) -> dict[str, str | None]:
    """In a fresh process: load ``field`` of ``run_id``'s last state and compare every case
    (one entry per case: None when exact, else the reason)."""
    from rewind.replay import Rewind

    rw = Rewind(store)
    try:
        last = rw.store.nodes_of(run_id)[-1]
        loaded = rw.node_state(last)[field]
    finally:
        rw.store.close()
    if isinstance(loaded, list):  # `copies`: in the order of CASES
        loaded = dict(zip(CASES, loaded, strict=False))
    return {name: same(factory(), loaded.get(name, _Missing)) for name, factory in CASES.items()}


class _MissingType:
    pass


_Missing = _MissingType()
