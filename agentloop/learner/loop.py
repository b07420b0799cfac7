"""LOOP — leave-one-out PPO for LLM agents — as pure torch functions.

Per task, K rollouts from the same initial state; reward R = fraction of tests passed.

    A_k = R_k - mean_{j != k} R_j                              (leave-one-out baseline; no value network)
    rho_t = exp(log pi_theta(a_t) - log pi_old(a_t))          over the agent's own tokens only
    L_rollout = -mean_t min(rho_t A, clip(rho_t, 1/(1+eps), 1+eps) A)

Rollouts with |A| < 0.01 carry no signal and are dropped. Std normalisation (GRPO) is an option; the
LOOP paper measured it 9 points worse. Log-probs are computed a chunk of positions at a time, so the
full (positions x vocabulary) fp32 log-softmax never exists at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.checkpoint import checkpoint

RatioLevel = Literal["token", "turn", "trajectory"]


# --- advantages ----------------------------------------------------------------------------------


def leave_one_out_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(N tasks, K rollouts) rewards -> advantages A_k = R_k - mean of the other K-1 rewards."""
    k = rewards.shape[-1]
    if k < 2:
        raise ValueError("leave-one-out needs at least 2 rollouts per task")
    total = rewards.sum(dim=-1, keepdim=True)
    return rewards - (total - rewards) / (k - 1)


def group_normalised_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """GRPO's advantage: (R_k - mean_j R_j) / (std_j R_j + eps) within each task's group."""
    mean = rewards.mean(dim=-1, keepdim=True)
    std = rewards.std(dim=-1, keepdim=True, unbiased=False)
    return (rewards - mean) / (std + eps)


def std_normalise(advantages: torch.Tensor, rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Scale each task's advantages by the std of its rewards (an option; off by default)."""
    return advantages / (rewards.std(dim=-1, keepdim=True, unbiased=False) + eps)


def keep_mask(advantages: torch.Tensor, threshold: float = 0.01) -> torch.Tensor:
    """Rollouts worth training on: |A| >= threshold (drops every rollout of an all-equal group)."""
    return advantages.abs() >= threshold


def trajectory_advantages(
    groups: Sequence[Sequence[float]], algo: str, std_norm: bool = False
) -> list[list[float] | None]:
    """Each group's rewards (K rollouts of one task; groups may be ragged) -> their advantages, or None for
    a group too small for a baseline. loop: leave-one-out (optionally std-normalised); grpo: group-normalised;
    reinforce: one baseline, the mean reward of the whole batch (so it needs no groups)."""
    if algo == "reinforce":
        every = [r for g in groups for r in g]
        baseline = sum(every) / max(len(every), 1)
        return [[r - baseline for r in g] for g in groups]
    out: list[list[float] | None] = []
    for group in groups:
        if len(group) < 2:
            out.append(None)
            continue
        rewards = torch.tensor([list(group)], dtype=torch.float64)
        if algo == "grpo":
            adv = group_normalised_advantages(rewards)
        else:
            adv = leave_one_out_advantages(rewards)
            if std_norm:
                adv = std_normalise(adv, rewards)
        out.append(adv[0].tolist())
    return out


# --- log-probs -------------------------------------------------------------------------------------


def _chunk_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    logits = (hidden @ weight.T).float()  # (B, C, V) for this chunk only
    if temperature != 1.0:
        logits = logits / temperature
    several = targets.dim() == logits.dim()  # (B, C, k): k tokens' log-probs at each position
    picked = targets if several else targets.unsqueeze(-1)
    out = logits.gather(-1, picked) - torch.logsumexp(logits, dim=-1, keepdim=True)  # (B, C, k)
    return out if several else out.squeeze(-1)


def logprobs_from_hidden(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int = 512, temperature: float = 1.0
) -> torch.Tensor:
    """log p(targets) from final hidden states (B, T, H) and the output matrix (V, H), `chunk` positions at
    a time; targets (B, T), or (B, T, k) for k tokens' log-probs at each position. With gradients, each
    chunk's logits are recomputed in the backward pass instead of being kept, so peak memory holds one
    (B, chunk, V) block, not (B, T, V)."""
    out = []
    for start in range(0, hidden.shape[1], chunk):
        h, t = hidden[:, start : start + chunk], targets[:, start : start + chunk]
        if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
            out.append(checkpoint(_chunk_logprobs, h, weight, t, temperature, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(h, weight, t, temperature))
    return torch.cat(out, dim=1)


def sequence_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    chunk: int = 512,
    temperature: float = 1.0,
    target_mask: torch.Tensor | None = None,
    frozen: int = 0,
) -> torch.Tensor:
    """log p(input_ids[:, t+1] | input_ids[:, :t+1]): (B, T-1). Works for a plain causal LM and for a
    PEFT-wrapped one (the output layer is not adapted). With `target_mask` (B, T-1), the output layer
    runs only where it is 1 (the agent's tokens) and other positions are 0: a long prompt costs one
    decoder pass, not a vocabulary-sized product per position. `frozen`: as `decoder_hidden`'s."""
    hidden = decoder_hidden(model.get_decoder(), input_ids, attention_mask, frozen)  # (B, T, H)
    weight = model.get_output_embeddings().weight  # (V, H)
    hidden, targets = hidden[:, :-1], input_ids[:, 1:]
    if target_mask is None:
        return logprobs_from_hidden(hidden, weight, targets, chunk, temperature)
    rows, cols = target_mask.nonzero(as_tuple=True)
    picked = logprobs_from_hidden(
        hidden[rows, cols].unsqueeze(0), weight, targets[rows, cols].unsqueeze(0), chunk, temperature
    )[0]  # (n,)
    out = torch.zeros(targets.shape, dtype=picked.dtype, device=picked.device)
    return out.index_put((rows, cols), picked)


@torch.no_grad()
def greedy_tokens(hidden: torch.Tensor, weight: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """The most likely next token after each of (n, H) final hidden states: (n,)."""
    best = [(hidden[s : s + chunk] @ weight.T).argmax(dim=-1) for s in range(0, len(hidden), chunk)]
    return torch.cat(best) if best else torch.zeros(0, dtype=torch.long, device=hidden.device)


@torch.no_grad()
def greedy_hits(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_mask: torch.Tensor, chunk: int = 512
) -> torch.Tensor:
    """Teacher forcing: (B, T-1) bool, True where `target_mask` (B, T-1) is 1 and the most likely token after
    position t is input_ids[:, t+1]. Greedy decoding from a prefix writes a given continuation exactly iff
    this holds at every one of its positions, so one pass over a sequence answers that for all its parts."""
    hidden = decoder_hidden(model.get_decoder(), input_ids, attention_mask)[:, :-1]  # (B, T-1, H)
    weight = model.get_output_embeddings().weight  # (V, H)
    rows, cols = target_mask.nonzero(as_tuple=True)
    picked, targets = hidden[rows, cols], input_ids[:, 1:][rows, cols]  # (n, H), (n,)
    out = torch.zeros(target_mask.shape, dtype=torch.bool, device=input_ids.device)
    out[rows, cols] = greedy_tokens(picked, weight, chunk) == targets
    return out


SHARED_OPENING_MIN_TOKENS = 16  # below this, running the opening apart saves less than it costs


def shared_opening(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> int:
    """How many leading tokens every row has in common (and attends to): rollouts open with the same
    system prompt and worked example, often the same instruction."""
    same = (input_ids == input_ids[:1]).all(dim=0)
    if attention_mask is not None:
        same &= attention_mask.bool().all(dim=0)
    return int(same.long().cumprod(dim=0).sum())


def decoder_hidden(
    decoder: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, frozen: int = 0
) -> torch.Tensor:
    """The decoder's last hidden states. When the rows share an opening, it runs once (batch 1) and every
    row's remainder attends to its keys/values: the same function, so the same values and gradients (they
    flow back through the shared keys/values and add up), at a fraction of the cost when the opening
    is most of each sequence.

    `frozen`: the first `frozen` positions run without gradients and reach the rest as constant keys and
    values: the same values, a backward that skips them, and no gradient for how they are read (a
    different objective; `prompt_gradients`). Ignored where layers are recomputed in backward."""
    B, T = input_ids.shape
    opening = min(shared_opening(input_ids, attention_mask), T - 1) if B > 1 else 0
    opening = opening if opening >= SHARED_OPENING_MIN_TOKENS else 0
    frozen = max(0, min(frozen, T - 1))
    if (opening == 0 and frozen == 0) or recomputes_layers(decoder):
        return decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    from transformers import DynamicCache

    from agentloop.policy.models import output_cache

    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    cuts = sorted({0, opening, frozen, T})
    cache, pieces, grad = None, [], torch.is_grad_enabled()
    for start, end in itertools.pairwise(cuts):
        alone = end <= opening  # the shared opening: one row for all
        if not alone and cache is not None and pieces[-1].shape[0] == 1 < B:
            kv = [(lay.keys.expand(B, -1, -1, -1), lay.values.expand(B, -1, -1, -1)) for lay in cache.layers]
            cache = DynamicCache(ddp_cache_data=kv)
        rows = slice(0, 1) if alone else slice(None)
        with torch.set_grad_enabled(grad and start >= frozen):
            out = decoder(
                input_ids=input_ids[rows, start:end],
                attention_mask=None if alone else mask[:, :end],
                cache=cache,
                use_cache=True,
            )
        cache = output_cache(out)
        pieces.append(out.last_hidden_state)
    return torch.cat([p.expand(B, -1, -1) for p in pieces], dim=1)


def recomputes_layers(decoder: Any) -> bool:
    """Whether this forward recomputes its layers in backward (activation checkpointing, training, with
    gradients): the replay would drop or rewrite a cache, so rows then run whole, without sharing."""
    return bool(decoder.training and torch.is_grad_enabled() and getattr(decoder, "is_activation_checkpointing", False))


def naive_sequence_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The obvious way (full log-softmax over every position); for tests and the memory benchmark."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float()  # (B, T, V)
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


# --- the clipped objective -------------------------------------------------------------------------


@dataclass
class LossStats:
    clip_frac: float
    approx_kl: float
    ratio_mean: float
    tokens: int


def _segment_sum(values: torch.Tensor, segments: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per token: the sum of `values` over the tokens of the same (row, segment)."""
    B = values.shape[0]
    n_seg = int(segments.max().item()) + 1 if segments.numel() else 1
    seg = segments.clamp(min=0)
    sums = torch.zeros((B, n_seg), dtype=values.dtype, device=values.device)
    sums = sums.scatter_add(1, seg, values * mask)
    return sums.gather(1, seg)


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps: float = 0.1,
    level: RatioLevel = "token",
    turn_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """LOOP's clipped surrogate. logp/old_logp/mask: (B, T) over generated positions, mask = 1 on the
    agent's own tokens; advantages: (B,), or (B, T) when they differ by step (LOOP+step). Returns the mean
    over rollouts of each rollout's mean token loss.
    `level`: the importance ratio per token (default), per turn (product over the turn's tokens) or per
    trajectory (product over all agent tokens)."""
    mask = mask.to(logp.dtype)
    log_ratio = (logp - old_logp) * mask  # (B, T)
    if level == "token":
        seq_log_ratio = log_ratio
    elif level == "turn":
        if turn_ids is None:
            raise ValueError("level='turn' needs turn_ids")
        seq_log_ratio = _segment_sum(log_ratio, turn_ids, mask)
    elif level == "trajectory":
        seq_log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(log_ratio)
    else:
        raise ValueError(f"unknown ratio level {level!r}")
    ratio = torch.exp(seq_log_ratio)  # (B, T)
    adv = advantages.to(logp.dtype)
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv  # (B, 1), or (B, T): an advantage per token
    low, high = 1.0 / (1.0 + eps), 1.0 + eps
    surrogate = torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)
    per_rollout = -(surrogate * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (B,)
    loss = per_rollout.mean()
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        clipped = ((ratio < low) | (ratio > high)).to(mask.dtype) * mask
        token_ratio = torch.exp(log_ratio)
        stats = LossStats(
            clip_frac=float(clipped.sum() / n),
            approx_kl=float(k3_kl(log_ratio, mask)),  # KL(old || new): the tokens were sampled by old
            ratio_mean=float((token_ratio * mask).sum() / n),
            tokens=int(mask.sum().item()),
        )
    return loss, stats


def policy_gradient_loss(logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE: -A * mean_t log pi(a_t), per rollout, averaged over rollouts."""
    mask = mask.to(logp.dtype)
    per_rollout = -(logp * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0) * advantages.to(logp.dtype)
    return per_rollout.mean()


def k3_kl(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The k3 estimate of KL(q || p) from tokens sampled by q, log_ratio = log p - log q per token:
    mean over masked tokens of (r - 1) - log r, r = p / q. Unbiased, and >= 0 for every token."""
    mask = mask.to(log_ratio.dtype)
    per_token = torch.exp(log_ratio) - 1.0 - log_ratio
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


def kl_to_reference(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(pi_theta || pi_ref) over the agent's tokens, sampled by pi_theta (the optional penalty, weight lambda)."""
    return k3_kl(ref_logp - logp, mask)
