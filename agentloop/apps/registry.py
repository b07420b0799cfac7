"""World providers by name: the built-in world, and worlds that packages add through the
`agentloop.worlds` entry-point group."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Protocol, runtime_checkable

from agentloop.apps.base import AppSpec
from agentloop.apps.tasks import SEED_LIMIT, ScenarioSetupError, TaskSpec, procedural_ref
from agentloop.apps.world import World

SEED_DRAWS = 8  # seeds tried for a drawn scenario before its setup failing is taken for a broken scenario


class WorldProvider(Protocol):
    """A world by name. The worlds it builds may carry `prompt` (`World(..., prompt=...)`): its persona,
    conventions and worked example for the agent's prompt; without it they get the neutral prompt."""

    name: str

    @property
    def apps(self) -> Mapping[str, AppSpec]: ...

    def new_world(self, seed: int, available: Sequence[str]) -> World: ...

    def tasks(self, split: str | None = None) -> list[TaskSpec]: ...

    def task(self, task_id: str) -> TaskSpec: ...

    def task_world(self, task_id: str) -> World: ...


@runtime_checkable
class ProceduralWorld(WorldProvider, Protocol):
    """A world whose train scenarios also take refs `<scenario>@<seed>` (`procedural_ref`): the scenario set
    up on a world of that seed, which `task` and `task_world` resolve like a listed task (the built-in world)."""

    def procedural_scenarios(self) -> list[str]: ...


def draw_instance(provider: ProceduralWorld, scenario: str, rng: random.Random) -> TaskSpec:
    """`scenario` set up on a seed drawn from `rng`; a seed its setup finds nothing on is drawn again, up to
    SEED_DRAWS times, then ScenarioSetupError with the last reason."""
    failures: list[str] = []
    for _ in range(SEED_DRAWS):
        try:
            return provider.task(procedural_ref(scenario, rng.randrange(SEED_LIMIT)))
        except ScenarioSetupError as exc:
            failures.append(str(exc))
    raise ScenarioSetupError(
        f"scenario {scenario!r} of world {provider.name!r} could not be set up on {SEED_DRAWS} seeds in a row, "
        f"the last: {failures[-1]}"
    )


def fresh_instances(provider: WorldProvider, n: int, seed: int) -> list[TaskSpec]:
    """`n` new instances of the world's train scenarios, each scenario in turn (their listed order), on seeds
    drawn from `random.Random(seed)`: the kinds of task training sees, with people and values it has not. A
    world without procedural scenarios is a ValueError."""
    if not isinstance(provider, ProceduralWorld) or not provider.procedural_scenarios():
        raise ValueError(
            f"world {provider.name!r} has no procedural train scenarios (refs '<scenario>@<seed>'), so it has no "
            "fresh instances: evaluate a split or named task refs"
        )
    if n < 1:
        raise ValueError(f"fresh instances: n must be 1 or more, not {n}")
    scenarios = provider.procedural_scenarios()
    rng = random.Random(seed)
    return [draw_instance(provider, scenarios[i % len(scenarios)], rng) for i in range(n)]


class UnknownWorld(KeyError):
    pass


def why_no_task(exc: KeyError, task_ref: str) -> str:
    """What a provider's KeyError for `task_ref` says, or "" when it only repeats the ref (a bare lookup)."""
    reason = str(exc.args[0]) if exc.args else ""
    return "" if reason == task_ref else reason


@lru_cache(maxsize=1)
def worlds() -> dict[str, WorldProvider]:
    from importlib.metadata import entry_points

    from agentloop.apps.builtin import BUILTIN

    found: dict[str, WorldProvider] = {BUILTIN.name: BUILTIN}
    for ep in entry_points(group="agentloop.worlds"):
        provider = ep.load()
        provider = provider() if isinstance(provider, type) else provider
        found[provider.name] = provider
    return found


def get_world(name: str) -> WorldProvider:
    try:
        return worlds()[name]
    except KeyError:
        raise UnknownWorld(f"unknown world {name!r}; known: {', '.join(sorted(worlds()))}") from None
