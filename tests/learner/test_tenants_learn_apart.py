"""Two tenants train their own adapters from their own client episodes, and are then served them side by
side: what one tenant's feedback rewards moves that tenant's adapter only."""

import dataclasses
import threading

import sqlalchemy as sa
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentloop.apps import registry
from agentloop.apps.evaluation import Verdict
from agentloop.learner import adapters
from agentloop.learner.config import LoopConfig
from agentloop.policy.local import LocalPolicy
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import Episode, Step, TrainingRun
from tests.learner.lights_world import LightsWorld
from tests.learner.test_logged import feedback, make_trainer, serve


class SameReward:
    """Every rollout of the world's own tasks earns the same reward, so their leave-one-out advantages are 0:
    whatever a run learns comes from its tenant's episodes and feedback."""

    def evaluate(self, before, after, answer):
        return Verdict([], score=0.5)


class EvenLights(LightsWorld):
    def tasks(self, split=None):
        return [dataclasses.replace(t, evaluator=SameReward()) for t in super().tasks(split)]


def action_of(episode_id):
    with session_scope() as s:
        step = s.scalar(sa.select(Step).where(Step.episode_id == episode_id).order_by(Step.index))
        return step.action["api"] if step is not None and step.action else None


def sequences(episode_ids):
    """Each episode's first turn: (prompt token ids, the agent's sampled token ids)."""
    with session_scope() as s:
        out = []
        for ep_id in episode_ids:
            prompt = s.get(Episode, ep_id).prompt_token_ids
            step = s.scalar(sa.select(Step).where(Step.episode_id == ep_id).order_by(Step.index))
            out.append((list(prompt), list(step.output_token_ids)))
        return out


def logprob(model, prompt, output):
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(output)[:, None]).sum().item()


def train_and_save(config, model_dir, tenant):
    trainer = make_trainer(config, model_dir, tenant=tenant)
    metrics = trainer.iteration(0)
    settings = get_settings()
    with session_scope() as s:
        row = adapters.save_adapter(
            s,
            trainer.model,
            settings.adapters_dir,
            settings.model_name,
            parent=None,
            training_run_id=trainer.run_id,
            tenant_id=tenant,
        )
        adapters.activate(s, row)
        name, path = row.name, row.path
        trained_on = s.get(TrainingRun, trainer.run_id).trained_on
    return metrics, name, path, trained_on


def test_each_tenant_trains_on_its_own_feedback_and_is_served_its_own_adapter_in_one_batch(
    sqlite_db, lights_world, lights_model_dir, configure_env
):
    configure_env(
        MODEL=str(lights_model_dir),
        AGENT_MAX_TURNS=1,
        AGENT_MAX_NEW_TOKENS=40,
        AGENT_TEMPERATURE=1.0,
        BATCH_WINDOW_MS=2000,
    )
    registry.worlds()["lights"] = EvenLights()
    tok = AutoTokenizer.from_pretrained(lights_model_dir)
    policy = LocalPolicy(AutoModelForCausalLM.from_pretrained(lights_model_dir), tok, "m", seed=0)
    # the warm start, asked what it was trained on, turns the lights on now and then (about one sample in six at
    # temperature 1; how often, and which samples, differs from one CPU's arithmetic to another's): tenant a is
    # served until its samples hold each action twice, and rewards turning them on; b rates every episode alike
    served: dict[str, list[str]] = {"a": [], "b": []}
    a_actions: list[str | None] = []
    while min(a_actions.count("turn_on"), a_actions.count("turn_off")) < 2:
        assert len(a_actions) < 60, a_actions
        served["a"].append(serve(policy, "a")[1])
        a_actions.append(action_of(served["a"][-1]))
    served["b"] = [serve(policy, "b")[1] for _ in served["a"]]
    with session_scope() as s:
        task_of = {ep.id: ep.task_id for ep in s.scalars(sa.select(Episode))}
    for ep_id, action in zip(served["a"], a_actions, strict=True):
        feedback(task_of[ep_id], ep_id, 1.0 if action == "turn_on" else 0.0)
    for ep_id in served["b"]:
        feedback(task_of[ep_id], ep_id, 1.0)

    config = LoopConfig(
        world="lights",
        tasks_per_iteration=1,
        rollouts_per_task=2,
        iterations=1,
        epochs=4,
        max_turns=1,
        max_new_tokens=40,
        lr=1e-2,
        clip_eps=0.5,  # one iteration, so let it move
        minibatch_size=16,
        micro_batch_size=4,
        promote=False,
        seed=0,
    )
    a_metrics, a_name, a_path, a_read = train_and_save(config, lights_model_dir, "a")
    b_metrics, b_name, b_path, b_read = train_and_save(config, lights_model_dir, "b")
    assert a_read == {"tenants": ["a"], "episodes": sorted(served["a"])}
    assert b_read == {"tenants": ["b"], "episodes": sorted(served["b"])}
    assert a_metrics["logged/feedback_used"] == b_metrics["logged/feedback_used"] == len(served["a"])

    base = AutoModelForCausalLM.from_pretrained(lights_model_dir).eval()
    on = [seq for seq, act in zip(sequences(served["a"]), a_actions, strict=True) if act == "turn_on"]
    off = [seq for seq, act in zip(sequences(served["a"]), a_actions, strict=True) if act == "turn_off"]

    def shift(path, seqs):
        """Mean change of the sequences' log-probability from the base model to the adapter at `path`."""
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(lights_model_dir), path).eval()
        return sum(logprob(model, p, o) - logprob(base, p, o) for p, o in seqs) / len(seqs)

    # a's adapter prefers what a's feedback rewarded (log p(on) - log p(off) up) ...
    assert shift(a_path, on) - shift(a_path, off) > 0.3
    # ... and b's, trained on b's episodes alone, did not move at all (had it read a's, it would have)
    assert abs(shift(b_path, on)) < 1e-5 and abs(shift(b_path, off)) < 1e-5

    # served afterwards: one episode of each tenant at a time, from two threads, decode in the same batches,
    # each on its own tenant's adapter
    configure_env(AGENT_MAX_TURNS=3)
    merged_before = policy.batches_merged[1]
    after: dict[str, str] = {}
    threads = [
        threading.Thread(target=lambda t=t: after.setdefault(t, serve(policy, t, instruction="Lights please.")[1]))
        for t in ("a", "b")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and set(after) == {"a", "b"}
    with session_scope() as s:
        assert s.get(Episode, after["a"]).adapter == a_name and s.get(Episode, after["b"]).adapter == b_name
    assert policy.batches_merged[1] > merged_before  # a forward held both tenants' rows
