"""Scenarios on the calendar app alone."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from agentloop.apps.builtin.people import iso
from agentloop.apps.builtin.scenarios._when import clock, day_label
from agentloop.apps.builtin.scenarios.common import my_email, people_of, plant
from agentloop.apps.evaluation import added, same_items, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance, pick
from agentloop.apps.world import World

Record = dict[str, Any]
BIRTHDAY = "'s birthday"


# --- reading the initial state (setup only; oracles use the APIs) ------------------------------


def events(world: World) -> list[Record]:
    return sorted(world.state["calendar"]["events"].values(), key=lambda e: e["id"])


def people_emails(world: World) -> list[str]:
    """Everyone the calendar knows, other than the supervisor."""
    me = my_email(world)
    found = {e["organizer"] for e in events(world)} | {a for e in events(world) for a in e["attendees"]}
    return sorted(found - {me})


def upcoming_own(world: World) -> list[Record]:
    """Future, confirmed, timed events the supervisor organizes that are the only ones of their title that day."""
    me, now = my_email(world), iso(world.now)
    per_day = Counter((e["title"], e["start"][:10]) for e in events(world))
    return [
        e
        for e in events(world)
        if e["organizer"] == me
        and e["status"] == "confirmed"
        and not e["all_day"]
        and e["start"] > now
        and per_day[(e["title"], e["start"][:10])] == 1
    ]


def midnight(world: World, days_from_now: int) -> datetime:
    return (world.now + timedelta(days=days_from_now)).replace(hour=0, minute=0, second=0, microsecond=0)


def overlapping(world: World, start: str, end: str) -> list[Record]:
    return [e for e in events(world) if e["status"] != "cancelled" and e["start"] < end and e["end"] > start]


def new_event(world: World, title: str, start: datetime, minutes: int, **fields: Any) -> Record:
    """A timed event the supervisor organizes, for planting."""
    created = iso(world.now - timedelta(days=3))
    return {
        "title": title,
        "start": iso(start),
        "end": iso(start + timedelta(minutes=minutes)),
        "all_day": False,
        "location": "",
        "description": "",
        "organizer": my_email(world),
        "attendees": [],
        "my_response": "accepted",
        "status": "confirmed",
        "created_at": created,
        "updated_at": created,
        **fields,
    }


# --- oracle helpers ----------------------------------------------------------------------------


def find_event(c: OracleClient, token: str, title: str, day: str) -> Record:
    """The event with this exact title on this day (YYYY-MM-DD)."""
    hits = c.pages("calendar", "search_events", access_token=token, query=title)
    return next(e for e in hits if e["title"] == title and e["start"].startswith(day))


# --- scenarios ---------------------------------------------------------------------------------


def calendar_event_location(world: World, rng: random.Random) -> TaskInstance:
    titles = Counter(e["title"] for e in events(world))
    now = iso(world.now)
    options = [
        e
        for e in events(world)
        if titles[e["title"]] == 1 and e["location"] and e["status"] == "confirmed" and e["start"] > now
    ]
    target = rng.choice(options)
    title, day = target["title"], target["start"][:10]

    def oracle(c: OracleClient) -> str:
        token = c.login("calendar")
        return str(find_event(c, token, title, day)["location"])

    return TaskInstance(
        f"Where is my '{title}' on {day_label(target['start'])}? Tell me its location as the calendar has it.",
        oracle,
        answer=target["location"],
    )


NEW_EVENTS = {  # title -> places it could be at
    "Tennis": ["Riverside Courts", "Eastside Tennis Club"],
    "Planning session": ["Zoom", "Central Library, room 2"],
    "Apartment viewing": ["14 Linden Avenue, apt 3B", "220 Harbor Street, unit 12"],
    "Study group": ["Central Library, room 2", "Little Owl Coffee"],
    "Budget review": ["Zoom", "Blue Door Bistro"],
    "Lunch": ["Blue Door Bistro", "Sakura House", "Casa Verde"],
}


def calendar_create_event(world: World, rng: random.Random) -> TaskInstance:
    title = rng.choice(sorted(NEW_EVENTS))
    place, guest = rng.choice(NEW_EVENTS[title]), rng.choice(people_emails(world))
    start = midnight(world, rng.randint(3, 24)) + timedelta(hours=rng.randint(8, 17), minutes=rng.choice([0, 30]))
    end = start + timedelta(minutes=rng.choice([30, 45, 60, 90]))
    begin, finish = iso(start), iso(end)

    def oracle(c: OracleClient) -> None:
        token = c.login("calendar")
        c.call(
            "calendar",
            "create_event",
            access_token=token,
            title=title,
            start=begin,
            end=finish,
            location=place,
            attendees=[guest],
        )

    return TaskInstance(
        f"Put '{title}' on my calendar on {day_label(begin)}, {start.year}, from {clock(begin)} to {clock(finish)} "
        f"UTC at {place}, and invite {guest}.",
        oracle,
        [
            added(
                "calendar",
                "events",
                title=title,
                start=begin,
                end=finish,
                location=place,
                attendees=same_items([guest]),
            )
        ],
    )


def calendar_cancel_event(world: World, rng: random.Random) -> TaskInstance:
    target = rng.choice(upcoming_own(world))
    title, day = target["title"], target["start"][:10]

    def oracle(c: OracleClient) -> None:
        token = c.login("calendar")
        event = find_event(c, token, title, day)
        c.call("calendar", "cancel_event", access_token=token, event_id=event["event_id"])

    return TaskInstance(
        f"Cancel my '{title}' on {day_label(target['start'])}.",
        oracle,
        [updated("calendar", "events", target["id"], status="cancelled")],
    )


def calendar_add_attendee(world: World, rng: random.Random) -> TaskInstance:
    # not a 1:1: inviting a third person to it would be odd
    target = rng.choice([e for e in upcoming_own(world) if e["attendees"] and not e["title"].startswith("1:1")])
    guest = rng.choice([p for p in people_emails(world) if p not in target["attendees"]])
    title, day = target["title"], target["start"][:10]

    def oracle(c: OracleClient) -> None:
        token = c.login("calendar")
        event = find_event(c, token, title, day)
        c.call("calendar", "add_attendees", access_token=token, event_id=event["event_id"], emails=[guest])

    return TaskInstance(
        f"Invite {guest} to my '{title}' on {day_label(target['start'])}.",
        oracle,
        [updated("calendar", "events", target["id"], attendees=same_items([*target["attendees"], guest]))],
    )


def calendar_reschedule(world: World, rng: random.Random) -> TaskInstance:
    target = rng.choice(upcoming_own(world))
    title, day = target["title"], target["start"][:10]
    old_start = datetime.fromisoformat(target["start"])
    length = datetime.fromisoformat(target["end"]) - old_start
    hour = rng.choice([h for h in range(8, 19) if h != old_start.hour])
    new_start = old_start.replace(hour=hour, minute=rng.choice([0, 30]))
    begin, finish = iso(new_start), iso(new_start + length)

    def oracle(c: OracleClient) -> None:
        token = c.login("calendar")
        event = find_event(c, token, title, day)
        c.call("calendar", "update_event", access_token=token, event_id=event["event_id"], start=begin, end=finish)

    return TaskInstance(
        f"Move my '{title}' on {day_label(begin)} to start at {clock(begin)} UTC the same day, keeping its length.",
        oracle,
        [updated("calendar", "events", target["id"], start=begin, end=finish)],
    )


INVITES = ["Climbing session", "Wine tasting", "Pottery class", "Escape room", "Sunday brunch", "Movie marathon"]


def calendar_accept_from(world: World, rng: random.Random) -> TaskInstance:
    me = my_email(world)
    host = rng.choice(people_emails(world))
    titles = rng.sample(INVITES, 4)
    days = rng.sample(range(2, 40), 4)
    for n, (title, day) in enumerate(zip(titles, days, strict=True)):
        start = midnight(world, day) + timedelta(hours=rng.randint(10, 19))
        # the last one was already answered: it must stay as it is
        response = "declined" if n == 3 else "needs_action"
        guests = [me, *rng.sample([p for p in people_emails(world) if p != host], 2)]
        plant(
            world,
            "calendar",
            "events",
            new_event(world, title, start, 120, organizer=host, attendees=guests, my_response=response),
        )
    now = iso(world.now)
    pending = [
        e
        for e in events(world)
        if e["organizer"] == host
        and e["my_response"] == "needs_action"
        and e["status"] == "confirmed"
        and e["end"] > now
    ]

    def oracle(c: OracleClient) -> None:
        token = c.login("calendar")
        # collect first: answering takes an invitation off the list and would shift the pages
        waiting = [e for e in c.pages("calendar", "list_invitations", access_token=token) if e["organizer"] == host]
        for e in waiting:
            c.call("calendar", "respond_to_invitation", access_token=token, event_id=e["event_id"], response="accepted")

    return TaskInstance(
        f"Accept every calendar invitation from {host} that I haven't answered yet.",
        oracle,
        [updated("calendar", "events", e["id"], my_response="accepted") for e in pending],
    )


def calendar_count_with(world: World, rng: random.Random) -> TaskInstance:
    me = my_email(world)
    options = []
    for weeks_ahead in (1, 2, 3, 4):
        for span in (14, 21):
            first = midnight(world, 7 * weeks_ahead - world.now.weekday())  # a Monday
            low, high = iso(first), iso(first + timedelta(days=span))
            for person in people_emails(world):
                theirs = [
                    e
                    for e in events(world)
                    if (e["organizer"] == person or person in e["attendees"]) and e["start"] < high and e["end"] > low
                ]
                # only people whose events leave no room for interpretation (cancelled, declined, straddling)
                clear = all(
                    e["status"] == "confirmed"
                    and (e["organizer"] == me or e["my_response"] == "accepted")
                    and low <= e["start"]
                    and e["end"] <= high
                    for e in theirs
                )
                if clear and len(theirs) >= 2:
                    options.append((first, span, person, len(theirs)))
    first, span, person, count = rng.choice(options)
    low, high = iso(first), iso(first + timedelta(days=span))
    last = iso(first + timedelta(days=span - 1))

    def oracle(c: OracleClient) -> int:
        token = c.login("calendar")
        return len(list(c.pages("calendar", "list_events", access_token=token, after=low, before=high, person=person)))

    return TaskInstance(
        f"How many events do I have with {person} from {day_label(low)} to {day_label(last)} (both days included)?",
        oracle,
        answer=count,
    )


def birthday_windows(world: World) -> list[tuple[str, str, list[str]]]:
    """Windows of 21 to 35 days starting within the next 44 that hold at least two birthdays."""
    birthdays = [e for e in events(world) if e["all_day"] and e["title"].endswith(BIRTHDAY)]
    options = []
    for offset in range(1, 45):
        for span in (21, 28, 35):
            low, high = iso(midnight(world, offset)), iso(midnight(world, offset + span))
            names = sorted(e["title"].removesuffix(BIRTHDAY) for e in birthdays if low <= e["start"] < high)
            if len(names) >= 2:
                options.append((low, high, names))
    return options


def plant_more_birthdays(world: World) -> None:
    """Put the birthdays of the next 80 days of everyone else the supervisor knows on the calendar
    (the world has them only for family, friends and roommates)."""
    on_calendar = {e["title"] for e in events(world)}
    first, last = midnight(world, 1).date(), midnight(world, 80).date()
    for person in sorted(people_of(world.seed).values(), key=lambda p: p.id):
        born = date.fromisoformat(person.birthday)
        day = date(world.now.year, born.month, min(born.day, 28) if born.month == 2 else born.day)
        if day < first:
            day = day.replace(year=day.year + 1)
        title = f"{person.name}{BIRTHDAY}"
        if first <= day < last and title not in on_calendar:
            start = datetime.combine(day, time(0), tzinfo=UTC)
            plant(
                world,
                "calendar",
                "events",
                {
                    **new_event(world, title, start, 24 * 60, all_day=True),
                    "description": f"{person.first_name} turns {day.year - born.year}.",
                },
            )


def calendar_birthdays_between(world: World, rng: random.Random) -> TaskInstance:
    options = birthday_windows(world)
    if not options:
        plant_more_birthdays(world)
        options = birthday_windows(world)
    low, high, names = pick(rng, options, "window of 21 to 35 days with two birthdays on the calendar")
    last = iso(datetime.fromisoformat(high) - timedelta(days=1))

    def oracle(c: OracleClient) -> str:
        token = c.login("calendar")
        listed = c.pages("calendar", "list_events", access_token=token, after=low, before=high)
        return ", ".join(
            e["title"].removesuffix(BIRTHDAY) for e in listed if e["all_day"] and e["title"].endswith(BIRTHDAY)
        )

    first, final = datetime.fromisoformat(low), datetime.fromisoformat(last)
    return TaskInstance(
        f"Whose birthdays are on my calendar between {first:%B} {first.day} and {final:%B} {final.day} "
        "(both days included)? Give me their full names.",
        oracle,
        answer=names,
    )


FOCUS = [
    "Write the quarterly report",
    "Tax paperwork",
    "Prepare the board presentation",
    "Study for the AWS exam",
    "Review the vendor contracts",
    "Plan the team offsite",
    "Draft the grant proposal",
]
BLOCKERS = ["Client call", "Interview panel", "Vendor demo", "Budget review", "Offsite prep"]


def calendar_first_free_slot(world: World, rng: random.Random) -> TaskInstance:
    monday = midnight(world, 7 - world.now.weekday())
    title, minutes = rng.choice(FOCUS), rng.choice([90, 120])
    starts = [timedelta(hours=h, minutes=m) for h in (9, 10, 11, 13, 14, 15, 16) for m in (0, 30)]
    rng.shuffle(starts)
    for offset in starts:
        free_day = rng.randint(1, 3)
        slot = [
            (day, day + timedelta(minutes=minutes)) for day in (monday + timedelta(days=d) + offset for d in range(5))
        ]
        begin, finish = iso(slot[free_day][0]), iso(slot[free_day][1])
        if not overlapping(world, begin, finish):  # free even counting all-day and declined events
            break
    else:
        raise RuntimeError("calendar_first_free_slot: no weekday of next week can be made the first free one")
    for d in range(free_day):  # the days before are taken
        start = slot[d][0] + timedelta(minutes=rng.choice([-30, 0, 30, 60]))
        plant(world, "calendar", "events", new_event(world, rng.choice(BLOCKERS), start, 60, location="Zoom"))
    windows = [(iso(a), iso(b)) for a, b in slot]

    def oracle(c: OracleClient) -> None:
        token = c.login("calendar")
        for low, high in windows:
            if not list(c.pages("calendar", "list_events", access_token=token, after=low, before=high)):
                c.call("calendar", "create_event", access_token=token, title=title, start=low, end=high)
                return

    friday = iso(monday + timedelta(days=4))
    return TaskInstance(
        f"I need {'two hours' if minutes == 120 else 'an hour and a half'} for '{title}' next week, from "
        f"{clock(begin)} to {clock(finish)} UTC. Put it on my calendar on the "
        f"first weekday of next week ({day_label(iso(monday))} to {day_label(friday)}) that has nothing else on my "
        "calendar during those hours.",
        oracle,
        [added("calendar", "events", title=title, start=begin, end=finish)],
    )


RENAMES = ("Team sync", "Catch-up call", "Planning session", "Quick check-in", "Project review", "Coffee chat")


def calendar_rename_event(world: World, rng: random.Random) -> TaskInstance:
    target = pick(rng, upcoming_own(world), "upcoming event of mine")
    title, day = target["title"], target["start"][:10]
    new_title = rng.choice([t for t in RENAMES if t != title])

    def oracle(c: OracleClient) -> None:
        token = c.login("calendar")
        event = find_event(c, token, title, day)
        c.call("calendar", "update_event", access_token=token, event_id=event["event_id"], title=new_title)

    return TaskInstance(
        f"Rename my '{title}' on {day_label(target['start'])} to '{new_title}'.",
        oracle,
        [updated("calendar", "events", target["id"], title=new_title)],
    )


def calendar_extend_event(world: World, rng: random.Random) -> TaskInstance:
    target = pick(rng, upcoming_own(world), "upcoming event of mine")
    title, day = target["title"], target["start"][:10]
    finish = iso(datetime.fromisoformat(target["end"]) + timedelta(minutes=rng.choice([15, 30, 45, 60])))

    def oracle(c: OracleClient) -> None:
        token = c.login("calendar")
        event = find_event(c, token, title, day)
        c.call("calendar", "update_event", access_token=token, event_id=event["event_id"], end=finish)

    return TaskInstance(
        f"My '{title}' on {day_label(target['start'])} will run longer: make it end at {clock(finish)} UTC.",
        oracle,
        [updated("calendar", "events", target["id"], end=finish)],
    )


def calendar_clear_day(world: World, rng: random.Random) -> TaskInstance:
    me = my_email(world)
    day = pick(rng, sorted({e["start"][:10] for e in upcoming_own(world)}), "day with an event of mine")
    mine = [e for e in events(world) if e["organizer"] == me and e["status"] == "confirmed" and e["start"][:10] == day]
    after, before = f"{day}T00:00:00Z", iso(datetime.fromisoformat(f"{day}T00:00:00+00:00") + timedelta(days=1))

    def oracle(c: OracleClient) -> None:
        token = c.login("calendar")
        listed = list(c.pages("calendar", "list_events", access_token=token, after=after, before=before))
        for event in listed:
            if event["organizer"] == me and event["start"].startswith(day):
                c.call("calendar", "cancel_event", access_token=token, event_id=event["event_id"])

    return TaskInstance(
        f"I'm taking {day_label(mine[0]['start'])} off: cancel every event I organize that starts that day.",
        oracle,
        [updated("calendar", "events", e["id"], status="cancelled") for e in mine],
    )


SCENARIOS = [
    Scenario("calendar_event_location", 1, ("calendar",), "train", calendar_event_location),
    Scenario("calendar_create_event", 1, ("calendar",), "train", calendar_create_event),
    Scenario("calendar_add_attendee", 1, ("calendar",), "train", calendar_add_attendee),
    Scenario("calendar_rename_event", 1, ("calendar",), "train", calendar_rename_event),
    Scenario("calendar_extend_event", 1, ("calendar",), "train", calendar_extend_event),
    Scenario("calendar_cancel_event", 1, ("calendar",), "test_normal", calendar_cancel_event),
    Scenario("calendar_reschedule", 1, ("calendar",), "dev", calendar_reschedule),
    Scenario("calendar_accept_from", 2, ("calendar",), "train", calendar_accept_from),
    Scenario("calendar_count_with", 2, ("calendar",), "train", calendar_count_with),
    Scenario("calendar_clear_day", 2, ("calendar",), "train", calendar_clear_day),
    Scenario("calendar_birthdays_between", 2, ("calendar",), "test_normal", calendar_birthdays_between),
    Scenario("calendar_first_free_slot", 3, ("calendar",), "test_normal", calendar_first_free_slot),
]
