"""A real worker process says when it can run episodes: one line in its log once the model is loaded
(and no progress bar logged as a warning), and to /readyz, which counts the workers of each queue."""

import os
import re
import signal
import time

import pytest
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.store.db import get_sessionmaker
from tests.factories import bearer, make_keys
from tests.processes import ended, task_row, wait_for

READY_LINE = re.compile(
    r"INFO agentloop\.policy\.local: policy model ready: tiny-llama-v1 on cpu \(float32\), loaded in \d+\.\d s"
)


@pytest.fixture(params=["embedded", pytest.param("redis", marks=pytest.mark.services)])
def broker(request, sqlite_db, tiny_model_dir, configure_env):
    """The embedded SQL broker (worker records in files) or Redis (records in Redis), the tiny model."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    configure_env(BROKER_URL=url, MODEL=tiny_model_dir, AGENT_MAX_NEW_TOKENS=4, TORCH_THREADS=1)
    return request.param


def submit(client: TestClient, max_turns: int | None = None) -> str:
    with get_sessionmaker()() as s:
        key = make_keys(s).tenant_a_client
    body = {"task_ref": "wallet_balance-1", "max_turns": max_turns} if max_turns else {"task_ref": "wallet_balance-1"}
    resp = client.post("/v1/tasks", json=body, headers=bearer(key))
    assert resp.status_code == 202, resp.text
    return resp.json()["id"]


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_the_worker_logs_when_the_model_is_ready_and_no_progress_bar_as_a_warning(
    pool, processes, sqlite_db, tiny_model_dir, configure_env
):
    """solo loads the model before it consumes; a prefork child loads it on its first task, inside Celery,
    where stderr used to be redirected into the log as `WARNING celery.redirected`."""
    configure_env(MODEL=tiny_model_dir, AGENT_MAX_NEW_TOKENS=4, TORCH_THREADS=1)
    processes.start("worker", "--queues", "episodes", "--pool", pool, "--concurrency", "1")
    wait_for(lambda: "celery@" in processes.logs() and " ready." in processes.logs(), 120, "the worker", processes.logs)
    task_id = submit(TestClient(create_app()), max_turns=1)
    task = wait_for(lambda: ended(task_id), 120, "the task to end", processes.logs)
    assert task.status == "finished", task.error
    logs = processes.logs()
    assert len(READY_LINE.findall(logs)) == 1, logs
    assert "celery.redirected" not in logs, logs
    if pool == "solo":  # ready before it consumed: the task did not wait for the model
        assert READY_LINE.search(logs).start() < logs.index(" ready.")


def readyz(client: TestClient) -> dict:
    resp = client.get("/readyz")
    assert resp.status_code == 200, resp.text  # degraded or not, the API takes tasks
    return resp.json()


def test_readyz_counts_the_workers_consuming_each_queue(broker, processes):
    client = TestClient(create_app())
    before = readyz(client)
    assert before["status"] == "degraded" and before["workers"]["episodes"] == 0
    assert "no worker consumes the `episodes` queue" in before["warnings"][0]
    assert before["checks"] == {"database": "ok", "migrations": "ok", "broker": "ok"}

    worker = processes.start("worker", "--queues", "episodes,maintenance")
    up = wait_for(lambda: (r := readyz(client))["workers"]["episodes"] and r, 120, "the worker", processes.logs)
    assert up["status"] == "ready" and up["warnings"] == []
    assert up["workers"] == {"episodes": 1, "rollouts": 0, "learner": 0, "maintenance": 1}
    assert READY_LINE.search(processes.logs())  # counted once its model is loaded

    os.killpg(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    # at once, not after the record's lease_s (60 s here): a worker that stops says so
    gone = readyz(client)
    assert gone["status"] == "degraded" and gone["workers"]["episodes"] == 0


def test_a_busy_worker_stays_counted_and_a_killed_one_drops_out(broker, processes, configure_env):
    # records: refreshed every 1 s, valid 4 s; an episode that outlasts them (on an idle machine the tiny model
    # fills the default 8192-token context in about 6 s)
    configure_env(LEASE_S=4, AGENT_MAX_TURNS=400, AGENT_MAX_NEW_TOKENS=24, AGENT_MAX_CONTEXT_TOKENS=60000)
    client = TestClient(create_app())
    worker = processes.start("worker", "--queues", "episodes")
    wait_for(lambda: readyz(client)["workers"]["episodes"], 120, "the worker", processes.logs)
    task_id = submit(client)
    wait_for(lambda: task_row(task_id).status == "running", 60, "the episode to start", processes.logs)
    time.sleep(6)  # longer than a record lives: only the worker's own thread keeps it, mid-episode
    assert task_row(task_id).status == "running"
    assert readyz(client)["workers"]["episodes"] == 1

    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    start = time.monotonic()
    wait_for(lambda: readyz(client)["workers"]["episodes"] == 0, 10, "the killed worker to drop out", processes.logs)
    assert time.monotonic() - start > 1  # it was counted until its record expired
