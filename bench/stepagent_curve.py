"""Expert-action agreement and dev TGC per cycle: SFT alone, StepAgent (implicit reward, inverse RL), LOOP
and LOOP+step, each from one shared supervised warm start and for the same training budget, on the
built-in world whose train tasks (and their oracle experts) are fresh `<scenario>@<seed>` instances.

    python bench/stepagent_curve.py [--quick] [--results DIR] [--arms sft,loop,...] [--start-only] [--merge]
        [--rerun] [--defer-eval] [--extend] [--budget-s S] [--warm-start-s S] [--dev-every N] [--model DIR]
        [--json] [--write-docs]

On a CPU that another job shares, OMP_NUM_THREADS=1 is several times faster than torch's default of one
thread per core (measured here: decoding 4.5x, prefill 1.7x, with one other process busy on 2 cores).

Phases, each kept on disk under `--results DIR` so that a run can be split into sittings:
    base.json          the base model (no adapter): dev TGC / SGC and expert-action agreement, measured once
    warm_start/        SFT for `--warm-start-s` training seconds from a fresh adapter: the adapter every arm
    warm_start.json    loads (reused when present) and its dev figures, which are every arm's start point
    <arm>.json         one arm, rewritten after every cycle: a run killed midway keeps what it measured
    adapters/<arm>/    the arm's adapter when its budget is spent: what its end-of-arm dev evaluation measures.
                       With --defer-eval an arm stops there (its file says trained, not finished) and the
                       same command without the flag, in a later sitting, runs only that evaluation

Arms (`--arms`, run in the order given): sft (SFT alone: more supervised cycles), sft-recovery (SFT with
half of each cycle's experts replayed as recoveries: the agent's own greedy mistake at one of their steps, the
world's answer, then the expert's calls; learner/recovery.py), stepagent-implicit,
stepagent-greedy (stepagent-implicit with `inspection: greedy`: pairs where the greedy action leaves the
expert's, read from SFT's own pass), stepagent-irl, loop, loop+step, loop+expert (LOOP with each group's task's
expert trajectory, scored by the world, as one more sample of the group: LoopConfig.expert_in_group),
sft+loop+expert (cycles alternate: one of SFT alone's, then one of loop+expert's, each at its own lr). An arm
whose file records a finished run with the same settings (the model, the presets, the seed and SFT lr, and that
arm's own options: another arm's lr or beta does not count) is skipped (`--rerun` runs it again). `--extend` with
a larger `--budget-s` continues such an arm from its saved adapter and optimizer state (cycles kept; AdamW's
moments are saved as `optimizer.pt` beside the adapter, which the repository ignores: an adapter saved without
them, or checked out without them, goes on with a fresh optimizer, recorded per extension).
`--start-only` makes base.json and the warm start, no arm; `--merge` trains nothing; every run ends by
building the table and the PNG from every arm file in DIR.

Budget: an arm's "train seconds" are the wall time of `Trainer.iteration` (one cycle: drawing experts or
rollouts, inspection, the update), less the agreement measurement the learner makes inside it. A cycle
starts while the train seconds are below `--budget-s` (and fewer than `--max-cycles` ran); the cycle that
crosses the budget runs to its end and counts. Dev evaluation (greedy, `--dev-max-turns` turns) runs at
the arm's start (the warm start's figures), every `--dev-every` cycles (0: none between) and at the end,
timed apart.

Fairness: one seed; cycle i of every arm draws from an RNG seeded with (seed, i), so the arms see the same
procedural instances where they draw the same things; the same dev set and agreement prefixes; each arm in
its own AGENTLOOP_HOME and SQLite database under DIR/homes/<arm>, the model reloaded from the warm-start
adapter with a fresh optimizer.

Output: a summary table (stdout), `--plot` PNG of agreement and dev TGC vs train seconds (skipped with a
note without matplotlib), with `--write-docs` the `stepagent_curve` section of docs/benchmarks.md; progress
on stderr; last line a JSON object.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import random
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from learning_curve import new_run, use_home

from agentloop.learner.checkpoint import write_atomically
from agentloop.learner.config import LoopConfig
from agentloop.learner.model import lora_model
from agentloop.learner.run import AgentTrainer
from agentloop.learner.trainer import Trainer
from agentloop.policy.models import resolve_model_dir
from agentloop.settings import Settings, get_settings

from report import emit, machine, write_section

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PLOT = ROOT / "docs" / "stepagent_curve.png"
SECTION = "stepagent_curve"
OPTIMIZER_FILE = "optimizer.pt"  # AdamW's state beside an arm's adapter, for --extend

ARMS = (
    "sft",
    "sft-recovery",
    "stepagent-implicit",
    "stepagent-greedy",
    "stepagent-irl",
    "loop",
    "loop+step",
    "loop+expert",
    "sft+loop+expert",
)
# their gain is over SFT alone's
STEP_REWARD_ARMS = ("stepagent-implicit", "stepagent-greedy", "stepagent-irl", "loop+step")
LABELS = {
    "sft": "SFT alone",
    "sft-recovery": "SFT with recovery experts",
    "stepagent-implicit": "StepAgent (implicit reward)",
    "stepagent-greedy": "StepAgent (implicit reward, greedy inspection)",
    "stepagent-irl": "StepAgent (inverse RL)",
    "loop": "LOOP",
    "loop+step": "LOOP + step rewards",
    "loop+expert": "LOOP with the expert in each group",
    "sft+loop+expert": "SFT and LOOP with the expert, alternate cycles",
}

# (full run, --quick); None in a flag means "take the preset". The full run fits a 2-core CPU: a cycle is
# a minute or two, and a dev evaluation of all 51 dev tasks some minutes.
PRESETS: dict[str, tuple[Any, Any]] = {
    "budget_s": (2400.0, 1.0),  # --quick: one cycle per arm (the cycle that crosses the budget counts)
    "max_cycles": (1000, 1),
    "warm_start_s": (600.0, 1.0),
    "dev_every": (0, 0),
    "dev_limit": (None, 1),  # None: all dev tasks
    "dev_max_turns": (16, 2),  # the oracle solutions of the dev tasks take at most 15 calls
    "agreement_prefixes": (48, 2),  # the steps of ~10 dev oracle episodes, one teacher-forced pass each
    "tasks_per_iteration": (2, 1),
    "rollouts_per_task": (4, 2),
    "max_turns": (16, 1),
    "max_new_tokens": (160, 48),  # oracle calls take up to ~140 tokens: a longer one is cut and parses as none
    "experts_per_iteration": (32, 1),  # = sft_steps x sft_batch_size: every SFT step sees experts of its own
    "sft_steps": (8, 1),
    "sft_batch_size": (4, 1),
    "inspect_prefixes": (8, 1),
    "inspect_samples": (4, 2),
    "epochs": (None, 1),  # passes of an update over its batch (None: the learner's default)
    # bench/sft_step.py: LoRA on the upper 10 of 30 layers with opening-aware micro-batches of 8192 tokens
    # trains several times faster than LoRA everywhere in 4096-token micro-batches, in less memory
    "lora_layers": (10, 10),
    "micro_tokens": (8192, 8192),
}
# LoopConfig fields a flag sets for every arm (None: the algorithm's preset or the field's default)
OPTIONS = (
    "sft_lr",
    "stepagent_lr",
    "lr",
    "dpo_beta",
    "dpo_anchor",
    "dpo_reference",
    "irl_anchor",
    "step_omega",
    "seed",
)
# arms that run another arm's algorithm with some options of their own
ARM_ALGOS: dict[str, tuple[str, dict[str, Any]]] = {
    "stepagent-greedy": ("stepagent-implicit", {"inspection": "greedy"}),
    # half of each cycle's experts replayed with the agent's own greedy mistake at one step (learner/recovery.py)
    "sft-recovery": ("sft", {"recovery_share": 0.5}),
    # each rollout group has its task's expert trajectory as one more sample, scored by the world (rl.py)
    "loop+expert": ("loop", {"expert_in_group": True}),
    # cycles alternate: one of SFT on gold paths (at sft_lr), then one of loop+expert's update (at lr), and again
    "sft+loop+expert": ("loop", {"expert_in_group": True, "phases": ("sft:1", "loop:1") * 500}),
}
# the options that shape one arm only: its file is comparable with another run's whatever the others say
ARM_OPTIONS = {
    "stepagent-implicit": ("stepagent_lr", "dpo_beta", "dpo_anchor", "dpo_reference"),
    "stepagent-greedy": ("stepagent_lr", "dpo_beta", "dpo_anchor", "dpo_reference"),
    "stepagent-irl": ("stepagent_lr", "irl_anchor"),
    "loop": ("lr",),
    "loop+step": ("lr", "step_omega"),
    "loop+expert": ("lr",),
    "sft+loop+expert": ("lr",),
}
CONFIG_FIELDS = (
    "dev_limit",
    "dev_max_turns",
    "agreement_prefixes",
    "tasks_per_iteration",
    "rollouts_per_task",
    "max_turns",
    "max_new_tokens",
    "experts_per_iteration",
    "sft_steps",
    "sft_batch_size",
    "inspect_prefixes",
    "inspect_samples",
    "epochs",
    "lora_layers",
    "micro_tokens",
)
# what base.json's and warm_start.json's dev figures depend on: measured again when one differs (only the
# agreement when only its settings differ)
DEV_KEYS = ("model", "seed", "dev_limit", "dev_max_turns", "max_new_tokens")
# and these where a file records them: a world's own evaluation settings, and the worked example where it is
# not the fixed one (a warm start measured with the fixed example is measured again for a nearest-example arm)
OPTIONAL_DEV_KEYS = ("per_type", "prompt_example")
DEV_FIGURES = ("dev_tgc", "dev_sgc", "dev_tasks", "dev_solved", "behaviour", "mean_turns")
AGREEMENT_KEYS = ("agreement_prefixes", "agreement_metric")
# how the learner measures agreement: a file measured another way has its agreement measured again
AGREEMENT_METRIC = "greedy = expert tokens, teacher-forced over whole dev oracle episodes"
# per-cycle metrics of the learner kept in an arm's file (absent where the algorithm has none)
METRICS = {
    "reward/mean": "reward_mean",
    "success/rate": "success_rate",
    "step_reward/mean": "step_reward_mean",
    "dpo/margin": "dpo_margin",
    "dpo/accuracy": "dpo_accuracy",
    "disc/accuracy": "disc_accuracy",
    "loss/sft": "loss_sft",
    "adv/filtered_frac": "adv_filtered_frac",
    "rollouts": "rollouts",
    "experts": "experts",
    "recovery/kept": "recovery_kept",
    "recovery/errors": "recovery_errors",
    "recovery/agent_agreed": "recovery_agent_agreed",
    "expert/joined": "expert_joined",
    "expert/reward_mean": "expert_reward_mean",
}
ITERATION_TIME_KEY = "perf/iteration_s"  # the learner's time for the algorithm's part of `iteration`

T0 = time.perf_counter()


@dataclass(frozen=True)
class Curve:
    """What a learning-curve bench trains and measures: the world and its task selection (LoopConfig fields),
    the arms it offers, the presets, and a point's figures (`figures(trainer, args)`: greedy evaluation of the
    trainer's weights; the first of `figure_keys` is the one progress lines show). This file's is CURVE, on the
    built-in world; bench/scienceworld_curve.py runs the same phases with its own."""

    script: str
    name: str  # the results folder's default name under $AGENTLOOP_HOME/bench
    arms: tuple[str, ...]
    presets: dict[str, tuple[Any, Any]]
    world: dict[str, Any]
    figures: Callable[[Trainer, argparse.Namespace], dict[str, Any]]
    figure_keys: tuple[str, ...]
    extra_args: Callable[[argparse.ArgumentParser], None] | None = None  # flags of this bench alone


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {message}", file=sys.stderr, flush=True)


# --- files under DIR ------------------------------------------------------------------------------------


def arm_path(results: Path, arm: str) -> Path:
    return results / f"{arm}.json"


def read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all: a run killed while writing leaves the previous cycle's file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def bench_settings(args: argparse.Namespace, model: str) -> dict[str, Any]:
    """What makes two arm files comparable: the model, the presets (after `--quick`) and the options."""
    keys = [k for k in args.curve.presets if k != "dev_every"]  # when dev is measured does not change what is trained
    shown = {"prompt_example": args.prompt_example} if args.prompt_example != "fixed" else {}  # (older files: fixed)
    shown |= {} if args.prompt_gradients else {"prompt_gradients": False}  # (older files: on)
    return {"model": model, **{k: getattr(args, k) for k in [*keys, *OPTIONS]}, **shown}


def arm_settings(settings: dict[str, Any], arm: str) -> dict[str, Any]:
    """What must match for an arm's file to be this run's: the model, the presets, the options every arm shares
    (the seed; the SFT lr, which trained the warm start and SFT alone) and the arm's own."""
    others = {k for a, keys in ARM_OPTIONS.items() if a != arm for k in keys} - set(ARM_OPTIONS.get(arm, ()))
    return {k: v for k, v in settings.items() if k not in others}


def eval_settings(settings: dict[str, Any]) -> dict[str, Any]:
    keys = [*DEV_KEYS, *(k for k in OPTIONAL_DEV_KEYS if k in settings), *AGREEMENT_KEYS]
    return {**{k: settings.get(k) for k in keys}, "agreement_metric": AGREEMENT_METRIC}


def stale(found: dict[str, Any], settings: dict[str, Any]) -> str | None:
    """What of a phase file's figures must be measured again: None (nothing), "agreement" or "dev" (all)."""
    old, now = found.get("settings", {}), eval_settings(settings)
    if old == now:
        return None
    return "agreement" if all(old.get(k) == now.get(k) for k in DEV_KEYS + OPTIONAL_DEV_KEYS) else "dev"


def command(args: argparse.Namespace) -> str:
    """This run's command line, less the output-only flags."""
    return f"python {args.curve.script}" + "".join(
        f" {shlex.quote(a)}" for a in sys.argv[1:] if a not in ("--write-docs", "--json")
    )


def stamp(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "command": command(args),
        "machine": machine(),
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "load_avg_1min": round(os.getloadavg()[0], 2),
    }


# --- one trainer ----------------------------------------------------------------------------------------


def make_config(algo: str, args: argparse.Namespace, **overrides: Any) -> LoopConfig:
    options = {k: getattr(args, k) for k in OPTIONS if getattr(args, k) is not None}
    algo, preset = ARM_ALGOS.get(algo, (algo, {}))
    return LoopConfig.for_algo(
        algo,
        iterations=args.max_cycles,
        splits=("train",),
        **args.curve.world,
        expert_sources=("oracle",),  # experts: oracle episodes of (fresh procedural) train tasks, nothing logged
        replay_logged=False,
        **{k: getattr(args, k) for k in CONFIG_FIELDS if getattr(args, k) is not None or k == "dev_limit"},
        micro_batch_size=1,  # a rollout is ~2k tokens: activations of one at a time
        promote=False,  # no gate, no adapter versions: this bench measures dev itself
        prompt_gradients=args.prompt_gradients,
        **{**preset, **options, **overrides},
    )


def load_trainer(
    settings: Settings, config: LoopConfig, model_dir: Path, init_from: Path | None, label: str
) -> Trainer:
    """The config's trainer over a freshly loaded base model with the adapter from `init_from` (or a new one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(config.seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = lora_model(base, config, str(init_from) if init_from is not None else None)

    def report(event: dict[str, Any]) -> None:
        if event.get("phase") == "rollouts" and 0 < event.get("rollouts_done", 0) < event.get("rollouts_total", 0):
            return  # batched: the results of a batch arrive together
        shown = {k: v for k, v in event.items() if k not in ("phase", "metrics")}
        progress(f"{label} {event.get('phase')} " + " ".join(f"{k}={v}" for k, v in shown.items()))

    trainer = AgentTrainer(settings, config, new_run(config, "bench"), report=report, model=model, tokenizer=tokenizer)
    trainer.setup()
    with_dev_tasks(trainer)
    return trainer


def release(trainer: Trainer) -> None:
    """Free the model (and whatever else of this trainer's holds tensors) before the next one is loaded."""
    trainer.policy.clear_cache()
    del trainer.model, trainer.policy, trainer.module, trainer.optimizer
    gc.collect()


def with_dev_tasks(trainer: Trainer) -> None:
    """The learner loads its dev tasks to gate a promotion (off here: this bench measures dev itself) or to
    measure agreement; with `--agreement-prefixes 0` neither: load them the way the learner would."""
    if trainer.source.dev:
        return
    from agentloop.agent.eval_runs import world_tasks
    from agentloop.apps.registry import get_world

    c = trainer.config
    trainer.source.dev = world_tasks(get_world(c.world), c.dev_split, c.dev_limit)
    trainer.source.dev_set = f"{c.world}/{c.dev_split}"


def dev_figures(trainer: Trainer, args: argparse.Namespace) -> dict[str, Any]:
    """The built-in world's: greedy dev TGC / SGC over the dev tasks, the tasks solved, and behaviour."""
    summary = trainer.dev_summary()
    return {
        "dev_tgc": summary["tgc"],
        "dev_sgc": summary["sgc"],
        "dev_tasks": summary["tasks"],
        "dev_solved": summary["solved"],
        "behaviour": summary["behaviour"],
        "mean_turns": summary.get("mean_turns"),
    }


CURVE = Curve(
    script="bench/stepagent_curve.py",
    name="stepagent_curve",
    arms=ARMS,
    presets=PRESETS,
    world={"world": "builtin", "procedural": True},
    figures=dev_figures,
    figure_keys=DEV_FIGURES,
)


def measure_dev(trainer: Trainer, args: argparse.Namespace, agreement: bool = True) -> dict[str, Any]:
    """The curve's evaluation (`Curve.figures`) and expert-action agreement of the trainer's weights, timed."""
    t0 = time.perf_counter()
    point = args.curve.figures(trainer, args)
    if agreement:
        point.update(measure_agreement(trainer))
    point["eval_s"] = round(time.perf_counter() - t0, 1)  # the dev evaluation and the agreement
    return point


def measure_agreement(trainer: Trainer) -> dict[str, Any]:
    """The learner's expert-action agreement on dev, timed; nothing with `--agreement-prefixes 0` (no figure
    rather than the learner's 0.0)."""
    if trainer.config.agreement_prefixes <= 0:
        return {}
    t0 = time.perf_counter()
    agreement = round(float(trainer.dev_agreement()), 2)
    return {"agreement": agreement, "agreement_eval_s": round(time.perf_counter() - t0, 1)}


def timed_cycle(trainer: Trainer, i: int, rng_key: str) -> tuple[dict[str, Any], float, float]:
    """One cycle from an RNG seeded with `rng_key`; its metrics, its train seconds and the seconds of the
    agreement measurement inside it (not training)."""
    trainer.rng = random.Random(rng_key)
    t0 = time.perf_counter()
    metrics = trainer.iteration(i)
    took = time.perf_counter() - t0
    # what `iteration` does after the algorithm's step is the agreement measurement (promotion is off)
    train_s = float(metrics.get(ITERATION_TIME_KEY, took))
    return metrics, train_s, took - train_s


# --- the phases -----------------------------------------------------------------------------------------


def measure_base(args: argparse.Namespace, results: Path, model_dir: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """base.json: the base model's figures (a fresh LoRA adapter is the identity); reused when comparable."""
    path = results / "base.json"
    found = read_json(path)
    if found is not None and stale(found, settings) is None:
        progress(f"base: reusing {path}")
        return found
    home = use_home(results / "homes" / "base", model_dir)
    if found is not None and stale(found, settings) == "agreement":
        trainer = load_trainer(home, make_config("sft", args), model_dir, None, "base")
        progress("base: agreement settings changed, measuring its agreement again")
        found.update({"settings": eval_settings(settings), **measure_agreement(trainer)})
        release(trainer)
        write_json(path, found)
        return found
    trainer = load_trainer(home, make_config("sft", args), model_dir, None, "base")
    progress("base: dev evaluation and agreement of the base model")
    base = {"settings": eval_settings(settings), **measure_dev(trainer, args), **stamp(args)}
    release(trainer)
    write_json(path, base)
    progress(f"base: {headline_figure(args, base)}, agreement {base.get('agreement')} % (eval {base['eval_s']} s)")
    return base


def warm_start(args: argparse.Namespace, results: Path, model_dir: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """warm_start/ and warm_start.json: SFT for `warm_start_s` train seconds from a fresh adapter, then its
    dev figures. An adapter already there is reused (its dev figures measured again if the evaluation
    settings changed)."""
    adapter = results / "warm_start"
    path = results / "warm_start.json"
    found = read_json(path)
    config = make_config("sft", args)
    if found is not None and (adapter / "adapter_config.json").exists():
        if found["train_settings"]["warm_start_s"] != args.warm_start_s:
            progress(
                f"warm start: reusing {adapter} ({found['train_s']:.0f} s of SFT; asked {args.warm_start_s:g} s): "
                "delete it to train another"
            )
        what = stale(found, settings)
        if what is None:
            progress(f"warm start: reusing {adapter} and its figures")
            return found
        home = use_home(results / "homes" / "warm_start_eval", model_dir)
        trainer = load_trainer(home, config, model_dir, adapter, "warm start")
        progress(f"warm start: evaluation settings changed, measuring its {what} figures again")
        figures = measure_agreement(trainer) if what == "agreement" else measure_dev(trainer, args)
        found.update({"settings": eval_settings(settings), **figures})
        release(trainer)
        write_json(path, found)
        return found

    shutil.rmtree(results / "homes" / "warm_start", ignore_errors=True)
    home = use_home(results / "homes" / "warm_start", model_dir)
    trainer = load_trainer(home, config, model_dir, None, "warm start")
    train_s, cycles, losses = 0.0, 0, []
    while train_s < args.warm_start_s:
        # a key of its own: cycle i of the arms draws other instances than the warm start's cycle i
        metrics, took, _ = timed_cycle(trainer, cycles, f"{args.seed}:warm:{cycles}")
        train_s += took
        cycles += 1
        if "loss/sft" in metrics:
            losses.append(float(metrics["loss/sft"]))
        progress(
            f"warm start cycle {cycles - 1}: loss {metrics.get('loss/sft')}, {train_s:.0f}/{args.warm_start_s:g} s"
        )
    trainer.model.save_pretrained(adapter)
    progress(f"warm start: saved {adapter}; dev evaluation")
    start = {
        "settings": eval_settings(settings),
        "train_settings": {**settings, "warm_start_s": args.warm_start_s},
        "train_s": round(train_s, 1),
        "cycles": cycles,
        "loss_sft": [round(losses[0], 4), round(losses[-1], 4)] if losses else None,  # first and last cycle
        "adapter": str(adapter),
        "lr": config.phase_lr("sft"),
        "config": config.to_dict(),
        **measure_dev(trainer, args),
        **stamp(args),
    }
    release(trainer)
    write_json(path, start)
    progress(
        f"warm start: {headline_figure(args, start)}, agreement {start.get('agreement')} % (eval {start['eval_s']} s)"
    )
    return start


def start_point(start: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """An arm's first point: the warm start adapter it loads, measured once for all arms."""
    keep = (*args.curve.figure_keys, "agreement")
    return {"cycle": None, "train_s": 0.0, **{k: start.get(k) for k in keep}, "eval_s": 0.0}


def headline_figure(args: argparse.Namespace, point: dict[str, Any]) -> str:
    """The curve's first figure of a point, for progress lines: 'dev_tgc 2.0'."""
    key = args.curve.figure_keys[0]
    return f"{key} {point.get(key)}"


def cycle_point(i: int, train_s: float, took: float, agreement_s: float, metrics: dict[str, Any]) -> dict[str, Any]:
    point: dict[str, Any] = {
        "cycle": i,
        "algo": metrics.get("algo"),
        "train_s": round(train_s, 1),
        "cycle_s": round(took, 1),
        "agreement_eval_s": round(agreement_s, 1),
        "agreement": round(float(metrics["agreement/dev"]), 2) if "agreement/dev" in metrics else None,
        "perf": {k.removeprefix("perf/"): round(float(v), 2) for k, v in metrics.items() if k.startswith("perf/")},
    }
    for key, name in METRICS.items():
        if key in metrics:
            point[name] = round(float(metrics[key]), 4)
    return point


def train_arm(
    arm: str,
    args: argparse.Namespace,
    results: Path,
    model_dir: Path,
    settings: dict[str, Any],
    start: dict[str, Any],
    extend: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One arm from the warm-start adapter for the budget; DIR/<arm>.json rewritten after every cycle. With
    `extend` (the arm's file from an earlier sitting, trained for a smaller budget) the arm goes on from its
    saved adapter and optimizer state with its cycles kept, up to the new budget (an adapter saved without its
    optimizer state goes on with a fresh optimizer); the file records each extension under "extended"."""
    config = make_config(arm, args)  # SFT alone: the warm start's config, continued
    if extend is None:
        shutil.rmtree(results / "homes" / arm, ignore_errors=True)  # a rerun starts from an empty database
    home = use_home(results / "homes" / arm, model_dir)
    init_from = arm_adapter(results, arm) if extend is not None else results / "warm_start"
    trainer = load_trainer(home, config, model_dir, init_from, arm)
    record: dict[str, Any] = {
        "arm": arm,
        "label": LABELS[arm],
        "settings": settings,
        "dev_every": args.dev_every,
        "lr": config.phase_lr(config.algo),
        "config": config.to_dict(),
        "finished": False,
        "points": [start_point(start, args)],
        **stamp(args),
    }
    first, train_s, eval_s, agreement_s = 0, 0.0, 0.0, 0.0
    if extend is not None:
        first, train_s, eval_s = int(extend["cycles"]), float(extend["train_s"]), float(extend.get("eval_s", 0.0))
        resumed = resume_optimizer(trainer, arm_adapter(results, arm))
        here = {"at_cycle": first, "at_train_s": train_s, "optimizer": resumed, **stamp(args)}
        history = [*extend.get("extended", []), here]
        record.update(points=extend["points"], extended=history, at=extend["at"], command=extend["command"])
    path = arm_path(results, arm)
    for i in range(first, args.max_cycles):
        if train_s >= args.budget_s:
            break
        metrics, took, in_cycle = timed_cycle(trainer, i, f"{args.seed}:{i}")
        train_s += took
        agreement_s += in_cycle
        point = cycle_point(i, train_s, took, in_cycle, metrics)
        if args.dev_every and (i + 1) % args.dev_every == 0:
            point.update(measure_dev(trainer, args, agreement=point["agreement"] is None))
            eval_s += point["eval_s"]
        record["points"].append(point)
        record.update(train_s=round(train_s, 1), eval_s=round(eval_s + agreement_s, 1), cycles=i + 1)
        write_json(path, record)
        progress(
            f"{arm} cycle {i}: {took:.1f} s, train {train_s:.0f}/{args.budget_s:g} s, agreement "
            f"{point['agreement']} %" + (f", {headline_figure(args, point)}" if "eval_s" in point else "")
        )
    save_arm(trainer, arm_adapter(results, arm))  # what the end's dev evaluation measures
    record.update(trained=True, train_s=round(train_s, 1), eval_s=round(eval_s + agreement_s, 1))
    write_json(path, record)
    if args.defer_eval:
        release(trainer)
        progress(f"{arm}: trained, adapter saved to {arm_adapter(results, arm)}; its dev evaluation is deferred")
        return record
    return evaluate_arm(arm, record, trainer, results, args)


def extendable(done: dict[str, Any], settings: dict[str, Any], arm: str, args: argparse.Namespace) -> bool:
    """`--extend`: an arm file trained with these settings but for a smaller budget (or fewer cycles) goes on."""
    grown = ("budget_s", "max_cycles")
    same = {k: v for k, v in arm_settings(done["settings"], arm).items() if k not in grown} == {
        k: v for k, v in arm_settings(settings, arm).items() if k not in grown
    }
    return same and float(done["train_s"]) < args.budget_s and int(done["cycles"]) < args.max_cycles


def arm_adapter(results: Path, arm: str) -> Path:
    return results / "adapters" / arm


def save_arm(trainer: Trainer, adapter: Path) -> None:
    """The adapter and AdamW's state (for an --extend) together, replacing the last ones in one rename."""

    def write(tmp: Path) -> None:
        trainer.model.save_pretrained(tmp)
        torch.save(trainer.optimizer.state_dict(), tmp / OPTIMIZER_FILE)

    write_atomically(adapter, write)


def resume_optimizer(trainer: Trainer, adapter: Path) -> str:
    """AdamW's moments as the arm's last sitting left them, if it saved them: "resumed", else "fresh"."""
    path = adapter / OPTIMIZER_FILE
    if not path.exists():
        progress(f"{adapter}: no {OPTIMIZER_FILE}, the extension starts with a fresh optimizer")
        return "fresh"
    trainer.optimizer.load_state_dict(torch.load(path, weights_only=True))
    return "resumed"


def evaluate_arm(
    arm: str, record: dict[str, Any], trainer: Trainer, results: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The end of an arm: dev evaluation of the trained weights (unless its last cycle measured it), then the
    file marked finished."""
    last = record["points"][-1]
    eval_s = float(record.get("eval_s", 0.0))
    if args.curve.figure_keys[0] not in last or last["cycle"] is None:  # measured unless the last cycle was
        progress(f"{arm}: budget spent, dev evaluation at the end")
        final = measure_dev(trainer, args, agreement=last.get("agreement") is None)
        if last["cycle"] is None:  # no cycle ran (a budget of 0): the end is the start
            final = {k: v for k, v in final.items() if k != "agreement"}
        last.update(final)
        eval_s += final["eval_s"]
    release(trainer)
    record.update(
        finished=True,
        eval_s=round(eval_s, 1),
        cycles=len(record["points"]) - 1,
        load_avg_1min_end=round(os.getloadavg()[0], 2),
        final={k: last.get(k) for k in (*args.curve.figure_keys, "agreement")},
    )
    write_json(arm_path(results, arm), record)
    progress(f"{arm}: done, final {headline_figure(args, last)}, agreement {last.get('agreement')} %")
    return record


def evaluate_deferred(
    arm: str, args: argparse.Namespace, record: dict[str, Any], results: Path, model_dir: Path
) -> dict[str, Any]:
    """A sitting of its own for the end of an arm trained with --defer-eval: its saved adapter, measured."""
    home = use_home(results / "homes" / arm, model_dir)
    config = make_config(arm, args)  # the arm's (its file's settings are these)
    trainer = load_trainer(home, config, model_dir, arm_adapter(results, arm), f"{arm} (end)")
    return evaluate_arm(arm, record, trainer, results, args)


# --- merging ---------------------------------------------------------------------------------------------


def load_arms(results: Path) -> dict[str, dict[str, Any]]:
    """Every arm file in DIR, in ARMS order."""
    return {arm: data for arm in ARMS if (data := read_json(arm_path(results, arm))) is not None}


def final(run: dict[str, Any], key: str) -> Any:
    """The arm's last measured value of `key` after its start (a run killed midway, or one whose evaluation is
    deferred: its last cycle that has it; None when none has: the warm start's figure is not the arm's)."""
    points = run["points"][1:] or (run["points"] if run["finished"] else [])  # a budget of 0: the end is the start
    return next((p[key] for p in reversed(points) if p.get(key) is not None), None)


def mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def arm_summary(run: dict[str, Any]) -> dict[str, Any]:
    cycles = run["points"][1:]
    return {
        "finished": run["finished"],
        "cycles": len(cycles),
        "train_s": run.get("train_s", 0.0),
        "eval_s": run.get("eval_s", 0.0),
        "start_agreement": run["points"][0].get("agreement"),
        "final_agreement": final(run, "agreement"),
        "best_agreement": max((p["agreement"] for p in run["points"] if p.get("agreement") is not None), default=None),
        "final_dev_tgc": final(run, "dev_tgc"),
        "final_dev_sgc": final(run, "dev_sgc"),
        "mean_reward": mean([p["reward_mean"] for p in cycles if "reward_mean" in p]),
        "mean_step_reward": mean([p["step_reward_mean"] for p in cycles if "step_reward_mean" in p]),
    }


def headline(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """best arm by final dev TGC (then SGC, then agreement); the agreement gain of the best step-reward arm
    over SFT alone, in points."""
    finals = {a: arm_summary(r) for a, r in arms.items()}
    measured = {a: s for a, s in finals.items() if s["final_dev_tgc"] is not None}
    best = max(
        measured,
        key=lambda a: (measured[a]["final_dev_tgc"], measured[a]["final_dev_sgc"], measured[a]["final_agreement"] or 0),
        default=None,
    )
    step = {
        a: s["final_agreement"] for a, s in finals.items() if a in STEP_REWARD_ARMS and s["final_agreement"] is not None
    }
    best_step = max(step, key=lambda a: step[a], default=None)
    sft = finals.get("sft", {}).get("final_agreement")
    gain = round(step[best_step] - sft, 2) if best_step is not None and sft is not None else None
    return {
        "sft_dev_tgc": finals.get("sft", {}).get("final_dev_tgc"),
        "best_arm": best,
        "best_dev_tgc": measured[best]["final_dev_tgc"] if best is not None else None,
        "best_step_reward_arm": best_step,
        "agreement_gain": gain,
        "arms": finals,
    }


def arm_lr(run: dict[str, Any]) -> str:
    """The learning rate an arm's file records, and its SFT cycles' where its cycles alternate with SFT's."""
    phases = {p.partition(":")[0] for p in run.get("config", {}).get("phases", [])}
    if "sft" in phases and len(phases) > 1:
        return f"{run['lr']:g}, SFT cycles {run['config']['sft_lr']:g}"
    return f"{run['lr']:g}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def fmt(value: Any, spec: str = ".1f") -> str:
    return "" if value is None else format(value, spec)


def summary_table(arms: dict[str, dict[str, Any]], base: dict[str, Any] | None, start: dict[str, Any] | None) -> str:
    rows = [
        "| arm | cycles | train s | agreement % (start → final, best) | dev TGC | dev SGC | mean train reward "
        "| mean step reward | eval s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if base is not None:
        rows.append(
            f"| base model (no adapter) | | | {fmt(base.get('agreement'))} | {fmt(base['dev_tgc'])} "
            f"| {fmt(base['dev_sgc'])} | | | {fmt(base['eval_s'], '.0f')} |"
        )
    if start is not None:
        rows.append(
            f"| warm start (SFT, every arm's start) | {start['cycles']} | {start['train_s']:.0f} "
            f"| {fmt(start.get('agreement'))} | {fmt(start['dev_tgc'])} | {fmt(start['dev_sgc'])} | | "
            f"| {fmt(start['eval_s'], '.0f')} |"
        )
    for arm, run in arms.items():
        s = arm_summary(run)
        state = (
            "" if run["finished"] else " (trained; dev evaluation deferred)" if run.get("trained") else " (unfinished)"
        )
        agreement = f"{fmt(s['start_agreement'])} → {fmt(s['final_agreement'])} ({fmt(s['best_agreement'])})"
        rows.append(
            f"| {LABELS[arm]}{state} | {s['cycles']} | {s['train_s']:.0f} | {agreement} | {fmt(s['final_dev_tgc'])} "
            f"| {fmt(s['final_dev_sgc'])} | {fmt(s['mean_reward'], '.3f')} | {fmt(s['mean_step_reward'], '.3f')} "
            f"| {fmt(s['eval_s'], '.0f')} |"
        )
    return "\n".join(rows)


BEHAVIOUR = (
    ("api_docs_calls_per_episode", "doc look-ups / episode"),
    ("failed_calls_per_episode", "failed calls / episode"),
    ("give_up_after_failure_rate", "give up after failure"),
    ("multi_action_turn_rate", "multi-action turns"),
    ("confabulation_turn_rate", "confabulation turns"),
)


def behaviour_table(arms: dict[str, dict[str, Any]], base: dict[str, Any] | None, start: dict[str, Any] | None) -> str:
    rows = ["| on dev | " + " | ".join(label for _, label in BEHAVIOUR) + " |", "|---" * (len(BEHAVIOUR) + 1) + "|"]
    named = [("base model", base), ("warm start", start)] + [
        (LABELS[a], {"behaviour": final(r, "behaviour")}) for a, r in arms.items()
    ]
    for name, figures in named:
        b = (figures or {}).get("behaviour")
        if b:
            rows.append(f"| {name} | " + " | ".join(fmt(b.get(k), ".3f") for k, _ in BEHAVIOUR) + " |")
    return "\n".join(rows)


def curves_table(arms: dict[str, dict[str, Any]]) -> str:
    """Agreement per cycle, one row per arm: the curve the PNG draws, in numbers."""
    longest = max((len(r["points"]) for r in arms.values()), default=1)
    heads = ["start", *[str(i) for i in range(longest - 1)]]
    rows = ["| agreement % by cycle | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for arm, run in arms.items():
        values = [fmt(p.get("agreement")) for p in run["points"]] + [""] * (longest - len(run["points"]))
        rows.append(f"| {LABELS[arm]} | " + " | ".join(values) + " |")
    return "\n".join(rows)


def plot(arms: dict[str, dict[str, Any]], base: dict[str, Any] | None, path: Path) -> str | None:
    """Agreement (every cycle) and dev TGC (where measured) vs train seconds; None, or why no PNG."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no PNG"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (arm, run), marker in zip(arms.items(), "os^Dv", strict=False):
        for ax, key in ((left, "agreement"), (right, "dev_tgc")):
            pts = [(p["train_s"], p[key]) for p in run["points"] if p.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=marker, label=LABELS[arm])
    for ax, key in ((left, "agreement"), (right, "dev_tgc")):
        if base is not None and base.get(key) is not None:
            ax.axhline(base[key], color="grey", linestyle="--", linewidth=1, label="base model")
        ax.set_xlabel("training wall time after the warm start, s")
        ax.grid(alpha=0.3)
        top = max([ax.get_ylim()[1], 10.0])
        ax.set_ylim(0, min(100.0, top * 1.05))
    left.set_ylabel("dev expert-action agreement, %")
    left.set_title("Greedy action = expert's, at dev oracle prefixes")
    right.set_ylabel("dev TGC, % (greedy)")
    right.set_title("Dev TGC at the start, where measured, and at the end")
    left.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def finding(arms: dict[str, dict[str, Any]], start: dict[str, Any] | None, result: dict[str, Any]) -> str:
    """What the figures say, sized against one dev task's worth of TGC."""
    if not arms:
        return "No arm has run yet."
    dev_tasks = (start or {}).get("dev_tasks") or 0
    step = 100.0 / dev_tasks if dev_tasks else float("nan")
    parts = []
    if result["agreement_gain"] is not None:
        best_step = result["best_step_reward_arm"]
        parts.append(
            f"Expert-action agreement at the end: the best step-reward arm, {LABELS[best_step]}, "
            f"{fmt(result['arms'][best_step]['final_agreement'])} % vs SFT alone's "
            f"{fmt(result['arms']['sft']['final_agreement'])} % ({result['agreement_gain']:+.1f} points)."
        )
    if all(s["final_dev_tgc"] is None for s in result["arms"].values()):
        parts.append("No arm's final dev TGC is measured yet (each arm's dev evaluation is deferred).")
        return " ".join(parts)
    measured = {a: s for a, s in result["arms"].items() if s["final_dev_tgc"] is not None}
    finals = "; ".join(f"{LABELS[a]} {fmt(s['final_dev_tgc'])}" for a, s in measured.items())
    deferred = [LABELS[a] for a in result["arms"] if a not in measured]
    if deferred:
        finals += f"; not measured yet (deferred): {', '.join(deferred)}"
    tied = [a for a, s in measured.items() if s["final_dev_tgc"] == result["best_dev_tgc"]]
    best = (
        f"all measured arms tie at {fmt(result['best_dev_tgc'])}"
        if len(tied) == len(measured) > 1
        else f"best {LABELS[result['best_arm']]}"
        if result["best_arm"]
        else "no arm measured"
    )
    parts.append(
        f"Final dev TGC: {finals} ({best}); with {plural(dev_tasks, 'dev task')} one task is {step:.1f} points, so a "
        "difference of a task or two is within the noise of one greedy evaluation."
    )
    return " ".join(parts)


def docs_section(
    result: dict[str, Any], arms: dict[str, Any], base: Any, start: Any, plot_path: Path, note: str | None
) -> str:
    files = [*(x for x in (base, start) if x), *arms.values()]  # in the order the phases ran
    runs = [r["command"] for r in files] + [e["command"] for r in arms.values() for e in r.get("extended", [])]
    commands = list(dict.fromkeys(runs))
    machines = list(dict.fromkeys(r["machine"] for r in files))
    s = result["settings"]
    budgets = ", ".join(f"{LABELS[a]} {r['settings']['budget_s']:g} s (lr {arm_lr(r)})" for a, r in arms.items())
    budgets = budgets or f"{s['budget_s']:g} s each (no arm has run yet)"
    dev_every = {r.get("dev_every", 0) for r in arms.values()}
    when = (
        "at each arm's start and at its end only"
        if dev_every <= {0}
        else f"at each arm's start, every {'/'.join(str(d) for d in sorted(dev_every))} cycles and at the end"
    )
    mixed = [a for a, r in arms.items() if arm_settings(r["settings"], a) != arm_settings(s, a)]
    image = os.path.relpath(plot_path, DEFAULT_PLOT.parent)
    figure = f"![agreement and dev TGC vs training seconds]({image})" if note is None else f"(No figure: {note}.)"
    start_line = (
        f"Warm start: {start['train_s']:.0f} s of SFT ({start['cycles']} cycles, lr {start['lr']:g}) from a "
        "fresh adapter, saved once; every arm loads it with a fresh optimizer."
        if start
        else "No warm start recorded."
    )
    dev = "all 51 dev tasks" if s["dev_limit"] is None else f"the first {plural(s['dev_limit'], 'dev task')}"
    setup = "\n".join(
        [
            f"- Budget per arm, after the shared warm start: {budgets} of training wall time (the learner's "
            "`iteration`, less its agreement measurement); the cycle that crosses it runs to its end.",
            f"- Per cycle: {s['experts_per_iteration']} procedural experts; SFT {s['sft_steps']} steps x "
            f"{s['sft_batch_size']} experts; inspection of {s['inspect_prefixes']} expert prefixes x M = "
            f"{s['inspect_samples']} samples; RL {s['tasks_per_iteration']} procedural train tasks x K = "
            f"{s['rollouts_per_task']} rollouts of {s['max_turns']} turns x {s['max_new_tokens']} tokens; seed "
            f"{s['seed']}; the learner's per-algorithm defaults otherwise (each arm's config is in the JSON below).",
            f"- Dev: {dev}, greedy, {s['dev_max_turns']} turns, {when}; agreement on "
            f"{s['agreement_prefixes']} dev oracle prefixes at the start and after every cycle that updated the "
            "weights. Evaluation is not counted in the budget (the table's last column).",
        ]
    )
    return f"""
## StepAgent vs SFT vs LOOP: expert-action agreement and dev TGC (`bench/stepagent_curve.py`)

{chr(10).join(f"`{c}`" + "  " for c in commands)}

On {"; ".join(machines)}; model `{s["model"]}`.

{setup}
{"- Arms run with other settings than the first: " + ", ".join(LABELS[a] for a in mixed) if mixed else ""}

{start_line}

{summary_table(arms, base, start)}

{figure}

{curves_table(arms)}

Behaviour on dev at the end (LOOP paper's metrics; `agentloop/agent/behaviour.py`):

{behaviour_table(arms, base, start)}

{finding(arms, start, result)}

<details><summary>Merged results (JSON)</summary>

```json
{json.dumps({"base": base, "warm_start": start, "arms": arms}, indent=1, sort_keys=True)}
```

</details>
"""


def merged_result(
    arms: dict[str, dict[str, Any]], base: dict[str, Any] | None, start: dict[str, Any] | None, settings: dict[str, Any]
) -> dict[str, Any]:
    return {
        "settings": settings,
        "base_dev_tgc": base["dev_tgc"] if base else None,
        "base_dev_sgc": base["dev_sgc"] if base else None,
        "base_agreement": base.get("agreement") if base else None,
        "warm_start_dev_tgc": start["dev_tgc"] if start else None,
        "warm_start_agreement": start.get("agreement") if start else None,
        "warm_start_train_s": start["train_s"] if start else None,
        **headline(arms),
    }


# --- main -----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None, curve: Curve | None = None, doc: str | None = None) -> argparse.Namespace:
    """The flags of every curve bench; `curve` (default CURVE) gives the arms, the presets and the world."""
    curve = curve or CURVE
    arms, presets = curve.arms, curve.presets
    ap = argparse.ArgumentParser(description=doc or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: one tiny cycle per arm, 1 dev task of 2 turns")
    ap.add_argument("--model", default=None, help="model name or directory (default: AGENTLOOP_MODEL)")
    ap.add_argument(
        "--results",
        type=Path,
        default=None,
        help=f"where the phases' files are kept (default: $AGENTLOOP_HOME/bench/{curve.name})",
    )
    ap.add_argument("--arms", default=",".join(arms), help=f"comma-separated subset of {','.join(arms)}")
    ap.add_argument("--merge", action="store_true", help="train nothing: table and PNG from the files in DIR")
    ap.add_argument("--start-only", action="store_true", help="measure the base model, train the warm start, no arm")
    ap.add_argument(
        "--skip-base", action="store_true", help="leave the base model's figures to another sitting (base.json)"
    )
    ap.add_argument("--rerun", action="store_true", help="run the arms again even where DIR has them finished")
    ap.add_argument(
        "--defer-eval",
        action="store_true",
        help="train the arms and save their adapters; their end-of-arm dev evaluation runs in a later sitting "
        "(the same command without this flag)",
    )
    ap.add_argument(
        "--extend",
        action="store_true",
        help="an arm trained in an earlier sitting for a smaller --budget-s goes on from its saved adapter",
    )
    ap.add_argument("--budget-s", type=float, default=None, help="training seconds per arm (default 2400)")
    ap.add_argument("--max-cycles", type=int, default=None, help="cycle cap per arm")
    ap.add_argument("--warm-start-s", type=float, default=None, help="training seconds of the shared SFT warm start")
    ap.add_argument("--dev-every", type=int, default=None, help="dev TGC every N cycles too (default 0: start, end)")
    ap.add_argument("--dev-limit", type=int, default=None, help="the first N dev tasks (default: all)")
    if "per_type" in presets:
        ap.add_argument("--per-type", type=int, default=None, help="variations of each task type per evaluated set")
    ap.add_argument("--dev-max-turns", type=int, default=None, help="turn limit on dev (default 16)")
    ap.add_argument("--agreement-prefixes", type=int, default=None, help="dev oracle prefixes for agreement")
    ap.add_argument("--tasks-per-iteration", type=int, default=None, help="RL: N procedural train tasks per cycle")
    ap.add_argument("--rollouts-per-task", type=int, default=None, help="RL: K rollouts per task")
    ap.add_argument("--max-turns", type=int, default=None, help="RL: turn limit of a rollout")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per turn")
    ap.add_argument("--experts-per-iteration", type=int, default=None, help="procedural experts per cycle")
    ap.add_argument("--sft-steps", type=int, default=None, help="SFT: optimizer steps per cycle")
    ap.add_argument("--sft-batch-size", type=int, default=None, help="SFT: experts per step")
    ap.add_argument("--inspect-prefixes", type=int, default=None, help="StepAgent: expert prefixes per cycle")
    ap.add_argument("--inspect-samples", type=int, default=None, help="StepAgent: M samples per prefix")
    ap.add_argument("--epochs", type=int, default=None, help="passes of an RL or DPO update (default: learner's)")
    ap.add_argument("--lora-layers", type=int, default=None, help="LoRA on the upper N layers (default 10; 0: all)")
    ap.add_argument("--micro-tokens", type=int, default=None, help="tokens per micro-batch (default 8192)")
    ap.add_argument(
        "--no-prompt-gradients",
        dest="prompt_gradients",
        action="store_false",
        help="SFT steps run the prompt without gradients (prompt_gradients; bench/sft_step.py measures the speed)",
    )
    ap.add_argument("--sft-lr", type=float, default=None, help="learning rate of SFT: warm start, SFT alone")
    ap.add_argument("--stepagent-lr", type=float, default=None, help="learning rate of the StepAgent arms")
    ap.add_argument("--lr", type=float, default=None, help="learning rate of LOOP and LOOP+step")
    ap.add_argument("--dpo-beta", type=float, default=None, help="stepagent-implicit: beta (default: preset)")
    ap.add_argument("--dpo-anchor", type=float, default=None, help="stepagent-implicit: SFT anchor weight")
    ap.add_argument(
        "--dpo-reference",
        choices=("base", "cycle"),
        default=None,
        help="stepagent-implicit: DPO's reference, the adapter disabled (base, the default) or the cycle's sampler",
    )
    ap.add_argument("--irl-anchor", type=float, default=None, help="stepagent-irl: SFT anchor weight")
    ap.add_argument("--step-omega", type=float, default=None, help="loop+step: omega (default: preset)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--prompt-example",
        choices=("fixed", "nearest"),
        default="fixed",
        help="the worked example every episode shows: the world's fixed one, or the nearest solved train task of "
        "another scenario (AGENTLOOP_PROMPT_EXAMPLE; agent/examples.py)",
    )
    ap.add_argument(
        "--plot",
        type=Path,
        default=None,
        help=f"PNG to write (default: docs/{curve.name}.png with --write-docs, else {curve.name}.png in DIR)",
    )
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    ap.add_argument("--write-docs", action="store_true", help=f"update docs/benchmarks.md's {curve.name} section")
    if curve.extra_args is not None:
        curve.extra_args(ap)
    args = ap.parse_args(argv)
    args.curve = curve
    for name, (full, quick) in presets.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.arm_list = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in args.arm_list if a not in arms]
    if unknown or not args.arm_list:
        ap.error(f"--arms takes a comma-separated subset of {', '.join(arms)}; got {args.arms!r}")
    try:
        for arm in arms:  # a bad combination fails here, before any model is loaded
            make_config(arm, args)
    except ValueError as exc:
        ap.error(str(exc))
    return args


def run_phases(args: argparse.Namespace, results: Path, model_dir: Path, settings: dict[str, Any]) -> None:
    """The base model's figures (unless --skip-base), the warm start, then each arm asked for: trained, or
    skipped, continued or evaluated as its file in DIR says."""
    progress(f"model {model_dir}; results {results}; arms {', '.join(args.arm_list)}; {args.budget_s:g} s each")
    if not args.skip_base:
        measure_base(args, results, model_dir, settings)
    start = warm_start(args, results, model_dir, settings)
    for arm in [] if args.start_only else args.arm_list:
        done = read_json(arm_path(results, arm))
        same = done is not None and arm_settings(done["settings"], arm) == arm_settings(settings, arm)
        if done is not None and done["finished"] and same and not args.rerun:
            progress(f"{arm}: finished in {arm_path(results, arm)} with these settings; skipped (--rerun)")
            continue
        saved = (arm_adapter(results, arm) / "adapter_config.json").exists()
        if done is not None and done.get("trained") and saved and not args.rerun:
            if args.extend and extendable(done, settings, arm, args):
                progress(f"{arm}: going on from {arm_adapter(results, arm)} ({done['train_s']:.0f} s trained)")
                train_arm(arm, args, results, model_dir, settings, start, extend=done)
                continue
            if same and args.defer_eval:
                progress(f"{arm}: trained, its dev evaluation still deferred; skipped")
                continue
            if same:
                progress(f"{arm}: trained in an earlier sitting; the dev evaluation at its end")
                evaluate_deferred(arm, args, done, results, model_dir)
                continue
        progress(f"{arm}: training from the warm start")
        train_arm(arm, args, results, model_dir, settings, start)


def main() -> None:
    args = parse_args()
    os.environ["AGENTLOOP_PROMPT_EXAMPLE"] = args.prompt_example  # every episode of this process: trained and measured
    get_settings.cache_clear()
    settings_now = get_settings()
    results = (args.results or settings_now.home / "bench" / "stepagent_curve").resolve()
    results.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model_dir(args.model or settings_now.model, settings_now.models_dir)
    settings = bench_settings(args, model_dir.name)
    if args.plot is None:  # only a run that writes the docs replaces their figure
        args.plot = DEFAULT_PLOT if args.write_docs else results / "stepagent_curve.png"
    if not args.merge:
        run_phases(args, results, model_dir, settings)

    base, start_found = read_json(results / "base.json"), read_json(results / "warm_start.json")
    arms = load_arms(results)
    # what the table describes: the arms' own settings (a --merge's flags are not what they ran with)
    described = next((r["settings"] for r in arms.values()), settings)
    result = merged_result(arms, base, start_found, described)
    note = plot(arms, base, args.plot) if arms else "no arm files"
    progress(note or f"plot written to {args.plot}")
    if not args.json:
        print(summary_table(arms, base, start_found))
        print(finding(arms, start_found, result))
    if args.write_docs:
        write_section(SECTION, docs_section(result, arms, base, start_found, args.plot.resolve(), note))
        progress("docs/benchmarks.md: section stepagent_curve written")
    emit({"model": model_dir.name, "quick": args.quick, "results": str(results), "command": command(args), **result})


if __name__ == "__main__":
    main()
