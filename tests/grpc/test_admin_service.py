"""AdminService over a real channel: training runs and their progress stream, adapters, admin-only."""

import asyncio
import json

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf import json_format, struct_pb2

from agentloop.learner.adapters import directory_sha256
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.store.db import session_scope
from agentloop.store.models import Adapter, TrainingRun, TrainingRunStatus, utcnow
from tests.grpc.conftest import auth
from tests.grpc.test_agent_service import expect_error


def struct(value: dict) -> struct_pb2.Struct:
    return json_format.ParseDict(value, struct_pb2.Struct())


def update_run(run_id: str, **values) -> None:
    with session_scope() as s:
        s.execute(sa.update(TrainingRun).where(TrainingRun.id == run_id).values(**values))


def test_train_queues_a_run_and_its_progress_streams_until_it_ends(api):
    admin = auth(api.keys.tenant_a_admin)

    async def scenario():
        async with api.connect() as c:
            run = await c.admin.Train(
                pb.TrainRequest(iterations=2, config=struct({"tasks_per_iteration": 8, "lr": 1e-5})), metadata=admin
            )
            got = await c.admin.GetTrainingRun(pb.GetTrainingRunRequest(run_id=run.id), metadata=admin)
            updates = []
            stream = c.admin.StreamTrainingProgress(pb.StreamTrainingProgressRequest(run_id=run.id), metadata=admin)
            async for update in stream:
                updates.append(update)
                # the learner's side, as it would write it: start, report progress, finish
                if len(updates) == 1:
                    update_run(
                        run.id,
                        status=TrainingRunStatus.RUNNING,
                        started_at=utcnow(),
                        progress={"phase": "rollouts", "done": 3},
                    )
                elif len(updates) == 2:
                    update_run(run.id, iteration=1, metrics=[{"reward/mean": 0.25, "loss/clip_frac": 0.1}])
                elif len(updates) == 3:
                    update_run(run.id, status=TrainingRunStatus.FINISHED, finished_at=utcnow(), adapter="tiny@v1")
            return run, got, updates, await stream.code()

    run, got, updates, code = asyncio.run(scenario())
    assert run.status == pb.TRAINING_RUN_STATUS_QUEUED and run.algo == "loop" and run.trigger == "admin"
    config = json_format.MessageToDict(run.config)
    assert config["tasks_per_iteration"] == 8 and config["iterations"] == 2 and config["lr"] == 1e-5
    assert got == run
    assert [u.status for u in updates] == [
        pb.TRAINING_RUN_STATUS_QUEUED,
        pb.TRAINING_RUN_STATUS_RUNNING,
        pb.TRAINING_RUN_STATUS_RUNNING,
        pb.TRAINING_RUN_STATUS_FINISHED,
    ]
    assert json_format.MessageToDict(updates[1].progress) == {"phase": "rollouts", "done": 3}
    assert updates[2].iteration == 1 and json_format.MessageToDict(updates[2].metrics[0])["reward/mean"] == 0.25
    assert updates[3].adapter == "tiny@v1" and updates[3].HasField("finished_at")
    assert code == grpc.StatusCode.OK  # the stream ended by itself, cleanly


def test_a_finished_run_streams_its_state_once_and_ends(api):
    admin = auth(api.keys.tenant_a_admin)

    async def scenario():
        async with api.connect() as c:
            run = await c.admin.Train(pb.TrainRequest(), metadata=admin)
            update_run(run.id, status=TrainingRunStatus.FAILED, error="out of memory")
            request = pb.StreamTrainingProgressRequest(run_id=run.id)
            return [u async for u in c.admin.StreamTrainingProgress(request, metadata=admin)]

    (only,) = asyncio.run(scenario())
    assert only.status == pb.TRAINING_RUN_STATUS_FAILED and only.error == "out of memory"


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"algo": "ppo"}, "algo"),
        ({"iterations": 5000}, "iterations"),
        ({"config": struct({"colour": "red"})}, "unknown training option(s): colour"),
        ({"config": struct({"rollouts_per_task": 1})}, "rollouts_per_task must be >= 2"),
    ],
)
def test_bad_training_requests_are_invalid_argument(api, fields, needle):
    async def scenario():
        async with api.connect() as c:
            request = pb.TrainRequest(**fields)
            await expect_error(
                grpc.StatusCode.INVALID_ARGUMENT,
                lambda: c.admin.Train(request, metadata=auth(api.keys.tenant_a_admin)),
                needle,
            )

    asyncio.run(scenario())
    with session_scope() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(TrainingRun)) == 0


def test_admin_calls_need_an_admin_key(api):
    client = auth(api.keys.tenant_a_client)

    async def scenario():
        async with api.connect() as c:
            run = await c.admin.Train(pb.TrainRequest(), metadata=auth(api.keys.tenant_a_admin))
            for call in [
                lambda: c.admin.Train(pb.TrainRequest(), metadata=client),
                lambda: c.admin.Train(pb.TrainRequest(algo="ppo"), metadata=client),  # refused before validation
                lambda: c.admin.GetTrainingRun(pb.GetTrainingRunRequest(run_id=run.id), metadata=client),
                lambda: c.admin.StreamTrainingProgress(
                    pb.StreamTrainingProgressRequest(run_id=run.id), metadata=client
                ),
                lambda: c.admin.ListAdapters(pb.ListAdaptersRequest(), metadata=client),
                lambda: c.admin.ActivateAdapter(pb.ActivateAdapterRequest(name="x@v1"), metadata=client),
            ]:
                error = await expect_error(grpc.StatusCode.PERMISSION_DENIED, call, "admin key")
                assert dict(error.trailing_metadata())["agentloop-error-code"] == "permission_denied"
            for call in [
                lambda: c.admin.GetTrainingRun(
                    pb.GetTrainingRunRequest(run_id="nope"), metadata=auth(api.keys.tenant_a_admin)
                ),
                lambda: c.admin.StreamTrainingProgress(
                    pb.StreamTrainingProgressRequest(run_id="nope"), metadata=auth(api.keys.tenant_a_admin)
                ),
            ]:
                await expect_error(grpc.StatusCode.NOT_FOUND, call, "no training run 'nope'")

    asyncio.run(scenario())
    with session_scope() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(TrainingRun)) == 1


def add_adapter(root, version: int, status: str, *, tamper: bool = False) -> str:
    path = root / f"v{version}"
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 4, "version": version}))
    digest = directory_sha256(path)
    if tamper:
        (path / "adapter_config.json").write_text("{}")
    name = f"tiny@v{version}"
    with session_scope() as s:
        s.add(
            Adapter(
                name=name,
                base_model="tiny",
                version=version,
                parent=f"tiny@v{version - 1}" if version > 1 else None,
                path=str(path),
                sha256=digest,
                status=status,
                metrics={"dev_tgc": 0.1 * version},
                activated_at=utcnow() if status == "active" else None,
            )
        )
    return name


def test_list_and_activate_adapters_including_rollback(api, tmp_path):
    admin = auth(api.keys.tenant_a_admin)
    v1 = add_adapter(tmp_path, 1, "retired")
    v2 = add_adapter(tmp_path, 2, "active")
    v3 = add_adapter(tmp_path, 3, "candidate", tamper=True)

    async def scenario():
        async with api.connect() as c:
            before = await c.admin.ListAdapters(pb.ListAdaptersRequest(), metadata=admin)
            rolled_back = await c.admin.ActivateAdapter(pb.ActivateAdapterRequest(name=v1), metadata=admin)
            after = await c.admin.ListAdapters(pb.ListAdaptersRequest(base_model="tiny"), metadata=admin)
            none = await c.admin.ListAdapters(pb.ListAdaptersRequest(base_model="other"), metadata=admin)
            await expect_error(
                grpc.StatusCode.NOT_FOUND,
                lambda: c.admin.ActivateAdapter(pb.ActivateAdapterRequest(name="tiny@v9"), metadata=admin),
                "no adapter 'tiny@v9'",
            )
            await expect_error(
                grpc.StatusCode.FAILED_PRECONDITION,
                lambda: c.admin.ActivateAdapter(pb.ActivateAdapterRequest(name=v3), metadata=admin),
                "do not match their sha256",
            )
            return before, rolled_back, after, none

    before, rolled_back, after, none = asyncio.run(scenario())
    assert [(a.name, a.status) for a in before.adapters] == [
        (v3, pb.ADAPTER_STATUS_CANDIDATE),
        (v2, pb.ADAPTER_STATUS_ACTIVE),
        (v1, pb.ADAPTER_STATUS_RETIRED),
    ]
    assert before.adapters[1].parent == v1 and json_format.MessageToDict(before.adapters[1].metrics) == {"dev_tgc": 0.2}
    assert (
        rolled_back.name == v1
        and rolled_back.status == pb.ADAPTER_STATUS_ACTIVE
        and rolled_back.HasField("activated_at")
    )
    assert {a.name: a.status for a in after.adapters} == {
        v3: pb.ADAPTER_STATUS_CANDIDATE,  # a changed adapter is never activated
        v2: pb.ADAPTER_STATUS_RETIRED,
        v1: pb.ADAPTER_STATUS_ACTIVE,
    }
    assert list(none.adapters) == []
