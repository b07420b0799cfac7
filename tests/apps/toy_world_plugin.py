"""A world as a separate package would ship it (see test_plugins.py): one app, a few tasks."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from agentloop.apps.base import AppSpec, CallContext, integer
from agentloop.apps.builtin.apps import api_docs, supervisor
from agentloop.apps.evaluation import StateEvaluator, updated
from agentloop.apps.tasks import OracleClient, TaskSpec, ToolCall
from agentloop.apps.world import World
from agentloop.apps.world_prompt import ExampleStep, WorkedExample, WorldPrompt

counter = AppSpec(name="counter", description="A counter you can add to.", login=False)


@counter.api(
    "Add to the counter.", params={"amount": integer("How much to add.")}, required=["amount"], returns="{value}"
)
def add(ctx: CallContext, amount: int) -> dict[str, Any]:
    row = ctx.table("counters")["1"]
    row["value"] += amount
    return {"value": row["value"]}


@counter.api("Show the counter.", returns="{value}")
def show(ctx: CallContext) -> dict[str, Any]:
    return {"value": ctx.table("counters")["1"]["value"]}


APPS = {"api_docs": api_docs.app, "supervisor": supervisor.app, "counter": counter}
PROFILE = {"first_name": "Toy", "last_name": "User", "email": "toy@example.com", "phone": "5550000000"}
# what this world says in the agent's prompt (a world that supplies nothing gets the neutral prompt)
PROMPT = WorldPrompt(
    persona="You keep the counter of the toy world.",
    conventions=("The counter only goes up: add to it, never subtract.",),
    first_call=ToolCall("counter", "show", {}),
    example=WorkedExample(
        "Add 1 to the counter.",
        (
            ExampleStep(ToolCall("counter", "add", {"amount": 1}), {"value": 4}),
            ExampleStep(ToolCall("supervisor", "complete_task", {}), "Task marked as complete."),
        ),
    ),
    unlisted_apps=frozenset({"supervisor"}),
)


def toy_prompt(world: World) -> WorldPrompt:
    return PROMPT


class ToyWorld:
    name = "toy"

    @property
    def apps(self) -> Mapping[str, AppSpec]:
        return APPS

    def new_world(self, seed: int, available: Sequence[str]) -> World:
        state = {
            "api_docs": {},
            "supervisor": {
                "profile": {"1": {"id": 1, **PROFILE}},
                "accounts": {},
                "addresses": {},
                "payment_cards": {},
            },
            "counter": {"counters": {"1": {"id": 1, "value": seed % 10}}},
        }
        return World(
            name="toy",
            seed=seed,
            now=datetime(2025, 1, 1, tzinfo=UTC),
            apps=APPS,
            state=state,
            available=["api_docs", "supervisor", *available],
            prompt=toy_prompt,
        )

    def tasks(self, split: str | None = None) -> list[TaskSpec]:
        out = []
        for n in (1, 2, 3):
            start = n % 10
            amount = random.Random(n).randint(2, 9)

            def oracle(c: OracleClient, amount: int = amount) -> None:
                c.call("counter", "add", amount=amount)

            out.append(
                TaskSpec(
                    id=f"count-{n}",
                    scenario_id="count",
                    split="dev",
                    difficulty=1,
                    instruction=f"Add {amount} to the counter.",
                    apps=("counter",),
                    seed=n,
                    evaluator=StateEvaluator((updated("counter", "counters", 1, value=start + amount),)),
                    oracle=oracle,
                    world="toy",
                )
            )
        return [t for t in out if split is None or t.split == split]

    def task(self, task_id: str) -> TaskSpec:
        for t in self.tasks():
            if t.id == task_id:
                return t
        raise KeyError(task_id)

    def task_world(self, task_id: str) -> World:
        return self.new_world(self.task(task_id).seed, ["counter"])
