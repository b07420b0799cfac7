"""The update step moves probability the right way: up for positive advantages, down for negative."""

import dataclasses
import random

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentloop.agent.episode import Limits
from agentloop.agent.eval_runs import world_tasks
from agentloop.apps.tasks import ToolCall
from agentloop.learner.config import LoopConfig
from agentloop.learner.experts import expert_rollouts
from agentloop.learner.model import lora_model
from agentloop.learner.update import LogprobModel, compute_logprobs, update
from tests.learner.lights_world import LightsWorld


def _rollouts(tok):
    world = LightsWorld()
    task = world_tasks(world, "train")[0]
    wrong = dataclasses.replace(task, expert=lambda _world: [ToolCall("lights", "turn_off", {})])
    return expert_rollouts(tok, [task, wrong], Limits(max_turns=1))


def _agent_logp(module, rollouts, pad_id):
    out = compute_logprobs(module, rollouts, pad_id, 4, torch.device("cpu"))
    return [float((lp * torch.tensor(r.agent_mask[1:])).sum()) for lp, r in zip(out, rollouts, strict=True)]


def test_update_follows_the_advantage_sign(tiny_model_dir):
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    on, off = _rollouts(tok)
    for algo in ("loop", "reinforce"):
        config = LoopConfig(algo=algo, lr=1e-3, epochs=3, minibatch_size=2, micro_batch_size=2, lora_r=8, lora_alpha=16)
        model = lora_model(base, config, None)
        module = LogprobModel(model, 512)
        old = compute_logprobs(module, [on, off], tok.eos_token_id, 4, torch.device("cpu"))
        before = _agent_logp(module, [on, off], tok.eos_token_id)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr)
        update(
            module, opt, Accelerator(cpu=True), [on, off], [1.0, -1.0], old, config, tok.eos_token_id, random.Random(0)
        )
        after = _agent_logp(module, [on, off], tok.eos_token_id)
        assert after[0] > before[0] and after[1] < before[1], (algo, before, after)
        base = model.unload()  # the next algorithm starts from the plain base again


def test_supervised_micro_batches_match_one_batch(tiny_model_dir):
    """Accumulating a step over one-sequence micro-batches is the same step as the whole batch at once."""
    from agentloop.learner.sft import supervised_steps

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    demos = _rollouts(tok)
    cut = {f: getattr(demos[0], f)[:-3] for f in ("token_ids", "agent_mask", "turn_ids", "sampler_logprobs")}
    demos.append(dataclasses.replace(demos[0], **cut))  # a shorter one: the whole batch is padded
    runs = []
    for micro_tokens in (10**9, 1):  # all three together, then each alone
        torch.manual_seed(0)
        config = LoopConfig(lora_r=8, lora_alpha=16)
        model = lora_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config, None)
        losses = supervised_steps(model, demos, tok.eos_token_id, 3, 1e-3, batch_size=3, micro_tokens=micro_tokens)
        lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        runs.append((losses, lora))
    (whole, w_lora), (micro, m_lora) = runs
    assert whole == pytest.approx(micro, rel=1e-5)
    assert whole[-1] < whole[0]
    for name, value in w_lora.items():
        torch.testing.assert_close(m_lora[name], value, rtol=1e-4, atol=1e-6)


def test_supervised_steps_with_the_prompt_frozen_train_the_lora_weights_on_the_same_loss(tiny_model_dir):
    """prompt_gradients=False: the first step's loss is the same number (one forward, split), the LoRA weights
    move, and not as with the prompt's gradients (which it leaves out)."""
    from agentloop.learner.sft import supervised_steps

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    demos = _rollouts(tok)
    runs = []
    for prompt_gradients in (True, False):
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        model = lora_model(base, LoopConfig(lora_r=8, lora_alpha=16), None)
        before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        losses = supervised_steps(
            model, demos, tok.eos_token_id, 3, 1e-3, batch_size=2, prompt_gradients=prompt_gradients
        )
        after = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        runs.append((losses, before, after))
    (full, _, a_full), (frozen, b_frozen, a_frozen) = runs
    assert frozen[0] == pytest.approx(full[0], rel=1e-5)
    assert frozen[-1] < frozen[0]
    moved = [n for n in a_frozen if not torch.equal(a_frozen[n], b_frozen[n])]
    assert moved
    assert any(not torch.allclose(a_frozen[n], a_full[n], rtol=1e-5, atol=1e-7) for n in moved)


def test_micro_batches_count_a_shared_opening_once(tiny_model_dir):
    from agentloop.learner.sft import micro_batches

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    (demo, _) = _rollouts(tok)

    def row(opening: list[int], own: int) -> object:
        ids = opening + [own] * 50
        return dataclasses.replace(demo, token_ids=ids, agent_mask=[1] * len(ids), turn_ids=[0] * len(ids))

    shared = [row(list(range(100)), own) for own in (7, 8, 9)]  # 150 tokens each, the first 100 the same
    assert [len(g) for g in micro_batches(shared, 100 + 3 * 50)] == [3]
    assert [len(g) for g in micro_batches(shared, 100 + 3 * 50, shared=False)] == [1, 1, 1]
    apart = [row([own] * 100, own) for own in (7, 8, 9)]  # nothing in common: whole rows count
    assert [len(g) for g in micro_batches(apart, 100 + 3 * 50)] == [1, 1, 1]
    assert [len(g) for g in micro_batches(apart, 2 * 150)] == [2, 1]


def test_lora_on_the_upper_layers_only_trains_those(tiny_model_dir):
    from agentloop.learner.sft import supervised_steps

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    n = base.config.num_hidden_layers
    with pytest.raises(ValueError, match=f"has {n} decoder layers"):
        lora_model(base, LoopConfig(lora_layers=n + 1), None)
    model = lora_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoopConfig(lora_layers=1), None)
    lora = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    layers = {int(name.split(".layers.")[1].split(".")[0]) for name in lora}
    assert layers == {n - 1} and all("lora_" in name for name in lora)
    supervised_steps(model, _rollouts(tok), tok.eos_token_id, 1, 1e-2, batch_size=2)
    after = dict(model.named_parameters())
    assert all(not torch.equal(after[name], value) for name, value in lora.items() if "lora_B" in name)
