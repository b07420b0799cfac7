"""Scenarios that span several apps."""

from __future__ import annotations

import random

from agentloop.apps.builtin.scenarios.common import days_ago, my_email, plant
from agentloop.apps.builtin.scenarios.notes import find_note
from agentloop.apps.builtin.scenarios.wallet import world_people
from agentloop.apps.evaluation import added, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World


def wallet_pay_from_note(world: World, rng: random.Random) -> TaskInstance:
    people = rng.sample(world_people(world), 3)
    shares = {p: float(rng.randint(8, 60)) for p in people}
    title = rng.choice(["Dinner split", "Cabin weekend costs", "Concert tickets split"])
    body = "I owe:\n" + "\n".join(f"{p}: ${amt:.2f}" for p, amt in shares.items())
    plant(
        world,
        "notes",
        "notes",
        {
            "title": title,
            "body": body,
            "tags": ["money"],
            "pinned": False,
            "created_at": days_ago(world, 1),
            "updated_at": days_ago(world, 1),
        },
    )
    me = my_email(world)
    balance = world.state["wallet"]["account"]["1"]["balance"]

    def oracle(c: OracleClient) -> None:
        ntoken = c.login("notes")
        found = find_note(c, ntoken, title)
        text = c.call("notes", "show_note", access_token=ntoken, note_id=found["note_id"])["body"]
        wtoken = c.login("wallet")
        for line in text.splitlines()[1:]:
            email, amount = line.split(": $")
            c.call("wallet", "send_money", access_token=wtoken, receiver_email=email, amount=float(amount), note=title)

    return TaskInstance(
        f"My note '{title}' lists what I owe people. Pay each of them that amount on wallet, with the note '{title}'.",
        oracle,
        [added("wallet", "transactions", sender=me, receiver=p, amount=a, note=title) for p, a in shares.items()]
        + [updated("wallet", "account", 1, balance=round(balance - sum(shares.values()), 2))],
    )


SCENARIOS = [
    Scenario("wallet_pay_from_note", 3, ("notes", "wallet"), "test_normal", wallet_pay_from_note),
]
