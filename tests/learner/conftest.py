"""Learner fixtures: the toy lights world (in this process, or installed as a plugin for child
processes), a tiny model warm-started on it, and a LoRA adapter on that model that turns the lights on."""

import dataclasses
import shutil
import sys
from pathlib import Path

import pytest

from agentloop.apps import registry
from tests.learner.lights_world import LightsWorld

WARM_START_STEPS = 80


@pytest.fixture
def lights_world():
    registry.worlds.cache_clear()
    registry.worlds()["lights"] = LightsWorld()
    yield registry.worlds()["lights"]
    registry.worlds.cache_clear()


@pytest.fixture
def lights_plugin(tmp_path, monkeypatch):
    """The lights world as an installed `agentloop.worlds` plugin: visible to child processes too."""
    site = tmp_path / "site"
    dist = site / "lights_world-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lights-world\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[agentloop.worlds]\nlights = tests.learner.lights_world:LightsWorld\n")
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", f"{site}:{root}")
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    registry.worlds.cache_clear()
    yield site
    registry.worlds.cache_clear()


def warm_start(tiny_model_dir, world, steps=WARM_START_STEPS):
    """Supervised on expert turns, four in five of them the wrong action (turn the lights off): the
    policy starts out taking either, mostly the wrong one, and LOOP must find which one is rewarded.

    Every step sees all demonstrations (full batch), so the model settles on the mixture itself
    (about one in five) instead of wherever the last small batches happened to push it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentloop.agent.episode import Limits
    from agentloop.agent.eval_runs import world_tasks
    from agentloop.apps.tasks import ToolCall
    from agentloop.learner.experts import expert_rollouts
    from agentloop.learner.sft import supervised_steps

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tasks = world_tasks(world, "train")
    wrong = [dataclasses.replace(t, expert=lambda _world: [ToolCall("lights", "turn_off", {})]) for t in tasks]
    demos = expert_rollouts(tok, tasks + wrong * 4, Limits(max_turns=1))
    losses = supervised_steps(model, demos, tok.eos_token_id, steps=steps, lr=1e-2, batch_size=len(demos))
    assert losses[-1] < losses[0] / 4  # it learnt the two answers
    return model, tok


def prompt_digest(tokenizer_dir) -> str:
    """Of the opening a lights task's episode sees: a model warm-started on another prompt is built again."""
    import hashlib

    from transformers import AutoTokenizer

    from agentloop.agent.episode import Episode, Limits
    from agentloop.agent.prompt import ChatFormat

    world = LightsWorld()
    task = world.tasks("train")[0]
    episode = Episode(world.task_world(task.id), ChatFormat(AutoTokenizer.from_pretrained(tokenizer_dir)), "", Limits())
    return hashlib.sha256(str(episode.prompt_token_ids).encode()).hexdigest()[:8]


@pytest.fixture(scope="session")
def lights_model_dir(model_cache, tiny_model_dir):
    """The warm-started tiny model saved as a model directory (built once per prompt, cached between runs)."""
    path = model_cache / f"lights-warm-v3-{WARM_START_STEPS}-{prompt_digest(tiny_model_dir)}"
    if not (path / "config.json").exists():
        model, tok = warm_start(tiny_model_dir, LightsWorld())
        tmp = path.with_name(path.name + ".tmp")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(path)
    return path


LIGHTS_ON_STEPS = 30


@pytest.fixture(scope="session")
def lights_on_adapter_dir(model_cache, lights_model_dir):
    """A LoRA adapter (the learner's default shape) on the warm start, supervised on the right action of
    every lights task, dev included: greedy, it turns the lights on in every dev task (the warm start
    alone in none); sampled at temperature 1, in about 7 of 10 train episodes. Built once, cached."""
    path = model_cache / f"{lights_model_dir.name}-on-lora-{LIGHTS_ON_STEPS}"  # rebuilt with its base
    if not (path / "adapter_config.json").exists():
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agentloop.agent.episode import Limits
        from agentloop.agent.eval_runs import world_tasks
        from agentloop.learner.config import LoopConfig
        from agentloop.learner.experts import expert_rollouts
        from agentloop.learner.model import lora_model
        from agentloop.learner.sft import supervised_steps

        torch.manual_seed(0)
        model = lora_model(AutoModelForCausalLM.from_pretrained(lights_model_dir), LoopConfig(), None)
        tok = AutoTokenizer.from_pretrained(lights_model_dir)
        demos = expert_rollouts(tok, world_tasks(LightsWorld(), None), Limits(max_turns=1))
        losses = supervised_steps(model, demos, tok.eos_token_id, LIGHTS_ON_STEPS, lr=1e-2, batch_size=len(demos))
        assert losses[-1] < losses[0] / 2, losses
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # left by a build that was interrupted
        model.save_pretrained(tmp)
        tmp.rename(path)
    return path
