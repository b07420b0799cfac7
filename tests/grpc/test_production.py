"""gRPC -> real Redis -> a real Celery worker process -> real PostgreSQL, with a real (tiny) model:
RunTask streams the episode as the worker stores it, woken by Redis notices."""

import asyncio

import pytest
import sqlalchemy as sa

from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.store.db import get_sessionmaker
from agentloop.store.models import Episode, Step
from tests.grpc.conftest import ServerThread, auth
from tests.processes import ended, wait_for

pytestmark = pytest.mark.services


@pytest.fixture
def production_server(production_keys):
    server = ServerThread()
    yield server, production_keys
    server.close()


def test_run_task_through_redis_and_a_worker(production_server, processes):
    server, keys = production_server
    processes.start("worker", "--queues", "episodes,maintenance")

    async def scenario():
        async with server.connect() as c:
            request = pb.SubmitTaskRequest(task_ref="wallet_send_money-2")
            call = c.agent.RunTask(request, metadata=auth(keys.tenant_a_client), timeout=180)
            return [e async for e in call]

    events = asyncio.run(scenario())
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds == ["submitted", "attempt", "step", "step", "step", "result"], kinds
    task_id = events[0].submitted.id
    task = wait_for(lambda: ended(task_id), 60, "the task to end", processes.logs)
    assert events[-1].result.status == pb.TASK_STATUS_FINISHED and events[-1].result.reward == task.reward
    with get_sessionmaker()() as s:
        rows = s.scalars(sa.select(Step).join(Episode).where(Episode.task_id == task_id).order_by(Step.index)).all()
    assert [list(e.step.output_token_ids) for e in events[2:5]] == [r.output_token_ids for r in rows]
