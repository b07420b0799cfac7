"""When to train without an admin asking: on a period, or once enough new client episodes exist.
Celery beat calls `maybe_start_training` every `train_check_interval_s`; at most one run is queued
or running at a time."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.learner.config import LoopConfig
from agentloop.learner.task_source import TaskSourceError, TaskSourceUnavailable, load_source
from agentloop.settings import Settings
from agentloop.store.db import session_scope
from agentloop.store.models import Episode, Reward, TrainingRun, TrainingRunStatus, utcnow

log = logging.getLogger(__name__)


def new_usable_episodes(session: Session, since: datetime | None) -> int:
    """Finished client episodes since `since` that training can use: a named task (replayable when it is
    in a trained split) or client feedback."""
    has_feedback = sa.exists().where(Reward.episode_id == Episode.id, Reward.source == "client")
    query = (
        sa.select(sa.func.count())
        .select_from(Episode)
        .where(Episode.kind == "served", Episode.status == "finished")
        .where(sa.or_(Episode.task_ref.is_not(None), has_feedback))
    )
    if since is not None:
        query = query.where(Episode.created_at >= since)
    return int(session.scalar(query) or 0)


def due(session: Session, settings: Settings, now: datetime) -> str | None:
    """Why a run should start now ("period" | "episodes"), or None."""
    busy = session.scalar(
        sa.select(sa.func.count())
        .select_from(TrainingRun)
        .where(TrainingRun.status.in_((TrainingRunStatus.QUEUED, TrainingRunStatus.RUNNING)))
    )
    if busy:
        return None
    last = session.scalar(sa.select(sa.func.max(TrainingRun.created_at)))
    if settings.train_every_s > 0 and (last is None or now - last >= timedelta(seconds=settings.train_every_s)):
        return "period"
    if settings.train_min_new_episodes > 0 and new_usable_episodes(session, last) >= settings.train_min_new_episodes:
        return "episodes"
    return None


def maybe_start_training(settings: Settings, now: datetime | None = None) -> str | None:
    """Queue and publish a run if one is due; returns its id."""
    from agentloop.worker.dispatch import publish_training

    if settings.train_every_s <= 0 and settings.train_min_new_episodes <= 0:
        return None
    if settings.train_recipe:
        config = LoopConfig.for_recipe(settings.train_recipe, **settings.train_config)
    else:
        config = LoopConfig.for_algo(settings.train_algo, iterations=settings.train_iterations, **settings.train_config)
    with session_scope() as s:
        reason = due(s, settings, now or utcnow())
        if reason is None:
            return None
        try:  # an app named by AGENTLOOP_TRAIN_CONFIG is the one tenant's that registered one of that name
            source = load_source(s, config, None, settings.secret_key)
        except (TaskSourceError, TaskSourceUnavailable) as exc:
            log.error("training is due (%s) but AGENTLOOP_TRAIN_CONFIG cannot train: %s", reason, exc)
            return None
        run = TrainingRun(
            algo=config.label,
            status=TrainingRunStatus.QUEUED,
            trigger=f"schedule:{reason}",
            tenant_id=source.tenant_id,  # a run on an app is its tenant's
            config=config.to_dict(),
            progress={"phase": "queued"},
        )
        s.add(run)
        s.flush()
        run_id = run.id
    log.info("training run %s queued (%s)", run_id, reason)
    publish_training(run_id)
    return run_id
