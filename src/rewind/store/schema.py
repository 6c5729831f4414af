"""The store's tables (SQLAlchemy Core) and the schema version.

One table per concept of DESIGN's vocabulary: runs, nodes (one row per node execution), calls (the
LLM and tool calls a node made, with their cache outcome), edges (the pipeline graph), the two
caches, content-addressed blobs, Burr state rows (one blob reference per top-level field) and
artifacts. Payloads never live inline in the row tables: rows carry sha256 references into
``blobs``, so an unchanged value is stored once however many runs and forks repeat it.
The immutability triggers (rule 7) live in the migrations, per dialect.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect

SCHEMA_VERSION = 2
"""The compatibility level in ``meta.schema_version``: bumped (by the migration that makes the
change) only when a store can no longer be read by older Rewinds. The schema's exact history is
Alembic's (``store/migrations``; see ``store/migrate.py``): change a table here AND add a
revision there — ``tests/test_migrations.py`` fails if the two disagree."""


class Digest(TypeDecorator[str]):
    """A sha256 as the program sees it (64 lowercase hex), kept as its 32 raw bytes on SQLite.

    The columns that name blobs and cache entries hold most of a store's bytes as hex (a traced
    step's node, call, cache and blob rows carry ~40 of them); on SQLite this type binds a
    64-lowercase-hex string as a 32-byte BLOB and reads a 32-byte BLOB back as that string, so
    every Core query (filters, ``IN``, inserts, results) sees hex as before. Any other value
    (empty, ``None``, a key of another shape, hex written before migration 0011) is stored and
    read back unchanged: a BLOB and a TEXT never compare equal, and only values that round-trip
    exactly are converted, so the two forms cannot be confused. Raw SQL (``text()``) that
    *returns* such a column must type it (``.columns(col=Digest())``) to get hex back; joins
    between two ``Digest`` columns work as before. PostgreSQL keeps ``VARCHAR(64)`` hex.
    """

    impl = String(64)
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        """64 lowercase hex → 32 bytes on SQLite; anything else unchanged."""
        return digest_bytes(value) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        """32 stored bytes → their 64 lowercase hex; anything else unchanged."""
        if type(value) is bytes and len(value) == 32:
            return value.hex()
        return value


def digest_bytes(value: Any) -> Any:
    """How :class:`Digest` stores ``value`` on SQLite: the 32 bytes of a 64-lowercase-hex string
    (exactly: ``digest_bytes(h).hex() == h``), any other value unchanged."""
    if type(value) is str and len(value) == 64:
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            return value
        if len(raw) == 32 and raw.hex() == value:
            return raw
    return value


class Usual(TypeDecorator[str]):
    """A text column whose one usual value is kept as the empty string on SQLite.

    ``nodes.determinism`` and ``calls.determinism`` are ``deterministic`` on nearly every row
    (13 of a call row's ~200 bytes: measured on peerbench's 100-step trace, the calls table
    holds 5 rows a 1 KiB page instead of 4). On SQLite this type binds ``usual`` as ``''`` and
    reads ``''`` back as ``usual``, so every Core query (filters, inserts, results) sees the
    value as before; other values are stored unchanged (the column holds one of a fixed set of
    words, never ``''`` of its own). Rows written before migration 0013 hold ``usual`` itself,
    which reads back the same. Raw SQL (``text()``) that *returns* such a column must type it
    (``.columns(col=Usual(...))``). PostgreSQL stores values as they are.
    """

    impl = String(24)
    cache_ok = True

    def __init__(self, usual: str) -> None:
        super().__init__()
        self.usual = usual

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        """``usual`` → ``''`` on SQLite; anything else unchanged."""
        return "" if value == self.usual and dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        """``''`` → ``usual``; anything else unchanged."""
        return self.usual if value == "" else value

    def stored(self, value: Any) -> Any:
        """How this type stores ``value`` on SQLite (``''`` for ``usual``)."""
        return "" if value == self.usual else value


DETERMINISTIC = "deterministic"
"""The usual ``determinism`` of a node or call row (stored as ``''`` on SQLite, :class:`Usual`)."""

USUAL_COLUMNS: dict[str, dict[str, str]] = {
    "nodes": {"determinism": DETERMINISTIC},
    "calls": {"determinism": DETERMINISTIC},
}
"""The columns typed :class:`Usual`, with their usual value (migration 0013 rewrote it as ``''``
on SQLite)."""

OWN_APP = ""
"""``nodes.src_app_id`` as SQLite stores it when it is the row's own ``run_id`` (a run's own
nodes: nearly every row; migration 0013). Rows written before hold the run id itself; readers
take both (:func:`src_app_of`)."""


def lean_node_row(row: dict[str, Any]) -> dict[str, Any]:
    """A ``nodes`` row as SQLite stores it: ``src_app_id`` :data:`OWN_APP` when it equals the
    row's ``run_id`` (32 of a ~220-byte row), else the row itself (never changed in place)."""
    if row.get("src_app_id") == row.get("run_id"):
        return {**row, "src_app_id": OWN_APP}
    return row


def src_app_of(stored: str, run_id: str) -> str:
    """A node row's source app id from its stored ``src_app_id`` and its ``run_id``."""
    return stored or run_id


DIGEST_COLUMNS: dict[str, tuple[str, ...]] = {
    "blobs": ("hash",),
    "nodes": ("input_hash", "output_hash", "state_hash"),
    "calls": ("key", "request_hash", "result_hash"),
    "llm_cache": ("key", "request_hash", "response_hash"),
    "tool_cache": ("key", "args_hash", "result_hash"),
    "blob_data": ("hash",),
}
"""The columns typed :class:`Digest` (migration 0011 converted their stored values on SQLite)."""

metadata = MetaData()

meta = Table(
    "meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
    sqlite_with_rowid=False,  # migration 0012: small rows; no separate key index
)

runs = Table(
    "runs",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("pipeline", String(200), nullable=False),
    Column("pipeline_ref", String(400), nullable=False, default=""),
    Column("status", String(16), nullable=False),  # running|completed|failed|interrupted|cancelled
    Column("parent_run_id", String(64), ForeignKey("runs.run_id"), nullable=True),
    Column("fork_node", String(200), nullable=True),
    Column("fork_position", Integer, nullable=True),
    Column("override_json", Text, nullable=True),
    Column("initial_state_hash", String(64), nullable=True),
    Column("burr_fork_app_id", String(64), nullable=True),
    Column("burr_fork_sequence_id", Integer, nullable=True),
    Column("config_json", Text, nullable=False, default="{}"),
    # how a Burr app was launched: runtime inputs, halt_after, halt_before (forks replay them)
    Column("launch_json", Text, nullable=False, default="{}"),
    Column("created_at", Float, nullable=False),  # unix seconds
    Column("finished_at", Float, nullable=True),
    Column("prompt_tokens", Integer, nullable=False, default=0),
    Column("completion_tokens", Integer, nullable=False, default=0),
    Column("latency_ms", Float, nullable=False, default=0.0),
    Column("error", Text, nullable=True),
    Column("owner", String(200), nullable=True),  # host:pid of the process executing it
    # a Burr sub-application's run: the run and node position that spawned it, and which child
    # of that node execution it is (migration 0006); None for top-level runs
    Column("spawning_run_id", String(64), nullable=True, index=True),
    Column("spawning_position", Integer, nullable=True),
    Column("spawn_key", String(64), nullable=True),
    # The user the run belongs to (rewind.store.users): the API's authenticated user, the CLI's
    # REWIND_USER, or None (an unowned local run: only admins see it over an API with users).
    Column("created_by", String(64), nullable=True, index=True),
    # What the run executes now, written by its executing process at each node start (migration
    # 0008; rewind.progress): a server that does not execute the run shows it from here.
    Column("live_node", String(200), nullable=True),
    Column("live_position", Integer, nullable=True),
    Column("live_since", Float, nullable=True),
    # JSON {"by", "at"} once a cancel was asked; the executing process stops at its next node.
    Column("cancel_requested", Text, nullable=True),
)
# A traced chain finds its source among a pipeline's newest runs (rewind.tracing.tracer_source):
# without this index that query scans every run (1.4 ms at 10^4 runs; migration 0014).
Index("ix_runs_pipeline_created", runs.c.pipeline, runs.c.created_at)

nodes = Table(
    "nodes",
    metadata,
    Column("run_id", String(64), ForeignKey("runs.run_id"), primary_key=True),
    Column("position", Integer, primary_key=True),
    Column("name", String(200), nullable=False),
    Column("sequence_id", Integer, nullable=True),
    Column("src_app_id", String(64), nullable=False),
    Column("src_sequence_id", Integer, nullable=True),
    Column("inherited", Boolean, nullable=False, default=False),
    Column("input_hash", Digest(), nullable=False),
    Column("output_hash", Digest(), nullable=True),
    Column("state_hash", Digest(), nullable=True),
    Column("params_json", Text, nullable=False, default="{}"),
    Column("latency_ms", Float, nullable=False, default=0.0),
    Column("prompt_tokens", Integer, nullable=False, default=0),
    Column("completion_tokens", Integer, nullable=False, default=0),
    Column("cache_outcome", String(16), nullable=False),
    Column("cache_reason", String(64), nullable=False, default=""),
    Column("determinism", Usual(DETERMINISTIC), nullable=False, default=DETERMINISTIC),
    Column("error", Text, nullable=True),
    Column("started_at", Float, nullable=False),
    # Migration 0015: ~190-byte rows (since 0011 and 0013) live in the key's own b-tree on
    # SQLite, not a rowid table + a copy of (run_id, position) in an index (10 pages of 41 in
    # peerbench's 100-step trace).
    sqlite_with_rowid=False,
)

calls = Table(
    "calls",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("position", Integer, primary_key=True),
    Column("call_index", Integer, primary_key=True),
    Column("kind", String(8), nullable=False),  # llm | tool
    Column("name", String(200), nullable=False),  # model or tool name
    Column("key", Digest(), nullable=False),
    Column("request_hash", Digest(), nullable=False),
    Column("result_hash", Digest(), nullable=True),
    Column("outcome", String(16), nullable=False),
    Column("reason", String(64), nullable=False, default=""),
    Column("prompt_tokens", Integer, nullable=False, default=0),
    Column("completion_tokens", Integer, nullable=False, default=0),
    Column("latency_ms", Float, nullable=False, default=0.0),
    Column("determinism", Usual(DETERMINISTIC), nullable=False, default=DETERMINISTIC),
    Column("produced_at", Float, nullable=True),  # when the result was produced (unix s)
    sqlite_with_rowid=False,  # migration 0011: rows are small; no separate key index
)

effects = Table(
    "effects",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("position", Integer, primary_key=True),
    Column("call_index", Integer, primary_key=True),
    Column("resource", String(400), primary_key=True),
    Column("kind", String(32), nullable=False),  # fingerprinter kind
    Column("mode", String(16), nullable=False),  # record | live | recorded | dry-run
    Column("pre_digest", String(64), nullable=True),
    Column("pre_epoch", String(64), nullable=True),
    Column("post_digest", String(64), nullable=True),  # None: not captured
    Column("post_epoch", String(64), nullable=True),
    Column("snapshot_hash", String(64), nullable=True),  # pinned pre-state (blob)
    Column("idempotency_key", String(128), nullable=True),
    Column("spec_json", Text, nullable=True),  # settings that rebuild the fingerprinter
)

audits = Table(
    "audits",
    metadata,
    # One row per effect audit (rewind audit, the API, verify): the run's last audit verdict is
    # its "admissible" label. A separate table: recorded run rows stay immutable (rule 7).
    Column("run_id", String(64), ForeignKey("runs.run_id"), primary_key=True),
    Column("seq", Integer, primary_key=True),  # 1, 2, … per run
    Column("audited_at", Float, nullable=False),  # unix seconds
    Column("against", String(64), nullable=True),  # reference run id, "current", or None
    Column("label", String(24), nullable=False),  # admissible | vacuous | not-admissible
    Column("note", Text, nullable=False, default=""),
    Column("counts_json", Text, nullable=False, default="{}"),
    sqlite_with_rowid=False,  # migration 0012: small rows; no separate key index
)

edges = Table(
    "edges",
    metadata,
    Column("pipeline", String(200), primary_key=True),
    Column("src", String(200), primary_key=True),
    Column("dst", String(200), primary_key=True),
    Column("condition", Text, nullable=False, default="default"),
    sqlite_with_rowid=False,  # migration 0012: small rows; no separate key index
)

run_graphs = Table(
    # What each run ran: its graph document (rewind.drift: nodes with code fingerprints,
    # transitions, entrypoint) as a blob, and for a fork the drift from its parent's recording
    # that it ran with (code changed, structural differences accepted). A table of its own, so a
    # store written before it existed gains it by migration 0003 (no version bump): runs
    # without a row fork as before, with a warning that drift cannot be checked.
    "run_graphs",
    metadata,
    Column("run_id", String(64), ForeignKey("runs.run_id"), primary_key=True),
    Column("graph_hash", String(64), nullable=False),  # blob: canonical JSON graph document
    Column("drift_json", Text, nullable=True),  # forks: GraphDrift.to_json(); None otherwise
    sqlite_with_rowid=False,  # migration 0012: small rows; no separate key index
)

llm_cache = Table(
    "llm_cache",
    metadata,
    Column("key", Digest(), primary_key=True),
    Column("model", String(200), nullable=False),
    Column("request_hash", Digest(), nullable=False),
    Column("response_hash", Digest(), nullable=False),
    Column("prompt_tokens", Integer, nullable=False, default=0),
    Column("completion_tokens", Integer, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
    Column("origin", String(64), nullable=True),  # None: recorded here; else the importing trace
    sqlite_with_rowid=False,  # migration 0011: rows are small; no separate key index
)

tool_cache = Table(
    "tool_cache",
    metadata,
    Column("key", Digest(), primary_key=True),
    Column("tool", String(200), nullable=False),
    Column("args_hash", Digest(), nullable=False),
    Column("result_hash", Digest(), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("origin", String(64), nullable=True),  # None: recorded here; else the importing trace
    sqlite_with_rowid=False,  # migration 0011: rows are small; no separate key index
)

blobs = Table(
    "blobs",
    metadata,
    Column("hash", Digest(), primary_key=True),
    Column("size", Integer, nullable=False),  # bytes before compression
    # raw|zlib|zd1|object (codec.py); x-raw|x-zlib|x-zd1: the packed bytes are in blob_data
    Column("codec", String(8), nullable=False, default="raw"),
    Column("data", LargeBinary, nullable=False),  # empty when codec is object or x-...
    Column("ref", Text, nullable=True),  # object URL when codec is object (store/objects.py)
    # Migration 0011: rows stay small (a blob's packed bytes over SPILL_MIN_BYTES live in
    # blob_data), so on SQLite they live in the hash's own b-tree, not a rowid table + an index.
    sqlite_with_rowid=False,
)

SPILL_PREFIX = "x-"
"""``blobs.codec`` of a blob whose packed bytes are in ``blob_data`` (``x-`` + their codec)."""
SPILL_MIN_BYTES = 161
"""On SQLite, packed bytes at least this long are kept in ``blob_data``: a ``blobs`` row stays
under ~230 bytes, the most a ``WITHOUT ROWID`` row keeps on a 1 KiB page before it spills to an
overflow page of its own (a rowid table packs such rows several to a page)."""

blob_data = Table(
    # The packed bytes of SQLite blobs of SPILL_MIN_BYTES or more (codec x-...), by hash.
    "blob_data",
    metadata,
    Column("hash", Digest(), primary_key=True),
    Column("data", LargeBinary, nullable=False),
)

blob_packs = Table(
    # Many small blobs of one write in one row (codec.pack_together; migration 0012): a traced
    # chain's documents (node input/output/state maps, field values), or its calls' requests
    # and results. Their ``blobs`` rows
    # (codec ``p-...``) name the pack by id. SQLite only (created empty on PostgreSQL).
    "blob_packs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("data", LargeBinary, nullable=False),  # zlib of the concatenated slices
)

blob_slices = Table(
    # A packed blob (codec.pack_together) under the first codec.SLICE_KEY_BYTES bytes of its
    # sha256 instead of a ``blobs`` row under all 32 (migration 0016): ~20 bytes a row where a
    # ``blobs`` row took ~55. A second blob whose key is taken keeps a ``blobs`` row (codec
    # ``p-...``); readers look in ``blobs`` first and check a slice's bytes against the whole
    # hash. SQLite only (created empty on PostgreSQL).
    "blob_slices",
    metadata,
    Column("key", LargeBinary, primary_key=True),
    Column("ref", LargeBinary, nullable=False),  # codec.slice_ref: pack id, offset, length[, size]
    sqlite_with_rowid=False,
)

burr_state = Table(
    "burr_state",
    metadata,
    Column("partition_key", String(200), primary_key=True),
    Column("app_id", String(64), primary_key=True),
    Column("sequence_id", Integer, primary_key=True),
    Column("position", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    Column("fields_json", Text, nullable=False),  # {field: blob sha256}, semantic fields
    Column("internal_json", Text, nullable=False, default="{}"),  # Burr's __ keys, inline
    Column("created_at", Float, nullable=False),
)

artifacts = Table(
    "artifacts",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("name", String(200), primary_key=True),
    Column("sha256", String(64), nullable=False),
    Column("size", Integer, nullable=False),  # bytes
    Column("path", Text, nullable=False),  # relative to the store's folder
    sqlite_with_rowid=False,  # migration 0012: small rows; no separate key index
)

spans = Table(
    # What a traced chain knows about its steps beyond a node row (rewind.tracing): a trace IS a
    # run and each step IS a node row at the same position; this row adds the step type, the
    # trace vocabulary's status, nesting, the OpenTelemetry span id, attributes (model,
    # finish_reason, scores...) and the exception. Position -1 is the trace itself (the root
    # span): its row carries the chain's status, duration and output. A run with a position -1
    # row is a trace.
    "spans",
    metadata,
    Column("run_id", String(64), ForeignKey("runs.run_id"), primary_key=True),
    Column("position", Integer, primary_key=True),
    Column("span_id", String(16), nullable=False),  # 16 hex
    Column("parent_position", Integer, nullable=True),  # -1: top-level step; None: the root
    Column("step_type", String(16), nullable=False),  # llm_call | retrieval | ... | chain
    Column("status", String(16), nullable=False),  # pending | running | success | failed | skipped
    Column("error_type", String(200), nullable=True),
    Column("error_message", Text, nullable=True),
    Column("attributes_json", Text, nullable=False, default="{}"),
    Column("started_at", Float, nullable=True),  # unix seconds
    Column("ended_at", Float, nullable=True),
    Column("duration_ms", Float, nullable=False, default=0.0),
    Column("output_hash", String(64), nullable=True),  # root only: blob of the chain's output
    # root only: the trace's step spans packed (rewind.store.spans; migration 0012); None when
    # they are rows of their own (written before 0012, or not packable)
    Column("steps", LargeBinary, nullable=True),
    sqlite_with_rowid=False,  # migration 0012: small rows; no separate key index
)

archived_runs = Table(
    # Runs ``rewind gc`` moved to the object store (rewind.store.retention): one self-contained
    # archive document per run; ``rewind archive restore RUN`` reads it back, verified against
    # ``archive_sha256``. The run's own rows are gone while this row exists.
    "archived_runs",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("parent_run_id", String(64), nullable=True),
    Column("pipeline", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    Column("created_at", Float, nullable=False),  # the run's, unix seconds
    Column("archived_at", Float, nullable=False),  # unix seconds
    Column("archive_ref", Text, nullable=False),  # the archive object's URL
    Column("archive_sha256", String(64), nullable=False),  # of the archive's bytes
    Column("archive_bytes", Integer, nullable=False),
)

archive_permits = Table(
    # The one sanctioned exception to node immutability: the nodes delete trigger lets a row go
    # only while its run has a permit row, which gc inserts and deletes inside its own
    # transaction (never committed, never seen by another transaction).
    "archive_permits",
    metadata,
    Column("run_id", String(64), primary_key=True),
    sqlite_with_rowid=False,  # migration 0015: an empty table; no separate key index
)

users = Table(
    # People (and services) who call the HTTP API (rewind.store.users): only a SHA-256 of each
    # bearer token is kept, never the token. A user is revoked, never deleted, so the runs they
    # created keep naming them.
    "users",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("token_hash", String(64), nullable=False, unique=True),  # sha256 hex of the token
    Column("team", String(64), nullable=True),  # runs are visible to users of the same team
    Column("admin", Boolean, nullable=False, default=False),  # sees every run
    Column("created_at", Float, nullable=False),  # unix seconds
    Column("revoked_at", Float, nullable=True),  # set: the token is refused
    sqlite_with_rowid=False,  # migration 0012: small rows; no separate key index
)

jobs = Table(
    # Long-running work the API accepted (record, fork): what to do (the job description as
    # JSON) and where it is — queued, running, succeeded, failed — whether an in-process worker
    # thread or a Celery worker executes it. Rows change as the job moves (unlike runs).
    "jobs",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("kind", String(24), nullable=False),  # record | fork
    Column("run_id", String(64), nullable=False),  # the run of the current attempt
    Column("state", String(16), nullable=False),  # queued | running | succeeded | failed
    Column("attempts", Integer, nullable=False, default=0),
    Column("spec_json", Text, nullable=False),  # rewind.jobs.Job.to_json()
    Column("error", Text, nullable=True),
    Column("worker", String(200), nullable=True),  # host:pid of the last executing process
    Column("runs_json", Text, nullable=False, default="[]"),  # run ids of earlier attempts
    Column("created_at", Float, nullable=False),  # unix seconds
    Column("started_at", Float, nullable=True),
    Column("finished_at", Float, nullable=True),
)
