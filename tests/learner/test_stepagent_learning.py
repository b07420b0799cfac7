"""StepAgent learns: in the toy lights world the expert's action is known (turn the lights on, then complete
the task) and the warm-started tiny model mostly takes the wrong one. Over inspection -> reflection cycles,
the greedy action at the held-out dev prefixes comes to agree with the expert's, for both variants."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentloop.learner.config import LoopConfig
from agentloop.learner.model import lora_model
from agentloop.learner.run import AgentTrainer
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import TrainingRun


def _trainer(algo, lights_model_dir, **overrides):
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(lights_model_dir)
    tok = AutoTokenizer.from_pretrained(lights_model_dir)
    options = {
        "world": "lights",
        "iterations": 4,
        "experts_per_iteration": 6,
        "expert_sources": ("oracle",),
        "inspect_prefixes": 6,
        "inspect_samples": 4,
        "max_turns": 1,
        "dev_max_turns": 1,  # expert trajectories of one step: the call that turns the lights on
        "max_new_tokens": 40,
        "sft_batch_size": 2,  # prefixes per optimizer step
        "agreement_prefixes": 8,  # the 8 dev tasks' first steps
        "promote": False,
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


@pytest.mark.timeout(420)
@pytest.mark.parametrize(
    ("algo", "overrides"),
    [
        # DPO at 3e-3 collapsed on one seed of four (the samples stopped parsing); at 1e-3 for 6 cycles all four rose
        (
            "stepagent-implicit",
            {"stepagent_lr": 1e-3, "dpo_beta": 0.5, "dpo_anchor": 2.0, "epochs": 2, "iterations": 6},
        ),
        ("stepagent-irl", {"stepagent_lr": 3e-3, "irl_anchor": 2.0, "epochs": 2}),
    ],
)
def test_agreement_rises_over_cycles(algo, overrides, sqlite_db, lights_world, lights_model_dir, configure_env):
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=48)
    trainer = _trainer(algo, lights_model_dir, **overrides)
    before = trainer.dev_agreement()
    history = [trainer.iteration(i) for i in range(trainer.config.iterations)]
    curve = [before] + [m["agreement/dev"] for m in history]
    print(algo, "agreement per cycle:", curve, "step reward:", [round(m["step_reward/mean"], 3) for m in history])
    assert before <= 25.0, curve  # the warm start mostly turns the lights off
    # then agrees with the expert on two more of the 8 dev tasks at least, in both last cycles: a level
    # reached and held, not a blip (seeds 0-3 of the implicit variant end 25-50 points above the start)
    assert min(curve[-2:]) >= before + 25.0, curve
    if algo == "stepagent-implicit":
        assert history[0]["dpo/pairs"] > 0  # the warm start's samples differ from the expert's: pairs to learn from
    else:
        assert history[-1]["disc/accuracy"] > 0.5  # D tells the expert's actions from the agent's


def test_each_variant_changes_the_adapter_and_only_it(sqlite_db, lights_world, lights_model_dir, configure_env):
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=48)
    for algo in ("sft", "stepagent-implicit", "stepagent-irl"):
        trainer = _trainer(
            algo, lights_model_dir, iterations=1, inspect_prefixes=2, inspect_samples=2, sft_steps=1, disc_steps=5
        )
        named = dict(trainer.model.named_parameters())
        before = {n: p.detach().clone() for n, p in named.items()}
        metrics = trainer.iteration(0)
        changed = {n for n, p in named.items() if not torch.equal(p, before[n])}
        assert changed, (algo, metrics)
        assert all("lora_" in n for n in changed), (algo, sorted(changed)[:5])  # the base stays frozen


@pytest.mark.parametrize("reference", ["base", "cycle"])
def test_the_dpo_reference_is_the_base_model_or_the_cycles_sampler(
    reference, sqlite_db, lights_world, lights_model_dir, configure_env
):
    """After a supervised step the adapter prefers the expert's actions: measured against the adapter disabled
    the first DPO pass already shows a margin; against the weights that sampled the cycle it starts at 0 (one
    optimizer step over all pairs: every margin is taken before the weights move)."""
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=48)
    trainer = _trainer(
        "stepagent-implicit",
        lights_model_dir,
        phases=("sft:1", "stepagent-implicit:1"),
        sft_steps=2,
        sft_lr=1e-2,
        epochs=1,
        sft_batch_size=6,  # all inspected prefixes in one optimizer step
        dpo_reference=reference,
    )
    trainer.iteration(0)
    metrics = trainer.iteration(1)
    assert metrics["dpo/pairs"] > 0, metrics
    if reference == "cycle":
        assert metrics["dpo/margin"] == pytest.approx(0.0, abs=1e-3), metrics
    else:
        assert metrics["dpo/margin"] > 0.1, metrics
