"""LOOP, GRPO and REINFORCE: one iteration of the trainer from task sampling to an updated adapter.

iteration i:
    sample N training tasks (built-in world, resettable external apps, tasks clients sent)
    K rollouts each, from the same initial state, with the current weights   (rollouts.py)
    advantages: leave-one-out (or GRPO / REINFORCE), drop |A| < 0.01          (loop.py)
        loop+step: A_t = A_trajectory + omega * A_step,t at each turn          (stepagent.py)
    pi_old: the sampler's log-probs when it is this process (checked on a probe), else recomputed
    E epochs of clipped updates over shuffled minibatches                    (update.py)
then the shared phases (trainer.py): save the candidate, gate it on dev, checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
import torch

from agentloop.agent.evaluate import EvalTask
from agentloop.apps.tasks import ToolCall
from agentloop.learner import rollouts
from agentloop.learner.checkpoint import write_atomically
from agentloop.learner.config import LoopConfig
from agentloop.learner.experts import scored_expert_rollouts
from agentloop.learner.logged import Logged, feedback_advantages, logged_episodes
from agentloop.learner.loop import trajectory_advantages
from agentloop.learner.stepagent import combined_advantages, turn_rewards, turn_step_advantages
from agentloop.learner.trainer import Trainer
from agentloop.learner.update import compute_logprobs, sampler_gap, update
from agentloop.store import training_runs
from agentloop.store.db import session_scope
from agentloop.store.models import TrainingRun

Advantage = float | list[float]  # one per rollout, or one per turn (loop+step)


def advantages_for(
    groups: list[list[rollouts.Rollout]],
    config: LoopConfig,
    algo: str | None = None,
    experts: Sequence[Sequence[ToolCall] | None] | None = None,
) -> list[tuple[rollouts.Rollout, Advantage]]:
    """Each rollout with its advantage; rollouts with |A| < threshold (at every turn) are dropped. Groups
    may be ragged (stragglers dropped): each is handled on its own. loop+step, with the expert calls of each
    group's task (`experts`): A_t = A_trajectory + omega * A_step,t at each turn (stepagent.py)."""
    algo = algo or config.algo
    base = "loop" if algo == "loop+step" else algo
    advantages = trajectory_advantages([[r.reward for r in g] for g in groups], base, config.std_normalise)
    kept: list[tuple[rollouts.Rollout, Advantage]] = []
    for k, (group, advs) in enumerate(zip(groups, advantages, strict=True)):
        if advs is None:
            continue
        expert = experts[k] if algo == "loop+step" and experts is not None else None
        if expert is None or any(r.actions is None for r in group):
            kept += [(r, a) for r, a in zip(group, advs, strict=True) if abs(a) >= config.adv_threshold]
            continue
        steps = turn_step_advantages([turn_rewards(r.actions or [], expert, r.commands is not None) for r in group])
        for r, a, step in zip(group, advs, steps, strict=True):
            per_turn = combined_advantages(a, step, config.step_omega)
            if any(abs(x) >= config.adv_threshold for x in per_turn):
                kept.append((r, per_turn))
    return kept


class LoopTrainer(Trainer):
    """LOOP (and GRPO, REINFORCE): rollouts of the current weights, scored by the world's evaluator."""

    def prepare(self) -> None:
        super().prepare()
        self.logged_used: set[str] = set()
        self.sampled: dict[str, EvalTask] = {}  # the iteration's tasks by ref (their experts, for loop+step)

    def checkpoint_extra(self) -> dict[str, Any]:
        return {**super().checkpoint_extra(), "logged_used": sorted(self.logged_used)}

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        self.logged_used = set(state.get("logged_used", []))

    def logged_episodes(self) -> list[Logged]:
        """Episodes the clients of the tenants it reads ran since the same owner's last finished run, not yet
        used by this one; recorded in the run's `trained_on`."""
        with session_scope() as s:
            same_owner = (
                TrainingRun.tenant_id.is_(None) if self.tenant_id is None else TrainingRun.tenant_id == self.tenant_id
            )
            since = s.scalar(
                sa.select(sa.func.max(TrainingRun.created_at)).where(
                    TrainingRun.status == "finished",
                    TrainingRun.id != self.run_id,
                    same_owner,
                    TrainingRun.created_at
                    < s.scalar(sa.select(TrainingRun.created_at).where(TrainingRun.id == self.run_id)),
                )
            )
            found = logged_episodes(
                s,
                None if self.source.app else self.source.world,  # an app's tasks are served in any world
                {t.task_ref for t in self.train_tasks},
                since,
                self.config.logged_per_iteration,
                self.source.readers,
                exclude=self.logged_used,
            )
            ids = [item.rollout.episode_id for item in found if item.rollout.episode_id]
            training_runs.record_reads(s, self.run_id, self.source.readers, ids)
            return found

    def collect(
        self, iteration: int, replay: Sequence[str] = (), feedback_only: int = 0
    ) -> dict[str, list[rollouts.Rollout]]:
        """K rollouts of each sampled train task, and of each task of a replayed client episode (`replay`:
        one task_ref per episode; `feedback_only`: client episodes used without rollouts, for the plan)."""
        c = self.config
        if c.procedural and self.source.procedural:
            sampled = _distinct(self.source.fresh(self.rng, c.tasks_per_iteration))
        else:
            sampled = _distinct(rollouts.sample_tasks(self.train_tasks, c.tasks_per_iteration, self.rng))
        by_ref = {t.task_ref: t for t in self.train_tasks}
        tasks = _distinct(sampled + [by_ref[ref] for ref in replay])
        self.sampled = {t.task_ref: t for t in tasks}
        total = len(tasks) * c.rollouts_per_task
        plan = rollout_plan(len(sampled), len(tasks) - len(sampled), c.rollouts_per_task, len(replay), feedback_only)
        done = [0]
        self.report(
            {
                "phase": "rollouts",
                "iteration": iteration,
                "rollouts_done": 0,
                "rollouts_total": total,
                "tasks_sampled": len(sampled),
                "tasks_from_logged": len(tasks) - len(sampled),
                "logged_joined": len(replay),
                "logged_feedback_only": feedback_only,
                "plan": plan,
            }
        )

        def on_result(_result: Any) -> None:
            done[0] += 1
            if done[0] % max(1, total // 20) == 0 or done[0] == total:
                self.report(
                    {"phase": "rollouts", "iteration": iteration, "rollouts_done": done[0], "rollouts_total": total}
                )
            # after each batch of episodes (each stored whole): a cancel need not wait for all N x K
            self.safe_point(f"in iteration {iteration}, during its rollouts", collective=False)

        def store(result: Any) -> str | None:
            with session_scope() as s:
                return rollouts.store_rollout(
                    s,
                    result,
                    world=self.source.world,
                    policy=self.policy.name,
                    adapter=None,
                    run_id=self.run_id,
                    iteration=iteration,
                )

        self.model.eval()
        if c.rollout_mode == "celery":
            return self.collect_distributed(iteration, tasks)
        self.policy.clear_cache()
        by_task = rollouts.run_local(
            self.policy,
            tasks,
            c.rollouts_per_task,
            self.limits(),
            self.settings.max_batch_size,
            store=store,
            on_result=on_result,
        )
        self.policy.clear_cache()
        return by_task

    def collect_distributed(self, iteration: int, tasks: list[EvalTask]) -> dict[str, list[rollouts.Rollout]]:
        """One job per task on the `rollouts` queue, with the current weights saved for the workers."""
        from agentloop.worker.dispatch import publish_rollouts

        c = self.config
        path = self.run_dir / "rollout-adapters" / f"it{iteration}"
        write_atomically(path, lambda tmp: self.model.save_pretrained(tmp))
        name = f"run-{self.run_id[:8]}-it{iteration}"  # a new name per iteration: never a stale cache
        limits = self.limits().__dict__
        refs = [t.task_ref for t in tasks]
        for ref in refs:
            publish_rollouts(
                self.run_id,
                iteration,
                ref,
                c.rollouts_per_task,
                name,
                str(path),
                limits,
                c.world,
                app=self.source.app,
                tenant_id=self.source.tenant_id,
            )

        def load() -> dict[str, list[rollouts.Rollout]]:
            with session_scope() as s:
                return rollouts.stored_rollouts(s, self.run_id, iteration)

        def progress(done: int) -> None:
            self.report(
                {
                    "phase": "rollouts",
                    "iteration": iteration,
                    "rollouts_done": done,
                    "rollouts_total": len(refs) * c.rollouts_per_task,
                }
            )
            self.safe_point(f"in iteration {iteration}, waiting for its rollouts", collective=False)

        return rollouts.wait_for_stored(
            load, refs, c.rollouts_per_task, c.min_rollouts_per_task or 1, c.min_fraction, c.rollout_timeout_s, progress
        )

    def samples(self, i: int) -> tuple[list[Logged], dict[str, list[rollouts.Rollout]]]:
        """The iteration's client episodes and rollouts by task. With several processes the main one
        samples (and stores) them and hands them, with its RNG state, to the others, so that every
        process updates on the same data in the same order."""
        if self.accelerator.num_processes > 1:
            from accelerate.utils import broadcast_object_list

            payload: list[Any] = [None]
            if self.accelerator.is_main_process:
                payload = [(*self._sample(i), self.rng.getstate())]
            broadcast_object_list(payload, from_process=0)
            logged, by_task, state = payload[0]
            self.rng.setstate(state)
            return logged, by_task
        return self._sample(i)

    def _sample(self, i: int) -> tuple[list[Logged], dict[str, list[rollouts.Rollout]]]:
        logged = self.logged_episodes() if self.config.replay_logged else []
        replayed = [item for item in logged if item.replayable]
        by_task = self.collect(i, [item.rollout.task_ref for item in replayed], len(logged) - len(replayed))
        for item in replayed:  # the client's episode is one more sample of its task's group
            by_task.setdefault(item.rollout.task_ref, []).append(item.rollout)
        if self.config.expert_in_group:
            self.join_experts(by_task)
        return logged, by_task

    def join_experts(self, by_task: dict[str, list[rollouts.Rollout]]) -> None:
        """expert_in_group: each group's task's expert, played through the episode loop and scored by the
        task's evaluator (experts.scored_expert_rollouts), as one more sample of the group. Its pi_old is the
        current weights' log-prob of its tokens, so that its first update step starts at ratio 1 as a sampled
        rollout's does; it counts in no sampler/learner gap (its numbers are the learner's own)."""
        tasks = [self.sampled[ref] for ref in by_task if ref in self.sampled]
        found = scored_expert_rollouts(self.tokenizer, tasks, self.limits(expert=True), self.settings.max_batch_size)
        joined = list(found.values())
        device = self.accelerator.device
        logps = compute_logprobs(self.module, joined, self.pad_id, self.config.micro_batch_size, device)
        for r, lp in zip(joined, logps, strict=True):
            mask = r.agent_mask[1:]
            r.sampler_logprobs = [0.0] + [x if m else 0.0 for x, m in zip(lp.tolist(), mask, strict=True)]
            r.expert = True
            by_task[r.task_ref].append(r)

    def rl_iteration(self, i: int, algo: str) -> dict[str, Any]:
        c = self.config
        t0 = time.perf_counter()
        logged, by_task = self.samples(i)
        self.safe_point(f"in iteration {i}, after its rollouts")
        replayed = [item for item in logged if item.replayable]
        every = [r for g in by_task.values() for r in g if not r.expert]
        joined = [r for g in by_task.values() for r in g if r.expert]
        experts = [self.expert_calls(ref) for ref in by_task] if algo == "loop+step" else None
        kept: list[tuple[rollouts.Rollout, Advantage]] = advantages_for(list(by_task.values()), c, algo, experts)
        kept += [(r, a) for r, a in feedback_advantages(logged, c.feedback_baseline_min) if abs(a) >= c.adv_threshold]
        sampled_kept = sum(not r.expert for r, _ in kept)
        self.logged_used |= {item.rollout.episode_id for item in logged if item.rollout.episode_id}
        metrics: dict[str, Any] = {
            "iteration": i,
            "reward/mean": sum(r.reward for r in every) / max(len(every), 1),
            "success/rate": sum(r.success for r in every) / max(len(every), 1),
            "adv/filtered_frac": 1 - sampled_kept / max(len(every), 1),
            "rollouts": len(every),
            "logged/replayed": len(replayed),
            "logged/feedback_only": len(logged) - len(replayed),
            "logged/feedback_used": sum(1 for item in logged if item.reward_source == "client"),
            "perf/rollout_s": time.perf_counter() - t0,
            "updated": float(bool(kept)),
        }
        if c.expert_in_group:
            metrics["expert/joined"] = float(len(joined))
            metrics["expert/reward_mean"] = sum(r.reward for r in joined) / max(len(joined), 1)
        if experts is not None:
            metrics["step/tasks_with_expert"] = float(sum(e is not None for e in experts))
            step_rewards = [
                x
                for expert, group in zip(experts, by_task.values(), strict=True)
                if expert is not None
                for r in group
                if r.actions is not None
                for x in turn_rewards(r.actions, expert, r.commands is not None)
            ]
            metrics["step_reward/mean"] = sum(step_rewards) / max(len(step_rewards), 1)
        if kept:
            batch = [r for r, _ in kept]
            advs = [a for _, a in kept]
            self.report({"phase": "updating", "iteration": i, "rollouts_kept": len(kept)})
            old_logps, gap = self.old_logprobs(batch, others={id(item.rollout) for item in logged})
            metrics["sampler_learner_gap"] = gap
            metrics["old_logprobs_recomputed"] = float(old_logps is not None)
            metrics.update(
                update(
                    self.module,
                    self.optimizer,
                    self.accelerator,
                    batch,
                    advs,
                    old_logps,
                    c,
                    self.pad_id,
                    self.rng,
                    reference=self.model if c.kl_coef > 0 else None,
                    between_steps=lambda step: self.safe_point(f"in iteration {i}, after update step {step}"),
                    algo=algo,
                )
            )
            self.policy.clear_cache()
        else:
            metrics.update(
                {
                    "loss/clip_frac": 0.0,
                    "loss/approx_kl": 0.0,
                    "sampler_learner_gap": 0.0,
                    "perf/tokens_per_s": 0.0,
                    "perf/peak_mem_mb": 0.0,
                }
            )
        return metrics

    def expert_calls(self, task_ref: str) -> list[ToolCall] | None:
        """The expert's calls for a sampled task (its oracle), for loop+step's step rewards."""
        task = self.sampled.get(task_ref)
        if task is None or task.expert is None:
            return None
        world, _ = task.start()
        try:
            return task.expert(world)
        finally:
            world.close()

    def old_logprobs(self, batch: list[rollouts.Rollout], others: set[int]) -> tuple[list[torch.Tensor] | None, float]:
        """pi_old for the update and the measured sampler/learner gap. None: the sampler's numbers.

        In `auto` with local rollouts the learner checks the gap on a probe (the rollouts it did not
        sample itself, e.g. client episodes, plus one micro-batch of its own) and recomputes the
        whole batch only when the probe shows a gap: a forward pass over the batch saved when the
        sampler's numbers are the learner's."""
        c = self.config
        device = self.accelerator.device
        if c.recompute_old_logprobs == "always" or (c.recompute_old_logprobs == "auto" and c.rollout_mode != "local"):
            logps = compute_logprobs(self.module, batch, self.pad_id, c.micro_batch_size, device)
            sampled = [(lp, r) for lp, r in zip(logps, batch, strict=True) if not r.expert]  # experts': ours
            return logps, sampler_gap([lp for lp, _ in sampled], [r for _, r in sampled])
        own = [r for r in batch if id(r) not in others and not r.expert]
        probe = [r for r in batch if id(r) in others] + own[: c.micro_batch_size]
        probed = compute_logprobs(self.module, probe, self.pad_id, c.micro_batch_size, device)
        gap = sampler_gap(probed, probe)
        if c.recompute_old_logprobs == "never" or gap <= 1e-3:
            return None, gap
        probed_ids = set(map(id, probe))
        rest = [r for r in batch if id(r) not in probed_ids]  # the probe's rows are computed already
        done = dict(zip(map(id, probe), probed, strict=True))
        done |= zip(
            map(id, rest), compute_logprobs(self.module, rest, self.pad_id, c.micro_batch_size, device), strict=True
        )
        return [done[id(r)] for r in batch], gap


def rollout_plan(sampled: int, from_logged: int, k: int, joined: int, feedback_only: int) -> str:
    """What an iteration's rollouts are, in words: "2 tasks x 2 rollouts + 7 tasks clients ran x 2 rollouts
    = 18 rollouts; 7 logged client episodes joined (one more sample in their task's group)"."""

    def n(count: int, noun: str) -> str:
        return f"{count} {noun}{'s' * (count != 1)}"

    times = "\u00d7"
    plan = f"{n(sampled, 'task')} {times} {n(k, 'rollout')}"
    if from_logged:  # the tasks of client episodes that were not sampled get K rollouts too
        total = n((sampled + from_logged) * k, "rollout")
        plan += f" + {n(from_logged, 'task')} clients ran {times} {n(k, 'rollout')} = {total}"
    if joined:
        plan += f"; {n(joined, 'logged client episode')} joined (one more sample in their task's group)"
    if feedback_only:
        plan += f"; {n(feedback_only, 'client episode')} with feedback used alone (no task to replay)"
    return plan


def _distinct(tasks: list[EvalTask]) -> list[EvalTask]:
    seen: set[str] = set()
    return [t for t in tasks if not (t.task_ref in seen or seen.add(t.task_ref))]  # type: ignore[func-returns-value]
