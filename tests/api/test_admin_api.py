"""/v1/admin: training runs and adapters, admin keys only; a run started here trains in a real worker."""

import sqlalchemy as sa
from fastapi.testclient import TestClient
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from agentloop.api.app import create_app
from agentloop.learner import adapters
from agentloop.settings import get_settings
from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.models import Adapter, TrainingRun
from tests.factories import bearer, make_keys

TRAIN = {
    "algo": "loop",
    "iterations": 1,
    "config": {
        "world": "lights",
        "tasks_per_iteration": 3,
        "rollouts_per_task": 3,
        "max_turns": 1,
        "max_new_tokens": 40,
        "dev_limit": 2,
        "dev_max_turns": 1,
        "promotion_tolerance": 100.0,
    },
}


def env():
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    return TestClient(create_app()), keys


def runs():
    with session_scope() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(TrainingRun))


def save_version(model_dir, activate):
    settings = get_settings()
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"])
    )
    with session_scope() as s:
        row = adapters.save_adapter(
            s, model, settings.adapters_dir, settings.model_name, parent=None, training_run_id=None
        )
        if activate:
            adapters.activate(s, row)
        return row.name, row.path


def test_admin_routes_need_an_admin_key(sqlite_db):
    client, keys = env()
    for method, path in [
        ("post", "/v1/admin/train"),
        ("get", "/v1/admin/training-runs"),
        ("get", "/v1/admin/training-runs/x"),
        ("get", "/v1/admin/adapters"),
        ("post", "/v1/admin/adapters/x/activate"),
    ]:
        assert client.request(method, path, json=TRAIN).status_code == 401, path
        resp = client.request(method, path, json=TRAIN, headers=bearer(keys.tenant_a_client))
        assert resp.status_code == 403 and "admin" in resp.json()["error"]["message"], (path, resp.text)
    assert runs() == 0


def test_bad_training_requests_write_nothing(sqlite_db):
    client, keys = env()
    admin = bearer(keys.tenant_a_admin)
    for body in [
        {"algo": "ppo"},
        {"iterations": 0},
        {"config": {"lr": -1}},
        {"config": {"no_such_option": 1}},
        {"config": {"rollouts_per_task": 1}},  # leave-one-out needs two
        {"config": {"ratio_level": "sentence"}},  # one of a fixed set of words
        {"config": {"dpo_reference": "yesterday"}},
        {"algo": "stepagent-irl", "config": {"inspection": "greedy"}},  # its discriminator needs samples
        {"unknown_field": 1},
        {"recipe": "fastest"},
    ]:
        resp = client.post("/v1/admin/train", json=body, headers=admin)
        assert resp.status_code == 422, (body, resp.text)
        assert resp.json()["error"]["message"], body
    assert runs() == 0
    assert client.get("/v1/admin/training-runs/nope", headers=admin).status_code == 404


def test_a_recipe_queues_its_phases_as_one_run(sqlite_db):
    client, keys = env()
    resp = client.post("/v1/admin/train", json={"recipe": "default"}, headers=bearer(keys.tenant_a_admin))
    assert resp.status_code == 202, resp.text
    run = resp.json()
    assert run["algo"] == "sft+stepagent-implicit+loop+step"
    assert run["config"]["phases"] == ["sft:2", "stepagent-implicit:3", "loop+step:3"]
    assert run["config"]["iterations"] == 8  # the phases' iterations, whatever `iterations` says


def test_list_activate_and_roll_back(sqlite_db, tiny_model_dir, configure_env):
    """The shared adapter's versions, by the operator (tests/api/test_tenant_adapters.py: a tenant's own)."""
    configure_env(MODEL=str(tiny_model_dir))
    client, keys = env()
    admin = bearer(keys.operator)
    v1, _ = save_version(tiny_model_dir, activate=True)
    v2, v2_path = save_version(tiny_model_dir, activate=False)
    listed = client.get("/v1/admin/adapters", headers=admin).json()
    assert {(a["name"], a["status"]) for a in listed} == {(v2, "candidate"), (v1, "active")}
    resp = client.post(f"/v1/admin/adapters/{v2}/activate", headers=admin)
    assert resp.status_code == 200 and resp.json()["status"] == "active"
    resp = client.post(f"/v1/admin/adapters/{v1}/activate", headers=admin)  # roll back
    assert resp.status_code == 200
    statuses = {a["name"]: a["status"] for a in client.get("/v1/admin/adapters", headers=admin).json()}
    assert statuses == {v1: "active", v2: "retired"}
    assert client.post("/v1/admin/adapters/nope@v9/activate", headers=admin).status_code == 404
    # files changed on disk since they were written: refused, and nothing changes
    with open(f"{v2_path}/adapter_config.json", "a") as f:
        f.write(" ")
    resp = client.post(f"/v1/admin/adapters/{v2}/activate", headers=admin)
    assert resp.status_code == 409 and "sha256" in resp.json()["error"]["message"]
    with session_scope() as s:
        assert {a.name: a.status for a in s.scalars(sa.select(Adapter))} == {v1: "active", v2: "retired"}
