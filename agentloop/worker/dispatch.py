"""Publishing task ids to the queue, and recovering tasks whose message or worker was lost.

A task exists once its row is committed; the message only carries its id and is published after
the commit. If publishing fails the row stays queued and the sweeper publishes it again.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from agentloop import events
from agentloop.settings import Settings
from agentloop.store import tasks as task_store
from agentloop.store.db import session_scope
from agentloop.store.models import TaskStatus, utcnow

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
    with session_scope() as s:
        task = task_store.get_task(s, task_id)
        if task is not None:
            task.dispatched_at = utcnow()
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


def sweep(settings: Settings) -> dict[str, int]:
    """Re-queue (or fail) tasks whose worker stopped heartbeating; re-publish queued tasks whose
    message may be lost. Safe to run concurrently and repeatedly: claims are atomic."""
    requeued, failed = [], 0
    now = utcnow()
    with session_scope() as s:
        for task in task_store.expired_leases(s, now):
            task_store.abandon_running_episodes(s, task.id, "worker_lost")
            if task.attempts >= settings.max_attempts:
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
    for task_id in requeued:
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
    if requeued or failed or stale:
        log.info("sweep: requeued %d, failed %d, republished %d", len(requeued), failed, republished)
    return {"requeued": len(requeued), "failed": failed, "republished": republished}
