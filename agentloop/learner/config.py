"""Training configuration: the LOOP paper's defaults, one field per knob, checked on construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, get_args, get_origin, get_type_hints

Algo = Literal["sft", "stepagent-implicit", "stepagent-irl", "loop", "loop+step", "grpo", "reinforce"]
ALGOS = ("sft", "stepagent-implicit", "stepagent-irl", "loop", "loop+step", "grpo", "reinforce")
RL_ALGOS = ("loop", "loop+step", "grpo", "reinforce")  # rollouts of the agent's own, scored by the world
EXPERT_ALGOS = ("sft", "stepagent-implicit", "stepagent-irl", "loop+step")  # these need expert trajectories

# `--recipe default`: a supervised warm start on the experts, StepAgent cycles, then LOOP with step rewards;
# every iteration's candidate is gated on dev as any other
RECIPES: dict[str, tuple[str, ...]] = {"default": ("sft:2", "stepagent-implicit:3", "loop+step:3")}

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoopConfig:
    algo: Algo = field(
        default="loop",
        metadata={"help": "sft | stepagent-implicit | stepagent-irl | loop | loop+step | grpo | reinforce"},
    )
    iterations: int = field(default=1, metadata={"help": "training iterations to run"})
    phases: tuple[str, ...] = field(
        default=(),
        metadata={"help": "algo:iterations run in order (a recipe); empty: `algo` for `iterations`"},
    )
    tasks_per_iteration: int = field(default=40, metadata={"help": "N: tasks sampled per iteration"})
    rollouts_per_task: int = field(default=6, metadata={"help": "K: rollouts per task, same initial state"})
    splits: tuple[str, ...] = field(
        default=("train",), metadata={"help": "splits (of the world or the app) to sample tasks from"}
    )
    world: str = field(
        default="builtin", metadata={"help": "world whose tasks are sampled (with `app`: the world it runs in)"}
    )
    scenarios: tuple[str, ...] = field(
        default=(),
        metadata={"help": "train and evaluate on tasks of these scenarios only (ScienceWorld: task types); empty: all"},
    )
    app: str | None = field(
        default=None,
        metadata={"help": "a registered resettable app whose tasks (of `splits`) are sampled instead of the world's"},
    )
    procedural: bool = field(
        default=True,
        metadata={"help": "built-in world: draw train tasks as fresh <scenario>@<seed> instances, not the fixed list"},
    )
    replay_logged: bool = field(default=True, metadata={"help": "also train on episodes clients ran"})
    logged_per_iteration: int = field(default=40, metadata={"help": "most logged episodes used per iteration"})
    feedback_baseline_min: int = field(
        default=3, metadata={"help": "comparable episodes needed before a non-replayable one gets an advantage"}
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of rollouts"})
    max_turns: int = field(default=40, metadata={"help": "turn limit of a rollout (paper: 40 in training)"})
    max_new_tokens: int = field(default=1500, metadata={"help": "new tokens per turn"})
    observation_max_tokens: int = field(default=3000, metadata={"help": "observation truncation"})
    max_context_tokens: int = field(default=8192, metadata={"help": "a rollout stops at this context length"})
    # --- advantages
    std_normalise: bool = field(default=False, metadata={"help": "divide advantages by the group's reward std"})
    adv_threshold: float = field(default=0.01, metadata={"help": "drop rollouts with |A| below this"})
    expert_in_group: bool = field(
        default=False,
        metadata={
            "help": "loop, loop+step, grpo, reinforce: each sampled task's expert trajectory (its oracle, where it"
            " has one), played and scored by the world's evaluator, joins the task's group as one more sample, its"
            " pi_old the learner's own: a group whose rollouts all earned the same reward still has advantages"
        },
    )
    # --- the update
    epochs: int = field(default=2, metadata={"help": "passes over the iteration's rollouts"})
    minibatch_size: int = field(default=32, metadata={"help": "rollouts per optimizer step"})
    micro_batch_size: int = field(default=4, metadata={"help": "rollouts per forward/backward (accumulation)"})
    lr: float = field(default=5e-5, metadata={"help": "AdamW learning rate (constant) of RL phases"})
    sft_lr: float = field(default=1e-4, metadata={"help": "learning rate of sft phases"})
    stepagent_lr: float = field(default=5e-5, metadata={"help": "learning rate of stepagent phases"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    clip_eps: float = field(default=0.1, metadata={"help": "PPO clip epsilon: ratio kept in [1/(1+e), 1+e]"})
    ratio_level: Literal["token", "turn", "trajectory"] = field(
        default="token", metadata={"help": "importance ratio per token, turn or trajectory"}
    )
    kl_coef: float = field(default=0.0, metadata={"help": "lambda of a KL penalty to the adapter-free model"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient-norm clip"})
    kl_stop: float = field(default=20.0, metadata={"help": "stop the iteration's updates above this KL estimate"})
    activation_checkpointing: bool = field(
        default=False,
        metadata={"help": "recompute layer activations in backward: less memory on long rollouts, more compute"},
    )
    logprob_chunk: int = field(default=512, metadata={"help": "positions per log-prob chunk"})
    recompute_old_logprobs: Literal["auto", "always", "never"] = field(
        default="auto", metadata={"help": "recompute pi_old with the learner (auto: unless sampled by it)"}
    )
    # --- experts: supervised steps and StepAgent
    experts_per_iteration: int = field(
        default=16, metadata={"help": "expert trajectories drawn per iteration (oracles, demonstrations, logged)"}
    )
    expert_sources: tuple[str, ...] = field(
        default=("oracle", "demonstrations", "logged"),
        metadata={"help": "where experts come from: oracle solutions, uploaded demonstrations, successful episodes"},
    )
    sft_steps: int = field(default=16, metadata={"help": "sft: optimizer steps per iteration"})
    sft_batch_size: int = field(
        default=4, metadata={"help": "expert trajectories (sft) or inspected prefixes (stepagent-implicit) per step"}
    )
    micro_tokens: int = field(default=4096, metadata={"help": "padded tokens per forward/backward (accumulation)"})
    prompt_gradients: bool = field(
        default=True,
        metadata={
            "help": "sft: gradients through the prompt (the tokens before the first agent turn); off, the prompt"
            " runs without them: a cheaper backward, and how the prompt is read is not trained"
        },
    )
    recovery_share: float = field(
        default=0.0,
        metadata={
            "help": "sft: share of each iteration's experts replayed as recoveries: the agent's own greedy action"
            " at one of their steps where it is not the expert's, what the world answered, then the expert's calls"
            " from that step on; kept when the task still succeeds, trained on the expert's turns only"
        },
    )
    inspect_prefixes: int = field(default=24, metadata={"help": "stepagent: expert prefixes inspected per iteration"})
    inspect_samples: int = field(default=4, metadata={"help": "stepagent: M agent actions sampled per prefix"})
    inspect_temperature: float = field(default=1.0, metadata={"help": "stepagent: temperature of those samples"})
    dpo_beta: float = field(default=0.1, metadata={"help": "stepagent-implicit: beta of the step-level DPO"})
    dpo_anchor: float = field(default=1.0, metadata={"help": "stepagent-implicit: weight of the SFT anchor"})
    dpo_reference: Literal["base", "cycle"] = field(
        default="base",
        metadata={
            "help": "stepagent-implicit: DPO's reference, the adapter disabled (base) or the weights that sampled"
            " the cycle's actions (cycle; with greedy inspection, the weights at each optimizer step)"
        },
    )
    inspection: Literal["sample", "greedy"] = field(
        default="sample",
        metadata={
            "help": "stepagent-implicit: the agent's actions at expert prefixes, M samples decoded at"
            " `inspect_prefixes` prefixes (sample), or the greedy action at every step of every drawn expert, read"
            " from one teacher-forced pass per expert with a pair wherever its token is not the expert's (greedy)."
            " stepagent-irl always samples: its discriminator scores whole actions"
        },
    )
    irl_anchor: float = field(default=1.0, metadata={"help": "stepagent-irl: weight of the SFT anchor on a*_t"})
    disc_lr: float = field(default=1e-3, metadata={"help": "stepagent-irl: the discriminator's learning rate"})
    disc_steps: int = field(default=50, metadata={"help": "stepagent-irl: discriminator steps per iteration"})
    step_omega: float = field(default=0.5, metadata={"help": "loop+step: A_t = A_trajectory + omega * A_step"})
    agreement_prefixes: int = field(
        default=0, metadata={"help": "dev oracle steps at which expert-action agreement is measured (0: off)"}
    )
    # --- LoRA
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha"})
    lora_targets: tuple[str, ...] = field(default=LORA_TARGETS, metadata={"help": "modules that get LoRA"})
    lora_layers: int = field(
        default=0,
        metadata={"help": "LoRA on the upper N decoder layers only (0: all); backward stops below them"},
    )
    # --- rollouts, gate
    rollout_mode: Literal["local", "celery"] = field(
        default="local", metadata={"help": "local: this process samples; celery: the rollouts queue does"}
    )
    min_rollouts_per_task: int | None = field(
        default=None, metadata={"help": "stragglers: go on with >= this many of K (default min(4, K))"}
    )
    min_fraction: float = field(default=0.9, metadata={"help": "stragglers: ... and this fraction overall"})
    rollout_timeout_s: float = field(default=3600.0, metadata={"help": "stop waiting for rollouts after this"})
    dev_split: str = field(default="dev", metadata={"help": "split the candidate adapter is evaluated on"})
    dev_limit: int | None = field(default=None, metadata={"help": "evaluate on the first N dev tasks only"})
    dev_max_turns: int = field(default=50, metadata={"help": "turn limit on dev (paper: 50 in evaluation)"})
    promotion_tolerance: float = field(default=0.0, metadata={"help": "promote if dev TGC >= active's - this"})
    promote: bool = field(default=True, metadata={"help": "evaluate and promote at the end of each iteration"})
    seed: int = field(default=0, metadata={"help": "task sampling and rollout seed"})

    def __post_init__(self) -> None:
        named_scenarios = not isinstance(self.scenarios, str) and all(isinstance(x, str) and x for x in self.scenarios)
        self.splits = tuple(self.splits)
        self.scenarios = tuple(self.scenarios) if named_scenarios else self.scenarios
        self.lora_targets = tuple(self.lora_targets)
        self.expert_sources = tuple(self.expert_sources)
        self.phases = tuple(self.phases)
        problems = [] if named_scenarios else [f"scenarios must be a list of scenario names (got {self.scenarios!r})"]
        problems += [
            f"{name} must be one of {', '.join(map(repr, choices))} (got {getattr(self, name)!r})"
            for name, choices in CHOICES.items()
            if getattr(self, name) not in choices
        ]
        for phase in self.phases:
            algo, _, n = phase.partition(":")
            if algo not in ALGOS or not n.isdigit() or int(n) < 1:
                problems.append(f"phase {phase!r} must be <algo>:<iterations>, algo one of {', '.join(ALGOS)}")
        if self.phases and not problems:
            self.iterations = sum(int(p.partition(":")[2]) for p in self.phases)
        unknown_sources = sorted(set(self.expert_sources) - {"oracle", "demonstrations", "logged"})
        if unknown_sources:
            problems.append(f"unknown expert source(s) {', '.join(unknown_sources)}: oracle, demonstrations, logged")
        if self.min_rollouts_per_task is None:
            self.min_rollouts_per_task = min(4, self.rollouts_per_task)
        if self.rollouts_per_task < 2 and self.algo in RL_ALGOS and self.algo != "reinforce":
            problems.append("rollouts_per_task must be >= 2: the leave-one-out baseline needs other rollouts")
        if self.min_rollouts_per_task > self.rollouts_per_task:
            problems.append("min_rollouts_per_task cannot exceed rollouts_per_task")
        if not 0 < self.min_fraction <= 1:
            problems.append("min_fraction must be in (0, 1]")
        if self.micro_batch_size > self.minibatch_size:
            problems.append("micro_batch_size cannot exceed minibatch_size (it is the accumulation unit)")
        for name in (
            "iterations",
            "tasks_per_iteration",
            "epochs",
            "minibatch_size",
            "micro_batch_size",
            "max_turns",
            "max_new_tokens",
            "lora_r",
            "logprob_chunk",
            "experts_per_iteration",
            "sft_steps",
            "sft_batch_size",
            "inspect_prefixes",
            "inspect_samples",
            "micro_tokens",
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if min(self.lr, self.sft_lr, self.stepagent_lr, self.clip_eps, self.dpo_beta, self.disc_lr) <= 0:
            problems.append("lr, sft_lr, stepagent_lr, clip_eps, dpo_beta and disc_lr must be > 0")
        if min(self.dpo_anchor, self.irl_anchor, self.step_omega, self.agreement_prefixes, self.lora_layers) < 0:
            problems.append("dpo_anchor, irl_anchor, step_omega, agreement_prefixes and lora_layers must be >= 0")
        if not 0 <= self.recovery_share <= 1:
            problems.append(f"recovery_share must be in [0, 1] (got {self.recovery_share!r})")
        if self.inspection == "greedy" and "stepagent-irl" in self.algos():
            problems.append("inspection 'greedy' is stepagent-implicit's: stepagent-irl's discriminator needs samples")
        if self.temperature != 1.0 and self.recompute_old_logprobs == "never":
            problems.append("rollouts sampled at temperature != 1 need recompute_old_logprobs='auto' or 'always'")
        if self.app is not None and (not isinstance(self.app, str) or not self.app):
            problems.append("app must be the name of a registered app")
        if problems:
            raise ValueError("invalid training config: " + "; ".join(problems))

    def algo_at(self, iteration: int) -> str:
        """The algorithm iteration `iteration` (from 0) runs: its phase's, or `algo`."""
        for phase in self.phases:
            algo, _, n = phase.partition(":")
            if iteration < int(n):
                return algo
            iteration -= int(n)
        return self.phases[-1].partition(":")[0] if self.phases else self.algo

    def phase_lr(self, algo: str) -> float:
        return {"sft": self.sft_lr, "stepagent-implicit": self.stepagent_lr, "stepagent-irl": self.stepagent_lr}.get(
            algo, self.lr
        )

    def algos(self) -> tuple[str, ...]:
        return tuple(p.partition(":")[0] for p in self.phases) if self.phases else (self.algo,)

    @property
    def label(self) -> str:
        """What a training run records as its algo: the algorithm, or a recipe's phases joined by '+'."""
        return "+".join(self.algos())

    @classmethod
    def for_recipe(cls, recipe: str, **overrides: Any) -> LoopConfig:
        if recipe not in RECIPES:
            raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}")
        return cls.for_algo(RECIPES[recipe][0].partition(":")[0], phases=RECIPES[recipe], **overrides)

    @classmethod
    def for_algo(cls, algo: str, **overrides: Any) -> LoopConfig:
        """Defaults per algorithm: GRPO normalises advantages by the group std; REINFORCE makes one plain
        policy-gradient pass."""
        presets: dict[str, dict[str, Any]] = {"grpo": {"std_normalise": True}, "reinforce": {"epochs": 1}}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"unknown training option(s): {', '.join(unknown)}")
        return cls(**{"algo": algo, **presets.get(algo, {}), **overrides})

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["splits"] = list(self.splits)
        data["lora_targets"] = list(self.lora_targets)
        data["expert_sources"] = list(self.expert_sources)
        data["phases"] = list(self.phases)
        return data


# the fields whose values are a fixed set of words, and those words (checked on construction)
CHOICES: dict[str, tuple[Any, ...]] = {
    name: get_args(hint) for name, hint in get_type_hints(LoopConfig).items() if get_origin(hint) is Literal
}
