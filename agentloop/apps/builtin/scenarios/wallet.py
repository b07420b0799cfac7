"""Scenarios on the wallet app alone."""

from __future__ import annotations

import random

from agentloop.apps.builtin.scenarios.common import days_ago, my_email, plant
from agentloop.apps.evaluation import added, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World


def wallet_balance(world: World, rng: random.Random) -> TaskInstance:
    balance = world.state["wallet"]["account"]["1"]["balance"]

    def oracle(c: OracleClient) -> float:
        token = c.login("wallet")
        return float(c.call("wallet", "show_balance", access_token=token)["balance"])

    return TaskInstance("How much money is in my wallet right now?", oracle, answer=balance)


def wallet_send_money(world: World, rng: random.Random) -> TaskInstance:
    person = rng.choice(world_people(world))
    amount = rng.choice([12, 15, 20, 25, 30, 42, 50, 75])
    note = rng.choice(["lunch", "movie tickets", "cab ride", "book club", "groceries"])
    balance = world.state["wallet"]["account"]["1"]["balance"]

    def oracle(c: OracleClient) -> None:
        token = c.login("wallet")
        c.call("wallet", "send_money", access_token=token, receiver_email=person, amount=amount, note=note)

    return TaskInstance(
        f"Send ${amount} to {person} on wallet with the note '{note}'.",
        oracle,
        [
            added("wallet", "transactions", sender=my_email(world), receiver=person, amount=amount, note=note),
            updated("wallet", "account", 1, balance=round(balance - amount, 2)),
        ],
    )


def wallet_decline_from(world: World, rng: random.Random) -> TaskInstance:
    me = my_email(world)
    person = rng.choice(world_people(world))
    for days in rng.sample(range(1, 30), rng.randint(2, 3)):
        plant(
            world,
            "wallet",
            "requests",
            {
                "requester": person,
                "payer": me,
                "amount": float(rng.randint(10, 90)),
                "note": rng.choice(["snacks", "parking", "tickets", "lunch"]),
                "status": "pending",
                "created_at": days_ago(world, days),
            },
        )
    pending = [
        r
        for r in world.state["wallet"]["requests"].values()
        if r["requester"] == person and r["payer"] == me and r["status"] == "pending"
    ]

    def oracle(c: OracleClient) -> None:
        token = c.login("wallet")
        mine = [
            r
            for r in c.pages("wallet", "list_requests", access_token=token, direction="incoming", status="pending")
            if r["requester"] == person
        ]
        for r in mine:
            c.call("wallet", "decline_request", access_token=token, request_id=r["request_id"])

    return TaskInstance(
        f"Decline every pending money request that {person} sent me on wallet.",
        oracle,
        [updated("wallet", "requests", r["id"], status="declined") for r in pending],
    )


def world_people(world: World) -> list[str]:
    """Emails of people the supervisor has paid or been paid by (so wallet knows them)."""
    txns = world.state["wallet"]["transactions"].values()
    me = my_email(world)
    return sorted({t["receiver"] if t["sender"] == me else t["sender"] for t in txns})


SCENARIOS = [
    Scenario("wallet_balance", 1, ("wallet",), "train", wallet_balance),
    Scenario("wallet_send_money", 1, ("wallet",), "train", wallet_send_money),
    Scenario("wallet_decline_from", 2, ("wallet",), "dev", wallet_decline_from),
]
