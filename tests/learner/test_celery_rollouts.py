"""rollout_mode=celery: the learner publishes one job per task on the `rollouts` queue, a real Celery
worker process runs K rollouts of each with the learner's current weights and stores them, and the
iteration trains on what the worker stored. The worker samples in its own process, or (`remote`) through
`agentloop inference` in another one, which loads each iteration's weights by name at run time."""

import pytest
import sqlalchemy as sa
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentloop.learner.config import LoopConfig
from agentloop.learner.rl import LoopTrainer
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import Episode, TrainingRun
from agentloop.worker.celery_app import app, declare_queues
from tests.policy.test_remote import Server

TASKS, K = 6, 4


@pytest.mark.parametrize("backend", ["local", "remote"])
def test_an_iteration_trains_on_rollouts_a_worker_ran(
    sqlite_db,
    lights_plugin,
    lights_model_dir,
    lights_on_adapter_dir,
    configure_env,
    processes,
    tmp_path,
    request,
    backend,
):
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=16)
    server = None
    if backend == "remote":
        server = Server(lights_model_dir, tmp_path / "inference.log", None)
        request.addfinalizer(server.kill)
        configure_env(POLICY_BACKEND="remote", INFERENCE_URLS=server.url)
    declare_queues(app)  # before the worker consumes and the learner publishes
    processes.start("worker", "--queues", "rollouts", name="rollouts")
    config = LoopConfig(
        world="lights",
        rollout_mode="celery",
        tasks_per_iteration=TASKS,  # every train task
        rollouts_per_task=K,
        min_rollouts_per_task=3,
        min_fraction=0.75,
        rollout_timeout_s=240,
        max_turns=1,
        max_new_tokens=40,
        lr=1e-3,
        minibatch_size=8,
        micro_batch_size=4,
        promote=False,
        seed=0,
    )
    # the learner's weights turn the lights on in about 7 of 10 samples: with 4 per task, some task's
    # rewards differ (all six groups equal: under 1 in 1000), and they differ visibly from the base
    # model's, so a worker that sampled with other weights shows as a sampler/learner gap
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(lights_model_dir), str(lights_on_adapter_dir), is_trainable=True
    )
    with session_scope() as s:
        run = TrainingRun(algo="loop", status="running", trigger="test", config=config.to_dict())
        s.add(run)
        s.flush()
        run_id = run.id
    trainer = LoopTrainer(
        get_settings(), config, run_id, model=model, tokenizer=AutoTokenizer.from_pretrained(lights_model_dir)
    )
    trainer.setup()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    metrics = trainer.iteration(0)

    with session_scope() as s:
        stored = s.scalars(sa.select(Episode).where(Episode.training_run_id == run_id, Episode.iteration == 0)).all()
        per_task = {ref: sum(1 for e in stored if e.task_ref == ref) for ref in {e.task_ref for e in stored}}
        sampled_with = {(e.kind, e.adapter, e.status) for e in stored}
    # the worker ran and stored every job (the learner never samples in this mode): K per task, each
    # with the weights the learner saved for this iteration
    assert sorted(per_task.values()) == [K] * TASKS, per_task
    assert min(per_task.values()) >= config.min_rollouts_per_task  # the straggler rule's minimum held
    assert sampled_with == {("rollout", f"run-{run_id[:8]}-it0", "finished")}
    # the iteration trained on exactly those rollouts, with pi_old recomputed by the learner, and the
    # learner's numbers match the worker's: it sampled with the learner's weights
    assert metrics["rollouts"] == TASKS * K, metrics
    assert metrics["adv/filtered_frac"] < 1.0, metrics
    assert metrics["old_logprobs_recomputed"] == 1.0 and metrics["sampler_learner_gap"] < 1e-3, metrics
    changed = [n for n, p in model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed, "the update left every LoRA weight as it was"
    if server is not None:  # the server sampled, on the iteration's adapter, and let it go afterwards
        stats = server.stats()
        server.kill()
        assert stats["steps"] > 0 and stats["registered"] == [], stats
