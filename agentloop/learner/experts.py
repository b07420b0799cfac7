"""Expert trajectories for supervised steps and StepAgent, from three sources (DESIGN §6):

* oracle: the oracle solution of a train task — with `procedural`, of a train scenario set up on a fresh
  seed (`<scenario>@<seed>`), so there are as many as training asks for;
* demonstrations: what clients uploaded (POST /v1/demonstrations) for a task of the trained world, whose
  steps were replayed on that world when they were stored;
* logged: served episodes of a train task that the evaluator scored a success.

Each becomes an EvalTask whose `expert` returns the calls; `expert_rollouts` plays them through the real
episode loop, so the learner sees exactly the tokens the agent would (prompt, observations and all).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from agentloop.agent.actions import action_space
from agentloop.agent.episode import Episode, Limits, run_episodes
from agentloop.agent.evaluate import EvalTask, run_eval
from agentloop.agent.examples import example_for
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.registry import WorldProvider
from agentloop.apps.tasks import ToolCall
from agentloop.apps.world import World
from agentloop.learner.rollouts import Rollout, build_rollout, from_result, sample_tasks
from agentloop.learner.task_source import TaskSource
from agentloop.policy.scripted import ScriptedPolicy
from agentloop.store import demonstrations as demo_store
from agentloop.store.models import Episode as EpisodeRow
from agentloop.store.models import Reward, Step, Task


@dataclass
class ExpertStep:
    """One step of an expert trajectory as StepAgent inspects it: the tokens before the expert's action
    (instruction, earlier actions and observations), the action's tokens, and the call itself."""

    task_ref: str
    index: int
    prefix: list[int]
    action_tokens: list[int]
    call: ToolCall
    commands: str | None = None  # a text world's command app: how an agent's action at this prefix parses


def oracle_experts(source: TaskSource, n: int, rng: random.Random, procedural: bool) -> list[EvalTask]:
    """n train tasks with an oracle: fresh instances where the source makes them, else sampled from its list."""
    if procedural and source.procedural:
        return source.fresh(rng, n)
    with_oracle = [t for t in source.train if t.expert is not None]
    return sample_tasks(with_oracle, n, rng) if with_oracle else []


def demonstration_experts(
    session: Session, provider: WorldProvider, tenants: Sequence[str], limit: int, rng: random.Random
) -> tuple[list[EvalTask], int]:
    """Up to `limit` uploaded demonstrations of the world by `tenants` or the deployment, as tasks; and how
    many could not be used (steps over an external app were never replayed: there is no world here to play
    them in)."""
    rows = demo_store.for_training(session, tenants, provider.name)
    usable = [r for r in rows if r.replayed]
    picked = rng.sample(usable, min(limit, len(usable)))
    return [_demonstration_task(provider, row) for row in picked], len(rows) - len(usable)


def _demonstration_task(provider: WorldProvider, row: Any) -> EvalTask:
    calls = [ToolCall(s["app"], s["api"], dict(s.get("args") or {})) for s in row.steps]
    ref, seed, apps = row.task_ref, row.seed, list(row.apps)

    def start() -> tuple[Any, Any]:
        world = provider.task_world(ref) if ref is not None else provider.new_world(seed, apps)
        return world, None

    return EvalTask(
        task_ref=ref or f"demonstration:{row.id}",
        scenario="demonstration",
        split="train",
        difficulty=0,
        instruction=row.instruction,
        start=start,
        expert=_fixed(calls),
        world=provider.name,
    )


def logged_experts(session: Session, source: TaskSource, limit: int) -> tuple[list[EvalTask], list[str]]:
    """Served episodes of the source's train tasks, sent by the tenants it reads (`TaskSource.readers`), that
    the evaluator scored a success (newest first), as experts: the task's start and the calls the agent made;
    and the episodes' ids."""
    by_ref = {t.task_ref: t for t in source.train}
    if not by_ref:
        return [], []
    success = sa.exists().where(
        Reward.episode_id == EpisodeRow.id, Reward.source == "evaluator", Reward.success.is_(True)
    )
    query = (
        sa.select(EpisodeRow)
        .where(EpisodeRow.kind == "served", EpisodeRow.status == "finished", success)
        .where(EpisodeRow.task_ref.in_(sorted(by_ref)))
        .join(Task, Task.id == EpisodeRow.task_id)
        .where(Task.tenant_id.in_(list(source.readers)))
        .order_by(EpisodeRow.created_at.desc())
        .limit(limit)
    )
    out: list[EvalTask] = []
    ids: list[str] = []
    for ep in session.scalars(query):
        if ep.task_ref is None:
            continue
        steps = session.scalars(sa.select(Step).where(Step.episode_id == ep.id).order_by(Step.index)).all()
        calls = [
            ToolCall(s.action["app"], s.action["api"], dict(s.action.get("args") or {})) for s in steps if s.action
        ]
        out.append(replace(by_ref[ep.task_ref], expert=_fixed(calls)))
        ids.append(ep.id)
    return out, ids


def _fixed(calls: list[ToolCall]) -> Callable[[World], list[ToolCall]]:
    return lambda _world: calls


EXPERT_WORLDS_AT_ONCE = 8  # expert episodes played together (each holds its world until it ends)


def expert_rollouts(tokenizer: Any, tasks: Sequence[EvalTask], limits: Limits) -> list[Rollout]:
    """Each task's expert calls played through the real episode loop: exact token sequences, one turn
    per call, with each turn's call kept (`Rollout.actions`). With `prompt_example: nearest` each shows the
    nearest solved task of another scenario (agent/examples.py): what it learns is to carry an example over."""
    policy = ScriptedPolicy(tokenizer, name="oracle")
    fmt = ChatFormat(tokenizer)
    with_expert = [(i, task) for i, task in enumerate(tasks) if task.expert is not None]
    rollouts = []
    # a few worlds at a time: a world may hold a process of its own (a ScienceWorld simulator is a JVM)
    for start in range(0, len(with_expert), EXPERT_WORLDS_AT_ONCE):
        episodes = []
        try:
            for i, task in with_expert[start : start + EXPERT_WORLDS_AT_ONCE]:
                assert task.expert is not None
                world, _ = task.start()
                key = f"{task.task_ref}#{i}"  # a task may appear several times (e.g. with other demonstrations)
                example = example_for(task.world, task.instruction, world.available, exclude_scenario=task.scenario)
                ep = Episode(world, fmt, task.instruction, limits, key=key, example=example)
                episodes.append((task, ep))
                policy.plan_actions(key, task.expert(world), action_space(world.commands))
            run_episodes(policy, [ep for _, ep in episodes])
        finally:
            for _, ep in episodes:
                ep.world.close()
        rollouts += [
            build_rollout(t.task_ref, ep.prompt_token_ids, ep.turns, 1.0, True, commands=ep.world.commands)
            for t, ep in episodes
        ]
    return rollouts


def scored_expert_rollouts(
    tokenizer: Any, tasks: Sequence[EvalTask], limits: Limits, batch_size: int
) -> dict[str, Rollout]:
    """Each task's expert calls played as an episode of the task's own group would be (the same prompt and
    worked example as its rollouts), and scored by the task's evaluator, by task ref. A task without an expert,
    or whose episode the app could not evaluate, has none. The turns were not sampled: no log-probs."""
    policy = ScriptedPolicy(tokenizer, name="oracle")

    def prepare(ep: Episode, task: EvalTask) -> None:
        assert task.expert is not None and ep.key is not None
        policy.plan_actions(ep.key, task.expert(ep.world), action_space(ep.world.commands))

    with_expert = [t for t in tasks if t.expert is not None]
    results = run_eval(policy, with_expert, 1, limits, batch_size, prepare=prepare)
    return {r.task.task_ref: from_result(r) for r in results if r.verdict is not None}


def expert_steps(rollout: Rollout) -> list[ExpertStep]:
    """The steps of an expert rollout: for each turn t, the tokens before it and its own tokens."""
    assert rollout.actions is not None, "an expert rollout knows its calls"
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for pos, turn in enumerate(rollout.turn_ids):
        if turn >= 0:
            starts.setdefault(turn, pos)
            ends[turn] = pos + 1
    return [
        ExpertStep(
            rollout.task_ref,
            t,
            rollout.token_ids[: starts[t]],
            rollout.token_ids[starts[t] : ends[t]],
            call,
            rollout.commands,
        )
        for t, call in enumerate(rollout.actions)
        if call is not None and t in starts
    ]
