"""Rollouts: K episodes per task from the same initial state, turned into training sequences.

A rollout's sequence is exactly the tokens the episode saw and sampled — the opening prompt, then
for each turn the sampled ids (agent tokens, with their sampler log-probs) and the observation ids —
rebuilt from stored ids, never re-tokenised. Rollouts run in the learner process (`local`) or are
spread over the Celery `rollouts` queue (`celery`), one job per task, so more workers give more
throughput; the learner goes on once every task has enough rollouts and enough are in overall
(stragglers are dropped, as in the paper)."""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.agent.episode import Limits
from agentloop.agent.evaluate import EpisodeResult, EvalTask, run_eval
from agentloop.apps.tasks import ToolCall
from agentloop.policy.base import Policy
from agentloop.store import episodes as episode_store
from agentloop.store.models import Episode as EpisodeRow
from agentloop.store.models import Reward, Step

log = logging.getLogger(__name__)


@dataclass
class Rollout:
    task_ref: str
    token_ids: list[int]
    agent_mask: list[int]  # 1 on tokens the policy sampled
    turn_ids: list[int]  # the turn of each agent token, -1 elsewhere
    sampler_logprobs: list[float]  # log-prob of each agent token when it was sampled (0 elsewhere)
    reward: float
    success: bool
    episode_id: str | None = None
    actions: list[ToolCall | None] | None = None  # each turn's parsed call (None: none parsed); where known
    commands: str | None = None  # a text world's command app (`World.commands`): how its turns parse
    expert: bool = False  # an expert's trajectory joined to a group (LoopConfig.expert_in_group), not sampled

    @property
    def agent_tokens(self) -> int:
        return sum(self.agent_mask)


def build_rollout(
    task_ref: str,
    prompt_ids: Sequence[int],
    turns: Sequence[Any],
    reward: float,
    success: bool,
    episode_id: str | None = None,
    commands: str | None = None,
) -> Rollout:
    """From the opening prompt and the turns (agent Turns or stored Steps, which share these fields).
    The sequence ends with the last agent token: later observation tokens teach nothing."""
    ids, mask, turn_ids, logps = (
        list(prompt_ids),
        [0] * len(prompt_ids),
        [-1] * len(prompt_ids),
        [0.0] * len(prompt_ids),
    )
    for i, turn in enumerate(turns):
        out = list(turn.output_token_ids)
        lp = list(turn.output_logprobs or [0.0] * len(out))
        if len(lp) != len(out):
            raise ValueError(f"turn {i} of {task_ref}: {len(out)} tokens but {len(lp)} log-probs")
        ids += out
        mask += [1] * len(out)
        turn_ids += [i] * len(out)
        logps += lp
        if i < len(turns) - 1:
            obs = list(turn.observation_token_ids)
            ids += obs
            mask += [0] * len(obs)
            turn_ids += [-1] * len(obs)
            logps += [0.0] * len(obs)
    actions = [_call(getattr(turn, "action", None)) for turn in turns]
    return Rollout(task_ref, ids, mask, turn_ids, logps, reward, success, episode_id, actions, commands)


def _call(action: Any) -> ToolCall | None:
    if not isinstance(action, dict) or not {"app", "api"} <= set(action):
        return None
    return ToolCall(str(action["app"]), str(action["api"]), dict(action.get("args") or {}))


def from_result(result: EpisodeResult, episode_id: str | None = None) -> Rollout:
    ep = result.episode
    task_ref = result.task.task_ref
    return build_rollout(
        task_ref, ep.prompt_token_ids, ep.turns, result.reward, result.success, episode_id, ep.world.commands
    )


def sample_tasks(tasks: Sequence[EvalTask], n: int, rng: random.Random) -> list[EvalTask]:
    """n distinct tasks when there are enough, else every task and then repeats."""
    if n <= len(tasks):
        return rng.sample(list(tasks), n)
    return list(tasks) + [rng.choice(list(tasks)) for _ in range(n - len(tasks))]


def run_local(
    policy: Policy,
    tasks: Sequence[EvalTask],
    k: int,
    limits: Limits,
    batch_size: int,
    store: Callable[[EpisodeResult], str | None] | None = None,
    on_result: Callable[[EpisodeResult], None] | None = None,
    adapter: str | None = None,
) -> dict[str, list[Rollout]]:
    """K rollouts of each task in this process, batched across rollouts and tasks. `store` persists an
    episode and returns its id."""
    by_task: dict[str, list[Rollout]] = defaultdict(list)

    def collect(result: EpisodeResult) -> None:
        episode_id = store(result) if store is not None else None
        if result.verdict is not None:  # one the app could not evaluate is stored as an error, never trained on
            by_task[result.task.task_ref].append(from_result(result, episode_id))
        if on_result is not None:
            on_result(result)

    run_eval(policy, tasks, k, limits, batch_size, on_result=collect, adapter=adapter)
    return dict(by_task)


# --- rollouts over the Celery queue --------------------------------------------------------------


def stored_rollouts(session: Session, run_id: str, iteration: int) -> dict[str, list[Rollout]]:
    """The iteration's rollouts that workers have stored so far, by task."""
    episodes = session.scalars(
        sa.select(EpisodeRow).where(
            EpisodeRow.training_run_id == run_id, EpisodeRow.iteration == iteration, EpisodeRow.status == "finished"
        )
    ).all()
    rewards = {
        r.episode_id: r
        for r in session.scalars(
            sa.select(Reward).where(Reward.episode_id.in_([e.id for e in episodes]), Reward.source == "evaluator")
        )
    }
    by_task: dict[str, list[Rollout]] = defaultdict(list)
    for ep in episodes:
        reward = rewards.get(ep.id)
        if reward is None or ep.task_ref is None:
            continue
        steps = session.scalars(sa.select(Step).where(Step.episode_id == ep.id).order_by(Step.index)).all()
        by_task[ep.task_ref].append(
            build_rollout(ep.task_ref, ep.prompt_token_ids, steps, reward.value, bool(reward.success), ep.id)
        )
    return dict(by_task)


def enough(
    by_task: dict[str, list[Rollout]], task_refs: Sequence[str], k: int, min_per_task: int, min_fraction: float
) -> bool:
    """The straggler rule: every task has >= min_per_task rollouts and >= min_fraction of all are in."""
    counts = [len(by_task.get(ref, [])) for ref in task_refs]
    return min(counts, default=0) >= min_per_task and sum(counts) >= min_fraction * k * len(task_refs)


def wait_for_stored(
    load: Callable[[], dict[str, list[Rollout]]],
    task_refs: Sequence[str],
    k: int,
    min_per_task: int,
    min_fraction: float,
    timeout_s: float,
    on_progress: Callable[[int], None] | None = None,
    poll_s: float = 1.0,
) -> dict[str, list[Rollout]]:
    """Poll the store until the straggler rule holds (or every rollout is in); extra rollouts of a task
    beyond K are ignored. Raises TimeoutError with what arrived."""
    deadline = time.monotonic() + timeout_s
    while True:
        by_task = {ref: rs[:k] for ref, rs in load().items() if ref in set(task_refs)}
        total = sum(len(v) for v in by_task.values())
        if on_progress is not None:
            on_progress(total)
        if total >= k * len(task_refs) or enough(by_task, task_refs, k, min_per_task, min_fraction):
            return by_task
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {total} of {k * len(task_refs)} rollouts arrived within {timeout_s:g} s")
        time.sleep(poll_s)


def store_rollout(
    session: Session,
    result: EpisodeResult,
    *,
    world: str,
    policy: str,
    adapter: str | None,
    run_id: str,
    iteration: int,
) -> str:
    row = episode_store.add_finished_episode(
        session,
        result.episode,
        kind="rollout",
        world=world,
        task_ref=result.task.task_ref,
        instruction=result.task.instruction,
        policy=policy,
        adapter=adapter,
        verdict=result.verdict,
        error=result.error,
        training_run_id=run_id,
        iteration=iteration,
    )
    return row.id


def run_rollout_job(
    policy: Policy,
    *,
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
) -> int:
    """A `rollouts` worker's job: K rollouts of one task (of `world`, or of the registered `app` of
    `tenant_id`, each rollout reset in the app) with the learner's current weights, stored."""
    from agentloop.learner.task_source import APP_WORLD, rollout_task
    from agentloop.settings import get_settings
    from agentloop.store.db import session_scope

    with session_scope() as s:
        task = rollout_task(s, world, app, tenant_id, task_ref, get_settings().secret_key)
    if app is not None:
        world = APP_WORLD.format(app)  # as the learner's own rollouts of the app record it
    if adapter not in policy.loaded_adapters():
        policy.load_adapter(adapter, adapter_path)
    try:
        results = run_eval(policy, [task], k, Limits(**limits), batch_size=k, adapter=adapter)
    finally:
        policy.unload_adapter(adapter)
    with session_scope() as s:
        for result in results:
            store_rollout(
                s, result, world=world, policy=policy.name, adapter=adapter, run_id=run_id, iteration=iteration
            )
    return len(results)
