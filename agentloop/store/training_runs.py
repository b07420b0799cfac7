"""Data functions for training runs: who sees a run, and cancelling one. The caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.store.models import TrainingRun, TrainingRunStatus, utcnow

CLI_TRIGGER = "cli"  # started by `agentloop learn`: only `agentloop learn --resume` resumes it


def _visible(tenant_id: str) -> sa.ColumnElement[bool]:
    """A tenant's admins see the runs they started and the deployment's (tenant None: the CLI, the schedule)."""
    return sa.or_(TrainingRun.tenant_id == tenant_id, TrainingRun.tenant_id.is_(None))


def get_run(session: Session, run_id: str, tenant_id: str, *, for_update: bool = False) -> TrainingRun | None:
    stmt = sa.select(TrainingRun).where(TrainingRun.id == run_id, _visible(tenant_id))
    if for_update:
        stmt = stmt.with_for_update()
    return session.scalars(stmt).first()


def list_runs(session: Session, tenant_id: str, limit: int) -> Sequence[TrainingRun]:
    return session.scalars(
        sa.select(TrainingRun).where(_visible(tenant_id)).order_by(TrainingRun.created_at.desc()).limit(limit)
    ).all()


def request_cancel(session: Session, run: TrainingRun, reason: str, now: datetime | None = None) -> bool:
    """Cancel a run that has not ended. A queued run, or one whose learner is gone (lease expired), is
    cancelled at once (returns True); a running one is marked and its learner stops at its next safe
    point (returns False). Load `run` FOR UPDATE so that a learner claiming it cannot cross this."""
    now = now or utcnow()
    assert run.status not in TrainingRunStatus.TERMINAL, run.status
    run.cancel_requested = True
    idle = run.status == TrainingRunStatus.QUEUED or run.lease_expires_at is None or run.lease_expires_at < now
    if not idle:
        run.error = reason  # the learner adds where it stopped
        return False
    mark_cancelled(run, reason, now)
    return True


def mark_cancelled(run: TrainingRun, reason: str, now: datetime) -> None:
    run.status, run.error, run.finished_at = TrainingRunStatus.CANCELLED, reason, now
    run.lease_owner, run.lease_expires_at = None, None
    run.progress = {"phase": "cancelled", "iteration": run.iteration}
