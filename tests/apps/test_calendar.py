"""The calendar app: listing and searching events, creating and changing them, and invitations."""

from datetime import datetime
from typing import Any

import pytest

from agentloop.apps.base import ApiError
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.evaluation import StateEvaluator
from agentloop.apps.tasks import OracleClient
from agentloop.apps.world import World


class Calendar:
    """A logged-in calendar session on a fresh world."""

    def __init__(self, seed: int = 11) -> None:
        self.world: World = BUILTIN.new_world(seed, ["calendar"])
        self.me = self.world.state["supervisor"]["profile"]["1"]["email"]
        password = self.world.state["supervisor"]["accounts"]["calendar"]["password"]
        self.token = self.world.call("calendar", "login", {"username": self.me, "password": password})["access_token"]

    def __call__(self, api: str, **args: Any) -> Any:
        return self.world.call("calendar", api, {"access_token": self.token, **args})

    @property
    def events(self) -> list[dict[str, Any]]:
        return sorted(self.world.state["calendar"]["events"].values(), key=lambda e: e["id"])

    def event(self, event_id: int) -> dict[str, Any]:
        event: dict[str, Any] = self.world.state["calendar"]["events"][str(event_id)]
        return event

    def future(self, mine: bool) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if (e["organizer"] == self.me) == mine and e["status"] == "confirmed" and e["start"] > "2025-06-03"
        ]


@pytest.fixture
def cal() -> Calendar:
    return Calendar()


def error(call: Any, *args: Any, **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as exc:
        call(*args, **kwargs)
    return exc.value


def every_page(cal: Calendar, api: str, **args: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for page in range(100):
        batch = cal(api, page_index=page, page_limit=7, **args)
        if not batch:
            return items
        items += batch
    raise AssertionError("the list never ended")


def test_login_is_required(cal: Calendar) -> None:
    err = error(cal.world.call, "calendar", "list_events", {"access_token": "forged"})
    assert err.status == 401 and "calendar.login" in err.message


def test_world_has_a_few_months_of_varied_events(cal: Calendar) -> None:
    titles = [e["title"] for e in cal.events]
    assert 60 <= len(cal.events) <= 150
    assert any(t.endswith("'s birthday") for t in titles) and "Weekly team sync" in titles
    assert min(e["start"] for e in cal.events) < "2025-05-01" < "2025-08-01" < max(e["start"] for e in cal.events)
    assert any(e["my_response"] == "needs_action" for e in cal.events)


def test_list_events_pages_in_start_order_and_hide_cancelled(cal: Calendar) -> None:
    listed = every_page(cal, "list_events")
    ids = [e["event_id"] for e in listed]
    assert len(ids) == len(set(ids)) == sum(e["status"] != "cancelled" for e in cal.events)
    starts = [e["start"] for e in listed]
    assert starts == sorted(starts)
    with_cancelled = every_page(cal, "list_events", include_cancelled=True)
    assert len(with_cancelled) == len(cal.events)


def test_list_events_window_keeps_overlapping_events(cal: Calendar) -> None:
    trip = next(e for e in cal.events if e["title"].startswith("Trip to"))
    day_inside = trip["start"][:10] + "T12:00:00Z"
    inside = cal("list_events", after=day_inside, before=day_inside.replace("12:00", "13:00"), page_limit=20)
    assert trip["id"] in [e["event_id"] for e in inside]  # started before the window, still going
    after_it = cal("list_events", after=trip["end"], page_limit=20)
    assert trip["id"] not in [e["event_id"] for e in after_it]
    assert all(e["end"] > trip["end"] for e in after_it)
    # a plain date and an offset are understood, in UTC
    same = cal("list_events", after="2025-06-10", before="2025-06-11T02:00:00+02:00", page_limit=20)
    assert same == cal("list_events", after="2025-06-10T00:00:00Z", before="2025-06-11T00:00:00Z", page_limit=20)
    err = error(cal, "list_events", after="next week")
    assert err.status == 422 and "ISO 8601" in err.message


def test_person_filter_and_search(cal: Calendar) -> None:
    someone = next(e for e in cal.future(mine=False))["organizer"]
    theirs = every_page(cal, "list_events", person=someone.upper())
    assert theirs and all(
        someone == cal.event(e["event_id"])["organizer"] or someone in cal.event(e["event_id"])["attendees"]
        for e in theirs
    )
    yoga = every_page(cal, "search_events", query="YOGA")
    assert yoga and all("yoga" in (e["title"] + e["location"]).lower() for e in yoga)
    assert cal("search_events", query="no such thing anywhere") == []


def test_create_event_stores_canonical_utc_times(cal: Calendar) -> None:
    made = cal(
        "create_event",
        title="Tennis",
        start="2025-06-12T16:30:00+02:00",
        end="2025-06-12T15:30",
        location="Riverside Courts",
        attendees=["Ann.Lee@Example.com", "ann.lee@example.com"],
    )
    event = cal("show_event", event_id=made["event_id"])
    assert (event["start"], event["end"]) == ("2025-06-12T14:30:00Z", "2025-06-12T15:30:00Z")
    assert event["attendees"] == ["ann.lee@example.com"] and event["organizer"] == cal.me
    day = cal("create_event", title="Festival", start="2025-07-04T10:00:00Z", end="2025-07-06", all_day=True)
    assert cal.event(day["event_id"])["start"] == "2025-07-04T00:00:00Z"


def test_create_event_rejects_bad_input(cal: Calendar) -> None:
    err = error(cal, "create_event", title="x", start="2025-06-12T15:00:00Z", end="2025-06-12T14:00:00Z")
    assert err.status == 422 and "end after it starts" in err.message
    err = error(cal, "create_event", title="x", start="tomorrow 3pm", end="2025-06-12T14:00:00Z")
    assert err.status == 422 and "start" in err.message
    err = error(cal, "create_event", title="x", start="2025-06-12", end="2025-06-13", attendees=["Bob"])
    assert err.status == 422 and "email" in err.message
    err = error(cal, "create_event", title="x", start="2025-06-12", end="2025-06-13", attendees=[cal.me])
    assert err.status == 422 and "organizer" in err.message


def test_update_event_moves_with_the_same_length_and_only_for_the_organizer(cal: Calendar) -> None:
    mine = next(e for e in cal.future(mine=True) if not e["all_day"])
    before = dict(mine)
    moved = cal("update_event", event_id=mine["id"], start=mine["start"][:10] + "T07:00:00Z")
    assert moved["start"].endswith("T07:00:00Z")

    def span(e: dict[str, Any]) -> float:
        return (datetime.fromisoformat(e["end"]) - datetime.fromisoformat(e["start"])).total_seconds()

    assert span(moved) == span(before)
    assert error(cal, "update_event", event_id=mine["id"]).status == 422
    theirs = cal.future(mine=False)[0]
    err = error(cal, "update_event", event_id=theirs["id"], title="Mine now")
    assert err.status == 403 and "respond_to_invitation" in err.message
    assert error(cal, "update_event", event_id=99999, title="x").status == 404


def test_attendees_are_added_once_and_removed_by_email(cal: Calendar) -> None:
    mine = next(e for e in cal.future(mine=True) if e["attendees"])
    result = cal("add_attendees", event_id=mine["id"], emails=["new.person@example.com", mine["attendees"][0]])
    assert result["added"] == ["new.person@example.com"]
    assert error(cal, "add_attendees", event_id=mine["id"], emails=["new.person@example.com"]).status == 409
    cal("remove_attendee", event_id=mine["id"], email="new.person@example.com")
    assert "new.person@example.com" not in cal.event(mine["id"])["attendees"]
    err = error(cal, "remove_attendee", event_id=mine["id"], email="nobody@example.com")
    assert err.status == 404 and mine["attendees"][0] in err.message


def test_cancel_event(cal: Calendar) -> None:
    mine = cal.future(mine=True)[0]
    assert cal("cancel_event", event_id=mine["id"])["status"] == "cancelled"
    assert cal.event(mine["id"])["status"] == "cancelled"
    assert error(cal, "cancel_event", event_id=mine["id"]).status == 409
    assert error(cal, "add_attendees", event_id=mine["id"], emails=["a.b@example.com"]).status == 409
    assert error(cal, "cancel_event", event_id=cal.future(mine=False)[0]["id"]).status == 403


def test_invitations_are_answered_once(cal: Calendar) -> None:
    pending = every_page(cal, "list_invitations")
    assert pending and all(e["my_response"] == "needs_action" and e["organizer"] != cal.me for e in pending)
    answered = every_page(cal, "list_invitations", include_answered=True)
    assert len(answered) > len(pending)
    first = pending[0]["event_id"]
    assert cal("respond_to_invitation", event_id=first, response="declined")["my_response"] == "declined"
    assert first not in [e["event_id"] for e in every_page(cal, "list_invitations")]
    assert error(cal, "respond_to_invitation", event_id=first, response="maybe").status == 422
    own = cal.future(mine=True)[0]
    assert error(cal, "respond_to_invitation", event_id=own["id"], response="accepted").status == 409
    past = next(e for e in cal.events if e["organizer"] != cal.me and e["end"] < "2025-06-01")
    err = error(cal, "respond_to_invitation", event_id=past["id"], response="accepted")
    assert err.status == 409 and "over" in err.message


def test_accepting_every_invitation_is_collateral_damage() -> None:
    task = BUILTIN.task("calendar_accept_from-1")
    world = BUILTIN.task_world(task.id)
    before = world.copy_state()
    client = OracleClient(world)
    token = client.login("calendar")
    for e in list(client.pages("calendar", "list_invitations", access_token=token)):
        client.call(
            "calendar", "respond_to_invitation", access_token=token, event_id=e["event_id"], response="accepted"
        )
    verdict = StateEvaluator(task.evaluator.expectations, volatile=task.evaluator.volatile).evaluate(
        before, world.state, None
    )
    failed = [t.name for t in verdict.tests if not t.passed]
    assert failed == ["no collateral damage"]
