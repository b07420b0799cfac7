"""apps: the resolved operations, stored at registration

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 12:00:00.000000

Rows registered before stay NULL here; agentloop.store.apps resolves such a row's document the first
time it is used and stores the result (a migration cannot know the limits the service runs with).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("apps", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("operations", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True)
        )
        batch_op.add_column(
            sa.Column("operation_ids", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("apps", schema=None) as batch_op:
        batch_op.drop_column("operation_ids")
        batch_op.drop_column("operations")
