"""Code and graph drift: what a run ran, and whether the pipeline a fork re-imports still matches.

A run records its *graph document* (:func:`graph_document`): the nodes with a fingerprint of each
node's code, the transitions in Burr's order with their conditions, the entrypoint, and a
fingerprint of the pipeline's ``param_check``. Before a fork runs anything,
:func:`compare_graphs` compares the recorded document with the re-imported pipeline's, over what
the fork touches: the nodes it inherits, the node it resumes from and everything reachable after
it. A node renamed, removed or inserted there, or a transition changed there, is *structural*
drift (it would make the fork skip the node it was asked to fork or run one nobody asked for): the
fork is refused unless the caller accepts it. Changed code of a node that keeps its name is
allowed and labelled.

The module is pure apart from reading source files through :mod:`inspect`.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import os
import sys
import sysconfig
import textwrap
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from burr.core.action import Action
from burr.core.graph import Graph

from rewind.canonical import CanonicalError, canonical_bytes, sha256_hex

__all__ = [
    "GRAPH_FORMAT",
    "GraphDrift",
    "action_fingerprint",
    "callable_fingerprint",
    "changed_helpers",
    "compare_graphs",
    "graph_document",
    "helper_fingerprints",
]

GRAPH_FORMAT = 1
"""Version of the graph document's shape, stored in it."""


# -- fingerprints ------------------------------------------------------------------------------


def callable_fingerprint(fn: Callable[..., Any], bound: Mapping[str, Any] | None = None) -> str:
    """SHA-256 hex of a function's code and of the parameters bound to it.

    The code is the function's source, parsed and dumped as an AST (so comments, blank lines and
    indentation do not count, while the decorator line, e.g. an ``@action(reads=…)``, does);
    when the source cannot be read (a REPL, a frozen app), the code object's bytecode, constants
    and names. Bound values (Burr's ``.bind(…)``) are hashed canonically; a value that cannot be
    (a client object) counts by its type only. Only the function's own body is covered; the
    helpers it calls are fingerprinted separately (:func:`helper_fingerprints`).

    Args:
        fn: a function (decorator wrappers are unwrapped through ``__wrapped__``).
        bound: keyword arguments bound to it, if any.
    """
    fn = _unwrap(fn)
    bound_doc = _bound_json(bound or {})
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return sha256_hex(canonical_bytes({"code": _code_text(fn), "bound": bound_doc}))
    # Every record and fork fingerprints every node: the hash of a code object's text with the
    # same bound values is looked up instead of encoding and hashing the text again.
    key = (code, code.co_filename, canonical_bytes(bound_doc) if bound_doc else b"")
    found = _FINGERPRINTS.get(key)
    if found is None:
        found = sha256_hex(canonical_bytes({"code": _code_text(fn), "bound": bound_doc}))
        if len(_FINGERPRINTS) < _CODE_TEXTS_MAX:
            _FINGERPRINTS[key] = found
    return found


def action_fingerprint(action: Action | Callable[..., Any]) -> str:
    """SHA-256 hex of the code a Burr action runs.

    A function-based action (``@action``, or the decorated function itself) hashes its
    originating function and its bound params (:func:`callable_fingerprint`); any other action
    hashes its class's source. Reads Burr
    0.43's ``_originating_fn``/``_bound_params`` (the version is pinned).
    """
    action = getattr(action, "action_function", action)  # an @action-decorated function
    fn = getattr(action, "_originating_fn", None)
    if callable(fn):
        return callable_fingerprint(fn, getattr(action, "_bound_params", None))
    cls = type(action)
    try:
        text = _normalised(inspect.getsource(cls))
    except (OSError, TypeError):
        members = sorted(
            (name, _code_text(value))
            for name, value in vars(cls).items()
            if isinstance(value, types.FunctionType)
        )
        text = _join_members(f"{cls.__module__}.{cls.__qualname__}", members)
    return sha256_hex(canonical_bytes({"class": text}))


HELPERS_MAX = 64
"""At most this many helpers are fingerprinted per node (a node reaching more counts the first
64 in discovery order, which is deterministic)."""

_NOT_USER_CODE = frozenset({"rewind", "burr", "builtins"})


def helper_fingerprints(action: Action | Callable[..., Any]) -> dict[str, str]:
    """Fingerprints of the helpers a node's code calls: ``{"pkg.module.fn": sha256 hex}``.

    :func:`action_fingerprint` covers only the node's own body, so a fork whose diff comes from
    an edited helper would be blamed on the override. This follows the global names the node's
    code uses (``score(...)``, ``helpers.score(...)``) to functions and classes defined in the
    the user's own modules (loaded from files outside the interpreter's stdlib and
    site-packages folders), transitively, at most :data:`HELPERS_MAX`; library code (Rewind
    and Burr included) is never followed. Each helper hashes its code text as
    :func:`callable_fingerprint` does (a class: its methods).

    Args:
        action: a Burr action, or an ``@action``-decorated function.
    Returns:
        qualified helper name → fingerprint; empty for a class-based action or a node calling
        no helper of its own package.
    """
    action = getattr(action, "action_function", action)
    fn = getattr(action, "_originating_fn", None)
    fn = _unwrap(fn) if callable(fn) else None
    if not isinstance(fn, types.FunctionType):
        return {}

    def ours(value: Any) -> bool:
        return _is_user_module(getattr(value, "__module__", None) or "")

    out: dict[str, str] = {}
    seen: set[int] = {id(fn)}
    queue: list[Callable[..., Any]] = [fn]
    while queue and len(out) < HELPERS_MAX:
        current = queue.pop(0)
        for value in _referenced(current):
            if id(value) in seen or not ours(value):
                continue
            seen.add(id(value))
            name = f"{value.__module__}.{value.__qualname__}"
            if isinstance(value, type):
                methods = sorted(
                    (k, v) for k, v in vars(value).items() if isinstance(v, types.FunctionType)
                )
                text = _join_members(name, ((k, _code_text(v)) for k, v in methods))
                queue.extend(v for _, v in methods)
                digest = sha256_hex(text.encode())
            else:
                digest = _text_hash(value)
                queue.append(value)
            out[name] = digest
            if len(out) >= HELPERS_MAX:
                break
    return dict(sorted(out.items()))


_LIBRARY_ROOTS = tuple(
    {
        str(Path(p).resolve())
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(key))
    }
)
_USER_MODULES: dict[str, bool] = {}


def _is_user_module(name: str) -> bool:
    """True for a module of the user's own code: loaded from a file outside the interpreter's
    library folders (stdlib, site-packages), and not Rewind's or Burr's."""
    known = _USER_MODULES.get(name)
    if known is not None:
        return known
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    mine = bool(file) and name.split(".")[0] not in _NOT_USER_CODE
    if mine:
        where = str(Path(str(file)).resolve())
        mine = not any(where.startswith(root + os.sep) for root in _LIBRARY_ROOTS)
    if len(_USER_MODULES) < _CODE_TEXTS_MAX:
        _USER_MODULES[name] = mine
    return mine


def _referenced(fn: Callable[..., Any]) -> list[Any]:
    """The functions and classes ``fn``'s code reaches through its globals, in name order of
    appearance (``name`` and ``module.name``)."""
    fn = _unwrap(fn)
    code = getattr(fn, "__code__", None)
    scope = getattr(fn, "__globals__", None)
    if not isinstance(code, types.CodeType) or not isinstance(scope, dict):
        return []
    names = _global_names(code)
    found: list[Any] = []
    for name in names:
        value = scope.get(name)
        if isinstance(value, types.ModuleType):  # helpers.score(...): the attributes used
            found.extend(getattr(value, n, None) for n in names)
        else:
            found.append(value)
    return [
        _unwrap(v) if isinstance(v, types.FunctionType) else v
        for v in found
        if isinstance(v, types.FunctionType | type)
    ]


_GLOBAL_NAMES: dict[types.CodeType, tuple[str, ...]] = {}


def _global_names(code: types.CodeType) -> tuple[str, ...]:
    """The names a code object and the code nested in it use, first appearance first (fixed
    for a code object, so kept per code object; the values they name are looked up each time:
    a helper reassigned or its module reloaded is seen)."""
    found = _GLOBAL_NAMES.get(code)
    if found is not None:
        return found
    names: list[str] = []
    stack = [code]
    while stack:
        c = stack.pop()
        names.extend(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    found = tuple(dict.fromkeys(names))
    if len(_GLOBAL_NAMES) < _CODE_TEXTS_MAX:
        _GLOBAL_NAMES[code] = found
    return found


def changed_helpers(
    recorded: Mapping[str, Any],
    current: Mapping[str, Any],
    node: str,
    recorded_name: str | None = None,
) -> tuple[str, ...]:
    """Helpers of ``node`` whose code differs between two graph documents (added, removed or
    edited), sorted; empty when either document predates helper fingerprints.

    Args:
        recorded, current: graph documents (:func:`graph_document`).
        node: the node's name in ``current``; ``recorded_name`` its name in ``recorded`` when
            it was renamed.
    """
    if "helpers" not in recorded or "helpers" not in current:
        return ()
    a: Mapping[str, str] = recorded["helpers"].get(recorded_name or node, {})
    b: Mapping[str, str] = current["helpers"].get(node, {})
    return tuple(sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)))


def _unwrap(fn: Any) -> Any:
    """:func:`inspect.unwrap`, without its cost for the usual function that wraps nothing."""
    return inspect.unwrap(fn) if hasattr(fn, "__wrapped__") else fn


def _join_members(name: str, members: Iterable[tuple[str, str]]) -> str:
    """One text from a class name and its methods' code texts (length-prefixed, rule 5)."""
    return name + "".join(f"\n{m}:{len(t)}:{t}" for m, t in members)


_CODE_TEXTS: dict[tuple[types.CodeType, str], str] = {}
"""Code texts by code object (and file): parsing a function's source costs ~0.5 ms, and every
record and fork fingerprints every node; a reloaded or edited-and-reimported module has new code
objects, so a cached text is always the text of the code that runs."""
_CODE_TEXTS_MAX = 4096


def _code_text(fn: Callable[..., Any]) -> str:
    code = getattr(fn, "__code__", None)
    key = (code, code.co_filename) if isinstance(code, types.CodeType) else None
    if key is not None and (cached := _CODE_TEXTS.get(key)) is not None:
        return cached
    text = _read_code_text(fn)
    if key is not None and len(_CODE_TEXTS) < _CODE_TEXTS_MAX:
        _CODE_TEXTS[key] = text
    return text


_FINGERPRINTS: dict[tuple[types.CodeType, str, bytes], str] = {}
"""Fingerprints by (code object, file, canonical bound values): see :func:`callable_fingerprint`."""
_TEXT_HASHES: dict[tuple[types.CodeType, str], str] = {}


def _text_hash(fn: Callable[..., Any]) -> str:
    """sha256 hex of :func:`_code_text` (kept per code object, as the text is)."""
    code = getattr(fn, "__code__", None)
    key = (code, code.co_filename) if isinstance(code, types.CodeType) else None
    if key is not None and (cached := _TEXT_HASHES.get(key)) is not None:
        return cached
    digest = sha256_hex(_code_text(fn).encode())
    if key is not None and len(_TEXT_HASHES) < _CODE_TEXTS_MAX:
        _TEXT_HASHES[key] = digest
    return digest


def _read_code_text(fn: Callable[..., Any]) -> str:
    try:
        return _normalised(inspect.getsource(fn))
    except (OSError, TypeError):
        code = getattr(fn, "__code__", None)
        if code is None:
            return f"{type(fn).__module__}.{type(fn).__qualname__}"
        return "bytecode:" + hashlib.sha256(canonical_bytes(_code_json(code))).hexdigest()


def _normalised(source: str) -> str:
    text = textwrap.dedent(source)
    try:
        return ast.dump(ast.parse(text))
    except SyntaxError:  # a lambda's line cut out of an expression: hash the text itself
        return text


def _code_json(code: types.CodeType) -> dict[str, Any]:
    return {
        "bytecode": code.co_code.hex(),
        "names": list(code.co_names),
        "consts": [_const_json(c) for c in code.co_consts],
    }


def _const_json(value: Any) -> Any:
    if isinstance(value, types.CodeType):
        return _code_json(value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, tuple):
        return [_const_json(v) for v in value]
    if isinstance(value, frozenset):
        items = [_const_json(v) for v in value]
        return {"set": sorted(items, key=lambda v: canonical_bytes(v))}
    return {"type": f"{type(value).__module__}.{type(value).__qualname__}"}


def _bound_json(bound: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in bound.items():
        try:
            canonical_bytes(value)
            out[str(key)] = value
        except (CanonicalError, ValueError, TypeError):
            out[str(key)] = {"$object": f"{type(value).__module__}.{type(value).__qualname__}"}
    return out


# -- the graph document ------------------------------------------------------------------------


def graph_document(
    graph: Graph,
    entrypoint: str,
    param_check: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """What a run records about the pipeline it ran.

    Returns:
        ``{"format": 1, "entrypoint": name, "nodes": {name: code sha256},
        "transitions": [[src, dst, condition name, [keys read]], …] (Burr's order, which decides
        which transition fires first), "param_check": sha256 | None, "helpers": {name:
        {helper: sha256}} (:func:`helper_fingerprints`; absent in documents recorded before
        helpers were)}``; JSON-like.
    """
    transitions = [
        [t.from_.name, t.to.name, t.condition.name, sorted(t.condition.reads)]
        for t in graph.transitions
    ]
    return {
        "format": GRAPH_FORMAT,
        "entrypoint": entrypoint,
        "nodes": {a.name: action_fingerprint(a) for a in graph.actions},
        "transitions": transitions,
        "param_check": None if param_check is None else callable_fingerprint(param_check),
        "helpers": {a.name: helpers for a in graph.actions if (helpers := helper_fingerprints(a))},
    }


# -- comparison --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphDrift:
    """How a re-imported pipeline differs from a recording, over what a fork touches.

    Attributes:
        structural: differences that change which nodes the fork runs, one sentence each (node
            renamed, removed or inserted; transition added, removed or reordered; entrypoint
            changed). A fork refuses them unless told to accept them.
        code_changed: names of nodes the fork will execute whose code fingerprint differs from
            the code that produced their recorded rows (allowed, labelled).
        param_check_changed: the pipeline's ``param_check`` code differs.
        helpers_changed: ``"node: pkg.module.helper"`` for each helper of an executed node whose
            code changed (:func:`changed_helpers`); such a node is in ``code_changed`` too.
    """

    structural: tuple[str, ...] = ()
    code_changed: tuple[str, ...] = ()
    param_check_changed: bool = False
    helpers_changed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.structural or self.code_changed or self.param_check_changed)

    def to_json(self) -> dict[str, Any]:
        """``{"structural": [...], "code_changed": [...], "param_check_changed": bool,
        "helpers_changed": [...]}``."""
        return {
            "structural": list(self.structural),
            "code_changed": list(self.code_changed),
            "param_check_changed": self.param_check_changed,
            "helpers_changed": list(self.helpers_changed),
        }


def _as_recorded(
    recorded: Mapping[str, Any],
    current: Mapping[str, Any],
    produced_code: Mapping[str, str] | None,
) -> bool:
    """Whether the current pipeline is the recorded one and produced every recorded row."""
    return recorded == current and all(
        current["nodes"].get(n) == code for n, code in (produced_code or {}).items()
    )


def compare_graphs(
    recorded: Mapping[str, Any],
    current: Mapping[str, Any],
    *,
    inherited: Sequence[str],
    resume_from: str | None,
    produced_code: Mapping[str, str] | None = None,
) -> GraphDrift:
    """Compare a recorded graph document with the current pipeline's, for one fork.

    Args:
        recorded: the graph document the parent run recorded (:func:`graph_document`).
        current: the re-imported pipeline's graph document.
        inherited: names of the nodes the fork inherits (not executed): each must still exist.
        resume_from: the last inherited node (Burr resumes after it), or None when the fork
            starts at the first node (from the entrypoint).
        produced_code: node name → fingerprint of the code that actually produced its recorded
            row, where that differs from ``recorded`` (a fork's rows come from several runs).
    Returns:
        the drift; falsy when nothing the fork touches changed. A rename is a node gone and a
        node new with identical code; renames anywhere in the graph are paired first so a
        renamed inherited node reads as a rename, not as a removal.
    """
    if _as_recorded(recorded, current, produced_code):
        return GraphDrift()  # the pipeline as recorded (the usual fork): nothing can differ
    rec_nodes: dict[str, str] = dict(recorded["nodes"]) | dict(produced_code or {})
    cur_nodes: dict[str, str] = dict(current["nodes"])
    gone = sorted(set(rec_nodes) - set(cur_nodes))
    new = sorted(set(cur_nodes) - set(rec_nodes))
    renames = _renames(gone, new, rec_nodes, cur_nodes)

    def translate(name: str) -> str:
        return renames.get(name, name)

    rec_edges = [tuple(t[:3]) for t in recorded["transitions"]]
    cur_edges = [tuple(t[:3]) for t in current["transitions"]]
    structural: list[str] = []
    if resume_from is None:
        if translate(recorded["entrypoint"]) != current["entrypoint"]:
            structural.append(
                f"entrypoint changed from {recorded['entrypoint']!r} to {current['entrypoint']!r}"
            )
        rec_region = {recorded["entrypoint"]} | _reachable(rec_edges, recorded["entrypoint"])
        cur_region = {current["entrypoint"]} | _reachable(cur_edges, current["entrypoint"])
        rec_sources, cur_sources = rec_region, cur_region
    else:
        rec_region = _reachable(rec_edges, resume_from)
        cur_region = _reachable(cur_edges, translate(resume_from))
        rec_sources = rec_region | {resume_from}
        cur_sources = cur_region | {translate(resume_from)}

    touched = set(rec_region) | set(inherited) | ({resume_from} if resume_from else set())
    removed = [n for n in sorted(touched) if n in gone and n not in renames]
    inserted = [n for n in sorted(cur_region) if n in new and n not in renames.values()]
    structural += _node_changes(
        renames, touched, cur_region, inherited, removed, inserted, cur_edges, cur_sources
    )
    structural.extend(
        _transition_changes(
            [(translate(s), translate(d), c) for s, d, c in rec_edges if s in rec_sources],
            [e for e in cur_edges if e[0] in cur_sources],
            removed=set(removed),
            inserted=set(inserted),
        )
    )
    executed = sorted({translate(n) for n in rec_region} & cur_region)
    code_changed, helpers_changed = _code_changes(
        recorded, current, rec_nodes, executed, {v: k for k, v in renames.items()}
    )
    return GraphDrift(
        structural=tuple(structural),
        code_changed=code_changed,
        param_check_changed=recorded.get("param_check") != current.get("param_check"),
        helpers_changed=helpers_changed,
    )


def _renames(
    gone: list[str], new: list[str], rec_nodes: Mapping[str, str], cur_nodes: Mapping[str, str]
) -> dict[str, str]:
    """Old name → new name: a node gone and a node new with identical code (first match)."""
    renames: dict[str, str] = {}
    for old in gone:
        match = next(
            (n for n in new if n not in renames.values() and cur_nodes[n] == rec_nodes[old]), None
        )
        if match is not None:
            renames[old] = match
    return renames


def _node_changes(
    renames: Mapping[str, str],
    touched: set[str],
    cur_region: set[str],
    inherited: Sequence[str],
    removed: list[str],
    inserted: list[str],
    cur_edges: Sequence[tuple[Any, ...]],
    cur_sources: set[str],
) -> list[str]:
    """Sentences for the nodes the fork touches that were renamed, removed or inserted."""
    out: list[str] = []
    for old, now in sorted(renames.items()):
        if old in touched or now in cur_region:
            where = " (inherited)" if old in inherited else ""
            out.append(f"node {old!r}{where} renamed to {now!r}")
    for n in removed:
        where = "inherited node" if n in inherited else "node"
        out.append(f"{where} {n!r} removed")
    for n in inserted:
        before = sorted(s for s, d, _ in cur_edges if d == n and s in cur_sources)
        after = f" after {', '.join(repr(b) for b in before)}" if before else ""
        out.append(f"node {n!r} inserted{after}")
    return out


def _code_changes(
    recorded: Mapping[str, Any],
    current: Mapping[str, Any],
    rec_nodes: Mapping[str, str],
    executed: list[str],
    inverse: Mapping[str, str],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(nodes the fork executes whose code or helpers changed, ``node: helper`` lines);
    ``inverse`` maps a renamed node's new name to its recorded one."""
    cur_nodes: Mapping[str, str] = current["nodes"]
    helpers_changed = tuple(
        f"{n}: {h}"
        for n in executed
        for h in changed_helpers(recorded, current, n, inverse.get(n, n))
    )
    with_helper = {h.split(": ", 1)[0] for h in helpers_changed}
    code_changed = tuple(
        n
        for n in executed
        if rec_nodes.get(inverse.get(n, n), cur_nodes[n]) != cur_nodes[n] or n in with_helper
    )
    return code_changed, helpers_changed


def _reachable(edges: Sequence[tuple[Any, ...]], start: str) -> set[str]:
    """Nodes reachable from ``start`` through at least one transition."""
    out: dict[str, list[str]] = {}
    for src, dst, _ in edges:
        out.setdefault(src, []).append(dst)
    seen: set[str] = set()
    frontier = [start]
    while frontier:
        for dst in out.get(frontier.pop(), ()):
            if dst not in seen:
                seen.add(dst)
                frontier.append(dst)
    return seen


def _transition_changes(
    recorded: Sequence[tuple[Any, ...]],
    current: Sequence[tuple[Any, ...]],
    *,
    removed: set[str],
    inserted: set[str],
) -> list[str]:
    """Sentences for transitions added, removed or reordered (per source node, Burr's order
    decides which condition is checked first). A transition that only reflects a node removed
    or inserted (``a → c`` now that ``b`` between them is gone) is already explained by it."""
    skip = removed | inserted
    rec = [e for e in recorded if e[0] not in skip and e[1] not in skip]
    cur = [e for e in current if e[0] not in skip and e[1] not in skip]
    out = [
        f"transition {s!r} → {d!r} ({c}) removed"
        for s, d, c in rec
        if (s, d, c) not in cur and not _through(current, s, d, inserted)
    ]
    out += [
        f"transition {s!r} → {d!r} ({c}) added"
        for s, d, c in cur
        if (s, d, c) not in rec and not _through(recorded, s, d, removed)
    ]
    out += [f"transitions out of {src!r} reordered" for src in _reordered(rec, cur)]
    return out


def _reordered(rec: Sequence[tuple[Any, ...]], cur: Sequence[tuple[Any, ...]]) -> list[str]:
    """Source nodes whose transitions kept in both lists are in another order now."""
    return [
        src
        for src in sorted({e[0] for e in rec})
        if [e for e in rec if e[0] == src and e in cur]
        != [e for e in cur if e[0] == src and e in rec]
    ]


def _through(edges: Sequence[tuple[Any, ...]], src: str, dst: str, via: set[str]) -> bool:
    """True when ``edges`` lead from ``src`` to ``dst`` through one or more ``via`` nodes."""
    seen: set[str] = set()
    frontier = [d for s, d, _ in edges if s == src and d in via]
    while frontier:
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        for s, d, _ in edges:
            if s == node and d == dst:
                return True
            if s == node and d in via:
                frontier.append(d)
    return False
