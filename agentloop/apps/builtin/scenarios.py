"""Task scenarios of the built-in world. Each `setup` picks people and values from the world (and may
plant records the task needs), then says what the result must be and how an expert gets there."""

from __future__ import annotations

import random
from typing import Any

from agentloop.apps.builtin.people import iso
from agentloop.apps.evaluation import added, removed, same_items, updated
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


def _me(world: World) -> str:
    email: str = world.state["supervisor"]["profile"]["1"]["email"]
    return email


def _plant(world: World, app: str, table: str, record: dict[str, Any]) -> dict[str, Any]:
    rows = world.state[app][table]
    rid = max((int(k) for k in rows), default=0) + 1
    record = {"id": rid, **record}
    rows[str(rid)] = record
    return record


def _find_note(client: OracleClient, token: str, title: str) -> dict[str, Any]:
    hits = client.call("notes", "search_notes", access_token=token, query=title)
    return next(n for n in hits if n["title"] == title)


# --- notes ------------------------------------------------------------------------------------


def notes_delete_titled(world: World, rng: random.Random) -> TaskInstance:
    notes = sorted(world.state["notes"]["notes"].values(), key=lambda n: n["id"])
    target = rng.choice(notes[:12])
    title = target["title"]

    def oracle(c: OracleClient) -> None:
        token = c.login("notes")
        note = _find_note(c, token, title)
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
        found = _find_note(c, token, "Home wifi")
        body = c.call("notes", "show_note", access_token=token, note_id=found["note_id"])["body"]
        return str(body.split("Password: ", 1)[1].strip())

    return TaskInstance("What is the password of my home wifi? It is in my notes.", oracle, answer=password)


# --- wallet -----------------------------------------------------------------------------------


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
            added("wallet", "transactions", sender=_me(world), receiver=person, amount=amount, note=note),
            updated("wallet", "account", 1, balance=round(balance - amount, 2)),
        ],
    )


def wallet_decline_from(world: World, rng: random.Random) -> TaskInstance:
    me = _me(world)
    person = rng.choice(world_people(world))
    for days in rng.sample(range(1, 30), rng.randint(2, 3)):
        _plant(
            world,
            "wallet",
            "requests",
            {
                "requester": person,
                "payer": me,
                "amount": float(rng.randint(10, 90)),
                "note": rng.choice(["snacks", "parking", "tickets", "lunch"]),
                "status": "pending",
                "created_at": _days_ago(world, days),
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


def wallet_pay_from_note(world: World, rng: random.Random) -> TaskInstance:
    people = rng.sample(world_people(world), 3)
    shares = {p: float(rng.randint(8, 60)) for p in people}
    title = rng.choice(["Dinner split", "Cabin weekend costs", "Concert tickets split"])
    body = "I owe:\n" + "\n".join(f"{p}: ${amt:.2f}" for p, amt in shares.items())
    _plant(
        world,
        "notes",
        "notes",
        {
            "title": title,
            "body": body,
            "tags": ["money"],
            "pinned": False,
            "created_at": _days_ago(world, 1),
            "updated_at": _days_ago(world, 1),
        },
    )
    me = _me(world)
    balance = world.state["wallet"]["account"]["1"]["balance"]

    def oracle(c: OracleClient) -> None:
        ntoken = c.login("notes")
        found = _find_note(c, ntoken, title)
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


def world_people(world: World) -> list[str]:
    """Emails of people the supervisor has paid or been paid by (so wallet knows them)."""
    txns = world.state["wallet"]["transactions"].values()
    me = _me(world)
    return sorted({t["receiver"] if t["sender"] == me else t["sender"] for t in txns})


def _days_ago(world: World, days: float) -> str:
    from datetime import timedelta

    return iso(world.now - timedelta(days=days))


SCENARIOS = [
    Scenario("notes_delete_titled", 1, ("notes",), "train", notes_delete_titled),
    Scenario("notes_create_tagged", 1, ("notes",), "train", notes_create_tagged),
    Scenario("wallet_balance", 1, ("wallet",), "train", wallet_balance),
    Scenario("wallet_send_money", 1, ("wallet",), "train", wallet_send_money),
    Scenario("notes_wifi_password", 1, ("notes",), "dev", notes_wifi_password),
    Scenario("wallet_decline_from", 2, ("wallet",), "dev", wallet_decline_from),
    Scenario("wallet_pay_from_note", 3, ("notes", "wallet"), "test_normal", wallet_pay_from_note),
]
