"""Submissions, and durable_tasks' tables at version 3, in one revision."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from durable_tasks import migrations

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "submissions",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("verdict", sa.String(16)),
    )
    migrations.upgrade(op, to=3)  # pinned: this revision does the same after a durable_tasks upgrade


def downgrade() -> None:
    op.drop_table("submissions")  # durable_tasks' steps only go forward: its tables stay
