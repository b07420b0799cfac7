"""What training on a world's train scenarios can carry to its dev split, read from the oracle's solutions alone
(no model): for each dev scenario, the calls that solve its tasks (app.api), whether some train scenario is
solved by the same sequence of calls (then only the arguments differ), which of its APIs no train expert ever
calls, and the per-step expert-action agreement a dev TGC target asks for.

    python bench/dev_reach.py [--world builtin] [--instances N] [--seed S] [--target TGC] [--quick]
        [--write-docs]

Train call sequences come from the world's listed train tasks and `--instances` fresh instances of every train
scenario (`<scenario>@<seed>`, seeds drawn from `--seed`), so that a scenario whose solution changes with its
seed shows each form. A call repeated back to back counts once in a sequence (a loop over search results is
one pattern whatever its length).

The agreement asked for: a greedy episode solves its task when each of its n expert steps is right (or an
equally good one is taken). If steps were right independently with probability p, dev TGC would be the mean of
p^n over dev tasks; the bench solves that for p at `--target`. Steps are not independent (an episode that
starts well tends to go on well), so read it as the order of agreement needed, not a bound.

Last line: a JSON object with `dev_tasks`, `same_pattern_tasks`, `unseen_api_tasks`, `calls_per_task`,
`target_tgc` and `step_agreement_needed`.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from agentloop.apps.registry import ProceduralWorld, draw_instance, get_world
from agentloop.apps.tasks import TaskSpec, run_oracle

from report import emit, write_section

SEED = 20261206  # the train instances' draw


def calls(provider: Any, spec: TaskSpec) -> list[str]:
    """The oracle's calls on the task's own world, as app.api."""
    world = provider.task_world(spec.id)
    try:
        return [f"{c.app}.{c.api}" for c in run_oracle(spec, world).actions]
    finally:
        world.close()


def pattern(seq: Sequence[str]) -> tuple[str, ...]:
    """The sequence with back-to-back repeats of one call counted once."""
    out: list[str] = []
    for c in seq:
        if not out or out[-1] != c:
            out.append(c)
    return tuple(out)


def agreement_needed(lengths: Sequence[int], target: float) -> float:
    """p in [0, 1] with mean(p ** n) = target (a fraction), by bisection: the mean rises with p."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**n for n in lengths) / len(lengths) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


Patterns = dict[tuple[str, ...], set[str]]  # a call sequence -> the scenarios solved by it


def train_calls(provider: ProceduralWorld, instances: int, seed: int) -> tuple[Patterns, set[str]]:
    """Each train call pattern with the scenarios solved by it, and every API a train expert calls."""
    rng = random.Random(seed)
    specs = list(provider.tasks("train"))
    specs += [draw_instance(provider, s, rng) for s in provider.procedural_scenarios() for _ in range(instances)]
    patterns: Patterns = defaultdict(set)
    apis: set[str] = set()
    for spec in specs:
        seq = calls(provider, spec)
        patterns[pattern(seq)].add(spec.scenario_id)
        apis.update(seq)
    return patterns, apis


def reach(provider: ProceduralWorld, instances: int, seed: int, dev_limit: int | None) -> dict[str, Any]:
    patterns, seen_apis = train_calls(provider, instances, seed)
    dev = provider.tasks("dev")[:dev_limit]
    scenarios: dict[str, dict[str, Any]] = {}
    lengths: list[int] = []
    for spec in dev:
        seq = calls(provider, spec)
        lengths.append(len(seq))
        row = scenarios.setdefault(
            spec.scenario_id,
            {"tasks": 0, "calls": [], "same_pattern_as": set(), "unseen_apis": set(), "difficulty": spec.difficulty},
        )
        row["tasks"] += 1
        row["calls"].append(len(seq))
        row["same_pattern_as"] |= patterns.get(pattern(seq), set())
        row["unseen_apis"] |= {c for c in seq if c not in seen_apis}
    for row in scenarios.values():
        row["same_pattern_as"] = sorted(row["same_pattern_as"])
        row["unseen_apis"] = sorted(row["unseen_apis"])
    return {
        "scenarios": scenarios,
        "lengths": lengths,
        "train_patterns": len(patterns),
        "train_apis": len(seen_apis),
    }


def section(result: dict[str, Any], scenarios: dict[str, dict[str, Any]], command: str) -> str:
    rows = [
        f"| {name} | {r['difficulty']} | {r['tasks']} | {min(r['calls'])}-{max(r['calls'])} | "
        f"{', '.join(r['same_pattern_as']) or '-'} | {', '.join(r['unseen_apis']) or '-'} |"
        for name, r in scenarios.items()
    ]
    t = result
    return (
        "## What train scenarios teach of dev (`bench/dev_reach.py`)\n\n"
        f"`{command}`\n\n"
        f"World `{t['world']}`; no model: the oracle's solutions of the {t['dev_tasks']} dev tasks against "
        f"those of the train split and {t['instances']} fresh instances of every train scenario "
        f"({t['train_patterns']} call sequences, {t['train_apis']} APIs). *Same calls as*: the train scenarios "
        "solved by the same sequence of calls (a call repeated back to back counted once), so that only the "
        "arguments differ; *APIs no train expert calls*: what training never shows the agent calling.\n\n"
        "| dev scenario | difficulty | tasks | calls | same calls as (train) | APIs no train expert calls |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        f"{t['same_pattern_tasks']} of {t['dev_tasks']} dev tasks are solved by a call sequence some train "
        f"scenario is solved by; {t['unseen_api_tasks']} call an API no train expert calls; "
        f"{t['dev_tasks'] - t['unseen_api_tasks']} use only APIs training shows. A dev task takes "
        f"{t['calls_per_task']} calls on average (oracle, `complete_task` included). For dev TGC "
        f"{t['target_tgc']:g} with steps right independently, each step would have to be right "
        f"{t['step_agreement_needed']} % of the time (the mean of p^n over dev tasks = {t['target_tgc']:g} %); "
        "steps are not independent, so this is the order of the agreement needed, not a bound.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", default="builtin", help="a world with procedural train scenarios")
    ap.add_argument("--instances", type=int, default=3, help="fresh instances of each train scenario")
    ap.add_argument("--seed", type=int, default=SEED, help="the fresh instances' draw")
    ap.add_argument("--target", type=float, default=20.0, help="the dev TGC (percent) to ask the agreement for")
    ap.add_argument("--quick", action="store_true", help="one instance per train scenario, six dev tasks")
    ap.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    if args.instances < 1:
        ap.error(f"--instances must be 1 or more, not {args.instances}")
    if not 0 < args.target < 100:
        ap.error(f"--target is a TGC in percent, between 0 and 100 (exclusive), not {args.target:g}")
    try:
        provider = get_world(args.world)
    except KeyError as exc:
        ap.error(str(exc))
    if not isinstance(provider, ProceduralWorld) or not provider.procedural_scenarios():
        ap.error(f"world {args.world!r} has no procedural train scenarios to draw instances of")
    if args.quick:
        args.instances = 1
    t0 = time.perf_counter()
    found = reach(provider, args.instances, args.seed, 6 if args.quick else None)
    scenarios, lengths = found["scenarios"], found["lengths"]
    result = {
        "world": args.world,
        "instances": args.instances,
        "dev_tasks": len(lengths),
        "dev_scenarios": len(scenarios),
        "same_pattern_tasks": sum(r["tasks"] for r in scenarios.values() if r["same_pattern_as"]),
        "unseen_api_tasks": sum(r["tasks"] for r in scenarios.values() if r["unseen_apis"]),
        "calls_per_task": round(sum(lengths) / len(lengths), 2),
        "target_tgc": args.target,
        "step_agreement_needed": round(100 * agreement_needed(lengths, args.target / 100), 1),
        "train_patterns": found["train_patterns"],
        "train_apis": found["train_apis"],
        "scenarios": scenarios,
    }
    print(f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.write_docs:
        command = "python bench/dev_reach.py" + (f" --world {args.world}" if args.world != "builtin" else "")
        command += f" --instances {args.instances}" if args.instances != 3 else ""
        command += f" --target {args.target:g}" if args.target != 20 else ""
        write_section("dev_reach", section(result, scenarios, command + " --write-docs"))
    emit(result)


if __name__ == "__main__":
    main()
