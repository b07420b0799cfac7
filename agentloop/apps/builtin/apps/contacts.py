"""Contacts: the supervisor's address book (phones, emails, relationships, birthdays, addresses, notes)."""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Any

from agentloop.apps.base import (
    ApiError,
    AppSpec,
    AppState,
    CallContext,
    boolean,
    integer,
    page_params,
    paginate,
    string,
)
from agentloop.apps.builtin.people import RELATIONSHIPS, WorldData, iso

STREETS = [
    "Maple",
    "Oak",
    "Cedar",
    "Elm",
    "Willow",
    "Lakeview",
    "Hillcrest",
    "Sunset",
    "Park",
    "Church",
    "Mill",
    "River",
    "Highland",
    "Forest",
    "Spring",
    "Chestnut",
    "Ridge",
    "Harbor",
]
STREET_KINDS = ["St", "Ave", "Rd", "Ln", "Dr", "Ct", "Blvd", "Way"]
NOTES = {
    "friend": ["Met at {place}.", "Loves {hobby}.", "Vegetarian.", "Owes me a rematch at {hobby}."],
    "coworker": ["Works on the {team} team.", "Sits two desks over.", "Go-to person for {team} questions."],
    "family": ["Allergic to peanuts.", "Sunday calls.", "Likes {hobby}.", "Spare key to the house."],
    "roommate": ["Pays utilities on the 1st.", "Has the room by the kitchen.", "Night shifts on weekdays."],
    "neighbor": ["Has a spare key.", "Waters the plants when I travel.", "Dog named {pet}."],
    "manager": ["1:1s on {weekday}s.", "Prefers Slack over email.", "Runs the {team} org."],
    "classmate": ["{school} class of {year}.", "Study group for {course}.", "Lab partner in {course}."],
}
FILL = {
    "place": ["the climbing gym", "a friend's wedding", "a book club", "the farmers market", "college orientation"],
    "hobby": ["chess", "bouldering", "board games", "tennis", "baking", "jazz records"],
    "team": ["platform", "payments", "design", "data", "mobile", "growth"],
    "pet": ["Biscuit", "Luna", "Otis", "Pepper", "Milo"],
    "weekday": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"],
    "school": ["Westbrook", "Lincoln High", "State U", "Riverside College"],
    "year": ["2012", "2014", "2016", "2019"],
    "course": ["organic chemistry", "statistics", "French", "data structures"],
}
FIELDS = (
    "first_name",
    "last_name",
    "email",
    "phone",
    "relationship",
    "birthday",
    "address",
    "city",
    "company",
    "notes",
)


def employer(data: WorldData) -> str:
    """The company the supervisor and their coworkers work at (mail signs work emails with it too)."""
    return str(data.faker("employer").company())


def build_state(data: WorldData) -> AppState:
    rng = data.rng("contacts")
    company = employer(data)
    # most of the people the supervisor knows are in the address book, not all of them
    known = [p for p in data.people if rng.random() < 0.9]
    rows: dict[str, dict[str, Any]] = {}
    for i, person in enumerate(sorted(known, key=lambda p: p.id), start=1):
        note = ""
        if rng.random() < 0.6:
            note = rng.choice(NOTES[person.relationship])
            note = re.sub(r"\{(\w+)\}", lambda m: rng.choice(FILL[m.group(1)]), note)
        works_with = person.relationship in ("coworker", "manager")
        created = data.ago(days=rng.randint(20, 1800), hours=rng.randint(0, 23))
        rows[str(i)] = {
            "id": i,
            "first_name": person.first_name,
            "last_name": person.last_name,
            "email": person.email,
            "phone": person.phone,
            "relationship": person.relationship,
            "birthday": person.birthday if rng.random() < 0.92 else None,
            "address": f"{rng.randint(1, 9899)} {rng.choice(STREETS)} {rng.choice(STREET_KINDS)}",
            "city": person.city,
            "company": company if works_with else None,
            "notes": note,
            "favorite": rng.random() < (0.35 if person.relationship == "family" else 0.08),
            "created_at": created,
            "updated_at": created,
        }
    return {"contacts": rows, "_sessions": {}}


app = AppSpec(
    name="contacts",
    description="Your address book: people's phone numbers, emails, relationships to you, birthdays and addresses.",
    build_state=build_state,
)

SUMMARY = "[{contact_id, first_name, last_name, email, phone, relationship, city, favorite}]"
DETAIL = (
    "{contact_id, first_name, last_name, email, phone, relationship, birthday, address, city, company, notes, "
    "favorite, created_at, updated_at}"
)
RELATIONSHIP = string("Your relationship to the person.", enum=list(RELATIONSHIPS))


def _summary(c: dict[str, Any]) -> dict[str, Any]:
    keys = ("first_name", "last_name", "email", "phone", "relationship", "city", "favorite")
    return {"contact_id": c["id"], **{k: c[k] for k in keys}}


def _detail(c: dict[str, Any]) -> dict[str, Any]:
    return {"contact_id": c["id"], **{k: v for k, v in c.items() if k != "id"}}


def _full_name(c: dict[str, Any]) -> str:
    return f"{c['first_name']} {c['last_name'] or ''}".strip()


def _phone(value: str) -> str:
    """Phone numbers are stored as digits, whatever punctuation they were typed with."""
    digits = re.sub(r"\D", "", value)
    if value.strip().startswith("+1") or (len(digits) == 11 and digits.startswith("1")):
        digits = digits[1:]
    if not 7 <= len(digits) <= 15:
        raise ApiError(422, f"{value!r} is not a phone number: give 7 to 15 digits, e.g. '(555) 123-4567'.")
    return digits


def _birthday(value: str) -> str:
    try:
        born = date.fromisoformat(value)
    except ValueError:
        raise ApiError(422, f"Birthday {value!r} is not a date: use YYYY-MM-DD, e.g. '1990-04-17'.") from None
    return born.isoformat()


def _email(value: str) -> str:
    email = value.strip().lower()
    if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", email):
        raise ApiError(422, f"{value!r} is not an email address.")
    return email


def _clean(fields: dict[str, Any]) -> dict[str, Any]:
    """Validate and normalise the contact fields given to add/update; an empty string clears a field."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, str):
            value = value.strip()
            if value == "" and key not in ("first_name", "notes"):
                out[key] = None
                continue
        if key == "phone":
            value = _phone(value)
        elif key == "email":
            value = _email(value)
        elif key == "birthday":
            value = _birthday(value)
        out[key] = value
    if out.get("first_name") == "":
        raise ApiError(422, "A contact needs a first name.")
    return out


def _check_email_free(ctx: CallContext, email: str | None, contact_id: int | None = None) -> None:
    if email is None:
        return
    for c in ctx.table("contacts").values():
        if c["email"] == email and c["id"] != contact_id:
            raise ApiError(
                409,
                f"{_full_name(c)} (contact_id {c['id']}) already has the email {email}. "
                "Update that contact instead, or use another address.",
            )


@app.api(
    "List your contacts, alphabetically, optionally only one relationship or only favorites.",
    params={
        "relationship": RELATIONSHIP,
        "favorite": boolean("Only favorites (true) or only non-favorites (false)."),
        "sort_by": string(
            "first_name, last_name or recently_added.",
            enum=["first_name", "last_name", "recently_added"],
            default="first_name",
        ),
        **page_params(),
    },
    returns=SUMMARY,
)
def list_contacts(
    ctx: CallContext,
    page_index: int,
    page_limit: int,
    sort_by: str,
    relationship: str | None = None,
    favorite: bool | None = None,
) -> list[dict[str, Any]]:
    rows = [
        c
        for c in ctx.table("contacts").values()
        if (relationship is None or c["relationship"] == relationship)
        and (favorite is None or c["favorite"] == favorite)
    ]
    if sort_by == "recently_added":
        rows.sort(key=lambda c: (c["created_at"], c["id"]), reverse=True)
    elif sort_by == "last_name":
        rows.sort(key=lambda c: ((c["last_name"] or "").casefold(), c["first_name"].casefold(), c["id"]))
    else:
        rows.sort(key=lambda c: (c["first_name"].casefold(), (c["last_name"] or "").casefold(), c["id"]))
    return [_summary(c) for c in paginate(rows, page_index, page_limit)]


def _haystack(c: dict[str, Any]) -> str:
    parts = [_full_name(c), c["email"], c["city"], c["company"]]
    return " ".join(p for p in parts if p).casefold()


def _matches(c: dict[str, Any], words: list[str]) -> bool:
    text = _haystack(c)
    for word in words:
        digits = re.sub(r"\D", "", word)
        if digits and len(digits) >= 3 and len(digits) == len(re.sub(r"[\s().+-]", "", word)):
            if digits not in (c["phone"] or ""):
                return False
        elif word not in text:
            return False
    return True


@app.api(
    "Search your contacts by name, email, phone number, city or company. Every word of the query must match.",
    params={
        "query": string("Words to look for, e.g. 'dana whit' or '555 0123'."),
        "relationship": RELATIONSHIP,
        **page_params(),
    },
    required=["query"],
    returns=SUMMARY,
)
def search_contacts(
    ctx: CallContext, query: str, page_index: int, page_limit: int, relationship: str | None = None
) -> list[dict[str, Any]]:
    words = query.casefold().split()
    if not words:
        raise ApiError(422, "The query is empty: give part of a name, email, phone number, city or company.")
    hits = [
        c
        for c in ctx.table("contacts").values()
        if _matches(c, words) and (relationship is None or c["relationship"] == relationship)
    ]
    hits.sort(key=lambda c: (c["first_name"].casefold(), (c["last_name"] or "").casefold(), c["id"]))
    return [_summary(c) for c in paginate(hits, page_index, page_limit)]


@app.api(
    "Show everything about one contact.",
    params={"contact_id": integer("Id of the contact.")},
    required=["contact_id"],
    returns=DETAIL,
)
def show_contact(ctx: CallContext, contact_id: int) -> dict[str, Any]:
    return _detail(ctx.get("contacts", contact_id, "contact"))


CONTACT_FIELDS = {
    "first_name": string("First name."),
    "last_name": string("Last name."),
    "email": string("Email address."),
    "phone": string("Phone number; any punctuation is fine, it is stored as digits."),
    "relationship": RELATIONSHIP,
    "birthday": string("Birthday as YYYY-MM-DD."),
    "address": string("Street address."),
    "city": string("City."),
    "company": string("Where they work."),
    "notes": string("Free-form notes."),
    "favorite": boolean("Show them among your favorites."),
}


@app.api(
    "Add a person to your contacts. Only first_name is required; an email may belong to one contact only.",
    params=CONTACT_FIELDS,
    required=["first_name"],
    returns="{contact_id}",
)
def add_contact(ctx: CallContext, first_name: str, **fields: Any) -> dict[str, Any]:
    values = _clean({"first_name": first_name, **fields})
    _check_email_free(ctx, values.get("email"))
    now = iso(ctx.now)
    record = {k: values.get(k) for k in FIELDS}
    record["notes"] = values.get("notes") or ""
    record["favorite"] = bool(values.get("favorite", False))
    contact = ctx.insert("contacts", {**record, "created_at": now, "updated_at": now})
    return {"contact_id": contact["id"]}


@app.api(
    "Change a contact. Only the fields you give change; an empty string clears a field.",
    params={"contact_id": integer("Id of the contact."), **CONTACT_FIELDS},
    required=["contact_id"],
    returns="{contact_id}",
)
def update_contact(ctx: CallContext, contact_id: int, **fields: Any) -> dict[str, Any]:
    contact = ctx.get("contacts", contact_id, "contact")
    if not fields:
        raise ApiError(422, f"Nothing to update: give at least one of {', '.join(CONTACT_FIELDS)}.")
    values = _clean(fields)
    _check_email_free(ctx, values.get("email"), contact_id)
    if "notes" in values and values["notes"] is None:
        values["notes"] = ""
    contact.update(values)
    contact["updated_at"] = iso(ctx.now)
    return {"contact_id": contact_id}


@app.api(
    "Delete a contact for good.",
    params={"contact_id": integer("Id of the contact.")},
    required=["contact_id"],
    returns="A confirmation message.",
)
def delete_contact(ctx: CallContext, contact_id: int) -> str:
    contact = ctx.get("contacts", contact_id, "contact")
    del ctx.table("contacts")[str(contact_id)]
    return f"{_full_name(contact)} (contact {contact_id}) deleted."


@app.api(
    "List the relationship labels a contact can have, with how many of your contacts have each.",
    params=page_params(default_limit=10),
    returns="[{relationship, contact_count}]",
)
def list_relationships(ctx: CallContext, page_index: int, page_limit: int) -> list[dict[str, Any]]:
    contacts = ctx.table("contacts").values()
    counts = [
        {"relationship": r, "contact_count": sum(c["relationship"] == r for c in contacts)} for r in RELATIONSHIPS
    ]
    return paginate(counts, page_index, page_limit)


def next_birthday(born: date, today: date) -> date:
    """The first birthday on or after today (29 February falls on the 28th in other years)."""
    for year in (today.year, today.year + 1):
        try:
            day = born.replace(year=year)
        except ValueError:
            day = date(year, 2, 28)
        if day >= today:
            return day
    raise AssertionError("unreachable: a birthday recurs within a year")


@app.api(
    "Contacts whose birthday falls within the next `days` days (today included), soonest first, with the age "
    "they are turning.",
    params={"days": integer("How many days ahead to look.", minimum=0, maximum=365, default=30), **page_params()},
    returns="[{contact_id, first_name, last_name, birthday, next_birthday, days_until, turning}]",
)
def upcoming_birthdays(ctx: CallContext, days: int, page_index: int, page_limit: int) -> list[dict[str, Any]]:
    today = ctx.now.date()
    rows = []
    for c in ctx.table("contacts").values():
        if not c["birthday"]:
            continue
        born = date.fromisoformat(c["birthday"])
        upcoming = next_birthday(born, today)
        if upcoming <= today + timedelta(days=days):
            rows.append(
                {
                    "contact_id": c["id"],
                    "first_name": c["first_name"],
                    "last_name": c["last_name"],
                    "birthday": c["birthday"],
                    "next_birthday": upcoming.isoformat(),
                    "days_until": (upcoming - today).days,
                    "turning": upcoming.year - born.year,
                }
            )
    rows.sort(key=lambda r: (r["days_until"], r["first_name"].casefold(), r["contact_id"]))
    return paginate(rows, page_index, page_limit)
