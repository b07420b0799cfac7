"""Scenarios on the contacts app alone."""

from __future__ import annotations

import random
from datetime import date, timedelta
from typing import Any

from agentloop.apps.builtin.apps.contacts import next_birthday
from agentloop.apps.builtin.scenarios.common import days_ago, plant
from agentloop.apps.evaluation import added, removed, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World

PLURAL = {
    "friend": "friends",
    "coworker": "coworkers",
    "family": "family members",
    "roommate": "roommates",
    "neighbor": "neighbors",
    "manager": "managers",
    "classmate": "classmates",
}
NEW_FIRST = ["Priya", "Mateo", "Ingrid", "Tobias", "Amara", "Caspian", "Noor", "Elio", "Wren", "Soren", "Yara", "Idris"]
NEW_LAST = ["Okafor", "Lindqvist", "Castellano", "Haddad", "Brennan", "Takahashi", "Moreau", "Vasquez", "Adeyemi"]
DOMAINS = ["gmail.com", "outlook.com", "proton.me", "fastmail.com"]


# --- helpers other scenario modules share --------------------------------------------------------


def contact_rows(world: World) -> list[dict[str, Any]]:
    return sorted(world.state["contacts"]["contacts"].values(), key=lambda c: c["id"])


def full_name(contact: dict[str, Any]) -> str:
    return f"{contact['first_name']} {contact['last_name']}"


def pretty_phone(digits: str) -> str:
    return f"({digits[:3]}) {digits[3:6]}-{digits[6:]}"


def new_phone(world: World, rng: random.Random) -> str:
    taken = {c["phone"] for c in contact_rows(world)}
    while True:
        digits = f"{rng.randint(201, 989)}{rng.randint(200, 999)}{rng.randint(1000, 9999)}"
        if digits not in taken:
            return digits


def new_person(world: World, rng: random.Random) -> tuple[str, str, str]:
    """A first name, last name and email nobody in the address book has."""
    names = {full_name(c) for c in contact_rows(world)}
    emails = {c["email"] for c in contact_rows(world)}
    while True:
        first, last = rng.choice(NEW_FIRST), rng.choice(NEW_LAST)
        email = f"{first.lower()}.{last.lower()}@{rng.choice(DOMAINS)}"
        if f"{first} {last}" not in names and email not in emails:
            return first, last, email


def find_contact(c: OracleClient, token: str, name: str) -> dict[str, Any]:
    hits = c.call("contacts", "search_contacts", access_token=token, query=name, page_limit=20)
    return next(h for h in hits if f"{h['first_name']} {h['last_name']}" == name)


def in_window(world: World, days: int, rng: random.Random, at_least: int, at_most: int) -> list[dict[str, Any]]:
    """Contacts whose birthday falls within today..today+days, moved in or out so that there are a few."""
    today = world.now.date()
    end = today + timedelta(days=days)
    dated = [c for c in contact_rows(world) if c["birthday"]]
    inside = [c for c in dated if next_birthday(date.fromisoformat(c["birthday"]), today) <= end]
    for c in rng.sample(inside, max(0, len(inside) - at_most)):
        born = date.fromisoformat(c["birthday"])
        c["birthday"] = _with_day(born, end + timedelta(days=rng.randint(20, 120))).isoformat()
        inside.remove(c)
    outside = [c for c in dated if c not in inside]
    for c in rng.sample(outside, max(0, at_least - len(inside))):
        born = date.fromisoformat(c["birthday"])
        c["birthday"] = _with_day(born, today + timedelta(days=rng.randint(0, days))).isoformat()
        inside.append(c)
    return sorted(inside, key=lambda c: c["id"])


def _with_day(born: date, day: date) -> date:
    """The same birth year on another month and day (kept clear of 29 February)."""
    return date(born.year, day.month, min(day.day, 28) if day.month == 2 else day.day)


# --- scenarios ----------------------------------------------------------------------------------


def contacts_phone_of(world: World, rng: random.Random) -> TaskInstance:
    person = rng.choice(contact_rows(world))
    name = full_name(person)
    ask = rng.choice(
        ["What is {name}'s phone number?", "I need to call {name}. What's their number?", "Find {name}'s phone number."]
    )

    def oracle(c: OracleClient) -> str:
        token = c.login("contacts")
        return str(find_contact(c, token, name)["phone"])

    return TaskInstance(ask.format(name=name), oracle, answer=person["phone"])


def contacts_add_new(world: World, rng: random.Random) -> TaskInstance:
    first, last, email = new_person(world, rng)
    phone = new_phone(world, rng)
    relationship = rng.choice(list(PLURAL))

    def oracle(c: OracleClient) -> None:
        token = c.login("contacts")
        c.call(
            "contacts",
            "add_contact",
            access_token=token,
            first_name=first,
            last_name=last,
            email=email,
            phone=phone,
            relationship=relationship,
        )

    return TaskInstance(
        f"Add {first} {last} to my contacts: phone {pretty_phone(phone)}, email {email}, "
        f"relationship '{relationship}'.",
        oracle,
        [
            added(
                "contacts",
                "contacts",
                first_name=first,
                last_name=last,
                email=email,
                phone=phone,
                relationship=relationship,
            )
        ],
    )


def contacts_delete_person(world: World, rng: random.Random) -> TaskInstance:
    person = rng.choice(contact_rows(world))
    name = full_name(person)

    def oracle(c: OracleClient) -> None:
        token = c.login("contacts")
        c.call("contacts", "delete_contact", access_token=token, contact_id=find_contact(c, token, name)["contact_id"])

    ask = rng.choice(["Delete {name} from my contacts.", "Remove {name} from my address book."])
    return TaskInstance(ask.format(name=name), oracle, [removed("contacts", "contacts", person["id"])])


def contacts_update_phone(world: World, rng: random.Random) -> TaskInstance:
    person = rng.choice(contact_rows(world))
    name = full_name(person)
    phone = new_phone(world, rng)
    typed = rng.choice(
        [pretty_phone(phone), f"{phone[:3]}.{phone[3:6]}.{phone[6:]}", f"+1 {phone[:3]}-{phone[3:6]}-{phone[6:]}"]
    )

    def oracle(c: OracleClient) -> None:
        token = c.login("contacts")
        hit = find_contact(c, token, name)
        c.call("contacts", "update_contact", access_token=token, contact_id=hit["contact_id"], phone=typed)

    return TaskInstance(
        f"{name} has a new phone number: {typed}. Update it in my contacts.",
        oracle,
        [updated("contacts", "contacts", person["id"], phone=phone)],
    )


def contacts_upcoming_birthdays(world: World, rng: random.Random) -> TaskInstance:
    days = rng.randint(6, 30)
    end = world.now.date() + timedelta(days=days)
    names = [full_name(c) for c in in_window(world, days, rng, at_least=2, at_most=5)]

    def oracle(c: OracleClient) -> str:
        token = c.login("contacts")
        soon = c.pages("contacts", "upcoming_birthdays", access_token=token, days=days)
        return ", ".join(f"{b['first_name']} {b['last_name']}" for b in soon)

    return TaskInstance(
        f"Which of my contacts have a birthday between today and {end:%B} {end.day} (inclusive)? "
        "Answer with their full names.",
        oracle,
        answer=names,
    )


def contacts_favorite_city(world: World, rng: random.Random) -> TaskInstance:
    contacts = contact_rows(world)
    cities = {c["city"] for c in contacts}
    city = rng.choice(
        [x for x in ("Portland", "Savannah", "Boulder", "Madison", "Tucson", "Asheville") if x not in cities]
    )
    movers = rng.sample(contacts, rng.randint(2, 4))
    for c in movers:
        c["city"], c["favorite"] = city, False

    def oracle(c: OracleClient) -> None:
        token = c.login("contacts")
        there = [x for x in c.pages("contacts", "search_contacts", access_token=token, query=city) if x["city"] == city]
        for x in there:
            if not x["favorite"]:
                c.call("contacts", "update_contact", access_token=token, contact_id=x["contact_id"], favorite=True)

    ask = rng.choice(
        [
            "Mark every contact of mine who lives in {city} as a favorite.",
            "Make all my contacts in {city} favorites.",
            "Everyone in my contacts who lives in {city} should be a favorite; please set that.",
        ]
    )
    return TaskInstance(
        ask.format(city=city),
        oracle,
        [updated("contacts", "contacts", c["id"], favorite=True) for c in movers],
    )


def contacts_merge_duplicate(world: World, rng: random.Random) -> TaskInstance:
    original = rng.choice([c for c in contact_rows(world) if c["email"]])
    name = full_name(original)
    phone = new_phone(world, rng)
    when = days_ago(world, rng.randint(3, 30))
    duplicate = plant(
        world,
        "contacts",
        "contacts",
        {
            "first_name": original["first_name"],
            "last_name": original["last_name"],
            "email": None,
            "phone": phone,
            "relationship": original["relationship"],
            "birthday": None,
            "address": None,
            "city": None,
            "company": None,
            "notes": "",
            "favorite": False,
            "created_at": when,
            "updated_at": when,
        },
    )

    def oracle(c: OracleClient) -> None:
        token = c.login("contacts")
        hits = c.call("contacts", "search_contacts", access_token=token, query=name, page_limit=20)
        both = [h for h in hits if f"{h['first_name']} {h['last_name']}" == name]
        keep = next(h for h in both if h["email"])
        drop = next(h for h in both if not h["email"])
        c.call("contacts", "update_contact", access_token=token, contact_id=keep["contact_id"], phone=drop["phone"])
        c.call("contacts", "delete_contact", access_token=token, contact_id=drop["contact_id"])

    return TaskInstance(
        f"I have two contacts for {name}. Keep the one with their email address, give it the phone number "
        "of the other one, then delete the other one.",
        oracle,
        [
            updated("contacts", "contacts", original["id"], phone=phone),
            removed("contacts", "contacts", duplicate["id"]),
        ],
    )


def contacts_round_birthdays(world: World, rng: random.Random) -> TaskInstance:
    year = world.now.year
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in contact_rows(world):
        if c["birthday"]:
            groups.setdefault(c["relationship"], []).append(c)
    relationship = rng.choice(sorted(r for r, members in groups.items() if len(members) >= 3))
    members = groups[relationship]
    for c in rng.sample(members, rng.randint(1, 2)):
        born = date.fromisoformat(c["birthday"])
        c["birthday"] = _with_day(date(year - rng.choice([30, 40, 50, 60]), 1, 1), born).isoformat()
    names = [full_name(c) for c in members if (year - int(c["birthday"][:4])) % 10 == 0]

    def oracle(c: OracleClient) -> str:
        token = c.login("contacts")
        round_age = []
        for x in c.pages("contacts", "list_contacts", access_token=token, relationship=relationship):
            detail = c.call("contacts", "show_contact", access_token=token, contact_id=x["contact_id"])
            if detail["birthday"] and (year - int(detail["birthday"][:4])) % 10 == 0:
                round_age.append(f"{x['first_name']} {x['last_name']}")
        return ", ".join(round_age)

    return TaskInstance(
        f"Which of my {PLURAL[relationship]} (relationship '{relationship}' in my contacts) turn a round age "
        f"(20, 30, 40, ...) in {year}, whether their birthday has already passed or not? Give their full names.",
        oracle,
        answer=names,
    )


def contacts_count_birthdays(world: World, rng: random.Random) -> TaskInstance:
    days = rng.choice([7, 10, 14, 21, 45, 60])
    inside = in_window(world, days, rng, at_least=1, at_most=6)

    def oracle(c: OracleClient) -> int:
        token = c.login("contacts")
        return len(list(c.pages("contacts", "upcoming_birthdays", access_token=token, days=days)))

    return TaskInstance(
        f"How many of my contacts have a birthday in the next {days} days, today included?",
        oracle,
        answer=len(inside),
    )


SCENARIOS = [
    Scenario("contacts_phone_of", 1, ("contacts",), "train", contacts_phone_of),
    Scenario("contacts_add_new", 1, ("contacts",), "train", contacts_add_new),
    Scenario("contacts_delete_person", 1, ("contacts",), "train", contacts_delete_person),
    Scenario("contacts_count_birthdays", 1, ("contacts",), "train", contacts_count_birthdays),
    Scenario("contacts_update_phone", 1, ("contacts",), "dev", contacts_update_phone),
    Scenario("contacts_upcoming_birthdays", 2, ("contacts",), "test_normal", contacts_upcoming_birthdays),
    Scenario("contacts_favorite_city", 2, ("contacts",), "train", contacts_favorite_city),
    Scenario("contacts_merge_duplicate", 2, ("contacts",), "test_normal", contacts_merge_duplicate),
    Scenario("contacts_round_birthdays", 3, ("contacts",), "train", contacts_round_birthdays),
]
