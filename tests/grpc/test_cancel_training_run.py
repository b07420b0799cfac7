"""AdminService.CancelTrainingRun over a real channel: what REST's cancel does, with gRPC status codes."""

import asyncio

import grpc
import sqlalchemy as sa

from agentloop.api.auth import create_key
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.store.db import session_scope
from agentloop.store.models import TrainingRun, TrainingRunStatus, utcnow
from agentloop.store.training_runs import claim_run
from tests.grpc.conftest import auth
from tests.grpc.test_agent_service import expect_error


def test_cancel_training_run_and_its_status_codes(api):
    admin = auth(api.keys.tenant_a_admin)
    with session_scope() as s:
        _, other_admin = create_key(s, "tenant-b", "admin")

    async def scenario():
        async with api.connect() as c:
            queued = await c.admin.Train(pb.TrainRequest(), metadata=admin)
            running = await c.admin.Train(pb.TrainRequest(), metadata=admin)
            finished = await c.admin.Train(pb.TrainRequest(), metadata=admin)
            claim_run(running.id, "a-learner", 60)
            with session_scope() as s:
                s.execute(
                    sa.update(TrainingRun)
                    .where(TrainingRun.id == finished.id)
                    .values(status=TrainingRunStatus.FINISHED, finished_at=utcnow())
                )

            def call(run_id, metadata):
                return c.admin.CancelTrainingRun(pb.CancelTrainingRunRequest(run_id=run_id), metadata=metadata)

            error = await expect_error(
                grpc.StatusCode.PERMISSION_DENIED, lambda: call(queued.id, auth(api.keys.tenant_a_client)), "admin key"
            )
            assert dict(error.trailing_metadata())["agentloop-error-code"] == "permission_denied"
            await expect_error(grpc.StatusCode.NOT_FOUND, lambda: call("nope", admin), "no training run 'nope'")
            await expect_error(grpc.StatusCode.NOT_FOUND, lambda: call(queued.id, auth(other_admin)), "no training run")
            await expect_error(
                grpc.StatusCode.FAILED_PRECONDITION, lambda: call(finished.id, admin), "already ended (finished)"
            )
            return await call(queued.id, admin), await call(running.id, admin)

    cancelled, stopping = asyncio.run(scenario())
    assert cancelled.status == pb.TRAINING_RUN_STATUS_CANCELLED and cancelled.cancel_requested
    assert cancelled.HasField("finished_at") and "cancelled by an admin of tenant 'tenant-a'" in cancelled.error
    assert stopping.status == pb.TRAINING_RUN_STATUS_RUNNING and stopping.cancel_requested
    with session_scope() as s:
        assert {r.id: r.status for r in s.scalars(sa.select(TrainingRun))}[cancelled.id] == "cancelled"
