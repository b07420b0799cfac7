"""A ScienceWorld task over gRPC's RunTask: every step streamed as the runner stores it, then the score."""

import asyncio

from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from tests.grpc.conftest import EpisodeThread, GatedPolicy, auth
from tests.worker.test_scienceworld_served import REF, assert_scored_by_the_simulator, stored


def test_a_scienceworld_task_streams_every_step_over_grpc(simulator_ready, api, tiny, configure_env):
    configure_env(AGENT_MAX_NEW_TOKENS=16)
    policy = GatedPolicy(tiny)
    episode: EpisodeThread | None = None

    async def scenario():
        nonlocal episode
        kinds, steps, result = [], [], None
        async with api.connect() as c:
            request = pb.SubmitTaskRequest(world="scienceworld", task_ref=REF, max_turns=3)
            async for event in c.agent.RunTask(request, metadata=auth(api.keys.tenant_a_client)):
                kind = event.WhichOneof("event")
                kinds.append(kind)
                if kind == "submitted":
                    episode = EpisodeThread(event.submitted.id, policy)
                    episode.start()
                    policy.allow()
                elif kind == "step":
                    steps.append(event.step)
                    policy.allow()
                elif kind == "result":
                    result = event.result
        return kinds, steps, result

    kinds, steps, result = asyncio.run(scenario())
    assert episode is not None and episode.finish() == "finished"
    assert kinds == ["submitted", "attempt", "step", "step", "step", "result"]
    task, row, stored_steps, rewards = stored(result.id)
    assert row.world == "scienceworld"
    assert [s.observation for s in steps] == [s.observation for s in stored_steps]
    assert [list(s.output_token_ids) for s in steps] == [s.output_token_ids for s in stored_steps]
    assert result.status == pb.TASK_STATUS_FINISHED and result.reward == task.reward
    assert_scored_by_the_simulator(task, rewards)
