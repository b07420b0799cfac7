"""Worked examples chosen per task (`prompt_example: nearest`): the solved task most like the one at hand is
the example shown before it, instead of the world's one fixed example.

A small model copies the form of the example in its prompt far better than it recalls what training taught
it. The fixed example (one notes task) shows the format of a call; an example that uses the same apps shows
the moves as well: which app to log in to, which API finds the thing the task names, which ids to pass on.

The bank holds solved tasks of a procedural world: `per_scenario` instances of each train scenario on seeds
drawn from BANK_SEED (no bench or test trains on those), each played with its oracle so that every call
comes with what the world returned. `nearest` scores a task's apps against the apps each example calls
(Jaccard), then its instruction's words (cosine), and takes the best example whose calls and answers fit in
`max_chars`. Training excludes the task's own scenario (what it learns is to carry an example over to another
kind of task, which is what dev and served tasks need); serving and evaluation take the best there is.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from agentloop.apps.registry import ProceduralWorld, UnknownWorld, WorldProvider, draw_instance, get_world
from agentloop.apps.tasks import ScenarioSetupError
from agentloop.apps.world_prompt import ExampleStep, WorkedExample

BANK_SEED = 777
NOT_SCORED = frozenset({"api_docs", "supervisor"})  # every task may use them: they tell no task from another
_WORDS = re.compile(r"[a-z]+")


def words(text: str) -> Counter[str]:
    return Counter(w for w in _WORDS.findall(text.lower()) if len(w) > 2)


def cosine(a: Counter[str], b: Counter[str]) -> float:
    norm = math.sqrt(sum(v * v for v in a.values()) * sum(v * v for v in b.values()))
    return sum(n * b[w] for w, n in a.items()) / norm if norm else 0.0


@dataclass(frozen=True)
class Banked:
    scenario: str
    apps: frozenset[str]  # the apps its calls use, less NOT_SCORED
    words: Counter[str]
    example: WorkedExample
    chars: int  # its calls' arguments and answers as JSON: about what it adds to a prompt


class ExampleBank:
    def __init__(self, examples: Sequence[Banked], max_chars: int) -> None:
        self.examples = list(examples)
        self.max_chars = max_chars

    @classmethod
    def from_oracle(cls, provider: WorldProvider, per_scenario: int, max_chars: int) -> ExampleBank:
        """`per_scenario` solved instances of each train scenario of a procedural world (none for another)."""
        if not isinstance(provider, ProceduralWorld) or per_scenario < 1:
            return cls([], max_chars)
        rng = random.Random(BANK_SEED)
        examples = []
        for scenario in provider.procedural_scenarios():
            for _ in range(per_scenario):
                try:
                    spec = draw_instance(provider, scenario, rng)
                except ScenarioSetupError:
                    continue
                examples.append(solved(provider, spec))
        return cls(examples, max_chars)

    def nearest(
        self, instruction: str, apps: Iterable[str], exclude_scenario: str | None = None
    ) -> WorkedExample | None:
        """The example most like a task with this instruction and these apps; None when the bank has none."""
        wanted, query = frozenset(apps) - NOT_SCORED, words(instruction)
        pool = [e for e in self.examples if e.scenario != exclude_scenario]
        fitting = [e for e in pool if e.chars <= self.max_chars] or pool
        if not fitting:
            return None

        def score(e: Banked) -> float:
            overlap = len(wanted & e.apps) / max(1, len(wanted | e.apps))
            return overlap + 0.5 * cosine(query, e.words)

        return max(fitting, key=score).example


def solved(provider: WorldProvider, spec: object) -> Banked:
    """A task played with its oracle: each call and what the world returned."""
    from agentloop.agent.eval_runs import eval_task

    task = eval_task(provider, spec)  # type: ignore[arg-type]
    world, _ = task.start()
    try:
        assert task.expert is not None, f"{task.task_ref} has no oracle"
        steps = [ExampleStep(call, world.call(call.app, call.api, call.args)) for call in task.expert(world)]
    finally:
        world.close()
    used = frozenset(step.call.app for step in steps) - NOT_SCORED
    chars = sum(len(json.dumps(s.call.args, default=str)) + len(json.dumps(s.observation, default=str)) for s in steps)
    return Banked(task.scenario, used, words(task.instruction), WorkedExample(task.instruction, tuple(steps)), chars)


@cache
def world_bank(world: str, per_scenario: int, max_chars: int) -> ExampleBank:
    """The bank of a world, built once per process (a few seconds for the built-in world); empty for a name
    that is no world (an app's tasks)."""
    try:
        provider = get_world(world)
    except UnknownWorld:
        return ExampleBank([], max_chars)
    return ExampleBank.from_oracle(provider, per_scenario, max_chars)


def example_for(
    world: str, instruction: str, apps: Iterable[str], exclude_scenario: str | None = None
) -> WorkedExample | None:
    """The worked example for a task under the settings: None (the world's own) unless `prompt_example` is
    `nearest` and the world has a bank."""
    from agentloop.settings import get_settings

    settings = get_settings()
    if settings.prompt_example != "nearest" or not world:
        return None
    bank = world_bank(world, settings.example_bank_per_scenario, settings.example_max_chars)
    return bank.nearest(instruction, apps, exclude_scenario)
