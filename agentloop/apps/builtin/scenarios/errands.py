"""Scenarios that combine the shop or the calendar with other apps (wallet, notes)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from agentloop.apps.builtin.people import iso
from agentloop.apps.builtin.scenarios._matchers import all_of
from agentloop.apps.builtin.scenarios._when import clock, day_label
from agentloop.apps.builtin.scenarios.calendar import BIRTHDAY, events, midnight, new_event, people_emails
from agentloop.apps.builtin.scenarios.common import days_ago, my_email, plant
from agentloop.apps.builtin.scenarios.notes import find_note
from agentloop.apps.builtin.scenarios.shop import buyable, cart_lines, plant_order, products, the
from agentloop.apps.builtin.scenarios.wallet import world_people
from agentloop.apps.evaluation import added, contains
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World

EMAIL = re.compile(r"[\w.+'-]+@[\w-]+(?:\.[\w-]+)+")


def emails_exactly(expected: list[str]) -> Callable[[Any], bool]:
    """Matcher for a text: the email addresses in it are exactly these, whatever the layout."""
    want = {e.casefold() for e in expected}
    return lambda v: isinstance(v, str) and {m.casefold() for m in EMAIL.findall(v)} == want


def shop_split_order(world: World, rng: random.Random) -> TaskInstance:
    """Two friends chipped in on an order: request a third of its total from each on wallet."""
    stock = buyable(world)
    pairs = [
        (a, b)
        for i, a in enumerate(stock)
        for b in stock[i + 1 :]
        if a["price"] + b["price"] >= 35 and round((a["price"] + b["price"]) * 100) % 3 == 0
    ]
    pair = list(rng.choice(pairs))
    order = plant_order(world, rng, pair, [1, 1], placed_days_ago=rng.uniform(5, 20))
    share = round(order["total"] / 3, 2)
    friends = rng.sample(world_people(world), 2)
    hint, day = pair[0]["name"], order["placed_at"][:10]
    me, note = my_email(world), "our shop order"

    def oracle(c: OracleClient) -> None:
        stoken = c.login("shop")
        mine = next(
            o
            for o in c.pages("shop", "list_orders", access_token=stoken)
            if o["placed_at"].startswith(day) and hint in o["products"]
        )
        amount = round(mine["total"] / 3, 2)
        wtoken = c.login("wallet")
        for friend in friends:
            c.call("wallet", "request_money", access_token=wtoken, payer_email=friend, amount=amount, note=note)

    return TaskInstance(
        f"{friends[0]} and {friends[1]} chipped in on my shop order from {day_label(order['placed_at'])} (the one "
        f"with {the(hint)}). Split its total evenly between the three of us and send each of them a wallet money "
        f"request for their share, with the note '{note}'.",
        oracle,
        [
            added("wallet", "requests", requester=me, payer=f, amount=share, note=note, status="pending")
            for f in friends
        ],
    )


GATHERINGS = ["Trivia night", "Hiking trip planning", "Surprise party planning", "Volunteer briefing", "Game jam"]


def calendar_guest_list_note(world: World, rng: random.Random) -> TaskInstance:
    title = rng.choice(GATHERINGS)
    guests = rng.sample(people_emails(world), rng.randint(3, 4))
    start = midnight(world, rng.randint(3, 30)) + timedelta(hours=rng.randint(17, 19))
    event = plant(world, "calendar", "events", new_event(world, title, start, 120, attendees=guests))
    day, note_title = event["start"][:10], f"{title} guests"

    def oracle(c: OracleClient) -> None:
        ctoken = c.login("calendar")
        hits = c.pages("calendar", "search_events", access_token=ctoken, query=title)
        found = next(e for e in hits if e["title"] == title and e["start"].startswith(day))
        invited = c.call("calendar", "show_event", access_token=ctoken, event_id=found["event_id"])["attendees"]
        ntoken = c.login("notes")
        c.call("notes", "create_note", access_token=ntoken, title=note_title, body="\n".join(invited))

    return TaskInstance(
        f"Create a note titled '{note_title}' with the email address of everyone I invited to my '{title}' on "
        f"{day_label(event['start'])}, one per line.",
        oracle,
        [added("notes", "notes", title=note_title, body=emails_exactly(guests))],
    )


APPOINTMENTS = [  # (what, with whom, where, what to bring)
    ("Eye exam", "Dr. {}", "Brightview Eye Care, 12 Elm Street", "Bring your current glasses."),
    ("Physiotherapy", "{}", "MoveWell Physio, 480 Harbor Road", "Wear comfortable clothes."),
    ("Dermatologist", "Dr. {}", "Clearskin Clinic, 9 Birch Lane", "List the creams you use."),
    ("Tax advisor", "{}", "Lee & Partners, 77 Market Street, suite 4", "Bring last year's return."),
    ("Orthodontist", "Dr. {}", "Smile Studio, 301 Oak Avenue", "Bring the retainer."),
]
SURNAMES = ["Okafor", "Lindqvist", "Moreau", "Tanaka", "Haddad", "Kowalski", "Brennan", "Castillo", "Nguyen", "Adler"]
BOOKED = re.compile(r"Booked for \w+, (\w+ \d+, \d{4}) at (\d\d:\d\d) UTC \((\d+) minutes\)")


def calendar_from_note(world: World, rng: random.Random) -> TaskInstance:
    kind, who, place, tip = rng.choice(APPOINTMENTS)
    title = f"{kind} with {who.format(rng.choice(SURNAMES))}"
    day = midnight(world, rng.randint(3, 30))
    while day.weekday() >= 5:
        day += timedelta(days=1)
    start = day + timedelta(hours=rng.randint(8, 16), minutes=rng.choice([0, 15, 30, 45]))
    minutes = rng.choice([30, 45, 60])
    begin, finish = iso(start), iso(start + timedelta(minutes=minutes))
    body = (
        f"Booked for {day_label(begin)}, {start.year} at {clock(begin)} UTC ({minutes} minutes).\nPlace: {place}\n{tip}"
    )
    written = days_ago(world, rng.randint(1, 6))
    plant(
        world,
        "notes",
        "notes",
        {"title": title, "body": body, "tags": ["money" if kind == "Tax advisor" else "health"], "pinned": False}
        | {"created_at": written, "updated_at": written},
    )

    def oracle(c: OracleClient) -> None:
        ntoken = c.login("notes")
        text = c.call("notes", "show_note", access_token=ntoken, note_id=find_note(c, ntoken, title)["note_id"])["body"]
        booked = BOOKED.search(text)
        assert booked is not None
        when = datetime.strptime(f"{booked[1]} {booked[2]} +0000", "%B %d, %Y %H:%M %z")
        where = next(line.removeprefix("Place: ") for line in text.splitlines() if line.startswith("Place: "))
        ctoken = c.login("calendar")
        c.call(
            "calendar",
            "create_event",
            access_token=ctoken,
            title=title,
            start=iso(when),
            end=iso(when + timedelta(minutes=int(booked[3]))),
            location=where,
        )

    return TaskInstance(
        f"My note '{title}' has the details of an appointment. Put it on my calendar titled '{title}', with the "
        "right start and end time and its place as the location.",
        oracle,
        [added("calendar", "events", title=title, start=begin, end=finish, location=place)],
    )


def shop_birthday_gift(world: World, rng: random.Random) -> TaskInstance:
    today = iso(midnight(world, 0))
    tomorrow = iso(midnight(world, 1))
    upcoming = sorted(
        (e for e in events(world) if e["all_day"] and e["title"].endswith(BIRTHDAY) and e["start"] >= tomorrow),
        key=lambda e: e["start"],
    )
    if not upcoming:
        raise RuntimeError("shop_birthday_gift: this world's calendar has no birthday after today")
    first = upcoming[0]
    for twin in upcoming[1:]:  # another birthday the same day would make "the next one" ambiguous
        if twin["start"] == first["start"]:
            del world.state["calendar"]["events"][str(twin["id"])]
    name = first["title"].removesuffix(BIRTHDAY)

    in_cart = {c["product_id"] for c in cart_lines(world)}
    options = []
    for category in sorted({p["category"] for p in products(world)}):
        for cap in (20, 25, 30, 40, 50, 60, 80, 100):
            shelf = sorted(
                (p for p in products(world) if p["category"] == category and p["stock"] > 0 and p["price"] < cap),
                key=lambda p: -p["rating"],
            )
            exact = any(p["category"] == category and p["price"] == cap for p in products(world))
            if (
                len(shelf) >= 3
                and shelf[0]["rating"] > shelf[1]["rating"]
                and shelf[0]["id"] not in in_cart
                and not exact
            ):
                options.append((category, cap, shelf[0]))
    category, cap, gift = rng.choice(options)

    def oracle(c: OracleClient) -> None:
        ctoken = c.login("calendar")
        listed = c.pages("calendar", "list_events", access_token=ctoken, after=tomorrow)
        birthday = next(e for e in listed if e["all_day"] and e["title"].endswith(BIRTHDAY) and e["start"] >= tomorrow)
        who = birthday["title"].removesuffix(BIRTHDAY)
        stoken = c.login("shop")
        shelf = list(
            c.pages(
                "shop",
                "search_products",
                access_token=stoken,
                category=category,
                max_price=cap - 0.01,
                in_stock_only=True,
                sort_by="rating",
            )
        )
        best = max(shelf, key=lambda p: p["rating"])
        c.call("shop", "add_to_cart", access_token=stoken, product_id=best["product_id"], quantity=1)
        ntoken = c.login("notes")
        c.call("notes", "create_note", access_token=ntoken, title="Birthday gift", body=f"For {who}: {best['name']}")

    return TaskInstance(
        f"Today is {day_label(today)}. Find whose birthday is the next one on my calendar after today and get them "
        f"a present: add the best-rated in-stock product under ${cap} from the shop's {category} category to my "
        "cart. Then create a note titled 'Birthday gift' that says whose birthday it is and which product I got.",
        oracle,
        [
            added("shop", "cart_items", product_id=gift["id"], quantity=1),
            added("notes", "notes", title="Birthday gift", body=all_of(contains(name), contains(gift["name"]))),
        ],
    )


SCENARIOS = [
    Scenario("shop_split_order", 3, ("shop", "wallet"), "train", shop_split_order),
    Scenario("calendar_guest_list_note", 2, ("calendar", "notes"), "train", calendar_guest_list_note),
    Scenario("calendar_from_note", 2, ("notes", "calendar"), "dev", calendar_from_note),
    Scenario("shop_birthday_gift", 3, ("calendar", "shop", "notes"), "test_normal", shop_birthday_gift),
]
