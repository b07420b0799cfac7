"""The built-in world: apps with real state generated from a seed, and task scenarios over them."""

from __future__ import annotations

import pickle
import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property, lru_cache

from agentloop.apps.base import AppSpec
from agentloop.apps.builtin.apps import discover as discover_apps
from agentloop.apps.builtin.apps import supervisor
from agentloop.apps.builtin.people import NOW, make_world_data
from agentloop.apps.builtin.prompt import builtin_prompt
from agentloop.apps.evaluation import StateEvaluator
from agentloop.apps.tasks import SEED_LIMIT, Scenario, ScenarioSetupError, TaskSpec, procedural_ref, task_seed
from agentloop.apps.world import ALWAYS_AVAILABLE, World, WorldState, add_login_api


def _apps() -> dict[str, AppSpec]:
    specs = discover_apps()
    for spec in specs:
        if spec.login and "login" not in spec.apis:
            add_login_api(spec)
    return {s.name: s for s in specs}


APPS: dict[str, AppSpec] = _apps()
VOLATILE = {name: spec.volatile_fields for name, spec in APPS.items()}
REDRAWS = 8  # setups tried for a variant before one repeating an earlier variant's instruction is kept
WORLD_POOL = 24  # tasks start from one of this many generated worlds (plus their own setup)
PROCEDURAL_CACHE = 512  # procedural tasks kept built (spec and initial state, about 150 kB each)


def world_seed(task_id: str) -> int:
    return zlib.crc32(f"world:{task_id}".encode()) % WORLD_POOL


@lru_cache(maxsize=WORLD_POOL)
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
        return World(
            name=self.name,
            seed=seed,
            now=NOW,
            apps=APPS,
            state=state,
            available=_visible(available),
            prompt=builtin_prompt,
        )

    @cached_property
    def scenarios(self) -> list[Scenario]:
        from agentloop.apps.builtin.scenarios import discover

        return discover()

    @cached_property
    def _scenario_of(self) -> dict[str, Scenario]:
        """Every fixed task id and its scenario, known without building any world."""
        return {f"{sc.id}-{v}": sc for sc in self.scenarios for v in range(1, sc.variants + 1)}

    @cached_property
    def _scenario_by_id(self) -> dict[str, Scenario]:
        return {sc.id: sc for sc in self.scenarios}

    def procedural_scenarios(self) -> list[str]:
        """The scenarios that also take refs `<scenario>@<seed>`: the train ones (dev and test stay fixed)."""
        return [sc.id for sc in self.scenarios if sc.split == "train"]

    def _build(self, task_id: str) -> tuple[TaskSpec, bytes]:
        """A task and its initial state: its scenario's setup on one of the pooled base worlds."""
        if task_id not in self._built:
            sc = self._scenario_of[task_id]
            variant = int(task_id.rsplit("-", 1)[1])
            # variants of a scenario are different tasks: one whose instruction repeats an earlier
            # variant's is drawn again with another setup seed (a pure function of the ids, still)
            taken = {self._build(f"{sc.id}-{v}")[0].instruction for v in range(1, variant)}
            for attempt in range(REDRAWS):
                setup_seed = task_seed(task_id if attempt == 0 else f"{task_id}#{attempt}")
                spec, world = self._instantiate(sc, task_id, world_seed(task_id), setup_seed)
                if spec.instruction not in taken:
                    break
            self._built[task_id] = (spec, world.snapshot())
        return self._built[task_id]

    def _instantiate(self, sc: Scenario, task_id: str, seed: int, setup_seed: int) -> tuple[TaskSpec, World]:
        world = self.new_world(seed, sc.apps)
        try:
            inst = sc.setup(world, random.Random(setup_seed))
        except Exception as exc:
            raise ScenarioSetupError(
                f"scenario {sc.id!r} cannot be set up on world seed {seed} (setup seed {setup_seed}): {exc}"
            ) from exc
        spec = TaskSpec(
            id=task_id,
            scenario_id=sc.id,
            split=sc.split,
            difficulty=sc.difficulty,
            instruction=inst.instruction,
            apps=sc.apps,
            seed=seed,
            evaluator=StateEvaluator(tuple(inst.expectations), inst.answer, VOLATILE),
            oracle=inst.oracle,
        )
        return spec, world

    def instance(self, scenario_id: str, seed: int) -> tuple[TaskSpec, World]:
        """A scenario set up on a world of its own seed (any int, any split), outside the fixed task list: a
        fresh task of the same kind, with its world in the initial state. Raises ScenarioSetupError."""
        sc = self._scenario_by_id.get(scenario_id)
        if sc is None:
            raise KeyError(f"unknown built-in scenario {scenario_id!r}")
        return self._instantiate(sc, procedural_ref(sc.id, seed), seed, seed)

    def _procedural_scenario(self, task_ref: str) -> tuple[Scenario, int]:
        """The train scenario and the seed a ref `<scenario>@<seed>` names; a KeyError says what is wrong."""
        scenario_id, _, seed_text = task_ref.rpartition("@")
        sc = self._scenario_by_id.get(scenario_id)
        if sc is None:
            raise KeyError(
                f"no built-in scenario {scenario_id!r} (task ref {task_ref!r}); the train scenarios are the ids "
                "`agentloop world tasks --split train` lists, without their '-<variant>'"
            )
        if sc.split != "train":
            raise KeyError(
                f"scenario {sc.id!r} is a {sc.split} scenario: only train scenarios take '<scenario>@<seed>' refs, "
                f"so that dev and test figures stay comparable; its tasks are {sc.id}-1 to {sc.id}-{sc.variants}"
            )
        # one spelling per seed: the ref is the task's id, so "x@07" must not be a second name of "x@7"
        canonical = seed_text.isascii() and seed_text.isdigit() and str(int(seed_text)) == seed_text
        if not canonical or int(seed_text) >= SEED_LIMIT:
            raise KeyError(
                f"bad seed {seed_text!r} in task ref {task_ref!r}: a seed is a whole number from 0 to "
                f"{SEED_LIMIT - 1}, written without sign or leading zeros"
            )
        return sc, int(seed_text)

    def _build_procedural(self, task_ref: str) -> tuple[TaskSpec, bytes]:
        sc, seed = self._procedural_scenario(task_ref)
        spec, world = self._instantiate(sc, task_ref, seed, seed)
        return spec, world.snapshot()

    @cached_property
    def _built(self) -> dict[str, tuple[TaskSpec, bytes]]:
        return {}

    @cached_property
    def _procedural(self) -> Callable[[str], tuple[TaskSpec, bytes]]:
        """Procedural tasks built so far, the least recently used dropped: their seeds are unbounded."""
        return lru_cache(maxsize=PROCEDURAL_CACHE)(self._build_procedural)

    def _lookup(self, task_id: str) -> tuple[TaskSpec, bytes]:
        """A fixed task `<scenario>-<variant>` or a procedural one `<scenario>@<seed>`, and its initial state."""
        if task_id in self._scenario_of:
            return self._build(task_id)
        if "@" in task_id:
            return self._procedural(task_id)
        raise KeyError(
            f"no built-in task {task_id!r}: tasks are '<scenario>-<variant>' (`agentloop world tasks` lists "
            "them), and a train scenario also takes '<scenario>@<seed>'"
        )

    def task_ids(self, split: str | None = None) -> list[str]:
        """The fixed task ids (procedural refs are not listed: every train scenario takes any seed)."""
        return [tid for tid, sc in self._scenario_of.items() if split is None or sc.split == split]

    def tasks(self, split: str | None = None) -> list[TaskSpec]:
        return [self._build(tid)[0] for tid in self.task_ids(split)]

    def task(self, task_id: str) -> TaskSpec:
        """A fixed task or a procedural one (train scenarios only); KeyError says why a ref names none.
        A procedural ref whose setup finds nothing on its seed raises ScenarioSetupError."""
        return self._lookup(task_id)[0]

    def task_world(self, task_id: str) -> World:
        """A fresh world in the task's initial state."""
        spec, snap = self._lookup(task_id)
        return World.from_snapshot(self.name, spec.seed, NOW, APPS, _visible(spec.apps), snap, builtin_prompt)


BUILTIN = BuiltinWorld()
