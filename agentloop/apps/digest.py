"""Fingerprints of a world's tasks: what a task ref stands for (its initial state, instruction, expected
outcome, and the oracle's run with its verdict), as a digest two processes, machines or days can compare.

A world is meant to be a pure function of its seed and its frozen "now"; stored episodes are replayed
and dev/test figures compared on that promise, and these digests are how it is checked.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agentloop.apps.evaluation import StateEvaluator
from agentloop.apps.registry import WorldProvider
from agentloop.apps.tasks import TaskSpec, run_oracle


def canonical(value: Any) -> str:
    """JSON in the value's own order (a list's or a dict's insertion order is part of a world: APIs list
    records in it); anything that is not plain JSON is an error rather than a repr with an address in it."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def sha256(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode()).hexdigest()


def _expected_answer(answer: Any) -> Any:
    if callable(answer):
        return "<matcher>"  # judged through the verdict on the oracle's answer below
    try:
        canonical(answer)
    except (TypeError, ValueError):
        return "<none>"  # NO_ANSWER: not a question
    return answer


def task_fingerprint(provider: WorldProvider, task: TaskSpec) -> dict[str, Any]:
    """Everything a task ref fixes, run once with the task's oracle."""
    world = provider.task_world(task.id)
    try:
        before = world.copy_state()
        initial = sha256(before)
        run = run_oracle(task, world)
        verdict = task.evaluator.evaluate(before, world.state, world.answer)
    finally:
        world.close()
    judged = task.evaluator if isinstance(task.evaluator, StateEvaluator) else None  # else: the verdict says
    return {
        "task": task.id,
        "initial_state": initial,
        "instruction": task.instruction,
        "apps": list(task.apps),
        "expectations": [[e.kind, e.app, e.table, e.key, e.describe()] for e in judged.expectations] if judged else [],
        "expected_answer": _expected_answer(judged.answer) if judged else "<none>",
        "oracle_actions": [a.to_dict() for a in run.actions],
        "oracle_answer": run.answer,
        "final_state": sha256(world.state),
        "verdict": verdict.to_dict(),
    }


def task_digests(provider: WorldProvider, split: str | None = None) -> dict[str, str]:
    """Task ref → digest of its fingerprint, for every task of the split (all splits when None)."""
    return {task.id: sha256(task_fingerprint(provider, task)) for task in provider.tasks(split)}


def world_digest(digests: dict[str, str]) -> str:
    """One digest over the per-task digests."""
    return sha256(sorted(digests.items()))
