"""AgentService over a real channel: episodes streamed step by step, resuming, cancel, feedback,
paging, and every kind of bad call getting its specific status code."""

import asyncio
import time

import grpc
import pytest
import sqlalchemy as sa

from agentloop.api import streams
from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from agentloop.store.db import get_sessionmaker, session_scope
from agentloop.store.models import Episode, Reward, Step, Task, TaskStatus
from tests.grpc.conftest import EpisodeThread, GatedPolicy, auth, run_task_streamed

TASK = pb.SubmitTaskRequest(task_ref="wallet_balance-1")


def stored_steps(task_id: str) -> list[Step]:
    with get_sessionmaker()() as s:
        return list(
            s.scalars(sa.select(Step).join(Episode).where(Episode.task_id == task_id).order_by(Step.index)).all()
        )


def task_row(task_id: str) -> Task:
    with get_sessionmaker()() as s:
        task = s.get(Task, task_id)
        s.expunge(task)
        return task


def assert_same_steps(received: list[pb.Step], stored: list[Step]) -> None:
    assert [s.index for s in received] == [s.index for s in stored]
    for got, row in zip(received, stored, strict=True):
        assert list(got.output_token_ids) == row.output_token_ids
        assert list(got.output_logprobs) == pytest.approx(row.output_logprobs, abs=0)
        assert got.output_text == row.output_text and got.observation == row.observation
        assert list(got.observation_token_ids) == row.observation_token_ids
        assert got.attempt == 1


async def expect_error(code: grpc.StatusCode, call, needle: str = "") -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        result = call()
        if hasattr(result, "__aiter__"):
            async for _ in result:
                pass
        else:
            await result
    assert info.value.code() == code, info.value.details()
    assert needle in info.value.details()
    return info.value


def test_run_task_streams_every_step_of_a_real_episode_in_order_then_the_result(api, tiny, configure_env):
    configure_env(AGENT_MAX_NEW_TOKENS=16)
    policy = GatedPolicy(tiny)
    request = pb.SubmitTaskRequest(task_ref="wallet_send_money-2", max_turns=3)
    run = run_task_streamed(api, request, policy)
    kinds, steps, result, episode = run.kinds, run.steps, run.result, run.episode
    assert [s.status for s in run.submitted] == [pb.TASK_STATUS_QUEUED]
    assert episode is not None and episode.finish() == "finished"
    assert kinds == ["submitted", "attempt", "step", "step", "step", "result"]
    assert_same_steps(steps, stored_steps(result.id))
    assert all(s.output_logprobs and max(s.output_logprobs) <= 0.0 for s in steps)  # sampled, not replayed
    row = task_row(result.id)
    assert result.status == pb.TASK_STATUS_FINISHED and row.status == TaskStatus.FINISHED
    assert result.HasField("reward") and result.reward == row.reward
    assert result.finished_at.ToDatetime(tzinfo=row.finished_at.tzinfo) == row.finished_at


def test_stream_resumes_after_a_disconnect_with_no_gap_and_no_duplicate(api, tiny, configure_env):
    configure_env(AGENT_MAX_NEW_TOKENS=16)
    policy = GatedPolicy(tiny)
    key = auth(api.keys.tenant_a_client)

    async def scenario():
        async with api.connect() as c:
            task = (
                await c.agent.SubmitTask(pb.SubmitTaskRequest(task_ref="wallet_balance-1", max_turns=4), metadata=key)
            ).task
            episode = EpisodeThread(task.id, policy)
            episode.start()
            first = []
            call = c.agent.StreamSteps(pb.StreamStepsRequest(task_id=task.id), metadata=key)
            policy.allow(2)
            async for event in call:
                first.append(event)
                if len(first) == 3:  # attempt, step 0, step 1
                    break
            call.cancel()  # the client goes away mid-episode
            policy.allow(2)  # steps 2 and 3 are stored while nobody listens
            last = first[-1].step
            resumed = [
                e
                async for e in c.agent.StreamSteps(
                    pb.StreamStepsRequest(task_id=task.id, attempt=last.attempt, from_index=last.index + 1),
                    metadata=key,
                )
            ]
            return task.id, episode, first, resumed

    task_id, episode, first, resumed = asyncio.run(scenario())
    assert episode.finish() == "finished"
    assert [e.WhichOneof("event") for e in first] == ["attempt", "step", "step"]
    assert [e.WhichOneof("event") for e in resumed] == ["step", "step", "result"]  # no second `attempt`
    received = [e.step for e in first + resumed if e.WhichOneof("event") == "step"]
    assert_same_steps(received, stored_steps(task_id))
    assert len(received) == 4

    # a stream of an ended task replays it at once; from_index in the middle skips what was seen
    async def replay():
        async with api.connect() as c:
            request = pb.StreamStepsRequest(task_id=task_id, from_index=2)
            return [e async for e in c.agent.StreamSteps(request, metadata=auth(api.keys.tenant_a_client))]

    events = asyncio.run(replay())
    assert [e.WhichOneof("event") for e in events] == ["attempt", "step", "step", "result"]
    assert [e.step.index for e in events[1:3]] == [2, 3]


def test_submit_get_and_idempotency(api):
    key = auth(api.keys.tenant_a_client)

    async def scenario():
        async with api.connect() as c:
            request = pb.SubmitTaskRequest(
                instruction="Tidy my notes.",
                apps=["notes", "notes"],
                seed=4,
                metadata={"k": "v"},
                idempotency_key="abc",
            )
            first = await c.agent.SubmitTask(request, metadata=key)
            again = await c.agent.SubmitTask(request, metadata=key)
            got = await c.agent.GetTask(pb.GetTaskRequest(task_id=first.task.id), metadata=key)
            request.seed = 5
            reused = await expect_error(
                grpc.StatusCode.ALREADY_EXISTS, lambda: c.agent.SubmitTask(request, metadata=key), "different request"
            )
            other_tenant = await c.agent.SubmitTask(
                pb.SubmitTaskRequest(task_ref="wallet_balance-1", idempotency_key="abc"),
                metadata=auth(api.keys.tenant_b_client),
            )
            return first, again, got, reused, other_tenant

    first, again, got, reused, other_tenant = asyncio.run(scenario())
    assert first.replayed is False and again.replayed is True and again.task.id == first.task.id
    assert got == first.task
    assert list(got.apps) == ["notes"] and dict(got.metadata) == {"k": "v"} and not got.HasField("task_ref")
    assert dict(reused.trailing_metadata())["agentloop-error-code"] == "idempotency_key_reused"
    assert other_tenant.task.id != first.task.id  # keys are per tenant
    with session_scope() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Task)) == 2
        assert s.get(Task, first.task.id).dispatched_at is not None  # published after the commit


def test_the_same_request_over_rest_and_grpc_shares_the_idempotency_key(api):
    from fastapi.testclient import TestClient

    from agentloop.api.app import create_app
    from tests.factories import bearer

    rest = TestClient(create_app()).post(
        "/v1/tasks",
        json={"task_ref": "wallet_balance-1"},
        headers={**bearer(api.keys.tenant_a_client), "Idempotency-Key": "shared"},
    )

    async def scenario():
        async with api.connect() as c:
            request = pb.SubmitTaskRequest(task_ref="wallet_balance-1", idempotency_key="shared")
            return await c.agent.SubmitTask(request, metadata=auth(api.keys.tenant_a_client))

    replay = asyncio.run(scenario())
    assert replay.replayed and replay.task.id == rest.json()["id"]


@pytest.mark.parametrize(
    ("request_fields", "needle"),
    [
        ({}, "give either `task_ref`"),
        ({"instruction": "x", "apps": ["bank"]}, "unknown app(s) 'bank'"),
        ({"task_ref": "no_such_task-1"}, "unknown task_ref"),
        ({"task_ref": "wallet_balance-1", "world": "mars"}, "unknown world"),
        ({"task_ref": "wallet_balance-1", "instruction": "x"}, "leave out"),
        ({"instruction": "x"}, "needs `apps`"),
        ({"task_ref": "wallet_balance-1", "seed": -1}, "seed"),
        ({"task_ref": "wallet_balance-1", "max_turns": 0}, "max_turns"),
        ({"task_ref": "wallet_balance-1", "temperature": 3.0}, "temperature"),
        ({"task_ref": "wallet_balance-1", "idempotency_key": "k" * 201}, "Idempotency-Key"),
        ({"instruction": "hi\u0000there", "apps": ["wallet"]}, "request.instruction: contains a NUL character"),
        ({"task_ref": "wallet_balance-1", "metadata": {"k": "\u0000"}}, "request.metadata.k: contains a NUL"),
    ],
)
def test_bad_submissions_are_invalid_argument_and_write_nothing(api, request_fields, needle):
    async def scenario():
        async with api.connect() as c:
            request = pb.SubmitTaskRequest(**request_fields)
            error = await expect_error(
                grpc.StatusCode.INVALID_ARGUMENT,
                lambda: c.agent.SubmitTask(request, metadata=auth(api.keys.tenant_a_client)),
                needle,
            )
            # RunTask validates the same way, before anything is streamed
            await expect_error(
                grpc.StatusCode.INVALID_ARGUMENT,
                lambda: c.agent.RunTask(request, metadata=auth(api.keys.tenant_a_client)),
                needle,
            )
            return error

    error = asyncio.run(scenario())
    assert dict(error.trailing_metadata())["agentloop-error-code"] == "invalid_request"
    with session_scope() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Task)) == 0


def test_a_message_over_the_size_limit_is_resource_exhausted(sqlite_db, configure_env):
    configure_env(MAX_BODY_BYTES=2048)
    from tests.grpc.conftest import ServerThread

    server = ServerThread()
    try:

        async def scenario():
            async with server.connect() as c:
                request = pb.SubmitTaskRequest(instruction="x" * 5000, apps=["notes"])
                await expect_error(grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: c.agent.SubmitTask(request))

        asyncio.run(scenario())
    finally:
        server.close()


@pytest.mark.parametrize("metadata", [(), auth("al_wrong"), (("authorization", "Basic dXNlcjpwYXNz"),), auth("")])
def test_missing_or_wrong_keys_are_unauthenticated(api, metadata):
    async def scenario():
        async with api.connect() as c:
            calls = [
                lambda: c.agent.SubmitTask(TASK, metadata=metadata),
                lambda: c.agent.ListTasks(pb.ListTasksRequest(), metadata=metadata),
                lambda: c.agent.StreamSteps(pb.StreamStepsRequest(task_id="x"), metadata=metadata),
                lambda: c.agent.RunTask(TASK, metadata=metadata),
                lambda: c.agent.ListApps(pb.ListAppsRequest(), metadata=metadata),
                lambda: c.admin.ListAdapters(pb.ListAdaptersRequest(), metadata=metadata),
            ]
            for call in calls:
                await expect_error(grpc.StatusCode.UNAUTHENTICATED, call)

    asyncio.run(scenario())
    with session_scope() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Task)) == 0


def test_a_revoked_key_is_unauthenticated(api):
    from agentloop.api.auth import hash_key
    from agentloop.store.models import ApiKey, utcnow

    with session_scope() as s:
        s.execute(
            sa.update(ApiKey).where(ApiKey.key_hash == hash_key(api.keys.tenant_b_client)).values(revoked_at=utcnow())
        )

    async def scenario():
        async with api.connect() as c:
            await expect_error(
                grpc.StatusCode.UNAUTHENTICATED,
                lambda: c.agent.SubmitTask(TASK, metadata=auth(api.keys.tenant_b_client)),
            )

    asyncio.run(scenario())


def test_a_tenant_never_sees_another_tenants_task(api):
    async def scenario():
        async with api.connect() as c:
            task = (await c.agent.SubmitTask(TASK, metadata=auth(api.keys.tenant_a_client))).task
            other = auth(api.keys.tenant_b_client)
            for call in [
                lambda: c.agent.GetTask(pb.GetTaskRequest(task_id=task.id), metadata=other),
                lambda: c.agent.StreamSteps(pb.StreamStepsRequest(task_id=task.id), metadata=other),
                lambda: c.agent.CancelTask(pb.CancelTaskRequest(task_id=task.id), metadata=other),
                lambda: c.agent.SubmitFeedback(pb.SubmitFeedbackRequest(task_id=task.id, reward=1.0), metadata=other),
            ]:
                error = await expect_error(grpc.StatusCode.NOT_FOUND, call, task.id)
                assert dict(error.trailing_metadata())["agentloop-error-code"] == "not_found"
            return task, await c.agent.ListTasks(pb.ListTasksRequest(), metadata=other)

    task, listed = asyncio.run(scenario())
    assert list(listed.tasks) == [] and listed.next_page_token == ""
    row = task_row(task.id)
    assert row.status == TaskStatus.QUEUED and not row.cancel_requested
    with session_scope() as s:
        assert s.scalar(sa.select(sa.func.count()).select_from(Reward)) == 0


def test_list_is_paged_newest_first_with_rests_cursors_and_filters_by_status(api):
    from fastapi.testclient import TestClient

    from agentloop.api.app import create_app
    from tests.factories import bearer

    key = auth(api.keys.tenant_a_client)

    async def scenario():
        async with api.connect() as c:
            ids = []
            for i in range(5):
                request = pb.SubmitTaskRequest(task_ref=f"wallet_balance-{i % 3 + 1}")
                ids.append((await c.agent.SubmitTask(request, metadata=key)).task.id)
            await c.agent.CancelTask(pb.CancelTaskRequest(task_id=ids[0]), metadata=key)
            seen, tokens, token = [], [], ""
            while True:
                page = await c.agent.ListTasks(pb.ListTasksRequest(page_size=2, page_token=token), metadata=key)
                seen += [t.id for t in page.tasks]
                token = page.next_page_token
                if not token:
                    break
                tokens.append(token)
            cancelled = await c.agent.ListTasks(pb.ListTasksRequest(status=pb.TASK_STATUS_CANCELLED), metadata=key)
            for request, needle in [
                (pb.ListTasksRequest(page_token="%%%"), "cursor"),
                (pb.ListTasksRequest(page_size=101), "between 1 and 100"),
                (pb.ListTasksRequest(page_size=-1), "between 1 and 100"),
                (pb.ListTasksRequest(status=99), "unknown status 99"),
            ]:
                await expect_error(
                    grpc.StatusCode.INVALID_ARGUMENT, lambda r=request: c.agent.ListTasks(r, metadata=key), needle
                )
            return ids, seen, tokens, cancelled

    ids, seen, tokens, cancelled = asyncio.run(scenario())
    assert seen == ids[::-1]
    assert [t.id for t in cancelled.tasks] == [ids[0]]
    # a page token is REST's cursor: either API continues the other's listing
    rest = TestClient(create_app()).get(
        "/v1/tasks", params={"limit": 2, "cursor": tokens[0]}, headers=bearer(api.keys.tenant_a_client)
    )
    assert [t["id"] for t in rest.json()["items"]] == ids[::-1][2:4]


def test_cancel_queued_then_failed_precondition_and_running_asks_the_worker(api):
    key = auth(api.keys.tenant_a_client)

    async def scenario():
        async with api.connect() as c:
            queued = (await c.agent.SubmitTask(TASK, metadata=key)).task
            cancelled = await c.agent.CancelTask(pb.CancelTaskRequest(task_id=queued.id), metadata=key)
            await expect_error(
                grpc.StatusCode.FAILED_PRECONDITION,
                lambda: c.agent.CancelTask(pb.CancelTaskRequest(task_id=queued.id), metadata=key),
                "already ended",
            )
            stream = [e async for e in c.agent.StreamSteps(pb.StreamStepsRequest(task_id=queued.id), metadata=key)]
            running = (await c.agent.SubmitTask(pb.SubmitTaskRequest(task_ref="wallet_balance-2"), metadata=key)).task
            with session_scope() as s:
                s.get(Task, running.id).status = TaskStatus.RUNNING
            asked = await c.agent.CancelTask(pb.CancelTaskRequest(task_id=running.id), metadata=key)
            await expect_error(
                grpc.StatusCode.NOT_FOUND,
                lambda: c.agent.CancelTask(pb.CancelTaskRequest(task_id="nope"), metadata=key),
            )
            return cancelled, stream, asked

    cancelled, stream, asked = asyncio.run(scenario())
    assert cancelled.status == pb.TASK_STATUS_CANCELLED and cancelled.HasField("finished_at")
    # a cancelled task's stream ends at once with its result (it never ran: no attempt, no step)
    assert [e.WhichOneof("event") for e in stream] == ["result"]
    assert stream[0].result.status == pb.TASK_STATUS_CANCELLED
    assert asked.status == pb.TASK_STATUS_RUNNING and asked.cancel_requested


def test_feedback_only_for_ended_tasks_and_validated(api):
    key = auth(api.keys.tenant_a_client)

    async def scenario():
        async with api.connect() as c:
            task = (await c.agent.SubmitTask(TASK, metadata=key)).task

            def feedback(**fields):
                return lambda: c.agent.SubmitFeedback(pb.SubmitFeedbackRequest(task_id=task.id, **fields), metadata=key)

            await expect_error(
                grpc.StatusCode.FAILED_PRECONDITION, feedback(reward=1.0), "feedback is for tasks that ended"
            )
            with session_scope() as s:
                s.get(Task, task.id).status = TaskStatus.FINISHED
            await expect_error(grpc.StatusCode.INVALID_ARGUMENT, feedback(reward=1.5), "reward")
            await expect_error(grpc.StatusCode.INVALID_ARGUMENT, feedback(reward=0.5, comment="x" * 5001), "comment")
            return task, await feedback(reward=0.75, comment="close")()

    task, stored = asyncio.run(scenario())
    assert (stored.task_id, stored.reward, stored.comment) == (task.id, 0.75, "close")
    with session_scope() as s:
        (reward,) = s.scalars(sa.select(Reward)).all()
        assert (reward.id, reward.source, reward.value, reward.comment) == (stored.id, "client", 0.75, "close")


def test_list_apps(api):
    async def scenario():
        async with api.connect() as c:
            apps = await c.agent.ListApps(pb.ListAppsRequest(), metadata=auth(api.keys.tenant_a_client))
            await expect_error(
                grpc.StatusCode.INVALID_ARGUMENT,
                lambda: c.agent.ListApps(pb.ListAppsRequest(world="mars"), metadata=auth(api.keys.tenant_a_client)),
                "unknown world",
            )
            return {a.name: a for a in apps.apps}

    apps = asyncio.run(scenario())
    assert {"api_docs", "supervisor", "notes", "wallet"} <= set(apps)
    assert apps["wallet"].api_count >= 8 and apps["wallet"].kind == pb.APP_KIND_BUILTIN


def test_a_stream_stops_at_the_deadline_and_reads_nothing_after_it(api, monkeypatch):
    deadline_s = 1.5
    reads = []
    real_read = streams.read_task_progress

    def counting_read(*args):
        reads.append(time.monotonic())
        return real_read(*args)

    monkeypatch.setattr(streams, "read_task_progress", counting_read)
    key = auth(api.keys.tenant_a_client)

    async def scenario():
        async with api.connect() as c:
            task = (await c.agent.SubmitTask(TASK, metadata=key)).task  # stays queued: no worker
            start = time.monotonic()
            call = lambda: c.agent.StreamSteps(pb.StreamStepsRequest(task_id=task.id), metadata=key, timeout=deadline_s)  # noqa: E731
            await expect_error(grpc.StatusCode.DEADLINE_EXCEEDED, call)
            elapsed = time.monotonic() - start
            count = len(reads)
            await asyncio.sleep(0.5)
            return start, elapsed, count

    # the deadline is many poll periods (0.02 s) long, so that a loaded machine still polls more than once
    start, elapsed, count = asyncio.run(scenario())
    assert deadline_s <= elapsed < deadline_s + 1.0
    assert count >= 2  # it was polling while the task waited
    assert len(reads) == count and max(reads) < start + deadline_s + 0.05  # and stopped with the deadline


def test_stream_position_must_not_be_negative(api):
    async def scenario():
        async with api.connect() as c:
            request = pb.StreamStepsRequest(task_id="x", from_index=-1)
            await expect_error(
                grpc.StatusCode.INVALID_ARGUMENT,
                lambda: c.agent.StreamSteps(request, metadata=auth(api.keys.tenant_a_client)),
                "from_index",
            )

    asyncio.run(scenario())
