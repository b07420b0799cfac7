"""Data functions for training runs: who sees a run, cancelling one, and the learner's lease on it (claim,
renew, progress, outcome). Functions taking a session leave the transaction to the caller; the learner's
(which take none) each run in a transaction of their own."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.store.db import session_scope
from agentloop.store.models import TrainingRun, TrainingRunStatus, utcnow

CLI_TRIGGER = "cli"  # started by `agentloop learn`: only `agentloop learn --resume` resumes it


def _visible(tenant_id: str | None) -> sa.ColumnElement[bool]:
    """A tenant's runs only; None: every run, the shared ones (no tenant: an operator's, the CLI's, the
    schedule's) too."""
    return sa.true() if tenant_id is None else TrainingRun.tenant_id == tenant_id


def get_run(session: Session, run_id: str, tenant_id: str | None, *, for_update: bool = False) -> TrainingRun | None:
    stmt = sa.select(TrainingRun).where(TrainingRun.id == run_id, _visible(tenant_id))
    if for_update:
        stmt = stmt.with_for_update()
    return session.scalars(stmt).first()


def list_runs(session: Session, tenant_id: str | None, limit: int) -> Sequence[TrainingRun]:
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


def record_reads(session: Session, run_id: str, tenants: Sequence[str], episode_ids: Sequence[str]) -> None:
    """Add to the run's row what it read besides its world (`TrainingRun.trained_on`): the served episodes,
    and the tenants whose data it may read."""
    run = session.get(TrainingRun, run_id)
    if run is None:  # a run of a bench or a test without a row
        return
    seen = dict(run.trained_on or {})
    episodes = sorted({*seen.get("episodes", []), *episode_ids})
    run.trained_on = {"tenants": sorted(tenants), "episodes": episodes}


# --- the learner's side: a lease on the run's row ----------------------------------------------------


def claim_run(run_id: str, owner: str, lease_s: float) -> TrainingRun | None:
    """Take a queued run, or a running one whose lease expired (its learner is gone); None if neither."""
    now = utcnow()
    with session_scope() as s:
        result = s.execute(
            sa.update(TrainingRun)
            .where(
                TrainingRun.id == run_id,
                sa.or_(
                    TrainingRun.status == "queued",
                    sa.and_(TrainingRun.status == "running", TrainingRun.lease_expires_at < now),
                ),
                TrainingRun.cancel_requested.is_(False),
            )
            .values(
                status="running",
                lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_s),
                started_at=sa.func.coalesce(TrainingRun.started_at, now),
                attempts=TrainingRun.attempts + 1,
            )
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            return None
        run = s.get(TrainingRun, run_id, populate_existing=True)
        assert run is not None
        s.expunge(run)
        return run


def renew_lease(session: Session, run_id: str, owner: str, lease_s: float) -> None:
    session.execute(
        sa.update(TrainingRun)
        .where(TrainingRun.id == run_id, TrainingRun.lease_owner == owner)
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
    )


def stop_reason(session: Session, run_id: str, owner: str | None) -> tuple[str, bool] | None:
    """Why the learner `owner` must stop the run, if it must: (reason, lease_lost)."""
    row = session.execute(
        sa.select(TrainingRun.cancel_requested, TrainingRun.error, TrainingRun.lease_owner).where(
            TrainingRun.id == run_id
        )
    ).one_or_none()
    if row is None or (owner is not None and row.lease_owner != owner):
        return "the run's lease is not this learner's any more", True
    if row.cancel_requested:
        return row.error or "cancelled", False
    return None


def set_progress(run_id: str, progress: dict[str, Any]) -> None:
    with session_scope() as s:
        s.execute(sa.update(TrainingRun).where(TrainingRun.id == run_id).values(progress=progress))


def record_iteration(run_id: str, next_iteration: int, metrics: dict[str, Any]) -> None:
    with session_scope() as s:
        run = s.get(TrainingRun, run_id)
        assert run is not None
        run.iteration = next_iteration
        run.metrics = [*(run.metrics or []), metrics]


def end_run(run_id: str, owner: str, status: str, error: str | None = None) -> None:
    """The learner's last word on its run (finished | failed), written only while the lease is its own."""
    values: dict[str, Any] = {"status": status, "finished_at": utcnow(), "lease_owner": None, "lease_expires_at": None}
    if error is not None:
        values["error"] = error
    if status == TrainingRunStatus.FINISHED:
        values["progress"] = {"phase": "finished"}
    with session_scope() as s:
        s.execute(
            sa.update(TrainingRun).where(TrainingRun.id == run_id, TrainingRun.lease_owner == owner).values(**values)
        )


def record_stopped(run_id: str, owner: str, reason: str, where: str) -> None:
    """The learner stopped its run at a safe point: cancelled, never claimed again."""
    with session_scope() as s:
        run = s.scalars(
            sa.select(TrainingRun).where(TrainingRun.id == run_id, TrainingRun.lease_owner == owner).with_for_update()
        ).first()
        if run is not None:
            run.cancel_requested = True  # never claimed again, even by a sweeper that misses the status
            mark_cancelled(run, reason, utcnow())
            run.progress = {**run.progress, "stopped": where}
