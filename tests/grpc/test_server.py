"""The server around the services: standard health, reflection, graceful shutdown."""

import asyncio
import time
from types import SimpleNamespace

import grpc
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.store import episodes as episode_store
from agentloop.store.db import session_scope
from agentloop.store.models import Episode, Task, TaskStatus, utcnow
from tests.grpc.conftest import auth


def test_health_overall_and_per_service(api):
    async def scenario():
        async with api.connect() as c:
            stub = health_pb2_grpc.HealthStub(c.channel)
            statuses = {
                name: (await stub.Check(health_pb2.HealthCheckRequest(service=name))).status
                for name in ("", "agentloop.v1.AgentService", "agentloop.v1.AdminService")
            }
            try:
                await stub.Check(health_pb2.HealthCheckRequest(service="agentloop.v1.Nothing"))
            except grpc.aio.AioRpcError as exc:
                unknown = exc.code()
            return statuses, unknown

    statuses, unknown = asyncio.run(scenario())
    assert set(statuses.values()) == {health_pb2.HealthCheckResponse.SERVING}
    assert unknown == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_services_and_describes_them(api):
    async def scenario():
        async with api.connect() as c:
            stub = reflection_pb2_grpc.ServerReflectionStub(c.channel)
            requests = [
                reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="agentloop.v1.AgentService"),
            ]
            return [r async for r in stub.ServerReflectionInfo(iter(requests))]

    listed, described = asyncio.run(scenario())
    assert {s.name for s in listed.list_services_response.service} == {
        "agentloop.v1.AgentService",
        "agentloop.v1.AdminService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in described.file_descriptor_response.file_descriptor_proto
    ]
    agent = next(f for f in files if f.name == "agentloop/v1/agent.proto")
    methods = {m.name: m for s in agent.service for m in s.method}
    assert methods["StreamSteps"].server_streaming and methods["RunTask"].server_streaming
    assert methods["StreamTrainingProgress"].server_streaming and not methods["SubmitTask"].server_streaming


def running_task_with_one_step(task_id: str) -> None:
    """The store as a worker leaves it mid-episode: the task running, attempt 1, step 0 committed."""
    turn = SimpleNamespace(
        index=0,
        prompt_token_count=3,
        output_token_ids=[5, 6],
        output_logprobs=[-0.5, -0.25],
        output_text="hi",
        finish_reason="stop",
        action=None,
        observation="Error: no tool call",
        observation_token_ids=[7],
        error_kind="parse_error",
        gen_s=0.01,
        env_s=0.0,
    )
    with session_scope() as s:
        task = s.get(Task, task_id)
        task.status, task.attempts, task.started_at = TaskStatus.RUNNING, 1, utcnow()
        episode = Episode(
            task_id=task_id, attempt=1, world="builtin", instruction="x", policy="test", prompt_token_ids=[1]
        )
        s.add(episode)
        s.flush()
        episode_store.add_step(s, episode.id, turn)


def test_graceful_stop_lets_a_running_stream_finish_and_refuses_new_calls(api):
    key = auth(api.keys.tenant_a_client)

    async def scenario():
        async with api.connect() as c:
            task = (await c.agent.SubmitTask(pb.SubmitTaskRequest(task_ref="wallet_balance-1"), metadata=key)).task
            running_task_with_one_step(task.id)
            stream = c.agent.StreamSteps(pb.StreamStepsRequest(task_id=task.id), metadata=key)
            events = [await stream.read(), await stream.read()]  # attempt, step 0: the stream is live
            stopped = api.server.stop_soon(grace_s=20)
            await asyncio.sleep(0.2)
            try:
                await c.agent.GetTask(pb.GetTaskRequest(task_id=task.id), metadata=key, timeout=5)
                refused = None
            except grpc.aio.AioRpcError as exc:
                refused = exc.code()
            with session_scope() as s:  # the worker finishes the task while the server drains
                row = s.get(Task, task.id)
                row.status, row.finished_at, row.reward = TaskStatus.FINISHED, utcnow(), 0.5
            start = time.monotonic()
            while (event := await stream.read()) is not grpc.aio.EOF:
                events.append(event)
            code = await stream.code()
            await asyncio.wrap_future(stopped)
            return events, refused, code, time.monotonic() - start

    events, refused, code, drained_in = asyncio.run(scenario())
    assert refused == grpc.StatusCode.UNAVAILABLE
    assert [e.WhichOneof("event") for e in events] == ["attempt", "step", "result"]
    assert events[-1].result.status == pb.TASK_STATUS_FINISHED and events[-1].result.reward == 0.5
    assert code == grpc.StatusCode.OK
    assert drained_in < 10  # the server stopped as soon as its last stream ended, not at the grace's end
