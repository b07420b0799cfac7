"""StepAgent's iteration (the objectives are in stepagent.py): inspection at expert prefixes, then reflection.

    iteration i:
        draw expert trajectories (experts.py) and play them through the episode loop: exact tokens
        pick `inspect_prefixes` of their steps h_t = (u, a*_1, o_1, ..., o_{t-1}) at random
        inspection: sample M actions at each prefix, all prefixes in batches; compare each with a*_t
        reflection, implicit: step-level DPO on (a*_t, a^_t != a*_t) against the adapter disabled (or the
            cycle's sampler), + anchor
        reflection, inverse RL: train D on expert vs agent actions; r = D(h, a^); leave-one-out over the M
            samples of a prefix; LOOP's clipped loss on the sampled actions + the SFT anchor on a*_t
    then the shared phases (trainer.py): save the candidate, gate it on dev, measure agreement, checkpoint.

Every forward runs one prefix's rows together (the expert's action and the M samples), so the long
prefix goes through the decoder once per group (loop.shared_opening).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch

from agentloop.agent.actions import action_space
from agentloop.learner import stepagent
from agentloop.learner.experts import ExpertStep, expert_steps
from agentloop.learner.loop import LossStats, decoder_hidden, greedy_tokens, logprobs_from_hidden, sequence_logprobs
from agentloop.learner.rollouts import Rollout
from agentloop.learner.sft import run_steps
from agentloop.learner.trainer import Trainer
from agentloop.learner.update import Batch, collate
from agentloop.policy.base import GenerationRequest

T = TypeVar("T")


@dataclass
class Inspected:
    """One expert step and the M actions the policy sampled at its prefix, each compared with a*_t."""

    step: ExpertStep
    samples: list[list[int]]  # sampled token ids
    logprobs: list[list[float]]  # their log-probs when sampled
    rewards: list[float]  # stepagent.action_reward against a*_t
    well_formed: list[bool]  # the sample parsed as exactly one tool call

    def row(self, tokens: Sequence[int], logprobs: Sequence[float] | None = None, reward: float = 1.0) -> Rollout:
        """The prefix and one action as a sequence the learner's functions take (agent mask on the action)."""
        p, n = len(self.step.prefix), len(tokens)
        return Rollout(
            task_ref=f"{self.step.task_ref}#{self.step.index}",  # rows of one prefix sort together
            token_ids=[*self.step.prefix, *tokens],
            agent_mask=[0] * p + [1] * n,
            turn_ids=[-1] * p + [0] * n,
            sampler_logprobs=[0.0] * p + list(logprobs or [0.0] * n),
            reward=reward,
            success=reward == 1.0,
        )


@dataclass
class GreedyTally:
    """What greedy inspection found over a cycle's passes."""

    tokens: int = 0  # expert action tokens compared
    pairs: int = 0  # of them, where the greedy token was another
    steps: int = 0  # expert actions
    agreeing: int = 0  # of them, those the greedy action wrote exactly
    margin: float = 0.0  # sum of log pi(y*) - log pi(y^) over the pairs
    anchor: float = 0.0  # sum of the experts' -mean log pi(y*)
    sequences: int = 0


def greedy_dpo_loss(
    model: Any,
    batch: Batch,
    chunk: int,
    beta: float,
    anchor_weight: float,
    reference: Literal["base", "cycle"],
    tally: GreedyTally | None = None,
) -> torch.Tensor:
    """Each expert sequence's loss (B,) under greedy inspection (stepagent.py): alpha * -mean log pi(y*_j) over
    its action tokens, plus the mean over its pairs (tokens j where the most likely token y^_j is not y*_j) of
    -log sigmoid(m_j); the reference is `base` (the adapter disabled: a second pass, without gradients) or the
    weights as they are (`cycle`: m_j is 0 and only its gradient acts)."""
    decoder, weight = model.get_decoder(), model.get_output_embeddings().weight
    rows, cols = batch.agent_mask.nonzero(as_tuple=True)
    expert = batch.input_ids[:, 1:][rows, cols]  # (n,) y*_j
    hidden = decoder_hidden(decoder, batch.input_ids, batch.attention_mask)[:, :-1][rows, cols]  # (n, H)
    greedy = greedy_tokens(hidden.detach(), weight, chunk)  # (n,) y^_j
    step_ids = rows * (int(batch.turn_ids.max()) + 1) + batch.turn_ids[rows, cols]
    found = stepagent.greedy_comparison(expert, greedy, step_ids)
    pair_tokens = torch.stack([expert, greedy], dim=-1).unsqueeze(0)  # (1, n, 2)
    logp = logprobs_from_hidden(hidden.unsqueeze(0), weight, pair_tokens, chunk)[0]  # (n, 2)
    if reference == "base":
        with torch.no_grad(), model.disable_adapter():
            h_ref = decoder_hidden(decoder, batch.input_ids, batch.attention_mask)[:, :-1][rows, cols]
            ref = logprobs_from_hidden(h_ref.unsqueeze(0), weight, pair_tokens, chunk)[0]
    else:
        ref = logp.detach()
    B = batch.input_ids.shape[0]

    def per_row(values: torch.Tensor) -> torch.Tensor:
        return torch.zeros(B, dtype=values.dtype, device=values.device).index_add(0, rows, values)

    anchor = -per_row(logp[:, 0]) / per_row(torch.ones_like(logp[:, 0])).clamp(min=1)
    wrong = found.wrong.to(logp.dtype)
    terms = stepagent.dpo_terms(logp[:, 0], logp[:, 1], ref[:, 0], ref[:, 1], beta)
    dpo = per_row(terms * wrong) / per_row(wrong).clamp(min=1)  # mean over each expert's pairs (0 without)
    if tally is not None:
        with torch.no_grad():
            tally.tokens += len(expert)
            tally.pairs += int(found.wrong.sum())
            tally.steps += found.steps
            tally.agreeing += found.steps_agreeing
            tally.margin += float((logp[:, 0] - logp[:, 1])[found.wrong].sum())
            tally.anchor += float(anchor.sum())
            tally.sequences += B
    return anchor_weight * anchor + dpo


class StepAgentTrainer(Trainer):
    """stepagent-implicit and stepagent-irl."""

    def prepare(self) -> None:
        super().prepare()
        self.discriminator: stepagent.Discriminator | None = None
        self.disc_optimizer: torch.optim.Optimizer | None = None

    def checkpoint_files(self) -> dict[str, Any]:
        files = super().checkpoint_files()
        if self.discriminator is not None and self.disc_optimizer is not None:
            files["discriminator"] = {
                "weights": self.discriminator.state_dict(),
                "optimizer": self.disc_optimizer.state_dict(),
            }
        return files

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        saved = self.checkpoint.load_file("discriminator")
        if saved is not None:
            self._discriminator().load_state_dict(saved["weights"])
            assert self.disc_optimizer is not None
            self.disc_optimizer.load_state_dict(saved["optimizer"])

    def stepagent_iteration(self, i: int, algo: str) -> dict[str, Any]:
        c = self.config
        t0 = time.perf_counter()
        self.report({"phase": "experts", "iteration": i})
        rollouts, counts = self.expert_batch(i)
        if algo == "stepagent-implicit" and c.inspection == "greedy":
            self.safe_point(f"in iteration {i}, after drawing its experts")
            if not rollouts:
                return {"iteration": i, "experts": 0.0, **counts}
            t1 = time.perf_counter()
            done = {"iteration": i, **counts, **self.reflect_greedy(i, rollouts), "perf/expert_s": t1 - t0}
            self.policy.clear_cache()
            return {**done, "perf/update_s": time.perf_counter() - t1}
        steps = [s for r in rollouts for s in expert_steps(r)]
        picked = self.rng.sample(steps, min(c.inspect_prefixes, len(steps)))
        self.safe_point(f"in iteration {i}, after drawing its experts")
        inspected = self.inspect(i, picked)
        self.safe_point(f"in iteration {i}, after its inspection")
        rewards = [r for x in inspected for r in x.rewards]
        metrics: dict[str, Any] = {
            "iteration": i,
            **counts,
            "inspect/prefixes": float(len(inspected)),
            "step_reward/mean": sum(rewards) / max(len(rewards), 1),
            "inspect/agree_frac": sum(r == 1.0 for r in rewards) / max(len(rewards), 1),
            "perf/inspect_s": time.perf_counter() - t0,
        }
        t1 = time.perf_counter()
        if algo == "stepagent-implicit":
            metrics.update(self.reflect_implicit(i, inspected))
        else:
            metrics.update(self.reflect_irl(i, inspected))
        metrics["perf/update_s"] = time.perf_counter() - t1
        self.policy.clear_cache()
        return metrics

    # --- inspection
    def inspect(self, i: int, steps: Sequence[ExpertStep]) -> list[Inspected]:
        """M samples at each prefix, in batches across prefixes (the policy runs a prefix's rows together)."""
        c = self.config
        self.report({"phase": "inspection", "iteration": i, "prefixes": len(steps), "samples": c.inspect_samples})
        self.model.eval()
        self.policy.clear_cache()
        requests = [
            GenerationRequest(s.prefix, c.max_new_tokens, temperature=c.inspect_temperature)
            for s in steps
            for _ in range(c.inspect_samples)
        ]
        gens = self.policy.generate(requests)
        self.policy.clear_cache()
        out = []
        M = c.inspect_samples
        for k, step in enumerate(steps):
            group = gens[k * M : (k + 1) * M]
            space, text = action_space(step.commands), step.commands is not None
            turns = [space.parse(g.text) for g in group]
            out.append(
                Inspected(
                    step,
                    [g.token_ids for g in group],
                    [list(g.logprobs or []) for g in group],
                    [stepagent.action_reward(t.actions[0] if t.actions else None, step.call, text) for t in turns],
                    [not t.error and len(t.actions) == 1 for t in turns],
                )
            )
        return out

    # --- reflection, implicit reward
    def reflect_implicit(self, i: int, inspected: Sequence[Inspected]) -> dict[str, Any]:
        """Step-level DPO: chosen a*_t, rejected each sampled a^_t that is a well-formed call other than a*_t;
        reference = the adapter disabled, or with `dpo_reference: cycle` the weights that sampled this cycle (its
        log-probs computed once, before any step); plus the SFT anchor on a*_t. A malformed sample is no
        rejected action: its tokens are mostly the expert's own syntax, and pushing them down pulled a*_t down
        with them (the toy world's margin fell to -17 and agreement with it); the anchor teaches the syntax."""
        c = self.config
        groups = [
            (
                x,
                [x.row(x.step.action_tokens)]
                + [x.row(s) for s, r, ok in zip(x.samples, x.rewards, x.well_formed, strict=True) if r < 1.0 and ok],
            )
            for x in inspected
        ]
        # a prefix without a pair (its samples were a*_t or malformed) still has the anchor to learn from
        groups = [(x, rows) for x, rows in groups if len(rows) > 1 or c.dpo_anchor > 0]
        if not groups:
            return {"dpo/pairs": 0.0}
        device = self.accelerator.device
        # the reference's log-probs, once, before any step: the adapter disabled (the base model), or the weights
        # as they are now, which sampled the rejected actions (`dpo_reference: cycle`, refreshed every cycle)
        reference = self.model.disable_adapter() if c.dpo_reference == "base" else contextlib.nullcontext()
        with torch.no_grad(), reference:
            refs = [self._summed_logprobs(rows, device) if len(rows) > 1 else None for _, rows in groups]

        def loss_of(g: int) -> tuple[torch.Tensor, stepagent.DpoStats | None]:
            x, rows = groups[g]
            logp = self._summed_logprobs(rows, device)
            ref, n, tokens = refs[g], len(rows) - 1, float(len(x.step.action_tokens))
            if ref is None:  # no pair: the anchor's term alone
                return c.dpo_anchor * stepagent.sft_anchor(logp[0], tokens), None
            return stepagent.step_dpo_loss(
                logp[0].expand(n),
                logp[1:],
                ref[0].expand(n),
                ref[1:],
                torch.full((n,), tokens, device=device),
                c.dpo_beta,
                c.dpo_anchor,
            )

        stats = [s for s in self._reflect(i, len(groups), loss_of) if s is not None]
        metrics = {
            "dpo/pairs": float(sum(len(rows) - 1 for _, rows in groups)),
            "dpo/anchor_only": float(sum(len(rows) == 1 for _, rows in groups)),  # prefixes without a pair
            "updated": 1.0,
        }
        if stats:
            mean = lambda name: sum(getattr(s, name) for s in stats) / len(stats)  # noqa: E731
            metrics.update(
                {
                    "loss/dpo_total": mean("loss"),
                    "loss/dpo": mean("dpo"),
                    "loss/anchor": mean("anchor"),
                    "dpo/margin": mean("margin"),
                    "dpo/accuracy": mean("accuracy"),
                }
            )
        return metrics

    # --- inspection and reflection in one pass: the greedy action, implicit reward
    def reflect_greedy(self, i: int, rollouts: Sequence[Rollout]) -> dict[str, Any]:
        """`sft_steps` steps of `sft_batch_size` experts, as SFT's; each expert's loss is the SFT anchor on its
        tokens plus step-level DPO at every token where the greedy action leaves the expert's (stepagent.py:
        greedy inspection), all from the one pass SFT makes anyway (with `dpo_reference: base`, a second one
        without gradients and with the adapter disabled)."""
        c = self.config
        self.report({"phase": "updating", "iteration": i, "experts": len(rollouts), "steps": c.sft_steps})
        tally = GreedyTally()

        def sequence_loss(model: Any, batch: Batch, chunk: int) -> torch.Tensor:
            return greedy_dpo_loss(model, batch, chunk, c.dpo_beta, c.dpo_anchor, c.dpo_reference, tally)

        losses = run_steps(self, i, rollouts, sequence_loss)
        agree = tally.agreeing / max(tally.steps, 1)
        return {
            "experts": float(len(rollouts)),
            "loss/dpo_total": sum(losses) / len(losses),
            "loss/sft": tally.anchor / max(tally.sequences, 1),  # the anchor: what SFT alone minimises
            "dpo/pairs": float(tally.pairs),
            # log pi(y*) - log pi(y^) at the pairs: how far the expert's token is behind the greedy one
            "dpo/margin": tally.margin / max(tally.pairs, 1),
            "inspect/token_agree": 1.0 - tally.pairs / max(tally.tokens, 1),
            "inspect/agree_frac": agree,
            "step_reward/mean": agree,  # a greedy action earns 1 when it is the expert's, else 0
            "updated": 1.0,
        }

    def _reflect(self, i: int, n_groups: int, loss_of: Callable[[int], tuple[torch.Tensor, T]]) -> list[T]:
        """`epochs` passes over the prefixes' groups in a random order, `sft_batch_size` groups per optimizer
        step; `loss_of(g)` is group g's loss (one decoder pass over its rows) and its stats."""
        c = self.config
        stats: list[T] = []
        order = list(range(n_groups))
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()
        for _epoch in range(c.epochs):
            self.rng.shuffle(order)
            for start in range(0, len(order), c.sft_batch_size):
                chunk = order[start : start + c.sft_batch_size]
                self.optimizer.zero_grad(set_to_none=True)
                for g in chunk:
                    loss, st = loss_of(g)
                    (loss / len(chunk)).backward()
                    stats.append(st)
                torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm)
                self.optimizer.step()
                self.safe_point(f"in iteration {i}, after a reflection step")
        self.model.eval()
        return stats

    def _summed_logprobs(self, rows: Sequence[Rollout], device: torch.device) -> torch.Tensor:
        """Each row's summed log-prob of its action tokens (rows of one prefix: its decoder pass is shared)."""
        logp, mask = self._token_logprobs(rows, device)
        return (logp * mask).sum(dim=1)

    def _token_logprobs(self, rows: Sequence[Rollout], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's per-position log-probs of its action tokens and the action mask, both (N, T-1)."""
        batch = collate(rows, self.pad_id).to(device)
        logp = sequence_logprobs(
            self.model, batch.input_ids, batch.attention_mask, self.config.logprob_chunk, target_mask=batch.agent_mask
        )
        return logp, batch.agent_mask

    # --- reflection, inverse RL
    def _discriminator(self) -> stepagent.Discriminator:
        if self.discriminator is None:
            hidden = int(self.model.get_decoder().config.hidden_size)
            self.discriminator = stepagent.Discriminator(hidden).to(self.accelerator.device)
            self.disc_optimizer = torch.optim.Adam(self.discriminator.parameters(), lr=self.config.disc_lr)
        return self.discriminator

    @torch.no_grad()
    def _features(self, rows: Sequence[Rollout], device: torch.device) -> torch.Tensor:
        """D's input per row: the frozen base model's last hidden state at the prefix's end and its mean over
        the action's tokens, (N, 2H)."""
        batch = collate(rows, self.pad_id).to(device)
        with self.model.disable_adapter():
            hidden = decoder_hidden(self.model.get_decoder(), batch.input_ids, batch.attention_mask).float()
        feats = []
        for b, r in enumerate(rows):
            start = r.agent_mask.index(1)
            n = sum(r.agent_mask)
            feats.append(torch.cat([hidden[b, start - 1], hidden[b, start : start + n].mean(dim=0)]))
        return torch.stack(feats)

    def reflect_irl(self, i: int, inspected: Sequence[Inspected]) -> dict[str, Any]:
        """Train D on expert (1) vs agent (0) actions, score every sample with D, and minimise LOOP's clipped
        loss on the samples with leave-one-out advantages over the M samples of each prefix, plus the SFT
        anchor on the expert's action (`irl_anchor`; 0 leaves D's reward alone)."""
        c = self.config
        device = self.accelerator.device
        disc = self._discriminator()
        assert self.disc_optimizer is not None
        self.model.eval()
        expert_f, sample_f = [], []
        for x in inspected:
            f = self._features([x.row(x.step.action_tokens)] + [x.row(s) for s in x.samples], device)
            expert_f.append(f[:1])
            sample_f.append(f[1:])
        negatives = torch.cat(
            [f[[k for k, r in enumerate(x.rewards) if r < 1.0]] for f, x in zip(sample_f, inspected, strict=True)]
        )
        positives = torch.cat(expert_f)
        disc.standardise(torch.cat([positives, *sample_f]))
        accuracy = 0.0
        disc.train()
        for _ in range(c.disc_steps if len(negatives) else 0):
            self.disc_optimizer.zero_grad(set_to_none=True)
            loss, accuracy = stepagent.discriminator_loss(disc(positives), disc(negatives))
            loss.backward()
            self.disc_optimizer.step()
        disc.eval()
        groups: list[tuple[Inspected, list[Rollout], torch.Tensor]] = []  # rows: [a*_t, kept samples...]
        scores: list[float] = []
        with torch.no_grad():
            expert_reward = float(torch.sigmoid(disc(positives)).mean()) if len(positives) else 0.0
            for f, x in zip(sample_f, inspected, strict=True):
                r = stepagent.discriminator_rewards(disc(f))
                scores += r
                kept = [(s, a) for s, a in zip(x.samples, stepagent.step_leave_one_out(r), strict=True)]
                kept = [(s, a) for s, a in kept if abs(a) >= c.adv_threshold]
                if kept:
                    rows = [x.row(x.step.action_tokens)] + [x.row(s) for s, _ in kept]
                    groups.append((x, rows, torch.tensor([a for _, a in kept], device=device)))
            # pi_old: the policy before this reflection, computed here rather than taken from the sampler
            # (whose numbers are of a tempered distribution when inspect_temperature != 1)
            olds = [self._token_logprobs(rows, device)[0][1:] for _, rows, _ in groups]
        metrics: dict[str, Any] = {
            "disc/accuracy": accuracy,
            "disc/reward_mean": sum(scores) / max(len(scores), 1),
            "disc/expert_reward": expert_reward,
            "adv/kept": float(sum(len(rows) - 1 for _, rows, _ in groups)),
        }
        if not groups:
            return metrics

        def loss_of(g: int) -> tuple[torch.Tensor, tuple[LossStats, float]]:
            x, rows, adv = groups[g]
            logp, mask = self._token_logprobs(rows, device)
            loss, st, anchor = stepagent.irl_policy_loss(
                logp[1:],
                olds[g],
                adv,
                mask[1:],
                (logp[0] * mask[0]).sum(),
                len(x.step.action_tokens),
                c.clip_eps,
                c.irl_anchor,
                c.ratio_level,
            )
            return loss, (st, anchor)

        stats = self._reflect(i, len(groups), loss_of)
        n = len(stats)
        metrics.update(
            {
                "loss/clip_frac": sum(st.clip_frac for st, _ in stats) / n,
                "loss/approx_kl": sum(st.approx_kl for st, _ in stats) / n,
                "loss/anchor": sum(a for _, a in stats) / n,
                "updated": 1.0,
            }
        )
        return metrics
