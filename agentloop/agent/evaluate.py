"""Evaluation runs: a policy over a set of tasks, K episodes each, batched through one generate call
per round; TGC (tasks fully solved) and SGC (scenarios whose tasks are all solved) per split and
difficulty. `agentloop eval` is the command; the learner uses the same code to gate adapters."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentloop.agent.behaviour import behaviour
from agentloop.agent.episode import Episode, Limits, run_episodes
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.evaluation import Verdict
from agentloop.apps.tasks import ToolCall
from agentloop.apps.world import World, WorldState
from agentloop.policy.base import Policy


class Evaluator(Protocol):
    def evaluate(self, before: WorldState, after: WorldState, answer: str | None) -> Verdict: ...


@dataclass
class EvalTask:
    """One task as evaluation needs it, whatever world it comes from."""

    task_ref: str
    scenario: str
    split: str
    difficulty: int
    instruction: str
    start: Callable[[], tuple[World, Evaluator]]  # a fresh world in the task's initial state
    expert: Callable[[], list[ToolCall]] | None = None  # the oracle's calls, where one exists


@dataclass
class EpisodeResult:
    task: EvalTask
    repetition: int
    verdict: Verdict
    episode: Episode
    error: str | None = None

    @property
    def success(self) -> bool:
        return self.verdict.success

    @property
    def reward(self) -> float:
        return self.verdict.reward


@dataclass
class _Running:
    task: EvalTask
    repetition: int
    episode: Episode
    evaluator: Evaluator
    before: WorldState = field(repr=False)


def run_eval(
    policy: Policy,
    tasks: Sequence[EvalTask],
    k: int,
    limits: Limits,
    batch_size: int,
    on_result: Callable[[EpisodeResult], None] | None = None,
    adapter: str | None = None,
    prepare: Callable[[Episode, EvalTask], None] | None = None,
) -> list[EpisodeResult]:
    """Run every task k times, `batch_size` episodes at a time. `prepare` is called once per episode
    before it starts (the oracle policy uses it to queue the expert's calls)."""
    fmt = ChatFormat(policy.tokenizer)
    jobs = [(task, rep) for rep in range(k) for task in tasks]
    results: list[EpisodeResult] = []
    for start in range(0, len(jobs), batch_size):
        batch: list[_Running] = []
        for task, rep in jobs[start : start + batch_size]:
            world, evaluator = task.start()
            ep = Episode(world, fmt, task.instruction, limits, adapter=adapter, key=f"{task.task_ref}#{rep}")
            if prepare is not None:
                prepare(ep, task)
            batch.append(_Running(task, rep, ep, evaluator, world.copy_state()))
        run_episodes(policy, [r.episode for r in batch])
        for r in batch:
            world = r.episode.world
            verdict = r.evaluator.evaluate(r.before, world.state, world.answer)
            result = EpisodeResult(r.task, r.repetition, verdict, r.episode)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results


# --- metrics ------------------------------------------------------------------------------------


def tgc(results: Sequence[EpisodeResult]) -> float:
    """Task goal completion: % of episodes that passed every test."""
    return 100.0 * sum(r.success for r in results) / len(results) if results else 0.0


def sgc(results: Sequence[EpisodeResult]) -> float:
    """Scenario goal completion: % of scenarios all of whose tasks succeeded, averaged over repetitions."""
    if not results:
        return 0.0
    by_rep: dict[int, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        by_rep[r.repetition][r.task.scenario].append(r.success)
    per_rep = [100.0 * sum(all(v) for v in scen.values()) / len(scen) for scen in by_rep.values()]
    return sum(per_rep) / len(per_rep)


def _block(results: Sequence[EpisodeResult]) -> dict[str, Any]:
    return {
        "tgc": round(tgc(results), 2),
        "sgc": round(sgc(results), 2),
        "mean_reward": round(sum(r.reward for r in results) / len(results), 4) if results else 0.0,
        "episodes": len(results),
        "tasks": len({r.task.task_ref for r in results}),
        "scenarios": len({r.task.scenario for r in results}),
    }


def summarize(results: Sequence[EpisodeResult]) -> dict[str, Any]:
    """Overall, per split and per difficulty, plus how episodes ended."""
    by_split: dict[str, list[EpisodeResult]] = defaultdict(list)
    by_difficulty: dict[int, list[EpisodeResult]] = defaultdict(list)
    finish: dict[str, int] = defaultdict(int)
    for r in results:
        by_split[r.task.split].append(r)
        by_difficulty[r.task.difficulty].append(r)
        finish[r.episode.finish_reason or "unknown"] += 1
    return {
        **_block(results),
        "splits": {s: _block(rs) for s, rs in sorted(by_split.items())},
        "difficulty": {str(d): _block(rs) for d, rs in sorted(by_difficulty.items())},
        "finish_reasons": dict(sorted(finish.items())),
        "mean_turns": round(sum(len(r.episode.turns) for r in results) / len(results), 2) if results else 0.0,
        "tokens_generated": sum(r.episode.tokens_generated for r in results),
        "behaviour": behaviour([r.episode.turns for r in results]),
    }
