"""Hot-swap: an adapter promoted while 20 served episodes run on one policy; a serving process that loads
an announced version before any episode asks for it."""

import threading
import time

import pytest
import sqlalchemy as sa
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from agentloop.agent import runner
from agentloop.learner import adapters
from agentloop.policy.local import LocalPolicy
from agentloop.settings import get_settings
from agentloop.store import adapters as adapter_store
from agentloop.store.db import session_scope
from agentloop.store.models import Episode, Task, TaskStatus, Tenant
from tests.api.test_admin_api import env
from tests.factories import bearer, save_random_lora
from tests.processes import wait_for


def _save_version(settings, model_dir, seed):
    import torch

    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    with session_scope() as s:
        row = adapters.save_adapter(
            s, model, settings.adapters_dir, settings.model_name, parent=None, training_run_id=None
        )
        adapters.activate(s, row)
        name = row.name
    adapters.announce(row)
    return name


def _new_tasks(n):
    with session_scope() as s:
        if s.get(Tenant, "t") is None:
            s.add(Tenant(id="t", name="t"))
            s.flush()
        rows = [
            Task(
                tenant_id="t",
                request_hash="-",
                options={},
                instruction=f"Note {i}: buy milk.",
                apps=["notes"],
                world="builtin",
            )
            for i in range(n)
        ]
        s.add_all(rows)
        s.flush()
        return [r.id for r in rows]


def _started(ids):
    with session_scope() as s:
        return s.scalar(sa.select(sa.func.count()).select_from(Episode).where(Episode.task_id.in_(ids)))


def test_promotion_during_twenty_running_episodes(sqlite_db, tiny_model_dir, tokenizer, configure_env):
    configure_env(MODEL=str(tiny_model_dir), AGENT_MAX_TURNS=4, AGENT_MAX_NEW_TOKENS=24)
    settings = get_settings()
    old = _save_version(settings, tiny_model_dir, seed=1)
    policy = LocalPolicy(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer, settings.model_name, seed=0)
    outcomes: dict[str, str] = {}

    def serve(task_id):
        try:
            outcomes[task_id] = runner.run_served_task(task_id, f"w-{task_id[:6]}", policy, settings)
        except Exception as exc:  # a crash is a failed episode too
            outcomes[task_id] = f"crashed: {exc!r}"

    before, after = _new_tasks(10), _new_tasks(10)
    threads = [threading.Thread(target=serve, args=(t,)) for t in before]
    for t in threads:
        t.start()
    while _started(before) < len(before):  # all ten pinned their adapter and are running
        threading.Event().wait(0.01)
    with session_scope() as s:
        still_running = s.scalar(
            sa.select(sa.func.count()).select_from(Task).where(Task.id.in_(before), Task.status == TaskStatus.RUNNING)
        )
    new = _save_version(settings, tiny_model_dir, seed=2)  # promoted while they run
    late = [threading.Thread(target=serve, args=(t,)) for t in after]
    for t in late:
        t.start()
    for t in threads + late:
        t.join(timeout=300)

    assert still_running >= 5  # the promotion really happened mid-flight
    assert set(outcomes.values()) == {TaskStatus.FINISHED}, outcomes  # zero failed episodes
    with session_scope() as s:
        episodes = {e.task_id: e for e in s.scalars(sa.select(Episode)).all()}
        tasks = {t.id: t for t in s.scalars(sa.select(Task)).all()}
        assert all(tasks[i].error is None for i in before + after), [tasks[i].error for i in before + after]
        assert all(episodes[i].status == "finished" for i in before + after)
        assert {episodes[i].adapter for i in before} == {old}  # in-flight episodes finished on theirs
        assert {episodes[i].adapter for i in after} == {new}  # the first started after promotion uses the new one
        assert all(tasks[i].adapter == episodes[i].adapter for i in before + after)
        steps_by_old = [len(episodes[i].steps) for i in before]
    assert min(steps_by_old) >= 1
    assert runner.PINS.pinned() == {}
    policy_loaded_at_end = policy.loaded_adapters()
    assert new in policy_loaded_at_end
    # one more episode after everything drained: the old version is no longer held in memory
    (last,) = _new_tasks(1)
    serve(last)
    assert policy.loaded_adapters() == {new}


def _save_candidate(settings, model_dir, seed):
    import torch

    torch.manual_seed(seed)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    with session_scope() as s:
        row = adapters.save_adapter(
            s, model, settings.adapters_dir, settings.model_name, parent=None, training_run_id=None
        )
        return row.name, row.path


def _activate_quietly(name):
    """Activated and committed, not announced."""
    with session_scope() as s:
        row = adapter_store.get_adapter(s, name)
        assert row is not None
        adapters.activate(s, row)
        s.flush()
        s.expunge(row)
    return row


@pytest.mark.services
def test_a_serving_process_loads_an_announced_version_before_any_episode_asks(
    sqlite_db, redis_url, tiny_model_dir, tokenizer, configure_env, tmp_path
):
    configure_env(MODEL=str(tiny_model_dir), REDIS_URL=redis_url)
    settings = get_settings()
    client, keys = env()
    admin = bearer(keys.operator)  # the shared adapter is the operator's to roll back
    (v1, _), (v2, _) = _save_candidate(settings, tiny_model_dir, 1), _save_candidate(settings, tiny_model_dir, 2)
    _activate_quietly(v1)
    policy = LocalPolicy(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer, settings.model_name, seed=0)
    policy.load_adapter("run-x-it0", str(save_random_lora(tiny_model_dir, tmp_path / "rollout")))  # a rollout job's
    pins = runner.AdapterPins()  # this process's, as a worker's PINS
    listener = pins.follow(policy, settings)
    assert listener is not None
    try:
        assert listener.subscribed.wait(10)
        # on subscribing it looked once: v1, activated while nobody listened, is loaded
        assert policy.loaded_adapters() == {v1, "run-x-it0"}

        # committed but not announced: nothing moves (no polling in this process)...
        row = _activate_quietly(v2)
        time.sleep(1.5)
        assert policy.loaded_adapters() == {v1, "run-x-it0"}
        # ...announced: v2 is loaded at once, v1 (no episode runs on it) unloaded, the job's left alone
        started = time.monotonic()
        adapters.announce(row)
        wait_for(lambda: policy.loaded_adapters() == {v2, "run-x-it0"}, 10, "v2 to be loaded on its notice")
        assert time.monotonic() - started < 5

        # an episode in flight on v2 keeps it while an admin rolls back to v1 (REST, which announces)
        assert pins.pin(policy, settings) == v2
        assert client.post(f"/v1/admin/adapters/{v1}/activate", headers=admin).status_code == 200
        wait_for(lambda: policy.loaded_adapters() == {v1, v2, "run-x-it0"}, 10, "v1 to be loaded on its notice")
        pins.release(v2)
        assert pins.pin(policy, settings) == v1  # the next episode finds v1 loaded and starts on it
        assert policy.loaded_adapters() == {v1, "run-x-it0"}  # v2 went once its episode ended
    finally:
        listener.stop()
    assert not listener.is_alive()
