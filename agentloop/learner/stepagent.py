"""StepAgent — step-wise rewards from comparing the agent's actions with an expert's — as pure functions.

An expert trajectory (u, a*_1, o_1, ..., a*_n). At a prefix h_t = (u, a*_1, o_1, ..., o_{t-1}) the policy
samples M actions a^_t^1..M (inspection); each is compared with a*_t. Reflection turns the comparison into
an update, in one of two ways:

    implicit reward (step-level DPO), reference pi_ref = the adapter disabled:
        m_t   = beta * [(log pi(a*_t|h_t) - log pi_ref(a*_t|h_t)) - (log pi(a^_t|h_t) - log pi_ref(a^_t|h_t))]
        L     = -log sigmoid(m_t)  +  alpha * (-log pi(a*_t|h_t) / |a*_t|)          (the SFT anchor)
    inverse RL: a discriminator D(h, a) in (0, 1) learns expert (1) from agent (0) actions
        L_D   = -log D(h_t, a*_t) - log(1 - D(h_t, a^_t))
        r_t^m = D(h_t, a^_t^m);  A_t^m = r_t^m - mean_{j != m} r_t^j          (leave-one-out over the M samples)
        L     = LOOP's clipped objective on the sampled actions with A_t^m  +  alpha * (-log pi(a*_t|h_t) / |a*_t|)
        (the same SFT anchor: without it the policy climbs whatever D scores high, and D has seen a few
        dozen actions)

Greedy inspection (`inspection: greedy`, implicit reward only): the agent's action is its greedy one, and one
teacher-forced pass over an expert trajectory reads it at every step at once. Wherever the most likely token
y^_j after (h_t, y*_<j) is not the expert's y*_j, greedy decoding that had followed the expert so far leaves
it there: a pair, chosen y*_j and rejected y^_j after the same context (the tokens two such actions share
cancel in m_t, so the pair is the actions up to their first difference). The reference is the weights at
that optimizer step, or the adapter disabled; the anchor is SFT on every expert token:
        m_j   = beta * [(log pi(y*_j) - log pi_ref(y*_j)) - (log pi(y^_j) - log pi_ref(y^_j))]
        L     = alpha * (-mean_j log pi(y*_j))  +  mean over pairs of -log sigmoid(m_j)
A pair exists only while the expert's token is not the greedy one, so the contrast stops where agreement is
reached. One pass per expert, as for SFT: no decoding.

Combined with LOOP on the agent's own rollouts: A_t = A_trajectory + omega * A_step,t, where A_step,t is the
leave-one-out advantage (over the K rollouts of the task) of the turn's comparison reward.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agentloop.apps.tasks import ToolCall
from agentloop.learner.loop import LossStats, RatioLevel, ppo_clip_loss

# --- comparing an action with the expert's ---------------------------------------------------------

APP_WEIGHT, API_WEIGHT, ARGS_WEIGHT = 0.25, 0.25, 0.5  # a right app and API earn half, the arguments the rest
# a text world's command that is not the expert's: at most this, times the share of words the two have in common
COMMAND_WORDS_WEIGHT = 0.75


def normalise(value: Any) -> Any:
    """A value as two calls that mean the same would write it: strings trimmed, whitespace collapsed and
    case folded; a numeric string is its number; 3.0 is 3; containers normalised inside (dict order aside)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return int(value) if float(value).is_integer() else round(float(value), 9)
    if isinstance(value, str):
        text = " ".join(value.split()).casefold()
        try:
            number = float(text)
        except ValueError:
            return text
        return normalise(number) if math.isfinite(number) else text
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    if isinstance(value, dict):
        return {str(k): normalise(v) for k, v in value.items()}
    return value


def argument_agreement(args: dict[str, Any], expert_args: dict[str, Any]) -> float:
    """Share of the argument names (either call's) whose values agree after normalisation; 1 for two calls
    without arguments. An argument one call leaves out counts as a disagreement."""
    names = set(args) | set(expert_args)
    if not names:
        return 1.0
    same = sum(1 for n in names if n in args and n in expert_args and normalise(args[n]) == normalise(expert_args[n]))
    return same / len(names)


def command_reward(command: str, expert: str) -> float:
    """A text command against the expert's: 1.0 when they are the same after normalisation; else
    COMMAND_WORDS_WEIGHT times the F1 of their words ('go to hallway' for 'go to kitchen': 0.5; the right words
    in another order, 'move b to a' for 'move a to b': 0.75; another verb and object: 0)."""
    mine, theirs = str(normalise(command)).split(), str(normalise(expert)).split()
    if mine == theirs:
        return 1.0
    common = sum((Counter(mine) & Counter(theirs)).values())
    if not common:
        return 0.0
    precision, recall = common / len(mine), common / len(theirs)
    return COMMAND_WORDS_WEIGHT * 2 * precision * recall / (precision + recall)


def action_reward(action: ToolCall | None, expert: ToolCall, text: bool = False) -> float:
    """The step reward of an agent action against the expert's, in [0, 1]: 0 for no parseable call or another
    app; APP_WEIGHT for the app alone; + API_WEIGHT for the API; + ARGS_WEIGHT times the argument agreement.
    1.0 exactly when the calls are the same after normalisation. `text`: actions of a text world, one command
    each (`agent/actions.py`), compared by `command_reward` (every command is a call of the same app and API)."""
    if text:
        return command_reward(str(action.args.get("command", "")), str(expert.args["command"])) if action else 0.0
    if action is None or action.app.strip().casefold() != expert.app.strip().casefold():
        return 0.0
    if action.api.strip().casefold() != expert.api.strip().casefold():
        return APP_WEIGHT
    return APP_WEIGHT + API_WEIGHT + ARGS_WEIGHT * argument_agreement(action.args, expert.args)


def agrees(action: ToolCall | None, expert: ToolCall) -> bool:
    """Expert-action agreement: the same call after normalisation."""
    return action_reward(action, expert) == 1.0


def turn_rewards(actions: Sequence[ToolCall | None], expert: Sequence[ToolCall], text: bool = False) -> list[float]:
    """Step rewards of an agent's own trajectory against an expert trajectory of the same task: each turn is
    compared with the expert's next action not yet matched (a turn that matches it moves the pointer on), so
    an extra look-up costs that turn's reward and not the rest of the trajectory's. `text`: see action_reward."""
    rewards, j = [], 0
    for action in actions:
        if j >= len(expert):
            rewards.append(0.0)  # the expert was done: any further call is one too many
            continue
        r = action_reward(action, expert[j], text)
        rewards.append(r)
        if r == 1.0:
            j += 1
    return rewards


# --- step-level advantages --------------------------------------------------------------------------


def step_leave_one_out(rewards: Sequence[float]) -> list[float]:
    """A^m = r^m - mean_{j != m} r^j over the M samples at one prefix (or the K rollouts at one turn)."""
    m = len(rewards)
    if m < 2:
        return [0.0] * m
    total = sum(rewards)
    return [r - (total - r) / (m - 1) for r in rewards]


def turn_step_advantages(per_rollout: Sequence[Sequence[float]]) -> list[list[float]]:
    """Leave-one-out, at each turn index, over the rollouts (of one task) that reached that turn. Ragged:
    a turn only one rollout reached gets 0."""
    longest = max((len(r) for r in per_rollout), default=0)
    out = [[0.0] * len(r) for r in per_rollout]
    for t in range(longest):
        reached = [k for k, r in enumerate(per_rollout) if len(r) > t]
        advs = step_leave_one_out([per_rollout[k][t] for k in reached])
        for k, a in zip(reached, advs, strict=True):
            out[k][t] = a
    return out


def combined_advantages(trajectory: float, step: Sequence[float], omega: float) -> list[float]:
    """A_t = A_trajectory + omega * A_step,t for each turn t of one rollout."""
    return [trajectory + omega * a for a in step]


# --- reflection: implicit reward (step-level DPO with an SFT anchor) -----------------------------------


def sft_anchor(chosen: torch.Tensor, chosen_tokens: torch.Tensor | float) -> torch.Tensor:
    """The SFT anchor of both variants: -log pi(a*_t|h_t) / |a*_t|, from the expert action's summed log-prob
    and its token count."""
    if isinstance(chosen_tokens, torch.Tensor):
        return -chosen / chosen_tokens.clamp(min=1)
    return -chosen / max(chosen_tokens, 1)


def dpo_terms(
    chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float
) -> torch.Tensor:
    """-log sigmoid(m) per pair, m = beta * [(log pi(chosen) - log pi_ref(chosen)) - (log pi(rejected) -
    log pi_ref(rejected))]."""
    return -F.logsigmoid(beta * ((chosen - ref_chosen) - (rejected - ref_rejected)))


@dataclass
class GreedyComparison:
    """The greedy actions of expert trajectories against the experts', token by token."""

    wrong: torch.Tensor  # (n,) bool: the greedy token is not the expert's (a pair)
    steps: int  # expert actions compared
    steps_agreeing: int  # of them, those whose greedy action is the expert's (no wrong token)


def greedy_comparison(expert: torch.Tensor, greedy: torch.Tensor, step_ids: torch.Tensor) -> GreedyComparison:
    """expert, greedy: (n,) the expert's token and the most likely one at each action token; step_ids: (n,)
    which expert action (any ids, unique per action) each token belongs to."""
    wrong = expert != greedy
    steps, inverse = torch.unique(step_ids, return_inverse=True)
    wrong_in_step = torch.zeros(len(steps), dtype=torch.long, device=expert.device).scatter_add(
        0, inverse, wrong.long()
    )
    return GreedyComparison(wrong, len(steps), int((wrong_in_step == 0).sum()))


@dataclass
class DpoStats:
    loss: float
    dpo: float
    anchor: float
    margin: float  # mean m_t / beta: the chosen action's implicit reward above the rejected one's
    accuracy: float  # share of pairs with m_t > 0


def step_dpo_loss(
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    chosen_tokens: torch.Tensor,
    beta: float,
    anchor_weight: float,
) -> tuple[torch.Tensor, DpoStats]:
    """Mean over pairs of -log sigmoid(m) + alpha * (-log pi(a*) / |a*|). Inputs (P,): each pair's summed
    log-probs of the chosen (expert) and rejected (agent) action under the policy and the reference, and the
    chosen action's token count."""
    margin = (chosen - ref_chosen) - (rejected - ref_rejected)  # (P,)
    dpo = dpo_terms(chosen, rejected, ref_chosen, ref_rejected, beta)
    anchor = sft_anchor(chosen, chosen_tokens)
    loss = (dpo + anchor_weight * anchor).mean()
    with torch.no_grad():
        stats = DpoStats(
            loss=float(loss),
            dpo=float(dpo.mean()),
            anchor=float(anchor.mean()),
            margin=float(margin.mean()),
            accuracy=float((margin > 0).float().mean()),
        )
    return loss, stats


# --- reflection: inverse RL (a discriminator's score as the step reward) ------------------------------


class Discriminator(torch.nn.Module):
    """D(h, a): a small classifier over features the frozen base model computes anyway (the reference
    pass of the inspection: adapter disabled, no gradient) — its last hidden state at the end of the prefix
    h and its mean over the action's tokens a. Separate from the policy: training it never moves the
    policy's weights, and its features do not drift as the policy learns.

    The features are standardised, each dimension by its mean and spread over the cycle's rows
    (`standardise`): the actions at one prefix differ in a few tokens, which moves the raw features by well
    under a percent of their norm (measured on the toy world: 0.03 on a norm of 12), too little for a
    classifier to see among the dimensions that every row shares."""

    mean: torch.Tensor
    scale: torch.Tensor

    def __init__(self, hidden_size: int, width: int = 64) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(2 * hidden_size))
        self.register_buffer("scale", torch.ones(2 * hidden_size))
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2 * hidden_size, width),
            torch.nn.Tanh(),
            torch.nn.Linear(width, 1),
        )

    @torch.no_grad()
    def standardise(self, features: torch.Tensor, eps: float = 1e-6) -> None:
        """Take each dimension's mean and standard deviation over `features` (N, 2H) as D's input scale."""
        self.mean.copy_(features.mean(dim=0))
        self.scale.copy_(features.std(dim=0, unbiased=False).clamp(min=eps))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(N, 2H) features -> (N,) logits; D = sigmoid(logit)."""
        return self.net((features - self.mean) / self.scale).squeeze(-1)


def discriminator_loss(expert_logits: torch.Tensor, agent_logits: torch.Tensor) -> tuple[torch.Tensor, float]:
    """-mean log D(expert) - mean log(1 - D(agent)), and the accuracy over both sides (D > 0.5 on experts,
    < 0.5 on agents)."""
    loss = -F.logsigmoid(expert_logits).mean() - F.logsigmoid(-agent_logits).mean()
    with torch.no_grad():
        right = int((expert_logits > 0).sum()) + int((agent_logits < 0).sum())
        accuracy = right / max(expert_logits.numel() + agent_logits.numel(), 1)
    return loss, accuracy


def discriminator_rewards(logits: torch.Tensor) -> list[float]:
    """r = D(h, a) in (0, 1): the step reward of each sampled action."""
    return torch.sigmoid(logits).tolist()


def irl_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    expert: torch.Tensor,
    expert_tokens: int,
    eps: float,
    anchor_weight: float,
    level: RatioLevel = "token",
) -> tuple[torch.Tensor, LossStats, float]:
    """LOOP's clipped loss on one prefix's sampled actions (logp, old_logp, mask: (M, T); advantages: (M,),
    their leave-one-out D-advantages) plus alpha * (-log pi(a*_t|h_t) / |a*_t|), `expert` being the expert
    action's summed log-prob. Returns the loss, the clipped part's stats and the anchor's value."""
    clipped, stats = ppo_clip_loss(logp, old_logp, advantages, mask, eps, level)
    anchor = sft_anchor(expert, expert_tokens)
    return clipped + anchor_weight * anchor, stats, float(anchor.detach())
