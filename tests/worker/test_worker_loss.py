"""`kill -9` of a worker in the middle of an episode: the task is re-run or failed with a reason,
never left running."""

import os
import signal

import pytest
import sqlalchemy as sa

from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.migrate import upgrade
from agentloop.store.models import Episode, Step, Task
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


def running_on(pid: int) -> set[str]:
    """The episodes running on the worker process `pid` (a task's lease owner names its process)."""
    with get_sessionmaker()() as s:
        query = (
            sa.select(Episode.id)
            .join(Task, Task.id == Episode.task_id)
            .where(Episode.status == "running", Task.lease_owner.like(f"%:{pid}:%"))
        )
        return set(s.scalars(query).all())


def stepping_on(pid: int) -> bool:
    """`pid` has an episode running with at least one step written."""
    with get_sessionmaker()() as s:
        query = (
            sa.select(Episode.id)
            .join(Task, Task.id == Episode.task_id)
            .where(Episode.status == "running", Episode.num_steps >= 1, Task.lease_owner.like(f"%:{pid}:%"))
        )
        return s.scalars(query).first() is not None


def test_twenty_kills_in_a_row_lose_no_task_and_leave_none_stuck(production, processes, configure_env):
    """A worker killed mid-episode twenty times in a row, the next one loading while the last one runs: every
    task ends (finished), every killed episode is marked abandoned by the sweeper, and every episode's steps
    are whole."""
    configure_env(MAX_ATTEMPTS=30, AGENT_MAX_TURNS=20)  # short episodes: the survivor finishes all six soon
    tasks = [submit() for _ in range(6)]
    processes.start("beat", name="beat")
    processes.start("worker", "--queues", "maintenance", name="sweeper")
    killed: set[str] = set()
    victim = processes.start("worker", "--queues", "episodes", name="victim0")
    for kill in range(20):
        upcoming = processes.start("worker", "--queues", "episodes", name=f"victim{kill + 1}") if kill < 19 else None
        wait_for(lambda v=victim: stepping_on(v.pid), 120, f"victim {kill}'s first step", processes.logs)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        killed |= running_on(victim.pid)  # what it ran when it died: nobody has touched those rows yet
        victim = upcoming
    assert len(killed) >= 15  # most kills land mid-episode (they are timed just after a step)
    processes.start("worker", "--queues", "episodes", name="survivor")
    for task_id in tasks:
        task = wait_for(lambda t=task_id: ended(t), 300, f"task {task_id} to end", processes.logs)
        assert task.status == "finished", task.error
    with get_sessionmaker()() as s:
        episodes = s.scalars(sa.select(Episode).where(Episode.task_id.in_(tasks))).all()
        lost = [e for e in episodes if e.status == "abandoned"]
        assert {e.id for e in lost} == killed and all(e.finish_reason == "worker_lost" for e in lost)
        assert not [e for e in episodes if e.status == "running"]
        for e in episodes:  # no half-written step: the count the episode says is the rows it has, 0..n-1
            indexes = s.scalars(sa.select(Step.index).where(Step.episode_id == e.id).order_by(Step.index)).all()
            assert list(indexes) == list(range(e.num_steps)), (e.id, e.num_steps, indexes)


def blocked_backends() -> list[int]:
    with get_sessionmaker()() as s:
        return list(
            s.scalars(
                sa.text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).all()
        )


def terminate_idle_connections() -> int:
    """Terminate every other connection to this test's database that is idle in its pool: what a PostgreSQL
    restart, a failover or a network cut does to the worker's pooled connections between two writes (one
    cut inside a write ends that attempt: the other case below)."""
    with get_sessionmaker()() as s:
        return len(
            s.scalars(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'idle'"
                )
            ).all()
        )


def test_a_workers_connection_cut_in_the_middle_of_a_step_write(production, processes, postgres_url):
    """The worker's connection is cut while it writes a step (its UPDATE waits on a row lock the test holds,
    then its backend is terminated): that step's transaction is rolled back whole, the attempt is closed as
    `transient_error`, the task is released and run again, and it finishes; a cut between two writes is not
    even noticed (each write checks its connection out, and the pool pings it first)."""
    task_id = submit()
    processes.start("worker", "--queues", "episodes,maintenance", "--beat", name="worker")
    wait_for(lambda: steps_of_attempt(task_id, 1) >= 2, 120, "two steps", processes.logs)
    wait_for(terminate_idle_connections, 30, "an idle connection to cut", processes.logs)  # the attempt goes on
    done = steps_of_attempt(task_id, 1)
    wait_for(lambda: steps_of_attempt(task_id, 1) >= done + 2, 60, "steps after the cut", processes.logs)
    locker = sa.create_engine(postgres_url)
    with locker.connect() as conn:
        held = conn.begin()
        conn.execute(sa.select(Episode.id).where(Episode.task_id == task_id).with_for_update())
        pids = wait_for(blocked_backends, 60, "the worker's step write to wait on the lock", processes.logs)
        with get_sessionmaker()() as s:
            for pid in pids:
                s.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        held.rollback()
    locker.dispose()
    task = wait_for(lambda: ended(task_id), 180, "the task to end", processes.logs)
    assert task.status == "finished" and task.attempts == 2, (task.status, task.attempts, task.error)
    with get_sessionmaker()() as s:
        episodes = s.scalars(sa.select(Episode).where(Episode.task_id == task_id).order_by(Episode.attempt)).all()
        assert [(e.attempt, e.status, e.finish_reason) for e in episodes] == [
            (1, "abandoned", "transient_error"),
            (2, "finished", "max_turns"),
        ]
        for e in episodes:  # no half-written step: the count the episode says is the rows it has, 0..n-1
            indexes = s.scalars(sa.select(Step.index).where(Step.episode_id == e.id).order_by(Step.index)).all()
            assert list(indexes) == list(range(e.num_steps)), (e.id, e.num_steps, indexes)
    assert "given back to the queue: database unavailable during the episode" in processes.everything()
