"""The promotion gate (Trainer.save_and_gate): each candidate is measured on dev by the gate itself and
compared with the active version's dev TGC, which the same code measured when it was promoted."""

import sqlalchemy as sa
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentloop.agent import runner
from agentloop.apps.registry import get_world
from agentloop.learner.config import LoopConfig
from agentloop.learner.model import lora_model
from agentloop.learner.rl import LoopTrainer
from agentloop.settings import get_settings
from agentloop.store.db import session_scope
from agentloop.store.models import Adapter, Episode, Task, Tenant, TrainingRun
from tests.factories import tiny_policy

CONFIG = LoopConfig(world="lights", max_turns=1, max_new_tokens=40, dev_max_turns=1, promotion_tolerance=0.0)


def gate(model, tokenizer):
    """A run's save-and-gate step for `model` as its trained weights; returns the iteration's metrics."""
    with session_scope() as s:
        run = TrainingRun(algo="loop", status="running", trigger="test", config=CONFIG.to_dict())
        s.add(run)
        s.flush()
        run_id = run.id
    trainer = LoopTrainer(get_settings(), CONFIG, run_id, model=model, tokenizer=tokenizer)
    trainer.setup()  # takes the active version's recorded dev TGC as the bar
    metrics = trainer.save_and_gate(0)
    with session_scope() as s:
        assert s.get(TrainingRun, run_id).adapter == metrics["adapter"]
    return metrics


def rows():
    with session_scope() as s:
        return {a.name: (a.status, a.metrics["dev_tgc"]) for a in s.scalars(sa.select(Adapter))}


def served_adapter(task_ref):
    """A dev task served after the gate, greedily, as a worker serves it: the version it pinned, and
    whether it succeeded."""
    with session_scope() as s:
        if s.get(Tenant, "t") is None:
            s.add(Tenant(id="t", name="t"))
            s.flush()
        task = Task(
            tenant_id="t",
            world="lights",
            task_ref=task_ref,
            instruction=get_world("lights").task(task_ref).instruction,
            apps=["lights"],
            options={"temperature": 0.0},
            request_hash="-",
        )
        s.add(task)
        s.flush()
        task_id = task.id
    settings = get_settings()
    policy = tiny_policy(settings.model)
    assert runner.run_served_task(task_id, "w", policy, settings) == "finished"
    with session_scope() as s:
        return s.scalar(sa.select(Episode.adapter).where(Episode.task_id == task_id)), s.get(Task, task_id).success


def test_a_worse_candidate_is_rejected_and_serving_keeps_the_active_version(
    sqlite_db, lights_world, lights_model_dir, lights_on_adapter_dir, configure_env
):
    configure_env(MODEL=str(lights_model_dir), MAX_BATCH_SIZE=8, AGENT_MAX_TURNS=1, AGENT_MAX_NEW_TOKENS=40)
    tok = AutoTokenizer.from_pretrained(lights_model_dir)

    def base():
        return AutoModelForCausalLM.from_pretrained(lights_model_dir)

    # v1, an adapter that turns the lights on, against the base model (nothing is active yet)
    good = gate(PeftModel.from_pretrained(base(), str(lights_on_adapter_dir), is_trainable=True), tok)
    v1 = good["adapter"]
    assert good["adapter/promoted"] == 1.0 and good["dev/tgc"] == 100.0 and good["dev/baseline_tgc"] == 0.0
    assert rows() == {v1: ("active", 100.0)}

    # v2, a candidate that lost what v1 learnt (the warm start's weights: the wrong action), at tolerance 0
    torch.manual_seed(0)
    worse = gate(lora_model(base(), CONFIG, None), tok)
    v2 = worse["adapter"]
    assert worse["adapter/promoted"] == 0.0
    assert worse["dev/tgc"] == good["dev/baseline_tgc"] == 0.0  # the same weights, measured the same way
    assert worse["dev/baseline_tgc"] == 100.0  # the bar was v1's recorded measurement
    assert rows() == {v1: ("active", 100.0), v2: ("rejected", 0.0)}
    assert served_adapter("lights-6") == (v1, True)  # serving kept v1: the lights went on

    # v3, the same weights as v1: as good as the active version, so promoted at tolerance 0
    again = gate(PeftModel.from_pretrained(base(), str(lights_on_adapter_dir), is_trainable=True), tok)
    v3 = again["adapter"]
    assert again["adapter/promoted"] == 1.0 and again["dev/tgc"] == again["dev/baseline_tgc"] == 100.0
    assert rows() == {v1: ("retired", 100.0), v2: ("rejected", 0.0), v3: ("active", 100.0)}
    assert served_adapter("lights-7") == (v3, True)
