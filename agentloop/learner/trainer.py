"""Training runs: the LOOP iteration from task sampling to a promoted (or rejected) adapter.

    iteration i:
        sample N training tasks (built-in world, resettable external apps, tasks clients sent)
        K rollouts each, from the same initial state, with the current weights   (rollouts.py)
        advantages: leave-one-out (or GRPO / REINFORCE), drop |A| < 0.01          (loop.py)
        pi_old: the sampler's log-probs when it is this process (checked on a probe), else recomputed
        E epochs of clipped updates over shuffled minibatches                    (update.py)
        save adapter v(n+1) as a candidate; evaluate on dev; promote or reject   (adapters.py)
        checkpoint (adapter, optimizer, iteration, config) so a lost learner resumes here

`agentloop learn` runs this in the foreground; the Celery `train` task runs it for POST /v1/admin/train
and for the beat trigger. A run holds a lease on its row while it works.

Cancelling (POST /v1/admin/training-runs/{id}/cancel, or a signal to `agentloop learn`): the learner
stops at its next safe point, where nothing is half-written: before an iteration, between rollout
batches, after the rollouts, between update minibatches, before the adapter is saved, between dev
evaluation batches, and at the promotion itself (checked in the transaction that would promote).
Nothing of the iteration it stops in is kept: the checkpoint and the active adapter are the previous
iteration's.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import torch

from agentloop import events, faults
from agentloop.agent.episode import Limits
from agentloop.agent.evaluate import EvalTask, run_eval, summarize
from agentloop.learner import adapters, rollouts
from agentloop.learner.config import LoopConfig
from agentloop.learner.logged import Logged, feedback_advantages, logged_episodes
from agentloop.learner.loop import group_normalised_advantages, keep_mask, leave_one_out_advantages, std_normalise
from agentloop.learner.task_source import load_source
from agentloop.learner.update import LogprobModel, compute_logprobs, sampler_gap, update
from agentloop.policy.local import LocalPolicy
from agentloop.settings import Settings
from agentloop.store import adapters as adapter_store
from agentloop.store.db import session_scope
from agentloop.store.models import TrainingRun, utcnow
from agentloop.store.training_runs import mark_cancelled

log = logging.getLogger(__name__)

Report = Callable[[dict[str, Any]], None]


# --- advantages for one iteration ----------------------------------------------------------------


def advantages_for(groups: list[list[rollouts.Rollout]], config: LoopConfig) -> list[tuple[rollouts.Rollout, float]]:
    """Each rollout with its advantage; rollouts with |A| < threshold are dropped. Groups may be ragged
    (stragglers dropped): each is handled on its own."""
    kept: list[tuple[rollouts.Rollout, float]] = []
    if config.algo == "reinforce":  # one baseline for the whole batch
        every = [r for g in groups for r in g]
        baseline = sum(r.reward for r in every) / max(len(every), 1)
        return [(r, r.reward - baseline) for r in every if abs(r.reward - baseline) >= config.adv_threshold]
    for group in groups:
        if len(group) < 2:
            continue
        rewards = torch.tensor([[r.reward for r in group]])
        if config.algo == "grpo":
            adv = group_normalised_advantages(rewards)
        else:
            adv = leave_one_out_advantages(rewards)
            if config.std_normalise:
                adv = std_normalise(adv, rewards)
        keep = keep_mask(adv, config.adv_threshold)
        kept += [(r, float(a)) for r, a, k in zip(group, adv[0].tolist(), keep[0].tolist(), strict=True) if k]
    return kept


# --- the model -----------------------------------------------------------------------------------


def lora_config(config: LoopConfig) -> Any:
    """PEFT's description of the adapter a LoopConfig asks for."""
    from peft import LoraConfig

    return LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        target_modules=list(config.lora_targets),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def lora_model(base: Any, config: LoopConfig, init_from: str | None) -> Any:
    """The one model in memory: the base with a trainable LoRA adapter (from `init_from`, or fresh)."""
    from peft import PeftModel, get_peft_model

    for p in base.parameters():
        p.requires_grad_(False)
    if init_from is not None:
        model = PeftModel.from_pretrained(base, init_from, is_trainable=True)
    else:
        model = get_peft_model(base, lora_config(config))
    if config.activation_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model


def _write_atomically(target: Path, write: Callable[[Path], None]) -> None:
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    write(tmp)
    faults.crash_point("checkpoint_save")
    old = target.with_name(target.name + ".old")
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    if old.exists():
        shutil.rmtree(old)


@dataclass
class Checkpoint:
    """Self-describing: the adapter weights, the optimizer, the next iteration, the config, the RNG."""

    path: Path

    @property
    def exists(self) -> bool:
        return (self.path / "state.json").exists()

    def save(
        self,
        model: Any,
        optimizer: torch.optim.Optimizer,
        next_iteration: int,
        config: LoopConfig,
        rng: random.Random,
        extra: dict[str, Any],
    ) -> None:
        def write(tmp: Path) -> None:
            model.save_pretrained(tmp / "adapter")
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            state = {"next_iteration": next_iteration, "config": config.to_dict(), "rng": rng.getstate(), **extra}
            (tmp / "state.json").write_text(json.dumps(state, default=list))

        _write_atomically(self.path, write)

    def state(self) -> dict[str, Any]:
        return dict(json.loads((self.path / "state.json").read_text()))


# --- stopping at a safe point ----------------------------------------------------------------------


class RunStopped(Exception):
    """Raised at a safe point of a run that was cancelled (or whose lease another learner holds now)."""

    def __init__(self, reason: str, where: str, lease_lost: bool = False) -> None:
        super().__init__(f"{reason}; stopped {where}")
        self.reason, self.where, self.lease_lost = reason, where, lease_lost


@dataclass
class Cancellation:
    """Why the run must stop, once it must. Set by the run's heartbeat (its row has cancel_requested, or its
    lease is gone) or by a signal handler of `agentloop learn`; the trainer looks at it at safe points."""

    reason: str | None = None
    lease_lost: bool = False

    def request(self, reason: str, lease_lost: bool = False) -> None:
        if self.reason is None:
            self.lease_lost = lease_lost
            self.reason = reason  # last: it is the flag other threads read

    @property
    def requested(self) -> bool:
        return self.reason is not None


# --- a run -----------------------------------------------------------------------------------------


@dataclass
class Trainer:
    settings: Settings
    config: LoopConfig
    run_id: str
    report: Report = field(default=lambda _p: None)
    model: Any = None
    tokenizer: Any = None
    accelerator: Any = None
    cancellation: Cancellation = field(default_factory=Cancellation)
    owner: str | None = None  # the lease holder: promotion checks the row is still its run

    def __post_init__(self) -> None:
        self.run_dir = self.settings.home.resolve() / "runs" / self.run_id
        self.checkpoint = Checkpoint(self.run_dir / "checkpoint")
        self.rng = random.Random(self.config.seed)
        self.baseline_dev_tgc: float | None = None
        self.parent: str | None = None
        self.logged_used: set[str] = set()

    # --- setup
    def setup(self) -> int:
        """Load the model (resuming from the checkpoint, or starting from the active adapter) and return
        the first iteration to run."""
        from accelerate import Accelerator
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agentloop.policy.models import resolve_model_dir

        self.accelerator = self.accelerator or Accelerator(cpu=not torch.cuda.is_available())
        start = 0
        init_from: str | None = None
        measure_bar = False  # the active version's dev TGC was measured on other tasks than this run's dev
        with session_scope() as s:
            tenant_id = s.scalar(sa.select(TrainingRun.tenant_id).where(TrainingRun.id == self.run_id))
            self.source = load_source(s, self.config, tenant_id, self.settings.secret_key)
            active = adapter_store.active_adapter(s, self.settings.model_name)
            if active is not None:
                adapters.verify(active)
                self.parent, init_from = active.name, active.path
                recorded = active.metrics or {}
                # versions gated before dev sets were recorded were gated on a world's dev split
                legacy = self.source.dev_set if self.source.app is None else None
                if recorded.get("dev_set", legacy) == self.source.dev_set:
                    self.baseline_dev_tgc = recorded.get("dev_tgc")
                else:
                    measure_bar = self.config.promote
        if self.checkpoint.exists:
            state = self.checkpoint.state()
            start = int(state["next_iteration"])
            self.rng.setstate(_rng_state(state["rng"]))
            self.parent = state.get("parent", self.parent)
            self.logged_used = set(state.get("logged_used", []))
            self.baseline_dev_tgc = state.get("baseline_dev_tgc", self.baseline_dev_tgc)
            init_from = str(self.checkpoint.path / "adapter")
            measure_bar = False  # the bar was measured (or taken) when the run started
            log.info("run %s resumes at iteration %d from %s", self.run_id, start, self.checkpoint.path)
        if self.model is None:
            model_dir = resolve_model_dir(self.settings.model, self.settings.models_dir)
            base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
            torch.manual_seed(self.config.seed)
            self.model = lora_model(base, self.config, init_from)
        else:
            measure_bar = False  # weights the caller gave are not the active version's: the bar is the base model
        self.model.to(self.accelerator.device)
        self.module = LogprobModel(self.model, self.config.logprob_chunk)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=self.config.lr, weight_decay=self.config.weight_decay)
        if self.checkpoint.exists and (self.checkpoint.path / "optimizer.pt").exists():
            self.optimizer.load_state_dict(torch.load(self.checkpoint.path / "optimizer.pt", weights_only=False))
        self.optimizer = self.accelerator.prepare(self.optimizer)
        eos = self.tokenizer.eos_token_id
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos)
        self.policy = LocalPolicy(
            self.model,
            self.tokenizer,
            name=self.settings.model_name,
            max_batch_size=self.settings.max_batch_size,
            seed=self.config.seed,
        )
        self.train_tasks = self.source.train
        if measure_bar and self.accelerator.is_main_process:  # the active version, before any update
            self.baseline_dev_tgc = self.dev_tgc()
        return start

    def limits(self, dev: bool = False) -> Limits:
        c = self.config
        return Limits(
            max_turns=c.dev_max_turns if dev else c.max_turns,
            max_new_tokens=c.max_new_tokens,
            observation_max_tokens=c.observation_max_tokens,
            max_context_tokens=c.max_context_tokens,
            wall_time_s=1e9,
            temperature=0.0 if dev else c.temperature,
        )

    def safe_point(self, where: str, collective: bool = True) -> None:
        """Raise RunStopped here if the run must stop. Call only where nothing is half-written. With several
        processes a `collective` point is reached by all of them (the main one's answer is shared, so they
        stop together); a point only the main process reaches is skipped then."""
        reason, lost = self.cancellation.reason, self.cancellation.lease_lost
        if self.accelerator is not None and self.accelerator.num_processes > 1:
            if not collective:
                return
            from accelerate.utils import broadcast_object_list

            shared: list[Any] = [(reason, lost)]
            broadcast_object_list(shared, from_process=0)
            reason, lost = shared[0]
        if reason is not None:
            raise RunStopped(reason, where, lost)

    # --- phases
    def logged_episodes(self) -> list[Logged]:
        """Episodes clients ran since the last finished run, not yet used by this one."""
        with session_scope() as s:
            since = s.scalar(
                sa.select(sa.func.max(TrainingRun.created_at)).where(
                    TrainingRun.status == "finished",
                    TrainingRun.id != self.run_id,
                    TrainingRun.created_at
                    < s.scalar(sa.select(TrainingRun.created_at).where(TrainingRun.id == self.run_id)),
                )
            )
            return logged_episodes(
                s,
                None if self.source.app else self.source.world,  # an app's tasks are served in any world
                {t.task_ref for t in self.train_tasks},
                since,
                self.config.logged_per_iteration,
                exclude=self.logged_used,
                tenant_id=self.source.tenant_id,
            )

    def dev_summary(self, iteration: int | None = None) -> dict[str, Any]:
        tasks = self.source.dev
        self.report({"phase": "evaluating", "dev_tasks": len(tasks), "dev_set": self.source.dev_set})
        self.model.eval()
        self.policy.clear_cache()
        where = f"in iteration {iteration}, during the dev evaluation" if iteration is not None else "evaluating"
        results = run_eval(
            self.policy,
            tasks,
            1,
            self.limits(dev=True),
            self.settings.max_batch_size,
            on_result=lambda _r: self.safe_point(where, collective=False),
        )
        self.policy.clear_cache()
        return summarize(results)

    def dev_tgc(self) -> float:
        return float(self.dev_summary()["tgc"])

    def collect(
        self, iteration: int, replay: Sequence[str] = (), feedback_only: int = 0
    ) -> dict[str, list[rollouts.Rollout]]:
        """K rollouts of each sampled train task, and of each task of a replayed client episode (`replay`:
        one task_ref per episode; `feedback_only`: client episodes used without rollouts, for the plan)."""
        c = self.config
        sampled = _distinct(rollouts.sample_tasks(self.train_tasks, c.tasks_per_iteration, self.rng))
        by_ref = {t.task_ref: t for t in self.train_tasks}
        tasks = _distinct(sampled + [by_ref[ref] for ref in replay])
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
        _write_atomically(path, lambda tmp: self.model.save_pretrained(tmp))
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
        return logged, by_task

    def iteration(self, i: int) -> dict[str, Any]:
        c = self.config
        t0 = time.perf_counter()
        logged, by_task = self.samples(i)
        self.safe_point(f"in iteration {i}, after its rollouts")
        replayed = [item for item in logged if item.replayable]
        every = [r for g in by_task.values() for r in g]
        kept = advantages_for(list(by_task.values()), c)
        kept += [(r, a) for r, a in feedback_advantages(logged, c.feedback_baseline_min) if abs(a) >= c.adv_threshold]
        self.logged_used |= {item.rollout.episode_id for item in logged if item.rollout.episode_id}
        metrics: dict[str, Any] = {
            "iteration": i,
            "reward/mean": sum(r.reward for r in every) / max(len(every), 1),
            "success/rate": sum(r.success for r in every) / max(len(every), 1),
            "adv/filtered_frac": 1 - len(kept) / max(len(every), 1),
            "rollouts": len(every),
            "logged/replayed": len(replayed),
            "logged/feedback_only": len(logged) - len(replayed),
            "logged/feedback_used": sum(1 for item in logged if item.reward_source == "client"),
            "perf/rollout_s": time.perf_counter() - t0,
        }
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
        if c.promote and kept:
            self.safe_point(f"in iteration {i}, before saving its adapter")
            if self.accelerator.is_main_process:  # no update, no new version
                metrics.update(self.save_and_gate(i))
        return metrics

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
            return logps, sampler_gap(logps, batch)
        own = [r for r in batch if id(r) not in others]
        probe = [r for r in batch if id(r) in others] + own[: c.micro_batch_size]
        probed = compute_logprobs(self.module, probe, self.pad_id, c.micro_batch_size, device)
        gap = sampler_gap(probed, probe)
        if c.recompute_old_logprobs == "never" or gap <= 1e-3:
            return None, gap
        rest = own[c.micro_batch_size :]  # the probe's rows are computed already
        done = dict(zip(map(id, probe), probed, strict=True))
        done |= zip(
            map(id, rest), compute_logprobs(self.module, rest, self.pad_id, c.micro_batch_size, device), strict=True
        )
        return [done[id(r)] for r in batch], gap

    def save_and_gate(self, i: int) -> dict[str, Any]:
        if self.baseline_dev_tgc is None:  # nothing active yet: the bar is the base model
            with self.model.disable_adapter():
                self.baseline_dev_tgc = float(self.dev_summary(i)["tgc"])
        self.report({"phase": "saving", "iteration": i})
        with session_scope() as s:
            row = adapters.save_adapter(
                s,
                self.model,
                self.settings.adapters_dir,
                self.settings.model_name,
                parent=self.parent,
                training_run_id=self.run_id,
            )
            name = row.name
        summary = self.dev_summary(i)
        dev = float(summary["tgc"])
        with session_scope() as s:
            # the run's row first: a cancel request (or another learner) cannot slip in before the promotion
            ours = [TrainingRun.id == self.run_id, TrainingRun.cancel_requested.is_(False)]
            if self.owner is not None:
                ours.append(TrainingRun.lease_owner == self.owner)
            claimed = s.execute(sa.update(TrainingRun).where(*ours).values(adapter=name))
            still_ours = claimed.rowcount == 1  # type: ignore[attr-defined]
            stop = None if still_ours else _stop_reason(s, self.run_id, self.owner)
            candidate = adapter_store.get_adapter(s, name)
            assert candidate is not None
            promoted = False
            if stop is None:
                promoted = adapters.promote_or_reject(
                    s, candidate, dev, self.baseline_dev_tgc, self.config.promotion_tolerance
                )
                candidate.metrics = {
                    **candidate.metrics,
                    "dev_sgc": summary["sgc"],
                    "dev_set": self.source.dev_set,  # a later run gated on other tasks measures its own bar
                    "behaviour": summary["behaviour"],
                }
        if stop is not None:  # the candidate stays a candidate: saved whole, never gated
            self.cancellation.request(*stop)
            self.safe_point(f"in iteration {i}, before promoting {name}", collective=False)
            return {"adapter": name, "adapter/promoted": 0.0}  # several processes: all stop at the next point
        bar = self.baseline_dev_tgc  # what this candidate was gated against (the next one's bar may be its own)
        if promoted:
            adapters.announce(candidate)
            self.parent, self.baseline_dev_tgc = name, dev
        return {
            "dev/tgc": dev,
            "dev/sgc": summary["sgc"],
            "dev/baseline_tgc": bar,
            "dev/set": self.source.dev_set,
            **{f"behaviour/{k}": v for k, v in summary["behaviour"].items()},
            "adapter": name,
            "adapter/promoted": float(promoted),
        }

    def run(self, start: int) -> list[dict[str, Any]]:
        history = []
        for i in range(start, self.config.iterations):
            self.safe_point(f"before iteration {i}")
            metrics = self.iteration(i)
            history.append(metrics)
            if self.accelerator.is_main_process:
                self.checkpoint.save(
                    self.model,
                    self.optimizer,
                    i + 1,
                    self.config,
                    self.rng,
                    {
                        "parent": self.parent,
                        "baseline_dev_tgc": self.baseline_dev_tgc,
                        "logged_used": sorted(self.logged_used),
                    },
                )
                with session_scope() as s:
                    run = s.get(TrainingRun, self.run_id)
                    assert run is not None
                    run.iteration = i + 1
                    run.metrics = [*(run.metrics or []), metrics]
                self.report({"phase": "iteration_done", "iteration": i, "metrics": metrics})
        return history


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


def _stop_reason(session: Any, run_id: str, owner: str | None) -> tuple[str, bool]:
    """Why the run's row refused the promotion: a cancel request, or the lease is someone else's."""
    row = session.execute(
        sa.select(TrainingRun.cancel_requested, TrainingRun.error, TrainingRun.lease_owner).where(
            TrainingRun.id == run_id
        )
    ).one_or_none()
    if row is None or (owner is not None and row.lease_owner != owner):
        return "the run's lease is held by another learner now", True
    return row.error or "cancelled", False


def _distinct(tasks: list[EvalTask]) -> list[EvalTask]:
    seen: set[str] = set()
    return [t for t in tasks if not (t.task_ref in seen or seen.add(t.task_ref))]  # type: ignore[func-returns-value]


def _rng_state(value: Any) -> Any:
    """JSON turned the RNG state's tuples into lists; random.setstate wants them back."""
    version, internal, gauss = value
    return (version, tuple(internal), gauss)


# --- leases and the entry point ---------------------------------------------------------------------


def claim_run(run_id: str, owner: str, lease_s: float) -> TrainingRun | None:
    now = utcnow()
    with session_scope() as s:
        result = s.execute(
            sa.update(TrainingRun)
            .where(
                TrainingRun.id == run_id,
                sa.or_(
                    TrainingRun.status == "queued",
                    sa.and_(TrainingRun.status == "running", TrainingRun.lease_expires_at < now),
                ),
                TrainingRun.cancel_requested.is_(False),
            )
            .values(
                status="running",
                lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_s),
                started_at=sa.func.coalesce(TrainingRun.started_at, now),
                attempts=TrainingRun.attempts + 1,
            )
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:  # type: ignore[attr-defined]
            return None
        run = s.get(TrainingRun, run_id, populate_existing=True)
        assert run is not None
        s.expunge(run)
        return run


class RunHeartbeat(threading.Thread):
    """Renews the run's lease every heartbeat_s, and notices within a second a cancel request or a lease
    that is not ours any more (the sweeper gave the run up): the trainer then stops at its next safe point."""

    CANCEL_POLL_S = 1.0

    def __init__(self, run_id: str, owner: str, settings: Settings, cancellation: Cancellation) -> None:
        super().__init__(daemon=True, name=f"run-heartbeat-{run_id[:8]}")
        self.run_id, self.owner, self.settings, self.cancellation = run_id, owner, settings, cancellation
        self.stop_event = threading.Event()

    def run(self) -> None:
        last_renewal = time.monotonic()
        while not self.stop_event.wait(min(self.CANCEL_POLL_S, self.settings.heartbeat_s)):
            try:
                with session_scope() as s:
                    if time.monotonic() - last_renewal >= self.settings.heartbeat_s:
                        s.execute(
                            sa.update(TrainingRun)
                            .where(TrainingRun.id == self.run_id, TrainingRun.lease_owner == self.owner)
                            .values(lease_expires_at=utcnow() + timedelta(seconds=self.settings.lease_s))
                        )
                        last_renewal = time.monotonic()
                    row = s.execute(
                        sa.select(TrainingRun.cancel_requested, TrainingRun.error, TrainingRun.lease_owner).where(
                            TrainingRun.id == self.run_id
                        )
                    ).one_or_none()
            except Exception as exc:  # retried next period; the lease outlives several
                log.warning("heartbeat of training run %s failed: %s", self.run_id, exc)
                continue
            if row is None or row.lease_owner != self.owner:
                self.cancellation.request("the run's lease is not this learner's any more", lease_lost=True)
                return
            if row.cancel_requested:
                self.cancellation.request(row.error or "cancelled")


def db_reporter(run_id: str) -> Report:
    def report(progress: dict[str, Any]) -> None:
        with session_scope() as s:
            s.execute(
                sa.update(TrainingRun)
                .where(TrainingRun.id == run_id)
                .values(progress={k: v for k, v in progress.items() if k != "metrics"})
            )
        events.publish(
            events.run_channel(run_id),
            {"type": "progress", **{k: v for k, v in progress.items() if isinstance(v, int | float | str)}},
        )

    return report


def run_training(
    run_id: str,
    owner: str,
    settings: Settings,
    report: Report | None = None,
    cancellation: Cancellation | None = None,
) -> str:
    """Claim the run, train, and record the outcome. Returns finished | failed | cancelled | lease_lost |
    not_claimed. `cancellation` lets the caller stop the run too (`agentloop learn` on a signal).
    Under `accelerate launch` / torchrun every process calls this: the main one claims the run,
    samples, stores, evaluates and reports; the others join the updates."""
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())
    cancellation = cancellation or Cancellation()
    if state.num_processes > 1:
        return _run_distributed(run_id, owner, settings, report, state, cancellation)
    run = claim_run(run_id, owner, settings.lease_s)
    if run is None:
        return "not_claimed"
    return _run_claimed(run, owner, settings, report, cancellation)


def _run_distributed(
    run_id: str, owner: str, settings: Settings, report: Report | None, state: Any, cancellation: Cancellation
) -> str:
    from accelerate.utils import broadcast_object_list

    claimed: list[Any] = [None]
    if state.is_main_process:
        run = claim_run(run_id, owner, settings.lease_s)
        claimed = [run]
    broadcast_object_list(claimed, from_process=0)
    if claimed[0] is None:
        return "not_claimed"
    if state.is_main_process:
        return _run_claimed(claimed[0], owner, settings, report, cancellation)
    run = claimed[0]
    config = LoopConfig.for_algo(
        run.config.get("algo", run.algo), **{k: v for k, v in run.config.items() if k != "algo"}
    )
    trainer = Trainer(settings, config, run_id)  # stops when the main process does (collective safe points)
    try:
        trainer.run(trainer.setup())
    except RunStopped:
        return "cancelled"
    return "finished"


def _run_claimed(
    run: TrainingRun, owner: str, settings: Settings, report: Report | None, cancellation: Cancellation
) -> str:
    run_id = run.id
    to_db = db_reporter(run_id)

    def both(progress: dict[str, Any]) -> None:
        to_db(progress)
        if report is not None:
            report(progress)

    heartbeat = RunHeartbeat(run_id, owner, settings, cancellation)
    heartbeat.start()
    try:
        config = LoopConfig.for_algo(
            run.config.get("algo", run.algo), **{k: v for k, v in run.config.items() if k != "algo"}
        )
        trainer = Trainer(settings, config, run_id, report=both, cancellation=cancellation, owner=owner)
        start = trainer.setup()
        trainer.run(start)
    except RunStopped as stop:
        return _record_stop(run_id, owner, stop)
    except Exception as exc:
        log.exception("training run %s failed", run_id)
        with session_scope() as s:
            s.execute(
                sa.update(TrainingRun)
                .where(TrainingRun.id == run_id, TrainingRun.lease_owner == owner)
                .values(
                    status="failed",
                    error=f"{type(exc).__name__}: {exc}",
                    finished_at=utcnow(),
                    lease_owner=None,
                    lease_expires_at=None,
                )
            )
        events.publish(events.run_channel(run_id), {"type": "done"})
        return "failed"
    except BaseException as exc:  # KeyboardInterrupt, SystemExit: this process stops now, wherever it was
        why = cancellation.reason or f"the learner process was interrupted ({type(exc).__name__})"
        _record_stop(run_id, owner, RunStopped(why, "at once, in the middle of its current step"))
        raise
    finally:
        heartbeat.stop_event.set()
    with session_scope() as s:
        s.execute(
            sa.update(TrainingRun)
            .where(TrainingRun.id == run_id, TrainingRun.lease_owner == owner)
            .values(
                status="finished",
                finished_at=utcnow(),
                lease_owner=None,
                lease_expires_at=None,
                progress={"phase": "finished"},
            )
        )
    events.publish(events.run_channel(run_id), {"type": "done"})
    return "finished"


def _record_stop(run_id: str, owner: str, stop: RunStopped) -> str:
    """The run stopped at a safe point: record it as cancelled (a run whose lease another learner or the
    sweeper holds now is theirs to record)."""
    if stop.lease_lost:
        log.warning("training run %s: %s", run_id, stop)
        return "lease_lost"
    log.info("training run %s: %s", run_id, stop)
    with session_scope() as s:
        run = s.scalars(
            sa.select(TrainingRun).where(TrainingRun.id == run_id, TrainingRun.lease_owner == owner).with_for_update()
        ).first()
        if run is not None:
            run.cancel_requested = True  # never claimed again, even by a sweeper that misses the status
            kept = "; nothing of that iteration was kept" if stop.where.startswith(("in iteration", "at once")) else ""
            mark_cancelled(run, f"{stop}{kept}", utcnow())
            run.progress = {**run.progress, "stopped": stop.where}
    events.publish(events.run_channel(run_id), {"type": "done"})
    return "cancelled"
