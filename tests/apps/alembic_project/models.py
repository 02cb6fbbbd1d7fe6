"""The application's own tables, on its own metadata (what its autogenerate compares)."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()
sa.Table(
    "submissions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("verdict", sa.String(16)),
)
