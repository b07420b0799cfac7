"""A damaged active adapter (files deleted, checksum wrong) fails over: new tasks finish on the previous good
version, then on the base model; the damage is stored, /readyz says degraded, /metrics shows it; activation
verifies; files that verify again clear it."""

import shutil
from pathlib import Path

import pytest
import sqlalchemy as sa
from transformers import AutoModelForCausalLM

from agentloop.agent import runner
from agentloop.policy.local import LocalPolicy
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import Adapter, Episode, TaskStatus
from tests.agent.test_hot_swap import _new_tasks, _save_version
from tests.api.test_admin_api import env
from tests.factories import bearer


@pytest.fixture
def pins(monkeypatch):
    """A serving process of its own: nothing loaded, nothing found damaged yet."""
    fresh = runner.AdapterPins()
    monkeypatch.setattr(runner, "PINS", fresh)
    return fresh


def serve_one(policy, settings) -> str | None:
    """Run one new task to its end; the adapter its episode ran on."""
    (task_id,) = _new_tasks(1)
    assert runner.run_served_task(task_id, "w-1", policy, settings) == "finished"
    with session_scope() as s:
        assert s.get(runner.Task, task_id).status == TaskStatus.FINISHED
        return s.scalars(sa.select(Episode.adapter).where(Episode.task_id == task_id)).one()


def row(name) -> Adapter:
    with session_scope() as s:
        adapter = s.scalars(sa.select(Adapter).where(Adapter.name == name)).one()
        s.expunge(adapter)
        return adapter


def test_a_damaged_active_adapter_fails_over_and_is_reported(
    sqlite_db, tiny_model_dir, tokenizer, configure_env, pins, caplog, monkeypatch
):
    configure_env(MODEL=str(tiny_model_dir), AGENT_MAX_TURNS=2, AGENT_MAX_NEW_TOKENS=16)
    settings = get_settings()
    client, keys = env()
    v1 = _save_version(settings, tiny_model_dir, seed=1)
    v2 = _save_version(settings, tiny_model_dir, seed=2)  # v1 retires
    policy = LocalPolicy(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer, settings.model_name, seed=0)
    assert row(v2).status == "active" and row(v1).status == "retired"
    assert not [w for w in client.get("/readyz").json()["warnings"] if "adapter" in w]

    # the active version's files are deleted before any process loaded it: the previous good version serves
    shutil.rmtree(row(v2).path)
    assert serve_one(policy, settings) == v1
    assert "is missing" in (row(v2).damage or "") and row(v2).damaged_at is not None
    assert f"adapter {v2} cannot be served" in caplog.text and f"run on {v1}" in caplog.text
    ready = client.get("/readyz").json()
    assert ready["status"] in ("degraded", "not_ready"), ready  # not_ready only if the broker check failed
    (warning,) = [w for w in ready["warnings"] if "adapter" in w]
    assert v2 in warning and "is missing" in warning
    metrics = client.get("/metrics", headers=bearer(keys.operator)).text
    assert f'agentloop_adapter_damaged{{adapter="{v2}",base_model="{settings.model_name}",owner="shared"}} 1.0' in (
        metrics
    )
    listed = {a["name"]: a for a in client.get("/v1/admin/adapters", headers=bearer(keys.operator)).json()}
    assert "is missing" in listed[v2]["damage"] and listed[v1]["damage"] is None
    # a second task is not slowed by checking v2 again (within DAMAGE_RECHECK_S), and logs nothing new
    caplog.clear()
    assert serve_one(policy, settings) == v1
    assert "cannot be served" not in caplog.text

    # a process that has loaded nothing yet, and v1's files changed too: the base model serves
    other = runner.AdapterPins()
    fresh_policy = LocalPolicy(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer, settings.model_name, seed=0
    )
    weights = next(Path(row(v1).path).glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes() + b"\0")
    monkeypatch.setattr(runner, "PINS", other)
    assert serve_one(fresh_policy, settings) is None
    assert "do not match their sha256" in (row(v1).damage or "")

    # activation verifies: the deleted version cannot be activated again
    resp = client.post(f"/v1/admin/adapters/{v2}/activate", headers=bearer(keys.operator))
    assert resp.status_code == 409 and "is missing" in resp.json()["error"]["message"]
    # a new good version is activated: nothing active is damaged, it serves
    v3 = _save_version(settings, tiny_model_dir, seed=3)
    assert not [w for w in client.get("/readyz").json()["warnings"] if "adapter" in w]
    assert serve_one(fresh_policy, settings) == v3


def test_files_that_verify_again_clear_the_damage(sqlite_db, tiny_model_dir, tokenizer, configure_env, pins):
    configure_env(MODEL=str(tiny_model_dir), AGENT_MAX_TURNS=1, AGENT_MAX_NEW_TOKENS=8)
    settings = get_settings()
    v1 = _save_version(settings, tiny_model_dir, seed=1)
    policy = LocalPolicy(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer, settings.model_name, seed=0)
    path = Path(row(v1).path)
    shutil.move(path, path.with_name(path.name + ".moved"))
    assert serve_one(policy, settings) is None  # no earlier version: the base model
    assert row(v1).damage is not None
    shutil.move(path.with_name(path.name + ".moved"), path)  # restored
    pins._damaged = {name: (why, when - runner.DAMAGE_RECHECK_S) for name, (why, when) in pins._damaged.items()}
    assert serve_one(policy, settings) == v1
    assert row(v1).damage is None and row(v1).damaged_at is None
