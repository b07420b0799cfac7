"""Scenarios that span several apps: notes, wallet, contacts, mail, shop, calendar and the supervisor."""

from __future__ import annotations

import random
import re
from datetime import date, datetime, timedelta
from typing import Any

from agentloop.apps.builtin.apps.contacts import STREET_KINDS, STREETS
from agentloop.apps.builtin.apps.notes import GROCERIES
from agentloop.apps.builtin.apps.shop import make_order
from agentloop.apps.builtin.people import iso
from agentloop.apps.builtin.scenarios._matchers import all_of, amounts_in, has_phone, mentions_amount
from agentloop.apps.builtin.scenarios._when import day_label
from agentloop.apps.builtin.scenarios.calendar import events, find_event, midnight, new_event, people_emails
from agentloop.apps.builtin.scenarios.common import days_ago, my_email, plant
from agentloop.apps.builtin.scenarios.contacts import contact_rows, find_contact, full_name, new_person
from agentloop.apps.builtin.scenarios.mail import find_email, plant_email, subject_is_unique
from agentloop.apps.builtin.scenarios.notes import note_rows, plant_note, read_note
from agentloop.apps.builtin.scenarios.shop import buyable, find_product, orders, supervisor_names, the
from agentloop.apps.builtin.scenarios.supervisor import named
from agentloop.apps.builtin.scenarios.wallet import (
    MONTHS,
    at,
    balance,
    cents,
    money,
    month_bounds,
    plant_payment,
    transactions,
    world_people,
)
from agentloop.apps.evaluation import Expect, added, contains, same_items, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World

Record = dict[str, Any]
LINE = re.compile(r"^- (.+?): \$(\d+\.\d\d)(.*)$")  # '- Dana Whitfield: $23.50 (paid back)'


# --- helpers -----------------------------------------------------------------------------------


def free_title(world: World, rng: random.Random, options: list[str]) -> str:
    """A note title no note has yet."""
    taken = {n["title"] for n in note_rows(world)}
    return rng.choice([t for t in options if t not in taken])


def reachable(world: World) -> list[Record]:
    """Contacts with an email address."""
    return [c for c in contact_rows(world) if c["email"]]


def make_roommates(world: World, rng: random.Random, count: int) -> list[Record]:
    """Exactly `count` contacts are roommates (those who were, first); the others who were become friends."""
    current = [c for c in reachable(world) if c["relationship"] == "roommate"]
    chosen = rng.sample(current, min(count, len(current)))
    chosen += rng.sample([c for c in reachable(world) if c not in chosen], count - len(chosen))
    for c in contact_rows(world):
        if c["relationship"] == "roommate" and c not in chosen:
            c["relationship"] = "friend"
    for c in chosen:
        c["relationship"] = "roommate"
    return sorted(chosen, key=lambda c: c["id"])


def roommate_emails(c: OracleClient) -> list[str]:
    token = c.login("contacts")
    return [x["email"] for x in c.pages("contacts", "list_contacts", access_token=token, relationship="roommate")]


def priced_lines(text: str) -> list[tuple[str, float, str]]:
    """(label, amount, remark) of each '- label: $12.34 remark' line of a note (people, groceries...)."""
    return [(m[1], float(m[2]), m[3].strip()) for line in text.splitlines() if (m := LINE.match(line.strip()))]


def new_calendar_title(world: World, rng: random.Random, options: list[str]) -> str:
    taken = {e["title"] for e in events(world)}
    return rng.choice([t for t in options if t not in taken])


def plant_latest_order(world: World, rng: random.Random, items: list[Record], quantities: list[int]) -> Record:
    """An order placed a few hours ago, after every other order: 'my most recent order'."""
    placed = world.now - timedelta(hours=rng.uniform(1, 5))
    assert all(o["placed_at"] < iso(placed) for o in orders(world))
    cards, addresses = supervisor_names(world)
    order = make_order(
        items,
        quantities,
        status="processing",
        placed_at=iso(placed),
        delivered_at=None,
        card_id=rng.choice(sorted(cards)),
        address_id=rng.choice(sorted(addresses)),
    )
    return plant(world, "shop", "orders", order)


def request_changes(world: World, payers: list[str], amount: float, note: str) -> list[Expect]:
    me = my_email(world)
    return [
        added("wallet", "requests", requester=me, payer=p, amount=amount, note=note, status="pending") for p in payers
    ]


# --- scenarios ---------------------------------------------------------------------------------


DEBT_NOTES = ["Dinner split", "Cabin weekend costs", "Concert tickets split", "Ski trip costs", "Road trip expenses"]


def wallet_pay_from_note(world: World, rng: random.Random) -> TaskInstance:
    """Pay what a note says I owe, looking up everyone's email in contacts; one line is already paid."""
    title = free_title(world, rng, DEBT_NOTES)
    people = rng.sample(reachable(world), rng.randint(3, 4))
    paid_already = people.pop()
    owe = {p["email"]: cents(rng, 8, 60) for p in people}
    lines = [f"- {full_name(p)}: ${owe[p['email']]:.2f}" for p in people]
    lines.insert(rng.randint(0, len(lines)), f"- {full_name(paid_already)}: ${cents(rng, 8, 60):.2f} (paid back)")
    plant_note(world, title, "What I owe:\n" + "\n".join(lines), ["money"], days=rng.uniform(1, 4))
    me = my_email(world)

    def oracle(c: OracleClient) -> None:
        ntoken = c.login("notes")
        text = read_note(c, ntoken, title)
        ctoken = c.login("contacts")
        wtoken = c.login("wallet")
        for name, amount, remark in priced_lines(text):
            if "paid" in remark:
                continue
            email = find_contact(c, ctoken, name)["email"]
            c.call("wallet", "send_money", access_token=wtoken, receiver_email=email, amount=amount, note=title)

    ask = rng.choice(
        [
            "My note '{title}' lists what I owe people. Pay each of them what I still owe on wallet, with the note "
            "'{title}'. Their emails are in my contacts.",
            "Settle my debts from the note '{title}': send everyone listed there the amount I owe them on wallet "
            "(skip anyone I've already paid back), noting '{title}' on each payment.",
            "Go through my '{title}' note and pay back on wallet everyone I haven't paid yet. Use '{title}' as the "
            "note; you'll find their email addresses in my contacts.",
        ]
    )
    return TaskInstance(
        ask.format(title=title),
        oracle,
        [added("wallet", "transactions", sender=me, receiver=e, amount=a, note=title) for e, a in owe.items()]
        + [updated("wallet", "account", 1, balance=round(balance(world) - sum(owe.values()), 2))],
    )


GROCERY_NOTES = ["May groceries", "Groceries this week", "Big grocery run", "Costco trip", "Farmers market haul"]


def notes_roommates_groceries(world: World, rng: random.Random) -> TaskInstance:
    """WORLD.md's example: split a grocery bill from a note with the roommates, charge them, email the breakdown."""
    roommates = make_roommates(world, rng, rng.randint(2, 3))
    heads = len(roommates) + 1
    title = free_title(world, rng, GROCERY_NOTES)
    items = rng.sample(GROCERIES, rng.randint(5, 7))
    prices = [rng.randint(150, 1600) for _ in items]  # in cents
    prices[-1] += -sum(prices) % heads  # a total that splits into whole cents
    total = sum(prices) / 100
    share = round(total / heads, 2)
    body = f"Paid by me at the supermarket on {day_label(days_ago(world, 3))}:\n" + "\n".join(
        f"- {item}: ${p / 100:.2f}" for item, p in zip(items, prices, strict=True)
    )
    plant_note(world, title, body, ["shopping"], days=rng.uniform(1, 3))
    subject = rng.choice(["{title}: your share", "Splitting: {title}", "What you owe ({title})"]).format(title=title)
    emails = [r["email"] for r in roommates]

    def oracle(c: OracleClient) -> None:
        ntoken = c.login("notes")
        bill = round(sum(amount for _, amount, _ in priced_lines(read_note(c, ntoken, title))), 2)
        mates = roommate_emails(c)
        each = round(bill / (len(mates) + 1), 2)
        wtoken = c.login("wallet")
        for email in mates:
            c.call("wallet", "request_money", access_token=wtoken, payer_email=email, amount=each, note=title)
        mtoken = c.login("mail")
        text = f"The groceries came to ${bill:.2f} in total, split {len(mates) + 1} ways: ${each:.2f} each."
        c.call("mail", "send_email", access_token=mtoken, to=mates, subject=subject, body=text)

    ask = rng.choice(
        [
            "I paid for the groceries in my note '{title}'. Split the total evenly between me and my roommates "
            "(the contacts marked as roommates): request each roommate's share on wallet with the note '{title}', "
            "then send one email to all of them with the subject '{subject}' giving the total and the share each.",
            "Charge my roommates for the shopping in my '{title}' note. Everyone, me included, pays an equal part of "
            "the total: send each roommate a wallet request for their part (note: '{title}') and email them all "
            "together, subject '{subject}', with the total and what each person owes.",
        ]
    )
    return TaskInstance(
        ask.format(title=title, subject=subject),
        oracle,
        [
            *request_changes(world, emails, share, title),
            added(
                "mail",
                "emails",
                folder="sent",
                to=same_items(emails),
                subject=subject,
                body=all_of(mentions_amount(total), mentions_amount(share)),
            ),
        ],
    )


GATHERINGS = ["Housewarming party", "Birthday dinner", "Board game night", "Book swap", "Potluck supper"]
CITIES = ["Springfield", "Riverton", "Lakewood", "Fairview", "Milford", "Ashland"]


def mail_event_address(world: World, rng: random.Random) -> TaskInstance:
    """Email the guests of an event this weekend the address written in a note."""
    title = new_calendar_title(world, rng, GATHERINGS)
    day = midnight(world, rng.choice([4, 5, 6]))  # Friday, Saturday or Sunday of this week
    start = day + timedelta(hours=rng.randint(17, 19))
    guests = rng.sample(people_emails(world), rng.randint(3, 4))
    plant(world, "calendar", "events", new_event(world, title, start, 180, attendees=guests))
    street = f"{rng.randint(2, 480)} {rng.choice(STREETS)} {rng.choice(STREET_KINDS)}"
    city = rng.choice(CITIES)
    note_title = free_title(world, rng, ["New place", "Our new flat", "Venue", "Where we live now"])
    body = f"Address: {street}, {city}\nBuzzer: {rng.randint(1, 40)}\nParking on the street after 6pm is free."
    plant_note(world, note_title, body, ["home"], days=rng.uniform(3, 20))
    subject = f"{title}: the address"
    when = day_label(iso(start))

    def oracle(c: OracleClient) -> None:
        ctoken = c.login("calendar")
        found = find_event(c, ctoken, title, iso(start)[:10])
        invited = c.call("calendar", "show_event", access_token=ctoken, event_id=found["event_id"])["attendees"]
        ntoken = c.login("notes")
        address = next(
            line.removeprefix("Address: ")
            for line in read_note(c, ntoken, note_title).splitlines()
            if line.startswith("Address:")
        )
        mtoken = c.login("mail")
        text = f"Looking forward to seeing you! The address is {address}."
        c.call("mail", "send_email", access_token=mtoken, to=invited, subject=subject, body=text)

    ask = rng.choice(
        [
            "Email everyone I invited to my '{title}' on {when} the address from my note '{note}'. Send one email to "
            "all of them with the subject '{subject}'.",
            "The guests of my '{title}' ({when}) need the address. It's in my note '{note}'. Write them a single "
            "email, everyone in 'to', subject '{subject}', that gives it.",
        ]
    )
    return TaskInstance(
        ask.format(title=title, when=when, note=note_title, subject=subject),
        oracle,
        [
            added(
                "mail",
                "emails",
                folder="sent",
                to=same_items(guests),
                subject=subject,
                body=all_of(contains(street), contains(city)),
            )
        ],
    )


IOU_NOTES = ["Who owes me", "IOUs", "Money I'm owed", "Lent money"]
IOU_FOR = ["concert ticket", "pizza", "taxi home", "birthday gift", "cinema", "train tickets"]


def wallet_request_note_contacts(world: World, rng: random.Random) -> TaskInstance:
    """Request what a note says people owe me, but only from those in my contacts."""
    title = free_title(world, rng, IOU_NOTES)
    known = rng.sample(reachable(world), rng.randint(2, 3))
    strangers = []
    for _ in range(rng.randint(1, 2)):
        first, last, _email = new_person(world, rng)
        if f"{first} {last}" not in strangers:
            strangers.append(f"{first} {last}")
    owed = {c["email"]: cents(rng, 6, 70) for c in known}
    lines = [f"- {full_name(c)}: ${owed[c['email']]:.2f} ({rng.choice(IOU_FOR)})" for c in known]
    lines += [f"- {name}: ${cents(rng, 6, 70):.2f} ({rng.choice(IOU_FOR)})" for name in strangers]
    rng.shuffle(lines)
    plant_note(world, title, "\n".join(lines), ["money"], days=rng.uniform(1, 10))

    def oracle(c: OracleClient) -> None:
        ntoken = c.login("notes")
        listed = priced_lines(read_note(c, ntoken, title))
        ctoken = c.login("contacts")
        wtoken = c.login("wallet")
        for name, amount, _ in listed:
            hits = c.call("contacts", "search_contacts", access_token=ctoken, query=name, page_limit=20)
            match = [h for h in hits if f"{h['first_name']} {h['last_name']}" == name]
            if match:
                payer = match[0]["email"]
                c.call("wallet", "request_money", access_token=wtoken, payer_email=payer, amount=amount, note=title)

    ask = rng.choice(
        [
            "Request the money people owe me according to my note '{title}', but only from people who are in my "
            "contacts. Use '{title}' as the note of each wallet request.",
            "My note '{title}' says who owes me what. Send a wallet money request to each of them who is in my "
            "contacts (skip anyone who isn't), for what they owe, with the note '{title}'.",
        ]
    )
    return TaskInstance(
        ask.format(title=title),
        oracle,
        [
            added("wallet", "requests", requester=my_email(world), payer=e, amount=a, note=title, status="pending")
            for e, a in owed.items()
        ],
    )


def wallet_split_shop_order(world: World, rng: random.Random) -> TaskInstance:
    """Split the latest shop order's total with the roommates, as wallet requests."""
    roommates = make_roommates(world, rng, rng.randint(1, 3))
    heads = len(roommates) + 1
    stock = buyable(world)
    while True:
        picked = rng.sample(stock, rng.randint(1, 3))
        quantities = [rng.choice([1, 1, 2]) for _ in picked]
        order = make_order(
            picked, quantities, status="processing", placed_at="", delivered_at=None, card_id=1, address_id=1
        )
        if round(order["total"] * 100) % heads == 0 and order["total"] >= 20:
            break
    order = plant_latest_order(world, rng, picked, quantities)
    share = round(order["total"] / heads, 2)
    note = rng.choice(["shop order", "house supplies", "our shop order"])

    def oracle(c: OracleClient) -> None:
        stoken = c.login("shop")
        latest = c.call("shop", "list_orders", access_token=stoken, page_limit=1)[0]
        mates = roommate_emails(c)
        each = round(latest["total"] / (len(mates) + 1), 2)
        wtoken = c.login("wallet")
        for email in mates:
            c.call("wallet", "request_money", access_token=wtoken, payer_email=email, amount=each, note=note)

    who = "my roommate" if heads == 2 else "my roommates"
    ask = rng.choice(
        [
            "Split the total of my most recent shop order (the one with {item}) evenly between me and {who} (the "
            "contacts marked as roommates), and send a wallet request for the share to each roommate, with the note "
            "'{note}'.",
            "My latest shop order, with {item} in it, was for the whole flat. Charge {who} their equal part of its "
            "total (I pay my part too) with wallet money requests, note '{note}'. Roommates are marked as such in my "
            "contacts.",
        ]
    )
    return TaskInstance(
        ask.format(who=who, note=note, item=the(picked[0]["name"])),
        oracle,
        request_changes(world, [r["email"] for r in roommates], share, note),
    )


ASKS = [  # subject, the request (total and share); the share is the email's last amount
    ("Concert tickets", "The two tickets came to {total}, so your half is {share}.", 2),
    ("Cabin deposit", "The deposit was {total} for the four of us, so your part is {share}.", 4),
    ("Gift for the Parkers", "The gift was {total} split three ways, which makes {share} each.", 3),
    ("Dinner on Saturday", "The bill was {total} with the tip; your share of it comes to {share}.", 2),
    ("Ferry tickets", "I paid {total} for the five of us, so yours is {share}.", 5),
]


def mail_pay_asked(world: World, rng: random.Random) -> TaskInstance:
    """Someone emailed asking for their share of something: pay them that (not the total) on wallet."""
    options = [a for a in ASKS if all(e["subject"] != a[0] for e in world.state["mail"]["emails"].values())]
    subject, text, heads = rng.choice(options)
    share = rng.randint(800, 6000) / 100
    total = round(share * heads, 2)
    person = rng.choice(reachable(world))
    name = full_name(person)
    request = text.format(total=f"${total:.2f}", share=f"${share:.2f}")
    plant_email(
        world,
        sender=person["email"],
        sender_name=name,
        subject=subject,
        body=f"Hi {world.state['supervisor']['profile']['1']['first_name']},\n\n{request} Could you send it to me "
        f"on wallet when you get a chance?\n\nThanks!\n{person['first_name']}",
        date=days_ago(world, rng.uniform(0.3, 5)),
    )
    assert subject_is_unique(world, subject)

    def oracle(c: OracleClient) -> None:
        mtoken = c.login("mail")
        found = find_email(c, mtoken, subject, sender=name)
        body = c.call("mail", "show_email", access_token=mtoken, email_id=found["email_id"])["body"]
        wtoken = c.login("wallet")
        amount = amounts_in(body)[-1]
        c.call("wallet", "send_money", access_token=wtoken, receiver_email=found["sender"], amount=amount, note=subject)

    ask = rng.choice(
        [
            "{name} emailed me about '{subject}'. Pay them on wallet what they asked me for, with the note "
            "'{subject}'.",
            "Read {name}'s email '{subject}' and send them my share on wallet. Put '{subject}' as the note.",
            "I still owe {name} for the thing in their email '{subject}'. Send the amount they asked for through "
            "wallet (note: '{subject}').",
        ]
    )
    me = my_email(world)
    return TaskInstance(
        ask.format(name=name, subject=subject),
        oracle,
        [
            added("wallet", "transactions", sender=me, receiver=person["email"], amount=share, note=subject),
            updated("wallet", "account", 1, balance=round(balance(world) - share, 2)),
        ],
    )


THANKS = "Thank you!"


def wallet_thank_senders(world: World, rng: random.Random) -> TaskInstance:
    """One thank-you email to each person who paid me since a day (however many times they paid)."""
    me = my_email(world)

    def senders(since: str) -> set[str]:
        return {t["sender"] for t in transactions(world) if t["receiver"] == me and t["created_at"] >= since}

    days = rng.choice([d for d in range(4, 15) if len(senders(iso(midnight(world, -d)))) <= 3] or [3])
    start = midnight(world, -days)
    bound = iso(start)
    for t in transactions(world):  # nobody paid me around midnight of that day, so 'since' reads one way
        if abs(datetime.fromisoformat(t["created_at"]) - start) < timedelta(hours=3):
            t["created_at"] = iso(start - timedelta(hours=4))
    others = [p for p in world_people(world) if p not in senders(bound)]
    twice, once, late = rng.sample(others, 3)
    for who in [twice, twice] + ([once] if len(senders(bound)) < 2 else []):  # paying twice still gets one email
        paid = days_ago(world, rng.uniform(0.3, days - 0.5))
        plant_payment(world, who, me, cents(rng, 5, 80), rng.choice(["pizza", "gas", "lunch"]), paid)
    # paid me the evening before: no email
    plant_payment(world, late, me, cents(rng, 5, 80), "dinner", iso(start - timedelta(hours=rng.uniform(4, 10))))
    thanked = sorted(senders(bound))

    def oracle(c: OracleClient) -> None:
        wtoken = c.login("wallet")
        got = c.pages("wallet", "list_transactions", access_token=wtoken, direction="received", after=bound)
        who = sorted({t["sender"] for t in got})
        mtoken = c.login("mail")
        for email in who:
            text = "Thanks a lot for the payment on wallet, got it!"
            c.call("mail", "send_email", access_token=mtoken, to=[email], subject=THANKS, body=text)

    ask = rng.choice(
        [
            "Send a short thank-you email to everyone who has sent me money on wallet since {when}: one email per "
            "person, even if they paid me more than once, with the subject '{subject}'.",
            "Thank the people who paid me through wallet from {when} until now. Each of them gets one email (subject "
            "'{subject}', a line of thanks in the body), no matter how many payments they made.",
        ]
    )
    return TaskInstance(
        ask.format(when=day_label(bound), subject=THANKS),
        oracle,
        [added("mail", "emails", folder="sent", to=[p], subject=THANKS) for p in thanked],
    )


SHOPPING_NOTES = ["Things to buy", "Shopping for the new flat", "Camping gear to get", "Stuff to order"]


def notes_shopping_to_cart(world: World, rng: random.Random) -> TaskInstance:
    """Put the items of a shopping note in the cart, in the note's quantities; skip those already bought."""
    title = free_title(world, rng, SHOPPING_NOTES)
    names: dict[str, list[Record]] = {}
    for p in buyable(world):
        names.setdefault(p["name"], []).append(p)
    unique = [ps[0] for ps in names.values() if len(ps) == 1]
    wanted = rng.sample(unique, rng.randint(3, 4))
    bought = wanted.pop()
    quantities = {p["id"]: rng.choice([1, 1, 2, 3]) for p in wanted}
    lines = [f"- {quantities[p['id']]} x {p['name']}" for p in wanted]
    lines.insert(rng.randint(0, len(lines)), f"- 1 x {bought['name']} (already bought)")
    plant_note(world, title, "\n".join(lines), ["shopping"], days=rng.uniform(1, 8))

    def oracle(c: OracleClient) -> None:
        ntoken = c.login("notes")
        text = read_note(c, ntoken, title)
        stoken = c.login("shop")
        for line in text.splitlines():
            m = re.match(r"- (\d+) x (.+)$", line)
            if m and "(already bought)" not in line:
                found = find_product(c, stoken, m[2])
                c.call("shop", "add_to_cart", access_token=stoken, product_id=found["product_id"], quantity=int(m[1]))

    ask = rng.choice(
        [
            "Add everything on my note '{title}' to my shop cart, in the quantities the note gives. Skip anything "
            "marked as already bought.",
            "Put the items from my '{title}' note in my shopping cart (how many of each is in the note); leave out "
            "what I've already bought.",
        ]
    )
    return TaskInstance(
        ask.format(title=title),
        oracle,
        [added("shop", "cart_items", product_id=pid, quantity=q) for pid, q in quantities.items()],
    )


DETAILS = {"phone": "phone number", "email": "email address", "address": "street address"}


def contacts_details_note(world: World, rng: random.Random) -> TaskInstance:
    """Copy two fields of a contact into a new note."""
    person = rng.choice([c for c in reachable(world) if c["phone"] and c["address"]])
    name = full_name(person)
    fields = sorted(rng.sample(sorted(DETAILS), 2))
    title = rng.choice(["{name}", "{first}'s details", "Contact card: {name}"]).format(
        name=name, first=person["first_name"]
    )
    checks = {
        "phone": has_phone(person["phone"]),
        "email": contains(person["email"]),
        "address": contains(person["address"]),
    }

    def oracle(c: OracleClient) -> None:
        ctoken = c.login("contacts")
        hit = find_contact(c, ctoken, name)
        detail = c.call("contacts", "show_contact", access_token=ctoken, contact_id=hit["contact_id"])
        ntoken = c.login("notes")
        text = "\n".join(f"{DETAILS[f].capitalize()}: {detail[f]}" for f in fields)
        c.call("notes", "create_note", access_token=ntoken, title=title, body=text)

    what = " and ".join(DETAILS[f] for f in fields)
    ask = rng.choice(
        [
            "Create a note titled '{title}' with {name}'s {what} from my contacts.",
            "I want {name}'s {what} handy in my notes. Look them up in my contacts and save them in a new note "
            "called '{title}'.",
        ]
    )
    return TaskInstance(
        ask.format(title=title, name=name, what=what),
        oracle,
        [added("notes", "notes", title=title, body=all_of(*(checks[f] for f in fields)))],
    )


OUTINGS = ["Pizza night", "Karaoke night", "Escape room", "Bowling night", "Cooking class", "Go-kart racing"]


def wallet_charge_event_guests(world: World, rng: random.Random) -> TaskInstance:
    """Everyone invited to a past outing owes a fixed amount: request it from each."""
    title = new_calendar_title(world, rng, OUTINGS)
    start = midnight(world, -rng.randint(2, 6)) + timedelta(hours=rng.randint(18, 20))
    guests = rng.sample(people_emails(world), rng.randint(2, 4))
    made = iso(start - timedelta(days=7))
    plant(
        world,
        "calendar",
        "events",
        new_event(world, title, start, 150, attendees=guests, created_at=made, updated_at=made),
    )
    amount = rng.choice([12, 15, 18, 22.5, 25, 31.75, 40])

    def oracle(c: OracleClient) -> None:
        ctoken = c.login("calendar")
        found = find_event(c, ctoken, title, iso(start)[:10])
        invited = c.call("calendar", "show_event", access_token=ctoken, event_id=found["event_id"])["attendees"]
        wtoken = c.login("wallet")
        for email in invited:
            c.call("wallet", "request_money", access_token=wtoken, payer_email=email, amount=amount, note=title)

    ask = rng.choice(
        [
            "Everyone I invited to '{title}' on {when} owes me {amount} for their share. Send each of them a wallet "
            "money request for it, with the note '{title}'.",
            "I paid for '{title}' ({when}) up front. Request {amount} on wallet from each person on that event's guest "
            "list; note: '{title}'.",
        ]
    )
    return TaskInstance(
        ask.format(title=title, when=day_label(iso(start)), amount=money(amount)),
        oracle,
        request_changes(world, guests, float(amount), title),
    )


def wallet_top_payee_name(world: World, rng: random.Random) -> TaskInstance:
    """Who I sent the most money to in a month, by full name from contacts."""
    me = my_email(world)
    month = rng.choice(sorted(MONTHS))
    low, high = month_bounds(world, month)

    def sent_totals() -> dict[str, float]:
        totals: dict[str, float] = {}
        for t in transactions(world):
            if t["sender"] == me and low <= t["created_at"] < high:
                totals[t["receiver"]] = round(totals.get(t["receiver"], 0) + t["amount"], 2)
        return totals

    target = rng.choice(reachable(world))
    totals = sent_totals()
    best_other = max((v for k, v in totals.items() if k != target["email"]), default=0.0)
    need = round(max(best_other - totals.get(target["email"], 0.0), 0) + cents(rng, 10, 60), 2)
    start = date.fromisoformat(low[:10])
    parts = [round(need / 2, 2), round(need - round(need / 2, 2), 2)] if need > 60 else [need]
    for part in parts:
        day = start + timedelta(days=rng.randint(1, 26))
        plant_payment(
            world, me, target["email"], part, rng.choice(["rent", "dinner", "concert tickets"]), at(world, day, rng)
        )
    # a bigger sum someone sent me that month, which is not money I sent
    other = rng.choice([p for p in world_people(world) if p != target["email"]])
    plant_payment(
        world, other, me, round(max(sent_totals().values()) + 30, 2), "rent", at(world, start + timedelta(days=10), rng)
    )
    name = full_name(target)

    def oracle(c: OracleClient) -> str:
        wtoken = c.login("wallet")
        sent = c.pages("wallet", "list_transactions", access_token=wtoken, direction="sent", after=low)
        per: dict[str, float] = {}
        for t in sent:
            if t["created_at"] < high:
                per[t["receiver"]] = per.get(t["receiver"], 0) + t["amount"]
        top = max(per, key=per.__getitem__)
        ctoken = c.login("contacts")
        hit = next(
            h for h in c.pages("contacts", "search_contacts", access_token=ctoken, query=top) if h["email"] == top
        )
        return f"{hit['first_name']} {hit['last_name']}"

    ask = rng.choice(
        [
            "Who did I send the most money to on wallet in {month}, adding up all my payments to each person? Give "
            "their full name.",
            "In {month}, which person received the largest total from me through wallet? I want their full name as "
            "it is in my contacts.",
            "Add up what I paid each person on wallet during {month} {year}. Who got the most? Tell me their full "
            "name.",
        ]
    )
    return TaskInstance(ask.format(month=MONTHS[month], year=world.now.year), oracle, answer=name)


def supervisor_last_order_card(world: World, rng: random.Random) -> TaskInstance:
    """Which card paid for the latest shop order (shop gives the card's id, the supervisor app its name)."""
    picked = rng.sample(buyable(world), rng.randint(1, 2))
    order = plant_latest_order(world, rng, picked, [1] * len(picked))
    cards, _ = supervisor_names(world)
    card = cards[order["payment_card_id"]]

    def oracle(c: OracleClient) -> str:
        stoken = c.login("shop")
        latest = c.call("shop", "list_orders", access_token=stoken, page_limit=1)[0]
        detail = c.call("shop", "show_order", access_token=stoken, order_id=latest["order_id"])
        listed = c.call("supervisor", "show_payment_cards")
        return str(next(x["card_name"] for x in listed if x["id"] == detail["payment_card_id"]))

    ask = rng.choice(
        [
            "Which of my cards did I pay my most recent shop order with (the one with {item})? Give the card's name.",
            "I just ordered {item} on the shop. Which of my payment cards was that order charged to? Tell me the "
            "card's name.",
            "What's the name of the card I used for my latest shop order, the one with {item} in it?",
        ]
    )
    return TaskInstance(ask.format(item=the(picked[0]["name"])), oracle, answer=named(card))


SCENARIOS = [
    Scenario("contacts_details_note", 1, ("contacts", "notes"), "train", contacts_details_note),
    Scenario("supervisor_last_order_card", 1, ("shop", "supervisor"), "test_normal", supervisor_last_order_card),
    Scenario("mail_event_address", 2, ("calendar", "notes", "mail"), "train", mail_event_address),
    Scenario("mail_pay_asked", 2, ("mail", "wallet"), "train", mail_pay_asked),
    Scenario("notes_shopping_to_cart", 2, ("notes", "shop"), "train", notes_shopping_to_cart),
    Scenario("wallet_top_payee_name", 2, ("wallet", "contacts"), "train", wallet_top_payee_name),
    Scenario("wallet_charge_event_guests", 2, ("calendar", "wallet"), "dev", wallet_charge_event_guests),
    Scenario("wallet_thank_senders", 2, ("wallet", "mail"), "test_normal", wallet_thank_senders),
    Scenario(
        "notes_roommates_groceries", 3, ("notes", "contacts", "wallet", "mail"), "train", notes_roommates_groceries
    ),
    Scenario("wallet_request_note_contacts", 3, ("notes", "contacts", "wallet"), "dev", wallet_request_note_contacts),
    Scenario("wallet_pay_from_note", 3, ("notes", "contacts", "wallet"), "test_normal", wallet_pay_from_note),
    Scenario("wallet_split_shop_order", 3, ("shop", "contacts", "wallet"), "test_normal", wallet_split_shop_order),
]
