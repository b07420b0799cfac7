"""Scenarios on the notes app alone: finding, reading, editing, tagging, pinning and pruning notes."""

from __future__ import annotations

import random
import re
from datetime import date
from typing import Any

from agentloop.apps.builtin.apps.notes import GROCERIES
from agentloop.apps.builtin.people import iso
from agentloop.apps.builtin.scenarios._matchers import all_of, listed_lines, only_amount
from agentloop.apps.builtin.scenarios.common import days_ago, plant
from agentloop.apps.evaluation import Expect, added, contains, normalise_text, removed, same_items, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World

Record = dict[str, Any]

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
# notes a scenario may plant so that a tag has enough of them (titles the generator never uses)
EXTRA_NOTES: dict[str, list[tuple[str, str]]] = {
    "ideas": [
        ("App idea: plant tracker", "Reminds you when to water each plant, with photos of how it grows."),
        ("Side project: recipe box", "Scan grandma's recipe cards and tag them by season."),
        ("Garage workshop", "Pegboard wall, a small lathe and much better lighting."),
        ("Podcast concept", "Interviews with people who changed careers after forty."),
        ("Board game night theme", "Eighties arcade night with retro snacks."),
        ("Photo book", "One page per month of the year, printed before the holidays."),
        ("Bike commute route", "Along the canal, then the new bike lane past the library."),
        ("Birthday surprise", "Rent a rowing boat and pack a picnic."),
    ],
    "home": [
        ("Boiler service", "Annual check with the plumber; ask about the pressure valve."),
        ("Paint colours", "Living room: warm grey. Hallway: off-white."),
        ("Spare keys", "The neighbour has one, the other is in the blue box in the shed."),
        ("Bin days", "Recycling on Tuesdays, general waste on Fridays."),
        ("Window measurements", "Bedroom 120 x 140 cm, kitchen 90 x 100 cm."),
        ("Smoke alarm batteries", "Hallway and kitchen, replace every October."),
        ("Gutter cleaning", "Before the autumn rains; borrow the long ladder."),
        ("Meter readings", "Gas 40213, electricity 18877 at the last reading."),
    ],
    "personal": [
        ("New year goals", "Read 20 books, run a half marathon, call grandma every week."),
        ("Journal prompt", "What made me laugh this week?"),
        ("Things I'm grateful for", "Good friends, a warm flat, the Sunday market."),
        ("Letter to future me", "Open this in five years."),
        ("Places I want to live", "Lisbon for a year, then somewhere by the sea."),
        ("Language learning", "Twenty minutes of Portuguese before breakfast."),
        ("Favourite quotes", "Not all those who wander are lost."),
        ("Habits to keep", "No phone in the bedroom, a walk after lunch."),
    ],
    "work": [
        ("Performance review prep", "List the three launches I led this year."),
        ("Team offsite ideas", "Cooking class, escape room or a long hike."),
        ("Onboarding checklist", "Laptop, badge, accounts and a first-week buddy."),
        ("Conference talk outline", "Intro, the migration story, lessons learned, Q&A."),
        ("1:1 topics", "Career growth, the on-call rotation, hiring."),
        ("Expense report", "Taxi receipts from the March trip are still missing."),
        ("Promotion case", "Impact, scope, and the mentoring I did this year."),
        ("Reading group at work", "Next up: a book on distributed systems."),
    ],
}
TAG_TOPICS = sorted(EXTRA_NOTES)
RENAMES = {"ideas": "brainstorm", "home": "household", "personal": "private", "work": "job"}
MORE_GROCERIES = ["oat milk", "avocados", "honey", "peanut butter", "frozen peas", "basil", "tortillas", "salmon"]


# --- reading and planting (setup only; oracles use the APIs) ----------------------------------


def note_rows(world: World) -> list[Record]:
    return sorted(world.state["notes"]["notes"].values(), key=lambda n: n["id"])


def titled(world: World, title: str) -> Record:
    return next(n for n in note_rows(world) if n["title"] == title)


def with_tag(world: World, tag: str) -> list[Record]:
    return [n for n in note_rows(world) if tag in n["tags"]]


def plant_note(
    world: World, title: str, body: str, tags: list[str], *, days: float = 3, pinned: bool = False
) -> Record:
    """A note written `days` ago and not touched since."""
    when = days_ago(world, days)
    record = {"title": title, "body": body, "tags": tags, "pinned": pinned, "created_at": when, "updated_at": when}
    return plant(world, "notes", "notes", record)


def plant_tagged(world: World, rng: random.Random, tag: str, *, days: float, pinned: bool = False) -> Record:
    """One more note with `tag` (a title no note has yet); some carry a second tag."""
    taken = {n["title"] for n in note_rows(world)}
    title, body = rng.choice([x for x in EXTRA_NOTES[tag] if x[0] not in taken])
    tags = [tag] if rng.random() < 0.6 else [tag, rng.choice([t for t in TAGS if t != tag])]
    return plant_note(world, title, body, tags, days=days, pinned=pinned)


def fill_tag(world: World, rng: random.Random, tag: str, at_least: int) -> list[Record]:
    """Notes with `tag`, planting more until there are `at_least`."""
    while len(with_tag(world, tag)) < at_least:
        plant_tagged(world, rng, tag, days=rng.uniform(2, 300))
    return with_tag(world, tag)


def tag_list(tags: list[str]) -> str:
    return " and ".join(f"'{t}'" for t in tags)


# --- oracle helpers ----------------------------------------------------------------------------


def find_note(client: OracleClient, token: str, title: str) -> Record:
    """The note with exactly this title, found with the search box."""
    hits = client.pages("notes", "search_notes", access_token=token, query=title)
    return next(n for n in hits if n["title"] == title)


def read_note(client: OracleClient, token: str, title: str) -> str:
    found = find_note(client, token, title)
    return str(client.call("notes", "show_note", access_token=token, note_id=found["note_id"])["body"])


# --- scenarios ---------------------------------------------------------------------------------


FIXED_TITLES = [
    "Grocery list",
    "Books to read",
    "Gift ideas",
    "Old wifi password",
    "Gym routine",
    "Meeting notes",
    "Dentist",
    "Recipe: lentil soup",
    "Car service",
    "Podcast list",
]


def notes_delete_titled(world: World, rng: random.Random) -> TaskInstance:
    ask = rng.choice(
        [
            "Delete my note titled '{t}'.",
            "I don't need the '{t}' note anymore, please delete it.",
            "Get rid of the note called '{t}' in my notes app.",
            "Please remove '{t}' from my notes.",
        ]
    )
    target = titled(world, rng.choice(FIXED_TITLES))
    title = target["title"]

    def oracle(c: OracleClient) -> None:
        token = c.login("notes")
        c.call("notes", "delete_note", access_token=token, note_id=find_note(c, token, title)["note_id"])

    return TaskInstance(ask.format(t=title), oracle, [removed("notes", "notes", target["id"])])


def notes_create_tagged(world: World, rng: random.Random) -> TaskInstance:
    taken = {n["title"] for n in note_rows(world)}
    title = rng.choice([t for t in MY_NOTES if t not in taken])
    text = rng.choice(NOTE_TEXTS)
    tags = rng.sample(TAGS, rng.choice([1, 1, 2]))
    pinned = rng.random() < 0.4

    def oracle(c: OracleClient) -> None:
        token = c.login("notes")
        c.call("notes", "create_note", access_token=token, title=title, body=text, tags=tags, pinned=pinned)

    ask = rng.choice(
        [
            "Create a note titled '{title}' with the text '{text}' and the tag{s} {tags}.",
            "Make me a new note called '{title}' that says '{text}'. Tag it {tags}.",
            "Add a note '{title}' to my notes: the text is '{text}' and it gets the tag{s} {tags}.",
        ]
    )
    pin = " Pin it to the top." if pinned else ""
    instruction = ask.format(title=title, text=text, tags=tag_list(tags), s="s" if len(tags) > 1 else "") + pin
    return TaskInstance(
        instruction,
        oracle,
        [added("notes", "notes", title=title, body=text, tags=same_items(tags), pinned=pinned)],
    )


WIFI_QUESTIONS = {
    "Password": [
        "What is the password of my home wifi? It is in my notes.",
        "A friend is visiting and wants to get on our wifi. What's the current home wifi password? It's somewhere "
        "in my notes.",
        "Check my notes: what's the password of my home wifi network (the current one, not the old one)?",
    ],
    "Network": [
        "What's the name of my home wifi network? I wrote it in my notes.",
        "Which network name (SSID) does my home wifi have? Look it up in my notes.",
    ],
}


def notes_wifi_password(world: World, rng: random.Random) -> TaskInstance:
    field = rng.choice(sorted(WIFI_QUESTIONS))
    body = titled(world, "Home wifi")["body"]
    value = re.search(rf"{field}: (\S+)", body)
    assert value is not None

    def oracle(c: OracleClient) -> str:
        token = c.login("notes")
        found = re.search(rf"{field}: (\S+)", read_note(c, token, "Home wifi"))
        assert found is not None
        return found[1]

    return TaskInstance(rng.choice(WIFI_QUESTIONS[field]), oracle, answer=value[1])


def _trip(world: World) -> Record:
    return next(n for n in note_rows(world) if n["title"].startswith("Trip to "))


FACTS = {  # fact: (questions, note title of the fact (None: the trip), pattern with the answer as group 1)
    "budget": (
        ["How much have I budgeted for my {trip}? It's in my notes.", "What's the budget in my note about my {trip}?"],
        None,
        r"Budget: \$(\d+)",
    ),
    "hotel": (
        ["Which hotel am I staying at on my {trip}? Check my notes.", "What's the name of my hotel for my {trip}?"],
        None,
        r"Hotel: (.+?) Hotel\.",
    ),
    "mileage": (
        [
            "At what mileage is my car's next oil change due? Answer with the number of miles.",
            "According to my notes, at how many miles should I get the car's oil changed?",
        ],
        "Car service",
        r"due at ([\d,]+) miles",
    ),
    "dentist": (
        ["What's my dentist's name? I noted it down.", "Who is my dentist? Give me the doctor's name from my notes."],
        "Dentist",
        r"Dr\. (.+?) on the",
    ),
    "meeting": (
        ["Who did I have the Q3 planning meeting with? Check my meeting notes.", "Who was at my Q3 planning meeting?"],
        "Meeting notes",
        r"Q3 planning with (.+?)\.\n",
    ),
}


def _fact_answer(fact: str, value: str) -> Any:
    if fact in ("budget", "mileage"):
        return only_amount(float(value.replace(",", "")))
    want = normalise_text(value)

    def match(answer: Any) -> bool:
        text = normalise_text(answer)
        text = re.sub(r"^(dr\.?|doctor) ", "", text) if fact == "dentist" else text
        text = re.sub(r" hotel$", "", text) if fact == "hotel" else text
        return text == want

    return match


def notes_fact_lookup(world: World, rng: random.Random) -> TaskInstance:
    fact = rng.choice(sorted(FACTS))
    questions, title, pattern = FACTS[fact]
    note_title = title or _trip(world)["title"]
    found = re.search(pattern, titled(world, note_title)["body"])
    assert found is not None
    value = found[1]
    question = rng.choice(questions).format(trip=note_title.replace("Trip to", "trip to"))

    def oracle(c: OracleClient) -> str:
        token = c.login("notes")
        if title is None:  # the trip's note: look for it, its title names the place
            hits = c.pages("notes", "search_notes", access_token=token, query="Trip to")
            name = next(n["title"] for n in hits if n["title"].startswith("Trip to"))
        else:
            name = title
        hit = re.search(pattern, read_note(c, token, name))
        assert hit is not None
        return hit[1]

    return TaskInstance(question, oracle, answer=_fact_answer(fact, value))


def notes_count_tag(world: World, rng: random.Random) -> TaskInstance:
    tag = rng.choice(TAG_TOPICS)
    count = len(fill_tag(world, rng, tag, at_least=rng.randint(6, 8)))

    def oracle(c: OracleClient) -> int:
        token = c.login("notes")
        return len(list(c.pages("notes", "list_notes", access_token=token, tag=tag)))

    ask = rng.choice(
        [
            "How many notes do I have with the tag '{tag}'?",
            "Count my notes tagged '{tag}'. How many are there?",
            "How many of my notes carry the '{tag}' tag?",
        ]
    )
    return TaskInstance(ask.format(tag=tag), oracle, answer=count)


def notes_pin_tag(world: World, rng: random.Random) -> TaskInstance:
    tag = rng.choice(TAG_TOPICS)
    tagged = fill_tag(world, rng, tag, at_least=rng.randint(4, 6))
    first, second, done = rng.sample(tagged, 3)
    first["pinned"] = second["pinned"] = False  # at least two to pin
    done["pinned"] = True  # and one that is pinned already
    others = [n for n in note_rows(world) if tag not in n["tags"]]
    if not any(n["pinned"] for n in others):  # and at least one other note to unpin
        rng.choice(others)["pinned"] = True
    to_pin = [n for n in with_tag(world, tag) if not n["pinned"]]
    to_unpin = [n for n in note_rows(world) if tag not in n["tags"] and n["pinned"]]

    def oracle(c: OracleClient) -> None:
        token = c.login("notes")
        for n in list(c.pages("notes", "list_notes", access_token=token, tag=tag, pinned=False)):
            c.call("notes", "update_note", access_token=token, note_id=n["note_id"], pinned=True)
        for n in list(c.pages("notes", "list_notes", access_token=token, pinned=True)):
            if tag not in n["tags"]:
                c.call("notes", "update_note", access_token=token, note_id=n["note_id"], pinned=False)

    ask = rng.choice(
        [
            "Pin every note tagged '{tag}' and unpin all my other notes, so only the '{tag}' ones stay on top.",
            "I want exactly my '{tag}' notes pinned: pin the ones that aren't yet and unpin every note without "
            "that tag.",
            "Reorganise my pinned notes: all notes with the tag '{tag}' should be pinned, no other note should be.",
        ]
    )
    return TaskInstance(
        ask.format(tag=tag),
        oracle,
        [updated("notes", "notes", n["id"], pinned=True) for n in to_pin]
        + [updated("notes", "notes", n["id"], pinned=False) for n in to_unpin],
    )


def notes_retag(world: World, rng: random.Random) -> TaskInstance:
    old = rng.choice(TAG_TOPICS)
    new = RENAMES[old]
    tagged = fill_tag(world, rng, old, at_least=rng.randint(3, 5))
    if all(len(n["tags"]) == 1 for n in tagged):  # one note with a second tag, which must stay
        rng.choice(tagged)["tags"].append(rng.choice([t for t in TAGS if t != old]))

    def oracle(c: OracleClient) -> None:
        token = c.login("notes")
        for n in list(c.pages("notes", "list_notes", access_token=token, tag=old)):
            tags = [new if t == old else t for t in n["tags"]]
            c.call("notes", "update_note", access_token=token, note_id=n["note_id"], tags=tags)

    ask = rng.choice(
        [
            "Rename my tag '{old}' to '{new}': every note tagged '{old}' should be tagged '{new}' instead, "
            "keeping its other tags.",
            "I'm switching from the tag '{old}' to '{new}'. Change it on all my notes that have it and leave their "
            "other tags alone.",
            "Replace the '{old}' tag with '{new}' on each of my notes (any other tags a note has stay as they are).",
        ]
    )
    return TaskInstance(
        ask.format(old=old, new=new),
        oracle,
        [
            updated("notes", "notes", n["id"], tags=same_items([new if t == old else t for t in n["tags"]]))
            for n in tagged
        ],
    )


def notes_grocery_edit(world: World, rng: random.Random) -> TaskInstance:
    note = titled(world, "Grocery list")
    items = [line.removeprefix("- ") for line in note["body"].splitlines()]
    new = rng.sample([g for g in GROCERIES + MORE_GROCERIES if g not in items], 2)

    def clashes(word: str, others: list[str]) -> bool:
        return any(re.search(rf"\b{re.escape(word)}\b", o) or re.search(rf"\b{re.escape(o)}\b", word) for o in others)

    drop = rng.choice([i for i in items if not clashes(i, [x for x in items + new if x != i])])
    kept = [i for i in items if i != drop]

    def oracle(c: OracleClient) -> None:
        token = c.login("notes")
        found = find_note(c, token, "Grocery list")
        body = c.call("notes", "show_note", access_token=token, note_id=found["note_id"])["body"]
        lines = [line for line in body.splitlines() if line.removeprefix("- ") != drop]
        text = "\n".join(lines + [f"- {x}" for x in new])
        c.call("notes", "update_note", access_token=token, note_id=found["note_id"], body=text)

    ask = rng.choice(
        [
            "Update my grocery list note: take {drop} off it and add {a} and {b}.",
            "I already bought {drop}, so remove it from my 'Grocery list' note, and put {a} and {b} on the list.",
            "Edit the note 'Grocery list': add {a}, add {b}, and delete the line with {drop}.",
        ]
    )

    def without_drop(body: Any) -> bool:
        return isinstance(body, str) and not re.search(rf"\b{re.escape(drop)}\b", body.casefold())

    return TaskInstance(
        ask.format(drop=drop, a=new[0], b=new[1]),
        oracle,
        [updated("notes", "notes", note["id"], body=all_of(without_drop, *(contains(x) for x in kept + new)))],
    )


def notes_tag_digest(world: World, rng: random.Random) -> TaskInstance:
    tag = rng.choice(TAG_TOPICS)
    tagged = fill_tag(world, rng, tag, at_least=rng.randint(4, 7))
    title = rng.choice(["Index of my {tag} notes", "All '{tag}' notes", "{Tag} notes: overview"]).format(
        tag=tag, Tag=tag.capitalize()
    )

    def oracle(c: OracleClient) -> None:
        token = c.login("notes")
        titles = [n["title"] for n in c.pages("notes", "list_notes", access_token=token, tag=tag)]
        c.call("notes", "create_note", access_token=token, title=title, body="\n".join(titles))

    ask = rng.choice(
        [
            "Create a note titled \"{title}\" that lists the titles of all my notes tagged '{tag}', one per line.",
            "I want an overview of my '{tag}' notes: make a new note called \"{title}\" whose text is the title of "
            "every note with that tag, one title per line.",
        ]
    )
    return TaskInstance(
        ask.format(title=title, tag=tag),
        oracle,
        [added("notes", "notes", title=title, body=listed_lines([n["title"] for n in tagged]))],
    )


CUTOFFS = [date(2024, 10, 1), date(2024, 12, 1), date(2025, 1, 1), date(2025, 2, 1)]


def notes_prune_old(world: World, rng: random.Random) -> TaskInstance:
    tag = rng.choice(TAG_TOPICS)
    cutoff = rng.choice(CUTOFFS)
    bound = iso(world.now.replace(year=cutoff.year, month=cutoff.month, day=cutoff.day, hour=0))
    age = (world.now.date() - cutoff).days  # days from the cutoff to today
    for n in with_tag(world, tag):  # nothing within a day of the cutoff
        if abs((date.fromisoformat(n["updated_at"][:10]) - cutoff).days) <= 1:
            n["updated_at"] = days_ago(world, age + 3)
            n["created_at"] = min(n["created_at"], n["updated_at"])
    old = [n for n in with_tag(world, tag) if n["updated_at"] < bound]
    while sum(not n["pinned"] for n in old) < 2:  # at least two to delete
        old.append(plant_tagged(world, rng, tag, days=age + rng.uniform(5, 90)))
    if not any(n["pinned"] for n in old):  # an old pinned one, which stays
        old.append(plant_tagged(world, rng, tag, days=age + rng.uniform(5, 90), pinned=True))
    if not [n for n in with_tag(world, tag) if n["updated_at"] >= bound]:  # and a recent one, which stays
        plant_tagged(world, rng, tag, days=rng.uniform(2, age - 5))
    doomed = [n for n in with_tag(world, tag) if n["updated_at"] < bound and not n["pinned"]]

    def oracle(c: OracleClient) -> None:
        token = c.login("notes")
        for n in list(c.pages("notes", "list_notes", access_token=token, tag=tag, pinned=False)):
            if n["updated_at"] < bound:
                c.call("notes", "delete_note", access_token=token, note_id=n["note_id"])

    when = f"{cutoff:%B} {cutoff.day}, {cutoff.year}"
    ask = rng.choice(
        [
            "Clean up my '{tag}' notes: delete every one that was last updated before {when}, but keep the pinned "
            "ones.",
            "Delete my notes tagged '{tag}' that nobody has touched since before {when} (last updated before that "
            "day). Pinned notes stay, whatever their date.",
            "Time for a tidy-up. Any note with the tag '{tag}' whose last update is older than {when} can go, unless "
            "it's pinned.",
        ]
    )
    expectations: list[Expect] = [removed("notes", "notes", n["id"]) for n in doomed]
    return TaskInstance(ask.format(tag=tag, when=when), oracle, expectations)


SCENARIOS = [
    Scenario("notes_delete_titled", 1, ("notes",), "train", notes_delete_titled),
    Scenario("notes_create_tagged", 1, ("notes",), "train", notes_create_tagged),
    Scenario("notes_count_tag", 1, ("notes",), "train", notes_count_tag),
    Scenario("notes_wifi_password", 1, ("notes",), "dev", notes_wifi_password),
    Scenario("notes_fact_lookup", 1, ("notes",), "test_normal", notes_fact_lookup),
    Scenario("notes_pin_tag", 2, ("notes",), "train", notes_pin_tag),
    Scenario("notes_grocery_edit", 2, ("notes",), "train", notes_grocery_edit),
    Scenario("notes_tag_digest", 2, ("notes",), "dev", notes_tag_digest),
    Scenario("notes_retag", 2, ("notes",), "test_normal", notes_retag),
    Scenario("notes_prune_old", 3, ("notes",), "train", notes_prune_old),
]
