"""One iteration's policy update: batches of rollouts through the clipped objective, under accelerate,
so the same code runs on one CPU, one GPU or several processes (DDP/FSDP via `accelerate launch`).

    for epoch in 1..E:                               # paper: 2
        for minibatch of M rollouts (shuffled):      # paper: 32, gradient accumulation
            loss = mean_r L_rollout(r) [+ lambda KL]
            clip grad norm; AdamW step
            stop the iteration if the KL estimate exceeds kl_stop
"""

from __future__ import annotations

import math
import random
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from agentloop import faults
from agentloop.learner.config import LoopConfig
from agentloop.learner.loop import k3_kl, kl_to_reference, policy_gradient_loss, ppo_clip_loss, sequence_logprobs
from agentloop.learner.rollouts import Rollout


class LogprobModel(nn.Module):
    """The policy as one module whose forward returns token log-probs (chunked), so that DDP or FSDP
    wrap the whole computation (their hooks see the forward that produced the gradients)."""

    def __init__(self, model: Any, chunk: int) -> None:
        super().__init__()
        self.model = model
        self.chunk = chunk

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return sequence_logprobs(self.model, input_ids, attention_mask, self.chunk, target_mask=target_mask)


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    agent_mask: torch.Tensor  # (B, T-1): 1 where the target token was sampled by the agent
    turn_ids: torch.Tensor  # (B, T-1)
    sampler_logprobs: torch.Tensor  # (B, T-1)

    def to(self, device: torch.device) -> Batch:
        return Batch(
            *(
                t.to(device)
                for t in (self.input_ids, self.attention_mask, self.agent_mask, self.turn_ids, self.sampler_logprobs)
            )
        )


def collate(rollouts: Sequence[Rollout], pad_id: int) -> Batch:
    """Right-padded tensors; masks and log-probs shifted to line up with next-token targets."""
    width = max(len(r.token_ids) for r in rollouts)
    B = len(rollouts)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attn = torch.zeros((B, width), dtype=torch.long)
    agent = torch.zeros((B, width), dtype=torch.float32)
    turns = torch.full((B, width), -1, dtype=torch.long)
    logps = torch.zeros((B, width), dtype=torch.float32)
    for b, r in enumerate(rollouts):
        n = len(r.token_ids)
        ids[b, :n] = torch.tensor(r.token_ids)
        attn[b, :n] = 1
        agent[b, :n] = torch.tensor(r.agent_mask, dtype=torch.float32)
        turns[b, :n] = torch.tensor(r.turn_ids)
        logps[b, :n] = torch.tensor(r.sampler_logprobs)
    return Batch(ids, attn, agent[:, 1:], turns[:, 1:], logps[:, 1:])


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


@torch.no_grad()
def compute_logprobs(
    module: nn.Module, rollouts: Sequence[Rollout], pad_id: int, micro_batch: int, device: torch.device
) -> list[torch.Tensor]:
    """The learner's own log-probs of every rollout's tokens (B, T-1 per rollout), e.g. pi_old."""
    out: list[torch.Tensor] = []
    module.eval()
    for start in range(0, len(rollouts), micro_batch):
        chunk = rollouts[start : start + micro_batch]
        batch = collate(chunk, pad_id).to(device)
        logp = module(batch.input_ids, batch.attention_mask, batch.agent_mask).float()
        for b, r in enumerate(chunk):
            out.append(logp[b, : len(r.token_ids) - 1].cpu())
    return out


def sampler_gap(learner_logprobs: Sequence[torch.Tensor], rollouts: Sequence[Rollout]) -> float:
    """Mean |log pi_learner - log pi_sampler| over agent tokens: how far the sampler's numbers are from ours."""
    total, count = 0.0, 0
    for lp, r in zip(learner_logprobs, rollouts, strict=True):
        mask = torch.tensor(r.agent_mask[1:], dtype=torch.bool)
        sampled = torch.tensor(r.sampler_logprobs[1:])
        total += float((lp - sampled).abs()[mask].sum())
        count += int(mask.sum())
    return total / max(count, 1)


def update(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    accelerator: Any,
    rollouts: Sequence[Rollout],
    advantages: Sequence[float | Sequence[float]],
    old_logprobs: Sequence[torch.Tensor] | None,
    config: LoopConfig,
    pad_id: int,
    rng: random.Random,
    reference: Any | None = None,
    between_steps: Callable[[int], None] | None = None,
    algo: str | None = None,
) -> dict[str, float]:
    """Train on the rollouts. `old_logprobs` None: the sampler's log-probs are pi_old. With several
    processes, each takes its share of every minibatch; gradients are averaged across them.
    `between_steps(steps_done)` runs after each optimizer step (the trainer's cancel check: an exception
    from it stops the update there). `algo`: the phase's algorithm when it is not `config.algo`."""
    device = accelerator.device
    world, rank = accelerator.num_processes, accelerator.process_index
    params = [p for p in module.parameters() if p.requires_grad]
    order = list(range(len(rollouts)))
    stats: dict[str, list[float]] = {"loss": [], "clip_frac": [], "approx_kl": [], "grad_norm": []}
    tokens, steps, stopped = 0, 0, False
    start = time.perf_counter()
    module.train()
    for _epoch in range(config.epochs):
        rng.shuffle(order)  # the same rng on every process: the same minibatches everywhere
        for mb_start in range(0, len(order), config.minibatch_size):
            minibatch = order[mb_start : mb_start + config.minibatch_size]
            # rollouts of one task side by side: a micro-batch of them runs their common prompt once
            mine = sorted(minibatch[rank::world], key=lambda i: rollouts[i].task_ref)
            optimizer.zero_grad(set_to_none=True)
            kls, clips, losses = [], [], []
            for micro_start in range(0, len(mine), config.micro_batch_size):
                idx = mine[micro_start : micro_start + config.micro_batch_size]
                batch = collate([rollouts[i] for i in idx], pad_id).to(device)
                if old_logprobs is None:
                    old = batch.sampler_logprobs
                else:
                    old = torch.zeros_like(batch.sampler_logprobs)
                    for b, i in enumerate(idx):
                        old[b, : old_logprobs[i].shape[0]] = old_logprobs[i].to(device)
                adv = _advantage_tensor([advantages[i] for i in idx], batch.turn_ids).to(device)
                logp = module(batch.input_ids, batch.attention_mask, batch.agent_mask)  # (B, T-1), 0 off-agent
                if (algo or config.algo) == "reinforce":
                    loss = policy_gradient_loss(logp, adv, batch.agent_mask)
                    with torch.no_grad():
                        kl = float(k3_kl(logp - old, batch.agent_mask))  # KL(old || new), as LOOP's
                    clip = 0.0
                else:
                    loss, s = ppo_clip_loss(
                        logp, old, adv, batch.agent_mask, config.clip_eps, config.ratio_level, batch.turn_ids
                    )
                    kl, clip = s.approx_kl, s.clip_frac
                if config.kl_coef > 0 and reference is not None:
                    with torch.no_grad(), reference.disable_adapter():
                        ref = sequence_logprobs(
                            reference,
                            batch.input_ids,
                            batch.attention_mask,
                            config.logprob_chunk,
                            target_mask=batch.agent_mask,
                        )
                    loss = loss + config.kl_coef * kl_to_reference(logp, ref, batch.agent_mask)
                # each micro-batch's share of the minibatch mean (rollouts weigh the same)
                accelerator.backward(loss * len(idx) / len(minibatch) * world)
                tokens += int(batch.attention_mask.sum())
                kls.append(kl)
                clips.append(clip)
                losses.append(float(loss.detach()))
            if world > 1 and not _is_wrapped(module):
                for p in params:  # a module nobody wrapped: average the gradients by hand
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    p.grad = accelerator.reduce(p.grad, reduction="mean")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
            optimizer.step()
            steps += 1
            faults.crash_point("learner_update")
            mean_kl = (
                float(accelerator.reduce(torch.tensor(sum(kls) / max(len(kls), 1), device=device), reduction="mean"))
                if kls
                else 0.0
            )
            stats["loss"].append(sum(losses) / max(len(losses), 1))
            stats["clip_frac"].append(sum(clips) / max(len(clips), 1))
            stats["approx_kl"].append(mean_kl)
            stats["grad_norm"].append(grad_norm)
            if mean_kl > config.kl_stop:
                stopped = True
                break
            if between_steps is not None:
                between_steps(steps)
        if stopped:
            break
    elapsed = time.perf_counter() - start
    mean = {k: (sum(v) / len(v) if v else 0.0) for k, v in stats.items()}
    return {
        "loss/policy": mean["loss"],
        "loss/clip_frac": mean["clip_frac"],
        "loss/approx_kl": mean["approx_kl"],
        "loss/grad_norm": mean["grad_norm"] if math.isfinite(mean["grad_norm"]) else -1.0,
        "update/steps": float(steps),
        "update/kl_stopped": float(stopped),
        "perf/tokens_per_s": tokens * world / elapsed if elapsed > 0 else 0.0,
        "perf/update_s": elapsed,
        "perf/peak_mem_mb": peak_memory_mb(device),
    }


def _advantage_tensor(advantages: Sequence[float | Sequence[float]], turn_ids: torch.Tensor) -> torch.Tensor:
    """(B,) when every rollout has one advantage; else (B, T): each token gets its turn's (loop+step), a
    rollout with one advantage gets it at every token."""
    if all(isinstance(a, float | int) for a in advantages):
        return torch.tensor(advantages, dtype=torch.float32)
    out = torch.zeros(turn_ids.shape, dtype=torch.float32)
    for b, a in enumerate(advantages):
        if isinstance(a, float | int):
            out[b] = float(a)
            continue
        per_turn = torch.tensor([*a, 0.0], dtype=torch.float32)  # index -1 (not an agent token) -> 0
        turns = turn_ids[b].cpu().clamp(max=len(a) - 1)
        out[b] = per_turn[torch.where(turns >= 0, turns, torch.full_like(turns, len(a)))]
    return out


def _is_wrapped(module: nn.Module) -> bool:
    return type(module).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel")
