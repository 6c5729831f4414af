"""Side effects: fingerprints of the resources a tool touches, pinned snapshots, idempotency salts.

Same output is not the same effect (seed 004): a tool can return an identical result while it
left the world in a different state. So every side-effecting tool declares the resources it
touches; Rewind fingerprints each one before and after every call (content hash, row-version or
ETag, plus an *epoch* — when or at which version that state was observed) and keeps a pinned
snapshot of the pre-state where the resource can provide one. The audit (:mod:`rewind.audit`)
compares (output, post-state) pairs; replay in ``live`` mode re-executes only when the same
resource's pre-state matches the one recorded at the call's slot (or after restoring the pinned
snapshot), one writer per resource at a time.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, get_args

from rewind.call import Call, CallPolicy, execute_call
from rewind.canonical import canonical_bytes, key_of, sha256_hex
from rewind.context import LineageEntry, NodeScope, RunContext, current
from rewind.errors import ContextLost, RewindError
from rewind.fingerprints import (
    ABSENT,
    RESTORE_MODES,
    EffectPreconditionFailed,
    FileTree,
    Fingerprint,
    Fingerprinter,
    FingerprintUnavailable,
    HttpResource,
    SQLiteTable,
)
from rewind.store.records import CallRecord, EffectRecord

EffectsMode = Literal["recorded", "dry-run", "live"]
"""A replay's side-effect mode (stored as this string in a fork's ``launch``)."""

EFFECT_MODES: tuple[EffectsMode, ...] = get_args(EffectsMode)
"""How a replay treats side-effecting calls: serve the recorded result (default), log the call and
execute nothing, or re-execute against a verified (or restored) pre-state."""


def idempotency_key(base: str) -> str:
    """An idempotency key salted per replay attempt.

    A key consumed by the original run must not let a replay look perfect by returning the
    cached original (seed 004, third class): inside a run the key is
    ``sha256(len-prefixed base, run id)``, so every run and every replay attempt gets its own.
    Outside a run it is the base unchanged. Declare the argument that carries it with
    ``@tool(..., idempotency_arg=...)`` so it stays out of the cache key.
    """
    ctx = current()
    if ctx is None:
        return base
    return key_of("idempotency/v1", base, ctx.run_id)


class SideEffectBlocked(RewindError):
    """A replay in ``recorded`` mode reached a side-effecting call it has no record of."""


def side_effect_call(ctx: RunContext, call: Call) -> tuple[bytes, CallRecord]:
    """Run (or serve, or skip) one side-effecting call according to the run's effects mode.

    Recording executes the call with pre/post fingerprints of every declared resource and a
    pinned pre-state snapshot. A replay never re-executes silently:

    - ``recorded`` (default): serve the result the source trajectory recorded for these exact
      arguments (``served:side-effect-recorded``; the audit verdict is ``not-re-executed``). A
      call whose arguments changed upstream has no record: :class:`SideEffectBlocked`.
    - ``dry-run``: log the intended call, execute nothing; the recorded result is returned when
      there is one, else ``{"dry_run": true, "tool": name, "request_sha256": …}``.
    - ``live``: re-execute, but only after each resource's pre-state fingerprint matches the
      recorded pre-state (or after restoring the recorded pinned snapshot);
      :class:`EffectPreconditionFailed` otherwise.

    Side-effect results are kept as blobs on the run but never become shared cache entries, and
    hash-stability runs always serve them from record.
    """
    scope = ctx.node
    if scope is None:
        # No node or step to hang the call and its fingerprints on (a traced chain gives such
        # a call a step of its own first): it would execute unrecorded and audit vacuously.
        raise ContextLost(
            f"side-effecting tool {call.name!r} was called outside any step of run "
            f"{ctx.run_id[:12]}, so it would execute unrecorded",
            'call it inside a step: with rewind.tracing.step("name", "tool_call"): ...',
        )
    entry = ctx.lineage.get(call.key) if ctx.read_cache or not ctx.write_cache else None
    mode = "record" if not ctx.read_cache and ctx.write_cache else ctx.effects_mode
    if not ctx.write_cache:
        # Stability runs never repeat effects: serve the record, or log the call when its
        # arguments spread upstream (there is then no record to serve).
        mode = "recorded" if entry is not None else "dry-run"
    where = f"node {scope.name!r}: "
    resources = _declared_resources(call, where)
    if mode == "recorded" or (mode == "dry-run" and entry is not None):
        data, record = _served_effect(ctx, scope, call, resources, mode, entry, where)
    elif mode == "dry-run":
        data, record = _dry_run_effect(ctx, scope, call, resources)
    else:
        with _holding(resources):
            data, record = _execute_effect(ctx, call, resources, mode, where)
    scope.add_call(record)
    return data, record


def _declared_resources(call: Call, where: str) -> list[Fingerprinter]:
    """The call's declared resources, each a :class:`Fingerprinter` (RewindError otherwise)."""
    wrong = [r for r in call.policy.resources if not isinstance(r, Fingerprinter)]
    if wrong:
        raise RewindError(
            f"{where}side-effecting tool {call.name!r} declares a resource that cannot be "
            f"fingerprinted: {type(wrong[0]).__name__} {str(wrong[0])[:80]!r}",
            "declare resources as rewind.effects.FileTree(path), SQLiteTable(db, table) or "
            "HttpResource(url)",
        )
    return list(call.policy.resources)


def _served_effect(
    ctx: RunContext,
    scope: NodeScope,
    call: Call,
    resources: list[Fingerprinter],
    mode: str,
    entry: LineageEntry | None,
    where: str,
) -> tuple[bytes, CallRecord]:
    """``recorded`` (or ``dry-run`` with a record): the recorded result, nothing executed."""
    if entry is None:
        raise SideEffectBlocked(
            f"{where}side-effecting tool {call.name!r} is called with arguments the source "
            "run never used, so there is no recorded result to serve",
            "replay with --effects live (re-execute against a verified pre-state) or "
            "--effects dry-run (log the call, execute nothing)",
        )
    data = ctx.lineage_blobs.get(entry.result_hash) or ctx.store.get_blob(entry.result_hash)
    outcome, reason = (
        ("served", "side-effect-recorded")
        if mode == "recorded"
        else ("dry-run", "side-effect-dry-run")
    )
    record = call.record(entry.result_hash, outcome, reason, produced_at=entry.produced_at)
    if mode == "recorded" and call.policy.on_served is not None:
        call.policy.on_served(call.request, data)
    _effect_rows(ctx, scope, call.index, resources, mode, None, None, None, call.policy)
    return data, record


def _dry_run_effect(
    ctx: RunContext, scope: NodeScope, call: Call, resources: list[Fingerprinter]
) -> tuple[bytes, CallRecord]:
    """``dry-run`` without a record: log the intended call, execute nothing."""
    data = canonical_bytes(
        {"dry_run": True, "tool": call.name, "request_sha256": call.request_hash}
    )
    record = call.record(
        sha256_hex(data), "dry-run", "side-effect-dry-run", produced_at=ctx.clock()
    )
    _effect_rows(ctx, scope, call.index, resources, "dry-run", None, None, None, call.policy)
    scope.pending[f"dry-run:{call.key}:{call.index}"] = call.pending(
        record.result_hash or "", data, cacheable=False, produced_at=None
    )
    return data, record


_RESOURCE_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


LOCK_DIR = Path(tempfile.gettempdir()) / "rewind-effect-locks"
"""Where the per-resource lock files live (one per resource name, shared by every process of
this machine that runs Rewind)."""


@contextlib.contextmanager
def _holding(resources: list[Fingerprinter]) -> Iterator[None]:
    """Hold every resource's lock (by name, in name order, so two calls never deadlock) for a
    whole verify → restore → execute → fingerprint sequence: what-if grid variants, parallel
    forks and other processes on this machine (worker processes, a second ``rewind fork``)
    touching one resource run one after the other, never interleaved. A thread lock orders the
    threads of this process; an ``flock`` on a lock file in :data:`LOCK_DIR` orders processes."""
    names = sorted({r.name for r in resources})
    with _LOCKS_GUARD:
        locks = [_RESOURCE_LOCKS.setdefault(n, threading.Lock()) for n in names]
    with contextlib.ExitStack() as stack:
        for name, lock in zip(names, locks, strict=True):
            stack.enter_context(lock)
            stack.enter_context(_process_lock(name))
        yield


@contextlib.contextmanager
def _process_lock(name: str) -> Iterator[None]:
    """An exclusive ``flock`` on the resource's lock file (no-op where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    path = LOCK_DIR / f"{sha256_hex(name.encode())[:32]}.lock"
    try:
        if not LOCK_DIR.is_dir():
            LOCK_DIR.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):  # shared by every user, like /tmp itself
                os.chmod(LOCK_DIR, 0o1777)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # another user's lock file: a read-only descriptor locks too
            fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise EffectPreconditionFailed(
            f"cannot take the lock of {name} ({path}): {exc.strerror or exc}",
            f"make {LOCK_DIR} writable for this user, or replay with --effects recorded",
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _execute_effect(
    ctx: RunContext, call: Call, resources: list[Fingerprinter], mode: str, where: str
) -> tuple[bytes, CallRecord]:
    """Execute one side-effecting call (``record`` or ``live``) between pre and post
    fingerprints, with its pre-state pinned; ``live`` verifies (or restores) the slot's recorded
    pre-state first."""
    scope, key, index, policy = ctx.node, call.key, call.index, call.policy
    reason = "bypass" if mode == "record" else "side-effect-live"
    if mode == "live":
        slot = ctx.lineage_slots.get((scope.position, index)) if scope is not None else None
        pre, drift = _verify_pre_state(ctx, slot, resources, where, call.name, index)
        if drift:
            reason = "side-effect-live-restored"
            ctx.emit("effect-drift", tool=call.name, call_index=index, drift=drift)
    else:
        pre = _observe(resources)
    # Pinned after any restore: the snapshot is the pre-state this call really ran against.
    snapshots = {r.name: _pin(r) for r in resources}
    # Two identical side-effecting calls are two effects: keep both results.
    try:
        data, record = execute_call(
            ctx, scope, call, "miss", reason, cacheable=False, pending_key=f"effect:{key}:{index}"
        )
    except BaseException:
        # A call that raised may have written half its effect: keep what it found (and the
        # pinned snapshot of it) and what it left, on its failed node.
        with contextlib.suppress(Exception):  # never hide the call's own error
            post = _observe(resources)
            _effect_rows(ctx, scope, index, resources, mode, pre, post, snapshots, policy)
        raise
    post = _observe(resources)
    _remember_left(post)
    _effect_rows(ctx, scope, index, resources, mode, pre, post, snapshots, policy)
    return data, record


_LEFT: dict[str, dict[str, None]] = {}
"""Per resource name, the post-state digests the latest calls this process executed left
(newest last, at most 64): a later live call may replace such a state without asking."""


def _remember_left(post: dict[str, Fingerprint | None]) -> None:
    with _LOCKS_GUARD:
        for name, fp in post.items():
            if fp is None or fp.digest == ABSENT:
                continue
            seen = _LEFT.setdefault(name, {})
            seen.pop(fp.digest, None)
            seen[fp.digest] = None
            while len(seen) > 64:
                seen.pop(next(iter(seen)))


def _left_by_rewind(ctx: RunContext, name: str, digest: str, rec: EffectRecord) -> bool:
    """Whether ``digest`` (the resource's state now) is exactly what a call Rewind executed
    left: the recorded call, a call this process ran (a grid sibling), or a live fork of the
    recorded run (another process)."""
    if digest == rec.post_digest:
        return True
    with _LOCKS_GUARD:
        if digest in _LEFT.get(name, {}):
            return True
    for child in ctx.store.children(rec.run_id):
        for e in ctx.store.effects_of(child.run_id):
            if e.resource == name and e.mode == "live" and e.post_digest == digest:
                return True
    return False


def _pin(resource: Fingerprinter) -> bytes | None:
    """The resource's snapshot, or None when it cannot be read now (the call still runs; a
    ``live`` replay of it then refuses on drift instead of restoring)."""
    try:
        return resource.snapshot()
    except (OSError, RewindError):
        return None


def _observe(resources: list[Fingerprinter]) -> dict[str, Fingerprint | None]:
    """Fingerprints while recording: a resource that cannot be read now gets None (no
    fingerprint captured, so the audit says ``audit-incomplete``), never a guess."""
    out: dict[str, Fingerprint | None] = {}
    for r in resources:
        try:
            out[r.name] = r.fingerprint()
        except FingerprintUnavailable:
            out[r.name] = None
    return out


def _verify_pre_state(
    ctx: RunContext,
    slot: LineageEntry | None,
    resources: list[Fingerprinter],
    where: str,
    name: str,
    index: int,
) -> tuple[dict[str, Fingerprint | None], list[str]]:
    """Before a ``live`` re-execution: the call's slot (node position + call index, never its
    arguments: changed arguments must not skip the check) must find every resource in the
    recorded pre-state, restoring the pinned snapshot where it drifted.

    Returns:
        (the pre-state the call runs against, one ``"resource found→recorded"`` line per drifted
        and restored resource).
    Raises:
        EffectPreconditionFailed: no recorded call at this slot, a resource without a recorded
            pre-state, one that cannot be fingerprinted now, or a drifted one without a snapshot
            (or whose restore would delete data; see :data:`RESTORE_MODES`).
    """
    fix = "replay with --effects recorded or --effects dry-run"
    if not resources:
        raise EffectPreconditionFailed(
            f"{where}{name!r} declares no resource, so nothing can verify the pre-state it "
            "would re-execute against",
            "declare what it touches with @rewind.tool(..., resources=...), or "
            + fix[0].lower()
            + fix[1:],
        )
    if slot is None:
        raise EffectPreconditionFailed(
            f"{where}{name!r} (call {index} of the node) has no recorded execution at this "
            "place in the source run, so its pre-state cannot be verified",
            fix,
        )
    rows = [
        e
        for e in ctx.store.effects_of(slot.run_id)
        if e.position == slot.position and e.call_index == slot.call_index
    ]
    pre: dict[str, Fingerprint | None] = {}
    drift: list[str] = []
    for r in resources:
        rec = _recorded_pre_state(ctx, rows, r, where, name, fix)
        try:
            now = r.fingerprint()
        except FingerprintUnavailable as exc:
            raise EffectPreconditionFailed(
                f"{where}cannot verify the pre-state of {r.name} before re-executing {name!r}: "
                f"{exc.message}",
                exc.hint or fix,
            ) from exc
        if now.digest == rec.pre_digest:
            pre[r.name] = now
            continue
        pre[r.name], found = _restore_pre_state(ctx, r, rec, now, where, name, fix)
        drift.append(found)
        ctx.emit(
            "warning",
            run_id=ctx.run_id,
            message=f"{where}restored {found} from the pinned snapshot before re-executing "
            f"{name!r}: what was found there is replaced",
        )
    return pre, drift


def _recorded_pre_state(
    ctx: RunContext,
    rows: list[EffectRecord],
    r: Fingerprinter,
    where: str,
    name: str,
    fix: str,
) -> EffectRecord:
    """The slot's effect row of resource ``r``, with a recorded pre-state.

    Only the same resource: a call that now touches another folder is a new effect, and the
    recorded folder's snapshot must never be restored into it."""
    rec = next(
        (
            e
            for e in rows
            if e.kind == r.kind and same_resource(r.name, ctx.run_id, e.resource, e.run_id)
        ),
        None,
    )
    if rec is None or rec.pre_digest is None:
        touched = ", ".join(sorted(e.resource for e in rows)) or "nothing"
        raise EffectPreconditionFailed(
            f"{where}the source run recorded no pre-state of {r.name} for {name!r} (that "
            f"call touched {touched}): a call on another resource is a new effect",
            fix,
        )
    return rec


def _restore_pre_state(
    ctx: RunContext,
    r: Fingerprinter,
    rec: EffectRecord,
    now: Fingerprint,
    where: str,
    name: str,
    fix: str,
) -> tuple[Fingerprint, str]:
    """Restore a drifted resource from the slot's pinned snapshot: (its fingerprint after, the
    ``"resource: found …, recorded …"`` line with what changed)."""
    assert rec.pre_digest is not None
    found = f"{r.name}: found {now.digest[:12]}, recorded {rec.pre_digest[:12]}"
    if rec.snapshot_hash is None:
        raise EffectPreconditionFailed(
            f"{where}{r.name} is not in the state {name!r} was recorded against "
            f"(pre-state {now.digest[:12]} vs recorded {rec.pre_digest[:12]}) and there is "
            "no pinned snapshot to restore it from (a SQLite table, or a folder over "
            "FileTree.max_snapshot_bytes or holding special files)",
            "restore the resource, or replay with --effects recorded or --effects dry-run",
        )
    # Data outside the snapshot may go only when the user asked for it, or when the world
    # holds exactly what a call Rewind executed left (the recorded call, a grid sibling, an
    # earlier live fork of the same slot): then that call wrote the data, not a person.
    replace = ctx.restore_mode == "replace" or _left_by_rewind(ctx, r.name, now.digest, rec)
    snapshot = ctx.store.get_blob(rec.snapshot_hash)
    try:
        changes = r.changes_from(snapshot)
    except (OSError, ValueError):
        changes = []
    r.restore(snapshot, replace=replace)
    after = r.fingerprint()
    if after.digest != rec.pre_digest:
        raise EffectPreconditionFailed(
            f"{where}restoring {r.name} did not give the recorded pre-state of {name!r} "
            f"({after.digest[:12]} vs {rec.pre_digest[:12]})",
            fix,
        )
    if changes:
        shown = ", ".join(changes[:5]) + (f" (+{len(changes) - 5} more)" if changes[5:] else "")
        found += f" ({shown})"
    return after, found


def same_resource(name: str, run_id: str, other: str, other_run_id: str) -> bool:
    """Whether resource ``name`` touched by run ``run_id`` is the resource ``other`` touched by
    run ``other_run_id``: the same name, or a run-scoped name (a run's own artifact folder holds
    the run id) that differs only by the run id."""
    if name == other:
        return True
    return (
        bool(other_run_id) and other_run_id in other and other.replace(other_run_id, run_id) == name
    )


def _effect_rows(
    ctx: RunContext,
    scope: NodeScope | None,
    index: int,
    resources: list[Fingerprinter],
    mode: str,
    pre: dict[str, Fingerprint | None] | None,
    post: dict[str, Fingerprint | None] | None,
    snapshots: dict[str, bytes | None] | None,
    policy: CallPolicy,
) -> None:
    if scope is None:
        return
    for r in resources:
        snap = (snapshots or {}).get(r.name)
        snap_hash = sha256_hex(snap) if snap is not None else None
        scope.effects.append(
            {
                "run_id": ctx.run_id,
                "position": scope.position,
                "call_index": index,
                "resource": r.name,
                "kind": r.kind,
                "mode": mode,
                "pre_digest": _digest(pre, r.name),
                "pre_epoch": _epoch(pre, r.name),
                "post_digest": _digest(post, r.name),
                "post_epoch": _epoch(post, r.name),
                "snapshot_hash": snap_hash,
                "idempotency_key": policy.idempotency_key,
                "spec_json": canonical_bytes(r.spec()).decode() if r.spec() else None,
                "_snapshot": snap,
            }
        )


def _digest(observed: dict[str, Fingerprint | None] | None, name: str) -> str | None:
    fp = (observed or {}).get(name)
    return None if fp is None else fp.digest


def _epoch(observed: dict[str, Fingerprint | None] | None, name: str) -> str | None:
    fp = (observed or {}).get(name)
    return None if fp is None else fp.epoch


__all__ = [  # the fingerprint names are re-exported: rewind.effects stays their public home
    "ABSENT",
    "EFFECT_MODES",
    "RESTORE_MODES",
    "EffectPreconditionFailed",
    "EffectsMode",
    "FileTree",
    "Fingerprint",
    "FingerprintUnavailable",
    "Fingerprinter",
    "HttpResource",
    "SQLiteTable",
    "SideEffectBlocked",
    "idempotency_key",
    "same_resource",
    "side_effect_call",
]
