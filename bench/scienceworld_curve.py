"""SmolLM2-135M on ScienceWorld: average score and success on seen and unseen variations, per cycle, for the
base model, SFT on gold paths, SFT -> StepAgent, SFT -> LOOP and SFT -> LOOP+step, each arm the same training
budget after one shared SFT warm start. The phases, their files under --results, the budget and the flags are
bench/stepagent_curve.py's (see there); only the world, the task types and what a point measures differ.

    python bench/scienceworld_curve.py [--quick] [--results DIR]
        [--arms sft,stepagent-greedy,loop,loop+step,loop+expert,sft+loop+expert] [--start-only] [--merge]
        [--defer-eval] [--budget-s S] [--warm-start-s S] [--dev-every N] [--json] [--write-docs]

Task types (TYPES): the eight whose gold path (of the first train variation) takes at most 11 commands: finding
a plant, an animal, a living or a non-living thing and focusing on it; naming the longest- or shortest-lived of
some animals (and both); and building a circuit that powers a component. Longer types (boiling, melting,
genetics) outgrow what a 135M model on 2 CPU cores can be trained for in a sitting. Training draws the listed
train variations of these types (10 each); their gold paths are the experts.

Seen and unseen, as in the published ScienceWorld tables (ETO, IPR): seen = the benchmark's dev variations,
unseen = its test variations, of the same task types (other objects, places and answers than any train
variation). A point evaluates `--per-type` listed variations of each type from each (greedy, --dev-max-turns):
average score (0-100, the simulator's, a negative one as 0) and success (the task completed). Agreement: the
greedy command = the gold command, at dev (seen) gold-path prefixes.

The published figures beside the table (PUBLISHED) are ETO's (Song et al., 2024) with Llama-2-7B-Chat
fine-tuned on all 30 task types' gold paths on GPUs: another model, 50x larger, other task types and budgets.
They show where the methods land at scale, not a target this bench can be held to.

Last line: a JSON object with base_seen_score, sft_seen_score, best_seen_score, best_arm (and unseen).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import stepagent_curve as curve

from agentloop.agent.eval_runs import eval_task, world_tasks
from agentloop.agent.evaluate import EvalTask, run_eval, summarize
from agentloop.apps.registry import get_world
from agentloop.learner.trainer import Trainer
from agentloop.policy.models import resolve_model_dir
from agentloop.settings import get_settings

from report import emit, write_section

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PLOT = ROOT / "docs" / "scienceworld_curve.png"
SECTION = "scienceworld_curve"
TYPES = (
    "find-animal",
    "find-living-thing",
    "find-non-living-thing",
    "find-plant",
    "lifespan-longest-lived",
    "lifespan-longest-lived-then-shortest-lived",
    "lifespan-shortest-lived",
    "power-component",
)
ARMS = ("sft", "stepagent-greedy", "loop", "loop+step", "loop+expert", "sft+loop+expert")
SETS = {"seen": "dev", "unseen": "test"}
# ETO (Song et al., 2024), ScienceWorld average reward x 100, Llama-2-7B-Chat, all 30 task types
PUBLISHED = (("SFT (Llama-2-7B-Chat)", 67.4, 53.0), ("ETO (Llama-2-7B-Chat)", 73.8, 65.0))

PRESETS: dict[str, tuple[Any, Any]] = {
    **curve.PRESETS,
    "per_type": (2, 1),  # variations of each type in each of seen and unseen: 16 + 16 episodes a point
    "dev_max_turns": (20, 2),  # the gold paths of these types take 5-11 commands
    "agreement_prefixes": (40, 2),  # the commands of ~5 seen gold paths
    "max_turns": (16, 1),
    "max_new_tokens": (32, 16),  # a command is a few words
    # a point's evaluation (32 episodes of up to 20 turns) takes minutes: every 5th cycle, the start and the end
    "dev_every": (5, 0),
}


def per_type(tasks: list[EvalTask], n: int) -> list[EvalTask]:
    """The first `n` listed variations of each of TYPES, in TYPES order."""
    by_type: dict[str, list[EvalTask]] = defaultdict(list)
    for t in tasks:
        if t.scenario in TYPES and len(by_type[t.scenario]) < n:
            by_type[t.scenario].append(t)
    return [t for name in TYPES for t in by_type[name]]


def figures(trainer: Trainer, args: Any) -> dict[str, Any]:
    """Seen and unseen: average score and success of the trainer's weights, greedy."""
    provider = get_world("scienceworld")
    out: dict[str, Any] = {}
    trainer.model.eval()
    for name, split in SETS.items():
        tasks = per_type(world_tasks(provider, split), args.per_type)
        trainer.report({"phase": "evaluating", "set": name, "tasks": len(tasks)})
        trainer.policy.clear_cache()
        results = run_eval(trainer.policy, tasks, 1, trainer.limits(dev=True), trainer.settings.max_batch_size)
        trainer.policy.clear_cache()
        summary = summarize(results)
        out[f"{name}_score"] = round(100 * summary["mean_reward"], 2)
        out[f"{name}_success"] = round(summary["tgc"], 2)
        out[f"{name}_tasks"] = summary["tasks"]
        out[f"{name}_by_type"] = {t: round(100 * b["mean_reward"], 1) for t, b in summary["by_scenario"].items()}
        out[f"{name}_mean_turns"] = summary.get("mean_turns")
    return out


FIGURES = ("seen_score", "seen_success", "unseen_score", "unseen_success")


def extra_args(ap: Any) -> None:
    ap.add_argument(
        "--reevaluate",
        default=None,
        metavar="MODELS",
        help="train nothing: measure these saved models again, episode by episode, on --per-type variations of "
        f"each type (comma-separated: base, warm_start, {', '.join(ARMS)}); written to DIR/reeval-<per-type>.json "
        "and compared pairwise, variation by variation",
    )


CURVE = curve.Curve(
    script="bench/scienceworld_curve.py",
    name="scienceworld_curve",
    arms=ARMS,
    presets=PRESETS,
    world={"world": "scienceworld", "procedural": False, "scenarios": TYPES},
    figures=figures,
    figure_keys=(*FIGURES, "seen_tasks", "unseen_tasks", "seen_by_type", "unseen_by_type"),
    extra_args=extra_args,
)


# --- paired re-evaluation: the saved models on the same variations, episode by episode -------------------

REEVAL_MODELS = ("base", "warm_start", *ARMS)
PAIRED_AGAINST = ("warm_start", "sft")  # what each model is compared with, variation by variation


def reeval_path(results: Path, per_type: int) -> Path:
    return results / f"reeval-{per_type}.json"


def model_adapter(results: Path, name: str) -> Path | None:
    """Where a model's adapter is: None for the base model (a fresh LoRA adapter is the identity)."""
    if name == "base":
        return None
    return results / "warm_start" if name == "warm_start" else curve.arm_adapter(results, name)


def adapter_digest(adapter: Path | None) -> str | None:
    """sha256 of the adapter's weights: a model trained further since it was measured is measured again."""
    return None if adapter is None else hashlib.sha256((adapter / "adapter_model.safetensors").read_bytes()).hexdigest()


def trained_for(results: Path, name: str) -> dict[str, Any]:
    """A model's training as its phase file records it: seconds and cycles (the warm start's own; an arm's after
    the warm start)."""
    found = curve.read_json(results / f"{name}.json") if name != "base" else None
    return {"train_s": (found or {}).get("train_s"), "cycles": (found or {}).get("cycles")}


def reevaluate(args: Any, results: Path, model_dir: Path, settings: dict[str, Any]) -> None:
    """`--reevaluate MODELS`: each model's greedy episodes on the first --per-type seen and unseen variations of
    every type (`variations`: more than the world lists, if asked), one score per variation, in
    DIR/reeval-<per-type>.json (rewritten after each model). A model already there with the same adapter weights
    and evaluation settings is reused; one trained further since is measured again, its earlier figures kept
    under "earlier"."""
    names = [n.strip() for n in args.reevaluate.split(",") if n.strip()]
    unknown = [n for n in names if n not in REEVAL_MODELS]
    if unknown or not names:
        raise SystemExit(f"--reevaluate takes a comma-separated subset of {', '.join(REEVAL_MODELS)}; got {unknown}")
    adapters = {n: model_adapter(results, n) for n in names}
    missing = [n for n, a in adapters.items() if a is not None and not (a / "adapter_config.json").exists()]
    if missing:
        raise SystemExit(f"no saved adapter for {', '.join(missing)} under {results} (train them first)")
    path = reeval_path(results, args.per_type)
    now = curve.eval_settings(settings)
    data = curve.read_json(path) or {"per_type": args.per_type, "models": {}}
    provider = get_world("scienceworld")
    sets = {name: variations(provider, split, args.per_type) for name, split in SETS.items()}
    for name in names:
        adapter = adapters[name]
        digest = adapter_digest(adapter)
        found = data["models"].get(name)
        if found is not None and found["adapter_sha256"] == digest and found["settings"] == now:
            curve.progress(f"reeval {name}: measured already with these weights and settings, reused")
            continue
        home = curve.use_home(results / "homes" / "reeval", model_dir)
        trainer = curve.load_trainer(home, curve.make_config("sft", args), model_dir, adapter, f"reeval {name}")
        trainer.model.eval()
        t0 = time.perf_counter()
        record: dict[str, Any] = {
            "adapter": None if adapter is None else os.path.relpath(adapter, results),
            "adapter_sha256": digest,
            "settings": now,
            **trained_for(results, name),
        }
        for set_name, tasks in sets.items():
            curve.progress(f"reeval {name}: {len(tasks)} {set_name} episodes")
            trainer.policy.clear_cache()
            done = run_eval(trainer.policy, tasks, 1, trainer.limits(dev=True), trainer.settings.max_batch_size)
            record[set_name] = {
                r.task.task_ref: {"score": round(100 * r.reward, 2), "success": r.success}
                for r in done
                if r.verdict is not None
            }
        curve.release(trainer)
        record.update(eval_s=round(time.perf_counter() - t0, 1), **curve.stamp(args))
        if found is not None:
            earlier = found.pop("earlier", [])
            record["earlier"] = [*earlier, {k: v for k, v in found.items() if k not in SETS} | summary_of(found)]
        data["models"][name] = record
        curve.write_json(path, data)
        curve.progress(f"reeval {name}: " + ", ".join(f"{k} {v}" for k, v in summary_of(record).items()))


def variations(provider: Any, split: str, n: int) -> list[EvalTask]:
    """The first `n` of the benchmark's `split` variations of each of TYPES (all of a type's, where it has fewer),
    in TYPES order. The world lists the first few of each split (what a point of the curve evaluates: the same
    first ones); any other is a task by its ref, so a re-evaluation may measure more than are listed."""
    found = provider.catalogue.variations
    return [eval_task(provider, provider.task(f"{t}-{v}")) for t in TYPES for v in found[t][split][:n]]


def summary_of(record: dict[str, Any]) -> dict[str, Any]:
    """A model's mean score and success % over each set's variations."""
    out: dict[str, Any] = {}
    for name in SETS:
        episodes = list(record.get(name, {}).values())
        out[f"{name}_score"] = round(sum(e["score"] for e in episodes) / len(episodes), 1) if episodes else None
        out[f"{name}_success"] = (
            round(100 * sum(e["success"] for e in episodes) / len(episodes), 1) if episodes else None
        )
        out[f"{name}_tasks"] = len(episodes)
    return out


def paired(record: dict[str, Any], against: dict[str, Any], set_name: str) -> dict[str, Any] | None:
    """Mean score difference over the variations both measured, with its standard error (sd / sqrt n)."""
    common = sorted(set(record.get(set_name, {})) & set(against.get(set_name, {})))
    if len(common) < 2:
        return None
    diffs = [record[set_name][r]["score"] - against[set_name][r]["score"] for r in common]
    mean_d = sum(diffs) / len(diffs)
    var = sum((d - mean_d) ** 2 for d in diffs) / (len(diffs) - 1)
    return {"mean": round(mean_d, 1), "se": round((var / len(diffs)) ** 0.5, 1), "n": len(common)}


def reeval_result(data: dict[str, Any]) -> dict[str, Any]:
    """Per model: its figures and its paired differences against the warm start and SFT alone."""
    models = data["models"]
    out: dict[str, Any] = {}
    for name in [n for n in REEVAL_MODELS if n in models]:
        row: dict[str, Any] = {**summary_of(models[name]), "train_s": models[name].get("train_s")}
        for other in PAIRED_AGAINST:
            if other != name and other in models:
                for set_name in SETS:
                    row[f"{set_name}_vs_{other}"] = paired(models[name], models[other], set_name)
        out[name] = row
    return {"per_type": data["per_type"], "models": out}


def reeval_label(name: str) -> str:
    return {"base": "base model (no adapter)", "warm_start": "warm start"}.get(name) or curve.LABELS[name]


def reeval_table(result: dict[str, Any]) -> str:
    f = curve.fmt

    def pm(x: dict[str, Any] | None) -> str:
        return "" if x is None else f"{x['mean']:+.1f} ± {x['se']:.1f}"

    rows = [
        "| model | train s | seen score | seen success % | unseen score | unseen success % | seen vs warm start "
        "| unseen vs warm start | seen vs SFT alone | unseen vs SFT alone |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["models"].items():
        rows.append(
            f"| {reeval_label(name)} | {f(r['train_s'], '.0f')} | {f(r['seen_score'])} | {f(r['seen_success'])} "
            f"| {f(r['unseen_score'])} | {f(r['unseen_success'])} | {pm(r.get('seen_vs_warm_start'))} "
            f"| {pm(r.get('unseen_vs_warm_start'))} | {pm(r.get('seen_vs_sft'))} | {pm(r.get('unseen_vs_sft'))} |"
        )
    return "\n".join(rows)


def reeval_section(reevals: list[dict[str, Any]]) -> str:
    """The docs' part on the re-evaluations, fewest variations first: commands, what a row is, table, finding."""
    parts = []
    for data in reevals:
        n = data["per_type"]
        commands = list(dict.fromkeys(m["command"] for m in data["models"].values()))
        result = reeval_result(data)
        first = next(iter(data["models"].values()))
        tasks = {name: len(first.get(name, {})) for name in SETS}
        parts.append(f"""
### The saved models measured again on {n} variations of each type (`--reevaluate`, `--per-type {n}`)

{chr(10).join(f"`{c}`" + "  " for c in commands)}

Each model greedy on the first {n} dev (seen) and {n} test (unseen) variations of each of the {len(TYPES)}
types{fewer(data)}: {tasks["seen"]} + {tasks["unseen"]} episodes, one per variation. A "vs" column is the
mean difference in score (0-100) over the same variations, ± its standard error (sd / sqrt n): paired, so a
variation that is hard for every model does not widen it. Train s: the warm start's own seconds, and an arm's
after the warm start. File: `{CURVE.name}/reeval-{n}.json` under the results folder (scores per variation).

{reeval_table(result)}

{reeval_finding(result)}
""")
    return "".join(parts)


def fewer(data: dict[str, Any]) -> str:
    """ ", all of a type's where it has fewer (power-component: 5 and 5)" where a set holds fewer than asked."""
    first = next(iter(data["models"].values()))
    counts: dict[str, list[int]] = {}
    for name in SETS:
        per: dict[str, int] = defaultdict(int)
        for ref in first.get(name, {}):
            per[ref.rsplit("-", 1)[0]] += 1
        for t, k in per.items():
            if k < data["per_type"]:
                counts.setdefault(t, []).append(k)
    if not counts:
        return ""
    return (
        ", all of a type's where it has fewer ("
        + "; ".join(f"{t}: {' and '.join(map(str, ks))}" for t, ks in counts.items())
        + ")"
    )


def reeval_finding(result: dict[str, Any]) -> str:
    """In words: each arm's paired difference from SFT alone, and whether it stands clear of its noise."""
    parts = []
    for name, r in result["models"].items():
        if name in ("base", "warm_start", "sft"):
            continue
        said = []
        for set_name in SETS:
            d = r.get(f"{set_name}_vs_sft")
            if d is None:
                continue
            ratio = d["mean"] / d["se"] if d["se"] else float("inf")
            clear = "more than 2 SE" if abs(ratio) > 2 else "within 1 SE" if abs(ratio) <= 1 else "1-2 SE"
            said.append(f"{d['mean']:+.1f} ± {d['se']:.1f} {set_name} ({clear})")
        if said:
            parts.append(f"{reeval_label(name)} vs SFT alone: " + ", ".join(said) + ".")
    return " ".join(parts)


def reevaluations(results: Path) -> list[dict[str, Any]]:
    """Every re-evaluation in DIR, fewest variations per type first."""
    files = sorted(results.glob("reeval-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    return [data for f in files if (data := curve.read_json(f)) is not None]


# --- the report ------------------------------------------------------------------------------------------


def arm_row(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "cycles": len(run["points"]) - 1,
        "train_s": run.get("train_s", 0.0),
        "eval_s": run.get("eval_s", 0.0),
        "finished": run["finished"],
        "agreement": curve.final(run, "agreement"),
        **{k: curve.final(run, k) for k in FIGURES},
    }


def headline(arms: dict[str, Any], base: Any, start: Any) -> dict[str, Any]:
    rows = {a: arm_row(r) for a, r in arms.items()}
    measured = {a: r for a, r in rows.items() if r["seen_score"] is not None}
    best = max(measured, key=lambda a: (measured[a]["seen_score"], measured[a]["unseen_score"] or 0), default=None)
    return {
        "types": list(TYPES),
        "seen_tasks": (base or start or {}).get("seen_tasks"),
        "base_seen_score": (base or {}).get("seen_score"),
        "base_unseen_score": (base or {}).get("unseen_score"),
        "warm_start_seen_score": (start or {}).get("seen_score"),
        "sft_seen_score": rows.get("sft", {}).get("seen_score"),
        "sft_unseen_score": rows.get("sft", {}).get("unseen_score"),
        "best_arm": best,
        "best_seen_score": measured[best]["seen_score"] if best else None,
        "best_unseen_score": measured[best]["unseen_score"] if best else None,
        "arms": rows,
    }


def summary_table(arms: dict[str, Any], base: Any, start: Any) -> str:
    f = curve.fmt
    rows = [
        "| arm | cycles | train s | seen score | seen success % | unseen score | unseen success % | agreement % "
        "| eval s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, x in (("base model (no adapter)", base), ("warm start (SFT, every arm's start)", start)):
        if x:
            rows.append(
                f"| {label} | {x.get('cycles', '')} | {f(x.get('train_s'), '.0f')} | {f(x['seen_score'])} "
                f"| {f(x['seen_success'])} | {f(x['unseen_score'])} | {f(x['unseen_success'])} "
                f"| {f(x.get('agreement'))} | {f(x['eval_s'], '.0f')} |"
            )
    for arm, run in arms.items():
        r = arm_row(run)
        state = "" if run["finished"] else " (trained; evaluation deferred)" if run.get("trained") else " (unfinished)"
        rows.append(
            f"| {curve.LABELS[arm]}{state} | {r['cycles']} | {r['train_s']:.0f} | {f(r['seen_score'])} "
            f"| {f(r['seen_success'])} | {f(r['unseen_score'])} | {f(r['unseen_success'])} | {f(r['agreement'])} "
            f"| {f(r['eval_s'], '.0f')} |"
        )
    for label, seen, unseen in PUBLISHED:
        rows.append(f"| *published: {label}* | | | *{seen}* | | *{unseen}* | | | |")
    return "\n".join(rows)


def curves_table(arms: dict[str, Any]) -> str:
    """Seen score per evaluated point, one row per arm."""
    longest = max((len(r["points"]) for r in arms.values()), default=1)
    heads = ["start", *[str(i) for i in range(longest - 1)]]
    rows = ["| seen score by cycle | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for arm, run in arms.items():
        values = [curve.fmt(p.get("seen_score")) for p in run["points"]] + [""] * (longest - len(run["points"]))
        rows.append(f"| {curve.LABELS[arm]} | " + " | ".join(values) + " |")
    return "\n".join(rows)


def plot(arms: dict[str, Any], base: Any, path: Path) -> str | None:
    """Seen and unseen score vs train seconds, where measured; None, or why no PNG."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no PNG"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, name in zip(axes, SETS, strict=True):
        key = f"{name}_score"
        for (arm, run), marker in zip(arms.items(), "os^Dv", strict=False):
            pts = [(p["train_s"], p[key]) for p in run["points"] if p.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=marker, label=curve.LABELS[arm])
        if base is not None and base.get(key) is not None:
            ax.axhline(base[key], color="grey", linestyle="--", linewidth=1, label="base model")
        ax.set_xlabel("training wall time after the warm start, s")
        ax.set_ylabel("average score (0-100), greedy")
        ax.set_title(f"ScienceWorld {name} ({SETS[name]} variations)")
        ax.set_ylim(0, max(10.0, ax.get_ylim()[1] * 1.05))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def finding(result: dict[str, Any]) -> str:
    base, rows = result["base_seen_score"], result["arms"]
    measured = {a: r for a, r in rows.items() if r["seen_score"] is not None}
    if base is None or not measured:
        return "Not enough measured yet to compare the arms with the base model."
    above = [a for a, r in measured.items() if r["seen_score"] > base]
    sft = rows.get("sft", {}).get("seen_score")
    parts = [
        f"Seen score: base {curve.fmt(base)}; "
        + "; ".join(f"{curve.LABELS[a]} {curve.fmt(r['seen_score'])}" for a, r in measured.items())
        + f". Above the base model: {len(above)} of {len(measured)} measured arms."
    ]
    if sft is not None and result["best_arm"] not in (None, "sft"):
        gap = result["best_seen_score"] - sft
        parts.append(f"The best arm, {curve.LABELS[result['best_arm']]}, is {gap:+.1f} points from SFT alone.")
    n = result["seen_tasks"] or 0
    if n:
        parts.append(f"With {n} seen episodes a point, one episode's score moves the average by up to {100 / n:.1f}.")
    return " ".join(parts)


def docs_section(result: dict[str, Any], arms: dict[str, Any], base: Any, start: Any, image: str, note: Any) -> str:
    files = [*(x for x in (base, start) if x), *arms.values()]
    commands = list(dict.fromkeys(r["command"] for r in files))
    s = result["settings"]
    figure = f"![seen and unseen score vs training seconds]({image})" if note is None else f"(No figure: {note}.)"
    budgets = ", ".join(
        f"{curve.LABELS[a]} {r['settings']['budget_s']:g} s (lr {curve.arm_lr(r)})" for a, r in arms.items()
    )
    return f"""
## ScienceWorld: score on seen and unseen variations (`bench/scienceworld_curve.py`)

{chr(10).join(f"`{c}`" + "  " for c in commands)}

On {"; ".join(dict.fromkeys(r["machine"] for r in files))}; model `{s["model"]}`. Task types ({len(TYPES)}):
{", ".join(TYPES)}. Seen: {s["per_type"]} dev variations of each, unseen: {s["per_type"]} test variations of
each; greedy, {s["dev_max_turns"]} turns. Budget per arm after the shared warm start: {budgets or "none yet"}.
Per cycle: {s["experts_per_iteration"]} gold-path experts of train variations; SFT {s["sft_steps"]} steps x
{s["sft_batch_size"]}; RL {s["tasks_per_iteration"]} train variations x K = {s["rollouts_per_task"]} rollouts of
{s["max_turns"]} turns. The published rows are ETO's Llama-2-7B-Chat on all 30 types: another model and scale.

{summary_table(arms, base, start)}

{figure}

{curves_table(arms)}

{finding(result)}

<details><summary>Merged results (JSON)</summary>

```json
{json.dumps({"base": base, "warm_start": start, "arms": arms}, indent=1, sort_keys=True)}
```

</details>
"""


def main() -> None:
    args = curve.parse_args(curve=CURVE, doc=__doc__)
    settings_now = get_settings()
    results = (args.results or settings_now.home / "bench" / CURVE.name).resolve()
    results.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model_dir(args.model or settings_now.model, settings_now.models_dir)
    settings = curve.bench_settings(args, model_dir.name)
    if args.plot is None:
        args.plot = DEFAULT_PLOT if args.write_docs else results / f"{CURVE.name}.png"
    if args.reevaluate:
        reevaluate(args, results, model_dir, settings)
    elif not args.merge:
        curve.run_phases(args, results, model_dir, settings)

    base, start = curve.read_json(results / "base.json"), curve.read_json(results / "warm_start.json")
    arms = curve.load_arms(results)
    described = next((r["settings"] for r in arms.values()), settings)
    result = {"settings": described, **headline(arms, base, start)}
    reevals = reevaluations(results)
    if reevals:
        result["reeval"] = {str(r["per_type"]): reeval_result(r) for r in reevals}
    measured_again = list(result.get("reeval", {}).values())
    note = plot(arms, base, args.plot) if arms or base else "nothing measured yet"
    curve.progress(note or f"plot written to {args.plot}")
    if not args.json:
        print(summary_table(arms, base, start))
        print(finding(result))
        for r in measured_again:
            print(reeval_table(r))
            print(reeval_finding(r))
    if args.write_docs:
        image = os.path.relpath(args.plot.resolve(), DEFAULT_PLOT.parent)
        write_section(SECTION, docs_section(result, arms, base, start, image, note) + reeval_section(reevals))
        curve.progress(f"docs/benchmarks.md: section {SECTION} written")
    run = {"model": model_dir.name, "quick": args.quick, "results": str(results), "command": curve.command(args)}
    emit({**run, **result})


if __name__ == "__main__":
    main()
