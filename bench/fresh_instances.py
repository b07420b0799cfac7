"""Success on new tasks of the kinds training sees: each model, greedy, on fresh instances of the built-in
world's train scenarios (new people and values, on seeds no bench or test trains on), beside the dev split
(scenarios no train task uses).

    python bench/fresh_instances.py --results DIR [--adapter LABEL=DIR ...] [--no-base] [--n N] [--seed S]
        [--dev] [--rerun] [--quick] [--merge] [--write-docs]

A served tenant's tasks are mostly new instances of the kinds it sent before; dev measures transfer to kinds
never trained on. The two together say whether a learner fits what it is shown and whether that carries over.
Each model's figures are written to DIR/<label>.json as soon as they are measured, so models can be measured
in separate sittings (one already measured under the same settings is skipped unless --rerun); --merge reads
every file in DIR. Limits match bench/stepagent_curve.py's dev evaluation: greedy, 16 turns, 160 new tokens
a turn. Last line: a JSON object with each model's TGC per set, the base model's and the best one's on fresh.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentloop.agent.episode import Limits
from agentloop.agent.eval_runs import eval_task, world_tasks
from agentloop.agent.evaluate import EpisodeResult, EvalTask, run_eval, summarize
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.registry import fresh_instances
from agentloop.settings import get_settings

from report import emit, machine, models_to_measure, write_section

SECTION = "fresh_instances"
SEED = 20261204  # the instances' draw: not a seed any bench or test trains with
MAX_TURNS = 16
MAX_NEW_TOKENS = 160


def task_sets(n: int, seed: int, dev: bool, quick: bool) -> dict[str, list[EvalTask]]:
    sets = {"fresh": [eval_task(BUILTIN, spec) for spec in fresh_instances(BUILTIN, n, seed)]}
    if dev:
        sets["dev"] = world_tasks(BUILTIN, "dev", 2 if quick else None)
    return sets


def settings_key(args: argparse.Namespace, sets: dict[str, list[EvalTask]]) -> dict[str, Any]:
    """What makes two measurements comparable: the task sets and the limits."""
    return {
        "sets": {name: [t.task_ref for t in tasks] for name, tasks in sets.items()},
        "max_turns": args.max_turns,
        "max_new_tokens": MAX_NEW_TOKENS,
        **({"prompt_example": args.prompt_example} if args.prompt_example != "fixed" else {}),
    }


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", label).strip("_") or "model"


def first_calls(results: list[EpisodeResult]) -> dict[str, int]:
    """How many episodes opened with each call (app.api; "none" when the first turn was no call)."""
    counts: Counter[str] = Counter()
    for r in results:
        action = r.episode.turns[0].action if r.episode.turns else None
        counts[f"{action['app']}.{action['api']}" if action else "none"] += 1
    return dict(counts.most_common())


def figures(summary: dict[str, Any], seconds: float, results: list[EpisodeResult]) -> dict[str, Any]:
    return {
        "first_calls": first_calls(results),
        "tgc": summary["tgc"],
        "sgc": summary["sgc"],
        "mean_reward": summary["mean_reward"],
        "tasks": summary["tasks"],
        "mean_turns": summary["mean_turns"],
        "failed_calls_per_episode": summary["behaviour"]["failed_calls_per_episode"],
        "give_up_after_failure_rate": summary["behaviour"]["give_up_after_failure_rate"],
        "solved_scenarios": sorted(s for s, b in summary["by_scenario"].items() if b["tgc"] > 0),
        "by_difficulty": {d: b["tgc"] for d, b in summary["difficulty"].items()},
        "eval_s": round(seconds, 1),
    }


def progress_printer(what: str, total: int) -> Callable[[EpisodeResult], None]:
    """A line per finished episode on stderr: an evaluation of a few dozen episodes takes many minutes."""
    done: list[bool] = []

    def on_result(result: EpisodeResult) -> None:
        done.append(result.success)
        print(
            f"  {what}: {len(done)}/{total} {result.task.task_ref} {'ok' if result.success else 'fail'} "
            f"(passed {sum(done)})",
            file=sys.stderr,
            flush=True,
        )

    return on_result


def measure(policy: Any, label: str, adapter: Path | None, sets: dict[str, list[EvalTask]], limits: Limits) -> dict:
    name = None
    if adapter is not None:
        name = f"bench-{slug(label)}"
        policy.load_adapter(name, str(adapter))
    out: dict[str, Any] = {}
    try:
        for set_name, tasks in sets.items():
            t0 = time.perf_counter()
            on_result = progress_printer(f"{label} {set_name}", len(tasks))
            results = run_eval(policy, tasks, 1, limits, get_settings().max_batch_size, on_result, adapter=name)
            out[set_name] = figures(summarize(results), time.perf_counter() - t0, results)
            policy.clear_cache()
    finally:
        if name is not None:
            policy.unload_adapter(name)
    return out


def docs_section(merged: dict[str, Any], cmds: list[str]) -> str:
    models = merged["models"]
    sets = sorted({s for m in models.values() for s in m["sets"]}, key=lambda s: (s != "fresh", s))
    n = {s: next(m["sets"][s]["tasks"] for m in models.values() if s in m["sets"]) for s in sets}
    lines = [
        "## New tasks of trained kinds vs unseen kinds (`bench/fresh_instances.py`)",
        "",
        *[f"`{c}`  " for c in cmds],
        "",
        f"On {machine()}; model `smollm2-135m-instruct`. *fresh*: {n['fresh']} new instances of the built-in "
        "world's train scenarios, one per scenario, on seeds drawn from "
        f"{merged['seed']} (no bench or test trains on them: new people, values and worlds); "
        + (f"*dev*: the {n['dev']} dev tasks (scenarios no train task uses). " if "dev" in n else "")
        + f"greedy, {merged['max_turns']} turns, {MAX_NEW_TOKENS} new tokens a turn, as stepagent_curve's dev "
        "evaluation. Adapters are the saved ones of the runs named (training seconds after the start they say).",
        "",
        "| model | set | TGC | SGC | mean reward | failed calls / episode | give up after failure | turns "
        "| first calls | eval s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, m in models.items():
        for s in sets:
            if s not in m["sets"]:
                continue
            f = m["sets"][s]
            opened = ", ".join(f"{call} {n}" for call, n in list(f.get("first_calls", {}).items())[:2]) or "not kept"
            lines.append(
                f"| {label} | {s} | {f['tgc']:.1f} | {f['sgc']:.1f} | {f['mean_reward']:.3f} | "
                f"{f['failed_calls_per_episode']:.2f} | {f['give_up_after_failure_rate']:.2f} | {f['mean_turns']:.1f} "
                f"| {opened} | {f['eval_s']:.0f} |"
            )
    lines += ["", merged["finding"], "", "<details><summary>Results (JSON)</summary>", "", "```json"]
    lines += [json.dumps(merged, indent=1, sort_keys=True), "```", "", "</details>"]
    return "\n".join(lines)


def merge(results: Path) -> dict[str, Any]:
    files = sorted(results.glob("*.json"), key=lambda p: p.stat().st_mtime)
    runs = [json.loads(p.read_text()) for p in files]
    if not runs:
        raise SystemExit(f"no measurements in {results}")
    models = {r["label"]: {"adapter": r["adapter"], "sets": r["sets"], "command": r["command"]} for r in runs}
    fresh = {label: m["sets"]["fresh"]["tgc"] for label, m in models.items() if "fresh" in m["sets"]}
    best = max(fresh, key=lambda label: fresh[label]) if fresh else None
    base = fresh.get("base")
    finding = f"Best on fresh instances: {best} at TGC {fresh[best]:.1f}" if best else "No fresh measurement."
    if best and base is not None:
        finding += f" (base model {base:.1f}); one task is {100 / models[best]['sets']['fresh']['tasks']:.1f} points."
    return {
        "seed": runs[0]["settings"]["seed"],
        "max_turns": runs[0]["settings"]["max_turns"],
        "models": models,
        "base_fresh_tgc": base,
        "best_fresh_tgc": fresh[best] if best else None,
        "best_model": best,
        "finding": finding,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, required=True, help="folder of per-model result files")
    ap.add_argument("--adapter", action="append", default=[], help="LABEL=DIR of a saved LoRA adapter (repeat)")
    ap.add_argument("--no-base", action="store_true", help="leave the base model out")
    ap.add_argument("--n", type=int, default=None, help="fresh instances (default: one per train scenario)")
    ap.add_argument("--seed", type=int, default=SEED, help="the seed the instances' seeds are drawn from")
    ap.add_argument("--dev", action="store_true", help="also the dev split (51 tasks)")
    ap.add_argument("--max-turns", type=int, default=MAX_TURNS)
    ap.add_argument(
        "--prompt-example",
        choices=("fixed", "nearest"),
        default="fixed",
        help="the worked example each episode shows (AGENTLOOP_PROMPT_EXAMPLE): the world's, or the nearest solved "
        "train task; results in one DIR must share it",
    )
    ap.add_argument("--rerun", action="store_true", help="measure a model again even if DIR has its figures")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 3 instances, 4 turns (and 2 dev tasks)")
    ap.add_argument("--merge", action="store_true", help="only merge DIR's files (no model is run)")
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md's fresh_instances section")
    args = ap.parse_args()
    os.environ["AGENTLOOP_PROMPT_EXAMPLE"] = args.prompt_example
    get_settings.cache_clear()
    models = models_to_measure(ap, args.adapter, base=not args.no_base)
    if args.quick:
        args.n, args.max_turns = 3, 4
    n = args.n or len(BUILTIN.procedural_scenarios())
    if n < 1:
        ap.error("--n must be 1 or more")
    args.results.mkdir(parents=True, exist_ok=True)
    command = "python bench/fresh_instances.py " + shlex.join(a for a in sys.argv[1:] if a != "--write-docs")

    if not args.merge:
        from agentloop.policy.local import LocalPolicy

        sets = task_sets(n, args.seed, args.dev, args.quick)
        key = settings_key(args, sets)
        limits = Limits(
            max_turns=args.max_turns,
            max_new_tokens=MAX_NEW_TOKENS,
            observation_max_tokens=get_settings().agent_observation_max_tokens,
            max_context_tokens=get_settings().agent_max_context_tokens,
            wall_time_s=1e9,
            temperature=0.0,
        )
        policy = None
        for label, adapter in models:
            path = args.results / f"{slug(label)}.json"
            if path.exists() and not args.rerun:
                found = json.loads(path.read_text())
                if found.get("key") == key:
                    print(f"{label}: measured already ({path}); --rerun to measure again", file=sys.stderr)
                    continue
            policy = policy or LocalPolicy.from_settings(get_settings())
            print(f"{label}: {', '.join(f'{len(t)} {s}' for s, t in sets.items())} tasks", file=sys.stderr)
            measured = measure(policy, label, adapter, sets, limits)
            record = {
                "label": label,
                "adapter": str(adapter) if adapter else None,
                "sets": measured,
                "settings": {"seed": args.seed, "max_turns": args.max_turns, "n": n},
                "key": key,
                "command": command,
                "machine": machine(),
                "quick": args.quick,
            }
            path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            for s, f in measured.items():
                print(f"{label} {s}: TGC {f['tgc']:.1f} SGC {f['sgc']:.1f} ({f['eval_s']:.0f} s)", file=sys.stderr)
    merged = merge(args.results)
    if args.write_docs:
        cmds = sorted({m["command"] for m in merged["models"].values()})
        write_section(SECTION, docs_section(merged, cmds))
    emit(
        {k: v for k, v in merged.items() if k != "models"}
        | {"models": {label: {s: f["tgc"] for s, f in m["sets"].items()} for label, m in merged["models"].items()}}
    )


if __name__ == "__main__":
    main()
