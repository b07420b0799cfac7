"""Data functions for uploaded demonstrations (expert trajectories). The caller owns the transaction."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.store.models import Demonstration
from agentloop.store.paging import Before, newest_first

EXPORT_BATCH = 200  # rows read at a time by an export


def create_demonstration(
    session: Session,
    tenant_id: str | None,
    *,
    world: str,
    task_ref: str | None,
    instruction: str,
    apps: list[str],
    steps: list[dict[str, Any]],
    replayed: bool,
    seed: int = 0,
    metadata: dict[str, Any] | None = None,
) -> Demonstration:
    """Add a demonstration whose steps were already checked (and, where the world allows, replayed)."""
    row = Demonstration(
        tenant_id=tenant_id,
        world=world,
        task_ref=task_ref,
        instruction=instruction,
        apps=apps,
        seed=seed,
        steps=steps,
        replayed=replayed,
        meta=dict(metadata or {}),
    )
    session.add(row)
    session.flush()
    return row


def get_demonstration(session: Session, demo_id: str, tenant_id: str) -> Demonstration | None:
    """A demonstration by id, only if `tenant_id` owns it: another tenant's is 'not found'."""
    stmt = sa.select(Demonstration).where(Demonstration.id == demo_id, Demonstration.tenant_id == tenant_id)
    return session.scalars(stmt).first()


def _of(tenant_id: str | None, world: str | None, task_ref: str | None = None) -> sa.Select[Demonstration]:
    """Demonstrations of one tenant (None: every tenant's), one world and one task, where given."""
    stmt = sa.select(Demonstration)
    if tenant_id is not None:
        stmt = stmt.where(Demonstration.tenant_id == tenant_id)
    if world is not None:
        stmt = stmt.where(Demonstration.world == world)
    if task_ref is not None:
        stmt = stmt.where(Demonstration.task_ref == task_ref)
    return stmt


def list_demonstrations(
    session: Session,
    tenant_id: str,
    *,
    world: str | None = None,
    task_ref: str | None = None,
    limit: int = 100,
    before: Before | None = None,
) -> list[Demonstration]:
    """A tenant's demonstrations, newest first, keyset-paginated on (created_at, id)."""
    stmt = newest_first(_of(tenant_id, world, task_ref), Demonstration.created_at, Demonstration.id, before, limit)
    return list(session.scalars(stmt))


def delete_demonstration(session: Session, demo_id: str, tenant_id: str) -> bool:
    """Delete a tenant's demonstration; False when that tenant has none with this id."""
    row = get_demonstration(session, demo_id, tenant_id)
    if row is None:
        return False
    session.delete(row)
    session.flush()
    return True


def oldest_first(session: Session, tenant_id: str | None, world: str | None) -> Iterator[Demonstration]:
    """Every demonstration of one tenant (None: every tenant's) and world (None: every world), oldest first,
    read in batches: what an export writes, in the order an import recreates."""
    stmt = _of(tenant_id, world).order_by(Demonstration.created_at, Demonstration.id)
    yield from session.scalars(stmt.execution_options(yield_per=EXPORT_BATCH))


def for_training(session: Session, tenants: Sequence[str], world: str) -> list[Demonstration]:
    """Every demonstration of `world` a run may learn from: those of `tenants` (a tenant's run: its own; a
    shared run: the tenants that share their data) and the deployment's own (no tenant's). Oldest first, so a
    run sees them in a stable order; `replayed` says whose observations are the world's own answers."""
    owner = sa.or_(Demonstration.tenant_id.is_(None), Demonstration.tenant_id.in_(list(tenants)))
    stmt = (
        sa.select(Demonstration)
        .where(Demonstration.world == world, owner)
        .order_by(Demonstration.created_at, Demonstration.id)
    )
    return list(session.scalars(stmt))
