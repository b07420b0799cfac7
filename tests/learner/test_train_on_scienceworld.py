"""The learner on ScienceWorld (a text world): gold paths as SFT and StepAgent experts, K rollouts of one
variation scored by the simulator for LOOP(+step), one iteration each with a tiny model; the named task types
(`scenarios`) are the only ones trained and measured."""

import pytest
import sqlalchemy as sa
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentloop.apps import scienceworld as sw
from agentloop.learner.config import LoopConfig
from agentloop.learner.model import lora_model
from agentloop.learner.run import AgentTrainer
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import Episode, Reward, TrainingRun

TYPES = ("find-plant", "lifespan-longest-lived")


def trainer_for(algo: str, model_dir, **overrides) -> AgentTrainer:
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    options = {
        "world": "scienceworld",
        "scenarios": TYPES,
        "iterations": 1,
        "experts_per_iteration": 2,
        "sft_steps": 1,
        "sft_batch_size": 2,
        "expert_sources": ("oracle",),
        "inspect_prefixes": 2,
        "inspect_samples": 2,
        "tasks_per_iteration": 1,
        "rollouts_per_task": 2,
        "max_turns": 3,
        "max_new_tokens": 12,
        "max_context_tokens": 4096,
        "agreement_prefixes": 2,
        "promote": False,
        "lr": 1e-2,
        "sft_lr": 1e-2,
        "stepagent_lr": 1e-2,
        "seed": 0,
    }
    config = LoopConfig.for_algo(algo, **{**options, **overrides})
    with session_scope() as s:
        run = TrainingRun(algo=algo, status="running", trigger="test", config=config.to_dict())
        s.add(run)
        s.flush()
        run_id = run.id
    trainer = AgentTrainer(get_settings(), config, run_id, model=lora_model(base, config, None), tokenizer=tok)
    trainer.setup()
    return trainer


def lora_weights(trainer: AgentTrainer) -> dict[str, torch.Tensor]:
    """LoRA's B matrices: they start at zero, so weight decay alone does not move them; a gradient does."""
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}


def changed(before: dict[str, torch.Tensor], trainer: AgentTrainer) -> bool:
    after = lora_weights(trainer)
    return any(not torch.equal(before[n], after[n]) for n in before)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("algo", ["sft", "stepagent-implicit", "loop+step"])
def test_one_iteration_on_scienceworld_trains_on_the_named_task_types(
    algo, simulator_ready, sqlite_db, tiny_model_dir, configure_env
):
    configure_env(MODEL=str(tiny_model_dir))
    trainer = trainer_for(algo, tiny_model_dir)
    assert {t.scenario for t in trainer.source.train} == set(TYPES)
    assert {t.split for t in trainer.source.dev} == {"dev"} and {t.scenario for t in trainer.source.dev} <= set(TYPES)
    before = lora_weights(trainer)
    metrics = trainer.iteration(0)
    assert 0.0 <= metrics["agreement/dev"] <= 100.0
    if algo == "loop+step":
        # K rollouts of one train variation, each scored by its own simulator, stored with their reward
        assert metrics["rollouts"] == 2 and metrics["step/tasks_with_expert"] == 1.0
        assert 0.0 <= metrics["step_reward/mean"] <= 1.0
        with session_scope() as s:
            episodes = s.scalars(sa.select(Episode).where(Episode.kind == "rollout")).all()
            assert len(episodes) == 2 and {e.world for e in episodes} == {"scienceworld"}
            (ref,) = {e.task_ref for e in episodes}
            assert sw.split_ref(ref)[0] in TYPES and ref in {t.task_ref for t in trainer.source.train}
            rewards = s.scalars(sa.select(Reward).where(Reward.episode_id.in_([e.id for e in episodes]))).all()
            assert len(rewards) == 2 and all(0.0 <= r.value <= 1.0 and r.source == "evaluator" for r in rewards)
        # an update exactly when some rollout's advantage (its score's and its commands' against the gold path's)
        # is not zero
        assert changed(before, trainer) == (metrics["adv/filtered_frac"] < 1.0)
    else:
        # the experts are gold paths of train variations of the named types, played on the simulator
        assert metrics["experts/oracle"] == 2
        assert changed(before, trainer)
