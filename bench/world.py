"""World speed.

    python bench/world.py [--world builtin|scienceworld] [--quick] [--write-docs]

builtin: building a world from its seed, loading a task's initial state, and evaluating a finished episode
(state diff + tests), over every task. Targets: a world loads in < 0.5 s; evaluating a task takes < 50 ms.

scienceworld: starting a simulator (a JVM); resetting one from the pool to a dev variation (load, gold path,
`look around`: what every episode's world costs) and a step (one command), p50/p99, over a dev variation of
every task type played along its gold path; and whole episodes per minute on the short task types (gold
paths of at most SHORT_STEPS commands): the oracle (no model: the environment's and the loop's cost alone)
vs the default model (greedy), measured one after the other in one run, with the model episodes' time split
into generation and environment.

Last line: a JSON object.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from agentloop.agent.episode import Limits
from agentloop.agent.eval_runs import oracle_preparer, world_tasks
from agentloop.agent.evaluate import run_eval
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


def percentiles_ms(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    at = lambda q: round(1000 * values[min(len(values) - 1, int(q * len(values)))], 2)  # noqa: E731
    return {"p50_ms": at(0.5), "p99_ms": at(0.99), "n": len(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", choices=("builtin", "scienceworld"), default="builtin")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="builtin: 8 seeds, 60 tasks; scienceworld: 4 task types, 2 episodes of 3 turns each way",
    )
    ap.add_argument("--model", default=None, help="scienceworld: model name or directory (default: AGENTLOOP_MODEL)")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    emit(scienceworld(args) if args.world == "scienceworld" else builtin(args))


def builtin(args: argparse.Namespace) -> dict[str, Any]:
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
    return result


# --- ScienceWorld -----------------------------------------------------------------------------------------------

SHORT_STEPS = 12  # a short task type: the gold path of its first train variation has at most this many commands
SW_LIMITS = Limits(
    max_turns=16, max_new_tokens=32, observation_max_tokens=1024, max_context_tokens=8192, temperature=0.0
)


def scienceworld(args: argparse.Namespace) -> dict[str, Any]:
    from agentloop.apps import scienceworld as sw
    from agentloop.policy.local import LocalPolicy
    from agentloop.policy.models import load_model_and_tokenizer, resolve_model_dir
    from agentloop.policy.scripted import ScriptedPolicy
    from agentloop.settings import get_settings

    reason = sw.missing()
    if reason is not None:
        raise SystemExit(f"bench/world.py --world scienceworld: {reason}")
    provider = sw.ScienceWorld()
    gold_steps = provider.catalogue.gold_steps
    types = sorted(gold_steps)
    if args.quick:
        types = sorted(types, key=lambda t: gold_steps[t])[:4]
    dev = {t.scenario_id: t for t in reversed(provider.tasks("dev"))}  # each type's first dev variation

    sw.POOL.close_all()
    starts = []
    for _ in range(1 if args.quick else 3):  # a cold simulator: a JVM and its gateway
        t0 = time.perf_counter()
        sim = sw.Simulator()
        starts.append(time.perf_counter() - t0)
        sw.POOL.release(sim)

    resets, steps, completed = [], [], 0
    for task_type in types:
        t0 = time.perf_counter()
        world = provider.task_world(dev[task_type].id)
        resets.append(time.perf_counter() - t0)
        try:
            for command in world.gold:
                t0 = time.perf_counter()
                world.run(command)
                steps.append(time.perf_counter() - t0)
            completed += bool(world.state[sw.NAME]["progress"]["1"]["completed"])
        finally:
            world.close()

    settings = get_settings()
    model_dir = resolve_model_dir(args.model or settings.model, settings.models_dir)
    model, tok = load_model_and_tokenizer(model_dir, settings.model_dtype, settings.device)
    short = sorted(t for t, n in gold_steps.items() if n <= SHORT_STEPS)
    tasks = [t for t in world_tasks(provider, "dev") if t.scenario in short]
    tasks = tasks[:: max(1, len(tasks) // (2 if args.quick else 8))][: 2 if args.quick else 8]
    limits = Limits(**{**SW_LIMITS.__dict__, "max_turns": 3}) if args.quick else SW_LIMITS
    batch = 4

    oracle = ScriptedPolicy(tok, name="oracle")
    t0 = time.perf_counter()
    oracle_runs = run_eval(oracle, tasks, 1, limits, batch, prepare=oracle_preparer(oracle))
    oracle_s = time.perf_counter() - t0
    policy = LocalPolicy(model, tok, name=str(model_dir), max_batch_size=batch, seed=0)
    t0 = time.perf_counter()
    model_runs = run_eval(policy, tasks, 1, limits, batch)
    model_s = time.perf_counter() - t0

    def turns(runs: list[Any]) -> list[Any]:
        return [turn for r in runs for turn in r.episode.turns]

    gen_s = sum(turn.gen_s for turn in turns(model_runs))
    env_s = sum(turn.env_s for turn in turns(model_runs))
    result = {
        "world": "scienceworld",
        "simulator_start_s": round(statistics.fmean(starts), 2),
        "reset": percentiles_ms(resets),
        "step": percentiles_ms(steps),
        "gold_paths_completed": f"{completed}/{len(types)}",
        "episode_tasks": [t.task_ref for t in tasks],
        "max_turns": limits.max_turns,
        "oracle_episodes_per_min": round(60 * len(oracle_runs) / oracle_s, 2),
        "oracle_turns": len(turns(oracle_runs)),
        "oracle_mean_reward": round(statistics.fmean(r.verdict.reward for r in oracle_runs), 3),
        "model_episodes_per_min": round(60 * len(model_runs) / model_s, 2),
        "model_turns": len(turns(model_runs)),
        "model_mean_reward": round(statistics.fmean(r.verdict.reward for r in model_runs), 3),
        "model_time_share": {"generate": round(gen_s / model_s, 3), "environment": round(env_s / model_s, 3)},
        "oracle_vs_model_episode_rate": round((len(oracle_runs) / oracle_s) / (len(model_runs) / model_s), 1),
        "model": model_dir.name,
        "quick": args.quick,
    }
    if args.write_docs:
        cmd = "python bench/world.py --world scienceworld" + (" --quick" if args.quick else "")
        r = result
        timing = "\n".join(
            f"| {what} | {r[key]['p50_ms']} | {r[key]['p99_ms']} | {r[key]['n']} |"
            for what, key in [
                ("reset a pooled simulator to a dev variation (load, its gold path, `look around`)", "reset"),
                ("one step (a command of the gold path)", "step"),
            ]
        )
        write_section(
            "world_scienceworld",
            f"""
## ScienceWorld speed (`bench/world.py --world scienceworld`)

`{cmd}` on {machine()}; model `{r["model"]}`.

| what | p50 ms | p99 ms | n |
|---|---|---|---|
{timing}

A cold simulator (a JVM) starts in {r["simulator_start_s"]} s; episodes borrow started ones from the pool.
The gold paths played completed {r["gold_paths_completed"]} task types' first dev variation.

Whole episodes on {len(tasks)} dev variations of the short task types (gold paths of at most {SHORT_STEPS}
commands), at most {r["max_turns"]} turns, {batch} at a time, one after the other in this run:

| policy | episodes / min | turns | mean score / 100 |
|---|---|---|---|
| oracle (gold path; no model) | {r["oracle_episodes_per_min"]} | {r["oracle_turns"]} | {r["oracle_mean_reward"]} |
| {r["model"]} (greedy) | {r["model_episodes_per_min"]} | {r["model_turns"]} | {r["model_mean_reward"]} |

The oracle runs {r["oracle_vs_model_episode_rate"]}x as many episodes a minute; of the model episodes' wall
time, generation takes {round(100 * r["model_time_share"]["generate"])} % and the simulator
{round(100 * r["model_time_share"]["environment"])} %.
""",
        )
    return result


if __name__ == "__main__":
    main()
