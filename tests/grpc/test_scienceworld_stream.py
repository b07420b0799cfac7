"""A ScienceWorld task over gRPC's RunTask: every step streamed as the runner stores it, then the score."""

from agentloop.proto_gen.agentloop.v1 import agent_pb2 as pb
from tests.grpc.conftest import GatedPolicy, run_task_streamed
from tests.worker.test_scienceworld_served import REF, assert_scored_by_the_simulator, stored


def test_a_scienceworld_task_streams_every_step_over_grpc(simulator_ready, api, tiny, configure_env):
    configure_env(AGENT_MAX_NEW_TOKENS=16)
    policy = GatedPolicy(tiny)
    request = pb.SubmitTaskRequest(world="scienceworld", task_ref=REF, max_turns=3)
    run = run_task_streamed(api, request, policy)
    kinds, steps, result, episode = run.kinds, run.steps, run.result, run.episode
    assert episode is not None and episode.finish() == "finished"
    assert kinds == ["submitted", "attempt", "step", "step", "step", "result"]
    task, row, stored_steps, rewards = stored(result.id)
    assert row.world == "scienceworld"
    assert [s.observation for s in steps] == [s.observation for s in stored_steps]
    assert [list(s.output_token_ids) for s in steps] == [s.output_token_ids for s in stored_steps]
    assert result.status == pb.TASK_STATUS_FINISHED and result.reward == task.reward
    assert_scored_by_the_simulator(task, rewards)
