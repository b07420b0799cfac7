"""Data functions for adapter versions. The caller owns the transaction.

An adapter belongs to a tenant (its runs trained it) or to the deployment (`tenant_id` None: the shared
adapter). Each owner has at most one active version per base model; a tenant's episodes run on its own
active version, else on the shared one (unless the tenant chose the base model), else on the base model."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.store.models import Adapter, Tenant, utcnow


def owned_by(tenant_id: str | None) -> sa.ColumnElement[bool]:
    return Adapter.tenant_id.is_(None) if tenant_id is None else Adapter.tenant_id == tenant_id


def active_adapter(session: Session, base_model: str, tenant_id: str | None = None) -> Adapter | None:
    """The owner's active version (`tenant_id` None: the shared one); no fallback."""
    return session.scalars(
        sa.select(Adapter).where(Adapter.base_model == base_model, Adapter.status == "active", owned_by(tenant_id))
    ).first()


def serving_adapter(session: Session, base_model: str, tenant_id: str | None) -> Adapter | None:
    """What a tenant's episodes run on: its own active version, else the shared one unless it chose the base
    model, else None (the base model). `tenant_id` None: the shared one. The head of `serving_chain`."""
    chain = serving_chain(session, base_model, tenant_id)
    return chain[0] if chain else None


FALLBACKS_PER_OWNER = 3  # earlier versions tried when the one served cannot be used


def serving_chain(session: Session, base_model: str, tenant_id: str | None) -> list[Adapter]:
    """What the owner's episodes may run on, best first: the version it is served (`serving_adapter`), then
    the versions its owner had active before, latest first; for a tenant not on the base model, then the
    shared ones likewise. Past the end: the base model. A serving process takes the first it can load."""
    owners: list[str | None] = [tenant_id]
    if tenant_id is not None and not session.scalar(sa.select(Tenant.serve_base).where(Tenant.id == tenant_id)):
        owners.append(None)
    chain: list[Adapter] = []
    for owner in owners:
        stmt = (
            sa.select(Adapter)
            .where(Adapter.base_model == base_model, owned_by(owner))
            .where(
                sa.or_(Adapter.status == "active", (Adapter.status == "retired") & Adapter.activated_at.is_not(None))
            )
            .order_by((Adapter.status == "active").desc(), Adapter.activated_at.desc().nulls_last())
            .limit(FALLBACKS_PER_OWNER + 1)
        )
        rows = list(session.scalars(stmt))
        if rows and rows[0].status == "active":  # an owner with none active (base chosen, or none yet) serves none
            chain.extend(rows)
    return chain


def record_damage(session: Session, adapter_id: int, why: str | None) -> None:
    """Store why a version's files cannot be used (None: they verify again)."""
    values: dict[str, object] = {"damage": why, "damaged_at": utcnow() if why else None}
    stmt = sa.update(Adapter).where(Adapter.id == adapter_id)
    if why is None:
        stmt = stmt.where(Adapter.damage.is_not(None))
    else:
        stmt = stmt.where(sa.or_(Adapter.damage.is_(None), Adapter.damage != why))
    session.execute(stmt.values(**values).execution_options(synchronize_session=False))


def damaged_active(session: Session) -> Sequence[Adapter]:
    """Active versions a serving process found damaged (their owners' episodes run on a fallback)."""
    return session.scalars(sa.select(Adapter).where(Adapter.status == "active", Adapter.damage.is_not(None))).all()


def active_names(session: Session, base_model: str) -> set[str]:
    """Every owner's active version of `base_model`."""
    stmt = sa.select(Adapter.name).where(Adapter.base_model == base_model, Adapter.status == "active")
    return set(session.scalars(stmt))


def list_adapters(
    session: Session, base_model: str | None = None, tenant_id: str | None = None, *, every_owner: bool = False
) -> Sequence[Adapter]:
    """One owner's versions (`tenant_id` None: the shared ones), or every owner's."""
    stmt = sa.select(Adapter).order_by(Adapter.base_model, Adapter.version.desc())
    if not every_owner:
        stmt = stmt.where(owned_by(tenant_id))
    if base_model:
        stmt = stmt.where(Adapter.base_model == base_model)
    return session.scalars(stmt).all()


def get_adapter(session: Session, name: str) -> Adapter | None:
    return session.scalars(sa.select(Adapter).where(Adapter.name == name)).first()
