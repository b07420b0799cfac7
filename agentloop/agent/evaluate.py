"""Evaluation runs: a policy over a set of tasks, K episodes each, batched through one generate call
per round; TGC (tasks fully solved) and SGC (scenarios whose tasks are all solved) per split and
difficulty. `agentloop eval` is the command; the learner uses the same code to gate adapters."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentloop.agent.behaviour import behaviour
from agentloop.agent.episode import Episode, Limits, run_episodes
from agentloop.agent.examples import example_for
from agentloop.agent.prompt import ChatFormat
from agentloop.apps.evaluation import Evaluator, Verdict
from agentloop.apps.remote_env import EnvironmentFailure
from agentloop.apps.tasks import ToolCall
from agentloop.apps.world import World, WorldState
from agentloop.policy.base import Policy


@runtime_checkable
class Releasing(Protocol):
    """An evaluator whose episode holds state elsewhere (an external app's), freed when the episode ends."""

    def release(self) -> None: ...


@dataclass
class EvalTask:
    """One task as evaluation needs it, whatever world it comes from."""

    task_ref: str
    scenario: str
    split: str
    difficulty: int
    instruction: str
    start: Callable[[], tuple[World, Evaluator]]  # a fresh world in the task's initial state
    # the expert's calls for an episode that starts in the given world (left unchanged), where an expert exists:
    # the oracle solves a scratch copy of it (a world whose setup varies from load to load, ScienceWorld's,
    # has its solution generated with it)
    expert: Callable[[World], list[ToolCall]] | None = None
    world: str = ""  # the world provider's name ("": an app's tasks): where a `nearest` worked example comes from


@dataclass
class EpisodeResult:
    task: EvalTask
    repetition: int
    verdict: Verdict | None  # None: not evaluated (`error` says why); such a result has no reward at all
    episode: Episode
    error: str | None = None

    @property
    def success(self) -> bool:
        return self._verdict().success

    @property
    def reward(self) -> float:
        return self._verdict().reward

    def _verdict(self) -> Verdict:
        if self.verdict is None:  # never a zero: callers leave errors out of metrics and training
            raise ValueError(f"episode {self.task.task_ref}#{self.repetition} was not evaluated: {self.error}")
        return self.verdict


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
    before it starts (the oracle policy uses it to queue the expert's calls). An episode an external app
    could not evaluate is a result with `error` and no verdict; an app that cannot be reset raises
    (EnvironmentFailure)."""
    fmt = ChatFormat(policy.tokenizer)
    jobs = [(task, rep) for rep in range(k) for task in tasks]
    results: list[EpisodeResult] = []
    for start in range(0, len(jobs), batch_size):
        batch: list[_Running] = []
        try:
            for task, rep in jobs[start : start + batch_size]:
                world, evaluator = task.start()
                example = example_for(task.world, task.instruction, world.available)
                ep = Episode(
                    world, fmt, task.instruction, limits, adapter=adapter, key=f"{task.task_ref}#{rep}", example=example
                )
                batch.append(_Running(task, rep, ep, evaluator, world.copy_state()))
                if prepare is not None:
                    prepare(ep, task)
            run_episodes(policy, [r.episode for r in batch])
            for r in batch:
                result = _evaluated(r)
                results.append(result)
                if on_result is not None:
                    on_result(result)
        finally:  # ended however the batch did: external apps and simulators may free the episodes' state
            for r in batch:
                try:
                    if isinstance(r.evaluator, Releasing):
                        r.evaluator.release()
                finally:
                    r.episode.world.close()
    return results


def _evaluated(r: _Running) -> EpisodeResult:
    world = r.episode.world
    try:
        verdict = r.evaluator.evaluate(r.before, world.state, world.answer)
    except EnvironmentFailure as exc:
        return EpisodeResult(r.task, r.repetition, None, r.episode, error=exc.message)
    return EpisodeResult(r.task, r.repetition, verdict, r.episode)


# --- metrics ------------------------------------------------------------------------------------


def scored(results: Sequence[EpisodeResult]) -> list[EpisodeResult]:
    """The results that have a reward: an episode the app could not evaluate counts in no metric."""
    return [r for r in results if r.verdict is not None]


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


def _scenario_block(results: Sequence[EpisodeResult]) -> dict[str, Any]:
    return {
        "tgc": round(tgc(results), 2),
        "mean_reward": round(sum(r.reward for r in results) / len(results), 4),
        "episodes": len(results),
    }


def summarize(results: Sequence[EpisodeResult]) -> dict[str, Any]:
    """Overall, per split, per difficulty and per scenario (a ScienceWorld task type; over evaluated episodes
    only), plus how episodes ended, how many could not be evaluated (`errors`) and which tasks were solved
    (`solved`: the refs of tasks that at least one of their episodes passed, sorted)."""
    by_split: dict[str, list[EpisodeResult]] = defaultdict(list)
    by_difficulty: dict[int, list[EpisodeResult]] = defaultdict(list)
    by_scenario: dict[str, list[EpisodeResult]] = defaultdict(list)
    finish: dict[str, int] = defaultdict(int)
    evaluated = scored(results)
    for r in evaluated:
        by_split[r.task.split].append(r)
        by_difficulty[r.task.difficulty].append(r)
        by_scenario[r.task.scenario].append(r)
    for r in results:
        finish[r.episode.finish_reason or "unknown"] += 1
    return {
        **_block(evaluated),
        "errors": len(results) - len(evaluated),
        "splits": {s: _block(rs) for s, rs in sorted(by_split.items())},
        "difficulty": {str(d): _block(rs) for d, rs in sorted(by_difficulty.items())},
        "by_scenario": {sc: _scenario_block(rs) for sc, rs in sorted(by_scenario.items())},
        "finish_reasons": dict(sorted(finish.items())),
        "solved": sorted({r.task.task_ref for r in evaluated if r.success}),
        "mean_turns": round(sum(len(r.episode.turns) for r in results) / len(results), 2) if results else 0.0,
        "tokens_generated": sum(r.episode.tokens_generated for r in results),
        "behaviour": behaviour([r.episode.turns for r in results]),
    }
