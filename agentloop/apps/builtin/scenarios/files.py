"""Scenarios on the files app, alone and with todo."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from agentloop.apps.builtin.apps.files import mime_type, name_of, parent_of
from agentloop.apps.builtin.scenarios.common import days_ago, plant
from agentloop.apps.evaluation import added, removed, updated
from agentloop.apps.tasks import OracleClient, Scenario, TaskInstance
from agentloop.apps.world import World

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October")


def anything(_: Any) -> bool:
    """Field matcher for fields a correct solution changes in a way the task does not fix (e.g. timestamps)."""
    return True


# --- reading and planting the drive at setup time -----------------------------------------------------


def drive(world: World) -> list[dict[str, Any]]:
    return sorted(world.state["files"]["files"].values(), key=lambda r: r["id"])


def at(world: World, path: str) -> dict[str, Any]:
    return next(r for r in drive(world) if r["path"] == path)


def plant_file(world: World, path: str, content: str | None = None, days: float = 3) -> dict[str, Any]:
    """Add a file (and any missing folders above it) to the task's initial drive."""
    paths = {r["path"] for r in drive(world)}
    parts = path.strip("/").split("/")
    for depth in range(1, len(parts)):
        folder = "/" + "/".join(parts[:depth])
        if folder not in paths:
            _plant(world, folder, "folder", None, None, days + 30)
    size = len(content.encode()) if content is not None else 1_000 * (len(path) * 37 % 900 + 50)
    return _plant(world, path, "file", content, size, days)


def _plant(world: World, path: str, kind: str, content: str | None, size: int | None, days: float) -> dict[str, Any]:
    when = days_ago(world, days)
    return plant(
        world,
        "files",
        "files",
        {
            "path": path,
            "kind": kind,
            "mime_type": None if kind == "folder" else mime_type(path),
            "content": content,
            "size_bytes": size,
            "created_at": when,
            "modified_at": when,
            "last_opened_at": None,
        },
    )


def money(text: str) -> float:
    return float(text.replace("$", "").replace(",", "").strip())


# --- scenarios -------------------------------------------------------------------------------------


# line label in the summary -> how the user asks about it
TAX_FIELDS = {
    "Refund": "how big was my tax refund",
    "Charitable donations": "how much did I give in charitable donations",
    "Interest income": "how much interest income did I have",
    "Total tax": "how much was my total tax",
}


def files_read_tax_figure(world: World, rng: random.Random) -> TaskInstance:
    year = rng.choice([2023, 2024])
    label = rng.choice(sorted(TAX_FIELDS))
    path = f"/Documents/Taxes/{year} tax summary.txt"
    line = next(li for li in at(world, path)["content"].splitlines() if li.startswith(label + ":"))
    value = money(line.split(":", 1)[1])

    def oracle(c: OracleClient) -> float:
        token = c.login("files")
        text = c.call("files", "read_file", access_token=token, path=path)["content"]
        found = next(li for li in text.splitlines() if li.startswith(label + ":"))
        return money(found.split(":", 1)[1])

    return TaskInstance(
        f"According to my {year} tax summary in /Documents/Taxes, {TAX_FIELDS[label]}? Answer with the dollar amount.",
        oracle,
        answer=value,
    )


NEW_FILES = (
    ("/Notes/Plumber.txt", "Mario's Plumbing, 555-0142, comes Thursdays after 2pm."),
    ("/Notes/Parking.txt", "Level 3, spot 318, near the elevator."),
    ("/Notes/Wine to try.txt", "Albarino from Rias Baixas; ask for the 2022 vintage."),
    ("/Documents/Home/Spare key.txt", "The spare key is with the neighbor in 4B."),
    ("/Documents/Home/Paint colors.txt", "Living room: Sea Salt SW 6204. Trim: Pure White."),
    ("/Notes/Bike size.txt", "Frame 54 cm, saddle height 71 cm."),
)


def files_create_text_file(world: World, rng: random.Random) -> TaskInstance:
    path, text = rng.choice(NEW_FILES)
    phrasing = rng.choice(
        [
            "Create a text file at {p} that says: {t}",
            "Save a new file {p} on my drive with this text: {t}",
            "Please write this into a new file {p}: {t}",
        ]
    )

    def oracle(c: OracleClient) -> None:
        token = c.login("files")
        c.call("files", "write_file", access_token=token, path=path, content=text)

    return TaskInstance(
        phrasing.format(p=path, t=text),
        oracle,
        [added("files", "files", path=path, kind="file", content=text)],
    )


PHOTO_NAMES = ("Sunset at the harbor", "Old town square", "Dinner with friends", "Hiking trail", "Street market")


def files_rename_photo(world: World, rng: random.Random) -> TaskInstance:
    photos = [r for r in drive(world) if r["path"].startswith("/Photos/Trip to ") and r["kind"] == "file"]
    photo = rng.choice(photos)
    old = photo["path"]
    new_name = rng.choice(PHOTO_NAMES) + ".jpg"
    new = f"{parent_of(old)}/{new_name}"

    def oracle(c: OracleClient) -> None:
        token = c.login("files")
        c.call("files", "move", access_token=token, source=old, destination=new)

    return TaskInstance(
        f"Rename the photo {old} to '{new_name}', keeping it in the same folder.",
        oracle,
        [updated("files", "files", photo["id"], path=new)],
    )


EXTRA_ITEMS = (
    "oat milk",
    "paper towels",
    "basil",
    "sparkling water",
    "dark chocolate",
    "frozen peas",
    "peanut butter",
    "trash bags",
    "lemons",
    "tortillas",
)


def files_append_line(world: World, rng: random.Random) -> TaskInstance:
    path = "/Notes/Shopping list.txt"
    record = at(world, path)
    item = rng.choice([i for i in EXTRA_ITEMS if i not in record["content"]])
    expected = record["content"].rstrip("\n") + "\n" + item
    phrasing = rng.choice(
        [
            "Add '{i}' as a new line at the end of my shopping list ({p}); keep everything else as it is.",
            "Put '{i}' on my shopping list in {p}, as a new last line. Don't change the other lines.",
            "I'm out of {i}: append it as its own line at the bottom of {p}, leaving the rest untouched.",
        ]
    )

    def oracle(c: OracleClient) -> None:
        token = c.login("files")
        text = c.call("files", "read_file", access_token=token, path=path)["content"]
        c.call(
            "files",
            "write_file",
            access_token=token,
            path=path,
            content=text.rstrip("\n") + "\n" + item,
            overwrite=True,
        )

    return TaskInstance(
        phrasing.format(i=item, p=path),
        oracle,
        [
            updated(
                "files",
                "files",
                record["id"],
                content=expected,
                size_bytes=anything,
                modified_at=anything,
            )
        ],
    )


# extension -> (what people call it, where such files get left)
LEFTOVERS = {
    "tmp": ("temporary", ["/Downloads/~report-draft.tmp", "/Documents/Work/~Q2 goals.tmp", "/Documents/~lock.tmp"]),
    "part": ("half-downloaded", ["/Downloads/holiday-video.mp4.part", "/Downloads/podcast-ep12.mp3.part"]),
    "crdownload": ("unfinished download", ["/Downloads/tax-forms.zip.crdownload", "/Downloads/setup.exe.crdownload"]),
    "bak": ("old backup", ["/Documents/Resume.txt.bak", "/Notes/Ideas.txt.bak", "/Documents/Work/Q2 goals.txt.bak"]),
}


def files_delete_leftovers(world: World, rng: random.Random) -> TaskInstance:
    ext = rng.choice(sorted(LEFTOVERS))
    what, places = LEFTOVERS[ext]
    for path in places:
        plant_file(world, path, days=rng.uniform(1, 30))
    plant_file(world, f"/Photos/Camera Uploads/IMG_{rng.randint(1000, 9999)}.jpg.{ext}", days=rng.uniform(1, 30))
    # a note that mentions the extension is not one of them
    plant_file(
        world,
        "/Notes/Computer tips.txt",
        f"Programs leave .{ext} files behind when something stops halfway; they are safe to delete.",
        days=40,
    )
    doomed = [r for r in drive(world) if r["kind"] == "file" and name_of(r["path"]).casefold().endswith("." + ext)]

    def oracle(c: OracleClient) -> None:
        token = c.login("files")
        hits = [
            r
            for r in c.pages("files", "search_files", access_token=token, query="." + ext, kind="file")
            if r["name"].casefold().endswith("." + ext)
        ]
        for r in hits:
            c.call("files", "delete", access_token=token, path=r["path"])

    phrasing = rng.choice(
        [
            "My drive is full of {w} .{e} files. Delete every file ending in .{e}, wherever it is, and nothing else.",
            "Find all the .{e} files ({w} files) anywhere on my drive and delete them. Leave everything else.",
        ]
    )
    return TaskInstance(
        phrasing.format(w=what, e=ext),
        oracle,
        [removed("files", "files", r["id"]) for r in doomed],
    )


# what the user asks for -> (the word a search would use, how such a code looks)
SECRETS: dict[str, tuple[str, Callable[[random.Random], str]]] = {
    "gym locker combination": ("locker", lambda r: f"{r.randint(10, 39)}-{r.randint(10, 39)}-{r.randint(10, 39)}"),
    "bike lock code": ("lock", lambda r: f"{r.randint(1000, 9999)}"),
    "storage unit gate code": ("gate", lambda r: f"{r.randint(10000, 99999)}"),
    "garage door code": ("garage", lambda r: f"{r.randint(100000, 999999)}"),
    "alarm system PIN": ("alarm", lambda r: f"{r.randint(1000, 9999)}"),
    "mailbox key number": ("mailbox", lambda r: f"MB-{r.randint(100, 999)}"),
}


def files_find_secret(world: World, rng: random.Random) -> TaskInstance:
    what = rng.choice(sorted(SECRETS))
    keyword, make = SECRETS[what]
    code = make(rng)
    path = rng.choice(["/Notes/Odds and ends.txt", "/Documents/Home/Misc.txt", "/Notes/Random bits.txt"])
    lines = [
        f"Library card: {rng.randint(10**9, 10**10)}",
        f"{what[0].upper()}{what[1:]}: {code}",
        f"Parking spot: B-{rng.randint(1, 60)}",
    ]
    rng.shuffle(lines)
    plant_file(world, path, "\n".join(lines), days=rng.uniform(30, 200))

    def oracle(c: OracleClient) -> str:
        token = c.login("files")
        hits = c.pages("files", "search_files", access_token=token, query=keyword, kind="file")
        for hit in (h for h in hits if h["matched_in"] == "content"):
            text = c.call("files", "read_file", access_token=token, path=hit["path"])["content"]
            for line in text.splitlines():
                if line.casefold().startswith(what.casefold()):
                    return line.split(":", 1)[1].strip()
        raise LookupError(what)

    phrasing = rng.choice(
        [
            "I wrote down my {w} somewhere in my files but can't remember where. What is it?",
            "What's my {w}? It's saved in one of the files on my drive.",
            "Can you look up my {w}? I noted it in a text file on my drive at some point.",
        ]
    )
    return TaskInstance(phrasing.format(w=what), oracle, answer=code)


def files_photos_by_year(world: World, rng: random.Random) -> TaskInstance:
    uploads = "/Photos/Camera Uploads"
    in_uploads = [r for r in drive(world) if parent_of(r["path"]) == uploads]
    years = sorted({name_of(r["path"])[4:8] for r in in_uploads})
    year = rng.choice([y for y in years[:-1] if sum(name_of(r["path"])[4:8] == y for r in in_uploads) >= 2])
    target = rng.choice(["/Photos/{y}", "/Photos/{y} photos", "/Photos/Archive/{y}"]).format(y=year)
    photos = [r for r in in_uploads if name_of(r["path"]).startswith(f"IMG_{year}")]
    new_folders = ["/Photos/Archive", target] if target.startswith("/Photos/Archive") else [target]

    def oracle(c: OracleClient) -> None:
        token = c.login("files")
        mine = [
            r
            for r in c.pages("files", "list_dir", access_token=token, path=uploads)
            if r["name"].startswith(f"IMG_{year}")
        ]
        c.call("files", "make_dir", access_token=token, path=target)
        for r in mine:
            c.call("files", "move", access_token=token, source=r["path"], destination=f"{target}/{r['name']}")

    return TaskInstance(
        f"Photos in {uploads} are named IMG_<date>_<time>.jpg. Move every photo taken in {year} from there into "
        f"a new folder {target}.",
        oracle,
        [added("files", "files", path=p, kind="folder") for p in new_folders]
        + [updated("files", "files", r["id"], path=f"{target}/{name_of(r['path'])}") for r in photos],
    )


def files_backup_folder(world: World, rng: random.Random) -> TaskInstance:
    source = rng.choice(["/Documents/Taxes", "/Documents/Work", "/Documents/Medical", "/Notes"])
    dest = rng.choice(["/Backups/{n}", "/Backups/{n} 2025-06-02", "/Backups/{n} copy"]).format(n=name_of(source))
    inside = [r for r in drive(world) if r["path"].startswith(source + "/")]

    def oracle(c: OracleClient) -> None:
        token = c.login("files")
        c.call("files", "make_dir", access_token=token, path="/Backups")
        c.call("files", "copy", access_token=token, source=source, destination=dest)

    return TaskInstance(
        f"Back up my folder {source}: copy it, with everything in it, to {dest}. Leave the original where it is.",
        oracle,
        [added("files", "files", path="/Backups", kind="folder"), added("files", "files", path=dest, kind="folder")]
        + [
            added(
                "files",
                "files",
                path=dest + r["path"][len(source) :],
                kind=r["kind"],
                content=r["content"],
                size_bytes=r["size_bytes"],
            )
            for r in inside
        ],
    )


def receipt_total(text: str) -> float:
    line = next(li for li in text.splitlines() if li.startswith("Total"))
    return money(line[len("Total") :])


def files_receipts_total(world: World, rng: random.Random) -> TaskInstance:
    receipts = [r for r in drive(world) if parent_of(r["path"]) == "/Receipts"]
    by_month: dict[str, list[dict[str, Any]]] = {}
    by_store: dict[str, list[dict[str, Any]]] = {}
    for r in receipts:
        by_month.setdefault(name_of(r["path"])[:7], []).append(r)
        by_store.setdefault(name_of(r["path"])[11:-4], []).append(r)
    kind = rng.choice(["month", "store", "since"])
    since = store = month = ""
    if kind == "month":
        month = rng.choice(sorted(m for m, rows in by_month.items() if len(rows) >= 3))
        chosen = by_month[month]
        when = f"in {MONTHS[int(month[5:]) - 1]} {month[:4]}"
    elif kind == "store":
        store = rng.choice(sorted(s for s, rows in by_store.items() if len(rows) >= 2))
        chosen = by_store[store]
        when = f"at {store} altogether"
    else:
        since_day = world.now.date() - timedelta(days=rng.randint(20, 45))
        since = since_day.isoformat()
        chosen = [r for r in receipts if name_of(r["path"])[:10] >= since]
        when = f"since {MONTHS[since_day.month - 1]} {since_day.day} (that day included)"
    total = round(sum(receipt_total(r["content"]) for r in chosen), 2)

    def wanted(name: str) -> bool:
        if kind == "month":
            return name.startswith(month)
        if kind == "store":
            return name[11:-4] == store
        return name[:10] >= since

    def oracle(c: OracleClient) -> float:
        token = c.login("files")
        names = [r["name"] for r in c.pages("files", "list_dir", access_token=token, path="/Receipts")]
        mine = [n for n in names if wanted(n)]
        texts = [c.call("files", "read_file", access_token=token, path=f"/Receipts/{n}")["content"] for n in mine]
        return round(sum(receipt_total(t) for t in texts), 2)

    return TaskInstance(
        f"Going by the receipts in my /Receipts folder, how much did I spend {when}? Add up the totals "
        "(tax included) and give the amount in dollars.",
        oracle,
        answer=total,
    )


CHECKLISTS = {
    "Moving": (
        "Book the movers",
        "Cancel the internet contract",
        "Forward my mail",
        "Pack the kitchen",
        "Return the old keys",
    ),
    "Wedding": ("Order the flowers", "Send the invitations", "Book the photographer", "Taste the cake options"),
    "Trip to Japan": ("Buy the rail pass", "Book the Kyoto ryokan", "Get travel insurance", "Order yen at the bank"),
    "Baby shower": ("Reserve the room", "Order the cake", "Make the playlist", "Buy the decorations"),
}


def files_checklist_to_todo(world: World, rng: random.Random) -> TaskInstance:
    event = rng.choice(sorted(CHECKLISTS))
    items = rng.sample(CHECKLISTS[event], rng.randint(3, 4))
    today = world.now.date()
    dues = sorted(rng.sample(range(4, 60), len(items)))
    lines = [(item, today + timedelta(days=d)) for item, d in zip(items, dues, strict=True)]
    path = f"/Documents/{event} checklist.txt"
    plant_file(
        world,
        path,
        f"{event} checklist\n\n" + "\n".join(f"- {item} (by {d:%B} {d.day})" for item, d in lines),
        days=rng.uniform(1, 6),
    )
    project = rng.choice(["{e}", "{e} prep", "{e} to-dos"]).format(e=event)
    new_project_id = max(int(k) for k in world.state["todo"]["projects"]) + 1

    def oracle(c: OracleClient) -> None:
        ftoken = c.login("files")
        text = c.call("files", "read_file", access_token=ftoken, path=path)["content"]
        ttoken = c.login("todo")
        pid = c.call("todo", "create_project", access_token=ttoken, name=project)["project_id"]
        for line in text.splitlines():
            m = re.fullmatch(r"- (.+) \(by (\w+) (\d+)\)", line.strip())
            if m:
                due = datetime.strptime(f"{m[2]} {m[3]} {today.year}", "%B %d %Y").date()
                c.call("todo", "add_task", access_token=ttoken, title=m[1], project_id=pid, due_date=due.isoformat())

    return TaskInstance(
        f"Turn my checklist {path} into to-dos: create a todo project called '{project}' and add one task per "
        "item, titled exactly as in the file and due on the date written next to it.",
        oracle,
        [added("todo", "projects", name=project)]
        + [
            added("todo", "tasks", title=item, due_date=d.isoformat(), project_id=new_project_id, status="open")
            for item, d in lines
        ],
    )


SCENARIOS = [
    Scenario("files_read_tax_figure", 1, ("files",), "test_challenge", files_read_tax_figure),
    Scenario("files_create_text_file", 1, ("files",), "test_challenge", files_create_text_file),
    Scenario("files_rename_photo", 1, ("files",), "test_normal", files_rename_photo),
    Scenario("files_append_line", 2, ("files",), "test_challenge", files_append_line),
    Scenario("files_delete_leftovers", 2, ("files",), "dev", files_delete_leftovers),
    Scenario("files_find_secret", 2, ("files",), "test_challenge", files_find_secret),
    Scenario("files_photos_by_year", 2, ("files",), "test_challenge", files_photos_by_year),
    Scenario("files_backup_folder", 2, ("files",), "test_challenge", files_backup_folder),
    Scenario("files_receipts_total", 3, ("files",), "test_challenge", files_receipts_total),
    Scenario("files_checklist_to_todo", 3, ("files", "todo"), "test_challenge", files_checklist_to_todo),
]
