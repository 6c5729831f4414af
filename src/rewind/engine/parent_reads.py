"""What a fork reads of its parent, kept per session: a finished run never changes (rule 7).

Every fork (an unchanged replay, a what-if grid's variants, a stability run's repeats) starts by
reading its parent's node rows with their calls, and the parent's *lineage* (the calls of the
parent and its ancestors, by cache key) with the result bytes of those calls. For the same
finished parent these reads give the same answer every time: node and call rows are immutable
(database triggers refuse updates and deletes), and result blobs are content-addressed. So a
session keeps them for the last few parents it forked (measured on a 100-node chain: ~2.8 ms of
a 35 ms unchanged replay).

What keeps a kept read valid:

- the parent is read afresh by every fork (:meth:`rewind.replay.Rewind.finished_run`): a run that
  was deleted or archived meanwhile is refused before anything kept is used, and a run recorded
  again under a reused id has another ``created_at``, so another key;
- the lineage is keyed by the ancestors found now (a fork of a fork whose ancestor was removed
  by retention gets the lineage without it, as a fresh read would) and by the store's blob epoch
  (bumped by every ``rewind gc`` that deletes blobs);
- callers get copies of the lineage maps (a replay adds the blobs it fetched to its own).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rewind.context import LineageEntry
from rewind.store import NodeRecord, RunRecord, Store

KEPT_PARENTS = 8
"""How many parents' reads a session keeps (least recently forked dropped first)."""
KEPT_BLOB_BYTES = 4_000_000
"""A parent whose lineage results are larger than this (bytes) keeps no result bytes."""

Lineages = tuple[
    dict[str, LineageEntry],
    dict[tuple[int, str], LineageEntry],
    dict[tuple[int, int], LineageEntry],
    dict[tuple[int, str], LineageEntry],
]
"""(by cache key, by (node position, cache key), side-effecting calls by (position, index),
model calls that raised by (node position, cache key): :attr:`RunContext.failed_calls`)."""


@dataclass
class _Kept:
    nodes: tuple[NodeRecord, ...]
    lineage: tuple[tuple[Any, ...], Lineages, dict[str, bytes] | None] | None = None
    graph_hashes: dict[tuple[str, ...], dict[str, str]] | None = None
    initial: tuple[Any, dict[str, str], dict[str, bytes]] | None = None


class ParentReads:
    """A session's kept reads of the finished runs it forks (see the module docstring).

    Args:
        store: the session's store.
        kept: how many parents are kept.
    """

    def __init__(self, store: Store, kept: int = KEPT_PARENTS) -> None:
        self.store = store
        self.kept = kept
        self._lock = threading.Lock()
        self._by_run: OrderedDict[tuple[Any, ...], _Kept] = OrderedDict()

    @staticmethod
    def _key(run: RunRecord) -> tuple[Any, ...] | None:
        if run.status == "running" or run.finished_at is None:
            return None  # still growing: never kept
        return (run.run_id, run.created_at, run.finished_at, run.status)

    def _get(self, key: tuple[Any, ...]) -> _Kept | None:
        with self._lock:
            kept = self._by_run.get(key)
            if kept is not None:
                self._by_run.move_to_end(key)
            return kept

    def nodes(self, run: RunRecord) -> tuple[NodeRecord, ...]:
        """``run``'s node records with their calls, in position order (read once per finished
        run; a running one is read every time)."""
        key = self._key(run)
        kept = self._get(key) if key is not None else None
        if kept is not None:
            return kept.nodes
        nodes = tuple(self.store.nodes_of(run.run_id))
        if key is not None:
            with self._lock:
                self._by_run[key] = _Kept(nodes)
                while len(self._by_run) > self.kept:
                    self._by_run.popitem(last=False)
        return nodes

    def lineage(
        self,
        run: RunRecord,
        build: Callable[[Sequence[RunRecord]], Lineages],
    ) -> tuple[Lineages, dict[str, bytes]]:
        """``run``'s lineage maps and the result bytes of their calls, as copies.

        Args:
            run: the parent (as just read).
            build: makes the lineage maps from the parent's ancestors (nearest first) when
                they are not kept.
        Raises:
            StoreError: a result blob is missing (a damaged store).
        """
        ancestors = self.store.ancestors(run)
        key = self._key(run)
        kept = self._get(key) if key is not None else None
        lineage_key = (
            tuple((a.run_id, a.created_at) for a in ancestors),
            self.store.blob_epoch,
        )
        # (key, maps, bytes or None) replaced as one tuple: concurrent forks never mix entries
        found = kept.lineage if kept is not None else None
        if found is not None and found[0] == lineage_key:
            lineages, blobs = found[1], found[2]
        else:
            lineages, blobs = build(ancestors), None
        if blobs is None:
            blobs = self.store.get_blobs({e.result_hash for e in lineages[0].values()})
            if kept is not None:
                small = sum(map(len, blobs.values())) <= KEPT_BLOB_BYTES
                kept.lineage = (lineage_key, lineages, blobs if small else None)
        return (
            dict(lineages[0]),
            dict(lineages[1]),
            dict(lineages[2]),
            dict(lineages[3]),
        ), dict(blobs)

    def graph_hashes(self, run: RunRecord, producers: Sequence[str]) -> dict[str, str]:
        """:meth:`Store.run_graph_hashes` of ``producers`` (the parent and the runs that made
        its rows), kept with the parent: a run's graph row is written with it and never
        changes (a database trigger refuses updates)."""
        wanted = tuple(dict.fromkeys(producers))
        key = self._key(run)
        kept = self._get(key) if key is not None else None
        if kept is not None and kept.graph_hashes is not None and wanted in kept.graph_hashes:
            return dict(kept.graph_hashes[wanted])
        found = self.store.run_graph_hashes(wanted)
        if kept is not None:
            kept.graph_hashes = {wanted: dict(found)}
        return found

    def initial_state(self, run: RunRecord) -> tuple[dict[str, str], dict[str, bytes]]:
        """``run``'s initial state as ({field: blob hash}, {blob hash: bytes}), copies (a fork
        at the first node decodes fresh values from them each time).

        Raises:
            StoreError: a blob is missing.
        """
        key = self._key(run)
        kept = self._get(key) if key is not None else None
        epoch = self.store.blob_epoch
        if kept is not None and kept.initial is not None and kept.initial[0] == epoch:
            return dict(kept.initial[1]), dict(kept.initial[2])
        fields: dict[str, str] = self.store.get_json(str(run.initial_state_hash))
        blobs = self.store.get_blobs(fields.values())
        if kept is not None and sum(map(len, blobs.values())) <= KEPT_BLOB_BYTES:
            kept.initial = (epoch, dict(fields), dict(blobs))
        return fields, blobs
