"""A gRPC stream whose key stops holding while it is open ends with UNAUTHENTICATED: revoked while it
waits on a queued task, expired (a rotated key past its grace) while it follows a training run."""

import asyncio
import time
from datetime import timedelta

import grpc
import sqlalchemy as sa

from agentloop.api import streams
from agentloop.api.auth import hash_key, rotate_key
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.store.db import session_scope
from agentloop.store.models import ApiKey, utcnow
from tests.grpc.conftest import auth


def set_key(key: str, **values) -> None:
    with session_scope() as s:
        s.execute(sa.update(ApiKey).where(ApiKey.key_hash == hash_key(key)).values(**values))


def test_a_step_stream_waiting_on_a_queued_task_ends_when_its_key_is_revoked(api):
    key = auth(api.keys.tenant_a_client)

    async def scenario():
        async with api.connect() as c:
            task = (await c.agent.SubmitTask(pb.SubmitTaskRequest(task_ref="wallet_balance-1"), metadata=key)).task
            call = c.agent.StreamSteps(pb.StreamStepsRequest(task_id=task.id), metadata=key, timeout=20)
            await asyncio.sleep(0.3)  # the stream is open and waiting (no worker: the task stays queued)
            await asyncio.to_thread(set_key, api.keys.tenant_a_client, revoked_at=utcnow())
            revoked = time.monotonic()
            try:
                events = [e async for e in call]
            except grpc.aio.AioRpcError as exc:
                return exc, time.monotonic() - revoked
            raise AssertionError(f"the stream ended cleanly with {events}")

    error, after_s = asyncio.run(scenario())
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error.details() == "the API key was revoked"
    assert dict(error.trailing_metadata())["agentloop-error-code"] == "unauthenticated"
    assert after_s < streams.KEY_RECHECK_S + 1.0  # re-checked while waiting, not only at an event


def test_a_progress_stream_ends_when_its_rotated_key_expires(api):
    old = api.keys.tenant_a_admin
    with session_scope() as s:
        old_id = s.scalars(sa.select(ApiKey.id).where(ApiKey.key_hash == hash_key(old))).one()
        _, new = rotate_key(s, old_id, 3600)

    async def scenario():
        async with api.connect() as c:
            run = await c.admin.Train(pb.TrainRequest(), metadata=auth(new))  # stays queued: no learner
            call = c.admin.StreamTrainingProgress(
                pb.StreamTrainingProgressRequest(run_id=run.id), metadata=auth(old), timeout=20
            )
            updates = [await call.read()]  # the old key still works during its grace
            await asyncio.to_thread(set_key, old, expires_at=utcnow() - timedelta(seconds=1))
            try:
                while (update := await call.read()) is not grpc.aio.EOF:
                    updates.append(update)
            except grpc.aio.AioRpcError as exc:
                return run, updates, exc
            raise AssertionError(f"the stream ended cleanly with {updates}")

    run, updates, error = asyncio.run(scenario())
    assert [u.id for u in updates] == [run.id] and updates[0].status == pb.TRAINING_RUN_STATUS_QUEUED
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error.details().startswith("the API key expired")
