"""Scenarios about the supervisor's own profile, addresses and cards: one or two calls, no login."""

from __future__ import annotations

import random
from typing import Any

from agentloop.apps.builtin.scenarios._matchers import Matcher, same_date
from agentloop.apps.builtin.scenarios.common import me, plant
from agentloop.apps.evaluation import normalise_text, same_digits
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World

ADDRESS_QUESTIONS = {
    "zip_code": [
        "What is the ZIP code of my {place} address?",
        "I'm filling in a form. What's the zip code of my {place} address?",
        "Look up my {place} address and tell me its postal (ZIP) code.",
    ],
    "city": [
        "Which city is my {place} address in?",
        "In what city is the {place} address I have saved?",
        "Tell me the city of my {place} address.",
    ],
    "street_address": [
        "What's the street address (number and street) of my {place} address?",
        "Give me just the street line of my saved {place} address.",
    ],
}
EXTRA_CARDS = ["Mastercard Cashback", "Amex Gold", "Debit Checking", "Mastercard Groceries"]
EXPIRY_QUESTIONS = {
    "first": [
        "Which of my payment cards expires first? Give its name.",
        "One of my cards is going to expire before the others. Which one? Tell me the card's name.",
        "What's the name of the payment card of mine that expires soonest?",
    ],
    "last": [
        "Which of my payment cards has the latest expiry date? Give its name.",
        "Which card of mine stays valid the longest? Tell me the card's name.",
    ],
}
DIGITS_QUESTIONS = [
    "What are the last four digits of my {card} card?",
    "Which four digits does my {card} card end with?",
    "I need to confirm my {card} card over the phone. What are its last 4 digits?",
]
BIRTHDAY_QUESTIONS = [
    "What's my date of birth? I need it for {purpose}.",
    "I'm doing {purpose} and it asks when I was born. What's the full date?",
    "For {purpose} I have to give my birth date. What is it?",
]
PURPOSES = [
    "a passport renewal",
    "a gym membership form",
    "a rental application",
    "an insurance quote",
    "a new bank account",
]


def card_rows(world: World) -> list[dict[str, Any]]:
    return sorted(world.state["supervisor"]["payment_cards"].values(), key=lambda c: c["id"])


def named(name: str) -> Matcher:
    """Answer matcher for a card's name, with or without the word 'card' after it."""
    want = normalise_text(name)
    return lambda v: isinstance(v, str) and normalise_text(v).removesuffix(" card").removeprefix("my ") == want


def supervisor_address_field(world: World, rng: random.Random) -> TaskInstance:
    address = rng.choice(sorted(world.state["supervisor"]["addresses"].values(), key=lambda a: a["id"]))
    field = rng.choice(sorted(ADDRESS_QUESTIONS))
    question = rng.choice(ADDRESS_QUESTIONS[field]).format(place=address["name"].lower())
    place = address["name"]

    def oracle(c: OracleClient) -> str:
        saved = c.call("supervisor", "show_addresses")
        return str(next(a for a in saved if a["name"] == place)[field])

    return TaskInstance(question, oracle, answer=address[field])


def supervisor_card_expiry(world: World, rng: random.Random) -> TaskInstance:
    """Three cards whose MM/YY dates sort differently as text than in time, so reading them right matters."""
    which = rng.choice(sorted(EXPIRY_QUESTIONS))
    extra = rng.choice(EXTRA_CARDS)
    plant(
        world,
        "supervisor",
        "payment_cards",
        {
            "card_name": extra,
            "owner_name": f"{me(world)['first_name']} {me(world)['last_name']}",
            "card_number": "5" + "".join(str(rng.randint(0, 9)) for _ in range(15)),
            "expiry_date": "",
            "cvv_number": f"{rng.randint(100, 999)}",
        },
    )
    cards = card_rows(world)
    while True:
        dates = [(rng.randint(26, 31), rng.randint(1, 12)) for _ in cards]  # (year, month)
        if len(set(dates)) < len(dates):
            continue
        texts = [f"{m:02d}/{y}" for y, m in dates]
        pick = min if which == "first" else max
        if pick(texts) != texts[dates.index(pick(dates))]:  # naive text order gives the wrong card
            break
    for card, text in zip(cards, texts, strict=True):
        card["expiry_date"] = text
    answer = cards[dates.index(pick(dates))]["card_name"]

    def oracle(c: OracleClient) -> str:
        listed = c.call("supervisor", "show_payment_cards")

        def when(card: dict[str, Any]) -> tuple[int, int]:
            month, year = card["expiry_date"].split("/")
            return int(year), int(month)

        chosen = min(listed, key=when) if which == "first" else max(listed, key=when)
        return str(chosen["card_name"])

    news = rng.choice(
        ["I just added my {card} card.", "My new {card} card is saved now.", "Since I got the {card} card:"]
    )
    question = f"{news.format(card=extra)} {rng.choice(EXPIRY_QUESTIONS[which])}"
    return TaskInstance(question, oracle, answer=named(answer))


def supervisor_card_digits(world: World, rng: random.Random) -> TaskInstance:
    card = rng.choice(card_rows(world))
    name = card["card_name"]

    def oracle(c: OracleClient) -> str:
        listed = c.call("supervisor", "show_payment_cards")
        return str(next(x for x in listed if x["card_name"] == name)["card_number"])[-4:]

    return TaskInstance(
        rng.choice(DIGITS_QUESTIONS).format(card=name), oracle, answer=same_digits(card["card_number"][-4:])
    )


def supervisor_birthday(world: World, rng: random.Random) -> TaskInstance:
    born = me(world)["birthday"]

    def oracle(c: OracleClient) -> str:
        return str(c.call("supervisor", "show_profile")["birthday"])

    question = rng.choice(BIRTHDAY_QUESTIONS).format(purpose=rng.choice(PURPOSES))
    return TaskInstance(question, oracle, answer=same_date(born))


SCENARIOS = [
    Scenario("supervisor_address_field", 1, ("supervisor",), "train", supervisor_address_field),
    Scenario("supervisor_card_digits", 1, ("supervisor",), "train", supervisor_card_digits),
    Scenario("supervisor_birthday", 1, ("supervisor",), "train", supervisor_birthday),
    Scenario("supervisor_card_expiry", 1, ("supervisor",), "test_normal", supervisor_card_expiry),
]
