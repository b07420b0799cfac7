"""Files: a cloud drive with folders, text documents, photos and receipts, addressed by path.

Every file and folder is one record with an integer id and a `path` (case-preserving; looked up
case-insensitively, as most cloud drives do). The root folder "/" is implicit.
"""

from __future__ import annotations

import random
from datetime import date, timedelta
from typing import Any

from agentloop.apps.base import (
    ApiError,
    AppSpec,
    AppState,
    CallContext,
    boolean,
    page_params,
    paginate,
    string,
)
from agentloop.apps.builtin.people import Person, WorldData, iso

TEXT_TYPES = {"txt": "text/plain", "md": "text/markdown", "csv": "text/csv", "json": "application/json"}
BINARY_TYPES = {
    "jpg": "image/jpeg",
    "png": "image/png",
    "heic": "image/heic",
    "pdf": "application/pdf",
    "zip": "application/zip",
    "dmg": "application/x-apple-diskimage",
    "mp4": "video/mp4",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}

STORES = {
    "Whole Foods": [
        ("Organic milk", 4.29),
        ("Sourdough bread", 5.49),
        ("Baby spinach", 3.99),
        ("Free-range eggs", 6.19),
        ("Greek yogurt", 5.79),
        ("Avocados (3)", 4.50),
        ("Salmon fillet", 12.87),
        ("Blueberries", 4.99),
    ],
    "Trader Joe's": [
        ("Mandarin orange chicken", 4.99),
        ("Everything bagel seasoning", 2.49),
        ("Frozen dumplings", 3.99),
        ("Bananas", 1.14),
        ("Cold brew coffee", 5.99),
        ("Hummus", 3.49),
        ("Flowers", 5.99),
    ],
    "Target": [
        ("Paper towels", 11.99),
        ("Laundry detergent", 13.49),
        ("Phone charger", 19.99),
        ("Storage bins (2)", 16.00),
        ("Toothpaste", 3.79),
        ("Candles", 8.00),
    ],
    "CVS Pharmacy": [("Allergy tablets", 14.99), ("Band-aids", 4.49), ("Vitamin D", 9.99), ("Sunscreen", 11.49)],
    "Shell": [("Unleaded fuel", 48.12), ("Car wash", 12.00), ("Windshield fluid", 5.99)],
    "Home Depot": [
        ("Light bulbs (4)", 9.97),
        ("Painter's tape", 6.48),
        ("Wood screws", 7.26),
        ("Extension cord", 14.98),
    ],
    "Barnes & Noble": [("Paperback novel", 17.99), ("Notebook", 12.95), ("Greeting card", 5.99), ("Magazine", 8.99)],
    "Blue Bottle Coffee": [("Latte", 5.75), ("Croissant", 4.25), ("Whole bean coffee", 22.00)],
}
TAX_RATE = 0.0825
SHOPPING = (
    "milk",
    "eggs",
    "coffee filters",
    "dish soap",
    "bananas",
    "rice",
    "olive oil",
    "tomatoes",
    "cheddar",
    "oats",
)
PACKING = ("passport", "phone charger", "sunglasses", "rain jacket", "toothbrush", "book for the flight", "adapter")
IDEAS = (
    "Start a small herb garden on the balcony.",
    "Learn to make fresh pasta.",
    "Plan a weekend hike with the neighbors.",
    "Try the pottery class downtown.",
    "Write down three good things every evening.",
    "Sell the old bike before winter.",
)
QUOTES = (
    '"A reader lives a thousand lives before he dies." - George R. R. Martin',
    '"We read to know we are not alone." - C. S. Lewis',
    '"There is no friend as loyal as a book." - Ernest Hemingway',
    '"Until I feared I would lose it, I never loved to read." - Harper Lee',
)
TRIPS = ("Lisbon", "Kyoto", "Vancouver", "Oaxaca", "Edinburgh", "Reykjavik")
EMPLOYERS = ("Northwind Analytics", "Bluepeak Software", "Harbor & Lane Design", "Cedar Health Partners")


def mime_type(path: str) -> str:
    ext = path.rsplit(".", 1)[-1].casefold() if "." in path.rsplit("/", 1)[-1] else ""
    return TEXT_TYPES.get(ext) or BINARY_TYPES.get(ext) or "application/octet-stream"


def is_text_path(path: str) -> bool:
    return mime_type(path) in TEXT_TYPES.values()


class _Drive:
    """Collects the records of the initial drive, creating parent folders as needed."""

    def __init__(self, data: WorldData, rng: random.Random) -> None:
        self.data, self.rng = data, rng
        self.rows: dict[str, dict[str, Any]] = {}
        self.paths: set[str] = set()

    def _record(self, path: str, kind: str, content: str | None, size: int | None, when: str) -> None:
        rid = len(self.rows) + 1
        self.rows[str(rid)] = {
            "id": rid,
            "path": path,
            "kind": kind,
            "mime_type": None if kind == "folder" else mime_type(path),
            "content": content,
            "size_bytes": size,
            "created_at": when,
            "modified_at": when,
            "last_opened_at": None,
        }
        self.paths.add(path)

    def folder(self, path: str, days: float) -> None:
        parent = path.rsplit("/", 1)[0]
        if parent and parent not in self.paths:
            self.folder(parent, days + 30)
        if path not in self.paths:
            self._record(path, "folder", None, None, self.data.ago(days=days))

    def file(self, path: str, content: str | None = None, days: float | None = None, when: str | None = None) -> None:
        if path in self.paths:  # e.g. two relatives with the same first name
            return
        when = when or self.data.ago(days=self.rng.uniform(1, 500) if days is None else days)
        self.folder(path.rsplit("/", 1)[0], 700)
        size = len(content.encode()) if content is not None else self.rng.randint(40_000, 6_000_000)
        self._record(path, "file", content, size, when)


def _money(x: float) -> str:
    return f"${x:,.2f}"


def _tax_summary(rng: random.Random, year: int, employer: str, name: str) -> tuple[str, date]:
    """The text of a year's tax summary, and the day it was filed."""
    wages = rng.randint(6_200_000, 12_500_000) / 100
    interest = rng.randint(2_000, 90_000) / 100
    donations = rng.randint(10, 60) * 25.0
    deduction = 14_600.0 if year == 2024 else 13_850.0
    taxable = round(wages + interest - deduction, 2)
    tax = round(taxable * rng.uniform(0.12, 0.16), 2)
    refund = rng.randint(200, 2_800) + rng.choice((0.0, 0.5, 0.25))
    filed = date(year + 1, rng.randint(2, 4), rng.randint(1, 28))
    text = "\n".join(
        [
            f"Tax year {year} - federal return summary",
            f"Taxpayer: {name}",
            "Filing status: Single",
            f"Wages (W-2, {employer}): {_money(wages)}",
            f"Interest income: {_money(interest)}",
            f"Charitable donations: {_money(donations)}",
            f"Standard deduction: {_money(deduction)}",
            f"Taxable income: {_money(taxable)}",
            f"Total tax: {_money(tax)}",
            f"Federal tax withheld: {_money(tax + refund)}",
            f"Refund: {_money(refund)}",
            f"Filed on {filed.isoformat()}.",
        ]
    )
    return text, filed


def receipt_text(store: str, date: str, items: list[tuple[str, float]]) -> str:
    subtotal = round(sum(p for _, p in items), 2)
    tax = round(subtotal * TAX_RATE, 2)
    lines = [store, f"Date: {date}", ""] + [f"{name:<28}{_money(price):>10}" for name, price in items]
    lines += ["", f"{'Subtotal':<28}{_money(subtotal):>10}", f"{'Tax':<28}{_money(tax):>10}"]
    lines += [f"{'Total':<28}{_money(round(subtotal + tax, 2)):>10}", "", "Thank you for shopping with us!"]
    return "\n".join(lines)


def _contact_lines(people: list[Person]) -> str:
    return "\n".join(f"{p.name} - {p.email} - {p.phone}" for p in people)


def build_state(data: WorldData) -> AppState:
    rng = data.rng("files")
    me = data.supervisor
    drive = _Drive(data, rng)
    by_rel: dict[str, list[Person]] = {}
    for p in data.people:
        by_rel.setdefault(p.relationship, []).append(p)
    coworkers = (by_rel.get("coworker", []) + by_rel.get("manager", []))[:6] or data.people[:4]
    friends = (by_rel.get("friend", []) + by_rel.get("classmate", []))[:8] or data.people[:6]
    employer = rng.choice(EMPLOYERS)

    for year in (2023, 2024):
        text, filed = _tax_summary(rng, year, employer, me.name)
        drive.file(f"/Documents/Taxes/{year} tax summary.txt", text, days=(data.now.date() - filed).days)
    drive.file("/Documents/Taxes/W-2 2024.pdf", days=rng.randint(100, 130))
    drive.file("/Documents/Taxes/1099-INT 2024.pdf", days=rng.randint(100, 130))
    manager = next((p for p in coworkers if p.relationship == "manager"), coworkers[0])
    drive.file(
        "/Documents/Work/Q2 goals.txt",
        f"Q2 goals ({employer})\n1. Ship the reporting dashboard by June 20.\n2. Mentor {coworkers[-1].first_name} "
        f"on the data pipeline.\n3. Cut cloud costs by 10%.\nReviewed with {manager.name}.",
        days=rng.randint(40, 70),
    )
    drive.file("/Documents/Work/Team contacts.txt", _contact_lines(coworkers), days=rng.randint(20, 200))
    drive.file(
        "/Documents/Work/Offsite agenda.txt",
        "Team offsite\n09:30 Coffee\n10:00 Roadmap review\n12:30 Lunch\n14:00 Workshops\n16:30 Wrap-up\n"
        f"Organiser: {coworkers[0].name}",
        days=rng.randint(5, 40),
    )
    drive.file("/Documents/Work/Performance review 2024.docx", days=rng.randint(150, 200))
    drive.file("/Documents/Home/Lease agreement.pdf", days=rng.randint(300, 600))
    drive.file(
        "/Documents/Home/Utility accounts.txt",
        f"Electricity: City Power, account {rng.randint(10**7, 10**8)}\n"
        f"Internet: FiberNet, account {rng.randint(10**7, 10**8)}\n"
        f"Water: billed with rent, ask {rng.choice(data.people).first_name} (landlord's office)",
    )
    drive.file(
        "/Documents/Medical/Vaccination record.txt",
        f"{me.name}\nTetanus booster: 2021-03-14\nFlu shot: 2024-10-{rng.randint(10, 28)}\n"
        f"COVID-19 booster: 2024-09-{rng.randint(10, 28)}",
    )
    drive.file("/Documents/Medical/Insurance card.jpg")
    drive.file(
        "/Documents/Resume.txt",
        f"{me.name}\n{me.email} | {me.phone} | {me.city}\n\nExperience\n- {employer}, analyst (2021-present)\n"
        "- Freelance data consulting (2018-2021)\n\nSkills: SQL, Python, dashboards, stakeholder interviews",
        days=rng.randint(30, 300),
    )

    for _ in range(rng.randint(22, 30)):
        taken = data.now - timedelta(days=rng.uniform(3, 880))
        drive.file(f"/Photos/Camera Uploads/IMG_{taken:%Y%m%d_%H%M%S}.jpg", when=iso(taken + timedelta(minutes=5)))
    trip = rng.choice(TRIPS)
    trip_day = rng.randint(200, 400)
    for n in rng.sample(range(1000, 9999), rng.randint(5, 8)):
        drive.file(f"/Photos/Trip to {trip}/IMG_{n}.jpg", days=trip_day)
    family = by_rel.get("family", [])
    for p in rng.sample(family if len(family) >= 2 else data.people, 2):  # a person with one relative too
        drive.file(f"/Photos/Family/{p.first_name} birthday.jpg")

    receipt_days = rng.sample(range(2, 125), rng.randint(22, 28))
    for days in sorted(receipt_days, reverse=True):
        store = rng.choice(list(STORES))
        items = rng.sample(STORES[store], rng.randint(1, min(4, len(STORES[store]))))
        date = (data.now - timedelta(days=days)).date().isoformat()
        drive.file(f"/Receipts/{date} {store}.txt", receipt_text(store, date, items), days=days - 0.3)

    drive.file("/Notes/Shopping list.txt", "\n".join(rng.sample(SHOPPING, 5)), days=rng.uniform(1, 9))
    drive.file("/Notes/Ideas.txt", "\n".join(f"- {i}" for i in rng.sample(IDEAS, 4)))
    drive.file("/Notes/Book quotes.txt", "\n\n".join(rng.sample(QUOTES, 3)))
    drive.file("/Notes/Packing list.txt", "\n".join(f"[ ] {i}" for i in rng.sample(PACKING, 6)))
    gifts = rng.sample(friends, min(3, len(friends)))
    drive.file(
        "/Notes/Gift ideas.txt",
        "\n".join(f"{p.name}: {rng.choice(['a cookbook', 'concert tickets', 'a plant', 'a scarf'])}" for p in gifts),
    )
    drive.file("/Downloads/bank-statement-2025-04.pdf", days=rng.randint(20, 35))
    drive.file("/Downloads/photos-export.zip", days=rng.randint(5, 60))
    drive.file("/Downloads/Installer-3.2.1.dmg", days=rng.randint(5, 200))
    drive.file("/Downloads/~upload-3f9a.tmp", "", days=rng.randint(1, 30))
    club = rng.sample(friends, min(4, len(friends)))
    drive.file(
        "/Shared/Book club/Schedule 2025.txt",
        "\n".join(
            f"2025-{month:02d}-{rng.randint(3, 27):02d}  hosted by {p.name}"
            for month, p in zip(range(6, 6 + len(club)), club, strict=False)
        ),
        days=rng.randint(20, 150),
    )
    return {"files": drive.rows, "_sessions": {}}


app = AppSpec(
    name="files",
    description="Your cloud drive: browse folders, read and write text files, move, copy, delete and search.",
    build_state=build_state,
    volatile_fields=frozenset({"last_opened_at"}),  # set by read_file: reading is not a change
)

ENTRY = "{file_id, name, path, kind, size_bytes, modified_at}"


# --- paths ------------------------------------------------------------------------------------


def normalise_path(path: str) -> str:
    """'/Documents//Taxes/' -> '/Documents/Taxes'; relative paths and '.'/'..' are refused."""
    path = path.strip()
    if not path.startswith("/"):
        raise ApiError(422, f"Paths start at the root folder, like /Documents/notes.txt; got {path!r}.")
    parts = [p for p in path.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ApiError(422, f"Paths cannot contain '.' or '..'; give the full path from the root, got {path!r}.")
    return "/" + "/".join(p.strip() for p in parts)


def parent_of(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


def name_of(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _is_under(path: str, folder: str) -> bool:
    """Whether `path` lies inside `folder` (case-insensitively), at any depth."""
    folder = folder.casefold().rstrip("/")
    return path.casefold().startswith(folder + "/")


def _lookup(ctx: CallContext, path: str) -> dict[str, Any] | None:
    key = path.casefold()
    return next((r for r in ctx.table("files").values() if r["path"].casefold() == key), None)


def _existing(ctx: CallContext, path: str) -> dict[str, Any]:
    record = _lookup(ctx, path)
    if record is None:
        raise ApiError(404, f"Nothing at {path}. Use list_dir on {parent_of(path)} to see what is there.")
    return record


def _require_folder(ctx: CallContext, path: str) -> None:
    if path == "/":
        return
    record = _lookup(ctx, path)
    if record is None:
        raise ApiError(404, f"Folder {path} does not exist. Create it first with make_dir.")
    if record["kind"] != "folder":
        raise ApiError(422, f"{path} is a file, not a folder.")


def _children(ctx: CallContext, folder: str) -> list[dict[str, Any]]:
    key = folder.casefold()
    return [r for r in ctx.table("files").values() if parent_of(r["path"]).casefold() == key]


def _descendants(ctx: CallContext, folder: str) -> list[dict[str, Any]]:
    return [r for r in ctx.table("files").values() if _is_under(r["path"], folder)]


def _entry(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "file_id": record["id"],
        "name": name_of(record["path"]),
        "path": record["path"],
        "kind": record["kind"],
        "size_bytes": record["size_bytes"],
        "modified_at": record["modified_at"],
    }


def _check_destination(ctx: CallContext, src: dict[str, Any], dst: str, verb: str) -> None:
    if dst == "/":
        raise ApiError(422, f"Give the full new path to {verb} to, e.g. /Archive/{name_of(src['path'])}.")
    clash = _lookup(ctx, dst)
    if clash is not None and clash["id"] != src["id"]:
        raise ApiError(409, f"{clash['path']} already exists; choose another name or delete it first.")
    if src["kind"] == "folder" and _is_under(dst, src["path"]):
        raise ApiError(422, f"Cannot {verb} the folder {src['path']} into itself.")
    _require_folder(ctx, parent_of(dst))


# --- APIs ---------------------------------------------------------------------------------------


@app.api(
    "List what is directly inside a folder. Folders come first when sorted by name.",
    params={
        "path": string("The folder, e.g. / or /Documents/Taxes.", default="/"),
        "sort_by": string(
            "name (A-Z), modified (newest first) or size (largest first).",
            enum=["name", "modified", "size"],
            default="name",
        ),
        **page_params(),
    },
    returns=f"[{ENTRY}]",
)
def list_dir(ctx: CallContext, path: str, sort_by: str, page_index: int, page_limit: int) -> list[dict[str, Any]]:
    path = normalise_path(path)
    if path != "/":
        record = _existing(ctx, path)
        if record["kind"] != "folder":
            raise ApiError(422, f"{record['path']} is a file, not a folder; use read_file or file_info on it.")
        path = record["path"]
    rows = _children(ctx, path)
    if sort_by == "modified":
        rows.sort(key=lambda r: (r["modified_at"], r["path"]), reverse=True)
    elif sort_by == "size":
        rows.sort(key=lambda r: (-(r["size_bytes"] or 0), r["path"].casefold()))
    else:
        rows.sort(key=lambda r: (r["kind"] != "folder", r["path"].casefold()))
    return [_entry(r) for r in paginate(rows, page_index, page_limit)]


@app.api(
    "Read a text file (.txt, .md, .csv, .json). Photos, PDFs and other binary files cannot be read; use file_info.",
    params={"path": string("Path of the file, e.g. /Notes/Ideas.txt.")},
    required=["path"],
    returns="{file_id, path, content, size_bytes, modified_at}",
)
def read_file(ctx: CallContext, path: str) -> dict[str, Any]:
    record = _existing(ctx, normalise_path(path))
    if record["kind"] == "folder":
        raise ApiError(422, f"{record['path']} is a folder; use list_dir to see what is in it.")
    if record["content"] is None:
        raise ApiError(
            422, f"{record['path']} is a {record['mime_type']} file, not text; use file_info to see its details."
        )
    record["last_opened_at"] = iso(ctx.now)
    return {
        "file_id": record["id"],
        "path": record["path"],
        "content": record["content"],
        "size_bytes": record["size_bytes"],
        "modified_at": record["modified_at"],
    }


@app.api(
    "Save text to a file (.txt, .md, .csv or .json). Creates the file if it does not exist; replacing an "
    "existing file's content needs overwrite=true. The folder must exist (see make_dir).",
    params={
        "path": string("Path of the file, e.g. /Notes/Plans.txt."),
        "content": string("The full text of the file."),
        "overwrite": boolean("Replace the content if the file already exists.", default=False),
    },
    required=["path", "content"],
    returns="{file_id, path, size_bytes, created}",
)
def write_file(ctx: CallContext, path: str, content: str, overwrite: bool) -> dict[str, Any]:
    path = normalise_path(path)
    if path == "/" or not is_text_path(path):
        raise ApiError(
            422, f"write_file saves text: give a file name ending in .txt, .md, .csv or .json (got {path!r})."
        )
    now = iso(ctx.now)
    record = _lookup(ctx, path)
    if record is not None:
        if record["kind"] == "folder":
            raise ApiError(409, f"{record['path']} is a folder; choose a file name inside it.")
        if not overwrite:
            raise ApiError(409, f"{record['path']} already exists; pass overwrite=true to replace its content.")
        record.update(content=content, size_bytes=len(content.encode()), modified_at=now)
        return {"file_id": record["id"], "path": record["path"], "size_bytes": record["size_bytes"], "created": False}
    _require_folder(ctx, parent_of(path))
    record = ctx.insert(
        "files",
        {
            "path": path,
            "kind": "file",
            "mime_type": mime_type(path),
            "content": content,
            "size_bytes": len(content.encode()),
            "created_at": now,
            "modified_at": now,
            "last_opened_at": None,
        },
    )
    return {"file_id": record["id"], "path": path, "size_bytes": record["size_bytes"], "created": True}


@app.api(
    "Create a folder, and any missing folders above it (like `mkdir -p`).",
    params={"path": string("Path of the new folder, e.g. /Photos/2024.")},
    required=["path"],
    returns="{file_id, path, created_folders: [path]}",
)
def make_dir(ctx: CallContext, path: str) -> dict[str, Any]:
    path = normalise_path(path)
    existing = _lookup(ctx, path) if path != "/" else {"path": "/"}
    if existing is not None:
        raise ApiError(409, f"{existing['path']} already exists.")
    parts = path.strip("/").split("/")
    created: list[str] = []
    record: dict[str, Any] = {}
    for depth in range(1, len(parts) + 1):
        sub = "/" + "/".join(parts[:depth])
        found = _lookup(ctx, sub)
        if found is not None:
            if found["kind"] != "folder":
                raise ApiError(409, f"{found['path']} is a file, so it cannot hold folders.")
            continue
        now = iso(ctx.now)
        record = ctx.insert(
            "files",
            {
                "path": sub,
                "kind": "folder",
                "mime_type": None,
                "content": None,
                "size_bytes": None,
                "created_at": now,
                "modified_at": now,
                "last_opened_at": None,
            },
        )
        created.append(sub)
    return {"file_id": record["id"], "path": path, "created_folders": created}


@app.api(
    "Move or rename a file or folder (a folder moves with everything in it). `destination` is the full new "
    "path, e.g. moving /Notes/a.txt into /Archive means destination /Archive/a.txt.",
    params={
        "source": string("Current path."),
        "destination": string("New full path; its folder must exist and nothing may be there yet."),
    },
    required=["source", "destination"],
    returns="{file_id, path, moved: number of items moved}",
)
def move(ctx: CallContext, source: str, destination: str) -> dict[str, Any]:
    src_path, dst = normalise_path(source), normalise_path(destination)
    if src_path == "/":
        raise ApiError(403, "The root folder cannot be moved.")
    src = _existing(ctx, src_path)
    _check_destination(ctx, src, dst, "move")
    old = src["path"]
    items = [src, *(_descendants(ctx, old) if src["kind"] == "folder" else [])]
    for r in items:
        r["path"] = dst + r["path"][len(old) :]
    return {"file_id": src["id"], "path": dst, "moved": len(items)}


@app.api(
    "Copy a file or folder (a folder is copied with everything in it). `destination` is the full path of the copy.",
    params={
        "source": string("Path of what to copy."),
        "destination": string("Full path of the copy; its folder must exist and nothing may be there yet."),
    },
    required=["source", "destination"],
    returns="{file_id, path, copied: number of items copied}",
)
def copy(ctx: CallContext, source: str, destination: str) -> dict[str, Any]:
    src_path, dst = normalise_path(source), normalise_path(destination)
    if src_path == "/":
        raise ApiError(422, "The root folder cannot be copied; copy the folders inside it one by one.")
    src = _existing(ctx, src_path)
    if _lookup(ctx, dst) is src:
        raise ApiError(409, f"{src['path']} already exists; a copy needs another path.")
    _check_destination(ctx, src, dst, "copy")
    old = src["path"]
    items = [src, *sorted(_descendants(ctx, old) if src["kind"] == "folder" else [], key=lambda r: r["path"])]
    now = iso(ctx.now)
    first: dict[str, Any] = {}
    for r in items:
        fields = {k: v for k, v in r.items() if k != "id"}
        fields.update(path=dst + r["path"][len(old) :], created_at=now, modified_at=now, last_opened_at=None)
        added = ctx.insert("files", fields)
        first = first or added
    return {"file_id": first["id"], "path": dst, "copied": len(items)}


@app.api(
    "Delete a file, or a folder. A folder that is not empty is only deleted with recursive=true. "
    "Deleting is permanent.",
    params={
        "path": string("Path of the file or folder."),
        "recursive": boolean("Also delete everything inside a folder.", default=False),
    },
    required=["path"],
    returns="{deleted: number of items deleted}",
)
def delete(ctx: CallContext, path: str, recursive: bool) -> dict[str, Any]:
    path = normalise_path(path)
    if path == "/":
        raise ApiError(403, "The root folder cannot be deleted.")
    record = _existing(ctx, path)
    inside = _descendants(ctx, record["path"]) if record["kind"] == "folder" else []
    if inside and not recursive:
        raise ApiError(
            409,
            f"Folder {record['path']} is not empty ({len(inside)} items); pass recursive=true to delete it "
            "with everything in it.",
        )
    rows = ctx.table("files")
    for r in [record, *inside]:
        del rows[str(r["id"])]
    return {"deleted": 1 + len(inside)}


@app.api(
    "Search file and folder names and the text inside files (case-insensitive), optionally only inside one "
    "folder. Name matches come first.",
    params={
        "query": string("Text to look for.", minLength=1),
        "path": string("Only search inside this folder (at any depth).", default="/"),
        "kind": string("Only files or only folders.", enum=["file", "folder"]),
        **page_params(),
    },
    required=["query"],
    returns="[{file_id, name, path, kind, size_bytes, modified_at, matched_in: name|content}]",
)
def search_files(
    ctx: CallContext, query: str, path: str, page_index: int, page_limit: int, kind: str | None = None
) -> list[dict[str, Any]]:
    folder = normalise_path(path)
    if folder != "/":
        _require_folder(ctx, folder)
    q = query.casefold().strip()
    hits = []
    for r in ctx.table("files").values():
        if (folder != "/" and not _is_under(r["path"], folder)) or (kind and r["kind"] != kind):
            continue
        if q in name_of(r["path"]).casefold():
            hits.append((0, r))
        elif r["content"] and q in r["content"].casefold():
            hits.append((1, r))
    hits.sort(key=lambda h: (h[0], h[1]["path"].casefold()))
    return [
        {**_entry(r), "matched_in": "content" if rank else "name"} for rank, r in paginate(hits, page_index, page_limit)
    ]


@app.api(
    "Show the details of a file or folder: type, size, dates, and for a folder how many items it holds.",
    params={"path": string("Path of the file or folder.")},
    required=["path"],
    returns="{file_id, name, path, kind, mime_type, size_bytes, created_at, modified_at, last_opened_at, "
    "item_count (folders)}",
)
def file_info(ctx: CallContext, path: str) -> dict[str, Any]:
    path = normalise_path(path)
    if path == "/":
        return {"path": "/", "kind": "folder", "item_count": len(_children(ctx, "/"))}
    record = _existing(ctx, path)
    info = {
        "file_id": record["id"],
        "name": name_of(record["path"]),
        **{k: v for k, v in record.items() if k not in ("id", "content")},
    }
    if record["kind"] == "folder":
        info["item_count"] = len(_children(ctx, record["path"]))
    return info
