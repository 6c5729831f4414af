"""Immutable records the store hands out: a run, a node execution, a call.

Built once from a row, never mutated (STYLE: an immutable value with a few verbs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

RunStatus = Literal["running", "completed", "failed", "interrupted"]
"""A run's status, stored as this string."""

RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)

_new = object.__new__


_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (no UTF-8 form: no store backend can write it);
    ASCII text is answered without a scan."""
    return not text.isascii() and _SURROGATE.search(text) is not None


MAX_NAME_CHARS = 200
"""The longest name (trace or pipeline, step or node, model or tool) a store keeps: its name
columns are ``varchar(200)`` on PostgreSQL."""
NAME_RULE = f"of 1 to {MAX_NAME_CHARS} characters without NUL (UTF-8)"
"""What :func:`storable_name` accepts, as refusals say it."""


def storable_string(value: object, max_chars: int) -> bool:
    """Whether every store backend keeps ``value`` in a ``varchar(max_chars)`` column: a
    ``str`` of 1 to ``max_chars`` characters, without NUL, encodable as UTF-8.

    SQLite keeps any string; PostgreSQL refuses a NUL or a longer value when the row is
    written, and no backend can encode a lone surrogate. Such a value is refused where it is
    given, before any work is spent, so a run is never kept on one backend and lost on the other.
    """
    if not isinstance(value, str) or not 0 < len(value) <= max_chars or "\x00" in value:
        return False
    return not has_lone_surrogate(value)


def storable_name(name: object) -> bool:
    """Whether every store backend keeps ``name`` in a name column (:func:`storable_string`
    with :data:`MAX_NAME_CHARS`)."""
    return storable_string(name, MAX_NAME_CHARS)


def storable_text(text: str) -> str:
    """``text`` (an error message, an exception's type name) as every store backend keeps it:
    each NUL written ``\\u0000`` (PostgreSQL text holds no NUL) and each lone surrogate as its
    ``\\udXXX`` escape (it has no UTF-8 form). Other text is returned unchanged.

    Error text comes from the user's exceptions (a file name decoded with ``surrogateescape``,
    bytes read as text): it is written down, never refused, since refusing it would lose the run.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\\u0000")
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def stored_name(text: str) -> str:
    """``text`` (a name from a foreign system: an imported span's, model's or tool's) as a name
    column keeps it on every backend: :func:`storable_text`, cut to :data:`MAX_NAME_CHARS`."""
    return storable_text(text)[:MAX_NAME_CHARS]


def _params(text: str | None) -> dict[str, Any]:
    """A node's params from ``params_json`` (most nodes have none: ``{}``, not parsed)."""
    return json.loads(text) if text and text != "{}" else {}


@dataclass(frozen=True)
class RunRecord:
    """One execution of a pipeline.

    ``run_id`` equals the Burr ``app_id``. ``parent_run_id``/``fork_node``/``override`` are set for
    forks. Token totals are tokens actually spent by this run (cache hits count 0); latency in ms.
    Timestamps are unix seconds.
    """

    run_id: str
    pipeline: str
    pipeline_ref: str
    status: str
    parent_run_id: str | None
    fork_node: str | None
    fork_position: int | None
    override: dict[str, Any] | None
    initial_state_hash: str | None
    burr_fork_app_id: str | None
    burr_fork_sequence_id: int | None
    config: dict[str, Any]
    created_at: float
    finished_at: float | None
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    error: str | None
    launch: dict[str, Any] = field(default_factory=dict)
    """How the run was launched: ``{"inputs": {...}, "halt_after": [...], "halt_before": [...]}``
    (Burr runtime inputs and halt conditions; a fork replays them, with its input override);
    a fork adds ``"effects"``, its side-effect mode."""
    last_audit: dict[str, Any] | None = None
    """The run's last effect audit (``{"label", "against", "note", "counts", "audited_at"}``;
    ``label`` is ``admissible``, ``vacuous`` or ``not-admissible``), None when never audited."""
    spawning_run_id: str | None = None
    """For the run of a Burr sub-application (``MapStates``/``MapActions`` child, recursive app):
    the run whose node spawned it; None for a top-level run."""
    spawning_position: int | None = None
    """The spawning node's position (0-based) in ``spawning_run_id``."""
    spawn_key: str | None = None
    """Which child of that node execution this is, stable across forks of the spawning run
    (the worker lane it was built in, then its order in that lane: ``"2.0"``, ``"1"``)."""
    created_by: str | None = None
    """The user the run belongs to (:mod:`rewind.store.users`); None: an unowned local run."""

    @property
    def effects_mode(self) -> str:
        """How the run treated side-effecting calls: ``record`` (a recorded run executes them),
        or a fork's ``recorded`` / ``dry-run`` / ``live``."""
        if self.parent_run_id is None:
            return "record"
        return str(self.launch.get("effects", "recorded"))

    @property
    def admissible(self) -> str | None:
        """The last audit's label (``admissible``, ``vacuous``, ``not-admissible``), or None."""
        return None if self.last_audit is None else str(self.last_audit["label"])

    @property
    def is_sub_run(self) -> bool:
        """True for the run of a Burr sub-application (see ``spawning_run_id``)."""
        return self.spawning_run_id is not None

    @property
    def tokens(self) -> int:
        """Prompt + completion tokens spent by this run."""
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_row(cls, row: Any) -> RunRecord:
        m = row._mapping
        return cls(
            run_id=m["run_id"],
            pipeline=m["pipeline"],
            pipeline_ref=m["pipeline_ref"],
            status=m["status"],
            parent_run_id=m["parent_run_id"],
            fork_node=m["fork_node"],
            fork_position=m["fork_position"],
            override=json.loads(m["override_json"]) if m["override_json"] else None,
            initial_state_hash=m["initial_state_hash"],
            burr_fork_app_id=m["burr_fork_app_id"],
            burr_fork_sequence_id=m["burr_fork_sequence_id"],
            config=json.loads(m["config_json"] or "{}"),
            created_at=m["created_at"],
            finished_at=m["finished_at"],
            prompt_tokens=m["prompt_tokens"],
            completion_tokens=m["completion_tokens"],
            latency_ms=m["latency_ms"],
            error=m["error"],
            launch=json.loads(m["launch_json"] or "{}"),
            spawning_run_id=m.get("spawning_run_id"),
            spawning_position=m.get("spawning_position"),
            spawn_key=m.get("spawn_key"),
            created_by=m.get("created_by"),
        )


NOT_ANSWERS = ("served", "dry-run", "failed")
"""Call outcomes whose ``result_hash`` is no answer a replay may serve from lineage: a side
effect served from record or only logged, and a model call that raised (``failed``, its
``result_hash`` names the failure's document: :func:`rewind.call.failure_bytes`)."""


@dataclass(frozen=True)
class CallRecord:
    """One LLM or tool call a node made, with its cache outcome.

    ``key`` is the cache key (DESIGN rule 5); ``request_hash``/``result_hash`` reference blobs.
    ``outcome`` is ``hit`` or ``miss``; ``reason`` says which rule decided (rule 6). Tokens are the
    tokens spent (0 on a hit); latency in ms.
    """

    call_index: int
    kind: str
    name: str
    key: str
    request_hash: str
    result_hash: str | None
    outcome: str
    reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    determinism: str = "deterministic"
    produced_at: float | None = None

    @property
    def label(self) -> str:
        """``outcome:reason`` as shown to people (``hit``, ``miss:new-input``,
        ``served:side-effect-recorded``, ``bypass:stability``…)."""
        return (
            self.outcome if self.reason in ("", self.outcome) else f"{self.outcome}:{self.reason}"
        )

    @classmethod
    def from_row(cls, row: Any) -> CallRecord:
        """The record of a ``calls`` row.

        Built without the dataclass ``__init__`` (a frozen one sets each field through
        ``object.__setattr__``): a fork reads every call of its parent (measured: 5.7 -> 3.1 µs
        a row). Every field is set, as ``__init__`` would."""
        m = row._mapping
        record = _new(cls)
        record.__dict__.update(
            call_index=m["call_index"],
            kind=m["kind"],
            name=m["name"],
            key=m["key"],
            request_hash=m["request_hash"],
            result_hash=m["result_hash"],
            outcome=m["outcome"],
            reason=m["reason"],
            prompt_tokens=m["prompt_tokens"],
            completion_tokens=m["completion_tokens"],
            latency_ms=m["latency_ms"],
            determinism=m["determinism"],
            produced_at=m["produced_at"],
        )
        return record


@dataclass(frozen=True)
class EffectRecord:
    """Pre- and post-call fingerprints of one resource touched by one side-effecting call.

    ``mode`` is how the call was treated: ``record`` (original run), ``live`` (re-executed),
    ``recorded`` (served from record, not re-executed) or ``dry-run``. A ``None`` post digest
    means no post-state was captured.
    """

    run_id: str
    position: int
    call_index: int
    resource: str
    kind: str
    mode: str
    pre_digest: str | None
    pre_epoch: str | None
    post_digest: str | None
    post_epoch: str | None
    snapshot_hash: str | None
    idempotency_key: str | None
    spec: dict[str, Any] | None = None

    @classmethod
    def from_row(cls, row: Any) -> EffectRecord:
        m = row._mapping
        fields = {k: m[k] for k in cls.__dataclass_fields__ if k != "spec"}
        return cls(**fields, spec=json.loads(m["spec_json"]) if m["spec_json"] else None)


@dataclass(frozen=True)
class NodeRecord:
    """One node execution ("step") of a run.

    ``position`` is the 0-based order in the run; ``sequence_id`` the Burr sequence id of the
    persisted state row; ``src_app_id``/``src_sequence_id`` name the app and row that actually
    produced this node (for inherited nodes of a fork: the ancestor's). Hashes are sha256 hex of
    canonical JSON: ``input_hash`` covers node name, the state fields it reads, its inputs and
    params; ``output_hash`` the fields it wrote; ``state_hash`` the whole semantic state after it.
    ``cache_outcome`` is ``hit``, ``miss``, ``inherited``, ``override``, ``none`` (no cacheable
    call) or ``failed``; ``cache_reason`` says why. Tokens are spent tokens; latency in ms.
    """

    run_id: str
    position: int
    name: str
    sequence_id: int | None
    src_app_id: str
    src_sequence_id: int | None
    inherited: bool
    input_hash: str
    output_hash: str | None
    state_hash: str | None
    params: dict[str, Any]
    latency_ms: float
    prompt_tokens: int
    completion_tokens: int
    cache_outcome: str
    cache_reason: str
    error: str | None
    started_at: float
    calls: tuple[CallRecord, ...] = field(default=())
    determinism: str = "deterministic"

    @property
    def tokens(self) -> int:
        """Prompt + completion tokens spent by this node in this run."""
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def from_row(cls, row: Any, calls: tuple[CallRecord, ...] = ()) -> NodeRecord:
        """The record of a ``nodes`` row with its calls (built as :meth:`CallRecord.from_row`
        is: 10.4 -> 3.7 µs a row; a fork reads every node of its parent)."""
        m = row._mapping
        record = _new(cls)
        record.__dict__.update(
            run_id=m["run_id"],
            position=m["position"],
            name=m["name"],
            sequence_id=m["sequence_id"],
            src_app_id=m["src_app_id"] or m["run_id"],  # stored "" for its own run (SQLite)
            src_sequence_id=m["src_sequence_id"],
            inherited=bool(m["inherited"]),
            input_hash=m["input_hash"],
            output_hash=m["output_hash"],
            state_hash=m["state_hash"],
            params=_params(m["params_json"]),
            latency_ms=m["latency_ms"],
            prompt_tokens=m["prompt_tokens"],
            completion_tokens=m["completion_tokens"],
            cache_outcome=m["cache_outcome"],
            cache_reason=m["cache_reason"],
            error=m["error"],
            started_at=m["started_at"],
            calls=calls,
            determinism=m["determinism"],
        )
        return record


@dataclass(frozen=True)
class RunGraph:
    """What a run ran: its graph document and, for a fork, the drift it ran with.

    ``document`` is the graph document of :func:`rewind.drift.graph_document` (nodes → code
    sha256, transitions, entrypoint, param check); ``drift`` is ``GraphDrift.to_json()`` of a
    fork (``{"structural": [...], "code_changed": [...], "param_check_changed": bool}``), or
    None for a recorded run.
    """

    run_id: str
    graph_hash: str
    document: dict[str, Any]
    drift: dict[str, Any] | None = None
