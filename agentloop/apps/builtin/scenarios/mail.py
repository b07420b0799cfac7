"""Scenarios on the mail app alone."""

from __future__ import annotations

import random
import re
from datetime import timedelta
from typing import Any

from agentloop.apps.builtin.apps.mail import NEWSLETTERS, PROJECTS, PROMOS, STORES, receipt_body, store_items
from agentloop.apps.builtin.people import iso
from agentloop.apps.builtin.scenarios.common import days_ago, me, my_email, plant
from agentloop.apps.builtin.scenarios.contacts import contact_rows, full_name
from agentloop.apps.evaluation import Expect, added, contains, same_items, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance, pick
from agentloop.apps.world import World

SERVICES = {s.address for s in STORES} | {n[1] for n in NEWSLETTERS} | {p[1] for p in PROMOS}
REPLIES = [
    "Thanks, sounds great!",
    "Got it, I'll get back to you by tomorrow.",
    "Thank you! See you then.",
    "Perfect, that works for me.",
    "Thanks for letting me know.",
]
MESSAGES = [
    ("Coffee next week?", "Are you free for coffee on Tuesday morning?"),
    ("Borrowed book", "I finally finished your book, I'll bring it back on Saturday."),
    ("Weekend plans", "Want to go to the farmers market this weekend?"),
    ("Thank you", "Thank you so much for your help with the move."),
    ("Running late", "I'm running about 15 minutes late, sorry!"),
]
LABELS = ["Follow up", "Priority", "To read", "Keep"]
DRAFT_IDEAS = [
    ("Notes from Thursday's meeting", "Here are my notes: we agreed to ship the beta on the 20th."),
    ("Dinner recipe", "Here's the curry recipe you asked for: onions, garlic, ginger, coconut milk, chickpeas."),
    ("Trip photos", "Some of my favourite shots from the trip, enjoy!"),
    ("Introduction", "I'd love to introduce you to a friend who is also into woodworking."),
]
THREAD_IDEAS = [
    "Moving the {project} demo",
    "Team lunch on Friday",
    "Dates for the {project} retro",
    "Volunteers for the {project} launch",
]


# --- helpers other scenario modules share --------------------------------------------------------


def email_rows(world: World) -> list[dict[str, Any]]:
    return sorted(world.state["mail"]["emails"].values(), key=lambda e: e["id"])


def plant_email(
    world: World,
    *,
    sender: str,
    sender_name: str,
    subject: str,
    body: str,
    date: str,
    to: list[str] | None = None,
    cc: list[str] | None = None,
    folder: str = "inbox",
    attachments: list[dict[str, Any]] | None = None,
    labels: list[str] | None = None,
) -> dict[str, Any]:
    """Add an email the task needs (a thread of its own) to the mailbox."""
    record = plant(
        world,
        "mail",
        "emails",
        {
            "thread_id": 0,
            "folder": folder,
            "sender": sender,
            "sender_name": sender_name,
            "to": list(to) if to is not None else [my_email(world)],
            "cc": list(cc or []),
            "subject": subject,
            "body": body,
            "attachments": list(attachments or []),
            "labels": list(labels or []),
            "read": folder != "inbox",
            "date": date,
            "in_reply_to": None,
            "forward_of": None,
        },
    )
    record["thread_id"] = record["id"]
    return record


def base_subject(subject: str) -> str:
    return re.sub(r"^((re|fwd): )+", "", subject, flags=re.IGNORECASE)


def subject_is_unique(world: World, subject: str) -> bool:
    """No other email (reply or forward included) has this subject."""
    return sum(base_subject(e["subject"]) == base_subject(subject) for e in email_rows(world)) == 1


def from_people(world: World) -> list[dict[str, Any]]:
    """Inbox emails people (not stores or newsletters) sent."""
    return [e for e in email_rows(world) if e["folder"] == "inbox" and e["sender"] not in SERVICES]


def find_email(c: OracleClient, token: str, subject: str, **filters: Any) -> dict[str, Any]:
    hits = c.pages("mail", "search_emails", access_token=token, query=subject, **filters)
    return next(e for e in hits if e["subject"] == subject)


# --- scenarios ----------------------------------------------------------------------------------


def mail_latest_subject(world: World, rng: random.Random) -> TaskInstance:
    latest: dict[str, dict[str, Any]] = {}
    for e in from_people(world):
        if e["date"] > latest.get(e["sender"], {"date": ""})["date"]:
            latest[e["sender"]] = e
    email = rng.choice([e for _, e in sorted(latest.items()) if not e["subject"].startswith("Re: ")])
    name = email["sender_name"]

    def oracle(c: OracleClient) -> str:
        token = c.login("mail")
        hits = c.call("mail", "search_emails", access_token=token, sender=name, page_limit=20)
        return str(next(e for e in hits if e["sender_name"] == name)["subject"])

    ask = rng.choice(
        [
            "What's the subject of the latest email {name} sent me?",
            "What was {name}'s last email to me about? Give me its subject.",
        ]
    )
    return TaskInstance(ask.format(name=name), oracle, answer=email["subject"])


def mail_send_simple(world: World, rng: random.Random) -> TaskInstance:
    to = rng.choice(contact_rows(world))["email"]
    subject, body = rng.choice(MESSAGES)

    def oracle(c: OracleClient) -> None:
        token = c.login("mail")
        c.call("mail", "send_email", access_token=token, to=[to], subject=subject, body=body)

    return TaskInstance(
        f"Send an email to {to} with the subject '{subject}' and the text '{body}'.",
        oracle,
        [added("mail", "emails", folder="sent", to=[to], cc=[], subject=subject, body=contains(body))],
    )


def mail_attachment_names(world: World, rng: random.Random) -> TaskInstance:
    candidates = [
        e for e in from_people(world) if len(e["attachments"]) >= 2 and subject_is_unique(world, e["subject"])
    ]
    if candidates:
        email = rng.choice(candidates)
    else:
        sender = rng.choice(contact_rows(world))
        email = plant_email(
            world,
            sender=sender["email"],
            sender_name=full_name(sender),
            subject=f"Photos from {rng.choice(['the wedding', 'the beach', 'the reunion'])}",
            body=f"Hi {me(world)['first_name']},\n\nA few of my favourites, enjoy!\n\n{sender['first_name']}",
            date=days_ago(world, rng.uniform(1, 20)),
            attachments=[
                {"file_name": f"IMG_{rng.randint(1000, 9999)}.jpg", "size_kb": rng.randint(800, 4000)} for _ in range(3)
            ],
        )
    subject, name = email["subject"], email["sender_name"]

    def oracle(c: OracleClient) -> str:
        token = c.login("mail")
        found = find_email(c, token, subject, sender=name)
        return ", ".join(found["attachments"])

    return TaskInstance(
        f"What are the names of the files attached to the email '{subject}' from {name}?",
        oracle,
        answer=[a["file_name"] for a in email["attachments"]],
    )


def replied(email: dict[str, Any], text: str) -> Expect:
    """A reply to `email`, to its sender alone, saying `text`."""
    return added(
        "mail",
        "emails",
        folder="sent",
        in_reply_to=email["id"],
        to=[email["sender"]],
        cc=[],
        subject=f"Re: {email['subject']}",
        body=contains(text),
    )


def mail_reply_to(world: World, rng: random.Random) -> TaskInstance:
    email = rng.choice(
        [e for e in from_people(world) if not e["cc"] and len(e["to"]) == 1 and subject_is_unique(world, e["subject"])]
    )
    subject, name, text = email["subject"], email["sender_name"], rng.choice(REPLIES)

    def oracle(c: OracleClient) -> None:
        token = c.login("mail")
        found = find_email(c, token, subject, sender=name)
        c.call("mail", "reply_email", access_token=token, email_id=found["email_id"], body=text)

    return TaskInstance(
        f"Reply to {name}'s email '{subject}' with: '{text}'",
        oracle,
        [replied(email, text)],
    )


def mail_trash_old_newsletters(world: World, rng: random.Random) -> TaskInstance:
    name, address, topics = rng.choice(NEWSLETTERS)
    cutoff = (world.now - timedelta(days=rng.randint(6, 20))).date()
    age = (world.now.date() - cutoff).days
    # one issue on each side of the cutoff, so there is always something to delete and something to keep
    ages = (rng.uniform(0.2, age - 1), rng.uniform(age + 1, age + 30))
    for topic, days in zip(rng.sample(topics, 2), ages, strict=True):
        plant_email(
            world,
            sender=address,
            sender_name=name,
            subject=f"{name}: {topic} (special edition)",
            body=f"A special edition of {name} about {topic}.",
            date=days_ago(world, days),
        )
    old = [
        e
        for e in email_rows(world)
        if e["sender"] == address and e["folder"] == "inbox" and e["date"] < cutoff.isoformat()
    ]

    def oracle(c: OracleClient) -> None:
        token = c.login("mail")
        issues = c.pages("mail", "search_emails", access_token=token, sender=name, folder="inbox", before=str(cutoff))
        for e in list(issues):
            c.call("mail", "delete_email", access_token=token, email_id=e["email_id"])

    return TaskInstance(
        f"Delete the emails from {name} in my inbox that arrived before {cutoff:%B} {cutoff.day}; keep the newer ones.",
        oracle,
        [updated("mail", "emails", e["id"], folder="trash") for e in old],
    )


def mail_forward_attachment(world: World, rng: random.Random) -> TaskInstance:
    files: dict[str, list[dict[str, Any]]] = {}
    for e in email_rows(world):
        for a in e["attachments"]:
            files.setdefault(a["file_name"], []).append(e)
    file_name = rng.choice(
        sorted(f for f, emails in files.items() if len(emails) == 1 and emails[0]["folder"] == "inbox")
    )
    email = files[file_name][0]
    to = rng.choice([c["email"] for c in contact_rows(world) if c["email"] != email["sender"]])

    def oracle(c: OracleClient) -> None:
        token = c.login("mail")
        found = next(
            e
            for e in c.pages("mail", "search_emails", access_token=token, query=file_name)
            if file_name in e["attachments"]
        )
        c.call("mail", "forward_email", access_token=token, email_id=found["email_id"], to=[to])

    return TaskInstance(
        f"Forward the email that has '{file_name}' attached to {to}.",
        oracle,
        [
            added(
                "mail",
                "emails",
                folder="sent",
                forward_of=email["id"],
                to=[to],
                cc=[],
                subject=f"Fwd: {email['subject']}",
                attachments=email["attachments"],
            )
        ],
    )


def mail_label_from_person(world: World, rng: random.Random) -> TaskInstance:
    colleagues = [c for c in contact_rows(world) if c["relationship"] in ("coworker", "manager")]
    person = rng.choice(colleagues or contact_rows(world))
    name, label = full_name(person), rng.choice(LABELS)
    for subject in rng.sample(["Quick favor", "Agenda for tomorrow", "Re-org FAQ", "Expense report reminder"], 2):
        plant_email(
            world,
            sender=person["email"],
            sender_name=name,
            subject=subject,
            body=f"Hi {me(world)['first_name']},\n\nSee below, let me know what you think.\n\n{person['first_name']}",
            date=days_ago(world, rng.uniform(0.5, 40)),
            labels=["Work"],
        )
    theirs = [e for e in email_rows(world) if e["sender"] == person["email"] and e["folder"] != "trash"]

    def oracle(c: OracleClient) -> None:
        token = c.login("mail")
        found = [
            e for e in c.pages("mail", "search_emails", access_token=token, sender=name) if e["sender_name"] == name
        ]
        for e in found:
            c.call("mail", "label_email", access_token=token, email_id=e["email_id"], label=label)

    return TaskInstance(
        f"Add the label '{label}' to every email {name} has sent me.",
        oracle,
        [updated("mail", "emails", e["id"], labels=same_items([*e["labels"], label])) for e in theirs],
    )


def mail_send_draft(world: World, rng: random.Random) -> TaskInstance:
    subject, body = rng.choice(DRAFT_IDEAS)
    draft = plant_email(
        world,
        sender=my_email(world),
        sender_name=f"{me(world)['first_name']} {me(world)['last_name']}",
        to=[],
        subject=subject,
        body=body,
        date=days_ago(world, rng.uniform(0.5, 6)),
        folder="drafts",
    )
    recipient = rng.choice(contact_rows(world))
    to = recipient["email"]

    def oracle(c: OracleClient) -> None:
        token = c.login("mail")
        found = find_email(c, token, subject, folder="drafts")
        c.call("mail", "send_draft", access_token=token, email_id=found["email_id"], to=[to])

    return TaskInstance(
        f"Send my draft '{subject}' to {full_name(recipient)} at {to}.",
        oracle,
        [updated("mail", "emails", draft["id"], folder="sent", to=[to], date=iso(world.now))],
    )


def mail_reply_all(world: World, rng: random.Random) -> TaskInstance:
    contacts = contact_rows(world)
    colleagues = [c for c in contacts if c["relationship"] in ("coworker", "manager")]
    author, other, copied = rng.sample(colleagues if len(colleagues) >= 3 else contacts, 3)
    subject = THREAD_IDEAS[rng.randrange(len(THREAD_IDEAS))].format(project=rng.choice(PROJECTS))
    email = plant_email(
        world,
        sender=author["email"],
        sender_name=full_name(author),
        to=[my_email(world), other["email"]],
        cc=[copied["email"]],
        subject=subject,
        body=f"Hi both,\n\nDoes Thursday afternoon work for everyone?\n\n{author['first_name']}",
        date=days_ago(world, rng.uniform(0.2, 3)),
        labels=["Work"],
    )
    text = rng.choice(["Thursday works for me.", "I can do Thursday after 2pm.", "Count me in for Thursday."])

    def oracle(c: OracleClient) -> None:
        token = c.login("mail")
        found = find_email(c, token, subject, sender=author["email"])
        c.call("mail", "reply_email", access_token=token, email_id=found["email_id"], body=text, reply_all=True)

    return TaskInstance(
        f"Reply to everyone on {full_name(author)}'s email '{subject}' (including the people in cc) saying '{text}'",
        oracle,
        [
            added(
                "mail",
                "emails",
                folder="sent",
                in_reply_to=email["id"],
                to=same_items([author["email"], other["email"]]),
                cc=[copied["email"]],
                subject=f"Re: {subject}",
                body=contains(text),
            )
        ],
    )


def mail_receipts_total(world: World, rng: random.Random) -> TaskInstance:
    since = (world.now - timedelta(days=rng.randint(15, 45))).date()
    store = rng.choice(STORES)
    last4 = str(world.state["supervisor"]["payment_cards"]["1"]["card_number"])[-4:]
    for _ in range(2):
        when = world.now - timedelta(days=rng.uniform(1, (world.now.date() - since).days - 1))
        order = rng.randint(10000, 99999)
        plant_email(
            world,
            sender=store.address,
            sender_name=store.name,
            subject=f"Your receipt from {store.name} (order #{order})",
            body=receipt_body(me(world)["first_name"], store.name, order, when, store_items(store, rng), last4),
            date=iso(when),
            attachments=[{"file_name": f"receipt_{order}.pdf", "size_kb": rng.randint(30, 120)}],
            labels=["Receipts"],
        )
    total = 0.0
    for e in email_rows(world):
        if e["sender"] == store.address and e["folder"] != "trash" and e["date"] >= since.isoformat():
            total += sum(float(x) for x in re.findall(r"^Total: \$([\d.]+)$", e["body"], flags=re.MULTILINE))

    def oracle(c: OracleClient) -> float:
        token = c.login("mail")
        spent = 0.0
        for e in list(c.pages("mail", "search_emails", access_token=token, sender=store.name, after=since.isoformat())):
            body = c.call("mail", "show_email", access_token=token, email_id=e["email_id"])["body"]
            match = re.search(r"^Total: \$([\d.]+)$", body, flags=re.MULTILINE)
            spent += float(match.group(1)) if match else 0.0
        return round(spent, 2)

    return TaskInstance(
        f"How much have I spent at {store.name} since {since:%B} {since.day} ({since.isoformat()}), counting that day, "
        "according to the receipts in my email? Answer with the amount in dollars.",
        oracle,
        answer=round(total, 2),
    )


def mail_reply_latest_from(world: World, rng: random.Random) -> TaskInstance:
    latest: dict[str, dict[str, Any]] = {}
    for e in sorted(from_people(world), key=lambda e: e["date"]):
        latest[e["sender"]] = e
    email = pick(
        rng,
        [e for e in latest.values() if not e["cc"] and len(e["to"]) == 1 and subject_is_unique(world, e["subject"])],
        "latest email of a person that went to me alone",
    )
    name, address, text = email["sender_name"], email["sender"], rng.choice(REPLIES)

    def oracle(c: OracleClient) -> None:
        token = c.login("mail")
        hits = c.pages("mail", "search_emails", access_token=token, sender=address, folder="inbox")
        found = max((e for e in hits if e["sender"] == address), key=lambda e: e["date"])
        c.call("mail", "reply_email", access_token=token, email_id=found["email_id"], body=text)

    return TaskInstance(
        f"Reply to the latest email in my inbox from {name} ({address}), saying: '{text}'",
        oracle,
        [replied(email, text)],
    )


def mail_send_newest_draft(world: World, rng: random.Random) -> TaskInstance:
    (old_subject, old_body), (subject, body) = rng.sample(DRAFT_IDEAS, 2)
    sender, name = my_email(world), f"{me(world)['first_name']} {me(world)['last_name']}"
    # an older draft beside it: the task is the newer one
    for title, text, age in ((old_subject, old_body, rng.uniform(4, 9)), (subject, body, rng.uniform(0.05, 0.4))):
        newer = plant_email(
            world,
            sender=sender,
            sender_name=name,
            to=[],
            subject=title,
            body=text,
            date=days_ago(world, age),
            folder="drafts",
        )
    recipient = rng.choice(contact_rows(world))
    to = recipient["email"]

    def oracle(c: OracleClient) -> None:
        token = c.login("mail")
        found = max(c.pages("mail", "search_emails", access_token=token, folder="drafts"), key=lambda e: e["date"])
        c.call("mail", "send_draft", access_token=token, email_id=found["email_id"], to=[to])

    return TaskInstance(
        f"Send my most recent draft email to {full_name(recipient)} ({to}).",
        oracle,
        [updated("mail", "emails", newer["id"], folder="sent", to=[to], date=iso(world.now))],
    )


SCENARIOS = [
    Scenario("mail_latest_subject", 1, ("mail",), "train", mail_latest_subject),
    Scenario("mail_send_simple", 1, ("mail",), "train", mail_send_simple),
    Scenario("mail_reply_latest_from", 1, ("mail",), "train", mail_reply_latest_from),
    Scenario("mail_send_newest_draft", 1, ("mail",), "train", mail_send_newest_draft),
    Scenario("mail_attachment_names", 1, ("mail",), "test_normal", mail_attachment_names),
    Scenario("mail_reply_to", 1, ("mail",), "dev", mail_reply_to),
    Scenario("mail_trash_old_newsletters", 2, ("mail",), "train", mail_trash_old_newsletters),
    Scenario("mail_forward_attachment", 2, ("mail",), "train", mail_forward_attachment),
    Scenario("mail_label_from_person", 2, ("mail",), "train", mail_label_from_person),
    Scenario("mail_send_draft", 2, ("mail",), "dev", mail_send_draft),
    Scenario("mail_reply_all", 2, ("mail",), "test_normal", mail_reply_all),
    Scenario("mail_receipts_total", 3, ("mail",), "test_normal", mail_receipts_total),
]
