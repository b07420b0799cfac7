"""Todo: a task manager with projects and task items (due dates, priorities, tags)."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta
from typing import Any

from agentloop.apps.base import (
    ApiError,
    AppSpec,
    AppState,
    CallContext,
    array,
    integer,
    page_params,
    paginate,
    string,
)
from agentloop.apps.builtin.people import Person, WorldData, iso

PRIORITIES = ("low", "medium", "high", "urgent")
STATUSES = ("open", "done")
INBOX = "Inbox"

# project -> task titles; {c} a coworker, {m} the manager, {f} a friend, {r} a relative, {n} a neighbour
TITLES: dict[str, tuple[str, ...]] = {
    "Work": (
        "Review {c}'s pull request",
        "Prepare Q3 roadmap slides",
        "Send the weekly status update to {m}",
        "Book a room for the team offsite",
        "Update the onboarding doc",
        "Submit the May expense report",
        "1:1 with {c}",
        "Write the incident postmortem",
        "Reply to {c} about the budget",
        "Renew the design tool license",
        "Plan the summer hackathon",
        "Draft the hiring plan with {m}",
        "Clean up the analytics dashboard",
        "Give feedback on {c}'s proposal",
        "Archive old project channels",
        "Prepare the demo for Friday",
    ),
    "Home": (
        "Fix the leaky kitchen faucet",
        "Replace the smoke detector batteries",
        "Clean the gutters",
        "Call the landlord about the heater",
        "Deep-clean the fridge",
        "Hang the new shelves",
        "Change the air filter",
        "Donate old clothes",
        "Ask {n} to feed the cat next weekend",
        "Defrost the freezer",
        "Repot the fiddle-leaf fig",
    ),
    "Errands": (
        "Pick up the dry cleaning",
        "Return the library books",
        "Buy printer ink",
        "Drop off the package at the post office",
        "Get the car washed",
        "Buy stamps",
        "Get spare keys copied",
        "Return the shoes to the store",
        "Pick up the photo prints",
    ),
    "Personal": (
        "Call {r}",
        "Buy a birthday gift for {f}",
        "Renew my passport",
        "Plan a weekend trip with {f}",
        "Write a thank-you card to {f}",
        "Sign up for the pottery class",
        "Back up the phone photos",
        "Finish reading Piranesi",
        "Send {r} the holiday photos",
    ),
    "Health": (
        "Schedule a dentist cleaning",
        "Refill the allergy prescription",
        "Book the annual physical",
        "Sign up for the Tuesday yoga class",
        "Buy new running shoes",
        "Get a flu shot",
    ),
    "Finance": (
        "Pay the credit card bill",
        "Cancel the unused streaming subscription",
        "Submit HSA receipts",
        "Review the 401(k) allocation",
        "Set up automatic savings",
        "Pay {f} back for the concert tickets",
    ),
}


def _people_by_role(data: WorldData, rng: random.Random) -> dict[str, list[Person]]:
    roles = {"c": ("coworker",), "m": ("manager",), "f": ("friend", "classmate", "roommate"), "r": ("family",)}
    roles["n"] = ("neighbor",)
    out = {k: [p for p in data.people if p.relationship in rels] or list(data.people) for k, rels in roles.items()}
    for people in out.values():
        rng.shuffle(people)
    return out


def _fill(template: str, people: dict[str, list[Person]], rng: random.Random) -> tuple[str, Person | None]:
    for key, group in people.items():
        if "{" + key + "}" in template:
            person = rng.choice(group)
            return template.replace("{" + key + "}", person.first_name if key in "cmn" else person.name), person
    return template, None


# words in a title -> the tag a person would give it
TAG_WORDS = (
    (("Call", "Ask"), "phone"),
    (("Reply", "Send"), "email"),
    (("Update", "Submit", "Back up", "Cancel", "Review", "Renew", "Archive", "Clean up", "Set up"), "computer"),
    (("Pick up", "Return", "Drop off", "Get", "Buy"), "errand"),
    (("Buy",), "shopping"),
)


def _tags_for(title: str, rng: random.Random) -> list[str]:
    tags = [tag for words, tag in TAG_WORDS if any(title.startswith(w) for w in words)]
    if rng.random() < 0.25:
        tags.append(rng.choice(("weekend", "15min", "waiting")))
    return tags


def _next_birthday(person: Person, today: date) -> date:
    month, day = int(person.birthday[5:7]), int(person.birthday[8:10])
    if (month, day) == (2, 29):
        day = 28
    this_year = date(today.year, month, day)
    return this_year if this_year >= today else date(today.year + 1, month, day)


def build_state(data: WorldData) -> AppState:
    rng = data.rng("todo")
    today = data.now.date()
    people = _people_by_role(data, rng)
    names = [INBOX, *rng.sample(list(TITLES), len(TITLES))]
    projects = {
        str(i): {"id": i, "name": name, "created_at": data.ago(days=rng.randint(200, 900))}
        for i, name in enumerate(names, start=1)
    }
    project_ids = {p["name"]: p["id"] for p in projects.values()}
    tasks: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    inbox_titles = (
        "Look into a standing desk",
        "Reply to {f} about dinner",
        "Try the new ramen place",
        "Research new phone plans",
        "Find a plumber",
    )
    for project, templates in [*TITLES.items(), (INBOX, inbox_titles)]:
        count = len(templates) if project == "Work" else rng.randint(len(templates) - 2, len(templates))
        for template in rng.sample(templates, count):
            title, person = _fill(template, people, rng)
            if title in seen:
                continue
            seen.add(title)
            created = data.now - timedelta(days=rng.uniform(10, 120))
            due: date | None = today + timedelta(days=rng.randint(-35, 50)) if rng.random() < 0.85 else None
            if "birthday gift" in title and person is not None:
                due = _next_birthday(person, today) - timedelta(days=2)
            done = rng.random() < 0.35
            completed: datetime | None = None
            if done:
                completed = created + (data.now - created) * rng.uniform(0.2, 0.95)
            tid = len(tasks) + 1
            tasks[str(tid)] = {
                "id": tid,
                "project_id": project_ids[project],
                "title": title,
                "notes": "",
                "due_date": due.isoformat() if due else None,
                "priority": rng.choices(PRIORITIES, weights=(3, 5, 3, 1))[0],
                "status": "done" if done else "open",
                "tags": _tags_for(title, rng),
                "created_at": iso(created),
                "updated_at": iso(completed or created),
                "completed_at": iso(completed) if completed else None,
            }
    return {"projects": projects, "tasks": tasks, "_sessions": {}}


app = AppSpec(
    name="todo",
    description="Your to-do list: projects and tasks with due dates, priorities and tags.",
    build_state=build_state,
)

TASK = "{task_id, title, project_id, project_name, due_date, priority, status, tags}"
DATE = {"pattern": r"^\d{4}-\d{2}-\d{2}$"}


def _date(value: str, field: str) -> str:
    try:
        return date.fromisoformat(value).isoformat()
    except ValueError:
        raise ApiError(
            422, f"{field} must be a real date written YYYY-MM-DD, e.g. 2025-06-14; got {value!r}."
        ) from None


def _task(ctx: CallContext, t: dict[str, Any]) -> dict[str, Any]:
    return {
        "task_id": t["id"],
        "title": t["title"],
        "project_id": t["project_id"],
        "project_name": ctx.table("projects")[str(t["project_id"])]["name"],
        "due_date": t["due_date"],
        "priority": t["priority"],
        "status": t["status"],
        "tags": list(t["tags"]),
    }


def _project(ctx: CallContext, project_id: int) -> dict[str, Any]:
    return ctx.get("projects", project_id, "project")


@app.api(
    "List your projects (Inbox first, then by name) with how many open and done tasks each has.",
    params=page_params(),
    returns="[{project_id, name, open_tasks, done_tasks}]",
)
def list_projects(ctx: CallContext, page_index: int, page_limit: int) -> list[dict[str, Any]]:
    tasks = list(ctx.table("tasks").values())
    rows = sorted(ctx.table("projects").values(), key=lambda p: (p["name"] != INBOX, p["name"].casefold()))
    return [
        {
            "project_id": p["id"],
            "name": p["name"],
            "open_tasks": sum(t["project_id"] == p["id"] and t["status"] == "open" for t in tasks),
            "done_tasks": sum(t["project_id"] == p["id"] and t["status"] == "done" for t in tasks),
        }
        for p in paginate(rows, page_index, page_limit)
    ]


@app.api(
    "Create a project. Project names are unique.",
    params={"name": string("Name of the project.", minLength=1)},
    required=["name"],
    returns="{project_id}",
)
def create_project(ctx: CallContext, name: str) -> dict[str, Any]:
    name = name.strip()
    clash = next((p for p in ctx.table("projects").values() if p["name"].casefold() == name.casefold()), None)
    if clash is not None:
        raise ApiError(409, f"A project named {clash['name']!r} already exists (project_id {clash['id']}).")
    project = ctx.insert("projects", {"name": name, "created_at": iso(ctx.now)})
    return {"project_id": project["id"]}


@app.api(
    "List tasks, filtered by project, status, due date, priority, tag or words in the title. Sorted by due date "
    "(tasks without one last), unless sort_by says otherwise.",
    params={
        "project_id": integer("Only tasks of this project."),
        "status": string("open or done.", enum=list(STATUSES)),
        "due_before": string("Only tasks due strictly before this date (YYYY-MM-DD).", **DATE),
        "due_after": string("Only tasks due strictly after this date (YYYY-MM-DD).", **DATE),
        "priority": string("Only tasks of this priority.", enum=list(PRIORITIES)),
        "tag": string("Only tasks with this tag."),
        "query": string("Only tasks whose title contains this text (case-insensitive)."),
        "sort_by": string(
            "due_date (soonest first), priority (most urgent first) or created (newest first).",
            enum=["due_date", "priority", "created"],
            default="due_date",
        ),
        **page_params(),
    },
    returns=f"[{TASK}]",
)
def list_tasks(
    ctx: CallContext,
    sort_by: str,
    page_index: int,
    page_limit: int,
    project_id: int | None = None,
    status: str | None = None,
    due_before: str | None = None,
    due_after: str | None = None,
    priority: str | None = None,
    tag: str | None = None,
    query: str | None = None,
) -> list[dict[str, Any]]:
    if project_id is not None:
        _project(ctx, project_id)
    before = _date(due_before, "due_before") if due_before else None
    after = _date(due_after, "due_after") if due_after else None
    q = (query or "").casefold().strip()
    rows = [
        t
        for t in ctx.table("tasks").values()
        if (project_id is None or t["project_id"] == project_id)
        and (status is None or t["status"] == status)
        and (before is None or (t["due_date"] is not None and t["due_date"] < before))
        and (after is None or (t["due_date"] is not None and t["due_date"] > after))
        and (priority is None or t["priority"] == priority)
        and (tag is None or tag in t["tags"])
        and q in t["title"].casefold()
    ]
    if sort_by == "priority":
        rows.sort(key=lambda t: (-PRIORITIES.index(t["priority"]), t["due_date"] or "9999", t["id"]))
    elif sort_by == "created":
        rows.sort(key=lambda t: (t["created_at"], t["id"]), reverse=True)
    else:
        rows.sort(key=lambda t: (t["due_date"] or "9999", -PRIORITIES.index(t["priority"]), t["id"]))
    return [_task(ctx, t) for t in paginate(rows, page_index, page_limit)]


@app.api(
    "Show one task with its notes and dates.",
    params={"task_id": integer("Id of the task.")},
    required=["task_id"],
    returns=TASK[:-1] + ", notes, created_at, updated_at, completed_at}",
)
def show_task(ctx: CallContext, task_id: int) -> dict[str, Any]:
    t = ctx.get("tasks", task_id, "task")
    return {**_task(ctx, t), **{k: t[k] for k in ("notes", "created_at", "updated_at", "completed_at")}}


@app.api(
    "Add a task. Without project_id it goes to the Inbox.",
    params={
        "title": string("What to do.", minLength=1),
        "project_id": integer("Project to put it in (see list_projects)."),
        "due_date": string("Due date, YYYY-MM-DD.", **DATE),
        "priority": string("How important it is.", enum=list(PRIORITIES), default="medium"),
        "tags": array("Tags, e.g. phone or errand.", {"type": "string"}),
        "notes": string("Details."),
    },
    required=["title"],
    returns="{task_id}",
)
def add_task(
    ctx: CallContext,
    title: str,
    priority: str,
    project_id: int | None = None,
    due_date: str | None = None,
    tags: list[str] | None = None,
    notes: str = "",
) -> dict[str, Any]:
    if project_id is None:
        project_id = next(p["id"] for p in ctx.table("projects").values() if p["name"] == INBOX)
    _project(ctx, project_id)
    now = iso(ctx.now)
    task = ctx.insert(
        "tasks",
        {
            "project_id": project_id,
            "title": title.strip(),
            "notes": notes,
            "due_date": _date(due_date, "due_date") if due_date else None,
            "priority": priority,
            "status": "open",
            "tags": list(dict.fromkeys(tags or [])),
            "created_at": now,
            "updated_at": now,
            "completed_at": None,
        },
    )
    return {"task_id": task["id"]}


@app.api(
    "Change a task's title, notes, due date, priority, tags or project. Only the fields you give change; "
    "tags replace the old ones; due_date null removes the due date.",
    params={
        "task_id": integer("Id of the task."),
        "title": string("New title.", minLength=1),
        "notes": string("New notes."),
        "due_date": {"type": ["string", "null"], "description": "New due date (YYYY-MM-DD), or null for none."},
        "priority": string("New priority.", enum=list(PRIORITIES)),
        "tags": array("New tags (replace the old ones).", {"type": "string"}),
        "project_id": integer("Move it to this project."),
    },
    required=["task_id"],
    returns=TASK,
)
def update_task(ctx: CallContext, task_id: int, **changes: Any) -> dict[str, Any]:
    task = ctx.get("tasks", task_id, "task")
    if not changes:
        raise ApiError(
            422, "Nothing to update: give at least one of title, notes, due_date, priority, tags, project_id."
        )
    if "project_id" in changes:
        _project(ctx, changes["project_id"])
    if changes.get("due_date") is not None:
        changes["due_date"] = _date(changes["due_date"], "due_date")
    if "tags" in changes:
        changes["tags"] = list(dict.fromkeys(changes["tags"]))
    if "title" in changes:
        changes["title"] = changes["title"].strip()
    task.update(changes)
    task["updated_at"] = iso(ctx.now)
    return _task(ctx, task)


@app.api(
    "Mark a task as done.",
    params={"task_id": integer("Id of the task.")},
    required=["task_id"],
    returns=TASK,
)
def complete_task_item(ctx: CallContext, task_id: int) -> dict[str, Any]:
    task = ctx.get("tasks", task_id, "task")
    if task["status"] == "done":
        raise ApiError(409, f"Task {task_id} ({task['title']!r}) is already done.")
    now = iso(ctx.now)
    task.update(status="done", completed_at=now, updated_at=now)
    return _task(ctx, task)


@app.api(
    "Mark a done task as open again.",
    params={"task_id": integer("Id of the task.")},
    required=["task_id"],
    returns=TASK,
)
def reopen_task(ctx: CallContext, task_id: int) -> dict[str, Any]:
    task = ctx.get("tasks", task_id, "task")
    if task["status"] == "open":
        raise ApiError(409, f"Task {task_id} ({task['title']!r}) is already open.")
    task.update(status="open", completed_at=None, updated_at=iso(ctx.now))
    return _task(ctx, task)


@app.api(
    "Delete a task for good.",
    params={"task_id": integer("Id of the task.")},
    required=["task_id"],
    returns="A confirmation message.",
)
def delete_task(ctx: CallContext, task_id: int) -> str:
    task = ctx.get("tasks", task_id, "task")
    del ctx.table("tasks")[str(task_id)]
    return f"Task {task_id} ({task['title']!r}) deleted."
