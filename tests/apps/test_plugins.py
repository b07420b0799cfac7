"""A package adds a world through the `agentloop.worlds` entry-point group, without touching agentloop."""

import sys

import pytest

from agentloop.agent.episode import Limits
from agentloop.agent.eval_runs import oracle_preparer, world_tasks
from agentloop.agent.evaluate import run_eval, summarize
from agentloop.apps import registry
from agentloop.policy.scripted import ScriptedPolicy


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    dist = tmp_path / "toy_world-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-world\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[agentloop.worlds]\ntoy = tests.apps.toy_world_plugin:ToyWorld\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    registry.worlds.cache_clear()
    yield
    registry.worlds.cache_clear()


def test_plugin_world_is_found_and_evaluated(installed_plugin, tokenizer):
    world = registry.get_world("toy")
    assert world.name == "toy" and "counter" in world.apps
    assert registry.get_world("builtin").name == "builtin"
    policy = ScriptedPolicy(tokenizer, name="oracle")
    results = run_eval(
        policy, world_tasks(world, "dev"), k=1, limits=Limits(), batch_size=4, prepare=oracle_preparer(policy)
    )
    assert summarize(results)["tgc"] == 100.0


def test_plugin_world_supplies_its_own_prompt(installed_plugin, tokenizer):
    from agentloop.agent.episode import Episode
    from agentloop.agent.prompt import ChatFormat

    provider = registry.get_world("toy")
    task = provider.tasks("dev")[0]
    ep = Episode(provider.task_world(task.id), ChatFormat(tokenizer), task.instruction, Limits())
    system, _, rest = tokenizer.decode(ep.prompt_token_ids).partition("<|im_end|>")
    assert system.startswith("<|im_start|>system\nYou keep the counter of the toy world.")
    assert "- The counter only goes up: add to it, never subtract." in system
    assert '{"app": "counter", "api": "show", "args": {}}' in system  # its own first call
    message = rest.rsplit("<|im_start|>user\n", 1)[1]  # the task's own: its apps, then the instruction
    assert "- counter: A counter you can add to.\n  APIs: " in message and "- supervisor" not in message
    assert "Task: Add 1 to the counter." in rest and "counter.add returned" in rest  # its worked example
    for builtin in ("notes", "login", "Toy User"):
        assert builtin not in system + rest


def test_unknown_world_is_a_clear_error():
    with pytest.raises(registry.UnknownWorld, match="unknown world 'nowhere'; known: builtin"):
        registry.get_world("nowhere")
