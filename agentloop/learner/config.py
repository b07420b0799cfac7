"""Training configuration: the LOOP paper's defaults, one field per knob, checked on construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

Algo = Literal["loop", "grpo", "reinforce"]
ALGOS = ("loop", "grpo", "reinforce")

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoopConfig:
    algo: Algo = field(default="loop", metadata={"help": "loop | grpo (std-normalised group advantage) | reinforce"})
    iterations: int = field(default=1, metadata={"help": "training iterations to run"})
    tasks_per_iteration: int = field(default=40, metadata={"help": "N: tasks sampled per iteration"})
    rollouts_per_task: int = field(default=6, metadata={"help": "K: rollouts per task, same initial state"})
    splits: tuple[str, ...] = field(
        default=("train",), metadata={"help": "splits (of the world or the app) to sample tasks from"}
    )
    world: str = field(
        default="builtin", metadata={"help": "world whose tasks are sampled (with `app`: the world it runs in)"}
    )
    app: str | None = field(
        default=None,
        metadata={"help": "a registered resettable app whose tasks (of `splits`) are sampled instead of the world's"},
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
    # --- the update
    epochs: int = field(default=2, metadata={"help": "passes over the iteration's rollouts"})
    minibatch_size: int = field(default=32, metadata={"help": "rollouts per optimizer step"})
    micro_batch_size: int = field(default=4, metadata={"help": "rollouts per forward/backward (accumulation)"})
    lr: float = field(default=5e-5, metadata={"help": "AdamW learning rate (constant)"})
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
    # --- LoRA
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha"})
    lora_targets: tuple[str, ...] = field(default=LORA_TARGETS, metadata={"help": "modules that get LoRA"})
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
        self.splits = tuple(self.splits)
        self.lora_targets = tuple(self.lora_targets)
        problems = []
        if self.min_rollouts_per_task is None:
            self.min_rollouts_per_task = min(4, self.rollouts_per_task)
        if self.algo not in ALGOS:
            problems.append(f"algo must be one of {', '.join(ALGOS)}")
        if self.rollouts_per_task < 2 and self.algo != "reinforce":
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
        ):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if self.lr <= 0 or self.clip_eps <= 0:
            problems.append("lr and clip_eps must be > 0")
        if self.temperature != 1.0 and self.recompute_old_logprobs == "never":
            problems.append("rollouts sampled at temperature != 1 need recompute_old_logprobs='auto' or 'always'")
        if self.app is not None and (not isinstance(self.app, str) or not self.app):
            problems.append("app must be the name of a registered app")
        if problems:
            raise ValueError("invalid training config: " + "; ".join(problems))

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
        return data
