"""A training run's shared phases, whatever the algorithm: load the model (resuming from the checkpoint or
starting from the active adapter), run iterations, checkpoint after each, save the candidate adapter,
evaluate it on dev and promote or reject it. Each algorithm is a sibling subclass that says what one
iteration is:

    rl.LoopTrainer         LOOP / GRPO / REINFORCE (+ step rewards)    K rollouts per task -> advantages -> update
    sft.SftTrainer         supervised steps on expert trajectories
    stepagent_trainer      StepAgent: inspection at expert prefixes -> reflection (step DPO or inverse RL)

`run.py` claims a run, holds its lease and records its outcome; this module never touches the lease.

Cancelling (POST /v1/admin/training-runs/{id}/cancel, or a signal to `agentloop learn`): the learner
stops at its next safe point, where nothing is half-written: before an iteration, between sampling
batches, after sampling, between update steps, before the adapter is saved, between dev evaluation
batches, and at the promotion itself (checked in the transaction that would promote). Nothing of the
iteration it stops in is kept: the checkpoint and the active adapter are the previous iteration's.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
import torch

from agentloop.agent.episode import Limits
from agentloop.agent.evaluate import run_eval, summarize
from agentloop.learner import adapters, experts, loop
from agentloop.learner.checkpoint import Checkpoint, rng_state
from agentloop.learner.config import LoopConfig
from agentloop.learner.model import load_base, lora_model
from agentloop.learner.task_source import load_source
from agentloop.learner.update import LogprobModel
from agentloop.policy.local import LocalPolicy
from agentloop.settings import Settings
from agentloop.store import adapters as adapter_store
from agentloop.store import training_runs
from agentloop.store.db import session_scope
from agentloop.store.models import TrainingRun

log = logging.getLogger(__name__)

Report = Callable[[dict[str, Any]], None]

EXPERT_CALL_TOKENS = 4096  # the most tokens one expert call may take when replayed

# which sibling runs an algorithm: its `<family>_iteration(i, algo)` method
FAMILY = {
    "sft": "sft",
    "stepagent-implicit": "stepagent",
    "stepagent-irl": "stepagent",
    "loop": "rl",
    "loop+step": "rl",
    "grpo": "rl",
    "reinforce": "rl",
}


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


AGREEMENT_ROWS = 2  # dev episodes per teacher-forced agreement pass (2-3k tokens each)


@dataclass
class Trainer:
    """The shared phases; a subclass implements `iteration` (and, for state it keeps between iterations,
    `checkpoint_extra` / `restore`)."""

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
        self.tenant_id: str | None = None  # the run's tenant (set by `setup`); None: a shared run
        self.agreement_steps: list[Any] | None = None  # dev oracle prefixes, drawn once
        self.last_agreement: float | None = None

    # --- setup
    def setup(self) -> int:
        """Load the model (resuming from the checkpoint, or starting from the active adapter) and return
        the first iteration to run."""
        from accelerate import Accelerator

        self.accelerator = self.accelerator or Accelerator(cpu=not torch.cuda.is_available())
        start = 0
        resumed: dict[str, Any] | None = None
        init_from: str | None = None
        measure_bar = False  # the active version's dev TGC was measured on other tasks than this run's dev
        with session_scope() as s:
            tenant_id = s.scalar(sa.select(TrainingRun.tenant_id).where(TrainingRun.id == self.run_id))
            self.tenant_id = tenant_id
            self.source = load_source(s, self.config, tenant_id, self.settings.secret_key)
            # it starts from what its owner is served now, and a candidate must do as well on dev
            active = adapter_store.serving_adapter(s, self.settings.model_name, tenant_id)
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
            self.rng.setstate(rng_state(state["rng"]))
            self.parent = state.get("parent", self.parent)
            self.baseline_dev_tgc = state.get("baseline_dev_tgc", self.baseline_dev_tgc)
            resumed = state
            init_from = str(self.checkpoint.adapter_path)
            measure_bar = False  # the bar was measured (or taken) when the run started
            log.info("run %s resumes at iteration %d from %s", self.run_id, start, self.checkpoint.path)
        if self.model is None:
            base, self.tokenizer = load_base(self.settings)
            torch.manual_seed(self.config.seed)
            self.model = lora_model(base, self.config, init_from)
        else:
            measure_bar = False  # weights the caller gave are not the active version's: the bar is the base model
        self.model.to(self.accelerator.device)
        self.module = LogprobModel(self.model, self.config.logprob_chunk)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=self.config.lr, weight_decay=self.config.weight_decay)
        if self.checkpoint.exists and self.checkpoint.optimizer_path.exists():
            self.optimizer.load_state_dict(torch.load(self.checkpoint.optimizer_path, weights_only=False))
        self.optimizer = self.accelerator.prepare(self.optimizer)
        eos = self.tokenizer.eos_token_id
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos)
        self.policy = LocalPolicy(
            self.model,
            self.tokenizer,
            name=self.settings.model_name,
            max_batch_size=self.settings.max_batch_size,
            max_batch_tokens=self.settings.max_batch_tokens,
            seed=self.config.seed,
        )
        self.train_tasks = self.source.train
        self.prepare()
        if resumed is not None:
            self.restore(resumed)
        if measure_bar and self.accelerator.is_main_process:  # the active version, before any update
            self.baseline_dev_tgc = self.dev_tgc()
        return start

    def limits(self, dev: bool = False, expert: bool = False) -> Limits:
        """Rollouts' limits, or dev evaluation's (greedy), or those expert trajectories are played under
        (every expert call is a turn: the dev turn limit, which oracle solutions fit in)."""
        c = self.config
        return Limits(
            max_turns=c.dev_max_turns if dev or expert else c.max_turns,
            # an expert's call is replayed whole, however long (cut, it would teach a call that does not parse)
            max_new_tokens=max(c.max_new_tokens, EXPERT_CALL_TOKENS) if expert else c.max_new_tokens,
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

    # --- what an algorithm adds
    def prepare(self) -> None:
        """After the model and the task source are loaded, before the first iteration (e.g. load experts)."""

    def iteration(self, i: int) -> dict[str, Any]:
        """One iteration of the algorithm its phase names; then, when it updated the weights, the candidate is
        saved and gated, and (with `agreement_prefixes`) the expert-action agreement on dev is measured."""
        algo = self.config.algo_at(i)
        method = getattr(self, f"{FAMILY[algo]}_iteration", None)
        if method is None:
            raise ValueError(f"{type(self).__name__} cannot run {algo!r}; use learner.run.AgentTrainer")
        lr = self.config.phase_lr(algo)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        metrics: dict[str, Any] = {"algo": algo, **method(i, algo)}
        metrics["perf/iteration_s"] = time.perf_counter() - t0
        updated = bool(metrics.pop("updated", 0.0))
        if self.config.agreement_prefixes and self.accelerator.is_main_process:
            metrics["agreement/dev"] = (
                self.dev_agreement() if updated or self.last_agreement is None else self.last_agreement
            )
        if self.config.promote and updated:
            self.safe_point(f"in iteration {i}, before saving its adapter")
            if self.accelerator.is_main_process:  # no update, no new version
                metrics.update(self.save_and_gate(i, metrics))
        return metrics

    def expert_batch(self, i: int) -> tuple[list[Any], dict[str, float]]:
        """The iteration's expert trajectories as rollouts, and how many came from each source."""
        tasks, counts = self.expert_tasks(i)
        return experts.expert_rollouts(self.tokenizer, tasks, self.limits(expert=True)), counts

    def expert_tasks(self, i: int) -> tuple[list[Any], dict[str, float]]:
        """The iteration's expert tasks (EvalTasks with an `expert`), and how many came from each source."""
        c = self.config
        tasks: list[Any] = []
        counts: dict[str, float] = {}
        if "demonstrations" in c.expert_sources or "logged" in c.expert_sources:
            with session_scope() as s:
                if "demonstrations" in c.expert_sources and self.source.app is None:
                    demos, unusable = experts.demonstration_experts(
                        s, self.source.provider, self.source.readers, c.experts_per_iteration // 2, self.rng
                    )
                    tasks += demos
                    counts |= {"experts/demonstrations": float(len(demos)), "experts/not_replayed": float(unusable)}
                if "logged" in c.expert_sources:
                    logged, episode_ids = experts.logged_experts(s, self.source, c.experts_per_iteration // 4)
                    training_runs.record_reads(s, self.run_id, self.source.readers, episode_ids)
                    tasks += logged
                    counts["experts/logged"] = float(len(logged))
        if "oracle" in c.expert_sources:
            oracles = experts.oracle_experts(self.source, c.experts_per_iteration - len(tasks), self.rng, c.procedural)
            tasks += oracles
            counts["experts/oracle"] = float(len(oracles))
        return tasks, counts

    def dev_agreement(self) -> float:
        """Expert-action agreement, in percent: at held-out dev oracle prefixes (the same every time), the
        greedy action is the expert's a*_t, token for token. Greedy decoding writes a*_t iff at each of its
        positions the most likely next token is a*_t's, so one teacher-forced pass over an expert episode
        measures all its steps (loop.greedy_hits): the prefixes are the steps of whole dev episodes, taken
        in a fixed random order until there are `agreement_prefixes`. A call written differently that
        means the same counts as a miss: this is a lower bound of call agreement."""
        if self.agreement_steps is None:
            self.agreement_steps = self._agreement_episodes(self.config.agreement_prefixes)
        total = sum(len(steps) for _, steps in self.agreement_steps)
        if not total:
            return 0.0
        self.report({"phase": "agreement", "prefixes": total, "episodes": len(self.agreement_steps)})
        self.model.eval()
        device = self.accelerator.device
        hits = 0
        for start in range(0, len(self.agreement_steps), AGREEMENT_ROWS):
            part = self.agreement_steps[start : start + AGREEMENT_ROWS]
            # each episode up to the end of its last measured action; targets: the measured actions' tokens
            ends = [len(steps[-1].prefix) + len(steps[-1].action_tokens) for _, steps in part]
            ids = torch.full((len(part), max(ends)), self.pad_id, dtype=torch.long)
            attn = torch.zeros_like(ids)
            targets = torch.zeros((len(part), max(ends) - 1), dtype=torch.bool)
            for b, ((tokens, steps), end) in enumerate(zip(part, ends, strict=True)):
                ids[b, :end] = torch.tensor(tokens[:end])
                attn[b, :end] = 1
                for st in steps:
                    targets[b, len(st.prefix) - 1 : len(st.prefix) + len(st.action_tokens) - 1] = True
            matches = loop.greedy_hits(self.model, ids.to(device), attn.to(device), targets.to(device))
            for b, (_, steps) in enumerate(part):
                for st in steps:
                    p = len(st.prefix)
                    hits += bool(matches[b, p - 1 : p + len(st.action_tokens) - 1].all())
        self.last_agreement = 100.0 * hits / total
        return self.last_agreement

    def _agreement_episodes(self, n: int) -> list[tuple[list[int], list[experts.ExpertStep]]]:
        """The steps of dev oracle episodes, episodes in a fixed random order, until n steps."""
        dev = [t for t in self.source.dev if t.expert is not None]
        rollouts = experts.expert_rollouts(self.tokenizer, dev, self.limits(expert=True))
        random.Random(0).shuffle(rollouts)
        chosen: list[tuple[list[int], list[experts.ExpertStep]]] = []
        for r in rollouts:
            steps = experts.expert_steps(r)[: n - sum(len(s) for _, s in chosen)]
            if steps:
                chosen.append((r.token_ids, steps))
            if sum(len(s) for _, s in chosen) == n:
                break
        return chosen

    def checkpoint_extra(self) -> dict[str, Any]:
        """JSON state kept between iterations, beside the shared state."""
        return {}

    def checkpoint_files(self) -> dict[str, Any]:
        """Torch state kept between iterations (e.g. a discriminator's weights and optimizer)."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back `checkpoint_extra`'s state (and files through self.checkpoint.load_file) on resume."""

    # --- shared phases
    def dev_summary(self, iteration: int | None = None) -> dict[str, Any]:
        tasks = self.source.dev
        self.report({"phase": "evaluating", "dev_tasks": len(tasks), "dev_set": self.source.dev_set})
        self.model.eval()
        self.policy.clear_cache()
        where = f"in iteration {iteration}, during the dev evaluation" if iteration is not None else "evaluating"
        done: list[bool] = []

        def on_result(result: Any) -> None:
            done.append(result.success)
            if len(done) % max(1, len(tasks) // 10) == 0 or len(done) == len(tasks):  # a dev set takes minutes
                self.report(
                    {
                        "phase": "evaluating",
                        "episodes_done": len(done),
                        "episodes_total": len(tasks),
                        "passed": sum(done),
                    }
                )
            self.safe_point(where, collective=False)

        results = run_eval(
            self.policy, tasks, 1, self.limits(dev=True), self.settings.max_batch_size, on_result=on_result
        )
        self.policy.clear_cache()
        return summarize(results)

    def dev_tgc(self) -> float:
        return float(self.dev_summary()["tgc"])

    def save_and_gate(self, i: int, learned: dict[str, Any] | None = None) -> dict[str, Any]:
        """Save the candidate, measure it on dev, promote or reject it. `learned`: the iteration's training
        metrics (agreement, step rewards, losses), stored with the candidate."""
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
                tenant_id=self.tenant_id,
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
            stop = None if still_ours else training_runs.stop_reason(s, self.run_id, self.owner)
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
                    "training": {k: v for k, v in (learned or {}).items() if isinstance(v, int | float | str)},
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
                    {"parent": self.parent, "baseline_dev_tgc": self.baseline_dev_tgc, **self.checkpoint_extra()},
                    self.checkpoint_files(),
                )
                training_runs.record_iteration(self.run_id, i + 1, metrics)
                self.report({"phase": "iteration_done", "iteration": i, "metrics": metrics})
        return history
