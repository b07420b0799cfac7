"""Write agentloop/apps/scienceworld_tasks.json from the ScienceWorld simulator: every task type's variations per
split (the benchmark's own), the instruction of each listed variation (`scienceworld.LISTED` per split), the
length of the gold path of each task type's first train variation (its difficulty), and the worked example of
the prompt (a train variation's gold path with what the simulator answered).

    python scripts/scienceworld_tasks.py [--out PATH] [--example TASK-VARIATION]

The simulator is deterministic, so the file is a pure function of the scienceworld package's version (kept in
the file); run it again after upgrading that package.
"""

from __future__ import annotations

import argparse
import json
import time
from importlib.metadata import version
from pathlib import Path

from agentloop.apps.scienceworld import LISTED, SPLITS, TASKS_FILE, Simulator, split_ref

EXAMPLE = "find-plant-1"  # a short train variation: ten commands, every kind of observation the agent meets early


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=TASKS_FILE)
    ap.add_argument("--example", default=EXAMPLE, help="the worked example's train variation")
    args = ap.parse_args()
    t0 = time.perf_counter()
    sim = Simulator()
    variations, instructions, gold_steps = {}, {}, {}
    for task_type in sim.task_types():
        splits = sim.variations(task_type)
        variations[task_type] = {s: splits[s] for s in SPLITS}
        for s in SPLITS:
            for v in splits[s][: LISTED[s]]:
                sim.load(task_type, v)
                instructions[f"{task_type}-{v}"] = sim.description()
        sim.load(task_type, splits["train"][0], gold=True)
        gold_steps[task_type] = len(sim.gold())
        print(f"[{time.perf_counter() - t0:6.1f}s] {task_type}: {sum(map(len, splits.values()))} variations")
    task_type, variation = split_ref(args.example)
    start = sim.load(task_type, variation, gold=True)
    steps = [{"command": "look around", "observation": start}]  # where the example agent starts
    for command in sim.gold():
        observation, _, completed = sim.step(command)
        steps.append({"command": command, "observation": observation})
        if completed:
            break
    else:
        raise SystemExit(f"the gold path of {args.example} does not complete it")
    sim.load(task_type, variation)
    example = {"task": args.example, "instruction": sim.description(), "steps": steps}
    sim.close()
    data = {
        "scienceworld_version": version("scienceworld"),
        "listed": LISTED,
        "variations": variations,
        "instructions": instructions,
        "gold_steps": gold_steps,
        "example": example,
    }
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    took = time.perf_counter() - t0
    print(f"{args.out}: {len(variations)} task types, {len(instructions)} listed tasks ({took:.0f} s)")


if __name__ == "__main__":
    main()
