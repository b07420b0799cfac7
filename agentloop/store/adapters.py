"""Data functions for adapter versions. The caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.store.models import Adapter


def active_adapter(session: Session, base_model: str) -> Adapter | None:
    return session.scalars(
        sa.select(Adapter).where(Adapter.base_model == base_model, Adapter.status == "active")
    ).first()


def list_adapters(session: Session, base_model: str | None = None) -> Sequence[Adapter]:
    stmt = sa.select(Adapter).order_by(Adapter.base_model, Adapter.version.desc())
    if base_model:
        stmt = stmt.where(Adapter.base_model == base_model)
    return session.scalars(stmt).all()


def get_adapter(session: Session, name: str) -> Adapter | None:
    return session.scalars(sa.select(Adapter).where(Adapter.name == name)).first()
