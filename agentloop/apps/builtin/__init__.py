"""The built-in world: apps with real state generated from a seed, and task scenarios over them."""

from __future__ import annotations

import pickle
import random
from collections.abc import Mapping, Sequence
from functools import cached_property, lru_cache

from agentloop.apps.base import AppSpec
from agentloop.apps.builtin.apps import discover as discover_apps
from agentloop.apps.builtin.apps import supervisor
from agentloop.apps.builtin.people import NOW, make_world_data
from agentloop.apps.evaluation import StateEvaluator
from agentloop.apps.tasks import Scenario, TaskSpec, task_seed
from agentloop.apps.world import ALWAYS_AVAILABLE, World, WorldState, add_login_api


def _apps() -> dict[str, AppSpec]:
    specs = discover_apps()
    for spec in specs:
        if spec.login and "login" not in spec.apis:
            add_login_api(spec)
    return {s.name: s for s in specs}


APPS: dict[str, AppSpec] = _apps()


@lru_cache(maxsize=64)
def _base_state(seed: int) -> bytes:
    data = make_world_data(seed)
    account_apps = [name for name, spec in APPS.items() if spec.login]
    state: WorldState = {"api_docs": {}, "supervisor": supervisor.build_state(data, account_apps)}
    for name, spec in APPS.items():
        if spec.build_state is not None:
            state[name] = spec.build_state(data)
    return pickle.dumps(state)


def _visible(available: Sequence[str]) -> list[str]:
    return list(ALWAYS_AVAILABLE) + [a for a in available if a not in ALWAYS_AVAILABLE]


class BuiltinWorld:
    """The world provider for `world="builtin"`."""

    name = "builtin"

    @property
    def apps(self) -> Mapping[str, AppSpec]:
        return APPS

    def new_world(self, seed: int, available: Sequence[str]) -> World:
        unknown = [a for a in available if a not in APPS]
        if unknown:
            raise KeyError(f"unknown built-in app(s): {', '.join(unknown)}")
        state = pickle.loads(_base_state(seed))
        return World(name=self.name, seed=seed, now=NOW, apps=APPS, state=state, available=_visible(available))

    @cached_property
    def scenarios(self) -> list[Scenario]:
        from agentloop.apps.builtin.scenarios import discover

        return discover()

    @cached_property
    def _tasks(self) -> dict[str, tuple[TaskSpec, bytes]]:
        tasks: dict[str, tuple[TaskSpec, bytes]] = {}
        volatile = {name: spec.volatile_fields for name, spec in APPS.items()}
        for sc in self.scenarios:
            for variant in range(1, sc.variants + 1):
                task_id = f"{sc.id}-{variant}"
                seed = task_seed(task_id)
                world = self.new_world(seed, sc.apps)
                inst = sc.setup(world, random.Random(seed))
                spec = TaskSpec(
                    id=task_id,
                    scenario_id=sc.id,
                    split=sc.split,
                    difficulty=sc.difficulty,
                    instruction=inst.instruction,
                    apps=sc.apps,
                    seed=seed,
                    evaluator=StateEvaluator(tuple(inst.expectations), inst.answer, volatile),
                    oracle=inst.oracle,
                )
                tasks[task_id] = (spec, world.snapshot())
        return tasks

    def tasks(self, split: str | None = None) -> list[TaskSpec]:
        return [t for t, _ in self._tasks.values() if split is None or t.split == split]

    def task(self, task_id: str) -> TaskSpec:
        try:
            return self._tasks[task_id][0]
        except KeyError:
            raise KeyError(f"unknown built-in task {task_id!r}") from None

    def task_world(self, task_id: str) -> World:
        """A fresh world in the task's initial state."""
        spec, snap = self._tasks[task_id]
        return World.from_snapshot(self.name, spec.seed, NOW, APPS, _visible(spec.apps), snap)


BUILTIN = BuiltinWorld()
