"""Recovery experts: expert trajectories that show what to do after a mistake.

An oracle never fails a call, so an agent trained on its episodes alone has never seen an error observation
followed by a good next call; after one of its own failed calls it tends to end the task. A recovery expert
is an expert episode with one of the agent's own mistakes in it (DAgger-style, on the agent's own actions):

    instruction, a*_1, o_1, ..., a*_{t-1}, o_{t-1},  â_t, ô_t,  a*_t, o_t, ..., a*_n
                                                     (masked)    (trained)

â_t is the agent's greedy action at the expert prefix where it is not a*_t (the comparison of StepAgent's
inspection, `stepagent.action_reward`), ô_t what the world really answered it (mostly an error), and the
expert's calls then go on from a*_t. The episode is played in a fresh world of the task and kept only when
the task still succeeds (a wrong action whose effects the expert's calls do not undo is dropped), so every
kept episode is an expert solution; the loss covers the expert's turns and never â_t.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from agentloop.agent.actions import action_space
from agentloop.agent.episode import Episode, Limits
from agentloop.agent.evaluate import EvalTask, run_eval
from agentloop.learner.experts import ExpertStep, expert_steps
from agentloop.learner.rollouts import Rollout, from_result
from agentloop.learner.stepagent import action_reward
from agentloop.policy.base import GenerationRequest, Policy
from agentloop.policy.scripted import ScriptedPolicy


def with_recoveries(
    policy: Policy,
    tasks: Sequence[EvalTask],
    rollouts: Sequence[Rollout],
    limits: Limits,
    max_new_tokens: int,
    share: float,
    rng: random.Random,
) -> tuple[list[Rollout], dict[str, float]]:
    """`rollouts` (expert episodes of `tasks`, matched by task ref) with a `share` of them, picked at random,
    replaced by their recovery where one is kept; and counts of what happened (`recovery/...`).

    For each picked episode one step t is drawn; the policy's greedy action at its prefix (at most
    `max_new_tokens`, the agent's own limit) is compared with a*_t; where it differs, the episode is played
    again with it inserted before a*_t (`limits`: the experts', with room for the extra turn)."""
    by_ref = {t.task_ref: t for t in tasks}
    candidates = [k for k, r in enumerate(rollouts) if r.task_ref in by_ref and expert_steps(r)]
    n = min(len(candidates), round(share * len(rollouts)))
    picked: list[tuple[int, ExpertStep]] = []
    seen: set[str] = set()
    for k in rng.sample(candidates, len(candidates)):
        if len(picked) == n:
            break
        if rollouts[k].task_ref not in seen:  # one recovery per task ref: an episode's key names its task
            seen.add(rollouts[k].task_ref)
            picked.append((k, rng.choice(expert_steps(rollouts[k]))))
    counts = {"recovery/inspected": float(len(picked))}
    if not picked:
        return list(rollouts), counts
    gens = policy.generate([GenerationRequest(step.prefix, max_new_tokens, temperature=0.0) for _, step in picked])
    wrong = []
    for (k, step), gen in zip(picked, gens, strict=True):
        parsed = action_space(step.commands).parse(gen.text)
        action = parsed.actions[0] if parsed.actions and not parsed.error else None
        if action is None or action_reward(action, step.call, step.commands is not None) < 1.0:
            wrong.append((k, step.index, gen.text))
    counts["recovery/agent_agreed"] = float(len(picked) - len(wrong))
    kept = _replay(policy.tokenizer, [(by_ref[rollouts[k].task_ref], t, text) for k, t, text in wrong], limits)
    out = list(rollouts)
    failed_actions = 0
    for (k, _, _), recovery in zip(wrong, kept, strict=True):
        if recovery is not None:
            out[k], errored = recovery
            failed_actions += errored
    counts["recovery/kept"] = float(sum(r is not None for r in kept))
    counts["recovery/dropped"] = float(sum(r is None for r in kept))  # the task failed with the mistake in it
    counts["recovery/errors"] = float(failed_actions)  # kept recoveries whose mistake the world answered with an error
    return out, counts


def _replay(
    tokenizer: Any, items: Sequence[tuple[EvalTask, int, str]], limits: Limits
) -> list[tuple[Rollout, bool] | None]:
    """Each (task, step t, the agent's reply at t) played as the expert's calls with that reply before the
    expert's t-th; the rollout with the reply's tokens masked and whether it failed, or None when the task
    then fails."""
    if not items:
        return []
    policy = ScriptedPolicy(tokenizer, name="recovery")
    at = {task.task_ref: (t, text) for task, t, text in items}

    def prepare(ep: Episode, task: EvalTask) -> None:
        assert task.expert is not None, "a recovery replays an expert"
        t, text = at[task.task_ref]
        space = action_space(ep.world.commands)
        calls = [space.render(c) for c in task.expert(ep.world)]
        policy.plan(ep.key or "", [*calls[:t], text, *calls[t:]])

    longer = replace(limits, max_turns=limits.max_turns + 1)
    results = run_eval(policy, [task for task, _, _ in items], 1, longer, batch_size=len(items), prepare=prepare)
    out: list[tuple[Rollout, bool] | None] = []
    for (_, t, _), result in zip(items, results, strict=True):
        turns = result.episode.turns
        if result.verdict is None or not result.success or len(turns) <= t + 1:
            out.append(None)
            continue
        out.append((_masked(from_result(result), t), turns[t].error_kind is not None))
    return out


def _masked(rollout: Rollout, turn: int) -> Rollout:
    """The rollout with one turn's tokens left out of the loss (and of the turns StepAgent would inspect)."""
    mask = [0 if tid == turn else m for m, tid in zip(rollout.agent_mask, rollout.turn_ids, strict=True)]
    turn_ids = [-1 if tid == turn else tid for tid in rollout.turn_ids]
    return replace(rollout, agent_mask=mask, turn_ids=turn_ids)
