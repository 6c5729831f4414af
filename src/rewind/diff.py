"""Trajectory diff: align two runs node by node and compare their outputs field by field.

The module is pure: it never touches the store. Callers hand it one `NodeSide` per node execution
of each run and get back an immutable `TrajectoryDiff`.

Equality follows the canonical hasher, not Python's `==`: `1` and `1.0` differ (type changed),
`True` and `1` differ, `0.0` and `-0.0` differ, and NaN equals NaN. A hand-written walk is used
instead of deepdiff because deepdiff skips `__`-prefixed keys and buckets `1 == 1.0` by default,
which would hide exactly the differences a replay audit must show.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rewind.canonical import canonical_json
from rewind.serde import UnstorableValue, display, encode

__all__ = [
    "FieldChange",
    "NodeDiff",
    "NodeSide",
    "TrajectoryDiff",
    "align_nodes",
    "diff_trajectories",
    "diff_values",
    "similarity",
]

CHANGED = "changed"
ADDED = "added"
REMOVED = "removed"
TYPE_CHANGED = "type_changed"
REORDERED = "reordered"

EQUAL = "equal"
ONLY_A = "only_a"
ONLY_B = "only_b"
_STATUSES = (EQUAL, CHANGED, ONLY_A, ONLY_B)

ERROR_FIELD = "$error"
"""The field under which a failed node's error (``Type: message``) is compared: a failed node
wrote no output, so without it two nodes failing with other errors (or one failing, one
writing nothing) read as equal."""

LONG_TEXT_CHARS = 120
"""Strings longer than this (or spanning several lines) get a unified `text_diff`."""

_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


# --------------------------------------------------------------------------------------------
# Records


@dataclass(frozen=True)
class NodeSide:
    """One node execution of one run, as the diff sees it.

    Attributes:
        position: 0-based order of the node in its run.
        name: node (Burr action) name.
        output: the fields the node wrote (JSON-like values).
        output_hash: SHA-256 hex of the output, as recorded; never recomputed here.
        tokens: tokens spent by this node in this run (0 for a cache hit).
        outcome: cache outcome label, passed through untouched (e.g. "hit", "miss:override").
        code: fingerprint (SHA-256 hex) of the code that produced the node, from the graph its
            producing run recorded (`rewind.drift`); `""` when unknown (a run recorded before
            graphs were, or a traced chain).
        helpers: fingerprints of the helpers the node's code calls (``{"pkg.mod.fn": sha256}``,
            `rewind.drift.helper_fingerprints`), from the same graph; None when unknown.
    """

    position: int
    name: str
    output: dict[str, Any]
    output_hash: str
    tokens: int
    outcome: str = ""
    code: str = ""
    helpers: Mapping[str, str] | None = None
    failed: bool = False
    """The node failed: its error is under :data:`ERROR_FIELD` in ``output``. Compared as well,
    so a node that failed never diffs equal to one that wrote a field of that name."""


@dataclass(frozen=True)
class FieldChange:
    """One difference between two values at one path.

    Attributes:
        path: where the difference is, e.g. `analysis.table[3].mean`. Identifier keys are joined
            with dots, other string keys as `['weird key']` (backslash and quote escaped), list
            indexes and non-string keys as `[3]`. `""` is the whole compared value.
        kind: `"changed"` (same type, different value), `"added"` (only in B), `"removed"`
            (only in A), `"type_changed"` (exact types differ: int vs float, bool vs int, a
            tuple vs a list, an `IntEnum` vs its int...) or `"reordered"` (a dict with the same
            keys and values in another order: `old`/`new` are the two key lists; a list with
            the same items in another order: `old` is `[0, 1, …]` and `new` gives, for each
            index in B, the index in A of the item now there).
        old: value in A; `None` when `kind == "added"` (read `kind`, not `old`, to tell an
            added field from a field whose old value was null).
        new: value in B; `None` when `kind == "removed"`.
        text_diff: unified diff (labels `a/<path>`, `b/<path>`, lines without terminators,
            joined by newlines) when both values are strings and either is longer than 120
            characters or contains a newline; otherwise `None`.
        old_path: where the old value sits in A when that differs from `path` (a list item
            compared in place after an insertion or removal before it moved: `table[4].mean` in
            B was `table[3].mean` in A); `None` when `path` addresses both sides. A `removed`
            change's `path` is always A's, an `added` one's always B's.
    """

    path: str
    kind: str
    old: Any
    new: Any
    text_diff: str | None = None
    old_path: str | None = None


@dataclass(frozen=True)
class NodeDiff:
    """One row of the aligned table: a node of A, of B, or of both.

    Attributes:
        index: 0-based row in the aligned table.
        name: node name (the same on both sides when both are present).
        a: the node in run A, or `None` if only B executed it.
        b: the node in run B, or `None` if only A executed it.
        status: `"equal"` (both present, no field change), `"changed"`, `"only_a"`, `"only_b"`.
            Decided by the field diff, never by the hashes alone.
        changes: field changes from A's output to B's; empty unless status is `"changed"`.
        token_delta: `b.tokens - a.tokens` in tokens, a missing side counting 0.
        hash_equal: both sides present and their recorded output hashes are equal.
        code_changed: both sides present, both code fingerprints known, and they differ (or
            a helper the node calls differs): the node ran other code in B than in A, so a
            difference here may come from the code rather than from the fork's override.
        helpers_changed: the helpers (``pkg.module.fn``) whose code differs between the sides,
            when both sides know their helpers.
    """

    index: int
    name: str
    a: NodeSide | None
    b: NodeSide | None
    status: str
    changes: tuple[FieldChange, ...]
    token_delta: int
    hash_equal: bool
    code_changed: bool = False
    helpers_changed: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrajectoryDiff:
    """Field-level comparison of two runs.

    Attributes:
        run_a: run id of the reference run.
        run_b: run id of the compared run (typically the fork).
        nodes: the aligned rows, in display order.
        first_divergence: the first row whose status is not `"equal"`, or `None`.
        tokens_a: total tokens of run A's nodes.
        tokens_b: total tokens of run B's nodes.
        token_delta: `tokens_b - tokens_a`.
    """

    run_a: str
    run_b: str
    nodes: tuple[NodeDiff, ...]
    first_divergence: NodeDiff | None
    tokens_a: int
    tokens_b: int
    token_delta: int

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-safe, deterministic dict for `--json` output.

        Shape: `{"run_a", "run_b", "tokens_a", "tokens_b", "token_delta",
        "first_divergence": <row index> | None, "counts": {status: n}, "code_changed":
        [node name...], "nodes": [row...]}`; a row is `{"index", "name", "status",
        "token_delta", "hash_equal", "code_changed", "helpers_changed", "a", "b", "changes"}`
        with `a`/`b` either `None` or `{"position", "name", "output_hash", "tokens", "outcome",
        "code", "output"}` and each change `{"path", "kind", "old", "new", "text_diff",
        "old_path"}`.

        Values are made JSON-safe: NaN/inf become the strings `"NaN"`, `"Infinity"`,
        `"-Infinity"`; tuples become lists; dict keys become strings (non-string keys via
        `str()`) and are sorted; any other non-JSON value is rendered as its tagged document
        (:func:`rewind.serde.display`, which names its type). The result
        passes `json.dumps(..., allow_nan=False)`. Raises nothing for JSON-like outputs.
        """
        return {
            "run_a": self.run_a,
            "run_b": self.run_b,
            "tokens_a": self.tokens_a,
            "tokens_b": self.tokens_b,
            "token_delta": self.token_delta,
            "first_divergence": (
                None if self.first_divergence is None else self.first_divergence.index
            ),
            "counts": {s: sum(n.status == s for n in self.nodes) for s in _STATUSES},
            "code_changed": [n.name for n in self.nodes if n.code_changed],
            "nodes": [_node_json(node) for node in self.nodes],
        }


# --------------------------------------------------------------------------------------------
# Value diff


def diff_values(old: Any, new: Any, path: str = "") -> list[FieldChange]:
    """List every difference from `old` (run A) to `new` (run B).

    Args:
        old: a JSON-like value (dict, list/tuple, str, int, float, bool, None).
        new: a JSON-like value.
        path: path prefix for the reported changes; `""` means the values are the root.

    Returns:
        Changes in a deterministic order (dict keys sorted, lists in item order). Dicts are
        compared key by key, keys starting with `_`, `__` or `$` included; keys on one side
        only are `added`/`removed`; when nothing else differs, another key order is one
        `reordered` change (key order is part of a stored dict, see :mod:`rewind.serde`).
        A list holding the same items in another order is one `reordered` change too. Other
        lists (and tuples and deques, each against its own type) are aligned by content where
        they differ index-wise: an item inserted at the front is one `added` at `[0]`, not every
        later item changed; an item removed is one `removed` at its index in A. Items left
        unaligned between two aligned ones compare in place, so one edited field inside one
        element is one change at e.g. `table[3].mean` (the index in B; `old_path` names A's when
        it differs); extra tail elements are `added`/`removed` at their index. Dataclass
        instances and pydantic models of one class are compared field by field
        (`report.title`). Values of different exact types give one `type_changed`. Other objects
        are equal when their stored documents are (:func:`rewind.serde.encode`), so the diff
        agrees with the hash.

    Raises:
        RecursionError: nesting deeper than the interpreter's recursion limit (or a cycle).
    """
    changes: list[FieldChange] = []
    _walk(old, new, path, path, changes)
    return changes


def similarity(a: Any, b: Any) -> float:
    """Score how alike two JSON-like values are, from 0.0 (nothing shared) to 1.0 (no diff).

    Strings score the `difflib.SequenceMatcher` ratio (averaged over both argument orders, so
    the score is symmetric); dicts the mean over the union of keys (a key on one side only
    scores 0); lists the mean over indexes up to the longer length (a missing element scores
    0); any other pair 1.0 if `diff_values` finds no change, else 0.0 (so `1` vs `1.0` is 0.0).
    `similarity(a, b) == 1.0` exactly when `diff_values(a, b) == []`.

    Raises:
        RecursionError: nesting deeper than the interpreter's recursion limit.
    """
    if a is b:
        return 1.0
    kind_a, kind_b = _kind(a), _kind(b)
    if kind_a != kind_b:
        return 0.0
    if kind_a == "object":
        keys = _sorted_keys(set(a) | set(b))
        if not keys:
            return 1.0
        scores = (similarity(a[k], b[k]) if k in a and k in b else 0.0 for k in keys)
        score = _mean_exact(scores, len(keys))
        # Another key order is a change (diff_values reports it): never a perfect score.
        return _BELOW_ONE if score == 1.0 and list(a) != list(b) else score
    if kind_a == "array":
        shared, longest = min(len(a), len(b)), max(len(a), len(b))
        if longest == 0:
            return 1.0
        scores = [similarity(a[i], b[i]) for i in range(shared)] + [0.0] * (longest - shared)
        return _mean_exact(scores, longest)
    if kind_a == "str":
        if a == b:
            return 1.0
        forward = difflib.SequenceMatcher(None, a, b).ratio()
        backward = difflib.SequenceMatcher(None, b, a).ratio()
        return min((forward + backward) / 2, _BELOW_ONE)
    return 1.0 if _scalar_equal(kind_a, a, b) else 0.0


_BELOW_ONE = math.nextafter(1.0, 0.0)


def _mean_exact(scores: Iterable[float], count: int) -> float:
    """Mean that is 1.0 only if every score is 1.0 (float rounding must not fake equality)."""
    values = list(scores)
    if all(v == 1.0 for v in values):
        return 1.0
    return min(math.fsum(values) / count, _BELOW_ONE)


_JSON_KINDS = {
    type(None): "null",
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    dict: "object",
    list: "array",
}


def _kind(value: Any) -> str:
    """JSON type of `value`, else `py:module.QualName` of its exact type.

    Exact types, because outputs are loaded with their recorded types (:mod:`rewind.serde`): an
    `IntEnum` member is not its int, a tuple is not a list, an `OrderedDict` is not a dict.
    """
    kind = _JSON_KINDS.get(type(value))
    if kind is not None:
        return kind
    return f"py:{type(value).__module__}.{type(value).__qualname__}"


def _scalar_equal(kind: str, old: Any, new: Any) -> bool:
    if kind == "float":
        if math.isnan(old) and math.isnan(new):
            return True
        # The canonical hasher keeps -0.0 distinct from 0.0, so the diff must too.
        return old == new and math.copysign(1.0, old) == math.copysign(1.0, new)
    if kind.startswith("py:"):
        return _same_document(old, new)
    return bool(old == new)


def _same_document(old: Any, new: Any) -> bool:
    """Equal as stored: the same exact document (what the hash covers), else `==`."""
    try:
        return canonical_json(encode(old)) == canonical_json(encode(new))
    except (ValueError, UnstorableValue):  # not storable (or CanonicalError): fall back to ==
        try:
            return bool(old == new)
        except ValueError:  # e.g. numpy's ambiguous truth value
            return False


def _is_sequence(value: Any) -> bool:
    return isinstance(value, list | tuple | deque)


def _fields_of(value: Any) -> dict[str, Any] | None:
    """Fields of a dataclass instance or pydantic model (walked like an object), else None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value)]
        return {n: getattr(value, n) for n in names if hasattr(value, n)}
    if hasattr(type(value), "model_fields") and hasattr(value, "__pydantic_private__"):
        return dict(value.__dict__) | dict(value.__pydantic_private__ or {})
    return None


def _walk(old: Any, new: Any, path_a: str, path_b: str, out: list[FieldChange]) -> None:
    """Append the changes from `old` (at `path_a` in A) to `new` (at `path_b` in B); the two
    paths differ only below a list item that moved (an insertion or removal before it)."""
    if old is new:
        return
    kind_old, kind_new = _kind(old), _kind(new)
    if kind_old != kind_new:
        out.append(_pair_change(path_a, path_b, TYPE_CHANGED, old, new))
        return
    if isinstance(old, dict):
        before = len(out)
        for key in _sorted_keys(set(old) | set(new)):
            child_a, child_b = _key_path(path_a, key), _key_path(path_b, key)
            if key not in new:
                out.append(FieldChange(child_a, REMOVED, old[key], None))
            elif key not in old:
                out.append(FieldChange(child_b, ADDED, None, new[key]))
            else:
                _walk(old[key], new[key], child_a, child_b, out)
        if len(out) == before and list(old) != list(new):
            # Key order is part of a stored dict (it loads back in that order): same keys and
            # values in another order is a change, shown as the two key orders.
            out.append(_pair_change(path_a, path_b, REORDERED, list(old), list(new)))
        elif getattr(old, "default_factory", None) != getattr(new, "default_factory", None):
            out.append(
                _pair_change(
                    f"{path_a}.default_factory",
                    f"{path_b}.default_factory",
                    CHANGED,
                    old.default_factory,
                    new.default_factory,
                )
            )
        return
    fields_old = _fields_of(old)
    if fields_old is not None:
        _walk(fields_old, _fields_of(new) or {}, path_a, path_b, out)
        return
    if _is_sequence(old):
        if getattr(old, "maxlen", None) != getattr(new, "maxlen", None):
            out.append(
                _pair_change(
                    f"{path_a}.maxlen", f"{path_b}.maxlen", CHANGED, old.maxlen, new.maxlen
                )
            )
        order = _reordering(old, new)
        if order is not None:
            # The same items in another order: one change, as B's order in A's indexes.
            out.append(_pair_change(path_a, path_b, REORDERED, list(range(len(old))), order))
        else:
            _walk_list(list(old), list(new), path_a, path_b, out)
        return
    if _scalar_equal(kind_old, old, new):
        return
    text_diff = _text_diff(old, new, path_a, path_b) if kind_old == "str" else None
    out.append(_pair_change(path_a, path_b, CHANGED, old, new, text_diff))


def _reordering(old: Sequence[Any], new: Sequence[Any]) -> list[int] | None:
    """For two lists holding the same items (as a multiset, by `_item_key`) in another order:
    for each index of `new`, the index in `old` of its item (equal items keep their relative
    order); else None."""
    if len(old) != len(new) or len(old) < 2:
        return None
    try:
        keys_old = [_item_key(v) for v in old]
        keys_new = [_item_key(v) for v in new]
    except TypeError:  # an unhashable non-JSON object: no content alignment
        return None
    if keys_old == keys_new:
        return None
    where: dict[Any, list[int]] = {}
    for i, k in enumerate(keys_old):
        where.setdefault(k, []).append(i)
    order: list[int] = []
    for k in keys_new:
        slots = where.get(k)
        if not slots:
            return None
        order.append(slots.pop(0))
    return order


def _pair_change(
    path_a: str, path_b: str, kind: str, old: Any, new: Any, text_diff: str | None = None
) -> FieldChange:
    return FieldChange(path_b, kind, old, new, text_diff, None if path_a == path_b else path_a)


def _walk_list(
    old: Sequence[Any], new: Sequence[Any], path_a: str, path_b: str, out: list[FieldChange]
) -> None:
    """Diff two lists: equal items aligned by content, the gaps between them item by item.

    A gap with as many items on both sides compares in place (an in-place change); a gap with
    more items on one side pairs its items by similarity (`_gap_pairs`), and what is left over is
    `removed` at its index in A or `added` at its index in B.
    """
    prev_i, prev_j = 0, 0
    for i, j in [*_aligned_items(old, new), (len(old), len(new))]:
        gap_old, gap_new = old[prev_i:i], new[prev_j:j]
        a, b = 0, 0
        for x, y in [*_gap_pairs(gap_old, gap_new), (len(gap_old), len(gap_new))]:
            for k in range(prev_i + a, prev_i + x):
                out.append(FieldChange(f"{path_a}[{k}]", REMOVED, old[k], None))
            for k in range(prev_j + b, prev_j + y):
                out.append(FieldChange(f"{path_b}[{k}]", ADDED, None, new[k]))
            if x < len(gap_old):
                ia, jb = prev_i + x, prev_j + y
                _walk(old[ia], new[jb], f"{path_a}[{ia}]", f"{path_b}[{jb}]", out)
            a, b = x + 1, y + 1
        if i < len(old):
            _walk(old[i], new[j], f"{path_a}[{i}]", f"{path_b}[{j}]", out)
        prev_i, prev_j = i + 1, j + 1


GAP_CELLS = 2_500
"""Largest gap (items in A × items in B) paired by similarity; a larger one pairs in place."""


def _gap_pairs(old: Sequence[Any], new: Sequence[Any]) -> list[tuple[int, int]]:
    """Pairs of items compared in place inside a gap between two aligned items.

    Equal-length gaps pair by index. Otherwise a weighted longest-common-subsequence over
    `similarity` keeps the order and maximises the summed similarity (items with nothing in
    common are never paired), so a row inserted next to an edited row is one `added` plus the
    edit, not a changed row plus an added one. The pairing is used only when it is the same
    computed from either side (so the diff mirrors when A and B swap); otherwise by index.
    """
    by_index = [(k, k) for k in range(min(len(old), len(new)))]
    if len(old) == len(new) or not old or not new or len(old) * len(new) > GAP_CELLS:
        return by_index
    forward = _best_pairs(old, new)
    backward = sorted((i, j) for j, i in _best_pairs(new, old))
    return forward if forward == backward else by_index


def _best_pairs(old: Sequence[Any], new: Sequence[Any]) -> list[tuple[int, int]]:
    score = [[similarity(x, y) for y in new] for x in old]
    best = [[0.0] * (len(new) + 1) for _ in range(len(old) + 1)]
    for i in range(len(old) - 1, -1, -1):
        for j in range(len(new) - 1, -1, -1):
            pair = best[i + 1][j + 1] + score[i][j] if score[i][j] > 0 else -1.0
            best[i][j] = max(pair, best[i + 1][j], best[i][j + 1])
    pairs: list[tuple[int, int]] = []
    i = j = 0
    while i < len(old) and j < len(new):
        if score[i][j] > 0 and best[i][j] == best[i + 1][j + 1] + score[i][j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif best[i][j] == best[i + 1][j]:
            i += 1
        else:
            j += 1
    return pairs


def _aligned_items(old: Sequence[Any], new: Sequence[Any]) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)`` of equal items that a content alignment of the two lists keeps.

    Equal items at the head and tail align first (so one insertion or removal anywhere is
    exactly one change); between them `difflib.SequenceMatcher` (no junk heuristic) matches
    items by an equality key that agrees with `diff_values`; the pairs kept are those found both
    from A to B and from B to A, so that `diff_values(b, a)` mirrors `diff_values(a, b)`
    (SequenceMatcher breaks ties by position, e.g. on swapped items, and would otherwise pick a
    different pairing each way). Between lists
    of equal length the content alignment is used only when it reports fewer changes than
    comparing index by index, so an in-place edit stays one change at its index.
    """
    shared = min(len(old), len(new))
    try:
        keys_old = [_item_key(v) for v in old]
        keys_new = [_item_key(v) for v in new]
    except TypeError:  # an unhashable non-JSON object: compare by index
        return [(i, i) for i in range(shared)]
    by_index = [(i, i) for i in range(shared)]
    if keys_old[:shared] == keys_new[:shared]:
        return by_index
    head = 0
    while head < shared and keys_old[head] == keys_new[head]:
        head += 1
    tail = 0
    while tail < shared - head and keys_old[-1 - tail] == keys_new[-1 - tail]:
        tail += 1
    mid_old, mid_new = keys_old[head : len(old) - tail], keys_new[head : len(new) - tail]
    forward = _matched_pairs(mid_old, mid_new)
    backward = {(i, j) for j, i in _matched_pairs(mid_new, mid_old)}
    by_content = [
        *((k, k) for k in range(head)),
        *((i + head, j + head) for i, j in sorted(forward & backward)),
        *((len(old) - tail + k, len(new) - tail + k) for k in range(tail)),
    ]
    if len(old) != len(new) or _cost(by_content, keys_old, keys_new) < _cost(
        by_index, keys_old, keys_new
    ):
        return by_content
    return by_index


def _cost(pairs: list[tuple[int, int]], old: list[Any], new: list[Any]) -> int:
    """How many changes an alignment reports at its top level: a pair of unequal items, and per
    gap between pairs, its larger side (items paired in place, the rest added or removed)."""
    total, prev_i, prev_j = 0, 0, 0
    for i, j in [*pairs, (len(old), len(new))]:
        total += max(i - prev_i, j - prev_j)
        if i < len(old):
            total += old[i] != new[j]
        prev_i, prev_j = i + 1, j + 1
    return total


def _matched_pairs(a: list[Any], b: list[Any]) -> set[tuple[int, int]]:
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return {(m.a + k, m.b + k) for m in matcher.get_matching_blocks() for k in range(m.size)}


def _item_key(value: Any) -> Any:
    """A hashable key equal for two values exactly when `diff_values` finds no change.

    Keys carry the exact type (`_kind`): floats key on `float.hex` (so `-0.0` differs from
    `0.0`) and every NaN on one key; dict items key in their order (another key order is a
    change); sequences with their `maxlen`; dataclasses and pydantic models by their fields;
    other objects by their stored document (:func:`rewind.serde.encode`). Raises TypeError for
    an object that is neither storable nor hashable.
    """
    kind = _kind(value)
    if kind == "float":
        return (kind, "nan" if math.isnan(value) else value.hex())
    if isinstance(value, dict):
        factory = getattr(value, "default_factory", None)
        items = tuple((_item_key(k), _item_key(v)) for k, v in value.items())
        return (kind, repr(factory), items)
    fields = _fields_of(value)
    if fields is not None:
        return (kind, _item_key(fields))
    if _is_sequence(value):
        return (kind, getattr(value, "maxlen", None), tuple(_item_key(v) for v in value))
    if kind.startswith("py:"):
        try:
            return (kind, canonical_json(encode(value)))
        except (ValueError, UnstorableValue):
            pass
    hash(value)
    return (kind, value)


def _sorted_keys(keys: Iterable[Any]) -> list[Any]:
    """Keys in a stable order: strings by code point first, then other keys by type and text."""
    return sorted(
        keys, key=lambda k: (0, "", k) if isinstance(k, str) else (1, _kind(k), _key_text(k))
    )


def _key_path(path: str, key: Any) -> str:
    if isinstance(key, str):
        if key.isidentifier():
            return f"{path}.{key}" if path else key
        escaped = key.replace("\\", "\\\\").replace("'", "\\'")
        return f"{path}['{escaped}']"
    return f"{path}[{_key_text(key)}]"


def _text_diff(old: str, new: str, path_a: str, path_b: str) -> str | None:
    long = max(len(old), len(new)) > LONG_TEXT_CHARS or "\n" in old or "\n" in new
    if not long:
        return None
    # split("\n") rather than splitlines(): a changed trailing newline must still show up.
    lines = difflib.unified_diff(
        old.split("\n"),
        new.split("\n"),
        fromfile=f"a/{path_a}",
        tofile=f"b/{path_b}",
        lineterm="",
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Alignment and trajectory diff


def align_nodes(
    a: Sequence[NodeSide], b: Sequence[NodeSide]
) -> list[tuple[NodeSide | None, NodeSide | None]]:
    """Pair the node executions of two runs.

    Both sequences are first ordered by `position` (stable, so equal positions keep the given
    order). If both runs executed the same sequence of node names, nodes pair by position.
    Otherwise the k-th execution of node X in A pairs with the k-th execution of X in B; rows
    follow A's order, and each B-only node is placed after the matched node that precedes it in
    B (after any A-only nodes at that spot, like a `-`/`+` hunk). Unpaired nodes come back as
    `(node, None)` or `(None, node)`.

    Returns:
        One `(a_node | None, b_node | None)` tuple per row; never `(None, None)`.
    """
    nodes_a = sorted(a, key=lambda n: n.position)
    nodes_b = sorted(b, key=lambda n: n.position)
    if [n.name for n in nodes_a] == [n.name for n in nodes_b]:
        return list(zip(nodes_a, nodes_b, strict=True))

    keys_a = _occurrence_keys(nodes_a)
    keys_b = _occurrence_keys(nodes_b)
    b_by_key = dict(zip(keys_b, nodes_b, strict=True))
    matched = set(keys_a) & set(keys_b)

    # B-only nodes grouped by the matched key that precedes them in B (None = start of run).
    b_only_after: dict[tuple[str, int] | None, list[NodeSide]] = {}
    anchor: tuple[str, int] | None = None
    for key, node in zip(keys_b, nodes_b, strict=True):
        if key in matched:
            anchor = key
        else:
            b_only_after.setdefault(anchor, []).append(node)

    rows: list[tuple[NodeSide | None, NodeSide | None]] = []
    pending = b_only_after.get(None, [])
    for key, node in zip(keys_a, nodes_a, strict=True):
        if key not in matched:
            rows.append((node, None))
            continue
        rows.extend((None, extra) for extra in pending)
        rows.append((node, b_by_key[key]))
        pending = b_only_after.get(key, [])
    rows.extend((None, extra) for extra in pending)
    return rows


def _occurrence_keys(nodes: Sequence[NodeSide]) -> list[tuple[str, int]]:
    seen: dict[str, int] = {}
    keys = []
    for node in nodes:
        k = seen.get(node.name, 0)
        seen[node.name] = k + 1
        keys.append((node.name, k))
    return keys


def diff_trajectories(
    run_a: str, a: Sequence[NodeSide], run_b: str, b: Sequence[NodeSide]
) -> TrajectoryDiff:
    """Align two runs with `align_nodes` and diff every paired node's output.

    Args:
        run_a: run id of the reference run; `a` its node executions (any order, see
            `align_nodes`).
        run_b: run id of the compared run; `b` its node executions.

    Returns:
        A `TrajectoryDiff`. A row is `"equal"` only when `diff_values` finds no change, even if
        the recorded hashes differ (and `"changed"` even if they match): `hash_equal` exposes
        the hash verdict separately so a caller can flag a hasher/diff disagreement, and
        `code_changed` says the node's code differs between the runs (its changes are then not
        the override's doing alone). One-sided rows carry no field changes.

    Raises:
        RecursionError: an output nested deeper than the interpreter's recursion limit.
    """
    rows: list[NodeDiff] = []
    for index, (side_a, side_b) in enumerate(align_nodes(a, b)):
        tokens = (side_b.tokens if side_b else 0) - (side_a.tokens if side_a else 0)
        changes: tuple[FieldChange, ...] = ()
        hash_equal = code_changed = False
        helpers: tuple[str, ...] = ()
        if side_a is None:
            assert side_b is not None  # align_nodes never yields (None, None)
            name, status = side_b.name, ONLY_B
        elif side_b is None:
            name, status = side_a.name, ONLY_A
        else:
            changes = _side_changes(side_a, side_b)
            name, status = side_a.name, CHANGED if changes else EQUAL
            hash_equal = side_a.output_hash == side_b.output_hash
            if side_a.helpers is not None and side_b.helpers is not None:
                ha, hb = side_a.helpers, side_b.helpers
                helpers = tuple(sorted(k for k in set(ha) | set(hb) if ha.get(k) != hb.get(k)))
            code_changed = bool(
                (side_a.code and side_b.code and side_a.code != side_b.code) or helpers
            )
        rows.append(
            NodeDiff(
                index,
                name,
                side_a,
                side_b,
                status,
                changes,
                tokens,
                hash_equal,
                code_changed,
                helpers,
            )
        )

    tokens_a = sum(n.tokens for n in a)
    tokens_b = sum(n.tokens for n in b)
    return TrajectoryDiff(
        run_a=run_a,
        run_b=run_b,
        nodes=tuple(rows),
        first_divergence=next((r for r in rows if r.status != EQUAL), None),
        tokens_a=tokens_a,
        tokens_b=tokens_b,
        token_delta=tokens_b - tokens_a,
    )


# --------------------------------------------------------------------------------------------
# JSON rendering


def _node_json(node: NodeDiff) -> dict[str, Any]:
    return {
        "index": node.index,
        "name": node.name,
        "status": node.status,
        "token_delta": node.token_delta,
        "hash_equal": node.hash_equal,
        "code_changed": node.code_changed,
        "helpers_changed": list(node.helpers_changed),
        "a": _side_json(node.a),
        "b": _side_json(node.b),
        "changes": [
            {
                "path": c.path,
                "kind": c.kind,
                "old": _json_safe(c.old),
                "new": _json_safe(c.new),
                "text_diff": c.text_diff,
                "old_path": c.old_path,
            }
            for c in node.changes
        ],
    }


def _key_text(key: Any) -> str:
    if isinstance(key, int) and not -_JSON_INT_LIMIT < key < _JSON_INT_LIMIT:
        return f"<int of {key.bit_length()} bits>"
    return str(key)


def _side_changes(a: NodeSide, b: NodeSide) -> tuple[FieldChange, ...]:
    """The field changes between two paired nodes; when only one of them failed and the fields
    read alike (a user field named :data:`ERROR_FIELD` holding the other's error text), the
    error appearing or going."""
    changes = tuple(diff_values(a.output, b.output))
    if changes or a.failed == b.failed:
        return changes
    old = {ERROR_FIELD: a.output.get(ERROR_FIELD)} if a.failed else {}
    new = {ERROR_FIELD: b.output.get(ERROR_FIELD)} if b.failed else {}
    return tuple(diff_values(old, new))


def _side_json(side: NodeSide | None) -> dict[str, Any] | None:
    if side is None:
        return None
    return {
        "position": side.position,
        "name": side.name,
        "output_hash": side.output_hash,
        "tokens": side.tokens,
        "outcome": side.outcome,
        "code": side.code,
        "output": _json_safe(side.output),
    }


_JSON_INT_LIMIT = 10**4300
"""json.dumps cannot write an int from here on (sys.int_max_str_digits); shown tagged instead."""


def _json_safe(value: Any) -> Any:
    if isinstance(value, int) and not -_JSON_INT_LIMIT < value < _JSON_INT_LIMIT:
        return display(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return _NON_FINITE.get(value, value)
    if isinstance(value, dict):
        items = {k if isinstance(k, str) else _key_text(k): v for k, v in value.items()}
        return {k: _json_safe(items[k]) for k in sorted(items)}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return display(value)
