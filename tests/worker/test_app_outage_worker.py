"""A real worker process (embedded broker, the tiny model) meets an external app that dies: killed during
an episode, the attempt is an error with no reward and the task runs again once the app is back; down at
reset, the task fails with the reason. The worker lives on through both."""

import time

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.models import App, Episode, Reward, Task
from agentloop.worker.dispatch import publish_episode
from tests.apps.loopback_app import API_KEY, LOOPBACK_NETWORKS, LoopbackProcess
from tests.factories import bearer, make_keys
from tests.processes import ended, wait_for


@pytest.fixture
def embedded(sqlite_db, tiny_model_dir, configure_env):
    configure_env(
        MODEL=tiny_model_dir,
        AGENT_MAX_TURNS=20,  # long enough for the app to die during the episode
        AGENT_MAX_NEW_TOKENS=8,
        TORCH_THREADS=1,
        APP_CONTROL_ATTEMPTS=4,  # 0.5 + 1 + 2 s of backoff: room for the app to come back
        APP_CONTROL_BACKOFF_S=0.5,
        APP_RETRY_AFTER_S=2,
    )


@pytest.fixture
def todo():
    app = LoopbackProcess()
    app.start()
    yield app
    app.stop()


def episodes_of(task_id: str) -> list[Episode]:
    with get_sessionmaker()() as s:
        rows = s.scalars(sa.select(Episode).where(Episode.task_id == task_id).order_by(Episode.attempt)).all()
        s.expunge_all()
        return list(rows)


def rewards_of(task_id: str) -> list[Reward]:
    with get_sessionmaker()() as s:
        rows = s.scalars(sa.select(Reward).where(Reward.task_id == task_id)).all()
        s.expunge_all()
        return list(rows)


def test_a_worker_survives_an_app_that_dies_mid_episode_and_at_reset(embedded, todo, processes):
    client = TestClient(create_app())
    with get_sessionmaker()() as s:
        admin = bearer(make_keys(s).operator)
    registration = {
        "name": "todolite",
        "openapi": todo.document,
        "base_url": todo.base_url,
        "auth_header": {"name": "X-Api-Key", "value": API_KEY},
        "allowed_networks": LOOPBACK_NETWORKS,
    }
    assert client.post("/v1/apps", json=registration, headers=admin).status_code == 201
    worker = processes.start("worker", "--queues", "episodes", "--pool", "solo")
    wait_for(lambda: " ready." in processes.logs(), 120, "the worker", processes.logs)

    # killed during attempt 1's episode: right after its reset was answered. The app logs a reset before
    # its answer is sent, so the episode row (written once the worker has the answer) is what is waited for.
    resp = client.post("/v1/tasks", json={"task_ref": "todolite:add-two"}, headers=admin)
    assert resp.status_code == 202, resp.text
    task_id = resp.json()["id"]
    deadline = time.monotonic() + 120
    while not episodes_of(task_id):
        assert time.monotonic() < deadline, processes.logs()
        time.sleep(0.01)
    todo.stop()
    wait_for(lambda: [e.status for e in episodes_of(task_id)] == ["failed"], 120, "attempt 1's end", processes.logs)
    assert rewards_of(task_id) == []
    todo.start()
    task = wait_for(lambda: ended(task_id), 120, "attempt 2", processes.logs)
    assert (task.status, task.attempts) == ("finished", 2), task.error
    first, second = episodes_of(task_id)
    assert (first.status, first.num_steps > 0, second.status) == ("failed", True, "finished")
    assert "agentloop_evaluate: could not reach the app" in first.error
    (reward,) = rewards_of(task_id)  # attempt 2's, from the app's evaluation: nothing for attempt 1
    assert reward.episode_id == second.id and reward.value == task.reward
    calls = todo.calls()
    wait_for(lambda: todo.calls()["releases"], 10, "the release", processes.logs)
    assert todo.calls()["releases"] == [calls["evaluations"][-1][1]]

    # down at reset: tried with backoff, then the task fails with the reason
    todo.stop()
    with session_scope() as s:
        task_row = Task(
            tenant_id=s.scalars(sa.select(App.tenant_id)).one(),
            world="builtin",
            task_ref="todolite:add-two",
            instruction="Add the items bread and milk to my list.",
            apps=["todolite"],
            options={},
            request_hash="h",
        )
        s.add(task_row)
        s.flush()
        down_id = task_row.id
    assert publish_episode(down_id)
    task = wait_for(lambda: ended(down_id), 60, "the failed reset", processes.logs)
    assert task.status == "failed" and "agentloop_reset: could not reach the app" in task.error, task.error
    assert "(4 tries)" in task.error and episodes_of(down_id) == []
    assert worker.poll() is None, processes.logs()  # alive, and still taking tasks
