"""The LOOP objective against hand-computed values."""

import pytest
import torch

from agentloop.learner.loop import (
    greedy_hits,
    group_normalised_advantages,
    keep_mask,
    kl_to_reference,
    leave_one_out_advantages,
    logprobs_from_hidden,
    naive_sequence_logprobs,
    policy_gradient_loss,
    ppo_clip_loss,
    sequence_logprobs,
    std_normalise,
)


def test_leave_one_out_k2():
    adv = leave_one_out_advantages(torch.tensor([[1.0, 0.0], [0.25, 0.75]]))
    assert adv.tolist() == [[1.0, -1.0], [-0.5, 0.5]]


def test_leave_one_out_equal_rewards_are_zero_and_filtered():
    rewards = torch.tensor([[0.5, 0.5, 0.5, 0.5]])
    adv = leave_one_out_advantages(rewards)
    assert adv.tolist() == [[0.0, 0.0, 0.0, 0.0]]
    assert not keep_mask(adv).any()


def test_leave_one_out_mixed_k3():
    adv = leave_one_out_advantages(torch.tensor([[1.0, 0.0, 0.5]]))
    # A_0 = 1 - (0 + .5)/2, A_1 = 0 - (1 + .5)/2, A_2 = .5 - (1 + 0)/2
    assert adv[0].tolist() == pytest.approx([0.75, -0.75, 0.0])
    assert keep_mask(adv).tolist() == [[True, True, False]]
    assert keep_mask(torch.tensor([0.009, -0.01, 0.011])).tolist() == [False, True, True]


def test_leave_one_out_needs_two_rollouts():
    with pytest.raises(ValueError, match="at least 2"):
        leave_one_out_advantages(torch.tensor([[1.0]]))


def test_std_normalisation_and_grpo():
    rewards = torch.tensor([[1.0, 0.0]])
    assert std_normalise(leave_one_out_advantages(rewards), rewards, eps=0.0).tolist() == [[2.0, -2.0]]
    assert group_normalised_advantages(rewards, eps=0.0).tolist() == [[1.0, -1.0]]


def one_token(ratio: float, advantage: float, eps: float = 0.1):
    old = torch.zeros((1, 1))
    logp = torch.log(torch.tensor([[ratio]])).requires_grad_()
    loss, stats = ppo_clip_loss(logp, old, torch.tensor([advantage]), torch.ones((1, 1)), eps=eps)
    loss.backward()
    return loss.item(), logp.grad.item(), stats


@pytest.mark.parametrize(
    ("ratio", "adv", "loss", "grad_zero", "clipped"),
    [
        (1.5, 1.0, -1.1, True, True),  # better than old, positive A: capped at 1+eps, no gradient
        (1.05, 1.0, -1.05, False, False),  # inside the trust region
        (0.5, 1.0, -0.5, False, True),  # worse than old, positive A: unclipped term is smaller, keeps gradient
        (1.5, -1.0, 1.5, False, True),  # negative A, ratio up: the pessimistic (unclipped) term wins
        (0.5, -1.0, 1 / 1.1, True, True),  # negative A, ratio down past 1/(1+eps): clipped, no gradient
    ],
)
def test_clipping_for_positive_and_negative_advantages(ratio, adv, loss, grad_zero, clipped):
    value, grad, stats = one_token(ratio, adv)
    assert value == pytest.approx(loss, abs=1e-6)
    assert (grad == 0.0) is grad_zero
    assert stats.clip_frac == (1.0 if clipped else 0.0)


def test_masked_tokens_get_no_gradient_and_do_not_count():
    logp = torch.tensor([[-1.0, -2.0, -3.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0, -3.0, -0.5]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0]])  # positions 1 and 3 are observation/prompt tokens
    loss, stats = ppo_clip_loss(logp, old, torch.tensor([2.0]), mask)
    loss.backward()
    assert logp.grad[0, 1] == 0.0 and logp.grad[0, 3] == 0.0
    assert logp.grad[0, 0] != 0.0 and logp.grad[0, 2] != 0.0
    assert loss.item() == pytest.approx(-2.0)  # ratio 1 on both agent tokens: -mean(1 * 2)
    assert stats.tokens == 2 and stats.approx_kl == pytest.approx(0.0)


def test_rollout_loss_is_the_mean_of_per_rollout_token_means():
    # rollout 0 has 1 agent token, rollout 1 has 3: each rollout weighs the same
    logp = torch.zeros((2, 3))
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    loss, _ = ppo_clip_loss(logp, logp.clone(), torch.tensor([1.0, -3.0]), mask)
    assert loss.item() == pytest.approx(-(1.0 + -3.0) / 2)


def test_turn_and_trajectory_ratios():
    logp = torch.log(torch.tensor([[1.2, 1.2, 0.95, 1.0]]))
    old = torch.zeros((1, 4))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    turns = torch.tensor([[0, 0, 1, 1]])
    _, token = ppo_clip_loss(logp, old, torch.tensor([1.0]), mask, level="token")
    loss_turn, _ = ppo_clip_loss(logp, old, torch.tensor([1.0]), mask, level="turn", turn_ids=turns, eps=10.0)
    # turn 0 ratio = 1.2 * 1.2 = 1.44 on its 2 tokens; turn 1 ratio = 0.95 on its 1 agent token
    assert loss_turn.item() == pytest.approx(-(1.44 + 1.44 + 0.95) / 3, abs=1e-5)
    loss_traj, _ = ppo_clip_loss(logp, old, torch.tensor([1.0]), mask, level="trajectory", eps=10.0)
    assert loss_traj.item() == pytest.approx(-(1.2 * 1.2 * 0.95), abs=1e-5)
    with pytest.raises(ValueError, match="turn_ids"):
        ppo_clip_loss(logp, old, torch.tensor([1.0]), mask, level="turn")
    assert token.clip_frac == pytest.approx(2 / 3)


def test_approx_kl_is_positive_when_the_policy_moved():
    logp = torch.log(torch.tensor([[0.5, 2.0]]))
    _, stats = ppo_clip_loss(logp, torch.zeros((1, 2)), torch.tensor([1.0]), torch.ones((1, 2)))
    expected = ((0.5 - 1 - torch.log(torch.tensor(0.5))) + (2.0 - 1 - torch.log(torch.tensor(2.0)))) / 2
    assert stats.approx_kl == pytest.approx(expected.item(), abs=1e-6)


def test_reinforce_and_kl_penalty():
    logp = torch.tensor([[-1.0, -3.0]])
    assert policy_gradient_loss(logp, torch.tensor([2.0]), torch.tensor([[1.0, 1.0]])).item() == pytest.approx(4.0)
    assert kl_to_reference(logp, logp, torch.ones((1, 2))).item() == pytest.approx(0.0)
    assert kl_to_reference(logp, logp - 1.0, torch.ones((1, 2))).item() > 0


def test_chunked_logprobs_equal_the_naive_computation(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.randint(0, 1000, (2, 37))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding on the second row
    expected = naive_sequence_logprobs(model, ids, mask)
    for chunk in (1, 8, 64):
        got = sequence_logprobs(model, ids, mask, chunk=chunk)
        assert got.shape == (2, 36)
        assert torch.allclose(got[0], expected[0], atol=1e-5)
        assert torch.allclose(got[1, 5:], expected[1, 5:], atol=1e-5)


def test_chunked_logprobs_have_the_same_gradient():
    torch.manual_seed(0)
    hidden = torch.randn(2, 10, 8, requires_grad=True)
    weight = torch.randn(50, 8, requires_grad=True)
    targets = torch.randint(0, 50, (2, 10))
    full = torch.log_softmax(hidden @ weight.T, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    full.sum().backward()
    g_hidden, g_weight = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    chunked = logprobs_from_hidden(hidden, weight, targets, chunk=3)
    assert torch.allclose(chunked, full, atol=1e-5)
    chunked.sum().backward()
    assert torch.allclose(hidden.grad, g_hidden, atol=1e-5) and torch.allclose(weight.grad, g_weight, atol=1e-5)


def test_several_targets_per_position_are_each_targets_logprob():
    torch.manual_seed(0)
    hidden = torch.randn(1, 9, 8)
    weight = torch.randn(50, 8)
    targets = torch.randint(0, 50, (1, 9, 2))
    both = logprobs_from_hidden(hidden, weight, targets, chunk=4)
    assert both.shape == (1, 9, 2)
    for k in range(2):
        torch.testing.assert_close(both[..., k], logprobs_from_hidden(hidden, weight, targets[..., k], chunk=4))


def test_selected_positions_equal_the_full_computation(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.randint(0, 1000, (2, 20))
    attn = torch.ones_like(ids)
    select = torch.zeros((2, 19))
    select[0, 3:6] = 1
    select[1, 10:] = 1
    full = sequence_logprobs(model, ids, attn, chunk=7)
    picked = sequence_logprobs(model, ids, attn, chunk=7, target_mask=select)
    assert torch.allclose(picked[select.bool()], full[select.bool()], atol=1e-5)
    assert (picked[~select.bool()] == 0).all()


def test_greedy_hits_are_where_greedy_decoding_writes_the_next_token(tiny_model_dir):
    """Teacher-forced argmax = what greedy decoding writes: a greedily decoded continuation is all hits, a
    token replaced in it is a miss; padding and the prompt are never targets."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompt = torch.randint(0, 1000, (1, 30))
    prompts = torch.cat([prompt, prompt], dim=0)
    prompts[1, 25:] = torch.randint(0, 1000, (5,))  # two rows that share their first 25 tokens
    rows = [
        model.generate(p[None], attention_mask=torch.ones_like(p[None]), max_new_tokens=n, do_sample=False)[0]
        for p, n in zip(prompts, (12, 8), strict=True)
    ]
    ids = torch.zeros((2, 42), dtype=torch.long)
    attn = torch.zeros_like(ids)
    target = torch.zeros((2, 41), dtype=torch.bool)
    for b, r in enumerate(rows):
        ids[b, : len(r)], attn[b, : len(r)] = r, 1
        target[b, 29 : len(r) - 1] = True  # the positions that predict the decoded tokens
    hits = greedy_hits(model, ids, attn, target, chunk=5)
    assert hits[target].all() and not hits[~target].any()
    wrong = ids.clone()
    wrong[0, 34] = (ids[0, 34] + 1) % 1000  # not what greedy decoding wrote there
    hits = greedy_hits(model, wrong, attn, target, chunk=5)
    assert not hits[0, 33] and hits[0, 29:33].all() and hits[1, 29:37].all()


def test_shared_opening_gives_the_same_logprobs_and_gradients(tiny_model_dir):
    """Rows that open the same way run the opening once; values and LoRA gradients equal row-by-row."""
    from transformers import AutoModelForCausalLM

    from agentloop.learner.config import LoopConfig
    from agentloop.learner.loop import shared_opening
    from agentloop.learner.model import lora_model

    torch.manual_seed(0)
    model = lora_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoopConfig(lora_r=4, lora_alpha=8), None)
    for p in model.parameters():  # a trained adapter, not the identity: B != 0
        if p.requires_grad:
            p.data.normal_(0, 0.05)
    ids = torch.randint(0, 1000, (3, 40))
    ids[:, :24] = ids[0, :24]
    ids[1, 24], ids[2, 24] = (ids[0, 24] + 1) % 1000, (ids[0, 24] + 2) % 1000
    mask = torch.ones_like(ids)
    mask[2, 33:] = 0  # right padding
    assert shared_opening(ids, mask) == 24
    lora = [p for p in model.parameters() if p.requires_grad]

    def run(rows):
        for p in lora:
            p.grad = None
        out = [sequence_logprobs(model, ids[r], mask[r], chunk=16) for r in rows]
        logp = torch.cat(out)
        (logp[:, :-8] * mask[:, 1:-8]).sum().backward()  # the opening's and the remainders' positions
        return logp.detach(), [p.grad.clone() for p in lora]

    shared, g_shared = run([slice(0, 3)])
    alone, g_alone = run([slice(i, i + 1) for i in range(3)])
    valid = mask[:, 1:].bool()
    torch.testing.assert_close(shared[valid], alone[valid], rtol=1e-4, atol=1e-5)
    for a, b in zip(g_shared, g_alone, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("frozen", [10, 24, 30])  # inside the shared opening, at its end, past it
def test_a_frozen_prompt_gives_the_same_values_and_the_gradients_of_constant_prompt_keys(tiny_model_dir, frozen):
    """`frozen` positions run without gradients: hidden states as without, and LoRA gradients those of each
    row run on its own with the prompt's keys/values computed under no_grad (not those of the whole graph)."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from agentloop.learner.config import LoopConfig
    from agentloop.learner.loop import decoder_hidden, shared_opening
    from agentloop.learner.model import lora_model
    from agentloop.policy.models import output_cache

    torch.manual_seed(0)
    model = lora_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoopConfig(lora_r=4, lora_alpha=8), None)
    lora = [p for p in model.parameters() if p.requires_grad]
    for p in lora:
        p.data.normal_(0, 0.05)
    decoder = model.get_decoder()
    ids = torch.randint(0, 1000, (3, 40), generator=torch.Generator().manual_seed(1))
    ids[:, :24] = ids[0, :24]
    ids[1, 24], ids[2, 24] = (ids[0, 24] + 1) % 1000, (ids[0, 24] + 2) % 1000
    mask = torch.ones_like(ids)
    mask[2, 35:] = 0  # right padding
    assert shared_opening(ids, mask) == 24
    probe = torch.randn(3, 40, model.config.hidden_size, generator=torch.Generator().manual_seed(2))
    probe[:, :frozen] = 0  # a loss on the positions after the prompt only
    probe *= mask.unsqueeze(-1)

    def grads(hidden):
        for p in lora:
            p.grad = None
        (hidden * probe).sum().backward()
        return [p.grad.clone() for p in lora]

    whole = decoder_hidden(decoder, ids, mask)
    g_whole = grads(whole)
    cut = decoder_hidden(decoder, ids, mask, frozen=frozen)
    valid = mask.bool()
    torch.testing.assert_close(cut[valid], whole.detach()[valid], rtol=1e-4, atol=1e-5)
    g_cut = grads(cut)
    reference = []
    for r in range(3):
        with torch.no_grad():
            prompt = decoder(input_ids=ids[r : r + 1, :frozen], use_cache=True)
        rest = decoder(
            input_ids=ids[r : r + 1, frozen:], attention_mask=mask[r : r + 1], cache=output_cache(prompt)
        ).last_hidden_state
        reference.append(torch.cat([prompt.last_hidden_state, rest], dim=1))
    g_ref = grads(torch.cat(reference))
    for a, b in zip(g_cut, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)
    assert isinstance(output_cache(prompt), DynamicCache)
    apart = [float((a - b).norm() / b.norm().clamp(min=1e-12)) for a, b in zip(g_cut, g_whole, strict=True)]
    assert max(apart) > 0.05  # the prompt's own gradient is what freezing leaves out


def test_activation_checkpointing_recomputes_layers_and_gives_the_same_gradients(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from agentloop.learner.config import LoopConfig
    from agentloop.learner.model import lora_model

    ids = torch.randint(0, 1000, (3, 40), generator=torch.Generator().manual_seed(0))
    ids[:, :24] = ids[0, :24]  # a shared opening: the checkpointed forward runs rows whole instead
    mask = torch.ones_like(ids)

    def run(checkpointing):
        config = LoopConfig(lora_r=4, lora_alpha=8, activation_checkpointing=checkpointing)
        torch.manual_seed(0)
        model = lora_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir), config, None)
        lora = [p for p in model.parameters() if p.requires_grad]
        for p in lora:
            p.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(p.numel()))
        attention_calls = []
        layer = model.get_decoder().layers[0]
        layer.self_attn.register_forward_hook(lambda *_: attention_calls.append(1))
        model.train()
        logp = sequence_logprobs(model, ids, mask, chunk=16)
        in_forward = len(attention_calls)
        logp.sum().backward()
        return logp.detach(), [p.grad.clone() for p in lora], (in_forward, len(attention_calls) - in_forward)

    plain, g_plain, calls_plain = run(False)
    ckpt, g_ckpt, calls_ckpt = run(True)
    assert calls_plain == (2, 0)  # the shared opening, then the rows' remainders; nothing in backward
    assert calls_ckpt == (1, 1)  # the rows whole, then once more in backward
    torch.testing.assert_close(ckpt, plain, rtol=1e-4, atol=1e-5)
    for a, b in zip(g_ckpt, g_plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)
