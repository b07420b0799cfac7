"""The ScienceWorld world: its catalogue and refs without a simulator; with one (a JVM), episodes of text
commands, the score as reward, gold paths as experts, and the simulator pool."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentloop.agent.actions import COMMAND_API, action_space
from agentloop.agent.episode import Episode, Limits, run_episodes
from agentloop.agent.eval_runs import eval_task
from agentloop.agent.prompt import ChatFormat
from agentloop.apps import scienceworld as sw
from agentloop.apps.registry import get_world
from agentloop.apps.tasks import ToolCall
from agentloop.learner import experts
from agentloop.policy.scripted import ScriptedPolicy

WORLD = sw.ScienceWorld()


def command(text: str) -> ToolCall:
    return ToolCall(sw.NAME, COMMAND_API, {"command": text})


# --- without a simulator ---------------------------------------------------------------------------------------


def test_the_world_is_found_through_its_entry_point() -> None:
    assert isinstance(get_world("scienceworld"), sw.ScienceWorld)


def test_listed_tasks_follow_the_benchmarks_split() -> None:
    variations = WORLD.catalogue.variations
    assert len(variations) == 30
    for split, n in sw.LISTED.items():
        tasks = WORLD.tasks(split)
        assert len(tasks) == sum(min(n, len(v[split])) for v in variations.values()) > 20 * n
        assert len({t.id for t in tasks}) == len(tasks)
        for t in tasks:
            task_type, v = sw.split_ref(t.id)
            assert t.split == split and v in variations[task_type][split] and t.scenario_id == task_type
            assert t.instruction.startswith("Your task is") and t.world == "scienceworld"
            assert t.apps == ("scienceworld",)
    # no variation is in two splits
    for splits in variations.values():
        seen = [v for s in sw.SPLITS for v in splits[s]]
        assert len(seen) == len(set(seen))
    assert WORLD.tasks("test_normal") == []


def test_bad_refs_say_what_a_ref_is() -> None:
    for ref, message in [
        ("boil", "write '<task type>-<variation>'"),
        ("boil-03", "write '<task type>-<variation>'"),
        ("boil-x", "write '<task type>-<variation>'"),
        ("bake-1", "no ScienceWorld task type 'bake'"),
        ("boil-999", "has no variation 999"),
    ]:
        with pytest.raises(KeyError, match=message):
            WORLD.task(ref)
    with pytest.raises(KeyError, match="starts from a task"):
        WORLD.new_world(0, [])


def test_the_score_is_the_reward_and_success_is_completion() -> None:
    def after(score: int, completed: bool) -> Any:
        return {"scienceworld": {"progress": {"1": {"score": score, "moves": 3, "completed": completed}}}}

    judge = sw.ScoreEvaluator()
    half = judge.evaluate({}, after(50, False), None)
    assert half.reward == 0.5 and not half.success and half.to_dict()["reward"] == 0.5
    done = judge.evaluate({}, after(100, True), None)
    assert done.reward == 1.0 and done.success
    failed = judge.evaluate({}, after(-100, True), None)
    assert failed.reward == 0.0 and not failed.success


# --- with the simulator ----------------------------------------------------------------------------------------


def test_an_episode_runs_commands_and_scores_them(simulator_ready: None, tokenizer: Any) -> None:
    task = WORLD.tasks("dev")[0]
    world = WORLD.task_world(task.id)
    try:
        ep = Episode(world, ChatFormat(tokenizer), task.instruction, Limits(max_turns=3, temperature=0.0), key="e")
        opening = tokenizer.decode(ep.prompt_token_ids)
        assert "one command on one line" in opening and "<tool_call>" not in opening
        # the task's message: where the agent stands, then the task
        assert world.start.startswith("This room is called")
        assert f"{world.start.strip()}\n\nTask: {task.instruction}" in opening
        policy = ScriptedPolicy(tokenizer)
        policy.plan("e", ["Look around", "fly to the moon", "open door to kitchen"])
        before = world.copy_state()
        run_episodes(policy, [ep])
        assert [t.action for t in ep.turns] == [
            command(c).to_dict() for c in ("look around", "fly to the moon", "open door to kitchen")
        ]
        assert "This room is called" in ep.turns[0].observation
        assert "No known action matches that input." in ep.turns[1].observation
        verdict = task.evaluator.evaluate(before, world.state, world.answer)
        assert world.state["scienceworld"]["progress"]["1"]["moves"] == 3
        assert 0.0 <= verdict.reward < 1.0 and not verdict.success
    finally:
        world.close()
    with pytest.raises(RuntimeError, match="simulator is closed"):
        world.run("look around")


def test_gold_paths_complete_their_tasks_and_become_expert_steps(simulator_ready: None, tokenizer: Any) -> None:
    first_dev = WORLD.catalogue.variations["find-plant"]["dev"][0]
    tasks = [eval_task(WORLD, WORLD.task(f"find-plant-{first_dev}"))]
    (rollout,) = experts.expert_rollouts(tokenizer, tasks, Limits(max_turns=60, max_context_tokens=32768))
    steps = experts.expert_steps(rollout)
    assert len(steps) >= 5 and all(s.commands == "scienceworld" and s.call.api == COMMAND_API for s in steps)
    space = action_space(steps[0].commands)
    assert space.parse(tokenizer.decode(steps[0].action_tokens, skip_special_tokens=True)).actions == [steps[0].call]


def test_a_dropped_world_gives_its_simulator_back(simulator_ready: None) -> None:
    world = WORLD.task_world(WORLD.task_ids("dev")[0])
    sim = world.simulator
    del world
    assert sim in sw.POOL._idle
    again = WORLD.task_world(WORLD.task_ids("dev")[1])
    assert again.simulator is sim  # reused, not a second JVM
    again.close()
    again.close()  # twice is harmless: the simulator went back once
    assert sw.POOL._idle.count(sim) == 1


def test_a_simulators_jvm_has_a_bounded_heap(simulator_ready: None) -> None:
    world = WORLD.task_world(WORLD.task_ids("dev")[0])
    try:
        java = world.simulator.env._gateway.java_process
        command = Path(f"/proc/{java.pid}/cmdline").read_bytes().split(b"\0")
        assert b"-Xmx512m" in command and b"-XX:+UseSerialGC" in command
    finally:
        world.close()


def test_oracle_eval_reaches_100_on_each_task_types_first_dev_variation(
    simulator_ready: None, isolated_home: Any, tiny_model_dir: Any, configure_env: Any
) -> None:
    # the oracle only uses the model's tokenizer; the longest gold paths (~180 commands) outgrow a small model's
    # context, which is the agent's limit, not the world's
    configure_env(MODEL=tiny_model_dir, AGENT_MAX_CONTEXT_TOKENS=200_000)
    refs = isolated_home / "refs.txt"
    refs.write_text("".join(f"{t}-{v['dev'][0]}\n" for t, v in WORLD.catalogue.variations.items()))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentloop.cli",
            "eval",
            "--world",
            "scienceworld",
            "--task-refs",
            str(refs),
            "--policy",
            "oracle",
            "--max-turns",
            "200",
            "--batch-size",
            "4",  # a JVM per episode in flight: 2 cores gain nothing from more
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 30 and summary["mean_reward"] >= 0.95 and summary["tgc"] >= 95.0
    # figures per task type
    assert set(summary["by_scenario"]) == set(WORLD.catalogue.variations)
    assert all(b["episodes"] == 1 for b in summary["by_scenario"].values())
