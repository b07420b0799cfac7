from collections import Counter

import pytest

from agentloop.apps.base import ApiError
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.builtin.apps import todo
from agentloop.apps.builtin.people import make_world_data
from agentloop.apps.tasks import SPLITS


@pytest.fixture
def world():
    return BUILTIN.new_world(31, ["todo"])


@pytest.fixture
def call(world):
    """Call a todo API as the logged-in supervisor."""
    email = world.state["supervisor"]["profile"]["1"]["email"]
    password = world.state["supervisor"]["accounts"]["todo"]["password"]
    token = world.call("todo", "login", {"username": email, "password": password})["access_token"]
    return lambda api, **args: world.call("todo", api, {"access_token": token, **args})


def all_pages(call, api, limit=20, **args):
    items, page = [], 0
    while batch := call(api, page_index=page, page_limit=limit, **args):
        items.extend(batch)
        page += 1
    return items


def rows(world):
    return list(world.state["todo"]["tasks"].values())


def status_of(call, api, **args):
    with pytest.raises(ApiError) as exc:
        call(api, **args)
    return exc.value.status, exc.value.message


def test_state_is_deterministic_with_unique_titles():
    state = todo.build_state(make_world_data(8))
    assert state == todo.build_state(make_world_data(8))
    titles = [t["title"] for t in state["tasks"].values()]
    assert len(titles) == len(set(titles)) and len(titles) > 40
    assert all((t["status"] == "done") == (t["completed_at"] is not None) for t in state["tasks"].values())


def test_list_tasks_pages_in_due_date_order(world, call):
    listed = all_pages(call, "list_tasks", limit=9)
    assert len(listed) == len({t["task_id"] for t in listed}) == len(rows(world))
    dues = [t["due_date"] for t in listed]
    dated = [d for d in dues if d]
    assert dated == sorted(dated) and dues[len(dated) :] == [None] * (len(dues) - len(dated))  # undated last
    by_priority = all_pages(call, "list_tasks", sort_by="priority")
    ranks = [todo.PRIORITIES.index(t["priority"]) for t in by_priority]
    assert ranks == sorted(ranks, reverse=True)


def test_list_tasks_filters(world, call):
    today = world.now.date().isoformat()
    overdue = all_pages(call, "list_tasks", status="open", due_before=today)
    assert {t["task_id"] for t in overdue} == {
        t["id"] for t in rows(world) if t["status"] == "open" and t["due_date"] and t["due_date"] < today
    }
    later = all_pages(call, "list_tasks", due_after=today)
    assert later and all(t["due_date"] > today for t in later)  # strictly after
    work = next(p for p in world.state["todo"]["projects"].values() if p["name"] == "Work")
    assert all(t["project_name"] == "Work" for t in all_pages(call, "list_tasks", project_id=work["id"]))
    assert all(t["priority"] == "urgent" for t in all_pages(call, "list_tasks", priority="urgent"))
    tag = Counter(tag for t in rows(world) for tag in t["tags"]).most_common(1)[0][0]
    assert all(tag in t["tags"] for t in all_pages(call, "list_tasks", tag=tag))
    assert [t["title"] for t in call("list_tasks", query="PULL REQUEST")] == [
        t["title"] for t in rows(world) if "pull request" in t["title"]
    ]
    status, message = status_of(call, "list_tasks", due_before="2025-02-30")
    assert status == 422 and "YYYY-MM-DD" in message
    assert status_of(call, "list_tasks", due_before="June 3")[0] == 422
    assert status_of(call, "list_tasks", project_id=999)[0] == 404


def test_projects_count_their_tasks(world, call):
    projects = call("list_projects", page_limit=20)
    assert projects[0]["name"] == "Inbox"
    assert sum(p["open_tasks"] + p["done_tasks"] for p in projects) == len(rows(world))
    status, message = status_of(call, "create_project", name="work")
    assert status == 409 and "project_id" in message
    new = call("create_project", name="Garden")["project_id"]
    assert world.state["todo"]["projects"][str(new)]["name"] == "Garden"


def test_add_task_defaults_to_the_inbox(world, call):
    task_id = call("add_task", title="Water the basil", tags=["home", "home"])["task_id"]
    shown = call("show_task", task_id=task_id)
    assert shown["project_name"] == "Inbox" and shown["priority"] == "medium" and shown["status"] == "open"
    assert shown["tags"] == ["home"] and shown["due_date"] is None
    assert status_of(call, "add_task", title="x", project_id=999)[0] == 404
    assert status_of(call, "add_task", title="x", priority="critical")[0] == 422
    assert status_of(call, "add_task", title="x", due_date="2025-13-01")[0] == 422


def test_update_task_changes_only_what_is_given(world, call):
    task = next(t for t in rows(world) if t["due_date"] and t["tags"])
    before = dict(task)
    call("update_task", task_id=task["id"], priority="low")
    assert {k for k in task if task[k] != before[k]} <= {"priority", "updated_at"}
    call("update_task", task_id=task["id"], due_date=None)
    assert task["due_date"] is None and task["tags"] == before["tags"]
    status, message = status_of(call, "update_task", task_id=task["id"])
    assert status == 422 and "Nothing to update" in message
    assert status_of(call, "update_task", task_id=task["id"], project_id=999)[0] == 404


def test_complete_reopen_and_delete(world, call):
    task = next(t for t in rows(world) if t["status"] == "open")
    call("complete_task_item", task_id=task["id"])
    assert task["status"] == "done" and task["completed_at"] == "2025-06-02T09:00:00Z"
    status, message = status_of(call, "complete_task_item", task_id=task["id"])
    assert status == 409 and "already done" in message
    call("reopen_task", task_id=task["id"])
    assert task["status"] == "open" and task["completed_at"] is None
    assert status_of(call, "reopen_task", task_id=task["id"])[0] == 409
    call("delete_task", task_id=task["id"])
    status, message = status_of(call, "show_task", task_id=task["id"])
    assert status == 404 and "task" in message


def test_scenarios_of_music_files_and_todo_are_held_out():
    """These apps are the held-out (test_challenge) apps: no training task may use them."""
    scenarios = [s for s in BUILTIN.scenarios if s.id.split("_")[0] in ("music", "files", "todo")]
    splits = Counter(s.split for s in scenarios)
    assert splits == {"dev": 4, "test_normal": 4, "test_challenge": 24}
    assert set(splits) <= set(SPLITS)
    assert Counter(s.difficulty for s in scenarios) == {1: 12, 2: 14, 3: 6}
    by_scenario: dict[str, set[str]] = {}
    for t in BUILTIN.tasks():
        if t.scenario_id.startswith("todo_"):
            by_scenario.setdefault(t.scenario_id, set()).add(t.instruction)
    assert by_scenario and all(len(v) == 3 for v in by_scenario.values()), by_scenario
