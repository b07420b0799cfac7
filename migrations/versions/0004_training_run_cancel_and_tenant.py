"""training runs: cancel_requested, and the tenant whose admin started a run

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 09:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("training_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tenant_id", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("cancel_requested", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.create_index(batch_op.f("ix_training_runs_tenant_id"), ["tenant_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_training_runs_tenant_id_tenants"), "tenants", ["tenant_id"], ["id"], ondelete="CASCADE"
        )


def downgrade() -> None:
    with op.batch_alter_table("training_runs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_training_runs_tenant_id_tenants"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_training_runs_tenant_id"))
        batch_op.drop_column("cancel_requested")
        batch_op.drop_column("tenant_id")
