"""Expert trajectories are played a few worlds at a time (a world may hold a process: a ScienceWorld simulator
is a JVM), every expert's rollout comes back in order, and every world is closed."""

import dataclasses

from agentloop.agent.episode import Limits
from agentloop.agent.eval_runs import world_tasks
from agentloop.apps.builtin import BUILTIN
from agentloop.learner import experts


def test_experts_play_a_few_worlds_at_a_time_and_close_each(tokenizer, monkeypatch):
    monkeypatch.setattr(experts, "EXPERT_WORLDS_AT_ONCE", 2)
    open_now, most, closed = [0], [0], []

    def counted(task):
        def start():
            world, evaluator = task.start()
            open_now[0] += 1
            most[0] = max(most[0], open_now[0])
            close = world.close

            def closing() -> None:
                open_now[0] -= 1
                closed.append(task.task_ref)
                close()

            world.close = closing
            return world, evaluator

        return dataclasses.replace(task, start=start)

    tasks = [counted(t) for t in world_tasks(BUILTIN, "train")[:5]]
    rollouts = experts.expert_rollouts(tokenizer, tasks, Limits(max_turns=20, max_new_tokens=4096))
    assert [r.task_ref for r in rollouts] == [t.task_ref for t in tasks]
    assert all(r.success for r in rollouts)
    assert most[0] == 2
    assert sorted(closed) == sorted(t.task_ref for t in tasks) and open_now[0] == 0
