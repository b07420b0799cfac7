"""Scenarios on the wallet app alone: balance and history questions, payments, requests and settling up."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta
from typing import Any

from agentloop.apps.builtin.apps.wallet import NOTES
from agentloop.apps.builtin.people import iso
from agentloop.apps.builtin.scenarios.common import days_ago, my_email, plant
from agentloop.apps.evaluation import Expect, added, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World

Record = dict[str, Any]
MONTHS = {3: "March", 4: "April", 5: "May"}  # the months the wallet's history covers in full


# --- reading and planting (setup only; oracles use the APIs) ----------------------------------


def world_people(world: World) -> list[str]:
    """Emails of people the supervisor has paid or been paid by (so wallet knows them)."""
    txns = world.state["wallet"]["transactions"].values()
    me = my_email(world)
    return sorted({t["receiver"] if t["sender"] == me else t["sender"] for t in txns})


def balance(world: World) -> float:
    return float(world.state["wallet"]["account"]["1"]["balance"])


def transactions(world: World) -> list[Record]:
    return sorted(world.state["wallet"]["transactions"].values(), key=lambda t: t["id"])


def requests(world: World) -> list[Record]:
    return sorted(world.state["wallet"]["requests"].values(), key=lambda r: r["id"])


def plant_payment(world: World, sender: str, receiver: str, amount: float, note: str, when: str) -> Record:
    record = {"sender": sender, "receiver": receiver, "amount": round(amount, 2), "note": note, "created_at": when}
    return plant(world, "wallet", "transactions", record)


def plant_request(
    world: World, requester: str, payer: str, amount: float, note: str, when: str, status: str = "pending"
) -> Record:
    record = {
        "requester": requester,
        "payer": payer,
        "amount": round(amount, 2),
        "note": note,
        "status": status,
        "created_at": when,
    }
    return plant(world, "wallet", "requests", record)


def cents(rng: random.Random, low: int, high: int) -> float:
    """A dollar amount between low and high with cents."""
    return rng.randint(low * 100, high * 100) / 100


def money(amount: float) -> str:
    """'$25' or '$18.50', as a person writes amounts."""
    return f"${amount:.0f}" if float(amount).is_integer() else f"${amount:.2f}"


def month_bounds(world: World, month: int) -> tuple[str, str]:
    """ISO bounds [first day, first day of the next month) of a month of the current year."""
    year = world.now.year
    start = world.now.replace(month=month, day=1, hour=0, minute=0, second=0)
    end = start.replace(month=month + 1) if month < 12 else start.replace(year=year + 1, month=1)
    return iso(start), iso(end)


def at(world: World, day: date, rng: random.Random) -> str:
    """A time during the day, between 8:00 and 22:00."""
    start = world.now.replace(year=day.year, month=day.month, day=day.day, hour=8, minute=0, second=0)
    return iso(start + timedelta(minutes=rng.randint(0, 14 * 60)))


# --- scenarios ---------------------------------------------------------------------------------


def wallet_balance(world: World, rng: random.Random) -> TaskInstance:
    def oracle(c: OracleClient) -> float:
        token = c.login("wallet")
        return float(c.call("wallet", "show_balance", access_token=token)["balance"])

    ask = rng.choice(
        [
            "How much money is in my wallet right now?",
            "What's my current wallet balance?",
            "Check my wallet app and tell me how much money I have there.",
            "Before I pay rent: what's the balance of my wallet?",
        ]
    )
    return TaskInstance(ask, oracle, answer=balance(world))


def wallet_send_money(world: World, rng: random.Random) -> TaskInstance:
    person = rng.choice(world_people(world))
    amount = rng.choice([12, 15, 20, 25, 30, 42, 50, 75, 18.5, 33.25, 9.99])
    note = rng.choice(["lunch", "movie tickets", "cab ride", "book club", "groceries", "parking", "flowers"])

    def oracle(c: OracleClient) -> None:
        token = c.login("wallet")
        c.call("wallet", "send_money", access_token=token, receiver_email=person, amount=amount, note=note)

    ask = rng.choice(
        [
            "Send {amount} to {person} on wallet with the note '{note}'.",
            "Please pay {person} {amount} through my wallet app; put '{note}' as the note.",
            "I owe {person} {amount} for {note}. Send it on wallet with the note '{note}'.",
        ]
    )
    return TaskInstance(
        ask.format(amount=money(amount), person=person, note=note),
        oracle,
        [
            added("wallet", "transactions", sender=my_email(world), receiver=person, amount=amount, note=note),
            updated("wallet", "account", 1, balance=round(balance(world) - amount, 2)),
        ],
    )


def wallet_request_money(world: World, rng: random.Random) -> TaskInstance:
    person = rng.choice(world_people(world))
    amount = rng.choice([10, 14, 22, 35, 40, 60, 27.5, 16.75, 48.2])
    note = rng.choice(["concert tickets", "gas money", "half the pizza", "the cabin deposit", "team lunch", "taxi"])

    def oracle(c: OracleClient) -> None:
        token = c.login("wallet")
        c.call("wallet", "request_money", access_token=token, payer_email=person, amount=amount, note=note)

    ask = rng.choice(
        [
            "Request {amount} from {person} on wallet for '{note}' (use that as the note).",
            "{person} owes me {amount} for {note}. Send them a money request on wallet with the note '{note}'.",
            "Ask {person} to pay me {amount} through wallet, note: '{note}'.",
        ]
    )
    return TaskInstance(
        ask.format(amount=money(amount), person=person, note=note),
        oracle,
        [
            added(
                "wallet",
                "requests",
                requester=my_email(world),
                payer=person,
                amount=amount,
                note=note,
                status="pending",
            )
        ],
    )


def wallet_decline_from(world: World, rng: random.Random) -> TaskInstance:
    me = my_email(world)
    person = rng.choice(world_people(world))
    for days in rng.sample(range(1, 30), rng.randint(2, 3)):
        plant_request(world, person, me, float(rng.randint(10, 90)), rng.choice(NOTES), days_ago(world, days))
    # one they sent earlier that I already paid: not pending, not part of the task
    plant_request(world, person, me, cents(rng, 10, 60), rng.choice(NOTES), days_ago(world, 35), status="approved")
    pending = [r for r in requests(world) if r["requester"] == person and r["payer"] == me and r["status"] == "pending"]

    def oracle(c: OracleClient) -> None:
        token = c.login("wallet")
        mine = [
            r
            for r in c.pages("wallet", "list_requests", access_token=token, direction="incoming", status="pending")
            if r["requester"] == person
        ]
        for r in mine:
            c.call("wallet", "decline_request", access_token=token, request_id=r["request_id"])

    ask = rng.choice(
        [
            "Decline every pending money request that {person} sent me on wallet.",
            "{person} keeps asking me for money on wallet. Decline all of their requests that are still open.",
            "Turn down all the wallet money requests from {person} that I haven't answered yet.",
        ]
    )
    return TaskInstance(
        ask.format(person=person),
        oracle,
        [updated("wallet", "requests", r["id"], status="declined") for r in pending],
    )


def wallet_received_in_month(world: World, rng: random.Random) -> TaskInstance:
    me = my_email(world)
    month = rng.choice(sorted(MONTHS))
    low, high = month_bounds(world, month)
    first = date.fromisoformat(low[:10])
    last = date.fromisoformat(high[:10]) - timedelta(days=1)
    person = rng.choice(world_people(world))
    for day in rng.sample(range(2, 28), rng.randint(2, 3)):  # what counts...
        plant_payment(world, person, me, cents(rng, 8, 90), rng.choice(NOTES), at(world, first.replace(day=day), rng))
    # ...and what doesn't: money I sent them that month, and their payments just outside it
    plant_payment(world, me, person, cents(rng, 8, 90), rng.choice(NOTES), at(world, first.replace(day=15), rng))
    outside = rng.choice([first - timedelta(days=1), last + timedelta(days=1)])
    plant_payment(world, person, me, cents(rng, 8, 90), rng.choice(NOTES), at(world, outside, rng))
    total = round(
        sum(t["amount"] for t in transactions(world) if t["sender"] == person and low <= t["created_at"] < high), 2
    )

    def oracle(c: OracleClient) -> float:
        token = c.login("wallet")
        got = c.pages("wallet", "list_transactions", access_token=token, direction="received", person=person, after=low)
        return round(sum(t["amount"] for t in got if t["created_at"] < high), 2)

    ask = rng.choice(
        [
            "How much did {person} send me on wallet in {month}?",
            "Add up all the money {person} paid me through wallet during {month} {year}. What's the total?",
            "What's the total that {person} transferred to me in {month}? Only count money they sent me.",
        ]
    )
    return TaskInstance(ask.format(person=person, month=MONTHS[month], year=world.now.year), oracle, answer=total)


def wallet_sent_with_note(world: World, rng: random.Random) -> TaskInstance:
    me = my_email(world)
    note = rng.choice(NOTES)
    since = (world.now - timedelta(days=rng.randint(30, 75))).date()
    bound = iso(world.now.replace(year=since.year, month=since.month, day=since.day, hour=0))
    span = (world.now.date() - since).days
    for t in transactions(world):  # nothing on the cutoff day itself, so 'since' cannot be read two ways
        if t["created_at"][:10] == str(since):
            t["created_at"] = iso(datetime.fromisoformat(t["created_at"]) - timedelta(days=1))
    people = world_people(world)
    for _ in range(rng.randint(2, 3)):
        plant_payment(world, me, rng.choice(people), cents(rng, 5, 80), note, days_ago(world, rng.uniform(1, span - 1)))
    plant_payment(world, me, rng.choice(people), cents(rng, 5, 80), note, days_ago(world, rng.uniform(span + 2, 110)))
    plant_payment(world, rng.choice(people), me, cents(rng, 5, 80), note, days_ago(world, rng.uniform(1, span - 1)))
    total = round(
        sum(
            t["amount"]
            for t in transactions(world)
            if t["sender"] == me and t["note"] == note and t["created_at"] > bound
        ),
        2,
    )

    def oracle(c: OracleClient) -> float:
        token = c.login("wallet")
        sent = c.pages("wallet", "list_transactions", access_token=token, direction="sent", after=bound)
        return round(sum(t["amount"] for t in sent if t["note"] == note), 2)

    when = f"{since:%B} {since.day}"
    ask = rng.choice(
        [
            "How much have I paid people on wallet for '{note}' since {when}? Only count payments I sent with the "
            "note '{note}'.",
            "Since {when}, what's the total of the wallet payments I sent with the note '{note}'?",
            "Add up what I've sent on wallet with the note '{note}' from {when} until today.",
        ]
    )
    return TaskInstance(ask.format(note=note, when=when), oracle, answer=total)


def wallet_approve_recent_small(world: World, rng: random.Random) -> TaskInstance:
    me = my_email(world)
    days = rng.randint(5, 10)
    cap = rng.choice([30, 40, 45, 50, 60])
    bound = days_ago(world, days)
    people = world_people(world)
    # keep clear of the edges, whether 'the last N days' is read from now or from midnight: nothing from half a
    # day after the cutoff back to the day before it, and nothing asking for exactly the cap
    for r in requests(world):
        if r["payer"] == me and r["status"] == "pending":
            age = (world.now - datetime.fromisoformat(r["created_at"])).total_seconds() / 86400
            if days - 0.5 < age < days + 1.5:
                r["created_at"] = days_ago(world, days + 2)
            if abs(r["amount"] - cap) < 0.01:
                r["amount"] = cap + 5.0
    for _ in range(2):  # small and recent: pay
        plant_request(
            world,
            rng.choice(people),
            me,
            cents(rng, 5, cap - 2),
            rng.choice(NOTES),
            days_ago(world, rng.uniform(0.5, days - 1)),
        )
    plant_request(
        world,
        rng.choice(people),
        me,
        cents(rng, cap + 1, cap + 60),
        rng.choice(NOTES),
        days_ago(world, rng.uniform(0.5, days - 1)),
    )
    plant_request(
        world,
        rng.choice(people),
        me,
        cents(rng, 5, cap - 2),
        rng.choice(NOTES),
        days_ago(world, rng.uniform(days + 2, days + 20)),
    )
    to_pay = [
        r
        for r in requests(world)
        if r["payer"] == me and r["status"] == "pending" and r["created_at"] > bound and r["amount"] < cap
    ]
    left = round(balance(world) - sum(r["amount"] for r in to_pay), 2)

    def oracle(c: OracleClient) -> None:
        token = c.login("wallet")
        open_ = list(c.pages("wallet", "list_requests", access_token=token, direction="incoming", status="pending"))
        for r in open_:
            if r["created_at"] > bound and r["amount"] < cap:
                c.call("wallet", "approve_request", access_token=token, request_id=r["request_id"])

    ask = rng.choice(
        [
            "Pay every pending wallet request sent to me in the last {days} days that is under ${cap}. Leave the "
            "others alone.",
            "Approve the money requests people sent me on wallet during the past {days} days, but only those below "
            "${cap}; don't touch any other request.",
            "Go through my open wallet requests: any that arrived in the last {days} days and asks for less than "
            "${cap}, pay it. Ignore the rest.",
        ]
    )
    expectations: list[Expect] = []
    for r in to_pay:
        expectations += [
            updated("wallet", "requests", r["id"], status="approved"),
            added("wallet", "transactions", sender=me, receiver=r["requester"], amount=r["amount"], note=r["note"]),
        ]
    expectations.append(updated("wallet", "account", 1, balance=left))
    return TaskInstance(ask.format(days=days, cap=cap), oracle, expectations)


SETTLE_NOTE = "settling up"


def wallet_settle_up(world: World, rng: random.Random) -> TaskInstance:
    me = my_email(world)
    person = rng.choice(world_people(world))
    since = (world.now - timedelta(days=rng.randint(25, 60))).date()
    bound = iso(world.now.replace(year=since.year, month=since.month, day=since.day, hour=0))
    span = (world.now.date() - since).days
    for t in transactions(world):  # nothing with them on the first day, so 'since' cannot be read two ways
        if person in (t["sender"], t["receiver"]) and t["created_at"][:10] == str(since):
            t["created_at"] = iso(datetime.fromisoformat(t["created_at"]) - timedelta(days=1))
    for sender, receiver in [(me, person), (me, person), (person, me), (person, me)]:
        plant_payment(
            world, sender, receiver, cents(rng, 10, 120), rng.choice(NOTES), days_ago(world, rng.uniform(1, span - 1))
        )
    # and one from before, which is already settled
    plant_payment(
        world, person, me, cents(rng, 10, 120), rng.choice(NOTES), days_ago(world, rng.uniform(span + 2, 110))
    )

    def owed() -> float:
        window = [t for t in transactions(world) if person in (t["sender"], t["receiver"]) and t["created_at"] > bound]
        return round(sum(t["amount"] if t["sender"] == person else -t["amount"] for t in window), 2)

    while abs(owed()) < 5:  # make sure someone owes something worth settling
        plant_payment(
            world, person, me, cents(rng, 10, 40), rng.choice(NOTES), days_ago(world, rng.uniform(1, span - 1))
        )
    diff = owed()  # > 0: they paid me more, so I owe them

    def oracle(c: OracleClient) -> None:
        token = c.login("wallet")
        history = c.pages("wallet", "list_transactions", access_token=token, person=person, after=bound)
        net = round(sum(t["amount"] if t["sender"] == person else -t["amount"] for t in history), 2)
        if net > 0:
            c.call("wallet", "send_money", access_token=token, receiver_email=person, amount=net, note=SETTLE_NOTE)
        elif net < 0:
            c.call("wallet", "request_money", access_token=token, payer_email=person, amount=-net, note=SETTLE_NOTE)

    when = f"{since:%B} {since.day}"
    ask = rng.choice(
        [
            "Since {when}, {person} and I have been paying each other back and forth on wallet. Settle up for "
            "everything since then: if they paid me more than I paid them, send them the difference; if I paid "
            "more, request the difference from them. Use the note '{note}'.",
            "Work out who owes whom between me and {person}, counting every wallet payment between us since {when}. "
            "If I owe them, pay the difference; if they owe me, send them a money request for it. Note: '{note}'.",
        ]
    )
    if diff > 0:
        expectations = [
            added("wallet", "transactions", sender=me, receiver=person, amount=diff, note=SETTLE_NOTE),
            updated("wallet", "account", 1, balance=round(balance(world) - diff, 2)),
        ]
    else:
        expectations = [
            added("wallet", "requests", requester=me, payer=person, amount=-diff, note=SETTLE_NOTE, status="pending")
        ]
    return TaskInstance(ask.format(when=when, person=person, note=SETTLE_NOTE), oracle, expectations)


def wallet_decline_by_amount(world: World, rng: random.Random) -> TaskInstance:
    me = my_email(world)
    for days in rng.sample(range(1, 20), 3):
        person = rng.choice(world_people(world))
        plant_request(world, person, me, cents(rng, 10, 150), rng.choice(NOTES), days_ago(world, days))
    pending = sorted(
        (r for r in requests(world) if r["payer"] == me and r["status"] == "pending"), key=lambda r: r["amount"]
    )
    # one largest and one smallest amount, whichever the task asks for
    pending[-1]["amount"] = round(max(pending[-1]["amount"], pending[-2]["amount"] + 5), 2)
    pending[0]["amount"] = round(min(pending[0]["amount"], pending[1]["amount"] / 2), 2)
    largest = rng.random() < 0.5
    target = pending[-1] if largest else pending[0]

    def oracle(c: OracleClient) -> None:
        token = c.login("wallet")
        mine = c.pages("wallet", "list_requests", access_token=token, direction="incoming", status="pending")
        pick_one = max if largest else min
        chosen = pick_one(mine, key=lambda r: r["amount"])
        c.call("wallet", "decline_request", access_token=token, request_id=chosen["request_id"])

    size = rng.choice(["largest", "biggest"] if largest else ["smallest"])
    ask = rng.choice(
        [
            "Decline the {size} money request on wallet that is still waiting for me to pay.",
            "Of the wallet requests I haven't answered yet, decline the {size} one.",
        ]
    )
    return TaskInstance(ask.format(size=size), oracle, [updated("wallet", "requests", target["id"], status="declined")])


SCENARIOS = [
    Scenario("wallet_balance", 1, ("wallet",), "train", wallet_balance),
    Scenario("wallet_send_money", 1, ("wallet",), "train", wallet_send_money),
    Scenario("wallet_decline_by_amount", 2, ("wallet",), "train", wallet_decline_by_amount),
    Scenario("wallet_request_money", 1, ("wallet",), "test_normal", wallet_request_money),
    Scenario("wallet_decline_from", 2, ("wallet",), "dev", wallet_decline_from),
    Scenario("wallet_received_in_month", 2, ("wallet",), "train", wallet_received_in_month),
    Scenario("wallet_approve_recent_small", 2, ("wallet",), "train", wallet_approve_recent_small),
    Scenario("wallet_sent_with_note", 2, ("wallet",), "test_normal", wallet_sent_with_note),
    Scenario("wallet_settle_up", 3, ("wallet",), "test_normal", wallet_settle_up),
]
