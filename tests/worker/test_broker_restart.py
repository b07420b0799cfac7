"""Redis restarts, empty, while tasks are queued (a private redis-server, no persistence: every message is
lost): no task is lost. The lease sweeper publishes again every queued task whose message may be gone, and
real worker processes then run each to its end."""

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.store.db import get_sessionmaker
from agentloop.store.migrate import upgrade
from tests.conftest import service_missing
from tests.factories import bearer, make_keys
from tests.processes import ended, wait_for
from tests.test_cli import free_port

pytestmark = pytest.mark.services


class PrivateRedis:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            ["redis-server", *args, "--dir", str(self.workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis.from_url(self.url)
        wait_for(lambda: self._pings(client), 20, "redis-server to start")

    @staticmethod
    def _pings(client: redis.Redis) -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def keys(self) -> int:
        return int(redis.Redis.from_url(self.url).dbsize())


@pytest.fixture
def private_redis(tmp_path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        service_missing("redis", "no redis-server binary to start a private instance with")
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


def test_tasks_queued_when_redis_restarts_empty_all_finish(
    private_redis, postgres_url, tiny_model_dir, configure_env, processes
):
    configure_env(
        DATABASE_URL=postgres_url,
        BROKER_URL=private_redis.url,
        MODEL=tiny_model_dir,
        AGENT_MAX_TURNS=3,
        AGENT_MAX_NEW_TOKENS=16,
        TORCH_THREADS=1,
        SWEEP_INTERVAL_S=2,
        REQUEUE_AFTER_S=5,
    )
    upgrade(postgres_url)
    with get_sessionmaker()() as s:
        keys = make_keys(s)
    client = TestClient(create_app())
    ids = []
    for _ in range(3):
        resp = client.post("/v1/tasks", json={"task_ref": "wallet_balance-1"}, headers=bearer(keys.tenant_a_client))
        assert resp.status_code == 202, resp.text
        ids.append(resp.json()["id"])
    assert private_redis.keys() > 0  # the messages wait in the broker
    private_redis.kill()
    private_redis.start()
    assert private_redis.keys() == 0  # and are gone with it
    started = time.monotonic()
    processes.start("worker", "--queues", "episodes", name="worker")
    processes.start("worker", "--queues", "maintenance", name="sweeper")
    processes.start("beat", name="beat")
    done = [wait_for(lambda t=t: ended(t), 180, f"task {t}", processes.logs) for t in ids]
    assert [task.status for task in done] == ["finished"] * 3, [task.error for task in done]
    assert time.monotonic() - started < 180
