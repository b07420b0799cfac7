"""Learning curves: LOOP, GRPO (std-normalised group advantages) and REINFORCE, each trained from the
same start for the same wall-clock budget on the built-in world's train split, with dev TGC after
every iteration.

    python bench/learning_curve.py [--quick] [--model DIR] [--budget-s S] [--max-iterations N]
        [--warm-start STEPS] [--plot PNG] [--json] [--write-docs]

Fairness: all algorithms start from one saved LoRA adapter (fresh, or after `--warm-start` supervised
steps on the train split's oracle episodes), use the same LoopConfig apart from the algorithm preset
(`LoopConfig.for_algo`), and see the same tasks: iteration i's task sample comes from an RNG seeded
with (seed, i). They run one after another in this process, each with its own SQLite database under
its own AGENTLOOP_HOME.

Budget: "train seconds" are the wall time of `Trainer.iteration` (rollouts, advantages, the update;
promotion is off). An algorithm starts another iteration while its train seconds are below
`--budget-s` and it has run fewer than `--max-iterations`; the iteration that crosses the budget runs
to the end and counts, so each algorithm gets at least the budget (the table shows the real totals).
Dev evaluation (greedy, first `--dev-limit` dev tasks) runs after each iteration and is timed apart;
after an iteration that kept no rollouts (all advantages ~0: no update) the previous figures carry over.

Output: the table (stdout), a PNG of dev TGC vs train seconds (`--plot`), with `--write-docs` a
section of docs/benchmarks.md; progress on stderr; last line a JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from agentloop.learner.config import LoopConfig
from agentloop.learner.model import lora_model
from agentloop.learner.rl import LoopTrainer
from agentloop.policy.models import resolve_model_dir
from agentloop.settings import Settings, get_settings

from report import emit, machine, write_section

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PLOT = ROOT / "docs" / "learning_curve.png"
LABELS = {"loop": "LOOP", "grpo": "GRPO (std-normalised)", "reinforce": "REINFORCE"}
ALGOS = tuple(LABELS)  # the trajectory-reward algorithms; bench/stepagent_curve.py has the expert ones

# (full run, --quick); None in a flag means "take the preset"
PRESETS: dict[str, tuple[Any, Any]] = {
    "budget_s": (720.0, 600.0),
    "max_iterations": (100, 2),
    "tasks_per_iteration": (2, 2),
    "rollouts_per_task": (4, 4),
    "max_turns": (6, 3),
    "max_new_tokens": (96, 64),
    "dev_limit": (10, 6),
    "dev_max_turns": (8, 3),
}

OPTIONS = ("lr", "seed", "warm_start", "warm_start_batch", "warm_start_lr")  # reported with the presets

SERIES = (
    "iteration",
    "train_s",
    "dev_tgc",
    "dev_sgc",
    "reward_mean",
    "success_rate",
    "kept",
    "rollouts",
    "iteration_s",
    "rollout_s",
    "update_s",
    "eval_s",
)

T0 = time.perf_counter()


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {message}", file=sys.stderr, flush=True)


# --- the environment of one run ---------------------------------------------------------------------


def use_home(home: Path, model_dir: Path) -> Settings:
    """Point the process's settings (and its one engine) at a fresh SQLite database under `home`."""
    from agentloop.store.db import reset_engines
    from agentloop.store.migrate import upgrade

    home.mkdir(parents=True, exist_ok=True)
    os.environ["AGENTLOOP_HOME"] = str(home)
    os.environ["AGENTLOOP_DATABASE_URL"] = f"sqlite:///{home / 'agentloop.db'}"
    os.environ["AGENTLOOP_MODEL"] = str(model_dir)  # resolved once: nothing is converted per run
    get_settings.cache_clear()
    reset_engines()
    settings = get_settings()
    upgrade(settings.db_url)
    return settings


def new_run(config: LoopConfig, trigger: str) -> str:
    from agentloop.store.db import session_scope
    from agentloop.store.models import TrainingRun

    with session_scope() as s:
        run = TrainingRun(algo=config.algo, status="running", trigger=trigger, config=config.to_dict(), progress={})
        s.add(run)
        s.flush()
        return str(run.id)


def trainer_for(
    settings: Settings, config: LoopConfig, model_dir: Path, init_from: Path | None, label: str
) -> LoopTrainer:
    """A Trainer over a freshly loaded base model with the LoRA adapter from `init_from` (or a new one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(config.seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = lora_model(base, config, str(init_from) if init_from is not None else None)

    def report(event: dict[str, Any]) -> None:
        if event.get("phase") == "rollouts" and 0 < event["rollouts_done"] < event["rollouts_total"]:
            return  # batched: the results of a batch arrive together
        shown = {k: v for k, v in event.items() if k not in ("phase", "metrics")}
        progress(f"{label} {event.get('phase')} " + " ".join(f"{k}={v}" for k, v in shown.items()))

    trainer = LoopTrainer(settings, config, new_run(config, "bench"), report=report, model=model, tokenizer=tokenizer)
    trainer.setup()
    return trainer


def make_config(algo: str, args: argparse.Namespace) -> LoopConfig:
    return LoopConfig.for_algo(
        algo,
        iterations=args.max_iterations,
        tasks_per_iteration=args.tasks_per_iteration,
        rollouts_per_task=args.rollouts_per_task,
        splits=("train",),
        world="builtin",
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        dev_limit=args.dev_limit,
        dev_max_turns=args.dev_max_turns,
        lr=args.lr,
        micro_batch_size=1,  # a rollout is ~2k tokens: activations of one at a time (~6 GB in fp32)
        promote=False,  # no gate, no adapter versions: dev TGC is measured here after every iteration
        seed=args.seed,
    )


def dev_point(trainer: LoopTrainer) -> dict[str, float]:
    t0 = time.perf_counter()
    summary = trainer.dev_summary()
    return {"dev_tgc": summary["tgc"], "dev_sgc": summary["sgc"], "eval_s": round(time.perf_counter() - t0, 1)}


# --- the phases ---------------------------------------------------------------------------------------


def prepare_start(args: argparse.Namespace, tmp: Path, model_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The adapter every algorithm starts from, saved to disk, and its dev figures (and the base model's)."""
    from agentloop.learner.experts import expert_rollouts
    from agentloop.learner.sft import supervised_steps

    load_at_start = round(os.getloadavg()[0], 2)
    settings = use_home(tmp / "start", model_dir)
    config = make_config("loop", args)
    trainer = trainer_for(settings, config, model_dir, None, "start")
    progress("start: dev evaluation of the base model (a fresh LoRA adapter is the identity)")
    base = dev_point(trainer)
    start: dict[str, Any] = {
        "base": base,
        "start": base,
        "warm_start_steps": args.warm_start,
        "load_avg": [load_at_start],  # the end's is appended when every run is done
    }
    if args.warm_start:
        t0 = time.perf_counter()
        # oracle episodes up to dev's turn limit: what the agent could use on dev, no longer (cost is per token)
        limits = dataclasses.replace(trainer.limits(dev=True), max_new_tokens=1500)
        demos = expert_rollouts(trainer.tokenizer, trainer.train_tasks, limits)
        progress(
            f"start: {args.warm_start} supervised steps of {args.warm_start_batch} on {len(demos)} oracle episodes "
            f"of the train split (up to {limits.max_turns} turns)"
        )
        losses = supervised_steps(
            trainer.model,
            demos,
            trainer.pad_id,
            args.warm_start,
            args.warm_start_lr,
            batch_size=args.warm_start_batch,
            seed=args.seed,
        )
        start["warm_start_s"] = round(time.perf_counter() - t0, 1)
        start["warm_start_loss"] = [round(x, 4) for x in (losses[0], losses[-1])]
        progress(f"start: warm start done, loss {losses[0]:.3f} -> {losses[-1]:.3f}; dev evaluation")
        start["start"] = dev_point(trainer)
    path = tmp / "start-adapter"
    trainer.model.save_pretrained(path)
    release(trainer)
    return path, start


def train_one(
    algo: str, args: argparse.Namespace, tmp: Path, model_dir: Path, start_adapter: Path, start: dict[str, Any]
) -> dict[str, Any]:
    settings = use_home(tmp / algo, model_dir)
    config = make_config(algo, args)
    trainer = trainer_for(settings, config, model_dir, start_adapter, algo)
    first = start["start"]
    points: list[dict[str, Any]] = [
        {"iteration": None, "train_s": 0.0, "dev_tgc": first["dev_tgc"], "dev_sgc": first["dev_sgc"]}
    ]
    train_s = 0.0
    for i in range(args.max_iterations):
        if train_s >= args.budget_s:
            break
        trainer.rng = random.Random(f"{args.seed}:{i}")  # the same task sample at iteration i for every algo
        t0 = time.perf_counter()
        metrics = trainer.iteration(i)
        took = time.perf_counter() - t0
        train_s += took
        if "update/steps" in metrics:
            dev = dev_point(trainer)
        else:  # nothing kept, no update: the weights, hence the greedy dev episodes, are the previous point's
            dev = {"dev_tgc": points[-1]["dev_tgc"], "dev_sgc": points[-1]["dev_sgc"], "eval_s": 0.0}
        point = {
            "iteration": i,
            "train_s": round(train_s, 1),
            "iteration_s": round(took, 1),
            "rollout_s": round(metrics["perf/rollout_s"], 1),
            "update_s": round(metrics.get("perf/update_s", 0.0), 1),
            "reward_mean": round(metrics["reward/mean"], 4),
            "success_rate": round(metrics["success/rate"], 4),
            "kept": round(metrics["rollouts"] * (1 - metrics["adv/filtered_frac"])),
            "rollouts": metrics["rollouts"],
            "approx_kl": round(metrics["loss/approx_kl"], 5),
            **dev,
        }
        points.append(point)
        progress(
            f"{algo} iteration {i} done: {took:.1f} s (rollouts {point['rollout_s']} s, update {point['update_s']} s), "
            f"train {train_s:.1f}/{args.budget_s:g} s, reward {point['reward_mean']}, kept {point['kept']}/"
            f"{point['rollouts']}, dev TGC {dev['dev_tgc']} (eval {dev['eval_s']} s)"
        )
    release(trainer)
    return {
        "points": points,
        "train_s": round(train_s, 1),
        "iterations": len(points) - 1,
        "final_dev_tgc": points[-1]["dev_tgc"],
        "final_dev_sgc": points[-1]["dev_sgc"],
        "eval_s": round(sum(p.get("eval_s", 0.0) for p in points[1:]), 1),
    }


def release(trainer: LoopTrainer) -> None:
    trainer.policy.clear_cache()
    del trainer.model, trainer.policy, trainer.module, trainer.optimizer
    gc.collect()


# --- output ---------------------------------------------------------------------------------------------


def table(runs: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| algorithm | iteration | train s (cumulative) | dev TGC | dev SGC | mean train reward | rollouts kept |",
        "|---|---|---|---|---|---|---|",
    ]
    for algo, run in runs.items():
        for p in run["points"]:
            it = "start" if p["iteration"] is None else str(p["iteration"])
            reward = "" if p["iteration"] is None else f"{p['reward_mean']:.3f}"
            kept = "" if p["iteration"] is None else f"{p['kept']}/{p['rollouts']}"
            rows.append(
                f"| {LABELS[algo]} | {it} | {p['train_s']:.1f} | {p['dev_tgc']:.1f} | {p['dev_sgc']:.1f} "
                f"| {reward} | {kept} |"
            )
    return "\n".join(rows)


def plot(runs: dict[str, dict[str, Any]], start: dict[str, Any], dev_tasks: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    top = start["base"]["dev_tgc"]
    for (algo, run), marker in zip(runs.items(), "os^", strict=False):
        xs = [p["train_s"] for p in run["points"]]
        ys = [p["dev_tgc"] for p in run["points"]]
        top = max(top, *ys)
        ax.plot(xs, ys, marker=marker, label=LABELS[algo])
    if start["warm_start_steps"]:
        ax.axhline(start["base"]["dev_tgc"], color="grey", linestyle="--", linewidth=1, label="base model")
    ax.set_xlabel("training wall time, s (rollouts + updates; dev evaluation not counted)")
    ax.set_ylabel(f"dev TGC, % ({dev_tasks} tasks, greedy)")
    ax.set_title("Dev TGC per iteration, same start and budget")
    ax.set_ylim(0, max(10.0, 1.15 * top))  # flat curves at 0 stay readable
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def finding(runs: dict[str, dict[str, Any]], start: dict[str, Any], dev_tasks: int) -> str:
    """One plain sentence (or two) about what the curves show, sized against one dev task's worth of TGC."""
    step = 100.0 / dev_tasks
    first = start["start"]["dev_tgc"]
    moved = {a: r for a, r in runs.items() if any(abs(p["dev_tgc"] - first) > 1e-9 for p in r["points"])}
    spent = ", ".join(
        f"{LABELS[a]} {plural(r['iterations'], 'iteration')} / {r['train_s']:.0f} s" for a, r in runs.items()
    )
    kept = "; ".join(
        f"{LABELS[a]} kept {sum(p['kept'] for p in r['points'][1:])} of {sum(p['rollouts'] for p in r['points'][1:])} "
        f"rollouts ({plural(sum(1 for p in r['points'][1:] if p['kept']), 'update')})"
        for a, r in runs.items()
    )
    if not moved:
        return (
            f"No measurable change within this budget: every algorithm stayed at the start's dev TGC of "
            f"{first:.1f} after its training ({spent}). With {dev_tasks} dev tasks one task is {step:.1f} points. "
            f"Rollouts with a non-zero advantage: {kept}."
        )
    finals = "; ".join(
        f"{LABELS[a]} {first:.1f} → {r['final_dev_tgc']:.1f} (best {max(p['dev_tgc'] for p in r['points']):.1f})"
        for a, r in runs.items()
    )
    return (
        f"Dev TGC from the same start ({spent}): {finals}. With {dev_tasks} dev tasks one task is {step:.1f} points, "
        f"so differences of a task or two are within the noise of this evaluation. Rollouts with a non-zero "
        f"advantage: {kept}."
    )


def command() -> str:
    """This run's command line, less the output-only flags."""
    return "python bench/learning_curve.py" + "".join(
        f" {shlex.quote(a)}" for a in sys.argv[1:] if a not in ("--write-docs", "--json")
    )


def docs_section(
    args: argparse.Namespace, runs: dict[str, Any], start: dict[str, Any], model: str, plot_path: Path
) -> str:
    cmd = command()
    starting = f"Base model dev TGC {start['base']['dev_tgc']:.1f} (SGC {start['base']['dev_sgc']:.1f})."
    if start["warm_start_steps"]:
        starting += (
            f" Warm start ({start['warm_start_steps']} supervised steps of {args.warm_start_batch} of the train "
            f"split's oracle episodes (up to {args.dev_max_turns} turns), "
            f"lr {args.warm_start_lr:g}, {start['warm_start_s']:.0f} s): dev TGC {start['start']['dev_tgc']:.1f} "
            f"(SGC {start['start']['dev_sgc']:.1f}); every algorithm starts there."
        )
    else:
        starting += " No warm start: every algorithm starts from the base model with a fresh LoRA adapter."
    image = os.path.relpath(plot_path, DEFAULT_PLOT.parent)
    load = " / ".join(f"{x:.1f}" for x in start["load_avg"]) + " (1 min, at start / at end)"
    setup = "\n".join(
        [
            f"- Per algorithm: {args.budget_s:g} s of training wall time (rollouts + updates), at most "
            f"{args.max_iterations} iterations; the iteration that crosses the budget runs to its end.",
            f"- Per iteration: {args.tasks_per_iteration} train tasks x K = {args.rollouts_per_task} rollouts at "
            f"temperature 1.0, {args.max_turns} turns x {args.max_new_tokens} new tokens; lr {args.lr:g}; "
            f"seed {args.seed}.",
            f"- Dev: the first {args.dev_limit} dev tasks, greedy, {args.dev_max_turns} turns. An iteration that "
            "kept no rollouts made no update: its dev figures are carried over, not re-measured.",
            "- All algorithms start from the same adapter and see the same task sample at each iteration. "
            "Wall times on a shared machine vary with its load.",
        ]
    )
    eval_s = ", ".join(f"{LABELS[a]} {r['eval_s']:.0f} s" for a, r in runs.items())
    return f"""
## Learning curves: LOOP vs GRPO vs REINFORCE (`bench/learning_curve.py`)

`{cmd}`

On {machine()}, load average {load}; model `{model}`. Dev evaluation time, not counted: {eval_s}.

{setup}

{starting}

{table(runs)}

![dev TGC vs training seconds]({image})

{finding(runs, start, args.dev_limit)}
"""


# --- main ---------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--quick", action="store_true", help="2 iterations of 2 tasks x K=4, 3 turns x 64 tokens, 6 dev tasks"
    )
    ap.add_argument("--model", default=None, help="model name or directory (default: AGENTLOOP_MODEL)")
    ap.add_argument("--algos", default=",".join(ALGOS), help="comma-separated, run in this order")
    ap.add_argument("--budget-s", type=float, default=None, help="training wall seconds per algorithm")
    ap.add_argument("--max-iterations", type=int, default=None, help="iteration cap per algorithm")
    ap.add_argument("--tasks-per-iteration", type=int, default=None, help="N train tasks per iteration")
    ap.add_argument("--rollouts-per-task", type=int, default=None, help="K rollouts per task")
    ap.add_argument("--max-turns", type=int, default=None, help="turn limit of a rollout")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per turn (rollouts and dev)")
    ap.add_argument("--dev-limit", type=int, default=None, help="evaluate on the first N dev tasks")
    ap.add_argument("--dev-max-turns", type=int, default=None, help="turn limit on dev")
    ap.add_argument("--lr", type=float, default=LoopConfig.lr, help="AdamW learning rate (LoopConfig's default)")
    ap.add_argument("--warm-start", type=int, default=0, help="supervised steps on oracle episodes first (0: none)")
    ap.add_argument("--warm-start-batch", type=int, default=4, help="oracle episodes per warm-start step")
    ap.add_argument("--warm-start-lr", type=float, default=1e-3, help="learning rate of the warm start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", type=Path, default=DEFAULT_PLOT, help=f"PNG to write (default {DEFAULT_PLOT})")
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    for name, (full, quick) in PRESETS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    algos = [a.strip() for a in args.algos.split(",") if a.strip()]
    unknown = [a for a in algos if a not in ALGOS]
    if unknown or not algos:
        ap.error(f"--algos takes a comma-separated subset of {', '.join(ALGOS)}; got {args.algos!r}")
    make_config("loop", args)  # a bad combination fails here, before any model is loaded

    settings = get_settings()
    model_dir = resolve_model_dir(args.model or settings.model, settings.models_dir)
    progress(f"model {model_dir}; algorithms {', '.join(algos)}; budget {args.budget_s:g} s each")
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="agentloop-curve-") as tmp:
        start_adapter, start = prepare_start(args, Path(tmp), model_dir)
        for algo in algos:
            progress(f"{algo}: training from the start adapter")
            runs[algo] = train_one(algo, args, Path(tmp), model_dir, start_adapter, start)

    start["load_avg"].append(round(os.getloadavg()[0], 2))
    plot(runs, start, args.dev_limit, args.plot)
    progress(f"plot written to {args.plot}")
    if not args.json:
        print(table(runs))
        print(finding(runs, start, args.dev_limit))
    if args.write_docs:
        write_section("learning_curve", docs_section(args, runs, start, model_dir.name, args.plot.resolve()))
    result = {
        "model": model_dir.name,
        "quick": args.quick,
        "config": {name: getattr(args, name) for name in [*PRESETS, *OPTIONS]},
        "command": command(),
        "base_dev_tgc": start["base"]["dev_tgc"],
        "base_dev_sgc": start["base"]["dev_sgc"],
        "start_dev_tgc": start["start"]["dev_tgc"],
        "start_dev_sgc": start["start"]["dev_sgc"],
        "warm_start_s": start.get("warm_start_s"),
        "warm_start_loss": start.get("warm_start_loss"),  # first and last step
        "load_avg_1min": start["load_avg"],
        "final_dev_tgc": {a: r["final_dev_tgc"] for a, r in runs.items()},
        "algos": {  # one entry per point; the first is the start (iteration None, no training figures)
            a: {
                **{key: [p.get(key) for p in r["points"]] for key in SERIES},
                "final_dev_tgc": r["final_dev_tgc"],
                "final_dev_sgc": r["final_dev_sgc"],
            }
            for a, r in runs.items()
        },
    }
    emit(result)


if __name__ == "__main__":
    main()
