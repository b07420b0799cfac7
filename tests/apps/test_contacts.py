from datetime import date

import pytest

from agentloop.apps.base import ApiError
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.builtin.apps.contacts import next_birthday
from agentloop.apps.builtin.people import RELATIONSHIPS, make_world_data
from agentloop.apps.evaluation import diff_states


@pytest.fixture
def world():
    return BUILTIN.new_world(11, ["contacts"])


@pytest.fixture
def call(world):
    profile = world.state["supervisor"]["profile"]["1"]
    password = world.state["supervisor"]["accounts"]["contacts"]["password"]
    token = world.call("contacts", "login", {"username": profile["email"], "password": password})["access_token"]

    def call(api, **args):
        return world.call("contacts", api, {"access_token": token, **args})

    return call


def rows(world):
    return world.state["contacts"]["contacts"]


def everything(call, api, **args):
    out, page = [], 0
    while batch := call(api, page_index=page, page_limit=7, **args):
        out.extend(batch)
        page += 1
    return out


def test_address_book_holds_most_people_with_their_details():
    data = make_world_data(11)
    book = BUILTIN.new_world(11, ["contacts"]).state["contacts"]["contacts"]
    by_email = {c["email"]: c for c in book.values()}
    assert 0.75 * len(data.people) <= len(book) < len(data.people)
    for person in data.people:
        if person.email in by_email:
            c = by_email[person.email]
            assert (c["first_name"], c["phone"], c["relationship"]) == (
                person.first_name,
                person.phone,
                person.relationship,
            )


def test_login_is_required(world):
    with pytest.raises(ApiError) as exc:
        world.call("contacts", "list_contacts", {"access_token": "stolen"})
    assert exc.value.status == 401


def test_pages_do_not_overlap_cover_everyone_and_end(world, call):
    seen = everything(call, "list_contacts")
    ids = [c["contact_id"] for c in seen]
    assert len(ids) == len(set(ids)) == len(rows(world))
    names = [(c["first_name"].casefold(), c["last_name"].casefold()) for c in seen]
    assert names == sorted(names)
    assert call("list_contacts", page_index=99) == []


def test_relationship_filter_and_counts_agree(call):
    counts = {r["relationship"]: r["contact_count"] for r in everything(call, "list_relationships")}
    assert set(counts) == set(RELATIONSHIPS)
    for relationship, n in counts.items():
        listed = everything(call, "list_contacts", relationship=relationship)
        assert len(listed) == n and all(c["relationship"] == relationship for c in listed)


def test_search_by_partial_name_phone_and_city(world, call):
    target = next(iter(rows(world).values()))
    hits = call("search_contacts", query=f"{target['first_name'][:3]} {target['last_name']}", page_limit=20)
    assert target["id"] in {h["contact_id"] for h in hits}
    phone = target["phone"]
    hits = call("search_contacts", query=f"({phone[:3]}) {phone[3:6]}-{phone[6:]}")
    assert [h["contact_id"] for h in hits] == [target["id"]]
    hits = everything(call, "search_contacts", query=target["city"])
    assert target["id"] in {h["contact_id"] for h in hits}
    other = next(r for r in RELATIONSHIPS if r != target["relationship"])
    assert call("search_contacts", query=target["email"], relationship=other) == []


def test_empty_search_is_an_error(call):
    with pytest.raises(ApiError) as exc:
        call("search_contacts", query="  ")
    assert exc.value.status == 422 and "query" in exc.value.message


def test_show_unknown_contact_is_404(call):
    with pytest.raises(ApiError) as exc:
        call("show_contact", contact_id=9999)
    assert exc.value.status == 404 and "9999" in exc.value.message


def test_add_contact_normalises_phone_and_email(world, call):
    new_id = call(
        "add_contact",
        first_name="Wren",
        last_name="Okafor",
        email=" Wren.Okafor@Example.com ",
        phone="+1 (555) 010-4477",
        relationship="friend",
    )["contact_id"]
    shown = call("show_contact", contact_id=new_id)
    assert shown["email"] == "wren.okafor@example.com" and shown["phone"] == "5550104477"
    assert shown["birthday"] is None and shown["notes"] == "" and shown["favorite"] is False
    assert shown["created_at"] == "2025-06-02T09:00:00Z"


def test_add_contact_rejects_duplicates_and_bad_values(world, call):
    existing = next(iter(rows(world).values()))
    with pytest.raises(ApiError) as exc:
        call("add_contact", first_name="Copy", email=existing["email"].upper())
    assert exc.value.status == 409 and f"contact_id {existing['id']}" in exc.value.message
    with pytest.raises(ApiError) as exc:
        call("add_contact", first_name="Ann", birthday="17/04/1990")
    assert exc.value.status == 422 and "YYYY-MM-DD" in exc.value.message
    with pytest.raises(ApiError) as exc:
        call("add_contact", first_name="Ann", phone="call me")
    assert exc.value.status == 422 and "phone" in exc.value.message
    with pytest.raises(ApiError) as exc:
        call("add_contact", first_name="Ann", relationship="enemy")
    assert exc.value.status == 422
    with pytest.raises(ApiError) as exc:
        call("add_contact", first_name=" ")
    assert exc.value.status == 422 and "first name" in exc.value.message


def test_update_changes_only_the_given_fields(world, call):
    before = world.copy_state()
    contact_id = next(c for c in rows(world).values() if c["company"])["id"]
    call("update_contact", contact_id=contact_id, city="Boulder", company="")
    changes = diff_states(before, world.state)
    assert len(changes) == 1 and changes[0].fields == {"city", "company", "updated_at"}
    assert rows(world)[str(contact_id)]["company"] is None
    with pytest.raises(ApiError) as exc:
        call("update_contact", contact_id=contact_id)
    assert exc.value.status == 422 and "Nothing to update" in exc.value.message


def test_update_cannot_steal_another_contacts_email(world, call):
    a, b = list(rows(world).values())[:2]
    with pytest.raises(ApiError) as exc:
        call("update_contact", contact_id=a["id"], email=b["email"])
    assert exc.value.status == 409
    call("update_contact", contact_id=a["id"], email=a["email"])  # its own address is fine


def test_delete_contact(world, call):
    contact_id = next(iter(rows(world).values()))["id"]
    assert "deleted" in call("delete_contact", contact_id=contact_id)
    with pytest.raises(ApiError) as exc:
        call("delete_contact", contact_id=contact_id)
    assert exc.value.status == 404


def test_upcoming_birthdays_window_order_and_age(world, call):
    first = next(c for c in rows(world).values() if c["birthday"])
    first["birthday"] = "1995-06-02"  # today: turning 30
    later = next(c for c in rows(world).values() if c["birthday"] and c is not first)
    later["birthday"] = "1980-06-09"  # in a week: turning 45
    soon = everything(call, "upcoming_birthdays", days=7)
    by_id = {s["contact_id"]: s for s in soon}
    assert (by_id[first["id"]]["days_until"], by_id[first["id"]]["turning"]) == (0, 30)
    assert (by_id[later["id"]]["days_until"], by_id[later["id"]]["turning"]) == (7, 45)
    assert by_id[later["id"]]["next_birthday"] == "2025-06-09"
    assert [s["days_until"] for s in soon] == sorted(s["days_until"] for s in soon)
    assert all(s["days_until"] <= 7 for s in soon)
    assert later["id"] not in {s["contact_id"] for s in everything(call, "upcoming_birthdays", days=6)}


def test_next_birthday_wraps_the_year_and_handles_leap_days():
    assert next_birthday(date(1990, 3, 1), date(2025, 6, 2)) == date(2026, 3, 1)
    assert next_birthday(date(1990, 6, 2), date(2025, 6, 2)) == date(2025, 6, 2)
    assert next_birthday(date(1992, 2, 29), date(2025, 1, 10)) == date(2025, 2, 28)
    assert next_birthday(date(1992, 2, 29), date(2027, 12, 1)) == date(2028, 2, 29)
