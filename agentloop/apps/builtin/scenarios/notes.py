"""Scenarios on the notes app alone."""

from __future__ import annotations

import random
from typing import Any

from agentloop.apps.evaluation import added, removed, same_items
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World

MY_NOTES = [
    "Packing list",
    "Weekend plans",
    "Plant watering",
    "Bike repair",
    "Birthday party ideas",
    "Movie watchlist",
    "Garden to-do",
    "Tax documents",
]
NOTE_TEXTS = [
    "Check the tire pressure first.",
    "Water the fern every Tuesday.",
    "Bring the blue folder.",
    "Call the landlord about the heater.",
    "Buy candles and balloons.",
    "Renew the passport.",
]
TAGS = ["personal", "home", "ideas", "errands", "family"]


def find_note(client: OracleClient, token: str, title: str) -> dict[str, Any]:
    hits = client.call("notes", "search_notes", access_token=token, query=title)
    return next(n for n in hits if n["title"] == title)


def notes_delete_titled(world: World, rng: random.Random) -> TaskInstance:
    notes = sorted(world.state["notes"]["notes"].values(), key=lambda n: n["id"])
    target = rng.choice(notes[:12])
    title = target["title"]

    def oracle(c: OracleClient) -> None:
        token = c.login("notes")
        note = find_note(c, token, title)
        c.call("notes", "delete_note", access_token=token, note_id=note["note_id"])

    return TaskInstance(f"Delete my note titled '{title}'.", oracle, [removed("notes", "notes", target["id"])])


def notes_create_tagged(world: World, rng: random.Random) -> TaskInstance:
    title, text, tag = rng.choice(MY_NOTES), rng.choice(NOTE_TEXTS), rng.choice(TAGS)

    def oracle(c: OracleClient) -> None:
        token = c.login("notes")
        c.call("notes", "create_note", access_token=token, title=title, body=text, tags=[tag])

    return TaskInstance(
        f"Create a note titled '{title}' with the text '{text}' and the tag '{tag}'.",
        oracle,
        [added("notes", "notes", title=title, body=text, tags=same_items([tag]))],
    )


def notes_wifi_password(world: World, rng: random.Random) -> TaskInstance:
    note = next(n for n in world.state["notes"]["notes"].values() if n["title"] == "Home wifi")
    password = note["body"].split("Password: ", 1)[1].strip()

    def oracle(c: OracleClient) -> str:
        token = c.login("notes")
        found = find_note(c, token, "Home wifi")
        body = c.call("notes", "show_note", access_token=token, note_id=found["note_id"])["body"]
        return str(body.split("Password: ", 1)[1].strip())

    return TaskInstance("What is the password of my home wifi? It is in my notes.", oracle, answer=password)


SCENARIOS = [
    Scenario("notes_delete_titled", 1, ("notes",), "train", notes_delete_titled),
    Scenario("notes_create_tagged", 1, ("notes",), "train", notes_create_tagged),
    Scenario("notes_wifi_password", 1, ("notes",), "dev", notes_wifi_password),
]
