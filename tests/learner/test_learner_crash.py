"""`kill -9` of the learner mid-update, mid-adapter-save or mid-checkpoint: the active adapter is
unchanged and still loads; the lost run is recorded with its reason and resumes to the end."""

import os
import subprocess
import sys
import time

import pytest
from transformers import AutoModelForCausalLM

from agentloop.learner import adapters
from agentloop.policy.local import LocalPolicy
from agentloop.settings import get_settings
from agentloop.store import adapters as adapter_store
from agentloop.store.db import session_scope
from agentloop.store.models import Adapter, TrainingRun, utcnow
from agentloop.worker.dispatch import sweep_training_runs

LEARN = [
    "learn",
    "--iterations",
    "2",
    "--tasks-per-iteration",
    "6",
    "--rollouts-per-task",
    "4",
    "--max-turns",
    "1",
    "--max-new-tokens",
    "40",
    "--dev-limit",
    "2",
    "--set",
    "world=lights",
    "--set",
    "lr=0.003",
    "--set",
    "dev_max_turns=1",
    "--set",
    "seed=3",
    "--set",
    "promotion_tolerance=1.0",
]


def learn(*args, crash_at=None, timeout=240):
    env = {k: v for k, v in os.environ.items() if k != "AGENTLOOP_CRASH_AT"}
    if crash_at:
        env["AGENTLOOP_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "agentloop.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def adapter_rows():
    with session_scope() as s:
        return {a.name: a.status for a in s.query(Adapter).all()}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("crash_at", ["learner_update", "adapter_save", "checkpoint_save"])
def test_learner_killed_mid_work_loses_nothing_and_resumes(
    crash_at, sqlite_db, lights_plugin, lights_model_dir, tokenizer, configure_env
):
    configure_env(MODEL=str(lights_model_dir), LEASE_S=4, HEARTBEAT_S=1, MAX_BATCH_SIZE=24)
    settings = get_settings()
    # an active adapter that serving uses before the crash
    from peft import LoraConfig, get_peft_model

    seeded = get_peft_model(
        AutoModelForCausalLM.from_pretrained(lights_model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    with session_scope() as s:
        row = adapters.save_adapter(
            s, seeded, settings.adapters_dir, settings.model_name, parent=None, training_run_id=None
        )
        adapters.activate(s, row)
        row.metrics = {"dev_tgc": 0.0}
        first = row.name

    crashed = learn(*LEARN, crash_at=crash_at)
    assert crashed.returncode == -9, crashed.stderr[-3000:]  # killed, as by kill -9
    with session_scope() as s:
        (run,) = s.query(TrainingRun).all()
        run_id, status = run.id, run.status
        active = adapter_store.active_adapter(s, settings.model_name)
        assert [a.name for a in s.query(Adapter).filter_by(status="active")] == [active.name]
        if crash_at != "checkpoint_save":  # killed before any promotion: nothing changed
            assert active.name == first
        adapters.verify(active)  # the active version is complete on disk...
        name, path = active.name, active.path
    assert status == "running"  # nobody recorded the end: the expired lease will tell
    policy = LocalPolicy(AutoModelForCausalLM.from_pretrained(lights_model_dir), tokenizer, settings.model_name)
    policy.load_adapter(name, path)  # ...and loads into a serving policy
    assert name in policy.loaded_adapters()

    time.sleep(4.5)  # the lease expires
    swept = sweep_training_runs(settings, utcnow())
    # a run of `agentloop learn`: no server's learner takes it over; only `agentloop learn --resume` does
    assert swept == {"runs_requeued": 0, "runs_failed": 0, "runs_cancelled": 0, "runs_interrupted": 1}
    with session_scope() as s:
        run = s.get(TrainingRun, run_id)
        assert run.status == "failed" and f"resume it with `agentloop learn --resume {run_id}`" in run.error

    resumed = learn("learn", "--resume", run_id)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with session_scope() as s:
        run = s.get(TrainingRun, run_id)
        assert run.status == "finished" and run.iteration == 2 and run.attempts == 2
        assert len(run.metrics) == 2  # each iteration recorded once
        rows = s.query(Adapter).order_by(Adapter.version).all()
        assert all(os.path.exists(r.path) for r in rows)
        for r in rows:
            adapters.verify(r)  # every registered version is complete on disk
    assert list(settings.adapters_dir.rglob(".tmp-*")) == []  # a crashed save left nothing behind
