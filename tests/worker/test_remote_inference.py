"""Episodes end to end with inference as a service: API -> Redis -> a worker process on the `remote` backend ->
`agentloop inference` in a process of its own (the tiny model) -> steps in PostgreSQL. Two tenants' adapters
are served side by side, a newly activated version is hot-swapped in, and a dead server ends the running
episode with the reason while every stored step stays whole."""

import httpx
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.learner.adapters import directory_sha256
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import Adapter, Episode, Step, Tenant
from tests.factories import bearer, save_random_lora
from tests.policy.test_remote import Server
from tests.processes import ended, wait_for

pytestmark = pytest.mark.services


def add_adapter(model_dir, root, tenant: str, version: int, status: str) -> str:
    path = save_random_lora(model_dir, root / f"{tenant}-v{version}", seed=version)
    name = f"{get_settings().model_name}@v{version}"
    with session_scope() as s:
        tenant_id = s.scalar(sa.select(Tenant.id).where(Tenant.name == tenant))
        s.add(
            Adapter(
                name=name,
                base_model=get_settings().model_name,
                version=version,
                tenant_id=tenant_id,
                path=str(path),
                sha256=directory_sha256(path),
                status=status,
                metrics={},
            )
        )
    return name


def episode_of(task_id: str) -> Episode:
    with session_scope() as s:
        episode = s.scalars(sa.select(Episode).where(Episode.task_id == task_id)).one()
        s.expunge(episode)
        return episode


def steps_of(task_id: str) -> list[Step]:
    with session_scope() as s:
        rows = s.scalars(sa.select(Step).join(Episode).where(Episode.task_id == task_id).order_by(Step.index)).all()
        for row in rows:
            s.expunge(row)
        return list(rows)


@pytest.fixture
def inference(production_keys, tiny_model_dir, tmp_path, configure_env):
    server = Server(tiny_model_dir, tmp_path / "inference.log", None)
    configure_env(POLICY_BACKEND="remote", INFERENCE_URLS=server.url, INFERENCE_RETRIES=1, INFERENCE_DOWN_S=1)
    yield server, production_keys
    server.kill()


def test_two_tenants_adapters_are_served_side_by_side_and_a_new_version_is_swapped_in(
    inference, processes, tiny_model_dir, tmp_path
):
    server, keys = inference
    a1 = add_adapter(tiny_model_dir, tmp_path, "tenant-a", 1, "active")
    b2 = add_adapter(tiny_model_dir, tmp_path, "tenant-b", 2, "active")
    processes.start("worker", "--queues", "episodes", "--pool", "threads", "--concurrency", "4")
    client = TestClient(create_app())

    def submit(key: str) -> str:
        resp = client.post("/v1/tasks", json={"task_ref": "wallet_balance-1"}, headers=bearer(key))
        assert resp.status_code == 202, resp.text
        return resp.json()["id"]

    tasks = {submit(keys.tenant_a_client): a1, submit(keys.tenant_b_client): b2}
    tasks |= {submit(keys.tenant_a_client): a1, submit(keys.tenant_b_client): b2}
    for task_id, adapter in tasks.items():
        task = wait_for(lambda t=task_id: ended(t), 180, "the task to end", processes.logs)
        assert task.status == "finished", task.error
        episode = episode_of(task_id)
        assert (episode.adapter, episode.policy) == (adapter, get_settings().model_name)
        for step in steps_of(task_id):
            assert len(step.output_logprobs) == len(step.output_token_ids) >= 1
    stats = server.stats()
    assert {a1, b2} <= set(stats["registered"]) and stats["most_rows"] >= 2
    assert stats["most_adapters"] == 2  # the two tenants' episodes decoded in one batch, each on its adapter

    # tenant-a's admin activates a new version: the next episode runs on it, loaded on the server by its name
    a3 = add_adapter(tiny_model_dir, tmp_path, "tenant-a", 3, "candidate")
    resp = client.post(f"/v1/admin/adapters/{a3}/activate", headers=bearer(keys.tenant_a_admin))
    assert resp.status_code == 200, resp.text
    task_id = submit(keys.tenant_a_client)
    task = wait_for(lambda: ended(task_id), 180, "the task on the new version", processes.logs)
    assert task.status == "finished" and episode_of(task_id).adapter == a3
    assert a3 in server.stats()["registered"]
    assert "Traceback" not in processes.everything()


def test_a_dead_inference_server_ends_the_episode_with_the_reason_and_keeps_its_steps(
    inference, processes, configure_env
):
    server, keys = inference
    configure_env(AGENT_MAX_TURNS=400)
    processes.start("worker", "--queues", "episodes")
    client = TestClient(create_app())
    task_id = client.post(
        "/v1/tasks", json={"task_ref": "wallet_balance-1"}, headers=bearer(keys.tenant_a_client)
    ).json()["id"]
    wait_for(lambda: len(steps_of(task_id)) >= 2, 120, "two steps", processes.logs)
    server.kill()
    task = wait_for(lambda: ended(task_id), 120, "the task to end", processes.logs)
    assert task.status == "failed" and "no inference replica answered" in (task.error or ""), task.error
    assert server.url in task.error
    steps = steps_of(task_id)
    assert [s.index for s in steps] == list(range(len(steps)))
    for step in steps:  # every stored step is whole: its tokens, their log-probs and the observation
        assert len(step.output_logprobs) == len(step.output_token_ids) >= 1 and step.observation_token_ids
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.url}/health", timeout=1)
