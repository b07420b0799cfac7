"""Calendar: the supervisor's events (meetings, birthdays, trips, appointments) and invitations from others."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, time, timedelta
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
from agentloop.apps.builtin.apps._iso_time import canonical_time, parse_time
from agentloop.apps.builtin.people import Person, WorldData, iso

RESTAURANTS = [
    "Olive & Thyme",
    "The Copper Pot",
    "Sakura House",
    "Luna Trattoria",
    "Blue Door Bistro",
    "Casa Verde",
    "The Brass Lantern",
    "Pho Saigon",
]
CAFES = ["Common Grounds", "Little Owl Coffee", "Bean There", "The Daily Grind", "Steam & Co."]
CITIES = ["Lisbon", "Kyoto", "Vancouver", "Oaxaca", "Edinburgh", "Cape Town", "Reykjavik", "Seoul", "Montreal"]
ROOMS = ["Conference room A", "Conference room B", "Maple room", "Harbor room", "Zoom"]
PROJECTS = ["Atlas", "Beacon", "Cobalt", "Driftwood", "Evergreen", "Falcon"]
TOPICS = ["writing good docs", "observability", "accessibility basics", "negotiation", "SQL tuning"]
BOOKS = ["Piranesi", "Pachinko", "Circe", "Station Eleven", "The Overstory", "Klara and the Sun", "Middlemarch"]
PETS = ["Biscuit", "Mochi", "Pepper", "Juniper", "Ziggy"]
WORK_INVITES = [
    ("Project kickoff: {project}", "Scope, owners and milestones for the first quarter."),
    ("Design review: {project}", "Walkthrough of the proposed architecture; comments welcome beforehand."),
    ("Quarterly planning", "Goals and priorities for next quarter."),
    ("Sprint retrospective", "What went well, what did not, what we change."),
    ("Lunch & learn: {topic}", "Bring your lunch; slides are shared afterwards."),
    ("Incident review", "Timeline, root cause and follow-ups of last week's outage."),
    ("Hiring sync", "Candidate pipeline and interview loops."),
]
SOCIAL_INVITES: list[tuple[str, str, str | None]] = [  # (title, description, place; None: the host's address)
    ("Housewarming at {host}'s", "Come and see the new place! Snacks provided.", None),
    ("Board game night at {host}'s", "Bring your favourite game.", None),
    ("BBQ at {host}'s", "Burgers and veggie skewers; bring something to drink.", None),
    ("Picnic in the park", "Blankets and snacks, join any time.", "Riverside Park"),
    ("{host}'s farewell drinks", "One last evening before the move.", "The Brass Lantern"),
    ("Karaoke night", "Private room booked for three hours.", "Lucky Star Karaoke"),
]

RESPONSES = ["accepted", "declined", "tentative"]


def _at(day: date, hour: int, minute: int = 0) -> datetime:
    return datetime.combine(day, time(hour, minute), tzinfo=UTC)


class _CalendarBuilder:
    """Collects events; ids are given in start order at the end."""

    def __init__(self, data: WorldData, rng: random.Random) -> None:
        self.data, self.rng = data, rng
        self.me = data.supervisor.email
        self.first_day = (data.now - timedelta(days=49)).date()  # seven weeks back, a Monday
        self.days = 140
        self.events: list[dict[str, Any]] = []

    def day(self, low: int = 0, high: int | None = None, weekday_only: bool = False) -> date:
        """A random day, `low`..`high` days after the window's first day."""
        while True:
            d = self.first_day + timedelta(days=self.rng.randrange(low, self.days if high is None else high))
            if not weekday_only or d.weekday() < 5:
                return d

    def add(
        self,
        title: str,
        start: datetime,
        end: datetime,
        *,
        all_day: bool = False,
        location: str = "",
        description: str = "",
        organizer: str | None = None,
        attendees: list[str] | None = None,
        my_response: str = "accepted",
        status: str = "confirmed",
    ) -> None:
        latest = self.data.now - timedelta(hours=self.rng.randint(2, 48))
        created = min(start - timedelta(days=self.rng.randint(2, 30)), latest)
        self.events.append(
            {
                "title": title,
                "start": iso(start),
                "end": iso(end),
                "all_day": all_day,
                "location": location,
                "description": description,
                "organizer": organizer or self.me,
                "attendees": list(attendees or []),
                "my_response": my_response,
                "status": status,
                "created_at": iso(created),
                "updated_at": iso(created),
            }
        )

    def weekly(self, weekday: int, every: int = 1) -> list[date]:
        first = self.first_day + timedelta(days=(weekday - self.first_day.weekday()) % 7)
        return [first + timedelta(weeks=w) for w in range(0, self.days // 7, every)]

    def table(self) -> dict[str, dict[str, Any]]:
        self.events.sort(key=lambda e: (e["start"], e["title"]))
        return {str(i): {"id": i, **e} for i, e in enumerate(self.events, start=1)}


def _groups(data: WorldData, rng: random.Random) -> tuple[Person, list[Person], list[Person]]:
    """The supervisor's manager, coworkers and friends (with fallbacks for worlds short of either)."""
    people = list(data.people)
    coworkers = [p for p in people if p.relationship == "coworker"]
    managers = [p for p in people if p.relationship == "manager"]
    friends = [p for p in people if p.relationship in ("friend", "roommate", "classmate", "neighbor")]
    if len(coworkers) < 4:
        coworkers += rng.sample([p for p in people if p not in coworkers and p not in friends], 4 - len(coworkers))
    if len(friends) < 4:
        friends += rng.sample([p for p in people if p not in coworkers and p not in friends], 4 - len(friends))
    manager = managers[0] if managers else coworkers.pop()
    return manager, coworkers, friends


def build_state(data: WorldData) -> AppState:
    rng = data.rng("calendar")
    fake = data.faker("calendar")
    cal = _CalendarBuilder(data, rng)
    me = cal.me
    manager, coworkers, friends = _groups(data, rng)
    team = rng.sample(coworkers, min(len(coworkers), rng.randint(3, 5)))

    # routines
    room = rng.choice(ROOMS[:4])
    for d in cal.weekly(0):
        cal.add(
            "Weekly team sync",
            _at(d, 14),
            _at(d, 14, 30),
            location=room,
            description="Priorities for the week, blockers, demos.",
            organizer=manager.email,
            attendees=[me, *(p.email for p in team)],
        )
    for d in cal.weekly(2, every=2):
        cal.add(
            f"1:1 with {manager.first_name}", _at(d, 16), _at(d, 16, 30), location="Zoom", attendees=[manager.email]
        )
    studio = f"{fake.last_name()} Yoga Studio, {fake.street_address()}"
    for d in cal.weekly(3):
        cal.add("Yoga class", _at(d, 18), _at(d, 19), location=studio, description="Bring the mat.")
    club = rng.sample(friends, min(len(friends), 4))
    last_day = cal.first_day + timedelta(days=cal.days)
    for month in range(cal.first_day.month + 1, last_day.month + 1):
        month_start = date(cal.first_day.year, month, 1)
        tuesday = month_start + timedelta(days=(1 - month_start.weekday()) % 7)  # the month's first Tuesday
        if tuesday >= last_day:
            break
        host = rng.choice(club)
        cal.add(
            "Book club",
            _at(tuesday, 19),
            _at(tuesday, 21),
            location=f"{host.first_name}'s place",
            description=f"This month: {rng.choice(BOOKS)}.",
            attendees=[p.email for p in club],
        )

    # birthdays of the people close to the supervisor
    for p in data.people:
        if p.relationship not in ("family", "friend", "roommate"):
            continue
        born = date.fromisoformat(p.birthday)
        day = date(data.now.year, born.month, min(born.day, 28) if born.month == 2 else born.day)
        if cal.first_day <= day < last_day:
            start = _at(day, 0)
            cal.add(
                f"{p.name}'s birthday",
                start,
                start + timedelta(days=1),
                all_day=True,
                description=f"{p.first_name} turns {day.year - born.year}.",
            )

    # appointments
    dentist = f"Dr. {fake.last_name()} Dental, {fake.street_address()}"
    appointments = [
        ("Dentist appointment", dentist, 60, cal.day(0, 45, weekday_only=True)),
        ("Dentist appointment", dentist, 60, cal.day(60, weekday_only=True)),
        (
            "Annual physical",
            f"{fake.last_name()} Family Clinic, {fake.street_address()}",
            45,
            cal.day(weekday_only=True),
        ),
        ("Car service", f"{fake.last_name()} Auto Repair, {fake.street_address()}", 90, cal.day(weekday_only=True)),
        (f"Vet checkup for {rng.choice(PETS)}", f"Paws & Claws Vet, {fake.street_address()}", 30, cal.day()),
    ]
    barber = f"{fake.first_name()}'s Barbershop, {fake.street_address()}"
    appointments += [("Haircut", barber, 45, cal.day(k * 45, k * 45 + 40)) for k in range(3)]
    for title, place, minutes, d in appointments:
        start = _at(d, rng.randint(8, 16), rng.choice([0, 30]))
        cal.add(title, start, start + timedelta(minutes=minutes), location=place)

    # time with friends and family
    mine: list[int] = []
    for kind, places, hour, count in (
        ("Dinner", RESTAURANTS, 19, 4),
        ("Coffee", CAFES, 10, 4),
        ("Lunch", RESTAURANTS, 12, 3),
    ):
        for _ in range(count):
            friend = rng.choice(friends)
            d = cal.day()
            start = _at(d, hour, rng.choice([0, 30]))
            mine.append(len(cal.events))
            cal.add(
                f"{kind} with {friend.first_name}",
                start,
                start + timedelta(minutes=90 if kind == "Dinner" else 60),
                location=rng.choice(places),
                attendees=[friend.email],
            )

    # trips: one behind, one ahead
    for low, high in ((10, 35), (70, 120)):
        city = rng.choice(CITIES)
        d, nights = cal.day(low, high), rng.randint(3, 6)
        cal.add(f"Trip to {city}", _at(d, 0), _at(d + timedelta(days=nights + 1), 0), all_day=True, location=city)
        code = fake.bothify("??####").upper()
        cal.add(f"Flight to {city}", _at(d, 8), _at(d, 12), location="Airport", description=f"Booking {code}.")
        home = d + timedelta(days=nights)
        cal.add(f"Flight home from {city}", _at(home, 15), _at(home, 19), location=city, description=f"Booking {code}.")

    # invitations from others
    invitations: list[tuple[str, str, str | None, bool]] = [
        (t, d, None, True) for t, d in rng.sample(WORK_INVITES, rng.randint(4, 6))
    ]
    invitations += [(t, d, venue, False) for t, d, venue in rng.sample(SOCIAL_INVITES, rng.randint(4, 5))]
    for title, description, venue, is_work in invitations:
        host = rng.choice(coworkers if is_work else friends)
        pool = [p for p in (coworkers if is_work else friends) if p is not host]
        guests = rng.sample(pool, min(len(pool), rng.randint(1, 4)))
        d = cal.day(weekday_only=is_work)
        start = _at(d, rng.randint(9, 16)) if is_work else _at(d, rng.randint(17, 19), 30)
        future = start > data.now
        response = rng.choices(["needs_action", *RESPONSES], [5, 3, 1, 1] if future else [0, 8, 2, 0])[0]
        cal.add(
            title.format(host=host.first_name, project=rng.choice(PROJECTS), topic=rng.choice(TOPICS)),
            start,
            start + timedelta(hours=1 if is_work else 3),
            location=rng.choice(ROOMS) if is_work else (venue or fake.street_address()),
            description=description,
            organizer=host.email,
            attendees=[me, *(g.email for g in guests)],
            my_response=response,
        )

    for i in rng.sample(mine, 2):
        cal.events[i]["status"] = "cancelled"
    return {"events": cal.table(), "_sessions": {}}


app = AppSpec(
    name="calendar",
    description="Your calendar: events, the people invited to them, and invitations from others. Times are UTC.",
    build_state=build_state,
)


# --- helpers -----------------------------------------------------------------------------------

EVENT_SUMMARY = "[{event_id, title, start, end, all_day, location, organizer, my_response, status}]"
EVENT = (
    "{event_id, title, start, end, all_day, location, description, organizer, attendees, my_response, status, "
    "created_at, updated_at}"
)


def _summary(e: dict[str, Any]) -> dict[str, Any]:
    keys = ("title", "start", "end", "all_day", "location", "organizer", "my_response", "status")
    return {"event_id": e["id"], **{k: e[k] for k in keys}}


def _full(e: dict[str, Any]) -> dict[str, Any]:
    return {"event_id": e["id"], **{k: v for k, v in e.items() if k != "id"}}


def _by_start(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(events, key=lambda e: (e["start"], e["id"]))


def _own_event(ctx: CallContext, event_id: int) -> dict[str, Any]:
    event = ctx.get("events", event_id, "event")
    if event["organizer"] != ctx.user:
        raise ApiError(
            403,
            f"Only the organizer ({event['organizer']}) can change event {event_id}; you can answer the "
            "invitation with respond_to_invitation.",
        )
    if event["status"] == "cancelled":
        raise ApiError(409, f"Event {event_id} is cancelled.")
    return event


def _emails(ctx: CallContext, emails: list[str]) -> list[str]:
    cleaned: list[str] = []
    for raw in emails:
        email = raw.strip().lower()
        local, _, domain = email.partition("@")
        if not local or "." not in domain:
            raise ApiError(422, f"{raw!r} is not an email address; attendees are given by email.")
        if email == ctx.user:
            raise ApiError(422, "You are the organizer; list only the other people.")
        if email not in cleaned:
            cleaned.append(email)
    return cleaned


def _times(start: str, end: str, all_day: bool) -> tuple[str, str]:
    begin, finish = parse_time(start, "start"), parse_time(end, "end")
    if all_day:
        begin, finish = _at(begin.date(), 0), _at(finish.date(), 0)
    if finish <= begin:
        hint = " For all-day events `end` is the day after the last day." if all_day else ""
        raise ApiError(422, f"The event must end after it starts (start {iso(begin)}, end {iso(finish)}).{hint}")
    return iso(begin), iso(finish)


# --- APIs --------------------------------------------------------------------------------------


@app.api(
    "List your events in start order. `after`/`before` keep the events that overlap that window; "
    "`person` keeps those someone organizes or is invited to. Cancelled events are left out unless asked for.",
    params={
        "after": string("Only events that end after this date-time (ISO 8601, UTC)."),
        "before": string("Only events that start before this date-time (ISO 8601, UTC)."),
        "person": string("Email of someone who organizes or attends the event."),
        "include_cancelled": boolean("Also list cancelled events.", default=False),
        **page_params(),
    },
    returns=EVENT_SUMMARY,
)
def list_events(
    ctx: CallContext,
    page_index: int,
    page_limit: int,
    include_cancelled: bool,
    after: str | None = None,
    before: str | None = None,
    person: str | None = None,
) -> list[dict[str, Any]]:
    rows = [e for e in ctx.table("events").values() if include_cancelled or e["status"] != "cancelled"]
    if after is not None:
        low = canonical_time(after, "after")
        rows = [e for e in rows if e["end"] > low]
    if before is not None:
        high = canonical_time(before, "before")
        rows = [e for e in rows if e["start"] < high]
    if person is not None:
        who = person.strip().lower()
        rows = [e for e in rows if who == e["organizer"] or who in e["attendees"]]
    return [_summary(e) for e in paginate(_by_start(rows), page_index, page_limit)]


@app.api(
    "Search your events (cancelled ones too): case-insensitive match of the query in the title, description "
    "or location. Results in start order.",
    params={"query": string("Text to look for.", minLength=1), **page_params()},
    required=["query"],
    returns=EVENT_SUMMARY,
)
def search_events(ctx: CallContext, query: str, page_index: int, page_limit: int) -> list[dict[str, Any]]:
    q = query.casefold().strip()
    rows = [
        e
        for e in ctx.table("events").values()
        if q in e["title"].casefold() or q in e["description"].casefold() or q in e["location"].casefold()
    ]
    return [_summary(e) for e in paginate(_by_start(rows), page_index, page_limit)]


@app.api(
    "Show one event with its description and attendees.",
    params={"event_id": integer("Id of the event.")},
    required=["event_id"],
    returns=EVENT,
)
def show_event(ctx: CallContext, event_id: int) -> dict[str, Any]:
    return _full(ctx.get("events", event_id, "event"))


@app.api(
    "Create an event you organize and invite people to it. Times are ISO 8601 in UTC; for an all-day event "
    "give dates, `end` being the day after the last day.",
    params={
        "title": string("Title.", minLength=1),
        "start": string("Start, e.g. 2025-06-12T14:30:00Z."),
        "end": string("End, after the start."),
        "all_day": boolean("An all-day event (birthdays, trips).", default=False),
        "location": string("Where."),
        "description": string("Details."),
        "attendees": array("Emails of the people to invite.", {"type": "string"}),
    },
    required=["title", "start", "end"],
    returns="{event_id}",
)
def create_event(
    ctx: CallContext,
    title: str,
    start: str,
    end: str,
    all_day: bool,
    location: str = "",
    description: str = "",
    attendees: list[str] | None = None,
) -> dict[str, Any]:
    begin, finish = _times(start, end, all_day)
    now = iso(ctx.now)
    event = ctx.insert(
        "events",
        {
            "title": title,
            "start": begin,
            "end": finish,
            "all_day": all_day,
            "location": location,
            "description": description,
            "organizer": ctx.user,
            "attendees": _emails(ctx, attendees or []),
            "my_response": "accepted",
            "status": "confirmed",
            "created_at": now,
            "updated_at": now,
        },
    )
    return {"event_id": event["id"]}


@app.api(
    "Change an event you organize. Only the fields you give change; moving `start` without `end` keeps "
    "the event's length.",
    params={
        "event_id": integer("Id of the event."),
        "title": string("New title.", minLength=1),
        "start": string("New start (ISO 8601, UTC)."),
        "end": string("New end (ISO 8601, UTC)."),
        "location": string("New location."),
        "description": string("New description."),
    },
    required=["event_id"],
    returns=EVENT,
)
def update_event(
    ctx: CallContext,
    event_id: int,
    title: str | None = None,
    start: str | None = None,
    end: str | None = None,
    location: str | None = None,
    description: str | None = None,
) -> dict[str, Any]:
    event = _own_event(ctx, event_id)
    if all(v is None for v in (title, start, end, location, description)):
        raise ApiError(422, "Nothing to update: give at least one of title, start, end, location, description.")
    if start is not None or end is not None:
        old_start, old_end = parse_time(event["start"], "start"), parse_time(event["end"], "end")
        new_start = parse_time(start, "start") if start is not None else old_start
        new_end = parse_time(end, "end") if end is not None else new_start + (old_end - old_start)
        event["start"], event["end"] = _times(iso(new_start), iso(new_end), event["all_day"])
    for key, value in (("title", title), ("location", location), ("description", description)):
        if value is not None:
            event[key] = value
    event["updated_at"] = iso(ctx.now)
    return _full(event)


@app.api(
    "Invite more people to an event you organize.",
    params={
        "event_id": integer("Id of the event."),
        "emails": array("Emails of the people to invite.", {"type": "string"}, minItems=1),
    },
    required=["event_id", "emails"],
    returns="{event_id, attendees, added}",
)
def add_attendees(ctx: CallContext, event_id: int, emails: list[str]) -> dict[str, Any]:
    event = _own_event(ctx, event_id)
    new = [e for e in _emails(ctx, emails) if e not in event["attendees"]]
    if not new:
        raise ApiError(409, f"Everyone you listed is already invited to event {event_id}.")
    event["attendees"] = [*event["attendees"], *new]
    event["updated_at"] = iso(ctx.now)
    return {"event_id": event_id, "attendees": event["attendees"], "added": new}


@app.api(
    "Take someone off the guest list of an event you organize.",
    params={"event_id": integer("Id of the event."), "email": string("Email of the attendee.")},
    required=["event_id", "email"],
    returns="{event_id, attendees}",
)
def remove_attendee(ctx: CallContext, event_id: int, email: str) -> dict[str, Any]:
    event = _own_event(ctx, event_id)
    who = email.strip().lower()
    if who not in event["attendees"]:
        raise ApiError(
            404, f"{email} is not invited to event {event_id}; its attendees: {', '.join(event['attendees'])}."
        )
    event["attendees"] = [a for a in event["attendees"] if a != who]
    event["updated_at"] = iso(ctx.now)
    return {"event_id": event_id, "attendees": event["attendees"]}


@app.api(
    "Cancel an event you organize; its attendees are told. It stays visible with status 'cancelled'.",
    params={"event_id": integer("Id of the event.")},
    required=["event_id"],
    returns="{event_id, status}",
)
def cancel_event(ctx: CallContext, event_id: int) -> dict[str, Any]:
    event = ctx.get("events", event_id, "event")
    if event["status"] == "cancelled":
        raise ApiError(409, f"Event {event_id} is already cancelled.")
    event = _own_event(ctx, event_id)
    event["status"] = "cancelled"
    event["updated_at"] = iso(ctx.now)
    return {"event_id": event_id, "status": "cancelled"}


@app.api(
    "List invitations from other people that you have not answered yet, in start order (or all of them, answered too).",
    params={"include_answered": boolean("Also list invitations you already answered.", default=False), **page_params()},
    returns=EVENT_SUMMARY,
)
def list_invitations(
    ctx: CallContext, include_answered: bool, page_index: int, page_limit: int
) -> list[dict[str, Any]]:
    rows = [
        e
        for e in ctx.table("events").values()
        if e["organizer"] != ctx.user
        and e["status"] != "cancelled"
        and (include_answered or e["my_response"] == "needs_action")
    ]
    return [_summary(e) for e in paginate(_by_start(rows), page_index, page_limit)]


@app.api(
    "Answer an invitation to someone else's event.",
    params={
        "event_id": integer("Id of the event."),
        "response": string("Your answer.", enum=RESPONSES),
    },
    required=["event_id", "response"],
    returns="{event_id, my_response}",
)
def respond_to_invitation(ctx: CallContext, event_id: int, response: str) -> dict[str, Any]:
    event = ctx.get("events", event_id, "event")
    if event["organizer"] == ctx.user:
        raise ApiError(409, f"You organize event {event_id}; there is no invitation to answer.")
    if event["status"] == "cancelled":
        raise ApiError(409, f"Event {event_id} was cancelled by its organizer.")
    if event["end"] <= iso(ctx.now):
        raise ApiError(409, f"Event {event_id} is already over.")
    event["my_response"] = response
    event["updated_at"] = iso(ctx.now)
    return {"event_id": event_id, "my_response": response}
