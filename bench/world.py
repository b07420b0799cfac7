"""Built-in world speed: building a world from its seed, loading a task's initial state, and
evaluating a finished episode (state diff + tests), over every task.

    python bench/world.py [--quick] [--write-docs]

Targets: a world loads in < 0.5 s; evaluating a task takes < 50 ms. Last line: a JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import time

from agentloop.apps.builtin import BUILTIN, _base_state
from agentloop.apps.tasks import run_oracle

from report import emit, machine, write_section


def stats_ms(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "mean_ms": round(1000 * statistics.fmean(values), 2),
        "p95_ms": round(1000 * values[int(0.95 * (len(values) - 1))], 2),
        "max_ms": round(1000 * values[-1], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 seeds, 60 tasks")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()

    seeds = range(1000, 1008 if args.quick else 1040)
    build = []
    for seed in seeds:  # uncached: generate people and every app's data from the seed
        t0 = time.perf_counter()
        _base_state.__wrapped__(seed)
        build.append(time.perf_counter() - t0)

    tasks = BUILTIN.tasks()
    if args.quick:
        tasks = tasks[:: max(1, len(tasks) // 60)]
    load, evaluate = [], []
    for task in tasks:
        t0 = time.perf_counter()
        world = BUILTIN.task_world(task.id)
        load.append(time.perf_counter() - t0)
        before = world.copy_state()
        run_oracle(task, world)
        t0 = time.perf_counter()
        verdict = task.evaluator.evaluate(before, world.state, world.answer)
        evaluate.append(time.perf_counter() - t0)
        assert verdict.success, task.id

    result = {
        "world_build": stats_ms(build),
        "task_load": stats_ms(load),
        "evaluate": stats_ms(evaluate),
        "world_build_max_s": round(max(build), 3),
        "evaluate_max_ms": round(1000 * max(evaluate), 2),
        "seeds": len(build),
        "tasks": len(tasks),
        "quick": args.quick,
    }
    if args.write_docs:
        cmd = "python bench/world.py" + (" --quick" if args.quick else "")
        rows = "\n".join(
            f"| {name} | {result[key]['mean_ms']} | {result[key]['p95_ms']} | {result[key]['max_ms']} |"
            for name, key in [
                (f"build a world from its seed ({len(build)} seeds, uncached)", "world_build"),
                (f"load a task's initial state ({len(tasks)} tasks)", "task_load"),
                (f"evaluate a finished episode ({len(tasks)} tasks, oracle runs)", "evaluate"),
            ]
        )
        write_section(
            "world",
            f"""
## Built-in world speed (`bench/world.py`)

`{cmd}` on {machine()}. Targets: a world loads in < 500 ms, a task evaluates in < 50 ms.

| step | mean ms | p95 ms | max ms |
|---|---|---|---|
{rows}
""",
        )
    emit(result)


if __name__ == "__main__":
    main()
