"""Attacks on the fixes merged in session 33 (issue #13): the digest of a value cut below the
hasher's depth (714d9e3), the source a cached replay of a failed chain links to (64af813,
ca8e936), the TTL of entries dated after the run's clock (989c9ce), and the rest.

Each test names what it found (a regression test that failed before its fix) or what held.
"""

from __future__ import annotations

from typing import Any

import pytest

from rewind.tracing import model
from rewind.tracing.model import jsonable


def _below_the_cut(value: Any) -> Any:
    """``value`` 70 levels down a list the canonical hasher refuses at once (an object first at
    every level), so :func:`jsonable` copies 64 levels and digests the rest (``_cut_digest``)."""
    for _ in range(70):
        value = [object(), value]
    return value


def _digest_of(value: Any) -> str:
    """The ``sha256`` of the cut in ``jsonable(_below_the_cut(value))``."""
    form = jsonable(_below_the_cut(value))
    while isinstance(form, list):
        form = form[1]
    return form["sha256"]


def test_a_shared_value_below_the_cut_is_digested_once_not_once_per_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """714d9e3's walk digested a shared sub-object once per path to it: a step output of a few
    dozen lists (each level a list holding the level below twice) below the cut took 2^k
    visits (k=18: ~1 s, k=30: hours; the cut before it was instant). A container walked
    before, holding no back reference above itself, is now digested once; the digest is the
    same as the tree walk gave, so stored hashes do not change."""
    shared: Any = [1]
    for _ in range(12):
        shared = [shared, shared]
    visits = 0
    real = model._cut_parts

    def counting(value: Any) -> Any:
        nonlocal visits
        visits += 1
        return real(value)

    monkeypatch.setattr(model, "_cut_parts", counting)
    digest = _digest_of(shared)
    assert visits < 200  # 4,096 paths to the leaf before
    unshared: Any = [1]
    for _ in range(12):
        unshared = [unshared, copy_of(unshared)]
    assert _digest_of(unshared) == digest


def copy_of(value: Any) -> Any:
    """A deep copy of nested lists, sharing nothing."""
    return [copy_of(v) for v in value] if isinstance(value, list) else value


def test_a_numpy_array_of_objects_inside_another_below_the_cut_keeps_its_content() -> None:
    """714d9e3's walk named a container on its path by ``id``; the form of a numpy array of
    objects (``tolist()``) is a new list no one held once walked into, so the form of an
    array inside it could be given the same address and was taken for a back reference
    ("cycle"): two outputs differing inside the inner array had one digest, a replay whose
    deeply nested output changed was stored as unchanged. Every container walked is now kept
    alive until the walk ends."""
    np = pytest.importorskip("numpy")

    def outer(v: int) -> Any:
        inner = np.empty(2, dtype=object)
        inner[0], inner[1] = v, "x"
        value = np.empty(2, dtype=object)
        value[0], value[1] = inner, "y"
        return value

    assert _digest_of(outer(1)) != _digest_of(outer(2))
    assert _digest_of(outer(1)) == _digest_of(outer(1))
