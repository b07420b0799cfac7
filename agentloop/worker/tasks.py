"""Celery tasks: each takes ids and calls into agent/ or learner/."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import Any

from celery import Task as CeleryTask
from sqlalchemy.exc import OperationalError

from agentloop.agent.runner import PINS, run_served_task
from agentloop.policy import get_policy
from agentloop.settings import get_settings
from agentloop.worker.celery_app import app
from agentloop.worker.dispatch import sweep

log = logging.getLogger(__name__)


@app.task(
    name="agentloop.run_episode",
    bind=True,
    # only the database going away is transient; everything else fails the task with its reason
    autoretry_for=(OperationalError,),
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=5,
)
def run_episode(self: CeleryTask, task_id: str) -> str:
    settings = get_settings()
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"  # unique per delivery
    policy = get_policy(settings)
    PINS.follow(policy, settings)  # from now on this process loads announced versions as they come
    outcome = run_served_task(task_id, owner, policy, settings)
    log.info("task %s: %s", task_id, outcome)
    if outcome == "retrying":  # the app's outage cost this attempt; the task is queued for the next one
        raise self.retry(countdown=settings.app_retry_after_s)
    return outcome


@app.task(name="agentloop.sweep_leases")
def sweep_leases() -> dict[str, Any]:
    return sweep(get_settings())


@app.task(name="agentloop.maybe_train")
def maybe_train() -> str | None:
    from agentloop.learner.schedule import maybe_start_training

    return maybe_start_training(get_settings())


@app.task(name="agentloop.train", bind=True, acks_late=True)
def train(self: CeleryTask, run_id: str) -> str:
    from agentloop.learner.run import run_training

    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return run_training(run_id, owner, get_settings())


@app.task(name="agentloop.rollout")
def rollout(**job: Any) -> int:
    from agentloop.learner.rollouts import run_rollout_job

    return run_rollout_job(get_policy(get_settings()), **job)
