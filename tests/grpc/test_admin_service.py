"""AdminService over a real channel: training runs and their progress stream, adapters, admin-only."""

import asyncio
import json
import threading

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf import json_format, struct_pb2

from agentloop.learner.adapters import directory_sha256
from agentloop.learner.run import run_training
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import Adapter, TrainingRun, TrainingRunStatus, utcnow
from tests.grpc.conftest import auth
from tests.grpc.test_agent_service import expect_error
from tests.learner.conftest import lights_model_dir, lights_world  # noqa: F401 (fixtures, by name)


def struct(value: dict) -> struct_pb2.Struct:
    return json_format.ParseDict(value, struct_pb2.Struct())


def update_run(run_id: str, **values) -> None:
    with session_scope() as s:
        s.execute(sa.update(TrainingRun).where(TrainingRun.id == run_id).values(**values))


TRAIN_LIGHTS = {
    "world": "lights",
    "tasks_per_iteration": 4,
    "rollouts_per_task": 4,
    "max_turns": 1,
    "max_new_tokens": 40,
    "dev_limit": 2,
    "dev_max_turns": 1,
    "promotion_tolerance": 100.0,
    "seed": 0,  # seeded: this model's 16 rollouts earn unequal rewards, so the iteration updates and gates
}


def phases(progress_dicts) -> list[str]:
    """The phases in order, each run of equal ones once."""
    out: list[str] = []
    for progress in progress_dicts:
        phase = progress.get("phase")
        if phase is not None and (not out or out[-1] != phase):
            out.append(phase)
    return out


class Lockstep:
    """The learner's reporter waits, at each new phase, until the stream has shown that progress: the
    stream must then deliver every phase (not only those a poll happens to catch), in order."""

    def __init__(self) -> None:
        self.reported: list[dict] = []
        self.streamed: list[dict] = []
        self.since = 0  # streamed[since:] came after the last phase was shown
        self.changed = threading.Condition()

    def report(self, progress: dict) -> None:  # the learner's thread, after db_reporter wrote it
        shown = {k: v for k, v in progress.items() if k != "metrics"}
        new_phase = not self.reported or self.reported[-1]["phase"] != progress["phase"]
        self.reported.append(progress)
        if new_phase:
            with self.changed:
                if not self.changed.wait_for(lambda: shown in self.streamed[self.since :], timeout=30):
                    raise AssertionError(f"the stream never showed {shown}; it showed {self.streamed}")
                self.since = len(self.streamed)

    def stream(self, progress: dict) -> None:  # the client's loop
        with self.changed:
            self.streamed.append(progress)
            self.changed.notify_all()


def test_progress_streams_the_learners_phases_until_the_run_ends(api, configure_env, request):
    request.getfixturevalue("lights_world")
    configure_env(MODEL=str(request.getfixturevalue("lights_model_dir")), MAX_BATCH_SIZE=16)
    admin = auth(api.keys.tenant_a_admin)
    lockstep = Lockstep()
    outcome: list[str] = []

    def learner(run_id: str) -> None:  # the real trainer with its real reporter, as a learner worker runs it
        outcome.append(run_training(run_id, "test-learner", get_settings(), report=lockstep.report))

    async def scenario():
        async with api.connect() as c:
            run = await c.admin.Train(pb.TrainRequest(iterations=1, config=struct(TRAIN_LIGHTS)), metadata=admin)
            got = await c.admin.GetTrainingRun(pb.GetTrainingRunRequest(run_id=run.id), metadata=admin)
            updates, thread = [], threading.Thread(target=learner, args=(run.id,))
            stream = c.admin.StreamTrainingProgress(pb.StreamTrainingProgressRequest(run_id=run.id), metadata=admin)
            async for update in stream:
                updates.append(update)
                lockstep.stream(json_format.MessageToDict(update.progress))
                if len(updates) == 1:
                    thread.start()
            thread.join(60)
            return run, got, updates, await stream.code()

    run, got, updates, code = asyncio.run(scenario())
    assert outcome == ["finished"], updates[-1].error
    assert run.status == pb.TRAINING_RUN_STATUS_QUEUED and run.algo == "loop" and run.trigger == "admin"
    config = json_format.MessageToDict(run.config)
    assert config["world"] == "lights" and config["iterations"] == 1 and config["rollouts_per_task"] == 4
    assert got == run
    assert updates[0].status == pb.TRAINING_RUN_STATUS_QUEUED
    assert {u.status for u in updates[1:-1]} == {pb.TRAINING_RUN_STATUS_RUNNING}
    streamed = [json_format.MessageToDict(u.progress) for u in updates]
    reported = phases(lockstep.reported)
    # the producer's phases, all of them, in its order, then the end
    assert reported == ["rollouts", "updating", "evaluating", "saving", "evaluating", "iteration_done"]
    assert phases(streamed) == ["queued", *reported, "finished"]
    rollouts = [p for p in streamed if p.get("phase") == "rollouts"]
    assert rollouts[0]["rollouts_done"] == 0 and rollouts[0]["rollouts_total"] == 16
    last = updates[-1]
    assert last.status == pb.TRAINING_RUN_STATUS_FINISHED and last.HasField("finished_at")
    assert last.iteration == 1 and len(last.metrics) == 1
    metrics = json_format.MessageToDict(last.metrics[0])
    assert metrics["rollouts"] == 16 and last.adapter == metrics["adapter"]
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
        ({"config": struct({"world": "nowhere"})}, "unknown world 'nowhere'"),  # refused before it is queued
        ({"config": struct({"app": "nope"})}, "no registered app named 'nope' for this tenant"),
        ({"recipe": "fastest"}, "unknown recipe 'fastest'"),
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


def test_a_recipe_queues_its_phases_as_one_run(api):
    async def scenario():
        async with api.connect() as c:
            return await c.admin.Train(pb.TrainRequest(recipe="default"), metadata=auth(api.keys.tenant_a_admin))

    run = asyncio.run(scenario())
    assert run.status == pb.TRAINING_RUN_STATUS_QUEUED and run.algo == "sft+stepagent-implicit+loop+step"
    config = json_format.MessageToDict(run.config)
    assert config["phases"] == ["sft:2", "stepagent-implicit:3", "loop+step:3"] and config["iterations"] == 8


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
    admin = auth(api.keys.operator)  # the shared adapter's versions: the operator's
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
