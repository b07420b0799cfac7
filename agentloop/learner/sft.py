"""Supervised steps: maximise the log-likelihood of expert turns (oracle solutions, uploaded
demonstrations, successful client episodes: experts.py) with the agent-token mask — the usual starting
point before LOOP, and StepAgent's. `SftTrainer` is the `sft` algorithm: each iteration draws fresh
experts and makes `sft_steps` optimizer steps on them."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from agentloop.learner.experts import expert_rollouts
from agentloop.learner.loop import SHARED_OPENING_MIN_TOKENS, recomputes_layers, sequence_logprobs
from agentloop.learner.recovery import with_recoveries
from agentloop.learner.rollouts import Rollout
from agentloop.learner.trainer import Trainer
from agentloop.learner.update import Batch, collate
from agentloop.policy.local import common_length

SequenceLoss = Callable[[Any, Batch, int], torch.Tensor]  # (model, micro-batch, log-prob chunk) -> (B,)


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
    optimizer: torch.optim.Optimizer | None = None,
    between_steps: Callable[[int], None] | None = None,
    sequence_loss: SequenceLoss | None = None,
    prompt_gradients: bool = True,
) -> list[float]:
    """`steps` AdamW steps of -mean log p(agent tokens); returns the loss of each step. `optimizer`: the
    caller's (a run's, checkpointed with it), else a fresh AdamW at `lr`; `between_steps(n)` after each;
    `sequence_loss(model, batch, chunk)`: each sequence's loss (B,) instead of that mean (StepAgent's greedy
    reflection adds its pairs to it). `prompt_gradients=False`: that mean with the tokens before a
    micro-batch's first agent token run without gradients (`prompt_nll`).

    A step's sequences go through the model in micro-batches of at most `micro_tokens` tokens run (their
    shared opening counted once, the rest padded; one sequence alone when it is longer), gradients
    accumulated: activations, not the batch size, bound memory (a whole oracle episode is thousands of
    tokens)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = optimizer or torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    device = next(model.parameters()).device
    losses = []
    model.train()
    for _ in range(steps):
        picked = rng.sample(list(rollouts), min(batch_size, len(rollouts)))
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for micro in micro_batches(picked, micro_tokens, shared=not recomputes_layers(model.get_decoder())):
            batch = collate(micro, pad_id).to(device)
            per_seq = (sequence_loss or (expert_nll if prompt_gradients else prompt_nll))(model, batch, chunk)
            loss = per_seq.sum() / len(picked)  # this micro-batch's share of the step's mean
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(total)
        if between_steps is not None:
            between_steps(len(losses))
    model.eval()
    return losses


def expert_nll(model: Any, batch: Batch, chunk: int) -> torch.Tensor:
    """Each sequence's -mean log p(agent tokens): (B,)."""
    mask = batch.agent_mask
    logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, chunk, target_mask=mask)
    return -(logp * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def prompt_nll(model: Any, batch: Batch, chunk: int) -> torch.Tensor:
    """`expert_nll` with the prompt frozen: the positions before the micro-batch's first agent token run
    without gradients, their keys and values constants to the turns after them. Same loss value; the
    backward skips the prompt (the system prompt, the worked example, the task: most of an expert episode's
    tokens), and what is trained is how the agent's turns use the prompt, not how the prompt is read."""
    mask = batch.agent_mask
    cols = mask.any(dim=0).nonzero()
    frozen = int(cols[0]) if len(cols) else 0  # hidden state c predicts token c + 1: c keeps its gradient
    logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask, chunk, target_mask=mask, frozen=frozen)
    return -(logp * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def micro_batches(rollouts: Sequence[Rollout], micro_tokens: int, shared: bool = True) -> list[list[Rollout]]:
    """Consecutive groups (by length) whose cost stays within `micro_tokens`. With `shared`, a group costs
    its rows' common opening once plus each row's padded rest (`decoder_hidden` runs the opening once):
    every episode of a world opens with the same system prompt and worked example, so a micro-batch holds
    more episodes than their whole lengths would let it."""
    groups: list[list[Rollout]] = []
    opening = 0  # of the last group
    for r in sorted(rollouts, key=lambda r: len(r.token_ids)):
        if groups:
            common = common_length(groups[-1][0].token_ids, r.token_ids, opening) if shared else 0
            if common < SHARED_OPENING_MIN_TOKENS:
                common = 0
            if common + (len(groups[-1]) + 1) * (len(r.token_ids) - common) <= micro_tokens:
                groups[-1].append(r)
                opening = common
                continue
        groups.append([r])
        opening = len(r.token_ids)
    return groups


def run_steps(
    trainer: Trainer, i: int, rollouts: Sequence[Rollout], sequence_loss: SequenceLoss | None = None
) -> list[float]:
    """Iteration i's `sft_steps` supervised steps of `sft_batch_size` experts with the trainer's optimizer and
    settings (SFT alone, and StepAgent's greedy reflection with its `sequence_loss`)."""
    c = trainer.config
    return supervised_steps(
        trainer.model,
        rollouts,
        trainer.pad_id,
        c.sft_steps,
        c.lr,
        batch_size=c.sft_batch_size,
        seed=trainer.rng.randrange(2**31),
        chunk=c.logprob_chunk,
        micro_tokens=c.micro_tokens,
        optimizer=trainer.optimizer,
        between_steps=lambda n: trainer.safe_point(f"in iteration {i}, after supervised step {n}"),
        sequence_loss=sequence_loss,
        prompt_gradients=c.prompt_gradients,
    )


class SftTrainer(Trainer):
    """sft: supervised steps on experts drawn fresh each iteration (oracles of procedural train tasks,
    demonstrations, successful client episodes)."""

    def sft_iteration(self, i: int, algo: str) -> dict[str, Any]:
        c = self.config
        t0 = time.perf_counter()
        self.report({"phase": "experts", "iteration": i})
        tasks, counts = self.expert_tasks(i)
        rollouts = expert_rollouts(self.tokenizer, tasks, self.limits(expert=True))
        self.safe_point(f"in iteration {i}, after drawing its experts")
        if not rollouts:
            return {"iteration": i, "experts": 0.0, **counts}
        if c.recovery_share > 0:
            self.report({"phase": "recovery", "iteration": i, "experts": len(rollouts)})
            self.policy.clear_cache()  # the weights changed since the policy last ran
            rollouts, found = with_recoveries(
                self.policy, tasks, rollouts, self.limits(expert=True), c.max_new_tokens, c.recovery_share, self.rng
            )
            self.policy.clear_cache()
            counts |= found
            self.safe_point(f"in iteration {i}, after its recoveries")
        self.report({"phase": "updating", "iteration": i, "experts": len(rollouts), "steps": c.sft_steps})
        t1 = time.perf_counter()
        losses = run_steps(self, i, rollouts)
        self.policy.clear_cache()
        tokens = sum(len(r.token_ids) for r in rollouts) * c.sft_steps * c.sft_batch_size / len(rollouts)
        update_s = time.perf_counter() - t1
        return {
            "iteration": i,
            "loss/sft": sum(losses) / len(losses),
            "loss/sft_last": losses[-1],
            "experts": float(len(rollouts)),
            **counts,
            "perf/expert_s": t1 - t0,
            "perf/update_s": update_s,
            "perf/tokens_per_s": tokens / update_s if update_s > 0 else 0.0,
            "updated": 1.0,
        }
