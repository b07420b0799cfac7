"""The people of a built-in world: the supervisor (the user the agent works for) and everyone they know.

Generated deterministically from the world seed; every app builds its data about these people.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from faker import Faker

NOW = datetime(2025, 6, 2, 9, 0, tzinfo=UTC)  # every built-in world's frozen "now" (a Monday)

OLDEST_BIRTHDAY = date(NOW.year - 70, NOW.month, NOW.day)
YOUNGEST_BIRTHDAY = date(NOW.year - 19, NOW.month, NOW.day)
RELATIONSHIPS = ("friend", "coworker", "family", "roommate", "neighbor", "manager", "classmate")


@dataclass(frozen=True)
class Person:
    id: int
    first_name: str
    last_name: str
    email: str
    phone: str
    birthday: str  # YYYY-MM-DD
    relationship: str  # to the supervisor; "self" for the supervisor
    city: str

    @property
    def name(self) -> str:
        return f"{self.first_name} {self.last_name}"

    def public(self) -> dict[str, Any]:
        return {
            "first_name": self.first_name,
            "last_name": self.last_name,
            "email": self.email,
            "phone": self.phone,
        }


@dataclass
class WorldData:
    """Shared facts every app builder draws from."""

    seed: int
    now: datetime
    supervisor: Person
    people: list[Person]
    addresses: list[dict[str, Any]] = field(default_factory=list)
    cards: list[dict[str, Any]] = field(default_factory=list)

    def rng(self, purpose: str) -> random.Random:
        """A random stream per app/purpose, so adding an app never changes another app's data."""
        return random.Random(zlib.crc32(f"{self.seed}:{purpose}".encode()))

    def faker(self, purpose: str) -> Faker:
        return seeded_faker(zlib.crc32(f"{self.seed}:{purpose}".encode()))

    def by_email(self, email: str) -> Person | None:
        if email == self.supervisor.email:
            return self.supervisor
        return next((p for p in self.people if p.email == email), None)

    def ago(self, days: float = 0, hours: float = 0) -> str:
        return iso(self.now - timedelta(days=days, hours=hours))


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def seeded_faker(seed: int) -> Faker:
    """A Faker of its own (about 1 ms): a shared instance re-seeded by two threads at once would mix streams."""
    fake = Faker("en_US")
    fake.seed_instance(seed)
    return fake


def make_world_data(seed: int, n_people: int | None = None) -> WorldData:
    fake = seeded_faker(seed)
    rng = random.Random(seed)
    n = n_people or rng.randint(40, 70)
    used_names: set[str] = set()
    people: list[Person] = []
    while len(people) < n + 1:
        first, last = fake.first_name(), fake.last_name()
        if f"{first} {last}" in used_names or first in {p.first_name for p in people[:1]}:
            continue
        used_names.add(f"{first} {last}")
        pid = len(people) + 1
        domain = rng.choice(("gmail.com", "yahoo.com", "outlook.com", "proton.me", "fastmail.com"))
        # between 70 and 19 years before the frozen NOW: Faker's relative "-70y" would count from today
        birthday = fake.date_between_dates(OLDEST_BIRTHDAY, YOUNGEST_BIRTHDAY).isoformat()
        people.append(
            Person(
                id=pid,
                first_name=first,
                last_name=last,
                email=f"{first.lower()}.{last.lower()}@{domain}".replace("'", ""),
                phone=f"{rng.randint(201, 989)}{rng.randint(200, 999)}{rng.randint(1000, 9999)}",
                birthday=birthday,
                relationship="self" if pid == 1 else rng.choice(RELATIONSHIPS),
                city=fake.city(),
            )
        )
    supervisor, others = people[0], people[1:]
    addresses = [
        {
            "id": i + 1,
            "name": label,
            "street_address": fake.street_address(),
            "city": fake.city(),
            "state": fake.state_abbr(),
            "zip_code": fake.zipcode(),
            "country": "United States",
        }
        for i, label in enumerate(("Home", "Work"))
    ]
    cards = [
        {
            "id": i + 1,
            "card_name": label,
            "owner_name": supervisor.name,
            "card_number": str(fake.credit_card_number(card_type="visa16")),
            "expiry_date": f"{rng.randint(1, 12):02d}/{rng.randint(26, 31)}",
            "cvv_number": f"{rng.randint(100, 999)}",
        }
        for i, label in enumerate(("Visa Everyday", "Visa Travel"))
    ]
    return WorldData(seed=seed, now=NOW, supervisor=supervisor, people=others, addresses=addresses, cards=cards)
