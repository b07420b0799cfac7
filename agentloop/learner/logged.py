"""Episodes clients ran, as training data, and the client's feedback as their reward.

Two kinds, because LOOP's baseline needs several samples of the same task from the same start:

* **Replayable** (the task names a task of the trained world, `task_ref`, or of the trained app,
  "<app>:<ref>", sent by the app's tenant): the learner runs K fresh rollouts of the task as for any
  train task, and the client's episode joins that group as one more sample. Its reward is the
  client's latest feedback if there is any, *overriding* the evaluator (the client knows what it
  wanted; the evaluator only checks the state), else the evaluator's.
* **Not replayable** (a free instruction: no initial state to go back to): the episode can only be a
  single sample. It is used when the client gave feedback, with the leave-one-out idea applied
  across episodes instead of rollouts: its advantage is its feedback minus the mean feedback of
  comparable recent episodes (same tenant, same apps), and it is skipped while fewer than
  `feedback_baseline_min` comparable ones exist (no baseline, no advantage).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.learner.rollouts import Rollout, build_rollout
from agentloop.store.models import Episode, Reward, Step, Task


@dataclass
class Logged:
    rollout: Rollout
    replayable: bool
    reward_source: str  # client | evaluator
    tenant_id: str
    apps: tuple[str, ...]


def logged_episodes(
    session: Session,
    world: str | None,
    known_refs: set[str],
    since: datetime | None,
    limit: int,
    tenants: Sequence[str],
    exclude: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[Logged]:
    """The most recent finished served episodes of `world` (newest first) with a usable reward, of tasks that
    `tenants` sent (a tenant's run: its own; a shared run: those of tenants that share their data; none: no
    episode): those of tasks in `known_refs` (the trained splits) and free instructions. `world` None (an
    app's run): episodes of the app's tasks ("<app>:<ref>" in `known_refs`) in whatever world they were
    served, and no free instructions."""
    query = (
        sa.select(Episode, Task)
        .join(Task, Task.id == Episode.task_id)
        .where(Episode.kind == "served", Episode.status == "finished", Episode.num_steps > 0)
        .where(Task.tenant_id.in_(list(tenants)))
        .order_by(Episode.created_at.desc())
        .limit(limit + len(exclude))
    )
    if world is not None:
        query = query.where(Episode.world == world)
    else:
        query = query.where(Episode.task_ref.in_(sorted(known_refs)))
    if since is not None:
        query = query.where(Episode.created_at >= since)
    rows = [
        (ep, task)
        for ep, task in session.execute(query).all()
        # a task outside the trained splits (dev, test) is never trained on, even when a client sent it
        if ep.id not in exclude and (ep.task_ref is None or ep.task_ref in known_refs)
    ][:limit]
    rewards = _latest_rewards(session, [ep.id for ep, _ in rows])
    out: list[Logged] = []
    for ep, task in rows:
        found = rewards.get(ep.id, {})
        replayable = ep.task_ref is not None and ep.task_ref in known_refs
        reward = found.get("client") or (found.get("evaluator") if replayable else None)
        if reward is None:
            continue
        steps = session.scalars(sa.select(Step).where(Step.episode_id == ep.id).order_by(Step.index)).all()
        rollout = build_rollout(
            ep.task_ref or f"logged:{ep.id}",
            ep.prompt_token_ids,
            steps,
            float(reward.value),
            bool(reward.success) if reward.success is not None else reward.value >= 1.0,
            ep.id,
        )
        out.append(Logged(rollout, replayable, reward.source, task.tenant_id, tuple(sorted(task.apps))))
    return out


def _latest_rewards(session: Session, episode_ids: Sequence[str]) -> dict[str, dict[str, Reward]]:
    latest: dict[str, dict[str, Reward]] = defaultdict(dict)
    if not episode_ids:
        return latest
    for r in session.scalars(
        sa.select(Reward).where(Reward.episode_id.in_(episode_ids)).order_by(Reward.created_at, Reward.id)
    ):
        latest[r.episode_id][r.source] = r  # type: ignore[index]  # later rows win
    return latest


def feedback_advantages(singles: Sequence[Logged], min_comparable: int) -> list[tuple[Rollout, float]]:
    """Non-replayable episodes with client feedback: advantage = feedback - mean feedback of the other
    comparable episodes (same tenant, same apps); none without `min_comparable` of them."""
    groups: dict[tuple[str, tuple[str, ...]], list[Logged]] = defaultdict(list)
    for item in singles:
        if not item.replayable and item.reward_source == "client":
            groups[(item.tenant_id, item.apps)].append(item)
    out: list[tuple[Rollout, float]] = []
    for members in groups.values():
        if len(members) - 1 < min_comparable:
            continue
        total = sum(m.rollout.reward for m in members)
        for m in members:
            baseline = (total - m.rollout.reward) / (len(members) - 1)
            out.append((m.rollout, m.rollout.reward - baseline))
    return out
