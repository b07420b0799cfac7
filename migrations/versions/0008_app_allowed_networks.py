"""apps: the private networks an app may be called on (allowed_networks) instead of allow_private

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 05:00:00.000000

`allow_private` let an app call any non-global address but multicast. It becomes the list of networks an
operator names; an app that had it gets loopback and the private ranges below: link-local (169.254.0.0/16,
fe80::/10) is no longer allowed to any app. Downgrading turns a non-empty list back into allow_private.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PRIVATE_NETWORKS = [
    "127.0.0.0/8",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "::1/128",
    "fc00::/7",
]
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("apps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("allowed_networks", JSON, server_default="[]", nullable=False))
    apps = sa.table("apps", sa.column("allow_private", sa.Boolean()), sa.column("allowed_networks", JSON))
    op.execute(apps.update().where(apps.c.allow_private.is_(True)).values(allowed_networks=PRIVATE_NETWORKS))
    with op.batch_alter_table("apps", schema=None) as batch_op:
        batch_op.drop_column("allow_private")


def downgrade() -> None:
    with op.batch_alter_table("apps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("allow_private", sa.Boolean(), server_default=sa.false(), nullable=False))
    apps = sa.table("apps", sa.column("id", sa.String()), sa.column("allowed_networks", JSON))
    allowing = [
        row.id for row in op.get_bind().execute(sa.select(apps.c.id, apps.c.allowed_networks)) if row.allowed_networks
    ]
    if allowing:
        flags = sa.table("apps", sa.column("id", sa.String()), sa.column("allow_private", sa.Boolean()))
        op.execute(flags.update().where(flags.c.id.in_(allowing)).values(allow_private=True))
    with op.batch_alter_table("apps", schema=None) as batch_op:
        batch_op.drop_column("allowed_networks")
