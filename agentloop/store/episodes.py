"""Data functions for episodes, steps and rewards. The caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.store.models import Episode, Reward, Step, utcnow


def add_step(session: Session, episode_id: str, turn: Any) -> Step:
    """Persist one agent turn (an `agentloop.agent.episode.Turn`)."""
    step = Step(
        episode_id=episode_id,
        index=turn.index,
        prompt_token_count=turn.prompt_token_count,
        output_token_ids=turn.output_token_ids,
        output_logprobs=turn.output_logprobs if turn.output_logprobs is not None else [],
        output_text=turn.output_text,
        finish_reason=turn.finish_reason,
        action=turn.action,
        observation=turn.observation,
        observation_token_ids=turn.observation_token_ids,
        error_kind=turn.error_kind,
        gen_s=turn.gen_s,
        env_s=turn.env_s,
    )
    session.add(step)
    session.execute(
        sa.update(Episode)
        .where(Episode.id == episode_id)
        .values(num_steps=Episode.num_steps + 1, tokens_generated=Episode.tokens_generated + len(turn.output_token_ids))
        .execution_options(synchronize_session=False)
    )
    return step


def add_finished_episode(
    session: Session,
    episode: Any,
    *,
    kind: str,
    world: str,
    task_ref: str | None,
    instruction: str,
    policy: str,
    adapter: str | None,
    verdict: Any | None = None,
    error: str | None = None,
    eval_run_id: str | None = None,
    training_run_id: str | None = None,
    iteration: int | None = None,
) -> Episode:
    """Store an episode that ran to its end elsewhere (eval, rollouts): its steps and its evaluator reward,
    or, with `error` (it could not be evaluated), as failed with no reward."""
    row = Episode(
        kind=kind,
        world=world,
        task_ref=task_ref,
        seed=episode.world.seed,
        instruction=instruction,
        policy=policy,
        adapter=adapter,
        status="failed" if error else "finished",
        finish_reason=episode.finish_reason,
        error=error,
        prompt_token_ids=episode.prompt_token_ids,
        answer=episode.world.answer,
        finished_at=utcnow(),
        eval_run_id=eval_run_id,
        training_run_id=training_run_id,
        iteration=iteration,
    )
    session.add(row)
    session.flush()
    for turn in episode.turns:
        add_step(session, row.id, turn)
    if verdict is not None:
        add_reward(
            session,
            source="evaluator",
            value=verdict.reward,
            success=verdict.success,
            episode_id=row.id,
            details=verdict.to_dict(),
        )
    return row


def latest_episode(session: Session, task_id: str) -> Episode | None:
    return session.scalars(
        sa.select(Episode).where(Episode.task_id == task_id).order_by(Episode.attempt.desc()).limit(1)
    ).first()


def steps_of(session: Session, episode_id: str, after: int = -1, limit: int | None = None) -> Sequence[Step]:
    stmt = sa.select(Step).where(Step.episode_id == episode_id, Step.index > after).order_by(Step.index)
    if limit:
        stmt = stmt.limit(limit)
    return session.scalars(stmt).all()


def finish_episode(
    session: Session,
    episode_id: str,
    status: str,
    finish_reason: str | None,
    answer: str | None = None,
    error: str | None = None,
) -> None:
    session.execute(
        sa.update(Episode)
        .where(Episode.id == episode_id)
        .values(status=status, finish_reason=finish_reason, answer=answer, error=error, finished_at=utcnow())
        .execution_options(synchronize_session=False)
    )


def add_reward(
    session: Session,
    *,
    source: str,
    value: float,
    success: bool | None = None,
    episode_id: str | None = None,
    task_id: str | None = None,
    details: dict[str, Any] | None = None,
    comment: str | None = None,
) -> Reward:
    reward = Reward(
        source=source,
        value=value,
        success=success,
        episode_id=episode_id,
        task_id=task_id,
        details=details or {},
        comment=comment,
    )
    session.add(reward)
    return reward


def rewards_of_task(session: Session, task_id: str) -> Sequence[Reward]:
    return session.scalars(sa.select(Reward).where(Reward.task_id == task_id).order_by(Reward.id)).all()
