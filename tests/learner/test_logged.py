"""Episodes clients ran become training data; client feedback is their reward (learner/logged.py)."""

import dataclasses

import sqlalchemy as sa
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentloop.agent import runner
from agentloop.learner.config import LoopConfig
from agentloop.learner.logged import feedback_advantages, logged_episodes
from agentloop.learner.model import lora_model
from agentloop.learner.rl import LoopTrainer
from agentloop.learner.update import compute_logprobs, sampler_gap
from agentloop.policy.local import LocalPolicy
from agentloop.settings import get_settings
from agentloop.store import episodes as episode_store
from agentloop.store.db import session_scope
from agentloop.store.models import Episode, Reward, Task, Tenant, TrainingRun

TRAIN_REFS = {f"lights-{i}" for i in range(6)}


def serve(policy, tenant, task_ref=None, instruction="Turn the lights on.", apps=("lights",)):
    with session_scope() as s:
        if s.get(Tenant, tenant) is None:
            s.add(Tenant(id=tenant, name=tenant))
            s.flush()
        task = Task(
            tenant_id=tenant,
            world="lights",
            task_ref=task_ref,
            instruction=instruction,
            apps=list(apps),
            options={},
            request_hash="-",
        )
        s.add(task)
        s.flush()
        task_id = task.id
    assert runner.run_served_task(task_id, "w", policy, get_settings()) == "finished"
    with session_scope() as s:
        return task_id, s.scalar(sa.select(Episode.id).where(Episode.task_id == task_id))


def make_trainer(config, model_dir, tenant=None):
    """A run of `tenant` (None: a shared run)."""
    torch.manual_seed(0)
    model = lora_model(AutoModelForCausalLM.from_pretrained(model_dir), config, None)
    with session_scope() as s:
        run = TrainingRun(algo="loop", status="running", trigger="test", config=config.to_dict(), tenant_id=tenant)
        s.add(run)
        s.flush()
        run_id = run.id
    trainer = LoopTrainer(
        get_settings(), config, run_id, model=model, tokenizer=AutoTokenizer.from_pretrained(model_dir)
    )
    trainer.setup()
    return trainer


def feedback(task_id, episode_id, value):
    with session_scope() as s:
        episode_store.add_reward(s, source="client", value=value, task_id=task_id, episode_id=episode_id)


def test_feedback_overrides_the_evaluator_and_dev_tasks_are_never_used(
    sqlite_db, lights_world, lights_model_dir, configure_env
):
    configure_env(MODEL=str(lights_model_dir), AGENT_MAX_TURNS=1, AGENT_MAX_NEW_TOKENS=40)
    tok = AutoTokenizer.from_pretrained(lights_model_dir)
    policy = LocalPolicy(AutoModelForCausalLM.from_pretrained(lights_model_dir), tok, "m", seed=0)
    replay_task, replay_ep = serve(policy, "a", task_ref="lights-0")
    _, plain_ep = serve(policy, "a", task_ref="lights-1")
    serve(policy, "a", task_ref="lights-7")  # a dev task: never trained on
    free = [serve(policy, "a", instruction=f"Lights please ({i}).") for i in range(4)]
    lonely = serve(policy, "b", instruction="Lights!")
    feedback(replay_task, replay_ep, 0.25)
    feedback(replay_task, replay_ep, 0.75)  # the latest feedback counts
    for (task_id, ep_id), value in zip(free, [1.0, 0.0, 0.0, 1.0], strict=True):
        feedback(task_id, ep_id, value)
    feedback(*lonely, 1.0)

    with session_scope() as s:
        items = {i.rollout.episode_id: i for i in logged_episodes(s, "lights", TRAIN_REFS, None, 100, ["a", "b"])}
        only_a = {i.rollout.episode_id for i in logged_episodes(s, "lights", TRAIN_REFS, None, 100, ["a"])}
        nobody = logged_episodes(s, "lights", TRAIN_REFS, None, 100, [])
        evaluator = s.scalar(sa.select(Reward.value).where(Reward.episode_id == plain_ep, Reward.source == "evaluator"))
    assert items[replay_ep].reward_source == "client" and items[replay_ep].rollout.reward == 0.75
    assert items[replay_ep].replayable and items[replay_ep].rollout.agent_tokens > 0
    assert items[plain_ep].reward_source == "evaluator" and items[plain_ep].replayable
    assert evaluator == items[plain_ep].rollout.reward
    assert len(items) == 2 + 4 + 1  # the dev task's episode is not there; free ones only with feedback
    assert not items[free[0][1]].replayable
    assert only_a == set(items) - {lonely[1]} and nobody == []  # only the tenants named are read

    advantages = dict((r.episode_id, a) for r, a in feedback_advantages(list(items.values()), min_comparable=3))
    # leave-one-out across comparable episodes (tenant a, same apps): 1 - mean(0, 0, 1) = 2/3
    assert abs(advantages[free[0][1]] - 2 / 3) < 1e-9 and abs(advantages[free[1][1]] + 2 / 3) < 1e-9
    assert lonely[1] not in advantages  # no comparable episodes: no baseline, no advantage
    assert not feedback_advantages(list(items.values()), min_comparable=4)


def test_an_iteration_trains_on_client_episodes(sqlite_db, lights_world, lights_model_dir, configure_env):
    configure_env(MODEL=str(lights_model_dir), AGENT_MAX_TURNS=1, AGENT_MAX_NEW_TOKENS=40)
    tok = AutoTokenizer.from_pretrained(lights_model_dir)
    policy = LocalPolicy(AutoModelForCausalLM.from_pretrained(lights_model_dir), tok, "m", seed=0)
    task_id, ep_id = serve(policy, "a", task_ref="lights-2")
    feedback(task_id, ep_id, 1.0)
    free = [serve(policy, "a", instruction=f"Lights please ({i}).") for i in range(4)]
    for (t, e), value in zip(free, [1.0, 0.0, 0.0, 1.0], strict=True):
        feedback(t, e, value)

    config = LoopConfig(
        world="lights",
        tasks_per_iteration=1,
        rollouts_per_task=3,
        iterations=1,
        max_turns=1,
        max_new_tokens=40,
        lr=1e-3,
        minibatch_size=8,
        micro_batch_size=4,
        promote=False,
        seed=0,
    )
    trainer = make_trainer(config, lights_model_dir, tenant="a")
    run_id = trainer.run_id
    metrics = trainer.iteration(0)
    assert metrics["logged/replayed"] == 1 and metrics["logged/feedback_used"] == 5
    assert ep_id in trainer.logged_used and all(e in trainer.logged_used for _, e in free)
    with session_scope() as s:  # the replayed task got fresh rollouts beside the client's episode
        rollouts_of_task = s.scalar(
            sa.select(sa.func.count())
            .select_from(Episode)
            .where(Episode.training_run_id == run_id, Episode.task_ref == "lights-2")
        )
    assert rollouts_of_task == 3
    assert trainer.logged_episodes() == []  # each client episode feeds a run once


def test_a_shared_run_reads_only_tenants_that_share_and_a_tenants_run_only_its_own(
    sqlite_db, lights_world, lights_model_dir, configure_env
):
    configure_env(MODEL=str(lights_model_dir), AGENT_MAX_TURNS=1, AGENT_MAX_NEW_TOKENS=40)
    tok = AutoTokenizer.from_pretrained(lights_model_dir)
    policy = LocalPolicy(AutoModelForCausalLM.from_pretrained(lights_model_dir), tok, "m", seed=0)
    episodes = {tenant: {serve(policy, tenant, task_ref=f"lights-{i}")[1] for i in range(2)} for tenant in "abc"}
    with session_scope() as s:  # a shares its data with shared runs; b and c do not (the default)
        s.get(Tenant, "a").share_training = True
    config = LoopConfig(world="lights", tasks_per_iteration=1, rollouts_per_task=2, max_turns=1, promote=False)

    def reads(tenant):
        trainer = make_trainer(config, lights_model_dir, tenant)
        found = {item.rollout.episode_id for item in trainer.logged_episodes()}
        with session_scope() as s:
            return found, s.get(TrainingRun, trainer.run_id).trained_on

    assert reads(None) == (episodes["a"], {"tenants": ["a"], "episodes": sorted(episodes["a"])})
    assert reads("b") == (episodes["b"], {"tenants": ["b"], "episodes": sorted(episodes["b"])})
    with session_scope() as s:
        s.get(Tenant, "a").share_training = False
    assert reads(None) == (set(), {"tenants": [], "episodes": []})  # nobody shares: a shared run reads nothing


def test_old_logprobs_are_recomputed_only_when_the_probe_shows_a_gap(
    sqlite_db, lights_world, lights_model_dir, configure_env
):
    configure_env(MODEL=str(lights_model_dir))
    config = LoopConfig(
        world="lights", tasks_per_iteration=2, rollouts_per_task=3, max_turns=1, max_new_tokens=24, micro_batch_size=2
    )
    trainer = make_trainer(config, lights_model_dir)
    batch = [r for group in trainer.collect(0).values() for r in group]
    assert len(batch) == 6
    logps, gap = trainer.old_logprobs(batch, others=set())  # sampled here, by these weights
    assert logps is None and gap < 1e-3

    # a rollout another sampler produced (a client episode), whose numbers are off: the probe sees it
    shifted = [x - 0.5 if x else 0.0 for x in batch[-1].sampler_logprobs]
    client = dataclasses.replace(batch[-1], sampler_logprobs=shifted)
    mixed = [*batch[:-1], client]
    logps, gap = trainer.old_logprobs(mixed, others={id(client)})
    assert logps is not None and len(logps) == len(mixed) and gap > 0.05
    own = compute_logprobs(trainer.module, mixed, trainer.pad_id, 6, trainer.accelerator.device)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(logps, own, strict=True))
    assert sampler_gap(logps[:1], batch[:1]) < 1e-3  # the learner's numbers are the sampler's for its own

    trainer.config = dataclasses.replace(config, recompute_old_logprobs="never")
    assert trainer.old_logprobs(mixed, others={id(client)})[0] is None
    trainer.config = dataclasses.replace(config, recompute_old_logprobs="always")
    assert trainer.old_logprobs(batch, others=set())[0] is not None
