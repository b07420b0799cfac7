import pytest

from agentloop.apps.base import ApiError
from agentloop.apps.builtin import APPS, BUILTIN
from agentloop.apps.builtin.apps import files
from agentloop.apps.builtin.people import make_world_data
from agentloop.apps.evaluation import diff_states


@pytest.fixture
def world():
    return BUILTIN.new_world(21, ["files"])


@pytest.fixture
def call(world):
    """Call a files API as the logged-in supervisor."""
    email = world.state["supervisor"]["profile"]["1"]["email"]
    password = world.state["supervisor"]["accounts"]["files"]["password"]
    token = world.call("files", "login", {"username": email, "password": password})["access_token"]
    return lambda api, **args: world.call("files", api, {"access_token": token, **args})


def paths(world):
    return {r["path"] for r in world.state["files"]["files"].values()}


def status_of(call, api, **args):
    with pytest.raises(ApiError) as exc:
        call(api, **args)
    return exc.value.status, exc.value.message


def test_drive_is_deterministic_and_every_parent_folder_exists():
    state = files.build_state(make_world_data(4))
    assert state == files.build_state(make_world_data(4))
    rows = state["files"].values()
    folders = {r["path"] for r in rows if r["kind"] == "folder"}
    assert all(files.parent_of(r["path"]) in folders | {"/"} for r in rows)
    assert len({r["path"] for r in rows}) == len(rows)
    texts = [r for r in rows if r["content"] is not None]
    assert all(r["size_bytes"] == len(r["content"].encode()) for r in texts)


def test_list_dir_pages_through_a_big_folder(world, call):
    receipts = [p for p in paths(world) if p.startswith("/Receipts/")]
    assert len(receipts) > 20
    seen, page = [], 0
    while batch := call("list_dir", path="/Receipts", page_index=page, page_limit=20):
        seen.extend(e["path"] for e in batch)
        page += 1
    assert sorted(seen) == sorted(receipts) and len(seen) == len(set(seen)) and page == 2
    newest = call("list_dir", path="/Receipts", sort_by="modified", page_limit=5)
    stamps = [e["modified_at"] for e in newest]
    assert stamps == sorted(stamps, reverse=True)


def test_list_dir_root_and_errors(call):
    top = call("list_dir", page_limit=20)
    assert [e["name"] for e in top][:2] == ["Documents", "Downloads"] and all(e["kind"] == "folder" for e in top)
    assert status_of(call, "list_dir", path="/Nope")[0] == 404
    status, message = status_of(call, "list_dir", path="/Documents/Resume.txt")
    assert status == 422 and "read_file" in message
    status, message = status_of(call, "list_dir", path="Documents")
    assert status == 422 and "root" in message
    assert status_of(call, "list_dir", path="/Documents/../Photos")[0] == 422


def test_read_file_text_only_and_case_insensitive(world, call):
    got = call("read_file", path="/documents//RESUME.TXT")
    assert got["path"] == "/Documents/Resume.txt" and "Experience" in got["content"]
    status, message = status_of(call, "read_file", path="/Documents/Medical/Insurance card.jpg")
    assert status == 422 and "file_info" in message
    assert status_of(call, "read_file", path="/Documents")[0] == 422
    status, message = status_of(call, "read_file", path="/Documents/nothing.txt")
    assert status == 404 and "list_dir on /Documents" in message


def test_reading_is_not_a_change(world, call):
    before = world.copy_state()
    call("read_file", path="/Notes/Ideas.txt")
    assert world.state != before  # last_opened_at moved...
    assert diff_states(before, world.state, {"files": APPS["files"].volatile_fields}) == []  # ...but it is volatile


def test_write_file_creates_and_overwrites(world, call):
    created = call("write_file", path="/Notes/New.txt", content="hello")
    assert created["created"] and world.state["files"]["files"][str(created["file_id"])]["content"] == "hello"
    status, message = status_of(call, "write_file", path="/notes/new.TXT", content="again")
    assert status == 409 and "overwrite=true" in message
    replaced = call("write_file", path="/Notes/New.txt", content="hello again", overwrite=True)
    record = world.state["files"]["files"][str(created["file_id"])]
    assert not replaced["created"] and record["content"] == "hello again" and record["size_bytes"] == 11
    status, message = status_of(call, "write_file", path="/Nowhere/a.txt", content="x")
    assert status == 404 and "make_dir" in message
    assert status_of(call, "write_file", path="/Notes/photo.jpg", content="x")[0] == 422
    assert status_of(call, "write_file", path="/Notes", content="x", overwrite=True)[0] == 422  # no text extension
    call("make_dir", path="/Notes/Odd.txt")
    status, message = status_of(call, "write_file", path="/Notes/Odd.txt", content="x", overwrite=True)
    assert status == 409 and "is a folder" in message


def test_make_dir_creates_missing_parents(world, call):
    made = call("make_dir", path="/Projects/2025/Garden")
    assert made["created_folders"] == ["/Projects", "/Projects/2025", "/Projects/2025/Garden"]
    assert status_of(call, "make_dir", path="/projects")[0] == 409
    assert status_of(call, "make_dir", path="/Documents/Resume.txt/sub")[0] == 409


def test_move_takes_a_folder_with_everything_inside(world, call):
    inside = sorted(p for p in paths(world) if p.startswith("/Documents/Taxes/"))
    moved = call("move", source="/Documents/Taxes", destination="/Archive Taxes")
    assert moved["moved"] == len(inside) + 1
    assert sorted(p for p in paths(world) if p.startswith("/Archive Taxes/")) == [
        p.replace("/Documents/Taxes", "/Archive Taxes") for p in inside
    ]
    assert not any(p.startswith("/Documents/Taxes") for p in paths(world))
    call("move", source="/Archive Taxes", destination="/archive taxes")  # a case-only rename is fine
    assert status_of(call, "move", source="/Notes", destination="/Notes/Inner")[0] == 422
    assert status_of(call, "move", source="/Notes/Ideas.txt", destination="/Documents/Resume.txt")[0] == 409
    assert status_of(call, "move", source="/Notes/Ideas.txt", destination="/Missing/Ideas.txt")[0] == 404
    assert status_of(call, "move", source="/", destination="/x")[0] == 403


def test_copy_duplicates_content_and_keeps_the_original(world, call):
    before = {r["path"]: r["content"] for r in world.state["files"]["files"].values()}
    copied = call("copy", source="/Notes", destination="/Notes backup")
    after = {r["path"]: r["content"] for r in world.state["files"]["files"].values()}
    originals = {p: c for p, c in before.items() if p.startswith("/Notes/")}
    assert copied["copied"] == len(originals) + 1
    assert all(after[p.replace("/Notes/", "/Notes backup/")] == c for p, c in originals.items())
    assert all(after[p] == c for p, c in before.items())
    assert status_of(call, "copy", source="/Notes", destination="/Notes backup")[0] == 409
    assert status_of(call, "copy", source="/Notes", destination="/Notes/copy")[0] == 422


def test_delete_needs_recursive_for_a_full_folder(world, call):
    count = sum(p.startswith("/Downloads/") for p in paths(world))
    status, message = status_of(call, "delete", path="/Downloads")
    assert status == 409 and "recursive=true" in message and "/Downloads" in paths(world)
    assert call("delete", path="/Downloads", recursive=True)["deleted"] == count + 1
    assert not any(p.startswith("/Downloads") for p in paths(world))
    assert status_of(call, "delete", path="/")[0] == 403
    assert status_of(call, "delete", path="/Downloads")[0] == 404


def test_search_finds_names_before_content_and_respects_the_folder(world, call):
    hits = call("search_files", query="tax", page_limit=20)
    kinds = [h["matched_in"] for h in hits]
    assert kinds == sorted(kinds, key=lambda k: k != "name") and "content" in kinds
    assert any(h["path"] == "/Documents/Taxes" for h in hits)
    scoped = call("search_files", query="total", path="/Receipts", page_limit=20)
    assert scoped and all(h["path"].startswith("/Receipts/") for h in scoped)
    assert all(h["kind"] == "folder" for h in call("search_files", query="o", kind="folder", page_limit=20))
    assert status_of(call, "search_files", query="x", path="/Nope")[0] == 404


def test_file_info(call):
    info = call("file_info", path="/Documents/Taxes")
    assert info["kind"] == "folder" and info["item_count"] == 4
    photo = call("file_info", path="/Documents/Medical/Insurance card.jpg")
    assert photo["mime_type"] == "image/jpeg" and photo["size_bytes"] > 0 and "content" not in photo


def test_files_scenarios_are_never_training_tasks_and_vary():
    tasks = [t for t in BUILTIN.tasks() if t.scenario_id.startswith("files_")]
    assert tasks and all(t.split != "train" for t in tasks)
    by_scenario: dict[str, set[str]] = {}
    for t in tasks:
        by_scenario.setdefault(t.scenario_id, set()).add(t.instruction)
    assert all(len(instructions) == 3 for instructions in by_scenario.values()), by_scenario
