"""REST and CLI for demonstrations: oracle trajectories of built-in tasks stored with their replayed
observations; every kind of bad step refused with its index and nothing written; external apps checked
against their operations and never called; tenant isolation; paging; import/export round trips."""

import json

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from agentloop.api.app import create_app
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.tasks import run_oracle
from agentloop.cli import app as cli
from agentloop.store.db import get_sessionmaker
from agentloop.store.models import Demonstration
from tests.apps.loopback_app import API_KEY, LOOPBACK_NETWORKS, serve_loopback_app
from tests.factories import bearer, make_keys

REF = "contacts_details_note-2"  # a train task: passwords, two logins, a search, a read, a new note, complete
OTHER_REF = "contacts_phone_of-1"


@pytest.fixture
def env(db_url):
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    return TestClient(create_app()), keys


@pytest.fixture(scope="module")
def loopback():
    with serve_loopback_app() as served:
        yield served


def oracle_steps(ref: str) -> list[dict]:
    """The task's oracle solution as demonstration steps (no observations: the service replays them)."""
    return [call.to_dict() for call in run_oracle(BUILTIN.task(ref), BUILTIN.task_world(ref)).actions]


def demo_rows() -> int:
    with get_sessionmaker()() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(Demonstration))


def upload(client, key, body):
    return client.post("/v1/demonstrations", json=body, headers=bearer(key))


def with_step(steps: list[dict], index: int, args_update: dict | None = None, **change) -> list[dict]:
    """The steps with step `index` changed: fields replaced by `change`, arguments updated by `args_update`."""
    changed = [dict(step) for step in steps]
    changed[index].update(change)
    if args_update:
        changed[index]["args"] = {**changed[index]["args"], **args_update}
    return changed


def test_an_oracle_demonstration_is_stored_with_the_observations_of_its_replay(env):
    client, keys = env
    steps = oracle_steps(REF)
    steps[0]["observation"] = "made up by the client"
    resp = upload(client, keys.tenant_a_client, {"task_ref": REF, "steps": steps, "metadata": {"by": "expert"}})
    assert resp.status_code == 201, resp.text
    demo = resp.json()
    assert resp.headers["Location"] == f"/v1/demonstrations/{demo['id']}"
    assert demo["replayed"] is True and demo["task_ref"] == REF and demo["apps"] == ["contacts", "notes"]
    assert demo["instruction"] == BUILTIN.task(REF).instruction and demo["metadata"] == {"by": "expert"}
    # the first step's observation is the world's: the passwords the next step logs in with
    passwords = {row["app"]: row["password"] for row in demo["steps"][0]["observation"]}
    assert demo["steps"][1]["args"]["password"] == passwords["contacts"]
    contact = demo["steps"][3]["observation"]
    assert contact["email"] in demo["steps"][5]["args"]["body"]
    assert demo["steps"][-1] == {
        "app": "supervisor",
        "api": "complete_task",
        "args": {},
        "observation": "Task marked as complete.",
    }
    got = client.get(f"/v1/demonstrations/{demo['id']}", headers=bearer(keys.tenant_a_client))
    assert got.status_code == 200 and got.json() == demo
    # each upload replays on a fresh initial world (the note created above does not exist in the next one)
    assert upload(client, keys.tenant_a_client, {"task_ref": REF, "steps": oracle_steps(REF)}).status_code == 201
    assert demo_rows() == 2


@pytest.mark.parametrize(
    ("index", "change", "needles"),
    [
        (2, {"api": "nope"}, ["app 'contacts' has no API 'nope'", "search_contacts"]),
        (0, {"app": "wallet", "api": "show_balance"}, ["app 'wallet' is not one of this task's apps"]),
        (3, {"args_update": {"contact_id": "forty-two"}}, ["contact_id", "not of type 'integer'"]),
        (5, {"args": {"title": "x"}}, ["'access_token' is a required property"]),
        (4, {"args_update": {"colour": "red"}}, ["Unknown argument(s) colour"]),
        (1, {"args_update": {"password": "wrong"}}, ["failed when replayed", "401", "Wrong username or password"]),
        (3, {"args_update": {"contact_id": 99999}}, ["failed when replayed", "404", "No contact with id 99999"]),
    ],
    ids=[
        "unknown-api",
        "app-not-in-task",
        "bad-arg-type",
        "missing-arg",
        "unknown-arg",
        "wrong-password",
        "no-contact",
    ],
)
def test_a_bad_step_is_refused_naming_its_index_and_nothing_is_written(env, index, change, needles):
    client, keys = env
    steps = with_step(oracle_steps(REF), index, **change)
    resp = upload(client, keys.tenant_a_client, {"task_ref": REF, "steps": steps})
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_request"
    step = steps[index]
    assert error["message"].startswith(f"step {index} ({step['app']}.{step['api']}; steps count from 0): ")
    assert error["details"]["step"] == index
    for needle in needles:
        assert needle in error["message"]
    assert demo_rows() == 0


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"task_ref": REF, "steps": []}, "steps: List should have at least 1 item"),
        ({"task_ref": REF, "steps": [{"app": "supervisor", "api": "show_profile"}] * 201}, "at most 200"),
        ({"task_ref": REF, "instruction": "x", "steps": [{"app": "notes", "api": "x"}]}, "leave out"),
        ({"instruction": "x", "steps": [{"app": "notes", "api": "x"}]}, "needs `apps`"),
        ({"instruction": "x", "apps": ["bank"], "steps": [{"app": "bank", "api": "x"}]}, "unknown app(s) 'bank'"),
        ({"task_ref": "no_such_task-1", "steps": [{"app": "notes", "api": "x"}]}, "unknown task_ref"),
        ({"task_ref": REF, "steps": [{"app": "notes", "api": "x", "extra": 1}]}, "steps.0.extra"),
    ],
)
def test_bad_bodies_get_clear_errors(env, body, needle):
    client, keys = env
    resp = upload(client, keys.tenant_a_client, body)
    assert resp.status_code == 422, resp.text
    assert needle in resp.json()["error"]["message"]
    assert demo_rows() == 0


def test_a_step_whose_args_are_over_the_limit_is_refused(env, configure_env):
    client, keys = env
    configure_env(DEMONSTRATION_MAX_ARGS_BYTES=200)
    steps = oracle_steps(REF)
    steps[5]["args"]["body"] = "x" * 300
    resp = upload(client, keys.tenant_a_client, {"task_ref": REF, "steps": steps})
    assert resp.status_code == 422
    message = resp.json()["error"]["message"]
    assert message.startswith("step 5 (notes.create_note; steps count from 0)") and "over the limit of 200" in message
    assert demo_rows() == 0


def free_notes_demo(seed: int, password_seed: int) -> dict:
    """A free instruction over notes, logging in with the notes password of the world of `password_seed`."""
    world = BUILTIN.new_world(password_seed, ["notes"])
    account = world.state["supervisor"]["accounts"]["notes"]
    return {
        "instruction": "How many notes do I have on the first page?",
        "apps": ["notes"],
        "seed": seed,
        "steps": [
            {
                "app": "notes",
                "api": "login",
                "args": {"username": account["username"], "password": account["password"]},
            },
        ],
    }


def test_a_free_instruction_is_replayed_on_the_world_of_its_seed(env):
    client, keys = env
    resp = upload(client, keys.tenant_a_client, free_notes_demo(seed=3, password_seed=3))
    assert resp.status_code == 201, resp.text
    demo = resp.json()
    assert demo["replayed"] is True and demo["seed"] == 3 and demo["task_ref"] is None
    assert set(demo["steps"][0]["observation"]) == {"access_token", "token_type"}
    other = upload(client, keys.tenant_a_client, free_notes_demo(seed=4, password_seed=3))
    assert other.status_code == 422 and "step 0 (notes.login" in other.json()["error"]["message"]
    assert demo_rows() == 1


def test_an_external_apps_steps_are_checked_against_its_operations_and_never_called(env, loopback):
    client, keys = env
    base_url, doc, calls = loopback
    registration = {
        "name": "todolite",
        "openapi": doc,
        "base_url": base_url,
        "auth_header": {"name": "X-Api-Key", "value": API_KEY},
        "allowed_networks": LOOPBACK_NETWORKS,
    }
    assert client.post("/v1/apps", json=registration, headers=bearer(keys.operator)).status_code == 201
    item_calls, resets = len(calls.headers_seen), len(calls.resets)
    steps = [
        {"app": "todolite", "api": "add_item", "args": {"name": "bread"}, "observation": {"ok": True, "count": 1}},
        {"app": "todolite", "api": "add_item", "args": {"name": "milk"}},
        {"app": "supervisor", "api": "complete_task", "args": {}},
    ]
    resp = upload(client, keys.tenant_a_client, {"task_ref": "todolite:add-two", "steps": steps})
    assert resp.status_code == 201, resp.text
    demo = resp.json()
    assert demo["replayed"] is False and demo["apps"] == ["todolite"]
    assert demo["instruction"] == "Add the items bread and milk to my list."
    assert [s["observation"] for s in demo["steps"]] == [{"ok": True, "count": 1}, None, None]
    assert (len(calls.headers_seen), len(calls.resets)) == (item_calls, resets)  # no step was sent to the app

    for index, change, needle in [
        (1, {"args": {"title": "milk"}}, "Unknown argument(s) title"),
        (0, {"api": "agentloop_reset", "args": {"task_ref": "add-two"}}, "has no API 'agentloop_reset'"),
        (0, {"app": "notes", "api": "list_notes"}, "app 'notes' is not one of this task's apps"),
    ]:
        bad = upload(
            client, keys.tenant_a_client, {"task_ref": "todolite:add-two", "steps": with_step(steps, index, **change)}
        )
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"]["message"].startswith(f"step {index} (") and needle in bad.json()["error"]["message"]
    assert demo_rows() == 1


def test_list_pages_newest_first_with_filters(env):
    client, keys = env
    ids = []
    for ref in (REF, OTHER_REF, REF):
        resp = upload(client, keys.tenant_a_client, {"task_ref": ref, "steps": oracle_steps(ref)})
        assert resp.status_code == 201, resp.text
        ids.append(resp.json()["id"])
    upload(client, keys.tenant_b_client, {"task_ref": REF, "steps": oracle_steps(REF)})
    auth = bearer(keys.tenant_a_client)

    first = client.get("/v1/demonstrations", params={"limit": 2}, headers=auth).json()
    assert [d["id"] for d in first["items"]] == ids[:0:-1] and first["next_cursor"]
    second = client.get("/v1/demonstrations", params={"limit": 2, "cursor": first["next_cursor"]}, headers=auth).json()
    assert [d["id"] for d in second["items"]] == ids[:1] and second["next_cursor"] is None

    of_task = client.get("/v1/demonstrations", params={"task_ref": REF}, headers=auth).json()
    assert [d["id"] for d in of_task["items"]] == [ids[2], ids[0]]
    assert len(client.get("/v1/demonstrations", params={"world": "builtin"}, headers=auth).json()["items"]) == 3
    assert client.get("/v1/demonstrations", params={"world": "toy"}, headers=auth).json()["items"] == []
    b_items = client.get("/v1/demonstrations", headers=bearer(keys.tenant_b_client)).json()["items"]
    assert len(b_items) == 1 and b_items[0]["id"] not in ids

    bad = client.get("/v1/demonstrations", params={"cursor": "not-a-cursor"}, headers=auth)
    assert bad.status_code == 422 and "invalid cursor" in bad.json()["error"]["message"]
    assert client.get("/v1/demonstrations").status_code == 401


def test_another_tenants_demonstration_is_not_found_and_delete_removes_it(env):
    client, keys = env
    demo_id = upload(client, keys.tenant_a_client, {"task_ref": OTHER_REF, "steps": oracle_steps(OTHER_REF)}).json()[
        "id"
    ]
    other = bearer(keys.tenant_b_client)
    for method in ("get", "delete"):
        resp = client.request(method, f"/v1/demonstrations/{demo_id}", headers=other)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
    assert demo_rows() == 1
    owner = bearer(keys.tenant_a_client)
    assert client.delete(f"/v1/demonstrations/{demo_id}", headers=owner).status_code == 204
    assert client.get(f"/v1/demonstrations/{demo_id}", headers=owner).status_code == 404
    assert client.delete(f"/v1/demonstrations/{demo_id}", headers=owner).status_code == 404
    assert demo_rows() == 0


def test_cli_import_reports_each_line_and_export_round_trips(env, tmp_path):
    client, keys = env
    good = {"task_ref": REF, "steps": oracle_steps(REF), "metadata": {"source": "file"}}
    bad_step = {"task_ref": REF, "steps": with_step(oracle_steps(REF), 2, api="nope")}
    free = {
        "instruction": "Show my profile.",
        "apps": ["notes"],
        "steps": [{"app": "supervisor", "api": "show_profile"}],
    }
    lines = [json.dumps(good), json.dumps(bad_step), "", json.dumps(free), "{not json"]
    source = tmp_path / "demos.jsonl"
    source.write_text("\n".join(lines) + "\n")
    runner = CliRunner()

    result = runner.invoke(cli, ["demos", "import", str(source), "--tenant", "tenant-a"])
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[0].startswith("line 1: ok ") and "replayed" in result.stdout
    assert result.stdout.splitlines()[1].startswith("line 4: ok ")
    errors = result.stderr.splitlines()
    assert errors[0].startswith("line 2: step 2 (contacts.nope; steps count from 0)")
    assert errors[1].startswith("line 5: ") and "Invalid JSON" in errors[1]
    assert "2 demonstration(s) imported" in errors[2] and "2 line(s) failed" in errors[2]
    assert demo_rows() == 2

    exported = tmp_path / "export.jsonl"
    result = runner.invoke(cli, ["demos", "export", str(exported), "--tenant", "tenant-a"])
    assert result.exit_code == 0, result.output
    bodies = [json.loads(line) for line in exported.read_text().splitlines()]
    assert [b.get("task_ref") for b in bodies] == [REF, None]  # oldest first, as imported
    assert bodies[0]["metadata"] == {"source": "file"} and "instruction" not in bodies[0]
    assert bodies[1]["instruction"] == "Show my profile." and bodies[1]["apps"] == ["notes"]

    result = runner.invoke(cli, ["demos", "import", str(exported), "--tenant", "tenant-b"])
    assert result.exit_code == 0, result.output
    a_items = client.get("/v1/demonstrations", headers=bearer(keys.tenant_a_client)).json()["items"]
    b_items = client.get("/v1/demonstrations", headers=bearer(keys.tenant_b_client)).json()["items"]
    same = ("task_ref", "instruction", "apps", "steps", "metadata", "replayed")
    assert [{k: d[k] for k in same} for d in b_items] == [{k: d[k] for k in same} for d in a_items]

    empty = tmp_path / "none.jsonl"
    assert runner.invoke(cli, ["demos", "export", str(empty), "--world", "toy"]).exit_code == 0
    assert empty.read_text() == ""
    unknown = runner.invoke(cli, ["demos", "import", str(source), "--tenant", "nobody"])
    assert unknown.exit_code == 2 and "no tenant named 'nobody'" in unknown.output
    assert demo_rows() == 4
