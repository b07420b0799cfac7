"""tenants learn apart: adapters owned by a tenant, the tenant's training settings, rotated keys

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04 00:00:00.000000

An adapter belongs to the tenant whose run trained it (NULL: the deployment's shared adapter, what every
existing row becomes); each owner has its own active version. A tenant may let shared runs train on its data
(`share_training`, off) and may choose the base model over the shared adapter (`serve_base`). A rotated API
key stays valid until `expires_at`. A training run records the logged episodes it read (`trained_on`).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("share_training", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(sa.Column("serve_base", sa.Boolean(), server_default=sa.false(), nullable=False))
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tenant_id", sa.String(length=36), nullable=True))
        batch_op.create_index(batch_op.f("ix_adapters_tenant_id"), ["tenant_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_adapters_tenant_id_tenants"), "tenants", ["tenant_id"], ["id"], ondelete="CASCADE"
        )
    with op.batch_alter_table("training_runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "trained_on",
                sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                server_default="{}",
                nullable=False,
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("training_runs", schema=None) as batch_op:
        batch_op.drop_column("trained_on")
    with op.batch_alter_table("adapters", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_adapters_tenant_id_tenants"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_adapters_tenant_id"))
        batch_op.drop_column("tenant_id")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("expires_at")
    with op.batch_alter_table("tenants", schema=None) as batch_op:
        batch_op.drop_column("serve_base")
        batch_op.drop_column("share_training")
