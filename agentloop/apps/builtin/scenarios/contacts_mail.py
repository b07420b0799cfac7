"""Scenarios that need both the address book and the mailbox."""

from __future__ import annotations

import random
import re
from datetime import timedelta
from typing import Any

from agentloop.apps.builtin.people import iso
from agentloop.apps.builtin.scenarios.common import days_ago, me
from agentloop.apps.builtin.scenarios.contacts import (
    PLURAL,
    contact_rows,
    full_name,
    in_window,
    new_person,
    new_phone,
    pretty_phone,
)
from agentloop.apps.builtin.scenarios.mail import plant_email
from agentloop.apps.evaluation import added, contains, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World

ANNOUNCEMENTS = [
    ("Dinner on Friday?", "Would you like to come over for dinner on Friday at 7?"),
    ("Moving update", "I'm moving at the end of the month, new address coming soon!"),
    ("Garage sale", "I'm having a garage sale on Saturday morning, come by!"),
    ("Book swap", "Bring a book you loved to the swap on Sunday afternoon."),
]
WISHES = [
    "Wishing you a wonderful year ahead!",
    "Hope your day is as great as you are!",
    "Have a fantastic birthday and a great year!",
]
INTRODUCTIONS = {
    "neighbor": [
        ("Hello from your new neighbor", "We just moved in two doors down from you. Say hi anytime!"),
        ("Your neighbor from across the street", "We got some of your mail by mistake, I'll drop it by tonight."),
    ],
    "classmate": [
        ("Remember me from statistics class?", "I found your email in the old class list. Let's catch up!"),
        ("Study group reunion", "A few of us from the old study group are meeting up next month. Join us!"),
    ],
    "friend": [
        ("Great meeting you at the climbing gym", "It was fun climbing with you on Saturday. Same time next week?"),
        ("Fun chatting at the book club", "Here is the novel I mentioned. Let's grab coffee sometime!"),
    ],
    "coworker": [
        ("Hello from the new hire", "I just joined the team and will be working with you on the platform."),
        ("Intro from the data team", "I'm the new analyst on the data team, looking forward to working together."),
    ],
}
NEW_NUMBER = [
    ("New phone number", "Quick heads-up: my new number is {phone}. The old one stops working on Friday."),
    ("My number changed", "I switched carriers, so my new number is {phone}. Please update it!"),
    ("Update your contacts", "Please save my new number: {phone}. Thanks!"),
]
NEW_NUMBER_RE = re.compile(r"new number(?: is|:)\s*([()\d][()\d .+-]{6,}\d)")


def contacts_email_group(world: World, rng: random.Random) -> TaskInstance:
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in contact_rows(world):
        groups.setdefault(c["relationship"], []).append(c)
    sizes = {r: len(members) for r, members in groups.items()}
    fitting = sorted(r for r, n in sizes.items() if 2 <= n <= 6)
    if not fitting:  # every group is tiny or large: take the smallest that still has two people
        fitting = [min((r for r in sizes if sizes[r] >= 2), key=sizes.__getitem__)]
    relationship = rng.choice(fitting)
    subject, body = rng.choice(ANNOUNCEMENTS)
    recipients = [c["email"] for c in groups[relationship]]

    def oracle(c: OracleClient) -> None:
        ctoken = c.login("contacts")
        group = list(c.pages("contacts", "list_contacts", access_token=ctoken, relationship=relationship))
        mtoken = c.login("mail")
        for person in group:
            c.call("mail", "send_email", access_token=mtoken, to=[person["email"]], subject=subject, body=body)

    return TaskInstance(
        f"Send each of my {PLURAL[relationship]} (relationship '{relationship}' in my contacts) a separate email "
        f"with the subject '{subject}' and the text '{body}'.",
        oracle,
        [
            added("mail", "emails", folder="sent", to=[to], cc=[], subject=subject, body=contains(body))
            for to in recipients
        ],
    )


def contacts_add_email_sender(world: World, rng: random.Random) -> TaskInstance:
    first, last, email = new_person(world, rng)
    phone = new_phone(world, rng)
    relationship = rng.choice(sorted(INTRODUCTIONS))
    subject, text = rng.choice(INTRODUCTIONS[relationship])
    plant_email(
        world,
        sender=email,
        sender_name=f"{first} {last}",
        subject=subject,
        body=f"Hi {me(world)['first_name']},\n\n{text}\n\nBest,\n{first} {last}\n{pretty_phone(phone)}",
        date=days_ago(world, rng.uniform(0.3, 6)),
    )

    def oracle(c: OracleClient) -> None:
        mtoken = c.login("mail")
        hits = c.pages("mail", "search_emails", access_token=mtoken, query=subject)
        found = next(e for e in hits if e["subject"] == subject)
        body = c.call("mail", "show_email", access_token=mtoken, email_id=found["email_id"])["body"]
        signature_phone = body.strip().splitlines()[-1]
        given, family = found["sender_name"].split(" ", 1)
        ctoken = c.login("contacts")
        c.call(
            "contacts",
            "add_contact",
            access_token=ctoken,
            first_name=given,
            last_name=family,
            email=found["sender"],
            phone=signature_phone,
            relationship=relationship,
        )

    return TaskInstance(
        f"Add the person who sent me the email '{subject}' to my contacts as a {relationship}, with their name, "
        "email address and the phone number from their signature.",
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


def contacts_birthday_wishes(world: World, rng: random.Random) -> TaskInstance:
    days = rng.randint(4, 12)
    end = world.now.date() + timedelta(days=days)
    celebrants = in_window(world, days, rng, at_least=2, at_most=4)
    wish = rng.choice(WISHES)

    def oracle(c: OracleClient) -> None:
        ctoken = c.login("contacts")
        soon = list(c.pages("contacts", "upcoming_birthdays", access_token=ctoken, days=days))
        mtoken = c.login("mail")
        for b in soon:
            contact = c.call("contacts", "show_contact", access_token=ctoken, contact_id=b["contact_id"])
            subject = f"Happy birthday, {b['first_name']}!"
            c.call("mail", "send_email", access_token=mtoken, to=[contact["email"]], subject=subject, body=wish)

    return TaskInstance(
        f"Email everyone in my contacts whose birthday falls between today and {end:%A, %B} {end.day} (inclusive), "
        f"one email each, with the subject 'Happy birthday, <their first name>!' and the text '{wish}'",
        oracle,
        [
            added(
                "mail",
                "emails",
                folder="sent",
                to=[c["email"]],
                cc=[],
                subject=f"Happy birthday, {c['first_name']}!",
                body=contains(wish),
            )
            for c in celebrants
        ],
    )


def contacts_update_from_emails(world: World, rng: random.Random) -> TaskInstance:
    days = rng.randint(5, 10)
    contacts = contact_rows(world)
    movers = rng.sample(contacts, rng.randint(2, 3) + 1)
    stale = movers.pop()  # told me months ago and is already up to date: not part of the task
    templates = rng.sample(NEW_NUMBER, len(movers))
    changes = []
    for person, (subject, text) in zip(movers, templates, strict=True):
        phone = new_phone(world, rng)
        plant_email(
            world,
            sender=person["email"],
            sender_name=full_name(person),
            subject=subject,
            body=f"Hi {me(world)['first_name']},\n\n{text.format(phone=pretty_phone(phone))}\n\n{person['first_name']}",
            date=days_ago(world, rng.uniform(0.2, days - 0.5)),
        )
        changes.append(updated("contacts", "contacts", person["id"], phone=phone))
    subject, text = rng.choice(NEW_NUMBER)
    old_news = text.format(phone=pretty_phone(stale["phone"]))
    plant_email(
        world,
        sender=stale["email"],
        sender_name=full_name(stale),
        subject=subject,
        body=f"Hi {me(world)['first_name']},\n\n{old_news}\n\n{stale['first_name']}",
        date=days_ago(world, rng.uniform(days + 3, 60)),
    )
    since = iso(world.now - timedelta(days=days))

    def oracle(c: OracleClient) -> None:
        mtoken = c.login("mail")
        recent = list(
            c.pages("mail", "search_emails", access_token=mtoken, query="number", folder="inbox", after=since)
        )
        ctoken = c.login("contacts")
        for e in recent:
            body = c.call("mail", "show_email", access_token=mtoken, email_id=e["email_id"])["body"]
            match = NEW_NUMBER_RE.search(body)
            if not match:
                continue
            hits = c.call("contacts", "search_contacts", access_token=ctoken, query=e["sender"])
            contact = next(h for h in hits if h["email"] == e["sender"])
            c.call(
                "contacts",
                "update_contact",
                access_token=ctoken,
                contact_id=contact["contact_id"],
                phone=match.group(1),
            )

    return TaskInstance(
        f"In the last {days} days a few of my contacts emailed me their new phone numbers. Update those numbers "
        "in my contacts.",
        oracle,
        changes,
    )


SCENARIOS = [
    Scenario("contacts_email_group", 2, ("contacts", "mail"), "train", contacts_email_group),
    Scenario("contacts_add_email_sender", 2, ("contacts", "mail"), "dev", contacts_add_email_sender),
    Scenario("contacts_birthday_wishes", 3, ("contacts", "mail"), "test_normal", contacts_birthday_wishes),
    Scenario("contacts_update_from_emails", 3, ("contacts", "mail"), "train", contacts_update_from_emails),
]
