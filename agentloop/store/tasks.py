"""Data functions for tasks and their leases. The caller owns the transaction (no commits here)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.store.models import Episode, Task, TaskStatus, utcnow
from agentloop.store.paging import Before, newest_first


def get_task(session: Session, task_id: str, tenant_id: str | None = None) -> Task | None:
    """A task by id; with `tenant_id`, only if that tenant owns it (others see 'not found')."""
    stmt = sa.select(Task).where(Task.id == task_id)
    if tenant_id is not None:
        stmt = stmt.where(Task.tenant_id == tenant_id)
    return session.scalars(stmt).first()


def get_task_by_idempotency_key(session: Session, tenant_id: str, key: str) -> Task | None:
    return session.scalars(sa.select(Task).where(Task.tenant_id == tenant_id, Task.idempotency_key == key)).first()


def list_tasks(session: Session, tenant_id: str, status: str | None, limit: int, before: Before | None) -> list[Task]:
    """Newest first, keyset-paginated on (created_at, id)."""
    stmt = sa.select(Task).where(Task.tenant_id == tenant_id)
    if status:
        stmt = stmt.where(Task.status == status)
    return list(session.scalars(newest_first(stmt, Task.created_at, Task.id, before, limit)))


def claim_task(session: Session, task_id: str, owner: str, lease_s: float) -> Task | None:
    """Take the lease on a queued task (or one whose lease expired). Atomic: one claimant wins."""
    now = utcnow()
    result = session.execute(
        sa.update(Task)
        .where(
            Task.id == task_id,
            sa.or_(
                Task.status == TaskStatus.QUEUED,
                sa.and_(Task.status == TaskStatus.RUNNING, Task.lease_expires_at < now),
            ),
            Task.cancel_requested.is_(False),
        )
        .values(
            status=TaskStatus.RUNNING,
            lease_owner=owner,
            lease_expires_at=now + timedelta(seconds=lease_s),
            attempts=Task.attempts + 1,
            started_at=sa.func.coalesce(Task.started_at, now),
            updated_at=now,
        )
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return None
    task = session.get(Task, task_id, populate_existing=True)
    return task


def renew_lease(session: Session, task_id: str, owner: str, lease_s: float) -> tuple[bool, bool]:
    """Extend our lease. Returns (still ours, cancel requested)."""
    now = utcnow()
    result = session.execute(
        sa.update(Task)
        .where(Task.id == task_id, Task.lease_owner == owner, Task.status == TaskStatus.RUNNING)
        .values(lease_expires_at=now + timedelta(seconds=lease_s))
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return False, False
    return True, cancel_requested(session, task_id)


def cancel_requested(session: Session, task_id: str) -> bool:
    return bool(session.scalar(sa.select(Task.cancel_requested).where(Task.id == task_id)))


def release_task(session: Session, task_id: str, owner: str, note: str) -> None:
    """Give a task back to the queue (a transient error stopped our attempt)."""
    session.execute(
        sa.update(Task)
        .where(Task.id == task_id, Task.lease_owner == owner, Task.status == TaskStatus.RUNNING)
        .values(status=TaskStatus.QUEUED, lease_owner=None, lease_expires_at=None, error=note, updated_at=utcnow())
        .execution_options(synchronize_session=False)
    )


def finish_task(
    session: Session,
    task_id: str,
    owner: str | None,
    status: str,
    *,
    error: str | None = None,
    answer: str | None = None,
    reward: float | None = None,
    success: bool | None = None,
) -> bool:
    """Record the end of a task; with `owner`, only while we still hold its lease."""
    stmt = sa.update(Task).where(Task.id == task_id, Task.status.not_in(TaskStatus.TERMINAL))
    if owner is not None:
        stmt = stmt.where(Task.lease_owner == owner)
    now = utcnow()
    result = session.execute(
        stmt.values(
            status=status,
            error=error,
            answer=answer,
            reward=reward,
            success=success,
            finished_at=now,
            updated_at=now,
            lease_owner=None,
            lease_expires_at=None,
        ).execution_options(synchronize_session=False)
    )
    return bool(result.rowcount == 1)  # type: ignore[attr-defined]


def expired_leases(session: Session, now: datetime | None = None) -> Sequence[Task]:
    now = now or utcnow()
    return session.scalars(
        sa.select(Task)
        .where(Task.status == TaskStatus.RUNNING, Task.lease_expires_at < now)
        .with_for_update(skip_locked=True)
    ).all()


def stale_queued(session: Session, undispatched_before: datetime, dispatched_before: datetime) -> Sequence[Task]:
    """Queued tasks whose message may be lost: never published (the broker was down), or published long ago."""
    return session.scalars(
        sa.select(Task)
        .where(
            Task.status == TaskStatus.QUEUED,
            Task.cancel_requested.is_(False),
            sa.or_(
                sa.and_(Task.dispatched_at.is_(None), Task.created_at < undispatched_before),
                Task.dispatched_at < dispatched_before,
            ),
        )
        .order_by(Task.created_at)
        .limit(500)
    ).all()


def abandon_running_episodes(session: Session, task_id: str, reason: str) -> None:
    session.execute(
        sa.update(Episode)
        .where(Episode.task_id == task_id, Episode.status == "running")
        .values(status="abandoned", finish_reason=reason, finished_at=utcnow())
        .execution_options(synchronize_session=False)
    )
