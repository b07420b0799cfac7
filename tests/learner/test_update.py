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
    wrong = dataclasses.replace(task, expert=lambda: [ToolCall("lights", "turn_off", {})])
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
