"""Tasks: a TaskSpec has an id, scenario id, split, difficulty, instruction, the apps used, a seed,
an evaluator and an oracle solution. Scenarios are templates instantiated several times on other
people and values (AppWorld's scenario/task split)."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentloop.apps.base import ApiError
from agentloop.apps.evaluation import NO_ANSWER, Evaluator, Expect
from agentloop.apps.world import World

T = TypeVar("T")
SPLITS = ("train", "dev", "test_normal", "test_challenge")


@dataclass(frozen=True)
class ToolCall:
    app: str
    api: str
    args: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"app": self.app, "api": self.api, "args": self.args}


class OracleClient:
    """What an oracle solution uses: the same API calls an agent makes, recorded as expert actions."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.actions: list[ToolCall] = []
        self._passwords: dict[str, str] | None = None
        self._tokens: dict[str, str] = {}

    def call(self, app: str, api: str, **args: Any) -> Any:
        try:
            result = self.world.call(app, api, args)
        except ApiError as exc:
            raise RuntimeError(f"oracle call {app}.{api}({args}) failed: {exc}") from exc
        self.actions.append(ToolCall(app, api, self._ordered(app, api, args)))
        return result

    def _ordered(self, app: str, api: str, args: dict[str, Any]) -> dict[str, Any]:
        """The arguments as the expert writes them: the access token first, then in the order the API
        declares its parameters (the order its index shows), so that every expert call of an API reads
        the same way whatever order the solution passed them in."""
        spec = self.world.apps.get(app)
        declared = list(spec.apis[api].parameters.get("properties") or {}) if spec and api in spec.apis else []
        rank = {name: i for i, name in enumerate(["access_token", *declared])}
        return dict(sorted(args.items(), key=lambda kv: rank.get(kv[0], len(rank))))

    def login(self, app: str) -> str:
        """Log in the way a careful agent would: read the passwords once, then call app.login."""
        if app not in self._tokens:
            if self._passwords is None:
                accounts = self.call("supervisor", "show_account_passwords")
                self._passwords = {a["app"]: a["password"] for a in accounts}
            email = self.world.state["supervisor"]["profile"]["1"]["email"]
            token = self.call(app, "login", username=email, password=self._passwords[app])["access_token"]
            self._tokens[app] = token
        return self._tokens[app]

    def pages(self, app: str, api: str, **args: Any) -> Iterator[Any]:
        """Every item of a paginated list API, page after page until an empty page."""
        page = 0
        while True:
            items = self.call(app, api, page_index=page, page_limit=20, **args)
            if not items:
                return
            yield from items
            page += 1


class NoInstance(LookupError):
    """A scenario's setup found nothing in this world to build its task from."""


class ScenarioSetupError(RuntimeError):
    """A scenario could not be set up on a seed; the message names both."""


def pick(rng: random.Random, options: Sequence[T], what: str) -> T:
    """`rng.choice`, with an error that says what was missing instead of an IndexError."""
    if not options:
        raise NoInstance(f"no {what} in this world")
    return rng.choice(options)


Oracle = Callable[[OracleClient], Any]  # returns the answer (None for tasks that are not questions)


@dataclass
class TaskInstance:
    """What a scenario makes of one world: the instruction, the expected result and how to get there."""

    instruction: str
    oracle: Oracle
    expectations: list[Expect] = field(default_factory=list)
    answer: Any = NO_ANSWER


@dataclass(frozen=True)
class Scenario:
    id: str
    difficulty: int  # 1..3
    apps: tuple[str, ...]
    split: str
    setup: Callable[[World, random.Random], TaskInstance]  # may add records the task needs to the world
    variants: int = 3


@dataclass(frozen=True)
class TaskSpec:
    id: str
    scenario_id: str
    split: str
    difficulty: int
    instruction: str
    apps: tuple[str, ...]
    seed: int
    evaluator: Evaluator
    oracle: Oracle
    world: str = "builtin"

    def summary(self) -> dict[str, Any]:
        return {
            "task_ref": self.id,
            "scenario": self.scenario_id,
            "split": self.split,
            "difficulty": self.difficulty,
            "instruction": self.instruction,
            "apps": list(self.apps),
        }


def task_seed(task_id: str) -> int:
    return zlib.crc32(task_id.encode()) % 1_000_000


SEED_LIMIT = 2**31  # a procedural task's seed: 0 <= seed < SEED_LIMIT (what fits a signed 32-bit column)


def procedural_ref(scenario_id: str, seed: int) -> str:
    """The ref of a scenario set up on a world of its own seed, beside the fixed `<scenario>-<variant>` ids."""
    return f"{scenario_id}@{seed}"


@dataclass
class OracleRun:
    actions: list[ToolCall]
    answer: str | None


def run_oracle(task: TaskSpec, world: World) -> OracleRun:
    """Solve the task on `world` with its oracle; ends with supervisor.complete_task like an agent (a text
    world ends when its last command completes the task)."""
    client = OracleClient(world)
    answer = task.oracle(client)
    if world.commands is None:
        args = {} if answer is None else {"answer": answer}
        client.call("supervisor", "complete_task", **args)
    return OracleRun(client.actions, world.answer)
