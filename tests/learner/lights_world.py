"""A toy world for learning tests: the rewarded behaviour is known (turn the lights on)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from agentloop.apps.base import AppSpec, CallContext
from agentloop.apps.builtin.apps import api_docs, supervisor
from agentloop.apps.evaluation import StateEvaluator, updated
from agentloop.apps.tasks import OracleClient, TaskSpec
from agentloop.apps.world import World

lights = AppSpec(name="lights", description="The lights of the house.", login=False)


@lights.api("Turn the lights on.", returns="{on}")
def turn_on(ctx: CallContext) -> dict[str, Any]:
    ctx.table("lights")["1"]["on"] = True
    return {"on": True}


@lights.api("Turn the lights off.", returns="{on}")
def turn_off(ctx: CallContext) -> dict[str, Any]:
    ctx.table("lights")["1"]["on"] = False
    return {"on": False}


APPS = {"api_docs": api_docs.app, "supervisor": supervisor.app, "lights": lights}
PROFILE = {"first_name": "Ada", "last_name": "Lux", "email": "ada@example.com", "phone": "5550000001"}
PHRASES = [
    "Turn the lights on.",
    "Please switch the lights on.",
    "Lights on, please.",
    "I need light: turn it on.",
    "Switch on the lights.",
    "Can you turn on the lights?",
    "It is dark, turn the lights on.",
    "Make the lights go on.",
    # more dev phrasings: held-out measurements (agreement, the dev gate) move in steps of 1/8, not 1/2
    "Could you switch on the lights for me?",
    "Put the lights on.",
    "The room is too dark: lights on.",
    "Please turn on the lights.",
    "I can't see anything, switch the lights on.",
    "Lights, please: on.",
]


def turn_on_oracle(c: OracleClient) -> None:
    c.call("lights", "turn_on")


def turn_off_oracle(c: OracleClient) -> None:
    c.call("lights", "turn_off")


class LightsWorld:
    name = "lights"

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
            "lights": {"lights": {"1": {"id": 1, "on": False}}},
        }
        return World(
            name="lights",
            seed=seed,
            now=datetime(2025, 1, 1, tzinfo=UTC),
            apps=APPS,
            state=state,
            available=["api_docs", "supervisor", *available],
        )

    def tasks(self, split: str | None = None) -> list[TaskSpec]:
        out = [
            TaskSpec(
                id=f"lights-{i}",
                scenario_id=f"lights-{i}",
                split="dev" if i >= 6 else "train",
                difficulty=1,
                instruction=phrase,
                apps=("lights",),
                seed=i,
                evaluator=StateEvaluator((updated("lights", "lights", 1, on=True),)),
                oracle=turn_on_oracle,
                world="lights",
            )
            for i, phrase in enumerate(PHRASES)
        ]
        return [t for t in out if split is None or t.split == split]

    def task(self, task_id: str) -> TaskSpec:
        """KeyError for a ref that names no task, as the built-in world's."""
        for t in self.tasks():
            if t.id == task_id:
                return t
        raise KeyError(f"lights world: no task {task_id!r}")

    def task_world(self, task_id: str) -> World:
        return self.new_world(self.task(task_id).seed, ["lights"])
