"""StepAgent's objectives against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from agentloop.apps.tasks import ToolCall
from agentloop.learner.stepagent import (
    Discriminator,
    action_reward,
    agrees,
    combined_advantages,
    command_reward,
    discriminator_loss,
    discriminator_rewards,
    dpo_terms,
    greedy_comparison,
    irl_policy_loss,
    normalise,
    step_dpo_loss,
    step_leave_one_out,
    turn_rewards,
    turn_step_advantages,
)

EXPERT = ToolCall("notes", "update_note", {"access_token": "ab12", "note_id": 7, "title": "Groceries"})


@pytest.mark.parametrize(
    ("action", "reward"),
    [
        (ToolCall("notes", "update_note", {"access_token": "ab12", "note_id": 7, "title": "Groceries"}), 1.0),
        # the same after normalisation: case, spaces, a numeric string, argument order
        (ToolCall(" Notes", "update_note ", {"title": " groceries ", "note_id": "7", "access_token": "ab12"}), 1.0),
        (ToolCall("notes", "update_note", {"access_token": "ab12", "note_id": 7.0, "title": "Groceries"}), 1.0),
        # 2 of 3 arguments agree: 0.25 + 0.25 + 0.5 * 2/3
        (ToolCall("notes", "update_note", {"access_token": "ab12", "note_id": 8, "title": "Groceries"}), 0.5 + 1 / 3),
        # a missing argument and an extra one: 2 agree of the 4 names either call uses
        (ToolCall("notes", "update_note", {"access_token": "ab12", "note_id": 7, "tag": "x"}), 0.5 + 0.5 * 2 / 4),
        (ToolCall("notes", "delete_note", {"access_token": "ab12", "note_id": 7}), 0.25),  # the app alone
        (ToolCall("mail", "update_note", {"access_token": "ab12", "note_id": 7, "title": "Groceries"}), 0.0),
        (None, 0.0),  # no parseable call
    ],
)
def test_action_reward_table(action: ToolCall | None, reward: float) -> None:
    assert action_reward(action, EXPERT) == pytest.approx(reward)
    assert agrees(action, EXPERT) == (reward == 1.0)


@pytest.mark.parametrize(
    ("command", "reward"),
    [
        ("focus on  Red Apple", 1.0),  # the same after normalisation
        ("go to hallway", 0.75 * 2 / 3),  # 2 of 3 words shared either way
        ("move pot to stove", 0.75),  # the same words, another order: not the expert's command
        ("look around", 0.0),  # another verb and object
        ("focus on red", 0.75 * 2 * 1 * 0.75 / 1.75),  # every word of it in the expert's (precision 1, recall 3/4)
        ("", 0.0),
    ],
)
def test_command_reward_table(command: str, reward: float) -> None:
    expert = {"focus on  Red Apple": "focus on red apple", "go to hallway": "go to kitchen"}.get(command)
    expert = expert or ("move stove to pot" if command.startswith("move") else "focus on red apple")
    act = lambda c: ToolCall("lab", "act", {"command": c})  # noqa: E731
    assert command_reward(command, expert) == pytest.approx(reward)
    assert action_reward(act(command), act(expert), text=True) == pytest.approx(reward)
    assert agrees(act(command), act(expert)) == (reward == 1.0)
    assert action_reward(None, act(expert), text=True) == 0.0
    # as tool calls, any command but the expert's earns the app and the API: half, whatever its words
    assert action_reward(act(command), act(expert)) == (1.0 if reward == 1.0 else 0.5)


def test_calls_without_arguments_agree() -> None:
    call = ToolCall("supervisor", "show_account_passwords", {})
    assert action_reward(call, call) == 1.0


def test_normalise() -> None:
    assert normalise("  Hello   World ") == "hello world"
    assert normalise("42") == 42 and normalise(42.0) == 42 and normalise("4.50") == 4.5
    assert normalise(True) is True and normalise("true") == "true"  # a bool is not the string
    assert normalise({"b": [" X", 2.0]}) == {"b": ["x", 2]}
    assert normalise("nan") == "nan"  # not a number to compare


def test_turn_rewards_follow_the_expert_path() -> None:
    login = ToolCall("notes", "login", {"username": "a", "password": "p"})
    docs = ToolCall("api_docs", "show_api_doc", {"app_name": "notes", "api_name": "update_note"})
    expert = [login, EXPERT]
    # a look-up between the two costs its own turn only; a turn after the expert finished earns 0
    assert turn_rewards([login, docs, EXPERT, login], expert) == [1.0, 0.0, 1.0, 0.0]
    # a wrong argument keeps the pointer on the expert's second step
    wrong = ToolCall("notes", "update_note", {"access_token": "ab12", "note_id": 8, "title": "Groceries"})
    assert turn_rewards([login, wrong, EXPERT], expert) == pytest.approx([1.0, 0.5 + 1 / 3, 1.0])


def test_step_leave_one_out() -> None:
    # r = (1, 0, 0.5): A_1 = 1 - 0.25, A_2 = 0 - 0.75, A_3 = 0.5 - 0.5
    assert step_leave_one_out([1.0, 0.0, 0.5]) == pytest.approx([0.75, -0.75, 0.0])
    assert step_leave_one_out([0.3]) == [0.0]  # no baseline from a single sample
    assert sum(step_leave_one_out([0.2, 0.9, 0.4, 0.4])) == pytest.approx(0.0)


def test_turn_step_advantages_are_ragged() -> None:
    # turn 0: three rollouts (1, 0, 1); turn 1: two (0.5, 1); turn 2: one -> 0
    out = turn_step_advantages([[1.0, 0.5, 1.0], [0.0], [1.0, 1.0]])
    assert out[0] == pytest.approx([0.5, -0.5, 0.0])
    assert out[1] == pytest.approx([-1.0])
    assert out[2] == pytest.approx([0.5, 0.5])


def test_combined_advantage() -> None:
    assert combined_advantages(0.5, [0.2, -0.4], omega=0.5) == pytest.approx([0.6, 0.3])
    assert combined_advantages(-1.0, [1.0], omega=0.0) == [-1.0]


def test_step_dpo_loss_with_its_anchor() -> None:
    chosen, rejected = torch.tensor([-2.0, -5.0]), torch.tensor([-3.0, -1.0])
    ref_chosen, ref_rejected = torch.tensor([-2.5, -4.0]), torch.tensor([-2.5, -2.0])
    tokens = torch.tensor([4.0, 10.0])
    beta, alpha = 0.5, 0.2
    loss, stats = step_dpo_loss(chosen, rejected, ref_chosen, ref_rejected, tokens, beta, alpha)
    # pair 1: m = (-2 + 2.5) - (-3 + 2.5) = 1;  pair 2: m = (-5 + 4) - (-1 + 2) = -2
    dpo = [-math.log(1 / (1 + math.exp(-beta * 1.0))), -math.log(1 / (1 + math.exp(-beta * -2.0)))]
    anchor = [2.0 / 4, 5.0 / 10]
    expected = sum(d + alpha * a for d, a in zip(dpo, anchor, strict=True)) / 2
    assert float(loss) == pytest.approx(expected)
    assert stats.margin == pytest.approx(-0.5) and stats.accuracy == pytest.approx(0.5)
    assert stats.anchor == pytest.approx(0.5)


def test_step_dpo_gradient_raises_the_chosen_and_lowers_the_rejected() -> None:
    chosen = torch.tensor([-2.0], requires_grad=True)
    rejected = torch.tensor([-2.0], requires_grad=True)
    loss, _ = step_dpo_loss(chosen, rejected, torch.tensor([-2.0]), torch.tensor([-2.0]), torch.tensor([1.0]), 1.0, 0.0)
    loss.backward()
    assert chosen.grad is not None and rejected.grad is not None
    # at m = 0: dL/dchosen = -beta * sigmoid(0) = -0.5, dL/drejected = +0.5
    assert float(chosen.grad) == pytest.approx(-0.5) and float(rejected.grad) == pytest.approx(0.5)


def test_greedy_comparison_finds_the_pairs_and_the_agreeing_steps() -> None:
    expert = torch.tensor([5, 6, 7, 8, 9, 4])
    greedy = torch.tensor([5, 0, 7, 8, 1, 4])
    steps = torch.tensor([10, 10, 10, 11, 12, 13])  # four expert actions: tokens 0-2, 3, 4, 5
    found = greedy_comparison(expert, greedy, steps)
    assert found.wrong.tolist() == [False, True, False, False, True, False]
    assert (found.steps, found.steps_agreeing) == (4, 2)  # actions 11 and 13 are written exactly


def test_dpo_terms_by_hand() -> None:
    terms = dpo_terms(
        torch.tensor([-1.0, -2.0]),
        torch.tensor([-3.0, -1.0]),
        torch.tensor([-2.0, -2.0]),
        torch.tensor([-2.0, -2.0]),
        beta=0.5,
    )
    # m = 0.5 * ((-1 + 2) - (-3 + 2)) = 1;  m = 0.5 * ((-2 + 2) - (-1 + 2)) = -0.5
    expected = [math.log(1 + math.exp(-1.0)), math.log(1 + math.exp(0.5))]
    assert terms.tolist() == pytest.approx(expected)


def test_discriminator_objective() -> None:
    expert, agent = torch.tensor([2.0, 0.0]), torch.tensor([-1.0, 1.0])
    loss, accuracy = discriminator_loss(expert, agent)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    expected = -(math.log(sig(2.0)) + math.log(sig(0.0))) / 2 - (math.log(1 - sig(-1.0)) + math.log(1 - sig(1.0))) / 2
    assert float(loss) == pytest.approx(expected)
    assert accuracy == pytest.approx(2 / 4)  # 2 > 0 right, 0 not > 0, -1 < 0 right, 1 not < 0
    assert discriminator_rewards(torch.tensor([0.0, math.log(3.0)])) == pytest.approx([0.5, 0.75])


def test_irl_policy_loss_is_the_clipped_loss_plus_the_anchor() -> None:
    # two sampled actions of 2 tokens each; the second's first token is clipped (ratio e^0.5 > 1.2)
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -1.0]])
    old = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    mask = torch.ones(2, 2)
    adv = torch.tensor([-0.25, 0.25])
    expert, expert_tokens, eps, alpha = torch.tensor(-6.0), 3, 0.2, 0.5
    loss, stats, anchor = irl_policy_loss(logp, old, adv, mask, expert, expert_tokens, eps, alpha)
    # row 1: ratios 1, 1 -> surrogate -0.25 each; row 2: min(e^0.5 * 0.25, 1.2 * 0.25) = 0.3, then 0.25
    clipped = -((-0.25 - 0.25) / 2 + (0.3 + 0.25) / 2) / 2
    assert float(loss) == pytest.approx(clipped + alpha * 6.0 / 3)
    assert anchor == pytest.approx(2.0)
    assert stats.clip_frac == pytest.approx(1 / 4)
    # the anchor pushes the expert action's log-prob up, by alpha per token
    expert = torch.tensor(-6.0, requires_grad=True)
    irl_policy_loss(logp, old, adv, mask, expert, expert_tokens, eps, alpha)[0].backward()
    assert expert.grad is not None and float(expert.grad) == pytest.approx(-alpha / 3)


def fit(d: Discriminator, expert: torch.Tensor, agent: torch.Tensor, lr: float, steps: int) -> float:
    """Adam steps of the discriminator objective; the accuracy of the last one."""
    opt = torch.optim.Adam(d.parameters(), lr=lr)
    accuracy = 0.0
    for _ in range(steps):
        opt.zero_grad()
        loss, accuracy = discriminator_loss(d(expert), d(agent))
        loss.backward()
        opt.step()
    return accuracy


def test_a_discriminator_learns_to_tell_expert_from_agent_features() -> None:
    g = torch.Generator().manual_seed(0)
    d = Discriminator(hidden_size=8)
    expert = torch.randn(64, 16, generator=g) + 1.0
    agent = torch.randn(64, 16, generator=g) - 1.0
    accuracy = fit(d, expert, agent, lr=1e-2, steps=100)
    assert accuracy > 0.95
    assert min(discriminator_rewards(d(expert))) > max(discriminator_rewards(d(agent)))


def test_standardised_features_let_the_discriminator_see_a_small_difference() -> None:
    """Rows that share most of their features (one prefix, actions a few tokens apart): raw, the difference is
    well under a percent of the features' norm; standardised over the rows, it is what D learns from."""
    g = torch.Generator().manual_seed(0)
    shared = 10.0 * torch.randn(16, generator=g)
    direction = torch.randn(16, generator=g)
    expert = shared + 0.01 * direction + 0.001 * torch.randn(32, 16, generator=g)
    agent = shared - 0.01 * direction + 0.001 * torch.randn(32, 16, generator=g)
    d = Discriminator(hidden_size=8)
    d.standardise(torch.cat([expert, agent]))
    assert torch.allclose(((torch.cat([expert, agent]) - d.mean) / d.scale).std(dim=0, unbiased=False), torch.ones(16))
    assert fit(d, expert, agent, lr=1e-3, steps=50) == 1.0
    assert [n for n, p in d.named_parameters()] == ["net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"]
    assert {"mean", "scale"} <= set(d.state_dict())  # kept with D in the checkpoint
