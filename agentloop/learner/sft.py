"""Supervised warm start: maximise the log-likelihood of expert turns (the oracle episodes of the train
split, uploaded demonstrations) with the agent-token mask — the usual starting point before LOOP, and
StepAgent's."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from agentloop.agent.episode import Episode, Limits, run_episodes
from agentloop.agent.evaluate import EvalTask
from agentloop.agent.prompt import ChatFormat
from agentloop.learner.loop import sequence_logprobs
from agentloop.learner.rollouts import Rollout, build_rollout
from agentloop.learner.update import collate
from agentloop.policy.scripted import ScriptedPolicy


def expert_rollouts(tokenizer: Any, tasks: Sequence[EvalTask], limits: Limits) -> list[Rollout]:
    """Each task's oracle solution played through the real episode loop: exact token sequences."""
    policy = ScriptedPolicy(tokenizer, name="oracle")
    fmt = ChatFormat(tokenizer)
    episodes = []
    for i, task in enumerate(tasks):
        if task.expert is None:
            continue
        world, _ = task.start()
        key = f"{task.task_ref}#{i}"  # a task may appear several times (e.g. with other demonstrations)
        ep = Episode(world, fmt, task.instruction, limits, key=key)
        policy.plan_actions(key, task.expert())
        episodes.append((task, ep))
    run_episodes(policy, [ep for _, ep in episodes])
    return [build_rollout(t.task_ref, ep.prompt_token_ids, ep.turns, 1.0, True) for t, ep in episodes]


def supervised_steps(
    model: Any,
    rollouts: Sequence[Rollout],
    pad_id: int,
    steps: int,
    lr: float,
    batch_size: int = 4,
    seed: int = 0,
    chunk: int = 512,
) -> list[float]:
    """`steps` AdamW steps of -mean log p(agent tokens); returns the loss of each step."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    device = next(model.parameters()).device
    losses = []
    model.train()
    for _ in range(steps):
        batch = collate(rng.sample(list(rollouts), min(batch_size, len(rollouts))), pad_id).to(device)
        logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, chunk, target_mask=batch.agent_mask)
        mask = batch.agent_mask
        loss = -((logp * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses
