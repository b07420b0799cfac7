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
        # the greedy action read from one teacher-forced pass per expert: steps of SFT's shape, 2 experts each
        ("stepagent-implicit", {"inspection": "greedy", "stepagent_lr": 3e-3, "dpo_beta": 0.5, "sft_steps": 4}),
    ],
    ids=["implicit", "irl", "implicit-greedy"],
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
    if overrides.get("inspection") == "greedy":
        # the greedy actions at the train experts come to agree too, and fewer tokens are pairs
        assert history[-1]["inspect/agree_frac"] > history[0]["inspect/agree_frac"], history
        assert history[-1]["dpo/pairs"] < history[0]["dpo/pairs"], history
    elif algo == "stepagent-implicit":
        assert history[0]["dpo/pairs"] > 0  # the warm start's samples differ from the expert's: pairs to learn from
    else:
        assert history[-1]["disc/accuracy"] > 0.5  # D tells the expert's actions from the agent's


def test_each_variant_changes_the_adapter_and_only_it(sqlite_db, lights_world, lights_model_dir, configure_env):
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=48)
    for algo, inspection in (
        ("sft", "sample"),
        ("stepagent-implicit", "sample"),
        ("stepagent-implicit", "greedy"),
        ("stepagent-irl", "sample"),
    ):
        trainer = _trainer(
            algo,
            lights_model_dir,
            iterations=1,
            inspect_prefixes=2,
            inspect_samples=2,
            sft_steps=1,
            disc_steps=5,
            inspection=inspection,
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
        # 4 steps, not 2: after 2 the margin was 0.47 on an AVX-512 CPU but 0.012 on an AVX2 one (the warm start's
        # weights differ with the arithmetic); after 4 it is 0.77 and 0.41
        sft_steps=4,
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


@pytest.mark.parametrize("reference", ["cycle", "base"])
def test_greedy_inspection_loss_is_the_anchor_plus_dpo_where_the_greedy_token_is_another(reference, tiny_model_dir):
    """greedy_dpo_loss against the obvious computation (full log-softmax, argmax): each expert's value
    alpha * -mean log pi(y*) + mean over its pairs of -log sigmoid(m), the LoRA gradients, and what it counts.
    Row 0's first action is what greedy decoding writes (it agrees), its second is not."""
    from agentloop.learner.config import LoopConfig
    from agentloop.learner.rollouts import Rollout
    from agentloop.learner.stepagent_trainer import GreedyTally, greedy_dpo_loss
    from agentloop.learner.update import collate

    torch.manual_seed(0)
    model = lora_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoopConfig(lora_r=4, lora_alpha=8), None)
    model.eval()
    for p in model.parameters():  # a trained adapter: the base reference differs from the weights
        if p.requires_grad:
            p.data.normal_(0, 0.05)
    prompt = torch.randint(0, 1000, (1, 20))
    with torch.no_grad():
        decoded = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False)[0]
    row0 = [*decoded.tolist(), *torch.randint(0, 1000, (9,)).tolist()]  # + an observation (4) + an action (5)
    row1 = torch.randint(0, 1000, (27,)).tolist()
    rollouts = [
        Rollout(
            "a",
            row0,
            [0] * 20 + [1] * 6 + [0] * 4 + [1] * 5,
            [-1] * 20 + [0] * 6 + [-1] * 4 + [1] * 5,
            [0.0] * 35,
            1.0,
            True,
        ),
        Rollout("b", row1, [0] * 15 + [1] * 8 + [0] * 4, [-1] * 15 + [0] * 8 + [-1] * 4, [0.0] * 27, 1.0, True),
    ]
    batch = collate(rollouts, pad_id=0)
    beta, alpha = 0.5, 0.7
    lora = [p for p in model.parameters() if p.requires_grad]
    tally = GreedyTally()
    loss = greedy_dpo_loss(model, batch, 4, beta, alpha, reference, tally)
    loss.sum().backward()
    got = [p.grad.clone() for p in lora]
    for p in lora:
        p.grad = None

    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    if reference == "base":
        with torch.no_grad(), model.disable_adapter():
            ref_logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
            ref = torch.log_softmax(ref_logits.float(), dim=-1)
    else:
        ref = logp.detach()
    greedy = logits.argmax(dim=-1)
    targets = batch.input_ids[:, 1:]
    expected, pairs = [], 0
    for b in range(2):
        where = batch.agent_mask[b].bool()
        y, g = targets[b][where], greedy[b][where]
        lp, rf = logp[b][where], ref[b][where]
        lp_y, lp_g = lp.gather(1, y[:, None])[:, 0], lp.gather(1, g[:, None])[:, 0]
        rf_y, rf_g = rf.gather(1, y[:, None])[:, 0], rf.gather(1, g[:, None])[:, 0]
        wrong = y != g
        pairs += int(wrong.sum())
        m = beta * ((lp_y - rf_y) - (lp_g - rf_g))
        dpo = (-torch.nn.functional.logsigmoid(m))[wrong].mean() if wrong.any() else torch.tensor(0.0)
        expected.append(alpha * -lp_y.mean() + dpo)
    expected_t = torch.stack(expected)
    torch.testing.assert_close(loss.detach(), expected_t.detach(), rtol=1e-4, atol=1e-5)
    expected_t.sum().backward()
    for a, b in zip(got, (p.grad for p in lora), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)
    assert (tally.tokens, tally.pairs, tally.steps, tally.agreeing) == (19, pairs, 3, 1)
    assert pairs >= 13 - 1  # the random actions' tokens are (nearly) never the tiny model's argmax
