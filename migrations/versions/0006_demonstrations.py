"""demonstrations: uploaded expert trajectories, replayed on their task's world

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 10:00:00.000000

`actions` becomes `steps` (each step keeps its observation); a demonstration records the seed of a free
instruction's world, whether its steps were replayed, and the client's metadata. `answer` and `source`
go: the answer is the argument of the last step (supervisor.complete_task), and every row is an upload.
Listing a tenant's demonstrations newest first uses (tenant_id, created_at).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("demonstrations", schema=None) as batch_op:
        batch_op.alter_column("actions", new_column_name="steps")
        batch_op.drop_column("answer")
        batch_op.drop_column("source")
        batch_op.add_column(sa.Column("seed", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("replayed", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.add_column(
            sa.Column(
                "metadata",
                sa.JSON().with_variant(postgresql.JSONB(), "postgresql"),
                server_default="{}",
                nullable=False,
            )
        )
        batch_op.drop_index(batch_op.f("ix_demonstrations_tenant_id"))
        batch_op.create_index("ix_demonstrations_tenant_created", ["tenant_id", "created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("demonstrations", schema=None) as batch_op:
        batch_op.drop_index("ix_demonstrations_tenant_created")
        batch_op.create_index(batch_op.f("ix_demonstrations_tenant_id"), ["tenant_id"], unique=False)
        batch_op.drop_column("metadata")
        batch_op.drop_column("replayed")
        batch_op.drop_column("seed")
        batch_op.add_column(sa.Column("source", sa.String(length=16), server_default="upload", nullable=False))
        batch_op.add_column(sa.Column("answer", sa.Text(), nullable=True))
        batch_op.alter_column("steps", new_column_name="actions")
