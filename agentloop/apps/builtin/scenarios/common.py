"""Helpers scenario modules share: who the supervisor is, planting records, dates."""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from typing import Any

from agentloop.apps.base import insert_record
from agentloop.apps.builtin.people import Person, iso, make_world_data
from agentloop.apps.world import World


def me(world: World) -> dict[str, Any]:
    """The supervisor's profile (first_name, last_name, email, phone, ...)."""
    profile: dict[str, Any] = world.state["supervisor"]["profile"]["1"]
    return profile


def my_email(world: World) -> str:
    return str(me(world)["email"])


@lru_cache(maxsize=32)
def people_of(seed: int) -> dict[str, Person]:
    """Everyone the supervisor knows in the world built from `seed`, by email."""
    return {p.email: p for p in make_world_data(seed).people}


def plant(world: World, app: str, table: str, record: dict[str, Any]) -> dict[str, Any]:
    """Add a record the task needs to the initial state, with the table's next integer id."""
    return insert_record(world.state[app], table, record)


def days_ago(world: World, days: float) -> str:
    return iso(world.now - timedelta(days=days))


def days_ahead(world: World, days: float) -> str:
    return iso(world.now + timedelta(days=days))
