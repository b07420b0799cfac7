"""A ScienceWorld task served like any other: REST -> real Redis -> a real Celery worker process (with its
simulator pool) -> real PostgreSQL, streamed over SSE."""

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.apps import scienceworld as sw
from agentloop.store.db import get_sessionmaker
from agentloop.store.models import Episode, Reward, Step, Task
from tests.factories import bearer
from tests.processes import ended, wait_for
from tests.worker.test_end_to_end import sse_events

REF = "find-plant-" + str(sw.ScienceWorld().catalogue.variations["find-plant"]["dev"][0])


def stored(task_id: str) -> tuple[Task, Episode, list[Step], list[Reward]]:
    with get_sessionmaker()() as s:
        task = s.get(Task, task_id)
        (episode,) = s.scalars(sa.select(Episode).where(Episode.task_id == task_id)).all()
        steps = list(s.scalars(sa.select(Step).where(Step.episode_id == episode.id).order_by(Step.index)).all())
        rewards = list(s.scalars(sa.select(Reward).where(Reward.task_id == task_id)).all())
        s.expunge_all()
    return task, episode, steps, rewards


def assert_scored_by_the_simulator(task: Task, rewards: list[Reward]) -> None:
    (reward,) = rewards
    assert reward.source == "evaluator" and reward.value == task.reward
    assert 0.0 <= task.reward <= 1.0 and task.success is False  # three turns of a random model complete nothing
    (test,) = reward.details["tests"]
    assert test["name"] == "task completed" and test["detail"] == f"score {round(task.reward * 100)}/100"


@pytest.mark.services
def test_a_scienceworld_task_runs_through_redis_and_a_worker_streamed_over_sse(
    simulator_ready, production_keys, processes, redis_url
):
    keys = production_keys
    client = TestClient(create_app())
    processes.start("worker", "--queues", "episodes")
    resp = client.post(
        "/v1/tasks", json={"world": "scienceworld", "task_ref": REF}, headers=bearer(keys.tenant_a_client)
    )
    assert resp.status_code == 202, resp.text
    task_id = resp.json()["id"]

    events = sse_events(client, task_id, keys.tenant_a_client)
    assert [e for e, _ in events] == ["attempt", "step", "step", "step", "result"]
    task = wait_for(lambda: ended(task_id), 120, "the task to end", processes.logs)
    assert task.status == "finished", task.error
    task, episode, steps, rewards = stored(task_id)
    assert (episode.world, episode.finish_reason) == ("scienceworld", "max_turns")
    # every turn is one command to the simulator: the observation streamed is what it answered, and stored
    streamed = [d for e, d in events if e == "step"]
    assert [s["observation"] for s in streamed] == [row.observation for row in steps]
    for row in steps:
        assert row.action is None or (row.action["app"], row.action["api"]) == (sw.NAME, "act")
        assert row.observation and row.observation_token_ids
    assert_scored_by_the_simulator(task, rewards)
    assert events[-1][1]["reward"] == task.reward
