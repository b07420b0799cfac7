"""API -> real Redis -> a real Celery worker process -> real PostgreSQL, with a real (tiny) model."""

import json

import pytest
import redis
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agentloop.api.app import create_app
from agentloop.store.db import get_sessionmaker
from agentloop.store.models import Episode, Reward, Step
from tests.factories import bearer
from tests.processes import ended, wait_for

pytestmark = pytest.mark.services


@pytest.fixture
def production(production_keys):
    return TestClient(create_app()), production_keys


def sse_events(client, task_id, key, **params):
    events = []
    with client.stream("GET", f"/v1/tasks/{task_id}/events", params=params, headers=bearer(key)) as resp:
        assert resp.status_code == 200
        event = None
        for line in resp.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("id:"):
                pass
            elif line.startswith("data:"):
                events.append((event, json.loads(line.split(":", 1)[1])))
    return events


def test_task_runs_to_a_rewarded_episode_through_redis_and_a_worker(production, processes, redis_url):
    client, keys = production
    processes.start("worker", "--queues", "episodes,maintenance")
    resp = client.post("/v1/tasks", json={"task_ref": "wallet_send_money-2"}, headers=bearer(keys.tenant_a_client))
    assert resp.status_code == 202
    task_id = resp.json()["id"]
    assert redis.Redis.from_url(redis_url).exists("_kombu.binding.episodes")  # the message went through Redis

    # stream while it runs: every step in order, then the result
    events = sse_events(client, task_id, keys.tenant_a_client)
    kinds = [e for e, _ in events]
    assert kinds[0] == "attempt" and kinds[-1] == "result"
    steps = [d for e, d in events if e == "step"]
    assert [s["index"] for s in steps] == [0, 1, 2]

    task = wait_for(lambda: ended(task_id), 120, "the task to end", processes.logs)
    assert task.status == "finished", task.error
    assert task.reward is not None and 0.0 <= task.reward < 1.0 and task.success is False
    result = events[-1][1]
    assert result["status"] == "finished" and result["reward"] == task.reward

    with get_sessionmaker()() as s:
        (episode,) = s.scalars(sa.select(Episode).where(Episode.task_id == task_id)).all()
        assert (episode.status, episode.finish_reason, episode.attempt) == ("finished", "max_turns", 1)
        rows = s.scalars(sa.select(Step).where(Step.episode_id == episode.id).order_by(Step.index)).all()
        assert len(rows) == 3
        for row in rows:
            assert 1 <= len(row.output_token_ids) <= 16
            assert len(row.output_logprobs) == len(row.output_token_ids)
            assert all(lp <= 0.0 for lp in row.output_logprobs)
            assert row.observation and row.observation_token_ids
        (reward,) = s.scalars(sa.select(Reward).where(Reward.task_id == task_id)).all()
        assert reward.source == "evaluator" and reward.details["total"] >= 2
        assert reward.value == task.reward

    # the steps endpoint gives the same exact tokens the stream did
    page = client.get(f"/v1/tasks/{task_id}/steps", headers=bearer(keys.tenant_a_client)).json()
    assert [s["output_token_ids"] for s in page["items"]] == [s["output_token_ids"] for s in steps]
    assert page["episode"]["prompt_token_ids"][:3] == episode.prompt_token_ids[:3]

    # a reconnecting client resumes after the last event it saw, with no gap and no duplicate
    resumed = sse_events(client, task_id, keys.tenant_a_client, after="1.0")
    assert [d["index"] for e, d in resumed if e == "step"] == [1, 2]

    # feedback on the finished task is stored as a client reward
    fb = client.post(f"/v1/tasks/{task_id}/feedback", json={"reward": 1.0}, headers=bearer(keys.tenant_a_client))
    assert fb.status_code == 201


def test_cancel_stops_a_running_episode(production, processes, configure_env):
    configure_env(AGENT_MAX_TURNS=400)
    client, keys = production
    processes.start("worker", "--queues", "episodes")
    task_id = client.post(
        "/v1/tasks", json={"task_ref": "wallet_balance-1"}, headers=bearer(keys.tenant_a_client)
    ).json()["id"]

    def some_steps():
        with get_sessionmaker()() as s:
            return s.scalar(
                sa.select(sa.func.count()).select_from(Step).join(Episode).where(Episode.task_id == task_id)
            )

    wait_for(some_steps, 120, "the first step", processes.logs)
    assert client.post(f"/v1/tasks/{task_id}/cancel", headers=bearer(keys.tenant_a_client)).status_code == 200
    task = wait_for(lambda: ended(task_id), 60, "the task to stop", processes.logs)
    assert task.status == "cancelled"
    # cut short by the client, so not evaluated: no reward to report, none to train on
    public = client.get(f"/v1/tasks/{task_id}", headers=bearer(keys.tenant_a_client)).json()
    assert (public["status"], public["reward"], public["success"]) == ("cancelled", None, None)
    with get_sessionmaker()() as s:
        episode = s.scalars(sa.select(Episode).where(Episode.task_id == task_id)).one()
        assert episode.finish_reason == "cancelled" and 1 <= episode.num_steps < 400
        assert s.scalars(sa.select(Reward).where(Reward.task_id == task_id)).all() == []
