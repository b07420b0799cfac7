"""expert_in_group: each sampled task's expert trajectory, played and scored by the task's evaluator, joins
the task's group as one more sample; the update then raises the expert's actions (toy lights world)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentloop.learner.config import LoopConfig
from agentloop.learner.model import lora_model
from agentloop.learner.rl import LoopTrainer, advantages_for
from agentloop.learner.update import compute_logprobs
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import Episode, TrainingRun


def trainer_for(model_dir, **overrides) -> LoopTrainer:
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    options = {
        "world": "lights",
        "splits": ("train",),
        "tasks_per_iteration": 2,
        "rollouts_per_task": 3,
        "iterations": 1,
        "max_turns": 1,
        "max_new_tokens": 40,
        "dev_max_turns": 1,
        "lr": 1e-2,
        "epochs": 2,
        "minibatch_size": 8,
        "micro_batch_size": 4,
        "replay_logged": False,
        "agreement_prefixes": 0,
        "promote": False,
        "expert_in_group": True,
        "seed": 3,
    }
    config = LoopConfig(**{**options, **overrides})
    with session_scope() as s:
        run = TrainingRun(algo="loop", status="running", trigger="test", config=config.to_dict())
        s.add(run)
        s.flush()
        run_id = run.id
    trainer = LoopTrainer(get_settings(), config, run_id, model=lora_model(base, config, None), tokenizer=tok)
    trainer.setup()
    return trainer


def agent_logprob(trainer: LoopTrainer, rollout) -> float:
    """Sum of the current weights' log-probs of the rollout's agent tokens."""
    (lp,) = compute_logprobs(trainer.module, [rollout], trainer.pad_id, 1, trainer.accelerator.device)
    return float(sum(x for x, m in zip(lp.tolist(), rollout.agent_mask[1:], strict=True) if m))


@pytest.mark.timeout(600)
def test_the_expert_joins_each_group_scored_and_is_raised(sqlite_db, lights_world, lights_model_dir, configure_env):
    configure_env(MODEL=str(lights_model_dir))
    trainer = trainer_for(lights_model_dir)
    logged, by_task = trainer._sample(0)
    assert not logged and len(by_task) == 2
    for ref, group in by_task.items():
        sampled = [r for r in group if not r.expert]
        (expert,) = [r for r in group if r.expert]
        assert len(sampled) == 3 and expert.task_ref == ref
        # played through the episode loop and scored by the task's evaluator: the oracle turns the lights on
        assert expert.reward == 1.0 and expert.success
        assert [(a.app, a.api) for a in expert.actions if a is not None] == [("lights", "turn_on")]
        # its pi_old is the learner's own log-prob of its tokens, on agent tokens only
        (lp,) = compute_logprobs(trainer.module, [expert], trainer.pad_id, 1, trainer.accelerator.device)
        mask = expert.agent_mask[1:]
        assert any(mask)
        for x, m, given in zip(lp.tolist(), mask, expert.sampler_logprobs[1:], strict=True):
            assert given == pytest.approx(x, abs=1e-5) if m else given == 0.0
    with session_scope() as s:  # the expert's episode is not stored as one of the rollouts
        assert s.query(Episode).filter(Episode.kind == "rollout").count() == 6

    # a group whose sampled rollouts all earned the same reward is dropped without the expert, kept with it
    group = [r for r in next(iter(by_task.values())) if not r.expert]
    expert = next(r for r in next(iter(by_task.values())) if r.expert)
    for r in group:
        r.reward = 0.0
    assert advantages_for([group], trainer.config) == []
    kept = dict((id(r), a) for r, a in advantages_for([[*group, expert]], trainer.config))
    assert kept[id(expert)] == pytest.approx(1.0)  # 1 - mean of the others' 0
    assert all(kept[id(r)] == pytest.approx(-1 / 3) for r in group)  # 0 - mean(0, 0, 1)


@pytest.mark.timeout(600)
def test_an_iteration_with_the_expert_in_group_raises_the_experts_actions(
    sqlite_db, lights_world, lights_model_dir, configure_env
):
    configure_env(MODEL=str(lights_model_dir))
    # the lights learning test's gentler step: at lr 1e-2 pushing the failed rollouts down also shakes the
    # tool-call syntax the expert shares with them (its "on" still rose: -1.57 -> -1.34, measured)
    trainer = trainer_for(lights_model_dir, lr=3e-3, clip_eps=0.3, kl_coef=0.1)
    _, by_task = trainer._sample(99)  # an expert trajectory of each train task, to read its log-prob
    experts = [r for g in by_task.values() for r in g if r.expert]
    before = [agent_logprob(trainer, r) for r in experts]
    metrics = trainer.iteration(0)
    assert metrics["expert/joined"] == 2.0 and metrics["expert/reward_mean"] == 1.0
    assert metrics["rollouts"] == 6  # sampled rollouts only: the experts are counted apart
    assert metrics["sampler_learner_gap"] < 1e-3  # the experts' numbers are the learner's; they are not in it
    after = [agent_logprob(trainer, r) for r in experts]
    assert all(a > b + 0.05 for a, b in zip(after, before, strict=True)), (before, after)
