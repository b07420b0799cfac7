"""`kill -9` of a worker in the middle of an episode: the task is re-run or failed with a reason,
never left running."""

import os
import signal

import pytest
import sqlalchemy as sa

from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.migrate import upgrade
from agentloop.store.models import Episode, Task
from agentloop.worker.dispatch import publish_episode
from tests.processes import ended, task_row, wait_for

pytestmark = pytest.mark.services


@pytest.fixture
def production(postgres_url, redis_url, tiny_model_dir, configure_env):
    configure_env(
        DATABASE_URL=postgres_url,
        BROKER_URL=redis_url,
        MODEL=tiny_model_dir,
        LEASE_S=4,
        SWEEP_INTERVAL_S=1,
        AGENT_MAX_TURNS=30,
        AGENT_MAX_NEW_TOKENS=24,
        TORCH_THREADS=1,
    )
    upgrade(postgres_url)


def submit() -> str:
    from agentloop.api.auth import get_or_create_tenant

    with session_scope() as s:
        tenant = get_or_create_tenant(s, "t")
        task = Task(
            tenant_id=tenant.id,
            world="builtin",
            task_ref="wallet_balance-2",
            instruction="x",
            apps=["wallet"],
            options={},
            request_hash="h",
        )
        s.add(task)
        s.flush()
        task_id = task.id
    assert publish_episode(task_id)
    return task_id


def steps_of_attempt(task_id: str, attempt: int) -> int:
    with get_sessionmaker()() as s:
        return s.scalar(sa.select(Episode.num_steps).where(Episode.task_id == task_id, Episode.attempt == attempt)) or 0


def kill_mid_episode(processes, task_id: str) -> None:
    victim = processes.start("worker", "--queues", "episodes", name="victim")
    wait_for(lambda: steps_of_attempt(task_id, 1) >= 1, 120, "the first step", processes.logs)
    lease_before = task_row(task_id).lease_expires_at
    wait_for(lambda: task_row(task_id).lease_expires_at > lease_before, 10, "a heartbeat", processes.logs)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert task_row(task_id).status == "running"  # nobody knows yet


def test_killed_worker_task_is_rerun_by_another_worker(production, processes):
    task_id = submit()
    kill_mid_episode(processes, task_id)
    processes.start("worker", "--queues", "episodes,maintenance", "--beat", name="rescuer")
    task = wait_for(lambda: ended(task_id), 180, "the re-run to end", processes.logs)
    assert task.status == "finished" and task.attempts == 2, task.error
    with get_sessionmaker()() as s:
        episodes = s.scalars(sa.select(Episode).where(Episode.task_id == task_id).order_by(Episode.attempt)).all()
        assert [(e.attempt, e.status, e.finish_reason) for e in episodes] == [
            (1, "abandoned", "worker_lost"),
            (2, "finished", "max_turns"),
        ]
        assert episodes[0].num_steps >= 1 and episodes[1].num_steps == 30


def test_killed_worker_task_fails_with_a_reason_when_out_of_attempts(production, processes, configure_env):
    configure_env(MAX_ATTEMPTS=1)
    task_id = submit()
    kill_mid_episode(processes, task_id)
    processes.start("beat", name="beat")
    processes.start("worker", "--queues", "maintenance", name="sweeper")
    task = wait_for(lambda: ended(task_id), 60, "the task to be failed", processes.logs)
    assert task.status == "failed"
    assert "worker lost during attempt 1" in task.error and "gave up after 1 attempts" in task.error
