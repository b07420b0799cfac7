"""World providers by name: the built-in world, and worlds that packages add through the
`agentloop.worlds` entry-point group."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Protocol, runtime_checkable

from agentloop.apps.base import AppSpec
from agentloop.apps.tasks import TaskSpec
from agentloop.apps.world import World


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
