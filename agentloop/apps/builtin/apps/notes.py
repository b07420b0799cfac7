"""Notes: the supervisor's personal notes, with tags and pinning."""

from __future__ import annotations

from typing import Any

from agentloop.apps.base import (
    ApiError,
    AppSpec,
    AppState,
    CallContext,
    array,
    boolean,
    integer,
    page_params,
    paginate,
    string,
)
from agentloop.apps.builtin.people import WorldData, iso

GROCERIES = [
    "milk",
    "eggs",
    "bread",
    "spinach",
    "apples",
    "rice",
    "coffee",
    "olive oil",
    "yogurt",
    "pasta",
    "tomatoes",
    "cheddar",
    "bananas",
    "chicken thighs",
    "oats",
    "lentils",
    "garlic",
    "lemons",
]
BOOKS = [
    "The Overstory",
    "Piranesi",
    "Klara and the Sun",
    "Project Hail Mary",
    "The Left Hand of Darkness",
    "Middlemarch",
    "Pachinko",
    "The Remains of the Day",
    "Circe",
    "Station Eleven",
]
PLACES = ["Lisbon", "Kyoto", "Vancouver", "Oaxaca", "Edinburgh", "Cape Town", "Reykjavik", "Seoul"]


def _note_bodies(data: WorldData) -> list[tuple[str, str, list[str]]]:
    rng = data.rng("notes")
    fake = data.faker("notes")
    friends = rng.sample(data.people, 6)
    notes: list[tuple[str, str, list[str]]] = [
        ("Grocery list", "\n".join(f"- {g}" for g in rng.sample(GROCERIES, 7)), ["shopping"]),
        (
            "Home wifi",
            f"Network: {fake.word().capitalize()}Net-{rng.randint(10, 99)}\n"
            f"Password: {fake.password(length=12, special_chars=False)}",
            ["home"],
        ),
        ("Books to read", "\n".join(f"- {b}" for b in rng.sample(BOOKS, 5)), ["reading"]),
        (
            "Gift ideas",
            "\n".join(
                f"- {p.first_name}: {fake.word()} {rng.choice(['mug', 'scarf', 'book', 'plant'])}" for p in friends[:3]
            ),
            ["personal"],
        ),
        ("Old wifi password", f"Password: {fake.password(length=10, special_chars=False)}", ["home"]),
        (
            f"Trip to {rng.choice(PLACES)}",
            f"Flights booked. Hotel: {fake.company()} Hotel.\nBudget: ${rng.randint(8, 30) * 100}",
            ["travel"],
        ),
        ("Gym routine", "Mon: legs\nWed: back and arms\nFri: cardio 30 min", ["health"]),
        ("Meeting notes", f"Q3 planning with {friends[3].name}.\nAction items: {fake.sentence(nb_words=8)}", ["work"]),
        ("Dentist", f"Appointment with Dr. {fake.last_name()} on the 14th at 3pm.", ["health"]),
        ("Recipe: lentil soup", "Lentils, onion, carrot, cumin, stock. Simmer 40 minutes.", ["cooking"]),
        ("Car service", f"Oil change due at {rng.randint(40, 90)},000 miles.", ["car"]),
        ("Podcast list", "\n".join(f"- {fake.catch_phrase()}" for _ in range(4)), ["reading"]),
    ]
    for _ in range(rng.randint(8, 14)):
        notes.append(
            (
                fake.sentence(nb_words=3).rstrip("."),
                fake.paragraph(nb_sentences=3),
                [rng.choice(["personal", "work", "ideas", "home"])],
            )
        )
    return notes


def build_state(data: WorldData) -> AppState:
    rng = data.rng("notes-dates")
    rows = {}
    for i, (title, body, tags) in enumerate(_note_bodies(data), start=1):
        created = data.ago(days=rng.randint(2, 400), hours=rng.randint(0, 23))
        rows[str(i)] = {
            "id": i,
            "title": title,
            "body": body,
            "tags": tags,
            "pinned": rng.random() < 0.15,
            "created_at": created,
            "updated_at": created,
        }
    return {"notes": rows, "_sessions": {}}


app = AppSpec(
    name="notes", description="Your personal notes: write, tag, pin, search and delete them.", build_state=build_state
)

NOTE_SUMMARY = "[{note_id, title, tags, pinned, updated_at}]"


def _summary(note: dict[str, Any]) -> dict[str, Any]:
    return {
        "note_id": note["id"],
        "title": note["title"],
        "tags": note["tags"],
        "pinned": note["pinned"],
        "updated_at": note["updated_at"],
    }


@app.api(
    "List your notes, pinned first then most recently updated, optionally only those with a tag.",
    params={
        "tag": string("Only notes with this tag."),
        "pinned": boolean("Only pinned (or unpinned) notes."),
        **page_params(),
    },
    returns=NOTE_SUMMARY,
)
def list_notes(
    ctx: CallContext, page_index: int, page_limit: int, tag: str | None = None, pinned: bool | None = None
) -> list[dict[str, Any]]:
    notes = [
        n
        for n in ctx.table("notes").values()
        if (tag is None or tag in n["tags"]) and (pinned is None or n["pinned"] == pinned)
    ]
    notes.sort(key=lambda n: n["updated_at"], reverse=True)
    notes.sort(key=lambda n: not n["pinned"])
    return [_summary(n) for n in paginate(notes, page_index, page_limit)]


@app.api(
    "Search your notes: case-insensitive match of the query in the title or body.",
    params={"query": string("Text to look for."), **page_params()},
    required=["query"],
    returns=NOTE_SUMMARY,
)
def search_notes(ctx: CallContext, query: str, page_index: int, page_limit: int) -> list[dict[str, Any]]:
    q = query.casefold().strip()
    hits = [n for n in ctx.table("notes").values() if q in n["title"].casefold() or q in n["body"].casefold()]
    # titles that match rank first, as a search box would
    hits.sort(key=lambda n: (q not in n["title"].casefold(), n["title"]))
    return [_summary(n) for n in paginate(hits, page_index, page_limit)]


@app.api(
    "Show one note with its full body.",
    params={"note_id": integer("Id of the note.")},
    required=["note_id"],
    returns="{note_id, title, body, tags, pinned, created_at, updated_at}",
)
def show_note(ctx: CallContext, note_id: int) -> dict[str, Any]:
    note = ctx.get("notes", note_id, "note")
    return {"note_id": note["id"], **{k: v for k, v in note.items() if k != "id"}}


@app.api(
    "Create a note.",
    params={
        "title": string("Title.", minLength=1),
        "body": string("Text of the note."),
        "tags": array("Tags.", {"type": "string"}),
        "pinned": boolean("Pin it to the top."),
    },
    required=["title"],
    returns="{note_id}",
)
def create_note(
    ctx: CallContext, title: str, body: str = "", tags: list[str] | None = None, pinned: bool = False
) -> dict[str, Any]:
    now = iso(ctx.now)
    note = ctx.insert(
        "notes",
        {
            "title": title,
            "body": body,
            "tags": list(tags or []),
            "pinned": pinned,
            "created_at": now,
            "updated_at": now,
        },
    )
    return {"note_id": note["id"]}


@app.api(
    "Change a note's title, body, tags or pinning. Only the fields you give change.",
    params={
        "note_id": integer("Id of the note."),
        "title": string("New title.", minLength=1),
        "body": string("New body."),
        "tags": array("New tags (replace the old ones).", {"type": "string"}),
        "pinned": boolean("Pin or unpin."),
    },
    required=["note_id"],
    returns="{note_id}",
)
def update_note(ctx: CallContext, note_id: int, **changes: Any) -> dict[str, Any]:
    note = ctx.get("notes", note_id, "note")
    if not changes:
        raise ApiError(422, "Nothing to update: give at least one of title, body, tags, pinned.")
    note.update({k: (list(v) if k == "tags" else v) for k, v in changes.items()})
    note["updated_at"] = iso(ctx.now)
    return {"note_id": note_id}


@app.api(
    "Delete a note for good.",
    params={"note_id": integer("Id of the note.")},
    required=["note_id"],
    returns="A confirmation message.",
)
def delete_note(ctx: CallContext, note_id: int) -> str:
    ctx.get("notes", note_id, "note")
    del ctx.table("notes")[str(note_id)]
    return f"Note {note_id} deleted."
