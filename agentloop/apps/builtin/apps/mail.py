"""Mail: the supervisor's mailbox (inbox, sent, drafts, trash) with labels and attachments."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
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
from agentloop.apps.builtin.apps.contacts import employer
from agentloop.apps.builtin.people import Person, WorldData, iso

FOLDERS = ("inbox", "sent", "drafts", "trash")


@dataclass(frozen=True)
class Store:
    """A shop that emails the supervisor receipts."""

    name: str
    address: str
    items: tuple[str, ...]
    prices: tuple[int, int]  # cheapest and dearest item, in dollars
    ships: bool = False  # also sends "your order has shipped" notices


STORES = [
    Store("Lumen Books", "receipts@lumenbooks.com", ("Piranesi", "Notebook set", "Cookbook"), (9, 38), True),
    Store("Greenleaf Grocery", "orders@greenleafgrocery.com", ("Produce box", "Oat milk", "Coffee beans"), (3, 24)),
    Store("CityRide", "receipts@cityride.app", ("Ride to Downtown", "Ride to the airport", "Ride home"), (9, 48)),
    Store("Brew & Bean", "hello@brewandbean.cafe", ("Flat white", "Croissant", "Cold brew", "Bagel"), (3, 7)),
    Store("Northwind Outfitters", "orders@northwindoutfitters.com", ("Rain jacket", "Hiking boots"), (12, 140), True),
]
NEWSLETTERS = [
    ("The Morning Brief", "newsletter@morningbrief.news", ["markets", "city council", "the heat wave", "elections"]),
    ("Trailhead Weekly", "digest@trailheadweekly.com", ["spring trails", "camp stoves", "bear safety", "day hikes"]),
    ("Kitchen Notes", "hello@kitchennotes.co", ["one-pot dinners", "sourdough", "summer salads", "knife skills"]),
]
PROMOS = [
    ("ShopMart Deals", "deals@shopmart.com", "Flash sale: 40% off everything"),
    ("Sunny Cruises", "promo@sunnycruises.biz", "You've been selected for a free cruise!"),
    ("FitLife", "offers@fitlife.club", "Your first month free"),
]
PROJECTS = ["Atlas", "Beacon", "Harbor", "Nimbus", "Orion", "Sparrow", "Juniper", "Cascade"]
WORK_TOPICS = [
    ("Q{q} roadmap review", "roadmap_q{q}.pdf"),
    ("Budget for the {project} launch", "budget_{slug}.xlsx"),
    ("Design doc: {project}", "{slug}_design.docx"),
    ("Offsite agenda", "offsite_agenda.pdf"),
    ("Hiring plan for {project}", None),
    ("Incident review: {project} outage", "postmortem_{slug}.docx"),
    ("Customer feedback on {project}", "feedback_{slug}.pdf"),
    ("Slides for Thursday's all-hands", "all_hands.pptx"),
    ("{project} status update", None),
]
WORK_OPENINGS = [
    "Following up on our conversation from this morning.",
    "I put together a first draft, see attached.",
    "Quick one before the weekend.",
    "Sharing the latest numbers ahead of the review.",
]
WORK_ASKS = [
    "Could you take a look and leave comments by Friday?",
    "Can you confirm the timeline works for your side?",
    "Let me know if anything is missing.",
    "Do you have 30 minutes tomorrow to go through it?",
]
WORK_REPLIES = [
    "Thanks, I'll review it today.",
    "Looks good to me. Two small comments inline.",
    "Works for me. Let's sync on Thursday.",
    "I added my notes to the doc.",
    "Great, thanks for pulling this together.",
]
INVITES = [
    ("Dinner at our place on {weekday}?", "We're making lasagna and would love to have you over."),
    ("Game night this {weekday}", "Bringing out the board games again, snacks provided."),
    ("BBQ in the backyard on {weekday}", "Firing up the grill, bring whatever you like to drink."),
    ("Hike at {park} on {weekday}?", "Thinking of the loop trail, about 8 miles."),
    ("Housewarming party!", "We finally finished unpacking. Come see the new place!"),
    ("Picnic at {park}", "Blankets and sandwiches, nothing fancy."),
]
PARKS = ["Eagle Rock", "Mill Creek", "Cedar Falls", "Lakeside Park", "Pine Ridge"]
RSVPS = ["Count me in!", "I'd love to come, what can I bring?", "Sorry, I can't make it this time. Have fun!"]
FAMILY = [
    ("Photos from {place}", "Here are some pictures from the trip. The kids loved it."),
    ("Grandma's {dish} recipe", "As promised, here's the recipe. Don't skip the nutmeg!"),
    ("Family reunion this summer", "We're thinking of the second weekend of August. Can you come?"),
    ("News from {city}", "Everything is good here. The garden is finally blooming."),
]
PLACES = ["the lake house", "Yosemite", "the coast", "Grandpa's farm", "the county fair"]
DISHES = ["apple pie", "lasagna", "banana bread", "chicken soup"]
ROOMMATE = [
    ("Rent for {month}", "Rent is due on the 1st. It's ${share} each this month."),
    ("Utilities bill for {month}", "Electric and internet came to ${total}, so ${share} each."),
    ("Cleaning schedule", "I made a rotation for the chores, see attached."),
    ("Package for you at the door", "A box came for you today, I left it in your room."),
]
NEIGHBOR = [
    ("Borrowing your ladder", "Would it be okay if I borrowed your ladder this weekend?"),
    ("Street party on {weekday}", "The block is doing a street party, hope you can come!"),
    ("Your package", "The courier left your package on my porch, I'll hold on to it."),
]
CLASSMATE = [
    ("Reunion planning", "We're planning the reunion for the fall. Are you in?"),
    ("Notes from {course}", "Found my old notes while cleaning, thought you'd like them."),
]
COURSES = ["statistics", "organic chemistry", "French", "data structures"]
MINE = [
    ("Quick question", "Do you still have the number of that plumber you recommended?"),
    ("Book recommendation", "I just finished Piranesi and think you'd love it."),
    ("Thanks for yesterday!", "Had a great time, thanks again for hosting."),
    ("Catching up", "It's been ages! Want to grab coffee next week?"),
    ("Photos from Saturday", "Here are the photos I promised."),
]
DRAFTS = [
    ("Vacation plans for {month}", "Thinking about a week in Lisbon. Flights look cheapest mid-month."),
    ("Letter to the landlord", "Hi, I'm writing about the heater in the living room, which still doesn't work."),
    ("Recommendation for {name}", "I'm happy to recommend {name}, who I've worked with for three years."),
]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October"]
WEEKDAYS = ["Friday", "Saturday", "Sunday"]


@dataclass
class _Draft:
    """An email being generated; ids are given once every email is made, in date order."""

    sender: str
    sender_name: str
    to: list[str]
    subject: str
    body: str
    when: datetime
    folder: str
    cc: list[str] = field(default_factory=list)
    attachments: list[dict[str, Any]] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    thread: int = 0
    reply_to: _Draft | None = None


class _MailboxBuilder:
    def __init__(self, data: WorldData) -> None:
        self.data = data
        self.rng = data.rng("mail")
        self.me = data.supervisor
        self.emails: list[_Draft] = []
        self._threads = 0

    def when(self, max_days: float, min_days: float = 0.05) -> datetime:
        return self.data.now - timedelta(days=self.rng.uniform(min_days, max_days))

    def new_thread(self) -> int:
        self._threads += 1
        return self._threads

    def add(self, draft: _Draft) -> _Draft:
        if not draft.thread:
            draft.thread = self.new_thread()
        self.emails.append(draft)
        return draft

    def from_person(self, p: Person, subject: str, body: str, when: datetime, **kw: Any) -> _Draft:
        to = kw.pop("to", [self.me.email])
        return self.add(_Draft(p.email, p.name, to, subject, body, when, "inbox", **kw))

    def reply(self, original: _Draft, sender: Person, body: str, hours: float) -> _Draft:
        """A reply in the same thread; the supervisor's replies go to Sent."""
        mine = sender.email == self.me.email
        recipients = [original.sender] if original.sender != sender.email else list(original.to)
        subject = original.subject if original.subject.startswith("Re: ") else f"Re: {original.subject}"
        cc = [a for a in original.cc if a != sender.email]
        return self.add(
            _Draft(
                sender.email,
                sender.name,
                recipients,
                subject,
                body,
                original.when + timedelta(hours=hours),
                "sent" if mine else "inbox",
                cc=cc,
                labels=list(original.labels) if not mine else [],
                thread=original.thread,
                reply_to=original,
            )
        )

    def attachment(self, name: str, low: int = 20, high: int = 900) -> dict[str, Any]:
        return {"file_name": name, "size_kb": self.rng.randint(low, high)}


def _fill(template: str, rng: random.Random, **values: str) -> str:
    pools = {
        "weekday": WEEKDAYS,
        "park": PARKS,
        "place": PLACES,
        "dish": DISHES,
        "month": MONTHS,
        "course": COURSES,
        "project": PROJECTS,
    }
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1)) or rng.choice(pools[m.group(1)]), template)


def receipt_body(
    first_name: str, store: str, order: int, when: datetime, bought: list[tuple[str, float]], card_last4: str
) -> str:
    """A store's receipt email; its last money line is `Total: $X.YY`."""
    lines = "\n".join(f"- {item}: ${price:.2f}" for item, price in bought)
    total = round(sum(price for _, price in bought), 2)
    return (
        f"Hi {first_name},\n\nThanks for shopping at {store}! Here is your receipt.\n\n"
        f"Order #{order} ({when:%B} {when.day}, {when.year})\n{lines}\nTotal: ${total:.2f}\n\n"
        f"Paid with Visa ending in {card_last4}."
    )


def store_items(store: Store, rng: random.Random) -> list[tuple[str, float]]:
    """One or two items of an order, with their prices."""
    low, high = store.prices
    return [(item, round(rng.uniform(low, high), 2)) for item in rng.sample(store.items, rng.randint(1, 2))]


def _receipts(b: _MailboxBuilder, card_last4: str) -> None:
    rng = b.rng
    for store in STORES:
        for _ in range(rng.randint(2, 4)):
            when = b.when(90)
            order = rng.randint(10000, 99999)
            bought = store_items(store, rng)
            body = receipt_body(b.me.first_name, store.name, order, when, bought, card_last4)
            b.add(
                _Draft(
                    store.address,
                    store.name,
                    [b.me.email],
                    f"Your receipt from {store.name} (order #{order})",
                    body,
                    when,
                    "inbox",
                    attachments=[b.attachment(f"receipt_{order}.pdf", 30, 120)],
                    labels=["Receipts"],
                )
            )
            if store.ships and when + timedelta(days=2) < b.data.now:
                b.add(
                    _Draft(
                        store.address,
                        store.name,
                        [b.me.email],
                        f"Your order #{order} has shipped",
                        f"Good news, {b.me.first_name}! Your {store.name} order #{order} is on its way.",
                        when + timedelta(days=rng.uniform(0.5, 2)),
                        "inbox",
                    )
                )


def _newsletters(b: _MailboxBuilder) -> None:
    for name, address, topics in NEWSLETTERS:
        for topic in b.rng.sample(topics, b.rng.randint(2, 4)):
            b.add(
                _Draft(
                    address,
                    name,
                    [b.me.email],
                    f"{name}: {topic}",
                    f"This week in {name}: everything about {topic}.\n\nRead more on our website. "
                    "Unsubscribe at any time.",
                    b.when(60),
                    "inbox",
                )
            )
    for name, address, subject in b.rng.sample(PROMOS, 2):
        b.add(_Draft(address, name, [b.me.email], subject, "Limited time only. Click to claim.", b.when(50), "trash"))


def _work(b: _MailboxBuilder, colleagues: list[Person], company: str) -> None:
    rng = b.rng
    if not colleagues:
        return
    for template, file_template in rng.sample(WORK_TOPICS, rng.randint(6, 8)):
        project = rng.choice(PROJECTS)
        values = {"project": project, "slug": project.lower(), "q": str(rng.randint(2, 4))}
        subject = _fill(template, rng, **values)
        author = rng.choice(colleagues)
        others = [p for p in colleagues if p is not author]
        cc = [p.email for p in rng.sample(others, min(len(others), rng.randint(0, 2)))]
        body = (
            f"Hi {b.me.first_name},\n\n{rng.choice(WORK_OPENINGS)} {rng.choice(WORK_ASKS)}\n\n"
            f"Thanks,\n{author.first_name}\n{company}"
        )
        files = [b.attachment(_fill(file_template, rng, **values))] if file_template else []
        email = b.from_person(author, subject, body, b.when(80, 1), cc=cc, attachments=files, labels=["Work"])
        speakers = [b.me, author]
        for turn in range(rng.randint(0, 3)):
            reply_body = f"{rng.choice(WORK_REPLIES)}\n\n{speakers[turn % 2].first_name}"
            email = b.reply(email, speakers[turn % 2], reply_body, hours=rng.uniform(1, 20) * (turn + 1))


def _personal(b: _MailboxBuilder, groups: dict[str, list[Person]]) -> None:
    rng = b.rng
    friends = groups["friend"] + groups["neighbor"] + groups["classmate"] + groups["family"]
    for template, text in rng.sample(INVITES, min(len(INVITES), rng.randint(4, 6))):
        if not friends:
            break
        host = rng.choice(friends)
        body = f"Hey {b.me.first_name}!\n\n{text} Starts at {rng.randint(5, 8)}pm. Let me know if you can make it!\n\n"
        email = b.from_person(host, _fill(template, rng), body + host.first_name, b.when(45, 0.5))
        if rng.random() < 0.6:
            b.reply(email, b.me, f"{rng.choice(RSVPS)}\n\n{b.me.first_name}", hours=rng.uniform(1, 10))
    _letters(b, groups["family"], FAMILY, rng.randint(3, 5), labels=["Family"])
    _letters(b, groups["roommate"], ROOMMATE, rng.randint(2, 4))
    _letters(b, groups["neighbor"], NEIGHBOR, rng.randint(1, 3))
    _letters(b, groups["classmate"], CLASSMATE, rng.randint(1, 2))


def _letters(
    b: _MailboxBuilder, senders: list[Person], templates: list[tuple[str, str]], n: int, labels: list[str] | None = None
) -> None:
    rng = b.rng
    if not senders:
        return
    for template, text in rng.sample(templates, min(n, len(templates))):
        p = rng.choice(senders)
        when = b.when(70, 0.3)
        total = rng.randint(90, 260)
        # rent is asked for the coming month, bills are for the one that just ended
        start = when.replace(day=1)
        month = start + timedelta(days=32) if template.startswith("Rent") else start - timedelta(days=1)
        values = {"city": p.city, "total": f"{total:.2f}", "share": f"{total / 3:.2f}", "month": f"{month:%B}"}
        if template.startswith("Rent"):
            values["share"] = f"{rng.randint(6, 14) * 100:.2f}"
        subject, text = _fill(template, rng, **values), _fill(text, rng, **values)
        files: list[dict[str, Any]] = []
        if subject.startswith("Photos"):
            files = [b.attachment(f"IMG_{rng.randint(1000, 9999)}.jpg", 800, 4000) for _ in range(rng.randint(2, 4))]
        elif subject.startswith(("Grandma", "Utilities", "Cleaning", "Notes from")):
            slug = re.sub(r"[^a-z0-9]+", "_", subject.lower().replace("'", "")).strip("_")
            files = [b.attachment(f"{slug}.pdf", 40, 400)]
        body = f"Hi {b.me.first_name},\n\n{text}\n\n{p.first_name}"
        b.from_person(p, subject, body, when, attachments=files, labels=list(labels or []))


def _mine(b: _MailboxBuilder, people: list[Person]) -> None:
    rng = b.rng
    for subject, text in rng.sample(MINE, rng.randint(3, 5)):
        p = rng.choice(people)
        body = f"Hi {p.first_name},\n\n{text}\n\n{b.me.first_name}"
        files = [b.attachment(f"IMG_{rng.randint(1000, 9999)}.jpg", 800, 4000) for _ in range(2)]
        email = _Draft(b.me.email, b.me.name, [p.email], subject, body, b.when(60), "sent")
        email.attachments = files if subject.startswith("Photos") else []
        b.add(email)
    for template, text in rng.sample(DRAFTS, 2):
        about, reader = rng.sample(people, 2)  # a recommendation is about one person, for another
        subject = _fill(template, rng, name=about.name)
        to = [reader.email] if template.startswith("Recommendation") else []
        b.add(_Draft(b.me.email, b.me.name, to, subject, _fill(text, rng, name=about.name), b.when(20), "drafts"))


def build_state(data: WorldData) -> AppState:
    b = _MailboxBuilder(data)
    groups: dict[str, list[Person]] = {}
    for p in data.people:
        groups.setdefault(p.relationship, []).append(p)
    for rel in ("friend", "coworker", "family", "roommate", "neighbor", "manager", "classmate"):
        groups.setdefault(rel, [])
    card_last4 = str(data.cards[0]["card_number"])[-4:] if data.cards else "4242"
    _receipts(b, card_last4)
    _newsletters(b)
    _work(b, groups["coworker"] + groups["manager"], employer(data))
    _personal(b, groups)
    _mine(b, data.people)

    b.emails.sort(key=lambda e: e.when)
    ids = {id(e): i for i, e in enumerate(b.emails, start=1)}
    threads: dict[int, int] = {}
    rows: dict[str, dict[str, Any]] = {}
    for e in b.emails:
        i = ids[id(e)]
        recent = (data.now - e.when).days < 4
        rows[str(i)] = {
            "id": i,
            "thread_id": threads.setdefault(e.thread, i),
            "folder": e.folder,
            "sender": e.sender,
            "sender_name": e.sender_name,
            "to": e.to,
            "cc": e.cc,
            "subject": e.subject,
            "body": e.body,
            "attachments": e.attachments,
            "labels": e.labels,
            "read": e.folder != "inbox" or b.rng.random() < (0.45 if recent else 0.92),
            "date": iso(e.when),
            "in_reply_to": ids[id(e.reply_to)] if e.reply_to else None,
            "forward_of": None,
        }
    return {"emails": rows, "_sessions": {}}


app = AppSpec(
    name="mail",
    description="Your email: inbox, sent mail, drafts and trash; read, search, send, reply, forward and label emails.",
    build_state=build_state,
    volatile_fields=frozenset({"read"}),
)

SUMMARY = "[{email_id, thread_id, folder, sender, sender_name, to, cc, subject, date, read, labels, attachments}]"
DETAIL = (
    "{email_id, thread_id, folder, sender, sender_name, to, cc, subject, body, date, read, labels, "
    "attachments: [{file_name, size_kb}], in_reply_to, forward_of}"
)
ADDRESSES = {"type": "string", "description": "An email address."}


def _summary(e: dict[str, Any]) -> dict[str, Any]:
    keys = ("thread_id", "folder", "sender", "sender_name", "to", "cc", "subject", "date", "read", "labels")
    return {"email_id": e["id"], **{k: e[k] for k in keys}, "attachments": [a["file_name"] for a in e["attachments"]]}


def _newest_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda e: (e["date"], e["id"]), reverse=True)


def _addresses(values: list[str], what: str) -> list[str]:
    out: list[str] = []
    for value in values:
        address = value.strip().lower()
        if not re.fullmatch(r"[^@\s<>]+@[^@\s<>]+\.[^@\s<>]+", address):
            raise ApiError(
                422, f"{value!r} in {what} is not an email address. Look people's addresses up in your contacts."
            )
        if address not in out:
            out.append(address)
    return out


def _date_bound(value: str, what: str) -> str:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?Z?)?", value):
        raise ApiError(422, f"{what} must be a date (YYYY-MM-DD) or date-time (YYYY-MM-DDTHH:MM:SSZ), not {value!r}.")
    return value


@app.api(
    "List the emails in your inbox, newest first. Optionally only unread ones or only those with a label.",
    params={
        "unread": boolean("Only unread (true) or only read (false) emails."),
        "label": string("Only emails with this label."),
        **page_params(),
    },
    returns=SUMMARY,
)
def list_inbox(
    ctx: CallContext, page_index: int, page_limit: int, unread: bool | None = None, label: str | None = None
) -> list[dict[str, Any]]:
    rows = [
        e
        for e in ctx.table("emails").values()
        if e["folder"] == "inbox"
        and (unread is None or e["read"] != unread)
        and (label is None or label.casefold() in (x.casefold() for x in e["labels"]))
    ]
    return [_summary(e) for e in paginate(_newest_first(rows), page_index, page_limit)]


@app.api("List the emails you sent, newest first.", params=page_params(), returns=SUMMARY)
def list_sent(ctx: CallContext, page_index: int, page_limit: int) -> list[dict[str, Any]]:
    rows = [e for e in ctx.table("emails").values() if e["folder"] == "sent"]
    return [_summary(e) for e in paginate(_newest_first(rows), page_index, page_limit)]


def _searchable(e: dict[str, Any]) -> str:
    files = " ".join(a["file_name"] for a in e["attachments"])
    return f"{e['subject']} {e['body']} {e['sender_name']} {e['sender']} {files}".casefold()


@app.api(
    "Search your emails, newest first. Every word of the query must appear in the subject, body, sender or an "
    "attachment's file name. Looks in every folder except trash unless you pick a folder.",
    params={
        "query": string("Words to look for."),
        "sender": string("Part of the sender's name or email address."),
        "recipient": string("Part of an address in to or cc."),
        "folder": string("inbox, sent, drafts or trash.", enum=list(FOLDERS)),
        "label": string("Only emails with this label."),
        "has_attachments": boolean("Only emails with (true) or without (false) attachments."),
        "unread": boolean("Only unread (true) or read (false) emails."),
        "after": string("Only emails on or after this date (YYYY-MM-DD) or date-time."),
        "before": string("Only emails before this date (YYYY-MM-DD) or date-time."),
        **page_params(),
    },
    returns=SUMMARY,
)
def search_emails(
    ctx: CallContext,
    page_index: int,
    page_limit: int,
    query: str | None = None,
    sender: str | None = None,
    recipient: str | None = None,
    folder: str | None = None,
    label: str | None = None,
    has_attachments: bool | None = None,
    unread: bool | None = None,
    after: str | None = None,
    before: str | None = None,
) -> list[dict[str, Any]]:
    words = (query or "").casefold().split()
    who = (sender or "").casefold().strip()
    to = (recipient or "").casefold().strip()
    lo = _date_bound(after, "after") if after else None
    hi = _date_bound(before, "before") if before else None
    rows = []
    for e in ctx.table("emails").values():
        if (folder is None and e["folder"] == "trash") or (folder is not None and e["folder"] != folder):
            continue
        if words and not all(w in _searchable(e) for w in words):
            continue
        if who and who not in e["sender"] and who not in e["sender_name"].casefold():
            continue
        if to and not any(to in a for a in e["to"] + e["cc"]):
            continue
        if label is not None and label.casefold() not in (x.casefold() for x in e["labels"]):
            continue
        if has_attachments is not None and bool(e["attachments"]) != has_attachments:
            continue
        if unread is not None and e["read"] == unread:
            continue
        if (lo and e["date"] < lo) or (hi and e["date"] >= hi):
            continue
        rows.append(e)
    return [_summary(e) for e in paginate(_newest_first(rows), page_index, page_limit)]


@app.api(
    "Show one email with its full body and attachments. Opening an email marks it as read.",
    params={"email_id": integer("Id of the email.")},
    required=["email_id"],
    returns=DETAIL,
)
def show_email(ctx: CallContext, email_id: int) -> dict[str, Any]:
    email = ctx.get("emails", email_id, "email")
    email["read"] = True
    return {"email_id": email["id"], **{k: v for k, v in email.items() if k != "id"}}


def _send(
    ctx: CallContext,
    to: list[str],
    cc: list[str],
    subject: str,
    body: str,
    *,
    attachments: list[dict[str, Any]] | None = None,
    reply_of: dict[str, Any] | None = None,
    forward_of: dict[str, Any] | None = None,
) -> dict[str, Any]:
    profile = ctx.world.state["supervisor"]["profile"]["1"]
    record = {
        "thread_id": 0,
        "folder": "sent",
        "sender": ctx.user,
        "sender_name": f"{profile['first_name']} {profile['last_name']}",
        "to": to,
        "cc": [a for a in cc if a not in to],
        "subject": subject,
        "body": body,
        "attachments": [dict(a) for a in attachments or []],
        "labels": [],
        "read": True,
        "date": iso(ctx.now),
        "in_reply_to": reply_of["id"] if reply_of else None,
        "forward_of": forward_of["id"] if forward_of else None,
    }
    email = ctx.insert("emails", record)
    email["thread_id"] = reply_of["thread_id"] if reply_of else email["id"]
    return {"email_id": email["id"]}


@app.api(
    "Send a new email.",
    params={
        "to": array("Recipients' email addresses.", ADDRESSES, minItems=1),
        "subject": string("Subject line."),
        "body": string("Text of the email."),
        "cc": array("Addresses to copy.", ADDRESSES),
    },
    required=["to", "subject", "body"],
    returns="{email_id}",
)
def send_email(ctx: CallContext, to: list[str], subject: str, body: str, cc: list[str] | None = None) -> dict[str, Any]:
    return _send(ctx, _addresses(to, "to"), _addresses(cc or [], "cc"), subject, body)


def _prefixed(prefix: str, subject: str) -> str:
    return subject if subject.casefold().startswith(prefix.casefold()) else f"{prefix}{subject}"


@app.api(
    "Reply to an email: it goes to the sender (or, for an email you sent, to its recipients) with 'Re: ' before "
    "the subject. With reply_all, everyone else on the email is included too.",
    params={
        "email_id": integer("Id of the email you are replying to."),
        "body": string("Text of your reply."),
        "reply_all": boolean("Also reply to the other recipients and cc.", default=False),
    },
    required=["email_id", "body"],
    returns="{email_id}",
)
def reply_email(ctx: CallContext, email_id: int, body: str, reply_all: bool) -> dict[str, Any]:
    original = ctx.get("emails", email_id, "email")
    if original["folder"] == "drafts":
        raise ApiError(409, f"Email {email_id} is a draft, not a received email; send it with send_draft.")
    me = ctx.user
    if original["sender"] == me:
        to = list(original["to"])
        cc = list(original["cc"]) if reply_all else []
    else:
        to = [original["sender"]] + ([a for a in original["to"] if a != me] if reply_all else [])
        cc = [a for a in original["cc"] if a != me] if reply_all else []
    subject = _prefixed("Re: ", original["subject"])
    return _send(ctx, _addresses(to, "to"), _addresses(cc, "cc"), subject, body, reply_of=original)


@app.api(
    "Forward an email, with its attachments, to other people. Your text goes above the forwarded message.",
    params={
        "email_id": integer("Id of the email to forward."),
        "to": array("Recipients' email addresses.", ADDRESSES, minItems=1),
        "body": string("Your text above the forwarded message.", default=""),
        "cc": array("Addresses to copy.", ADDRESSES),
    },
    required=["email_id", "to"],
    returns="{email_id}",
)
def forward_email(
    ctx: CallContext, email_id: int, to: list[str], body: str, cc: list[str] | None = None
) -> dict[str, Any]:
    original = ctx.get("emails", email_id, "email")
    quoted = (
        f"{body}\n\n---------- Forwarded message ----------\n"
        f"From: {original['sender_name']} <{original['sender']}>\nDate: {original['date']}\n"
        f"Subject: {original['subject']}\nTo: {', '.join(original['to'])}\n\n{original['body']}"
    ).lstrip("\n")
    subject = _prefixed("Fwd: ", original["subject"])
    return _send(
        ctx,
        _addresses(to, "to"),
        _addresses(cc or [], "cc"),
        subject,
        quoted,
        attachments=original["attachments"],
        forward_of=original,
    )


@app.api(
    "Send one of your drafts (find them with search_emails, folder 'drafts'). Give `to` to set or replace its "
    "recipients.",
    params={
        "email_id": integer("Id of the draft."),
        "to": array("Recipients' email addresses (replace the draft's).", ADDRESSES, minItems=1),
    },
    required=["email_id"],
    returns="{email_id}",
)
def send_draft(ctx: CallContext, email_id: int, to: list[str] | None = None) -> dict[str, Any]:
    draft = ctx.get("emails", email_id, "email")
    if draft["folder"] != "drafts":
        raise ApiError(409, f"Email {email_id} is not a draft (it is in {draft['folder']}).")
    recipients = _addresses(to, "to") if to else draft["to"]
    if not recipients:
        raise ApiError(422, f"Draft {email_id} has no recipients yet: give `to`.")
    draft.update({"to": recipients, "folder": "sent", "date": iso(ctx.now)})
    return {"email_id": email_id}


@app.api(
    "Delete an email: it moves to trash. Deleting an email that is already in trash removes it for good.",
    params={"email_id": integer("Id of the email.")},
    required=["email_id"],
    returns="A confirmation message.",
)
def delete_email(ctx: CallContext, email_id: int) -> str:
    email = ctx.get("emails", email_id, "email")
    if email["folder"] == "trash":
        del ctx.table("emails")[str(email_id)]
        return f"Email {email_id} deleted for good."
    email["folder"] = "trash"
    return f"Email {email_id} moved to trash."


def _set_read(ctx: CallContext, email_id: int, read: bool) -> str:
    email = ctx.get("emails", email_id, "email")
    email["read"] = read
    return f"Email {email_id} marked as {'read' if read else 'unread'}."


@app.api(
    "Mark an email as read.",
    params={"email_id": integer("Id of the email.")},
    required=["email_id"],
    returns="A confirmation message.",
)
def mark_read(ctx: CallContext, email_id: int) -> str:
    return _set_read(ctx, email_id, True)


@app.api(
    "Mark an email as unread.",
    params={"email_id": integer("Id of the email.")},
    required=["email_id"],
    returns="A confirmation message.",
)
def mark_unread(ctx: CallContext, email_id: int) -> str:
    return _set_read(ctx, email_id, False)


@app.api(
    "List your labels with how many emails (and unread emails) have each, alphabetically.",
    params=page_params(default_limit=10),
    returns="[{label, email_count, unread_count}]",
)
def list_labels(ctx: CallContext, page_index: int, page_limit: int) -> list[dict[str, Any]]:
    counts: dict[str, list[int]] = {}
    for e in ctx.table("emails").values():
        for label in e["labels"]:
            count = counts.setdefault(label, [0, 0])
            count[0] += 1
            count[1] += not e["read"]
    rows: list[dict[str, Any]] = [{"label": k, "email_count": v[0], "unread_count": v[1]} for k, v in counts.items()]
    rows.sort(key=lambda r: r["label"].casefold())
    return paginate(rows, page_index, page_limit)


@app.api(
    "Add a label to an email (a new label is created on first use), or remove one with remove=true.",
    params={
        "email_id": integer("Id of the email."),
        "label": string("The label, e.g. 'Work'.", minLength=1),
        "remove": boolean("Remove the label instead of adding it.", default=False),
    },
    required=["email_id", "label"],
    returns="{email_id, labels}",
)
def label_email(ctx: CallContext, email_id: int, label: str, remove: bool) -> dict[str, Any]:
    email = ctx.get("emails", email_id, "email")
    name = label.strip()
    if not name:
        raise ApiError(422, "The label is empty.")
    # reuse an existing label's spelling, so 'work' and 'Work' stay one label
    existing = {x.casefold(): x for e in ctx.table("emails").values() for x in e["labels"]}
    name = existing.get(name.casefold(), name)
    has = [x for x in email["labels"] if x.casefold() == name.casefold()]
    if remove:
        if not has:
            raise ApiError(
                404, f"Email {email_id} has no label {label!r}; its labels are: {email['labels'] or 'none'}."
            )
        email["labels"] = [x for x in email["labels"] if x not in has]
    elif not has:
        email["labels"] = [*email["labels"], name]
    return {"email_id": email_id, "labels": list(email["labels"])}
