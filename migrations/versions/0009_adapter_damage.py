"""adapters: the damage a serving process found in a version's files, and since when

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 06:00:00.000000

A serving process that cannot use an owner's active version (files missing, checksum wrong, not loadable)
runs that owner's episodes on the previous good version or the base model and records why here; /readyz
and /metrics report it until the files verify again.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.add_column(sa.Column("damage", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("damaged_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.drop_column("damaged_at")
        batch_op.drop_column("damage")
