"""Baseline: the schema of stores made before migrations (``meta.schema_version`` 2).

Tables as ``rewind.store.schema`` declared them on 2026-11-30, plus the immutability triggers
(DESIGN rule 7: recorded node, call, effect and state rows are never edited; node rows are never
deleted). SQLite raises from the trigger body; PostgreSQL uses one PL/pgSQL function that raises
the message passed as the trigger's argument, so both backends refuse with "... immutable".

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "name"),
    )
    op.create_table(
        "blobs",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("codec", sa.String(length=8), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("hash"),
    )
    op.create_table(
        "burr_state",
        sa.Column("partition_key", sa.String(length=200), nullable=False),
        sa.Column("app_id", sa.String(length=64), nullable=False),
        sa.Column("sequence_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("fields_json", sa.Text(), nullable=False),
        sa.Column("internal_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("partition_key", "app_id", "sequence_id"),
    )
    op.create_table(
        "calls",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("call_index", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("result_hash", sa.String(length=64), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("determinism", sa.String(length=24), nullable=False),
        sa.Column("produced_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "position", "call_index"),
    )
    op.create_table(
        "edges",
        sa.Column("pipeline", sa.String(length=200), nullable=False),
        sa.Column("src", sa.String(length=200), nullable=False),
        sa.Column("dst", sa.String(length=200), nullable=False),
        sa.Column("condition", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("pipeline", "src", "dst"),
    )
    op.create_table(
        "effects",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("call_index", sa.Integer(), nullable=False),
        sa.Column("resource", sa.String(length=400), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("pre_digest", sa.String(length=64), nullable=True),
        sa.Column("pre_epoch", sa.String(length=64), nullable=True),
        sa.Column("post_digest", sa.String(length=64), nullable=True),
        sa.Column("post_epoch", sa.String(length=64), nullable=True),
        sa.Column("snapshot_hash", sa.String(length=64), nullable=True),
        sa.Column("idempotency_key", sa.String(length=128), nullable=True),
        sa.Column("spec_json", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "position", "call_index", "resource"),
    )
    op.create_table(
        "llm_cache",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("request_hash", sa.String(length=64), nullable=False),
        sa.Column("response_hash", sa.String(length=64), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "meta",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("pipeline", sa.String(length=200), nullable=False),
        sa.Column("pipeline_ref", sa.String(length=400), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("parent_run_id", sa.String(length=64), nullable=True),
        sa.Column("fork_node", sa.String(length=200), nullable=True),
        sa.Column("fork_position", sa.Integer(), nullable=True),
        sa.Column("override_json", sa.Text(), nullable=True),
        sa.Column("initial_state_hash", sa.String(length=64), nullable=True),
        sa.Column("burr_fork_app_id", sa.String(length=64), nullable=True),
        sa.Column("burr_fork_sequence_id", sa.Integer(), nullable=True),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(
            ["parent_run_id"],
            ["runs.run_id"],
        ),
        sa.PrimaryKeyConstraint("run_id"),
    )
    op.create_table(
        "tool_cache",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("tool", sa.String(length=200), nullable=False),
        sa.Column("args_hash", sa.String(length=64), nullable=False),
        sa.Column("result_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "nodes",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("sequence_id", sa.Integer(), nullable=True),
        sa.Column("src_app_id", sa.String(length=64), nullable=False),
        sa.Column("src_sequence_id", sa.Integer(), nullable=True),
        sa.Column("inherited", sa.Boolean(), nullable=False),
        sa.Column("input_hash", sa.String(length=64), nullable=False),
        sa.Column("output_hash", sa.String(length=64), nullable=True),
        sa.Column("state_hash", sa.String(length=64), nullable=True),
        sa.Column("params_json", sa.Text(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("cache_outcome", sa.String(length=16), nullable=False),
        sa.Column("cache_reason", sa.String(length=64), nullable=False),
        sa.Column("determinism", sa.String(length=24), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
        ),
        sa.PrimaryKeyConstraint("run_id", "position"),
    )
    op.create_table(
        "spans",
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("span_id", sa.String(length=16), nullable=False),
        sa.Column("parent_position", sa.Integer(), nullable=True),
        sa.Column("step_type", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error_type", sa.String(length=200), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("attributes_json", sa.Text(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("output_hash", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.run_id"],
        ),
        sa.PrimaryKeyConstraint("run_id", "position"),
    )

    op.bulk_insert(
        sa.table("meta", sa.column("key", sa.String), sa.column("value", sa.Text)),
        [{"key": "schema_version", "value": "2"}],
    )
    _create_immutability()


def downgrade() -> None:
    _drop_immutability()
    op.drop_table("spans")
    op.drop_table("nodes")
    op.drop_table("tool_cache")
    op.drop_table("runs")
    op.drop_table("meta")
    op.drop_table("llm_cache")
    op.drop_table("effects")
    op.drop_table("edges")
    op.drop_table("calls")
    op.drop_table("burr_state")
    op.drop_table("blobs")
    op.drop_table("artifacts")


# (table, trigger name, event, message): rule 7 as the database enforces it.
_IMMUTABLE = (
    ("nodes", "nodes_immutable_update", "UPDATE", "recorded node rows are immutable"),
    ("nodes", "nodes_immutable_delete", "DELETE", "recorded node rows are immutable"),
    ("calls", "calls_immutable_update", "UPDATE", "recorded call rows are immutable"),
    ("effects", "effects_immutable_update", "UPDATE", "recorded effect rows are immutable"),
    ("burr_state", "state_immutable_update", "UPDATE", "persisted state rows are immutable"),
)


def _create_immutability() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(
            "CREATE OR REPLACE FUNCTION rewind_refuse_change() RETURNS trigger"
            " LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION '%', TG_ARGV[0]; END $$"
        )
    for table, name, event, message in _IMMUTABLE:
        if dialect == "sqlite":
            # IF NOT EXISTS: pre-Alembic stores already have these exact triggers.
            op.execute(
                f"CREATE TRIGGER IF NOT EXISTS {name} BEFORE {event} ON {table}"
                f" BEGIN SELECT RAISE(ABORT, '{message}'); END"
            )
        elif dialect == "postgresql":
            op.execute(
                f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW"
                f" EXECUTE FUNCTION rewind_refuse_change('{message}')"
            )
        else:
            raise NotImplementedError(f"no immutability triggers for the {dialect} dialect")


def _drop_immutability() -> None:
    dialect = op.get_bind().dialect.name
    for table, name, _event, _message in _IMMUTABLE:
        on = f" ON {table}" if dialect == "postgresql" else ""
        op.execute(f"DROP TRIGGER IF EXISTS {name}{on}")
    if dialect == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS rewind_refuse_change()")
