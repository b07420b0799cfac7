"""Data functions for tenants' own settings. The caller owns the transaction."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.store.models import Tenant


def sharing_tenants(session: Session) -> tuple[str, ...]:
    """The tenants that let the deployment's shared runs train on their data (`share_training`)."""
    return tuple(session.scalars(sa.select(Tenant.id).where(Tenant.share_training.is_(True)).order_by(Tenant.id)))


def get_tenant(session: Session, tenant_id: str) -> Tenant | None:
    return session.get(Tenant, tenant_id)
