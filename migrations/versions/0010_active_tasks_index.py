"""tasks: an index of each tenant's queued and running tasks (the active-task quota counts them per request)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 02:00:00.000000

`POST /v1/tasks` counts the tenant's queued and running tasks before it inserts one. Without this partial
index the count walked every task the tenant ever sent; with it, only the active ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ACTIVE = sa.text("status IN ('queued', 'running')")


def upgrade() -> None:
    op.create_index("ix_tasks_tenant_active", "tasks", ["tenant_id"], postgresql_where=ACTIVE, sqlite_where=ACTIVE)


def downgrade() -> None:
    op.drop_index("ix_tasks_tenant_active", table_name="tasks")
