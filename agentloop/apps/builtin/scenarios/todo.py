"""Scenarios on the todo app, alone and with wallet."""

from __future__ import annotations

import random
from datetime import date, timedelta
from typing import Any

from agentloop.apps.builtin.scenarios.common import days_ago, my_email, people_of, plant
from agentloop.apps.builtin.scenarios.files import anything
from agentloop.apps.builtin.scenarios.wallet import world_people
from agentloop.apps.evaluation import added, removed, same_items, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World

NEW_TASKS = (
    "Book a haircut",
    "Order contact lenses",
    "Schedule the car inspection",
    "Email the accountant about the 1099",
    "Buy a new bike helmet",
    "Sign the lease renewal",
    "Call the bank about the card fee",
)
NEW_PROJECTS = {
    "Garden": ("Buy tomato seedlings", "Fix the fence gate", "Set up drip irrigation"),
    "Job search": ("Update my resume", "Ask {f} for a referral", "Practice interview questions"),
    "Marathon training": ("Buy running gels", "Register for the half marathon", "Book a sports massage"),
    "Spanish lessons": ("Find a tutor", "Download the flashcard app", "Watch a film in Spanish"),
}


def day(d: date) -> str:
    """How a person writes a date: 'June 14'."""
    return f"{d:%B} {d.day}"


def tasks(world: World) -> list[dict[str, Any]]:
    return sorted(world.state["todo"]["tasks"].values(), key=lambda t: t["id"])


def projects(world: World) -> dict[str, dict[str, Any]]:
    """Projects by name."""
    return {p["name"]: p for p in world.state["todo"]["projects"].values()}


def unique_titled(world: World) -> list[dict[str, Any]]:
    rows = tasks(world)
    titles = [t["title"].casefold() for t in rows]
    return [t for t in rows if titles.count(t["title"].casefold()) == 1]


def today(world: World) -> date:
    return world.now.date()


def find_project(c: OracleClient, token: str, name: str) -> int:
    return int(next(p for p in c.pages("todo", "list_projects", access_token=token) if p["name"] == name)["project_id"])


def find_task(c: OracleClient, token: str, title: str) -> dict[str, Any]:
    hits = c.pages("todo", "list_tasks", access_token=token, query=title)
    return dict(next(t for t in hits if t["title"] == title))


# --- scenarios -------------------------------------------------------------------------------------


def todo_add_task(world: World, rng: random.Random) -> TaskInstance:
    taken = {t["title"] for t in tasks(world)}
    title = rng.choice([t for t in NEW_TASKS if t not in taken])
    project = rng.choice(sorted(n for n in projects(world) if n != "Inbox"))
    due = today(world) + timedelta(days=rng.randint(3, 40))
    priority = rng.choice(["low", "high", "urgent"])
    project_id = projects(world)[project]["id"]

    def oracle(c: OracleClient) -> None:
        token = c.login("todo")
        pid = find_project(c, token, project)
        c.call(
            "todo",
            "add_task",
            access_token=token,
            title=title,
            project_id=pid,
            due_date=due.isoformat(),
            priority=priority,
        )

    return TaskInstance(
        f"Add a task '{title}' to my {project} project in todo, due {day(due)}, with {priority} priority.",
        oracle,
        [
            added(
                "todo",
                "tasks",
                title=title,
                project_id=project_id,
                due_date=due.isoformat(),
                priority=priority,
                status="open",
            )
        ],
    )


def todo_complete_task(world: World, rng: random.Random) -> TaskInstance:
    task = rng.choice([t for t in unique_titled(world) if t["status"] == "open"])
    title = task["title"]

    def oracle(c: OracleClient) -> None:
        token = c.login("todo")
        c.call("todo", "complete_task_item", access_token=token, task_id=find_task(c, token, title)["task_id"])

    phrasing = rng.choice(["I finished '{t}'. Tick it off in my todo list.", "Mark my todo task '{t}' as done."])
    return TaskInstance(
        phrasing.format(t=title),
        oracle,
        [updated("todo", "tasks", task["id"], status="done", completed_at=anything)],
    )


def todo_reopen_task(world: World, rng: random.Random) -> TaskInstance:
    task = rng.choice([t for t in unique_titled(world) if t["status"] == "done"])
    title = task["title"]

    def oracle(c: OracleClient) -> None:
        token = c.login("todo")
        c.call("todo", "reopen_task", access_token=token, task_id=find_task(c, token, title)["task_id"])

    return TaskInstance(
        f"I marked '{title}' as done by mistake; reopen that task in my todo list.",
        oracle,
        [updated("todo", "tasks", task["id"], status="open", completed_at=None)],
    )


def todo_due_extreme(world: World, rng: random.Random) -> TaskInstance:
    """The open task of a project due first (or last): one call when sorted, a full page loop for the last."""
    last = rng.random() < 0.4
    candidates = []
    for name, project in sorted(projects(world).items()):
        dated = sorted(
            (t["due_date"], t["title"])
            for t in tasks(world)
            if t["project_id"] == project["id"] and t["status"] == "open" and t["due_date"]
        )
        if last:
            dated.reverse()
        if name != "Inbox" and len(dated) >= 2 and dated[0][0] != dated[1][0]:
            candidates.append((name, dated[0][1]))
    name, answer = rng.choice(candidates)

    def oracle(c: OracleClient) -> str:
        token = c.login("todo")
        pid = find_project(c, token, name)
        rows = [
            t for t in c.pages("todo", "list_tasks", access_token=token, project_id=pid, status="open") if t["due_date"]
        ]
        return str((rows[-1] if last else rows[0])["title"])

    which = "latest" if last else "earliest"
    phrasing = rng.choice(
        [
            "Of the open tasks in my {n} project, which one has the {w} due date? Just tell me its title.",
            "Which open task in my {n} project in todo has the {w} due date? Give me only its title.",
            "What's the title of the open {n} task with the {w} due date?",
        ]
    )
    return TaskInstance(phrasing.format(n=name, w=which), oracle, answer=answer)


def todo_count_overdue(world: World, rng: random.Random) -> TaskInstance:
    now = today(world).isoformat()
    counts = {
        name: sum(
            t["project_id"] == p["id"] and t["status"] == "open" and t["due_date"] is not None and t["due_date"] < now
            for t in tasks(world)
        )
        for name, p in projects(world).items()
    }
    if rng.random() < 0.3:
        scope, where, answer = None, "across all my projects", sum(counts.values())
    else:
        scope = rng.choice(sorted(n for n, k in counts.items() if k >= 1 and n != "Inbox"))
        where, answer = f"in my {scope} project", counts[scope]

    def oracle(c: OracleClient) -> int:
        token = c.login("todo")
        args: dict[str, Any] = {"status": "open", "due_before": now}
        if scope is not None:
            args["project_id"] = find_project(c, token, scope)
        return sum(1 for _ in c.pages("todo", "list_tasks", access_token=token, **args))

    return TaskInstance(
        f"How many open todo tasks {where} are overdue, i.e. were due before today?", oracle, answer=answer
    )


def todo_delete_done_in_project(world: World, rng: random.Random) -> TaskInstance:
    done: dict[str, list[dict[str, Any]]] = {}
    for name, p in projects(world).items():
        done[name] = [t for t in tasks(world) if t["project_id"] == p["id"] and t["status"] == "done"]
    name = rng.choice(sorted(n for n, rows in done.items() if len(rows) >= 2 and n != "Inbox"))

    def oracle(c: OracleClient) -> None:
        token = c.login("todo")
        pid = find_project(c, token, name)
        finished = list(c.pages("todo", "list_tasks", access_token=token, project_id=pid, status="done"))
        for t in finished:
            c.call("todo", "delete_task", access_token=token, task_id=t["task_id"])

    phrasing = rng.choice(
        [
            "Clean up my {n} project in todo: delete every task in it that is already done, and keep the open ones.",
            "Delete all the completed tasks in my {n} project (only the done ones).",
        ]
    )
    return TaskInstance(
        phrasing.format(n=name),
        oracle,
        [removed("todo", "tasks", t["id"]) for t in done[name]],
    )


def todo_new_project_tasks(world: World, rng: random.Random) -> TaskInstance:
    name = rng.choice(sorted(NEW_PROJECTS))
    friend = rng.choice(sorted(people_of(world.seed).values(), key=lambda p: p.id))
    titles = [t.format(f=friend.first_name) for t in NEW_PROJECTS[name]]
    dues = [today(world) + timedelta(days=d) for d in sorted(rng.sample(range(2, 30), 2))]
    project_id = max(int(k) for k in world.state["todo"]["projects"]) + 1

    def oracle(c: OracleClient) -> None:
        token = c.login("todo")
        pid = c.call("todo", "create_project", access_token=token, name=name)["project_id"]
        for title, due in zip(titles, [*dues, None], strict=True):
            args = {"due_date": due.isoformat()} if due else {}
            c.call("todo", "add_task", access_token=token, title=title, project_id=pid, **args)

    return TaskInstance(
        f"Start a new todo project called '{name}' with three tasks: '{titles[0]}' due {day(dues[0])}, "
        f"'{titles[1]}' due {day(dues[1])}, and '{titles[2]}' with no due date.",
        oracle,
        [added("todo", "projects", name=name)]
        + [
            added("todo", "tasks", title=title, project_id=project_id, due_date=due.isoformat() if due else None)
            for title, due in zip(titles, [*dues, None], strict=True)
        ],
    )


def todo_tag_by_priority(world: World, rng: random.Random) -> TaskInstance:
    open_tasks = [t for t in tasks(world) if t["status"] == "open"]
    priority = rng.choice([p for p in ("urgent", "high") if sum(t["priority"] == p for t in open_tasks) >= 2])
    tag = rng.choice(["focus", "this-week", "top", "priority", "now", "important"])
    chosen = [t for t in open_tasks if t["priority"] == priority]

    def oracle(c: OracleClient) -> None:
        token = c.login("todo")
        rows = list(c.pages("todo", "list_tasks", access_token=token, status="open", priority=priority))
        for t in rows:
            if tag not in t["tags"]:
                c.call("todo", "update_task", access_token=token, task_id=t["task_id"], tags=[*t["tags"], tag])

    phrasing = rng.choice(
        [
            "Add the tag '{t}' to every open todo task with {p} priority, keeping the tags they already have.",
            "Tag all my open {p}-priority tasks with '{t}' (don't remove their other tags).",
        ]
    )
    return TaskInstance(
        phrasing.format(t=tag, p=priority),
        oracle,
        [updated("todo", "tasks", t["id"], tags=same_items([*t["tags"], tag])) for t in chosen],
    )


def todo_postpone_overdue(world: World, rng: random.Random) -> TaskInstance:
    now = today(world).isoformat()
    overdue: dict[str, list[dict[str, Any]]] = {}
    for name, p in projects(world).items():
        overdue[name] = [
            t
            for t in tasks(world)
            if t["project_id"] == p["id"] and t["status"] == "open" and t["due_date"] and t["due_date"] < now
        ]
    name = max(sorted(n for n in overdue if n != "Inbox"), key=lambda n: (len(overdue[n]) >= 2, rng.random()))
    for title in LATE_TASKS[: max(0, 2 - len(overdue[name]))]:  # a rare world where no project is late twice
        created = days_ago(world, 30)
        overdue[name].append(
            plant(
                world,
                "todo",
                "tasks",
                {
                    "project_id": projects(world)[name]["id"],
                    "title": title,
                    "notes": "",
                    "due_date": (today(world) - timedelta(days=rng.randint(1, 20))).isoformat(),
                    "priority": "medium",
                    "status": "open",
                    "tags": [],
                    "created_at": created,
                    "updated_at": created,
                    "completed_at": None,
                },
            )
        )
    shift = rng.choice([2, 3, 5, 7, 10, 14])
    example = day(date(2025, 5, 20) + timedelta(days=shift))
    phrasing = rng.choice(
        [
            "Every open task in my {n} project that is overdue: postpone it by {s} days from its current due date "
            "(one due May 20 would move to {x}). Leave the other tasks alone.",
            "I'm behind on my {n} project. Push each overdue open task in it back by {s} days, counted from the "
            "date it was due (May 20 becomes {x}); don't touch anything else.",
        ]
    )

    def later(iso_day: str) -> str:
        return (date.fromisoformat(iso_day) + timedelta(days=shift)).isoformat()

    def oracle(c: OracleClient) -> None:
        token = c.login("todo")
        pid = find_project(c, token, name)
        late = list(c.pages("todo", "list_tasks", access_token=token, project_id=pid, status="open", due_before=now))
        for t in late:
            c.call("todo", "update_task", access_token=token, task_id=t["task_id"], due_date=later(t["due_date"]))

    return TaskInstance(
        phrasing.format(n=name, s=shift, x=example),
        oracle,
        [updated("todo", "tasks", t["id"], due_date=later(t["due_date"])) for t in overdue[name]],
    )


LATE_TASKS = ("Sort out the receipts drawer", "Reply to the building manager")
IOU_THINGS = ("pizza", "concert tickets", "the cab", "groceries", "brunch", "the cabin deposit", "movie tickets")


def todo_pay_money_tasks(world: World, rng: random.Random) -> TaskInstance:
    known = people_of(world.seed)
    emails = [e for e in world_people(world) if e in known]
    payees = rng.sample(emails, 5)
    project = rng.choice(["IOUs", "Money I owe", "Pay back"])
    pid = plant(world, "todo", "projects", {"name": project, "created_at": days_ago(world, 60)})["id"]
    sunday = today(world) + timedelta(days=6 - today(world).weekday())
    # three are due this week; one is due later and one is already paid: both must be left alone
    plan = [(today(world) + timedelta(days=d), "open") for d in sorted(rng.sample(range(-3, 7), 3))]
    plan += [(sunday + timedelta(days=rng.randint(3, 20)), "open"), (today(world) - timedelta(days=2), "done")]
    targets = []
    for email, (due, status) in zip(payees, plan, strict=True):
        person = known[email]
        amount = float(rng.randint(8, 60))
        title = f"Pay {person.name} ${amount:.0f} for {rng.choice(IOU_THINGS)}"
        created = days_ago(world, rng.randint(5, 15))
        task = plant(
            world,
            "todo",
            "tasks",
            {
                "project_id": pid,
                "title": title,
                "notes": f"Wallet: {email}",
                "due_date": due.isoformat(),
                "priority": "medium",
                "status": status,
                "tags": ["money"],
                "created_at": created,
                "updated_at": created if status == "open" else days_ago(world, 1),
                "completed_at": None if status == "open" else days_ago(world, 1),
            },
        )
        if status == "open" and due <= sunday:
            targets.append((task, email, amount))
    me = my_email(world)
    balance = world.state["wallet"]["account"]["1"]["balance"]

    def oracle(c: OracleClient) -> None:
        ttoken = c.login("todo")
        wtoken = c.login("wallet")
        project_id = find_project(c, ttoken, project)
        due_soon = list(
            c.pages(
                "todo",
                "list_tasks",
                access_token=ttoken,
                project_id=project_id,
                status="open",
                due_before=(sunday + timedelta(days=1)).isoformat(),
            )
        )
        for t in due_soon:
            info = c.call("todo", "show_task", access_token=ttoken, task_id=t["task_id"])
            email = info["notes"].split("Wallet:", 1)[1].strip()
            amount = float(t["title"].split("$", 1)[1].split()[0])
            c.call("wallet", "send_money", access_token=wtoken, receiver_email=email, amount=amount, note=t["title"])
            c.call("todo", "complete_task_item", access_token=ttoken, task_id=t["task_id"])

    return TaskInstance(
        f"My todo project '{project}' has tasks like 'Pay <name> $<amount> for <thing>', with the person's wallet "
        f"email in the task notes. For each open one due by this Sunday ({day(sunday)}), send that amount on wallet "
        "with the task title as the note, then mark the task done.",
        oracle,
        [
            added("wallet", "transactions", sender=me, receiver=email, amount=amount, note=task["title"])
            for task, email, amount in targets
        ]
        + [updated("wallet", "account", 1, balance=round(balance - sum(a for _, _, a in targets), 2))]
        + [updated("todo", "tasks", task["id"], status="done", completed_at=anything) for task, _, _ in targets],
    )


SCENARIOS = [
    Scenario("todo_add_task", 1, ("todo",), "test_challenge", todo_add_task),
    Scenario("todo_complete_task", 1, ("todo",), "test_challenge", todo_complete_task),
    Scenario("todo_reopen_task", 1, ("todo",), "test_challenge", todo_reopen_task),
    Scenario("todo_due_extreme", 1, ("todo",), "test_challenge", todo_due_extreme),
    Scenario("todo_count_overdue", 2, ("todo",), "dev", todo_count_overdue),
    Scenario("todo_delete_done_in_project", 2, ("todo",), "test_challenge", todo_delete_done_in_project),
    Scenario("todo_new_project_tasks", 2, ("todo",), "test_normal", todo_new_project_tasks),
    Scenario("todo_tag_by_priority", 2, ("todo",), "test_challenge", todo_tag_by_priority),
    Scenario("todo_postpone_overdue", 3, ("todo",), "test_challenge", todo_postpone_overdue),
    Scenario("todo_pay_money_tasks", 3, ("todo", "wallet"), "test_normal", todo_pay_money_tasks),
]
