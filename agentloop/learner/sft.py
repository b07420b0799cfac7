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
    micro_tokens: int = 4096,
) -> list[float]:
    """`steps` AdamW steps of -mean log p(agent tokens); returns the loss of each step.

    A step's sequences go through the model in micro-batches of at most `micro_tokens` padded tokens
    (one sequence alone when it is longer), gradients accumulated: activations, not the batch size,
    bound memory (a whole oracle episode is thousands of tokens)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    device = next(model.parameters()).device
    losses = []
    model.train()
    for _ in range(steps):
        picked = rng.sample(list(rollouts), min(batch_size, len(rollouts)))
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for micro in _micro_batches(picked, micro_tokens):
            batch = collate(micro, pad_id).to(device)
            mask = batch.agent_mask
            logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, chunk, target_mask=mask)
            per_seq = (logp * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
            loss = -per_seq.sum() / len(picked)  # this micro-batch's share of the step's mean
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(total)
    model.eval()
    return losses


def _micro_batches(rollouts: Sequence[Rollout], micro_tokens: int) -> list[list[Rollout]]:
    """Consecutive groups (by length) whose padded size stays within `micro_tokens`."""
    groups: list[list[Rollout]] = []
    for r in sorted(rollouts, key=lambda r: len(r.token_ids)):
        if groups and len(r.token_ids) * (len(groups[-1]) + 1) <= micro_tokens:
            groups[-1].append(r)
        else:
            groups.append([r])
    return groups
