"""Model calls that raised are call rows (``failed:raised`` / ``failed:replayed``).

Since this revision a model call that raised (``EndpointUnavailable``, ``ModelCallError``) is
recorded as a ``calls`` row whose ``outcome`` is ``failed`` and whose ``result_hash`` names its
error's document (``{"error", "message", "hint"}``, :func:`rewind.call.failure_bytes`), and a
replay raises it again from there (:mod:`rewind.cache`). The table's columns do not change: the
revision exists so that a Rewind from before it refuses such a store ("unknown revision")
instead of reading a failed row as an answered call, serving the error's document as the
model's answer (it failed with "answered without choices", a false message, and wrote ``hit``
rows naming that document, which later Rewinds would serve as answers too).

A downgrade deletes the ``failed`` call rows (before this revision a call that raised left no
row, and a replay sent it again: ``miss:source-failed``); the documents they named are left to
``rewind gc``. Upgrading changes nothing: older stores have no such rows.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FAILED = "failed"
"""The ``calls.outcome`` of a model call that raised (``rewind.call``'s, frozen here)."""


def upgrade() -> None:
    """Nothing to change: the revision marks stores that may hold failed call rows."""


def downgrade() -> None:
    """Delete the failed call rows, which revision 0016's readers take for answers."""
    op.get_bind().execute(sa.text("DELETE FROM calls WHERE outcome = :o"), {"o": FAILED})
