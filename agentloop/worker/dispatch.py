"""Publishing task ids to the queue, and recovering tasks whose message or worker was lost.

A task exists once its row is committed; the message only carries its id and is published after
the commit. If publishing fails the row stays queued and the sweeper publishes it again.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from agentloop import events
from agentloop.settings import Settings
from agentloop.store import tasks as task_store
from agentloop.store.db import get_engine, session_scope
from agentloop.store.models import Task, TaskStatus, utcnow

log = logging.getLogger(__name__)


def publish_episode(task_id: str) -> bool:
    """Send the task's id to the `episodes` queue and note when. False if the broker is unreachable."""
    from agentloop.worker.celery_app import app

    try:
        # retry briefly (kombu's default retry policy would keep an HTTP request waiting ~3 s per try)
        app.send_task(
            "agentloop.run_episode",
            args=[task_id],
            queue="episodes",
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
        )
    except Exception as exc:
        log.warning("could not publish task %s (the sweeper will retry): %s", task_id, exc)
        return False
    # one statement in autocommit (no BEGIN, no COMMIT): the request that published it waits for this too
    with get_engine().connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.update(Task).where(Task.id == task_id).values(dispatched_at=utcnow()))
    return True


def publish_training(run_id: str) -> bool:
    """Send a training run's id to the `learner` queue. False if the broker is unreachable (the run
    stays queued; the sweeper publishes it again)."""
    from agentloop.worker.celery_app import app

    try:
        app.send_task(
            "agentloop.train",
            args=[run_id],
            queue="learner",
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
        )
    except Exception as exc:
        log.warning("could not publish training run %s: %s", run_id, exc)
        return False
    return True


def publish_rollouts(
    run_id: str,
    iteration: int,
    task_ref: str,
    k: int,
    adapter: str,
    adapter_path: str,
    limits: dict[str, Any],
    world: str,
    app: str | None = None,
    tenant_id: str | None = None,
) -> None:
    """One `rollouts` job: K rollouts of a task of `world`, or of the registered `app` of `tenant_id`."""
    from agentloop.worker.celery_app import app as celery_app

    celery_app.send_task(
        "agentloop.rollout",
        kwargs={
            "run_id": run_id,
            "iteration": iteration,
            "task_ref": task_ref,
            "k": k,
            "adapter": adapter,
            "adapter_path": adapter_path,
            "limits": limits,
            "world": world,
            "app": app,
            "tenant_id": tenant_id,
        },
        queue="rollouts",
    )


def sweep(settings: Settings) -> dict[str, int]:
    """Re-queue (or fail) tasks whose worker stopped heartbeating; re-publish queued tasks whose
    message may be lost. Safe to run concurrently and repeatedly: claims are atomic."""
    requeued, failed, cancelled = [], 0, []
    now = utcnow()
    with session_scope() as s:
        for task in task_store.expired_leases(s, now):
            task_store.abandon_running_episodes(s, task.id, "worker_lost")
            if task.cancel_requested:  # nobody would claim it again: it ends as its client asked
                task.status = TaskStatus.CANCELLED
                task.error = f"cancelled; its worker was lost during attempt {task.attempts} (lease expired)"
                task.finished_at = now
                cancelled.append(task.id)
            elif task.attempts >= settings.max_attempts:
                task.status = TaskStatus.FAILED
                task.error = (
                    f"worker lost during attempt {task.attempts} (lease expired); gave up after "
                    f"{settings.max_attempts} attempts"
                )
                task.finished_at = now
                failed += 1
            else:
                task.status = TaskStatus.QUEUED
                task.error = f"attempt {task.attempts} lost its worker (lease expired); re-dispatched"
                requeued.append(task.id)
            task.lease_owner = None
            task.lease_expires_at = None
    for task_id in [*requeued, *cancelled]:
        events.publish(events.task_channel(task_id), {"type": "status"})
    with session_scope() as s:
        stale = [
            t.id
            for t in task_store.stale_queued(
                s,
                undispatched_before=now - timedelta(seconds=2 * settings.sweep_interval_s),
                dispatched_before=now - timedelta(seconds=settings.requeue_after_s),
            )
        ]
    republished = sum(publish_episode(tid) for tid in [*requeued, *stale])
    runs = sweep_training_runs(settings, now)
    if requeued or failed or cancelled or stale:
        log.info(
            "sweep: requeued %d, failed %d, cancelled %d, republished %d",
            len(requeued),
            failed,
            len(cancelled),
            republished,
        )
    return {
        "requeued": len(requeued),
        "failed": failed,
        "cancelled": len(cancelled),
        "republished": republished,
        **runs,
    }


def sweep_training_runs(settings: Settings, now: Any) -> dict[str, int]:
    """A learner that stopped heartbeating: record why and re-queue its run (it resumes from its last
    checkpoint), or fail it after max_attempts. Never re-queued: a run with a cancel request (it is
    cancelled now), and a run of `agentloop learn` (it is failed with how to resume it: only
    `agentloop learn --resume` resumes it, never a server's worker)."""
    import sqlalchemy as sa

    from agentloop.store.models import TrainingRun, TrainingRunStatus
    from agentloop.store.training_runs import CLI_TRIGGER, mark_cancelled

    requeued: list[str] = []
    failed = cancelled = interrupted = 0
    with session_scope() as s:
        lost = s.scalars(
            sa.select(TrainingRun)
            .where(TrainingRun.status == TrainingRunStatus.RUNNING, TrainingRun.lease_expires_at < now)
            .with_for_update(skip_locked=True)
        ).all()
        for run in lost:
            note = f"learner lost during attempt {run.attempts} at iteration {run.iteration} (lease expired)"
            run.lease_owner, run.lease_expires_at = None, None
            if run.cancel_requested:
                mark_cancelled(run, f"{run.error or 'cancelled'}; {note} before it stopped", now)
                cancelled += 1
            elif run.trigger == CLI_TRIGGER:
                run.status, run.finished_at = TrainingRunStatus.FAILED, now
                run.error = (
                    f"the `agentloop learn` process running it stopped at iteration {run.iteration} (lease "
                    f"expired); resume it with `agentloop learn --resume {run.id}`"
                )
                interrupted += 1
            elif run.attempts >= settings.max_attempts:
                run.status, run.error, run.finished_at = TrainingRunStatus.FAILED, f"{note}; gave up", now
                failed += 1
            else:
                run.status, run.error = TrainingRunStatus.QUEUED, f"{note}; resuming from its last checkpoint"
                requeued.append(run.id)
    for run_id in requeued:
        publish_training(run_id)
    return {
        "runs_requeued": len(requeued),
        "runs_failed": failed,
        "runs_cancelled": cancelled,
        "runs_interrupted": interrupted,
    }
