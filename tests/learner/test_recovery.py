"""Recovery experts (learner/recovery.py): an expert episode with the agent's own wrong action at one step,
the world's real answer to it, then the expert's calls; kept only when the task still succeeds, and trained
on the expert's turns only."""

import random

import torch

from agentloop.agent.actions import render_action
from agentloop.agent.episode import Limits
from agentloop.agent.eval_runs import world_tasks
from agentloop.apps.builtin import BUILTIN
from agentloop.apps.tasks import ToolCall
from agentloop.learner.experts import expert_rollouts, expert_steps
from agentloop.learner.recovery import with_recoveries
from agentloop.policy.base import Generation
from tests.factories import tiny_policy
from tests.learner.test_stepagent_learning import _trainer

LIMITS = Limits(max_turns=20, max_new_tokens=4096)
NO_SUCH_API = render_action(ToolCall("api_docs", "no_such_api", {}))


class Replies:
    """An agent that writes `reply(prefix)` at every prefix it is asked about (records what it was asked)."""

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.name, self.reply, self.asked = tokenizer, "replies", reply, []

    def generate(self, requests):
        self.asked += [r.temperature for r in requests]
        out = []
        for r in requests:
            text = self.reply(tuple(r.context))
            out.append(Generation(self.tokenizer.encode(text, add_special_tokens=False), None, "stop", text))
        return out


def _experts(tokenizer, n=3):
    tasks = [t for t in world_tasks(BUILTIN, "train") if t.expert is not None][:n]
    return tasks, expert_rollouts(tokenizer, tasks, LIMITS)


def test_a_failed_call_is_kept_with_its_error_and_only_the_experts_turns_train(tokenizer):
    tasks, rollouts = _experts(tokenizer)
    agent = Replies(tokenizer, lambda _prefix: NO_SUCH_API)
    out, counts = with_recoveries(agent, tasks, rollouts, LIMITS, 160, 1.0, random.Random(0))
    assert agent.asked == [0.0] * 3  # greedy, once per picked expert
    assert counts == {
        "recovery/inspected": 3.0,
        "recovery/agent_agreed": 0.0,
        "recovery/kept": 3.0,
        "recovery/dropped": 0.0,
        "recovery/errors": 3.0,
    }
    for plain, rec in zip(rollouts, out, strict=True):
        assert rec.task_ref == plain.task_ref and rec.success
        assert len(rec.actions) == len(plain.actions) + 1
        t = next(i for i, a in enumerate(rec.actions) if a == ToolCall("api_docs", "no_such_api", {}))
        assert rec.actions[:t] + rec.actions[t + 1 :] == plain.actions  # the expert's calls around the mistake
        # the expert's turns train, token for token the same calls; the mistake's tokens do not
        trained = [tok for tok, m in zip(rec.token_ids, rec.agent_mask, strict=True) if m]
        assert trained == [tok for tok, m in zip(plain.token_ids, plain.agent_mask, strict=True) if m]
        assert t not in rec.turn_ids
        text = tokenizer.decode(rec.token_ids)
        assert NO_SUCH_API in text and "Error from api_docs.no_such_api" in text  # the world's real answer
        # the mistake comes right before the expert's t-th call
        assert text.index(NO_SUCH_API) < text.index("Error from api_docs.no_such_api")


def test_the_experts_own_action_and_a_give_up_change_nothing(tokenizer):
    tasks, rollouts = _experts(tokenizer)
    expert_at = {tuple(s.prefix): render_action(s.call) for r in rollouts for s in expert_steps(r)}
    out, counts = with_recoveries(
        Replies(tokenizer, expert_at.__getitem__), tasks, rollouts, LIMITS, 160, 1.0, random.Random(1)
    )
    assert counts["recovery/agent_agreed"] == 3.0 and counts["recovery/kept"] == 0.0
    assert out == rollouts

    # ending the task at a step where the expert goes on leaves it undone: no recovery is kept
    give_up = render_action(ToolCall("supervisor", "complete_task", {"answer": "no idea"}))
    out, counts = with_recoveries(
        Replies(tokenizer, lambda _p: give_up), tasks, rollouts, LIMITS, 160, 1.0, random.Random(2)
    )
    assert counts["recovery/kept"] == 0.0
    assert counts["recovery/dropped"] + counts["recovery/agent_agreed"] == 3.0
    assert out == rollouts


def test_the_share_picks_that_many_experts(tokenizer):
    tasks, rollouts = _experts(tokenizer, n=4)
    out, counts = with_recoveries(
        Replies(tokenizer, lambda _p: NO_SUCH_API), tasks, rollouts, LIMITS, 160, 0.5, random.Random(0)
    )
    assert counts["recovery/inspected"] == 2.0 and counts["recovery/kept"] == 2.0
    assert sum(a is not b for a, b in zip(out, rollouts, strict=True)) == 2


def test_a_real_policy_at_the_prefixes(tokenizer, tiny_model_dir):
    """The tiny random model writes no call: its replies parse as none, the world answers with the parse
    error, and the expert's calls still solve the task."""
    tasks, rollouts = _experts(tokenizer, n=2)
    policy = tiny_policy(tiny_model_dir)
    out, counts = with_recoveries(policy, tasks, rollouts, LIMITS, 24, 1.0, random.Random(0))
    assert counts["recovery/kept"] + counts["recovery/dropped"] + counts["recovery/agent_agreed"] == 2.0
    assert counts["recovery/kept"] >= 1.0, counts
    assert all(r.success for r in out)


def test_sft_with_recoveries_trains_the_adapter_only(sqlite_db, lights_world, lights_model_dir, configure_env):
    """In the lights world the warm start mostly turns the lights off: those mistakes, then the expert's
    turn_on, are recoveries the world answers without an error."""
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=48)
    trainer = _trainer("sft", lights_model_dir, iterations=1, sft_steps=1, recovery_share=1.0)
    named = dict(trainer.model.named_parameters())
    before = {n: p.detach().clone() for n, p in named.items()}
    metrics = trainer.iteration(0)
    assert metrics["recovery/inspected"] == 6.0, metrics
    assert metrics["recovery/kept"] >= 1.0 and metrics["recovery/errors"] == 0.0, metrics
    changed = {n for n, p in named.items() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
