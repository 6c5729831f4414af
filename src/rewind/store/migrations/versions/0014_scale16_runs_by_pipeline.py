"""An index of runs by pipeline and creation time.

A traced chain replayed through the cache finds its source trace among the pipeline's newest
completed runs (``rewind.tracing.tracer_source.find_source``: ``pipeline = ? AND status =
'completed' ORDER BY created_at DESC LIMIT n``). Without an index SQLite scans every run row and
sorts: 1.4 ms per query at 10^4 stored runs (a traced replay's cost grew 1.29x from 10^3 cached
calls to the same plus 10^4 runs in ``benchmarks/store_scaling.py``); with it, 0.004 ms.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_runs_pipeline_created", "runs", ["pipeline", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_pipeline_created", table_name="runs")
